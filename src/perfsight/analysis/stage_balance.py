"""Whether counted FLOPs confirm a pipeline stage's timed excess of compute.

Why a module of its own: two layers ask the same question -- the cluster summary's ``imbalanced``
flag (:func:`perfsight.cluster.slow.pipeline_balance`) and the advisor's ``stage_imbalance`` rule --
and must not answer it twice.
"""

from __future__ import annotations

import pandas as pd


def flops_corroborate(per_stage: pd.DataFrame, heavy: int, spread: float) -> bool:
    """Whether the stage with the most compute time also has the most FLOPs, by at least
    ``spread`` (max - min) / max.

    Why: on a busy host a stage's compute time is noisy (a few milliseconds against descheduling),
    while the FLOPs of its partition are counted, not timed.  When both point at the same stage, the
    imbalance is the partition's, whatever one window's timing spread says."""
    flops = per_stage["flops"].astype("float64") if "flops" in per_stage else pd.Series(dtype="float64")
    if flops.empty or not (flops.max() > 0):
        return False
    return int(flops.idxmax()) == heavy and (flops.max() - flops.min()) / flops.max() >= spread
