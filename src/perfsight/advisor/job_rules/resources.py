"""Resource rules of a job: a rank near its device's memory capacity, and seed 003's delimiting over
the ranks (compute-, scheduling- or communication-bound).
"""

from __future__ import annotations

from perfsight.advisor.finding import (
    Evidence,
    Finding,
    bound_finding,
    pct,
)
from perfsight.advisor.job_input import JobResult
from perfsight.advisor.rules import RULES, threshold


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
