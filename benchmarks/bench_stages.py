"""Time every analysis and every writer of the pipeline side by side, on one trace, in one process.

Why this exists: ``bench_vs_hta.py`` measures the whole run against HTA; this script says *where*
the time of that run goes, so that an optimisation can be aimed and its effect checked stage by
stage.  The trace is read once (not timed); then, ``--repeats`` times, every analysis of
``perfsight.pipeline.ANALYSES`` runs in pipeline order on a fresh :class:`~perfsight.model.Trace`
(the same tables in a new object, so nothing derived from an earlier round is reused), and every
writer of ``pipeline.analyse_and_write`` writes into a temporary folder.  The table shows the median
and the minimum of each stage, the share of the total, and how much each stage raised the peak
resident memory (first round; the high-water mark only grows, so later stages often show 0), and
``own MB``: how far the stage rose above the resident memory it started with (sampled every 5 ms),
whatever ran before it -- the figure a bounded-memory design has to keep flat.

Last, the same work as the CLI does it (``pipeline.analyse_and_write``: the cached trace is written
beside the analyses, the other writers on two threads) is timed end to end: that wall time is
what a user waits for after the trace is read.  ``--profile`` runs one more round under cProfile and prints
the functions with the most cumulative time.

First, for a Kineto trace, the reading itself is timed in its stages, each ``--repeats`` times:
the native scan (decompression on its own thread included) to raw batches, the cut of those batches
into the trace's parts (``kineto.Parts.add``), and the trace model built from the parts
(``kineto.build_trace``); then the whole ``read_trace`` as the CLI runs it (the scan and the cut
interleaved).  CPU is shown for all threads and for the calling thread alone: the difference is
the decompression thread.

Usage::

    python benchmarks/bench_stages.py [TRACE] [--repeats 5] [--db] [--profile 30]
"""

from __future__ import annotations

import argparse
import cProfile
import dataclasses
import pstats
import resource
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_TRACE = ROOT.parent / "shared" / "data" / "kineto" / "df_index_resolver" / "df_index_resolver.json.gz"


def _peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _rss_mb() -> float:
    """Resident memory now (Linux ``/proc/self/statm``; 0 elsewhere)."""
    try:
        with open("/proc/self/statm", encoding="ascii") as statm:
            return int(statm.read().split()[1]) * resource.getpagesize() / 2**20
    except OSError:
        return 0.0


class _StagePeak:
    """The highest resident memory seen since :meth:`reset`, sampled every 5 ms on a thread.

    Why: ``ru_maxrss`` only grows, so a stage that runs after a bigger one shows +0 MB however
    much it allocates; this says how far each stage itself rises above the memory it started
    with (what a streaming or spilling design must bound), whatever ran before it."""

    def __init__(self) -> None:
        self.start = self.peak = _rss_mb()
        threading.Thread(target=self._sample, daemon=True).start()

    def _sample(self) -> None:
        while True:
            self.peak = max(self.peak, _rss_mb())
            time.sleep(0.005)

    def reset(self) -> None:
        self.start = self.peak = _rss_mb()

    def own_mb(self) -> float:
        return max(self.peak, _rss_mb()) - self.start


_SAMPLER: list[_StagePeak] = []


def _stages(trace, options, folder: Path, db: bool) -> list[tuple[str, str, Callable[[], object]]]:
    """(group, name, thunk) in pipeline order; analysis thunks store their tables for the writers."""
    from perfsight import advisor, pipeline
    from perfsight.export import data_pipeline_files, mindspore_csv, sqlite_db, trace_view
    from perfsight.export.communication_json import write_communication_json
    from perfsight.store import cache, timeline_index

    tables: dict = {}

    def analysis(name: str, run: Callable) -> Callable[[], object]:
        return lambda: tables.__setitem__(name, run(trace, options, tables))

    out = folder / "PROFILER_OUTPUT"
    out.mkdir(parents=True, exist_ok=True)
    stages = [("analysis", name, analysis(name, run)) for name, run in pipeline.ANALYSES.items()]
    stages += [
        (
            "write",
            "kernel_details.csv",
            lambda: mindspore_csv.write_kernel_details(out, tables["kernel_details"]),
        ),
        (
            "write",
            "op_statistic.csv",
            lambda: mindspore_csv.write_op_statistic(out, tables["op_statistic"]),
        ),
        (
            "write",
            "step_trace_time.csv",
            lambda: mindspore_csv.write_step_trace_time(out, tables["overlap_breakdown"]),
        ),
        (
            "write",
            "memory_record.csv",
            lambda: mindspore_csv.write_memory_record(out, tables["memory_curve"]),
        ),
        (
            "write",
            "operator_memory.csv",
            lambda: mindspore_csv.write_operator_memory(out, tables["operator_memory"]),
        ),
        (
            "write",
            "trace_view.json",
            lambda: trace_view.write_trace_view(out / "trace_view.json", trace, tables["overlap_intervals"]),
        ),
    ]
    if trace.comm.num_rows:
        stages.append(
            (
                "write",
                "communication.json",
                lambda: write_communication_json(out / "communication.json", tables),
            )
        )
    stages.append(("write", "data pipeline files", lambda: data_pipeline_files.write_all(out, tables)))
    stages.append(
        (
            "write",
            "advisor.json",
            lambda: advisor.write_advisor_json(
                out / advisor.ADVISOR_JSON, advisor.rank_findings(tables, trace), "rank"
            ),
        )
    )
    if db:
        stages.append(
            (
                "write",
                "perfsight.db",
                lambda: sqlite_db.write_db(out / "perfsight.db", {**tables, "slices": trace.slices}),
            )
        )
    stages += [
        ("write", "cache: trace", lambda: cache.save_trace(trace, folder / "cache")),
        ("write", "cache: tables", lambda: cache.save_tables(folder / "cache", tables)),
        (
            "write",
            "cache: timeline index",
            lambda: timeline_index.write_timeline_index(trace, folder / "cache"),
        ),
    ]
    return stages


def _round(trace, options, db: bool) -> list[tuple[str, str, float, float, float, float]]:
    """One pass over every stage: (group, name, seconds, peak-RSS increase in MB, CPU seconds,
    the stage's own peak above its starting RSS in MB).  CPU time (all threads) is what to
    compare on a loaded machine, where wall time mostly measures the neighbours."""
    if not _SAMPLER:
        _SAMPLER.append(_StagePeak())
    sampler = _SAMPLER[0]
    fresh = dataclasses.replace(trace)  # same tables, new object: no derived data carried over
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for group, name, thunk in _stages(fresh, options, Path(tmp), db):
            before = _peak_mb()
            sampler.reset()
            t0, c0 = time.perf_counter(), time.process_time()
            thunk()
            results.append(
                (
                    group,
                    name,
                    time.perf_counter() - t0,
                    _peak_mb() - before,
                    time.process_time() - c0,
                    sampler.own_mb(),
                )
            )
    return results


def _pipeline_round(trace, options) -> float:
    """Wall seconds of ``pipeline.analyse_and_write`` as the CLI runs it (the writers' overlap with
    the analyses and with each other included), on a fresh trace."""
    from perfsight import pipeline

    fresh = dataclasses.replace(trace)
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        pipeline.analyse_and_write(fresh, Path(tmp), options)
        return time.perf_counter() - t0


def _reading_stages(path: Path, repeats: int) -> None:
    """Print the median CPU of each stage of reading a Kineto trace (see the module docstring)."""
    import perfsight.ingest
    from perfsight.ingest import kineto
    from perfsight.ingest.chrome_events import read_events

    def scan() -> list:
        results, report = read_events(path)
        tables = [r.table for r in results]
        return [tables, report]

    def cut(tables: list) -> kineto.Parts:
        parts = kineto.Parts()
        for table in tables:
            parts.add(table)
        return parts

    rows: dict[str, list[tuple[float, float, float]]] = {}

    def timed(name: str, thunk: Callable[[], object]) -> object:
        t0, c0, m0 = time.perf_counter(), time.process_time(), time.thread_time()
        result = thunk()
        rows.setdefault(name, []).append(
            (time.perf_counter() - t0, time.process_time() - c0, time.thread_time() - m0)
        )
        return result

    for _ in range(max(repeats, 1)):
        tables, report = timed("scan to raw batches", scan)  # type: ignore[misc]
        parts = timed("cut into parts", lambda tables=tables: cut(tables))
        meta = kineto._metadata(path, report.header, None, [])
        timed(
            "build the model", lambda parts=parts, meta=meta: kineto.build_trace(parts, meta, truncated=False)
        )
        del tables, parts
        timed("read_trace (whole)", lambda: perfsight.ingest.read_trace(path))
    print(f"{'group':<9} {'stage':<22} {'median s':>9} {'CPU s':>8} {'thread CPU s':>13}")
    for name, runs in rows.items():
        wall, cpu, own = (statistics.median(r[i] for r in runs) for i in range(3))
        print(f"{'read':<9} {name:<22} {wall:9.4f} {cpu:8.4f} {own:13.4f}")
    print()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("trace", nargs="?", type=Path, default=DEFAULT_TRACE)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--db", action="store_true", help="also time the SQLite export")
    parser.add_argument(
        "--profile",
        type=int,
        default=0,
        metavar="N",
        help="after timing, profile one round and print the top N functions",
    )
    args = parser.parse_args(argv)

    rss_start = _peak_mb()
    t0 = time.perf_counter()
    import perfsight.ingest
    from perfsight.pipeline import Options

    import_s = time.perf_counter() - t0
    rss_imports = _peak_mb()
    t0 = time.perf_counter()
    trace = perfsight.ingest.read_trace(args.trace)
    read_s = time.perf_counter() - t0
    rss_read = _peak_mb()
    options = Options()
    had_pandas = "pandas" in sys.modules

    rounds = [_round(trace, options, args.db) for _ in range(max(args.repeats, 1))]
    first = rounds[0]
    print(
        f"trace: {args.trace.name}  slices={trace.slices.num_rows:,}  memory={trace.memory.num_rows:,}  "
        f"flows={trace.flows.num_rows:,}"
    )
    print(
        f"import {import_s:.3f} s, read {read_s:.3f} s; peak RSS: start {rss_start:.0f} MB, "
        f"after imports {rss_imports:.0f} MB, after read {rss_read:.0f} MB"
    )
    print(f"pandas imported: before analyses {had_pandas}, after {'pandas' in sys.modules}")
    print()
    if ".json" in args.trace.name:  # a Kineto trace file: its reading in stages
        _reading_stages(args.trace, args.repeats)
    print(
        f"{'group':<9} {'stage':<22} {'median s':>9} {'min s':>8} {'CPU s':>8} {'share':>6} {'+peak MB':>9}"
        f" {'own MB':>7}"
    )
    total_median = 0.0
    sums: dict[str, float] = {}
    medians = []
    for i, (group, name, _, grow, _, _) in enumerate(first):
        times = [r[i][2] for r in rounds]
        med = statistics.median(times)
        cpu = statistics.median(r[i][4] for r in rounds)
        medians.append((group, name, med, min(times), cpu, grow, first[i][5]))
        total_median += med
        sums[group] = sums.get(group, 0.0) + med
    for group, name, med, low, cpu, grow, own in medians:
        share = med / total_median if total_median else 0.0
        print(f"{group:<9} {name:<22} {med:9.4f} {low:8.4f} {cpu:8.4f} {share:6.1%} {grow:9.1f} {own:7.1f}")
    for group, total in sums.items():
        print(f"{group:<9} {'(total)':<22} {total:9.4f}")
    print(f"{'all':<9} {'(total)':<22} {total_median:9.4f}")
    pipeline_s = statistics.median(_pipeline_round(trace, options) for _ in range(max(args.repeats, 1)))
    print(f"{'pipeline':<9} {'analyse_and_write':<22} {pipeline_s:9.4f}  (wall, as the CLI runs it)")
    print(f"peak RSS at the end: {_peak_mb():.0f} MB")

    if args.profile:
        profiler = cProfile.Profile()
        profiler.enable()
        _round(trace, options, args.db)
        profiler.disable()
        pstats.Stats(profiler).sort_stats("cumulative").print_stats(args.profile)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
