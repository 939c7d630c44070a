"""The Python API: ``perfsight.analyse`` (write outputs) and ``perfsight.load`` (tables in memory).

Both accept a trace file, a folder of trace files (one per rank), or a folder
``perfsight analyse`` already wrote (then ``load`` reads the Parquet cache and
never re-parses the traces).
"""

from __future__ import annotations

import dataclasses
import logging
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from perfsight import arrow_pool  # noqa: F401 - before pyarrow: Arrow's allocator (see there)

# isort: split
import pyarrow as pa

from perfsight import layout
from perfsight.ingest import TraceReadError, find_traces, read_trace, run_folder
from perfsight.ingest.lazy_pandas import pandas_deferred
from perfsight.model import Trace
from perfsight.pipeline import ROW_TABLES, Options, OutputError, RankResult, analyse_and_write, analyse_trace

log = logging.getLogger(__name__)

_TRACE_SUFFIX = re.compile(r"(\.pt)?(\.trace)?\.json(\.gz)?$")


class InputError(ValueError):
    """Nothing analysable at the given path; the message says what was found instead."""


@dataclasses.dataclass
class Analysis:
    """The result of analysing one run: per-rank tables, as Arrow or pandas."""

    ranks: dict[int, RankResult]
    output_root: Path | None = None

    def table(self, name: str) -> pa.Table:
        """One analysis table over all ranks (see docs/ANALYSIS_CONTRACT.md for names).

        A rank analysed within a memory limit kept its per-row tables (``pipeline.ROW_TABLES``)
        on disk only: asking for one reads it whole from that rank's cache."""
        parts = [_rank_table(r, name) for r in self.ranks.values()]
        parts = [part for part in parts if part is not None]
        if not parts:
            raise KeyError(f"no table named {name!r}; have {sorted(self.table_names)}")
        return pa.concat_tables(parts, promote_options="permissive")

    @property
    def table_names(self) -> list[str]:
        on_disk = {n for r in self.ranks.values() if r.bounded for n in ROW_TABLES}
        return sorted({n for r in self.ranks.values() for n in r.tables} | on_disk)

    def df(self, name: str) -> Any:
        """``table(name)`` as a pandas DataFrame, for notebooks."""
        return self.table(name).to_pandas()

    def trace(self, rank: int | None = None) -> Trace:
        return self.ranks[rank if rank is not None else min(self.ranks)].trace

    def __getattr__(self, name: str) -> Any:
        # analysis.step_trace, analysis.kernel_details, ... as DataFrames
        if name.startswith("_") or name in {"ranks", "output_root"}:
            raise AttributeError(name)
        try:
            return self.df(name)
        except KeyError as exc:
            raise AttributeError(str(exc)) from None

    @property
    def slices(self) -> Any:
        return pa.concat_tables([r.trace.slices for r in self.ranks.values()]).to_pandas()


def _rank_table(result: RankResult, name: str) -> pa.Table | None:
    """``name`` of one rank: from its tables, or its cache when the bounded path left it there."""
    if name in result.tables:
        return result.tables[name]
    if result.bounded and name in ROW_TABLES and result.output_dir is not None:
        from perfsight.store import cache

        return cache.load_tables(result.output_dir.parent / layout.CACHE_DIR, [name]).get(name)
    return None


def trace_files(path: Path) -> list[Path]:
    """The trace files a path stands for; raises InputError with a reason when there are none."""
    if not path.exists():
        raise InputError(f"{path}: no such file or folder")
    if path.is_file():
        return [path]
    files = find_traces(path)
    if not files and run_folder.incomplete_windows(path):
        raise InputError("; ".join(run_folder.incomplete_windows(path)))
    if not files:
        raise InputError(f"{path}: no trace files (*.json, *.json.gz) found under this folder")
    return files


def default_output_root(path: Path) -> Path:
    """Outputs go next to the input: ``<stem>_perfsight/`` beside a file, inside a folder otherwise."""
    if path.is_file():
        return path.parent / (_TRACE_SUFFIX.sub("", path.name) + "_perfsight")
    if run_folder.is_run_folder(path):
        return path  # a run folder holds its own PROFILER_OUTPUT/, as the collector writes it
    return path / "perfsight_output"


class _RankDirs:
    """Where each rank's outputs go under ``root``: ``rank<N>/`` (a second window of one rank gets
    its file's or run folder's name after it), or ``root`` itself for a run folder's one trace."""

    def __init__(self, root: Path, traces: int) -> None:
        self.root = root
        self.single_run = traces == 1 and run_folder.is_run_folder(root)
        self.seen: dict[int, int] = {}

    def place(self, source: Path, rank: int) -> Path:
        if self.single_run:
            return self.root
        self.seen[rank] = self.seen.get(rank, 0) + 1
        # several windows of one rank: each run folder's name is unique, its trace file's is not
        label = source.parent.name if run_folder.is_run_folder(source.parent) else source.name
        name = f"rank{rank}" if self.seen[rank] == 1 else f"rank{rank}_{_TRACE_SUFFIX.sub('', label)}"
        return self.root / name


def _rank_dirs(traces: Iterable[tuple[Path, Trace]], root: Path) -> list[tuple[Trace, Path]]:
    traces = list(traces)
    dirs = _RankDirs(root, len(traces))
    return [(trace, dirs.place(source, trace.rank)) for source, trace in traces]


def read_all(
    path: Path, options: Options, progress: Any = None, files: list[Path] | None = None
) -> list[tuple[Path, Trace]]:
    """Read every trace under ``path`` (or ``files`` of it); an unreadable file is a warning, not a
    failure, when others read."""
    traces = []
    errors = []
    files = trace_files(path) if files is None else files
    for file in files:
        try:
            traces.append((file, read_trace(file, rank=options.rank)))
        except TraceReadError as exc:
            errors.append(str(exc))
            log.warning("%s", exc)
        if progress is not None:
            progress.update(1)
    if path.is_dir():
        for line in run_folder.incomplete_windows(path):  # a killed rank's window: named, not hidden
            log.warning("%s", line)
            errors.append(line)
    if not traces:
        raise InputError("; ".join(errors) or f"{path}: nothing readable")
    for _, trace in traces:
        trace.meta.warnings.extend(f"skipped {e}" for e in errors)
    return traces


def analyse(
    path: str | Path,
    out: str | Path | None = None,
    *,
    fp_point: str | None = None,
    bp_point: str | None = None,
    export_types: Iterable[str] = ("text",),
    rank: int | None = None,
    memory_limit: int | None = None,
    progress: Any = None,
) -> Analysis:
    """Analyse a trace (or a folder of per-rank traces) and write the outputs; returns the tables.

    ``memory_limit`` (bytes): a Kineto trace whose whole-trace analysis would need more is
    analysed chunk of steps by chunk within it (``pipeline_bounded.py``; same outputs).  Without
    it, a trace that would need more than half the memory available is analysed so within that.
    ``progress`` is an optional tqdm-like object: ``update(1)`` is called per stage.
    """
    path = Path(path)
    options = Options.from_env(
        fp_point=fp_point, bp_point=bp_point, export_types=tuple(export_types), rank=rank
    )
    unknown = set(options.export_types) - {"text", "db"}
    if unknown:
        raise InputError(f"unknown export type(s) {sorted(unknown)}; choose from text, db")
    root = Path(out) if out is not None else default_output_root(path)
    ranks: dict[int, RankResult] = {}
    files = trace_files(path)
    budgets = {file: _budget(file, memory_limit) for file in files}
    dirs = _RankDirs(root, len(files))
    with pandas_deferred():  # reading, analyses and writers never need pandas: keep its 32 MB out
        whole = [file for file in files if budgets[file] is None]
        for source, trace in read_all(path, options, progress, whole) if whole else ():
            rank_dir = dirs.place(source, trace.rank)
            with OutputError.naming(rank_dir):
                result = analyse_and_write(trace, rank_dir, options, progress)
            ranks.setdefault(result.trace.rank, result)
        for file in files:
            budget = budgets[file]
            if budget is not None:
                result = _analyse_bounded(file, dirs, options, budget, progress)
                ranks.setdefault(result.trace.rank, result)
    return Analysis(ranks=ranks, output_root=root)


def _budget(file: Path, memory_limit: int | None) -> int | None:
    """The memory budget ``file`` is analysed within, or None for the whole-trace path."""
    from perfsight import memory_budget
    from perfsight.ingest import BOUNDED_INPUTS, bounded_input

    if not bounded_input(file):
        if memory_limit is not None:
            log.warning("%s: read whole (the memory limit applies to %s)", file, BOUNDED_INPUTS)
        return None
    return memory_budget.budget_for(file, memory_limit)


def _analyse_bounded(file: Path, dirs: _RankDirs, options: Options, budget: int, progress: Any) -> RankResult:
    """One trace through the bounded path (its rank folder is known once the reader has its rank)."""
    from perfsight.pipeline_bounded import analyse_and_write_bounded

    if progress is not None:
        progress.update(1)  # the reading stage of the progress bar: the bounded path reads as it goes
    return analyse_and_write_bounded(
        file, dirs.root, lambda rank: dirs.place(file, rank), options, budget, progress
    )


def _in_staging(folder: Path, root: Path) -> bool:
    """Whether ``folder`` lies in a hidden ``.perfsight-partial-*`` staging folder under ``root``."""
    from perfsight.export.staging import STAGING_PREFIX

    return any(part.startswith(STAGING_PREFIX) for part in folder.relative_to(root).parts)


def load(path: str | Path, *, rank: int | None = None) -> Analysis:
    """Tables for a notebook: from the Parquet cache of an analysed folder, else analysed in memory."""
    from perfsight.store import cache

    path = Path(path)
    # a damaged cache too (layout.CACHE_MARKERS): loading it says what is missing
    found = (p.parent for name in layout.CACHE_MARKERS for p in path.glob(f"**/cache/{name}"))
    # a staging folder left by a killed analysis is not an analysis (export/staging.py)
    cached = sorted({f for f in found if not _in_staging(f, path)}) if path.is_dir() else []
    if cached:
        ranks = {}
        for folder in cached:
            trace = cache.load_trace(folder)
            ranks[trace.rank] = RankResult(
                trace=trace, tables=cache.load_tables(folder), output_dir=folder.parent / "PROFILER_OUTPUT"
            )
        return Analysis(ranks=ranks, output_root=path)
    options = Options.from_env(rank=rank)
    ranks = {}
    for _, trace in read_all(path, options):
        ranks.setdefault(trace.rank, analyse_trace(trace, options))
    return Analysis(ranks=ranks)
