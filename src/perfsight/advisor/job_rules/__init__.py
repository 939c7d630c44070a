"""Job rules: small pure functions from a job's cluster result to findings.

They read the cross-rank tables of ``perfsight.cluster.job.ClusterResult`` -- per-rank step phases,
rank averages, slow-rank lateness, slow links, matched op instances with their wait and transit
times, pipeline stages with compute and FLOPs, clock-alignment residuals -- and recompute none of
them.  Measurement error is explicit: per-step differences carry their step-to-step noise, and
anything read across ranks' clocks (lateness at a collective) must exceed the clock-alignment
residual before it is stated.

Must not import the summaries, the server or the commands.

Modules: ``view`` (steps and errors several rules read), then one module per subject: ``ranks``
(slow rank, waited for), ``pipeline``, ``communication``, ``resources`` (memory, delimiting).  This
package only lists them.
"""

from __future__ import annotations

from collections.abc import Callable

from perfsight.advisor.finding import Finding
from perfsight.advisor.job_rules.communication import (
    exposed_communication_job,
    slow_link,
    small_collectives,
    unaligned_collectives,
)
from perfsight.advisor.job_rules.pipeline import stage_imbalance
from perfsight.advisor.job_rules.ranks import slow_rank, waited_for
from perfsight.advisor.job_rules.resources import bound_job, memory_capacity_job, oversubscribed_host

JOB_RULES: dict[str, Callable[..., list[Finding]]] = {
    "slow_rank": slow_rank,
    "waited_for": waited_for,
    "stage_imbalance": stage_imbalance,
    "small_collectives": small_collectives,
    "exposed_communication_job": exposed_communication_job,
    "slow_link": slow_link,
    "unaligned_collectives": unaligned_collectives,
    "memory_capacity_job": memory_capacity_job,
    "oversubscribed_host": oversubscribed_host,
    "bound_job": bound_job,
}
"""Every job rule, by its id in ``perfsight.advisor.rules.RULES``."""

__all__ = [
    "JOB_RULES",
    "bound_job",
    "exposed_communication_job",
    "memory_capacity_job",
    "slow_link",
    "slow_rank",
    "small_collectives",
    "stage_imbalance",
    "unaligned_collectives",
    "waited_for",
]
