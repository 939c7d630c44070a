"""The one trace model: typed Arrow tables with explicit units.

Every reader (``perfsight.ingest``) produces a :class:`Trace`; every analysis
(``perfsight.analysis``) consumes one.  Times are integer nanoseconds (``*_ns``),
sizes are integer bytes (``*_bytes``); conversion to the microseconds and
megabytes of MindSpore-style files happens only at the export edge.

This module holds schemas and small constructors only.  It must not parse
files or compute metrics.  The schema is documented for users in
``docs/TRACE_MODEL.md``; keep the two in step.
"""

from __future__ import annotations

import dataclasses
import enum
from typing import Any

import pyarrow as pa

NO_ID = -1
"""Sentinel for integer ids that are absent (correlation, external id, step, stream)."""


class SliceKind(str, enum.Enum):
    """What a slice is, independent of the framework that recorded it."""

    CPU_OP = "cpu_op"  # a framework operator on a host thread (aten::mm, ...)
    PYTHON = "python"  # a Python function frame (with_stack)
    ANNOTATION = "annotation"  # a user range (record_function / perfsight.range)
    STEP = "step"  # a training step marker (ProfilerStep#N)
    DATA_LOADING = "data_loading"  # waiting for / producing the next batch
    RUNTIME = "runtime"  # a host-side accelerator API call (cudaLaunchKernel)
    KERNEL = "kernel"  # a compute kernel on an accelerator stream
    MEMCPY = "memcpy"  # a copy on an accelerator stream
    MEMSET = "memset"  # a fill on an accelerator stream
    COMMUNICATION = "communication"  # a collective/p2p op (device kernel or host op)
    DEVICE_ANNOTATION = "device_annotation"  # a user range mirrored on a stream
    SYNC = "sync"  # a host/device synchronisation wait
    OTHER = "other"


KIND_NAMES: tuple[str, ...] = tuple(k.value for k in SliceKind)
"""The ``kind`` dictionary, in a fixed order, so that every rank's slices share it."""


def kind_code(kind: SliceKind) -> int:
    """The integer a reader uses for ``kind`` while it builds a table (one byte a row, not a string)."""
    return KIND_NAMES.index(kind.value)


DEVICE_COMPUTE_KINDS = (
    SliceKind.KERNEL.value,
    SliceKind.MEMCPY.value,
    SliceKind.MEMSET.value,
)
"""Device slices (``is_device``) that are compute: everything a stream runs but communication."""

DEVICE_ACTIVITY_KINDS = (*DEVICE_COMPUTE_KINDS, SliceKind.COMMUNICATION.value)
"""Device slices (``is_device``) that occupy a stream: compute and communication kernels (device
annotations are not work)."""

HOST_OP_KINDS = (SliceKind.CPU_OP.value, SliceKind.COMMUNICATION.value)
"""Host slices (``is_device`` false) that are operators (a collective's host op is one)."""

CONCRETE_INPUT_OPS = frozenset(
    {
        "aten::conv1d",
        "aten::conv2d",
        "aten::conv3d",
        "aten::conv_transpose1d",
        "aten::conv_transpose2d",
        "aten::conv_transpose3d",
        "aten::convolution",
        "aten::_convolution",
        "aten::convolution_backward",
    }
)
"""Operators whose scalar arguments (Kineto's ``Concrete Inputs``: stride, padding, dilation,
transposed, groups) the slice table keeps: a convolution's FLOPs depend on them.  A trace recorded
with shapes carries them on every operator, and nothing else reads them, so other rows' are
dropped as the trace is read: kept on every row they would only grow the slice table."""

_DICT = pa.dictionary(pa.int32(), pa.string())

SLICE_SCHEMA = pa.schema(
    [
        pa.field("rank", pa.int32(), nullable=False),
        pa.field("kind", _DICT, nullable=False),
        pa.field("category", _DICT),  # the source's own category, kept for reference
        pa.field("name", _DICT, nullable=False),
        pa.field("is_device", pa.bool_(), nullable=False),  # runs on an accelerator timeline
        pa.field("pid", pa.int64(), nullable=False),  # source process id (device id for GPU rows)
        pa.field("tid", pa.int64(), nullable=False),  # source thread id (stream for GPU rows)
        pa.field("track", pa.int32(), nullable=False),  # index into Trace.tracks
        pa.field("start_ns", pa.int64(), nullable=False),
        pa.field("dur_ns", pa.int64(), nullable=False),
        pa.field("depth", pa.int16(), nullable=False),  # nesting level on its track, 0 = top
        pa.field("correlation", pa.int64(), nullable=False),  # runtime call <-> device work
        pa.field("external_id", pa.int64(), nullable=False),  # host op <-> its launches
        pa.field("step", pa.int32(), nullable=False),  # training step number, NO_ID if outside
        pa.field("input_dims", pa.list_(pa.list_(pa.int64()))),  # one shape per input; [] = not a tensor
        pa.field("input_types", pa.list_(pa.string())),  # one dtype name per input
        # one recorded scalar argument per input ("[2, 2]", "False", "" for a tensor), kept only
        # for CONCRETE_INPUT_OPS
        pa.field("concrete_inputs", pa.list_(pa.string())),
        pa.field("grid", pa.list_(pa.int64())),  # [x, y, z] for kernels
        pa.field("block", pa.list_(pa.int64())),
        pa.field("occupancy_pct", pa.float32()),  # estimated achieved occupancy
        pa.field("bytes", pa.int64()),  # memcpy/memset size
        pa.field("op_type", _DICT),  # device work: the vendor's operator type (Conv2D), when recorded
        pa.field(
            "core_type", _DICT
        ),  # device work: the vendor's core (AI_CORE, MIX_AIV, HCCL), when recorded
    ]
)
"""One row per timed interval (Chrome ``ph: X``), on host threads and device streams."""

TRACK_SCHEMA = pa.schema(
    [
        pa.field("track", pa.int32(), nullable=False),
        pa.field("rank", pa.int32(), nullable=False),
        pa.field("pid", pa.int64(), nullable=False),
        pa.field("tid", pa.int64(), nullable=False),
        pa.field("is_device", pa.bool_(), nullable=False),
        pa.field("device_index", pa.int32(), nullable=False),  # NO_ID for host threads
        pa.field("stream", pa.int64(), nullable=False),  # NO_ID for host threads
        pa.field("name", pa.string(), nullable=False),  # "thread 1234 (python)", "stream 7"
    ]
)
"""One row per timeline lane: a host thread or a device stream of one rank."""

MEMORY_SCHEMA = pa.schema(
    [
        pa.field("rank", pa.int32(), nullable=False),
        pa.field("device_type", _DICT, nullable=False),  # "cpu", "cuda", "npu", ...
        pa.field("device_index", pa.int32(), nullable=False),
        pa.field("ts_ns", pa.int64(), nullable=False),
        pa.field("tid", pa.int64(), nullable=False),  # host thread that (de)allocated
        pa.field("addr", pa.int64(), nullable=False),
        pa.field("bytes", pa.int64(), nullable=False),  # > 0 allocation, < 0 release
        pa.field("allocated_bytes", pa.int64()),  # allocator total after the event
        pa.field("reserved_bytes", pa.int64()),
        pa.field("active_bytes", pa.int64()),
    ]
)
"""Allocator events (Kineto ``[memory]``): the counters behind memory curves and peaks."""

FLOW_SCHEMA = pa.schema(
    [
        pa.field("rank", pa.int32(), nullable=False),
        pa.field("kind", _DICT, nullable=False),  # "launch" (runtime -> device), "fwdbwd"
        pa.field("src", pa.int64(), nullable=False),  # row index into Trace.slices
        pa.field("dst", pa.int64(), nullable=False),
    ]
)
"""Causal arrows between slices, by row index into ``Trace.slices``."""

STEP_SCHEMA = pa.schema(
    [
        pa.field("rank", pa.int32(), nullable=False),
        pa.field("step", pa.int32(), nullable=False),
        pa.field("start_ns", pa.int64(), nullable=False),  # host-side step marker
        pa.field("end_ns", pa.int64(), nullable=False),
        pa.field("device_start_ns", pa.int64()),  # first device work of the step, null if none
        pa.field("device_end_ns", pa.int64()),  # last device work of the step
        pa.field("complete", pa.bool_(), nullable=False),  # False: cut by the window or a truncation
        pa.field("inferred", pa.bool_(), nullable=False),  # True: no step marker, whole trace used
    ]
)
"""One row per training step of a rank."""

COMM_SCHEMA = pa.schema(
    [
        pa.field("rank", pa.int32(), nullable=False),
        pa.field("slice", pa.int64(), nullable=False),  # row index into Trace.slices
        pa.field("is_device", pa.bool_(), nullable=False),
        pa.field("collective", pa.string(), nullable=False),  # all_reduce, send, ...
        pa.field("start_ns", pa.int64(), nullable=False),
        pa.field("dur_ns", pa.int64(), nullable=False),
        pa.field("step", pa.int32(), nullable=False),
        pa.field("in_bytes", pa.int64()),
        pa.field("out_bytes", pa.int64()),
        pa.field("dtype", pa.string()),
        pa.field("group", pa.string()),  # process group name
        pa.field("group_ranks", pa.string()),  # JSON list of global ranks
        pa.field("seq", pa.int64()),  # per-group sequence number, when recorded
        pa.field("peer", pa.int64()),  # global rank of the peer for send/recv
        pa.field("name", pa.string()),  # the op's own name (hcom_allReduce__586_0_1), when recorded
        pa.field("host_wait_ns", pa.int64()),  # caller blocked in Work.wait() (perfsight's comm capture)
        pa.field("source", pa.string()),  # "trace", "trace+capture", "capture", "flight_recorder"
    ]
)
"""One row per communication op instance seen by a rank (host op or device kernel)."""

P2P_COLLECTIVES: tuple[str, ...] = ("send", "recv", "send_recv")
"""Values of ``COMM_SCHEMA.collective`` that are point-to-point: data between two ranks, not over a
group.  ``send_recv`` (HCCL's ``hcom_batchSendRecv``, NCCL's ``SendRecv`` kernel of a grouped
``batch_isend_irecv``) is point-to-point too, as Ascend's ``communication.json`` files it."""


COMMUNICATION_HOST_OP_NAME = r"^(?:record_param_comms$|nccl:|gloo:|c10d::|ProcessGroup|c10d_functional::)"
"""Host operators that run a collective or point-to-point op (``c10d::allreduce_``, ``gloo:send``,
``record_param_comms``...): the Kineto reader gives their slices kind ``communication``, and a
comparison of operators counts their time as communication, not compute."""


def is_p2p(collective: pa.Array | pa.ChunkedArray) -> pa.Array:
    """Which ``collective`` values are point-to-point (:data:`P2P_COLLECTIVES`); null is not.

    The one definition: the analyses, the exports and the cluster matching all ask this."""
    import pyarrow.compute as pc  # here, not at the top: the collector imports this module in training

    if isinstance(collective, pa.ChunkedArray):
        collective = collective.combine_chunks() if collective.num_chunks else pa.array([], pa.string())
    values = collective.cast(pa.string())
    return pc.fill_null(pc.is_in(values, value_set=pa.array(P2P_COLLECTIVES, pa.string())), False)


COMM_TASK_SCHEMA = pa.schema(
    [
        pa.field("rank", pa.int32(), nullable=False),
        pa.field("op", pa.int64(), nullable=False),  # row index into Trace.comm, NO_ID if unmatched
        pa.field("slice", pa.int64(), nullable=False),  # row index into Trace.slices, NO_ID if none
        pa.field("plane", pa.int32(), nullable=False),  # HCCL plane (a lane of one op), NO_ID if unknown
        pa.field("task_type", pa.string(), nullable=False),  # Memcpy, Reduce_Inline, Notify_Wait, RDMASend
        pa.field("start_ns", pa.int64(), nullable=False),
        pa.field("dur_ns", pa.int64(), nullable=False),
        pa.field("transport", pa.string()),  # SDMA, RDMA, LOCAL
        pa.field("link", pa.string()),  # HCCS, PCIE, SIO, ON_CHIP, ROCE, HCCS_SW; null when invalid
        pa.field("rdma_type", pa.string()),  # RDMA_SEND_PAYLOAD / RDMA_SEND_NOTIFY, when recorded
        pa.field("bytes", pa.int64()),  # bytes moved by this task (0 for notifications)
        pa.field("src_rank", pa.int64()),  # null when the source marks it invalid
        pa.field("dst_rank", pa.int64()),
    ]
)
"""One row per transfer or synchronisation task of a communication op (HCCL's per-plane tasks).

Kineto/NCCL traces have none (empty table); Ascend's HCCL timeline and database do.
"""

DATALOADER_SCHEMA = pa.schema(
    [
        pa.field("rank", pa.int32(), nullable=False),
        # "wait" (training loop) | "fetch" (a batch in a worker) | "stage" (one stage of a fetch) | "pin"
        pa.field("kind", pa.string(), nullable=False),
        pa.field("step", pa.int32(), nullable=False),  # step the row started in, NO_ID if outside
        pa.field("worker", pa.int32(), nullable=False),  # data-loader worker id, -1 = training process
        pa.field("pid", pa.int64(), nullable=False),
        pa.field("batch", pa.int64()),  # wait: index of the batch within its epoch
        pa.field("start_ns", pa.int64(), nullable=False),  # trace clock
        pa.field("dur_ns", pa.int64(), nullable=False),
        pa.field("ready_batches", pa.int32()),  # wait: batches already queued when it was requested
        pa.field("read_ns", pa.int64()),  # fetch: dataset reads (__getitem__ minus transforms)
        pa.field("transform_ns", pa.int64()),  # fetch: the dataset's transforms
        pa.field("collate_ns", pa.int64()),  # fetch: collate_fn
        pa.field("samples", pa.int32()),  # fetch: samples in the batch
        pa.field("host_queue", pa.int32()),  # wait: batches in the workers' result queue (0 without workers)
        pa.field("device_queue", pa.int32()),  # wait: batches pinned and ready (pin_memory thread only)
        pa.field("queue_capacity", pa.int32()),  # wait: prefetch_factor x num_workers (0 without workers)
        pa.field("sampler_ns", pa.int64()),  # wait: time in the sampler since the previous wait
        pa.field("cpu_ns", pa.int64()),  # fetch: CPU time of the fetching thread
        pa.field("stage", pa.string()),  # stage: its name ("collate", "transform[0] Resize"); copy: device
        pa.field("bytes", pa.int64()),  # copy: bytes of the batch's tensors copied by the loop's .to()
    ]
)
"""One row per batch waited for (training loop), fetched (a worker), per stage of a fetch (its
start is the fetch's, its duration the stage's total in that batch), pinned, or copied to the
device by the loop (``copy``: its summed copy time, bytes and target device): perfsight's
data-loader capture (``collect/dataloader_capture.py``)."""


STEP_PHASES_SCHEMA = pa.schema(
    [
        pa.field("rank", pa.int32(), nullable=False),
        pa.field("step", pa.int32(), nullable=False),
        pa.field("start_ns", pa.int64(), nullable=False),
        pa.field("end_ns", pa.int64(), nullable=False),
        pa.field("duration_ns", pa.int64(), nullable=False),
        pa.field("fp_start_ns", pa.int64(), nullable=False),
        pa.field("bp_end_ns", pa.int64(), nullable=False),
        pa.field("iteration_interval_ns", pa.int64(), nullable=False),
        pa.field("fp_bp_ns", pa.int64(), nullable=False),
        pa.field("tail_ns", pa.int64(), nullable=False),
    ]
)
"""Where each step's time goes (iteration interval + forward/backward + tail = duration), in ns: the
columns every step trace has, perfsight's own (``analysis.step_trace``) and the one a vendor's tool
recorded (:attr:`VendorResults.step_trace`), so the two compare column by column."""


@dataclasses.dataclass
class VendorResults:
    """What the source's own tool computed and recorded, kept beside perfsight's analyses as a
    cross-check, never in their place.

    Why typed and apart: a vendor's result may rest on facts the events do not carry (MindInsight's
    legacy step trace places FP/BP by the graph's op order, which its files do not keep), so it can
    neither be recomputed nor silently stand for perfsight's own number.  Readers fill it; the
    pipeline adds its tables to a rank's results under their own names and compares the step trace
    with perfsight's.  Units as everywhere in the model (ns, bytes)."""

    step_trace: pa.Table = dataclasses.field(default_factory=lambda: STEP_PHASES_SCHEMA.empty_table())
    """The vendor's own step trace (:data:`STEP_PHASES_SCHEMA`); empty when the source has none."""
    tables: dict[str, pa.Table] = dataclasses.field(default_factory=dict)
    """Other recorded results the events cannot give, by table name (MindInsight's
    ``hccl_raw`` per step and per link: ``mindinsight_hccl_steps``, ``mindinsight_hccl_links``)."""

    STEP_TRACE_TABLE = "vendor_step_trace"
    """The name under which :attr:`step_trace` appears among a rank's tables."""

    def named_tables(self) -> dict[str, pa.Table]:
        """Every non-empty recorded table by the name it has among a rank's tables."""
        named = {self.STEP_TRACE_TABLE: self.step_trace} if self.step_trace.num_rows else {}
        return {**named, **{name: table for name, table in self.tables.items() if table.num_rows}}


@dataclasses.dataclass
class DeviceInfo:
    """An accelerator as the trace describes it."""

    index: int
    name: str
    memory_bytes: int | None = None
    sm_count: int | None = None
    compute_capability: str | None = None


@dataclasses.dataclass
class RunMetadata:
    """Facts about the run that are not timed events.  Never guessed from file names
    unless ``rank_source`` says so (then a warning was emitted)."""

    rank: int = 0
    world_size: int = 1
    rank_source: str = "default"  # "trace", "file name", "option", "default"
    host: str | None = None
    framework: str = "pytorch"
    versions: dict[str, str] = dataclasses.field(default_factory=dict)
    devices: list[DeviceInfo] = dataclasses.field(default_factory=list)
    process_groups: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    backend: str | None = None
    base_time_ns: int | None = None  # add to start_ns for wall-clock Unix time, when known
    sources: list[str] = dataclasses.field(default_factory=list)
    warnings: list[str] = dataclasses.field(default_factory=list)
    extra: dict[str, Any] = dataclasses.field(default_factory=dict)
    # from a perfsight run folder's profiler_info (None when the input does not record them)
    local_rank: int | None = None
    clock_offset_ns: int | None = None  # this rank's clock minus rank 0's, to subtract from times
    clock_uncertainty_ns: int | None = None
    complete: bool = True  # False: the profiling window was cut short (see warnings)
    compute_recorded: bool = True
    """False: the input has no timeline of compute work (a MindInsight legacy run without
    ``ascend_timeline_display``), so what needs compute time (the overlap breakdown) is unknown:
    analyses return it empty, never "100 % free"."""

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RunMetadata:
        known = {f.name for f in dataclasses.fields(cls)}
        kwargs = {k: v for k, v in data.items() if k in known}
        kwargs["devices"] = [DeviceInfo(**d) for d in kwargs.get("devices", [])]
        return cls(**kwargs)


@dataclasses.dataclass
class Trace:
    """All tables of one rank.  Cheap to pass around; tables are immutable."""

    slices: pa.Table
    tracks: pa.Table
    memory: pa.Table
    flows: pa.Table
    steps: pa.Table
    comm: pa.Table
    meta: RunMetadata
    comm_tasks: pa.Table = dataclasses.field(default_factory=lambda: COMM_TASK_SCHEMA.empty_table())
    dataloader: pa.Table = dataclasses.field(default_factory=lambda: DATALOADER_SCHEMA.empty_table())
    vendor: VendorResults = dataclasses.field(default_factory=VendorResults)
    """What the source's own tool recorded (a cross-check; see :class:`VendorResults`)."""

    @property
    def rank(self) -> int:
        return self.meta.rank


TABLE_SCHEMAS: dict[str, pa.Schema] = {
    "slices": SLICE_SCHEMA,
    "tracks": TRACK_SCHEMA,
    "memory": MEMORY_SCHEMA,
    "flows": FLOW_SCHEMA,
    "steps": STEP_SCHEMA,
    "comm": COMM_SCHEMA,
    "comm_tasks": COMM_TASK_SCHEMA,
    "dataloader": DATALOADER_SCHEMA,
}
"""Every table of a :class:`Trace` by attribute name: used by the cache and the docs test."""


def empty_table(schema: pa.Schema) -> pa.Table:
    """A zero-row table of ``schema`` (readers return these rather than ``None``)."""
    return schema.empty_table()


def conform(table: pa.Table, schema: pa.Schema) -> pa.Table:
    """Select and cast ``table``'s columns to ``schema``, in schema order.

    Missing nullable columns become nulls, so readers can build only what their
    format has.  Raises ``KeyError`` naming a missing non-nullable column.
    """
    columns = []
    for field in schema:
        if field.name in table.column_names:
            columns.append(table.column(field.name).cast(field.type))
        elif field.nullable:
            columns.append(pa.nulls(table.num_rows, field.type))
        else:
            raise KeyError(f"table lacks required column {field.name!r}")
    return pa.Table.from_arrays(columns, schema=schema)
