"""Cluster analysis at scale: end-to-end wall time and peak memory of ``perfsight analyse JOB``.

Runs each variant in a fresh process and samples the resident memory of its whole process tree
(the command and its worker processes, summed) every 0.1 s with psutil, and of the command's own
process alone (``driver peak``: where the cross-rank step runs); wall time is the process's,
``after workers`` the part of it after the last per-rank worker process exited (the cross-rank step
and the writers, for the local executor; to within the 0.1 s sampling); CPU time is user + system
of the whole tree (``RUSAGE_CHILDREN``: the command and every worker it waited for), the figure
that does not depend on what else the machine runs.
Variants: ``cli`` (the command a user types, ``perfsight analyse JOB --out DIR --json``: the
default executor, one worker process per core; per-rank output files only up to 128 ranks, see
``perfsight.cluster.job.PER_RANK_OUTPUTS_LIMIT``; then the cluster step and its outputs);
``local`` (the same with every rank's output files, ``--per-rank-outputs all``); ``cluster-only``
(same executor, per-rank work limited to what the cluster step needs, no per-rank files);
``dask1`` / ``dask2`` (as cluster-only, on a Dask LocalCluster with 1 / 2 worker processes).
After each run it checks that the injected stragglers (from the job's ``.generator.json``, written
by ``gen_cluster_job.py``) are exactly the reported slow ranks -- with the sender of the injected
slow link, if any: its slow transfers make it late at the next collective.

    python benchmarks/gen_cluster_job.py --out /tmp/job1024 --ranks 1024 --size-mb 2 --layers 4 \
        --stragglers 17:1.3,600:1.25,1001:1.2 --slow-link ''
    python benchmarks/bench_cluster.py /tmp/job1024 --variants cli,cluster-only,local,dask1,dask2
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

DRIVER = """
import json, sys
from perfsight.cluster.job import analyse_job, write_cluster_outputs
from perfsight.cluster.summary import cluster_summary
job, out, variant = sys.argv[1:4]
executor, per_rank = "local", True
if variant.startswith("dask"):
    from perfsight.engine.dask import DaskExecutor
    executor = DaskExecutor("dask-local", workers=int(variant[4:]))
if variant != "local":
    per_rank = False
try:
    result = analyse_job(job, out, executor=executor, per_rank_outputs=per_rank)
finally:
    if not isinstance(executor, str):
        executor.close()
write_cluster_outputs(result, out)
summary = cluster_summary(result)
print(json.dumps({"slow": [r["rank"] for r in summary["slow_ranks"]], "ranks": summary["ranks"],
                  "method": summary["clock_alignment"]["method"]}))
"""


def _command(job: Path, out: str, variant: str) -> list[str]:
    if variant == "cli":
        cli = [sys.executable, "-m", "perfsight.cli", "analyse"]
        return [*cli, str(job), "--out", out, "--json", "--no-progress"]
    return [sys.executable, "-c", DRIVER, str(job), out, variant]


def _found(stdout: str, variant: str) -> dict:
    if variant != "cli":
        return json.loads(stdout.strip().splitlines()[-1])
    cluster = json.loads(stdout)["cluster"]
    return {
        "slow": [r["rank"] for r in cluster["slow_ranks"]],
        "ranks": cluster["ranks"],
        "method": cluster["clock_alignment"]["method"],
    }


def run_variant(job: Path, variant: str) -> dict:
    import psutil

    with tempfile.TemporaryDirectory(prefix="perfsight-bench-") as out:
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        started = time.perf_counter()
        proc = subprocess.Popen(
            _command(job, out, variant),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )  # fmt: skip
        root = psutil.Process(proc.pid)
        peak = driver_peak = 0
        workers_seen, workers_gone = False, None  # when the per-rank workers had all exited
        while proc.poll() is None:
            try:
                children = root.children(recursive=True)
                driver = root.memory_info().rss
                peak = max(peak, driver + sum(p.memory_info().rss for p in children if p.is_running()))
                driver_peak = max(driver_peak, driver)
                workers_seen = workers_seen or bool(children)
                if workers_seen and not children and workers_gone is None:
                    workers_gone = time.perf_counter()
            except psutil.Error:
                pass
            time.sleep(0.1)
        ended = time.perf_counter()
        wall = ended - started
        stdout, stderr = proc.communicate()
        after = resource.getrusage(resource.RUSAGE_CHILDREN)  # the driver and the workers it waited for
    cpu = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    if proc.returncode != 0:
        raise SystemExit(f"{variant} failed:\n{stderr[-3000:]}")
    found = _found(stdout, variant)
    after = ended - workers_gone if workers_gone is not None else float("nan")
    return {
        "variant": variant, "wall_s": wall, "cpu_s": cpu, "peak_rss_mb": peak / 2**20,
        "driver_peak_mb": driver_peak / 2**20, "after_workers_s": after, **found,
    }  # fmt: skip


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("job", type=Path)
    parser.add_argument("--variants", default="cli,cluster-only,local,dask1,dask2")
    args = parser.parse_args(argv)
    manifest = json.loads((args.job / ".generator.json").read_text())
    injected = sorted(int(r) for r in manifest["stragglers"])
    if manifest.get("slow_link"):  # its sender finishes each all-reduce late, so arrives late at the next
        injected = sorted({*injected, int(manifest["slow_link"]["src"])})
    size_mb = sum(p.stat().st_size for p in args.job.rglob("*.json")) / 2**20
    print(
        f"job: {manifest['ranks']} ranks, {size_mb:.0f} MiB of traces, {manifest['steps']} steps each, "
        f"stragglers {injected}; machine: {platform.machine()}, {os.cpu_count()} CPUs, "
        f"load average {os.getloadavg()[0]:.1f} at start"
    )
    print(
        "| variant | wall s | CPU s (tree) | CPU ms / rank | peak RSS MB (tree) | driver peak MB "
        "| after workers s | slow ranks found | injected found exactly | load avg |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for variant in args.variants.split(","):
        row = run_variant(args.job, variant.strip())
        print(
            f"| {row['variant']} | {row['wall_s']:.1f} | {row['cpu_s']:.1f} | "
            f"{1000 * row['cpu_s'] / max(1, manifest['ranks']):.0f} | {row['peak_rss_mb']:.0f} | "
            f"{row['driver_peak_mb']:.0f} | {row['after_workers_s']:.1f} | "
            f"{row['slow']} | "
            f"{'yes' if row['slow'] == injected else 'NO'} | {os.getloadavg()[0]:.1f} |",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
