"""What every single-rank rule reads: the rank's analysis tables, its trace, and the steps averaged.

``rank_view`` picks the steps (complete ones, a warm-up step dropped as the cluster analysis does);
``RankView`` sums per-step values over them; the small helpers here are shared by the rules of
several categories.  Must not hold a rule.

The rules never read a per-row table (one row per operator call or allocation) row by row: they read
small extracts of it (:func:`op_steps` here, ``memory.allocation_steps``), computed from the whole
table or, on the bounded-memory path (issue 21), merged from the extracts of each chunk of steps
(``perfsight.chunked_analysis``), which passes them in the tables under their keys.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from perfsight import columns
from perfsight.advisor.finding import Finding
from perfsight.advisor.rules import RULES
from perfsight.analysis import grouping
from perfsight.analysis.index import dictionary_mask
from perfsight.analysis.step_trace import MIN_STEPS_TO_DROP_WARMUP
from perfsight.model import SliceKind, Trace


@dataclasses.dataclass
class RankView:
    """What the rules read about one rank: its analysis tables, its trace, and the steps used."""

    tables: dict[str, pa.Table]
    trace: Trace
    steps: np.ndarray  # the step numbers averaged over
    step_ns: np.ndarray  # their durations, in the same order

    @property
    def rank(self) -> int:
        return int(self.trace.meta.rank)

    @property
    def mean_step_ns(self) -> float:
        return float(self.step_ns.mean()) if len(self.step_ns) else 0.0

    @property
    def on_device(self) -> bool:
        """The steps are on a device timeline (perfsight.analysis.timeline), not the host's."""
        st = self.tables.get("step_trace")
        return bool(st is not None and st.num_rows and "device" in st.column("timeline").to_pylist())

    def per_step(self, table: str, column: str) -> np.ndarray:
        """``column`` of ``table`` for the used steps, in step order (0 where a step has no row)."""
        t = self.tables.get(table)
        if t is None or t.num_rows == 0 or column not in t.column_names:
            return np.zeros(len(self.steps))
        steps = columns.int64(t.column("step"))
        values = columns.int64(t.column(column), null=0)
        out = np.zeros(len(self.steps))
        where = np.searchsorted(self.steps, steps)
        ok = (where < len(self.steps)) & (self.steps[np.minimum(where, len(self.steps) - 1)] == steps)
        np.add.at(out, where[ok], values[ok])
        return out

    def sum_by_step(self, starts: np.ndarray, values: np.ndarray, step_of: np.ndarray) -> np.ndarray:
        """Sum ``values`` into the used steps by their step number ``step_of`` (others dropped)."""
        out = np.zeros(len(self.steps))
        where = np.searchsorted(self.steps, step_of)
        ok = (where < len(self.steps)) & (self.steps[np.minimum(where, len(self.steps) - 1)] == step_of)
        np.add.at(out, where[ok], values[ok])
        return out


def rank_view(tables: dict[str, pa.Table], trace: Trace) -> RankView:
    """The used steps of a rank: complete steps of ``step_trace``, minus a warm-up step."""
    st = tables.get("step_trace")
    if st is None or st.num_rows == 0:
        return RankView(tables, trace, np.zeros(0, np.int64), np.zeros(0))
    steps = columns.int64(st.column("step"))
    durations = columns.int64(st.column("duration_ns"), null=0).astype(np.float64)
    complete = np.ones(len(steps), bool)
    if trace.steps.num_rows:
        known = dict(
            zip(
                columns.int64(trace.steps.column("step")).tolist(),
                trace.steps.column("complete").to_pylist(),
                strict=True,
            )
        )  # one entry per step: a loop over steps, not events
        complete = np.array([bool(known.get(int(s), True)) for s in steps])
    order = np.argsort(steps, kind="stable")
    steps, durations, complete = steps[order], durations[order], complete[order]
    if complete.sum() >= MIN_STEPS_TO_DROP_WARMUP:
        first = np.flatnonzero(complete)[0]
        complete[first] = False
    if not complete.any():
        complete[:] = True
    return RankView(tables, trace, steps[complete], durations[complete])


def finding_for(rule: str, view: RankView, **fields) -> Finding:
    """A finding of ``rule`` about this rank (its category from the rule's data unless given)."""
    fields.setdefault("category", RULES[rule].category)
    fields.setdefault("ranks", [view.rank])
    return Finding(rule=rule, **fields)


def slices_of_kind(trace: Trace, kind: SliceKind) -> pa.Table:
    """The slices of one kind (DataLoader ranges, runtime synchronisations); the kind is tested
    once per distinct kind, not decoded for every row."""
    wanted = pa.array([kind.value], pa.string())
    return trace.slices.filter(dictionary_mask(trace.slices.column("kind"), lambda k: pc.is_in(k, wanted)))


OP_STEPS = "advisor_op_steps"
"""Key of the :func:`op_steps` extract of ``operator_instances`` among the tables the rules read."""

OP_STEP_KEYS = ("name", "step")
OP_STEP_AGGREGATES = (("dur_ns", "count"), ("dur_ns", "sum"), ("device_ns", "sum"))
"""What :func:`op_steps` sums per (name, step); parts merge with ``grouping.merge_partials``."""


def op_steps(instances: pa.Table) -> pa.Table:
    """Calls, host time (``dur_ns``) and launched device time (``device_ns``) per (operator name,
    step) of ``instances`` (rows of ``operator_instances``; null times count 0, no step is -1):
    everything :func:`op_per_step` reads of the operator calls."""
    table = pa.table(
        {
            "name": pc.cast(instances.column("name"), pa.string()),
            "step": pa.array(columns.int64(instances.column("step"), null=-1), pa.int64()),
            "dur_ns": pa.array(columns.int64(instances.column("dur_ns"), null=0), pa.int64()),
            "device_ns": pa.array(columns.int64(instances.column("device_ns"), null=0), pa.int64()),
        }
    )
    return grouping.aggregate(table, OP_STEP_KEYS, OP_STEP_AGGREGATES)


def op_per_step(view: RankView, names: tuple[str, ...]) -> tuple[np.ndarray, np.ndarray]:
    """Time and calls per used step of the operators named ``names`` (operator_instances): host
    time on a host-only trace, the device time of the kernels they launched when there is a device."""
    wanted = pa.array(names, pa.string())
    if OP_STEPS in view.tables:  # the chunked path's, merged over the chunks
        steps = view.tables[OP_STEPS]
    else:  # the calls of those operators only (a small part of the table)
        ops = view.tables.get("operator_instances")
        ops = None if ops is None else ops.filter(pc.is_in(pc.cast(ops.column("name"), pa.string()), wanted))
        steps = op_steps(ops) if ops is not None and ops.num_rows else None
    if steps is None or steps.num_rows == 0:
        return np.zeros(len(view.steps)), np.zeros(len(view.steps))
    picked = steps.filter(pc.is_in(steps.column("name"), wanted))
    step_of = columns.int64(picked.column("step"))
    # with a device, the time the ops cost the device (the kernels they launched), as computing_ns is
    column = "device_ns_sum" if view.on_device else "dur_ns_sum"
    dur = columns.int64(picked.column(column)).astype(np.float64)
    calls = columns.int64(picked.column("dur_ns_count")).astype(np.float64)
    return view.sum_by_step(step_of, dur, step_of), view.sum_by_step(step_of, calls, step_of)


OP_SOURCE = RULES["top_operator"].sources[0]
