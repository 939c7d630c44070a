"""Compute rules: redundant dtype conversions, and which operator forward+backward spends its time
in when it dominates the step.
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
    ms,
    pct,
    robust_effect,
    severity_for,
)
from perfsight.advisor.rank_rules.view import OP_SOURCE, RankView, finding_for, op_per_step
from perfsight.advisor.rules import RULES, threshold

CAST_OPS = ("aten::_to_copy",)
"""Every dtype conversion (``.to(dtype)``, ``.float()``, ``.half()``, ``type_as``) runs this op."""


NOT_COMPUTE = r"^(gloo:|nccl:|c10d::|record_param_comms|ProfilerStep|hccl|Optimizer\.|enumerate\(DataLoader)"
"""Operator names that are communication, step markers or data loading, not computation."""


def dtype_casts(view: RankView) -> list[Finding]:
    """Conversions between dtypes that take a noticeable share of the step (seed 004: Cast ops)."""
    rule = "dtype_casts"
    if not len(view.steps) or view.mean_step_ns <= 0:
        return []
    time_ns, calls = op_per_step(view, CAST_OPS)
    if view.on_device and not time_ns.any():
        # the device time of the casts is not linked (no launch ids): their host span cannot be held
        # against device computing time, and a host-to-device copy (also aten::_to_copy) looks alike
        return []
    effect, error, _ = robust_effect(time_ns.tolist())
    computing = float(view.per_step("overlap_breakdown", "computing_ns").mean())
    share = effect / computing if computing > 0 else 0.0  # of the compute time, as the seed reads it
    if share < threshold(rule, "min_share"):
        return []
    conf = confidence(effect, error)
    if conf <= 0:
        return []
    src = RULES[rule].sources[0]
    return [
        finding_for(
            rule,
            view,
            severity=severity_for(share, threshold(rule, "warning"), threshold(rule, "critical")),
            culprit_kind="op",
            culprit=CAST_OPS[0],
            key="compute.casts",
            params={
                "culprit": CAST_OPS[0],
                "cast_ms": ms(effect),
                "share_pct": pct(share),
                "count": int(round(calls.mean())),
            },
            evidence=[
                Evidence("cast time per step", int(effect), "ns", None, src),
                Evidence("cast share of computing time", share, "share", threshold(rule, "min_share"), src),
                Evidence("cast calls per step", float(calls.mean()), "count", None, src),
            ],
            effect_ns=effect,
            error_ns=error,
            confidence=conf,
        )
    ]


def top_operator(view: RankView) -> list[Finding]:
    """Where forward+backward goes when it dominates the step (informative)."""
    rule = "top_operator"
    stats = view.tables.get("operator_stats")
    if not len(view.steps) or view.mean_step_ns <= 0 or stats is None or stats.num_rows == 0:
        return []
    fp_bp = view.per_step("step_trace", "fp_bp_ns")
    share = float(fp_bp.mean()) / view.mean_step_ns
    if share < threshold(rule, "min_share"):
        return []
    by = "device_total_ns" if (pc.sum(stats.column("device_total_ns")).as_py() or 0) > 0 else "host_self_ns"
    names = pc.cast(stats.column("name"), pa.string())
    compute = pc.invert(pc.match_substring_regex(names, NOT_COMPUTE))
    stats = stats.filter(compute)
    if stats.num_rows == 0:
        return []
    values = columns.int64(stats.column(by), null=0)
    top = int(np.argmax(values))
    name = str(stats.column("name")[top].as_py())
    op_share = float(values[top] / values.sum()) if values.sum() else 0.0
    return [
        finding_for(
            rule,
            view,
            severity="info",
            culprit_kind="op",
            culprit=name,
            key="compute.top_operator",
            params={"culprit": name, "share_pct": pct(share), "op_share_pct": pct(op_share)},
            evidence=[
                Evidence(
                    "forward+backward share of step",
                    share,
                    "share",
                    threshold(rule, "min_share"),
                    RULES["data_wait"].sources[0],
                ),
                Evidence(f"{name} share of operator time ({by})", op_share, "share", None, OP_SOURCE),
            ],
            effect_ns=float(fp_bp.mean()) * op_share,
            error_ns=0.0,
            confidence=1.0,
        )
    ]
