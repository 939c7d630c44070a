"""What the chunked analysis carries from chunk to chunk on one clock (:class:`Timeline`: the
per-step tables, the overlap intervals, the allocations per step) and for the rank rules
(:class:`Advice`: operators per step, each thread's outermost operators).

Split from ``chunked_analysis.py``, which drives them; every number still comes from the
analysis modules' own functions.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from perfsight import columns, pipeline
from perfsight.advisor.rank_rules import allocation_steps
from perfsight.advisor.rank_rules.view import OP_STEP_AGGREGATES, OP_STEP_KEYS, op_steps
from perfsight.analysis import clock, overlap
from perfsight.chunked_spills import GroupedSpill, concat, merged_partials, set_column
from perfsight.model import Trace

CLOCKED = ("step_trace", "overlap_breakdown", "device_idle")
"""Per-step tables each chunk computes for its own steps on its whole trace's clock (:class:`Timeline`)."""


class Timeline:
    """The clock-dependent tables (:data:`CLOCKED`, overlap_intervals) of the chunks judged on one
    clock, and where their step windows end.  Until a chunk with device work is seen, the chunks
    are judged on both clocks (the host clock's results are dropped once one is)."""

    def __init__(self, folder: Path, clock_name: str) -> None:
        self.clock = clock_name
        self.parts: dict[str, list[pa.Table]] = {name: [] for name in CLOCKED}
        self.intervals = GroupedSpill(folder, f"overlap_intervals.{clock_name}")
        self.held: dict[int, pa.Table] = {}  # per lane, the last interval (may touch the next chunk's)
        self.reach: int | None = None
        self.carried: clock.Activity | None = None
        self.step_starts = np.zeros(0, np.int64)
        self.step_numbers = np.zeros(0, np.int64)
        self.allocated: dict[int | None, pa.Table] = {}  # per candidate main thread (None: no operators)

    def add(self, trace: Trace, options: pipeline.Options) -> Trace:
        """Analyse one chunk on this clock; returns the chunk as judged (its index is kept)."""
        extra = {**trace.meta.extra, clock.CLOCK_KEY: self.clock}
        if self.reach is not None:
            extra[clock.REACH_KEY] = self.reach
        if self.carried is not None:
            extra[clock.CARRIED_KEY] = self.carried
        judged = dataclasses.replace(trace, meta=dataclasses.replace(trace.meta, extra=extra))
        done: dict[str, pa.Table] = {}
        for name in CLOCKED:  # in ANALYSES order: device_idle reads the chunk's step_trace
            done[name] = pipeline.ANALYSES[name](judged, options, done)
            self.parts[name].append(done[name])
        self._intervals(overlap.overlap_intervals(judged))
        steps = self.parts["step_trace"][-1]
        self.step_starts = np.concatenate([self.step_starts, columns.int64(steps.column("start_ns"))])
        self.step_numbers = np.concatenate([self.step_numbers, columns.int64(steps.column("step"))])
        windows = clock.step_windows(judged)
        if windows.num_rows:
            self.reach = int(pc.max(windows.column("end_ns")).as_py())
        if self.reach is not None:  # what runs on past the windows counts in the next chunk's
            self.carried = clock.after(clock.activity(judged, self.clock), self.reach)  # type: ignore[arg-type]
        return judged

    def add_allocations(self, names: dict[int | None, np.ndarray], made: pa.Table) -> None:
        """Bytes the chunk allocated per (step on this clock, operator), for each candidate main thread
        (``names``: the operator charged per allocation, by thread; see ``allocation_steps``)."""
        at = columns.int64(made.column("alloc_ns"))
        steps = allocation_steps.step_of(self.step_starts, self.step_numbers, at)
        size = columns.int64(made.column("size_bytes"))
        for thread in names:  # a new thread had no operators before: charged as with none
            if thread is not None and thread not in self.allocated and None in self.allocated:
                self.allocated[thread] = self.allocated[None]
        for thread, charged in names.items():  # a loop over threads
            part = allocation_steps.allocation_bytes(steps, charged, size)
            self.allocated[thread] = merged_partials(
                self.allocated.get(thread), part, allocation_steps.KEYS, allocation_steps.AGGREGATES
            )

    def allocation_steps(self, main: int | None) -> pa.Table | None:
        """The rules' allocation extract for the main thread (None: the rank has no operators);
        None without allocations."""
        return self.allocated.get(main, self.allocated.get(None))  # main: no operators while allocating

    def _intervals(self, table: pa.Table) -> None:
        """Spill each lane's intervals but its last, which waits for the next chunk's first one."""
        if self.intervals.schema is None:
            self.intervals.schema = table.schema
        for code, lane in enumerate(overlap.LANES):
            rows = table.filter(pc.equal(table.column("lane"), lane))
            if rows.num_rows == 0:
                continue
            held = self.held.pop(code, None)
            if held is not None:
                first_start = rows.column("start_ns")[0].as_py()
                held_end = held.column("end_ns")[0].as_py()
                if first_start <= held_end:  # touching or overlapping: one merged interval (iv.union)
                    end = max(held_end, rows.column("end_ns")[0].as_py())
                    joined = set_column(held, "end_ns", np.array([end], np.int64))
                    rows = pa.concat_tables([joined, rows.slice(1)])
                else:
                    self._spill(code, held)
            self._spill(code, rows.slice(0, rows.num_rows - 1))
            self.held[code] = rows.slice(rows.num_rows - 1)

    def _spill(self, lane: int, rows: pa.Table) -> None:
        self.intervals.add_group(lane, rows, columns.int64(rows.column("start_ns")))

    def finish(self) -> dict[str, pa.Table]:
        """The clocked tables, the held intervals spilled."""
        for code, held in self.held.items():
            self._spill(code, held)
        self.held.clear()
        return {name: concat(parts) for name, parts in self.parts.items()}

    def remove(self) -> None:
        self.intervals.remove()


class Advice:
    """The rank rules' extracts of operator_instances, chunk by chunk (``advisor.rank_rules``):
    calls and times per (name, step), calls per thread, and each thread's outermost operators
    (carried across chunks: an allocation is charged to the one running when it is made)."""

    def __init__(self) -> None:
        self.op_steps: pa.Table | None = None
        self.calls: dict[int, int] = {}
        self.outer: dict[int, allocation_steps.OuterOps] = {}  # per thread, this chunk's and the last before
        self.last: dict[int, allocation_steps.OuterOps] = {}
        self.reach: dict[int, int | None] = {}

    def add_operators(self, instances: pa.Table) -> None:
        self.outer = {thread: last for thread, last in self.last.items()}
        if instances.num_rows == 0:
            return
        self.op_steps = merged_partials(self.op_steps, op_steps(instances), OP_STEP_KEYS, OP_STEP_AGGREGATES)
        thread, start, end, name = allocation_steps.thread_ops(instances)
        threads, counts = np.unique(thread, return_counts=True)
        for t, n in zip(threads.tolist(), counts.tolist(), strict=True):  # a loop over threads
            self.calls[t] = self.calls.get(t, 0) + n
            mine = np.flatnonzero(thread == t)
            outer, self.reach[t] = allocation_steps.outermost_ops(start, end, name, mine, self.reach.get(t))
            before = self.last.get(t, allocation_steps.OuterOps.none())
            self.outer[t] = before.then(outer)
            if len(self.outer[t].start):
                self.last[t] = self.outer[t].last()

    def names(self, made: pa.Table) -> dict[int | None, np.ndarray]:
        """The operator each allocation of ``made`` is charged to, were each known thread the main one."""
        at = columns.int64(made.column("alloc_ns"))
        fallback = allocation_steps.allocating_names(made)
        out: dict[int | None, np.ndarray] = {None: fallback}
        for thread, outer in self.outer.items():
            charged = allocation_steps.names_at(outer, at)
            out[thread] = np.where(charged == "", fallback, charged)
        return out

    def op_steps_table(self) -> pa.Table | None:
        return self.op_steps

    def main_thread(self) -> int | None:
        if not self.calls:
            return None
        threads = np.array(sorted(self.calls), np.int64)
        return allocation_steps.main_thread(threads, np.array([self.calls[t] for t in threads.tolist()]))
