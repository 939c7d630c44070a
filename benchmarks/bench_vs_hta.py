"""Measure perfsight against Holistic Trace Analysis (HTA) 0.5.0 on the same Kineto traces.

Why this exists: perfsight claims to be faster and smaller than the best peer tools; this script is
the reproducible evidence (results go to ``docs/BENCHMARKS.md``).  For each trace it runs, in fresh
processes and alternating so that neither tool gets a warmer machine:

* HTA: ``hta.trace_analysis.TraceAnalysis(trace_dir=...)`` -- HTA's parse, no analysis;
* perfsight: ``perfsight.analyse(trace, out=...)`` -- the full analysis, outputs written.

Import time is excluded from the wall time.  Peak RSS is the child's own ``ru_maxrss`` or that of
its children (in case a tool uses a process pool), whichever is larger.  Each tool runs
``--repeats`` times; medians are reported.  ``--big`` also generates a ~1 GiB synthetic trace with
``gen_kineto_trace.py`` and measures perfsight alone on it (HTA is not run: it needs far more
memory than this benchmark's machines have).

It never crashes on a tool's failure: a run that fails is reported as such (with the last line of
its error) and the script exits 1 after printing the table.  It never writes results that include
a failure into ``--write-md``.

Usage::

    python benchmarks/bench_vs_hta.py [--big] [--repeats 3] [--hta-python /tmp/hta-venv/bin/python]
        [--write-md docs/BENCHMARKS.md]
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import gzip
import json
import os
import platform
import resource
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SHARED_KINETO = ROOT.parent / "shared" / "data" / "kineto"
DEFAULT_TRACES = (
    SHARED_KINETO / "df_index_resolver" / "df_index_resolver.json.gz",
    SHARED_KINETO / "nccl_parser_config" / "nccl_data.json.gz",
)
GENERATOR = Path(__file__).resolve().with_name("gen_kineto_trace.py")
RESULT_PREFIX = "BENCH_RESULT "
TOOLS = ("hta", "perfsight")
MIB = 1024 * 1024


# --------------------------------------------------------------------------------------------------
# Child side: runs in a fresh interpreter, measures one tool once, prints one JSON line.
# --------------------------------------------------------------------------------------------------
def _peak_rss_mb() -> float:
    """Peak resident set size of this process or any child it waited for, in MiB (Linux: KiB)."""
    own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    children = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    return max(own, children) / 1024


def _rss_now_mb() -> float:
    """Resident set size right now, in MiB: taken after a tool's imports, before it reads the
    trace, so the peak can be counted above what merely loading each tool's libraries costs."""
    with open(f"/proc/{os.getpid()}/statm") as handle:
        return int(handle.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / MIB


_MADV_POPULATE_READ = 22  # Linux >= 5.14: fault a mapping's pages in, as reading them would


class ResidentUnsupported(RuntimeError):
    """This kernel cannot make pages resident or reset the peak: the ``--resident`` figure is
    left out of the table (n/a), the benchmark's other figures stand."""


def _make_libraries_resident() -> int:
    """Fault in every page of every file mapped into this process (the libraries' code and data);
    return how many mappings took it.  Why (issue 21's target 3, ``--resident``): a tool's RSS
    grows during its run by the library pages it touches for the first time -- code that every
    later run in the process finds resident, and that the OS may drop and re-read at will -- as well
    as by the memory it allocates for the trace.  With every mapping resident before the baseline,
    the growth is that memory alone, for both tools alike."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    populated = 0
    with open("/proc/self/maps", encoding="utf-8", errors="replace") as maps:
        for line in maps:
            fields = line.split(maxsplit=5)
            if len(fields) < 6 or not fields[5].startswith("/"):
                continue  # anonymous memory, the heap, the stack, [vdso]
            start, end = (int(bound, 16) for bound in fields[0].split("-"))
            populated += libc.madvise(start, end - start, _MADV_POPULATE_READ) == 0
    if not populated:
        raise ResidentUnsupported("madvise(MADV_POPULATE_READ) unsupported (Linux >= 5.14 needed)")
    return populated


def _reset_peak_rss() -> None:
    """From now on ``VmHWM`` is the peak since this call (Linux >= 4.0)."""
    try:
        with open("/proc/self/clear_refs", "w", encoding="ascii") as clear_refs:
            clear_refs.write("5")
    except OSError as error:
        raise ResidentUnsupported(f"cannot reset the peak RSS ({error.strerror})") from error


def _peak_rss_since_reset_mb() -> float:
    with open("/proc/self/status", encoding="ascii") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError("no VmHWM in /proc/self/status")


def _cpu_s() -> float:
    """CPU seconds of this process (all its threads) and of the children it waited for: on a
    loaded machine wall time mostly measures the neighbours, CPU time the work done."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def run_child(tool: str, trace: Path, out_dir: Path, resident: bool = False) -> int:
    """Measure ``tool`` once and print its result line.  ``resident``: make every library page
    resident after the imports (:func:`_make_libraries_resident`) and report the peak above that
    baseline instead of the run's time and absolute peak."""
    try:
        if tool == "hta":
            import logging

            from hta.trace_analysis import TraceAnalysis

            logging.disable(logging.CRITICAL)  # HTA logs every parse step; we only want numbers
            resident_from = _resident_baseline() if resident else None
            imports_mb = _rss_now_mb()
            started, cpu_started = time.perf_counter(), _cpu_s()
            TraceAnalysis(trace_dir=str(trace.parent))
        else:
            import importlib

            import perfsight

            # imports are excluded on both sides: HTA's module import brings pandas; perfsight loads
            # its analyses and writers lazily, and pyarrow loads numpy.ma and dateutil on its first
            # conversions, so load them here (not pandas: perfsight never needs it, see
            # perfsight.ingest.lazy_pandas)
            # (every module the run imports: where bytecode is not cached, PYTHONDONTWRITEBYTECODE
            # as on the benchmark machine, a module first imported inside the timed run is
            # compiled there, about 9 ms that an installed package pays once)
            for module in ("numpy.ma", "perfsight.api", "perfsight.pipeline",
                           "perfsight.export.mindspore_csv", "perfsight.export.trace_view",
                           "perfsight.export.communication_json", "perfsight.export.data_pipeline_files",
                           "perfsight.export.staging", "perfsight.advisor.rank_rules",
                           "perfsight.export.sqlite_db", "perfsight.store.cache",
                           "perfsight.store.timeline_index", "perfsight.advisor.messages",
                           "perfsight.memory_budget", "dateutil.relativedelta"):  # fmt: skip
                with contextlib.suppress(ModuleNotFoundError):  # an older tree (bench_before_after)
                    importlib.import_module(module)
            analyse = getattr(perfsight, "analyse", None)
            if analyse is None:
                raise RuntimeError("perfsight.analyse does not exist yet")
            resident_from = _resident_baseline() if resident else None
            imports_mb = _rss_now_mb()
            started, cpu_started = time.perf_counter(), _cpu_s()
            analyse(trace, out=out_dir)
        wall_s = time.perf_counter() - started
        cpu_s = _cpu_s() - cpu_started
    except ResidentUnsupported as error:
        print(RESULT_PREFIX + json.dumps({"resident_unsupported": str(error)}), flush=True)
        return 0
    except Exception as error:  # report any failure of the tool, never a traceback-only crash
        print(RESULT_PREFIX + json.dumps({"error": f"{type(error).__name__}: {error}"}), flush=True)
        return 1
    if resident_from is not None:
        result = {"resident_above_mb": _peak_rss_since_reset_mb() - resident_from}
    else:
        result = {"wall_s": wall_s, "cpu_s": cpu_s, "peak_rss_mb": _peak_rss_mb()}
        result["imports_rss_mb"] = imports_mb
    print(RESULT_PREFIX + json.dumps(result), flush=True)
    return 0


def _resident_baseline() -> float:
    """RSS (MiB) once every library page is resident, the peak counted from then on."""
    _make_libraries_resident()
    _reset_peak_rss()
    return _rss_now_mb()


# --------------------------------------------------------------------------------------------------
# Parent side.
# --------------------------------------------------------------------------------------------------
@dataclass
class Runs:
    """All runs of one tool on one trace."""

    wall_s: list[float] = field(default_factory=list)
    cpu_s: list[float] = field(default_factory=list)
    peak_rss_mb: list[float] = field(default_factory=list)
    imports_rss_mb: list[float] = field(default_factory=list)
    """RSS after the tool's imports, before the trace is read (the baseline of issue 21's target 3)."""
    resident_above_mb: list[float] = field(default_factory=list)
    """Peak RSS above the baseline taken once every library page is resident (``--resident`` runs)."""
    resident_unsupported: str | None = None
    """Why the ``--resident`` runs could not measure on this machine, if they could not."""
    errors: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return bool(self.wall_s) and not self.errors

    def median_wall_s(self) -> float:
        return statistics.median(self.wall_s)

    def median_cpu_s(self) -> float:
        return statistics.median(self.cpu_s)

    def fastest_wall_s(self) -> float:
        """The run least slowed by the machine's other work: on a shared machine the median wall
        time measures the neighbours too, and a tool using two cores more than one on one core."""
        return min(self.wall_s)

    def median_rss_mb(self) -> float:
        return statistics.median(self.peak_rss_mb)

    def median_imports_mb(self) -> float:
        return statistics.median(self.imports_rss_mb) if self.imports_rss_mb else 0.0

    def median_resident_above_mb(self) -> float | None:
        return statistics.median(self.resident_above_mb) if self.resident_above_mb else None

    def median_above_imports_mb(self) -> float:
        """Median over runs of (peak - that run's RSS after imports)."""
        above = [p - i for p, i in zip(self.peak_rss_mb, self.imports_rss_mb, strict=False)]
        return statistics.median(above) if above else self.median_rss_mb()


def measure_once(
    tool: str,
    trace: Path,
    work_dir: Path,
    timeout_s: float,
    runs: Runs,
    env: dict[str, str] | None = None,
    python: str | None = None,
    resident: bool = False,
) -> None:
    """Copy ``trace`` into a fresh folder under ``work_dir`` and measure ``tool`` on it in a fresh
    process (with ``env`` as its environment when given: ``bench_before_after.py`` points
    PYTHONPATH at another version of perfsight).  ``resident``: the child's ``--resident`` run,
    which adds to ``runs.resident_above_mb`` only.

    The folder (the copy and the outputs) is left in ``work_dir``, which the caller removes once
    every run is done.  Why not at once: on an ext4 file system without a journal (the benchmark
    machine's), creating a file skips every inode of its group deleted in the last one to six
    minutes, reading each one's inode-table entry (``recently_deleted``, ``fs/ext4/ialloc.c``).
    Removing a run's ~70 output files a second before the next run created its own made each of
    those files cost about 0.3 ms of kernel time instead of 0.03: some 60 ms of system time in a
    perfsight run's timed region that a user's analysis does not pay (docs/BENCHMARKS.md).  HTA
    writes no file while it is timed."""
    tmp = tempfile.mkdtemp(prefix=f"bench-{tool}-", dir=work_dir)
    input_dir = Path(tmp) / "input"
    input_dir.mkdir()
    copy = input_dir / trace.name
    shutil.copyfile(trace, copy)
    command = [
        python or sys.executable,
        str(Path(__file__).resolve()),
        "--child",
        tool,
        str(copy),
        str(Path(tmp) / "out"),
        *(["--resident"] if resident else []),
    ]
    try:
        done = subprocess.run(
            command, capture_output=True, text=True, timeout=timeout_s, check=False, env=env
        )
    except subprocess.TimeoutExpired:
        runs.errors.append(f"timed out after {timeout_s:.0f} s")
        return
    lines = [line for line in done.stdout.splitlines() if line.startswith(RESULT_PREFIX)]
    if not lines:
        tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
        runs.errors.append(f"exit {done.returncode}: {tail}")
        return
    result = json.loads(lines[-1][len(RESULT_PREFIX) :])
    if "error" in result:
        runs.errors.append(result["error"])
    elif "resident_above_mb" in result:
        runs.resident_above_mb.append(result["resident_above_mb"])
    elif "resident_unsupported" in result:
        runs.resident_unsupported = result["resident_unsupported"]
    else:
        runs.wall_s.append(result["wall_s"])
        runs.cpu_s.append(result["cpu_s"])
        runs.peak_rss_mb.append(result["peak_rss_mb"])
        if "imports_rss_mb" in result:  # a child of an older tree (bench_before_after) lacks it
            runs.imports_rss_mb.append(result["imports_rss_mb"])


def uncompressed_mb(trace: Path) -> float:
    if trace.suffix != ".gz":
        return trace.stat().st_size / MIB
    size = 0
    with gzip.open(trace, "rb") as handle:
        while chunk := handle.read(MIB):
            size += len(chunk)
    return size / MIB


def machine_description() -> str:
    cpus = len(os.sched_getaffinity(0))
    model = "unknown CPU"
    ram_gib = 0.0
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                ram_gib = int(line.split()[1]) / MIB
                break
    except OSError:
        pass
    return f"{cpus} CPUs (nproc), {model}, {ram_gib:.1f} GiB RAM, Linux {platform.release()}"


def versions(hta_python: str | None = None) -> str:
    """Library versions on perfsight's side, and HTA's (and its pandas) in ``hta_python``'s
    environment when that is another interpreter."""
    found = []
    for dist in ("HolisticTraceAnalysis", "perfsight", "pandas", "numpy", "pyarrow"):
        try:
            found.append(f"{dist} {metadata.version(dist)}")
        except metadata.PackageNotFoundError:
            found.append(f"{dist} not installed")
    text = f"Python {platform.python_version()}; " + ", ".join(found)
    if hta_python and hta_python != sys.executable:
        probe = (
            "from importlib.metadata import version, PackageNotFoundError\n"
            "for d in ('HolisticTraceAnalysis', 'pandas', 'numpy', 'pyarrow'):\n"
            "    try: print(d, version(d))\n"
            "    except PackageNotFoundError: print(d, 'not installed')"
        )
        done = subprocess.run([hta_python, "-c", probe], capture_output=True, text=True, check=False)
        text += f"; HTA's interpreter ({hta_python}): " + ", ".join(done.stdout.split("\n")[:-1])
    return text


def _cell(runs: Runs, what: str) -> str:
    if not runs.ok:
        return "failed"
    if what == "cpu":
        return f"{runs.median_cpu_s():.2f}"
    return f"{runs.median_wall_s():.2f}" if what == "wall" else f"{runs.median_rss_mb():.0f}"


def comparison_table(results: dict[Path, dict[str, Runs]]) -> str:
    rows = [
        "| trace | size MB (file / JSON) | HTA parse s (CPU s) | HTA peak RSS MB "
        "| perfsight analyse s (CPU s) | perfsight peak RSS MB | HTA s / perfsight s (CPU) "
        "| perfsight RSS / HTA RSS | RSS above imports MB: HTA / perfsight (ratio) "
        "| the same, libraries resident: HTA / perfsight (ratio) "
        "| fastest run s: HTA / perfsight (ratio) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for trace, by_tool in results.items():
        hta, ps = by_tool["hta"], by_tool["perfsight"]
        both = hta.ok and ps.ok
        time_ratio = (
            f"{hta.median_wall_s() / ps.median_wall_s():.2f}x ({hta.median_cpu_s() / ps.median_cpu_s():.2f}x)"
            if both
            else "n/a"
        )
        rss_ratio = f"{ps.median_rss_mb() / hta.median_rss_mb():.2f}" if both else "n/a"
        above = "n/a"
        if both:
            h, p = hta.median_above_imports_mb(), ps.median_above_imports_mb()
            above = f"{h:.0f} / {p:.0f} ({p / h:.2f})"
        resident = f"n/a: {ps.resident_unsupported or hta.resident_unsupported or 'not measured'}"
        h_resident, p_resident = hta.median_resident_above_mb(), ps.median_resident_above_mb()
        if both and h_resident is not None and p_resident is not None:
            resident = f"{h_resident:.0f} / {p_resident:.0f} ({p_resident / h_resident:.2f})"
        fastest = "n/a"
        if both:
            h, p = hta.fastest_wall_s(), ps.fastest_wall_s()
            fastest = f"{h:.2f} / {p:.3f} ({h / p:.2f}x)"
        size = f"{trace.stat().st_size / MIB:.1f} / {uncompressed_mb(trace):.1f}"
        rows.append(
            f"| `{trace.name}` | {size} | {_cell(hta, 'wall')} ({_cell(hta, 'cpu')}) | {_cell(hta, 'rss')} "
            f"| {_cell(ps, 'wall')} ({_cell(ps, 'cpu')}) | {_cell(ps, 'rss')} | {time_ratio} | {rss_ratio} "
            f"| {above} | {resident} | {fastest} |"
        )
    return "\n".join(rows)


def big_table(trace: Path, generator_s: float | None, runs: Runs) -> str:
    generated = f"{generator_s:.1f}" if generator_s is not None else "reused"
    return "\n".join(
        [
            "| trace | size MB | generator s | perfsight analyse s | perfsight peak RSS MB |",
            "|---|---:|---:|---:|---:|",
            f"| `{trace.name}` (synthetic) | {trace.stat().st_size / MIB:.0f} | {generated} "
            f"| {_cell(runs, 'wall')} | {_cell(runs, 'rss')} |",
        ]
    )


def failure_notes(results: dict[Path, dict[str, Runs]]) -> list[str]:
    notes = []
    for trace, by_tool in results.items():
        for tool, runs in by_tool.items():
            for error in dict.fromkeys(runs.errors):  # unique, in order
                notes.append(f"- {tool} on `{trace.name}` failed: {error}")
    return notes


def generate_big(path: Path, size_mb: float, seed: int) -> float:
    started = time.perf_counter()
    command = [
        sys.executable,
        str(GENERATOR),
        "--out",
        str(path),
        "--size-mb",
        str(size_mb),
        "--seed",
        str(seed),
    ]
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL)
    return time.perf_counter() - started


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="perfsight vs HTA 0.5.0 (see module docstring).")
    parser.add_argument("--trace", type=Path, action="append", help="trace to compare on (repeatable)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--big", action="store_true", help="also measure perfsight on a ~1 GiB trace")
    parser.add_argument("--big-size-mb", type=float, default=1024.0)
    parser.add_argument("--big-trace", type=Path, help="reuse this big trace instead of generating one")
    parser.add_argument("--seed", type=int, default=0, help="seed of the generated big trace")
    parser.add_argument("--work-dir", type=Path, help="where temporary copies go (default: system temp)")
    parser.add_argument("--timeout", type=float, default=1800.0, help="seconds allowed per run")
    parser.add_argument("--write-md", type=Path, help="append the results to this Markdown file")
    parser.add_argument(
        "--hta-python",
        default=os.environ.get("HTA_PYTHON", sys.executable),
        help="interpreter with HTA 0.5.0 installed, for HTA's runs (default: $HTA_PYTHON, else this one; "
        "HTA pins its own pandas, so it is often kept in a virtual environment of its own)",
    )
    parser.add_argument("--child", nargs=3, metavar=("TOOL", "TRACE", "OUT"), help=argparse.SUPPRESS)
    parser.add_argument("--resident", action="store_true", help=argparse.SUPPRESS)  # a --child mode
    return parser.parse_args(argv)


def _measure_all(
    args: argparse.Namespace, traces: list[Path], work_dir: Path
) -> tuple[list[str], dict[Path, dict[str, Runs]]]:
    """Every run of both tools on ``traces`` (and the big trace with ``--big``), their folders under
    ``work_dir``: the report's tables and the runs behind them."""
    results: dict[Path, dict[str, Runs]] = {}
    for trace in traces:
        results[trace] = {tool: Runs() for tool in TOOLS}
        for repeat in range(args.repeats):
            for tool in TOOLS:
                print(f"[{trace.name}] {tool} run {repeat + 1}/{args.repeats}", file=sys.stderr, flush=True)
                python = args.hta_python if tool == "hta" else sys.executable
                for resident in (False, True):
                    runs = results[trace][tool]
                    measure_once(tool, trace, work_dir, args.timeout, runs, python=python, resident=resident)

    sections = [comparison_table(results)]
    all_results = dict(results)
    if args.big:
        big = args.big_trace.resolve() if args.big_trace else work_dir / "synthetic_rank0.pt.trace.json"
        generator_s = None
        if not args.big_trace:
            print(f"generating {args.big_size_mb:.0f} MiB trace", file=sys.stderr, flush=True)
            generator_s = generate_big(big, args.big_size_mb, args.seed)
        big_runs = Runs()
        print(f"[{big.name}] perfsight", file=sys.stderr, flush=True)
        measure_once("perfsight", big, work_dir, args.timeout, big_runs)
        sections.append(big_table(big, generator_s, big_runs))
        all_results[big] = {"perfsight": big_runs}
    return sections, all_results


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.child:
        tool, trace, out_dir = args.child
        return run_child(tool, Path(trace), Path(out_dir), resident=args.resident)

    traces = [path.resolve() for path in (args.trace or DEFAULT_TRACES)]
    missing = [str(path) for path in traces if not path.is_file()]
    if missing:
        print(f"trace not found: {', '.join(missing)}", file=sys.stderr)
        return 2
    if args.work_dir:
        args.work_dir.mkdir(parents=True, exist_ok=True)

    load_at_start = os.getloadavg()
    # every run's folder stays until all runs are done (see measure_once: why)
    with tempfile.TemporaryDirectory(prefix="bench-vs-hta-", dir=args.work_dir) as session:
        sections, all_results = _measure_all(args, traces, Path(session))
    notes = failure_notes(all_results)

    header = [
        f"## perfsight vs HTA 0.5.0 — {dt.datetime.now(dt.UTC):%Y-%m-%d %H:%M} UTC",
        "",
        f"Command: `{shlex.join(sys.orig_argv)}` (from the repository root)",
        "",
        f"Machine: {machine_description()}; {versions(args.hta_python)}; load average at the start "
        f"{load_at_start[0]:.1f}, at the end {os.getloadavg()[0]:.1f}.",
        "",
        f"Median of {args.repeats} alternating runs per tool, each in a fresh process, import excluded; "
        "CPU s: user + system time of the process and its children, all threads. "
        "HTA: `TraceAnalysis(trace_dir=...)` (parse only). perfsight: `perfsight.analyse(trace, out=...)` "
        "(full analysis and outputs). Peak RSS: max(`ru_maxrss` of the process, of its children). "
        "Fastest run: the least wall time of each tool's runs (the run least slowed by other load). "
        "RSS above imports: peak minus the RSS after the tool's imports; libraries resident: the same "
        "from a run of its own in which every page of every file the process maps (the libraries) "
        "was faulted in (`madvise(MADV_POPULATE_READ)`) before that baseline and the peak counted "
        "from it (`/proc/self/clear_refs`): the memory the tool allocates for the trace, without the "
        "library code it first touches during the run.",
    ]
    report = "\n".join([*header, "", *("\n\n".join(sections).splitlines()), *([""] + notes if notes else [])])
    print(report)

    if args.write_md:
        if notes:
            print(f"\nnot writing {args.write_md}: some measurements failed", file=sys.stderr)
        else:
            args.write_md.parent.mkdir(parents=True, exist_ok=True)
            new_file = not args.write_md.exists()
            with args.write_md.open("a", encoding="utf-8") as handle:
                if new_file:
                    handle.write("# Benchmarks\n\nProduced by `benchmarks/bench_vs_hta.py`; newest last.\n")
                handle.write("\n" + report + "\n")
            print(f"\nappended to {args.write_md}", file=sys.stderr)
    return 1 if notes else 0


if __name__ == "__main__":
    sys.exit(main())
