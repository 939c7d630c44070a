"""The top findings as the lines that lead the CLI summaries (single rank and job)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

TOP = 3


def lead_lines(
    findings: list[dict[str, Any]], top: int = TOP, ranks_text: Callable[[list[int]], str] | None = None
) -> list[str]:
    """Up to ``top`` findings: severity, category and culprit, the title, the suggestion, the evidence
    file; a run with nothing above "info" says so and shows its first informative finding.

    ``ranks_text`` (a job's summary): how a list of ranks reads; each finding then names the ranks
    it was seen on, since a rank's finding folded into the job's gives its worst rank's numbers."""
    if not findings:
        return ["findings: none"]
    actionable = [f for f in findings if f["severity"] != "info"]
    lines = [
        f"top findings ({len(actionable)} above info, of {len(findings)}):"
        if actionable
        else f"findings: none above info ({len(findings)} informative)"
    ]
    for f in (actionable or findings[:1])[:top]:
        culprit = f["culprit"]
        ranks = f.get("ranks") or []
        seen = ""
        if ranks_text is not None and ranks and not (culprit["kind"] == "rank" and len(ranks) == 1):
            seen = f" [seen on rank{'s' if len(ranks) > 1 else ''} {ranks_text(ranks)}]"
        lines.append(
            f"  [{f['severity'].upper()}] {f['category']} / {_culprit(culprit)}{seen}: {f['title']}"
            f" (confidence {f['confidence']:.2f})"
        )
        lines.append(f"      -> {f['suggestion']}")
        sources = sorted({e["source"] for e in f["evidence"] if e.get("source")})
        if sources:
            lines.append(f"      see: {', '.join(sources[:3])}")
    return lines


def _culprit(culprit: dict[str, str]) -> str:
    """``rank 3``, ``op aten::mm``; the whole job reads ``job``, not ``job job``."""
    return culprit["kind"] if culprit["name"] == culprit["kind"] else f"{culprit['kind']} {culprit['name']}"
