"""Vectorised text building for writers: Arrow columns in, Arrow string columns out.

Writers must not loop over rows in Python.  The few shapes of text they need — a dictionary
column as plain strings, a shape list as ``"32,3,224,224;64"`` or as JSON ``[[32,3,224,224],[64]]``,
a JSON-escaped string, one big text out of many lines — are built here with ``pyarrow.compute``.
JSON string escaping is done by ``orjson`` once per *distinct* value (names repeat heavily), then
spread to rows with ``take``, so hostile names (quotes, backslashes, control characters, ``</script>``)
are escaped by a real JSON encoder, never by hand.

This module must not convert units (see ``units.py``) or know about files.
"""

from __future__ import annotations

import orjson
import pyarrow as pa
import pyarrow.compute as pc

ArrayOrChunked = pa.Array | pa.ChunkedArray


def combined(values: ArrayOrChunked) -> pa.Array:
    """One contiguous array (chunked arrays are concatenated)."""
    return values.combine_chunks() if isinstance(values, pa.ChunkedArray) else values


def plain(values: ArrayOrChunked) -> pa.Array:
    """A dictionary-encoded column decoded to its value type; other columns unchanged."""
    arr = combined(values)
    if pa.types.is_dictionary(arr.type):
        return arr.dictionary_decode()
    return arr


def _rebuild(outer: pa.Array, new_values: pa.Array) -> pa.Array:
    """``outer``'s list structure (offsets, nulls) around ``new_values`` (one per element of
    ``outer.values``; ``outer`` must come from :func:`_as_list`, so it starts at offset 0)."""
    if outer.null_count:
        return pa.ListArray.from_arrays(outer.offsets, new_values, mask=pc.is_null(outer))
    return pa.ListArray.from_arrays(outer.offsets, new_values)


def _as_list(arr: pa.Array) -> pa.Array:
    """A ``list<...>`` array with int32 offsets, array offset 0 and values starting at 0."""
    if pa.types.is_large_list(arr.type) or pa.types.is_fixed_size_list(arr.type):
        arr = arr.cast(pa.list_(arr.type.value_type))
    if arr.offset == 0 and (len(arr) == 0 or arr.offsets[0].as_py() == 0):
        return arr
    offsets = arr.offsets
    first = offsets[0].as_py()
    values = arr.values.slice(first, offsets[-1].as_py() - first)
    shifted = pc.subtract(offsets, pa.scalar(first, pa.int32()))
    mask = pc.is_null(arr) if arr.null_count else None
    return pa.ListArray.from_arrays(shifted, values, mask=mask)


def join_ints(lists: ArrayOrChunked, sep: str = ",") -> pa.Array:
    """``list<int>`` -> ``"1,2,3"`` per row (null list -> null, empty list -> ``""``).

    JSON text (``"[1, 2, 3]"``, what the analysis tables hold) is accepted too.
    """
    arr = combined(lists)
    if pa.types.is_null(arr.type):
        return pa.nulls(len(arr), pa.string())
    if pa.types.is_string(arr.type) or pa.types.is_large_string(arr.type):
        bare = pc.replace_substring_regex(arr.cast(pa.string()), r"[\[\]\s]", "")
        return bare if sep == "," else pc.replace_substring(bare, ",", sep)
    return pc.binary_join(_as_list(arr).cast(pa.list_(pa.string())), sep)


def shapes_text(dims: ArrayOrChunked) -> pa.Array:
    """Input shapes as Ascend writes them: ``"32,1,224,224;121,4,16,8;64"``.

    Accepts ``list<list<int>>`` (the trace model) or JSON text (``"[[32,1],[64]]"``, what the
    operator analyses emit).  A non-tensor input is an empty shape (``"32,1;;64"``).
    """
    arr = combined(dims)
    if pa.types.is_null(arr.type):
        return pa.nulls(len(arr), pa.string())
    if pa.types.is_string(arr.type) or pa.types.is_large_string(arr.type):
        text = pc.replace_substring_regex(arr.cast(pa.string()), r"\]\s*,\s*\[", ";")
        return pc.replace_substring_regex(text, r"[\[\]\s]", "")
    arr = _as_list(arr)
    inner = _as_list(arr.values) if len(arr.values) else arr.values.cast(pa.list_(pa.int64()))
    return pc.binary_join(_rebuild(arr, join_ints(inner, ",")), ";")


def types_text(types: ArrayOrChunked) -> pa.Array:
    """Input dtypes as Ascend writes them: ``"FLOAT;FLOAT;INT64"`` (case kept as recorded).

    Accepts ``list<string>`` or JSON text (``'["float","int"]'``).
    """
    arr = plain(types)
    if pa.types.is_null(arr.type):
        return pa.nulls(len(arr), pa.string())
    if pa.types.is_string(arr.type) or pa.types.is_large_string(arr.type):
        text = pc.replace_substring_regex(arr.cast(pa.string()), r'"\s*,\s*"', ";")
        return pc.replace_substring_regex(text, r'^\s*\[\s*"?|"?\s*\]\s*$', "")
    arr = _as_list(arr)
    values = plain(arr.values).cast(pa.string())
    return pc.binary_join(_rebuild(arr, values), ";")


def json_strings(values: ArrayOrChunked) -> pa.Array:
    """Each value as a quoted, escaped JSON string literal (``'"a\\"b"'``); nulls stay null.

    Escaping is orjson's, applied once per distinct value.
    """
    arr = combined(values)
    if not pa.types.is_dictionary(arr.type):
        arr = pc.dictionary_encode(arr.cast(pa.string()))
    uniques = arr.dictionary.cast(pa.string()).to_pylist()
    escaped = pa.array([orjson.dumps(u).decode() if u is not None else None for u in uniques], pa.string())
    return escaped.take(arr.indices)


def json_int_lists(lists: ArrayOrChunked) -> pa.Array:
    """``list<int>`` -> ``"[1,2,3]"``; null -> null; JSON text is passed through."""
    arr = combined(lists)
    if pa.types.is_string(arr.type) or pa.types.is_large_string(arr.type):
        return arr.cast(pa.string())
    return pc.binary_join_element_wise("[", join_ints(lists, ","), "]", "")


def json_shapes(dims: ArrayOrChunked) -> pa.Array:
    """``list<list<int>>`` -> ``"[[32,3],[],[64]]"`` (JSON text already: passed through)."""
    arr = combined(dims)
    if pa.types.is_null(arr.type):
        return pa.nulls(len(arr), pa.string())
    if pa.types.is_string(arr.type) or pa.types.is_large_string(arr.type):
        return arr.cast(pa.string())
    arr = _as_list(arr)
    inner = _as_list(arr.values) if len(arr.values) else arr.values.cast(pa.list_(pa.int64()))
    joined = pc.binary_join(_rebuild(arr, json_int_lists(inner)), ",")
    return pc.binary_join_element_wise("[", joined, "]", "")


def json_string_lists(lists: ArrayOrChunked) -> pa.Array:
    """``list<string>`` -> ``'["float","int"]'`` with every element JSON-escaped; null -> null."""
    arr = plain(lists)
    if pa.types.is_null(arr.type):
        return pa.nulls(len(arr), pa.string())
    if pa.types.is_string(arr.type) or pa.types.is_large_string(arr.type):
        return arr.cast(pa.string())
    arr = _as_list(arr)
    joined = pc.binary_join(_rebuild(arr, json_strings(arr.values)), ",")
    return pc.binary_join_element_wise("[", joined, "]", "")


def concat(*parts: ArrayOrChunked | str) -> pa.Array:
    """Element-wise concatenation; a null part makes the row null (use ``fill_null`` before)."""
    return pc.binary_join_element_wise(*[p if isinstance(p, str) else combined(p) for p in parts], "")


def join_rows(lines: ArrayOrChunked, sep: str) -> str:
    """All rows of a string column joined by ``sep`` into one Python string (nulls are skipped)."""
    arr = combined(lines).drop_null()
    if len(arr) == 0:
        return ""
    joined = pc.binary_join(pa.ListArray.from_arrays(pa.array([0, len(arr)], pa.int32()), arr), sep)
    return joined[0].as_py()
