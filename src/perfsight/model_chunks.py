"""Cut one rank's :class:`~perfsight.model.Trace` into chunks of whole steps.

Why: a trace of 10 GB does not fit in memory as one ``Trace``, but one training step of it does.
The bounded-memory path (issue 21) reads the trace into chunks of a few steps, runs the analyses
chunk by chunk and merges what they give.  This module is the one definition of a chunk, so that
the spilled reader (which builds chunks from disk) and the in-memory splitter here (which the
tests use to check every chunked result against the whole trace's) cut at the same places.

The rule:

* a slice belongs to its ``step``; a slice outside every step (``NO_ID``) belongs to the step
  whose host window starts last at or before it (the first step when it starts before all);
* consecutive steps go into one chunk while its slices stay within ``max_slices`` (a chunk holds
  at least one step, however large);
* a launch flow never crosses chunks: a device slice launched from another chunk moves to its
  launcher's chunk (the model already gives launched work its launcher's step, so this is rare);
* a communication row goes with its slice; a row without one (an op only a capture saw), and
  memory, data-loader and HCCL task rows go by time, into the chunk whose time range holds them
  (a chunk's range starts at its first step's start and ends where the next chunk's begins; the
  first and last ranges are open-ended);
* every chunk keeps the rank's whole track list, metadata and vendor results (all small), and
  only its own steps' rows of the step table.

Within a chunk, rows keep their order in the whole trace; ``TraceChunk.slice_rows`` maps a
chunk's slice back to its row in the whole trace, so per-row results can be put back in order.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

import numpy as np
import pyarrow as pa

from perfsight.model import NO_ID, Trace


@dataclasses.dataclass(frozen=True)
class TraceChunk:
    """One chunk of a rank's trace: whole steps, with everything that belongs to them."""

    trace: Trace
    """The chunk's rows in :class:`Trace` form; row indices (flows, comm, HCCL tasks) are the chunk's own."""
    slice_rows: np.ndarray
    """Each chunk slice's row in the whole trace (int64, increasing)."""
    steps: tuple[int, ...]
    """The step numbers this chunk owns, in host-window order."""
    number: int
    """0 for the first chunk, counting up."""
    count: int
    """How many chunks the trace was cut into."""
    table_rows: dict[str, np.ndarray] = dataclasses.field(default_factory=dict)
    """For ``flows``, ``comm``, ``memory``, ``dataloader`` and ``comm_tasks``: each chunk row's row in
    the whole trace's table (int64, increasing), so the chunked writers put them back in order."""

    @property
    def is_last(self) -> bool:
        return self.number == self.count - 1


def slice_steps(trace: Trace) -> np.ndarray:
    """The step each slice is counted in for chunking: its own, or the step window it follows."""
    return steps_by_window(
        trace.slices.column("step").to_numpy(), trace.slices.column("start_ns").to_numpy(), trace.steps
    )


def steps_by_window(step: np.ndarray, start: np.ndarray, steps: pa.Table) -> np.ndarray:
    """``slice_steps`` of some slices (their ``step`` and ``start_ns``): readers that hold a part
    of the slices at a time (the spilled reader) call it per part."""
    step = step.astype(np.int32, copy=True)
    outside = np.flatnonzero(step == NO_ID)
    if len(outside) and steps.num_rows:
        starts, numbers = _step_starts(steps)
        pos = np.maximum(np.searchsorted(starts, start[outside], side="right") - 1, 0)
        step[outside] = numbers[pos]
    return step


def chunk_numbers(trace: Trace, max_slices: int) -> tuple[np.ndarray, list[tuple[int, ...]]]:
    """The chunk of each slice, and each chunk's steps (see the module's rule)."""
    if max_slices < 1:
        raise ValueError(f"max_slices must be at least 1, not {max_slices}")
    step = slice_steps(trace)
    if not trace.steps.num_rows:
        return np.zeros(len(step), np.int32), [()]
    step_chunk, chunks = group_steps(trace.steps, step_counts(trace.steps, step), max_slices)
    chunk = chunk_of_steps(trace.steps, step_chunk, step)
    chunk = _launches_follow_launcher(trace, chunk)
    return chunk, chunks


def step_counts(steps: pa.Table, step: np.ndarray) -> np.ndarray:
    """Slices per step (``steps_by_window`` values), in window order; steps the table lacks are
    not counted.  Counts of parts add up."""
    _, numbers = _step_starts(steps)
    slot, known = _slots(numbers, step)
    per_slot = np.zeros(len(numbers), np.int64)
    np.add.at(per_slot, np.argsort(numbers)[slot[known]], 1)
    return per_slot


def group_steps(
    steps: pa.Table, per_slot: np.ndarray, max_slices: int
) -> tuple[np.ndarray, list[tuple[int, ...]]]:
    """Consecutive steps (window order) into chunks of at most ``max_slices`` slices (at least one
    step each): each step's chunk (window order) and each chunk's step numbers."""
    _, numbers = _step_starts(steps)
    step_chunk = np.zeros(len(numbers), np.int32)
    chunks: list[list[int]] = [[]]
    filled = 0
    for i, n in enumerate(numbers):  # one pass over the steps (a few thousand), not the slices
        if chunks[-1] and filled + per_slot[i] > max_slices:
            chunks.append([])
            filled = 0
        chunks[-1].append(int(n))
        filled += int(per_slot[i])
        step_chunk[i] = len(chunks) - 1
    return step_chunk, [tuple(c) for c in chunks]


def chunk_of_steps(steps: pa.Table, step_chunk: np.ndarray, step: np.ndarray) -> np.ndarray:
    """Each slice's chunk from its ``steps_by_window`` step (a step the table lacks: the first)."""
    _, numbers = _step_starts(steps)
    slot, known = _slots(numbers, step)
    chunk = np.zeros(len(step), np.int32)
    chunk[known] = step_chunk[np.argsort(numbers)[slot[known]]]
    return chunk


def _slots(numbers: np.ndarray, step: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each step value's position among the sorted step numbers, and whether it is one of them."""
    ordered = np.sort(numbers)
    slot = np.minimum(np.searchsorted(ordered, step), len(numbers) - 1)
    return slot, ordered[slot] == step


def split_by_steps(trace: Trace, max_slices: int) -> Iterator[TraceChunk]:
    """``trace`` as chunks of whole steps of at most ``max_slices`` slices each (one step may exceed it)."""
    chunk, steps_of = chunk_numbers(trace, max_slices)
    bounds = chunk_starts(trace.steps, steps_of)
    comm_chunk = comm_chunks(trace.comm, chunk, bounds)
    for number, owned in enumerate(steps_of):
        rows = np.flatnonzero(chunk == number)
        low = bounds[number] if number else None
        high = bounds[number + 1] if number + 1 < len(bounds) else None
        table_rows: dict[str, np.ndarray] = {}
        yield TraceChunk(
            trace=_take(trace, rows, np.flatnonzero(comm_chunk == number), owned, low, high, table_rows),
            slice_rows=rows.astype(np.int64),
            steps=owned,
            number=number,
            count=len(steps_of),
            table_rows=table_rows,
        )


def comm_chunks(comm: pa.Table, slice_chunk: np.ndarray, bounds: list[int]) -> np.ndarray:
    """The chunk of each comm row: its slice's, or for a row without a slice (a captured op the
    trace did not record, ``perfsight.ingest.sidecar``) the one whose time range holds its start."""
    if not comm.num_rows:
        return np.zeros(0, np.int32)
    on = comm.column("slice").to_numpy()
    by_time = chunk_by_time(comm.column("start_ns").to_numpy(), bounds)
    return np.where(on >= 0, slice_chunk[np.maximum(on, 0)], by_time).astype(np.int32)


def chunk_by_time(times: np.ndarray, bounds: list[int]) -> np.ndarray:
    """The chunk whose time range (:func:`in_window` of ``bounds``, :func:`chunk_starts`) holds each time."""
    return np.searchsorted(np.array(bounds[1:], np.int64), times, side="right").astype(np.int32)


def _step_starts(steps: pa.Table) -> tuple[np.ndarray, np.ndarray]:
    """Step host-window starts and numbers, in window order."""
    starts = steps.column("start_ns").to_numpy()
    numbers = steps.column("step").to_numpy()
    order = np.argsort(starts, kind="stable")
    return starts[order], numbers[order]


def chunk_starts(steps: pa.Table, steps_of: list[tuple[int, ...]]) -> list[int]:
    """The host start of each chunk's first step (the time boundaries of memory and other timed rows)."""
    if not steps.num_rows:
        return [0]
    start_of = dict(zip(steps.column("step").to_pylist(), steps.column("start_ns").to_pylist(), strict=True))
    return [int(start_of[owned[0]]) for owned in steps_of]


def in_window(times: np.ndarray, low: int | None, high: int | None) -> np.ndarray:
    """True for times in [low, high) (an open end where None): which chunk a timed row is in."""
    keep = np.ones(len(times), bool)
    if low is not None:
        keep &= times >= low
    if high is not None:
        keep &= times < high
    return keep


def _launches_follow_launcher(trace: Trace, chunk: np.ndarray) -> np.ndarray:
    """Move a launched slice into its launcher's chunk when they differ (flows stay in one chunk)."""
    if not trace.flows.num_rows:
        return chunk
    src = trace.flows.column("src").to_numpy()
    dst = trace.flows.column("dst").to_numpy()
    crossing = chunk[src] != chunk[dst]
    if crossing.any():
        chunk = chunk.copy()
        chunk[dst[crossing]] = chunk[src[crossing]]
    return chunk


def whole_rows(local: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """Each of ``local`` (an index into ``rows``, or negative: none) as its value in ``rows``, the
    whole trace's row (NO_ID where none); the inverse of :func:`local_rows`."""
    local = np.asarray(local, np.int64)
    if not len(rows):
        return np.full(len(local), NO_ID, np.int64)
    return np.where(local >= 0, rows[np.maximum(local, 0)], NO_ID).astype(np.int64)


def in_whole_order(parts: list[pa.Table], keys: list[np.ndarray]) -> pa.Table:
    """The chunks' rows of one table (``parts``, each row's place in the whole table in ``keys``)
    back in the whole table's order."""
    table = pa.concat_tables(parts)
    return table.take(pa.array(np.argsort(np.concatenate(keys), kind="stable"), pa.int64()))


def local_rows(global_rows: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """Each of ``global_rows`` (all members of ``rows``, or NO_ID) as an index into ``rows``."""
    local = np.searchsorted(rows, global_rows)
    local = np.minimum(local, max(len(rows) - 1, 0))
    found = (global_rows != NO_ID) & (len(rows) > 0)
    if len(rows):
        found &= rows[local] == global_rows
    return np.where(found, local, NO_ID).astype(np.int64)


def _take(
    trace: Trace,
    rows: np.ndarray,
    comm_rows: np.ndarray,
    owned: tuple[int, ...],
    low: int | None,
    high: int | None,
    table_rows: dict[str, np.ndarray],
) -> Trace:
    """The chunk's :class:`Trace`: ``rows`` of the slices and whatever belongs with them (the whole
    trace's row of each taken row of the other tables goes into ``table_rows``)."""
    index = pa.array(rows, pa.int64())
    slices = trace.slices.take(index)
    flows = trace.flows
    table_rows["flows"] = np.zeros(0, np.int64)
    if flows.num_rows:
        src = local_rows(flows.column("src").to_numpy(), rows)
        keep = src != NO_ID
        table_rows["flows"] = np.flatnonzero(keep).astype(np.int64)
        dst = local_rows(flows.column("dst").to_numpy()[keep], rows)
        flows = flows.filter(pa.array(keep))
        flows = flows.set_column(
            flows.schema.get_field_index("src"), flows.schema.field("src"), pa.array(src[keep], pa.int64())
        )
        flows = flows.set_column(
            flows.schema.get_field_index("dst"), flows.schema.field("dst"), pa.array(dst, pa.int64())
        )
    table_rows["comm"] = comm_rows.astype(np.int64)
    comm = trace.comm.take(pa.array(comm_rows, pa.int64()))
    if comm.num_rows:
        local = local_rows(comm.column("slice").to_numpy(), rows)
        comm = comm.set_column(
            comm.schema.get_field_index("slice"), comm.schema.field("slice"), pa.array(local, pa.int64())
        )
    keep_memory = in_window(trace.memory.column("ts_ns").to_numpy(), low, high)
    memory = trace.memory.filter(pa.array(keep_memory))
    keep_loader = in_window(trace.dataloader.column("start_ns").to_numpy(), low, high)
    dataloader = trace.dataloader.filter(pa.array(keep_loader))
    table_rows["memory"] = np.flatnonzero(keep_memory).astype(np.int64)
    table_rows["dataloader"] = np.flatnonzero(keep_loader).astype(np.int64)
    comm_tasks = _tasks(trace, comm_rows, rows, low, high, table_rows)
    steps = trace.steps.filter(
        pa.array(np.isin(trace.steps.column("step").to_numpy(), np.array(owned, np.int64)))
    )
    return dataclasses.replace(
        trace,
        slices=slices,
        flows=flows,
        comm=comm,
        memory=memory,
        dataloader=dataloader,
        comm_tasks=comm_tasks,
        steps=steps,
    )


def _tasks(
    trace: Trace,
    comm_rows: np.ndarray,
    rows: np.ndarray,
    low: int | None,
    high: int | None,
    table_rows: dict[str, np.ndarray],
) -> pa.Table:
    """HCCL task rows of the chunk, their ``op`` and ``slice`` as chunk rows (by time when unmatched)."""
    tasks = trace.comm_tasks
    if not tasks.num_rows:
        table_rows["comm_tasks"] = np.zeros(0, np.int64)
        return tasks
    op = tasks.column("op").to_numpy()
    keep = in_window(tasks.column("start_ns").to_numpy(), low, high)
    matched = op != NO_ID
    keep[matched] = np.isin(op[matched], comm_rows)
    table_rows["comm_tasks"] = np.flatnonzero(keep).astype(np.int64)
    tasks = tasks.filter(pa.array(keep))
    local_op = local_rows(tasks.column("op").to_numpy(), comm_rows.astype(np.int64))
    local_slice = local_rows(tasks.column("slice").to_numpy(), rows)
    tasks = tasks.set_column(
        tasks.schema.get_field_index("op"), tasks.schema.field("op"), pa.array(local_op, pa.int64())
    )
    return tasks.set_column(
        tasks.schema.get_field_index("slice"), tasks.schema.field("slice"), pa.array(local_slice, pa.int64())
    )
