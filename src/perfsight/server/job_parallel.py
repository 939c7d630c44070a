"""The data of the parallel-execution job pages of seed 000: the pipeline chart and the Marey view.

Why a module of its own: both read ``cluster_analysis_output/cluster_step_ops.parquet`` (every
rank's ops of every step on the common clock, keyed to match across a stage:
``perfsight.cluster.execution``) for one selected step, and the cluster step trace for the stage
bubble.  Every request is one DuckDB query over the step's rows; nothing re-parses a trace.

What it decides, and only here: how a view of those rows is drawn.  A micro-batch block's compute
time is the time of the compute ops inside it on its rank (a block's span also holds the waits for
the neighbouring stage, which are not work of this stage); a stage's idle time in the step is the
step's span less its blocks' compute; the pacing stage is the one with the most block compute.  The
Marey view keeps, per stage, the ``limit`` longest matched ops of the step at least ``min_ns``
long and says how many it left out (a page of 1,024 devices x thousands of ops would not draw).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from perfsight.server import job_pages, job_views, queries
from perfsight.server.runs import CLUSTER_OUTPUT_DIR

OPS_FILE = "cluster_step_ops.parquet"
"""perfsight.cluster.execution.OUTPUT_FILE (not imported: the request path does not load pandas)."""
MAREY_LIMIT = 200
"""Matched ops per stage the Marey view draws by default (the longest)."""


def _ops_file(root: Path | None) -> Path:
    cluster = job_pages.cluster_folder(root)
    path = cluster / OPS_FILE
    if not path.is_file():
        raise job_pages.NoClusterAnalysis(
            f"{CLUSTER_OUTPUT_DIR}/{OPS_FILE} is missing (the ops of each step per rank): analyse the job "
            "again with this perfsight (`perfsight analyse JOB_FOLDER`)"
        )
    return path


def _steps(ops: Path) -> list[str]:
    got = queries.arrow("SELECT DISTINCT step FROM read_parquet(?) ORDER BY step", [str(ops)])
    return [str(s) for s in got.column("step").to_pylist()]


def _pick_step(steps: list[str], step: str | None) -> str:
    """The requested step, or by default the second profiled step (the first pays for warm-up)."""
    if step is not None:
        if step not in steps:
            known = ", ".join(steps)
            raise job_pages.NoClusterAnalysis(f"step {step} is not among the job's steps ({known})")
        return step
    if not steps:
        raise job_pages.NoClusterAnalysis("the job's analysis recorded no op in any step")
    return steps[1] if len(steps) > 1 else steps[0]


def pipeline(run: str, root: Path | None, saved: Path, step: str | None) -> dict[str, Any]:
    """The pipeline chart (:class:`models.JobPipeline`) of one step: per stage, its first rank's
    Forward/Backward blocks and point-to-point ops, and the send -> receive pairs between stages."""
    ops = _ops_file(root)
    steps = _steps(ops)
    chosen = _pick_step(steps, step)
    ranks = job_pages.ranks_table(job_pages.cluster_folder(root), saved)
    params = [str(ops), int(chosen)]
    base = "SELECT * FROM read_parquet(?) WHERE step = ?"
    span = queries.arrow(f"SELECT min(start_ns) AS t0, max(end_ns) AS t1 FROM ({base})", params)
    t0, t1 = span.column("t0")[0].as_py(), span.column("t1")[0].as_py()
    shown = queries.records(
        queries.arrow(
            f"SELECT stage, min(rank) AS rank, list(DISTINCT rank ORDER BY rank) AS ranks, "
            f"max(end_ns) - min(start_ns) AS span_ns FROM ({base}) GROUP BY stage ORDER BY stage",
            params,
        )
    )
    reps = [s["rank"] for s in shown]
    blocks = queries.records(
        queries.arrow(
            f"""WITH s AS ({base}), b AS (SELECT * FROM s WHERE level = 'micro_batch'),
                c AS (SELECT * FROM s WHERE level = 'op' AND category = 'compute')
            SELECT b.rank, b.stage, b.phase, b.micro_batch, b.start_ns - ? AS start_ns,
                b.end_ns - ? AS end_ns,
                CAST(coalesce(sum(least(c.end_ns, b.end_ns) - greatest(c.start_ns, b.start_ns)), 0) AS BIGINT)
                    AS compute_ns
            FROM b LEFT JOIN c ON c.rank = b.rank AND c.start_ns < b.end_ns AND c.end_ns > b.start_ns
            WHERE b.rank IN (SELECT unnest(?))
            GROUP BY b.rank, b.stage, b.phase, b.micro_batch, b.start_ns, b.end_ns
            ORDER BY b.stage, b.start_ns""",
            [*params, t0, t0, reps],
        )
    )
    p2p = queries.records(
        queries.arrow(
            f"SELECT rank, stage, name, instance, peer, start_ns - ? AS start_ns, end_ns - ? AS end_ns "
            f"FROM ({base}) WHERE is_p2p AND level = 'op' AND rank IN (SELECT unnest(?)) ORDER BY start_ns",
            [t0, t0, *params, reps],
        )
    )
    arrows = queries.records(
        queries.arrow(
            f"""WITH s AS ({base} AND is_p2p AND level = 'op')
            SELECT a.instance, a.rank AS src_rank, a.stage AS src_stage, b.rank AS dst_rank,
                b.stage AS dst_stage, a.start_ns - ? AS send_start_ns, b.end_ns - ? AS recv_end_ns
            FROM s a JOIN s b ON a.instance = b.instance AND a.name LIKE '%send%' AND b.name LIKE '%recv%'
            WHERE a.rank IN (SELECT unnest(?)) AND b.rank IN (SELECT unnest(?)) ORDER BY a.start_ns""",
            [*params, t0, t0, reps, reps],
        )
    )
    bubbles = {
        (r["stage"]): r
        for r in queries.rows(
            ranks,
            "WHERE type = 'stage' AND step = ?",
            "stage, bubble_ns, duration_ns",
            [chosen],
        )
    }
    stages = []
    for s in shown:  # a loop over stages (a handful), not over ops
        own = [b for b in blocks if b["rank"] == s["rank"]]
        compute = sum(b["compute_ns"] for b in own)
        trace = bubbles.get(s["stage"], {})
        stages.append(
            {
                "stage": s["stage"],
                "rank": s["rank"],
                "ranks": s["ranks"],
                "blocks": own,
                "p2p": [p for p in p2p if p["rank"] == s["rank"]],
                "compute_ns": compute,
                "idle_ns": max(0, (t1 - t0) - compute),
                "idle_share": (max(0, (t1 - t0) - compute) / (t1 - t0)) if t1 > t0 else None,
                "bubble_ns": trace.get("bubble_ns"),
                "step_ns": trace.get("duration_ns"),
            }
        )
    busy = [s for s in stages if s["blocks"]]
    return {
        "run": run,
        "step": chosen,
        "steps": steps,
        "span_ns": t1 - t0,
        "has_blocks": bool(busy),
        "pacing_stage": max(busy, key=lambda s: s["compute_ns"])["stage"] if busy else None,
        "stages": stages,
        "arrows": arrows,
    }


def marey(
    run: str, root: Path | None, saved: Path, step: str | None, min_ns: int, limit: int
) -> dict[str, Any]:
    """The Marey view (:class:`models.JobMarey`) of one step: every device's timeline and, per
    stage, its ``limit`` longest matched ops at least ``min_ns`` long, one interval per device."""
    ops = _ops_file(root)
    steps = _steps(ops)
    chosen = _pick_step(steps, step)
    params = [str(ops), int(chosen)]
    base = "SELECT * FROM read_parquet(?) WHERE step = ? AND level = 'op'"
    span = queries.arrow(f"SELECT min(start_ns) AS t0, max(end_ns) AS t1 FROM ({base})", params)
    t0, t1 = span.column("t0")[0].as_py(), span.column("t1")[0].as_py()
    grouped = f"""WITH s AS ({base}),
        g AS (SELECT stage, key, any_value(name) AS name, any_value(category) AS category,
                min("order") AS "order", max(end_ns - start_ns) AS longest_ns,
                list(rank ORDER BY rank) AS ranks, list(start_ns - ? ORDER BY rank) AS starts_ns,
                list(end_ns - ? ORDER BY rank) AS ends_ns
              FROM s GROUP BY stage, key),
        r AS (SELECT *, row_number() OVER (PARTITION BY stage ORDER BY longest_ns DESC, "order") AS n
              FROM g WHERE longest_ns >= ?)"""
    kept = queries.records(
        queries.arrow(
            f'{grouped} SELECT stage, key, name, category, "order", longest_ns, ranks, starts_ns, ends_ns '
            f'FROM r WHERE n <= ? ORDER BY stage, "order"',
            [*params, t0, t0, int(min_ns), int(limit)],
        )
    )
    counts = queries.arrow(
        f"{grouped} SELECT count(*) AS total, count(*) FILTER (WHERE n <= ?) AS kept FROM g "
        f"LEFT JOIN r USING (stage, key)",
        [*params, t0, t0, int(min_ns), int(limit)],
    ).to_pylist()[0]
    devices = queries.records(
        queries.arrow(
            f"""SELECT rank, any_value(stage) AS stage, count(*) AS ops,
                CAST(coalesce(sum(end_ns - start_ns) FILTER (WHERE category = 'compute'), 0) AS BIGINT)
                    AS compute_ns,
                CAST(coalesce(sum(end_ns - start_ns) FILTER (WHERE category = 'communication'), 0) AS BIGINT)
                    AS communication_ns,
                max(end_ns) - ? AS end_ns
            FROM ({base}) GROUP BY rank ORDER BY any_value(stage), rank""",
            [t0, *params],
        )
    )
    resources = job_views.resources_table(job_pages.cluster_folder(root), saved)
    if resources is not None:
        by_rank = {
            r["rank"]: r
            for r in queries.rows(
                resources,
                "",
                "rank, flops_normalised, peak_share, "
                "peak_allocated_bytes / nullif(max(peak_allocated_bytes) OVER (), 0) AS peak_of_max",
            )
        }
        for d in devices:  # a loop over devices, not ops
            r = by_rank.get(d["rank"], {})
            d["flops_of_max"] = r.get("flops_normalised")
            d["peak_share"] = r.get("peak_share")
            d["peak_of_max"] = r.get("peak_of_max")
    return {
        "run": run,
        "step": chosen,
        "steps": steps,
        "span_ns": (t1 - t0) if t0 is not None else 0,
        "min_ns": int(min_ns),
        "limit": int(limit),
        "matched_ops": int(counts["total"] or 0),
        "shown_ops": int(counts["kept"] or 0),
        "hidden_ops": int((counts["total"] or 0) - (counts["kept"] or 0)),
        "devices": devices,
        "ops": kept,
    }
