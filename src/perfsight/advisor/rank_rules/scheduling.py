"""The scheduling rule: host-device synchronisations inside the step (``.item()``,
``cudaStreamSynchronize``), each of which stops the host until the device is idle.
"""

from __future__ import annotations

import numpy as np

from perfsight import columns
from perfsight.advisor.finding import (
    Evidence,
    Finding,
    confidence,
    ms,
    robust_effect,
)
from perfsight.advisor.rank_rules.view import RankView, finding_for, op_per_step, slices_of_kind
from perfsight.advisor.rules import RULES, threshold
from perfsight.model import SliceKind

SYNC_OPS = (
    "aten::_local_scalar_dense",  # .item(), bool(tensor), int(tensor)
    "cudaStreamSynchronize",
    "cudaDeviceSynchronize",
    "cudaEventSynchronize",
    "aclrtSynchronizeStream",
)
"""Operators and runtime calls that make the host wait for the device."""


def host_syncs(view: RankView) -> list[Finding]:
    """Host-device synchronisations inside the step (``.item()``, ``cudaStreamSynchronize``)."""
    rule = "host_syncs"
    if not len(view.steps) or view.mean_step_ns <= 0:
        return []
    time_ns, calls = op_per_step(view, SYNC_OPS)
    runtime = slices_of_kind(view.trace, SliceKind.SYNC)
    if runtime.num_rows:
        time_ns = time_ns + view.sum_by_step(
            columns.int64(runtime.column("start_ns")),
            columns.int64(runtime.column("dur_ns")).astype(np.float64),
            columns.int64(runtime.column("step")),
        )
    per_step = float(calls.mean())
    if per_step < threshold(rule, "min_per_step"):
        return []
    effect, error, _ = robust_effect(time_ns.tolist())
    conf = confidence(effect, error)
    if conf <= 0:
        return []
    share = effect / view.mean_step_ns
    severity = "critical" if share >= threshold(rule, "critical_share") else "warning"
    src = RULES[rule].sources[0]
    return [
        finding_for(
            rule,
            view,
            severity=severity,
            culprit_kind="op",
            culprit=".item() / synchronize",
            key="scheduling.host_syncs",
            params={
                "culprit": ", ".join(SYNC_OPS[:1]) + " ...",
                "count": int(round(per_step)),
                "sync_ms": ms(effect),
            },
            evidence=[
                Evidence(
                    "synchronisations per step", per_step, "count", threshold(rule, "min_per_step"), src
                ),
                Evidence("synchronisation time per step", int(effect), "ns", None, src),
            ],
            effect_ns=effect,
            error_ns=error,
            confidence=conf,
        )
    ]
