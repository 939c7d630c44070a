"""One side of a comparison: the analysis tables of one rank of one run, and the steps to average.

Why its own module: a side may come from an analysed folder (its Parquet cache: read the analysis
tables only, never the trace's slices, so that comparing two 1 GB traces costs what reading their
summaries costs), from any input ``perfsight analyse`` takes (analysed in memory through
:func:`perfsight.api.load`), or be one rank of a job (``JOB:rank3``).  Everything after this module
sees one shape: a :class:`Side`.

This module must not compute a metric: the numbers are the single-rank analyses' tables as
they are; it only picks the rank and the steps (the warm-up policy of
:data:`perfsight.analysis.step_trace.MIN_STEPS_TO_DROP_WARMUP`).
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import numpy as np
import pyarrow as pa

from perfsight import columns, layout
from perfsight.analysis.step_trace import MIN_STEPS_TO_DROP_WARMUP

RANK_SUFFIX = re.compile(r"^(?P<path>.+):rank(?P<rank>\d+)$")
"""``JOB:rankN``: one rank of a job (the path may itself hold colons, the suffix may not)."""

NEEDED_TABLES = (
    "step_trace",
    "overlap_breakdown",
    "device_idle",
    "communication_ops",
    "communication_links",
    "communication_steps",
    "data_wait",
    "flops_by_step",
    "memory_peaks",
    "operator_instances",
    "kernel_details",
)
"""The analysis tables a comparison reads (names of ``perfsight.pipeline.ANALYSES``)."""
LARGE_TABLE_COLUMNS = {
    "operator_instances": ("rank", "step", "name", "input_dims", "self_ns", "device_ns", "dur_ns"),
    "kernel_details": ("rank", "step", "name", "op", "op_type", "dur_ns"),
    "communication_ops": (
        "rank",
        "op",
        "step",
        "name",
        "group",
        "collective",
        "elapse_ns",
        "transit_ns",
        "wait_ns",
    ),
    "communication_links": ("rank", "op", "bytes"),
}
"""The columns read of the tables that grow with the trace (a 1 GB trace: a million operator rows)."""


class CompareInputError(ValueError):
    """A side that cannot be compared; the message names the input and what is wrong with it."""


@dataclasses.dataclass
class Side:
    """The analysis tables of one rank, and which of its steps the per-step averages use."""

    label: str  # BASE or NEW, for every message
    spec: str  # what the user gave (PATH or PATH:rankN), for every heading
    rank: int
    ranks: list[int]  # every rank the input holds (a job's), so a note can say which was taken
    tables: dict[str, pa.Table]
    steps_used: list[int]  # the steps averaged; [] when the run has no steps (then: the whole run)
    steps_all: list[int]
    notes: list[str] = dataclasses.field(default_factory=list)

    @property
    def step_count(self) -> int:
        """Divisor of every per-step average (1 for a run without steps: its whole window)."""
        return max(len(self.steps_used), 1)

    def table(self, name: str) -> pa.Table:
        return self.tables[name]


def parse_spec(spec: str) -> tuple[Path, int | None]:
    """``PATH`` or ``PATH:rankN`` -> (path, rank or None)."""
    match = RANK_SUFFIX.match(spec)
    if match and not Path(spec).exists():
        return Path(match["path"]), int(match["rank"])
    return Path(spec), None


def _cache_folders(path: Path) -> dict[int, Path]:
    """Rank -> the rank's cache folder under an analysed ``path`` (the first window of a rank)."""
    from perfsight.store import cache

    if not path.is_dir():
        return {}
    found = sorted(
        {p.parent for name in layout.CACHE_MARKERS for p in path.glob(f"**/{layout.CACHE_DIR}/{name}")}
    )
    folders: dict[int, Path] = {}
    for folder in found:
        try:
            rank = cache.load_meta(folder).rank
        except cache.CacheError as error:
            raise CompareInputError(str(error)) from None
        folders.setdefault(rank, folder)
    return folders


def load_side(spec: str, label: str) -> Side:
    """The side ``spec`` names (see the module docstring); :class:`CompareInputError` if it cannot be."""
    path, rank = parse_spec(spec)
    if not path.exists():
        raise CompareInputError(f"{label} {spec}: no such file or folder")
    cached = _cache_folders(path)
    if cached:
        chosen = _choose_rank(spec, label, rank, sorted(cached))
        return cached_side(cached[chosen], label, spec, chosen, sorted(cached))
    return _analysed_in_memory(spec, label, path, rank)


def cached_side(folder: Path, label: str, spec: str, rank: int, ranks: list[int]) -> Side:
    """The side of one rank's cache folder (``.../cache``): its analysis tables and its steps only."""
    from perfsight.store import cache

    try:
        tables = cache.load_tables(folder, NEEDED_TABLES, LARGE_TABLE_COLUMNS)
        steps = cache.load_trace_table(folder, "steps")
    except cache.CacheError as error:
        raise CompareInputError(f"{label} {spec}: {error}") from None
    return _side(spec, label, rank, ranks, tables, steps)


def _analysed_in_memory(spec: str, label: str, path: Path, rank: int | None) -> Side:
    """An input not analysed yet: read and analysed here (nothing written), as ``perfsight.load``."""
    from perfsight.api import InputError, load
    from perfsight.ingest import TraceReadError

    try:
        analysis = load(path)
    except (InputError, TraceReadError, OSError) as error:
        raise CompareInputError(f"{label} {spec}: {error}") from None
    chosen = _choose_rank(spec, label, rank, sorted(analysis.ranks))
    result = analysis.ranks[chosen]
    tables = {name: result.tables[name] for name in NEEDED_TABLES if name in result.tables}
    return _side(spec, label, chosen, sorted(analysis.ranks), tables, result.trace.steps)


def _choose_rank(spec: str, label: str, rank: int | None, ranks: list[int]) -> int:
    if rank is None:
        return ranks[0]
    if rank not in ranks:
        raise CompareInputError(f"{label} {spec}: no rank {rank}; it holds rank(s) {_ranks_text(ranks)}")
    return rank


def _ranks_text(ranks: list[int]) -> str:
    return ", ".join(map(str, ranks[:16])) + (f" ... ({len(ranks)} ranks)" if len(ranks) > 16 else "")


def _side(
    spec: str, label: str, rank: int, ranks: list[int], tables: dict[str, pa.Table], steps: pa.Table
) -> Side:
    missing = [name for name in NEEDED_TABLES if name not in tables]
    if "step_trace" in missing:
        raise CompareInputError(
            f"{label} {spec}: its analysis has no step_trace table (written by an older perfsight?): "
            "analyse it again"
        )
    notes = [f"{label}: {name} was not in its analysis; compared as empty" for name in missing]
    for name in missing:
        tables[name] = pa.table({"rank": pa.array([], pa.int32()), "step": pa.array([], pa.int32())})
    if len(ranks) > 1 and parse_spec(spec)[1] is None:
        notes.append(
            f"{label} holds ranks {_ranks_text(ranks)}: rank {rank} compared (choose with PATH:rankN)"
        )
    used, every = steps_to_average(tables["step_trace"], steps)
    if every and len(used) < len(every):
        dropped = sorted(set(every) - set(used))
        notes.append(
            f"{label}: step(s) {', '.join(map(str, dropped))} left out (warm-up or cut by the window)"
        )
    return Side(
        label=label,
        spec=spec,
        rank=rank,
        ranks=ranks,
        tables=tables,
        steps_used=used,
        steps_all=every,
        notes=notes,
    )


def steps_to_average(step_trace: pa.Table, steps: pa.Table) -> tuple[list[int], list[int]]:
    """(steps averaged, every step of the step trace): the complete steps, less the first when at
    least :data:`MIN_STEPS_TO_DROP_WARMUP` complete steps remain -- the policy of the cluster step
    trace and the advisor, so that the three agree on what "per step" means."""
    every = (
        np.unique(columns.int64(step_trace.column("step"))) if step_trace.num_rows else np.zeros(0, np.int64)
    )
    if not every.size:
        return [], []
    complete = np.ones(every.size, bool)
    if steps.num_rows:
        known = columns.int64(steps.column("step"))
        cut = known[~columns.numpy(steps.column("complete"), null=False).astype(bool)]
        complete &= ~np.isin(every, cut)
    if complete.sum() >= MIN_STEPS_TO_DROP_WARMUP:
        complete[np.flatnonzero(complete)[0]] = False
    if not complete.any():
        complete[:] = True  # nothing survives the policy: average what there is, rather than nothing
    return every[complete].tolist(), every.tolist()
