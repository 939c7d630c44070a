"""The CSV files of ``cluster_analysis_output/``: unit conversion and column names only.

``cluster_step_trace_time.csv`` follows msprof-analyze's cluster step trace: one row per
(step, rank) with ``Type = rank`` and per (step, stage) with ``Type = stage``, plus rows with
``Step = average`` (the documented warm-up policy applied), times in microseconds; one column of
perfsight's own comes last, ``Free(Waiting for Host)(us)`` (the part of ``Free`` the device waited
for its host to launch work, ``perfsight.analysis.device_idle``), so that a reader of the vendor's
columns by name reads the file unchanged.  The other
files keep the analysis' own units (``_ns``, ``_bytes``) in their column names.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import pandas as pd

from perfsight.units import NS_PER_US

if TYPE_CHECKING:
    from perfsight.cluster.job import ClusterResult

STEP_TRACE_COLUMNS = {
    "duration_ns": "Step Time(us)",
    "iteration_interval_ns": "Iteration Interval(us)",
    "fp_bp_ns": "FP_BP Time(us)",
    "tail_ns": "Iteration Tail(us)",
    "computing_ns": "Computing(us)",
    "communication_not_overlapped_ns": "Communication(Not Overlapped)(us)",
    "overlapped_ns": "Overlapped(us)",
    "communication_ns": "Communication(us)",
    "free_ns": "Free(us)",
    "stage_ns": "Stage(us)",
    "bubble_ns": "Bubble(us)",
    "communication_not_overlapped_exclude_receive_ns": (
        "Communication(Not Overlapped and Exclude Receive)(us)"
    ),
    "receive_not_overlapped_ns": "Receive(Not Overlapped)(us)",
    "preparing_ns": "Preparing(us)",
    "host_wait_ns": "Free(Waiting for Host)(us)",
    "after_launch_ns": "Free(After Launch)(us)",
}
"""Phase column (ns) -> CSV header (us), in file order (see perfsight.cluster.step_trace.PHASES)."""


def step_trace_frame(result: ClusterResult) -> pd.DataFrame:
    """The rows of cluster_step_trace_time.csv (see the module docstring)."""
    phases = list(STEP_TRACE_COLUMNS)
    parts = []
    steps = result.steps
    if not steps.empty:
        parts.append(steps.assign(Type="rank", Index=steps["rank"], Step=steps["step"].astype(str)))
        stage_steps = result.stage_steps
        parts.append(
            stage_steps.assign(Type="stage", Index=stage_steps["stage"], Step=stage_steps["step"].astype(str))
        )
        ranks = result.rank_averages.assign(stage=result.rank_averages["rank"].map(result.stage_of))
        parts.append(ranks.assign(Type="rank", Index=ranks["rank"], Step="average"))
        stages = result.stage_averages
        parts.append(stages.assign(Type="stage", Index=stages["stage"], Step="average"))
    if not parts:
        return pd.DataFrame(columns=["Step", "Type", "Index", "Stage", *STEP_TRACE_COLUMNS.values()])
    frame = pd.concat(parts, ignore_index=True)
    out = pd.DataFrame(
        {"Step": frame["Step"], "Type": frame["Type"], "Index": frame["Index"].astype("int64")}
    )
    out["Stage"] = frame["stage"].astype("int64")
    for column in phases:
        out[STEP_TRACE_COLUMNS[column]] = (frame[column].astype("float64") / NS_PER_US).round(3)
    return out


def write_step_trace(path: Path, result: ClusterResult) -> Path:
    step_trace_frame(result).to_csv(path, index=False)
    return path


def ops_table(result: ClusterResult) -> pd.DataFrame:
    """Every matched op of every rank, with its cross-rank times (ns, aligned clock)."""
    ops = result.matched.ops.drop(columns=["members", "row"], errors="ignore")
    return ops.sort_values(["instance", "rank"], kind="stable")


def write_table(path: Path, frame: pd.DataFrame) -> Path:
    frame.to_csv(path, index=False)
    return path
