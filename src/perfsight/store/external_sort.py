"""DuckDB as the external sort of the chunked writers: a connection that spills past a memory limit.

Why: the bounded-memory writers need a few orders that no chunk has on its own (the timeline
index's lane order, a per-row table's CSV order when it comes out of that order); DuckDB sorts
Parquet files larger than memory by spilling to disk.  One place for its settings, so each sort
runs within the same limit, on one thread, spilling under the caller's folder (removed with it).

This module must not know what is sorted.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

LEAST_BYTES = 128 << 20
"""What one sort may hold before spilling (DuckDB's own buffers; its Arrow output comes on top)
at the least: the default, and the floor of a budget's share (``memory_budget.WRITE_SORT_SHARE``)."""

MEMORY_LIMIT = f"{LEAST_BYTES >> 20}MB"


def connect(spill: Path, memory_limit: str = MEMORY_LIMIT) -> Any:
    """A DuckDB connection that spills under ``spill`` past ``memory_limit``, on one thread."""
    import duckdb

    spill.mkdir(parents=True, exist_ok=True)
    con = duckdb.connect()
    con.execute("SET enable_progress_bar=false")  # it prints on stdout, where --json writes
    con.execute(f"SET memory_limit={quoted(memory_limit)}")
    con.execute(f"SET temp_directory={quoted(spill / 'duckdb')}")
    con.execute("SET threads=1")
    return con


def quoted(text: str | Path) -> str:
    """``text`` as an SQL string literal (a path may hold a quote)."""
    return "'" + str(text).replace("'", "''") + "'"


def files(paths: list[Path]) -> str:
    """A DuckDB list of file names, for ``read_parquet``."""
    return "[" + ", ".join(quoted(p) for p in paths) + "]"
