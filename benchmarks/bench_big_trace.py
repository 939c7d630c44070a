"""Peak memory and wall time of ``perfsight analyse`` on generated traces of growing size.

Why this exists: issue 21 asks that memory stay bounded and time grow linearly with the trace
(1, 2 and 10 GB Kineto traces, plain and gzip).  This script generates each trace with
``gen_kineto_trace.py`` (one at a time: a 10 GB trace and its outputs take ~20 GB of disk), runs
the command users run (``perfsight analyse TRACE --out OUT --json``) in a fresh process, samples
that process's resident memory every 50 ms, and deletes the trace and its outputs before the next
size.  It prints one row per trace and the ratios that the targets are stated in: peak against
the smallest trace's peak, and wall time per GB against the smallest trace's.

``--timeline`` writes each run's RSS samples (CSV: seconds, MB) next to the traces, to see
which phase (reading, analyses, writers) holds the peak; ``bench_stages.py`` gives each stage's own
peak in one process.

Usage::

    python benchmarks/bench_big_trace.py --sizes 1024 2048 [--gzip] [--dir /tmp/bm] [--keep]
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SAMPLE_S = 0.05


def _rss_mb(pid: int) -> float | None:
    """Resident memory of ``pid`` in MB (None once it has exited)."""
    try:
        with open(f"/proc/{pid}/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def generate(size_mb: int, folder: Path, gzip: bool) -> Path:
    """A ``size_mb`` trace (uncompressed JSON size) in ``folder``; gzip-1 compressed if asked."""
    folder.mkdir(parents=True, exist_ok=True)
    plain = folder / "rank0.pt.trace.json"
    generator = [sys.executable, str(ROOT / "benchmarks" / "gen_kineto_trace.py")]
    subprocess.run([*generator, "--out", str(plain), "--size-mb", str(size_mb)], check=True)
    if not gzip:
        return plain
    packed = plain.with_suffix(".json.gz")
    with open(packed, "wb") as out:
        subprocess.run(["gzip", "-1", "-c", str(plain)], stdout=out, check=True)
    plain.unlink()
    return packed


def measure(
    trace: Path, out: Path, timeline: Path | None = None, memory_limit: str | None = None
) -> dict[str, float]:
    """Run ``perfsight analyse`` on ``trace`` in a fresh process: wall s, CPU s, peak RSS MB."""
    shutil.rmtree(out, ignore_errors=True)
    command = [sys.executable, "-c", "from perfsight.cli import main; main()", "analyse", str(trace)]
    command += ["--out", str(out), "--no-progress", "--json"]
    if memory_limit:
        command += ["--memory-limit", memory_limit]
    samples: list[tuple[float, float]] = []
    t0 = time.perf_counter()
    child = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)

    def sample() -> None:
        while child.poll() is None:
            rss = _rss_mb(child.pid)
            if rss is not None:
                samples.append((time.perf_counter() - t0, rss))
            time.sleep(SAMPLE_S)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    _, status, usage = os.wait4(child.pid, 0)
    wall = time.perf_counter() - t0
    child.returncode = os.waitstatus_to_exitcode(status)
    sampler.join()
    errors = child.stderr.read().decode(errors="replace") if child.stderr else ""
    if child.returncode != 0:
        raise RuntimeError(f"perfsight analyse {trace} failed ({child.returncode}): {errors[-2000:]}")
    if timeline is not None:
        timeline.write_text("".join(f"{t:.2f},{mb:.0f}\n" for t, mb in samples))
    return {
        "wall_s": wall,
        "cpu_s": usage.ru_utime + usage.ru_stime,
        "peak_mb": usage.ru_maxrss / 1024,
        "sampled_peak_mb": max((mb for _, mb in samples), default=0.0),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[1024, 2048], help="trace sizes in MB")
    parser.add_argument("--gzip", action="store_true", help="gzip each trace (level 1) before analysing")
    parser.add_argument("--dir", type=Path, default=Path("/tmp/bm"), help="where traces and outputs go")
    parser.add_argument("--keep", action="store_true", help="keep the traces (default: delete each after)")
    parser.add_argument("--timeline", action="store_true", help="write each run's RSS samples as CSV")
    parser.add_argument(
        "--memory-limit", help="pass --memory-limit SIZE to perfsight analyse (the bounded path)"
    )
    parser.add_argument(
        "--traces",
        type=Path,
        nargs="+",
        help="analyse these existing traces instead (JSON size from the file's, a gzip file's as 9 times it)",
    )
    args = parser.parse_args(argv)
    if args.traces:
        return _existing(args)

    rows = []
    for size in args.sizes:
        folder = args.dir / f"big{size}{'gz' if args.gzip else ''}"
        existing = folder / ("rank0.pt.trace.json.gz" if args.gzip else "rank0.pt.trace.json")
        trace = existing if existing.exists() else generate(size, folder, args.gzip)
        out = args.dir / f"out{size}"
        timeline = args.dir / f"rss_{size}{'gz' if args.gzip else ''}.csv" if args.timeline else None
        try:
            rows.append(_measured(trace, size, out, timeline, args.memory_limit))
        finally:
            if not args.keep:
                shutil.rmtree(folder, ignore_errors=True)

    _table(rows, "gz" if args.gzip else "json")
    return 0


def _existing(args: argparse.Namespace) -> int:
    """Measure each of ``args.traces`` as it is (kept; its outputs deleted after)."""
    rows = []
    for trace in args.traces:
        size = round(trace.stat().st_size / 2**20) * (9 if trace.suffix == ".gz" else 1)
        timeline = args.dir / f"rss_{trace.name}.csv" if args.timeline else None
        rows.append(_measured(trace, size, args.dir / f"out_{trace.name}", timeline, args.memory_limit))
    _table(rows, "gz" if args.traces[0].suffix == ".gz" else "json")
    return 0


def _measured(
    trace: Path, size: int, out: Path, timeline: Path | None, memory_limit: str | None
) -> tuple[int, float, dict[str, float]]:
    """One row of the table: ``trace`` measured, its outputs deleted after, the figures printed."""
    try:
        result = measure(trace, out, timeline, memory_limit)
    finally:
        shutil.rmtree(out, ignore_errors=True)
    print(f"{trace.name} {size} MB: {result}", flush=True)
    return size, trace.stat().st_size / 2**20, result


def _table(rows: list[tuple[int, float, dict[str, float]]], kind: str) -> None:
    first_size, _, first = rows[0]
    print()
    print("| JSON MB | file | wall s | CPU s | peak RSS MB | peak / first | wall per GB / first |")
    print("|---:|---|---:|---:|---:|---:|---:|")
    for size, _, result in rows:
        per_gb = (result["wall_s"] / size) / (first["wall_s"] / first_size)
        print(
            f"| {size} | {kind} | {result['wall_s']:.1f} | {result['cpu_s']:.1f} "
            f"| {result['peak_mb']:.0f} | {result['peak_mb'] / first['peak_mb']:.2f} | {per_gb:.2f} |"
        )


if __name__ == "__main__":
    raise SystemExit(main())
