"""The advisor's findings of a rank or of a job, read from the ``advisor.json`` its analysis wrote.

Why a module of its own: the findings are decided once, by the advisor (``perfsight.advisor``),
when a rank or a job is analysed -- by ``perfsight analyse`` beside the traces, or by the server's
own analysis in its cache folder -- and written next to the other outputs (a rank's
``PROFILER_OUTPUT/advisor.json``, a job's ``cluster_analysis_output/advisor.json``).  The server
only reads that file, checks its shape against :class:`models.Findings` and counts severities; it
recomputes nothing, so the UI, the CLI summary and ``advisor.json`` always agree.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from perfsight.advisor import ADVISOR_JSON
from perfsight.server import job_pages, models
from perfsight.server.registry import DamagedAnalysis, OpenedRun, ReadyJob
from perfsight.server.runs import CLUSTER_OUTPUT_DIR
from perfsight.server.security import inside

SEVERITIES = tuple(models.Severity.__args__)  # type: ignore[attr-defined]


class NoFindings(LookupError):
    """The analysis wrote no ``advisor.json`` (made by a perfsight from before the advisor)."""


def _read(path: Path, roots: tuple[Path, ...], shown: str) -> list[dict[str, Any]]:
    """The findings of ``path`` (an ``advisor.json``), which must resolve inside ``roots`` (the base
    and cache folders): a link out of them is served as if the file were missing."""
    resolved = inside(path, roots)
    if resolved is None or not resolved.is_file():
        raise NoFindings(
            f"{shown}: not found; this analysis was made without the advisor "
            "(analyse the run again with this perfsight)"
        )
    try:
        doc = json.loads(resolved.read_text(encoding="utf-8"))
        findings = doc["findings"]
        if not isinstance(findings, list):
            raise TypeError("'findings' is not a list")
        return [models.Finding.model_validate(f).model_dump() for f in findings]
    except (ValueError, KeyError, TypeError, ValidationError) as error:
        raise DamagedAnalysis(f"{shown}: {str(error).splitlines()[0]}") from error


def _answer(
    run: str, scope: str, rank: int | None, source: str, findings: list[dict[str, Any]]
) -> dict[str, Any]:
    counts = {s: sum(1 for f in findings if f["severity"] == s) for s in SEVERITIES}
    return {
        "run": run,
        "scope": scope,
        "rank": rank,
        "source": source,
        "counts": counts,
        "findings": findings,
    }


def rank_findings(data: OpenedRun, rank: int | None) -> dict[str, Any]:
    """One rank's findings (:class:`models.Findings`), from its ``PROFILER_OUTPUT/advisor.json``."""
    chosen = data.rank(rank)
    source = f"{chosen.output_dir.name}/{ADVISOR_JSON}"
    found = _read(chosen.output_dir / ADVISOR_JSON, data.run.roots, f"rank {chosen.rank}: {source}")
    return _answer(data.run.id, "rank", chosen.rank, source, found)


def job_findings(data: OpenedRun | ReadyJob) -> dict[str, Any]:
    """The job's findings (:class:`models.Findings`), from ``cluster_analysis_output/advisor.json``
    (the job rules' findings and each rank's own, ranked together by the advisor)."""
    folder = job_pages.cluster_folder(data.root)  # NoClusterAnalysis (404) for a single rank
    source = f"{CLUSTER_OUTPUT_DIR}/{ADVISOR_JSON}"
    return _answer(data.run.id, "job", None, source, _read(folder / ADVISOR_JSON, data.run.roots, source))
