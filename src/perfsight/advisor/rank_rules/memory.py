"""Memory rules: allocator churn (large blocks allocated and freed every step, charged to the
operator that allocates) and a peak close to the device's capacity.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from perfsight import columns
from perfsight.advisor.finding import (
    Evidence,
    Finding,
    confidence,
    pct,
    robust_effect,
    severity_for,
)
from perfsight.advisor.rank_rules.allocation_steps import ALLOCATION_STEPS, allocation_steps, step_of
from perfsight.advisor.rank_rules.view import OP_SOURCE, RankView, finding_for, op_per_step
from perfsight.advisor.rules import RULES, threshold


def memory_churn(view: RankView) -> list[Finding]:
    """Large blocks allocated and freed every step, many times the peak (allocator churn)."""
    rule = "memory_churn"
    peaks = view.tables.get("memory_peaks")
    given = view.tables.get(ALLOCATION_STEPS)  # the chunked path's, merged over the chunks
    mem = view.tables.get("operator_memory")
    allocated_in = None  # (step, bytes) of each allocation, or of each (step, operator) extracted
    if ALLOCATION_STEPS in view.tables:
        if given is not None:
            allocated_in = (columns.int64(given.column("step")), columns.int64(given.column("bytes_sum")))
    elif mem is not None and mem.num_rows:
        allocated_in = (_steps_of(view, mem), columns.int64(mem.column("size_bytes"), null=0))
    if not len(view.steps) or allocated_in is None or peaks is None or peaks.num_rows == 0:
        return []
    peak = float(pc.max(peaks.column("peak_allocated_bytes")).as_py() or 0)
    steps, sizes = allocated_in
    per_step = view.sum_by_step(steps, sizes.astype(np.float64), steps)
    allocated = float(per_step.mean())
    churn = allocated / peak if peak > 0 else 0.0
    if churn < threshold(rule, "min_churn") or allocated < threshold(rule, "min_bytes_per_step"):
        return []
    extract = given if given is not None else _allocation_steps_of(view)
    charged_step = columns.int64(extract.column("step"))
    size = columns.int64(extract.column("bytes_sum")).astype(np.float64)
    names = extract.column("name").to_numpy(zero_copy_only=False).astype(str)
    used = np.isin(charged_step, view.steps)
    uniq, inverse = np.unique(names[used], return_inverse=True)
    by_name = np.bincount(inverse, weights=size[used], minlength=len(uniq))
    culprit = str(uniq[int(np.argmax(by_name))]) if len(uniq) else "?"
    op_time, _ = op_per_step(view, (culprit,))
    effect, error, _ = robust_effect(op_time.tolist())
    conf = confidence(effect, error)
    if conf <= 0:
        return []
    share = effect / view.mean_step_ns if view.mean_step_ns else 0.0
    src = RULES[rule].sources[0]
    return [
        finding_for(
            rule,
            view,
            severity=severity_for(
                max(share, threshold(rule, "warning")),
                threshold(rule, "warning"),
                threshold(rule, "critical"),
            ),
            culprit_kind="op",
            culprit=culprit,
            key="memory.churn",
            params={
                "culprit": culprit,
                "alloc_mb": round(allocated / 2**20, 1),
                "peak_mb": round(peak / 2**20, 1),
                "churn": round(churn, 1),
            },
            evidence=[
                Evidence(
                    "bytes allocated per step",
                    int(allocated),
                    "bytes",
                    int(threshold(rule, "min_bytes_per_step")),
                    src,
                ),
                Evidence("allocated per step / peak", churn, "", threshold(rule, "min_churn"), src),
                Evidence(f"{culprit} time per step", int(effect), "ns", None, OP_SOURCE),
            ],
            effect_ns=effect,
            error_ns=error,
            confidence=conf,
        )
    ]


def _steps_of(view: RankView, mem: pa.Table) -> np.ndarray:
    """The step of each allocation of ``mem`` (the in-memory path)."""
    st = view.tables["step_trace"]
    return step_of(
        columns.int64(st.column("start_ns")),
        columns.int64(st.column("step")),
        columns.int64(mem.column("alloc_ns")),
    )


def _allocation_steps_of(view: RankView) -> pa.Table:
    """The allocation extract from the whole tables (the in-memory path)."""
    mem = view.tables["operator_memory"]
    return allocation_steps(mem, view.tables.get("operator_instances"), view.tables["step_trace"])


def memory_capacity(view: RankView) -> list[Finding]:
    """Peak reserved memory close to the device's capacity (when the trace records it)."""
    rule = "memory_capacity"
    peaks = view.tables.get("memory_peaks")
    capacity = next((d.memory_bytes for d in view.trace.meta.devices if d.memory_bytes), None)
    if peaks is None or peaks.num_rows == 0 or not capacity:
        return []
    peak = float(pc.max(peaks.column("peak_reserved_bytes")).as_py() or 0)
    share = peak / capacity
    if share < threshold(rule, "min_peak_share"):
        return []
    return [
        finding_for(
            rule,
            view,
            severity="critical" if share >= 0.97 else "warning",
            culprit_kind="rank",
            culprit=str(view.rank),
            key="memory.capacity",
            params={
                "culprit": f"rank {view.rank}",
                "peak_mb": round(peak / 2**20, 1),
                "capacity_mb": round(capacity / 2**20, 1),
                "share_pct": pct(share),
            },
            evidence=[
                Evidence(
                    "peak reserved / capacity",
                    share,
                    "share",
                    threshold(rule, "min_peak_share"),
                    RULES[rule].sources[0],
                )
            ],
            effect_ns=0.0,
            error_ns=0.0,
            confidence=1.0,
        )
    ]
