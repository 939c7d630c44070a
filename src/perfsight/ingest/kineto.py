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

import logging
import re
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from perfsight.ingest import assemble
from perfsight.ingest.chrome_events import RAW_SCHEMA, micros_to_ns, parse_batch
from perfsight.ingest.jsonstream import NotATraceError, stream_events
from perfsight.model import (
    COMM_SCHEMA,
    MEMORY_SCHEMA,
    NO_ID,
    SLICE_SCHEMA,
    DeviceInfo,
    RunMetadata,
    SliceKind,
    Trace,
    conform,
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

_DEVICE_CATEGORIES = ("kernel", "gpu_memcpy", "memcpy", "gpu_memset", "memset", "gpu_user_annotation")

COMM_DEVICE_NAME = r"(?i)^(nccl|rccl)|nccl.*kernel"
COMM_HOST_NAME = r"^(record_param_comms$|nccl:|gloo:|c10d::|ProcessGroup|c10d_functional::)"
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
    try:
        batches, report = stream_events(path)
    except NotATraceError as exc:
        raise TraceReadError(f"{path}: not a Chrome/Kineto trace: {exc}") from None
    except OSError as exc:
        raise TraceReadError(f"{path}: cannot open: {exc.strerror or exc}") from None
    tables: list[pa.Table] = []
    warnings: list[str] = []
    try:
        for batch in batches:
            parsed = parse_batch(batch)
            if parsed.table.num_rows:
                tables.append(parsed.table)
            if parsed.problem:
                warnings.append(
                    f"{path}: damaged at byte {parsed.damage_offset} of the decompressed JSON "
                    f"({parsed.problem}); kept the {sum(t.num_rows for t in tables)} events before it"
                )
                break
    except OSError as exc:
        warnings.append(f"{path}: read error after {sum(t.num_rows for t in tables)} events: {exc}")
    if report.truncated:
        warnings.append(f"{path}: truncated: {report.problem}")
    raw = pa.concat_tables(tables) if tables else RAW_SCHEMA.empty_table()
    meta = _metadata(path, report.header, rank, warnings)
    trace = _build(raw, meta, truncated=report.truncated or any("damaged" in w for w in warnings))
    for message in trace.meta.warnings:
        log.warning(message)
    return trace


def _metadata(path: Path, header: dict[str, Any], rank: int | None, warnings: list[str]) -> RunMetadata:
    dist = header.get("distributedInfo") if isinstance(header.get("distributedInfo"), dict) else {}
    meta = RunMetadata(sources=[str(path)], warnings=warnings, framework="pytorch")
    if rank is not None:
        meta.rank, meta.rank_source = int(rank), "option"
    elif isinstance(dist.get("rank"), int):
        meta.rank, meta.rank_source = dist["rank"], "trace"
    else:
        match = re.search(r"rank[-_]?(\d+)", path.name)
        if match:
            meta.rank, meta.rank_source = int(match.group(1)), "file name"
            warnings.append(f"{path}: no distributedInfo.rank; rank {meta.rank} taken from the file name")
        else:
            warnings.append(f"{path}: no distributedInfo.rank and none in the file name; assuming rank 0")
    if isinstance(dist.get("world_size"), int):
        meta.world_size = dist["world_size"]
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


def _column(raw: pa.Table, name: str) -> pa.ChunkedArray:
    return raw.column(name)


def _arg(raw: pa.Table, key: str) -> pa.ChunkedArray:
    return pc.struct_field(raw.column("args"), key)


def _ints(array: pa.ChunkedArray | pa.Array, default: int = NO_ID) -> np.ndarray:
    return array.fill_null(default).to_numpy().astype(np.int64, copy=False)


def _build(raw: pa.Table, meta: RunMetadata, truncated: bool) -> Trace:
    rank = meta.rank
    ph = raw.column("ph")
    complete = raw.filter(pc.equal(ph, "X"))
    memory = _memory(raw.filter(pc.and_(pc.equal(ph, "i"), pc.equal(raw.column("name"), "[memory]"))), rank)
    track_names = _track_names(raw.filter(pc.equal(ph, "M")))

    cat = pc.utf8_lower(complete.column("cat").fill_null(""))
    names = complete.column("name").fill_null("")
    n = complete.num_rows
    is_device = pc.is_in(cat, pa.array(_DEVICE_CATEGORIES)).to_numpy(zero_copy_only=False)
    kind = _kinds(cat, names, is_device)

    start = micros_to_ns(complete.column("ts"))
    dur = np.maximum(micros_to_ns(complete.column("dur")), 0)
    pid = _ints(complete.column("pid"))
    tid = _ints(complete.column("tid"))
    dev_col = _ints(_arg(complete, "device"))
    stream_col = _ints(_arg(complete, "stream"))
    # device rows live on (device, stream); Kineto already writes them as pid/tid
    pid = np.where(is_device & (dev_col != NO_ID), dev_col, pid)
    tid = np.where(is_device & (stream_col != NO_ID), stream_col, tid)
    track, tracks = assemble.assign_tracks(rank, pid, tid, is_device, track_names)
    depth = assemble.nesting_depth(track.astype(np.int64), start, dur)

    external = _ints(pc.coalesce(_arg(complete, "External id"), _arg(complete, "external id")))
    correlation = _ints(_arg(complete, "correlation"))

    steps, inferred = assemble.step_windows(rank, names, kind, is_device, start, dur)
    if inferred:
        meta.warnings.append(
            f"{meta.sources[0]}: no ProfilerStep markers; the whole trace is one step (step 0)"
        )
    step = assemble.step_of(start, steps)
    src, dst = assemble.launch_links(correlation, is_device, kind)
    step = assemble.device_step(step, is_device, src, dst, start, steps)
    on_device = is_device & (kind != SliceKind.DEVICE_ANNOTATION.value)
    steps = assemble.device_windows(steps, step, on_device, start, start + dur)
    if truncated and steps.num_rows:
        complete_flags = np.ones(steps.num_rows, bool)
        complete_flags[-1] = False
        steps = steps.set_column(
            steps.schema.get_field_index("complete"), "complete", pa.array(complete_flags)
        )

    slices = conform(
        pa.table(
            {
                "rank": np.full(n, rank, np.int32),
                "kind": pa.array(kind).dictionary_encode(),
                "category": complete.column("cat").dictionary_encode(),
                "name": names.dictionary_encode(),
                "is_device": is_device,
                "pid": pid,
                "tid": tid,
                "track": track,
                "start_ns": start,
                "dur_ns": dur,
                "depth": depth,
                "correlation": correlation,
                "external_id": external,
                "step": step,
                "input_dims": _arg(complete, "Input Dims"),
                "input_types": _arg(complete, "Input type"),
                "grid": _arg(complete, "grid"),
                "block": _arg(complete, "block"),
                "occupancy_pct": _arg(complete, "est. achieved occupancy %"),
                "bytes": _arg(complete, "bytes"),
            }
        ),
        SLICE_SCHEMA,
    )
    flows = assemble.flows_table(rank, src, dst, "launch")
    comm = _comm(complete, slices, kind, is_device, start, dur, step, rank)
    return Trace(slices=slices, tracks=tracks, memory=memory, flows=flows, steps=steps, comm=comm, meta=meta)


def _kinds(cat: pa.ChunkedArray, names: pa.ChunkedArray, is_device: np.ndarray) -> np.ndarray:
    kind = np.full(len(cat), SliceKind.OTHER.value, dtype=object)
    cat_np = np.asarray(cat.to_numpy(zero_copy_only=False), dtype=object)
    for category, value in _CATEGORY_KIND.items():
        kind[cat_np == category] = value.value
    is_step = pc.match_substring_regex(names, assemble.STEP_NAME.pattern).to_numpy(zero_copy_only=False)
    kind[is_step & ~is_device & (kind == SliceKind.ANNOTATION.value)] = SliceKind.STEP.value
    loading = pc.match_substring_regex(names, DATA_LOADING_NAME).to_numpy(zero_copy_only=False)
    kind[loading & ~is_device] = SliceKind.DATA_LOADING.value
    comm_dev = pc.match_substring_regex(names, COMM_DEVICE_NAME).to_numpy(zero_copy_only=False)
    kind[comm_dev & is_device & (kind == SliceKind.KERNEL.value)] = SliceKind.COMMUNICATION.value
    comm_host = pc.match_substring_regex(names, COMM_HOST_NAME).to_numpy(zero_copy_only=False)
    host_op = (kind == SliceKind.CPU_OP.value) | (kind == SliceKind.ANNOTATION.value)
    kind[comm_host & ~is_device & host_op] = SliceKind.COMMUNICATION.value
    return kind.astype(str)


def _track_names(meta_events: pa.Table) -> dict[tuple[int, int, bool], str]:
    """Thread names from ``thread_name`` metadata events (a handful of rows)."""
    names: dict[tuple[int, int, bool], str] = {}
    rows = meta_events.filter(pc.equal(meta_events.column("name"), "thread_name"))
    for pid, tid, args in zip(
        rows.column("pid").to_pylist(),
        rows.column("tid").to_pylist(),
        rows.column("args").to_pylist(),
        strict=True,
    ):
        if pid is None or tid is None or not args or not args.get("name"):
            continue
        label = str(args["name"])
        names[(pid, tid, False)] = f"{label} ({tid})" if str(tid) not in label else label
    return names


def _memory(events: pa.Table, rank: int) -> pa.Table:
    n = events.num_rows
    device_type_code = _ints(_arg(events, "Device Type"), 0)
    # c10 DeviceType codes: 0 CPU, 1 CUDA, 20 PrivateUse1 (NPU and other plug-ins); HIP reports as CUDA
    labels = np.where(device_type_code == 0, "cpu", np.where(device_type_code == 1, "cuda", "device"))
    return conform(
        pa.table(
            {
                "rank": np.full(n, rank, np.int32),
                "device_type": pa.array(labels.astype(str)).dictionary_encode()
                if n
                else pa.array([], pa.string()),
                "device_index": _ints(_arg(events, "Device Id"), 0).astype(np.int32),
                "ts_ns": micros_to_ns(events.column("ts")),
                "tid": _ints(events.column("tid")),
                "addr": _ints(_arg(events, "Addr"), 0),
                "bytes": _ints(_arg(events, "Bytes"), 0),
                "allocated_bytes": _arg(events, "Total Allocated"),
                "reserved_bytes": _arg(events, "Total Reserved"),
                "active_bytes": _arg(events, "Total Active"),
            }
        ),
        MEMORY_SCHEMA,
    )


def _comm(
    complete: pa.Table,
    slices: pa.Table,
    kind: np.ndarray,
    is_device: np.ndarray,
    start: np.ndarray,
    dur: np.ndarray,
    step: np.ndarray,
    rank: int,
) -> pa.Table:
    """One row per communication op instance: device kernels, and host ops that carry
    collective metadata (or, without any metadata in the trace, the outermost host comm op)."""
    collective_meta = _arg(complete, "Collective name")
    has_meta = collective_meta.is_valid().to_numpy(zero_copy_only=False)
    is_comm = kind == SliceKind.COMMUNICATION.value
    device_rows = is_comm & is_device
    host_comm = is_comm & ~is_device
    if np.any(has_meta & host_comm):
        host_rows = has_meta & host_comm
    else:
        # without metadata, record_param_comms is an empty marker beside the collective's own range
        wrapper = pc.equal(complete.column("name"), "record_param_comms").to_numpy(zero_copy_only=False)
        candidates = host_comm & ~wrapper
        host_rows = assemble.outermost(slices.column("track").to_numpy(), start, start + dur, candidates)
    rows = np.flatnonzero(device_rows | host_rows)
    picked = complete.take(pa.array(rows))
    name_source = pc.coalesce(
        pc.struct_field(picked.column("args"), "Collective name"), picked.column("name")
    )
    collective = _canonical_collective(pc.utf8_lower(name_source.fill_null("")))
    dtype = pc.struct_field(picked.column("args"), "dtype")
    elem = _element_bytes(dtype)
    in_n = _ints(pc.struct_field(picked.column("args"), "In msg nelems"), -1)
    out_n = _ints(pc.struct_field(picked.column("args"), "Out msg nelems"), -1)
    in_bytes = np.where((in_n >= 0) & (elem > 0), in_n * elem, -1)
    out_bytes = np.where((out_n >= 0) & (elem > 0), out_n * elem, -1)
    args = picked.column("args")
    group = pc.coalesce(
        pc.struct_field(args, "Process Group Name"),
        pc.cast(pc.struct_field(args, "Process Group ID"), pa.string()),
    )
    seq = pc.struct_field(args, "Seq")
    peer = pc.coalesce(pc.struct_field(args, "Dst Rank"), pc.struct_field(args, "Src Rank"))
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
                "dtype": dtype,
                "group": group,
                "group_ranks": pc.struct_field(args, "Process Group Ranks"),
                "seq": seq,
                "peer": peer,
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
    idx_np = _ints(idx, -1)
    return np.where(idx_np >= 0, sizes[np.maximum(idx_np, 0)], 0)
