"""The order of work of a cluster analysis; no metric logic of its own.

``analyse_job`` lists the job's inputs, runs the per-rank step on an executor (processes here by
default, or Dask), judges the set of ranks, then runs the cross-rank step in this process:
match -> align -> per-op times -> matrix -> step trace -> slow rank / link / imbalance.  The
result holds every cross-rank table; ``write_cluster_outputs`` writes them to
``cluster_analysis_output/`` beside the per-rank ``rank<N>/`` folders.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import shutil
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa

from perfsight import layout
from perfsight.cluster import (
    alignment,
    discovery,
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
from perfsight.cluster.rank import RankDigest, RankTask, run_rank
from perfsight.engine import Executor, make_executor
from perfsight.pipeline import Options, OutputError

log = logging.getLogger(__name__)

PER_RANK_OUTPUTS_LIMIT = 128
"""Above this many ranks, ``analyse_job`` writes no per-rank files unless asked (``per_rank_outputs``).

Why: a thousand ranks' ``trace_view.json``, CSVs and Parquet caches cost about twice the cluster
analysis itself (docs/BENCHMARKS.md) and are looked at one rank at a time; one rank's outputs come
from ``perfsight analyse`` on that rank's input alone.  Below the limit every rank's outputs are
written, as a single-rank analysis would."""


class JobInputError(ValueError):
    """Nothing analysable at the location; the message says what was found instead."""


@dataclasses.dataclass
class ClusterResult:
    """Every cross-rank table of one job (ns and bytes; see docs/CLUSTER.md)."""

    location: str
    job: discovery.JobAssessment
    matched: matching.Matched
    alignment: alignment.Alignment
    stage_of: dict[int, int]
    parallel: parallel.ParallelLayout
    steps: pd.DataFrame  # per rank and step
    rank_averages: pd.DataFrame
    stage_steps: pd.DataFrame
    stage_averages: pd.DataFrame
    links: pd.DataFrame
    matrix: pd.DataFrame
    slow_ranks: slow.SlowRanks
    slow_links: pd.DataFrame
    pipeline: dict[str, Any]
    resources: pd.DataFrame
    executor: str
    step_ops: pa.Table | None = None  # every rank's ops per step, matched (cluster.execution)
    step_spread: pd.DataFrame | None = None  # per step across ranks (cluster.totals)
    communication_ranks: pd.DataFrame | None = None  # per rank and step, its ops summed (cluster.totals)
    strategy_nodes: pd.DataFrame | None = None  # the parallel-strategy graph (cluster.strategy_graph)
    strategy_edges: pd.DataFrame | None = None
    rank_modules: pd.DataFrame | None = None  # time per nn.Module per rank (cluster.module_table)
    cluster_modules: pd.DataFrame | None = None
    output_root: Path | None = None
    per_rank_outputs: bool = False  # whether ``rank<N>/`` folders were written under output_root

    @property
    def ranks(self) -> list[int]:
        return sorted(self.job.ranks)


def analyse_job(
    location: str | Path,
    out: str | Path | None = None,
    *,
    options: Options | None = None,
    executor: str | Executor | None = None,
    per_rank_outputs: bool | None = None,
    memory_limit: int | None = None,
) -> ClusterResult:
    """Analyse every rank under ``location`` (folder or fsspec URL) and the job as a whole.

    ``out``: where ``rank<N>/`` and ``cluster_analysis_output/`` go (None: nothing is written).
    ``per_rank_outputs``: write ``rank<N>/`` for every rank (True), for none (False), or, by default,
    when the job has at most :data:`PER_RANK_OUTPUTS_LIMIT` inputs.  ``executor``: ``local``
    (default), ``serial``, ``dask-local``, ``dask://HOST:PORT``, or an executor object (not closed here).
    ``memory_limit``: bytes per rank (``cluster.rank_chunks.rank_budget``).
    """
    location = str(location)
    inputs = discovery.list_inputs(location)
    cut = discovery.cut_windows(location)
    if not inputs:
        raise JobInputError(
            "; ".join(cut) or f"{location}: no trace files (*.json, *.json.gz) or run folders found"
        )
    if per_rank_outputs is None:
        per_rank_outputs = len(inputs) <= PER_RANK_OUTPUTS_LIMIT
    if out is not None:  # a folder that cannot be made: say so now, not after reading every rank
        with OutputError.naming(out):
            Path(out).mkdir(parents=True, exist_ok=True)
    owned = not hasattr(executor, "map")
    runner = make_executor(executor) if owned else executor  # type: ignore[arg-type]
    with _digest_folder(out, runner) as digest_dir:
        task = RankTask(
            out_root=str(out) if (out is not None and per_rank_outputs) else None,
            options=options or Options(),
            memory_limit=memory_limit,
            workers=min(getattr(runner, "workers", None) or 1, len(inputs)),
            digest_dir=digest_dir,
        )
        try:
            results = runner.map(run_rank, inputs, task)
        finally:  # Ctrl-C included: the executor has waited for its workers
            if owned:
                runner.close()
            if task.out_root is not None:  # the claims only mattered while the workers ran
                shutil.rmtree(Path(task.out_root) / ".perfsight-claims", ignore_errors=True)
        job = discovery.assess(results)
        job.cut_windows = cut
        if not job.ranks:
            raise JobInputError("; ".join(job.problems()) or f"{location}: nothing readable")
        if task.out_root is not None:
            _remove_outputs_of_set_aside(results, job, Path(task.out_root))
        for line in job.problems():
            log.warning("%s", line)
        result = cross_rank(location, job, runner.name)
    result.output_root = Path(out) if out is not None else None
    result.per_rank_outputs = task.out_root is not None
    return result


SHARED_FOLDER_EXECUTORS = ("local", "serial")
"""Executors whose workers write where this process reads (this machine): a large rank's digest
may leave its per-op tables in a file for the cross-rank step (``RankTask.digest_dir``)."""


@contextlib.contextmanager
def _digest_folder(out: str | Path | None, runner: Executor) -> Iterator[str | None]:
    """Where a large rank's worker leaves its per-op digest tables (``RankDigest.files``): a hidden
    scratch folder under ``out``, else under the system's temporary folder (made by the first
    worker that needs it), removed once the cross-rank step has read them, however it ends --
    a failed rank, a job with nothing readable, a Ctrl-C.  None where the workers may not share
    this machine's folders (a Dask cluster): the tables then travel inside the digests."""
    if getattr(runner, "name", None) not in SHARED_FOLDER_EXECUTORS:
        yield None
        return
    from perfsight.export.staging import STAGING_PREFIX, remove_folder

    unique = uuid.uuid4().hex[:12]
    if out is not None:  # hidden from discovery and the server, as a staging folder is
        folder = Path(out) / f"{STAGING_PREFIX}digests-{unique}"
    else:
        folder = Path(tempfile.gettempdir()) / f"perfsight-digests-{unique}"
    try:
        yield str(folder)
    finally:
        remove_folder(folder)


def _remove_outputs_of_set_aside(results: list, job: discovery.JobAssessment, out_root: Path) -> None:
    """A rank of another job gets no ``rank<N>/`` folder among this job's outputs: the folder's
    name would say it belongs (analyse its input alone for its own outputs).  When it had taken
    ``rank<N>/`` (it was read first), the job's own rank ``N`` moves there from ``rank<N>_<label>/``."""
    foreign = {aside.source for aside in job.set_aside}
    for result in results:
        if result.source in foreign and (folder := _rank_folder(result, out_root)) is not None:
            shutil.rmtree(folder, ignore_errors=True)
    for rank, digest in job.ranks.items():
        folder, wanted = _rank_folder(digest, out_root), out_root / f"rank{rank}"
        if folder is None or folder == wanted or wanted.exists():
            continue
        folder.rename(wanted)
        digest.output_dir = str(wanted / Path(digest.output_dir).relative_to(folder))
        if digest.summary is not None:
            digest.summary["output_dir"] = digest.output_dir


def _rank_folder(result: object, out_root: Path) -> Path | None:
    """``out_root/rank<N>[_label]`` holding a rank's outputs (its ``output_dir`` lies inside)."""
    output = getattr(result, "output_dir", None)  # rank<N>/PROFILER_OUTPUT
    if not output or not Path(output).is_relative_to(out_root) or Path(output) == out_root:
        return None
    return out_root / Path(output).relative_to(out_root).parts[0]


def cross_rank(location: str, job: discovery.JobAssessment, executor: str = "serial") -> ClusterResult:
    """The cross-rank step on digests already gathered (nothing is written).

    The digests give up their per-op tables (``step_ops``, ``op_context``) once the result's step
    ops and strategy graph are made of them: at 1,024 ranks they are 0.4 GB of the driver that the
    result holds again in its own form (docs/BENCHMARKS.md, "The cross-rank step's memory")."""
    digests = job.ranks
    matched = matching.match(digests)
    aligned = alignment.align(digests, matched)
    op_time.add_op_times(digests, matched, aligned)
    link_rows = matrix.links(matched, digests)
    layout = parallel.detect(digests, matched)
    stage_of = step_trace.stages(matched, sorted(digests), parallel.same_stage_groups(layout))
    parallel.check_stages(layout, stage_of)
    steps = step_trace.split_bubble(step_trace.rank_steps(digests, stage_of), matched.ops)
    rank_avgs = step_trace.averages(steps, "rank")
    stage_rows = step_trace.stage_steps(steps) if not steps.empty else steps
    stage_avgs = step_trace.averages(steps, "stage")
    resources = slow.resources(digests, steps)
    ops_of_steps = execution.step_ops(digests, matched, aligned, stage_of)
    _release(digests, execution.STEP_OPS_TABLE)
    nodes, edges = strategy_graph.strategy_graph(ops_of_steps, digests, matched, layout)
    _release(digests, strategy_graph.CONTEXT_TABLE)
    per_rank_modules = module_table.rank_modules(digests, stage_of)
    flops_by_stage = resources.assign(stage=resources["rank"].map(stage_of)).groupby("stage")["flops"].sum()
    return ClusterResult(
        location=location,
        job=job,
        matched=matched,
        alignment=aligned,
        stage_of=stage_of,
        parallel=layout,
        steps=steps,
        rank_averages=rank_avgs,
        stage_steps=stage_rows,
        stage_averages=stage_avgs,
        links=link_rows,
        matrix=matrix.matrix(link_rows),
        slow_ranks=slow.slow_ranks(matched, rank_avgs),
        slow_links=slow.slow_links(link_rows),
        pipeline=slow.pipeline_balance(stage_avgs, flops_by_stage.to_dict()),
        resources=resources,
        executor=executor,
        step_ops=ops_of_steps,
        step_spread=totals.step_spread(steps, matched.ops),
        communication_ranks=totals.communication_by_rank(matched.ops, resources),
        strategy_nodes=nodes,
        strategy_edges=edges,
        rank_modules=per_rank_modules,
        cluster_modules=module_table.cluster_modules(per_rank_modules),
    )


def _release(digests: dict[int, RankDigest], table: str) -> None:
    """Drop one per-rank table from every digest (its rows now live in a cross-rank table)."""
    for digest in digests.values():
        digest.release(table)


def write_cluster_outputs(result: ClusterResult, out: str | Path, doc: dict[str, Any] | None = None) -> Path:
    """Write ``cluster_analysis_output/`` under ``out``; returns that folder.

    ``doc``: the job's :func:`perfsight.cluster.summary.cluster_summary`, when the caller made it
    already (the CLI prints it too: made once, not twice, 0.3 s at 1,024 ranks)."""
    from perfsight import advisor
    from perfsight.cluster import summary
    from perfsight.export import cluster_csv
    from perfsight.export.communication_matrix_json import write_communication_matrix
    from perfsight.export.staging import staged

    name = discovery.CLUSTER_OUTPUT_DIR
    with OutputError.naming(out), staged(Path(out), (name,)) as stage:  # complete or absent
        folder = stage / name
        folder.mkdir()
        cluster_csv.write_step_trace(folder / "cluster_step_trace_time.csv", result)
        cluster_csv.write_table(folder / "cluster_communication_ops.csv", cluster_csv.ops_table(result))
        cluster_csv.write_table(folder / "clock_alignment.csv", result.alignment.table())
        cluster_csv.write_table(folder / "slow_rank.csv", result.slow_ranks.table)
        cluster_csv.write_table(folder / "slow_link.csv", result.slow_links)
        cluster_csv.write_table(folder / "cluster_resources.csv", result.resources)
        write_communication_matrix(folder / "communication_matrix.json", result.matrix)
        if result.step_ops is not None:
            execution.write(result.step_ops, folder / execution.OUTPUT_FILE)
        if result.step_spread is not None:
            result.step_spread.to_parquet(folder / layout.CLUSTER_STEP_SPREAD_FILE, index=False)
        if result.communication_ranks is not None:
            result.communication_ranks.to_parquet(
                folder / layout.CLUSTER_COMMUNICATION_RANKS_FILE, index=False
            )
        if result.strategy_nodes is not None and result.strategy_edges is not None:
            result.strategy_nodes.to_parquet(folder / strategy_graph.NODES_FILE, index=False)
            result.strategy_edges.to_parquet(folder / strategy_graph.EDGES_FILE, index=False)
        if result.rank_modules is not None and result.cluster_modules is not None:
            cluster_csv.write_table(folder / module_table.RANK_FILE, result.rank_modules)
            cluster_csv.write_table(folder / module_table.CLUSTER_FILE, result.cluster_modules)
        doc = summary.cluster_summary(result) if doc is None else doc
        summary.write_json(folder / "cluster_summary.json", doc)
        advisor.write_advisor_json(folder / advisor.ADVISOR_JSON, doc["findings"], "job")
    return Path(out) / name
