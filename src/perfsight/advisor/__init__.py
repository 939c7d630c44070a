"""The advisor: the tuning guide's method (seeds 004 and 003) applied to perfsight's analysis tables.

Rules are data (``rules.RULES``: category, thresholds, evidence sources) plus small pure functions
(the ``rank_rules`` package over one rank's tables, the ``job_rules`` package over a cluster result,
one module per category or subject); ``engine`` runs them,
relates symptoms to causes and ranks the findings; ``messages`` holds the English and Chinese texts
by key; ``text`` formats the lines that lead the CLI summaries.  Every finding carries its evidence
(values, thresholds, the file or page that shows them) and a confidence that accounts for the
step-to-step noise and the clock-alignment error.

Layering: the advisor reads the analysis, model and cluster results and never recomputes their
numbers; only the summaries, the output writers, the commands and the server import it.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson

from perfsight.advisor.engine import advise_job, advise_rank, advisor_doc
from perfsight.advisor.finding import Evidence, Finding
from perfsight.advisor.job_input import JobResult

if TYPE_CHECKING:
    import pyarrow as pa

    from perfsight.model import Trace

ADVISOR_JSON = "advisor.json"

__all__ = [
    "ADVISOR_JSON",
    "Evidence",
    "Finding",
    "advise_job",
    "advise_rank",
    "advisor_doc",
    "job_findings",
    "rank_findings",
    "write_advisor_json",
]


def rank_findings(tables: dict[str, pa.Table], trace: Trace) -> list[dict[str, Any]]:
    """One rank's findings as JSON, most important first (what its summary and advisor.json hold)."""
    return [f.to_json() for f in advise_rank(tables, trace)]


def job_findings(result: JobResult) -> list[dict[str, Any]]:
    """A job's findings as JSON: the job rules plus each fully analysed rank's own findings."""
    ranks = [doc for d in result.job.ranks.values() if d.summary for doc in d.summary.get("findings", [])]
    return [f.to_json() for f in advise_job(result, ranks)]


def write_advisor_json(path: Path, findings: list[dict[str, Any]], scope: str) -> Path:
    """Write ``advisor.json``: the findings (JSON, most important first) and the rules of ``scope``
    ("rank" or "job") with their thresholds."""
    doc = advisor_doc(findings, scope)
    path.write_bytes(orjson.dumps(doc, option=orjson.OPT_INDENT_2 | orjson.OPT_NON_STR_KEYS))
    return path
