"""Data preparation for a MindSpore MindData pipeline read from MindSpore's own profiler files (a
legacy ``profiler/`` folder), as MindInsight 2.3.1 judges it, in the data-preparation tables a
PyTorch DataLoader capture gives (``analysis.data_pipeline``'s schemas), so one page shows both.

Input: the vendor tables the MindInsight reader fills (``ingest.mindinsight_minddata`` /
``ingest.mindinsight_pipeline``): ``mindinsight_pipeline_ops`` (each op, its workers, parent and
sampled output queue), ``mindinsight_device_queue`` (the *host* queue MindData fills and the
transfer to the device empties, sampled per step: MindInsight's "host queue"),
``mindinsight_get_next`` (each fetch of the device's GetNext with the size of the *device-side*
queue it found: MindInsight's "data queue") and ``mindinsight_cpu_utilization``.

MindInsight's rules, from its analysers and proposers:

* the host queue empty in more than 30 % of its samples: data processing is the bottleneck; else
  any GetNext fetch finding the device queue empty: data transmission (``"host to device"``);
* the pipeline ops that may be the bottleneck (queue-usage thresholds 0.8 and 0.6): an op whose
  child's queue is fuller than its own by more than 0.1, and a source op whose queue is used less
  than 0.6; when every op but the last uses more than 0.8 of its queue, the last op;
* the CPU: the machine's mean use (100 - idle) above 80 % is reported.  Its means leave out the
  last sample when the host queue gives steps (it pairs sample i with time stamp i + 1).

The per-stage times a DataLoader capture measures are not in these files: they stay null.
Units: ns, ratios 0-1, CPU use in %.  Pure functions; this module must not read files.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from perfsight import columns
from perfsight.analysis.data_pipeline import (
    DATA_PIPELINE_SUMMARY_SCHEMA,
    DATA_QUEUE_SCHEMA,
    DATA_STAGES_SCHEMA,
)
from perfsight.model import NO_ID, Trace

PIPELINE_OPS, HOST_QUEUE, GET_NEXT, CPU = (
    "mindinsight_pipeline_ops",
    "mindinsight_device_queue",
    "mindinsight_get_next",
    "mindinsight_cpu_utilization",
)
"""The reader's vendor table names (``ingest.mindinsight_pipeline`` / ``mindinsight_minddata``)."""

HOST_EMPTY_WARNING = 0.3
"""MindInsight's ``DEVICE_QUEUE_EMPTY_WARNING_THRESHOLD``."""
USAGE_HIGH, USAGE_LOW, CHILD_FULLER = 0.8, 0.6, 0.1
"""MindInsight's pipeline proposer's queue-usage thresholds and its child-versus-op margin."""
CPU_BUSY_WARNING = 80.0
"""MindInsight reports the machine's mean CPU use above this (%)."""

DATA_CPU_UTILIZATION_SCHEMA = pa.schema(
    [
        pa.field("rank", pa.int32(), nullable=False),
        pa.field("scope", pa.string(), nullable=False),  # "machine" | "process" | "op"
        pa.field("op_id", pa.int64()),  # scope "op": the pipeline op
        pa.field("stage", pa.string()),  # scope "op": its name in data_stages
        pa.field("metric", pa.string(), nullable=False),  # user_utilization, sys_utilization, ...
        pa.field("samples", pa.int64(), nullable=False),  # samples averaged (MindInsight's)
        pa.field("mean", pa.float64(), nullable=False),  # % for *_utilization, else a count
        pa.field("max", pa.float64(), nullable=False),
    ]
)
"""Columns of :func:`data_cpu_utilization`: one row per scope and metric (MindInsight's CPU card)."""


DATA_STAGE_QUEUES_SCHEMA = pa.schema(
    [
        pa.field("rank", pa.int32(), nullable=False),
        pa.field("stage", pa.string(), nullable=False),  # as in data_stages
        pa.field("sample", pa.int32(), nullable=False),  # sample index (one per sample interval)
        pa.field("time_ms", pa.float64()),  # sample x the pipeline's sampling interval
        pa.field("size", pa.int64(), nullable=False),
        pa.field("capacity", pa.int64()),
    ]
)
"""Columns of :func:`data_stage_queues`: one row per sample of each op's output queue (the curve
MindInsight draws for a queue of its pipeline graph)."""


def has_minddata(trace: Trace) -> bool:
    """Whether the trace's data preparation is a MindData pipeline read from its files (and no
    DataLoader capture, which would come first)."""
    if trace.dataloader.num_rows:
        return False
    return any(
        trace.vendor.tables.get(name, pa.table({})).num_rows for name in (PIPELINE_OPS, HOST_QUEUE, GET_NEXT)
    )


def _table(trace: Trace, name: str) -> pa.Table | None:
    table = trace.vendor.tables.get(name)
    return table if table is not None and table.num_rows else None


def stage_name(op_type: str, op_id: int) -> str:
    """MindInsight's name of a pipeline op (``ImageFolderOp_3``)."""
    return f"{op_type}_{op_id}"


def _pipeline_order(ops: list[dict]) -> list[dict]:
    """The ops source first: deepest below the op that feeds training first (ties: higher id)."""
    by_id = {op["op_id"]: op for op in ops}

    def depth(op: dict) -> int:
        seen, d = {op["op_id"]}, 0
        while op["parent_id"] is not None and op["parent_id"] in by_id and op["parent_id"] not in seen:
            op = by_id[op["parent_id"]]
            seen.add(op["op_id"])
            d += 1
        return d

    return sorted(ops, key=lambda op: (-depth(op), -op["op_id"]))


def flagged_ops(ops: list[dict]) -> list[int]:
    """The op ids MindInsight's pipeline proposer names as possible bottlenecks (module doc)."""
    usage = {op["op_id"]: op["queue_usage"] for op in ops}
    root, flagged, all_high = None, [], True
    for op in ops:
        if op["parent_id"] is None:
            root = op["op_id"]
            continue
        rate = op["queue_usage"] if op["queue_usage"] is not None else 0.0
        all_high &= rate >= USAGE_HIGH
        children = op["children"] or []
        if not children:
            if rate < USAGE_LOW:
                flagged.append(op["op_id"])
            continue
        if any((usage.get(c) or 0.0) - rate > CHILD_FULLER for c in children):
            flagged.append(op["op_id"])
    if all_high and root is not None:
        return [root]
    return flagged


def data_stages(trace: Trace) -> pa.Table:
    """One row per pipeline op, source first, with its output queue and MindInsight's bottleneck
    mark; the times are null (the files do not measure them)."""
    table = _table(trace, PIPELINE_OPS)
    if table is None:
        return DATA_STAGES_SCHEMA.empty_table()
    ops = _pipeline_order(table.to_pylist())  # a handful of ops
    flagged = set(flagged_ops(ops))
    n = len(ops)
    sizes = [np.asarray(op["queue_sizes"] or [], np.int64) for op in ops]
    return pa.table(
        {
            "rank": pa.array(np.full(n, trace.rank, np.int32)),
            "order": pa.array(np.arange(n, dtype=np.int32)),
            "stage": [stage_name(op["op_type"], op["op_id"]) for op in ops],
            "op_type": [op["op_type"] for op in ops],
            "runs_in": ["workers"] * n,
            "parallelism": pa.array([max(op["num_workers"] or 1, 1) for op in ops], pa.int32()),
            "batches": pa.nulls(n, pa.int64()),
            "total_ns": pa.nulls(n, pa.int64()),
            "per_batch_ns": pa.nulls(n, pa.int64()),
            "throughput_per_s": pa.nulls(n, pa.float64()),
            "share": pa.nulls(n, pa.float64()),
            "bottleneck": [op["op_id"] in flagged for op in ops],
            "queue_capacity": [op["queue_capacity"] for op in ops],
            "queue_mean": [op["queue_mean"] for op in ops],
            "queue_usage": [op["queue_usage"] for op in ops],
            "queue_empty_ratio": [float((s == 0).mean()) if s.size else None for s in sizes],
            "queue_samples": [int(s.size) for s in sizes],
        },
        schema=DATA_STAGES_SCHEMA,
    )


def data_stage_queues(trace: Trace) -> pa.Table:
    """Each pipeline op's sampled output-queue sizes, in sample order."""
    table = _table(trace, PIPELINE_OPS)
    if table is None:
        return DATA_STAGE_QUEUES_SCHEMA.empty_table()
    rows = []
    for op in table.to_pylist():  # a handful of ops, each a few samples per interval
        sizes = op["queue_sizes"] or []
        interval = op["sample_interval_ms"]
        name = stage_name(op["op_type"], op["op_id"])
        rows += [
            {"rank": trace.rank, "stage": name, "sample": i, "size": size, "capacity": op["queue_capacity"],
             "time_ms": None if interval is None else i * interval}
            for i, size in enumerate(sizes)
        ]  # fmt: skip
    return pa.Table.from_pylist(rows, schema=DATA_STAGE_QUEUES_SCHEMA)


def _step_of(start_ns: np.ndarray, steps: pa.Table) -> np.ndarray:
    """The step whose window holds each time, ``NO_ID`` outside every step."""
    out = np.full(start_ns.size, NO_ID, np.int64)
    if steps.num_rows == 0 or start_ns.size == 0:
        return out
    ordered = steps.sort_by("start_ns")
    starts, ends = columns.int64(ordered.column("start_ns")), columns.int64(ordered.column("end_ns"))
    numbers = columns.int64(ordered.column("step"))
    i = np.searchsorted(starts, start_ns, side="right") - 1
    inside = (i >= 0) & (start_ns < ends[np.maximum(i, 0)])
    out[inside] = numbers[i[inside]]
    return out


def data_queue(trace: Trace) -> pa.Table:
    """The two queues by time: one row per GetNext fetch (the device queue's size it found, its
    wait) and one per host-queue sample (at the start of its step), in time order."""
    host, fetches = _table(trace, HOST_QUEUE), _table(trace, GET_NEXT)
    parts = []
    capacity = int(pc.max(host.column("capacity")).as_py()) if host is not None else None
    if fetches is not None:
        start = columns.int64(fetches.column("start_ns"))
        n = start.size
        parts.append(
            {
                "step": _step_of(start, trace.steps),
                "batch": pa.nulls(n, pa.int64()),
                "start_ns": start,
                "wait_ns": np.maximum(columns.int64(fetches.column("end_ns")) - start, 0),
                "host_queue": pa.nulls(n, pa.int32()),
                "device_queue": columns.int64(fetches.column("queue_size")),
                "queue_capacity": pa.array([capacity] * n, pa.int32()),
            }
        )
    if host is not None and trace.steps.num_rows:
        step_start = dict(
            zip(
                trace.steps.column("step").to_pylist(),
                trace.steps.column("start_ns").to_pylist(),
                strict=True,
            )
        )  # one per step
        sample_steps = host.column("step").to_pylist()
        known = np.array([s in step_start for s in sample_steps], bool)
        n = int(known.sum())
        parts.append(
            {
                "step": np.asarray(sample_steps, np.int64)[known],
                "batch": pa.nulls(n, pa.int64()),
                "start_ns": np.array([step_start[s] for s in sample_steps if s in step_start], np.int64),
                "wait_ns": np.zeros(n, np.int64),
                "host_queue": columns.int64(host.column("size"))[known],
                "device_queue": pa.nulls(n, pa.int32()),
                "queue_capacity": columns.int64(host.column("capacity"))[known],
            }
        )
    if not parts:
        return DATA_QUEUE_SCHEMA.empty_table()
    tables = [
        pa.table({"rank": pa.array(np.full(len(p["start_ns"]), trace.rank, np.int32)), **p}).cast(
            DATA_QUEUE_SCHEMA
        )
        for p in parts
    ]
    return pa.concat_tables(tables).sort_by("start_ns")


def _cpu_samples_used(trace: Trace) -> int | None:
    """How many samples per metric MindInsight averages: all but the last when the host queue gives
    steps (it pairs sample i with time stamp i + 1), else all (``None``)."""
    cpu = _table(trace, CPU)
    if cpu is None or _table(trace, HOST_QUEUE) is None:
        return None
    stamps = cpu.filter(pc.is_valid(cpu.column("time_stamp")))
    count = int(pc.max(stamps.column("sample")).as_py()) + 1 if stamps.num_rows else 0
    return max(count - 1, 0)


def data_cpu_utilization(trace: Trace) -> pa.Table:
    """Per scope (machine, process, each op) and metric: MindInsight's mean and the maximum."""
    cpu = _table(trace, CPU)
    if cpu is None:
        return DATA_CPU_UTILIZATION_SCHEMA.empty_table()
    used = _cpu_samples_used(trace)
    if used is not None:
        cpu = cpu.filter(pc.less(cpu.column("sample"), used))
    if cpu.num_rows == 0:
        return DATA_CPU_UTILIZATION_SCHEMA.empty_table()
    keyed = cpu.set_column(
        cpu.schema.get_field_index("op_id"), "op_id", pc.fill_null(cpu.column("op_id"), NO_ID)
    )
    grouped = keyed.group_by(["scope", "op_id", "metric"], use_threads=False).aggregate(
        [("value", "count"), ("value", "mean"), ("value", "max")]
    )
    op_ids = columns.int64(grouped.column("op_id"))
    ops = _table(trace, PIPELINE_OPS)
    names = (
        {
            op["op_id"]: stage_name(op["op_type"], op["op_id"])
            for op in ops.select(["op_id", "op_type"]).to_pylist()
        }
        if ops is not None
        else {}
    )  # a handful of ops
    scope_order = {"machine": 0, "process": 1, "op": 2}
    out = pa.table(
        {
            "rank": pa.array(np.full(grouped.num_rows, trace.rank, np.int32)),
            "scope": grouped.column("scope"),
            "op_id": pa.array(op_ids, mask=op_ids == NO_ID),
            "stage": [names.get(int(i)) if i != NO_ID else None for i in op_ids],
            "metric": grouped.column("metric"),
            "samples": grouped.column("value_count"),
            "mean": grouped.column("value_mean"),
            "max": grouped.column("value_max"),
            "_order": [scope_order.get(s, 3) for s in grouped.column("scope").to_pylist()],
        }
    )
    out = out.sort_by([("_order", "ascending"), ("op_id", "ascending"), ("metric", "ascending")])
    return out.drop_columns(["_order"]).cast(DATA_CPU_UTILIZATION_SCHEMA)


def _machine_busy_pct(cpu: pa.Table) -> float | None:
    """The machine's mean CPU use as MindInsight reports it: 100 - its rounded mean idle %."""
    idle = cpu.filter(
        pc.and_(pc.equal(cpu.column("scope"), "machine"), pc.equal(cpu.column("metric"), "idle_utilization"))
    )
    if idle.num_rows == 0:
        return None
    return 100.0 - round(float(idle.column("mean")[0].as_py()))


def data_pipeline_summary(trace: Trace, stages: pa.Table, cpu: pa.Table) -> pa.Table:
    """One row: the two queues, MindInsight's verdict and suggestions (module doc)."""
    host, fetches = _table(trace, HOST_QUEUE), _table(trace, GET_NEXT)
    if host is None and fetches is None and stages.num_rows == 0:
        return DATA_PIPELINE_SUMMARY_SCHEMA.empty_table()
    row: dict = {
        "rank": trace.rank,
        "num_workers": int(pc.max(stages.column("parallelism")).as_py() or 0) if stages.num_rows else 0,
    }
    host_sizes = columns.int64(host.column("size")) if host is not None else np.zeros(0, np.int64)
    device_sizes = (
        columns.int64(fetches.column("queue_size")) if fetches is not None else np.zeros(0, np.int64)
    )
    capacity = int(columns.int64(host.column("capacity")).max()) if host is not None else None
    if fetches is not None:
        start, end = columns.int64(fetches.column("start_ns")), columns.int64(fetches.column("end_ns"))
        wait, loop = int(np.maximum(end - start, 0).sum()), int(end.max() - start.min())
    else:
        wait, loop = 0, 0
    row.update(
        requests=int(device_sizes.size or host_sizes.size),
        wait_ns=wait,
        loop_ns=loop,
        wait_share=wait / loop if loop > 0 else 0.0,
        consume_interval_ns=None,
        host_queue_capacity=capacity,
        host_queue_samples=int(host_sizes.size) if host is not None else None,
    )
    if host_sizes.size:
        row.update(
            host_queue_mean=float(host_sizes.mean()),
            host_queue_usage=float(host_sizes.mean() / capacity) if capacity else None,
            host_queue_empty=int((host_sizes == 0).sum()),
            host_queue_empty_ratio=float((host_sizes == 0).mean()),
            host_queue_full=int((host_sizes == capacity).sum()) if capacity else 0,
        )
    if device_sizes.size:
        row.update(
            device_queue_mean=float(device_sizes.mean()),
            device_queue_empty=int((device_sizes == 0).sum()),
            device_queue_empty_ratio=float((device_sizes == 0).mean()),
        )
    host_empty = row.get("host_queue_empty_ratio")
    if host_empty is not None and host_empty > HOST_EMPTY_WARNING:
        row["verdict"] = "data processing"
    elif row.get("device_queue_empty"):
        row["verdict"] = "host to device"
    else:
        row["verdict"] = "none"
    named = stages.filter(stages.column("bottleneck")).column("stage").to_pylist() if stages.num_rows else []
    row["bottleneck_stage"] = "/".join(named) or None
    row["reason"] = suggestions(row, stages, cpu)
    return pa.Table.from_pylist([row], schema=DATA_PIPELINE_SUMMARY_SCHEMA)


def suggestions(row: dict, stages: pa.Table, cpu: pa.Table) -> str:
    """MindInsight's helper's suggestions for these numbers, in its words (English UI)."""
    lines = []
    if row.get("host_queue_samples"):
        empty, total = row["host_queue_empty"], row["host_queue_samples"]
        lines.append(
            f"The ratio of empty queues on a host is {empty}/{total}, "
            f"and the ratio of non empty queues is {total - empty}/{total}."
        )
    if row.get("device_queue_empty") is not None:
        empty, total = row["device_queue_empty"], row["requests"]
        lines.append(
            f"The ratio of empty data queues is {empty}/{total}, "
            f"and the ratio of non empty queues is {total - empty}/{total}."
        )
    if row["verdict"] != "none" and row.get("host_queue_empty_ratio") is not None:
        rate = int(np.ceil(row["host_queue_empty_ratio"] * 100))
        threshold = int(HOST_EMPTY_WARNING * 100)
        if row["verdict"] == "data processing":
            lines.append(
                f"The ratio of empty queues on a host is {rate}%, and the threshold is {threshold}%. "
                "The data processing stage can be optimized. You can adjust the script based on "
                "the data processing performance optimization suggestions."
            )
        else:
            lines.append(
                f"The ratio of empty queues on a host is {rate}%, and the threshold is {threshold}%. "
                "There are empty queues on a chip. The data transmission stage can be optimized."
            )
    if row.get("bottleneck_stage"):
        lines.append(
            f"The {row['bottleneck_stage']} operator in the pipeline may have performance bottlenecks."
        )
        advice = {
            "MapOp": "you can try to increase or decrease the num_parallel_workers parameter; if it runs "
            "Python operators, try to optimize the training script.",
            "GeneratorOp": "you can try to increase or decrease the num_parallel_workers parameter or "
            "optimize the training script, or replace it with the MindRecordDataset operator.",
            "BatchOp": "you can try to increase the prefetch_size.",
        }
        for stage in stages.filter(stages.column("bottleneck")).to_pylist():  # a handful
            source = stage["order"] == 0
            workers = "you can try to increase or decrease the num_parallel_workers parameter."
            text = workers if source else advice.get(stage["op_type"], workers)
            lines.append(f"For operator {stage['stage']}, {text}")
    busy = _machine_busy_pct(cpu) if cpu.num_rows else None
    if busy is not None and busy > CPU_BUSY_WARNING:
        lines.append(
            f"The average CPU usage of the entire system is {busy:.0f}%, "
            "which may affect the data processing performance."
        )
    return " ".join(lines) or "MindInsight's rules find no data-preparation problem."
