"""``read_trace`` at a git revision ("before") and in this work tree ("after"), timed only while the
machine is otherwise idle.

Why this exists: on a shared 2-core machine a change that puts work on a second thread can only
show its effect when the second core is free; ``bench_before_after.py`` times whatever the other
processes leave.  Here each read starts once both cores have been idle for 0.3 s (``/proc/stat``,
Linux; elsewhere at once), in fresh processes whose sides alternate, and the median wall and CPU
time of each round are printed.

Usage::

    python benchmarks/bench_read_quiet.py --before 5220547 [--trace T ...] [--rounds 3] [--reads 10]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_before_after import _checkout  # noqa: E402
from bench_vs_hta import DEFAULT_TRACES  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]

CHILD = r"""
import statistics, sys, time
from pathlib import Path


def busy(window=0.3):
    def stat():
        with open("/proc/stat") as f:
            values = [int(v) for v in f.readline().split()[1:]]
        return values[3] + values[4], sum(values)
    try:
        i0, t0 = stat()
        time.sleep(window)
        i1, t1 = stat()
    except OSError:
        return 0.0
    return 1 - (i1 - i0) / max(t1 - t0, 1)


def wait_quiet(limit=0.08, patience=20.0):
    end = time.time() + patience
    while time.time() < end and busy() >= limit:
        pass


import perfsight.ingest
path, reads = Path(sys.argv[1]), int(sys.argv[2])
for _ in range(3):
    perfsight.ingest.read_trace(path)
walls, cpus = [], []
for _ in range(reads):
    wait_quiet()
    t0, c0 = time.perf_counter(), time.process_time()
    perfsight.ingest.read_trace(path)
    walls.append(time.perf_counter() - t0)
    cpus.append(time.process_time() - c0)
print(statistics.median(walls), statistics.median(cpus))
"""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--before", required=True, help="git revision to compare this work tree with")
    parser.add_argument("--trace", type=Path, action="append", help="trace file (default: the HTA pair)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--reads", type=int, default=10, help="reads per round and side")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        folder = Path(scratch) / "before"
        sources = {"before": _checkout(args.before, folder), "after": ROOT / "src"}
        try:
            for trace in args.trace or DEFAULT_TRACES:
                rounds: dict[str, list[tuple[float, float]]] = {side: [] for side in sources}
                for _ in range(args.rounds):
                    for side, src in sources.items():
                        done = subprocess.run(
                            [sys.executable, "-c", CHILD, str(trace), str(args.reads)],
                            env={**os.environ, "PYTHONPATH": str(src)},
                            capture_output=True,
                            text=True,
                            check=True,
                        )
                        wall, cpu = (float(v) for v in done.stdout.split()[-2:])
                        rounds[side].append((wall, cpu))
                print(f"{trace.name}:")
                for side, values in rounds.items():
                    walls = " ".join(f"{w:.4f}" for w, _ in values)
                    cpus = " ".join(f"{c:.4f}" for _, c in values)
                    wall = statistics.median(w for w, _ in values)
                    cpu = statistics.median(c for _, c in values)
                    print(f"  {side:<6} wall {wall:.4f} s (rounds {walls}), CPU {cpu:.4f} s (rounds {cpus})")
        finally:
            remove = ["git", "-C", str(ROOT), "worktree", "remove", "--force", str(folder)]
            subprocess.run(remove, check=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
