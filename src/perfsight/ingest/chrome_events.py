"""Parse the event array of a Chrome trace into flat raw Arrow tables.

Every event whose phase the reader uses (:data:`KEPT_PHASES`) becomes one row of
:data:`RAW_SCHEMA`: the event's own fields, times as exact integer nanoseconds,
and the ``args`` keys of :data:`ARG_FIELDS` as ``args.<key>`` columns.  Other
keys and other events are validated but never converted.

Two paths give the same rows:

* native -- the C scanner of :mod:`perfsight.ingest.eventscan` splits and
  converts the decompressed blocks in one pass, without the GIL;
* portable -- :mod:`perfsight.ingest.jsonstream` splits the array into batches
  that ``pyarrow.json`` parses in C++ against an explicit schema.

On both, an event whose values do not fit their columns (Kineto's
``"pid": "Spans"`` is foreseen by the columns; a TensorList's deeper ``Input
Dims``, a decimal-string timestamp on the portable path) is decoded alone with
``orjson`` and coerced.  An event that is not valid JSON marks the damage point:
everything before it is kept, the rest is dropped, and the caller is told
where.  Timestamps are read as exact decimals of microseconds, so
nanosecond-resolution traces lose nothing.

Valid JSON that ``orjson`` refuses -- a lone surrogate escape (``"\\ud800"``), a number
past a double's range (``1e400``) -- is decoded by the standard library instead; each lone
surrogate becomes U+FFFD and is counted in the report (never damage).  A value that is not a
number where one is expected, or one out of range, becomes null here; what that means for
the event is the reader's rule (see :mod:`perfsight.ingest.kineto`).
"""

from __future__ import annotations

import dataclasses
import decimal
import io
import json
import re
from collections.abc import Generator, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pj

from perfsight.ingest import eventscan
from perfsight.ingest.eventscan import ColumnSpec
from perfsight.ingest.jsonstream import EventBatch, EventStream, StreamReport, open_events, prefetched

_DIMS = pa.list_(pa.list_(pa.int64()))
_TIME = pa.decimal128(24, 3)

ARG_FIELDS: dict[str, pa.DataType] = {
    "External id": pa.int64(),
    "external id": pa.int64(),  # legacy Kineto
    "correlation": pa.int64(),
    "device": pa.int64(),
    "stream": pa.int64(),
    "Input Dims": _DIMS,
    "Input type": pa.list_(pa.string()),
    "Concrete Inputs": pa.list_(pa.string()),  # kept for model.CONCRETE_INPUT_OPS only
    "grid": pa.list_(pa.int64()),
    "block": pa.list_(pa.int64()),
    "est. achieved occupancy %": pa.float64(),
    "bytes": pa.int64(),
    # allocator events
    "Addr": pa.int64(),
    "Bytes": pa.int64(),
    "Total Allocated": pa.int64(),
    "Total Reserved": pa.int64(),
    "Total Active": pa.int64(),
    "Device Type": pa.int64(),
    "Device Id": pa.int64(),
    # communication metadata (record_param_comms, NCCL kernels)
    "Collective name": pa.string(),
    "In msg nelems": pa.int64(),
    "Out msg nelems": pa.int64(),
    "dtype": pa.string(),
    "Process Group Name": pa.string(),
    "Process Group Ranks": pa.string(),
    "Process Group ID": pa.int64(),
    "Seq": pa.int64(),
    "Src Rank": pa.int64(),
    "Dst Rank": pa.int64(),
    # metadata events
    "name": pa.string(),
    "labels": pa.string(),  # process_labels ("GPU 0", "CPU")
}
"""The ``args`` keys we read, with the type each has in well-formed Kineto output."""

KEPT_PHASES = "XiM"
"""Phases the reader uses: complete slices, instants (allocator events), metadata (names).
Flow arrows (``s``/``f``, a third of a Kineto file) are derived from correlation ids instead."""

FIELDS: list[ColumnSpec] = [
    ColumnSpec("ph", "ph", 0, pa.string()),
    ColumnSpec("cat", "cat", 0, pa.string()),
    ColumnSpec("name", "name", 0, pa.string()),
    ColumnSpec("pid", "pid", 0, pa.int64(), label="pid_label"),
    ColumnSpec("tid", "tid", 0, pa.int64(), label="tid_label"),
    ColumnSpec("ts_ns", "ts", 0, pa.int64(), micros=True),
    ColumnSpec("dur_ns", "dur", 0, pa.int64(), micros=True),
    # pid/tid that were strings ("Spans", "stream 7")
    ColumnSpec("pid_label", None, 0, pa.string()),
    ColumnSpec("tid_label", None, 0, pa.string()),
    *(ColumnSpec(f"args.{key}", key, 1, dtype) for key, dtype in ARG_FIELDS.items()),
]
"""The raw columns, where each comes from, and its type: the one list both paths follow."""

RAW_SCHEMA = pa.schema([(f.name, f.dtype) for f in FIELDS])
"""Columns of the raw event table, before normalisation into the trace model."""

_SMALL = 64
"""Below this many events a rejected batch is decoded event by event."""


@dataclasses.dataclass
class ParseResult:
    table: pa.Table  # RAW_SCHEMA rows of kept events, in file order
    damage_offset: int | None = None  # file offset of the first event that is not valid JSON
    problem: str | None = None
    replaced: int = 0  # lone surrogates replaced by U+FFFD in this table's events


SCAN_AHEAD = 1
"""Scanned batches the scanning thread may hold ready beyond the one it is scanning and the one
being converted: bounds memory (a batch is at most ``eventscan.Scanner.ROWS`` rows, a few MB, in
a scanner's work buffers)."""


def read_events(
    path: Path, native: bool | None = None
) -> tuple[Generator[ParseResult, None, None], StreamReport]:
    """Open ``path`` (raising :class:`~perfsight.ingest.jsonstream.NotATraceError` if it is not a
    trace) and return (parsed tables, in order; the stream report, complete once they are read).

    After a result with a ``problem`` nothing more comes.  ``native`` picks the path (default:
    the native scanner when it is built).  Close the results when stopping before their end: that
    stops the scanning thread.

    Native: the events are scanned on a thread of their own, a batch ahead of the caller (see
    :func:`~perfsight.ingest.jsonstream.prefetched`); the scan runs without the GIL, so it
    overlaps with the conversion of the batch before and with what the caller does with it (the
    Kineto reader's cut); docs/BENCHMARKS.md says what that saves.
    """
    stream = open_events(path)
    if native is None:
        native = eventscan.available()
    # the portable path stays on the caller's thread: pyarrow.json already parses on both cores,
    # and a thread of its own cost 5 % more wall time (docs/BENCHMARKS.md)
    results = _native(stream) if native else _portable(stream, stream.batches())
    return results, stream.report


def _portable(stream: EventStream, batches: Iterator[EventBatch]) -> Generator[ParseResult, None, None]:
    try:
        for batch in batches:
            result = parse_batch(batch)
            stream.report.lone_surrogates += result.replaced
            if result.problem:
                stream.abandon()
                yield result
                return
            yield result
    finally:
        stream.close()


@dataclasses.dataclass
class _Scanned:
    """A batch the scanning thread finished: its rows are still in ``scanner``'s work buffers,
    converted on the caller's thread (:meth:`eventscan.Scanner.table`) while the next is scanned."""

    scanner: eventscan.Scanner
    scan: eventscan.Scan
    slow_texts: list[bytes]  # the text of each slow row's event (the window moves on)
    slow_offsets: list[int]  # where each starts in the decompressed file


class _Scanners:
    """The scanners of one read.  A scanner whose rows were converted is free for the next batch;
    the scanning thread takes one (:meth:`take`), the converting thread gives it back
    (:meth:`give`): list operations, atomic under the GIL.  At most ``SCAN_AHEAD + 2`` exist."""

    def __init__(self) -> None:
        self.free: list[eventscan.Scanner] = []

    def take(self) -> eventscan.Scanner:
        try:
            return self.free.pop()
        except IndexError:
            return eventscan.idle_scanner(FIELDS, KEPT_PHASES)  # see there: why reused

    def give(self, scanner: eventscan.Scanner) -> None:
        self.free.append(scanner)

    def close(self) -> None:
        """Keep the free scanners for the next read (one not given back is simply dropped)."""
        while self.free:
            eventscan.keep_idle(self.free.pop())


def _native(stream: EventStream) -> Generator[ParseResult, None, None]:
    """Scan the decompressed blocks with the C scanner on a thread (:func:`_scanned`) and convert
    each batch here; text the scanner cannot place goes to the portable splitter from that event
    on (on the scanning thread), so damage is judged the same way on both paths."""
    scanners = _Scanners()
    produced = prefetched(_scanned(stream, scanners), SCAN_AHEAD, "perfsight-scan")
    try:
        for item in produced:
            if isinstance(item, ParseResult):  # the portable path's, after the scanner stopped
                yield item
                continue
            table = item.scanner.table()
            scanners.give(item.scanner)
            result = _with_slow_rows(item, table)
            if result.problem:
                produced.close()  # the scanning thread stops before the stream is abandoned
                stream.abandon()
                yield result
                return
            yield result
    finally:
        produced.close()
        scanners.close()


def _scanned(stream: EventStream, scanners: _Scanners) -> Iterator[_Scanned | ParseResult]:
    report = stream.report
    window, base, pos = eventscan.Window(stream.first), stream.offset, 0  # window[0] is at offset base
    blocks = iter(stream.blocks)
    scanner: eventscan.Scanner | None = scanners.take()
    resume = False
    try:
        while True:
            assert scanner is not None
            scan = scanner.run(window, pos, resume)
            report.events += scan.events
            report.lone_surrogates += scan.lone_surrogates
            pos = scan.pos
            more: list[bytes] = []
            if scan.status == eventscan.NEED_MORE:  # an event goes on in the next block
                more = _take(blocks, WINDOW_BLOCKS)
                if more and not len(scan.slow_rows):
                    # the batch goes on in the next block (see Scanner.run: why)
                    window.advance(pos, more)
                    base, pos, more, resume = base + pos, 0, [], True
                    continue
            resume = False
            if scanner.rows:
                spans = scan.slow_spans.tolist()
                batch = _Scanned(
                    scanner, scan, [window.bytes(a, b) for a, b in spans], [base + a for a, _ in spans]
                )
                scanner = None  # the caller converts it, then gives it back
                yield batch
                scanner = scanners.take()
            else:
                scanner.make_room()
            if scan.status == eventscan.FULL:
                continue
            if scan.status == eventscan.END:
                stream.finish(window.bytes(pos + 1))
                return
            if scan.status == eventscan.INVALID:
                yield from _portable(stream, stream.batches(window.bytes(pos), base + pos))
                return
            if not more:
                stream.cut_short(base + pos, window.bytes(pos))
                return
            window.advance(pos, more)
            base, pos, more = base + pos, 0, []
    finally:
        if scanner is not None:
            scanners.give(scanner)
        stream.close()


WINDOW_BLOCKS = 4
"""Decompressed blocks appended to the scanner's window at a time.  Why more than one: each
return from the scan takes the GIL back, which is a wait while the caller's thread runs Python
(the cut of the batch before); a 512 KiB block per call meant 133 returns for df_index_resolver."""


def _take(blocks: Iterator[bytes], count: int) -> list[bytes]:
    """The next ``count`` blocks, fewer at the end."""
    taken = []
    for block in blocks:
        taken.append(block)
        if len(taken) == count:
            break
    return taken


def _with_slow_rows(scanned: _Scanned, table: pa.Table) -> ParseResult:
    """Fill the rows of ``table`` the scanner could not convert by decoding those events one by one."""
    scan = scanned.scan
    if not len(scan.slow_rows):
        return ParseResult(table=table)
    rows = []
    for i, text in enumerate(scanned.slow_texts):
        try:
            rows.append(_coerce(_loads(text)[0]))  # lone surrogates: counted by the scanner
        except orjson.JSONDecodeError as exc:  # the scanner's JSON is stricter; this is a safety net
            keep = int(scan.slow_rows[i])
            head = _merge(table.slice(0, keep), scan.slow_rows[:i], rows)
            return ParseResult(head, scanned.slow_offsets[i], f"an event is not valid JSON ({exc})")
    return ParseResult(table=_merge(table, scan.slow_rows, rows))


def _merge(table: pa.Table, slow_rows: np.ndarray, rows: list[dict[str, Any] | None]) -> pa.Table:
    """``table`` with row ``slow_rows[j]`` replaced by ``rows[j]``."""
    if not len(slow_rows):
        return table
    n = table.num_rows
    order = np.arange(n, dtype=np.int64)
    order[slow_rows] = n + np.arange(len(slow_rows))
    return pa.concat_tables([table, _rows_table(rows)]).take(pa.array(order))


def parse_batch(batch: EventBatch) -> ParseResult:
    """Parse every event of ``batch`` (portable path); stop at the first undecodable one."""
    tables: list[pa.Table] = []
    replaced = [0]
    result = _parse_range(batch, 0, len(batch.ends), tables, replaced)
    table = pa.concat_tables(tables) if tables else RAW_SCHEMA.empty_table()
    return ParseResult(table=table, damage_offset=result[0], problem=result[1], replaced=replaced[0])


def _parse_range(
    batch: EventBatch, lo: int, hi: int, out: list[pa.Table], replaced: list[int]
) -> tuple[int | None, str | None]:
    start = int(batch.ends[lo - 1]) if lo else 0
    stop = int(batch.ends[hi - 1])
    try:
        out.append(_columnar(batch.data[start:stop]))
        return None, None
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        pass
    if hi - lo <= _SMALL:
        return _one_by_one(batch, lo, hi, out, replaced)
    mid = (lo + hi) // 2
    damage = _parse_range(batch, lo, mid, out, replaced)
    if damage[0] is not None:
        return damage
    return _parse_range(batch, mid, hi, out, replaced)


_JSON_SCHEMA = pa.schema(
    [
        ("ph", pa.string()),
        ("cat", pa.string()),
        ("name", pa.string()),
        ("pid", pa.int64()),
        ("tid", pa.int64()),
        ("ts", _TIME),
        ("dur", _TIME),
        ("args", pa.struct([pa.field(k, t) for k, t in ARG_FIELDS.items()])),
        ("pid_label", pa.string()),
        ("tid_label", pa.string()),
    ]
)
"""What pyarrow.json reads (portable path) before :func:`_flat` makes it RAW_SCHEMA."""

_PARSE = pj.ParseOptions(
    explicit_schema=_JSON_SCHEMA, unexpected_field_behavior="ignore", newlines_in_values=True
)
_READ = pj.ReadOptions(block_size=1 << 21)  # several blocks per batch, so both cores parse

_LABEL_KEYS = (
    (b'"pid": "', b'"pid_label": "'),
    (b'"pid":"', b'"pid_label":"'),
    (b'"tid": "', b'"tid_label": "'),
    (b'"tid":"', b'"tid_label":"'),
)
"""Chrome traces mix numeric and string pids/tids ("Spans", "stream 7").  A key followed by
an opening quote is a string-valued key in well-formed JSON (inside a string every quote
is escaped), so renaming it lets both kinds parse into typed columns."""


def _columnar(data: bytes) -> pa.Table:
    for old, new in _LABEL_KEYS:
        if old in data:
            data = data.replace(old, new)
    return _flat(pj.read_json(io.BytesIO(data), read_options=_READ, parse_options=_PARSE))


def _flat(parsed: pa.Table) -> pa.Table:
    """pyarrow.json's nested table -> RAW_SCHEMA rows of the kept phases."""
    parsed = parsed.filter(pc.is_in(parsed.column("ph"), pa.array(list(KEPT_PHASES))))
    args = parsed.column("args")
    columns = {
        "ph": parsed.column("ph"),
        "cat": parsed.column("cat"),
        "name": parsed.column("name"),
        "pid": parsed.column("pid"),
        "tid": parsed.column("tid"),
        "ts_ns": micros_to_ns(parsed.column("ts")),
        "dur_ns": micros_to_ns(parsed.column("dur")),
        "pid_label": parsed.column("pid_label"),
        "tid_label": parsed.column("tid_label"),
        **{f"args.{key}": pc.struct_field(args, key) for key in ARG_FIELDS},
    }
    return pa.table(columns, schema=RAW_SCHEMA)


def _one_by_one(
    batch: EventBatch, lo: int, hi: int, out: list[pa.Table], replaced: list[int]
) -> tuple[int | None, str | None]:
    rows = []
    for i in range(lo, hi):
        start = int(batch.ends[i - 1]) if i else 0
        text = batch.data[start : int(batch.ends[i])]
        try:
            event, lone = _loads(text)
            replaced[0] += lone
        except orjson.JSONDecodeError as exc:
            stripped = len(text) - len(text.lstrip())
            if rows:
                out.append(_rows_table(rows))
            return batch.offset + start + stripped, f"an event is not valid JSON ({exc})"
        row = _coerce(event)
        if row is not None:
            rows.append(row)
    if rows:
        out.append(_rows_table(rows))
    return None, None


_SURROGATE = re.compile("[\ud800-\udfff]")


def _loads(text: bytes) -> tuple[Any, int]:
    """One event decoded, and how many lone surrogates in it became U+FFFD.

    ``orjson`` first; what it refuses is tried with the standard library, which accepts all of
    JSON (lone surrogate escapes, numbers past a double's range) and nothing more here (its
    ``NaN``/``Infinity`` extensions are refused).  Raises ``orjson.JSONDecodeError`` (orjson's
    own) for text that is not JSON.
    """
    try:
        event, lone = orjson.loads(text), 0
    except orjson.JSONDecodeError as refused:
        try:
            event = json.loads(text.decode("utf-8"), parse_constant=_not_json)
        except (ValueError, RecursionError):
            raise refused from None
        event, lone = _without_surrogates(event)
    if isinstance(event, dict) and (_inexact(event.get("ts")) or _inexact(event.get("dur"))):
        # a double cannot hold 1712195495520924.289 us: read the times again as exact decimals
        exact = json.loads(text.decode("utf-8"), parse_float=decimal.Decimal, parse_constant=_not_json)
        event.update({key: exact[key] for key in ("ts", "dur") if key in exact})
    return event, lone


_EXACT_MICROS = 1e12
"""A double keeps 15 significant digits: the nanoseconds of times below 1e12 us (11 days) survive it."""


def _inexact(value: Any) -> bool:
    return isinstance(value, float) and not abs(value) < _EXACT_MICROS


def _without_surrogates(event: Any) -> tuple[Any, int]:
    """``event`` with each lone surrogate in its strings (keys too) replaced by U+FFFD, and how many."""
    count = [0]

    def clean(value: Any) -> Any:
        if isinstance(value, str):
            fixed, n = _SURROGATE.subn("\ufffd", value)
            count[0] += n
            return fixed
        if isinstance(value, list):
            return [clean(v) for v in value]
        if isinstance(value, dict):
            return {clean(k): clean(v) for k, v in value.items()}
        return value

    return clean(event), count[0]


def _not_json(constant: str) -> Any:
    raise ValueError(f"{constant} is not JSON")


_RAW_STRUCT = pa.struct(list(RAW_SCHEMA))


def _rows_table(rows: list[dict[str, Any] | None]) -> pa.Table:
    """Rows -> table without Table.from_pylist, which imports pandas (a second of start-up)."""
    return pa.Table.from_struct_array(pa.array(rows, type=_RAW_STRUCT))


def _coerce(event: Any) -> dict[str, Any] | None:
    """Bring one loosely-typed event to RAW_SCHEMA's types (slow path, few events);
    None for an event of a phase the reader does not keep (or not an object)."""
    if not isinstance(event, dict):
        return None
    ph = _text(event.get("ph"))
    if ph is None or len(ph) != 1 or ph not in KEPT_PHASES:
        return None
    row: dict[str, Any] = {
        "ph": ph,
        "cat": _text(event.get("cat")),
        "name": _text(event.get("name")),
        "ts_ns": _nanos(event.get("ts")),
        "dur_ns": _nanos(event.get("dur")),
    }
    for key in ("pid", "tid"):
        value = event.get(key)
        number = _integer(value)
        row[key] = number
        row[f"{key}_label"] = str(value) if number is None and value is not None else None
    args = event.get("args")
    if isinstance(args, dict):
        row.update({f"args.{k}": _coerce_arg(args.get(k), t) for k, t in ARG_FIELDS.items()})
    return row


def _coerce_arg(value: Any, dtype: pa.DataType) -> Any:
    if value is None:
        return None
    if dtype == _DIMS:
        return [_flat_dims(d) for d in value] if isinstance(value, list) else None
    if pa.types.is_list(dtype):
        if not isinstance(value, list):
            return None
        inner = dtype.value_type
        return [_integer(v) if pa.types.is_integer(inner) else _text(v) for v in value]
    if pa.types.is_integer(dtype):
        return _integer(value)
    if pa.types.is_floating(dtype):
        try:
            return float(value)
        except (TypeError, ValueError):
            return None
    return _text(value)


def _flat_dims(dims: Any) -> list[int]:
    """One input's shape; a tensor list (nested lists) becomes its first tensor's shape."""
    if not isinstance(dims, list):
        return []
    if dims and isinstance(dims[0], list):
        return _flat_dims(dims[0])
    return [v for v in (_integer(d) for d in dims) if v is not None]


def _text(value: Any) -> str | None:
    if value is None:
        return None
    return value if isinstance(value, str) else orjson.dumps(value).decode()


_INT64_MAX = (1 << 63) - 1


def _integer(value: Any) -> int | None:
    """An int64, or None for anything else (including pointers past int64's range)."""
    number: int | None = None
    if isinstance(value, int) or isinstance(value, float) and value.is_integer():
        number = int(value)
    elif isinstance(value, str):
        try:
            number = int(value.strip())
        except ValueError:
            return None
    if number is None or not -_INT64_MAX <= number <= _INT64_MAX:
        return None
    return number


_MICROS_LIMIT = decimal.Decimal(_INT64_MAX) / 1000
"""Microseconds beyond this are past int64 nanoseconds: not a time this reader can hold."""


def _micros(value: Any) -> decimal.Decimal | None:
    """Microseconds as an exact decimal with three places (nanoseconds); tolerates strings.
    None for anything else: text that is not a number, NaN, infinities, values past int64 ns."""
    if value is None or isinstance(value, bool):
        return None
    try:
        if isinstance(value, decimal.Decimal):
            number = value
        else:
            number = decimal.Decimal(value.strip() if isinstance(value, str) else repr(value))
    except (decimal.InvalidOperation, AttributeError):
        return None
    if not number.is_finite() or abs(number) > _MICROS_LIMIT:  # 1e300 would not even quantize
        return None
    return number.quantize(decimal.Decimal("0.001"), rounding=decimal.ROUND_HALF_EVEN)


def _nanos(value: Any) -> int | None:
    micros = _micros(value)
    if micros is None:
        return None
    nanos = int(micros * 1000)
    return nanos if -_INT64_MAX <= nanos <= _INT64_MAX else None


def micros_to_ns(column: pa.ChunkedArray | pa.Array) -> pa.ChunkedArray | pa.Array:
    """Exact decimal microseconds -> int64 nanoseconds (nulls stay null)."""
    scaled = pc.multiply(column, pa.scalar(decimal.Decimal(1000), pa.decimal128(5, 0)))
    return pc.cast(scaled, pa.int64(), safe=False)
