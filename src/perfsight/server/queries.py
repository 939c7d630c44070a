"""Table pages for the UI: DuckDB over the Parquet analysis tables, never a re-read of the trace.

Why DuckDB: sorting, filtering and paging a million-row ``operator_instances`` table per request
is what a columnar SQL engine does well, straight from the Parquet files ``perfsight analyse``
wrote.  Column names in SQL come only from fixed allow-lists; every value from the request is a
bound parameter.

Fuzzy search: every whitespace-separated word of ``q`` must occur in the name, ignoring case and
the separators ``_ : . - /`` and spaces, in any order (``"allreduce nccl"`` finds
``ncclKernel_AllReduce_RING_LL``; ``"conv backward"`` finds ``aten::convolution_backward``).  A
looser subsequence match was tried and rejected: on long C++ kernel names almost any short word is a
subsequence, so it filtered nothing.
"""

from __future__ import annotations

import atexit
import dataclasses
import shutil
import tempfile
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

import duckdb
import orjson
import pyarrow as pa
from pydantic import BaseModel

from perfsight.server import models

MAX_LIMIT = 1000
PAGES_MEMORY_LIMIT = "256MB"
"""What the DuckDB of the per-row table pages may hold before it spills to disk.  Why a limit: a
rank's ``operator_instances`` or ``kernel_details`` has a row per call (millions on a gigabyte
trace), and a page deep into one of them sorts every row's keys; without a limit that sort grew with
the trace (188 MB at 1M rows, measured), with it the server's memory is the same for any trace."""
_db: duckdb.DuckDBPyConnection | None = None
_pages_db: duckdb.DuckDBPyConnection | None = None
_spill_folders: list[str] = []
_db_lock = threading.Lock()


class QueryTooLarge(RuntimeError):
    """A query needed more memory than the server's DuckDB may use, even spilling to disk (not a
    damaged file: the analysis is fine, the request is too big for this server)."""


def database() -> duckdb.DuckDBPyConnection:
    """The process's in-memory DuckDB (it only reads Parquet files; each query gets its own cursor)."""
    global _db
    with _db_lock:
        if _db is None:
            _db = duckdb.connect(config={"threads": 2})
        return _db


def pages_database() -> duckdb.DuckDBPyConnection:
    """The DuckDB of the per-row table pages (:func:`page`): a database of its own, limited to
    :data:`PAGES_MEMORY_LIMIT` and spilling into a private temporary folder, removed when the
    process exits (DuckDB's default, ``.tmp`` in the working directory, would write into the
    user's folder, and DuckDB leaves the folder behind).  Its own database, so the job pages'
    queries keep the main one's memory."""
    global _pages_db
    with _db_lock:
        if _pages_db is None:
            spill = tempfile.mkdtemp(prefix="perfsight-duckdb-")
            atexit.register(shutil.rmtree, spill, True)  # uvicorn exits by its signal: see close()
            _spill_folders.append(spill)
            _pages_db = duckdb.connect(
                config={"threads": 2, "memory_limit": PAGES_MEMORY_LIMIT, "temp_directory": spill}
            )
        return _pages_db


def close() -> None:
    """Close the pages' database and remove its spill folder: called when the server stops (uvicorn
    ends a server stopped by a signal with that signal, so ``atexit`` does not run there)."""
    global _pages_db
    with _db_lock:
        if _pages_db is not None:
            _pages_db.close()
            _pages_db = None
        while _spill_folders:
            shutil.rmtree(_spill_folders.pop(), ignore_errors=True)


def arrow(sql: str, params: Sequence[Any], db: duckdb.DuckDBPyConnection | None = None) -> pa.Table:
    """``sql`` with ``params`` as an Arrow table, on a cursor of its own (cursors are per thread) of
    ``db`` (default :func:`database`)."""
    cur = (db or database()).cursor()
    try:
        relation = cur.sql(sql, params=list(params))
        if relation is None:
            return pa.table({})
        method = getattr(relation, "to_arrow_table", None) or relation.arrow  # DuckDB 2 / DuckDB 1
        return method()
    except duckdb.OutOfMemoryException as error:
        raise QueryTooLarge(str(error).splitlines()[0]) from None
    finally:
        cur.close()


SEPARATORS = "_:.-/ "
"""Ignored when matching names: ``allreduce`` finds ``AllReduce``, ``all_reduce`` and ``all-reduce``."""


def _normalised(text: str) -> str:
    return "".join(ch for ch in text.lower() if ch not in SEPARATORS)


def _words(q: str | None) -> list[str]:
    return [w for w in (_normalised(word) for word in (q or "").split()) if w]


def _contains_word(column: str) -> str:
    """The fuzzy rule for one word (a parameter) and one column, in SQL."""
    return f"contains(translate(lower(coalesce({column}, '')), '{SEPARATORS}', ''), ?)"


def fuzzy_clause(q: str | None, columns: Sequence[str]) -> tuple[str, list[Any]]:
    """SQL (``TRUE`` when ``q`` is empty) and parameters for the fuzzy filter over ``columns``:
    every word of ``q`` must occur in one of the columns, ignoring case and separators."""
    words = _words(q)
    if not words:
        return "TRUE", []
    parts, params = [], []
    for word in words:
        ors = " OR ".join(_contains_word(c) for c in columns)
        parts.append(f"({ors})")
        params.extend([word] * len(columns))
    return " AND ".join(parts), params


def fuzzy_in_file(q: str | None, columns: Sequence[str], path: Path) -> tuple[str, list[Any]]:
    """:func:`fuzzy_clause` over the Parquet file at ``path``, the rule applied once per distinct
    value of each column (a few hundred names) and the rows then kept by membership.

    Why: DuckDB runs ``translate`` on every row, not once per dictionary entry: 5 s for one word
    over the 10 million operator rows of a 10 GB trace, against 0.1 s this way.  (A subquery of
    the distinct values does not help: the filter is pushed below the DISTINCT.)"""
    words = _words(q)
    if not words or not path.is_file():
        return fuzzy_clause(q, columns)
    db = pages_database()
    distinct = {
        c: arrow(f"SELECT DISTINCT {c} AS v FROM read_parquet(?) WHERE {c} IS NOT NULL", [str(path)], db)
        for c in columns
    }
    parts, params = [], []
    cur = db.cursor()
    try:
        for word in words:
            ors = []
            for c in columns:
                cur.register("distinct_values", distinct[c])
                found = cur.execute(f"SELECT v FROM distinct_values WHERE {_contains_word('v')}", [word])
                ors.append(f"{c} IN (SELECT unnest(?::VARCHAR[]))")
                params.append([row[0] for row in found.fetchall()])
            parts.append(f"({' OR '.join(ors)})")
    finally:
        cur.close()
    return " AND ".join(parts), params


def instance_filters(
    q: str | None,
    fuzzy_columns: Sequence[str],
    name: str | None,
    step: int | None,
    source: Path | None = None,
) -> list[tuple[str, list[Any]]]:
    """WHERE clauses of a page of instances (operators, kernels): the fuzzy search ``q`` over
    ``fuzzy_columns`` (decided per distinct value of the Parquet file ``source`` when given: see
    :func:`fuzzy_in_file`), then the exact type ``name`` (a drill-down from a type row) and ``step``."""
    where = [fuzzy_clause(q, fuzzy_columns) if source is None else fuzzy_in_file(q, fuzzy_columns, source)]
    if name is not None:
        where.append(("name = ?", [name]))
    if step is not None:
        where.append(("step = ?", [step]))
    return where


def page(
    path: Path,
    select: Sequence[str],
    *,
    sortable: Sequence[str],
    sort: str,
    order: str,
    offset: int,
    limit: int,
    where: Sequence[tuple[str, list[Any]]] = (),
    tiebreak: str = "",
) -> dict[str, Any]:
    """One page of the Parquet file at ``path`` as the API returns it: ``total`` (rows matching),
    ``offset``, ``limit`` and ``rows`` (dicts).

    ``select`` are SQL expressions with aliases from a fixed list (never from the request);
    ``sort`` must be in ``sortable`` (the caller has validated it, this re-checks).  Rows that tie
    on ``sort`` and ``tiebreak`` come in file order.

    Why two queries for a page (of at most :data:`MAX_LIMIT` rows): the first sorts only the sort
    keys and row numbers and keeps the page's row numbers, the second reads those rows alone (a
    row-number filter DuckDB pushes into the Parquet scan).  Sorting whole rows (shapes, types,
    names) past DuckDB's top-N -- any page beyond the first 0.7 % of the table -- held every row
    in memory.  Both run in :func:`pages_database`, which spills past its memory limit.
    """
    if sort not in sortable:
        raise ValueError(f"cannot sort by {sort!r}; choose from {', '.join(sortable)}")
    if not path.is_file():
        return {"total": 0, "offset": offset, "limit": limit, "rows": []}
    clauses = [c for c, _ in where] or ["TRUE"]
    params: list[Any] = [str(path)]
    for _, p in where:
        params.extend(p)
    direction = "DESC" if order == "desc" else "ASC"
    source = f"FROM read_parquet(?, file_row_number = true) WHERE {' AND '.join(clauses)}"
    db = pages_database()
    total = arrow(f"SELECT count(*) AS n {source}", params, db).column("n")[0].as_py()
    if limit > MAX_LIMIT:  # a whole small table (a job's ranks): one query, as it always was
        order_by = f'"{sort}" {direction} NULLS LAST' + (f", {tiebreak}" if tiebreak else "")
        sql = f"SELECT {', '.join(select)} {source} ORDER BY {order_by}, file_row_number LIMIT ? OFFSET ?"
        table = arrow(sql, [*params, int(limit), int(offset)], db)
        return {"total": int(total), "offset": offset, "limit": limit, "rows": records(table)}
    keys = _sort_keys(select, sort, direction, tiebreak)
    found = arrow(
        f"SELECT file_row_number AS r {source} ORDER BY {keys} LIMIT ? OFFSET ?",
        [*params, int(limit), int(offset)],
        db,
    )
    wanted = [int(r) for r in found.column("r").to_pylist()]
    if not wanted:
        return {"total": int(total), "offset": offset, "limit": limit, "rows": []}
    listed = ", ".join(map(str, wanted))  # integers DuckDB gave: no text of the request
    table = arrow(
        f"SELECT {', '.join(select)}, file_row_number AS __row FROM read_parquet(?, file_row_number = true) "
        f"WHERE file_row_number IN ({listed})",
        [str(path)],
        db,
    )
    at = {row: i for i, row in enumerate(table.column("__row").to_pylist())}
    table = table.drop_columns(["__row"]).take([at[row] for row in wanted])
    return {"total": int(total), "offset": offset, "limit": limit, "rows": records(table)}


def _sort_keys(select: Sequence[str], sort: str, direction: str, tiebreak: str) -> str:
    """The ORDER BY of a page in terms of the file's columns: ``sort`` and each ``tiebreak`` name
    stand for the SELECT expression of that alias when there is one (as ORDER BY binds an alias
    of the SELECT list first: a null ``self_ns`` selected as ``coalesce(self_ns, 0)`` sorts as 0),
    else for the column; file order breaks the remaining ties."""
    aliases = {}
    for item in select:
        expression, sep, alias = item.rpartition(" AS ")
        if sep:
            aliases[alias.strip()] = f"({expression})"
    quoted = '"' + sort + '"'
    terms = [f"{aliases.get(sort, quoted)} {direction} NULLS LAST"]
    for name in (t.strip() for t in tiebreak.split(",") if t.strip()):
        terms.append(aliases.get(name, name))
    return ", ".join([*terms, "file_row_number"])


@dataclasses.dataclass(frozen=True)
class TableView:
    """One paged table of the API, declared once: the analysis table it reads, the response row it
    returns (its fields are the selected columns, in order), and how it sorts and filters.

    ``expressions`` gives the SQL of a field that is not the column of that name (a null total read
    as 0, a timestamp made relative to the run's origin: ``{origin}``); every other field is
    selected as is.  ``instances`` views (one row per call) also filter by exact ``name`` and
    ``step``."""

    table: str
    row: type[BaseModel]
    sortable: tuple[str, ...]
    tiebreak: str
    fuzzy: tuple[str, ...] = ("name",)
    expressions: Mapping[str, str] = dataclasses.field(default_factory=dict)
    instances: bool = False
    sort_columns: Mapping[str, str] = dataclasses.field(default_factory=dict)  # API name -> column

    def select(self, origin_ns: int) -> list[str]:
        """The SELECT list: each field of the row, by its expression or as its own column."""
        out = []
        for field in self.row.model_fields:
            expression = self.expressions.get(field)
            if expression is not None:
                field = f"{expression.format(origin=int(origin_ns))} AS {field}"
            out.append(field)
        return out


def view_page(
    view: TableView,
    path: Path,
    *,
    origin_ns: int = 0,
    q: str | None = None,
    name: str | None = None,
    step: int | None = None,
    sort: str,
    order: str,
    offset: int,
    limit: int,
) -> dict[str, Any]:
    """One page of ``view`` over the Parquet file at ``path`` (see :func:`page`)."""
    if view.instances:
        where = instance_filters(q, view.fuzzy, name, step, path)
    else:
        where = [fuzzy_in_file(q, view.fuzzy, path)]
    column = view.sort_columns.get(sort, sort)
    return page(
        path, view.select(origin_ns), sortable=[*view.sortable, *view.sort_columns.values()], sort=column,
        order=order, offset=offset, limit=limit, where=where, tiebreak=view.tiebreak,
    )  # fmt: skip


def _zero_if_null(*names: str) -> dict[str, str]:
    return {name: f"coalesce({name}, 0)" for name in names}


OperatorTypeSort = Literal[
    "name", "count", "host_total_ns", "host_self_ns", "host_avg_ns", "host_min_ns", "host_max_ns",
    "device_total_ns", "host_ratio", "flops",
]  # fmt: skip
OperatorSort = Literal["id", "step", "name", "thread", "start_ns", "dur_ns", "self_ns", "device_ns", "flops"]
KernelTypeSort = Literal["name", "kind", "count", "total_ns", "avg_ns", "min_ns", "max_ns", "ratio"]
KernelSort = Literal["step", "name", "kind", "op", "stream", "start_ns", "dur_ns", "wait_ns", "occupancy_pct"]

OPERATOR_TYPES = TableView(
    table="operator_stats",
    row=models.OperatorTypeRow,
    sortable=OperatorTypeSort.__args__,
    tiebreak="name",
    expressions=_zero_if_null(
        "host_total_ns", "host_self_ns", "host_avg_ns", "host_min_ns", "host_max_ns", "device_total_ns"
    ),
)
OPERATORS = TableView(
    table="operator_instances",
    row=models.OperatorRow,
    sortable=OperatorSort.__args__,
    tiebreak="slice",
    expressions={"id": "slice", "start_ns": "start_ns - {origin}", **_zero_if_null("self_ns", "device_ns")},
    instances=True,
    sort_columns={"id": "slice"},
)
KERNEL_TYPES = TableView(
    table="kernel_stats", row=models.KernelTypeRow, sortable=KernelTypeSort.__args__, tiebreak="name, kind"
)
KERNELS = TableView(
    table="kernel_details",
    row=models.KernelRow,
    sortable=KernelSort.__args__,
    tiebreak="start_ns",
    fuzzy=("name", "op"),
    expressions={"start_ns": "start_ns - {origin}"},
    instances=True,
)


def json_list(select: str, tables: dict[str, pa.Table], order_by: str) -> orjson.Fragment:
    """The rows of ``select`` (over the Arrow ``tables``, by name) as a ready JSON array of objects.

    DuckDB writes the JSON: for thousands of steps this is several times faster than building
    Python dicts and encoding them, and the response embeds it as is (``orjson.Fragment``).
    """
    cur = database().cursor()
    try:
        for name, table in tables.items():
            cur.register(name, table)
        sql = f"SELECT coalesce(to_json(list(x ORDER BY {order_by})), '[]')::VARCHAR AS j FROM ({select}) x"
        text = cur.sql(sql).fetchall()[0][0]
        return orjson.Fragment(text)
    finally:
        cur.close()


def records(table: pa.Table) -> list[dict[str, Any]]:
    """Rows as dicts, converted column by column (several times faster than ``to_pylist``)."""
    data = table.to_pydict()
    names = list(data)
    return [dict(zip(names, values, strict=True)) for values in zip(*data.values(), strict=True)]


def rows(path: Path, sql_tail: str, select: str = "*", params: Sequence[Any] = ()) -> list[dict[str, Any]]:
    """All rows of ``SELECT {select} FROM read_parquet(path) {sql_tail}`` (small tables only)."""
    if not path.is_file():
        return []
    return records(arrow(f"SELECT {select} FROM read_parquet(?) {sql_tail}", [str(path), *params]))
