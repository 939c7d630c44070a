"""Peak memory and wall time of ``perfsight analyse JOBDIR`` whole and within ``--memory-limit``.

Why sampling the process tree: a job's ranks are analysed in worker processes, and what a memory
limit bounds is each worker's peak (one rank at a time); ``/usr/bin/time -v`` reports only the
largest single process it waited for.  This runs the command users run in a fresh process and
samples the RSS of it and of every descendant every 50 ms (psutil), reporting the largest single
worker, the parent, and the largest sum over the tree at one instant.

Usage: ``python benchmarks/bench_job_memory.py JOBDIR --out OUT [--limits 600M 400M]``; the
job comes from ``benchmarks/gen_cluster_job.py``.  Results go in docs/BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil

MIB = 1 << 20


def measure(job: Path, out: Path, limit: str | None) -> dict:
    """One run of the CLI on ``job``: wall seconds and peak RSS (MiB) per role."""
    shutil.rmtree(out, ignore_errors=True)
    command = [sys.executable, "-c", "from perfsight.cli import main; main()", "analyse", str(job)]
    command += ["--out", str(out), "--json"]
    command += ["--memory-limit", limit] if limit else []
    started = time.perf_counter()
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    peaks = {"parent": 0, "worker": 0, "tree": 0}
    done = threading.Event()

    def sample() -> None:
        parent = psutil.Process(process.pid)
        while not done.is_set():
            try:
                children = parent.children(recursive=True)
                own = parent.memory_info().rss
            except psutil.Error:
                break
            sizes = []
            for child in children:
                with contextlib.suppress(psutil.Error):  # a worker that has just ended
                    sizes.append(child.memory_info().rss)
            peaks["parent"] = max(peaks["parent"], own)
            peaks["worker"] = max([peaks["worker"], *sizes])
            peaks["tree"] = max(peaks["tree"], own + sum(sizes))
            time.sleep(0.05)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    stdout, _ = process.communicate()
    wall = time.perf_counter() - started
    done.set()
    sampler.join()
    if process.returncode != 0:
        raise SystemExit(f"perfsight analyse failed (exit {process.returncode})")
    ranks = json.loads(stdout)["ranks"]
    return {
        "memory_limit": limit or "none",
        "wall_s": round(wall, 1),
        "peak_worker_mib": round(peaks["worker"] / MIB),
        "peak_parent_mib": round(peaks["parent"] / MIB),
        "peak_tree_mib": round(peaks["tree"] / MIB),
        "chunks_per_rank": [r.get("bounded", {}).get("chunks", 0) for r in ranks],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("job", type=Path)
    parser.add_argument("--out", type=Path, required=True, help="output folder (replaced at each run)")
    parser.add_argument("--limits", nargs="*", default=["600M"], help="memory limits to run besides none")
    args = parser.parse_args(argv)
    for limit in [None, *args.limits]:
        print(json.dumps(measure(args.job, args.out, limit)), flush=True)
    shutil.rmtree(args.out, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
