"""Read a PyTorch profiler (Kineto) Chrome trace into the trace model.

Handles the variants seen in the wild: GPU (CUDA, ROCm) and CPU-only traces,
legacy categories (``Operator``/``Runtime``/``Kernel``) with a lowercase
``external id``, nanosecond-resolution timestamps, traces without
``distributedInfo`` (rank from an option or the file name, with a warning),
traces without ``ProfilerStep`` (one inferred step, with a warning), and
truncated or damaged files (every complete event before the damage, with a
warning naming the file).

What an event *is* (kind, device or host, communication or not) is decided
here, once; analyses only read the ``kind`` column.
"""

from __future__ import annotations

import dataclasses
import logging
import re
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from perfsight import columns
from perfsight.heap import prefer_returning_pool, return_freed_memory
from perfsight.ingest import assemble, kineto_devices
from perfsight.ingest.beside import beside
from perfsight.ingest.chrome_events import ARG_FIELDS, read_events
from perfsight.ingest.jsonstream import NotATraceError
from perfsight.intervals import outermost
from perfsight.model import (
    COMM_SCHEMA,
    COMMUNICATION_HOST_OP_NAME,
    CONCRETE_INPUT_OPS,
    MEMORY_SCHEMA,
    NO_ID,
    DeviceInfo,
    RunMetadata,
    SliceKind,
    Trace,
    conform,
    kind_code,
)

log = logging.getLogger(__name__)


class TraceReadError(ValueError):
    """The file cannot be read as a trace at all; the message names the file and why."""


_CATEGORY_KIND = {
    "cpu_op": SliceKind.CPU_OP,
    "operator": SliceKind.CPU_OP,
    "python_function": SliceKind.PYTHON,
    "user_annotation": SliceKind.ANNOTATION,
    "gpu_user_annotation": SliceKind.DEVICE_ANNOTATION,
    "cuda_runtime": SliceKind.RUNTIME,
    "cuda_driver": SliceKind.RUNTIME,
    "runtime": SliceKind.RUNTIME,
    "kernel": SliceKind.KERNEL,
    "gpu_memcpy": SliceKind.MEMCPY,
    "memcpy": SliceKind.MEMCPY,
    "gpu_memset": SliceKind.MEMSET,
    "memset": SliceKind.MEMSET,
    "cuda_sync": SliceKind.SYNC,
}
"""Kineto category (lower-cased) -> kind; unknown categories become OTHER."""

PROCESS_METADATA = ("process_name", "process_labels")
"""Metadata events that name or label a process (what :mod:`perfsight.ingest.kineto_devices`
reads); a tuple, since a ``pa.array`` built at import would load pandas (see ``lazy_pandas``)."""

_DEVICE_CATEGORIES = ("kernel", "gpu_memcpy", "memcpy", "gpu_memset", "memset", "gpu_user_annotation")

COMM_DEVICE_NAME = r"(?i)^(nccl|rccl)|nccl.*kernel"
DATA_LOADING_NAME = r"^enumerate\(DataLoader\)|DataLoader.*__next__"

_DTYPE_BYTES = {
    "float": 4, "float32": 4, "half": 2, "float16": 2, "bfloat16": 2, "double": 8, "float64": 8,
    "int": 4, "int32": 4, "long": 8, "int64": 8, "short": 2, "int16": 2, "byte": 1, "uint8": 1,
    "char": 1, "int8": 1, "bool": 1, "float8_e4m3fn": 1, "float8_e5m2": 1, "complexfloat": 8,
}  # fmt: skip
"""Element sizes by the dtype names record_param_comms writes ("Float", "BFloat16", ...)."""

_COLLECTIVES = (
    ("allreduce", "all_reduce"), ("all_reduce", "all_reduce"),
    ("allgather", "all_gather"), ("all_gather", "all_gather"),
    ("reducescatter", "reduce_scatter"), ("reduce_scatter", "reduce_scatter"),
    ("alltoall", "all_to_all"), ("all_to_all", "all_to_all"),
    ("broadcast", "broadcast"), ("barrier", "barrier"), ("sendrecv", "send_recv"),
    ("send", "send"), ("recv", "recv"), ("reduce", "reduce"), ("gather", "gather"), ("scatter", "scatter"),
)  # fmt: skip
"""Substrings of op or kernel names -> canonical collective name; first match wins."""


def read_kineto(path: str | Path, rank: int | None = None) -> Trace:
    """Read one Kineto trace file (``.json`` or ``.json.gz``).

    ``rank`` overrides the rank recorded in the trace.  Raises
    :class:`TraceReadError` only when nothing can be read; damage after some
    events is a warning in ``trace.meta.warnings``.
    """
    path = Path(path)
    prefer_returning_pool()
    parts = Parts()
    meta, truncated = read_into(path, parts, rank)
    trace = build_trace(parts, meta, truncated=truncated)
    del parts
    return_freed_memory()
    for message in trace.meta.warnings:
        log.warning(message)
    return trace


def read_into(path: Path, parts: Parts, rank: int | None) -> tuple[RunMetadata, bool]:
    """Stream ``path``'s events batch by batch into ``parts`` (``Parts.add``); return the run's
    metadata with the warnings about the file itself (damage, bad values, rank) and whether the
    file was cut short.  The one place where damage is judged, for the in-memory reader and the
    spilled one (:mod:`perfsight.ingest.kineto_spill`, whose ``parts`` writes each batch to disk)."""
    try:
        results, report = read_events(path)
    except NotATraceError as exc:
        raise TraceReadError(f"{path}: not a Chrome/Kineto trace: {exc}") from None
    except OSError as exc:
        raise TraceReadError(f"{path}: cannot open: {exc.strerror or exc}") from None
    warnings: list[str] = []
    damage: list[str] = []
    try:
        for parsed in results:
            parts.add(parsed.table)
            if parsed.problem:
                damage.append(
                    f"damaged at byte {parsed.damage_offset} of the decompressed JSON "
                    f"({parsed.problem}); kept the {parts.events} events before it"
                )
                break
    except OSError as exc:
        damage.append(f"read error after {parts.events} events: {exc}")
    finally:
        results.close()  # the scanning thread is joined before the report is read
    damaged = bool(damage)
    if report.truncated and not damaged:  # a cut gzip says "truncated" itself, below
        damage.append(report.problem if report.compression is not None else f"truncated: {report.problem}")
    if report.compression is not None:
        if not damage:
            damage.append(f"every event of the array was read ({report.events})")
        damage.insert(0, report.compression.message)
    if damage:  # one line: what was wrong with the file and what was kept
        warnings.append(f"{path}: " + "; ".join(damage))
    if (report.truncated or damaged) and parts.events == 0:
        raise TraceReadError(f"{path}: {'; '.join(damage)}: nothing before the damage is a complete event")
    warnings.extend(f"{path}: {line}" for line in parts.value_warnings(report.replaced))
    return _metadata(path, report.header, rank, warnings), report.truncated or damaged


_SLICE_ARGS = (
    "External id", "external id", "correlation", "device", "stream", "Input Dims", "Input type",
    "Concrete Inputs", "grid", "block", "est. achieved occupancy %", "bytes",
)  # fmt: skip
COMM_ARGS = (
    "Collective name", "In msg nelems", "Out msg nelems", "dtype", "Process Group Name",
    "Process Group Ranks", "Process Group ID", "Seq", "Src Rank", "Dst Rank",
)  # fmt: skip
_MEMORY_ARGS = (
    "Addr",
    "Bytes",
    "Total Allocated",
    "Total Reserved",
    "Total Active",
    "Device Type",
    "Device Id",
)
_SLICE_ARG_COLUMNS = tuple(f"args.{key}" for key in _SLICE_ARGS)
_SLICE_COLUMNS = ("cat", "name", "pid", "tid", "ts_ns", "dur_ns", *_SLICE_ARG_COLUMNS)
"""The raw columns a complete event's slice row is made of."""


TIME_LIMIT_NS = 1 << 62
"""Largest ``|ts|`` and ``dur`` the reader accepts (146 years): a start plus a duration stays
inside int64 nanoseconds, so no analysis overflows."""


def _usable_time(column: pa.ChunkedArray, low: int) -> np.ndarray:
    """True where a time column holds a value in [low, TIME_LIMIT_NS] (null: not a usable time).
    In NumPy: on a batch's few thousand rows, each Arrow call costs more than its work."""
    values = columns.int64(column, _NO_TIME)
    return (values >= low) & (values <= TIME_LIMIT_NS)


_NO_TIME = np.iinfo(np.int64).min
"""What a null time reads as in :func:`_usable_time`: below every usable time."""


@dataclasses.dataclass
class Parts:
    """Each parsed batch, cut at once into the few columns we keep, so that the wide raw
    table of one batch is the largest transient and memory stays bounded on huge files.

    The rule for bad times (docs/RELIABILITY.md): a slice or memory event whose ``ts`` is
    missing, not a number or out of range cannot be placed in time and is dropped; a slice whose
    ``dur`` is missing, not a number, negative or out of range is kept with duration 0.  Both
    are counted and named in a warning, never replaced silently."""

    complete: list[pa.Table] = dataclasses.field(default_factory=list)
    comm_args: list[pa.Table] = dataclasses.field(default_factory=list)
    memory: list[pa.Table] = dataclasses.field(default_factory=list)
    thread_names: list[pa.Table] = dataclasses.field(default_factory=list)
    process_labels: list[pa.Table] = dataclasses.field(default_factory=list)
    events: int = 0
    slices: int = 0
    bad_ts: int = 0  # slices and memory events dropped for their "ts"
    bad_dur: int = 0  # slices kept with duration 0 for their "dur"

    def value_warnings(self, replaced: int) -> list[str]:
        """One line per kind of bad value met (no file name)."""
        lines = []
        if self.bad_ts:
            lines.append(
                f'{self.bad_ts} events dropped: their "ts" is missing, not a number of microseconds '
                f"or out of range (|ts| up to {TIME_LIMIT_NS // 1000} us)"
            )
        if self.bad_dur:
            lines.append(
                f'{self.bad_dur} complete events (ph "X") kept with duration 0: their "dur" is missing, '
                "negative, not a number of microseconds or out of range"
            )
        if replaced:
            lines.append(
                f"{replaced} invalid UTF-8 sequences or lone surrogates in strings were replaced by "
                "U+FFFD; every event was kept"
            )
        return lines

    def _placed(self, chosen: np.ndarray, usable_ts: np.ndarray) -> np.ndarray:
        """The rows of ``chosen`` (a mask over the batch) whose ``ts_ns`` is usable (``usable_ts``);
        those whose time is not are counted in ``bad_ts``."""
        placed = chosen & usable_ts
        self.bad_ts += int(np.count_nonzero(chosen)) - int(np.count_nonzero(placed))
        return placed

    def add(self, raw: pa.Table) -> None:
        """Cut one raw batch (``chrome_events.RAW_SCHEMA``) into the kept parts.

        Only the slice columns are filtered to the complete events: the collective metadata and
        the allocator columns, null on nearly every row, are taken by row number (a filter of
        the wide batch copied every sparse column whole: half of this method's time)."""
        self.events += raw.num_rows
        if not raw.num_rows:
            return
        phase = _phases(raw.column("ph"))
        usable_ts = _usable_time(raw.column("ts_ns"), -TIME_LIMIT_NS)
        is_x = self._placed(phase == ord("X"), usable_ts)
        if is_x.any():
            kept = int(np.count_nonzero(is_x))
            # a column null on every row of the batch (shapes not recorded, legacy keys) is made
            # null rather than filtered: filtering it costs as much as a column with values
            filled = [c for c in _SLICE_COLUMNS if raw.column(c).null_count < raw.num_rows]
            x = raw.select(filled).filter(pa.array(is_x))
            for name in _SLICE_COLUMNS:
                if name not in filled:
                    x = x.append_column(raw.schema.field(name), pa.nulls(kept, raw.schema.field(name).type))
            dur = x.column("dur_ns")
            usable_dur = _usable_time(dur, 0)
            self.bad_dur += x.num_rows - int(np.count_nonzero(usable_dur))
            columns: dict[str, Any] = {
                "cat": x.column("cat").fill_null("").dictionary_encode(),
                "name": x.column("name").fill_null("").dictionary_encode(),
                "pid": x.column("pid"),
                "tid": x.column("tid"),
                "start_ns": x.column("ts_ns"),
                "dur_ns": np.where(usable_dur, int_column(dur, 0), 0),
            }
            columns.update({key: x.column(f"args.{key}") for key in _SLICE_ARGS})
            columns["Concrete Inputs"] = concrete_inputs_kept(columns["name"], columns["Concrete Inputs"])
            self.complete.append(pa.table(columns))
            has = pc.or_(
                pc.is_valid(raw.column("args.Collective name")), pc.is_valid(raw.column("args.In msg nelems"))
            )
            raw_rows = np.flatnonzero(is_x & _bools(has))
            if len(raw_rows):
                slice_row = np.cumsum(is_x)[raw_rows] - 1  # the row each has among the kept slices
                comm = raw.select([f"args.{key}" for key in COMM_ARGS]).take(pa.array(raw_rows))
                self.comm_args.append(
                    comm.rename_columns(list(COMM_ARGS)).append_column(
                        "row", pa.array(slice_row + self.slices)
                    )
                )
            self.slices += x.num_rows
        name = raw.column("name")
        is_mem = self._placed(_named(name, phase == ord("i"), ("[memory]",)), usable_ts)
        if is_mem.any():
            mem = raw.select(["ts_ns", "tid", *(f"args.{key}" for key in _MEMORY_ARGS)]).take(
                pa.array(np.flatnonzero(is_mem))
            )
            columns = {"ts_ns": mem.column("ts_ns"), "tid": mem.column("tid")}
            columns.update({key: mem.column(f"args.{key}") for key in _MEMORY_ARGS})
            self.memory.append(pa.table(columns))
        is_meta = phase == ord("M")
        is_name = _named(name, is_meta, ("thread_name",))
        names = raw.select(["pid", "tid", "args.name"]).filter(pa.array(is_name))
        if names.num_rows:
            self.thread_names.append(
                pa.table({"pid": names.column("pid"), "tid": names.column("tid"), "label": names.column(2)})
            )
        is_process = _named(name, is_meta, PROCESS_METADATA)
        procs = raw.select(["pid", "args.name", "args.labels"]).filter(pa.array(is_process))
        if procs.num_rows:
            label = pc.coalesce(procs.column("args.labels"), procs.column("args.name"))
            self.process_labels.append(pa.table({"pid": procs.column("pid"), "label": label}))


_TRIM_FROM_BYTES = 4 << 20
"""A joined column this large has its parts' memory returned at once (``malloc_trim``): the
parts are one small buffer per batch, below the mmap threshold, so freeing them leaves holes in
the heap that the next column's copy does not fit, and without the trim reading a 1 GB trace
peaked at twice its tables (960 MB, 650 MB with it).  Below this size, trimming costs more
than the memory it returns (a cluster worker reads a thousand 2 MB traces)."""


def concat_parts(tables: list[pa.Table]) -> pa.Table | None:
    """One contiguous table from the per-batch parts, emptying ``tables`` as it goes.

    Column by column, so that each part's buffers are released as soon as their column
    is copied (and returned to the system: see ``_TRIM_FROM_BYTES``): the peak is the parts
    plus one column, not the parts plus the whole result.
    """
    if not tables:
        return None
    schema = tables[0].schema
    # each column's parts, held only here once the tables are let go: dropping a column's list
    # frees its parts (a drop_columns of every part per column cost 170 tables on 10 batches)
    parts = {name: [t.column(name) for t in tables] for name in schema.names}
    tables.clear()
    columns = []
    for field in schema:
        chunks = [chunk for column in parts.pop(field.name) for chunk in column.chunks]
        if pa.types.is_dictionary(field.type):
            merged = pa.Table.from_arrays([pa.chunked_array(chunks, type=field.type)], [field.name])
            columns.append(merged.unify_dictionaries().column(0).combine_chunks())
            del merged
        else:
            columns.append(pa.concat_arrays(chunks) if chunks else pa.array([], field.type))
        del chunks
        if columns[-1].nbytes >= _TRIM_FROM_BYTES:
            return_freed_memory()  # the parts' small buffers sit in the heap: give this column's back
    return pa.table(dict(zip(schema.names, columns, strict=True)))


def _bools(array: pa.ChunkedArray | pa.Array) -> np.ndarray:
    return columns.numpy(array, null=False)


def _phases(ph: pa.ChunkedArray) -> np.ndarray:
    """Each row's phase as the byte of its one letter, for the phases the cut compares (``X``,
    ``i``, ``M``: others may read as 0).

    Why not ``pc.equal(ph, "X")`` per phase: every event the native scanner keeps has a
    one-letter phase, so the column's text is one byte a row, read here in place; three string
    comparisons over every row of every batch were a tenth of the cut of a batch into parts.
    Anything else (nulls, longer phases from the portable path) is compared as before."""
    array = columns.one_array(ph)
    n = len(array)
    offsets = None
    if n and pa.types.is_string(array.type):  # int32 offsets, then the text
        offsets = np.frombuffer(array.buffers()[1], np.int32, n + 1, array.offset * 4)
    if offsets is not None and array.null_count == 0 and bool(np.all(np.diff(offsets) == 1)):
        return np.frombuffer(array.buffers()[2], np.uint8, n, int(offsets[0])).copy()
    letters = np.zeros(n, np.uint8)
    for letter in "XiM":
        letters[_bools(pc.equal(array, letter))] = ord(letter)
    return letters


def _named(name: pa.ChunkedArray, rows: np.ndarray, names: tuple[str, ...]) -> np.ndarray:
    """``rows`` (a mask) narrowed to those whose name is one of ``names``; the names are compared
    only on the masked rows (a batch's few metadata or memory events, not all its names)."""
    chosen = np.flatnonzero(rows)
    found = np.zeros(len(rows), bool)
    if len(chosen):
        taken = name.take(pa.array(chosen))
        found[chosen] = _bools(pc.is_in(taken, pa.array(names, pa.string())))
    return found


def by_dictionary(column: pa.ChunkedArray, per_value: np.ndarray) -> np.ndarray:
    """Spread a per-dictionary-value result over the rows (work scales with unique names)."""
    return per_value[columns.int64(column)]


def dictionary_values(column: pa.ChunkedArray) -> pa.Array:
    return columns.combined(column).dictionary


def concrete_inputs_kept(names: pa.ChunkedArray, values: pa.ChunkedArray) -> pa.ChunkedArray | pa.Array:
    """``values`` (the ``Concrete Inputs`` of a batch's slices) kept only on rows named in
    ``CONCRETE_INPUT_OPS``, the only rows whose scalar arguments an analysis reads."""
    if values.null_count == len(values):
        return values
    # made here, not at import: pyarrow's pa.array checks for pandas, which analyses keep unloaded
    wanted = pc.is_in(dictionary_values(names), value_set=pa.array(sorted(CONCRETE_INPUT_OPS), pa.string()))
    keep = by_dictionary(names, _bools(wanted))
    return pc.if_else(pa.array(keep), values, pa.scalar(None, values.type))


def _metadata(path: Path, header: dict[str, Any], rank: int | None, warnings: list[str]) -> RunMetadata:
    dist = header.get("distributedInfo") if isinstance(header.get("distributedInfo"), dict) else {}
    meta = RunMetadata(sources=[str(path)], warnings=warnings, framework="pytorch")
    recorded = dist.get("rank")
    missing = "no distributedInfo.rank"
    if recorded is not None and not assemble.is_rank(recorded):
        missing = f"distributedInfo.rank {_shown(recorded)} is not a rank (0 to {assemble.MAX_RANK})"
    if rank is not None:
        meta.rank, meta.rank_source = int(rank), "option"
    elif assemble.is_rank(recorded):
        meta.rank, meta.rank_source = recorded, "trace"
    else:
        match = re.search(r"rank[-_]?(\d+)", path.name)
        if match:
            meta.rank, meta.rank_source = int(match.group(1)), "file name"
            warnings.append(f"{path}: {missing}; rank {meta.rank} taken from the file name")
        else:
            warnings.append(f"{path}: {missing} and none in the file name; assuming rank 0")
    world_size = dist.get("world_size")
    if assemble.is_rank(world_size) and world_size > 0:
        meta.world_size = world_size
    elif world_size is not None:
        warnings.append(f"{path}: distributedInfo.world_size {_shown(world_size)} is not a job size; ignored")
    meta.backend = dist.get("backend")
    groups = dist.get("pg_config")
    if isinstance(groups, list):
        meta.process_groups = [g for g in groups if isinstance(g, dict)]
    if dist.get("nccl_version"):
        meta.versions["nccl"] = str(dist["nccl_version"])
    for key in ("cupti_version", "cuda_runtime_version", "cuda_driver_version", "schemaVersion"):
        if key in header:
            meta.versions[key] = str(header[key])
    if isinstance(header.get("baseTimeNanoseconds"), int):
        meta.base_time_ns = header["baseTimeNanoseconds"]
    meta.host = header.get("host_name") if isinstance(header.get("host_name"), str) else None
    for dev in header.get("deviceProperties") or []:
        if isinstance(dev, dict) and isinstance(dev.get("id"), int):
            major, minor = dev.get("computeMajor"), dev.get("computeMinor")
            meta.devices.append(
                DeviceInfo(
                    index=dev["id"],
                    name=str(dev.get("name", "")),
                    memory_bytes=dev.get("totalGlobalMem"),
                    sm_count=dev.get("numSms"),
                    compute_capability=f"{major}.{minor}" if major is not None else None,
                )
            )
    return meta


def _shown(value: Any) -> str:
    """A header value for a warning, cut short (a hostile header may hold anything)."""
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def int_column(array: pa.ChunkedArray | pa.Array, default: int = NO_ID) -> np.ndarray:
    return columns.int64(array, null=default)


def build_trace(parts: Parts, meta: RunMetadata, truncated: bool) -> Trace:
    rank = meta.rank
    complete = concat_parts(parts.complete)
    if complete is None:
        complete = pa.table(
            {
                "cat": pa.array([], pa.string()).dictionary_encode(),
                "name": pa.array([], pa.string()).dictionary_encode(),
                "pid": pa.array([], pa.int64()),
                "tid": pa.array([], pa.int64()),
                "start_ns": pa.array([], pa.int64()),
                "dur_ns": pa.array([], pa.int64()),
                **{key: pa.nulls(0, ARG_FIELDS[key]) for key in _SLICE_ARGS},
            }
        )
    track_names = thread_track_names(concat_parts(parts.thread_names))

    cat_values = pc.utf8_lower(dictionary_values(complete.column("cat")))
    device_category, known_category = category_facts(cat_values)
    is_device = by_dictionary(complete.column("cat"), device_category)
    pid = int_column(complete.column("pid"))
    unknown_device, notes = kineto_devices.unknown_device_work(
        pid,
        kineto_devices.category_codes(complete.column("cat")),
        cat_values.to_pylist(),
        known_category,
        kineto_devices.process_labels(concat_parts(parts.process_labels)),
        source_name(meta),
        device_names_of(meta),
    )
    is_device |= unknown_device
    start = complete.column("start_ns").to_numpy()
    dur = complete.column("dur_ns").to_numpy()
    meta.warnings.extend(notes)
    pid, tid = device_lanes(
        pid,
        int_column(complete.column("tid")),
        is_device,
        complete.column("device"),
        complete.column("stream"),
    )
    # tracks and nesting depth (mostly NumPy sorts, without the GIL) beside the steps and links
    placing = (rank, pid, tid, is_device, track_names, start, dur)
    big = len(start) >= BESIDE_FROM
    with beside(tracks_and_depth, *placing, name="perfsight-depth", thread=big) as placed:
        names = complete.column("name")
        kind = slice_kinds(complete.column("cat"), cat_values, names, is_device, unknown_device)
        external = external_ids(complete)
        correlation = int_column(complete.column("correlation"))

        steps, inferred = assemble.steps_from_markers(rank, names, kind, is_device, start, dur)
        if inferred:
            meta.warnings.append(no_markers_warning(meta))
        step = assemble.step_of(start, steps)
        src, dst = assemble.launch_links(correlation, is_device, kind)
        step = assemble.device_step(step, is_device, src, dst, start, steps)
        steps = assemble.device_windows(steps, step, device_work(is_device, kind), start, start + dur)
        if truncated:
            steps = last_step_incomplete(steps)
        flows = assemble.flows_table(rank, src, dst, "launch")
        memory = memory_table(concat_parts(parts.memory), rank)
        comm_args = concat_parts(parts.comm_args)
        track, tracks, depth = placed()

    slices = assemble.slice_table(
        rank, kind, complete.column("cat"), names, is_device, pid, tid, track, start, dur, step, correlation,
        external_id=external,
        depth=depth,
        args=slice_args(complete),
    )  # fmt: skip
    comm = _comm(slices, comm_args, kind, is_device, start, dur, step, rank)
    return Trace(slices=slices, tracks=tracks, memory=memory, flows=flows, steps=steps, comm=comm, meta=meta)


BESIDE_FROM = 50_000
"""Slices from which a trace's tracks and depths are computed on a thread beside the steps: on
df_index_resolver (123k slices) that took the model's build from 27 to 22 ms of wall time, on
nccl_data (27k) a thread cost more than it saved (docs/BENCHMARKS.md)."""


def tracks_and_depth(
    rank: int,
    pid: np.ndarray,
    tid: np.ndarray,
    is_device: np.ndarray,
    track_names: dict[tuple[int, int, bool], str],
    start: np.ndarray,
    dur: np.ndarray,
) -> tuple[np.ndarray, pa.Table, np.ndarray]:
    """Each slice's track, the tracks table, and each slice's nesting depth on its track."""
    track, tracks = assemble.assign_tracks(rank, pid, tid, is_device, track_names)
    return track, tracks, assemble.nesting_depth(track.astype(np.int64), start, dur)


def source_name(meta: RunMetadata) -> str:
    return meta.sources[0] if meta.sources else "trace"


def device_names_of(meta: RunMetadata) -> dict[int, str]:
    return {d.index: d.name for d in meta.devices}


def no_markers_warning(meta: RunMetadata) -> str:
    return f"{meta.sources[0]}: no ProfilerStep markers; the whole trace is one step (step 0)"


def category_facts(cat_values: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """Per lower-cased category value: is it device work by name, and does perfsight know it."""
    return (
        _bools(pc.is_in(cat_values, pa.array(_DEVICE_CATEGORIES))),
        _bools(pc.is_in(cat_values, pa.array(list(_CATEGORY_KIND)))),
    )


def device_lanes(
    pid: np.ndarray,
    tid: np.ndarray,
    is_device: np.ndarray,
    device: pa.ChunkedArray | pa.Array,
    stream: pa.ChunkedArray | pa.Array,
) -> tuple[np.ndarray, np.ndarray]:
    """Each row's (pid, tid) lane: device rows live on (device, stream) when the event says
    them (Kineto already writes them as pid/tid)."""
    dev_col = int_column(device)
    stream_col = int_column(stream)
    return (
        np.where(is_device & (dev_col != NO_ID), dev_col, pid),
        np.where(is_device & (stream_col != NO_ID), stream_col, tid),
    )


def external_ids(complete: pa.Table) -> np.ndarray:
    return int_column(pc.coalesce(complete.column("External id"), complete.column("external id")))


def device_work(is_device: np.ndarray, kind: np.ndarray) -> np.ndarray:
    """Rows that are device work (what a step's device window spans): not device annotations."""
    return is_device & (kind != kind_code(SliceKind.DEVICE_ANNOTATION))


def last_step_incomplete(steps: pa.Table) -> pa.Table:
    """A cut trace's last step may lack its end: marked ``complete`` False."""
    if not steps.num_rows:
        return steps
    complete_flags = np.ones(steps.num_rows, bool)
    complete_flags[-1] = False
    return steps.set_column(steps.schema.get_field_index("complete"), "complete", pa.array(complete_flags))


SLICE_ARG_COLUMNS = {
    "input_dims": "Input Dims",
    "input_types": "Input type",
    "concrete_inputs": "Concrete Inputs",
    "grid": "grid",
    "block": "block",
    "occupancy_pct": "est. achieved occupancy %",
    "bytes": "bytes",
}
"""The optional argument columns of the slice table, by the event argument each comes from."""


def slice_args(complete: pa.Table) -> dict[str, pa.ChunkedArray]:
    """The optional argument columns of the slice table, from the kept event arguments."""
    return {column: complete.column(key) for column, key in SLICE_ARG_COLUMNS.items()}


def slice_kinds(
    cat: pa.ChunkedArray,
    cat_values: pa.Array,
    names: pa.ChunkedArray,
    is_device: np.ndarray,
    device_kernels: np.ndarray | None = None,
) -> np.ndarray:
    """Kind code of every slice (see ``model.kind_code``), decided per unique category and
    name, then spread over the rows as one byte each.  ``device_kernels``: rows of unknown
    categories that :mod:`perfsight.ingest.kineto_devices` found to be device work."""
    kind_of_cat = np.full(len(cat_values), kind_code(SliceKind.OTHER), dtype=np.int8)
    for i, category in enumerate(cat_values.to_pylist()):
        if category in _CATEGORY_KIND:
            kind_of_cat[i] = kind_code(_CATEGORY_KIND[category])
    kind = by_dictionary(cat, kind_of_cat)
    if device_kernels is not None:
        kind[device_kernels] = kind_code(SliceKind.KERNEL)
    name_values = dictionary_values(names)

    def matches(pattern: str) -> np.ndarray:
        return by_dictionary(names, _bools(pc.match_substring_regex(name_values, pattern)))

    code = kind_code
    kind[matches(assemble.STEP_NAME.pattern) & ~is_device & (kind == code(SliceKind.ANNOTATION))] = code(
        SliceKind.STEP
    )
    kind[matches(DATA_LOADING_NAME) & ~is_device] = code(SliceKind.DATA_LOADING)
    comm_kernel = matches(COMM_DEVICE_NAME) & is_device & (kind == code(SliceKind.KERNEL))
    kind[comm_kernel] = code(SliceKind.COMMUNICATION)
    host_op = (kind == code(SliceKind.CPU_OP)) | (kind == code(SliceKind.ANNOTATION))
    kind[matches(COMMUNICATION_HOST_OP_NAME) & ~is_device & host_op] = code(SliceKind.COMMUNICATION)
    return kind


def thread_track_names(rows: pa.Table | None) -> dict[tuple[int, int, bool], str]:
    """Thread names from ``thread_name`` metadata events (a handful of rows)."""
    names: dict[tuple[int, int, bool], str] = {}
    if rows is None:
        return names
    for pid, tid, label in zip(
        rows.column("pid").to_pylist(),
        rows.column("tid").to_pylist(),
        rows.column("label").to_pylist(),
        strict=True,
    ):
        if pid is None or tid is None or not label:
            continue
        names[(pid, tid, False)] = f"{label} ({tid})" if str(tid) not in label else label
    return names


def memory_table(events: pa.Table | None, rank: int) -> pa.Table:
    if events is None:
        return MEMORY_SCHEMA.empty_table()
    n = events.num_rows
    device_type_code = int_column(events.column("Device Type"), 0)
    return conform(
        pa.table(
            {
                "rank": np.full(n, rank, np.int32),
                "device_type": _device_types(device_type_code),
                "device_index": int_column(events.column("Device Id"), 0).astype(np.int32),
                "ts_ns": events.column("ts_ns"),
                "tid": int_column(events.column("tid")),
                "addr": int_column(events.column("Addr"), 0),
                "bytes": int_column(events.column("Bytes"), 0),
                "allocated_bytes": events.column("Total Allocated"),
                "reserved_bytes": events.column("Total Reserved"),
                "active_bytes": events.column("Total Active"),
            }
        ),
        MEMORY_SCHEMA,
    )


_DEVICE_TYPES = np.array(["cpu", "cuda", "device"])
"""c10 DeviceType codes 0 (CPU) and 1 (CUDA; HIP reports as CUDA), then every plug-in device."""


def _device_types(code: np.ndarray) -> pa.DictionaryArray:
    """Each allocator row's device type text, dictionary-encoded in order of first appearance (as
    ``dictionary_encode`` of the texts would: the per-row texts are never made)."""
    label = np.minimum(np.where(code < 0, 2, code), 2).astype(np.int32)  # index into _DEVICE_TYPES
    seen = columns.int64(pc.unique(pa.array(label)))  # first appearance order
    position = np.zeros(len(_DEVICE_TYPES), np.int32)
    position[seen] = np.arange(len(seen), dtype=np.int32)
    return pa.DictionaryArray.from_arrays(pa.array(position[label]), pa.array(_DEVICE_TYPES[seen].tolist()))


def _comm(
    slices: pa.Table,
    comm_args: pa.Table | None,
    kind: np.ndarray,
    is_device: np.ndarray,
    start: np.ndarray,
    dur: np.ndarray,
    step: np.ndarray,
    rank: int,
) -> pa.Table:
    """One row per communication op instance: device kernels, and host ops that carry
    collective metadata (or, without any metadata in the trace, the outermost host comm op)."""
    n = len(kind)
    # collective metadata spread back to slice rows (null where absent)
    meta_rows = np.full(n, -1, dtype=np.int64)
    if comm_args is not None:
        meta_rows[comm_args.column("row").to_numpy()] = np.arange(comm_args.num_rows)
    has_meta = meta_rows >= 0
    names = slices.column("name")
    device_rows, host_comm, fallback = comm_candidates(kind, is_device, names)
    if np.any(has_meta & host_comm):
        host_rows = has_meta & host_comm
    else:
        host_rows = outermost(slices.column("track").to_numpy(), start, start + dur, fallback)
    rows = np.flatnonzero(device_rows | host_rows)
    picked_meta = meta_rows[rows]
    if comm_args is None:
        comm_args = pa.table({key: pa.nulls(0, ARG_FIELDS[key]) for key in COMM_ARGS})
    with_meta = picked_meta >= 0
    take = (
        pa.array(np.where(with_meta, picked_meta, 0), mask=~with_meta)
        if len(rows)
        else pa.array([], pa.int64())
    )
    args = (
        comm_args.select(list(COMM_ARGS)).take(take)
        if comm_args.num_rows
        else pa.table({key: pa.nulls(len(rows), ARG_FIELDS[key]) for key in COMM_ARGS})
    )
    return comm_table(names, rows, args, is_device, start, dur, step, rank)


def comm_candidates(
    kind: np.ndarray, is_device: np.ndarray, names: pa.ChunkedArray | pa.Array
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(device communication rows, host communication rows, the host rows that count when no
    host row carries collective metadata: all but ``record_param_comms``, an empty marker beside
    the collective's own range, of which only the outermost per track count)."""
    is_comm = kind == kind_code(SliceKind.COMMUNICATION)
    host_comm = is_comm & ~is_device
    wrapper = by_dictionary(names, _bools(pc.equal(dictionary_values(names), "record_param_comms")))
    return is_comm & is_device, host_comm, host_comm & ~wrapper


def comm_table(
    names: pa.ChunkedArray | pa.Array,
    rows: np.ndarray,
    args: pa.Table,
    is_device: np.ndarray,
    start: np.ndarray,
    dur: np.ndarray,
    step: np.ndarray,
    rank: int,
) -> pa.Table:
    """The comm table of the slice ``rows`` picked, ``args`` their collective metadata (one row
    each, null where absent)."""
    row_names = pc.cast(pc.take(names, pa.array(rows, pa.int64())), pa.string())
    collective = _canonical_collective(pc.utf8_lower(pc.coalesce(args.column("Collective name"), row_names)))
    elem = _element_bytes(args.column("dtype"))
    in_n = int_column(args.column("In msg nelems"), -1)
    out_n = int_column(args.column("Out msg nelems"), -1)
    in_bytes = np.where((in_n >= 0) & (elem > 0), in_n * elem, -1)
    out_bytes = np.where((out_n >= 0) & (elem > 0), out_n * elem, -1)
    group = pc.coalesce(
        args.column("Process Group Name"), pc.cast(args.column("Process Group ID"), pa.string())
    )
    return conform(
        pa.table(
            {
                "rank": np.full(len(rows), rank, np.int32),
                "slice": rows.astype(np.int64),
                "is_device": is_device[rows],
                "collective": collective,
                "start_ns": start[rows],
                "dur_ns": dur[rows],
                "step": step[rows],
                "in_bytes": pa.array(in_bytes, pa.int64(), mask=in_bytes < 0),
                "out_bytes": pa.array(out_bytes, pa.int64(), mask=out_bytes < 0),
                "dtype": args.column("dtype"),
                "group": group,
                "group_ranks": args.column("Process Group Ranks"),
                "seq": args.column("Seq"),
                "peer": pc.coalesce(args.column("Dst Rank"), args.column("Src Rank")),
            }
        ),
        COMM_SCHEMA,
    )


def _canonical_collective(lower_names: pa.ChunkedArray | pa.Array) -> pa.Array:
    lower_names = pc.cast(lower_names, pa.string())
    unique = pc.unique(lower_names)
    mapping: dict[str, str] = {}
    for name in unique.to_pylist():
        compact = name.replace("_", "")
        mapping[name] = next((c for key, c in _COLLECTIVES if key.replace("_", "") in compact), name)
    keys = pa.array(list(mapping), pa.string())
    values = pa.array(list(mapping.values()), pa.string())
    return pc.take(values, pc.index_in(lower_names, keys))


def _element_bytes(dtype: pa.ChunkedArray) -> np.ndarray:
    lower = pc.utf8_lower(dtype.fill_null(""))
    keys = pa.array(list(_DTYPE_BYTES))
    idx = pc.index_in(lower, keys)
    sizes = np.array(list(_DTYPE_BYTES.values()), dtype=np.int64)
    idx_np = int_column(idx, -1)
    return np.where(idx_np >= 0, sizes[np.maximum(idx_np, 0)], 0)
