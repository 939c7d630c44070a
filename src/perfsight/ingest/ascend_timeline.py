"""Turn the raw events of an Ascend ``trace_view.json`` into the trace model's tables.

Ascend names its timeline's processes with ``M`` events, and the process says
what an event is:

* ``Python`` (torch_npu's framework process; MindSpore's is named after the
  framework too): host ops -- ``cpu_op`` -> ``cpu_op``, ``ProfilerStep#N`` ->
  ``step``, ``python_function`` -> ``python``, ``enumerate(DataLoader)...`` ->
  ``data_loading``, anything else (``enqueue``/``dequeue``) -> ``other``.
* ``CANN``: AscendCL / runtime / ``Node@launch`` calls -> ``runtime`` on host threads.
* ``Ascend Hardware``: device tasks, one lane per stream.  Kernels (AI Core,
  AI Vector, AI CPU, MIX, DSA task types) -> ``kernel``; HCCL's own tasks
  (``Notify Wait``, ``Write Value``, ``SDMA``, ``RDMA``...) -> ``communication``;
  ``MEMCPY_ASYNC``, events, placeholders and profiling markers -> ``other``: Ascend
  counts them neither as computing nor as communication, and perfsight agrees.  When the
  source says which task-info table names a task (the database: ``task_info``), that decides
  instead of the task type: compute -> ``kernel``, communication -> ``communication``, neither
  (the HCCL op's own ``AI_CORE`` task, events, copies, undescribed kernels) -> ``other``.
* ``HCCL``: lane ``Group N Communication`` holds the communication ops
  (``hcom_allReduce__586_0_1``: rows of ``comm``); lanes ``Plane N`` hold their
  transfer and notification tasks (rows of ``comm_tasks``).  Both are
  ``communication`` slices on the device.
* ``Overlap Analysis`` is Ascend's own result (perfsight recomputes it) and is
  skipped; counter (``C``) processes (HBM, LLC, QoS...) are not slices.

Device lanes get ``pid`` = the device index and ``tid`` = the stream id, or
:data:`HCCL_TID_BASE` + the HCCL lane, so that one device's lanes never collide.
``connection_id`` is the correlation: it links each CANN call to the device
tasks and HCCL op it launched, which gives device work the step of its launch.

This module must not compute metrics; it only labels, links and places events.
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from perfsight import columns
from perfsight.ingest import assemble
from perfsight.ingest.ascend_events import read_ascend_events
from perfsight.ingest.chrome_events import micros_to_ns
from perfsight.model import (
    COMM_SCHEMA,
    COMM_TASK_SCHEMA,
    FLOW_SCHEMA,
    NO_ID,
    SLICE_SCHEMA,
    STEP_SCHEMA,
    TRACK_SCHEMA,
    SliceKind,
    conform,
    kind_code,
)
from perfsight.units import NS_PER_US

SLICE_TYPE = SLICE_SCHEMA.field("op_type").type
"""The dictionary type of ``op_type`` / ``core_type``."""

HCCL_TID_BASE = 1 << 20
"""Added to an HCCL lane's tid so that it never collides with a hardware stream id."""

INVALID_ID = 4294967295
"""Ascend's "no value" for 32-bit ids (``dst rank`` of a local reduce, ``model id``)."""

CPU_OP_PROCESSES = ("CPU OP",)
"""Processes of MindSpore's CPU timeline whose slices are framework operators."""

SCOPE_PROCESSES = ("Scope Layer",)
"""MindSpore's name-scope lane: ranges, not ops."""

KERNEL_TASK = r"AI_CORE|AI_VECTOR|AI_CPU|AICPU|AIV|AIC|MIX|DSA|FFTS|KERNEL|VECTOR"
HCCL_TASK = r"(?i)^(notify|write.?value|sdma$|rdma|reduce.?inline|memcpy$|hccl)"
TS_PATTERN = r"^(-?\d+)(\.\d{1,3})?\d*$"
"""A timestamp in decimal microseconds; digits past the nanosecond are dropped."""
STEP_PATTERN = r"^ProfilerStep#\d+$"
DATA_LOADING_PREFIX = "enumerate(DataLoader)"
DTYPE_BYTES = {"INT8": 1, "UINT8": 1, "INT16": 2, "UINT16": 2, "FP16": 2, "BFP16": 2, "BF16": 2,
               "INT32": 4, "UINT32": 4, "FP32": 4, "INT64": 8, "UINT64": 8, "FP64": 8}  # fmt: skip
COLLECTIVES = (
    ("allreduce", "all_reduce"),
    ("allgather", "all_gather"),
    ("reducescatter", "reduce_scatter"),
    ("alltoall", "all_to_all"),
    ("broadcast", "broadcast"),
    ("batchsendrecv", "send_recv"),
    ("send", "send"),
    ("receive", "recv"),
    ("recv", "recv"),
    ("reduce", "reduce"),
    ("barrier", "barrier"),
    ("scatter", "scatter"),
    ("gather", "gather"),
)
"""hcom op name fragment (lower case, no underscores) -> canonical collective, first match wins."""


@dataclasses.dataclass
class Timeline:
    """What one ``trace_view.json`` holds, in model tables (before steps and meta are final)."""

    slices: pa.Table
    tracks: pa.Table
    flows: pa.Table
    steps: pa.Table
    comm: pa.Table
    comm_tasks: pa.Table
    warnings: list[str]
    max_rank_seen: int

    @classmethod
    def empty(cls) -> Timeline:
        """No events (a rank folder with memory records only): every table empty, with its columns."""
        return cls(
            SLICE_SCHEMA.empty_table(),
            TRACK_SCHEMA.empty_table(),
            FLOW_SCHEMA.empty_table(),
            STEP_SCHEMA.empty_table(),
            COMM_SCHEMA.empty_table(),
            COMM_TASK_SCHEMA.empty_table(),
            [],
            -1,
        )

    def tables(self) -> dict[str, pa.Table]:
        """The model tables by :class:`~perfsight.model.Trace` field name (``Trace(**tables, ...)``)."""
        return {
            "slices": self.slices,
            "tracks": self.tracks,
            "flows": self.flows,
            "steps": self.steps,
            "comm": self.comm,
            "comm_tasks": self.comm_tasks,
        }


def collective_of(names: list[str]) -> list[str]:
    """Canonical collective of each hcom op name (``hcom_allReduce__586_0_1`` -> ``all_reduce``)."""
    out = []
    for name in names:
        key = name.lower().replace("_", "").removeprefix("hcom")
        out.append(next((c for frag, c in COLLECTIVES if key.startswith(frag)), "other"))
    return out


def _matches(values: pa.Array, pattern: str) -> np.ndarray:
    return columns.numpy(pc.match_substring_regex(pc.fill_null(values, ""), pattern), null=False)


def _equals(values: pa.Array, text: str) -> np.ndarray:
    return columns.numpy(pc.equal(pc.fill_null(values, ""), text), null=False)


def _process_names(events: pa.Table) -> tuple[dict[int, str], dict[tuple[int, int], str]]:
    meta = events.filter(pc.equal(events.column("ph"), "M"))
    procs: dict[int, str] = {}
    threads: dict[tuple[int, int], str] = {}
    for row in meta.select(["name", "pid", "tid", "args.name"]).to_pylist():  # metadata: a few rows
        if row["args.name"] is None or row["pid"] is None:
            continue
        if row["name"] == "process_name":
            procs[row["pid"]] = row["args.name"]
        elif row["name"] == "thread_name":
            threads[(row["pid"], row["tid"] or 0)] = row["args.name"]
    return procs, threads


def read_timeline(path: Path, rank: int, device: int, groups: dict[str, str] | None = None) -> Timeline:
    """Read ``path`` (an Ascend ``trace_view.json``) as rank ``rank`` on device ``device``.

    ``groups`` maps an hcom op name to its communication group when another file knows it
    (``communication.json`` keys are ``name@group``); otherwise the HCCL lane's name is used.
    """
    parsed = read_ascend_events(path)
    warnings: list[str] = []
    if parsed.report.problem or parsed.report.truncated:
        warnings.append(
            f"{path}: damaged or truncated after {parsed.report.events} events "
            f"({parsed.report.problem or 'file ends inside the event array'}); the rest is kept"
        )
    timeline = timeline_from_events(parsed.table, rank, device, groups)
    timeline.warnings = warnings + [f"{path}: {w}" for w in timeline.warnings]
    return timeline


def timeline_from_events(
    events: pa.Table, rank: int, device: int, groups: dict[str, str] | None = None
) -> Timeline:
    """The model tables of raw events in :data:`~perfsight.ingest.ascend_events.FLAT_SCHEMA`
    (from ``trace_view.json``, a profiler database, or MindSpore's ``FRAMEWORK`` files).
    Its warnings do not name the source: the caller prefixes them."""
    warnings: list[str] = []
    procs, threads = _process_names(events)
    ts = pc.replace_substring_regex(pc.utf8_trim_whitespace(events.column("ts")), TS_PATTERN, r"\1\2")
    is_x = pc.equal(events.column("ph"), "X")
    has_ns = pc.and_(pc.is_valid(events.column("start_ns")), pc.is_valid(events.column("dur_ns")))
    timed = pc.or_(pc.fill_null(pc.match_substring_regex(ts, r"^-?\d{1,18}(\.\d{1,3})?$"), False), has_ns)
    untimed = pc.sum(pc.and_(is_x, pc.invert(pc.fill_null(timed, False)))).as_py() or 0
    if untimed:
        warnings.append(f"{untimed} slice event(s) without a usable timestamp skipped")
    events = events.set_column(events.schema.get_field_index("ts"), "ts", ts)
    x = events.filter(pc.and_(is_x, pc.fill_null(timed, False)))
    pid = columns.int64(x.column("pid"), NO_ID)
    tid = columns.int64(x.column("tid"), 0)
    role = np.array([procs.get(p, "") for p in np.unique(pid).tolist()], dtype=object)
    role_of = role[np.searchsorted(np.unique(pid), pid)] if pid.size else np.zeros(0, object)
    keep = role_of != "Overlap Analysis"
    x, pid, tid, role_of = x.filter(pa.array(keep)), pid[keep], tid[keep], role_of[keep]

    start, dur = _times(x)
    names = x.column("name").combine_chunks() if x.num_rows else pa.array([], pa.string())
    names = pc.fill_null(names, "")
    cat = x.column("cat").combine_chunks() if x.num_rows else pa.array([], pa.string())
    task_type = x.column("args.Task Type").combine_chunks() if x.num_rows else pa.array([], pa.string())

    is_hw = role_of == "Ascend Hardware"
    is_hccl = role_of == "HCCL"
    is_cann = role_of == "CANN"
    lanes, lane_of = np.unique(np.stack([pid, tid], axis=1).reshape(-1, 2), axis=0, return_inverse=True)
    lane_of = lane_of.reshape(-1)
    names_by_lane = [threads.get((int(p), int(t)), "") for p, t in lanes.tolist()]  # one per lane
    lane_name = np.array(names_by_lane + [""], dtype=object)[lane_of if lane_of.size else []]
    plane_by_lane = np.array(
        [int(m.group(1)) if (m := re.fullmatch(r"Plane (\d+)", n)) else NO_ID for n in names_by_lane]
        + [NO_ID],
        dtype=np.int64,
    )
    lane_plane = plane_by_lane[lane_of] if lane_of.size else np.zeros(0, np.int64)
    is_plane = is_hccl & (lane_plane != NO_ID)
    is_group = is_hccl & ~is_plane
    is_device = is_hw | is_hccl  # every other process (Python, CANN, MindSpore's CPU OP) is the host

    kind = np.full(x.num_rows, kind_code(SliceKind.OTHER), dtype=np.int8)
    host = ~is_device & ~is_cann
    kind[host & (_equals(cat, "cpu_op") | np.isin(role_of, CPU_OP_PROCESSES))] = kind_code(SliceKind.CPU_OP)
    kind[host & np.isin(role_of, SCOPE_PROCESSES)] = kind_code(SliceKind.ANNOTATION)
    kind[host & _equals(cat, "python_function")] = kind_code(SliceKind.PYTHON)
    kind[host & _equals(cat, "user_annotation")] = kind_code(SliceKind.ANNOTATION)
    kind[host & columns.numpy(pc.starts_with(names, DATA_LOADING_PREFIX), null=False)] = kind_code(
        SliceKind.DATA_LOADING
    )
    kind[host & _matches(names, STEP_PATTERN)] = kind_code(SliceKind.STEP)
    kind[is_cann] = kind_code(SliceKind.RUNTIME)
    kind[is_hw & _matches(task_type, KERNEL_TASK)] = kind_code(SliceKind.KERNEL)
    kind[is_hw & _matches(task_type, HCCL_TASK)] = kind_code(SliceKind.COMMUNICATION)
    kind[is_hw & (_equals(names, "MEMCPY_ASYNC") | _matches(task_type, "EVENT|PLACE_HOLDER"))] = kind_code(
        SliceKind.OTHER
    )
    kind[is_hccl] = kind_code(SliceKind.COMMUNICATION)
    info = x.column("task_info").combine_chunks() if x.num_rows else pa.array([], pa.string())
    recorded = is_hw & columns.numpy(pc.is_valid(info), null=False)  # the database's task-info tables
    kind[recorded] = kind_code(SliceKind.OTHER)  # "none": neither computing nor communication
    kind[recorded & _equals(info, "compute")] = kind_code(SliceKind.KERNEL)
    kind[recorded & _equals(info, "communication")] = kind_code(SliceKind.COMMUNICATION)

    out_pid = np.where(is_device, device, pid)
    out_tid = np.where(is_hccl, HCCL_TID_BASE + tid, tid)
    lane_label = {}
    first = np.unique(lane_of, return_index=True)[1] if lane_of.size else np.zeros(0, np.int64)
    for i in first.tolist():  # one per lane
        proc = procs.get(int(pid[i]), "")
        thread = threads.get((int(pid[i]), int(tid[i])), f"thread {tid[i]}")
        lane_label[(int(out_pid[i]), int(out_tid[i]), bool(is_device[i]))] = f"{proc} {thread}".strip()
    track, tracks = assemble.assign_tracks(rank, out_pid, out_tid, is_device, lane_label)
    correlation = columns.int64(x.column("args.connection_id"), NO_ID)

    category = pc.coalesce(cat, task_type, pa.array(role_of.astype(str)))
    steps, _ = assemble.steps_from_markers(rank, names, kind, is_device, start, dur)
    step = assemble.step_of(start, steps)
    src, dst = assemble.launch_links(correlation, is_device, kind)
    step = assemble.device_step(step, is_device, src, dst, start, steps)
    on_device = is_device & np.isin(
        kind, [kind_code(SliceKind(k)) for k in ("kernel", "memcpy", "memset", "communication")]
    )
    steps = assemble.device_windows(steps, step, on_device, start, start + dur)
    slices = assemble.slice_table(
        rank, kind, category, names, is_device, out_pid, out_tid, track, start, dur, step, correlation
    )
    slices = _with_vendor_types(slices, x, is_group, is_hw & (kind == kind_code(SliceKind.KERNEL)))
    flows = assemble.flows_table(rank, src, dst, "launch")
    comm, comm_tasks, max_rank = _comm_tables(
        x, rank, step, start, dur, is_group, is_plane, lane_name, lane_plane, groups
    )
    return Timeline(slices, tracks, flows, steps, comm, comm_tasks, warnings, max_rank)


def _times(x: pa.Table) -> tuple[np.ndarray, np.ndarray]:
    """Start and duration (ns) of each timed event: the source's integer ns when it records them
    (the database), else ``ts`` (exact decimal µs text) and ``dur`` (float µs, rounded to the ns)."""
    has_ns = columns.numpy(pc.is_valid(x.column("start_ns")), null=False)
    start = np.zeros(x.num_rows, np.int64)
    dur = np.zeros(x.num_rows, np.int64)
    if has_ns.any():
        start[has_ns] = columns.int64(x.column("start_ns").filter(pa.array(has_ns)), 0)
        dur[has_ns] = columns.int64(x.column("dur_ns").filter(pa.array(has_ns)), 0)
    if not has_ns.all():
        text = x.filter(pa.array(~has_ns))
        start[~has_ns] = columns.int64(micros_to_ns(pc.cast(text.column("ts"), pa.decimal128(24, 3))))
        micros = columns.numpy(text.column("dur"), null=0.0).astype(np.float64)
        dur[~has_ns] = np.round(micros * NS_PER_US).astype(np.int64)
    return start, np.maximum(dur, 0)


HCOM_SUFFIX = r"_\d+(_\d+)*$"
"""The instance numbers of an hcom op's name (``hcom_allReduce__586_0_1`` -> ``hcom_allReduce_``)."""

HCCL_CORE = "HCCL"
"""The core type Ascend gives an hcom op in ``kernel_details.csv``."""


def _with_vendor_types(
    slices: pa.Table, x: pa.Table, is_group: np.ndarray, is_kernel: np.ndarray
) -> pa.Table:
    """Fill ``op_type`` / ``core_type``: what the source recorded for a device task (the database's
    ``COMPUTE_TASK_INFO``); for a kernel without a recorded core, its task type (``AI_CORE``,
    ``KERNEL_AIVEC``); for an hcom op its name without instance numbers and ``HCCL``, as Ascend's
    ``kernel_details.csv`` types them."""
    op_type = x.column("op_type").combine_chunks() if x.num_rows else pa.array([], pa.string())
    core_type = x.column("core_type").combine_chunks() if x.num_rows else pa.array([], pa.string())
    task_type = x.column("args.Task Type").combine_chunks() if x.num_rows else pa.array([], pa.string())
    core_type = pc.if_else(pa.array(is_kernel), pc.coalesce(core_type, task_type), core_type)
    names = pc.fill_null(x.column("name"), "").combine_chunks() if x.num_rows else pa.array([], pa.string())
    group = pa.array(is_group)
    op_type = pc.if_else(group, pc.replace_substring_regex(names, HCOM_SUFFIX, ""), op_type)
    core_type = pc.if_else(group, pa.scalar(HCCL_CORE), core_type)
    slices = slices.set_column(
        slices.schema.get_field_index("op_type"), "op_type", pc.dictionary_encode(op_type).cast(SLICE_TYPE)
    )
    return slices.set_column(
        slices.schema.get_field_index("core_type"),
        "core_type",
        pc.dictionary_encode(core_type).cast(SLICE_TYPE),
    )


def _comm_tables(
    x: pa.Table,
    rank: int,
    step: np.ndarray,
    start: np.ndarray,
    dur: np.ndarray,
    is_group: np.ndarray,
    is_plane: np.ndarray,
    lane_name: np.ndarray,
    lane_plane: np.ndarray,
    groups: dict[str, str] | None,
) -> tuple[pa.Table, pa.Table, int]:
    """``comm`` rows for the HCCL ops and ``comm_tasks`` rows for their plane tasks."""
    ops = np.flatnonzero(is_group)
    ops = ops[np.argsort(start[ops], kind="stable")]
    op_names = x.column("name").take(pa.array(ops, pa.int64())).to_pylist()
    dtype = x.column("args.data_type").take(pa.array(ops, pa.int64())).to_pylist()
    count = columns.int64(x.column("args.count").take(pa.array(ops, pa.int64())), NO_ID)
    size = np.array([DTYPE_BYTES.get(str(d).upper(), 0) for d in dtype], np.int64)
    nbytes = np.where((count >= 0) & (size > 0), count * size, -1)
    lanes = [re.sub(r"\s*Communication$", "", str(lane_name[i])) for i in ops]  # one per op
    group = [(groups or {}).get(name or "", lane) for name, lane in zip(op_names, lanes, strict=True)]
    comm = conform(
        pa.table(
            {
                "rank": np.full(ops.size, rank, np.int32),
                "slice": ops.astype(np.int64),
                "is_device": np.ones(ops.size, bool),
                "collective": collective_of([n or "" for n in op_names]),
                "start_ns": start[ops],
                "dur_ns": dur[ops],
                "step": step[ops].astype(np.int32),
                "in_bytes": pa.array(nbytes, pa.int64(), mask=nbytes < 0),
                "out_bytes": pa.array(nbytes, pa.int64(), mask=nbytes < 0),
                "dtype": pa.array([d.lower() if d else None for d in dtype], pa.string()),
                "group": pa.array(group, pa.string()),
                "name": pa.array(op_names, pa.string()),
            }
        ),
        COMM_SCHEMA,
    )
    tasks = np.flatnonzero(is_plane)
    # a task belongs to the op whose interval holds its start (the latest op started by then)
    op_start, op_end = start[ops], start[ops] + dur[ops]
    at = np.searchsorted(op_start, start[tasks], side="right") - 1
    inside = (at >= 0) & (start[tasks] <= op_end[np.maximum(at, 0)])
    op_of = np.where(inside, at, NO_ID)
    plane = lane_plane[tasks]
    take = pa.array(tasks, pa.int64())
    plane_arg = columns.int64(x.column("args.plane id").take(take), NO_ID)
    plane = np.where(plane_arg != NO_ID, plane_arg, plane)

    def ranks(col: str) -> pa.Array:
        values = columns.int64(x.column(col).take(take), NO_ID)
        return pa.array(values, pa.int64(), mask=(values == NO_ID) | (values == INVALID_ID))

    link = pc.fill_null(x.column("args.link type").take(take), "")
    link = pc.if_else(pc.equal(link, "INVALID_TYPE"), pa.scalar(None, pa.string()), link)
    link = pc.if_else(pc.equal(link, ""), pa.scalar(None, pa.string()), link)
    task_type = pc.coalesce(x.column("args.task type").take(take), x.column("name").take(take))
    src, dst = ranks("args.src rank"), ranks("args.dst rank")
    comm_tasks = conform(
        pa.table(
            {
                "rank": np.full(tasks.size, rank, np.int32),
                "op": op_of.astype(np.int64),
                "slice": tasks.astype(np.int64),
                "plane": plane.astype(np.int32),
                "task_type": pc.fill_null(task_type, ""),
                "start_ns": start[tasks],
                "dur_ns": dur[tasks],
                "transport": x.column("args.transport type").take(take),
                "link": link,
                "rdma_type": x.column("args.rdma type").take(take),
                "bytes": pc.fill_null(x.column("args.size(Byte)").take(take), 0),
                "src_rank": src,
                "dst_rank": dst,
            }
        ),
        COMM_TASK_SCHEMA,
    )
    seen = [v for v in (pc.max(src).as_py(), pc.max(dst).as_py()) if v is not None]
    return comm, comm_tasks, max(seen) if seen else -1
