"""The data behind the data-preparation page (the seed's MindData page): the loader's queues per
request, the pipeline's stages, the workers and the judgement, read from the ``data_pipeline``
analysis tables.

Why only reads: every number was computed once by ``perfsight.analysis.data_pipeline`` and saved
with the rank's cache; this module selects rows, makes times relative to the run's origin (so the
browser holds them exactly) and thins a long queue curve for drawing, nothing else.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from perfsight.analysis.data_pipeline import STAGE_QUEUE_COLUMNS
from perfsight.server import queries
from perfsight.server.registry import OpenedRun, RankData

MAX_QUEUE_POINTS = 5000
"""Requests drawn at most; a longer run keeps every empty-queue request and evenly spaced others."""

HOW_TO_ENABLE = (
    "This run has no data-loader capture. Profile at Level2 to record the DataLoader's queues and "
    "the time of each stage: perfsight.profile(..., experimental_config=perfsight.ExperimentalConfig("
    'profiler_level="Level2")), or without code changes PERFSIGHT_PROFILER_OPTIONS=\'{"start": true, '
    '"profiler_level": "Level2"}\' (docs/COLLECTION.md).'
)


HOW_TO_ENABLE_MINDSPORE = (
    "MindSpore wrote no MindData profiling files for this device (minddata_pipeline_raw_<device>.csv, "
    "pipeline_profiling_<device>.json, device_queue_profiling_<device>.txt, minddata_aicpu_<device>.txt): "
    "profile with the data process enabled (MindSpore Profiler's data_process=True) to record the "
    "pipeline's queues."
)


def _thinned(rows: list[dict[str, Any]], points: int) -> list[dict[str, Any]]:
    """At most ``points`` rows: every row that found the host queue empty, then evenly spaced
    others (so the empty-queue marks a user counts on the chart are all there)."""
    if len(rows) <= points:
        return rows
    empty = np.array([r["host_queue"] == 0 for r in rows])
    keep = set(np.flatnonzero(empty)[:points].tolist())
    room = points - len(keep)
    if room > 0:
        others = np.flatnonzero(~empty)
        keep |= set(others[np.linspace(0, len(others) - 1, room).astype(int)].tolist())
    return [rows[i] for i in sorted(keep)]


MAX_STAGE_POINTS = 2000
"""Batches drawn at most per stage (evenly spaced in time order past that)."""


def _stage_curves(opened: OpenedRun, data: RankData) -> dict[str, dict[str, list[int]]]:
    """Per stage, its time on each measured batch: ``{stage: {start_ns, dur_ns, worker}}``."""
    path = data.table_path("data_stage_batches")
    if not path.is_file():
        return {}
    table = queries.arrow(
        f"""
        SELECT stage, start_ns - {int(opened.origin_ns)} AS start_ns, dur_ns, worker FROM (
            SELECT *, row_number() OVER (PARTITION BY stage ORDER BY start_ns) - 1 AS i,
                   count(*) OVER (PARTITION BY stage) AS n
            FROM read_parquet(?)
        ) WHERE i % greatest(1, n // {MAX_STAGE_POINTS}) = 0
        ORDER BY stage, start_ns
        """,
        [str(path)],
    )
    curves: dict[str, dict[str, list[int]]] = {}
    for row in queries.records(table):  # at most MAX_STAGE_POINTS x a handful of stages
        curve = curves.setdefault(row["stage"], {"start_ns": [], "dur_ns": [], "worker": []})
        for key in ("start_ns", "dur_ns", "worker"):
            curve[key].append(row[key])
    return curves


def per_rank(opened: OpenedRun) -> list[dict[str, Any]]:
    """Every captured rank's wait for data and verdict, for comparing ranks (one query over the
    ranks' one-row summary tables; empty for a single rank)."""
    if len(opened.ranks) < 2:
        return []
    paths = [str(opened.table_path(r, "data_pipeline_summary")) for r in opened.ranks]
    paths = [p for p in paths if Path(p).is_file()]
    if not paths:
        return []
    table = queries.arrow(
        "SELECT rank, wait_ns, wait_share, host_queue_empty_ratio, verdict, bottleneck_stage "
        "FROM read_parquet(?) ORDER BY rank",
        [paths],
    )
    return queries.records(table)


def data_prep(opened: OpenedRun, data: RankData) -> dict[str, Any]:
    """The ``/api/run/data-prep`` response for one rank (``captured`` false: ``how_to_enable``)."""
    summary = queries.rows(data.table_path("data_pipeline_summary"), "")
    stages = queries.rows(
        data.table_path("data_stages"),
        'ORDER BY "order"',
        'stage, "order", op_type, runs_in, parallelism, batches, total_ns, per_batch_ns, '
        "throughput_per_s, share, bottleneck"
        + (", " + ", ".join(STAGE_QUEUE_COLUMNS) if _has_columns(data.table_path("data_stages")) else ""),
    )
    workers = queries.rows(
        data.table_path("data_workers"),
        "ORDER BY worker, pid",
        "worker, pid, batches, busy_ns, cpu_ns, idle_ns, read_ns, transform_ns, collate_ns",
    )
    queue = queries.rows(
        data.table_path("data_queue"),
        "ORDER BY start_ns",
        f"step, batch, start_ns - {int(opened.origin_ns)} AS start_ns, wait_ns, host_queue, device_queue, "
        "queue_capacity",
    )
    waits = queries.rows(data.table_path("data_wait"), "ORDER BY step", "step, data_wait_ns")
    captured = bool(summary)
    return {
        "run": opened.run.id,
        "rank": data.rank,
        "captured": captured,
        "how_to_enable": None
        if captured
        else (HOW_TO_ENABLE_MINDSPORE if data.meta.framework == "mindspore" else HOW_TO_ENABLE),
        "summary": summary[0] if captured else None,
        "stages": stages,
        "workers": workers,
        "queue": _thinned(queue, MAX_QUEUE_POINTS),
        "queue_requests": len(queue),
        "wait_per_step": waits,
        "stage_batches": _stage_curves(opened, data),
        "ranks": per_rank(opened),
        "stage_queues": _stage_queues(data),
        "cpu": queries.rows(
            data.table_path("data_cpu_utilization"),
            "",
            "scope, op_id, stage, metric, samples, mean, max",
        ),
    }


def _stage_queues(data: RankData) -> dict[str, dict[str, list[Any]]]:
    """Per stage with its own output queue (MindData ops): ``{stage: {time_ms, size, capacity}}``."""
    rows = queries.rows(
        data.table_path("data_stage_queues"), "ORDER BY stage, sample", "stage, time_ms, size, capacity"
    )
    curves: dict[str, dict[str, list[Any]]] = {}
    for row in rows:  # a handful of ops x their samples
        curve = curves.setdefault(row["stage"], {"time_ms": [], "size": [], "capacity": []})
        for key in ("time_ms", "size", "capacity"):
            curve[key].append(row[key])
    return curves


def _has_columns(path: Path) -> bool:
    """Whether a cached ``data_stages`` has the per-stage queue columns (caches older than them lack them)."""
    import pyarrow.parquet as pq

    return path.is_file() and set(STAGE_QUEUE_COLUMNS) <= set(pq.read_schema(path).names)
