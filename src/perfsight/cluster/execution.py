"""Every rank's ops of every step on the job's common clock, each with the key that matches it
across the devices of its stage: the data of the Marey view and the pipeline chart (seed 000).

Why here: matching the same op on several devices and shifting each rank onto one clock are
cross-rank facts (``perfsight.cluster.matching`` and ``.alignment`` decide them); the per-rank rows
come from ``perfsight.analysis.step_ops``.  This module only joins them:

* ``stage`` from the cluster step trace's stage of each rank;
* ``instance``: a communication op's matched instance (the same collective on every rank of its
  group, a send with its receive) -- -1 for compute and for an op that matched nothing;
* ``key``: what makes "the same op" on two devices of a stage.  A collective: its group and
  sequence number (the matched instance); any other op: its name and how many ops of that name
  came before it in the step (``aten::linear#3``); a micro-batch block: its phase and micro-batch
  (``forward#2``).  Rows of one stage with one key in one step are one op of the Marey view.
  The FLOPs and memory rows (``level`` ``flops`` / ``memory``: series with a ``value``, drawn as
  lines over the timelines) have no key.

Times are shifted by the alignment's offsets (``start_ns``/``end_ns`` on the common clock, ns).
Vectorised with pandas merges and group counts, no loop over ops.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import pandas as pd

from perfsight.analysis.step_ops import SAMPLE_LEVELS
from perfsight.cluster.alignment import Alignment
from perfsight.cluster.matching import Matched
from perfsight.cluster.rank import RankDigest, concat

STEP_OPS_TABLE = "step_ops"
"""The per-rank table (``perfsight.analysis.step_ops``) each digest carries."""
OUTPUT_FILE = "cluster_step_ops.parquet"
"""Its cross-rank form in ``cluster_analysis_output/`` (columns: :data:`COLUMNS`)."""
ROW_GROUP_ROWS = 65_536
"""Rows per Parquet row group of :data:`OUTPUT_FILE`: its rows are sorted by step and rank, so the
Marey view's read of a page of devices' rows skips the other ranks' groups (pyarrow's default, a million
rows, spans hundreds of ranks at a few thousand rows a rank)."""
COLUMNS = [
    "step", "rank", "stage", "level", "order", "key", "name", "category", "phase", "micro_batch",
    "instance", "is_p2p", "peer", "start_ns", "end_ns", "slice", "value",
]  # fmt: skip
"""``slice``: the row in its rank's ``slices`` (joins the rank's ``op_context``); -1 for a
communication op (its row is the cluster's matched op)."""


def step_ops(
    digests: Mapping[int, RankDigest], matched: Matched, aligned: Alignment, stage_of: Mapping[int, int]
) -> pd.DataFrame:
    """Every rank's step ops on the common clock with stage, matched instance and key (:data:`COLUMNS`).

    Compute ops and micro-batch blocks come from each rank's ``step_ops`` (shifted by the rank's
    clock offset); communication ops are the matched ops themselves (already on the common clock),
    named by their collective (``all_reduce``, ``send``, ``recv``)."""
    ordered = [digests[r] for r in sorted(digests) if STEP_OPS_TABLE in digests[r].tables]
    table = concat(ordered, STEP_OPS_TABLE)
    rows = table.to_pandas() if table.num_rows else pd.DataFrame()
    if not rows.empty:
        shift = rows["rank"].map(aligned.offset_ns).fillna(0).astype("int64")
        rows = rows.assign(start_ns=rows["start_ns"] - shift, end_ns=rows["end_ns"] - shift)
        rows = rows.assign(instance=-1, is_p2p=False, peer=-1)
    comm = matched.ops
    comm = comm[comm["step"].notna() & (comm["step"] >= 0)] if not comm.empty else comm
    if not comm.empty:
        comm = pd.DataFrame(
            {
                "rank": comm["rank"].astype("int64"),
                "step": comm["step"].astype("int64"),
                "level": "op",
                "name": comm["collective"].astype(str),
                "category": "communication",
                "phase": "",
                "micro_batch": -1,
                "instance": comm["instance"].fillna(-1).astype("int64"),
                "is_p2p": comm["is_p2p"].fillna(False).astype(bool),
                "peer": comm["peer"].fillna(-1).astype("int64"),
                "slice": -1,
                "start_ns": comm["start_ns"].astype("int64"),
                "end_ns": comm["end_ns"].astype("int64"),
                "value": np.nan,
            }
        )
    parts = [p for p in (rows, comm) if not p.empty]
    if not parts:
        return pd.DataFrame({c: pd.Series(dtype="object") for c in COLUMNS})
    rows = pd.concat(parts, ignore_index=True)
    rows["stage"] = rows["rank"].map(stage_of).fillna(0).astype("int64")
    rows = rows.sort_values(["step", "rank", "level", "start_ns"], kind="stable")
    rows["order"] = rows.groupby(["rank", "step", "level"]).cumcount().astype("int64")
    rows["key"] = ""  # the FLOPs and memory series have none
    keyed = rows[~rows["level"].isin(SAMPLE_LEVELS)]
    nth = keyed.groupby(["rank", "step", "level", "name"]).cumcount().astype(str)
    by_name = keyed["name"] + "#" + nth
    by_block = keyed["phase"] + "#" + keyed["micro_batch"].astype(str)
    by_instance = "comm#" + keyed["instance"].astype(str)
    rows.loc[keyed.index, "key"] = np.where(
        keyed["level"] == "micro_batch", by_block, np.where(keyed["instance"] >= 0, by_instance, by_name)
    )
    return rows[COLUMNS].reset_index(drop=True)
