"""Group-by aggregation of Arrow tables in NumPy, the way the single-rank analyses need it.

Why not ``pa.Table.group_by``: in pyarrow 26 it runs on Acero, whose import maps the Acero,
Dataset and Substrait libraries -- 39 MB of resident memory and 0.03 s per process, a quarter
of a single-rank analysis' peak above its imports (docs/BENCHMARKS.md), for tables of a few
thousand groups.  :func:`aggregate` gives the same table as
``table.group_by(keys, use_threads=False).aggregate(aggregations)``: one row per distinct key
(nulls are a key value like any other), in order of first appearance (Arrow's order may differ;
every caller sorts its result), the key columns as in
``table`` (same types), and ``<column>_<function>`` columns with Arrow's null rules (nulls are
skipped; a group without any valid value gets null, except ``count``, which gets 0).

Supported functions: ``count``, ``sum``, ``min``, ``max``, ``mean`` on integer and float
columns.  Sums are exact for integers; float sums add in row order within a group.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pyarrow as pa
from numpy.typing import NDArray

from perfsight import columns

FUNCTIONS = ("count", "sum", "min", "max", "mean")


def group_codes(table: pa.Table, keys: Sequence[str]) -> tuple[NDArray[np.int64], NDArray[np.int64]]:
    """(code per row, first row of each code): codes ``0..k-1`` in order of first appearance."""
    if table.num_rows == 0:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    codes = columns.joint_codes(*(table.column(k) for k in keys))
    return codes, columns.first_rows(codes)


class _Groups:
    """The rows of each group, in row order, worked out once per :func:`aggregate` for every
    column without nulls (most of them) instead of once per aggregate: a stable sort of the
    codes, the most expensive step of a group-by (radix on 16-bit codes where they fit)."""

    def __init__(self, codes: NDArray[np.int64], k: int) -> None:
        self.codes, self.k = codes, k
        self._all: tuple[NDArray[np.int64], NDArray[np.int64]] | None = None

    def rows(self, valid: NDArray[np.bool_]) -> tuple[NDArray[np.int64], NDArray[np.int64]]:
        """(size of each group, its rows: group 0's, then 1's, ... each in row order) among ``valid``."""
        if valid.all():
            if self._all is None:
                self._all = self._sorted(np.arange(len(self.codes)))
            return self._all
        return self._sorted(np.flatnonzero(valid))

    def _sorted(self, rows: NDArray[np.int64]) -> tuple[NDArray[np.int64], NDArray[np.int64]]:
        codes = self.codes[rows]
        counts = np.bincount(codes, minlength=self.k).astype(np.int64)
        narrow = codes.astype(np.uint16) if self.k <= 1 << 16 else codes
        return counts, rows[np.argsort(narrow, kind="stable")]


def _reduced(
    values: NDArray, valid: NDArray[np.bool_], groups: _Groups, function: str
) -> tuple[NDArray, NDArray[np.bool_]]:
    """(result per group, which groups have a result) for one function."""
    k = groups.k
    counts, order = groups.rows(valid)
    if function == "count":
        return counts, np.ones(k, bool)
    has = counts > 0
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]])[has]
    out = np.zeros(k, values.dtype if function != "mean" else np.float64)
    if function == "sum" and values.dtype.kind == "f":
        rows = np.flatnonzero(valid)
        add_in_row_order(out, groups.codes[rows], values[rows])
        return out, has
    if order.size:
        ufunc = {"sum": np.add, "mean": np.add, "min": np.minimum, "max": np.maximum}[function]
        out[has] = ufunc.reduceat(values[order], starts)
    if function == "mean":
        out[has] = out[has] / counts[has]
    return out, has


def add_in_row_order(totals: NDArray, codes: NDArray[np.int64], values: NDArray) -> None:
    """Add each value to its group's total (``totals[code]``, in place) one after another, in the
    order given.  Why: a float sum's rounding depends on the order of its additions; summing in row
    order (not pairwise, as ``np.add.reduceat`` does) lets a table read back a batch at a time (the
    chunked path, issue 21) give the same sums, bit for bit, as the one-pass aggregate."""
    np.add.at(totals, codes, values)


def aggregate(
    table: pa.Table,
    keys: Sequence[str],
    aggregations: Sequence[tuple[str, str]],
    codes: tuple[NDArray[np.int64], NDArray[np.int64]] | None = None,
) -> pa.Table:
    """``table.group_by(keys, use_threads=False).aggregate(aggregations)`` without Acero (see the
    module docstring); the keys come first, then the aggregates, as Arrow orders them.  ``codes``:
    :func:`group_codes` of the same table and keys, when the caller already has them (row ``i`` of
    the result is group code ``i``)."""
    codes, first = group_codes(table, keys) if codes is None else codes
    k = first.size
    groups = _Groups(codes, k)
    take = pa.array(first, pa.int64())
    arrays: dict[str, pa.Array | pa.ChunkedArray] = {key: table.column(key).take(take) for key in keys}
    for column, function in aggregations:
        if function not in FUNCTIONS:
            raise ValueError(f"unsupported aggregate {function!r}; have {FUNCTIONS}")
        source = columns.combined(table.column(column))
        numeric = pa.types.is_integer(source.type) or pa.types.is_floating(source.type)
        if pa.types.is_dictionary(source.type) or not numeric:
            raise TypeError(f"cannot aggregate column {column!r} of type {source.type}")
        valid = columns.valid(source)
        values = columns.numpy(source, null=0)
        out_type = source.type
        if function == "count":
            out_type = pa.int64()
        elif function == "mean" or (function == "sum" and pa.types.is_floating(source.type)):
            out_type, values = pa.float64(), values.astype(np.float64)
        elif function == "sum":  # integers add up in 64 bits, as Arrow's sum does
            unsigned = pa.types.is_unsigned_integer(source.type)
            out_type = pa.uint64() if unsigned else pa.int64()
            values = values.astype(np.uint64 if unsigned else np.int64)
        result, has = _reduced(values, valid, groups, function)
        arrays[f"{column}_{function}"] = pa.array(result, out_type, mask=None if has.all() else ~has)
    return pa.table(arrays)


MERGED_BY = {"count": "sum", "sum": "sum", "min": "min", "max": "max"}
"""How a partial aggregate of one part of a table combines with the same aggregate of the other
parts (``mean`` has no such rule: keep a ``sum`` and a ``count`` and divide after merging)."""


def merge_partials(
    partials: Sequence[pa.Table], keys: Sequence[str], aggregations: Sequence[tuple[str, str]]
) -> pa.Table:
    """The :func:`aggregate` of a whole table from the :func:`aggregate` results of its parts.

    Why: the bounded-memory path (issue 21) aggregates a trace chunk by chunk; each chunk's
    result is a partial that merges exactly (counts and integer sums add, minima and maxima
    compare).  The result has :func:`aggregate`'s columns and types; groups come in order of first
    appearance over the partials in the order given.  A float ``sum`` merged from partials is
    not the one-pass sum (its rounding depends on the order of the additions): take it again over
    the rows in order with :func:`add_in_row_order`.
    """
    names = [f"{column}_{function}" for column, function in aggregations]
    for (_, function), name in zip(aggregations, names, strict=True):
        if function not in MERGED_BY:
            raise ValueError(f"{name}: a {function!r} aggregate does not merge from partials")
    whole = pa.concat_tables(partials)
    merging = [(name, MERGED_BY[f]) for name, (_, f) in zip(names, aggregations, strict=True)]
    merged = aggregate(whole, keys, merging)
    arrays = [merged.column(k) for k in keys]
    for name, (_, function) in zip(names, aggregations, strict=True):
        column = merged.column(f"{name}_{MERGED_BY[function]}")
        arrays.append(column.cast(whole.schema.field(name).type))
    return pa.table(dict(zip([*keys, *names], arrays, strict=True)))
