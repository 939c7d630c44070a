"""The communication matrix page: a rank x rank heatmap, aggregated to what the screen can show.

Why on the server: a 1,024-rank job has a million cells, far more than the pixels of a heatmap,
and most of them empty.  The page says how many cells a side it can draw; the server groups
consecutive ranks into square blocks of ``block`` ranks (a power of two: see :func:`block_size`)
so that the rank window fits, and returns
only the blocks that hold a link (sparse, a few kilobytes for a ring).  Clicking a block of several
ranks asks again for that block's window, down to single ranks.

What a block's value is, over the selected entries of ``communication_matrix.json`` (the step, op
family and group chosen) whose source rank lies in the block's rows and destination rank in its
columns: **size** = the sum of their bytes, **time** = the sum of their transit times, and
**bandwidth** = the mean of their bandwidths (each entry's own, as the file gives it; an entry
with no transit time has none and is left out);
``low``/``high`` are the smallest and largest entry value of the metric, ``links`` the entries
counted.  With one rank per block and one entry per link this is the file's own value.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from perfsight.server import job_comm, queries

METRICS = {
    "bandwidth": ("avg(bandwidth_bytes_per_s)", "bandwidth_bytes_per_s", "B/s"),
    "size": ("sum(bytes)", "bytes", "bytes"),
    "time": ("sum(transit_ns)", "transit_ns", "ns"),
}
"""Metric -> (block aggregate, entry column, unit); see the module docstring."""
MAX_CELLS = 1024
"""The most blocks a side the server returns, whatever the page asks (a million cells at most)."""


def axis_size(root: Path | None, saved: Path) -> int:
    """Ranks on each axis: 0 .. the highest rank of any op or link (missing ranks stay empty rows)."""
    ops, links = job_comm.ops_table(root, saved), job_comm.links_table(root, saved)
    top = (
        queries.arrow(
            "SELECT max(r) AS r FROM (SELECT max(rank) AS r FROM read_parquet(?) "
            "UNION ALL SELECT max(greatest(src, dst)) FROM read_parquet(?))",
            [str(ops), str(links)],
        )
        .column("r")[0]
        .as_py()
    )
    return 0 if top is None else int(top) + 1


def block_size(span: int, cells: int) -> int:
    """Ranks per block so that ``span`` ranks fit ``cells`` blocks: the smallest power of two that
    does.  Why a power of two: jobs place 2, 4, 8 or 16 ranks on a host, so a block is a host or a
    whole number of hosts (8 ranks a host: blocks of 8 are hosts), and the labels read 0, 64, 128."""
    need = max(1, math.ceil(span / max(1, cells)))
    return 1 << (need - 1).bit_length()


def _window(lo: int | None, hi: int | None, size: int) -> tuple[int, int]:
    """A rank window ``[lo, hi)`` clipped to the axis (the whole axis by default)."""
    start = 0 if lo is None else max(0, min(lo, size))
    end = size if hi is None else max(start, min(hi, size))
    if end <= start:
        start, end = 0, size
    return start, end


def matrix(
    run: str,
    root: Path | None,
    saved: Path,
    *,
    metric: str,
    step: str,
    op: str | None,
    group: str | None,
    cells: int,
    src_lo: int | None = None,
    src_hi: int | None = None,
    dst_lo: int | None = None,
    dst_hi: int | None = None,
) -> dict[str, Any]:
    """The heatmap of ``metric`` (:class:`models.CommMatrix`): blocks of ``block`` x ``block`` ranks
    so that the window fits ``cells`` blocks a side."""
    if metric not in METRICS:
        raise ValueError(f"unknown metric {metric!r}; choose from {', '.join(METRICS)}")
    aggregate, column, unit = METRICS[metric]
    options = job_comm.choices(root, saved)
    links = job_comm.links_table(root, saved)
    size = axis_size(root, saved)
    s_lo, s_hi = _window(src_lo, src_hi, size)
    d_lo, d_hi = _window(dst_lo, dst_hi, size)
    side = max(1, min(int(cells), MAX_CELLS))
    block = block_size(max(s_hi - s_lo, d_hi - d_lo), side)
    where = [
        job_comm.step_where(step, options["steps"]),
        ("src >= ? AND src < ? AND dst >= ? AND dst < ?", [s_lo, s_hi, d_lo, d_hi]),
        (f"{column} IS NOT NULL", []),  # a link without transit time has no bandwidth
    ]
    if op in ("collective", "p2p"):
        where.append(("kind = ?", [op]))
    elif op:
        where.append(("op = ?", [op]))
    if group:
        where.append(('"group" = ?', [group]))
    clauses = " AND ".join(c for c, _ in where)
    params: list[Any] = [block, block, str(links)]
    for _, p in where:
        params.extend(p)
    sql = (
        f"SELECT (src - {s_lo}) // ? AS src_block, (dst - {d_lo}) // ? AS dst_block, "
        f"{aggregate}::DOUBLE AS value, "
        f"min({column})::DOUBLE AS low, max({column})::DOUBLE AS high, count(*) AS links, "
        "string_agg(DISTINCT link_type, ',' ORDER BY link_type) AS link_types "
        f"FROM read_parquet(?) WHERE {clauses} GROUP BY ALL ORDER BY src_block, dst_block"
    )
    found = queries.arrow(sql, params).to_pydict()
    values = found.get("value", [])
    return {
        "run": run,
        "metric": metric,
        "unit": unit,
        "step": step,
        "op": op or "",
        "group": group or "",
        "ranks": size,
        "block": block,
        "src_lo": s_lo,
        "src_hi": s_hi,
        "dst_lo": d_lo,
        "dst_hi": d_hi,
        "rows": math.ceil((s_hi - s_lo) / block) if size else 0,
        "columns": math.ceil((d_hi - d_lo) / block) if size else 0,
        "min": min(values) if values else None,
        "max": max(values) if values else None,
        "cells": {
            k: found.get(k, [])
            for k in ("src_block", "dst_block", "value", "low", "high", "links", "link_types")
        },
        "choices": options,
    }
