"""The step trace with forward/backward points the user picked in the UI (the seed's FP_POINT/BP_POINT).

Why a module of its own: the analysis cached with a run used the points chosen at analysis time
(automatic detection unless ``--fp-point``/``--bp-point``).  When the user picks other ops on the
step-trace page, the step trace is computed again by the same function,
:func:`perfsight.analysis.step_trace.step_trace`, on the rank's cached trace -- never by a copy of
its rules here -- and saved once per choice in the server's own folder for the run, so a second
visit with the same points reads a file.  The candidate ops offered are host operators found in
the steps, in the order they usually start within a step.

This module must not write into the served folders, nor decide any number of the step trace.
"""

from __future__ import annotations

import hashlib
import tempfile
import threading
import uuid
from pathlib import Path
from typing import Any

import orjson
import pyarrow.parquet as pq

from perfsight.analysis import step_trace as step_trace_analysis
from perfsight.model import SliceKind
from perfsight.server import queries
from perfsight.server.registry import RankData
from perfsight.store import cache

MAX_CANDIDATES = 2000
"""Candidate ops listed for the FP/BP pickers (distinct names; a typed name need not be among them)."""

_locks: dict[str, threading.Lock] = {}
_locks_guard = threading.Lock()
_scratch: list[Path] = []
"""Where chosen step traces go for a rank the server has no folder of its own for (never the run's):
a temporary folder made on first need."""


def _lock(key: str) -> threading.Lock:
    with _locks_guard:
        return _locks.setdefault(key, threading.Lock())


def _scratch_folder() -> Path:
    with _locks_guard:
        if not _scratch:
            _scratch.append(Path(tempfile.mkdtemp(prefix="perfsight-steps-")))
        return _scratch[0]


def chosen(fp_point: str | None, bp_point: str | None) -> bool:
    """Whether the user named a point (else the cached analysis answers)."""
    return bool(fp_point) or bool(bp_point)


def step_trace_path(data: RankData, fp_point: str | None, bp_point: str | None) -> Path:
    """The ``step_trace`` table of ``data`` with these points: the cached analysis's own file when
    none is named, else the analysis run again with them, saved once per (cache, points)."""
    if not chosen(fp_point, bp_point):
        return data.table_path("step_trace")
    stamp = data.timeline.meta.get("stamp", "")
    key = hashlib.sha256(orjson.dumps([str(data.cache_folder), stamp, fp_point, bp_point])).hexdigest()[:20]
    folder = data.overview_file.parent if data.overview_file is not None else _scratch_folder()
    target = folder / f"step_trace_rank{data.rank}_{key}.parquet"
    with _lock(key):
        if target.is_file():
            return target
        trace = cache.load_trace(data.cache_folder)
        table = step_trace_analysis.step_trace(trace, fp_point=fp_point or None, bp_point=bp_point or None)
        folder.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(f".{target.name}.{uuid.uuid4().hex}.tmp")
        try:
            pq.write_table(table, tmp)
            tmp.replace(target)
        finally:
            tmp.unlink(missing_ok=True)
    return target


def warnings(path: Path, fp_point: str | None, bp_point: str | None) -> list[str]:
    """The analysis's own lines for a named point some steps could not use (a misspelt op)."""
    if not chosen(fp_point, bp_point) or not path.is_file():
        return []
    table = pq.ParquetFile(path).read(columns=["rank", "fp_op", "bp_op"])
    return step_trace_analysis.named_point_warnings(table, fp_point or None, bp_point or None)


def candidates(data: RankData) -> list[dict[str, Any]]:
    """Host operators inside the profiled steps, by name: in how many steps each appears and its
    median start from the step's start (the order they are listed in), so the forward pass's first
    op is near the top and the backward pass's last near the bottom."""
    slices, steps = data.cache_folder / "slices.parquet", data.table_path("step_trace")
    if not slices.is_file() or not steps.is_file():
        return []
    sql = (
        "SELECT CAST(s.name AS VARCHAR) AS name, count(*) AS count, count(DISTINCT s.step) AS steps, "
        "CAST(median(s.start_ns - t.start_ns) AS BIGINT) AS offset_ns "
        "FROM read_parquet(?) s JOIN read_parquet(?) t ON s.step = t.step "
        "WHERE NOT s.is_device AND CAST(s.kind AS VARCHAR) = ? "
        "GROUP BY s.name ORDER BY offset_ns, name LIMIT ?"
    )
    return queries.records(
        queries.arrow(sql, [str(slices), str(steps), SliceKind.CPU_OP.value, MAX_CANDIDATES])
    )
