"""Parse an Ascend ``trace_view.json`` (a bare JSON array) into one flat Arrow table of raw events.

Ascend's timeline differs from Kineto's in ways the Kineto scanner does not
foresee: ``ts`` is a decimal *string* (``"1736408883732241.564"``), flow ids are
sometimes numbers and sometimes strings, and the ``args`` that matter are HCCL's
(``transport type``, ``link type``, ``size(Byte)``, ``src rank`` ...) and the
``connection_id`` that ties a CANN API call to the device tasks it launched.

The array is split by :mod:`perfsight.ingest.jsonstream` (bounded memory, damage
reported, never raised); each batch of complete events becomes newline-delimited
JSON (raw newlines can only be whitespace between tokens, so they are blanked, and
the blanked separators become newlines) and is parsed in C++ by ``pyarrow.json``
against :data:`EVENT_SCHEMA`.  A batch whose values do not fit the schema (a
numeric ``ts`` from another exporter) is decoded with ``orjson`` and coerced.

This module only turns text into columns; it must not decide what an event means.
"""

from __future__ import annotations

import dataclasses
import decimal
import io
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pj

from perfsight.ingest.jsonstream import EventBatch, NotATraceError, StreamReport, stream_events

ARG_FIELDS: dict[str, pa.DataType] = {
    "name": pa.string(),  # process_name / thread_name metadata
    "labels": pa.string(),
    "Task Type": pa.string(),  # Ascend Hardware
    "Physic Stream Id": pa.int64(),
    "connection_id": pa.int64(),  # CANN call <-> device task
    "task type": pa.string(),  # HCCL plane task
    "transport type": pa.string(),
    "link type": pa.string(),
    "size(Byte)": pa.int64(),
    "src rank": pa.int64(),
    "dst rank": pa.int64(),
    "rdma type": pa.string(),
    "plane id": pa.int64(),
    "data_type": pa.string(),  # HCCL op
    "alg_type": pa.string(),
    "count": pa.int64(),
    "correlation_id": pa.int64(),
}
"""``args`` keys kept, with their types; every other key is skipped."""

EVENT_FIELDS = [
    pa.field("ph", pa.string()),
    pa.field("name", pa.string()),
    pa.field("cat", pa.string()),
    pa.field("pid", pa.int64()),
    pa.field("tid", pa.int64()),
    pa.field("ts", pa.string()),
    pa.field("dur", pa.float64()),
]
"""An event's own keys, with their types (``ts`` is text: Ascend writes it as a decimal string)."""

EVENT_SCHEMA = pa.schema(
    [*EVENT_FIELDS, pa.field("args", pa.struct([pa.field(k, v) for k, v in ARG_FIELDS.items()]))]
)
"""What ``pyarrow.json`` parses each event into (extra keys ignored)."""

SOURCE_FIELDS = [
    pa.field("start_ns", pa.int64()),
    pa.field("dur_ns", pa.int64()),
    pa.field("task_info", pa.string()),
    pa.field("op_type", pa.string()),
    pa.field("core_type", pa.string()),
]
"""Facts a stand-in source records that ``trace_view.json`` does not (null in the JSON's rows):

* ``start_ns`` / ``dur_ns``: integer nanoseconds, for sources that keep them (the profiler
  database); when set they are used instead of ``ts`` / ``dur``, so no time goes through text;
* ``task_info``: which of the database's task-info tables names a device task --
  ``"compute"`` (``COMPUTE_TASK_INFO``), ``"communication"`` (``COMMUNICATION_TASK_INFO``) or
  ``"none"``; null when the source has no such tables;
* ``op_type`` / ``core_type``: the vendor's operator type (``Conv2D``) and core type
  (``AI_CORE``, ``AI_VECTOR_CORE``, ``MIX_AIV``, ``HCCL``) of a device task, when recorded."""

FLAT_SCHEMA = pa.schema(
    [*EVENT_FIELDS, *[pa.field(f"args.{k}", v) for k, v in ARG_FIELDS.items()], *SOURCE_FIELDS]
)
"""The flat table :func:`read_ascend_events` returns: the event's keys, then ``args.<key>``, then
:data:`SOURCE_FIELDS` (null for a ``trace_view.json``)."""


@dataclasses.dataclass
class AscendEvents:
    table: pa.Table  # FLAT_SCHEMA rows in file order
    report: StreamReport


def _flat(parsed: pa.Table) -> pa.Table:
    arrays = []
    for field in FLAT_SCHEMA:
        if field in SOURCE_FIELDS:
            arrays.append(pa.nulls(parsed.num_rows, field.type))
        elif field.name.startswith("args."):
            args = parsed.column("args").combine_chunks() if "args" in parsed.column_names else None
            if args is None:
                arrays.append(pa.nulls(parsed.num_rows, field.type))
            else:
                arrays.append(pc.struct_field(args, field.name[5:]))
        else:
            arrays.append(parsed.column(field.name).combine_chunks())
    return pa.Table.from_arrays(arrays, schema=FLAT_SCHEMA)


def flat_table(columns: Mapping[str, Any], num_rows: int) -> pa.Table:
    """:data:`FLAT_SCHEMA` rows from the columns another source records (``trace_view.json``'s
    stand-ins: the profiler database, MindSpore's CPU-op files), by flat name; lists, NumPy or Arrow
    arrays, NaN read as null.  Every column the source lacks is null."""
    arrays = []
    for field in FLAT_SCHEMA:
        values = columns.get(field.name)
        if values is None:
            arrays.append(pa.nulls(num_rows, field.type))
        elif isinstance(values, pa.Array):
            arrays.append(values.cast(field.type))
        else:
            arrays.append(pa.array(values, field.type, from_pandas=True))
    return pa.Table.from_arrays(arrays, schema=FLAT_SCHEMA)


def _ndjson(batch: EventBatch) -> bytes:
    data = np.frombuffer(batch.data, dtype=np.uint8).copy()
    data[(data == 0x0A) | (data == 0x0D)] = 0x20
    ends = batch.ends[:-1].astype(np.int64)
    data[ends[ends < data.size]] = 0x0A
    return data.tobytes()


def _text(value: Any) -> str | None:
    if value is None:
        return None
    return value if isinstance(value, str) else str(value)


def _integer(value: Any) -> int | None:
    try:
        if isinstance(value, bool):
            return int(value)
        if isinstance(value, int):
            return value if -(1 << 63) <= value < (1 << 63) else None
        if isinstance(value, float) and value == value:
            return int(value)
        if isinstance(value, str) and value.strip():
            return int(decimal.Decimal(value.strip()))
    except (ValueError, ArithmeticError):
        return None
    return None


def _number(value: Any) -> float | None:
    try:
        return float(value) if value is not None and not isinstance(value, bool) else None
    except (TypeError, ValueError):
        return None


def _coerce(event: Any) -> dict[str, Any] | None:
    if not isinstance(event, dict):
        return None
    args = event.get("args") if isinstance(event.get("args"), dict) else {}
    row: dict[str, Any] = {
        "ph": _text(event.get("ph")),
        "name": _text(event.get("name")),
        "cat": _text(event.get("cat")),
        "pid": _integer(event.get("pid")),
        "tid": _integer(event.get("tid")),
        "ts": _text(event.get("ts")),
        "dur": _number(event.get("dur")),
    }
    for key, dtype in ARG_FIELDS.items():
        value = args.get(key)
        row[f"args.{key}"] = _text(value) if pa.types.is_string(dtype) else _integer(value)
    return row


def _slow(batch: EventBatch) -> tuple[pa.Table, int | None, str | None]:
    """Decode a batch event by event; stop at the first event that is not JSON."""
    rows: list[dict[str, Any]] = []
    for i in range(len(batch.ends)):  # slow path only: a batch pyarrow refused
        lo = int(batch.ends[i - 1]) if i else 0
        text = batch.data[lo : int(batch.ends[i])]
        try:
            event = orjson.loads(text)
        except orjson.JSONDecodeError as exc:
            table = pa.Table.from_pylist(rows, schema=FLAT_SCHEMA)
            return table, batch.offset + lo, f"event #{i} is not valid JSON ({exc})"
        row = _coerce(event)
        if row is not None:
            rows.append(row)
    return pa.Table.from_pylist(rows, schema=FLAT_SCHEMA), None, None


def read_ascend_events(path: Path) -> AscendEvents:
    """Every event of ``path`` as :data:`FLAT_SCHEMA` rows; damage stops reading and is reported.

    Raises :class:`~perfsight.ingest.jsonstream.NotATraceError` when the file is not a JSON trace.
    """
    batches, report = stream_events(path)
    tables: list[pa.Table] = []
    options = pj.ParseOptions(explicit_schema=EVENT_SCHEMA, unexpected_field_behavior="ignore")
    for batch in batches:
        try:
            parsed = pj.read_json(io.BytesIO(_ndjson(batch)), parse_options=options)
            tables.append(_flat(parsed))
            continue
        except (pa.ArrowInvalid, pa.ArrowTypeError):
            pass
        table, offset, problem = _slow(batch)
        tables.append(table)
        if problem:
            report.damage_offset = offset
            report.problem = problem
            break
    table = pa.concat_tables(tables) if tables else FLAT_SCHEMA.empty_table()
    return AscendEvents(table=table, report=report)


__all__ = ["FLAT_SCHEMA", "AscendEvents", "NotATraceError", "read_ascend_events"]
