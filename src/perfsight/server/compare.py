"""``/api/compare``: two analysed runs (or two ranks of one job) compared for the UI.

Why a module of its own: the compare page and the job's card-comparison tab ask the same question
of :mod:`perfsight.compare` -- this module only maps run ids and ranks to the ranks' cache
folders (runs the registry has opened: never an arbitrary path), keeps the last few comparisons
(each costs the time to read four or five analysis tables), and caps the rows sent.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any

from perfsight.compare import compare_sides
from perfsight.compare.inputs import CompareInputError, cached_side
from perfsight.server.registry import OpenedRun, RankData

__all__ = ["CompareInputError", "comparison"]

KEPT = 8
"""Comparisons kept in memory (a user flips between a few pairs)."""

_kept: OrderedDict[tuple, dict[str, Any]] = OrderedDict()
_lock = threading.Lock()


def _stamp(rank: RankData) -> tuple[str, int]:
    meta = rank.cache_folder / "meta.json"
    return str(rank.cache_folder), meta.stat().st_mtime_ns if meta.is_file() else 0


def comparison(
    base: OpenedRun, base_rank: int | None, new: OpenedRun, new_rank: int | None, limit: int
) -> dict[str, Any]:
    """The comparison document of ``perfsight compare`` (``Comparison.to_dict``), ``limit`` rows
    per table; sides are named ``RUN:rankN`` (run ids, never paths)."""
    b, n = base.rank(base_rank), new.rank(new_rank)
    key = (_stamp(b), _stamp(n), limit)
    with _lock:
        if key in _kept:
            _kept.move_to_end(key)
            return _kept[key]
    sides = [
        cached_side(r.cache_folder, label, f"{run.run.id}:rank{r.rank}", r.rank, sorted(run.ranks))
        for run, r, label in ((base, b, "BASE"), (new, n, "NEW"))
    ]
    doc = compare_sides(*sides).to_dict(limit)
    with _lock:
        _kept[key] = doc
        while len(_kept) > KEPT:
            _kept.popitem(last=False)
    return doc
