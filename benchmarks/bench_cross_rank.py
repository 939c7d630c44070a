"""The cross-rank step of a cluster analysis stage by stage: CPU time and resident memory of each.

Why: the driver process of ``perfsight analyse JOB`` holds every rank's digest, then runs the
cross-rank step (matching, alignment, step trace, step ops, strategy graph, ...) and the writers;
``bench_cluster.py`` sees only its total.  This runs the per-rank step once (``--dump``: the
digests pickled), then, in a fresh process per run, times each stage alone on them and samples RSS
every 5 ms (the peak within a stage and what is left after it; freed memory that the allocator
keeps counts as resident).  Run it with another tree's
``PYTHONPATH`` for the same table of that code.

    python benchmarks/bench_cross_rank.py /tmp/job1024 --dump /tmp/digests.pkl
    python benchmarks/bench_cross_rank.py --digests /tmp/digests.pkl
"""

from __future__ import annotations

import argparse
import gc
import pickle
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Sequence


def dump(job: str, path: str) -> None:
    from perfsight.cluster import discovery
    from perfsight.cluster.rank import RankTask, run_rank
    from perfsight.engine import make_executor
    from perfsight.pipeline import Options

    runner = make_executor(None)
    try:
        results = runner.map(run_rank, discovery.list_inputs(job), RankTask(out_root=None, options=Options()))
    finally:
        runner.close()
    assessed = discovery.assess(results)
    with open(path, "wb") as handle:
        pickle.dump(assessed, handle, protocol=5)


def stages(path: str) -> None:
    import psutil

    process, peak, running = psutil.Process(), [0], [True]

    def sample() -> None:
        while running[0]:
            peak[0] = max(peak[0], process.memory_info().rss)
            time.sleep(0.005)

    threading.Thread(target=sample, daemon=True).start()
    from perfsight.cluster import (
        alignment,
        execution,
        matching,
        matrix,
        module_table,
        op_time,
        parallel,
        slow,
        step_trace,
        strategy_graph,
        totals,
    )
    from perfsight.cluster import job as job_module
    from perfsight.cluster.summary import cluster_summary

    print("| stage | CPU s | RSS after MB | peak MB |\n|---|---:|---:|---:|")
    cpu = [time.process_time()]

    def mark(name: str) -> None:
        now, rss = time.process_time(), process.memory_info().rss
        print(
            f"| {name} | {now - cpu[0]:.2f} | {rss / 2**20:,.0f} | {max(peak[0], rss) / 2**20:,.0f} |",
            flush=True,
        )
        cpu[0], peak[0] = time.process_time(), rss

    with open(path, "rb") as handle:
        assessed = pickle.load(handle)
    mark("load the digests")
    d = assessed.ranks
    matched = matching.match(d)
    mark("match")
    aligned = alignment.align(d, matched)
    op_time.add_op_times(d, matched, aligned)
    link_rows = matrix.links(matched, d)
    layout = parallel.detect(d, matched)
    stage_of = step_trace.stages(matched, sorted(d), parallel.same_stage_groups(layout))
    steps = step_trace.split_bubble(step_trace.rank_steps(d, stage_of), matched.ops)
    rank_avgs = step_trace.averages(steps, "rank")
    resources = slow.resources(d, steps)
    mark("align, op times, links, parallel, stages, step trace, resources")
    ops = execution.step_ops(d, matched, aligned, stage_of)
    mark("execution.step_ops")
    if hasattr(job_module, "_release"):  # the digests give up what the step ops now hold
        job_module._release(d, execution.STEP_OPS_TABLE)
    strategy_graph.strategy_graph(ops, d, matched, layout)
    mark("strategy_graph")
    module_table.cluster_modules(module_table.rank_modules(d, stage_of))
    matrix.matrix(link_rows), slow.slow_ranks(matched, rank_avgs), slow.slow_links(link_rows)
    totals.step_spread(steps, matched.ops), totals.communication_by_rank(matched.ops, resources)
    mark("module table, matrix, slow ranks and links, totals")
    del ops, d, assessed, matched, aligned, link_rows, layout, steps, rank_avgs, resources
    gc.collect()
    with open(path, "rb") as handle:  # the whole step and the writers, on fresh digests
        assessed = pickle.load(handle)
    mark("load the digests again")
    result = job_module.cross_rank("job", assessed, "local")
    mark("cross_rank (whole)")
    out = tempfile.mkdtemp(prefix="perfsight-bench-")
    try:
        job_module.write_cluster_outputs(result, out)
        mark("write_cluster_outputs")
    finally:
        shutil.rmtree(out, ignore_errors=True)
    cluster_summary(result)
    mark("cluster_summary")
    running[0] = False


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("job", nargs="?", help="job folder (with --dump)")
    parser.add_argument("--dump", help="run the per-rank step on JOB and pickle its digests here")
    parser.add_argument("--digests", help="time the cross-rank stages on these pickled digests")
    args = parser.parse_args(argv)
    if args.dump:
        dump(args.job, args.dump)
    if args.digests:
        stages(args.digests)
    return 0


if __name__ == "__main__":
    sys.exit(main())
