"""What the advisor says: a finding, its evidence, and how sure it is.

A finding is plain data (JSON-able): the rule that raised it, a category (data, compute,
communication, scheduling, memory, host), a severity, a culprit (the rank, op, link, stage or
module to look at), the evidence (each metric's value, the threshold it crossed and the output file
or UI page that shows it), a message key and its parameters (texts live in
``perfsight.advisor.messages``, in English and Chinese), and a confidence.

Confidence accounts for measurement error: ``effect_ns`` is the time per step at stake and
``error_ns`` what the measurement cannot resolve (the clock-alignment residual for anything read
across ranks' clocks; for anything read per step, twice its standard error over steps, estimated
robustly from the median absolute deviation: see :func:`robust_effect`).  A
finding whose effect does not exceed its error is never made (see :func:`confidence`).

This module must not read analysis tables; the rules do.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

CATEGORIES = ("data", "compute", "communication", "scheduling", "memory", "host")
SEVERITIES = ("critical", "warning", "info")
"""Most severe first.  "info" describes the run (what bounds it); warnings and criticals name a
culprit with an anomaly a user can act on."""

CULPRIT_KINDS = ("rank", "op", "link", "stage", "module", "host", "job")


@dataclasses.dataclass
class Evidence:
    """One metric behind a finding: its value, the threshold it was held against, where to see it."""

    metric: str
    value: float | int | str | None
    unit: str = ""  # "ns", "bytes", "share" (0..1), "count", "flops", "B/s" or "" for text
    threshold: float | int | None = None
    source: str = ""  # the output file or UI page that shows the value

    def to_json(self) -> dict[str, Any]:
        return {k: _plain(v) for k, v in dataclasses.asdict(self).items()}


@dataclasses.dataclass
class Finding:
    """One diagnosis (see the module docstring)."""

    rule: str
    category: str
    severity: str
    culprit_kind: str
    culprit: str
    key: str  # message key in perfsight.advisor.messages (title "<key>" and suggestion "<key>.fix")
    params: dict[str, Any]
    evidence: list[Evidence]
    effect_ns: float
    error_ns: float
    confidence: float
    ranks: list[int] = dataclasses.field(default_factory=list)  # where it was seen (empty: the job)
    explained_by: str | None = None  # a stronger finding's rule that accounts for this one
    uncertain: bool = False  # lowered to info: the effect is not clear of the measurement error

    def __post_init__(self) -> None:
        if self.category not in CATEGORIES:
            raise ValueError(f"unknown category {self.category!r}")
        if self.severity not in SEVERITIES:
            raise ValueError(f"unknown severity {self.severity!r}")
        if self.culprit_kind not in CULPRIT_KINDS:
            raise ValueError(f"unknown culprit kind {self.culprit_kind!r}")

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> Finding:
        """The finding :meth:`to_json` wrote (a rank's findings travel to the job as JSON)."""
        return cls(
            rule=doc["rule"],
            category=doc["category"],
            severity=doc["severity"],
            culprit_kind=doc["culprit"]["kind"],
            culprit=doc["culprit"]["name"],
            key=doc["message_key"],
            params=dict(doc["params"]),
            evidence=[Evidence(**e) for e in doc["evidence"]],
            effect_ns=float(doc["effect_ns"]),
            error_ns=float(doc["error_ns"]),
            confidence=float(doc["confidence"]),
            ranks=list(doc.get("ranks", [])),
            explained_by=doc.get("explained_by"),
            uncertain=bool(doc.get("uncertain", False)),
        )

    def sort_key(self) -> tuple[int, float]:
        """Most severe first, then the largest effect the measurement can vouch for."""
        return (SEVERITIES.index(self.severity), -self.effect_ns * self.confidence)

    def to_json(self) -> dict[str, Any]:
        """Plain JSON: the English title and suggestion, and every language's under ``texts``."""
        from perfsight.advisor.messages import LANGUAGES, render

        texts = {
            lang: {
                "title": render(self.key, self.params, lang),
                "suggestion": render(self.key + ".fix", self.params, lang),
            }
            for lang in LANGUAGES
        }
        return {
            "rule": self.rule,
            "category": self.category,
            "severity": self.severity,
            "culprit": {"kind": self.culprit_kind, "name": self.culprit},
            "title": texts["en"]["title"],
            "suggestion": texts["en"]["suggestion"],
            "texts": texts,
            "message_key": self.key,
            "params": {k: _plain(v) for k, v in self.params.items()},
            "evidence": [e.to_json() for e in self.evidence],
            "effect_ns": int(self.effect_ns),
            "error_ns": int(self.error_ns),
            "confidence": round(self.confidence, 3),
            "ranks": list(self.ranks),
            "explained_by": self.explained_by,
            "uncertain": self.uncertain,
        }


def confidence(effect_ns: float, error_ns: float) -> float:
    """How far the effect stands above the measurement error, 0..1 (0: indistinguishable).

    ``1 - error / effect``: an effect twice the error gives 0.5, ten times 0.9.
    """
    if not (effect_ns > 0) or not math.isfinite(effect_ns):
        return 0.0
    return max(0.0, min(1.0, 1.0 - max(error_ns, 0.0) / effect_ns))


def standard_error(values: Sequence[float]) -> float:
    """Twice the standard error of the mean of ``values`` (the step-to-step noise of an average
    over steps); 0 for fewer than two values, whose noise cannot be known."""
    n = len(values)
    if n < 2:
        return 0.0
    mean = sum(values) / n
    var = sum((v - mean) ** 2 for v in values) / (n - 1)
    return 2.0 * math.sqrt(var / n)


def robust_effect(values: Sequence[float]) -> tuple[float, float, bool]:
    """The median of per-step ``values``, its error, and whether every step agrees in sign.

    Why robust: on a shared machine one step of one rank is sometimes descheduled for tens of
    milliseconds; a mean would call that rank slow, the median of the steps does not.  The error is
    twice the standard error estimated from the median absolute deviation (1.4826 * MAD / sqrt(n)),
    never less than a tenth of the plain two standard errors (identical steps are not certainty).
    """
    clean = sorted(v for v in values if math.isfinite(v))
    n = len(clean)
    if n == 0:
        return 0.0, 0.0, False
    mid = n // 2
    median = clean[mid] if n % 2 else (clean[mid - 1] + clean[mid]) / 2
    deviations = sorted(abs(v - median) for v in clean)
    mad = deviations[mid] if n % 2 else (deviations[mid - 1] + deviations[mid]) / 2
    error = max(2.0 * 1.4826 * mad / math.sqrt(n), 0.1 * standard_error(clean)) if n > 1 else 0.0
    consistent = all(v > 0 for v in clean) or all(v < 0 for v in clean)
    return median, error, consistent


def severity_for(share: float, warning: float, critical: float) -> str:
    """Severity of an anomaly from its share of the step (thresholds from the rule's data)."""
    if share >= critical:
        return "critical"
    if share >= warning:
        return "warning"
    return "info"


def _plain(value: Any) -> Any:
    if hasattr(value, "item"):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def pct(share: float) -> float:
    """A 0..1 share as a percentage with one decimal, for message parameters."""
    return round(share * 100, 1)


def ms(ns: float) -> float:
    """ns as ms with three decimals, for message parameters."""
    return round(ns / 1e6, 3)


def bound_finding(
    rule: str, shares: dict[str, float], culprit_kind: str, culprit: str, who: str, source: str
) -> Finding:
    """Seed 003's delimiting as an info finding: which of the compute / scheduling (free) /
    communication shares of the step dominates for ``who`` (a rank or the job)."""
    from perfsight.advisor.messages import BOUND_ZH

    kind = max(shares, key=shares.__getitem__)
    over = " (all ranks)" if culprit_kind == "job" else ""
    return Finding(
        rule=rule,
        category=kind,
        severity="info",
        culprit_kind=culprit_kind,
        culprit=culprit,
        key="bound",
        params={
            "culprit": who,
            "bound": kind,
            "bound_zh": BOUND_ZH[kind],
            "compute_pct": pct(shares["compute"]),
            "free_pct": pct(shares["scheduling"]),
            "comm_pct": pct(shares["communication"]),
        },
        evidence=[Evidence(f"{k} share of step{over}", v, "share", None, source) for k, v in shares.items()],
        effect_ns=0.0,
        error_ns=0.0,
        confidence=1.0,
    )
