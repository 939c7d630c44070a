"""Per-op communication time with the cross-rank facts a single rank lacks.

One definition, the rank's own where it can decide (``perfsight.analysis.communication.op_times``,
the numbers of its ``communication.json``): an op whose rank recorded HCCL's per-plane tasks
(Ascend) is split by those tasks (``basis = tasks``), and its cached ``communication_ops`` row is
taken as it is.  A rank without tasks (Kineto/NCCL, gloo) cannot tell how long it waited for its
peers; once instances are matched and aligned, the *last arrival* of each instance (the latest
aligned start among its ranks) is known, and ``op_times`` splits the op's elapse into
wait/synchronization (before the last rank arrived) and transit (after) (``basis = arrivals``).
An op of no complete instance keeps transit = elapse (``basis = elapse``), as a rank alone has it.
This module only prepares the arrivals and calls the analysis.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import pandas as pd
import pyarrow as pa

from perfsight.analysis.communication import op_times
from perfsight.cluster.alignment import Alignment
from perfsight.cluster.matching import Matched
from perfsight.cluster.rank import RankDigest, concat

TIME_COLUMNS = ("elapse_ns", "transit_ns", "wait_ns", "synchronization_ns", "idle_ns")
"""The per-op time columns added to ``matched.ops`` (ns; definitions in docs/OUTPUTS.md)."""


def add_op_times(digests: Mapping[int, RankDigest], matched: Matched, alignment: Alignment) -> None:
    """Add ``last_arrival_ns`` (aligned), ``last_rank``, the :data:`TIME_COLUMNS` and ``basis``
    (``tasks``, ``arrivals`` or ``elapse``: what split the op) to ``matched.ops`` (in place)."""
    ops = matched.ops
    keyed = ops["instance"] >= 0
    arrival = ops.loc[keyed].groupby("instance")["start_ns"]
    last = arrival.transform("max")
    ops["last_arrival_ns"] = last.reindex(ops.index)
    idx_last = ops.loc[keyed].groupby("instance")["start_ns"].idxmax()
    ops["last_rank"] = ops["instance"].map(
        ops.loc[idx_last.to_numpy(), ["instance", "rank"]].set_index("instance")["rank"]
    )
    ordered = sorted(digests)
    # every rank's op rows in one comm table (times stay on each rank's own clock), one call
    starts = np.cumsum([0] + [digests[r].comm.num_rows for r in ordered])
    base = dict(zip(ordered, starts[:-1], strict=True))
    # the op rows as the rank recorded them; a group's member list (thousands of characters per op
    # at 1,024 ranks) is no timing and would be copied by the take below
    comm = concat([digests[r] for r in ordered], "comm").drop_columns(
        ["name", "track", "bytes", "group_ranks"]
    )
    take = (ops["rank"].map(base) + ops["row"]).to_numpy(np.int64)
    offset = ops["rank"].map(alignment.offset_ns).fillna(0).to_numpy(np.int64)
    has = ops["last_arrival_ns"].notna().to_numpy()
    arrivals = pa.table(
        {
            "op": np.flatnonzero(has).astype(np.int64),
            # back on each rank's own clock, where its comm rows are
            "last_arrival_ns": (ops["last_arrival_ns"].to_numpy()[has] + offset[has]).astype(np.int64),
        }
    )
    times = op_times(comm.take(pa.array(take)), None, arrivals).to_pandas()
    for column in TIME_COLUMNS:
        ops[column] = times[column].to_numpy()
    ops["basis"] = times["basis"].to_numpy()
    _use_task_split(digests, ops)


def _use_task_split(digests: Mapping[int, RankDigest], ops: pd.DataFrame) -> None:
    """Where a rank split an op by its own tasks (its ``communication_ops`` row has basis
    ``tasks``), that split replaces the arrival-based one: the numbers of its communication.json."""
    parts = [
        d.tables["communication_ops"]
        for d in digests.values()
        if d.tables.get("communication_ops") is not None
    ]
    if not parts:
        return
    own = pa.concat_tables(parts).select(["rank", "comm_row", "basis", *TIME_COLUMNS]).to_pandas()
    own = own.loc[own["basis"] == "tasks"]
    if own.empty:
        return
    found = ops[["rank", "row"]].merge(
        own.rename(columns={"comm_row": "row"}), on=["rank", "row"], how="left", validate="many_to_one"
    )
    use = (found["basis"] == "tasks").to_numpy()
    for column in (*TIME_COLUMNS, "basis"):
        ops.loc[use, column] = found.loc[use, column].to_numpy()


def instance_times(matched: Matched) -> pd.DataFrame:
    """One row per complete instance: first/last/median arrival, the rank that arrived last, and the
    spread of arrivals (what the others waited)."""
    complete = matched.instances.loc[
        matched.instances["complete"], ["instance", "collective", "group", "step"]
    ]
    ops = matched.ops.loc[matched.ops["instance"].isin(complete["instance"])]
    grouped = ops.groupby("instance")
    out = grouped.agg(
        first_arrival_ns=("start_ns", "min"),
        median_arrival_ns=("start_ns", "median"),
        last_arrival_ns=("start_ns", "max"),
        last_rank=("last_rank", "first"),
        ranks=("rank", "nunique"),
    ).reset_index()
    out["arrival_spread_ns"] = out["last_arrival_ns"] - out["first_arrival_ns"]
    return complete.merge(out, on="instance")
