"""Communication rules of a job: small collectives (DDP buckets too small to overlap), exposed
communication with its wait/transit split, unaligned sizes, and slow links.
"""

from __future__ import annotations

from perfsight.advisor.finding import (
    Evidence,
    Finding,
    confidence,
    ms,
    pct,
    robust_effect,
    severity_for,
)
from perfsight.advisor.job_input import JobResult
from perfsight.advisor.job_rules.view import averaged_steps, median_step_ns
from perfsight.advisor.rules import RULES, threshold


def _exposed(result: JobResult) -> tuple[float, float, float]:
    """Median exposed communication per step (receives excluded; mean over ranks), its share of the
    step, and its robust error."""
    used = averaged_steps(result)
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
    used_steps = set(averaged_steps(result)["step"].tolist())
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
