"""Stream the event array of a Chrome-trace JSON file in bounded memory.

A Chrome trace is either ``{"traceEvents": [...], ...other keys}`` (Kineto) or a
bare ``[...]`` (Ascend's ``trace_view.json``).  Files reach a gigabyte, so we
never hold the whole document: the file is decompressed in blocks, a vectorised
structural scan (NumPy over the raw bytes) finds where each top-level event
ends, and complete events are handed on in batches of raw bytes whose
separating commas are blanked, ready for a columnar JSON parser.

Decompression (:mod:`perfsight.ingest.inflate`: every gzip member, every byte before
damage to the container) runs in a background thread, a couple of blocks ahead of the
consumer (zlib and ISA-L release the GIL), so it overlaps with parsing.  The blocks are
made valid UTF-8 on the way (invalid sequences become U+FFFD, counted in the report), so
both parsers see the same text and no undecodable string reaches a table.  Callers that
split and parse in one pass themselves (the native scanner) take the raw blocks
from :func:`open_events` and come back here for the header, the truncation
report, or -- when they meet text they do not handle -- to split the rest.

The scan tracks strings (with escapes), nesting depth and the end of the array
across block boundaries.  What it cannot place -- bytes after the last
complete event of a truncated file, or text that breaks the structure -- is
reported through :class:`StreamReport` and never raised: the caller keeps
every complete event before the damage.

This module knows nothing about Kineto fields; it only splits JSON.
"""

from __future__ import annotations

import codecs
import contextlib
import dataclasses
import queue
import re
import threading
from collections.abc import Generator, Iterator
from pathlib import Path
from typing import Any, BinaryIO, TypeVar

import numpy as np
import orjson

from perfsight.ingest import inflate

T = TypeVar("T")

READ_BLOCK = 512 << 10
"""Bytes read per I/O call (compressed bytes of a gzip file, else the blocks themselves).  Below
the 1 MiB mmap threshold, as :data:`MAX_BLOCK` (see there why): with 4 MiB reads a plain 128 MB
trace took 0.50 s of CPU to read, with 512 KiB 0.43; a gzip file's reads cost nothing either way."""

MAX_BLOCK = 512 << 10
"""Most decompressed bytes produced per block (gzip traces inflate 20x).  Below the 1 MiB mmap
threshold ``perfsight.heap`` sets, so a block's memory comes from the heap and is reused by the next
one; a 2 MiB block was a fresh mapping each time, faulted in page by page and unmapped when freed:
with it, reading df_index_resolver took 0.20 s of CPU, with 512 KiB 0.16 (docs/BENCHMARKS.md).  The
native scanner's batches go on across blocks, so smaller blocks do not mean more batches."""

BATCH_BYTES = 16 << 20
"""Decompressed bytes of complete events handed on per batch: bounds peak memory."""

_QUOTE, _BACKSLASH, _OPEN, _CLOSE, _COMMA = 1, 2, 3, 4, 5
_LUT = np.zeros(256, dtype=np.uint8)
_LUT[ord('"')] = _QUOTE
_LUT[ord("\\")] = _BACKSLASH
_LUT[ord("{")] = _OPEN
_LUT[ord("[")] = _OPEN
_LUT[ord("}")] = _CLOSE
_LUT[ord("]")] = _CLOSE
_LUT[ord(",")] = _COMMA


class NotATraceError(ValueError):
    """The file is not a Chrome-trace JSON document (wrong format, empty, binary)."""


@dataclasses.dataclass
class StreamReport:
    """What the stream saw besides events: the document's other keys and any damage."""

    header: dict[str, Any] = dataclasses.field(default_factory=dict)
    events: int = 0
    truncated: bool = False  # the file ended inside the event array
    damage_offset: int | None = None  # decompressed byte offset where parsing stopped
    problem: str | None = None  # one line describing the damage
    compression: inflate.Damage | None = None  # damage to the gzip container (bytes before it are kept)
    invalid_utf8: int = 0  # invalid UTF-8 sequences replaced by U+FFFD (the decompressing thread)
    lone_surrogates: int = 0  # \ud800-style escapes replaced by U+FFFD (the scanning thread)

    @property
    def replaced(self) -> int:
        """Invalid UTF-8 sequences and lone surrogates replaced by U+FFFD.  Two counters, each
        added to by one thread only: one ``+=`` from each thread on the same attribute could lose
        an update (the read and the write of an attribute are separate steps between threads)."""
        return self.invalid_utf8 + self.lone_surrogates


@dataclasses.dataclass
class EventBatch:
    """Complete events, back to back, separated by whitespace only."""

    data: bytes
    ends: np.ndarray  # offsets (exclusive) of each event's end within data
    offset: int  # decompressed offset of data[0] in the file


def _decompressed_blocks(handle: BinaryIO, report: StreamReport) -> Iterator[bytes]:
    """Decompressed blocks of a plain or gzip file, as valid UTF-8 (see :func:`_valid_utf8`); damage
    to the gzip container stops them after every byte that precedes it and is noted in ``report``.
    Closes ``handle`` when done or closed."""

    def noted(damage: inflate.Damage) -> None:
        report.compression = damage

    return _valid_utf8(inflate.blocks(handle, READ_BLOCK, MAX_BLOCK, noted), report)


_REPAIRS = threading.local()


def _count_replacement(error: UnicodeError) -> tuple[str, int]:
    _REPAIRS.count = getattr(_REPAIRS, "count", 0) + 1
    return "\ufffd", error.end  # type: ignore[attr-defined]


codecs.register_error("perfsight-count-replace", _count_replacement)


def _valid_utf8(blocks: Iterator[bytes], report: StreamReport) -> Iterator[bytes]:
    """``blocks`` with each invalid UTF-8 sequence replaced by U+FFFD, counted in ``report.invalid_utf8``.

    Why here, before any parsing: one stray byte in a name made the native scanner hand the
    rest to the portable path, which let it into Arrow strings that failed later, far from the
    file.  Replacing it keeps the event, on both paths alike.  ASCII blocks (most of a trace)
    pass untouched; others are decoded incrementally, so a character cut by a block boundary
    is not mistaken for damage.
    """
    decoder = None
    try:
        for block in blocks:
            if (decoder is None or not decoder.getstate()[0]) and block.isascii():
                yield block
                continue
            if decoder is None:
                try:
                    block.decode()
                    yield block
                    continue
                except UnicodeDecodeError:
                    decoder = codecs.getincrementaldecoder("utf-8")("perfsight-count-replace")
            _REPAIRS.count = 0
            text = decoder.decode(block)
            report.invalid_utf8 += _REPAIRS.count
            yield text.encode()
        if decoder is not None:
            _REPAIRS.count = 0
            text = decoder.decode(b"", final=True)
            report.invalid_utf8 += _REPAIRS.count
            if text:
                yield text.encode()
    finally:
        close = getattr(blocks, "close", None)
        if close is not None:
            close()


PREFETCH_BLOCKS = 4
"""Decompressed blocks the reading thread may hold ready: bounds its memory (2 MiB).  As many as
the native scanner takes at a time (``chrome_events.WINDOW_BLOCKS``): with one, the scanning thread
waited for the decompression of three blocks of every four, and reading df_index_resolver took
0.126 s instead of 0.113 (docs/BENCHMARKS.md)."""

_DONE = object()
_STOP_POLL_S = 0.05
"""How often a producer blocked on a full queue looks whether its consumer has stopped."""


@dataclasses.dataclass
class _Failed:
    error: BaseException


def prefetched(items: Iterator[T], depth: int, name: str) -> Generator[T, None, None]:
    """Iterate ``items`` on a background thread named ``name``, at most ``depth`` items ahead of
    the consumer, so that producing the next item overlaps with using this one.

    What makes it safe to put anywhere in a reader: an error raised by ``items`` is re-raised in
    the consumer, in order, after the items before it; a consumer that stops early (``close()``,
    a ``break`` followed by ``close()``, an exception) stops the producer, which closes ``items``
    on its own thread, and is joined before ``close()`` returns -- no thread outlives the
    iterator, and nothing waits forever (a producer blocked on the full queue is freed by the
    consumer emptying it).  Memory: ``depth`` items queued, one being made, one in use.
    """
    ready: queue.Queue[Any] = queue.Queue(maxsize=depth)
    stop = threading.Event()

    def put(item: Any) -> bool:
        while not stop.is_set():
            try:
                ready.put(item, timeout=_STOP_POLL_S)
                return True
            except queue.Full:
                continue
        return False

    def work() -> None:
        try:
            for item in items:
                if not put(item):
                    break
            else:
                put(_DONE)
        except BaseException as exc:  # noqa: BLE001 - handed to the consumer, which re-raises it
            put(_Failed(exc))
        finally:
            close = getattr(items, "close", None)
            if close is not None:
                close()

    worker = threading.Thread(target=work, name=name, daemon=True)
    worker.start()
    try:
        while True:
            item = ready.get()
            if item is _DONE:
                return
            if isinstance(item, _Failed):
                raise item.error
            yield item
    finally:
        stop.set()
        while worker.is_alive():  # free a producer blocked on the full queue, then wait for it
            with contextlib.suppress(queue.Empty):
                ready.get_nowait()
            worker.join(_STOP_POLL_S)


class _Scanner:
    """Carries string/escape/depth state of the structural scan across blocks."""

    def __init__(self) -> None:
        self.in_string = False
        self.backslash_run = 0  # trailing backslashes of the previous block
        self.depth = 0  # 0 = directly inside the event array

    def scan(self, block: np.ndarray) -> tuple[np.ndarray, np.ndarray, int | None]:
        """Return (event end offsets, top-level comma offsets, array end offset or None)."""
        codes = _LUT[block]
        pos = np.flatnonzero(codes)
        kinds = codes[pos]
        quote_mask = kinds == _QUOTE
        if np.any(kinds == _BACKSLASH) or self.backslash_run:
            quote_idx = np.flatnonzero(quote_mask)
            quote_mask[quote_idx[self._escaped(block, pos[quote_idx])]] = False
        else:
            self.backslash_run = 0
        # a structural character is inside a string when an odd number of real quotes precede it
        quotes_so_far = np.cumsum(quote_mask) - quote_mask
        inside = ((quotes_so_far + int(self.in_string)) & 1).astype(bool)
        self.in_string = bool((int(quote_mask.sum()) + int(self.in_string)) & 1)
        structural = ~inside & ~quote_mask & (kinds != _BACKSLASH)
        spos = pos[structural]
        skind = kinds[structural]
        step = np.where(skind == _OPEN, 1, np.where(skind == _CLOSE, -1, 0)).astype(np.int64)
        depth_after = self.depth + np.cumsum(step)
        array_end = None
        closes_array = np.flatnonzero((skind == _CLOSE) & (depth_after < 0))
        if len(closes_array):
            first = closes_array[0]
            array_end = int(spos[first])
            spos, skind, depth_after = spos[:first], skind[:first], depth_after[:first]
        ends = spos[(skind == _CLOSE) & (depth_after == 0)] + 1
        commas = spos[(skind == _COMMA) & (depth_after == 0)]
        if len(depth_after):
            self.depth = int(depth_after[-1])
        return ends, commas, array_end

    def _escaped(self, block: np.ndarray, quotes: np.ndarray) -> np.ndarray:
        """True for quotes preceded by an odd run of backslashes (runs may span blocks)."""
        is_bs = block == ord("\\")
        # length of the backslash run ending just before each quote
        idx = np.arange(len(block), dtype=np.int64)
        last_non_bs = np.maximum.accumulate(np.where(is_bs, -1, idx))
        run_before = np.zeros(len(quotes), dtype=np.int64)
        has_prev = quotes > 0
        prev = quotes[has_prev] - 1
        run_before[has_prev] = np.where(is_bs[prev], prev - last_non_bs[prev], 0)
        # a run that starts at the block's first byte continues the previous block's run
        starts_at_zero = has_prev.copy()
        starts_at_zero[has_prev] = last_non_bs[prev] < 0
        run_before[starts_at_zero] += self.backslash_run
        run_before[~has_prev] = self.backslash_run
        tail = len(block) - 1 - int(last_non_bs[-1]) if len(block) else 0
        self.backslash_run = tail + (self.backslash_run if tail == len(block) else 0)
        return (run_before & 1).astype(bool)


class _KinetoLineScanner:
    """Fast path for Kineto's own pretty-printing, where every event closes on a line
    that starts ``  }`` (reading ``  },``, the last one ``  }``).  JSON strings cannot hold
    a raw newline, so such a line is always structural.  Blocks must end at a newline."""

    @staticmethod
    def applies(body_head: bytes) -> bool:
        """True when the first event opens on its own line indented by two spaces."""
        stripped = body_head.lstrip(b" \t\r\n")
        lead = body_head[: len(body_head) - len(stripped)]
        return stripped.startswith(b"{\n") and lead.endswith(b"\n  ")

    def __init__(self) -> None:
        self.after_last = False  # saw the last event's closing line; the array's "]" is next

    def scan(self, block: np.ndarray) -> tuple[np.ndarray, np.ndarray, int | None]:
        none = np.zeros(0, dtype=np.int64)
        if self.after_last:
            return none, none, _first_closing_bracket(block, 0)
        closes = np.flatnonzero(block == ord("}"))
        closes = closes[closes >= 2]  # one at the very end: a file cut just after an event
        line_start = closes - 2
        ok = (block[line_start] == 0x20) & (block[line_start + 1] == 0x20)
        ok &= (line_start == 0) | (block[np.maximum(line_start - 1, 0)] == 0x0A)
        closes = closes[ok]
        after = block[np.minimum(closes + 1, len(block) - 1)].copy()
        after[closes + 1 >= len(block)] = 0  # nothing follows: not a comma, not the last line
        commas = closes[(after == ord(",")) & (block[np.minimum(closes + 2, len(block) - 1)] == 0x0A)] + 1
        # a "}" opening its line after two spaces closes an event whatever follows it: damage
        # right after an event (a flipped comma) belongs to the next event, never to this one
        ends = closes + 1
        last = closes[after == 0x0A]  # a line that reads exactly "  }": the last event
        if not len(last):
            return ends, commas, None
        end = int(last[0]) + 1
        ends = np.append(ends[ends < end], end)
        commas = commas[commas < end]
        self.after_last = True
        return ends, commas, _first_closing_bracket(block, end)


def _first_closing_bracket(block: np.ndarray, start: int) -> int | None:
    """Offset of the array's closing bracket when only whitespace precedes it from ``start``."""
    rest = bytes(block[start:])
    body = rest.lstrip()
    if body[:1] == b"]":
        return start + len(rest) - len(body)
    return None


def _line_aligned(blocks: Iterator[bytes]) -> Iterator[bytes]:
    """Re-cut blocks so that each ends just after a newline (the fast scanner needs whole lines)."""
    carry = b""
    for block in blocks:
        cut = block.rfind(b"\n")
        if cut < 0:
            carry += block
            continue
        yield carry + block[: cut + 1]
        carry = block[cut + 1 :]
    if carry:
        yield carry


_SPACE = re.compile(rb"[ \t\r\n\x0b\x0c]*")
"""What ``bytes.lstrip()`` strips; matched in place, since stripping copies the whole buffer."""


def _find_array_start(buffer: bytes) -> tuple[int, bool] | None:
    """Offset just after the event array's ``[``, and whether the document is a bare array."""
    lead = _SPACE.match(buffer).end()  # type: ignore[union-attr]
    if lead == len(buffer):
        return None
    if buffer[lead : lead + 1] == b"[":
        return lead + 1, True
    if buffer[lead : lead + 1] != b"{":
        raise NotATraceError("does not start with a JSON object or array")
    key = buffer.find(b'"traceEvents"')
    if key < 0:
        return None
    colon = buffer.find(b":", key + len(b'"traceEvents"'))
    if colon < 0:
        return None
    body = _SPACE.match(buffer, colon + 1).end()  # type: ignore[union-attr]
    if body == len(buffer):
        return None
    if buffer[body : body + 1] != b"[":
        raise NotATraceError('"traceEvents" is not an array')
    return body + 1, False


_HEADER_LIMIT = 64 << 20


@dataclasses.dataclass
class EventStream:
    """An open trace positioned just inside its event array.

    ``first`` (at decompressed offset ``offset``) and then ``blocks`` are the rest of the
    decompressed document.  Consume it either with :meth:`batches` (split here) or by
    scanning the blocks yourself and calling :meth:`finish` or :meth:`cut_short` at the end.
    """

    first: bytes
    offset: int
    blocks: Iterator[bytes]
    bare: bool
    header_text: bytes
    report: StreamReport

    def batches(self, first: bytes | None = None, offset: int | None = None) -> Iterator[EventBatch]:
        """Complete events from ``first`` (an event boundary; default: the array start) on."""
        if first is None:
            first, offset = self.first, self.offset
        assert offset is not None
        return _batches(self, first, offset)

    def finish(self, trailer: bytes, rest: Iterator[bytes] | None = None) -> None:
        """The array ended; ``trailer`` is what followed its ``]``, ``rest`` the blocks after it."""
        for block in self.blocks if rest is None else rest:
            if len(trailer) > _HEADER_LIMIT:
                break
            trailer += block
        self.close()
        self.report.header = _parse_header(self.header_text, trailer, self.bare)

    def cut_short(self, offset: int, leftover: bytes) -> None:
        """The file ended inside the array; ``leftover`` (at ``offset``) is a cut event, if any."""
        self.close()
        leftover = leftover.strip()
        report = self.report
        report.truncated = True
        report.damage_offset = offset
        report.problem = f"the event array stops after {report.events} complete events" + (
            f"; {len(leftover)} bytes of a cut event were dropped" if leftover else ""
        )
        report.header = _parse_header(self.header_text, b"", self.bare)

    def abandon(self) -> None:
        """The caller stops early (damage): close, and keep what the header says."""
        self.close()
        self.report.header = _parse_header(self.header_text, b"", self.bare)

    def close(self) -> None:
        close = getattr(self.blocks, "close", None)
        if close is not None:
            close()


def open_events(path: Path) -> EventStream:
    """Open ``path`` and position it at the start of its event array.

    Raises :class:`NotATraceError` at once if the file does not look like a trace.
    """
    report = StreamReport()
    handle = open(path, "rb")  # noqa: SIM115 - closed by the block generator
    blocks = _decompressed_blocks(handle, report)
    prefix = b""
    start: tuple[int, bool] | None = None
    try:
        for block in blocks:
            prefix += block
            start = _find_array_start(prefix)
            if start is not None or len(prefix) > _HEADER_LIMIT:
                break
    except NotATraceError:
        blocks.close()
        raise
    except OSError as exc:
        blocks.close()
        raise NotATraceError(f"cannot be read: {exc}") from exc
    if start is None:
        blocks.close()
        if report.compression is not None:
            raise NotATraceError(f"{report.compression.message}, before its event array begins")
        if not prefix.strip():
            raise NotATraceError("is empty")
        if b'"traceEvents"' not in prefix and prefix.lstrip()[:1] == b"{":
            raise NotATraceError('has no "traceEvents" array')
        raise NotATraceError("ends before its event array begins")
    body_start, bare = start
    return EventStream(
        first=prefix[body_start:],
        offset=body_start,
        blocks=prefetched(blocks, PREFETCH_BLOCKS, "perfsight-decompress"),
        bare=bare,
        header_text=prefix[:body_start],
        report=report,
    )


def stream_events(path: Path) -> tuple[Iterator[EventBatch], StreamReport]:
    """Open ``path`` and return (batches of complete events, report filled as they stream).

    Raises :class:`NotATraceError` at once if the file does not look like a trace.
    """
    stream = open_events(path)
    return stream.batches(), stream.report


def _batches(stream: EventStream, first: bytes, first_offset: int) -> Iterator[EventBatch]:
    report = stream.report
    kineto_layout = _KinetoLineScanner.applies(first[:256])
    scanner: _Scanner | _KinetoLineScanner = _KinetoLineScanner() if kineto_layout else _Scanner()
    blocks = _chain(first, stream.blocks)
    source = _line_aligned(blocks) if kineto_layout else blocks
    pending = bytearray()  # bytes not yet handed on, starting at an event boundary
    pending_offset = first_offset  # file offset of pending[0]
    pending_ends: list[np.ndarray] = []  # event ends found in pending, relative to pending[0]

    def emit() -> EventBatch:
        nonlocal pending, pending_offset, pending_ends
        ends = np.concatenate(pending_ends)
        cut = int(ends[-1])
        batch = EventBatch(data=bytes(pending[:cut]), ends=ends, offset=pending_offset)
        del pending[:cut]
        pending_offset += cut
        pending_ends = []
        report.events += len(ends)
        return batch

    try:
        for block in source:
            ends, commas, array_end = scanner.scan(np.frombuffer(block, dtype=np.uint8))
            base = len(pending)
            pending += block
            if len(commas):
                np.frombuffer(pending, dtype=np.uint8)[base + commas] = 0x20
            if len(ends):
                pending_ends.append(base + ends.astype(np.int64))
            if array_end is not None:
                trailer = bytes(pending[base + array_end + 1 :])
                del pending[base + array_end :]
                if pending_ends:
                    yield emit()
                stream.finish(trailer, source)
                return
            if pending_ends and len(pending) >= BATCH_BYTES:
                yield emit()
        if pending_ends:
            yield emit()
        stream.cut_short(pending_offset, bytes(pending))
    finally:
        stream.close()


def _chain(first: bytes, rest: Iterator[bytes]) -> Iterator[bytes]:
    if first:
        yield first
    yield from rest


def _parse_header(header_text: bytes, trailer: bytes, bare: bool) -> dict[str, Any]:
    """The document's keys other than traceEvents, best effort (damage leaves them partial)."""
    if bare:
        return {}
    text = header_text + b"]" + trailer
    try:
        doc = orjson.loads(text)
        if isinstance(doc, dict):
            doc.pop("traceEvents", None)
            return doc
    except orjson.JSONDecodeError:
        pass
    # trailer missing or cut: the header alone, closed by hand
    try:
        doc = orjson.loads(header_text + b"]}")
        if isinstance(doc, dict):
            doc.pop("traceEvents", None)
            return doc
    except orjson.JSONDecodeError:
        pass
    return {}
