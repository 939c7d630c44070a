"""One rank of MindInsight's legacy ``profiler/`` layout as a :class:`~perfsight.model.Trace`.

Why a trace and not only tables: as a trace, an old run goes through the same analyses, outputs,
cache, cluster analysis and web UI as every other input.  What each file gives:

* ``step_trace_raw_{n}_detail_time.csv`` -> ``steps`` (one per row, device clock, 10 ns ticks).
  MindInsight placed the FP and BP points with the graph's op order, which the files do not keep,
  so its step trace cannot be recomputed: MindInsight's own is kept in ``Trace.vendor.step_trace``
  as a cross-check beside perfsight's (which places FP/BP by the ops it finds), and a warning says so.
* ``ascend_timeline_display_{n}.json`` -> ``slices``.  MindSpore 1.x numbers its processes: the
  device id holds the AI Core ops (``tid`` = stream; ``tid`` 100000 is its own ``Steps`` lane,
  skipped as the steps come from the step trace; 100001 is the ``Scope Name`` lane, kept as device
  annotations), 9000 AI CPU ops, 10000 communication ops, 11000 host CPU ops, 12000 its overlap
  analysis (a result: skipped, perfsight recomputes it), 13000 GPU activities.  Times are
  microseconds.  With it, overlap breakdown, operators and communication are perfsight's own.
* No timeline: the per-stream communication intervals of the step trace become the
  ``communication`` slices; compute time is unknown (``meta.compute_recorded`` is false), so the
  overlap breakdown is empty (never "100 % free") and a warning says why.
* ``hccl_raw_{n}.csv`` has no timestamps per op, so it cannot become ``comm`` rows: its per-step
  communication/wait cost and per-link time, size and bandwidth are vendor tables
  (``Trace.vendor.tables``) ``mindinsight_hccl_steps`` / ``mindinsight_hccl_links`` (ns, bytes, bytes/s).
* ``ascend_cluster_analyse_*_{n}.csv`` (MindSpore's own breakdown for MindInsight's cluster page) ->
  vendor table ``mindinsight_cluster_analyse`` in ns (``perfsight.ingest.mindinsight_cluster``), and
  a labelled note with the file's ms.
* ``profiler_info_{n}.json`` (rank), the r1.3 rank table (global rank, world size), the
  ``ascend_cluster_analyse_*`` file name (parallel mode, rank count), ``flops_{n}.txt``,
  ``minddata_pipeline_raw_{n}.csv`` -> ``meta`` (``extra["mindinsight"]``).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from perfsight import columns
from perfsight.ingest import ascend_files as files
from perfsight.ingest import assemble
from perfsight.ingest import mindinsight_cluster as cluster_files
from perfsight.ingest import mindinsight_minddata as minddata
from perfsight.ingest import mindinsight_pipeline as pipeline_files
from perfsight.ingest.ascend_timeline import TS_PATTERN, collective_of
from perfsight.ingest.chrome_events import micros_to_ns
from perfsight.ingest.kineto import TraceReadError
from perfsight.ingest.mindinsight_flops import summary_text
from perfsight.ingest.mindinsight_legacy import LegacyRank, read_rank_of
from perfsight.ingest.mindinsight_ops import (
    AI_CPU_OPS_TABLE,
    read_aicpu_ops,
    read_framework_raw,
    timeline_offset_ns,
    with_op_facts,
)
from perfsight.model import (
    COMM_SCHEMA,
    NO_ID,
    STEP_SCHEMA,
    TRACK_SCHEMA,
    DeviceInfo,
    RunMetadata,
    SliceKind,
    Trace,
    VendorResults,
    conform,
    kind_code,
)
from perfsight.units import NS_PER_MS, NS_PER_US

AI_CPU_PID, COMMUNICATION_PID, HOST_CPU_PID, OVERLAP_PID, GPU_ACTIVITY_PID = 9000, 10000, 11000, 12000, 13000
STEPS_TID, SCOPE_NAME_TID = 100000, 100001
LANE_BASE = {AI_CPU_PID: 1 << 20, COMMUNICATION_PID: 2 << 20, GPU_ACTIVITY_PID: 3 << 20}
"""Added to the tid of a device lane outside the AI Core process, so that lanes never collide."""
STREAM_TID_BASE = 4 << 20
"""Lanes of the step trace's per-stream communication intervals (no timeline)."""


def read_legacy_trace(path: str | Path, rank: int | None = None) -> Trace:
    """The rank of ``path`` (its ``step_trace_raw_{n}_detail_time.csv``) as a trace.

    ``rank`` is used only when neither the rank table nor ``profiler_info_{n}.json`` gives one.
    Raises :class:`TraceReadError` when the rank has neither steps nor a timeline.
    """
    step_file = Path(path)
    problems = files.FileProblems()
    legacy, rank_table = read_rank_of(step_file, problems)
    the_rank, rank_source = _rank(legacy, rank_table, rank)
    legacy.rank = the_rank
    device = (
        legacy.device_id if legacy.device_id is not None else _int(legacy.info.get("device_id"), the_rank)
    )
    steps = _steps(legacy, the_rank)
    vendor = VendorResults()
    compute_recorded = True
    if legacy.step_trace.num_rows:
        vendor.step_trace = _with_rank(legacy.step_trace, the_rank)
        problems.add(
            step_file,
            "MindInsight's own step trace (iteration interval, forward+backward, tail) is kept as table "
            f"{VendorResults.STEP_TRACE_TABLE}, a cross-check beside perfsight's: its FP/BP points follow "
            "the graph's op order, which a legacy run does not keep",
        )
    if legacy.flops_ops is not None and legacy.flops_ops.num_rows:
        ranks = pa.array(np.full(legacy.flops_ops.num_rows, the_rank, np.int32))
        vendor.tables["mindinsight_flops"] = legacy.flops_ops.add_column(0, "rank", ranks)
    if legacy.flops:
        problems.add(
            step_file.parent / f"flops_{legacy.device_id}.txt",
            f"MindInsight's FLOPs summary: {summary_text(legacy.flops)}",
        )
    minddata = _minddata(legacy, step_file.parent, the_rank, vendor, problems)
    aicpu_file = step_file.parent / f"aicpu_intermediate_{legacy.device_id}.csv"
    if aicpu_file.is_file():
        aicpu = read_aicpu_ops(aicpu_file, the_rank, problems)
        if aicpu.num_rows:
            vendor.tables[AI_CPU_OPS_TABLE] = aicpu
    if legacy.step_trace_average:
        problems.add(step_file, summary_note(legacy.step_trace_average, legacy.step_trace.num_rows))
    timeline_file = step_file.parent / f"ascend_timeline_display_{legacy.device_id}.json"
    if legacy.timeline_events is not None and legacy.timeline_events.num_rows:
        slices, tracks, comm = _timeline(
            legacy.timeline_events, the_rank, device, steps, step_file.parent, legacy.device_id, problems
        )
        if steps.num_rows == 0 and slices.num_rows == 0:
            raise TraceReadError(f"{step_file}: no readable steps and no op in {timeline_file.name}")
        if steps.num_rows == 0:
            steps = _whole_trace_step(slices, the_rank)
            step_column = pa.array(assemble.step_of(columns.int64(slices.column("start_ns")), steps))
            slices = slices.set_column(slices.schema.get_field_index("step"), "step", step_column)
            problems.add(step_file, "no steps; the whole timeline is one step (step 0)")
        elif slices.num_rows and not _overlaps(slices):
            problems.add(timeline_file, "no op lies inside the step trace's steps: clocks differ?")
    else:
        if steps.num_rows == 0:
            raise TraceReadError(
                f"{step_file}: no readable steps and no timeline ("
                + ("; ".join(problems.warnings) or "empty")
                + ")"
            )
        slices, tracks, comm = _stream_intervals(legacy, the_rank, device)
        compute_recorded = False
        problems.add(
            timeline_file,
            "missing: no op timeline, so compute time, the overlap breakdown and operators are unknown; "
            "communication comes from the step trace's per-stream intervals",
        )
    steps = assemble.device_windows(
        steps,
        columns.int64(slices.column("step")),
        columns.numpy(slices.column("is_device"), null=False),
        columns.int64(slices.column("start_ns")),
        columns.int64(slices.column("start_ns")) + columns.int64(slices.column("dur_ns")),
    )
    steps = _device_defaults(steps)
    for name, table in (
        ("mindinsight_hccl_steps", legacy.hccl_steps),
        ("mindinsight_hccl_links", legacy.hccl_links),
    ):
        if table.num_rows:
            vendor.tables[name] = _with_rank(table, the_rank)
    if legacy.cluster_analyse is not None and legacy.cluster_analyse.num_rows:
        vendor.tables[cluster_files.TABLE] = legacy.cluster_analyse.set_column(
            0, "rank", pa.array(np.full(legacy.cluster_analyse.num_rows, the_rank, np.int32))
        )
    world = legacy.parallel.get("ranks") if isinstance(legacy.parallel.get("ranks"), int) else None
    world_size = max(rank_table.num_rows or world or 1, the_rank + 1)
    sources = [str(step_file)] + [  # every file numbered like it (hccl_raw_{n}.csv, flops_{n}.txt, ...)
        str(p)
        for p in sorted(step_file.parent.iterdir())
        if p != step_file and p.is_file() and re.search(rf"_{legacy.device_id}\.(csv|json|txt)$", p.name)
    ]
    meta = RunMetadata(
        rank=the_rank,
        world_size=world_size,
        rank_source=rank_source,
        host=legacy.host,
        framework="mindspore",
        devices=[DeviceInfo(index=device, name="Ascend NPU")],
        backend="hccl",
        sources=sources,
        warnings=problems.warnings,
        compute_recorded=compute_recorded,
        extra={
            "mindinsight": {
                "folder": str(step_file.parent),
                "device_id": legacy.device_id,
                "parallel": legacy.parallel,
                "flops": legacy.flops,
                "profiler_info": legacy.info,
                "step_trace_average_ns": legacy.step_trace_average,
                "minddata": minddata,
            },
        },
    )
    if rank_source in ("file name", "default"):
        meta.warnings.append(
            f"{step_file}: no rank table or profiler_info rank_id; rank {the_rank} ({rank_source})"
        )
    return Trace(
        slices=slices,
        tracks=tracks,
        memory=_empty("memory"),
        flows=_empty("flows"),
        steps=steps,
        comm=comm,
        meta=meta,
        vendor=vendor,
    )


def _minddata(
    legacy: LegacyRank, folder: Path, rank: int, vendor: VendorResults, problems: files.FileProblems
) -> dict[str, Any]:
    """The MindData queues (vendor tables ``mindinsight_device_queue`` / ``mindinsight_get_next``), the
    pipeline's ops and the host's CPU use (``mindinsight_pipeline_ops`` / ``mindinsight_cpu_utilization``)
    and MindInsight's summary of the queues, also as a labelled note."""
    index = legacy.device_id
    device_queue = minddata.read_device_queue(folder, index, rank, problems)
    get_next = minddata.read_get_next(folder, index, rank, problems)
    for name, table in (("mindinsight_device_queue", device_queue), ("mindinsight_get_next", get_next)):
        if table.num_rows:
            vendor.tables[name] = table
    pipeline = legacy.tables.get(f"minddata_pipeline_raw_{index}.csv")
    for name, table in (
        (
            pipeline_files.PIPELINE_OPS_TABLE,
            pipeline_files.read_pipeline_ops(folder, index, rank, pipeline, problems),
        ),
        (
            pipeline_files.CPU_UTILIZATION_TABLE,
            pipeline_files.read_cpu_utilization(folder, index, rank, problems),
        ),
    ):
        if table.num_rows:
            vendor.tables[name] = table
    summary = minddata.queue_summary(device_queue, get_next, pipeline)
    if summary:
        problems.add(folder / f"minddata_pipeline_raw_{index}.csv", minddata.summary_text(summary))
    return summary


def summary_note(average_ns: dict[str, float], steps: int) -> str:
    """MindInsight's own averages (the step trace's summary row), labelled as such: they leave out the
    first, warm-up step (of ``steps``), where perfsight's step table lists every step."""
    ms = {k: average_ns.get(k, 0.0) / NS_PER_MS for k in ("total", "iteration_interval", "fp_and_bp", "tail")}
    return (
        "MindInsight's averages (the file's summary row, over the "
        f"{max(steps - 1, 0)} step(s) after the first): "
        f"step {ms['total']:.3f} ms, iteration interval {ms['iteration_interval']:.3f} ms, "
        f"forward+backward {ms['fp_and_bp']:.3f} ms, tail {ms['tail']:.3f} ms"
    )


def _with_rank(table: pa.Table, rank: int) -> pa.Table:
    """``table`` with its ``rank`` column set to the rank this reader decided."""
    column = pa.array(np.full(table.num_rows, rank, np.int32))
    return table.set_column(table.schema.get_field_index("rank"), table.schema.field("rank"), column)


def _empty(name: str) -> pa.Table:
    from perfsight.model import TABLE_SCHEMAS

    return TABLE_SCHEMAS[name].empty_table()


def _int(value: Any, default: int) -> int:
    try:
        return int(str(value).strip())
    except (TypeError, ValueError):
        return default


def _rank(legacy: LegacyRank, rank_table: pa.Table, option: int | None) -> tuple[int, str]:
    """The rank and where it came from: the r1.3 rank table, then ``profiler_info``'s ``rank_id``,
    then ``--rank``, then the number in the file names."""
    if rank_table.num_rows and legacy.host is not None:
        return legacy.rank, "trace"
    info_rank = legacy.info.get("rank_id")
    if isinstance(info_rank, int) and info_rank >= 0:
        return info_rank, "trace"
    if option is not None:
        return option, "option"
    return legacy.rank, "file name"


def _steps(legacy: LegacyRank, rank: int) -> pa.Table:
    """One ``steps`` row per step trace row; the device clock is the only clock a legacy run has."""
    st = legacy.step_trace
    n = st.num_rows
    return conform(
        pa.table(
            {
                "rank": np.full(n, rank, np.int32),
                "step": st.column("step"),
                "start_ns": st.column("start_ns"),
                "end_ns": st.column("end_ns"),
                "complete": np.ones(n, bool),
                "inferred": np.zeros(n, bool),
            }
        ),
        STEP_SCHEMA,
    )


def _device_defaults(steps: pa.Table) -> pa.Table:
    """A step without timeline work keeps its own window as its device window (it is device time)."""
    for name, fallback in (("device_start_ns", "start_ns"), ("device_end_ns", "end_ns")):
        filled = pc.coalesce(steps.column(name), steps.column(fallback))
        steps = steps.set_column(steps.schema.get_field_index(name), name, filled)
    return steps


def _whole_trace_step(slices: pa.Table, rank: int) -> pa.Table:
    start = columns.int64(slices.column("start_ns"))
    end = start + columns.int64(slices.column("dur_ns"))
    return conform(
        pa.table(
            {
                "rank": [rank],
                "step": [0],
                "start_ns": [int(start.min())],
                "end_ns": [int(end.max())],
                "complete": [True],
                "inferred": [True],
            }
        ),
        STEP_SCHEMA,
    )


def _overlaps(slices: pa.Table) -> bool:
    """Whether any slice lies inside a step (else the timeline and the step trace use other clocks)."""
    return bool((columns.int64(slices.column("step")) != NO_ID).any())


def _labels(events: pa.Table) -> tuple[dict[int, str], dict[tuple[int, int], str]]:
    """Process labels (``process_labels``/``process_name``) and thread names of the ``M`` events."""
    meta = events.filter(pc.equal(events.column("ph"), "M"))
    procs: dict[int, str] = {}
    threads: dict[tuple[int, int], str] = {}
    for row in meta.select(["name", "pid", "tid", "args.name", "args.labels"]).to_pylist():  # a few rows
        if row["pid"] is None:
            continue
        if row["name"] == "process_labels" and row["args.labels"]:
            procs[row["pid"]] = row["args.labels"]
        elif row["name"] == "process_name" and row["args.name"]:
            procs.setdefault(row["pid"], row["args.name"])
        elif row["name"] == "thread_name" and row["args.name"]:
            threads[(row["pid"], row["tid"] or 0)] = row["args.name"]
    return procs, threads


def _timeline(
    events: pa.Table, rank: int, device: int, steps: pa.Table, folder: Path, index: int | None,
    problems: files.FileProblems,
) -> tuple[pa.Table, pa.Table, pa.Table]:  # fmt: skip
    """(slices, tracks, comm) of the timeline display's ``X`` events (see the module docstring),
    on the step trace's clock and with the operator facts of the folder's files numbered ``index``."""
    procs, threads = _labels(events)
    ts = pc.replace_substring_regex(pc.utf8_trim_whitespace(events.column("ts")), TS_PATTERN, r"\1\2")
    timed = pc.fill_null(pc.match_substring_regex(ts, r"^-?\d{1,18}(\.\d{1,3})?$"), False)
    x = events.set_column(events.schema.get_field_index("ts"), "ts", ts)
    x = x.filter(pc.and_(pc.equal(x.column("ph"), "X"), timed))
    pid = columns.int64(x.column("pid"), NO_ID)
    tid = columns.int64(x.column("tid"), 0)
    keep = (pid != OVERLAP_PID) & ~((tid == STEPS_TID) & ~np.isin(pid, list(LANE_BASE) + [HOST_CPU_PID]))
    x, pid, tid = x.filter(pa.array(keep)), pid[keep], tid[keep]
    n = x.num_rows
    start = columns.int64(micros_to_ns(pc.cast(x.column("ts"), pa.decimal128(24, 3))))
    dur = np.maximum(np.round(columns.numpy(x.column("dur"), null=0.0) * NS_PER_US).astype(np.int64), 0)
    names = pc.fill_null(x.column("name").combine_chunks() if n else pa.array([], pa.string()), "")

    is_ai_cpu = pid == AI_CPU_PID
    aicpu_file = folder / f"aicpu_intermediate_{index}.csv"
    if aicpu_file.is_file() and is_ai_cpu.any():
        order = np.flatnonzero(is_ai_cpu)[np.argsort(start[is_ai_cpu], kind="stable")]
        cpu_names = pc.take(names, pa.array(order)).to_pylist()  # the AI CPU ops: a handful per step
        offset = timeline_offset_ns(aicpu_file, cpu_names, start[order], problems)
        if offset is not None:
            start = start + offset
    is_host = pid == HOST_CPU_PID
    is_comm = pid == COMMUNICATION_PID
    is_scope = ~np.isin(pid, list(LANE_BASE) + [HOST_CPU_PID]) & (tid == SCOPE_NAME_TID)
    kind = np.full(n, kind_code(SliceKind.KERNEL), np.int8)
    kind[is_host] = kind_code(SliceKind.CPU_OP)
    kind[is_comm] = kind_code(SliceKind.COMMUNICATION)
    kind[is_scope] = kind_code(SliceKind.DEVICE_ANNOTATION)
    is_device = ~is_host
    base = np.zeros(n, np.int64)
    for special, offset in LANE_BASE.items():  # three processes
        base[pid == special] = offset
    out_pid = np.where(is_device, device, pid)
    out_tid = tid + base
    labels = {}
    for i in np.unique(np.stack([pid, tid], 1), axis=0, return_index=True)[1] if n else []:  # per lane
        p, t = int(pid[i]), int(tid[i])
        proc = procs.get(p, "Host CPU Op" if is_host[i] else f"device {device}")
        labels[(int(out_pid[i]), int(out_tid[i]), bool(is_device[i]))] = (
            f"{proc} {threads.get((p, t), f'stream {t}')}"
        )
    track, tracks = assemble.assign_tracks(rank, out_pid, out_tid, is_device, labels)
    step = assemble.step_of(start, steps)
    slices = assemble.slice_table(
        rank, kind, _category(pid, procs), names, is_device, out_pid, out_tid, track, start, dur, step
    )
    framework_file = folder / f"framework_raw_{index}.csv"
    if framework_file.is_file():
        is_ai_core = ~np.isin(pid, [*LANE_BASE, HOST_CPU_PID]) & ~is_scope
        slices = with_op_facts(slices, is_ai_core, is_ai_cpu, read_framework_raw(framework_file, problems))
    return slices, tracks, _comm(slices, np.flatnonzero(is_comm), rank)


def _category(pid: np.ndarray, procs: dict[int, str]) -> pa.Array:
    """The process label of each row, looked up once per distinct pid."""
    values, inverse = np.unique(pid, return_inverse=True)
    label = pa.array([procs.get(int(p), "") for p in values.tolist()], pa.string())
    return label.take(pa.array(inverse.reshape(-1).astype(np.int64)))


def _comm(slices: pa.Table, rows: np.ndarray, rank: int) -> pa.Table:
    """One ``comm`` row per communication slice (no group, size or sequence: the files lack them)."""
    rows = rows[np.argsort(columns.int64(slices.column("start_ns"))[rows], kind="stable")]
    take = pa.array(rows, pa.int64())
    names = slices.column("name").take(take).cast(pa.string())
    return conform(
        pa.table(
            {
                "rank": np.full(rows.size, rank, np.int32),
                "slice": rows.astype(np.int64),
                "is_device": np.ones(rows.size, bool),
                "collective": collective_of([v or "" for v in names.to_pylist()]),
                "start_ns": slices.column("start_ns").take(take),
                "dur_ns": slices.column("dur_ns").take(take),
                "step": slices.column("step").take(take),
                "name": names,
            }
        ),
        COMM_SCHEMA,
    )


def _stream_intervals(legacy: LegacyRank, rank: int, device: int) -> tuple[pa.Table, pa.Table, pa.Table]:
    """Without a timeline: the step trace's per-stream communication intervals as device slices."""
    streams = legacy.stream_communication
    streams = streams.filter(pc.greater(streams.column("dur_ns"), 0)) if streams.num_rows else streams
    n = streams.num_rows
    names = streams.column("stream").combine_chunks() if n else pa.array([], pa.string())
    lane_values, lane = np.unique(np.array(names.to_pylist(), dtype=object), return_inverse=True)
    tid = STREAM_TID_BASE + lane.reshape(-1).astype(np.int64)
    labels = {
        (device, STREAM_TID_BASE + i, True): f"step trace {v}" for i, v in enumerate(lane_values.tolist())
    }
    track, tracks = assemble.assign_tracks(rank, np.full(n, device, np.int64), tid, np.ones(n, bool), labels)
    start = columns.int64(streams.column("start_ns")) if n else np.zeros(0, np.int64)
    dur = columns.int64(streams.column("dur_ns")) if n else np.zeros(0, np.int64)
    slices = assemble.slice_table(
        rank,
        np.full(n, kind_code(SliceKind.COMMUNICATION), np.int32),
        pa.array(["step_trace_raw"] * n, pa.string()),
        names,
        np.ones(n, bool),
        np.full(n, device, np.int64),
        tid,
        track,
        start,
        dur,
        streams.column("step") if n else np.zeros(0, np.int32),
    )
    if not n:
        tracks = TRACK_SCHEMA.empty_table()
    return slices, tracks, _comm(slices, np.arange(n), rank)
