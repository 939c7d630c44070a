"""Job rules: small pure functions from a job's cluster result to findings.

They read the cross-rank tables of ``perfsight.cluster.job.ClusterResult`` -- per-rank step phases,
rank averages, slow-rank lateness, slow links, matched op instances with their wait and transit
times, pipeline stages with compute and FLOPs, clock-alignment residuals -- and recompute none of
them.  Measurement error is explicit: per-step differences carry their step-to-step noise, and
anything read across ranks' clocks (lateness at a collective) must exceed the clock-alignment
residual before it is stated.

Must not import the summaries, the server or the commands.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pandas as pd

from perfsight.advisor.finding import (
    SEVERITIES,
    Evidence,
    Finding,
    bound_finding,
    confidence,
    ms,
    pct,
    robust_effect,
    severity_for,
)
from perfsight.advisor.job_input import JobResult
from perfsight.advisor.messages import PHASE_FIXES, PHASES
from perfsight.advisor.rules import RULES, threshold

PHASE_CATEGORY = {"iteration_interval_ns": "data", "computing_ns": "compute", "free_ns": "host"}


def _used(result: JobResult) -> pd.DataFrame:
    steps = result.steps
    used = steps.loc[steps["averaged"]] if "averaged" in steps else steps
    return used if not used.empty else steps


def median_step_ns(result: JobResult) -> float:
    avgs = result.rank_averages
    return float(avgs["duration_ns"].median()) if not avgs.empty else 0.0


def max_residual_ns(result: JobResult) -> float:
    """The clock-alignment error: the largest rank residual (0 when unknown)."""
    return float(max(result.alignment.residual_ns.values(), default=0) or 0)


def slow_rank(result: JobResult, data_ranks: set[int] | None = None) -> list[Finding]:
    """The slow card: a rank whose gap, computing or free time stands out in its stage.

    ``data_ranks``: ranks whose own analysis found their gap to be data loading (else a gap that
    stands out is host work).  Per step, each rank's phase is compared with the median of the
    other ranks of its stage at that step; the rank must exceed them in every step, and the
    median excess must beat ``min_share`` of the median step and its robust error
    (:func:`perfsight.advisor.finding.robust_effect`).
    """
    rule = "slow_rank"
    used = _used(result)
    step_ns = median_step_ns(result)
    if used.empty or step_ns <= 0 or used["rank"].nunique() < 2:
        return []
    best: tuple[float, int, str, np.ndarray] | None = None
    for phase in PHASE_CATEGORY:  # three phases; everything inside is vectorised over ranks and steps
        table = used.pivot_table(index=["stage", "step"], columns="rank", values=phase, aggfunc="first")
        for _stage, block in table.groupby(level="stage"):
            block = block.dropna(axis=1, how="all")
            if block.shape[1] < 2:
                continue
            values = block.to_numpy(np.float64)
            others = np.stack(
                [np.nanmedian(np.delete(values, i, axis=1), axis=1) for i in range(values.shape[1])], axis=1
            )
            excess = values - others
            for i in range(excess.shape[1]):  # a rank of the stage: a handful
                effect, error, consistent = robust_effect(excess[:, i].tolist())
                if consistent and (best is None or effect - error > best[0] - best[1]):
                    best = (effect, error, int(block.columns[i]), phase)
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


def waited_for(result: JobResult) -> list[Finding]:
    """A rank the others wait for at collectives (seed 004: long wait time -> a slow node), by the
    wait the matched ops attribute to their last arrival.  Wait is read across clocks, so its
    error is the clock-alignment residual plus its step-to-step noise."""
    rule = "waited_for"
    ops = result.matched.ops
    step_ns = median_step_ns(result)
    if ops.empty or "wait_ns" not in ops or step_ns <= 0 or ops["rank"].nunique() < 2:
        return []
    used = _used(result)
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


def _flops(result: JobResult, rank: int) -> tuple[float, float]:
    """FLOPs of ``rank`` over the averaged steps and the median of the other ranks' (0 if unknown)."""
    res = result.resources
    if res.empty or "flops" not in res:
        return 0.0, 0.0
    flops = res.set_index("rank")["flops"].astype("float64")
    if rank not in flops.index or len(flops) < 2:
        return 0.0, 0.0
    return float(flops.loc[rank]), float(flops.drop(index=rank).median())


def _flops_corroborate(per_stage: pd.DataFrame, heavy: int, spread: float) -> bool:
    """Whether the stage with the most compute time also has the most FLOPs, by at least
    ``spread`` (max - min) / max.

    Why: on a busy host a stage's compute time is noisy (a few milliseconds against descheduling),
    while the FLOPs of its partition are counted, not timed.  When both point at the same stage, the
    imbalance is the partition's, whatever one window's timing spread says."""
    flops = per_stage["flops"].astype("float64") if "flops" in per_stage else pd.Series(dtype="float64")
    if flops.empty or not (flops.max() > 0):
        return False
    return int(flops.idxmax()) == heavy and (flops.max() - flops.min()) / flops.max() >= spread


def stage_imbalance(result: JobResult) -> list[Finding]:
    """Pipeline stages with unequal compute: the heaviest is the one the others wait for."""
    rule = "stage_imbalance"
    pipe = result.pipeline
    if pipe.get("stages", 0) < 2:
        return []
    per_stage = pd.DataFrame(pipe["per_stage"]).set_index("stage")
    heavy = int(pipe["slowest_stage"])
    partitioned_unequally = _flops_corroborate(per_stage, heavy, threshold(rule, "spread"))
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


def _exposed(result: JobResult) -> tuple[float, float, float]:
    """Median exposed communication per step (receives excluded; mean over ranks), its share of the
    step, and its robust error."""
    used = _used(result)
    column = "communication_not_overlapped_exclude_receive_ns"
    per_step = used.groupby("step")[column].mean()
    step_ns = median_step_ns(result)
    effect, error, _ = robust_effect(per_step.tolist())
    return effect, (effect / step_ns if step_ns else 0.0), error


def small_collectives(result: JobResult) -> list[Finding]:
    """Many small collectives a step that leave communication exposed: DDP buckets too small."""
    rule = "small_collectives"
    effect, share, error = _exposed(result)
    if share < threshold(rule, "min_share") or confidence(effect, error) <= 0:
        return []
    inst = result.matched.instances
    coll = inst.loc[inst["complete"] & ~inst["is_p2p"]]
    used_steps = set(_used(result)["step"].tolist())
    coll = coll.loc[coll["step"].isin(used_steps)]
    if coll.empty:
        return []
    per_step = float(coll.groupby("step").size().mean())
    median_bytes = float(coll["bytes"].median())
    if per_step < threshold(rule, "min_per_step") or not median_bytes <= threshold(rule, "max_median_bytes"):
        return []
    kind = str(coll["collective"].mode().iloc[0])
    src = RULES[rule].sources
    return [
        Finding(
            rule=rule,
            category="communication",
            severity=severity_for(share, threshold(rule, "warning"), threshold(rule, "critical")),
            culprit_kind="module",
            culprit=f"DDP gradient buckets ({kind})",
            key="communication.small_collectives",
            params={
                "per_step": round(per_step, 1),
                "median_kb": round(median_bytes / 1024, 1),
                "comm_ms": ms(effect),
                "share_pct": pct(share),
            },
            evidence=[
                Evidence("collectives per step", per_step, "count", threshold(rule, "min_per_step"), src[0]),
                Evidence(
                    "median bytes per collective",
                    median_bytes,
                    "bytes",
                    threshold(rule, "max_median_bytes"),
                    src[0],
                ),
                Evidence(
                    "exposed communication share of step",
                    share,
                    "share",
                    threshold(rule, "min_share"),
                    src[1],
                ),
            ],
            effect_ns=effect,
            error_ns=error,
            confidence=confidence(effect, error),
        )
    ]


def exposed_communication_job(result: JobResult) -> list[Finding]:
    """Exposed communication with its wait vs transit split (informative; see the engine)."""
    rule = "exposed_communication_job"
    effect, share, error = _exposed(result)
    if share < threshold(rule, "min_share") or confidence(effect, error) <= 0:
        return []
    ops = result.matched.ops
    wait = float(ops["wait_ns"].sum()) if "wait_ns" in ops else 0.0
    transit = float(ops["transit_ns"].sum()) if "transit_ns" in ops else 0.0
    total = wait + transit
    wait_share = wait / total if total else 0.0
    src = RULES[rule].sources
    return [
        Finding(
            rule=rule,
            category="communication",
            severity="info",
            culprit_kind="job",
            culprit="job",
            key="communication.exposed_job",
            params={
                "comm_ms": ms(effect),
                "share_pct": pct(share),
                "wait_pct": pct(wait_share),
                "transit_pct": pct(1 - wait_share if total else 0.0),
            },
            evidence=[
                Evidence("exposed communication per step", int(effect), "ns", None, src[0]),
                Evidence(
                    "exposed communication share of step",
                    share,
                    "share",
                    threshold(rule, "min_share"),
                    src[0],
                ),
                Evidence(
                    "wait share of communication time",
                    wait_share,
                    "share",
                    threshold(rule, "wait_dominant"),
                    src[1],
                ),
            ],
            effect_ns=effect,
            error_ns=error,
            confidence=confidence(effect, error),
        )
    ]


def unaligned_collectives(result: JobResult) -> list[Finding]:
    """Collectives whose message size is not a multiple of ``alignment`` bytes (msprof-analyze's
    byte-alignment check: HCCL's SDMA and NCCL's copies run slower on unaligned sizes).
    Informative: the cost is not measured here."""
    rule = "unaligned_collectives"
    inst = result.matched.instances
    coll = inst.loc[inst["complete"] & ~inst["is_p2p"] & (inst["bytes"].fillna(0) > 0)]
    if coll.empty:
        return []
    alignment = int(threshold(rule, "alignment"))
    odd = coll.loc[coll["bytes"].astype("int64") % alignment != 0]
    if odd.empty:
        return []
    kinds = ", ".join(sorted(odd["collective"].astype(str).unique()))
    src = RULES[rule].sources[0]
    return [
        Finding(
            rule=rule,
            category="communication",
            severity="info",
            culprit_kind="op",
            culprit=kinds,
            key="communication.unaligned",
            params={
                "count": int(len(odd)),
                "total": int(len(coll)),
                "culprit": kinds,
                "alignment": alignment,
                "example": int(odd["bytes"].iloc[0]),
            },
            evidence=[
                Evidence("collectives with unaligned sizes", int(len(odd)), "count", 0, src),
                Evidence("example size", int(odd["bytes"].iloc[0]), "bytes", alignment, src),
            ],
            effect_ns=0.0,
            error_ns=0.0,
            confidence=1.0,
        )
    ]


def slow_link(result: JobResult) -> list[Finding]:
    """Links the cluster analysis flagged as bandwidth outliers among links of their type and size."""
    links = result.slow_links
    if links.empty or not links["slow"].any():
        return []
    # slow_link.csv sums every matched transfer, warm-up step included: per step of those
    steps = max(int(result.links["step"].nunique()), 1) if not result.links.empty else 1
    out = []
    for row in links.loc[links["slow"]].to_dict("records"):  # the flagged links: a handful
        expected = row["bytes"] / row["median"] * 1e9 if row["median"] else row["transit_ns"]
        effect = max(float(row["transit_ns"] - expected), 0.0) / steps
        drop = 1 - row["bandwidth"] / row["median"] if row["median"] else 0.0
        name = f"{int(row['src'])}->{int(row['dst'])}"
        out.append(
            Finding(
                rule="slow_link",
                category="communication",
                severity="critical" if drop >= 0.5 else "warning",
                culprit_kind="link",
                culprit=name,
                key="link.slow",
                params={
                    "culprit": name,
                    "link_type": row["link_type"],
                    "bandwidth": round(row["bandwidth"] / 1e9, 4),
                    "median": round(row["median"] / 1e9, 4),
                    "drop_pct": pct(drop),
                },
                evidence=[
                    Evidence(
                        "bandwidth",
                        float(row["bandwidth"]),
                        "B/s",
                        float(row["median"]),
                        RULES["slow_link"].sources[0],
                    )
                ],
                effect_ns=effect,
                error_ns=0.0,
                confidence=1.0,
                ranks=[int(row["src"]), int(row["dst"])],
            )
        )
    return out


def memory_capacity_job(result: JobResult) -> list[Finding]:
    """Ranks whose peak allocated memory is close to their device's capacity."""
    rule = "memory_capacity_job"
    res = result.resources
    if res.empty or "peak_share" not in res:
        return []
    near = res.loc[res["peak_share"].astype("Float64").fillna(0) >= threshold(rule, "min_peak_share")]
    return [
        Finding(
            rule=rule,
            category="memory",
            severity="warning",
            culprit_kind="rank",
            culprit=str(int(row["rank"])),
            key="memory.capacity",
            params={
                "culprit": f"rank {int(row['rank'])}",
                "peak_mb": round(row["peak_allocated_bytes"] / 2**20, 1),
                "capacity_mb": round(row["capacity_bytes"] / 2**20, 1),
                "share_pct": pct(row["peak_share"]),
            },
            evidence=[
                Evidence(
                    "peak allocated / capacity",
                    float(row["peak_share"]),
                    "share",
                    threshold(rule, "min_peak_share"),
                    RULES[rule].sources[0],
                )
            ],
            effect_ns=0.0,
            error_ns=0.0,
            confidence=1.0,
            ranks=[int(row["rank"])],
        )
        for row in near.to_dict("records")  # the few ranks near capacity
    ]


def bound_job(result: JobResult) -> list[Finding]:
    """Seed 003's delimiting over the ranks: which share dominates, and how much it varies."""
    avgs = result.rank_averages
    if avgs.empty or not avgs["duration_ns"].sum():
        return []
    total = float(avgs["duration_ns"].sum())
    shares = {
        "compute": float(avgs["computing_ns"].sum()) / total,
        "scheduling": float(avgs["free_ns"].sum()) / total,
        "communication": float(avgs["communication_not_overlapped_ns"].sum()) / total,
    }
    return [bound_finding("bound_job", shares, "job", "job", "the job", RULES["bound_job"].sources[0])]


JOB_RULES: dict[str, Callable[..., list[Finding]]] = {
    "slow_rank": slow_rank,
    "waited_for": waited_for,
    "stage_imbalance": stage_imbalance,
    "small_collectives": small_collectives,
    "exposed_communication_job": exposed_communication_job,
    "slow_link": slow_link,
    "unaligned_collectives": unaligned_collectives,
    "memory_capacity_job": memory_capacity_job,
    "bound_job": bound_job,
}
"""Every job rule, by its id in ``perfsight.advisor.rules.RULES``."""
