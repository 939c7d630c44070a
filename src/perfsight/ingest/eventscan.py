"""The native event scanner: ``_eventscan.c`` loaded with ctypes, its output made Arrow.

The C library validates and splits the event array and converts the fields of
:data:`perfsight.ingest.chrome_events.FIELDS` straight into column buffers, in one
pass and without the GIL.  This module only describes those columns to it, hands it
buffers, and wraps what it wrote as Arrow arrays (zero copy).  Policy -- what a slow
row or a scan that stops means -- belongs to :mod:`perfsight.ingest.chrome_events`.

The same library lays out the writers' rows of text (:func:`gather`, :func:`format_rows`, used
by :class:`perfsight.export.text.TextRows`): one build, kept beside the reader that builds it.

The library is built when the package is installed (``hatch_build.py``); where it is
missing (no C compiler, a checkout not reinstalled) :func:`available` is false and the
reader uses its pure-Python path (the writers their Arrow layout, the same bytes).  Set
``PERFSIGHT_NATIVE=0`` to force that path.
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import os
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pyarrow as pa

from perfsight import heap
from perfsight.ingest._build_native import source_hash

LIBRARY_NAME = "_eventscan.dll" if sys.platform == "win32" else "_eventscan.so"
SOURCE = Path(__file__).with_name("_eventscan.c")

NEED_MORE, END, FULL, INVALID = 0, 1, 2, 3
"""Why a scan stopped: buffer exhausted mid-event, ``]`` reached, out of room, not an event."""

K_STR, K_INT, K_TIME, K_FLOAT, K_INT_LIST, K_INT_LIST_LIST, K_STR_LIST, K_ID = range(1, 9)


class _Column(ctypes.Structure):
    _fields_ = [
        ("kind", ctypes.c_int32),
        ("label", ctypes.c_int32),
        ("valid", ctypes.c_void_p),
        ("ints", ctypes.c_void_p),
        ("floats", ctypes.c_void_p),
        ("offsets", ctypes.c_void_p),
        ("inner", ctypes.c_void_p),
        ("values", ctypes.c_void_p),
        ("heap", ctypes.c_void_p),
        ("heap_cap", ctypes.c_int64),
        ("inner_cap", ctypes.c_int64),
        ("values_cap", ctypes.c_int64),
        ("heap_len", ctypes.c_int64),
        ("inner_len", ctypes.c_int64),
        ("values_len", ctypes.c_int64),
        ("present", ctypes.c_int64),
    ]


class _Spec(ctypes.Structure):
    _fields_ = [
        ("nkeys", ctypes.c_int32),
        ("keys", ctypes.POINTER(ctypes.c_char_p)),
        ("key_lens", ctypes.POINTER(ctypes.c_int32)),
        ("key_scopes", ctypes.POINTER(ctypes.c_int32)),
        ("key_columns", ctypes.POINTER(ctypes.c_int32)),
        ("ncolumns", ctypes.c_int32),
        ("columns", ctypes.POINTER(_Column)),
        ("ph_column", ctypes.c_int32),
        ("keep_ph", ctypes.c_char_p),
        ("rows_cap", ctypes.c_int64),
        ("slow_rows", ctypes.c_void_p),
        ("slow_start", ctypes.c_void_p),
        ("slow_end", ctypes.c_void_p),
    ]


class _Result(ctypes.Structure):
    _fields_ = [
        ("pos", ctypes.c_int64),
        ("rows", ctypes.c_int64),
        ("events", ctypes.c_int64),
        ("slow", ctypes.c_int64),
        ("status", ctypes.c_int32),
        ("full_column", ctypes.c_int32),
        ("lone_surrogates", ctypes.c_int64),
    ]


class Piece(ctypes.Structure):
    """One piece of every row of text for ``es_format`` (``_eventscan.c`` says what each field is;
    :class:`perfsight.export.text.TextRows` fills them)."""

    _fields_ = [
        ("kind", ctypes.c_int32),
        ("opens", ctypes.c_int32),
        ("codes", ctypes.c_void_p),
        ("offsets", ctypes.c_void_p),
        ("data", ctypes.c_void_p),
        ("bitmap", ctypes.c_void_p),
        ("bit_offset", ctypes.c_int64),
        ("present", ctypes.c_void_p),
        ("values", ctypes.c_void_p),
        ("count", ctypes.c_int64),
        ("key", ctypes.c_void_p),
        ("key_len", ctypes.c_int64),
    ]


F_POOL, F_STR, F_INT, F_US = range(1, 5)
"""What a :class:`Piece` writes: a text chosen from a pool, a string column, an integer, exact µs."""


def _load(directory: Path | None = None) -> ctypes.CDLL | None:
    if os.environ.get("PERFSIGHT_NATIVE", "1") == "0":
        return None
    path = (directory or Path(__file__).parent) / LIBRARY_NAME
    if not path.is_file():
        return None
    try:
        lib = ctypes.CDLL(str(path))
    except OSError:
        return None
    try:
        lib.es_source_hash.restype = ctypes.c_char_p
        built_from = lib.es_source_hash().decode()
    except AttributeError:
        return None
    if built_from != source_hash(SOURCE):
        return None  # built from another version of _eventscan.c: never run stale native code
    lib.es_scan.restype = ctypes.c_int64
    lib.es_scan.argtypes = [
        ctypes.c_void_p,
        ctypes.c_int64,
        ctypes.c_int64,
        ctypes.POINTER(_Spec),
        ctypes.POINTER(_Result),
    ]
    lib.es_gather.restype = ctypes.c_int64
    lib.es_gather.argtypes = [
        ctypes.c_void_p,
        ctypes.c_int64,
        ctypes.c_void_p,
        ctypes.c_void_p,
        ctypes.c_int64,
        ctypes.c_void_p,
        ctypes.c_int64,
    ]
    lib.es_format.restype = ctypes.c_int64
    lib.es_format.argtypes = [
        ctypes.POINTER(Piece),
        ctypes.c_int32,
        ctypes.c_int64,
        ctypes.c_int64,
        ctypes.c_void_p,
        ctypes.c_int64,
        ctypes.POINTER(ctypes.c_int64),
    ]
    return lib


_LIB = _load()


def available() -> bool:
    """True when the native scanner is built and loadable."""
    return _LIB is not None


def use_library(directory: Path | None) -> bool:
    """Load the library from ``directory`` (tests build one there); None forgets it."""
    global _LIB
    _LIB = _load(directory) if directory is not None else None
    return _LIB is not None


@dataclasses.dataclass(frozen=True)
class ColumnSpec:
    """One output column: where its value sits in an event and what it becomes."""

    name: str  # column name in the output table
    key: str | None  # JSON key (None: filled by another column, e.g. a pid's text label)
    scope: int  # 0 = the event object, 1 = its "args" object
    dtype: pa.DataType
    label: str | None = None  # integer id column: name of the column that takes string values
    micros: bool = False  # int64 nanoseconds from decimal microseconds (a number or a numeric string)


def _kind(column: ColumnSpec) -> int:
    t = column.dtype
    if column.label is not None:
        return K_ID
    if column.micros:
        return K_TIME
    if t == pa.string():
        return K_STR
    if t == pa.int64():
        return K_INT
    if t == pa.float64():
        return K_FLOAT
    if t == pa.list_(pa.int64()):
        return K_INT_LIST
    if t == pa.list_(pa.list_(pa.int64())):
        return K_INT_LIST_LIST
    if t == pa.list_(pa.string()):
        return K_STR_LIST
    raise TypeError(f"no native conversion to {t} for column {column.name!r}")


class Window:
    """The bytes being scanned: what is left of the last block, then the next block, in one
    reused buffer (a fresh multi-megabyte ``bytes`` per block would fragment the heap)."""

    def __init__(self, first: bytes = b"") -> None:
        self.buffer = np.empty(0, np.uint8)
        self.length = 0
        self.advance(0, [first])

    def advance(self, keep_from: int, blocks: list[bytes]) -> None:
        """Drop bytes before ``keep_from``, then append ``blocks``."""
        tail = self.length - keep_from
        need = tail + sum(len(block) for block in blocks)
        if need > len(self.buffer):
            grown = np.empty(need + need // 4, np.uint8)
            grown[:tail] = self.buffer[keep_from : self.length]
            self.buffer = grown
        elif tail:
            ctypes.memmove(self.buffer.ctypes.data, self.buffer.ctypes.data + keep_from, tail)
        end = tail
        for block in blocks:
            self.buffer[end : end + len(block)] = np.frombuffer(block, np.uint8)
            end += len(block)
        self.length = need

    def bytes(self, start: int, end: int | None = None) -> bytes:
        return self.buffer[start : self.length if end is None else end].tobytes()


@dataclasses.dataclass
class Scan:
    """Where one call stopped and what it met; its rows stay in the scanner (``Scanner.table``)."""

    status: int
    pos: int  # next byte to scan (the ']' for END, the bad event for INVALID)
    events: int  # whole events consumed, kept or not
    slow_rows: np.ndarray  # rows whose values did not fit their columns (all null here)
    slow_spans: np.ndarray  # (k, 2) byte spans of those events in the buffer
    lone_surrogates: int  # \uD800-\uDFFF escapes without their pair in the whole events scanned


class Scanner:
    """Reusable description of the columns; :meth:`scan` runs the library over a window.

    The library writes into work buffers owned by the scanner and reused by every call;
    each call copies out only what it used, so memory follows the data, not the buffers.
    """

    ROWS = 1 << 14
    """Rows per call: bounds the work buffers (a few MB)."""

    MIN_HEAP = 1 << 20
    """Bytes a new scanner's text and list heaps start with.  Why 1 MiB, not less: a heap out of
    room ends the batch early (one more batch to convert and cut) and each scanner of a read
    grows its own; from 64 KiB, a fresh read of df_index_resolver stopped 20 times instead of 9
    (its names need 1 MiB per 16K rows).  Pages never written cost no memory (the buffer is
    mapped, not touched), and idle ones are handed back (:meth:`release_pages`)."""

    def __init__(self, columns: list[ColumnSpec], keep_phases: str) -> None:
        if _LIB is None:
            raise RuntimeError("the native event scanner is not built")
        self.columns = columns
        self.keep_phases = keep_phases
        self.kinds = [_kind(c) for c in columns]
        index = {c.name: i for i, c in enumerate(columns)}
        keyed = [(i, c) for i, c in enumerate(columns) if c.key is not None]
        self._keys = [c.key.encode() for _, c in keyed]  # type: ignore[union-attr]
        self._key_ptrs = (ctypes.c_char_p * len(keyed))(*self._keys)
        self._key_lens = (ctypes.c_int32 * len(keyed))(*(len(k) for k in self._keys))
        self._key_scopes = (ctypes.c_int32 * len(keyed))(*(c.scope for _, c in keyed))
        self._key_columns = (ctypes.c_int32 * len(keyed))(*(i for i, _ in keyed))
        keep = bytearray(256)
        for phase in keep_phases:
            keep[ord(phase)] = 1
        self._keep = bytes(keep)
        self._cols = (_Column * len(columns))()
        self._work: list[dict[str, np.ndarray]] = []
        rows = self.ROWS
        for i, kind in enumerate(self.kinds):
            c = self._cols[i]
            c.kind = kind
            c.label = index[columns[i].label] if columns[i].label else -1  # type: ignore[index]
            work = {"valid": np.empty(rows, np.uint8)}
            if kind == K_FLOAT:
                work["data"] = np.empty(rows, np.float64)
            elif kind in (K_INT, K_TIME, K_ID):
                work["data"] = np.empty(rows, np.int64)
            else:
                work["offsets"] = np.empty(rows + 1, np.int32)
            self._work.append(work)
            self._grow(i, self.MIN_HEAP)
        self._slow = np.empty((3, rows), np.int64)
        self._rows = 0  # rows in the work buffers
        self._full_column = -1  # the column the last call ran out of room in (-1: none)
        self._spec = _Spec(
            nkeys=len(self._keys),
            keys=self._key_ptrs,
            key_lens=self._key_lens,
            key_scopes=self._key_scopes,
            key_columns=self._key_columns,
            ncolumns=len(columns),
            columns=self._cols,
            ph_column=index["ph"],
            keep_ph=self._keep,
            rows_cap=rows,
            slow_rows=self._slow[0].ctypes.data,
            slow_start=self._slow[1].ctypes.data,
            slow_end=self._slow[2].ctypes.data,
        )

    def _grow(self, i: int, size: int) -> None:
        """(Re)allocate column i's variable-size work buffers for ``size`` bytes of values."""
        c, work, kind = self._cols[i], self._work[i], self.kinds[i]
        if kind in (K_STR, K_STR_LIST):
            work["heap"] = np.empty(size, np.uint8)
            c.heap_cap = size
        if kind in (K_INT_LIST, K_INT_LIST_LIST):
            work["values"] = np.empty(size // 8, np.int64)
            c.values_cap = size // 8
        if kind in (K_INT_LIST_LIST, K_STR_LIST):
            work["inner"] = np.empty(size // 8 + 1, np.int32)
            c.inner_cap = size // 8
        c.valid = work["valid"].ctypes.data
        c.ints = work["data"].ctypes.data if kind in (K_INT, K_TIME, K_ID) else None
        c.floats = work["data"].ctypes.data if kind == K_FLOAT else None
        for name in ("offsets", "heap", "values", "inner"):
            setattr(c, name, work[name].ctypes.data if name in work else None)

    def release_pages(self) -> None:
        """Let the OS take back the pages the work buffers hold while this scanner is idle (their
        contents do not matter between reads: every :meth:`run` that does not resume writes
        before it reads); they are faulted in again as the next read touches them."""
        heap.release_pages(self._slow)
        for work in self._work:
            for array in work.values():
                heap.release_pages(array)

    def work_bytes(self) -> int:
        """Bytes held by the work buffers (what keeping this scanner idle costs)."""
        return self._slow.nbytes + sum(a.nbytes for work in self._work for a in work.values())

    def run(self, window: Window, pos: int, resume: bool = False) -> Scan:
        """Scan whole events of ``window`` from ``pos`` on, until a stop (see :class:`Scan`), into
        the work buffers: :meth:`table` copies the rows out.

        ``resume``: add to the rows of the last call, which stopped at NEED_MORE without slow rows
        (their spans would point into bytes the window has since dropped) and whose rows were not
        taken.  Why: a block boundary then no longer ends a batch, and every batch has a fixed
        cost downstream (one Arrow table of every column, one cut into the trace's parts): a
        512 KiB block holds a twelfth of the rows a batch may hold."""
        assert _LIB is not None
        if not resume:
            for c in self._cols:
                c.heap_len = c.inner_len = c.values_len = c.present = 0
            self._rows = 0
        result = _Result(rows=self._rows)
        address = window.buffer.ctypes.data
        if _LIB.es_scan(address, window.length, pos, ctypes.byref(self._spec), ctypes.byref(result)) < 0:
            raise RuntimeError("native event scanner rejected its column description")
        self._rows = int(result.rows)
        self._full_column = int(result.full_column) if result.status == FULL else -1
        k = int(result.slow)
        return Scan(
            status=int(result.status),
            pos=int(result.pos),
            events=int(result.events),
            slow_rows=self._slow[0, :k].copy(),
            slow_spans=self._slow[1:, :k].T.copy(),
            lone_surrogates=int(result.lone_surrogates),
        )

    @property
    def rows(self) -> int:
        """Rows the calls since the last non-resumed :meth:`run` wrote."""
        return self._rows

    def table(self) -> pa.Table:
        """The rows the calls since the last non-resumed :meth:`run` wrote, copied out as Arrow
        (the work buffers are reused); then :meth:`make_room`."""
        n = self._rows
        table = pa.table(
            {
                col.name: _arrow(self.kinds[i], col.dtype, n, self._cols[i], self._work[i])
                for i, col in enumerate(self.columns)
            }
        )
        self.make_room()
        return table

    def make_room(self) -> None:
        """Give the column the last call ran out of room in (FULL) twice the room; its rows must
        have been taken (:meth:`table`) or be none."""
        if self._full_column >= 0:
            i, self._full_column = self._full_column, -1
            self._grow(i, 2 * max(int(self._cols[i].heap_cap), int(self._cols[i].values_cap) * 8))


KEEP_IDLE_BYTES = 64 << 20
"""A scanner whose work buffers grew past this is dropped after its read, not kept for the next."""

KEEP_IDLE = 3
"""Idle scanners kept per column description: what one read uses at most (the one scanning, the
one whose rows are being converted, the one waiting between them: ``chrome_events``)."""

_IDLE: dict[tuple[tuple[ColumnSpec, ...], str], list[Scanner]] = {}

_PAGES_KEPT: list[int] = [0]  # reads under pages_kept() now running


@contextlib.contextmanager
def pages_kept() -> Iterator[None]:
    """Within this block, a scanner made idle keeps the pages its work buffers touched.

    Why: after a read the idle scanners hand their pages back to the OS
    (:meth:`Scanner.release_pages`), so that a single analysis does not hold them while it runs.
    A cluster worker instead reads its next trace within a tenth of a second, and giving the
    pages back only to fault them in again cost 2.5 ms of a 2 MB trace's 16 ms read (madvise
    calls and 500 page faults a read; docs/BENCHMARKS.md).  The idle scanners then hold at most
    :data:`KEEP_IDLE` work buffers' touched pages (about 20 MB each for any trace); a read outside
    the block releases them again."""
    _PAGES_KEPT[0] += 1
    try:
        yield
    finally:
        _PAGES_KEPT[0] -= 1


def idle_scanner(columns: list[ColumnSpec], keep_phases: str) -> Scanner:
    """A scanner for ``columns``, taken from an earlier read in this process when one is idle.

    Why: a cluster worker reads a thousand small traces one after the other; a fresh scanner
    allocates its work buffers and then regrows its string heaps from 64 KiB, stopping the scan at
    every growth (each stop is one more batch to convert and concatenate): 5-10 % of the CPU time
    of reading a 2 MB trace.  Every scan copies out what it wrote, so nothing a caller
    holds points into the buffers; each user has its own scanner (taken off the idle list, an
    atomic list operation, so threads may share it).  Give it back with :func:`keep_idle`.
    """
    try:
        return _IDLE.setdefault((tuple(columns), keep_phases), []).pop()
    except IndexError:
        return Scanner(columns, keep_phases)


def keep_idle(scanner: Scanner) -> None:
    """Keep ``scanner`` for a later read (:func:`idle_scanner`) unless it grew large or enough are kept."""
    idle = _IDLE.setdefault((tuple(scanner.columns), scanner.keep_phases), [])
    if scanner.work_bytes() <= KEEP_IDLE_BYTES and len(idle) < KEEP_IDLE:
        if not _PAGES_KEPT[0]:  # see pages_kept
            scanner.release_pages()
        idle.append(scanner)


def _copy(array: np.ndarray, count: int) -> pa.Buffer:
    """The first ``count`` items of a work buffer, copied into Arrow's memory."""
    nbytes = count * array.itemsize
    buffer = pa.allocate_buffer(nbytes)
    if nbytes:
        ctypes.memmove(buffer.address, array.ctypes.data, nbytes)
    return buffer


def _arrow(kind: int, dtype: pa.DataType, n: int, c: _Column, work: dict[str, np.ndarray]) -> pa.Array:
    present = int(c.present)
    if not present:
        return pa.nulls(n, dtype)
    nulls = n - present
    bitmap = None
    if nulls:
        bitmap = pa.py_buffer(np.packbits(work["valid"][:n].view(np.bool_), bitorder="little"))
    if kind in (K_INT, K_TIME, K_ID, K_FLOAT):
        return pa.Array.from_buffers(dtype, n, [bitmap, _copy(work["data"], n)], null_count=nulls)
    offsets = _copy(work["offsets"], n + 1)
    if kind == K_STR:
        heap = _copy(work["heap"], int(c.heap_len))
        return pa.Array.from_buffers(pa.string(), n, [bitmap, offsets, heap], null_count=nulls)
    if kind == K_STR_LIST:
        inner = int(c.inner_len)
        strings = pa.Array.from_buffers(
            pa.string(), inner, [None, _copy(work["inner"], inner + 1), _copy(work["heap"], int(c.heap_len))]
        )
        return pa.Array.from_buffers(dtype, n, [bitmap, offsets], null_count=nulls, children=[strings])
    count = int(c.values_len)
    values = pa.Array.from_buffers(pa.int64(), count, [None, _copy(work["values"], count)])
    if kind == K_INT_LIST_LIST:
        inner = int(c.inner_len)
        values = pa.Array.from_buffers(
            dtype.value_type, inner, [None, _copy(work["inner"], inner + 1)], children=[values]
        )
    return pa.Array.from_buffers(dtype, n, [bitmap, offsets], null_count=nulls, children=[values])


def gather(strings: pa.Array, order: np.ndarray) -> np.ndarray | None:
    """The UTF-8 bytes of ``strings[order[0]]``, ``strings[order[1]]``, ... end to end, copied by the
    native library (no Arrow offsets built for a result that is written out at once); ``order``
    must not point at a null.  None where the library is not built or ``strings`` is not a plain
    string array: the caller then uses Arrow's take."""
    lib = _LIB
    if lib is None or strings.type != pa.string() or len(strings) == 0:
        return None
    _, offsets_buffer, data_buffer = strings.buffers()
    offsets = np.frombuffer(offsets_buffer, np.int32)[strings.offset : strings.offset + len(strings) + 1]
    order = np.ascontiguousarray(order, dtype=np.int32)
    total = int((offsets[1:] - offsets[:-1])[order].sum()) if len(order) else 0
    out = np.empty(total, np.uint8)
    data = data_buffer.address if data_buffer is not None else 0
    written = lib.es_gather(
        offsets.ctypes.data, len(strings), data, order.ctypes.data, len(order), out.ctypes.data, total
    )
    if written != total:
        raise RuntimeError("native gather disagrees with the string lengths")
    return out


def format_rows(pieces: ctypes.Array, lo: int, hi: int, out: np.ndarray) -> tuple[int, int]:
    """Rows ``lo`` to ``hi`` of ``pieces`` laid out into ``out`` by the native library: (bytes
    written, whole rows written; fewer rows than asked when ``out`` is full).  The caller checks
    :func:`available` first and keeps every buffer the pieces point to alive."""
    assert _LIB is not None
    done = ctypes.c_int64(0)
    written = _LIB.es_format(pieces, len(pieces), lo, hi, out.ctypes.data, len(out), ctypes.byref(done))
    if written < 0:
        raise RuntimeError("native row formatter met a code outside its texts")
    return int(written), int(done.value)
