"""Run the rules, relate the findings, rank them: the one place the advisor's order of work lives.

``advise_rank`` applies the single-rank rules to one rank's analysis tables; ``advise_job`` applies
the job rules to a cluster result and folds in the ranks' own findings (the same rule and culprit
on several ranks becomes one finding that lists them).  Then findings that a stronger one explains
are marked and lowered to "info" -- communication exposed because the others wait for a slow rank
or an overloaded pipeline stage is a symptom, not a cause -- and the rest are sorted, most severe
and largest effect first.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from perfsight.advisor.finding import Finding
from perfsight.advisor.job_input import JobResult
from perfsight.advisor.rules import RULES

if TYPE_CHECKING:
    from perfsight.model import Trace

CAUSES = ("slow_rank", "waited_for", "stage_imbalance", "slow_link", "small_collectives")
"""Rules whose finding explains exposed communication elsewhere in the same run."""
SYMPTOMS = ("exposed_communication", "exposed_communication_job")

MIN_CONFIDENCE = 1 / 3
"""Below this a finding is kept as "info" (``uncertain``): its effect is less than 1.5 times its
measurement error, which is itself two standard errors of the step-to-step noise (or the clock
residual) -- the classic three-sigma rule.  Why: on a busy machine a balanced job's ranks differ by
a few milliseconds from step to step; a warning must stand clear of that noise."""


def advise_rank(tables: dict[str, pa.Table], trace: Trace) -> list[Finding]:
    """Every single-rank rule on one rank's tables, related and sorted."""
    from perfsight.advisor.rank_rules import RANK_RULES, rank_view

    view = rank_view(tables, trace)
    findings = [f for rule in RANK_RULES.values() for f in rule(view)]
    return relate(findings)


def advise_job(result: JobResult, rank_findings: Iterable[dict[str, Any]] = ()) -> list[Finding]:
    """Every job rule on ``result`` plus the ranks' own (JSON) findings above "info", merged."""
    from perfsight.advisor.job_rules import JOB_RULES

    from_ranks = merge_ranks([Finding.from_json(doc) for doc in rank_findings if doc["severity"] != "info"])
    data_ranks = {r for f in from_ranks if f.rule == "data_wait" and f.category == "data" for r in f.ranks}
    findings: list[Finding] = []
    for rule_id, rule in JOB_RULES.items():
        findings += rule(result, data_ranks) if rule_id == "slow_rank" else rule(result)
    slow = {r for f in findings if f.rule == "slow_rank" for r in f.ranks}
    findings = [f for f in findings if not (f.rule == "waited_for" and set(f.ranks) <= slow)]
    # a rank's data finding that the job's slow-rank rule already names adds nothing
    named = {(f.category, r) for f in findings if f.rule == "slow_rank" for r in f.ranks}
    from_ranks = [f for f in from_ranks if not all((f.category, r) in named for r in f.ranks)]
    return relate(explain_by_hosts(findings + from_ranks))


def explain_by_hosts(findings: list[Finding]) -> list[Finding]:
    """Host findings on ranks of an oversubscribed host (more ranks than cores) are that host's
    contention: marked explained by it and lowered to info.  (Not a slow link: a rate-limited link
    between two such ranks is still a link, and far slower than contention makes one.)"""
    crowded = {r for f in findings if f.rule == "oversubscribed_host" for r in f.ranks}
    for f in findings:
        if f.category == "host" and f.rule != "oversubscribed_host" and f.ranks and set(f.ranks) <= crowded:
            f.explained_by, f.severity = "oversubscribed_host", "info"
    return findings


def merge_ranks(findings: list[Finding]) -> list[Finding]:
    """One finding per (rule, category, culprit) over ranks: the largest effect's, listing every rank."""
    merged: dict[tuple[str, str, str], Finding] = {}
    for f in findings:  # a few findings per rank
        key = (f.rule, f.category, f.culprit)
        keep = merged.get(key)
        ranks = sorted(set(f.ranks) | set(keep.ranks if keep else []))
        if keep is None or f.effect_ns > keep.effect_ns:
            keep = f
        keep.ranks = ranks
        merged[key] = keep
    return list(merged.values())


def relate(findings: list[Finding]) -> list[Finding]:
    """Lower uncertain findings and symptoms explained by a cause to info, then sort them."""
    for f in findings:
        if f.severity != "info" and f.confidence < MIN_CONFIDENCE:
            f.severity, f.uncertain = "info", True
    causes = [f for f in findings if f.rule in CAUSES and f.severity != "info"]
    if causes:
        cause = min(causes, key=Finding.sort_key)
        for f in findings:
            if f.rule in SYMPTOMS:
                f.explained_by = cause.rule
                f.severity = "info"
    return sorted(findings, key=Finding.sort_key)


def advisor_doc(findings: list[dict[str, Any]], scope: str) -> dict[str, Any]:
    """What ``advisor.json`` holds: the findings (JSON, most important first) and every rule applied."""
    return {
        "scope": scope,
        "findings": findings,
        "rules": {rid: r.to_json() for rid, r in RULES.items() if r.scope == scope},
    }
