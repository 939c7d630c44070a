"""Bytes allocated per step and operator: everything the memory-churn rule reads of the allocations.

The rule (``memory.memory_churn``) charges each allocation to the outermost operator running on
the main thread when it was made (the op a user wrote: ``torch.cat``, not its ``aten::empty``),
else to the operator that made it, and each allocation to the step whose window holds it.  What
it reads is the sum of bytes per (step, operator): :func:`allocation_steps` computes it from the
whole tables; the bounded-memory path (issue 21, ``perfsight.chunked_analysis``) computes the
same with the parts here, a chunk of steps at a time, carrying each thread's outermost operators
across chunks, and passes it under :data:`ALLOCATION_STEPS`.  Must not hold a rule.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from perfsight import columns
from perfsight.analysis import grouping

ALLOCATION_STEPS = "advisor_allocation_steps"
"""Key of the extract among the tables the rules read: ``step``, ``name``, ``bytes_sum``."""

KEYS = ("step", "name")
AGGREGATES = (("bytes", "sum"),)
"""What :func:`allocation_bytes` sums per (step, name); parts merge with ``grouping.merge_partials``."""


@dataclasses.dataclass(frozen=True)
class OuterOps:
    """The outermost operators of one thread, by start: an instant inside ``[start, end)`` is theirs."""

    start: np.ndarray
    end: np.ndarray
    name: np.ndarray

    @classmethod
    def none(cls) -> OuterOps:
        return cls(np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, dtype=str))

    def then(self, later: OuterOps) -> OuterOps:
        """These operators followed by ``later`` ones (all of which start after these)."""
        return OuterOps(
            np.concatenate([self.start, later.start]),
            np.concatenate([self.end, later.end]),
            np.concatenate([self.name, later.name]),
        )

    def last(self) -> OuterOps:
        return OuterOps(self.start[-1:], self.end[-1:], self.name[-1:])


def thread_ops(instances: pa.Table) -> tuple[np.ndarray, np.ndarray, np.ndarray, pa.Array]:
    """(thread, start, end, name) of each operator call of ``instances`` (operator_instances rows).

    The names stay Arrow text: only the outermost operators' become NumPy text
    (:func:`outermost_ops`).  Turning every call's name into fixed-width NumPy text and sorting
    it with the calls took 0.6 s of a 1 GB trace's analysis and 8 s of a 10 GB one's."""
    thread = columns.int64(instances.column("thread"))
    start = columns.int64(instances.column("start_ns"))
    end = start + columns.int64(instances.column("dur_ns"), null=0)
    return thread, start, end, columns.one_array(instances.column("name"))


def main_thread(threads: np.ndarray, counts: np.ndarray) -> int:
    """The thread with the most operator calls (the lowest id among equals): ``threads`` ascending."""
    return int(threads[int(np.argmax(counts))])


def outermost_ops(
    start: np.ndarray, end: np.ndarray, name: pa.Array, rows: np.ndarray, reach_before: int | None = None
) -> tuple[OuterOps, int | None]:
    """The operators ``rows`` of ``start``/``end``/``name`` not inside an earlier one (by start;
    the longer first among equal starts), and the latest end of them all; ``reach_before``: the
    latest end of the thread's earlier operators."""
    if not len(rows):
        return OuterOps.none(), reach_before
    start, end = start[rows], end[rows]
    order = np.lexsort((-end, start))  # by start; the longer first among equal starts
    start, end = start[order], end[order]
    reach = np.maximum.accumulate(end)
    if reach_before is not None:
        reach = np.maximum(reach, reach_before)
    first = reach_before is None or bool(start[0] >= reach_before)
    outer = np.concatenate([[first], start[1:] >= reach[:-1]])  # not inside an earlier op
    names = pc.cast(name.take(pa.array(rows[order[outer]])), pa.string()).to_numpy(zero_copy_only=False)
    return OuterOps(start[outer], end[outer], names.astype(str)), int(reach[-1])


def names_at(ops: OuterOps, at_ns: np.ndarray) -> np.ndarray:
    """The name of the operator of ``ops`` running at each instant, "" where none is."""
    out = np.full(len(at_ns), "", dtype=object)
    if len(ops.start) and len(at_ns):
        which = np.searchsorted(ops.start, at_ns, side="right") - 1
        inside = (which >= 0) & (at_ns < ops.end[np.maximum(which, 0)])
        out[inside] = ops.name[which[inside]]
    return out.astype(str)


def allocating_names(allocations: pa.Table) -> np.ndarray:
    """The operator that made each allocation (``operator_memory.name``; "None" when unknown)."""
    return pc.cast(allocations.column("name"), pa.string()).to_numpy(zero_copy_only=False).astype(str)


def step_of(step_starts: np.ndarray, step_numbers: np.ndarray, at_ns: np.ndarray) -> np.ndarray:
    """The step whose window (from its ``step_trace`` start) holds each instant; -1 before all."""
    order = np.argsort(step_starts)
    which = np.searchsorted(step_starts[order], at_ns, side="right") - 1
    return np.where(which >= 0, step_numbers[order][np.maximum(which, 0)], -1)


def allocation_bytes(steps: np.ndarray, names: np.ndarray, size: np.ndarray) -> pa.Table:
    """Bytes allocated per (step, operator name)."""
    table = pa.table(
        {
            "step": pa.array(steps, pa.int64()),
            "name": pa.array(names, pa.string()),
            "bytes": pa.array(size, pa.int64()),
        }
    )
    return grouping.aggregate(table, KEYS, AGGREGATES)


def allocation_steps(allocations: pa.Table, instances: pa.Table | None, step_trace: pa.Table) -> pa.Table:
    """The extract from the whole tables (``operator_memory``, ``operator_instances``, ``step_trace``)."""
    at = columns.int64(allocations.column("alloc_ns"))
    names = np.full(len(at), "", dtype=str)
    if instances is not None and instances.num_rows and len(at):
        thread, start, end, name = thread_ops(instances)
        threads, counts = np.unique(thread, return_counts=True)
        on_main = thread == main_thread(threads, counts)
        outer, _ = outermost_ops(start, end, name, np.flatnonzero(on_main))
        names = names_at(outer, at)
    names = np.where(names == "", allocating_names(allocations), names)
    steps = step_of(
        columns.int64(step_trace.column("start_ns")), columns.int64(step_trace.column("step")), at
    )
    return allocation_bytes(steps, names, columns.int64(allocations.column("size_bytes"), null=0))
