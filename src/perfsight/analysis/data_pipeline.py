"""Data preparation for a PyTorch DataLoader, as the seeds' MindData analysis judges it: the
queues over time, the time of each pipeline stage, the workers, and which stage is the
bottleneck and why.

Input: the trace's ``dataloader`` table (perfsight's data-loader capture; see
docs/TRACE_MODEL.md).  A PyTorch loader is a fixed pipeline: the sampler (training process)
hands indices to the workers; each worker runs, for one batch at a time, the dataset read
(``__getitem__`` minus transforms), each transform, and ``collate_fn``; finished batches wait in
the *host queue* (the workers' result queue) and, with ``pin_memory``, are pinned by a thread of
the training process into the *device-side queue*; the loop then copies each batch to the device
(``to_device``, when it copies anything).  The training loop takes one batch per
request (a ``wait`` row, with both queue sizes at the request).

Which stage is the bottleneck, and why, is decided in ``analysis.data_judgement`` (the seed's
rules); this module builds the tables and marks that stage.  :func:`data_queue` keeps every
request, the judgement leaves out each epoch's first.

Units: ns; throughputs in batches per second.  Pure functions; this module must not read files or
format for display.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from perfsight import columns
from perfsight.analysis import data_judgement as judge
from perfsight.analysis.data_judgement import PIN, TO_DEVICE, rows_of_kind
from perfsight.model import Trace
from perfsight.units import ns_to_s

SAMPLER, READ, COLLATE = "sampler", "read", "collate"

DATA_QUEUE_SCHEMA = pa.schema(
    [
        pa.field("rank", pa.int32(), nullable=False),
        pa.field("step", pa.int32(), nullable=False),  # step the request started in, -1 outside steps
        pa.field("batch", pa.int64()),  # index of the batch in its epoch
        pa.field("start_ns", pa.int64(), nullable=False),  # when the loop asked (trace clock)
        pa.field("wait_ns", pa.int64(), nullable=False),  # how long it waited for the batch
        pa.field("host_queue", pa.int32()),  # batches ready in the workers' result queue at the request
        pa.field("device_queue", pa.int32()),  # batches pinned and ready (pin_memory thread only)
        pa.field("queue_capacity", pa.int32()),  # prefetch_factor x num_workers; 0 without workers
    ]
)
"""Columns of :func:`data_queue`: one row per batch the training loop asked for, by time."""

DATA_STAGES_SCHEMA = pa.schema(
    [
        pa.field("rank", pa.int32(), nullable=False),
        pa.field("order", pa.int32(), nullable=False),  # position in the pipeline, source first
        # sampler, read, transform..., collate, pin_memory, to_device (the loop's copy to the device)
        pa.field("stage", pa.string(), nullable=False),
        pa.field(
            "op_type", pa.string(), nullable=False
        ),  # Sampler | Dataset | Map | Batch | PinMemory | DeviceCopy
        pa.field("runs_in", pa.string(), nullable=False),  # "workers" | "training process"
        pa.field("parallelism", pa.int32(), nullable=False),  # workers running it side by side
        pa.field("batches", pa.int64()),  # null: not measured (a MindData pipeline read from its files)
        pa.field("total_ns", pa.int64()),  # likewise
        pa.field("per_batch_ns", pa.int64()),  # mean time of one batch in this stage; likewise
        pa.field("throughput_per_s", pa.float64()),  # batches/s this stage can deliver (parallelism / time)
        pa.field("share", pa.float64()),  # of all stages' time per batch; likewise
        pa.field("bottleneck", pa.bool_(), nullable=False),
        # the stage's own output queue, where the pipeline samples one (MindData: each op's); else null
        pa.field("queue_capacity", pa.int64()),
        pa.field("queue_mean", pa.float64()),  # mean sampled size
        pa.field("queue_usage", pa.float64()),  # mean size / capacity
        pa.field("queue_empty_ratio", pa.float64()),  # share of samples that found it empty
        pa.field("queue_samples", pa.int64()),
    ]
)
"""Columns of :func:`data_stages`: one row per pipeline stage, in pipeline order (source first).
``analysis.minddata`` fills the same columns for a MindData pipeline read from MindSpore's files."""

STAGE_QUEUE_COLUMNS = ("queue_capacity", "queue_mean", "queue_usage", "queue_empty_ratio", "queue_samples")
"""The per-stage output-queue columns: a DataLoader's stages have none (its one queue is the host
queue after collate, in :data:`DATA_PIPELINE_SUMMARY_SCHEMA`)."""

DATA_WORKERS_SCHEMA = pa.schema(
    [
        pa.field("rank", pa.int32(), nullable=False),
        pa.field("worker", pa.int32(), nullable=False),  # -1 = the training process (num_workers=0)
        pa.field("pid", pa.int64(), nullable=False),
        pa.field("batches", pa.int64(), nullable=False),
        pa.field("busy_ns", pa.int64(), nullable=False),  # sum of its batches' fetch time
        pa.field("cpu_ns", pa.int64()),  # CPU time of those fetches (mean of the batches measured x batches)
        pa.field("idle_ns", pa.int64(), nullable=False),  # first fetch start to last end, minus busy
        pa.field("read_ns", pa.int64(), nullable=False),  # mean of the batches measured x batches
        pa.field("transform_ns", pa.int64(), nullable=False),  # likewise
        pa.field("collate_ns", pa.int64(), nullable=False),
    ]
)
"""Columns of :func:`data_workers`: one row per worker process (and pid: a restarted worker is new).
Read, transform and CPU times are measured on some batches only (the capture times each transform
and reads the CPU clock on a sample of fetches), so their totals are the measured mean times the
worker's batches."""

DATA_PIPELINE_SUMMARY_SCHEMA = pa.schema(
    [
        pa.field("rank", pa.int32(), nullable=False),
        pa.field("requests", pa.int64(), nullable=False),  # batches judged (the first of an epoch is not)
        pa.field("num_workers", pa.int32(), nullable=False),
        pa.field("wait_ns", pa.int64(), nullable=False),  # total time the loop waited
        pa.field("loop_ns", pa.int64(), nullable=False),  # first request to the last batch received
        pa.field("wait_share", pa.float64(), nullable=False),
        pa.field("consume_interval_ns", pa.int64()),  # median time the loop spends per batch outside next()
        pa.field("host_queue_capacity", pa.int32()),
        pa.field("host_queue_mean", pa.float64()),
        pa.field("host_queue_usage", pa.float64()),  # mean size / capacity (null without workers)
        pa.field("host_queue_empty", pa.int64()),  # requests that found the host queue empty
        pa.field("host_queue_empty_ratio", pa.float64()),
        pa.field("host_queue_full", pa.int64()),
        pa.field("device_queue_mean", pa.float64()),
        pa.field("device_queue_empty", pa.int64()),
        pa.field("device_queue_empty_ratio", pa.float64()),
        pa.field("verdict", pa.string(), nullable=False),  # "data processing" | "host to device" | "none"
        pa.field("bottleneck_stage", pa.string()),
        pa.field("reason", pa.string(), nullable=False),
        # host-queue samples when they are not one per request (MindData samples it once per step)
        pa.field("host_queue_samples", pa.int64()),
    ]
)
"""Columns of :func:`data_pipeline_summary`: one row, the seed's judgement (no row without capture)."""

_OP_TYPES = {SAMPLER: "Sampler", READ: "Dataset", COLLATE: "Batch", PIN: "PinMemory", TO_DEVICE: "DeviceCopy"}

DATA_STAGE_BATCHES_SCHEMA = pa.schema(
    [
        pa.field("rank", pa.int32(), nullable=False),
        pa.field("stage", pa.string(), nullable=False),  # as in data_stages
        pa.field("worker", pa.int32(), nullable=False),  # -1 = the training process
        pa.field("start_ns", pa.int64(), nullable=False),  # the batch's fetch (sampler, pin: its own) start
        pa.field("dur_ns", pa.int64(), nullable=False),  # the stage's time on that batch
    ]
)
"""Columns of :func:`data_stage_batches`: one row per stage per measured batch, by time."""


def data_queue(trace: Trace) -> pa.Table:
    """The host and device-side queue sizes at each request of the training loop, by time."""
    waits = rows_of_kind(trace.dataloader, "wait")
    if waits.num_rows == 0:
        return DATA_QUEUE_SCHEMA.empty_table()
    waits = waits.sort_by("start_ns")
    table = pa.table(
        {
            "rank": pa.array(np.full(waits.num_rows, trace.rank, np.int32)),
            "step": waits.column("step"),
            "batch": waits.column("batch"),
            "start_ns": waits.column("start_ns"),
            "wait_ns": waits.column("dur_ns"),
            "host_queue": waits.column("host_queue"),
            "device_queue": waits.column("device_queue"),
            "queue_capacity": waits.column("queue_capacity"),
        }
    )
    return table.cast(DATA_QUEUE_SCHEMA)


def _sum(table: pa.Table, column: str) -> int:
    return int(pc.sum(table.column(column)).as_py() or 0) if table.num_rows else 0


def data_stages(trace: Trace) -> pa.Table:
    """Each pipeline stage's time per batch and throughput, in pipeline order (see module doc)."""
    rows = trace.dataloader
    fetches = rows_of_kind(rows, "fetch")
    if fetches.num_rows == 0:
        return DATA_STAGES_SCHEMA.empty_table()
    waits, pins, copies, stage_rows = (
        rows_of_kind(rows, "wait"),
        rows_of_kind(rows, "pin"),
        rows_of_kind(rows, "copy"),
        rows_of_kind(rows, "stage"),
    )
    workers = _worker_count(fetches)
    batches = fetches.num_rows
    names: list[str] = []
    totals: list[int] = []
    counts: list[int] = []
    sampled = waits.filter(pc.is_valid(waits.column("sampler_ns")))
    if sampled.num_rows:
        names.append(SAMPLER)
        totals.append(_sum(sampled, "sampler_ns"))
        counts.append(sampled.num_rows)
    names.append(READ)  # known on the batches whose transforms were timed (see the capture)
    totals.append(_sum(fetches, "read_ns"))
    counts.append(batches - fetches.column("read_ns").null_count)
    transforms = stage_rows.filter(pc.not_equal(stage_rows.column("stage"), COLLATE))
    if transforms.num_rows:
        first = pa.table({"stage": transforms.column("stage"), "i": pa.array(np.arange(transforms.num_rows))})
        grouped = first.group_by("stage").aggregate([("i", "min")]).sort_by("i_min")
        summed = transforms.group_by("stage").aggregate([("dur_ns", "sum"), ("dur_ns", "count")])
        by_name = dict(
            zip(
                summed.column("stage").to_pylist(),
                zip(
                    summed.column("dur_ns_sum").to_pylist(),
                    summed.column("dur_ns_count").to_pylist(),
                    strict=True,
                ),
                strict=True,
            )
        )
        for name in grouped.column("stage").to_pylist():  # a handful of stages, not rows
            names.append(name)
            totals.append(int(by_name[name][0]))
            counts.append(int(by_name[name][1]))
    names.append(COLLATE)
    totals.append(_sum(fetches, "collate_ns"))
    counts.append(batches)
    if pins.num_rows:
        names.append(PIN)
        totals.append(_sum(pins, "dur_ns"))
        counts.append(pins.num_rows)
    if copies.num_rows:  # no row when the loop copied nothing (CPU-only): absent, not zero
        names.append(TO_DEVICE)
        totals.append(_sum(copies, "dur_ns"))
        counts.append(copies.num_rows)
    total = np.array(totals, np.int64)
    count = np.maximum(np.array(counts, np.int64), 1)
    per_batch = total // count
    in_workers = np.array([n not in (SAMPLER, PIN, TO_DEVICE) for n in names])
    parallelism = np.where(in_workers, max(workers, 1), 1).astype(np.int32)
    with np.errstate(divide="ignore", invalid="ignore"):
        throughput = np.where(per_batch > 0, parallelism / ns_to_s(per_batch), np.nan)
    share = per_batch / per_batch.sum() if per_batch.sum() > 0 else np.zeros(len(names))
    bottleneck = np.zeros(len(names), bool)
    stage = judge.bottleneck_stage(judge.judgement(trace.dataloader), names, throughput)
    if stage is not None:
        bottleneck[names.index(stage)] = True
    return pa.table(
        {
            "rank": pa.array(np.full(len(names), trace.rank, np.int32)),
            "order": pa.array(np.arange(len(names), dtype=np.int32)),
            "stage": pa.array(names, pa.string()),
            "op_type": pa.array([_OP_TYPES.get(n, "Map") for n in names], pa.string()),
            "runs_in": pa.array(np.where(in_workers & (workers > 0), "workers", "training process").tolist()),
            "parallelism": pa.array(parallelism),
            "batches": pa.array(np.array(counts, np.int64)),
            "total_ns": pa.array(total),
            "per_batch_ns": pa.array(per_batch),
            "throughput_per_s": pa.array(throughput, mask=np.isnan(throughput)),
            "share": pa.array(share.astype(np.float64)),
            "bottleneck": pa.array(bottleneck),
            **{
                name: pa.nulls(len(names), DATA_STAGES_SCHEMA.field(name).type)
                for name in STAGE_QUEUE_COLUMNS
            },
        },
        schema=DATA_STAGES_SCHEMA,
    )


def data_stage_batches(trace: Trace) -> pa.Table:
    """Each stage's time on each batch it was measured on (the curve behind a stage of the graph)."""
    rows = trace.dataloader
    if rows_of_kind(rows, "fetch").num_rows == 0:
        return DATA_STAGE_BATCHES_SCHEMA.empty_table()
    parts = []

    def part(table: pa.Table, stage: str | None, dur: str) -> None:
        """The rows of ``table`` with ``dur`` known, as ``stage`` (None: the rows' own stage names)."""
        table = table.filter(pc.is_valid(table.column(dur)))
        if table.num_rows == 0:
            return
        names = table.column("stage") if stage is None else pa.array([stage] * table.num_rows, pa.string())
        parts.append(
            pa.table(
                {
                    "rank": pa.array(np.full(table.num_rows, trace.rank, np.int32)),
                    "stage": names,
                    "worker": table.column("worker"),
                    "start_ns": table.column("start_ns"),
                    "dur_ns": table.column(dur),
                }
            ).cast(DATA_STAGE_BATCHES_SCHEMA)
        )

    fetches = rows_of_kind(rows, "fetch")
    part(rows_of_kind(rows, "wait"), SAMPLER, "sampler_ns")
    part(fetches, READ, "read_ns")
    stage_rows = rows_of_kind(rows, "stage")
    part(stage_rows.filter(pc.not_equal(stage_rows.column("stage"), COLLATE)), None, "dur_ns")
    part(fetches, COLLATE, "collate_ns")
    part(rows_of_kind(rows, "pin"), PIN, "dur_ns")
    part(rows_of_kind(rows, "copy"), TO_DEVICE, "dur_ns")
    if not parts:
        return DATA_STAGE_BATCHES_SCHEMA.empty_table()
    return pa.concat_tables(parts).sort_by([("start_ns", "ascending")])


def _worker_count(fetches: pa.Table) -> int:
    """Worker processes seen (0 when the training process fetched: num_workers=0)."""
    ids = columns.int64(fetches.column("worker"))
    return int(len(np.unique(ids[ids >= 0])))


def data_workers(trace: Trace) -> pa.Table:
    """Per worker process: batches, busy, CPU and idle time, and its stage totals."""
    fetches = rows_of_kind(trace.dataloader, "fetch")
    if fetches.num_rows == 0:
        return DATA_WORKERS_SCHEMA.empty_table()
    with_end = fetches.append_column("end_ns", pc.add(fetches.column("start_ns"), fetches.column("dur_ns")))
    grouped = with_end.group_by(["worker", "pid"]).aggregate(
        [
            ("dur_ns", "count"),
            ("dur_ns", "sum"),
            ("cpu_ns", "mean"),
            ("start_ns", "min"),
            ("end_ns", "max"),
            ("read_ns", "mean"),
            ("transform_ns", "mean"),
            ("collate_ns", "sum"),
        ]
    )
    grouped = grouped.sort_by([("worker", "ascending"), ("start_ns_min", "ascending")])
    count = columns.int64(grouped.column("dur_ns_count"))  # after the sort: the rows' own counts

    def estimated(mean: str) -> pa.Array:  # measured on some batches only: their mean x batches
        return pa.array(np.round(columns.numpy(grouped.column(mean), 0.0) * count).astype(np.int64))

    busy = columns.int64(grouped.column("dur_ns_sum"))
    span = columns.int64(grouped.column("end_ns_max")) - columns.int64(grouped.column("start_ns_min"))
    return pa.table(
        {
            "rank": pa.array(np.full(grouped.num_rows, trace.rank, np.int32)),
            "worker": grouped.column("worker"),
            "pid": grouped.column("pid"),
            "batches": grouped.column("dur_ns_count"),
            "busy_ns": pa.array(busy),
            "cpu_ns": estimated("cpu_ns_mean"),
            "idle_ns": pa.array(np.maximum(span - busy, 0)),
            "read_ns": estimated("read_ns_mean"),
            "transform_ns": estimated("transform_ns_mean"),
            "collate_ns": pc.fill_null(grouped.column("collate_ns_sum"), 0),
        }
    ).cast(DATA_WORKERS_SCHEMA)


def data_pipeline_summary(trace: Trace, stages: pa.Table | None = None) -> pa.Table:
    """One row: queue usage and empty counts, the wait share and the named bottleneck with why."""
    facts = judge.judgement(trace.dataloader)
    if facts is None:
        return DATA_PIPELINE_SUMMARY_SCHEMA.empty_table()
    stages = data_stages(trace) if stages is None else stages
    workers = _worker_count(rows_of_kind(trace.dataloader, "fetch"))
    named = stages.filter(stages.column("bottleneck")).to_pylist()
    stage = named[0] if named else None
    return pa.Table.from_pylist(
        [
            {
                "rank": trace.rank,
                "requests": judge.judged_requests(trace.dataloader).num_rows,
                "num_workers": workers,
                "wait_ns": facts["wait"],
                "loop_ns": facts["loop"],
                "wait_share": facts["share"],
                "consume_interval_ns": facts["interval"],
                "host_queue_capacity": facts["capacity"],
                "host_queue_mean": facts["host_mean"],
                "host_queue_usage": facts["host_usage"],
                "host_queue_empty": facts["host_empty"],
                "host_queue_empty_ratio": facts["host_empty_ratio"],
                "host_queue_full": facts["host_full"],
                "device_queue_mean": facts["device_mean"],
                "device_queue_empty": facts["device_empty"],
                "device_queue_empty_ratio": facts["device_empty_ratio"],
                "verdict": facts["verdict"],
                "bottleneck_stage": stage["stage"] if stage else None,
                "reason": judge.reason(facts, stage, workers),
            }
        ],
        schema=DATA_PIPELINE_SUMMARY_SCHEMA,
    )
