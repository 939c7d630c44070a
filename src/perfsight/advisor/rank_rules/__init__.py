"""Single-rank rules: small pure functions from one rank's analysis tables to findings.

Each reads tables the analyses wrote (``step_trace``, ``overlap_breakdown``, ``operator_instances``,
``operator_stats``, ``memory_peaks``, ``operator_memory``, ``device_idle``) and the trace's own ``slices`` /
``dataloader`` / ``meta`` for what no analysis summarises (are DataLoader ranges present, how many
batches were queued); it recomputes no metric an analysis owns.  Per-step values are averaged over
the steps the cluster analysis averages (complete steps, the first dropped when three or more
remain), and their step-to-step noise bounds every finding's confidence.

Must not import the pipeline, the summaries, the server or the commands.

Modules: ``view`` (the rank's used steps and shared helpers), then one module per category:
``data``, ``compute``, ``scheduling``, ``memory``, ``overview`` (informative rules).  This package
only lists them.
"""

from __future__ import annotations

from collections.abc import Callable

from perfsight.advisor.finding import Finding
from perfsight.advisor.rank_rules.compute import CAST_OPS, dtype_casts, top_operator
from perfsight.advisor.rank_rules.data import data_wait
from perfsight.advisor.rank_rules.memory import memory_capacity, memory_churn
from perfsight.advisor.rank_rules.overview import bound, exposed_communication
from perfsight.advisor.rank_rules.scheduling import SYNC_OPS, host_syncs, host_wait
from perfsight.advisor.rank_rules.view import RankView, rank_view

RANK_RULES: dict[str, Callable[[RankView], list[Finding]]] = {
    "data_wait": data_wait,
    "dtype_casts": dtype_casts,
    "host_syncs": host_syncs,
    "host_wait": host_wait,
    "memory_churn": memory_churn,
    "memory_capacity": memory_capacity,
    "exposed_communication": exposed_communication,
    "top_operator": top_operator,
    "bound": bound,
}
"""Every single-rank rule, by its id in ``perfsight.advisor.rules.RULES``."""

__all__ = [
    "CAST_OPS",
    "RANK_RULES",
    "RankView",
    "SYNC_OPS",
    "bound",
    "data_wait",
    "dtype_casts",
    "exposed_communication",
    "host_syncs",
    "host_wait",
    "memory_capacity",
    "memory_churn",
    "rank_view",
    "top_operator",
]
