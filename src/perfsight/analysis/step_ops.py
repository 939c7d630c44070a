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

The same table carries the two series the Marey view overlays on each device's timeline, as rows of
their own level with a ``value``: ``level = "flops"``, one row per outermost operator with a FLOPs
count (``perfsight.analysis.flops.op_flops``: its interval and its FLOPs), and ``level = "memory"``,
one row per allocator event of the rank's device (its time and the allocated total after it, bytes;
the device's events when the trace has any, else the host's).  They share the op rows' clock and
step so that one shift puts all of them on the job's clock.
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
        ("value", pa.float64()),  # "flops" rows: FLOPs; "memory" rows: allocated bytes; else null
    ]
)
"""Units: ns on the rank's own trace clock (the cluster step shifts them onto the common clock)."""

SAMPLE_LEVELS = ("flops", "memory")
"""The levels that are series over time, not ops (they have a ``value`` and no key)."""

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
    rows = pd.concat([ops, blocks, _flops_rows(trace, s), _memory_rows(trace)], ignore_index=True)
    if rows.empty:
        return STEP_OPS_SCHEMA.empty_table()
    rows = rows.sort_values(["step", "level", "start_ns", "slice"], kind="stable")
    rows["order"] = rows.groupby(["step", "level"]).cumcount()
    rows["end_ns"] = rows["start_ns"] + rows["dur_ns"]
    if "value" not in rows:
        rows["value"] = np.nan
    rows["rank"] = trace.rank
    return pa.Table.from_pandas(rows[STEP_OPS_SCHEMA.names], schema=STEP_OPS_SCHEMA, preserve_index=False)


def _flops_rows(trace: Trace, slices: pd.DataFrame) -> pd.DataFrame:
    """One row per outermost operator with a FLOPs count, in a step: its interval and FLOPs."""
    from perfsight.analysis.flops import op_flops

    counted = op_flops(trace)
    if counted.num_rows == 0:
        return pd.DataFrame()
    flops = pd.Series(counted.column("flops").to_numpy(), index=counted.column("slice").to_numpy())
    rows = slices[slices["slice"].isin(flops.index)]  # ``slices`` holds only rows inside a step
    return rows.assign(
        level="flops", category="compute", phase="", micro_batch=-1, name="flops",
        value=flops.loc[rows["slice"]].to_numpy(),
    )  # fmt: skip


def _memory_rows(trace: Trace) -> pd.DataFrame:
    """One row per allocator event of the rank's busiest device (an accelerator's when the trace has
    any, else the host's), in a step: its time and the allocated total after it (bytes)."""
    memory = trace.memory
    if memory.num_rows == 0 or trace.steps.num_rows == 0:
        return pd.DataFrame()
    m = memory.select(["device_type", "device_index", "ts_ns", "allocated_bytes"]).to_pandas()
    m["device_type"] = m["device_type"].astype(str)
    m = m[m["allocated_bytes"].notna()]
    accelerator = m[m["device_type"] != "cpu"]
    m = accelerator if not accelerator.empty else m
    if m.empty:
        return pd.DataFrame()
    busiest = m.groupby(["device_type", "device_index"]).size().idxmax()
    m = m[(m["device_type"] == busiest[0]) & (m["device_index"] == busiest[1])]
    steps = trace.steps.select(["step", "start_ns", "end_ns"]).to_pandas().sort_values("start_ns")
    at = np.searchsorted(steps["start_ns"].to_numpy(), m["ts_ns"].to_numpy(), side="right") - 1
    inside = at >= 0
    inside[inside] = m["ts_ns"].to_numpy()[inside] < steps["end_ns"].to_numpy()[at[inside]]
    m, at = m[inside], at[inside]
    if m.empty:
        return pd.DataFrame()
    return pd.DataFrame(
        {
            "level": "memory", "category": "memory", "phase": "", "micro_batch": -1, "name": "memory",
            "slice": -1, "step": steps["step"].to_numpy()[at], "start_ns": m["ts_ns"].to_numpy(),
            "dur_ns": 0, "value": m["allocated_bytes"].to_numpy(dtype=np.float64),
        }
    )  # fmt: skip


def _outermost(ops: pd.DataFrame) -> pd.DataFrame:
    """The ops not inside an earlier op of their track: an op starting before the latest end of the
    ops started before it on its track is nested (a track's ops nest, they do not cross; device
    work does not nest, so every kernel is kept)."""
    ops = ops.sort_values(["track", "start_ns", "dur_ns"], ascending=[True, True, False], kind="stable")
    end = ops["start_ns"] + ops["dur_ns"]
    reach = end.groupby(ops["track"]).cummax().groupby(ops["track"]).shift(1)
    return ops[~(ops["start_ns"] < reach)]
