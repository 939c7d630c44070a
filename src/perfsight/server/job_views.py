"""The data of two job pages: the memory and FLOPs heatmaps (seed 002) and the time overview (seed 000).

Why a module of its own: :mod:`perfsight.server.job_pages` shapes the cluster step trace per rank;
these pages read other files of the job's ``cluster_analysis_output/`` -- ``cluster_resources.csv``
(peak memory, capacity, FLOPs per rank) and ``cluster_communication_ops.csv`` (each rank's wait at
each collective) -- beside the same step trace.  Each file is turned once into a Parquet table in the
server's own folder for the run and every request is a DuckDB query over it.

What it must not do: decide a number the cluster analysis decides.  Peak share of capacity and FLOPs
over the largest rank's are read as ``perfsight.cluster.slow.resources`` wrote them.  What is
derived here is only how a view of those tables is drawn: a peak over the largest peak (the colour
scale of the memory heatmap when no capacity is known, said so by ``memory_basis``), a rank's wait
summed over its collectives of one step, and the spread and mean of one step across ranks -- each a
single SQL aggregate over the analysis's own columns, kept in this one module.
"""

from __future__ import annotations

import hashlib
import uuid
from pathlib import Path
from typing import Any

from perfsight.server import job_pages, queries

RESOURCES_TABLE = "job_resources"
"""Per rank: host, stage, peak memory, capacity, share, FLOPs and FLOPs / max (cluster_resources.csv)."""
WAITS_TABLE = "job_waits"
"""Per rank and step: the rank's wait for its peers at collectives (cluster_communication_ops.csv)."""
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


def waits_table(cluster: Path, saved: Path) -> Path | None:
    """:data:`WAITS_TABLE`: each rank's wait summed over its communication ops of each step;
    ``None`` when the job recorded no communication op."""
    source = cluster / "cluster_communication_ops.csv"
    if not source.is_file():
        return None
    sql = (
        "SELECT CAST(step AS VARCHAR) AS step, CAST(rank AS BIGINT) AS rank, "
        "CAST(sum(coalesce(TRY_CAST(wait_ns AS DOUBLE), 0)) AS BIGINT) AS wait_ns "
        "FROM read_csv(?, header = true, all_varchar = true) "
        "WHERE TRY_CAST(step AS BIGINT) IS NOT NULL GROUP BY 1, 2"
    )
    return _cached(saved, WAITS_TABLE, [source], sql, [str(source)])


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
    (spread, and each rank's when there are few) with the ranks' mean communication and wait."""
    cluster = job_pages.cluster_folder(root)
    ranks = job_pages.ranks_table(cluster, saved)
    waits = waits_table(cluster, saved)
    wait_join = (
        "LEFT JOIN read_parquet(?) w ON w.step = r.step AND w.rank = r.rank" if waits is not None else ""
    )
    wait_ns = "coalesce(w.wait_ns, 0)" if waits is not None else "NULL"
    per_rank = (
        f"SELECT r.step, r.rank, r.stage, r.duration_ns, r.communication_ns, {wait_ns} AS wait_ns "
        f"FROM read_parquet(?) r {wait_join} WHERE r.type = 'rank' AND r.step <> 'average'"
    )
    params = [str(ranks)] + ([str(waits)] if waits is not None else [])
    steps = queries.records(
        queries.arrow(
            f"SELECT step, count(*) AS ranks, min(duration_ns) AS min_ns, "
            f"CAST(round(median(duration_ns)) AS BIGINT) AS median_ns, max(duration_ns) AS max_ns, "
            f"arg_min(rank, duration_ns) AS fastest_rank, arg_max(rank, duration_ns) AS slowest_rank, "
            f"CAST(round(avg(communication_ns)) AS BIGINT) AS mean_communication_ns, "
            f"CAST(round(avg(wait_ns)) AS BIGINT) AS mean_wait_ns "
            f"FROM ({per_rank}) GROUP BY step ORDER BY length(step), step",
            params,
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
                f"SELECT rank, any_value(stage) AS stage, "
                f"list(duration_ns ORDER BY length(step), step) AS durations_ns, "
                f"list(step ORDER BY length(step), step) AS steps "
                f"FROM ({per_rank}) GROUP BY rank ORDER BY rank",
                params,
            )
        )
        for s in series:  # align each rank's durations on the job's steps (a rank may miss one)
            by_step = dict(zip(s.pop("steps"), s["durations_ns"], strict=True))
            s["durations_ns"] = [by_step.get(step) for step in order]
    return {
        "run": run,
        "rank_count": int(rank_count),
        "wait_known": waits is not None,
        "steps": steps,
        "series": series,
        "series_max_ranks": SERIES_MAX_RANKS,
    }
