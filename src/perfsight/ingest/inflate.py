"""Decompress a plain or gzip trace file in blocks, keeping every byte that precedes damage.

A gzip file is one or more *members* (``cat a.gz b.gz`` is a valid gzip file whose content is
both), each a header, raw deflate data and a trailer holding the CRC-32 and length of what it
inflates to.  This module reads every member, checks each trailer itself, and when something is
wrong says what (:class:`Damage`) instead of raising:

* the file ends inside a member (a cut file): everything inflated so far is yielded;
* a deflate block is corrupt: everything inflated before the corrupt bit is yielded;
* a trailer does not match (a flipped CRC byte): every byte was inflated and yielded already;
* bytes after the last member are not gzip: ignored, and said.

Why not simply catch the decompressor's error: a decompressor that raises drops the output of
the call that raised (up to ``max_block`` bytes, thousands of intact events).  The fast path
(ISA-L, raw deflate) runs in large calls; only when it stops short is the member inflated again
with zlib from its start, in small steps and byte by byte near the fault, to recover exactly
what precedes it.  That costs one more pass over one member, on damaged files only.

This module knows nothing about JSON.
"""

from __future__ import annotations

import dataclasses
import zlib
from collections.abc import Callable, Iterator
from typing import BinaryIO

try:  # ISA-L's inflate: the same output as zlib's, in a third of the CPU time
    from isal import isal_zlib as _fast

    _FAST_ERRORS: tuple[type[Exception], ...] = (zlib.error, _fast.error)
except ImportError:  # pragma: no cover - isal is a dependency; platforms without a wheel fall back
    _fast = zlib  # type: ignore[assignment]
    _FAST_ERRORS = (zlib.error,)

_crc32 = getattr(_fast, "crc32", zlib.crc32)  # ISA-L's: 10x zlib's (2 ms for a 54 MB trace)

GZIP_MAGIC = b"\x1f\x8b"

_FTEXT, _FHCRC, _FEXTRA, _FNAME, _FCOMMENT = 1, 2, 4, 8, 16

FEED_BYTES = 1 << 16
"""Compressed bytes given to the inflater per call.  Why not the whole read: a call that stops at
its output limit copies the input it did not use into ``unconsumed_tail``, so a 3 MB member fed at
once was copied again at every output block (tens of MB, each copy a fresh mapping past the
1 MiB mmap threshold of ``perfsight.heap``): two thirds of the decompression's CPU."""

SALVAGE_STEP = 4096
"""Compressed bytes fed per call while recovering a damaged member (then byte by byte near the
fault): bounds the output lost to a raising call to what one compressed byte inflates to."""


@dataclasses.dataclass
class Damage:
    """What went wrong with the compressed container (None in a report: nothing)."""

    kind: str  # "truncated", "corrupt", "crc", "length", "header", "trailing"
    message: str  # one line for a user, without the file name


class _BadHeader(Exception):
    pass


def _header_length(data: bytes) -> int | None:
    """Length of the gzip member header at the start of ``data``; None if ``data`` is too short.
    Raises :class:`_BadHeader` when it is not a gzip header perfsight can inflate."""
    if len(data) < 10:
        if data[: len(GZIP_MAGIC)] != GZIP_MAGIC[: len(data)]:
            raise _BadHeader("not a gzip member")
        return None
    if data[:2] != GZIP_MAGIC:
        raise _BadHeader("not a gzip member")
    if data[2] != 8:
        raise _BadHeader(f"unknown compression method {data[2]}")
    flags = data[3]
    if flags & 0xE0:
        raise _BadHeader(f"reserved header flags set ({flags:#04x})")
    pos = 10
    if flags & _FEXTRA:
        if len(data) < pos + 2:
            return None
        pos += 2 + int.from_bytes(data[pos : pos + 2], "little")
    for flag in (_FNAME, _FCOMMENT):
        if flags & flag:
            end = data.find(b"\x00", pos)
            if end < 0:
                return None
            pos = end + 1
    if flags & _FHCRC:
        pos += 2
    return pos if len(data) >= pos else None


def blocks(
    handle: BinaryIO,
    read_block: int,
    max_block: int,
    on_damage: Callable[[Damage], None],
) -> Iterator[bytes]:
    """Yield the decompressed content of ``handle`` (gzip when it starts with gzip's magic bytes,
    else as it is) in blocks of at most ``max_block`` bytes, reading ``read_block`` bytes at a time.

    Never raises for bad data: ``on_damage`` is called once with what was wrong, and the blocks
    stop after everything that precedes the damage.  Closes ``handle``.
    """
    with handle:
        head = handle.read(read_block)
        if head[:2] != GZIP_MAGIC:
            chunk = head
            while chunk:
                yield chunk
                chunk = handle.read(read_block)
            return
        yield from _Members(handle, head, read_block, max_block, on_damage).run()


class _Members:
    """Inflates the members of one gzip file; ``pending`` holds the compressed bytes read but not
    yet used (they end at the file position, so ``pending[0]`` is at ``tell() - len(pending)``)."""

    def __init__(
        self,
        handle: BinaryIO,
        head: bytes,
        read_block: int,
        max_block: int,
        on_damage: Callable[[Damage], None],
    ) -> None:
        self.handle = handle
        self.pending = head
        self.read_block = read_block
        self.max_block = max_block
        self.on_damage = on_damage

    def _more(self) -> bool:
        chunk = self.handle.read(self.read_block)
        self.pending += chunk
        return bool(chunk)

    def run(self) -> Iterator[bytes]:
        member = 0
        while True:
            member += 1
            try:
                length = _header_length(self.pending)
                while length is None:
                    if not self._more():
                        message = f"the file ends inside the header of gzip member {member}"
                        self.on_damage(Damage("truncated", message))
                        return
                    length = _header_length(self.pending)
            except _BadHeader as exc:
                if member > 1 and not self.pending.strip(b"\x00") and not self._rest_has_data():
                    return  # zero padding after the last member, as some writers leave
                if member == 1:
                    self.on_damage(Damage("header", f"gzip header: {exc}"))
                else:
                    message = f"the bytes after gzip member {member - 1} are not gzip data ({exc}); ignored"
                    self.on_damage(Damage("trailing", message))
                return
            self.pending = self.pending[length:]
            ended_well = yield from self._member(member)
            if not ended_well or (not self.pending and not self._more()):
                return

    def _rest_has_data(self) -> bool:
        while self._more():
            if self.pending.strip(b"\x00"):
                return True
        return False

    def _member(self, member: int) -> Iterator[bytes]:
        """Inflate one member whose deflate data starts at ``pending``; True when it ended well
        (its trailer read, whether or not it matched)."""
        start = self.handle.tell() - len(self.pending)
        inflater = _fast.decompressobj(wbits=-15)
        crc, size = 0, 0
        data, self.pending = memoryview(self.pending), b""
        fed = 0  # data[:fed] has been given to the inflater
        try:
            while not inflater.eof:
                while fed < len(data) and not inflater.eof:  # FEED_BYTES at a time: see there why
                    chunk, fed = data[fed : fed + FEED_BYTES], min(fed + FEED_BYTES, len(data))
                    while chunk and not inflater.eof:
                        out = inflater.decompress(chunk, self.max_block)
                        chunk = inflater.unconsumed_tail
                        if out:
                            crc = _crc32(out, crc)
                            size += len(out)
                            yield out
                if not inflater.eof:
                    data, fed = memoryview(self.handle.read(self.read_block)), 0
                    if not data:
                        break
        except _FAST_ERRORS:
            pass
        if not inflater.eof:  # cut or corrupt: inflate again with zlib, exactly up to the fault
            fault = yield from self._salvage(start, size)
            if fault is None:
                message = f"the file ends inside gzip member {member} (truncated)"
                self.on_damage(Damage("truncated", message))
            else:
                offset, reason = fault
                message = f"gzip member {member} is corrupt at compressed byte {offset} ({reason})"
                self.on_damage(Damage("corrupt", message))
            return False
        self.pending = inflater.unused_data + data[fed:]  # what follows the member, in file order
        while len(self.pending) < 8:
            if not self._more():
                message = f"the file ends inside the trailer of gzip member {member} (its data was all read)"
                self.on_damage(Damage("truncated", message))
                return False
        stored_crc = int.from_bytes(self.pending[:4], "little")
        stored_size = int.from_bytes(self.pending[4:8], "little")
        self.pending = self.pending[8:]
        if stored_crc != crc & 0xFFFFFFFF:
            message = f"gzip member {member} fails its CRC-32 check (the data may have been altered)"
            self.on_damage(Damage("crc", message))
        elif stored_size != size & 0xFFFFFFFF:
            message = f"gzip member {member} fails its length check ({size} bytes inflated)"
            self.on_damage(Damage("length", message))
        return True

    def _salvage(self, start: int, skip: int) -> Iterator[bytes]:
        """Inflate the deflate data at file offset ``start`` again with zlib, yielding what comes
        after the first ``skip`` bytes (already yielded) up to the fault; returns (file offset of
        the faulty byte, zlib's reason), or None when the data simply ends (the file was cut)."""
        self.handle.seek(start)
        inflater = zlib.decompressobj(wbits=-15)
        offset = start

        def fresh(out: bytes) -> bytes:
            nonlocal skip
            keep = out[skip:] if skip else out
            skip = max(0, skip - len(out))
            return keep

        while not inflater.eof:
            chunk = self.handle.read(SALVAGE_STEP)
            if not chunk:
                out = fresh(inflater.flush())
                if out:
                    yield out
                return None
            saved = inflater.copy()
            try:
                out = fresh(inflater.decompress(chunk))
                offset += len(chunk)
            except zlib.error:
                inflater = saved
                for i in range(len(chunk)):
                    try:
                        out = fresh(inflater.decompress(chunk[i : i + 1]))
                    except zlib.error as exc:
                        return offset, str(exc).removeprefix("Error -3 while decompressing data: ")
                    offset += 1
                    if out:
                        yield out
                continue
            if out:
                yield out
        return offset, "the fast decompressor stopped where zlib did not"
