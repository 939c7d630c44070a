"""The ops of each step in execution order, and the micro-batch blocks of a pipeline stage.

Why a table of its own: the parallel-execution views of seed 000 (the Marey view and the pipeline
chart) draw, for one step, every device's ops as intervals in time and join the same op across the
devices of a stage.  Neither the operator statistics (aggregated over instances) nor the step trace
(phases, not ops) keep the ops themselves, so this table does: one row per *outermost* op of a step
(an op nested inside another op is part of its parent's interval), with its order in the step --
the k-th op of a step is the same op on every device of a stage that runs the same program.

Which ops: compute only -- device work (kernels, copies) when the trace has any, else the host ops
of the thread that runs the training step (the thread holding ``ProfilerStep#N``: on a CPU job
that thread computes).  Communication ops are not taken from here: the cluster's matching already
holds each one with its execution timing (the NCCL kernel, gloo's worker-thread range), which a
host op nested inside an autograd op would hide.  Micro-batch blocks are the
``Forward N`` / ``Backward N`` ranges PyTorch's pipeline schedules record
(``torch.distributed.pipelining``); a stage that records none has no block rows, and the pipeline
chart says so rather than guessing a schedule.

What it must not do: decide cross-rank facts (which op matches which on another rank, clock
offsets) -- that is ``perfsight.cluster.execution``.  Vectorised: one sort and a grouped cumulative
maximum, no loop over slices.

The same table carries the two series the Marey view overlays on each device's timeline, as rows of
their own level with a ``value``: ``level = "flops"``, one row per outermost operator with a FLOPs
count (``perfsight.analysis.flops.op_flops``: its interval and its FLOPs), and ``level = "memory"``,
one row per allocator event of the rank's device (its time and the allocated total after it, bytes;
the device's events when the trace has any, else the host's).  They share the op rows' clock and
step so that one shift puts all of them on the job's clock.
"""

from __future__ import annotations

import dataclasses
import re

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from numpy.typing import NDArray

from perfsight import columns, intervals
from perfsight.analysis.index import TraceIndex, index_of
from perfsight.model import Trace

STEP_OPS_SCHEMA = pa.schema(
    [
        ("rank", pa.int32()),
        ("step", pa.int32()),
        ("level", pa.string()),  # "op" (an outermost op) or "micro_batch" (a Forward/Backward range)
        ("order", pa.int32()),  # index among the rank's rows of this step and level, in start order
        ("name", pa.string()),
        ("category", pa.string()),  # "compute" (communication rows are the cluster's matched ops)
        ("phase", pa.string()),  # micro-batch rows: "forward" / "backward"; op rows: ""
        ("micro_batch", pa.int32()),  # micro-batch rows: N of "Forward N"; op rows: -1
        ("slice", pa.int64()),  # row in the rank's ``slices`` (joins ``comm.slice``)
        ("start_ns", pa.int64()),
        ("end_ns", pa.int64()),
        ("value", pa.float64()),  # "flops" rows: FLOPs; "memory" rows: allocated bytes; else null
    ]
)
"""Units: ns on the rank's own trace clock (the cluster step shifts them onto the common clock)."""

SAMPLE_LEVELS = ("flops", "memory")
"""The levels that are series over time, not ops (they have a ``value`` and no key)."""

OP_KINDS_DEVICE = ("kernel", "memcpy", "memset")
OP_KINDS_HOST = ("cpu_op",)
MICRO_BATCH_PATTERN = r"^(?i:(forward|backward))\D*?(\d+)$"
"""``Forward 3``, ``Backward 3``, ``Backward input 3``, ``Backward weight 3`` (torch pipelining)."""


def step_ops(trace: Trace) -> pa.Table:
    """One row per outermost op and per micro-batch range of every step (:data:`STEP_OPS_SCHEMA`)."""
    merge = StepOpsMerge()
    merge.add(step_ops_part(trace))
    return merge.table(trace.rank)


@dataclasses.dataclass
class Rows:
    """Rows as NumPy columns of equal length, their names as codes into the names they use.

    Why not a pandas frame: a rank of a thousand-rank job has a few thousand rows here, and
    pandas' cost per call (an index per frame, dtype checks, a copy per filter) was most of this
    table's time -- 22 ms a rank, about 11 s of a 1,024-rank job's two cores."""

    columns: dict[str, np.ndarray]
    codes: NDArray[np.int64] | None = None
    """Each row's name: a position in ``names``, -1 for none; None where rows have no names."""
    names: pa.Array | None = None
    """The names the rows use (Arrow strings; a name may repeat across joined parts)."""

    def __len__(self) -> int:
        return len(next(iter(self.columns.values()))) if self.columns else 0

    @property
    def empty(self) -> bool:
        return len(self) == 0

    def __getitem__(self, column: str) -> np.ndarray:
        return self.columns[column]

    def __contains__(self, column: str) -> bool:
        return column in self.columns

    def take(self, rows: np.ndarray) -> Rows:
        """The rows at positions ``rows``, in that order."""
        codes = None if self.codes is None else self.codes[rows]
        return Rows({name: values[rows] for name, values in self.columns.items()}, codes, self.names)

    def none(self) -> Rows:
        """The same columns without a row."""
        return self.take(np.zeros(0, np.int64))

    def assign(self, column: str, values: np.ndarray) -> Rows:
        return Rows({**self.columns, column: values}, self.codes, self.names)

    def drop(self, column: str) -> Rows:
        return Rows({k: v for k, v in self.columns.items() if k != column}, self.codes, self.names)

    def name_codes(self) -> pa.DictionaryArray:
        """The names as int32 codes into string values (null where a row has none)."""
        assert self.codes is not None and self.names is not None
        return pa.DictionaryArray.from_arrays(
            pa.array(self.codes, pa.int32(), mask=self.codes < 0), pc.cast(self.names, pa.string())
        )


@dataclasses.dataclass
class StepOpsPart:
    """What :func:`step_ops` reads of one part of a rank's trace: the whole trace, or a chunk of
    whole steps (``perfsight.model_chunks``) read one at a time by the bounded-memory path.

    The choices only the whole trace can make -- device ops or the main thread's host ops, which
    thread is the main one, which memory device is the busiest, which op is nested in an op of
    another part -- are left to :class:`StepOpsMerge`: a part keeps every candidate and the counts
    those choices read.  ``slice`` values are rows of the whole trace's slices."""

    device: Rows
    """Device op candidates (:func:`_outermost_part`)."""
    host: Rows
    """Host op candidates of every thread (:func:`_outermost_part`)."""
    blocks: Rows
    flops: Rows
    memory: Rows
    """Allocator events inside a step, every device (``device_type``, ``device_index`` kept)."""
    memory_counts: dict[tuple[str, int], int]
    """Allocator events with an allocated total, per (device_type, device_index)."""
    step_tracks: dict[int, int]
    """Step markers (``kind == "step"``) per track, among the slices inside a step."""
    tracks: dict[int, int]
    """Slices inside a step per track."""
    has_slices: bool
    """Whether the part has any slice (a trace without any has no rows, memory events or not)."""


CANDIDATE_COLUMNS = ["track", "start_ns", "dur_ns", "step", "slice"]
"""What a part keeps of each op candidate, besides its name (a code into the names it uses)."""


def step_ops_part(trace: Trace, rows: np.ndarray | None = None) -> StepOpsPart:
    """The candidates and counts of ``trace`` (a whole trace, or a chunk whose slices are the
    whole trace's ``rows``), chosen and kept on NumPy columns."""
    slices = trace.slices
    whole = np.arange(slices.num_rows, dtype=np.int64) if rows is None else np.asarray(rows, np.int64)
    # a chunk's columns are read once, here; a whole trace's index is the one its analyses share
    ix = index_of(trace) if rows is None else TraceIndex(slices)
    in_step = ix.step >= 0
    device = in_step & ix.kind_mask(OP_KINDS_DEVICE, is_device=True)
    host = in_step & ix.kind_mask(OP_KINDS_HOST, is_device=False)
    memory, memory_counts = _memory_candidates(trace)
    return StepOpsPart(
        device=_outermost_part(_candidates(slices, ix, np.flatnonzero(device), whole)),
        host=_outermost_part(_candidates(slices, ix, np.flatnonzero(host), whole)),
        blocks=_micro_batch_blocks(slices, ix, np.flatnonzero(in_step & ix.of_kind(("annotation",))), whole),
        flops=_flops_rows(trace, ix, in_step, whole),
        memory=memory,
        memory_counts=memory_counts,
        step_tracks=_track_counts(ix.track[in_step & ix.of_kind(("step",))]),
        tracks=_track_counts(ix.track[in_step]),
        has_slices=slices.num_rows > 0,
    )


def _candidates(slices: pa.Table, ix: TraceIndex, local: np.ndarray, whole: np.ndarray) -> Rows:
    """The rows ``local`` of ``slices`` as :data:`CANDIDATE_COLUMNS` and names (``slice``: the whole
    trace's row)."""
    codes, names = _names(slices, local)
    return Rows(
        {
            "track": ix.track[local],
            "start_ns": ix.start[local],
            "dur_ns": _raw_dur(slices, ix)[local],
            "step": ix.step[local],
            "slice": whole[local],
        },
        codes,
        names,
    )


def _names(slices: pa.Table, local: np.ndarray) -> tuple[NDArray[np.int64], pa.Array]:
    """The names of the rows ``local`` of ``slices``: a code per row (-1: none) into the names
    these rows use, no text per row.  Only the used names are kept: a chunk's part is kept until
    the whole trace is read, and the column's dictionary holds every name of the trace."""
    column = slices.column("name")
    if column.num_chunks == 1 and pa.types.is_dictionary(column.type):
        chunk = column.chunk(0)
        codes, values = columns.numpy(chunk.indices, -1)[local].astype(np.int64), chunk.dictionary
    else:  # plain text, or dictionaries per chunk: encode the taken rows
        taken = columns.combined(columns.decoded(column.take(pa.array(local, pa.int64()))))
        encoded = pc.dictionary_encode(taken)
        codes, values = columns.int64(encoded.indices, -1), encoded.dictionary
    known = codes >= 0
    used, at = columns.sorted_codes(codes[known])
    codes[known] = at
    return codes, values.take(pa.array(used, pa.int64()))


def _raw_dur(slices: pa.Table, ix: TraceIndex) -> NDArray[np.int64]:
    """``dur_ns`` as recorded (``TraceIndex.dur`` floors it at 0; an op's reach uses it as is)."""
    return ix.derived("raw dur", lambda: columns.int64(slices.column("dur_ns")))


_MICRO_BATCH = re.compile(MICRO_BATCH_PATTERN)


def _micro_batch_blocks(slices: pa.Table, ix: TraceIndex, local: np.ndarray, whole: np.ndarray) -> Rows:
    """The annotations named as micro-batch ranges (:data:`MICRO_BATCH_PATTERN`), with their phase
    and number; the pattern is matched once per distinct name."""
    codes, names = _names(slices, local)
    found = [None if text is None else _MICRO_BATCH.search(text) for text in names.to_pylist()]
    found.append(None)  # code -1 (no name) reads the last entry
    matched = np.array([m is not None for m in found], bool)[codes]
    phase = np.array([m.group(1).lower() if m else "" for m in found], object)
    number = np.array([int(m.group(2)) if m else -1 for m in found], np.int64)
    picked, picked_codes = local[matched], codes[matched]
    return Rows(
        {
            "start_ns": ix.start[picked],
            "dur_ns": _raw_dur(slices, ix)[picked],
            "step": ix.step[picked],
            "slice": whole[picked],
            "phase": phase[picked_codes],
            "micro_batch": number[picked_codes],
        },
        picked_codes,
        names,
    )


def _track_counts(tracks: np.ndarray) -> dict[int, int]:
    """How many rows each track has."""
    values, counts = np.unique(tracks, return_counts=True)
    return dict(zip(values.tolist(), counts.tolist(), strict=True))


class StepOpsMerge:
    """:func:`step_ops` of a trace from its parts, added in order (chunks in step-window order);
    holds only the candidates a later part can still need (no host candidates once a part had
    device ops, no host memory events once one had an accelerator's)."""

    def __init__(self) -> None:
        self.parts: list[StepOpsPart] = []
        self.has_device = False
        self.has_accelerator = False
        self.has_slices = False

    def add(self, part: StepOpsPart) -> None:
        self.has_device |= not part.device.empty
        self.has_slices |= part.has_slices
        self.has_accelerator |= any(kind != "cpu" for kind, _ in part.memory_counts)
        self.parts.append(part)
        for kept in self.parts:  # what the whole trace will not choose is dropped now
            if self.has_device:
                kept.host = kept.host.none()
            if self.has_accelerator and not kept.memory.empty:
                kept.memory = kept.memory.take(np.flatnonzero(kept.memory["device_type"] != "cpu"))

    def table(self, rank: int, encoded: tuple[str, ...] = ()) -> pa.Table:
        """The rank's :data:`STEP_OPS_SCHEMA` table, as :func:`step_ops` gives it for the whole trace;
        its text columns ``encoded`` dictionary-encoded as ``pyarrow.compute.dictionary_encode``
        encodes them (never spelt out per row: a kernel name is ~180 characters, on a million rows).
        Made once: the parts are let go as the table is made.

        Rows in order of step, then level (alphabetical), then start and slice; ``order`` counts
        each step's rows of a level.  Each level is ordered alone and the levels joined by a stable
        sort on the step, built column by column in Arrow (a rank's ops can be millions of rows),
        the text as codes until the end."""
        parts = self.parts
        if not self.has_slices:
            return STEP_OPS_SCHEMA.empty_table()
        if self.has_device:
            candidates = [p.device for p in parts]
        else:
            main = self._main_track()
            candidates = [
                p.host.take(np.flatnonzero(p.host["track"] == main)) if main is not None else p.host.none()
                for p in parts
            ]
        levels = [
            _level("flops", _by_slice([p.flops for p in parts]), rank, name="flops"),
            _level("memory", self._memory_rows(), rank, name="memory", category="memory"),
            _level("micro_batch", _by_slice([p.blocks for p in parts]), rank),
            _level("op", _outermost(_by_slice(candidates)), rank),
        ]
        self.parts = []
        del parts, candidates
        levels = [t for t in levels if t.num_rows]
        if not levels:
            return STEP_OPS_SCHEMA.empty_table()
        steps = np.concatenate([t.column("step").to_numpy() for t in levels])
        order = np.argsort(steps, kind="stable")
        made = {}
        for name in STEP_OPS_SCHEMA.names:  # a column at a time: one column's copy at most
            chunks = [t.column(name).combine_chunks() for t in levels]
            if pa.types.is_dictionary(chunks[0].type):
                made[name] = _joined_text(chunks, order, name in encoded)
            else:
                made[name] = pa.chunked_array(chunks).take(pa.array(order, pa.int64()))
            levels = [t.drop_columns([name]) for t in levels]
        schema = pa.schema(
            [pa.field(f.name, made[f.name].type) if f.name in encoded else f for f in STEP_OPS_SCHEMA]
        )
        return pa.table(made, schema=schema)

    def _main_track(self) -> int | None:
        """The thread that runs the training step: the one holding most step markers, else most
        slices (the smallest track among equals)."""
        for counts in ([p.step_tracks for p in self.parts], [p.tracks for p in self.parts]):
            total = _summed(counts)
            if total:
                most = max(total.values())
                return min(track for track, count in total.items() if count == most)
        return None

    def _memory_rows(self) -> Rows:
        """The busiest device's events inside a step (an accelerator's when the trace has any; the
        first in (device type, index) order among equals)."""
        counts = _summed([p.memory_counts for p in self.parts])
        if self.has_accelerator:
            counts = {device: count for device, count in counts.items() if device[0] != "cpu"}
        events = [p.memory for p in self.parts if not p.memory.empty]
        if not counts or not events:
            return Rows({})
        busiest = max(counts, key=counts.__getitem__)  # the first of the most, in key order
        m = _joined(events)
        return m.take(np.flatnonzero((m["device_type"] == busiest[0]) & (m["device_index"] == busiest[1])))


def _level(level: str, rows: Rows, rank: int, name: str | None = None, category: str = "compute") -> pa.Table:
    """One level's rows as :data:`STEP_OPS_SCHEMA` columns (the text as codes), ordered by step,
    start and slice (stable)."""
    if rows.empty:
        return _LEVEL_SCHEMA.empty_table()
    step, start = rows["step"].astype(np.int64), rows["start_ns"].astype(np.int64)
    by = columns.lexsort((rows["slice"].astype(np.int64), start, step))
    rows, step, start = rows.take(by), step[by], start[by]
    n = len(rows)
    first = np.flatnonzero(np.r_[True, step[1:] != step[:-1]])
    order = np.arange(n) - np.repeat(first, np.diff(np.r_[first, n]))
    value = rows["value"].astype(np.float64) if "value" in rows else np.full(n, np.nan)

    def constant(text: str) -> pa.DictionaryArray:
        return pa.DictionaryArray.from_arrays(pa.array(np.zeros(n, np.int32)), pa.array([text], pa.string()))

    micro = rows["micro_batch"].astype(np.int64) if "micro_batch" in rows else np.full(n, -1)
    return pa.table(
        {
            "rank": pa.array(np.full(n, rank), pa.int32()),
            "step": pa.array(step, pa.int32()),
            "level": constant(level),
            "order": pa.array(order, pa.int32()),
            "name": rows.name_codes() if name is None else constant(name),
            "category": constant(category),
            "phase": _text_codes(pa.array(rows["phase"], pa.string())) if "phase" in rows else constant(""),
            "micro_batch": pa.array(micro, pa.int32()),
            "slice": pa.array(rows["slice"].astype(np.int64), pa.int64()),
            "start_ns": pa.array(start, pa.int64()),
            "end_ns": pa.array(start + rows["dur_ns"].astype(np.int64), pa.int64()),
            "value": pa.array(value, pa.float64(), mask=np.isnan(value)),
        },
        schema=_LEVEL_SCHEMA,
    )


_LEVEL_SCHEMA = pa.schema(
    [
        pa.field(f.name, pa.dictionary(pa.int32(), pa.string())) if f.type == pa.string() else f
        for f in STEP_OPS_SCHEMA
    ]
)
"""One level's rows (:func:`_level`): the text as codes into each level's own values."""


def _text_codes(values: pa.Array) -> pa.DictionaryArray:
    """Text as int32 codes into string values (a pandas categorical comes as codes already)."""
    if not pa.types.is_dictionary(values.type):
        values = pc.dictionary_encode(values)
    return pa.DictionaryArray.from_arrays(
        values.indices.cast(pa.int32()), pc.cast(values.dictionary, pa.string())
    )


def _joined_text(chunks: list[pa.DictionaryArray], order: np.ndarray, encoded: bool) -> pa.Array:
    """The levels' text codes (``chunks``, each with its own values) as one column in ``order``:
    plain text, or, ``encoded``, dictionary-encoded as ``pc.dictionary_encode`` gives it (the
    values in order of first appearance, int32 codes), with no row's text spelt out."""
    dictionaries = [c.dictionary for c in chunks]
    values = pc.dictionary_encode(pa.concat_arrays(dictionaries))  # a code per distinct text
    offsets = np.cumsum([0] + [len(d) for d in dictionaries])
    to_value = values.indices.to_numpy()
    parts = []
    for at, chunk in zip(offsets, chunks, strict=False):
        local = columns.int64(chunk.indices, null=-1)
        parts.append(np.where(local >= 0, to_value[at + np.maximum(local, 0)], -1))
    codes = np.concatenate(parts)[order]
    known = codes >= 0
    mask = None if known.all() else ~known
    if not encoded:
        return values.dictionary.take(pa.array(np.where(known, codes, 0), pa.int64(), mask=mask))
    seen, first = np.unique(codes[known], return_index=True)
    by_first = np.argsort(first, kind="stable")
    renumbered = np.empty(len(seen), np.int64)
    renumbered[by_first] = np.arange(len(seen))
    out = np.zeros(len(codes), np.int64)
    out[known] = renumbered[np.searchsorted(seen, codes[known])]
    return pa.DictionaryArray.from_arrays(
        pa.array(out, pa.int32(), mask=mask), values.dictionary.take(pa.array(seen[by_first], pa.int64()))
    )


def _summed(counts: list[dict]) -> dict:
    """Counts of several parts added up by key (a few keys: tracks, or devices), in key order."""
    total: dict = {}
    for part in counts:
        for key, count in part.items():
            total[key] = total.get(key, 0) + count
    return dict(sorted(total.items()))


def _joined(parts: list[Rows]) -> Rows:
    """The parts' rows one after the other (each part's name codes moved past the names of the
    parts before it: a name two parts use appears twice among the names, never in a row)."""
    if len(parts) == 1:
        return parts[0]
    joined = {name: np.concatenate([p[name] for p in parts]) for name in parts[0].columns}
    if parts[0].codes is None:
        return Rows(joined)
    at = np.cumsum([0] + [len(p.names) for p in parts[:-1]])
    codes = np.concatenate(
        [np.where(p.codes >= 0, p.codes + offset, -1) for p, offset in zip(parts, at, strict=True)]
    )
    return Rows(joined, codes, pa.concat_arrays([pc.cast(p.names, pa.string()) for p in parts]))


def _by_slice(parts: list[Rows]) -> Rows:
    """The parts' rows in the whole trace's slice order (the order the whole trace's rows have)."""
    parts = [p for p in parts if not p.empty]
    if not parts:
        return Rows({})
    whole = _joined(parts)
    return whole.take(np.argsort(whole["slice"], kind="stable"))


def _flops_rows(trace: Trace, ix: TraceIndex, in_step: np.ndarray, whole: np.ndarray) -> Rows:
    """One row per outermost operator with a FLOPs count, in a step: its interval and FLOPs
    (``whole``: the whole trace's row of each of ``trace``'s slices), in slice order."""
    from perfsight.analysis.flops import op_flops

    counted = op_flops(trace)
    if counted.num_rows == 0:
        return Rows({})
    local = counted.column("slice").to_numpy()
    flops = counted.column("flops").to_numpy()
    keep = np.flatnonzero(in_step[local])
    keep = keep[np.argsort(local[keep], kind="stable")]
    picked = local[keep]
    return Rows(
        {
            "start_ns": ix.start[picked],
            "dur_ns": _raw_dur(trace.slices, ix)[picked],
            "step": ix.step[picked],
            "slice": whole[picked],
            "value": flops[keep],
        }
    )


def _memory_candidates(trace: Trace) -> tuple[Rows, dict[tuple[str, int], int]]:
    """Every device's allocator events inside a step of ``trace`` (its time and the allocated
    total after it, bytes), and the events with an allocated total per device; the merge keeps
    the busiest device's.  A chunk's events lie in its own steps' windows (``model_chunks``), so
    its own step table places them as the whole one does."""
    memory = trace.memory
    if memory.num_rows == 0:
        return Rows({}), {}
    allocated = memory.column("allocated_bytes")
    valid = np.flatnonzero(columns.numpy(pc.is_valid(allocated), False))
    if valid.size == 0:
        return Rows({}), {}
    kinds = pc.dictionary_encode(memory.column("device_type").cast(pa.string())).combine_chunks()
    names = np.asarray(kinds.dictionary.to_pylist(), dtype=object)
    kind = columns.int64(kinds.indices)[valid]
    index = columns.int64(memory.column("device_index"))[valid]
    low, span = int(index.min()), int(index.max()) - int(index.min()) + 1
    pairs, counted = np.unique(kind * span + (index - low), return_counts=True)  # a number per device
    devices = zip(names[pairs // span].tolist(), (pairs % span + low).tolist(), strict=True)
    counts = dict(sorted(zip(devices, counted.tolist(), strict=True)))
    steps = trace.steps
    if steps.num_rows == 0:
        return Rows({}), counts
    step_start = columns.int64(steps.column("start_ns"))
    by_start = np.argsort(step_start, kind="stable")
    step_start = step_start[by_start]
    step_end = columns.int64(steps.column("end_ns"))[by_start]
    step_number = columns.int64(steps.column("step"))[by_start]
    ts = columns.int64(memory.column("ts_ns"))[valid]
    at = np.searchsorted(step_start, ts, side="right") - 1
    inside = at >= 0
    inside[inside] = ts[inside] < step_end[at[inside]]
    if not inside.any():
        return Rows({}), counts
    n = int(inside.sum())
    rows = Rows(
        {
            "device_type": names[kind[inside]],
            "device_index": index[inside].astype(np.int32),
            "slice": np.full(n, -1, np.int64),
            "step": step_number[at[inside]],
            "start_ns": ts[inside],
            "dur_ns": np.zeros(n, np.int64),
            "value": columns.int64(allocated, null=0)[valid][inside].astype(np.float64),
        }
    )
    return rows, counts


def _outermost(ops: Rows) -> Rows:
    """The ops not inside an earlier op of their track: an op starting before the latest end of the
    ops started before it on its track is nested (a track's ops nest, they do not cross; device
    work does not nest, so every kernel is kept).  Rows of :func:`_outermost_part` marked as not
    candidates count as earlier ops but are never kept."""
    if ops.empty:
        return ops
    order, start, end, reach = _by_track(ops)
    kept = ~(start < reach)
    if "candidate" in ops:
        kept &= ops["candidate"][order]
        ops = ops.drop("candidate")
    return ops.take(order[kept])


def _by_track(ops: Rows) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The row order by track, start and longest first (stable), and in that order each op's start,
    end and the latest end of the ops before it on its track (:func:`perfsight.intervals.reach_before`)."""
    track = ops["track"]
    start = ops["start_ns"].astype(np.int64)
    dur = ops["dur_ns"].astype(np.int64)
    order = columns.lexsort((-dur, start, track))
    start, end = start[order], start[order] + dur[order]
    return order, start, end, intervals.reach_before(track[order], end)


def _outermost_part(ops: Rows) -> Rows:
    """What a part keeps for :func:`_outermost` over the whole trace: its ops not nested in an
    earlier op of the part (``candidate``), and the nested ones that end after every earlier op
    of the part (a crossing op, not a candidate: it can still hold an op of a later part).  An op
    nested in the part is nested in the whole; an op dropped here ends no later than one kept, so
    the whole trace's latest end before any op is the same over the kept rows."""
    if ops.empty:
        return ops.assign("candidate", np.zeros(0, bool))
    order, start, end, reach = _by_track(ops)
    nested = start < reach
    kept = ~nested | (end > reach)
    return ops.take(order[kept]).assign("candidate", ~nested[kept])
