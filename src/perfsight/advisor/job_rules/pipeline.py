"""The pipeline rule: stage imbalance from the stages' compute time and counted FLOPs (seed 004's
pipeline step 2).
"""

from __future__ import annotations

import pandas as pd

from perfsight.advisor.finding import (
    SEVERITIES,
    Evidence,
    Finding,
    confidence,
    ms,
    pct,
    robust_effect,
)
from perfsight.advisor.job_input import JobResult
from perfsight.advisor.rules import RULES, threshold
from perfsight.analysis.stage_balance import flops_corroborate


def stage_imbalance(result: JobResult) -> list[Finding]:
    """Pipeline stages with unequal compute: the heaviest is the one the others wait for."""
    rule = "stage_imbalance"
    pipe = result.pipeline
    if pipe.get("stages", 0) < 2:
        return []
    per_stage = pd.DataFrame(pipe["per_stage"]).set_index("stage")
    heavy = int(pipe["slowest_stage"])
    partitioned_unequally = flops_corroborate(per_stage, heavy, threshold(rule, "spread"))
    if pipe.get("spread", 0.0) < threshold(rule, "spread") and not partitioned_unequally:
        return []
    stage_steps = result.stage_steps
    used = stage_steps.loc[stage_steps["averaged"]] if "averaged" in stage_steps else stage_steps
    table = used.pivot_table(index="step", columns="stage", values="computing_ns", aggfunc="first")
    if heavy not in table.columns or table.shape[1] < 2:
        return []
    excess = (table[heavy] - table.drop(columns=heavy).mean(axis=1)).dropna()
    effect, error, _ = robust_effect(excess.tolist())
    conf = confidence(effect, error)
    if partitioned_unequally and effect > 0:
        # counted FLOPs are not noise: the timing only has to agree, step by step
        conf = max(conf, float((excess > 0).mean()))
    if conf <= 0:
        return []
    others = per_stage.drop(index=heavy)
    spread = float(pipe["spread"])
    severity = "critical" if spread >= threshold(rule, "critical_spread") else "warning"
    heavy_flops, other_flops = float(per_stage.loc[heavy, "flops"]), float(others["flops"].mean())
    # the same FLOPs computed slower: that stage's card or host, not the partition
    same_work = (
        heavy_flops > 0 and abs(heavy_flops - other_flops) <= threshold(rule, "same_flops") * other_flops
    )
    if same_work:
        severity = SEVERITIES[SEVERITIES.index(severity) + 1]
    src = RULES[rule].sources
    evidence = [
        Evidence("compute spread (max - min) / max", spread, "share", threshold(rule, "spread"), src[0])
    ]
    for stage, row in per_stage.iterrows():  # one row per stage
        evidence += [
            Evidence(f"stage {stage} compute per step", int(row["compute_ns"]), "ns", None, src[0]),
            Evidence(f"stage {stage} FLOPs", float(row["flops"]), "flops", None, src[1]),
            Evidence(f"stage {stage} bubble share", float(row["bubble_ratio"]), "share", None, src[0]),
        ]
    return [
        Finding(
            rule=rule,
            category="host" if same_work else "compute",
            severity=severity,
            culprit_kind="stage",
            culprit=str(heavy),
            key="stage.slow_same_work" if same_work else "stage.imbalance",
            params={
                "culprit": heavy,
                "compute_ms": ms(per_stage.loc[heavy, "compute_ns"]),
                "other_ms": ms(others["compute_ns"].mean()),
                "spread_pct": pct(spread),
                "flops": f"{per_stage.loc[heavy, 'flops']:.3g}",
                "other_flops": f"{others['flops'].mean():.3g}",
            },
            evidence=evidence,
            effect_ns=effect,
            error_ns=error,
            confidence=conf,
            ranks=sorted(r for r, s in result.stage_of.items() if s == heavy),
        )
    ]
