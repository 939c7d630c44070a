"""The job's totals that its pages show: each step across the ranks, and each rank's communication.

Why here: a number shown to a user is decided once, by the analysis (docs/ANALYSIS_CONTRACT.md,
"Cluster totals").  The time overview (seed 000) draws, per step, the spread of the ranks' step
times with the ranks' mean communication and wait; the Communication page (seed 002) lists per rank
and step the sums of its ops' times.  Both used to be aggregated by the server on each analysis it
read; now :func:`write_cluster_outputs` writes them beside the other cluster outputs and the server
only selects rows.

Inputs are the cluster result's own tables (ns, bytes): the step trace per rank and step
(``ClusterResult.steps``) and every rank's matched ops with their cross-rank times
(``ClusterResult.matched.ops``, ``perfsight.cluster.op_time``).  Vectorised group-bys; no loop over
ops, ranks or steps.  Nothing is written here.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from perfsight.cluster.op_time import TIME_COLUMNS

ALL_STEPS = "all"
"""The ``step`` of :func:`communication_by_rank`'s rows that sum every op of a rank (in a step or not)."""
STEP_SPREAD_COLUMNS = [
    "step", "ranks", "min_ns", "median_ns", "max_ns", "fastest_rank", "slowest_rank",
    "mean_communication_ns", "mean_wait_ns",
]  # fmt: skip
COMMUNICATION_RANK_COLUMNS = ["step", "rank", "host", "ops", *TIME_COLUMNS, "bytes"]


def _rounded(values: pd.Series) -> pd.Series:
    """Whole nanoseconds, halves away from zero (as SQL's ``round``; NumPy's rounds them to even)."""
    x = values.astype("float64").to_numpy()
    return pd.Series(np.sign(x) * np.floor(np.abs(x) + 0.5), index=values.index).astype("int64")


def _op_time(ops: pd.DataFrame, column: str) -> pd.Series:
    """One time column of the ops, in whole ns; 0 where the op has none (unmatched, unsplit)."""
    if column not in ops.columns:
        return pd.Series(0, index=ops.index, dtype="int64")
    return _rounded(pd.to_numeric(ops[column], errors="coerce").fillna(0))


def _op_steps(ops: pd.DataFrame) -> pd.Series:
    """The step of each op as a nullable integer (an op outside every step has none)."""
    if "step" not in ops.columns:
        return pd.Series(pd.NA, index=ops.index, dtype="Int64")
    step = pd.to_numeric(ops["step"], errors="coerce")
    return _rounded(step.fillna(0)).astype("Int64").where(step.notna(), pd.NA)


def step_spread(steps: pd.DataFrame, ops: pd.DataFrame) -> pd.DataFrame:
    """Per step (:data:`STEP_SPREAD_COLUMNS`): how many ranks recorded it; the least, median and
    largest of their step times (``duration_ns``) and which rank was fastest and slowest (ties: the
    lower rank for the fastest, the higher for the slowest, as the job overview's extremes); the
    ranks' communication time (the step trace's ``communication_ns``) and their wait for peers
    (each rank's ops' ``wait_ns`` summed over the step, 0 for a rank with none), each averaged over
    the step's ranks.  Medians and means are whole ns, halves rounded away from zero."""
    if steps.empty:
        return pd.DataFrame({c: pd.Series(dtype="int64") for c in STEP_SPREAD_COLUMNS})
    rows = pd.DataFrame(
        {
            "step": steps["step"].astype("int64").to_numpy(),
            "rank": steps["rank"].astype("int64").to_numpy(),
            "duration_ns": steps["duration_ns"].astype("int64").to_numpy(),
            "communication_ns": steps["communication_ns"].astype("int64").to_numpy(),
        }
    )
    waits = pd.DataFrame({"step": _op_steps(ops), "rank": ops["rank"], "wait_ns": _op_time(ops, "wait_ns")})
    waits = waits.dropna(subset=["step", "rank"]).astype({"step": "int64", "rank": "int64"})
    per_rank = waits.groupby(["step", "rank"], as_index=False)["wait_ns"].sum()
    rows = rows.merge(per_rank, on=["step", "rank"], how="left")
    rows["wait_ns"] = rows["wait_ns"].fillna(0)
    by = rows.groupby("step")
    out = by.agg(
        ranks=("rank", "size"),
        min_ns=("duration_ns", "min"),
        median_ns=("duration_ns", "median"),
        max_ns=("duration_ns", "max"),
        mean_communication_ns=("communication_ns", "mean"),
        mean_wait_ns=("wait_ns", "mean"),
    )
    fastest = rows.sort_values(["duration_ns", "rank"], kind="stable").drop_duplicates("step")
    slowest = rows.sort_values(["duration_ns", "rank"], ascending=False, kind="stable").drop_duplicates(
        "step"
    )
    out["fastest_rank"] = fastest.set_index("step")["rank"]
    out["slowest_rank"] = slowest.set_index("step")["rank"]
    for column in ("median_ns", "mean_communication_ns", "mean_wait_ns"):
        out[column] = _rounded(out[column])
    out = out.reset_index().sort_values("step", kind="stable")
    return out[STEP_SPREAD_COLUMNS].astype("int64").reset_index(drop=True)


def communication_by_rank(ops: pd.DataFrame, resources: pd.DataFrame) -> pd.DataFrame:
    """Per step and rank (:data:`COMMUNICATION_RANK_COLUMNS`), and per rank over every op
    (``step`` = :data:`ALL_STEPS`): how many communication ops it issued, their summed times
    (:data:`perfsight.cluster.op_time.TIME_COLUMNS`, ns) and bytes, with the rank's host.

    Every rank of the job (``resources``, and any rank with an op) has a row in every step that
    has an op, with zeros when it issued none there: a rank that did not communicate is shown, not
    missing.  ``step`` is text: a step number, or ``all``."""
    hosts = pd.DataFrame(
        {"rank": pd.Series(dtype="int64"), "host": pd.Series(dtype="object")}
        if resources.empty
        else {
            "rank": resources["rank"].astype("int64"),
            "host": resources["host"].where(resources["host"].notna() & (resources["host"] != ""), None)
            if "host" in resources.columns
            else None,
        }
    ).drop_duplicates("rank")
    ranked = ops.loc[ops["rank"].notna()] if "rank" in ops.columns else ops.iloc[0:0]
    per_op = pd.DataFrame(
        {
            "rank": ranked["rank"].astype("int64") if not ranked.empty else pd.Series(dtype="int64"),
            "step": _op_steps(ranked),
            "ops": 1,
            **{c: _op_time(ranked, c) for c in TIME_COLUMNS},
            "bytes": pd.to_numeric(ranked["bytes"], errors="coerce").astype("float64")
            if "bytes" in ranked.columns
            else np.nan,
        }
    )
    summed = [*TIME_COLUMNS, "ops", "bytes"]
    in_steps = per_op.dropna(subset=["step"]).groupby(["step", "rank"], as_index=False)[summed].sum()
    in_steps["step"] = in_steps["step"].astype("int64").astype(str)
    overall = per_op.groupby("rank", as_index=False)[summed].sum().assign(step=ALL_STEPS)
    sums = pd.concat([in_steps, overall], ignore_index=True)
    everyone = pd.Index(sorted(set(hosts["rank"]) | set(per_op["rank"])), name="rank", dtype="int64")
    step_names = [*sorted(in_steps["step"].unique(), key=int), ALL_STEPS]
    grid = pd.MultiIndex.from_product([step_names, everyone], names=["step", "rank"]).to_frame(index=False)
    out = grid.merge(sums, on=["step", "rank"], how="left").merge(hosts, on="rank", how="left")
    for column in (*TIME_COLUMNS, "ops"):
        out[column] = out[column].fillna(0).astype("int64")
    out["bytes"] = out["bytes"].fillna(0.0).astype("float64")
    out["host"] = out["host"].astype("object").where(out["host"].notna(), None)
    return out[COMMUNICATION_RANK_COLUMNS]
