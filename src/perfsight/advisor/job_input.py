"""What the job rules read of a job's cross-rank analysis, as a protocol.

``perfsight.cluster.job.ClusterResult`` provides every attribute below.  It is named here rather
than imported because the advisor sits below the cluster layer (the pipeline and the cluster code
both call it, docs/ARCHITECTURE.md): the advisor reads tables, it does not know who made them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:  # annotations only: a rank's analysis never loads pandas (ingest/lazy_pandas.py)
    import pandas as pd


class JobResult(Protocol):
    """The cluster tables the job rules read (see ``perfsight.cluster.job.ClusterResult``)."""

    job: Any  # discovery.JobAssessment: ranks, world size, hosts
    matched: Any  # matching.Matched: op instances across ranks
    alignment: Any  # alignment.Alignment: clock offsets and residuals per rank
    stage_of: dict[int, int]
    steps: pd.DataFrame
    rank_averages: pd.DataFrame
    stage_steps: pd.DataFrame
    slow_ranks: Any  # slow.SlowRanks
    links: pd.DataFrame  # one row per op instance and link it used (step, src, dst, bytes, transit)
    slow_links: pd.DataFrame
    pipeline: dict[str, Any]
    resources: pd.DataFrame
