"""The data rule: a long iteration gap is data loading (DataLoader ranges cover it) or host work
before the step (seed 004's first single-device step).
"""

from __future__ import annotations

import numpy as np
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
from perfsight.advisor.rank_rules.view import RankView, finding_for, slices_of_kind
from perfsight.advisor.rules import RULES, threshold
from perfsight.model import SliceKind


def data_wait(view: RankView) -> list[Finding]:
    """Iteration gap: data loading (DataLoader ranges cover it) or host work before the step."""
    rule = "data_wait"
    if not len(view.steps) or view.mean_step_ns <= 0:
        return []
    gaps = view.per_step("step_trace", "iteration_interval_ns")
    gap, error, _ = robust_effect(gaps.tolist())
    share = gap / view.mean_step_ns
    if share < threshold(rule, "min_share") or gap < threshold(rule, "min_gap_ns"):
        return []
    conf = confidence(gap, error)
    if conf <= 0:
        return []
    loading = slices_of_kind(view.trace, SliceKind.DATA_LOADING)
    loader_ns = view.sum_by_step(
        columns.int64(loading.column("start_ns")),
        columns.int64(loading.column("dur_ns")).astype(np.float64),
        columns.int64(loading.column("step")),
    )
    cover = float(loader_ns.mean()) / gap if gap else 0.0
    from_loader = cover >= threshold(rule, "loader_cover")
    evidence = [
        Evidence(
            "iteration gap per step",
            int(gap),
            "ns",
            int(threshold(rule, "min_gap_ns")),
            RULES[rule].sources[0],
        ),
        Evidence(
            "iteration gap share of step",
            share,
            "share",
            threshold(rule, "min_share"),
            RULES[rule].sources[0],
        ),
        Evidence("DataLoader ranges / gap", cover, "share", threshold(rule, "loader_cover"), "timeline"),
    ]
    queue = ""
    waits = view.trace.dataloader
    if waits.num_rows and "ready_batches" in waits.column_names:
        waits = waits.filter(pc.equal(waits.column("kind"), "wait"))
        ready = columns.int64(waits.column("ready_batches"), null=-1)
        ready = ready[ready >= 0]
        if len(ready):
            empty = float((ready == 0).mean())
            evidence.append(
                Evidence("loader queue empty at request", empty, "share", 0.5, "data preparation page")
            )
            queue = f"; the loader's queue was empty at {pct(empty)}% of requests"
    params = {"gap_ms": ms(gap), "share_pct": pct(share), "queue": queue, "culprit": ""}
    summary = view.tables.get("data_pipeline_summary")  # the data-preparation judgement, if captured
    stage = (
        summary.column("bottleneck_stage")[0].as_py() if summary is not None and summary.num_rows else None
    )
    if stage:
        evidence.append(Evidence("slowest data-loader stage", stage, "", None, "dataset.csv"))
    if from_loader:
        params["culprit"] = f"DataLoader stage {stage}" if stage else "DataLoader"
        key, category, culprit = "data.loader", "data", params["culprit"]
    else:
        params["culprit"] = f"rank {view.rank}"
        key, category, culprit = "host.before_step", "host", "host code before the forward pass"
    severity = severity_for(share, threshold(rule, "warning"), threshold(rule, "critical"))
    return [
        finding_for(
            rule,
            view,
            category=category,
            severity=severity,
            culprit_kind="module",
            culprit=culprit,
            key=key,
            params=params,
            evidence=evidence,
            effect_ns=gap,
            error_ns=error,
            confidence=conf,
        )
    ]
