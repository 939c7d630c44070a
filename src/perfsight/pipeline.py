"""Run every single-device analysis on one trace and write its outputs.

This is the one place that knows the order of work for a rank: read (or take
from the cache), analyse, export.  It holds no metric logic of its own: every
number comes from a function in ``perfsight.analysis``.  The CLI and the
Python API both call it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
import os
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import pyarrow as pa

from perfsight import advisor, heap
from perfsight.analysis import (
    communication,
    data_pipeline,
    data_wait,
    device_idle,
    flops,
    index,
    kernels,
    memory,
    minddata,
    operators,
    overlap,
    step_trace,
)
from perfsight.analysis.op_statistic import op_statistic
from perfsight.export.staging import BackgroundWriter
from perfsight.model import Trace

EXPORT_TYPES = ("text", "db")

log = logging.getLogger(__name__)


@dataclasses.dataclass
class Options:
    """What the user chose; defaults follow the seed (text export, automatic FP/BP points)."""

    fp_point: str | None = None
    bp_point: str | None = None
    export_types: tuple[str, ...] = ("text",)
    rank: int | None = None

    @classmethod
    def from_env(cls, **overrides: object) -> Options:
        """Options with PERFSIGHT_FP_POINT / PERFSIGHT_BP_POINT as defaults (the seed's FP_POINT/BP_POINT)."""
        base = cls(
            fp_point=os.environ.get("PERFSIGHT_FP_POINT") or None,
            bp_point=os.environ.get("PERFSIGHT_BP_POINT") or None,
        )
        for key, value in overrides.items():
            if value is not None:
                setattr(base, key, value)
        return base


class OutputError(OSError):
    """The outputs cannot be written where they were asked for (a file in the way, no space, no
    permission): the message names the folder and the system's reason, for a one-line error."""

    @classmethod
    @contextlib.contextmanager
    def naming(cls, folder: str | Path) -> Iterator[None]:
        """Turn an ``OSError`` raised inside into an ``OutputError`` that names ``folder``."""
        try:
            yield
        except cls:
            raise
        except OSError as exc:
            raise cls(f"cannot write the outputs under {folder}: {exc}") from None


@dataclasses.dataclass
class RankResult:
    """The analysis tables of one rank, by name (see docs/ANALYSIS_CONTRACT.md)."""

    trace: Trace
    tables: dict[str, pa.Table]
    output_dir: Path | None = None
    warnings: list[str] = dataclasses.field(default_factory=list)
    """What the analyses found wrong with the options (a named FP/BP point missing from steps) or
    the source's own results (a vendor step trace that differs from perfsight's); the reader's
    warnings stay in ``trace.meta.warnings``, which the cache saves."""
    bounded: dict[str, int] | None = None
    """Set when the rank was analysed chunk by chunk within a memory limit (``pipeline_bounded.py``):
    ``memory_limit_bytes`` and ``chunks``, which the summary reports."""
    findings: list | None = None
    """The advisor's findings when the analysis computed them without a whole trace (the bounded
    path: ``pipeline_bounded.py``); None means ask ``advisor.rank_findings(tables, trace)``."""


AnalysisFunction = Callable[[Trace, Options, dict[str, pa.Table]], pa.Table]
"""One entry of :data:`ANALYSES`: the trace, the user's options and the tables computed before it."""

ANALYSES: dict[str, AnalysisFunction] = {
    "step_trace": lambda t, o, done: step_trace.step_trace(t, fp_point=o.fp_point, bp_point=o.bp_point),
    "vendor_step_differences": lambda t, o, done: step_trace.vendor_step_differences(
        done["step_trace"], t.vendor.step_trace
    ),
    "overlap_breakdown": lambda t, o, done: overlap.overlap_breakdown(t),
    "overlap_intervals": lambda t, o, done: overlap.overlap_intervals(t),
    "device_idle": lambda t, o, done: device_idle.device_idle(t, done["step_trace"]),
    "time_shares": lambda t, o, done: overlap.time_shares(done["overlap_breakdown"], done["device_idle"]),
    "data_wait": lambda t, o, done: data_wait.data_wait(t),
    "data_queue": lambda t, o, done: (
        minddata.data_queue(t) if minddata.has_minddata(t) else data_pipeline.data_queue(t)
    ),
    "data_stages": lambda t, o, done: (
        minddata.data_stages(t) if minddata.has_minddata(t) else data_pipeline.data_stages(t)
    ),
    "data_workers": lambda t, o, done: data_pipeline.data_workers(t),
    "data_stage_batches": lambda t, o, done: data_pipeline.data_stage_batches(t),
    "data_cpu_utilization": lambda t, o, done: minddata.data_cpu_utilization(t),
    "data_stage_queues": lambda t, o, done: minddata.data_stage_queues(t),
    "data_pipeline_summary": lambda t, o, done: (
        minddata.data_pipeline_summary(t, done["data_stages"], done["data_cpu_utilization"])
        if minddata.has_minddata(t)
        else data_pipeline.data_pipeline_summary(t, done["data_stages"])
    ),
    "operator_instances": lambda t, o, done: operators.operator_instances(t),
    "operator_stats": lambda t, o, done: operators.operator_stats(t, done.get("operator_instances")),
    "operator_ranking": lambda t, o, done: operators.operator_ranking(done["operator_stats"]),
    "kernel_details": lambda t, o, done: kernels.kernel_details(t),
    "kernel_stats": lambda t, o, done: kernels.kernel_stats(t, done.get("kernel_details")),
    "op_statistic": lambda t, o, done: op_statistic(done.get("kernel_details"), done.get("operator_stats")),
    "flops_by_step": lambda t, o, done: flops.flops_by_step(t),
    "memory_curve": lambda t, o, done: memory.memory_curve(t),
    "memory_peaks": lambda t, o, done: memory.memory_peaks(t, done.get("memory_curve")),
    "operator_memory": lambda t, o, done: memory.operator_memory(t),
    "communication_ops": lambda t, o, done: communication.communication_ops(t),
    "communication_links": lambda t, o, done: communication.communication_links(t),
    "communication_sizes": lambda t, o, done: communication.communication_sizes(t),
    "communication_peers": lambda t, o, done: communication.communication_peers(t),
    "communication_steps": lambda t, o, done: communication.step_times(done["communication_ops"]),
    "communication_step_links": lambda t, o, done: communication.step_links(done["communication_links"]),
    "communication_step_sizes": lambda t, o, done: communication.step_sizes(done["communication_sizes"]),
}
"""Every single-device analysis, in order; a table is stored under its function's name.  ``done``
holds the tables computed before it, so an aggregate reuses the table it aggregates.  What the
source's own tool recorded (``trace.vendor``) is added beside these tables under its own names,
never in place of one of them."""


ROW_TABLES = (
    "overlap_intervals",
    "operator_instances",
    "kernel_details",
    "memory_curve",
    "operator_memory",
    "communication_ops",
    "communication_links",
)
"""The tables of :data:`ANALYSES` with a row per event (or per allocation, per collective): the
bounded path never holds them whole (spilled by ``chunked_analysis``, streamed by the chunked
writers)."""


def analyse_trace(
    trace: Trace, options: Options, on_table: Callable[[str, pa.Table], None] | None = None
) -> RankResult:
    """All analysis tables of one rank (pure: nothing is written).  ``on_table(name, table)`` is
    called as each analysis ends (the pipeline starts a writer that needs only that table then)."""
    tables: dict[str, pa.Table] = {}
    try:
        for name, run in ANALYSES.items():
            tables[name] = run(trace, options, tables)
            if on_table is not None:
                on_table(name, tables[name])
        for name, table in trace.vendor.named_tables().items():
            tables.setdefault(name, table)  # the source's own results, beside ours (never for them)
    finally:
        index.release(trace)  # what the analyses shared is not needed by the writers
        heap.return_freed_memory()  # the writers reuse the analyses' freed transients
    return RankResult(trace=trace, tables=tables, warnings=analysis_warnings(tables, options, trace))


def analysis_warnings(tables: dict[str, pa.Table], options: Options, trace: Trace) -> list[str]:
    """What the analyses found wrong with the options or the vendor's results (logged, returned)."""
    warnings = step_trace.named_point_warnings(tables["step_trace"], options.fp_point, options.bp_point)
    warnings += step_trace.vendor_difference_warnings(
        tables["vendor_step_differences"], trace.vendor.STEP_TRACE_TABLE
    )
    for line in warnings:
        log.warning("%s", line)
    return warnings


def analyse_and_write(trace: Trace, rank_dir: Path, options: Options, progress: Any = None) -> RankResult:
    """Analyse ``trace`` and write every output of the rank into ``rank_dir``.

    Why both in one call: the writers share this thread and a second one (Parquet encoding, the
    native trace-view formatter and NumPy release the GIL, so two cores work), and those that need
    the trace or one early table start on the second thread while the analyses still run here: the
    cached trace at once, ``trace_view.json`` as soon as ``overlap_intervals`` exists.
    ``progress`` (tqdm-like, optional) gets ``update(1)`` once analysed and once written.
    ``PROFILER_OUTPUT/`` and ``cache/`` are each complete or absent (see export/staging.py):
    they are written aside and renamed into ``rank_dir`` once every writer has finished.
    """
    from perfsight.export.staging import background_writer, staged
    from perfsight.store import cache

    with (
        staged(rank_dir, (OUTPUT_DIR, CACHE_DIR)) as stage,
        background_writer("perfsight-writer") as background,
    ):
        trace_cached = background.submit(cache.save_trace, trace, stage / CACHE_DIR)
        early = _EarlyTraceView(trace, stage / OUTPUT_DIR, background)
        text = "text" in options.export_types
        result = analyse_trace(trace, options, early.table_done if text else None)
        if progress is not None:
            progress.update(1)
        _write_tables(result, stage, options, background, trace_cached, early.written)
    result.output_dir = rank_dir / OUTPUT_DIR
    if progress is not None:
        progress.update(1)
    return result


@dataclasses.dataclass
class _EarlyTraceView:
    """Queues ``trace_view.json`` (the longest writer) on the writer thread as soon as the table it
    needs beside the trace, ``overlap_intervals`` (the fourth analysis of thirty), exists: it then
    runs beside the analyses rather than after them.

    Why only it: the timeline index queued there too gained no time (the writer thread is then
    busy until the analyses end) and raised the peak memory by 1-2 MB more."""

    trace: Trace
    out: Path
    background: BackgroundWriter
    written: Future | None = None

    def table_done(self, name: str, table: pa.Table) -> None:
        if name == "overlap_intervals":
            self.written = _queue_trace_view(self.background, self.out, self.trace, table)


def _queue_trace_view(background: BackgroundWriter, out: Path, trace: Trace, overlap: pa.Table) -> Future:
    """``out/trace_view.json`` queued on ``background``; its future."""
    from perfsight.export import trace_view

    out.mkdir(parents=True, exist_ok=True)
    return background.submit(trace_view.write_trace_view, out / "trace_view.json", trace, overlap)


class _WriteCost:
    """A writer's rough cost, in Parquet cells: enough to share the writers of a rank between two
    threads evenly (``staging.run_shared``), not a prediction.  Measured on df_index_resolver: a
    Parquet file and the timeline index cost about 25 ns a cell (rows x columns of what they
    write), a CSV or JSON file 90-170 ns (:data:`TEXT`), and every file about 0.5 ms more
    (:data:`TASK`)."""

    TEXT = 5.0
    TASK = 20_000.0

    @classmethod
    def parquet(cls, *tables: pa.Table) -> float:
        return cls.TASK + sum(table.num_rows * table.num_columns for table in tables)

    @classmethod
    def text(cls, *tables: pa.Table) -> float:
        return cls.TASK + cls.TEXT * sum(table.num_rows * table.num_columns for table in tables)

    @classmethod
    def of(cls, writer: Callable[[], Any], text: bool = False) -> float:
        """The cost of a writer made by ``functools.partial`` with the tables it writes among its
        arguments (``mindspore_csv.csv_writers``, ``cache.table_writers``); one file otherwise."""
        args = writer.args if isinstance(writer, functools.partial) else ()
        tables = [arg for arg in args if isinstance(arg, pa.Table)]
        return cls.text(*tables) if text else cls.parquet(*tables)


OUTPUT_DIR, CACHE_DIR = "PROFILER_OUTPUT", "cache"
"""The two folders a rank's analysis writes in its rank folder."""


def _write_tables(
    result: RankResult,
    rank_dir: Path,
    options: Options,
    background: BackgroundWriter,
    trace_cached: Future,
    trace_view_written: Future | None = None,
) -> Path:
    """Every other output, once ``trace_cached`` (the cached trace) and, when given,
    ``trace_view_written`` are under way on ``background``.

    The writers are shared between this thread and ``background`` (``staging.run_shared``): the
    timeline index `perfsight serve` reads (it waits for the cached trace: its stamp digests that
    cache's ``source.json``), each CSV and JSON file, the cached analysis tables.
    """
    from perfsight.export import data_pipeline_files, mindspore_csv, sqlite_db
    from perfsight.export.communication_json import write_communication_json
    from perfsight.export.staging import run_shared
    from perfsight.store import cache, timeline_index

    out = rank_dir / OUTPUT_DIR
    out.mkdir(parents=True, exist_ok=True)
    tables = result.tables
    waiting = [trace_cached]
    if trace_view_written is not None:
        waiting.append(trace_view_written)
    elif "text" in options.export_types:
        waiting.append(_queue_trace_view(background, out, result.trace, tables["overlap_intervals"]))

    def write_index() -> None:
        trace_cached.result()  # on this thread, the cached trace may still be saving
        timeline_index.write_timeline_index(result.trace, rank_dir / CACHE_DIR)

    def write_findings() -> None:
        findings = advisor.rank_findings(tables, result.trace)
        advisor.write_advisor_json(out / advisor.ADVISOR_JSON, findings, "rank")

    slices = result.trace.slices
    # each writer with a rough cost (see _WriteCost), so that the two threads share them evenly
    writers: list[tuple[float, Callable[[], Any]]] = [(_WriteCost.parquet(slices), write_index)]
    if "text" in options.export_types:
        writers += [(_WriteCost.of(csv, text=True), csv) for csv in mindspore_csv.csv_writers(out, tables)]
        writers.append((_WriteCost.TASK, functools.partial(data_pipeline_files.write_all, out, tables)))
        if result.trace.comm.num_rows:
            comm_json = functools.partial(write_communication_json, out / "communication.json", tables)
            comm_rows = (tables["communication_ops"], tables["communication_links"])
            writers.append((_WriteCost.text(*comm_rows), comm_json))
    if "db" in options.export_types:
        db_tables = {**tables, "slices": slices}
        db = functools.partial(sqlite_db.write_db, out / f"perfsight_{result.trace.rank}.db", db_tables)
        writers.append((_WriteCost.text(*db_tables.values()), db))
    writers.append((_WriteCost.parquet(slices) / 4, write_findings))  # the rules read the rank's tables
    table_writers = cache.table_writers(rank_dir / CACHE_DIR, tables)
    writers += [(_WriteCost.of(cached), cached) for cached in table_writers]
    run_shared(background, [writer for _, writer in writers], costs=[cost for cost, _ in writers])
    heap.return_freed_memory()  # the writers' transients
    for future in waiting:
        future.result()  # raises what the background writer raised
    return out
