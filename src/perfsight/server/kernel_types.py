"""The ``/api/run/kernel-types`` table: device kernels grouped per type.

Why two groupings: a GPU kernel's name is its type (``triton_poi_fused_...``), so GPU kernels
group by name (``kernel_stats``).  An Ascend / MindSpore device op's name is one graph node
(``Default/.../MatMul-op19``), so grouping by name gives one row per node; these inputs carry an op
type and a core type (AI Core, AI CPU, ...) per kernel, and they group as their own tools group
them: per (op type, core type), the ``op_statistic`` analysis table, as the operators page does.

For a MindInsight legacy folder, an AI CPU type's total is MindInsight's: the sum of
``aicpu_intermediate_{n}.csv``'s ``total_time`` (vendor table ``mindinsight_aicpu_ops``), which the
timeline's span of the op leaves out part of.  The share is within the row's core type, as
MindInsight's AI Core and AI CPU tabs show it.

This module only reads the cached tables (DuckDB over Parquet); it computes no new statistic.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from perfsight.server import queries
from perfsight.server.registry import RankData

AI_CPU_OPS = "mindinsight_aicpu_ops"


DERIVED_CORES = ("GPU", "MEMCPY", "MEMSET", "COMMUNICATION")
"""The core types ``analysis.kernels.core_of_kind`` gives device work whose trace names none (Kineto:
there ``op_type`` is the launching CPU op, not the kernel's type, and a kernel's name is its type)."""


def _has_op_types(details: Path) -> bool:
    """Whether the rank's kernels are typed by their trace (Ascend / MindSpore: a named core type and
    an op type on every such kernel)."""
    if not details.is_file():
        return False
    cores = ", ".join(f"'{c}'" for c in DERIVED_CORES)
    table = queries.arrow(
        f"SELECT count(*) AS n, count(op_type) AS typed FROM read_parquet(?) "
        f"WHERE core_type IS NOT NULL AND core_type NOT IN ({cores})",
        [str(details)],
    )
    n, typed = table.column("n")[0].as_py(), table.column("typed")[0].as_py()
    return bool(n) and n == typed


def op_type_page(
    data: RankData, q: str | None, sort: str, order: str, offset: int, limit: int
) -> dict[str, Any] | None:
    """One page of the per-(op type, core type) table, or ``None`` when the rank's kernels have no
    op type (then the by-name ``kernel_stats`` view applies)."""
    stats = data.table_path("op_statistic")
    if not stats.is_file() or not _has_op_types(data.table_path("kernel_details")):
        return None
    aicpu = data.table_path(AI_CPU_OPS)
    params: list[Any] = [str(stats)]
    rows = (
        "SELECT op_type AS name, core_type AS kind, count, total_ns, avg_ns, min_ns, max_ns "
        "FROM read_parquet(?)"
    )
    if aicpu.is_file():
        params.append(str(aicpu))
        rows = f"""
            WITH s AS ({rows}),
            f AS (
                SELECT kernel_type AS name, 'AI_CPU' AS kind, count(*) AS count, sum(total_ns) AS total_ns,
                       avg(total_ns) AS avg_ns, min(total_ns) AS min_ns, max(total_ns) AS max_ns
                FROM read_parquet(?) GROUP BY kernel_type
            )
            SELECT * FROM s WHERE NOT (kind = 'AI_CPU' AND name IN (SELECT name FROM f))
            UNION ALL SELECT * FROM f
        """
    where, where_params = queries.fuzzy_clause(q, ("name",))
    direction = "DESC" if order == "desc" else "ASC"
    if sort not in queries.KernelTypeSort.__args__:
        raise ValueError(f"cannot sort by {sort!r}")
    base = f"""
        SELECT name, kind, CAST(count AS BIGINT) AS count, CAST(total_ns AS BIGINT) AS total_ns,
               CAST(avg_ns AS DOUBLE) AS avg_ns, CAST(min_ns AS BIGINT) AS min_ns,
               CAST(max_ns AS BIGINT) AS max_ns,
               total_ns / nullif(sum(total_ns) OVER (PARTITION BY kind), 0) AS ratio
        FROM ({rows}) r
    """
    source = f"FROM ({base}) x WHERE {where}"
    all_params = [*params, *where_params]
    total = queries.arrow(f"SELECT count(*) AS n {source}", all_params).column("n")[0].as_py()
    table = queries.arrow(
        f'SELECT * {source} ORDER BY "{sort}" {direction} NULLS LAST, name, kind LIMIT ? OFFSET ?',
        [*all_params, int(limit), int(offset)],
    )
    return {"total": int(total), "offset": offset, "limit": limit, "rows": queries.records(table)}


def op_type_kernels_page(
    data: RankData,
    origin_ns: int,
    q: str | None,
    op_type: str,
    step: int | None,
    sort: str,
    order: str,
    offset: int,
    limit: int,
) -> dict[str, Any] | None:
    """The kernels of one op type (the drill-down from a row of :func:`op_type_page`), or ``None``
    when the rank's kernels have no op type (then a type row is a kernel name)."""
    details = data.table_path("kernel_details")
    if not _has_op_types(details):
        return None
    view = queries.KERNELS
    where = queries.instance_filters(q, view.fuzzy, None, step, details) + [("op_type = ?", [op_type])]
    return queries.page(
        details, view.select(origin_ns), sortable=[*view.sortable, *view.sort_columns.values()],
        sort=view.sort_columns.get(sort, sort), order=order, offset=offset, limit=limit, where=where,
        tiebreak=view.tiebreak,
    )  # fmt: skip


def top_op_types(data: RankData, limit: int) -> list[dict[str, Any]]:
    """The overview's operator-type shares for a rank with device ops and no host operator (a
    MindSpore graph run): the largest op types by device time (the rows of :func:`op_type_page`
    summed over core types), each with its share of all of them; [] for any other rank."""
    page = op_type_page(data, None, "total_ns", "desc", 0, 100_000)
    if page is None or not page["rows"]:
        return []
    totals: dict[str, list[int]] = {}
    for row in page["rows"]:  # one per op type and core: dozens
        entry = totals.setdefault(row["name"], [0, 0])
        entry[0] += int(row["count"])
        entry[1] += int(row["total_ns"])
    grand = sum(total for _, total in totals.values()) or 1
    ranked = sorted(totals.items(), key=lambda item: (-item[1][1], item[0]))[:limit]
    return [
        {"name": name, "count": count, "host_self_ns": 0, "device_total_ns": total, "share": total / grand}
        for name, (count, total) in ranked
    ]
