"""Vectorised text building for writers: Arrow columns in, Arrow string columns out.

Writers must not loop over rows in Python.  The few shapes of text they need — a dictionary
column as plain strings, a shape list as Ascend writes it (``"32,3,224,224;64"``), element-wise
concatenation, many lines as one block of UTF-8 — are built here with ``pyarrow.compute``.  JSON
text (escaped strings, lists as ``[[32,3],[64]]``) comes from :mod:`perfsight.jsontext`, the one
JSON renderer that analyses and writers share.

This module must not convert units (see ``units.py``) or know about files.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.compute as pc

from perfsight import columns
from perfsight.columns import ArrayOrChunked, combined, distinct_codes, rebased_list
from perfsight.ingest import eventscan

Render = Callable[[pa.Array], pa.Array]
"""Values -> their text (a null text means: write nothing)."""


def plain(values: ArrayOrChunked) -> pa.Array:
    """A dictionary-encoded column decoded to its value type; other columns unchanged."""
    arr = combined(values)
    if pa.types.is_dictionary(arr.type):
        return arr.dictionary_decode()
    return arr


def _rebuild(outer: pa.Array, new_values: pa.Array) -> pa.Array:
    """``outer``'s list structure (offsets, nulls) around ``new_values`` (one per element of
    ``outer.values``; ``outer`` must come from :func:`~perfsight.jsontext.rebased_list`, so it
    starts at offset 0)."""
    if outer.null_count:
        return pa.ListArray.from_arrays(outer.offsets, new_values, mask=pc.is_null(outer))
    return pa.ListArray.from_arrays(outer.offsets, new_values)


def _ascend(values: ArrayOrChunked, from_json: Render, from_lists: Render) -> pa.Array:
    """Ascend-style text of a list column given as Arrow lists (``from_lists`` of the rebased lists)
    or as the analysis tables' JSON text (``from_json``, once per distinct text); null stays null."""
    arr = plain(values)
    if pa.types.is_null(arr.type):
        return pa.nulls(len(arr), pa.string())
    if columns.is_text(arr.type):
        return columns.per_distinct(arr, lambda texts: from_json(texts.cast(pa.string())))
    return from_lists(rebased_list(arr))


def join_ints(lists: ArrayOrChunked, sep: str = ",") -> pa.Array:
    """``list<int>`` -> ``"1,2,3"`` per row (null list -> null, empty list -> ``""``).

    JSON text (``"[1, 2, 3]"``, what the analysis tables hold) is accepted too.
    """

    def from_json(texts: pa.Array) -> pa.Array:
        digits = pc.replace_substring_regex(texts, r"[\[\]\s]", "")
        return digits if sep == "," else pc.replace_substring(digits, ",", sep)

    return _ascend(lists, from_json, lambda arr: pc.binary_join(arr.cast(pa.list_(pa.string())), sep))


def shapes_text(dims: ArrayOrChunked) -> pa.Array:
    """Input shapes as Ascend writes them: ``"32,1,224,224;121,4,16,8;64"``.

    Accepts ``list<list<int>>`` (the trace model) or JSON text (``"[[32,1],[64]]"``, what the
    operator analyses emit).  A non-tensor input is an empty shape (``"32,1;;64"``).
    """

    def from_json(texts: pa.Array) -> pa.Array:
        separated = pc.replace_substring_regex(texts, r"\]\s*,\s*\[", ";")
        return pc.replace_substring_regex(separated, r"[\[\]\s]", "")

    def from_lists(arr: pa.Array) -> pa.Array:
        inner = rebased_list(arr.values) if len(arr.values) else arr.values.cast(pa.list_(pa.int64()))
        return pc.binary_join(_rebuild(arr, join_ints(inner, ",")), ";")

    return _ascend(dims, from_json, from_lists)


def types_text(types: ArrayOrChunked) -> pa.Array:
    """Input dtypes as Ascend writes them: ``"FLOAT;FLOAT;INT64"`` (case kept as recorded).

    Accepts ``list<string>`` or JSON text (``'["float","int"]'``).
    """

    def from_json(texts: pa.Array) -> pa.Array:  # decoded, so escaped names come back as they were
        return pa.array(
            [None if t is None else ";".join(_json_names(t)) for t in texts.to_pylist()], pa.string()
        )

    return _ascend(
        types, from_json, lambda arr: pc.binary_join(_rebuild(arr, plain(arr.values).cast(pa.string())), ";")
    )


def _json_names(text: str) -> list[str]:
    """The strings of a JSON list (``'["float","int"]'``); text that is not JSON is split as it
    stands, so hand-written tables still read."""
    try:
        values = orjson.loads(text)
    except orjson.JSONDecodeError:
        values = None
    if not isinstance(values, list):
        inner = text.strip().removeprefix("[").removesuffix("]").strip()
        return [part.strip().strip('"') for part in inner.split(",")] if inner else []
    return ["" if v is None else str(v) for v in values]


def concat(*parts: ArrayOrChunked | str) -> pa.Array:
    """Element-wise concatenation; a null part makes the row null (use ``fill_null`` before)."""
    return pc.binary_join_element_wise(*[p if isinstance(p, str) else combined(p) for p in parts], "")


def distinct_texts(values: ArrayOrChunked, render: Render | None = None) -> tuple[np.ndarray, list[str]]:
    """(per-row code, text per code) of a column, ``render`` applied once per distinct value
    (default: Arrow's text of the value).  A null value, or one whose text is null, gets code ``-1``."""
    arr = combined(values)
    if arr.null_count == len(arr):  # nothing to write (common: shapes not recorded)
        return np.full(len(arr), -1, np.int64), []
    codes = distinct_codes(arr)
    texts = (render or (lambda v: v.cast(pa.string())))(arr.take(pa.array(columns.first_rows(codes))))
    if texts.null_count:
        codes = np.where(columns.numpy(texts.is_valid())[np.maximum(codes, 0)] & (codes >= 0), codes, -1)
    return codes, texts.fill_null("").to_pylist()


Choice = tuple[np.ndarray | None, list[str]]
"""Per-row code (None: code 0 on every row) and the text of each code."""


class TextRows:
    """Rows of text, each the concatenation of the same sequence of pieces, built as one block.

    A piece is a constant (:meth:`add`), one of several texts chosen per row by a code
    (:meth:`add_choice`; :func:`distinct_texts` codes a column with few distinct values), or a
    string column (:meth:`add_values`).  Consecutive constants and choices are merged into one
    choice over the combinations that occur, so a row is made of a few elements only;
    :meth:`to_bytes` then lays the rows end to end with a single gather over a pool of the
    distinct texts and the columns (the native library's ``es_gather`` where built, else Arrow's
    ``take``).  The text costs about one copy of its bytes, where a row-wise
    concatenation kernel pays per piece and per row.  Empty and null pieces are skipped.
    """

    def __init__(self, n: int) -> None:
        self.n = n
        self._pieces: list[Choice | pa.Array] = []
        self._pending: list[Choice] = []  # constants and choices not yet merged

    @property
    def _most_texts(self) -> int:
        """A choice with more texts than this is kept as a column: merging it would cost more than
        it saves."""
        return max(256, self.n // 8)

    def add(self, text: str) -> None:
        """The same text on every row."""
        self._pending.append((None, [text]))

    def add_choice(self, codes: np.ndarray, texts: Sequence[str] | pa.Array) -> None:
        """``texts[codes[i]]`` on row ``i``; a code of ``-1`` adds nothing.  Many texts (a whole
        trace's names) may come as an Arrow array, made once for all blocks."""
        codes = np.asarray(codes)
        if len(codes) != self.n:
            raise ValueError(f"{len(codes)} codes for {self.n} rows of text")
        if len(texts) > self._most_texts:
            table = texts if isinstance(texts, pa.Array) else pa.array(texts, pa.string())
            self.add_values(table.take(pa.array(codes, pa.int64(), mask=codes < 0)))
            return
        texts = texts.to_pylist() if isinstance(texts, pa.Array) else list(texts)
        if (codes < 0).any():  # "nothing" becomes an extra, empty text
            codes = np.where(codes < 0, len(texts), codes)
            texts.append("")
        self._pending.append((codes, texts))

    def add_values(self, values: ArrayOrChunked) -> None:
        """Row ``i`` of a string column (nothing where it is null)."""
        arr = combined(values)
        if len(arr) != self.n:
            raise ValueError(f"column of {len(arr)} rows for {self.n} rows of text")
        self._flush()
        self._pieces.append(arr.cast(pa.string()))

    def _flush(self) -> None:
        """Merge the pending constants and choices."""
        choices: list[Choice] = []
        prefix = ""
        for codes, texts in self._pending:  # constants are folded into a neighbouring choice
            if codes is None and choices:
                choices[-1] = (choices[-1][0], [t + texts[0] for t in choices[-1][1]])
            elif codes is None:
                prefix += texts[0]
            else:
                choices.append((codes, [prefix + t for t in texts] if prefix else texts))
                prefix = ""
        self._pending = []
        if prefix:
            choices.append((None, [prefix]))
        if choices:
            self._pieces += self._combine(choices)

    def _combine(self, choices: list[Choice]) -> list[Choice]:
        """Consecutive choices as one choice over the combinations that occur; split in two where
        there would be too many."""
        if len(choices) == 1:
            return choices
        combined_code = np.zeros(self.n, np.int64)
        radix = 1
        for codes, texts in choices:
            radix *= len(texts)
            if radix >= 2**62:
                break
            if codes is not None:
                combined_code = combined_code * len(texts) + codes
        if radix < 2**62:
            encoded = pc.dictionary_encode(pa.array(combined_code))
            seen = columns.int64(encoded.dictionary)
            if len(seen) <= self._most_texts:
                digits = []
                for _, texts in reversed(choices):  # the last choice is the lowest digit
                    seen, digit = np.divmod(seen, len(texts))
                    digits.append(list(map(texts.__getitem__, digit.tolist())))
                merged = list(map("".join, zip(*reversed(digits), strict=True)))
                return [(columns.int64(encoded.indices), merged)]
        half = len(choices) // 2
        return self._combine(choices[:half]) + self._combine(choices[half:])

    def to_bytes(self) -> memoryview:
        """The rows' text, end to end, as UTF-8."""
        self._flush()
        if self.n == 0:
            return memoryview(b"")
        pool_texts = [""]  # slot 0: nothing
        index = np.zeros((len(self._pieces), self.n), dtype=np.int32)  # pool slot per piece and row
        value_columns: list[tuple[int, pa.Array]] = []
        for i, piece in enumerate(self._pieces):
            if isinstance(piece, pa.Array):
                value_columns.append((i, piece))
                continue
            codes, texts = piece
            slots = np.arange(len(pool_texts), len(pool_texts) + len(texts), dtype=np.int32)
            if "" in texts:  # an empty text adds nothing: slot 0
                slots[[j for j, t in enumerate(texts) if t == ""]] = 0
            pool_texts += texts
            index[i] = slots[0] if codes is None else slots[codes]
        base = len(pool_texts)
        for k, (i, column) in enumerate(value_columns):
            index[i] = np.arange(base + k * self.n, base + (k + 1) * self.n, dtype=np.int32)
            if column.null_count:
                index[i][~columns.numpy(column.is_valid())] = 0
        order = index.T.ravel()  # row by row
        pool = pa.concat_arrays([pa.array(pool_texts, pa.string()), *(c for _, c in value_columns)])
        order = order[order != 0]
        gathered = eventscan.gather(pool, order)  # native copy where built: no offsets to build
        if gathered is not None:
            return memoryview(gathered)
        taken = pool.take(pa.array(order))
        _, offsets, data = taken.buffers()
        if data is None or len(taken) == 0:
            return memoryview(b"")
        ends = np.frombuffer(offsets, np.int32)[[taken.offset, taken.offset + len(taken)]]
        return memoryview(data)[int(ends[0]) : int(ends[1])]
