"""The ops of each step in execution order, and the micro-batch blocks of a pipeline stage.

Why a table of its own: the parallel-execution views of seed 000 (the Marey view and the pipeline
chart) draw, for one step, every device's ops as intervals in time and join the same op across the
devices of a stage.  Neither the operator statistics (aggregated over instances) nor the step trace
(phases, not ops) keep the ops themselves, so this table does: one row per *outermost* op of a step
(an op nested inside another op is part of its parent's interval), with its order in the step --
the k-th op of a step is the same op on every device of a stage that runs the same program.

Which ops: compute only -- device work (kernels, copies) when the trace has any, else the host ops
of the thread that runs the training step (the thread holding ``ProfilerStep#N``: on a CPU job
that thread computes).  Communication ops are not taken from here: the cluster's matching already
holds each one with its execution timing (the NCCL kernel, gloo's worker-thread range), which a
host op nested inside an autograd op would hide.  Micro-batch blocks are the
``Forward N`` / ``Backward N`` ranges PyTorch's pipeline schedules record
(``torch.distributed.pipelining``); a stage that records none has no block rows, and the pipeline
chart says so rather than guessing a schedule.

What it must not do: decide cross-rank facts (which op matches which on another rank, clock
offsets) -- that is ``perfsight.cluster.execution``.  Vectorised: one sort and a grouped cumulative
maximum, no loop over slices.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pyarrow as pa

from perfsight.model import Trace

STEP_OPS_SCHEMA = pa.schema(
    [
        ("rank", pa.int32()),
        ("step", pa.int32()),
        ("level", pa.string()),  # "op" (an outermost op) or "micro_batch" (a Forward/Backward range)
        ("order", pa.int32()),  # index among the rank's rows of this step and level, in start order
        ("name", pa.string()),
        ("category", pa.string()),  # "compute" (communication rows are the cluster's matched ops)
        ("phase", pa.string()),  # micro-batch rows: "forward" / "backward"; op rows: ""
        ("micro_batch", pa.int32()),  # micro-batch rows: N of "Forward N"; op rows: -1
        ("slice", pa.int64()),  # row in the rank's ``slices`` (joins ``comm.slice``)
        ("start_ns", pa.int64()),
        ("end_ns", pa.int64()),
    ]
)
"""Units: ns on the rank's own trace clock (the cluster step shifts them onto the common clock)."""

OP_KINDS_DEVICE = ("kernel", "memcpy", "memset")
OP_KINDS_HOST = ("cpu_op",)
MICRO_BATCH_PATTERN = r"^(?i:(forward|backward))\D*?(\d+)$"
"""``Forward 3``, ``Backward 3``, ``Backward input 3``, ``Backward weight 3`` (torch pipelining)."""


def step_ops(trace: Trace) -> pa.Table:
    """One row per outermost op and per micro-batch range of every step (:data:`STEP_OPS_SCHEMA`)."""
    wanted = ["kind", "name", "is_device", "track", "start_ns", "dur_ns", "step"]
    s = trace.slices.select(wanted).to_pandas()
    if s.empty:
        return STEP_OPS_SCHEMA.empty_table()
    s["slice"] = np.arange(len(s), dtype=np.int64)
    s["kind"] = s["kind"].astype(str)
    s["name"] = s["name"].astype(str)
    s = s[s["step"].notna() & (s["step"] >= 0)]
    device = s[s["is_device"] & s["kind"].isin(OP_KINDS_DEVICE)]
    if not device.empty:
        ops = device
    else:
        steps_on = s.loc[s["kind"] == "step", "track"]
        main = steps_on.mode().iloc[0] if not steps_on.empty else s["track"].mode().iloc[0]
        ops = s[(~s["is_device"]) & (s["track"] == main) & s["kind"].isin(OP_KINDS_HOST)]
    ops = _outermost(ops)
    ops = ops.assign(
        level="op",
        category="compute",
        phase="",
        micro_batch=-1,
    )
    found = s.loc[s["kind"] == "annotation", "name"].str.extract(MICRO_BATCH_PATTERN)
    blocks = s.loc[found.dropna().index]
    blocks = blocks.assign(
        level="micro_batch",
        category="compute",
        phase=found.loc[blocks.index, 0].str.lower(),
        micro_batch=found.loc[blocks.index, 1].astype(int),
    )
    rows = pd.concat([ops, blocks], ignore_index=True)
    if rows.empty:
        return STEP_OPS_SCHEMA.empty_table()
    rows = rows.sort_values(["step", "level", "start_ns", "slice"], kind="stable")
    rows["order"] = rows.groupby(["step", "level"]).cumcount()
    rows["end_ns"] = rows["start_ns"] + rows["dur_ns"]
    rows["rank"] = trace.rank
    return pa.Table.from_pandas(rows[STEP_OPS_SCHEMA.names], schema=STEP_OPS_SCHEMA, preserve_index=False)


def _outermost(ops: pd.DataFrame) -> pd.DataFrame:
    """The ops not inside an earlier op of their track: an op starting before the latest end of the
    ops started before it on its track is nested (a track's ops nest, they do not cross; device
    work does not nest, so every kernel is kept)."""
    ops = ops.sort_values(["track", "start_ns", "dur_ns"], ascending=[True, True, False], kind="stable")
    end = ops["start_ns"] + ops["dur_ns"]
    reach = end.groupby(ops["track"]).cummax().groupby(ops["track"]).shift(1)
    return ops[~(ops["start_ns"] < reach)]
