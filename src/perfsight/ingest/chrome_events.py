"""Parse batches of Chrome-trace events into one raw Arrow table.

The columnar JSON parser (``pyarrow.json``) reads a batch in C++ against an
explicit schema of the fields we use; everything else is skipped unread.  A
batch it rejects -- a field whose type differs from event to event (Kineto's
``"pid": "Spans"``), a nested shape list, a decimal string timestamp -- is split
in halves until the offending events are few, and those few are decoded one
by one with ``orjson`` and coerced.  An event that is not valid JSON marks the
damage point: everything before it is kept, the rest is dropped, and the
caller is told where.

Timestamps and durations are read as exact decimals of microseconds and turned
into integer nanoseconds, so nanosecond-resolution traces lose nothing.
"""

from __future__ import annotations

import dataclasses
import decimal
import io
from typing import Any

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pj

from perfsight.ingest.jsonstream import EventBatch

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
}
"""The ``args`` keys we read, with the type each has in well-formed Kineto output."""

RAW_SCHEMA = pa.schema(
    [
        ("ph", pa.string()),
        ("cat", pa.string()),
        ("name", pa.string()),
        ("pid", pa.int64()),
        ("tid", pa.int64()),
        ("ts", _TIME),
        ("dur", _TIME),
        ("id", pa.int64()),
        ("args", pa.struct([pa.field(k, t) for k, t in ARG_FIELDS.items()])),
        ("pid_label", pa.string()),  # pid/tid that were strings ("Spans", "stream 7")
        ("tid_label", pa.string()),
    ]
)
"""Columns of the raw event table, before normalisation into the trace model."""

_SMALL = 64
"""Below this many events a rejected batch is decoded event by event."""


@dataclasses.dataclass
class ParseResult:
    table: pa.Table
    damage_offset: int | None = None  # file offset of the first event that is not valid JSON
    problem: str | None = None


def parse_batch(batch: EventBatch) -> ParseResult:
    """Parse every event of ``batch``; stop at the first undecodable one."""
    tables: list[pa.Table] = []
    result = _parse_range(batch, 0, len(batch.ends), tables)
    table = pa.concat_tables(tables) if tables else RAW_SCHEMA.empty_table()
    return ParseResult(table=table, damage_offset=result[0], problem=result[1])


def _parse_range(batch: EventBatch, lo: int, hi: int, out: list[pa.Table]) -> tuple[int | None, str | None]:
    start = int(batch.ends[lo - 1]) if lo else 0
    stop = int(batch.ends[hi - 1])
    try:
        out.append(_columnar(batch.data[start:stop]))
        return None, None
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        pass
    if hi - lo <= _SMALL:
        return _one_by_one(batch, lo, hi, out)
    mid = (lo + hi) // 2
    damage = _parse_range(batch, lo, mid, out)
    if damage[0] is not None:
        return damage
    return _parse_range(batch, mid, hi, out)


_PARSE = pj.ParseOptions(
    explicit_schema=RAW_SCHEMA, unexpected_field_behavior="ignore", newlines_in_values=True
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
    return pj.read_json(io.BytesIO(data), read_options=_READ, parse_options=_PARSE)


def _one_by_one(batch: EventBatch, lo: int, hi: int, out: list[pa.Table]) -> tuple[int | None, str | None]:
    rows = []
    for i in range(lo, hi):
        start = int(batch.ends[i - 1]) if i else 0
        text = batch.data[start : int(batch.ends[i])]
        try:
            event = orjson.loads(text)
        except orjson.JSONDecodeError as exc:
            stripped = len(text) - len(text.lstrip())
            if rows:
                out.append(_rows_table(rows))
            return batch.offset + start + stripped, f"event #{i} is not valid JSON ({exc})"
        if isinstance(event, dict):
            rows.append(_coerce(event))
    if rows:
        out.append(_rows_table(rows))
    return None, None


_RAW_STRUCT = pa.struct(list(RAW_SCHEMA))


def _rows_table(rows: list[dict[str, Any]]) -> pa.Table:
    """Rows -> table without Table.from_pylist, which imports pandas (a second of start-up)."""
    return pa.Table.from_struct_array(pa.array(rows, type=_RAW_STRUCT))


def _coerce(event: dict[str, Any]) -> dict[str, Any]:
    """Bring one loosely-typed event to RAW_SCHEMA's types (slow path, few events)."""
    row: dict[str, Any] = {
        "ph": _text(event.get("ph")),
        "cat": _text(event.get("cat")),
        "name": _text(event.get("name")),
        "ts": _micros(event.get("ts")),
        "dur": _micros(event.get("dur")),
        "id": _integer(event.get("id")),
    }
    for key in ("pid", "tid"):
        value = event.get(key)
        number = _integer(value)
        row[key] = number
        row[f"{key}_label"] = str(value) if number is None and value is not None else None
    args = event.get("args")
    if isinstance(args, dict):
        row["args"] = {k: _coerce_arg(args.get(k), t) for k, t in ARG_FIELDS.items()}
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


def _micros(value: Any) -> decimal.Decimal | None:
    """Microseconds as an exact decimal with three places (nanoseconds); tolerates strings."""
    if value is None or isinstance(value, bool):
        return None
    try:
        number = decimal.Decimal(value.strip() if isinstance(value, str) else repr(value))
    except (decimal.InvalidOperation, AttributeError):
        return None
    if not number.is_finite():
        return None
    return number.quantize(decimal.Decimal("0.001"), rounding=decimal.ROUND_HALF_EVEN)


def micros_to_ns(column: pa.ChunkedArray | pa.Array) -> np.ndarray:
    """Exact decimal microseconds -> int64 nanoseconds (nulls become 0)."""
    scaled = pc.multiply(column, pa.scalar(decimal.Decimal(1000), pa.decimal128(5, 0)))
    ints = pc.cast(scaled, pa.int64(), safe=False)
    return ints.fill_null(0).to_numpy()
