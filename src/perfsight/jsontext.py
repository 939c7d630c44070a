"""JSON text of Arrow columns, built column-wise: the one place perfsight writes JSON values.

The model keeps shapes, dtypes and launch geometry as Arrow lists (``input_dims`` is
``list<list<int64>>``, ``input_types`` is ``list<string>``, ``grid``/``block`` are
``list<int64>``).  Analysis tables show them as JSON text (``[[64, 128], [128]]``) so that CSV
writers and the UI need no nested types; ``trace_view.json`` and the SQLite export embed them
as compact JSON (``[[64,128],[128]]``).  Both come from :func:`json_text`.

Strings are escaped by ``orjson`` once per *distinct* value (names repeat heavily) and spread to
rows with ``take``, so quotes, backslashes, control characters and ``</script>`` are escaped by
a real JSON encoder, never by hand.  Numbers are Arrow's decimal text; a null element of a list
is ``null``; a null row stays null.  No Python object is made per row.

This module must not parse or interpret what it renders, convert units, or know about files.
"""

from __future__ import annotations

import orjson
import pyarrow as pa
import pyarrow.compute as pc

from perfsight.columns import (
    ArrayOrChunked,
    combined,
    is_list,
    is_text,
    one_array,
    per_distinct,
    rebased_list,
)


def json_strings(values: ArrayOrChunked) -> pa.Array:
    """Each value as a quoted, escaped JSON string literal (``'"a\\"b"'``); nulls stay null."""
    arr = combined(values)
    if not pa.types.is_dictionary(arr.type):
        arr = pc.dictionary_encode(arr.cast(pa.string()))
    uniques = _texts(arr.dictionary.cast(pa.string()))  # one Python string per distinct value
    escaped = pa.array([None if u is None else orjson.dumps(u).decode() for u in uniques], pa.string())
    return escaped.take(arr.indices)


def _texts(strings: pa.Array) -> list[str | None]:
    """The values as Python strings; bytes that are not UTF-8 (a table from elsewhere than our
    readers, which repair them) become U+FFFD instead of failing the whole export."""
    try:
        return strings.to_pylist()
    except UnicodeDecodeError:
        raw = strings.cast(pa.binary()).to_pylist()
        return [None if b is None else b.decode("utf-8", "replace") for b in raw]


def _scalar_text(values: pa.Array) -> pa.Array:
    if is_text(values.type) or pa.types.is_dictionary(values.type):
        return json_strings(values)
    return values.cast(pa.string())


def _render(arr: pa.Array, sep: str) -> pa.Array:
    if not is_list(arr.type):
        return _scalar_text(arr)
    arr = rebased_list(arr)
    inner = _render(arr.values, sep)
    if inner.null_count:
        inner = inner.fill_null("null")
    lists = pa.ListArray.from_arrays(arr.offsets, inner, mask=pc.is_null(arr) if arr.null_count else None)
    return pc.binary_join_element_wise("[", pc.binary_join(lists, sep), "]", "")


def json_text(column: ArrayOrChunked, sep: str = ", ") -> pa.Array:
    """The column as JSON text, list elements separated by ``sep`` (null stays null).

    A column that is already text is returned as it is (older stored tables hold JSON text).
    """
    arr = one_array(column)
    if is_text(arr.type):
        return arr.cast(pa.string())
    if pa.types.is_null(arr.type):
        return pa.nulls(len(arr), pa.string())
    if is_list(arr.type):
        return per_distinct(arr, lambda lists: _render(lists, sep))  # shapes repeat: render each once
    return _render(arr, sep)
