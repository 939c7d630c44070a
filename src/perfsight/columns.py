"""Arrow columns as NumPy arrays, read straight from the Arrow buffers: the one place that does it.

Analyses and writers work on NumPy views of the model's integer, float and boolean columns.
``pyarrow``'s own ``to_numpy`` imports pandas the first time it runs (about 0.4 s and 35 MB of
resident memory in pyarrow 26), which perfsight never needs; :func:`numpy` reads the data buffer
with ``np.frombuffer`` instead, zero-copy for a single-chunk column without nulls.

It also holds the two structural helpers every column-wise text builder needs: a list column
rebased to offset 0 (:func:`rebased_list`) and a code per row that is equal exactly where the
values are (:func:`distinct_codes`, which Arrow's hash kernels do not offer for lists); and the
row-order helpers built on them (:func:`first_rows`, :func:`first_match`, :func:`lexsort`).

This module must not interpret columns (units, ids, kinds): it only moves values between the two
libraries.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from numpy.typing import NDArray

ArrayOrChunked = pa.Array | pa.ChunkedArray


def combined(values: ArrayOrChunked) -> pa.Array:
    """One contiguous array (chunked arrays are concatenated)."""
    return values.combine_chunks() if isinstance(values, pa.ChunkedArray) else values


def one_array(values: ArrayOrChunked) -> pa.Array:
    """:func:`combined` without the copy where there is nothing to join: a one-chunk column's chunk
    as it stands (it may be a slice: its offset need not be 0).  Joining a single chunk copies
    every value -- 1-2 ms for a large table's names, per call."""
    if isinstance(values, pa.ChunkedArray) and values.num_chunks == 1:
        return values.chunk(0)
    return combined(values)


def valid(values: ArrayOrChunked) -> NDArray[np.bool_]:
    """Which rows hold a value (not null)."""
    if values.null_count == 0:
        return np.ones(len(values), bool)
    return numpy(pc.is_valid(values))


def _dtype(arrow_type: pa.DataType) -> np.dtype:
    if pa.types.is_integer(arrow_type):
        signed = pa.types.is_signed_integer(arrow_type)
        return np.dtype(f"{'' if signed else 'u'}int{arrow_type.bit_width}")
    if pa.types.is_floating(arrow_type) and arrow_type.bit_width in (32, 64):
        return np.dtype(f"float{arrow_type.bit_width}")
    raise TypeError(f"no NumPy view of Arrow type {arrow_type}")


def _one(array: pa.Array, null: object) -> NDArray:
    if pa.types.is_dictionary(array.type):
        array = array.indices
    if array.null_count:
        if null is None:
            raise ValueError(f"column of {array.type} has {array.null_count} nulls and no fill value")
        array = array.fill_null(null)
    n = len(array)
    if pa.types.is_boolean(array.type):
        bits = np.frombuffer(array.buffers()[1], dtype=np.uint8) if n else np.zeros(0, np.uint8)
        return np.unpackbits(bits, bitorder="little")[array.offset : array.offset + n].view(bool)
    dtype = _dtype(array.type)
    if n == 0:
        return np.zeros(0, dtype)
    return np.frombuffer(array.buffers()[1], dtype=dtype, count=n, offset=array.offset * dtype.itemsize)


def numpy(values: ArrayOrChunked, null: object = None) -> NDArray:
    """An integer, float or boolean column (a dictionary column: its indices) as a NumPy array.

    Nulls are replaced by ``null``; a column with nulls and no ``null`` given raises ``ValueError``.
    The result may share memory with Arrow: treat it as read-only.
    """
    if isinstance(values, pa.ChunkedArray):
        if values.num_chunks == 1:
            return _one(values.chunk(0), null)
        if values.num_chunks == 0:
            return _one(values.combine_chunks(), null)
        return np.concatenate([_one(chunk, null) for chunk in values.chunks])
    return _one(values, null)


def int64(values: ArrayOrChunked, null: int | None = None) -> NDArray[np.int64]:
    """An integer column as int64 (nulls become ``null``)."""
    return numpy(values, null).astype(np.int64, copy=False)


def is_text(arrow_type: pa.DataType) -> bool:
    """A string type of any offset width."""
    return pa.types.is_string(arrow_type) or pa.types.is_large_string(arrow_type)


def decoded(values: ArrayOrChunked) -> ArrayOrChunked:
    """A dictionary-encoded column decoded to its value type, chunk by chunk (what
    ``dictionary_decode`` gives); any other column unchanged.

    Why not Arrow's decode: it copies a string cell by cell (about 250 ns a row for CUDA kernel
    names, 5 ms on a 22,000-kernel trace).  Instead the dictionary's strings become 16-byte
    ``string_view`` cells, NumPy gathers one per row, and Arrow casts the views back to ``string``
    in one tight copy: a third of the time, the same array.
    """
    if isinstance(values, pa.ChunkedArray):
        if not pa.types.is_dictionary(values.type):
            return values
        return pa.chunked_array([_decoded_one(chunk) for chunk in values.chunks], values.type.value_type)
    return _decoded_one(values)


def _decoded_one(array: pa.Array) -> pa.Array:
    if not pa.types.is_dictionary(array.type):
        return array
    dictionary = array.dictionary
    if not pa.types.is_string(dictionary.type) or dictionary.null_count or not len(dictionary):
        return array.dictionary_decode()
    views = dictionary.cast(pa.string_view())
    _, view_cells, *data = views.buffers()
    cells = np.frombuffer(view_cells, np.dtype((np.void, 16)), len(views), views.offset * 16)
    indices = array.indices
    validity = pc.is_valid(indices).buffers()[1] if indices.null_count else None  # fresh, offset 0
    gathered = cells[numpy(indices, 0)]
    rows = pa.Array.from_buffers(
        pa.string_view(), len(array), [validity, pa.py_buffer(gathered), *data], null_count=indices.null_count
    )
    return rows.cast(pa.string())


def is_list(arrow_type: pa.DataType) -> bool:
    """A list type of any offset width (``list``, ``large_list``, ``fixed_size_list``)."""
    return (
        pa.types.is_list(arrow_type)
        or pa.types.is_large_list(arrow_type)
        or pa.types.is_fixed_size_list(arrow_type)
    )


def rebased_list(arr: pa.Array) -> pa.Array:
    """``arr`` as a ``list<...>`` array with int32 offsets starting at 0 and values cut to what
    its rows use (a slice of a large list array no longer drags the whole child along)."""
    if pa.types.is_large_list(arr.type) or pa.types.is_fixed_size_list(arr.type):
        arr = arr.cast(pa.list_(arr.type.value_type))
    if (
        arr.offset == 0
        and (len(arr) == 0 or arr.offsets[0].as_py() == 0)
        and len(arr.values) == (arr.offsets[-1].as_py() if len(arr) else 0)
    ):
        return arr
    offsets = arr.offsets
    first = offsets[0].as_py()
    values = arr.values.slice(first, offsets[-1].as_py() - first)
    shifted = pc.subtract(offsets, pa.scalar(first, pa.int32()))
    return pa.ListArray.from_arrays(shifted, values, mask=pc.is_null(arr) if arr.null_count else None)


def distinct_codes(values: ArrayOrChunked) -> np.ndarray:
    """A code per row, equal exactly where the values are equal: ``0..k-1`` in order of first
    appearance, ``-1`` for null.  Lists are coded through their elements' codes (Arrow has no hash
    kernel for lists): a row's list of element codes, viewed as bytes, is what gets encoded."""
    arr = one_array(values)
    if is_list(arr.type):
        arr = rebased_list(arr)
        elements = distinct_codes(arr.values).astype(np.int64)
        offsets = numpy(arr.offsets).astype(np.int64) * elements.itemsize
        validity = pc.is_valid(arr).buffers()[1] if arr.null_count else None
        arr = pa.Array.from_buffers(
            pa.large_binary(),
            len(arr),
            [validity, pa.py_buffer(offsets), pa.py_buffer(elements)],
            null_count=arr.null_count,
        )
    if pa.types.is_dictionary(arr.type):  # a dictionary may repeat or leave out values: renumber
        return distinct_codes(arr.indices)
    return int64(pc.dictionary_encode(arr).indices, -1)


def sorted_codes(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``np.unique(values, return_inverse=True)`` of an integer column: its distinct values in
    order and each row's index among them (int64).  Why not ``np.unique``: it sorts every row;
    a reader's pid, tid or (pid, tid) repeats over thousands of rows, so hashing the rows and
    sorting only the few distinct values does the same in a fifth of the time."""
    encoded = pc.dictionary_encode(pa.array(values))
    distinct = encoded.dictionary.to_numpy(zero_copy_only=False)
    order = np.argsort(distinct, kind="stable")
    position = np.empty(len(order), np.int64)
    position[order] = np.arange(len(order))
    return distinct[order], position[encoded.indices.to_numpy(zero_copy_only=False)]


def joint_codes(*values: ArrayOrChunked) -> NDArray[np.int64]:
    """A code per row, equal exactly where every one of the columns is equal (nulls count as a
    value here); ``0..k-1`` in order of first appearance.

    Each column's codes are folded into the codes so far and renumbered; a column with one code
    on every row (the rank of a one-rank table) cannot split a group and is not folded in, nor is
    the first column when its own codes already are the result (no nulls): each fold hashes
    every row again."""
    joint: NDArray[np.int64] | None = None
    for column in values:
        codes = distinct_codes(column) + 1  # 0: null
        low, high = int(codes.min(initial=0)), int(codes.max(initial=0))
        if joint is None and low > 0:
            joint = codes - 1  # codes of first appearance already
        elif joint is None or low != high:
            folded = codes if joint is None else joint * (high + 1) + codes
            joint = distinct_codes(pa.array(folded))
    return np.zeros(len(values[0]), np.int64) if joint is None else joint


def first_rows(codes: NDArray[np.int64]) -> NDArray[np.int64]:
    """For codes ``0..k-1`` (``-1`` ignored), the first row holding each code."""
    first = np.zeros(int(codes.max()) + 1 if len(codes) else 0, np.int64)
    valid = np.flatnonzero(codes >= 0)[::-1]
    first[codes[valid]] = valid
    return first


def per_distinct(values: ArrayOrChunked, fn: Callable[[pa.Array], pa.Array]) -> pa.Array:
    """``fn`` (an array -> an array of the same length) applied once per distinct value of the column
    and spread back to its rows; a null row stays null."""
    arr = one_array(values)
    codes = distinct_codes(arr)
    return spread(fn(arr.take(pa.array(first_rows(codes)))), codes)


def spread(distinct: pa.Array, codes: NDArray[np.int64]) -> pa.Array:
    """``distinct.take(codes)``, a code of ``-1`` giving null: one value per distinct key spread
    back to the rows.  Strings (no null among them) are spread by :func:`decoded`'s gather, a
    third of the time of Arrow's take."""
    indices = pa.array(codes, mask=codes < 0)
    if pa.types.is_string(distinct.type) and not distinct.null_count and len(distinct):
        return decoded(pa.DictionaryArray.from_arrays(indices, distinct))
    return distinct.take(indices)


def first_match(keys: np.ndarray, queries: np.ndarray) -> np.ndarray:
    """For each query, the position in ``keys`` of the first element equal to it (-1 if none)."""
    found = np.full(len(queries), -1, dtype=np.int64)
    if not len(keys) or not len(queries):
        return found
    order = np.argsort(keys, kind="stable")
    ordered = keys[order]
    pos = np.minimum(np.searchsorted(ordered, queries), len(ordered) - 1)
    hit = ordered[pos] == queries
    found[hit] = order[pos[hit]]
    return found


PACKED_BITS = 64
"""How many bits of keys :func:`lexsort` packs into one number per row."""


def lexsort(keys: Sequence[np.ndarray]) -> NDArray[np.intp]:
    """``np.lexsort(keys)``: the last key is the primary one, ties keep row order (stable).

    Why: analyses sort a trace's rows by (track, start, depth), (rank, start, stream) and the
    like; ``np.lexsort`` sorts once per key, but such keys (a track number, a nesting depth, a
    start within a span of seconds) usually fit together in one 64-bit number, and one stable
    sort of it gives the same order in about 40 % of the time (1.7 -> 0.7 ms for 123,000 slices).

    Integer and boolean keys whose value ranges fit in 64 bits together are packed, lowest key
    in the lowest bits, into one ``uint64`` per row and sorted once; otherwise ``np.lexsort``.
    """
    n = len(keys[0]) if len(keys) else 0
    if n < 2 or any(key.dtype.kind not in "iub" for key in keys):
        return np.lexsort(keys)
    spans = []
    for key in keys:
        low, high = int(key.min()), int(key.max())
        spans.append((low, (high - low).bit_length()))
    if sum(bits for _, bits in spans) > PACKED_BITS:
        return np.lexsort(keys)
    packed: NDArray[np.uint64] | None = None
    shift = 0
    for key, (low, bits) in zip(keys, spans, strict=True):
        if not bits:
            continue
        if key.dtype.kind == "u":  # unsigned: no negative values, maybe above int64's range
            offset = np.subtract(key, np.uint64(low), dtype=np.uint64)
        else:  # wraps past int64 only for a 64-bit span, where the bits still read right as uint64
            offset = np.subtract(key, np.int64(low), dtype=np.int64).view(np.uint64)
        if shift:
            offset <<= np.uint64(shift)
        if packed is None:
            packed = offset
        else:
            packed |= offset
        shift += bits
    return np.arange(n) if packed is None else np.argsort(packed, kind="stable")
