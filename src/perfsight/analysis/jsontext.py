"""List columns of the trace model rendered as JSON text, for display and export columns.

The model keeps shapes and dtypes as Arrow lists (``input_dims`` is
``list<list<int64>>``, ``input_types`` is ``list<string>``, ``grid``/``block`` are
``list<int64>``); the analysis tables show them as JSON text (``[[64, 128], [128]]``)
so that CSV writers and the UI need no nested types.  The rendering is vectorised
with Arrow string kernels (no per-row Python), and the text is valid JSON that
``json.loads`` turns back into the same lists.

This module must not parse or interpret shapes; it only renders them.  A column
that is already text is passed through unchanged, so older stored traces still work.
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc


def _bracket(text: pa.Array) -> pa.Array:
    return pc.binary_join_element_wise("[", text, "]", "")


def _scalar_text(values: pa.Array) -> pa.Array:
    if pa.types.is_string(values.type) or pa.types.is_large_string(values.type):
        escaped = pc.replace_substring(values, "\\", "\\\\")
        escaped = pc.replace_substring(escaped, '"', '\\"')
        return pc.binary_join_element_wise('"', escaped, '"', "")
    if pa.types.is_dictionary(values.type):
        return _scalar_text(values.cast(values.type.value_type))
    return pc.cast(values, pa.string())


def _render(array: pa.Array) -> pa.Array:
    if not (pa.types.is_list(array.type) or pa.types.is_large_list(array.type)):
        return _scalar_text(array)
    inner = _render(array.values)
    if inner.null_count:
        inner = pc.fill_null(inner, "null")
    joined_lists = type(array).from_arrays(array.offsets, inner, mask=array.is_null())
    return _bracket(pc.binary_join(joined_lists, ", "))


def json_text(column: pa.ChunkedArray | pa.Array) -> pa.Array:
    """The column as JSON text (null stays null); text columns are returned as they are."""
    array = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    if pa.types.is_string(array.type) or pa.types.is_large_string(array.type):
        return array
    if pa.types.is_null(array.type):
        return pa.nulls(len(array), pa.string())
    return _render(array)
