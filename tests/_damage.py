"""Damaged copies of real traces, and the oracle of what a reader must keep from them.

The oracle is independent of perfsight's reader: the standard library's JSON decoder walks the
original event array and records where each event starts and ends (in bytes of the
decompressed text) and its X-event identity (name, start and duration in exact nanoseconds).
A copy damaged from byte N on must keep every complete X event that ends at or before N.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gzip
import json
import zlib
from collections import Counter
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

from perfsight.ingest import eventscan

SliceKey = tuple[str, int, int]


def nanos(micros: Any) -> int:
    return int(Decimal(str(micros)) * 1000)


@dataclasses.dataclass
class Original:
    """One intact trace: its decompressed text and where each event of its array lies."""

    text: bytes
    ends: list[int]  # byte offset just after each event
    starts: list[int]  # byte offset of each event's "{"
    slices: list[SliceKey | None]  # the event's identity if it is an X event, else None
    array_end: int  # offset of the array's "]"
    memory: list[tuple[int, int] | None]  # (ts ns, Bytes) of a "[memory]" event, else None

    @classmethod
    def of(cls, text: bytes) -> Original:
        decoder = json.JSONDecoder(parse_float=Decimal)
        source = text.decode("utf-8")
        key = source.index('"traceEvents"')
        pos = source.index("[", key) + 1
        starts, ends, slices, memory = [], [], [], []
        byte = len(source[:pos].encode())
        while True:
            while source[pos] in " \t\r\n,":
                byte += 1
                pos += 1
            if source[pos] == "]":
                break
            event, end = decoder.raw_decode(source, pos)
            starts.append(byte)
            byte += len(source[pos:end].encode())
            ends.append(byte)
            pos = end
            is_x = isinstance(event, dict) and event.get("ph") == "X"
            slices.append((event["name"], nanos(event["ts"]), nanos(event["dur"])) if is_x else None)
            is_memory = isinstance(event, dict) and event.get("ph") == "i" and event.get("name") == "[memory]"
            memory.append((nanos(event["ts"]), event["args"]["Bytes"]) if is_memory else None)
        return cls(text=text, ends=ends, starts=starts, slices=slices, array_end=byte, memory=memory)

    def slices_before(self, offset: int) -> Counter[SliceKey]:
        """X events that end at or before ``offset`` (the damage), by identity."""
        return Counter(s for s, end in zip(self.slices, self.ends, strict=True) if s and end <= offset)

    def memory_before(self, offset: int) -> Counter[tuple[int, int]]:
        """Allocator events that end at or before ``offset``, by (ts ns, bytes)."""
        return Counter(m for m, end in zip(self.memory, self.ends, strict=True) if m and end <= offset)

    @property
    def all_slices(self) -> Counter[SliceKey]:
        return Counter(s for s in self.slices if s)


def read_original(path: Path) -> Original:
    return Original.of(gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes())


def inflated_prefix(compressed: bytes, cut: int) -> int:
    """How many bytes of content the first ``cut`` bytes of a one-member gzip file inflate to (by
    zlib): damage from compressed byte ``cut`` on cannot touch them."""
    return len(zlib.decompressobj(wbits=31).decompress(compressed[:cut]))


def slice_list(trace: Any) -> list[SliceKey]:
    """The trace's slices by identity, in file order."""
    s = trace.slices
    return list(
        zip(
            s.column("name").to_pylist(),
            s.column("start_ns").to_pylist(),
            s.column("dur_ns").to_pylist(),
            strict=True,
        )
    )


def memory_keys(trace: Any) -> Counter[tuple[int, int]]:
    m = trace.memory
    return Counter(zip(m.column("ts_ns").to_pylist(), m.column("bytes").to_pylist(), strict=True))


def slice_keys(trace: Any) -> Counter[SliceKey]:
    return Counter(slice_list(trace))


@contextlib.contextmanager
def reader_path(native: bool) -> Iterator[None]:
    """Read with the native scanner (skipped by the caller when it is not built) or the portable
    path, the way the tests of the two paths switch (``eventscan.use_library``)."""
    default = Path(eventscan.__file__).parent
    had = eventscan.available()
    if not native:
        eventscan.use_library(None)
    try:
        yield
    finally:
        if had:
            eventscan.use_library(default)
