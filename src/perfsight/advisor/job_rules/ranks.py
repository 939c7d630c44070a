"""Rank rules of a job: the slow card (a rank whose gap, computing or free time stands out in its
stage in every step) and the rank the others wait for at collectives.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pandas as pd

from perfsight.advisor.finding import (
    SEVERITIES,
    Evidence,
    Finding,
    confidence,
    ms,
    pct,
    robust_effect,
    severity_for,
)
from perfsight.advisor.job_input import JobResult
from perfsight.advisor.job_rules.view import averaged_steps, max_residual_ns, median_step_ns
from perfsight.advisor.messages import AFTER_LAUNCH_FIX, HOST_WAIT_FIX, PHASE_FIXES, PHASES
from perfsight.advisor.rules import RULES, threshold

PHASE_CATEGORY = {"iteration_interval_ns": "data", "computing_ns": "compute", "free_ns": "host"}
FREE_PARTS = {
    "host_wait_ns": "of which the device waiting for its host to launch work, per step",
    "after_launch_ns": "of which the device idle after its work was launched, per step",
}
"""The parts of a slow card's free time that name a cause (device_idle's), with their evidence text."""


def slow_rank(result: JobResult, data_ranks: set[int] | None = None) -> list[Finding]:
    """The slow card: a rank whose gap, computing or free time stands out in its stage.

    ``data_ranks``: ranks whose own analysis found their gap to be data loading (else a gap that
    stands out is host work).  Per step, each rank's phase is compared with the median of the
    other ranks of its stage at that step; the rank must exceed them in every step, and the
    median excess must beat ``min_share`` of the median step and its robust error
    (:func:`perfsight.advisor.finding.robust_effect`).
    """
    rule = "slow_rank"
    used = averaged_steps(result)
    step_ns = median_step_ns(result)
    if used.empty or step_ns <= 0 or used["rank"].nunique() < 2:
        return []
    best: tuple[float, float, int, str] | None = None  # effect, error, rank, phase
    for phase in PHASE_CATEGORY:  # three phases; everything inside is vectorised over ranks and steps
        for ranks, excess in _excess_by_stage(used, phase):
            for i, candidate in enumerate(ranks):  # a rank of the stage: a handful
                effect, error, consistent = robust_effect(excess[:, i].tolist())
                if consistent and (best is None or effect - error > best[0] - best[1]):
                    best = (effect, error, candidate, phase)
    if best is None:
        return []
    effect, error, rank, phase = best
    share = effect / step_ns
    conf = confidence(effect, error)
    if share < threshold(rule, "min_share") or conf <= 0:
        return []
    category = PHASE_CATEGORY[phase]
    if category == "data" and data_ranks is not None and rank not in data_ranks:
        category = "host"
    severity = severity_for(share, threshold(rule, "warning"), threshold(rule, "critical"))
    flops_rank, flops_others = _flops(result, rank)
    same_work = (
        category == "compute"
        and flops_rank > 0
        and abs(flops_rank - flops_others) <= threshold(rule, "same_flops") * flops_others
    )
    if same_work:  # the same FLOPs, done slower: the card or its host, not the program
        category = "host"
        severity = SEVERITIES[min(SEVERITIES.index(severity) + 1, len(SEVERITIES) - 1)]
    excess = {c: _free_part_excess_ns(used, rank, c) if phase == "free_ns" else 0.0 for c in FREE_PARTS}
    host_wait, after_launch = excess["host_wait_ns"], excess["after_launch_ns"]
    part_ns = threshold(rule, "host_wait_part") * effect  # what a part must reach to be the cause
    launching_slower = host_wait >= part_ns
    starting_later = not launching_slower and after_launch >= part_ns
    residual = max_residual_ns(result)
    table = result.slow_ranks.table.set_index("rank")
    lateness = float(table["lateness_ns"].get(rank, np.nan)) if "lateness_ns" in table else np.nan
    centre = float(table["lateness_ns"].median()) if "lateness_ns" in table else np.nan
    late, late_zh = "", ""
    evidence = [
        Evidence(
            f"{PHASES[phase][0]} excess over the other ranks' median, per step",
            int(effect),
            "ns",
            int(threshold(rule, "min_share") * step_ns),
            RULES[rule].sources[0],
        ),
        Evidence(
            "step-to-step noise of that excess (2 standard errors)",
            int(error),
            "ns",
            None,
            RULES[rule].sources[0],
        ),
    ]
    evidence += [
        Evidence(FREE_PARTS[column], int(value), "ns", int(part_ns), RULES[rule].sources[0])
        for column, value in excess.items()
        if value > 0
    ]
    if np.isfinite(lateness) and lateness - centre > residual:
        late = f"; it reaches collectives {ms(lateness - centre)} ms after the median rank"
        late_zh = f";到达集合通信比中位数晚 {ms(lateness - centre)} ms"
        evidence.append(
            Evidence(
                "lateness at collectives", int(lateness - centre), "ns", int(residual), RULES[rule].sources[1]
            )
        )
    evidence.append(
        Evidence("clock-alignment residual (largest)", int(residual), "ns", None, RULES[rule].sources[2])
    )
    if flops_rank > 0 and flops_others > 0:
        evidence.append(
            Evidence(
                "FLOPs of this rank / the others' median",
                flops_rank / flops_others,
                "",
                1 + threshold(rule, "same_flops"),
                "cluster_analysis_output/cluster_resources.csv",
            )
        )
    fix_en, fix_zh = PHASE_FIXES["same_work" if same_work else category]
    if launching_slower:
        fix_en, fix_zh = (text.format(host_wait_ms=ms(host_wait)) for text in HOST_WAIT_FIX)
    if starting_later:
        fix_en, fix_zh = (text.format(after_launch_ms=ms(after_launch)) for text in AFTER_LAUNCH_FIX)
    return [
        Finding(
            rule=rule,
            category=category,
            severity=severity,
            culprit_kind="rank",
            culprit=str(rank),
            key="rank.slow",
            params={
                "culprit": rank,
                "phase": PHASES[phase][0],
                "phase_zh": PHASES[phase][1],
                "excess_ms": ms(effect),
                "excess_pct": pct(share),
                "late": late,
                "late_zh": late_zh,
                "phase_fix": fix_en,
                "phase_fix_zh": fix_zh,
            },
            evidence=evidence,
            effect_ns=effect,
            error_ns=error,
            confidence=conf,
            ranks=[rank],
        )
    ]


def _excess_by_stage(used: pd.DataFrame, column: str) -> Iterator[tuple[list[int], np.ndarray]]:
    """Per stage of two ranks or more: its ranks, and per step (rows) and rank (columns) how far the
    rank's ``column`` exceeds the median of the stage's other ranks at that step."""
    table = used.pivot_table(index=["stage", "step"], columns="rank", values=column, aggfunc="first")
    for _stage, block in table.groupby(level="stage"):
        block = block.dropna(axis=1, how="all")
        if block.shape[1] < 2:
            continue
        values = block.to_numpy(np.float64)
        yield [int(r) for r in block.columns], values - _median_of_others(values)


def _free_part_excess_ns(used: pd.DataFrame, rank: int, part: str) -> float:
    """How much longer, per step, ``rank``'s device spent in ``part`` of its free time (waiting for
    its host, or idle after the launch) than the other ranks of its stage (the median over steps of
    its excess over their median; 0 when unknown)."""
    if part not in used:
        return 0.0
    for ranks, excess in _excess_by_stage(used, part):
        if rank in ranks:
            effect, _, _ = robust_effect(excess[:, ranks.index(rank)].tolist())
            return max(effect, 0.0)
    return 0.0


def _flops(result: JobResult, rank: int) -> tuple[float, float]:
    """FLOPs of ``rank`` over the averaged steps and the median of the other ranks' (0 if unknown)."""
    res = result.resources
    if res.empty or "flops" not in res:
        return 0.0, 0.0
    flops = res.set_index("rank")["flops"].astype("float64")
    if rank not in flops.index or len(flops) < 2:
        return 0.0, 0.0
    return float(flops.loc[rank]), float(flops.drop(index=rank).median())


def waited_for(result: JobResult) -> list[Finding]:
    """A rank the others wait for at collectives (seed 004: long wait time -> a slow node), by the
    wait the matched ops attribute to their last arrival.  Wait is read across clocks, so its
    error is the clock-alignment residual plus its step-to-step noise."""
    rule = "waited_for"
    ops = result.matched.ops
    step_ns = median_step_ns(result)
    if ops.empty or "wait_ns" not in ops or step_ns <= 0 or ops["rank"].nunique() < 2:
        return []
    used = averaged_steps(result)
    keyed = ops.loc[(ops["instance"] >= 0) & ~ops["is_p2p"] & ops["step"].isin(set(used["step"].tolist()))]
    keyed = keyed.loc[keyed["rank"] != keyed["last_rank"]]
    if keyed.empty:
        return []
    others = max(ops["rank"].nunique() - 1, 1)
    per_step = keyed.groupby(["last_rank", "step"])["wait_ns"].sum().unstack(fill_value=0) / others
    per_step = per_step.reindex(columns=sorted(set(used["step"].tolist())), fill_value=0)
    mean = per_step.median(axis=1)
    rank = int(mean.idxmax())
    effect, noise, _ = robust_effect(per_step.loc[rank].tolist())
    residual = max_residual_ns(result)
    error = noise + residual
    share = effect / step_ns
    conf = confidence(effect, error)
    if share < threshold(rule, "min_share") or conf <= 0:
        return []
    ranks_in_job = int(ops["rank"].nunique())
    instances = int(keyed.loc[keyed["last_rank"] == rank, "instance"].nunique())
    total = int(keyed["instance"].nunique())
    src = RULES[rule].sources
    return [
        Finding(
            rule=rule,
            category="scheduling",
            # with two ranks one is always last: who waits cannot tell a slow rank from the noise
            severity=severity_for(share, threshold(rule, "warning"), threshold(rule, "critical"))
            if ranks_in_job >= threshold(rule, "min_ranks")
            else "info",
            culprit_kind="rank",
            culprit=str(rank),
            key="rank.waited_for",
            params={
                "culprit": rank,
                "wait_ms": ms(effect),
                "share_pct": pct(share),
                "late": instances,
                "total": total,
            },
            evidence=[
                Evidence(
                    "others' wait for this rank per step",
                    int(effect),
                    "ns",
                    int(threshold(rule, "min_share") * step_ns),
                    src[0],
                ),
                Evidence("collectives it arrived last at", instances, "count", None, src[0]),
                Evidence("clock-alignment residual (largest)", int(residual), "ns", None, src[1]),
            ],
            effect_ns=effect,
            error_ns=error,
            confidence=conf,
            ranks=[rank],
        )
    ]


def _median_of_others(values: np.ndarray) -> np.ndarray:
    """Per row, for each column, the median of the row's other columns, NaN skipped (NaN where the
    others have none): ``np.nanmedian`` of the row without that column, for every column at once
    from one sort of the row -- one call per column was quadratic in ranks, 1.5 s at 1,024."""
    rows, n = values.shape
    order = np.argsort(values, axis=1, kind="stable")  # NaN last
    ranked = np.take_along_axis(values, order, axis=1)
    position = np.empty_like(order)
    np.put_along_axis(position, order, np.broadcast_to(np.arange(n), (rows, n)), axis=1)
    own = ~np.isnan(values)
    count = own.sum(axis=1, keepdims=True) - own  # the others' values
    out = np.full(values.shape, np.nan)

    def kth(k: np.ndarray) -> np.ndarray:  # the k-th smallest of the others: skip the column's own slot
        at = np.where(own & (k >= position), k + 1, k)
        return np.take_along_axis(ranked, np.clip(at, 0, n - 1), axis=1)

    has = count > 0
    middle = (kth((count - 1) // 2) + kth(count // 2)) / 2
    out[has] = middle[has]
    return out
