"""An SQLite ``.db`` holding the analysis tables and the trace's slices, one SQL table each.

MindSpore writes ``ascend_mindspore_profiler_{rank}.db`` so that users can query a run with any
SQLite client; the caller names ours ``perfsight_{rank}.db``.  Each Arrow table becomes one SQL
table with the same column names: integers (times stay integer nanoseconds, sizes bytes) as
``INTEGER``, floats as ``REAL``, booleans as ``INTEGER`` 0/1, strings and dictionary columns as
``TEXT``, and list columns (shapes, dtypes, grid) as JSON ``TEXT`` (``[[32,3],[64]]``).

Rows are converted column-wise per Arrow record batch (one ``to_pylist`` per column, then
``executemany``), all tables in one transaction, so a failed write leaves no half-filled file:
the database is built under a temporary name and moved into place at the end.

This module must not convert units or choose which tables a run exports (the caller does).
"""

from __future__ import annotations

import re
import sqlite3
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path

import pyarrow as pa

from perfsight.columns import is_list
from perfsight.export import text
from perfsight.jsontext import json_text

BATCH_ROWS = 50_000
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def _sql_type(arrow_type: pa.DataType) -> str:
    if pa.types.is_dictionary(arrow_type):
        return _sql_type(arrow_type.value_type)
    if pa.types.is_integer(arrow_type) or pa.types.is_boolean(arrow_type):
        return "INTEGER"
    if pa.types.is_floating(arrow_type) or pa.types.is_decimal(arrow_type):
        return "REAL"
    if pa.types.is_binary(arrow_type) or pa.types.is_large_binary(arrow_type):
        return "BLOB"
    return "TEXT"


def _quote(name: str) -> str:
    """A safe SQL identifier: always double-quoted and escaped (a plain name can be a keyword:
    the communication tables have a ``group`` column)."""
    return '"' + name.replace('"', '""') + '"'


def _sql_column(column: pa.Array) -> pa.Array:
    """One Arrow column in the form SQLite stores (dictionary decoded, lists as JSON text)."""
    arr = text.plain(column)
    kind = arr.type
    if is_list(kind):
        return json_text(arr, sep=",")
    if pa.types.is_boolean(arr.type):
        return arr.cast(pa.int8())
    if pa.types.is_decimal(arr.type):
        return arr.cast(pa.float64())
    if pa.types.is_timestamp(arr.type) or pa.types.is_duration(arr.type):
        return arr.cast(pa.int64())
    if pa.types.is_date(arr.type) or pa.types.is_time(arr.type):
        return arr.cast(pa.string())
    return arr


def _rows(parts: Iterable[pa.Table]) -> Iterator[list[tuple]]:
    for part in parts:
        for batch in part.to_batches(max_chunksize=BATCH_ROWS):
            columns = [_sql_column(batch.column(i)).to_pylist() for i in range(batch.num_columns)]
            yield list(zip(*columns, strict=True))


TableStream = tuple[pa.Schema, Callable[[], Iterable[pa.Table]]]
"""A table too large to hold, as its schema and a function giving its rows a batch at a time."""


def write_db(path: str | Path, tables: Mapping[str, pa.Table | TableStream]) -> Path:
    """Write every table of ``tables`` (name -> Arrow table, or a :data:`TableStream`) into a new
    SQLite file at ``path`` (a stream's rows are inserted a batch at a time: the same file).

    An existing file at ``path`` is replaced.  Table names must be identifiers (``kernel_details``).
    """
    path = Path(path)
    for name in tables:
        if not _NAME.match(name):
            raise ValueError(f"table name {name!r} is not an SQL identifier")
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.unlink(missing_ok=True)
    connection = sqlite3.connect(tmp, isolation_level=None)  # transactions managed explicitly below
    try:
        connection.execute("PRAGMA journal_mode = OFF")  # a temporary file: atomicity comes from the rename
        connection.execute("BEGIN")
        for name, table in tables.items():
            schema, parts = (table.schema, [table]) if isinstance(table, pa.Table) else (table[0], table[1]())
            columns = ", ".join(f"{_quote(f.name)} {_sql_type(f.type)}" for f in schema)
            connection.execute(f"CREATE TABLE {name} ({columns})")
            marks = ", ".join("?" for _ in schema)
            insert = f"INSERT INTO {name} VALUES ({marks})"
            for rows in _rows(parts):
                connection.executemany(insert, rows)
        connection.execute("COMMIT")
    except BaseException:
        connection.close()
        tmp.unlink(missing_ok=True)
        raise
    connection.close()
    tmp.replace(path)
    return path
