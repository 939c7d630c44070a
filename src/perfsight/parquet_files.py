"""How perfsight writes Parquet: one set of writer options for the cache and for every spill.

Why one place: the bounded path spills the trace, its chunks, sorted runs and the timeline
index's inputs as Parquet files that are written once and read once, and each writer had taken
pyarrow's defaults -- Snappy, and a dictionary tried on every column.  Ids and times rarely
repeat, so a dictionary of an integer column is built, found too large and thrown away: 5 % of
the samples of a bounded analysis of a 512 MB trace went to dictionaries of int64 columns
(``DictEncoderImpl<INT64>``).  The cache already wrote dictionaries only for text; now the
spills do too (:func:`spill_options`, which keeps the statistics DuckDB reads them back with).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pyarrow as pa

from perfsight.columns import is_text

COMPRESSION = "lz4"
"""Why LZ4 and not zstd: the cache is written on every analysis and read on every page, and zstd
set up a compression context per column chunk and cost about 10 ms more than no compression at
all, where LZ4 costs nothing measurable (its smaller files are as fast to write).  On
df_index_resolver the 38 cached tables took 58 -> 42 ms of CPU to write (a fresh ``analyse``:
-11 ms of CPU in the median of 16, and 1-2 MB less peak), for 2.1 -> 4.5 MB of Parquet: the
cache folder, whose uncompressed timeline index is most of it, grew 14.0 -> 16.4 MB."""

SMALL_TABLE_BYTES = 64 * 1024
"""A table smaller than this in memory is written uncompressed: a codec's pass per column costs
more than the few kilobytes it would save (a run's twenty-odd small analysis tables, with zstd:
3.4 -> 2.0 ms)."""


def writer_options(
    schema: pa.Schema, small: bool = False, statistics: bool | Sequence[str] = False
) -> dict[str, Any]:
    """Keyword arguments for ``pq.write_table`` / ``pq.ParquetWriter``: :data:`COMPRESSION` (none
    for a ``small`` table, see :data:`SMALL_TABLE_BYTES`) and only text columns dictionary-encoded
    (names repeat; ids and times rarely do, and trying costs a third of the write).

    ``statistics``: each row group's min/max per column.  The cache goes without (nothing reads it
    by row-group filter: smaller files, written faster); a spill that DuckDB reads back keeps them
    (see :func:`spill_options`); a list names the columns that keep them."""
    text = text_columns(schema)
    compression = "none" if small else COMPRESSION
    return {"compression": compression, "use_dictionary": text, "write_statistics": statistics}


def text_columns(schema: pa.Schema) -> list[str]:
    """The columns of ``schema`` that hold text, plain or dictionary-encoded."""
    return [f.name for f in schema if pa.types.is_dictionary(f.type) or is_text(f.type)]


def spill_options(schema: pa.Schema) -> dict[str, Any]:
    """:func:`writer_options` for a spill, a file the bounded path writes once and reads back, often
    through DuckDB: statistics kept, because DuckDB sizes its joins and sorts from them (without
    them the timeline index's join of a 10 GB trace's flows ran out of its 128 MB,
    ``store/external_sort.MEMORY_LIMIT``)."""
    return writer_options(schema, statistics=True)
