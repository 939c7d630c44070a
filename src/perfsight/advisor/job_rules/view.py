"""What several job rules read the same way: the averaged steps, the median step, the clock error.
Must not hold a rule.
"""

from __future__ import annotations

import pandas as pd

from perfsight.advisor.job_input import JobResult


def averaged_steps(result: JobResult) -> pd.DataFrame:
    """The rank-steps the cluster step trace averages (all of them when none is)."""
    steps = result.steps
    used = steps.loc[steps["averaged"]] if "averaged" in steps else steps
    return used if not used.empty else steps


def median_step_ns(result: JobResult) -> float:
    """The median over ranks of their average step: the yardstick of every share."""
    avgs = result.rank_averages
    return float(avgs["duration_ns"].median()) if not avgs.empty else 0.0


def max_residual_ns(result: JobResult) -> float:
    """The clock-alignment error: the largest rank residual (0 when unknown)."""
    return float(max(result.alignment.residual_ns.values(), default=0) or 0)
