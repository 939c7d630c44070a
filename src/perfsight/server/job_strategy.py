"""The data of the parallel-strategy page of a job (seed 000 fig. 3; issue 18 sections 2 and 3):
the strategy tree (stages, replicas, ranks), the execution graph and the module table.

Why a module of its own: the three read the cluster analysis's own outputs --
``cluster_summary.json``'s ``parallel`` groups, ``cluster_strategy_graph.parquet`` /
``cluster_strategy_edges.parquet`` (``perfsight.cluster.strategy_graph``) and
``module_statistic.csv`` / ``cluster_module_statistic.csv`` (``perfsight.cluster.module_table``).
Every number (a node's category and special kind, its time per rank, a module's spread) is decided
there; this module only selects the rows of one step and shapes them for the page, with one DuckDB
query per table.  Nothing re-parses a trace.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from perfsight.server import job_pages, queries
from perfsight.server.runs import CLUSTER_OUTPUT_DIR

NODES_FILE = "cluster_strategy_graph.parquet"
"""perfsight.cluster.strategy_graph.NODES_FILE (not imported: the request path does not load pandas)."""
EDGES_FILE = "cluster_strategy_edges.parquet"
RANK_MODULES_FILE = "module_statistic.csv"
CLUSTER_MODULES_FILE = "cluster_module_statistic.csv"
CATEGORIES = ["compute", "collective", "p2p", "memory copy", "optimizer"]
"""perfsight.cluster.strategy_graph.CATEGORIES, in legend order."""
NAMES_AS_TEXT = "{'module': 'VARCHAR', 'parent': 'VARCHAR'}"
"""A module named ``1`` stays a name, not a number, when DuckDB reads the CSVs."""
PER_RANK_LIMIT = 64
"""A node run by more ranks than this comes without its per-rank lists in the graph."""
NODE_FIELDS = (
    'stage, node, "order", key, name, category, special, module, modules, input_dims, collective, "group", '
    "group_ranks, CAST(bytes AS BIGINT) AS bytes, mean_ns, min_ns, max_ns, slowest_rank, "
    "list_min(starts_ns) AS first_start_ns"
)
SPECIALS = ["sharded", "redistribution", "gradient_aggregation"]


def _file(root: Path | None, name: str, what: str) -> Path:
    path = job_pages.cluster_folder(root) / name
    if not path.is_file():
        raise job_pages.NoClusterAnalysis(
            f"{CLUSTER_OUTPUT_DIR}/{name} is missing ({what}): analyse the job again with this perfsight "
            "(`perfsight analyse JOB_FOLDER`)"
        )
    return path


_SPAN_SQL = "SELECT coalesce(max(last_end_ns), 0) AS span FROM read_parquet(?) WHERE step = ?"
_SPAN_FROM_LISTS_SQL = (
    "SELECT coalesce(max(s + d), 0) AS span FROM "
    "(SELECT unnest(starts_ns) AS s, unnest(durations_ns) AS d FROM read_parquet(?) WHERE step = ?)"
)
"""The graph's span: the nodes' latest end, or (an analysis written before ``last_end_ns`` was a
column) every rank's start + duration, which reads lists of nodes x ranks values."""


def _has_last_end(nodes_file: Path) -> bool:
    found = queries.arrow(
        "SELECT count(*) AS n FROM parquet_schema(?) WHERE name = 'last_end_ns'", [str(nodes_file)]
    )
    return bool(found.column("n")[0].as_py())


def graph(
    run: str, root: Path | None, step: str | None, per_rank_limit: int = PER_RANK_LIMIT
) -> dict[str, Any]:
    """The execution graph (:class:`models.JobStrategyGraph`) of one step: per stage its nodes in
    execution order, the edges (execution order within a stage, send -> receive between stages),
    and the modules the page's selector lists.  A node run by more than ``per_rank_limit`` ranks
    comes without its per-rank lists (``rank_count`` says how many; :func:`node` has them): at
    1,024 ranks they would make the answer tens of megabytes."""
    nodes_file = _file(root, NODES_FILE, "the parallel-strategy graph")
    edges_file = _file(root, EDGES_FILE, "the parallel-strategy graph's edges")
    steps = [
        str(s)
        for s in queries.arrow("SELECT DISTINCT step FROM read_parquet(?) ORDER BY step", [str(nodes_file)])
        .column("step")
        .to_pylist()
    ]
    if step is not None and step not in steps:
        raise job_pages.NoClusterAnalysis(f"step {step} is not among the job's steps ({', '.join(steps)})")
    if not steps:
        raise job_pages.NoClusterAnalysis("the job's analysis recorded no op in any step")
    chosen = step if step is not None else (steps[1] if len(steps) > 1 else steps[0])  # the first warms up
    nodes = queries.records(
        queries.arrow(
            f"SELECT {NODE_FIELDS}, len(ranks) AS rank_count, "
            "CASE WHEN len(ranks) <= ? THEN ranks ELSE [] END AS ranks, "
            "CASE WHEN len(ranks) <= ? THEN starts_ns ELSE [] END AS starts_ns, "
            "CASE WHEN len(ranks) <= ? THEN durations_ns ELSE [] END AS durations_ns "
            "FROM read_parquet(?) WHERE step = ? ORDER BY stage, node",
            [per_rank_limit, per_rank_limit, per_rank_limit, str(nodes_file), int(chosen)],
        )
    )
    edges = queries.records(
        queries.arrow(
            "SELECT kind, src_stage, src_node, dst_stage, dst_node, pairs, CAST(bytes AS BIGINT) AS bytes "
            "FROM read_parquet(?) WHERE step = ? ORDER BY kind, src_stage, src_node",
            [str(edges_file), int(chosen)],
        )
    )
    ranks_of = {
        r["stage"]: r["ranks"]
        for r in queries.records(
            queries.arrow(
                "SELECT stage, list(DISTINCT r ORDER BY r) AS ranks FROM "
                "(SELECT stage, unnest(ranks) AS r FROM read_parquet(?) WHERE step = ?) GROUP BY stage",
                [str(nodes_file), int(chosen)],
            )
        )
    }
    stages: dict[int, dict[str, Any]] = {}
    for n in nodes:  # one pass over the step's nodes, grouping them by stage for the page
        stage = stages.setdefault(
            n["stage"], {"stage": n["stage"], "ranks": ranks_of[n["stage"]], "nodes": []}
        )
        stage["nodes"].append(n)
    shown = [s for _, s in sorted(stages.items())]
    modules = sorted({m for n in nodes for m in (n["modules"] or [])})
    specials = {k: sum(1 for n in nodes if n["special"] == k) for k in SPECIALS}
    span = queries.arrow(
        _SPAN_SQL if _has_last_end(nodes_file) else _SPAN_FROM_LISTS_SQL, [str(nodes_file), int(chosen)]
    )
    span = span.column("span")[0].as_py()
    return {
        "run": run,
        "step": chosen,
        "steps": steps,
        "span_ns": span,
        "categories": CATEGORIES,
        "specials": specials,
        "modules": modules,
        "stages": shown,
        "edges": edges,
    }


def node(run: str, root: Path | None, step: str, stage: int, index: int) -> dict[str, Any]:
    """One node of the graph with its time on every rank (:class:`models.StrategyNode`): what the
    page's attributes panel asks for when the graph left a node's per-rank lists out."""
    nodes_file = _file(root, NODES_FILE, "the parallel-strategy graph")
    found = queries.records(
        queries.arrow(
            f"SELECT {NODE_FIELDS}, len(ranks) AS rank_count, ranks, starts_ns, durations_ns "
            "FROM read_parquet(?) WHERE step = ? AND stage = ? AND node = ?",
            [str(nodes_file), int(step), int(stage), int(index)],
        )
    )
    if not found:
        raise job_pages.NoClusterAnalysis(f"run {run!r}: step {step} has no node {index} in stage {stage}")
    return found[0]


def modules(run: str, root: Path | None) -> dict[str, Any]:
    """The module table (:class:`models.JobModules`): per stage and module its time on each rank
    and the spread across them, as ``cluster_module_statistic.csv`` and ``module_statistic.csv`` say."""
    per_rank_file = _file(root, RANK_MODULES_FILE, "time per nn.Module per rank")
    cluster_file = _file(root, CLUSTER_MODULES_FILE, "time per nn.Module across ranks")
    table = queries.records(
        queries.arrow(
            """WITH r AS (SELECT * FROM read_csv(?, header = true, types = TYPES)),
                c AS (SELECT * FROM read_csv(?, header = true, types = TYPES))
            SELECT c.stage, c.module, coalesce(c.parent, '') AS parent,
                c.depth, c.ranks, c.mean_ns, c.min_ns, c.max_ns, c.slowest_rank,
                CAST(c.spread AS DOUBLE) AS spread,
                list({'rank': r.rank, 'time_ns': r.time_ns, 'calls_per_step': r.calls_per_step}
                    ORDER BY r.rank) AS per_rank
            FROM c JOIN r ON r.stage = c.stage AND r.module = c.module
            GROUP BY c.stage, c.module, c.parent, c.depth, c.ranks, c.mean_ns, c.min_ns, c.max_ns,
                c.slowest_rank, c.spread
            ORDER BY c.stage, c.depth, c.module""".replace("TYPES", NAMES_AS_TEXT),
            [str(per_rank_file), str(cluster_file)],
        )
    )
    ranks = sorted({p["rank"] for m in table for p in m["per_rank"]})
    return {"run": run, "ranks": ranks, "modules": table}


def strategy(run: str, root: Path | None, saved: Path) -> dict[str, Any]:
    """The parallel-strategy tree (:class:`models.JobStrategy`): stages, in each the model replicas
    (a tensor-parallel group, or a rank alone), in each its ranks with their average step time and
    data-parallel group.  The groups are the cluster analysis's (``cluster_summary.json``'s
    ``parallel``, :mod:`perfsight.cluster.parallel`), the step times its step trace's averages."""
    import json

    cluster = job_pages.cluster_folder(root)
    summary = json.loads((cluster / "cluster_summary.json").read_text(encoding="utf-8"))
    parallel = summary.get("parallel") or {}
    groups: dict[str, list[list[int]]] = parallel.get("groups") or {}
    ranks = queries.rows(
        job_pages.ranks_table(cluster, saved),
        "WHERE type = 'rank' AND step = 'average' ORDER BY stage, rank",
        "rank, stage, host, duration_ns, slow",
    )

    def group_of(mode: str) -> dict[int, int]:
        return {r: i for i, members in enumerate(groups.get(mode) or []) for r in members}

    tensor, data = group_of("tensor"), group_of("data")
    stages: dict[int, dict[int | str, list[dict[str, Any]]]] = {}
    for r in ranks:  # a loop over ranks (a few thousand at most), not over ops
        replica: int | str = tensor.get(r["rank"], f"rank{r['rank']}")
        leaf = {**r, "data_group": data.get(r["rank"]), "tensor_group": tensor.get(r["rank"])}
        stages.setdefault(r["stage"] or 0, {}).setdefault(replica, []).append(leaf)
    longest = max((r["duration_ns"] or 0 for r in ranks), default=0)
    return {
        "run": run,
        "modes": parallel.get("modes") or [],
        "evidence": parallel.get("evidence") or {},
        "problems": parallel.get("problems") or [],
        "max_duration_ns": longest,
        "stages": [
            {
                "stage": stage,
                "duration_ns": max(leaf["duration_ns"] or 0 for reps in replicas.values() for leaf in reps),
                "replicas": [{"tensor_group": m[0]["tensor_group"], "ranks": m} for m in replicas.values()],
            }
            for stage, replicas in sorted(stages.items())
        ],
    }
