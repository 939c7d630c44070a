"""Resource rules of a job: a rank near its device's memory capacity, a host with more ranks than
CPU cores, and seed 003's delimiting over the ranks (compute-, scheduling- or communication-bound).
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


def oversubscribed_host(result: JobResult) -> list[Finding]:
    """Hosts running more ranks than the CPU cores each rank may use (recorded by the collector).

    Why: such ranks take turns on the cores, so one of them is slower in every step for no reason
    in the program; the slow-rank findings on that host are then the machine's (see
    ``engine.advise_job``, which marks them explained by this one)."""
    rule = "oversubscribed_host"
    ranks = getattr(result.job, "ranks", {}) or {}
    by_host: dict[str, list[int]] = {}
    cpus: dict[str, int] = {}
    for rank, digest in ranks.items():  # one entry per rank
        meta = getattr(digest, "meta", None)
        if meta is None or not meta.host:
            continue
        by_host.setdefault(meta.host, []).append(int(rank))
        recorded = (meta.extra or {}).get("host_cpus")
        if isinstance(recorded, int) and recorded > 0:
            cpus[meta.host] = min(cpus.get(meta.host, recorded), recorded)
    findings = []
    for host, members in sorted(by_host.items()):
        cores = cpus.get(host)
        factor = threshold(rule, "ranks_per_core")
        if cores is None or len(members) <= factor * cores:
            continue
        findings.append(
            Finding(
                rule=rule,
                category="host",
                severity="warning",
                culprit_kind="host",
                culprit=host,
                key="host.oversubscribed",
                params={"culprit": f"host {host}", "ranks": len(members), "cpus": cores},
                evidence=[
                    Evidence("ranks on the host", len(members), "count", None, RULES[rule].sources[0]),
                    Evidence("CPU cores a rank may use", cores, "count", None, RULES[rule].sources[0]),
                ],
                effect_ns=0.0,
                error_ns=0.0,
                confidence=1.0,
                ranks=sorted(members),
            )
        )
    return findings
