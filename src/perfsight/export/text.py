"""Vectorised text building for writers: Arrow columns in, Arrow string columns out.

Writers must not loop over rows in Python.  The few shapes of text they need — a dictionary
column as plain strings, a shape list as Ascend writes it (``"32,3,224,224;64"``), element-wise
concatenation, many lines as one block of UTF-8 (:class:`TextRows`, laid out by the native
library where it is built) — are built here with ``pyarrow.compute``.  JSON text (escaped strings,
lists as ``[[32,3],[64]]``) comes from :mod:`perfsight.jsontext`, the one JSON renderer that
analyses and writers share.

This module must not convert units (see ``units.py``: nanoseconds are written as microseconds
only as ``units.us_pieces`` makes them, which the native layout's text is tested against) or know
about files.
"""

from __future__ import annotations

import ctypes
import dataclasses
from collections.abc import Callable, Iterator, Sequence

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.compute as pc

from perfsight import columns
from perfsight.columns import ArrayOrChunked, combined, distinct_codes, rebased_list
from perfsight.ingest import eventscan
from perfsight.units import US_FRACTIONS, US_SIGNS, us_pieces, us_text

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


@dataclasses.dataclass(frozen=True)
class _Coded:
    """``texts[codes[i]]`` on row ``i`` (``codes`` None: ``texts[0]`` on every row; -1: nothing)."""

    codes: np.ndarray | None
    texts: list[str] | pa.Array


@dataclasses.dataclass(frozen=True)
class _Numbers:
    """Integers as decimal text, or integer nanoseconds as exact microseconds with three decimals
    (``units.us_pieces``); nothing where ``present`` is False.  ``few``: the values repeat (the
    portable layout then makes each distinct text once)."""

    values: np.ndarray
    present: np.ndarray | None
    micros: bool
    few: bool


@dataclasses.dataclass(frozen=True)
class _Member:
    """A member of the JSON object opened last: its key (a comma before it after an earlier
    member) and its value; left out, key and all, where the value is null."""

    key: str
    value: _Coded | pa.Array | _Numbers


class _Open:
    """``{``, after which no member of the new object is written yet."""


_OPEN = _Open()
Item = str | _Open | _Coded | pa.Array | _Numbers | _Member


class TextRows:
    """Rows of text, each the concatenation of the same sequence of pieces, written in chunks.

    A piece is a constant (:meth:`add`), one of several texts chosen per row by a code
    (:meth:`add_choice`; :func:`distinct_texts` codes a column with few distinct values), a string
    column (:meth:`add_values`), a number (:meth:`add_ints`, :meth:`add_micros`), or a member of a
    JSON object (:meth:`open_object`, :meth:`add_member`, :meth:`close_object`).  Null and empty
    pieces are skipped.  :meth:`chunks` writes the rows a chunk at a time, so the text never
    needs more memory than a chunk.

    Two layouts give the same bytes.  Where the native library is built, ``es_format`` writes
    each row piece by piece straight into the chunk (numbers formatted there, no text made per
    row in between).  Elsewhere (:class:`_PortableLayout`) consecutive constants and choices are
    merged into one choice over the combinations that occur and the rows are gathered with one
    Arrow ``take`` over a pool of the distinct texts and the columns.
    """

    def __init__(self, n: int) -> None:
        self.n = n
        self._items: list[Item] = []

    def add(self, text: str) -> None:
        """The same text on every row."""
        self._items.append(text)

    def add_choice(self, codes: np.ndarray | None, texts: Sequence[str] | pa.Array) -> None:
        """``texts[codes[i]]`` on row ``i``; a code of ``-1`` adds nothing.  Many texts (a whole
        trace's names) may come as an Arrow array, made once for all chunks."""
        coded = self._coded(codes, texts)
        if coded is not None:
            self._items.append(coded)

    def add_values(self, values: ArrayOrChunked) -> None:
        """Row ``i`` of a string column (nothing where it is null)."""
        self._items.append(self._strings(values))

    def add_ints(self, values: np.ndarray, present: np.ndarray | None = None, few: bool = False) -> None:
        """Integers as decimal text; nothing where ``present`` is False.  ``few``: they repeat."""
        self._items.append(self._numbers(values, present, micros=False, few=few))

    def add_micros(self, ns: np.ndarray, few: bool = False) -> None:
        """Integer nanoseconds as exact microseconds with three decimals (``"-0.005"``)."""
        self._items.append(self._numbers(ns, None, micros=True, few=few))

    def open_object(self) -> None:
        """``{``; the members added next belong to this object."""
        self._items.append(_OPEN)

    def add_member(self, key: str, value: Choice | ArrayOrChunked) -> None:
        """An object member: ``value`` is (codes, texts) as for :meth:`add_choice` or a column of
        JSON text; the member is left out where the value is null."""
        coded = self._coded(*value) if isinstance(value, tuple) else self._strings(value)
        if coded is not None:
            self._items.append(_Member(key, coded))

    def add_int_member(
        self, key: str, values: np.ndarray, present: np.ndarray | None, few: bool = False
    ) -> None:
        """An object member whose value is an integer (left out where ``present`` is False)."""
        self._items.append(_Member(key, self._numbers(values, present, micros=False, few=few)))

    def close_object(self) -> None:
        self._items.append("}")

    def _coded(self, codes: np.ndarray | None, texts: Sequence[str] | pa.Array) -> _Coded | None:
        """The choice, its codes as int32 (what both layouts index with); None when it writes
        nothing on any row (common: a column no event of the trace has)."""
        if codes is not None:
            if len(codes) != self.n:
                raise ValueError(f"{len(codes)} codes for {self.n} rows of text")
            codes = np.ascontiguousarray(codes, dtype=np.int32)
            if not len(texts) or (len(codes) and codes.max() < 0):
                return None
        return _Coded(codes, texts if isinstance(texts, pa.Array) else list(texts))

    def _strings(self, values: ArrayOrChunked) -> pa.Array:
        arr = combined(values)
        if len(arr) != self.n:
            raise ValueError(f"column of {len(arr)} rows for {self.n} rows of text")
        return arr.cast(pa.string())

    def _numbers(self, values: np.ndarray, present: np.ndarray | None, micros: bool, few: bool) -> _Numbers:
        values = np.ascontiguousarray(values, dtype=np.int64)
        if len(values) != self.n:
            raise ValueError(f"{len(values)} numbers for {self.n} rows of text")
        if present is not None:
            present = None if present.all() else np.ascontiguousarray(present, dtype=bool)
        return _Numbers(values, present, micros, few)

    def chunks(self, rows: int) -> Iterator[memoryview]:
        """The text of rows ``0..n`` as UTF-8, ``rows`` rows (or fewer) per chunk.  A chunk is
        valid until the next is drawn (the native layout writes them all into one buffer): write
        it out, or copy it, first."""
        native = _NativeLayout(self._items) if eventscan.available() else None
        for lo in range(0, self.n, max(rows, 1)):
            hi = min(lo + rows, self.n)
            if native is not None:
                yield from native.chunks(lo, hi)
            else:
                yield _PortableLayout(self._items, lo, hi).to_bytes()

    def to_bytes(self) -> memoryview:
        """Every row's text, end to end, as UTF-8 (one chunk)."""
        parts = [bytes(chunk) for chunk in self.chunks(max(self.n, 1))]
        return memoryview(parts[0] if len(parts) == 1 else b"".join(parts))


def _merged_constants(items: list[Item]) -> Iterator[Item]:
    """The items with each run of constants as one (one piece for the native layout to write)."""
    constant = ""
    for item in items:
        if isinstance(item, str):
            constant += item
            continue
        if constant:
            yield constant
            constant = ""
        yield item
    if constant:
        yield constant


class _NativeLayout:
    """The pieces as the native library's ``Piece`` records (``es_format``), made once for all
    chunks; the arrays they point into are kept alive here."""

    CHUNK_BYTES = 4 << 20
    """The chunk buffer's size, unless every row of a chunk fits in less (or one row needs more):
    rows past it go to the next chunk."""

    NUMBER_BYTES = 25
    """The most a number piece writes: a sign, 19 digits, and ".fff"."""

    def __init__(self, items: list[Item]) -> None:
        self._alive: list[object] = []
        self._out: np.ndarray | None = None  # the chunk buffer, reused (its pages are touched once)
        self.row_bytes = 0  # the most one row can take
        records = [self._record(item) for item in _merged_constants(items)]
        self.pieces = (eventscan.Piece * len(records))()
        for piece, (kind, opens, fields) in zip(self.pieces, records, strict=True):
            piece.kind, piece.opens = kind, opens
            for name, value in fields.items():
                setattr(piece, name, value)

    def _record(self, item: Item) -> tuple[int, int, dict[str, int | None]]:
        """(kind, opens, the other fields) of the item's ``Piece``; counts its most bytes a row."""
        key = b""
        if isinstance(item, _Member):
            key, item = orjson.dumps(item.key) + b":", item.value
        if isinstance(item, str | _Open):
            kind, fields, most = self._pool(None, ["{" if isinstance(item, _Open) else item])
        elif isinstance(item, _Coded):
            kind, fields, most = self._pool(item.codes, item.texts)
        elif isinstance(item, pa.Array):
            kind, fields, most = self._column(item)
        else:
            kind, fields, most = self._number(item)
        if key:
            self._alive.append(key)
            fields.update(key=ctypes.cast(ctypes.c_char_p(key), ctypes.c_void_p).value, key_len=len(key))
            most += len(key) + 1  # and a comma
        self.row_bytes += most
        return kind, int(isinstance(item, _Open)), fields

    def _keep(self, array: np.ndarray) -> int:
        self._alive.append(array)
        return array.ctypes.data

    def _pool(
        self, codes: np.ndarray | None, texts: list[str] | pa.Array
    ) -> tuple[int, dict[str, int | None], int]:
        pool = texts if isinstance(texts, pa.Array) else pa.array(texts, pa.string())
        pool = pool.cast(pa.string())
        offsets, data = self._string_buffers(pool)
        lengths = np.diff(offsets)
        fields = {
            "offsets": self._keep(offsets),
            "data": data,
            "count": len(pool),
            "codes": self._keep(np.ascontiguousarray(codes, dtype=np.int32)) if codes is not None else None,
        }
        return eventscan.F_POOL, fields, int(lengths.max()) if len(lengths) else 0

    def _column(self, values: pa.Array) -> tuple[int, dict[str, int | None], int]:
        offsets, data = self._string_buffers(values)
        validity = values.buffers()[0] if values.null_count else None
        self._alive.append(values)
        fields = {
            "offsets": self._keep(offsets),
            "data": data,
            "bitmap": validity.address if validity is not None else None,
            "bit_offset": values.offset,
        }
        lengths = np.diff(offsets)
        return eventscan.F_STR, fields, int(lengths.max()) if len(lengths) else 0

    def _string_buffers(self, strings: pa.Array) -> tuple[np.ndarray, int]:
        """(int32 offsets of ``strings``' rows, address of its bytes); the array is kept alive."""
        self._alive.append(strings)
        _, offsets_buffer, data_buffer = strings.buffers()
        offsets = np.frombuffer(offsets_buffer, np.int32)[strings.offset : strings.offset + len(strings) + 1]
        return offsets, data_buffer.address if data_buffer is not None and data_buffer.size else 0

    def _number(self, item: _Numbers) -> tuple[int, dict[str, int | None], int]:
        fields = {
            "values": self._keep(item.values),
            "present": self._keep(item.present.view(np.uint8)) if item.present is not None else None,
        }
        return (eventscan.F_US if item.micros else eventscan.F_INT), fields, self.NUMBER_BYTES

    def chunks(self, lo: int, hi: int) -> Iterator[memoryview]:
        """Rows ``lo`` to ``hi`` in as many chunks as the buffer needs, each written into the same
        buffer (reused by the next call too)."""
        room = max(self.row_bytes, 1) * min(hi - lo, max(self.CHUNK_BYTES // max(self.row_bytes, 1), 1))
        if self._out is None or len(self._out) < room:
            self._out = np.empty(room, np.uint8)
        while lo < hi:
            written, done = eventscan.format_rows(self.pieces, lo, hi, self._out)
            if done == 0:
                raise RuntimeError("native row formatter wrote no row into room for every row")
            lo += done
            yield memoryview(self._out[:written])


class _PortableLayout:
    """Rows ``lo`` to ``hi`` of the items laid out with Arrow (see :class:`TextRows`)."""

    def __init__(self, items: list[Item], lo: int, hi: int) -> None:
        self.n = hi - lo
        self._pieces: list[Choice | pa.Array] = []
        self._pending: list[Choice] = []  # constants and choices not yet merged
        earlier = np.zeros(self.n, bool)  # rows where the open object has a member already
        for item in items:
            if isinstance(item, _Open):
                earlier = np.zeros(self.n, bool)
                item = "{"
            if isinstance(item, _Member):
                earlier = self._member(item.key, self._rows(item.value, lo, hi), earlier)
                continue
            if isinstance(item, _Numbers) and item.micros and not item.few:
                sign, whole, fraction = us_pieces(item.values[lo:hi])  # three pieces: the sign and
                self._add_choice(sign, US_SIGNS)  # the fraction have few texts, merged with their
                self._add_values(whole)  # neighbours
                self._add_choice(fraction, US_FRACTIONS)
                continue
            value = self._rows(item, lo, hi)
            if isinstance(value, pa.Array):
                self._add_values(value)
            elif isinstance(value, tuple):
                self._add_choice(*value)
            else:
                self._pending.append((None, [value]))

    def _rows(self, item: Item, lo: int, hi: int) -> str | Choice | pa.Array:
        """The item's rows ``lo`` to ``hi`` as a constant, a choice or a string column."""
        if isinstance(item, str):
            return item
        if isinstance(item, pa.Array):
            return item.slice(lo, hi - lo)
        if isinstance(item, _Coded):
            return (None if item.codes is None else item.codes[lo:hi]), item.texts
        values = item.values[lo:hi]
        present = None if item.present is None else item.present[lo:hi]
        arrow = pa.array(values, pa.int64(), mask=None if present is None else ~present)
        if item.few:
            return distinct_texts(arrow, us_text if item.micros else None)
        return arrow.cast(pa.string())

    def _member(self, key: str, value: str | Choice | pa.Array, earlier: np.ndarray) -> np.ndarray:
        name = orjson.dumps(key).decode() + ":"
        if isinstance(value, pa.Array):
            present = columns.numpy(value.is_valid()) if value.null_count else np.ones(self.n, bool)
            self._add_choice(np.where(present, earlier.view(np.int8), -1), [name, "," + name])
            self._add_values(value)
        else:  # the key and its value as one choice: first key, or after a comma
            codes, texts = value  # type: ignore[misc]
            codes = np.zeros(self.n, np.int64) if codes is None else codes
            texts = texts.to_pylist() if isinstance(texts, pa.Array) else texts
            present = codes >= 0
            self._add_choice(
                np.where(present, codes + earlier * len(texts), -1),
                [name + t for t in texts] + ["," + name + t for t in texts],
            )
        return earlier | present

    @property
    def _most_texts(self) -> int:
        """A choice with more texts than this is kept as a column: merging it would cost more than
        it saves."""
        return max(256, self.n // 8)

    def _add_choice(self, codes: np.ndarray | None, texts: list[str] | pa.Array) -> None:
        if codes is None:
            codes = np.zeros(self.n, np.int64)
        if len(texts) > self._most_texts:
            table = texts if isinstance(texts, pa.Array) else pa.array(texts, pa.string())
            self._add_values(table.take(pa.array(codes, pa.int64(), mask=codes < 0)))
            return
        texts = texts.to_pylist() if isinstance(texts, pa.Array) else list(texts)
        if (codes < 0).any():  # "nothing" becomes an extra, empty text
            codes = np.where(codes < 0, len(texts), codes)
            texts.append("")
        self._pending.append((codes, texts))

    def _add_values(self, values: pa.Array) -> None:
        self._flush()
        self._pieces.append(values.cast(pa.string()))

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
