"""The memory page's curves, reduced for drawing in DuckDB: a trace's ``memory_curve`` is never read whole.

Why: the ``memory_curve`` analysis table has a row per allocator event (8 million on a 10 GB trace);
reading it into Arrow and NumPy to reduce it took +187 MB on a 1 GB trace and +318 MB on a 2 GB one.
The reduction is the same as before, decided per device (its rows in file order, ``n`` of them):
with at most ``points`` rows, every row; otherwise ``points // 3`` buckets of rows cut at
``np.linspace(0, n, buckets + 1)`` (truncated), and of each bucket its first row, its row of
largest and of smallest allocated bytes (the first such; an unknown value counts as neither), plus
the last row -- so the peak always survives.  It runs in the server's memory-limited DuckDB
(``queries.pages_database``), which spills past its limit.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from perfsight.server import queries

REDUCED_CURVES_SQL = """
WITH c AS (
    SELECT CAST(device_type AS VARCHAR) AS device_type, coalesce(device_index, -1) AS device_index,
           coalesce(ts_ns, 0) AS ts_ns, allocated_bytes, reserved_bytes, file_row_number AS f
    FROM read_parquet(?, file_row_number = true)
),
p AS (
    SELECT *, row_number() OVER (w ORDER BY f) - 1 AS pos, count(*) OVER w AS n
    FROM c WINDOW w AS (PARTITION BY device_type, device_index)
),
s AS (  -- buckets: np.linspace(0, n, buckets + 1) truncated, step = n / buckets in float64
    SELECT *, CAST(n AS DOUBLE) / ? AS step, CAST(floor(pos / (CAST(n AS DOUBLE) / ?)) AS BIGINT) AS k0
    FROM p
),
b AS MATERIALIZED (  -- each row's bucket: the last whose first row is at or before it
    SELECT device_type, device_index, n, pos, ts_ns, allocated_bytes, reserved_bytes,
        CASE WHEN n <= ? THEN pos
             ELSE least(? - 1,
                 CASE WHEN CAST(trunc((k0 + 1) * step) AS BIGINT) <= pos THEN k0 + 1
                      WHEN CAST(trunc(k0 * step) AS BIGINT) > pos THEN k0 - 1
                      ELSE k0 END)
        END AS bucket
    FROM s
),
g AS (  -- per bucket: its first row, its first row of most and of least allocated bytes
    SELECT device_type, device_index,
        min(pos) AS first_pos,
        arg_max(pos, struct_pack(a := coalesce(allocated_bytes, -9223372036854775808), p := -pos)) AS max_pos,
        arg_min(pos, struct_pack(a := coalesce(allocated_bytes, 9223372036854775807), p := pos)) AS min_pos
    FROM b GROUP BY device_type, device_index, bucket
),
k AS (SELECT device_type, device_index, unnest([first_pos, max_pos, min_pos]) AS pos FROM g)
SELECT device_type, device_index, n, ts_ns, allocated_bytes, reserved_bytes
FROM b
WHERE pos = n - 1 OR (device_type, device_index, pos) IN (SELECT (device_type, device_index, pos) FROM k)
ORDER BY device_type, device_index, pos
"""
"""Why aggregates and not a window per bucket: three sorts of every row took 2.2 s on a 2 GB
trace's 1.7M curve rows, the hash aggregates 0.8 s (the structs break ties by the lower row)."""


def reduced_curves(path: Path, points: int) -> list[dict[str, Any]]:
    """Per device (by type, then index): ``{device_type, device_index, points (rows in all), ts_ns,
    allocated_bytes, reserved_bytes}``, the rows kept for drawing at about ``points`` points
    (absolute ns; ``None`` where a value is unknown).  [] without the file."""
    if not path.is_file():
        return []
    buckets = max(1, points // 3)
    found = queries.arrow(
        REDUCED_CURVES_SQL, [str(path), buckets, buckets, points, buckets], queries.pages_database()
    ).to_pydict()
    out: list[dict[str, Any]] = []
    rows = zip(
        found["device_type"], found["device_index"], found["n"], found["ts_ns"],
        found["allocated_bytes"], found["reserved_bytes"], strict=True,
    )  # fmt: skip
    for device_type, device_index, n, ts, allocated, reserved in rows:  # a few thousand rows
        if not out or (out[-1]["device_type"], out[-1]["device_index"]) != (device_type, device_index):
            out.append(
                {
                    "device_type": device_type,
                    "device_index": device_index,
                    "points": n,
                    "ts_ns": [],
                    "allocated_bytes": [],
                    "reserved_bytes": [],
                }
            )
        out[-1]["ts_ns"].append(ts)
        out[-1]["allocated_bytes"].append(allocated)
        out[-1]["reserved_bytes"].append(reserved)
    return out
