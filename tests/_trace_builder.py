"""Small hand-made Traces for unit tests whose every number can be worked out on paper.

Rows are written as dicts with only the fields that matter; the rest get the
model's defaults (``NO_ID``, depth 0, rank 0).  Tracks are derived from the
rows' ``track`` values.  Not for production code: readers build Traces.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa

from perfsight.model import (
    COMM_SCHEMA,
    FLOW_SCHEMA,
    MEMORY_SCHEMA,
    NO_ID,
    SLICE_SCHEMA,
    STEP_SCHEMA,
    TRACK_SCHEMA,
    RunMetadata,
    Trace,
    conform,
    empty_table,
)

_SLICE_DEFAULTS: dict[str, Any] = {
    "rank": 0,
    "category": None,
    "is_device": False,
    "pid": 1,
    "tid": 1,
    "depth": 0,
    "correlation": NO_ID,
    "external_id": NO_ID,
    "step": NO_ID,
}


def _table(rows: list[dict[str, Any]], schema: pa.Schema) -> pa.Table:
    if not rows:
        return empty_table(schema)
    columns = {key: [row.get(key) for row in rows] for key in rows[0]}
    return conform(pa.table(columns), schema)


def make_trace(
    slices: list[dict[str, Any]],
    steps: list[dict[str, Any]],
    *,
    track_names: dict[int, str] | None = None,
    comm: list[dict[str, Any]] | None = None,
    flows: list[dict[str, Any]] | None = None,
    rank: int = 0,
) -> Trace:
    """A Trace from slice rows (``kind``, ``name``, ``track``, ``start_ns``, ``dur_ns`` required)."""
    slice_rows = [{**_SLICE_DEFAULTS, "rank": rank, **row} for row in slices]
    keys = list(dict.fromkeys(k for row in slice_rows for k in row))
    slice_rows = [{k: row.get(k) for k in keys} for row in slice_rows]
    track_rows: dict[int, dict[str, Any]] = {}
    for row in slice_rows:
        device = bool(row["is_device"])
        track_rows.setdefault(
            row["track"],
            {
                "track": row["track"],
                "rank": rank,
                "pid": row["pid"],
                "tid": row["tid"],
                "is_device": device,
                "device_index": 0 if device else NO_ID,
                "stream": row["tid"] if device else NO_ID,
                "name": (track_names or {}).get(row["track"], f"track {row['track']}"),
            },
        )
    step_rows = [
        {
            "rank": rank,
            "device_start_ns": None,
            "device_end_ns": None,
            "complete": True,
            "inferred": False,
            **s,
        }
        for s in steps
    ]
    return Trace(
        slices=_table(slice_rows, SLICE_SCHEMA),
        tracks=_table(sorted(track_rows.values(), key=lambda r: r["track"]), TRACK_SCHEMA),
        memory=empty_table(MEMORY_SCHEMA),
        flows=_table([{"rank": rank, **f} for f in flows or []], FLOW_SCHEMA),
        steps=_table(step_rows, STEP_SCHEMA),
        comm=_table(
            [{"rank": rank, "start_ns": 0, "dur_ns": 0, "step": NO_ID, **c} for c in comm or []], COMM_SCHEMA
        ),
        meta=RunMetadata(rank=rank),
    )
