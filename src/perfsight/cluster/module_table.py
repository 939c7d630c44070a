"""The module table: time per ``nn.Module`` per rank, and its spread across the ranks that run it
(anchor: msprof-analyze's ``module_statistic``; issue 18 section 3).

Why in the cluster layer: each rank's ``module_statistic`` (``perfsight.analysis.modules``) says
how long its modules took per step; which ranks run "the same module" and how far apart their
times are is a cross-rank fact.  Two stages of a pipeline both have a ``Sequential.0 (Linear)``
that are different layers, so a module is keyed by its pipeline stage and name.

What it decides, and only here: a module's time on a rank is the mean over the rank's profiled
steps of the module's summed forward time in the step (ns); its spread is ``(max - min) / mean``
over the ranks of its stage, and the slowest rank is named.  Output: ``module_statistic.csv`` (one
row per rank and module) and ``cluster_module_statistic.csv`` (one row per stage and module) in
``cluster_analysis_output/``.  Vectorised group-bys, no loop over rows.
"""

from __future__ import annotations

from collections.abc import Mapping

import pandas as pd

from perfsight.cluster.rank import RankDigest, concat

TABLE = "module_statistic"
RANK_FILE = "module_statistic.csv"
CLUSTER_FILE = "cluster_module_statistic.csv"
RANK_COLUMNS = ["stage", "rank", "module", "parent", "depth", "steps", "calls_per_step", "time_ns"]
CLUSTER_COLUMNS = [
    "stage", "module", "parent", "depth", "ranks", "mean_ns", "min_ns", "max_ns", "slowest_rank",
    "spread",
]  # fmt: skip


def rank_modules(digests: Mapping[int, RankDigest], stage_of: Mapping[int, int]) -> pd.DataFrame:
    """One row per rank and module: its mean time per profiled step (:data:`RANK_COLUMNS`)."""
    with_table = [digests[r] for r in sorted(digests) if TABLE in digests[r].tables]
    table = concat(with_table, TABLE)
    if not table.num_rows:
        return pd.DataFrame({c: pd.Series(dtype="object") for c in RANK_COLUMNS})
    rows = table.to_pandas()
    rows["rank"] = rows["rank"].astype("int64")
    steps = rows.groupby("rank")["step"].nunique().rename("steps")
    out = (
        rows.groupby(["rank", "module", "parent", "depth"], sort=False)
        .agg(calls=("calls", "sum"), total_ns=("total_ns", "sum"))
        .reset_index()
        .merge(steps, left_on="rank", right_index=True)
    )
    out["calls_per_step"] = out["calls"] / out["steps"]
    out["time_ns"] = (out["total_ns"] / out["steps"]).round().astype("int64")
    out["stage"] = out["rank"].map(stage_of).fillna(0).astype("int64")
    return out.sort_values(["stage", "rank", "depth", "module"], kind="stable")[RANK_COLUMNS].reset_index(
        drop=True
    )


def cluster_modules(per_rank: pd.DataFrame) -> pd.DataFrame:
    """One row per stage and module: its time's mean, min and max over the ranks that ran it, the
    slowest rank and the spread ``(max - min) / mean`` (:data:`CLUSTER_COLUMNS`)."""
    if per_rank.empty:
        return pd.DataFrame({c: pd.Series(dtype="object") for c in CLUSTER_COLUMNS})
    keys = ["stage", "module", "parent", "depth"]
    grouped = per_rank.groupby(keys, sort=False)["time_ns"]
    out = grouped.agg(ranks="size", mean_ns="mean", min_ns="min", max_ns="max").reset_index()
    slowest = per_rank.loc[grouped.idxmax().to_numpy(), keys + ["rank"]].rename(
        columns={"rank": "slowest_rank"}
    )
    out = out.merge(slowest, on=keys)
    out["spread"] = ((out["max_ns"] - out["min_ns"]) / out["mean_ns"].where(out["mean_ns"] > 0)).round(4)
    out["mean_ns"] = out["mean_ns"].round().astype("int64")
    return out.sort_values(["stage", "depth", "module"], kind="stable")[CLUSTER_COLUMNS].reset_index(
        drop=True
    )
