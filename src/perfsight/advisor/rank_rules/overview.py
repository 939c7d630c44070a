"""Informative rank rules: exposed communication (the job rules name its cause) and seed 003's
delimiting (compute-, scheduling- or communication-bound).
"""

from __future__ import annotations

from perfsight.advisor.finding import (
    Evidence,
    Finding,
    bound_finding,
    confidence,
    ms,
    pct,
    robust_effect,
)
from perfsight.advisor.rank_rules.view import RankView, finding_for
from perfsight.advisor.rules import RULES, threshold


def _shares(view: RankView) -> dict[str, float]:
    total = float(view.per_step("overlap_breakdown", "step_ns").sum())
    if total <= 0:
        return {}
    return {
        name: float(view.per_step("overlap_breakdown", column).sum()) / total
        for name, column in (
            ("compute", "computing_ns"),
            ("scheduling", "free_ns"),
            ("communication", "communication_not_overlapped_ns"),
        )
    }


def exposed_communication(view: RankView) -> list[Finding]:
    """Communication left exposed (informative: the job's rules name the cause)."""
    rule = "exposed_communication"
    comm = view.per_step("overlap_breakdown", "communication_not_overlapped_ns")
    if not len(view.steps) or view.mean_step_ns <= 0:
        return []
    effect, error, _ = robust_effect(comm.tolist())
    share = effect / view.mean_step_ns
    if share < threshold(rule, "min_share") or confidence(effect, error) <= 0:
        return []
    return [
        finding_for(
            rule,
            view,
            severity="info",
            culprit_kind="rank",
            culprit=str(view.rank),
            key="communication.exposed",
            params={"comm_ms": ms(effect), "share_pct": pct(share)},
            evidence=[
                Evidence(
                    "communication not overlapped per step", int(effect), "ns", None, RULES[rule].sources[0]
                ),
                Evidence(
                    "share of step", share, "share", threshold(rule, "min_share"), RULES[rule].sources[0]
                ),
            ],
            effect_ns=effect,
            error_ns=error,
            confidence=confidence(effect, error),
        )
    ]


def bound(view: RankView) -> list[Finding]:
    """Seed 003's delimiting for this rank (informative)."""
    shares = _shares(view)
    if not shares:
        return []
    finding = bound_finding(
        "bound", shares, "rank", str(view.rank), f"rank {view.rank}", RULES["bound"].sources[0]
    )
    finding.ranks = [view.rank]
    return [finding]
