"""What ``perfsight analyse`` does with a multi-rank job (kept here so commands/analyse.py stays small).

A path is a job when it is a folder or fsspec URL holding more than one rank input.  The per-rank
outputs go to ``rank<N>/`` and the cross-rank ones to ``cluster_analysis_output/`` under the
output folder; the printed summary is the cluster summary (``--json``: ``{"cluster": ..., "ranks":
[...]}`` with each rank's single-device summary).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from perfsight.cluster import discovery


def is_job(location: str) -> bool:
    """True when ``location`` holds the outputs of more than one rank input."""
    if discovery.is_remote(location):
        return True  # a URL is always analysed as a job (one rank is a job of one)
    path = Path(location.removeprefix("file://"))
    return path.is_dir() and len(discovery.list_inputs(path)) > 1


def default_output(location: str) -> Path:
    """Next to a local job (``<job>/perfsight_output``), in the working folder for a URL."""
    if discovery.is_remote(location):
        name = location.rstrip("/").rsplit("/", 1)[-1] or "job"
        return Path.cwd() / f"{name}_perfsight"
    return Path(location.removeprefix("file://")) / "perfsight_output"


def read_whole(location: str) -> list[str]:
    """The job's local inputs a memory limit does not apply to (not Kineto traces, alone or in
    perfsight run folders: vendor folders), read whole whatever the limit; a URL's are judged per rank."""
    from perfsight.ingest import bounded_input

    if discovery.is_remote(location):
        return []
    return [item.trace for item in discovery.list_inputs(location) if not bounded_input(Path(item.trace))]


PER_RANK_CHOICES = {"auto": None, "all": True, "none": False}
"""``--per-rank-outputs``: by default (auto) every rank's outputs up to ``PER_RANK_OUTPUTS_LIMIT``
ranks, none above it."""


def run_job(
    location: str,
    out: str | None,
    options: Any,
    executor: str | None,
    per_rank: str = "auto",
    memory_limit: int | None = None,
) -> dict[str, Any]:
    """Analyse the job, write its outputs, and return ``{"cluster": summary, "ranks": [...]}``;
    ``memory_limit``: bytes each rank's analysis may use (a Kineto rank, alone or in a perfsight
    run folder, that would need more is analysed chunk of steps by chunk, ``cluster/rank_chunks.py``)."""
    from perfsight.cluster.job import analyse_job, write_cluster_outputs
    from perfsight.cluster.summary import cluster_summary

    root = Path(out) if out else default_output(location)
    result = analyse_job(
        location,
        root,
        options=options,
        executor=executor,
        per_rank_outputs=PER_RANK_CHOICES[per_rank],
        memory_limit=memory_limit,
    )
    doc = cluster_summary(result)
    write_cluster_outputs(result, root, doc)
    ranks = [d.summary for _, d in sorted(result.job.ranks.items()) if d.summary is not None]
    return {"cluster": doc, "ranks": ranks}
