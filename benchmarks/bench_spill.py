"""Peak memory and time of the spilled Kineto reader (``spill_kineto`` + every chunk) on big traces.

Why this exists: issue 21 asks that a trace of any size be read in bounded memory, the same peak
for a 2 GB and a 10 GB trace.  This script generates each trace with ``gen_kineto_trace.py`` (one
at a time; ``--keep`` keeps them), then in a fresh process reads it with
:func:`perfsight.ingest.kineto_spill.spill_kineto` and reads every chunk back (building each
chunk's tables, as the chunked analyses will), sampling that process's resident memory every
50 ms (``bench_big_trace.measure``'s sampler).  It prints one row per trace: wall and CPU seconds,
peak RSS, the chunk count, and the peak against the first trace's.

Usage::

    python benchmarks/bench_spill.py --sizes 1024 2048 [--max-slices 500000] [--dir /tmp/bm_spill]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_big_trace import SAMPLE_S, _rss_mb, generate  # noqa: E402


def child(trace: Path, spill_dir: Path, max_slices: int) -> None:
    """Spill ``trace`` and read every chunk; print the phase times and counts as JSON."""
    from perfsight.ingest.kineto_spill import spill_kineto

    t0 = time.perf_counter()
    with spill_kineto(trace, spill_dir, max_slices) as spilled:
        spill_s = time.perf_counter() - t0
        chunks = rows = 0
        for chunk in spilled.chunks():
            chunks += 1
            rows += chunk.trace.slices.num_rows
        assert rows == spilled.slices, (rows, spilled.slices)
        print(
            json.dumps(
                {
                    "spill_s": spill_s,
                    "chunks_s": time.perf_counter() - t0 - spill_s,
                    "chunks": chunks,
                    "slices": rows,
                }
            )
        )


def measure(trace: Path, spill_dir: Path, max_slices: int) -> dict[str, float]:
    """Run :func:`child` in a fresh process: wall s, CPU s, peak RSS MB, and the child's figures."""
    command = [sys.executable, __file__, "--child", str(trace), "--dir", str(spill_dir)]
    command += ["--max-slices", str(max_slices)]
    samples: list[float] = []
    t0 = time.perf_counter()
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)

    def sample() -> None:
        while process.poll() is None:
            rss = _rss_mb(process.pid)
            if rss is not None:
                samples.append(rss)
            time.sleep(SAMPLE_S)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    _, status, usage = os.wait4(process.pid, 0)
    wall = time.perf_counter() - t0
    sampler.join()
    out = process.stdout.read().decode() if process.stdout else ""
    if os.waitstatus_to_exitcode(status) != 0:
        raise RuntimeError(f"spilling {trace} failed: {out[-2000:]}")
    return {
        "wall_s": wall,
        "cpu_s": usage.ru_utime + usage.ru_stime,
        "peak_mb": usage.ru_maxrss / 1024,
        "sampled_peak_mb": max(samples, default=0.0),
        **json.loads(out.strip().splitlines()[-1]),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[1024, 2048], help="trace sizes in MB")
    parser.add_argument("--max-slices", type=int, default=500_000, help="the chunk budget in slices")
    parser.add_argument("--dir", type=Path, default=Path("/tmp/bm_spill"), help="where traces and spills go")
    parser.add_argument("--keep", action="store_true", help="keep the traces (default: delete each after)")
    parser.add_argument("--child", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child is not None:
        child(args.child, args.dir, args.max_slices)
        return 0

    rows = []
    for size in args.sizes:
        folder = args.dir / f"big{size}"
        existing = folder / "rank0.pt.trace.json"
        trace = existing if existing.exists() else generate(size, folder, gzip=False)
        spill = Path(tempfile.mkdtemp(prefix="spill", dir=args.dir))
        try:
            result = measure(trace, spill, args.max_slices)
        finally:
            shutil.rmtree(spill, ignore_errors=True)
            if not args.keep:
                shutil.rmtree(folder, ignore_errors=True)
        rows.append((size, result))
        print(f"{size} MB: {result}", flush=True)

    first = rows[0][1]
    print()
    print("| JSON MB | slices | chunks | spill s | chunks s | wall s | CPU s | peak RSS MB | peak / first |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for size, r in rows:
        print(
            f"| {size} | {r['slices']:,} | {r['chunks']} | {r['spill_s']:.0f} | {r['chunks_s']:.0f} "
            f"| {r['wall_s']:.0f} | {r['cpu_s']:.0f} | {r['peak_mb']:.0f} "
            f"| {r['peak_mb'] / first['peak_mb']:.2f} |"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
