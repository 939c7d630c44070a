"""The data of two job pages: the memory and FLOPs heatmaps (seed 002) and the time overview (seed 000).

Why a module of its own: :mod:`perfsight.server.job_pages` shapes the cluster step trace per rank;
these pages read other files of the job's ``cluster_analysis_output/`` -- ``cluster_resources.csv``
(peak memory, capacity, FLOPs per rank) and ``cluster_step_spread.parquet`` (per step, the spread of
the ranks' step times and their mean communication and wait) -- beside the same step trace.  A CSV
is turned once into a Parquet table in the server's own folder for the run; every request is a
DuckDB query.

What it must not do: decide a number the cluster analysis decides.  Peak share of capacity and FLOPs
over the largest rank's are read as ``perfsight.cluster.slow.resources`` wrote them, and each step's
spread and means as ``perfsight.cluster.totals.step_spread`` did.  What is derived here is only how
a view of those tables is drawn: a peak over the largest peak (the colour scale of the memory
heatmap when no capacity is known, said so by ``memory_basis``).
"""

from __future__ import annotations

import hashlib
import uuid
from pathlib import Path
from typing import Any

from perfsight import layout
from perfsight.server import job_pages, queries
from perfsight.server.runs import CLUSTER_OUTPUT_DIR

RESOURCES_TABLE = "job_resources"
"""Per rank: host, stage, peak memory, capacity, share, FLOPs and FLOPs / max (cluster_resources.csv)."""
SERIES_MAX_RANKS = 64
"""Up to this many ranks the time overview draws one line per rank; above, the min/median/max band
(a line per rank of 1,024 is a solid block nobody reads, and a large response)."""


def _cached(saved: Path, name: str, sources: list[Path], sql: str, params: list[Any]) -> Path:
    """A Parquet table ``saved/name-<hash of the sources' stamps>.parquet`` made by ``sql``, written
    once (atomically: two requests may build it at once) and reused until a source changes."""
    stamp = repr([(str(p), p.stat().st_mtime_ns, p.stat().st_size) for p in sources if p.is_file()])
    target = saved / f"{name}-{hashlib.sha256(stamp.encode()).hexdigest()[:16]}.parquet"
    if target.is_file():
        return target
    saved.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.{uuid.uuid4().hex}.tmp")
    literal = str(tmp).replace("'", "''")  # COPY TO takes no bound parameter
    cursor = queries.database().cursor()
    try:
        cursor.execute(f"COPY ({sql}) TO '{literal}' (FORMAT parquet)", params)
    finally:
        cursor.close()
    tmp.replace(target)
    return target


def resources_table(cluster: Path, saved: Path) -> Path | None:
    """:data:`RESOURCES_TABLE` for ``cluster``, with each rank's pipeline stage from the step
    trace; ``None`` when the analysis wrote no ``cluster_resources.csv``."""
    source = cluster / "cluster_resources.csv"
    if not source.is_file():
        return None
    ranks = job_pages.ranks_table(cluster, saved)
    sql = (
        "SELECT CAST(r.rank AS BIGINT) AS rank, NULLIF(CAST(r.host AS VARCHAR), '') AS host, "
        "CAST(s.stage AS BIGINT) AS stage, "
        "CAST(TRY_CAST(r.peak_allocated_bytes AS DOUBLE) AS BIGINT) AS peak_allocated_bytes, "
        "CAST(TRY_CAST(r.capacity_bytes AS DOUBLE) AS BIGINT) AS capacity_bytes, "
        "TRY_CAST(r.peak_share AS DOUBLE) AS peak_share, "
        "TRY_CAST(r.flops AS DOUBLE) AS flops, TRY_CAST(r.flops_normalised AS DOUBLE) AS flops_normalised "
        "FROM read_csv(?, header = true, all_varchar = true) r "
        "LEFT JOIN (SELECT rank, stage FROM read_parquet(?) WHERE type = 'rank' AND step = 'average') s "
        "ON s.rank = CAST(r.rank AS BIGINT)"
    )
    return _cached(saved, RESOURCES_TABLE, [source, ranks], sql, [str(source), str(ranks)])


def spread_table(cluster: Path) -> Path:
    """The analysis's per-step spread across ranks (``perfsight.cluster.totals.step_spread``);
    raises :class:`job_pages.NoClusterAnalysis` asking to analyse again when an analysis made
    before that table was written lacks it."""
    path = cluster / layout.CLUSTER_STEP_SPREAD_FILE
    if not path.is_file():
        raise job_pages.NoClusterAnalysis(
            f"{CLUSTER_OUTPUT_DIR}/{layout.CLUSTER_STEP_SPREAD_FILE} is missing (each step's spread "
            "across ranks, written by a newer perfsight): analyse the job again with this perfsight "
            "(`perfsight analyse JOB_FOLDER`)"
        )
    return path


def heatmaps(run: str, root: Path | None, saved: Path) -> dict[str, Any]:
    """The memory and FLOPs heatmaps (:class:`models.JobHeatmaps`): one cell per rank, by host."""
    cluster = job_pages.cluster_folder(root)
    table = resources_table(cluster, saved)
    if table is None:
        raise job_pages.NoClusterAnalysis(
            "this job's analysis has no cluster_resources.csv (peak memory and FLOPs per rank): "
            "analyse it again with `perfsight analyse JOB_FOLDER`"
        )
    cells = queries.rows(
        table,
        "ORDER BY host NULLS LAST, rank",
        "rank, host, stage, peak_allocated_bytes, capacity_bytes, peak_share, "
        "peak_allocated_bytes / nullif(max(peak_allocated_bytes) OVER (), 0) AS peak_of_max, "
        "flops, flops_normalised",
    )
    peaks = [c for c in cells if c["peak_allocated_bytes"] is not None]
    if not peaks:
        basis = "none"
    elif all(c["peak_share"] is not None for c in peaks):
        basis = "capacity"
    else:
        basis = "max_peak"
    hosts: list[str | None] = []
    for c in cells:  # a loop over ranks (≤ a few thousand), not events
        if not hosts or hosts[-1] != c["host"]:
            hosts.append(c["host"])
    return {
        "run": run,
        "memory_basis": basis,
        "max_peak_bytes": max((c["peak_allocated_bytes"] for c in peaks), default=None),
        "max_flops": max((c["flops"] for c in cells if c["flops"] is not None), default=None),
        "flops_known": any((c["flops"] or 0) > 0 for c in cells),
        "hosts": hosts,
        "cells": cells,
    }


def time_overview(run: str, root: Path | None, saved: Path) -> dict[str, Any]:
    """The time overview (:class:`models.JobTimeOverview`): per step, the ranks' step times
    (spread, and each rank's when there are few) with the ranks' mean communication and wait, as
    the cluster analysis wrote them (``perfsight.cluster.totals.step_spread``)."""
    cluster = job_pages.cluster_folder(root)
    spread = spread_table(cluster)
    ranks = job_pages.ranks_table(cluster, saved)
    steps = queries.records(
        queries.arrow(
            "SELECT CAST(step AS VARCHAR) AS step, ranks, min_ns, median_ns, max_ns, fastest_rank, "
            "slowest_rank, mean_communication_ns, mean_wait_ns FROM read_parquet(?) ORDER BY step",
            [str(spread)],
        )
    )
    rank_count = (
        queries.arrow(
            "SELECT count(DISTINCT rank) AS n FROM read_parquet(?) WHERE type = 'rank'", [str(ranks)]
        )
        .column("n")[0]
        .as_py()
    )
    series: list[dict[str, Any]] = []
    if rank_count <= SERIES_MAX_RANKS:
        order = [s["step"] for s in steps]
        series = queries.records(
            queries.arrow(
                "SELECT rank, any_value(stage) AS stage, "
                "list(duration_ns ORDER BY length(step), step) AS durations_ns, "
                "list(step ORDER BY length(step), step) AS steps "
                "FROM read_parquet(?) WHERE type = 'rank' AND step <> 'average' GROUP BY rank ORDER BY rank",
                [str(ranks)],
            )
        )
        for s in series:  # align each rank's durations on the job's steps (a rank may miss one)
            by_step = dict(zip(s.pop("steps"), s["durations_ns"], strict=True))
            s["durations_ns"] = [by_step.get(step) for step in order]
    return {
        "run": run,
        "rank_count": int(rank_count),
        "wait_known": all(s["mean_wait_ns"] is not None for s in steps),
        "steps": steps,
        "series": series,
        "series_max_ranks": SERIES_MAX_RANKS,
    }
