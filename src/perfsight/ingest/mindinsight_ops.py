"""Operator facts of MindInsight's legacy ``profiler/`` layout, for the timeline's device ops.

MindInsight's operator page reads, per device ``n``:

* ``framework_raw_{n}.csv``: ``task_id,stream_id,block_dim,full_op_name,op_name,op_type,subgraph,
  op_info`` -- one row per graph op: its full scope name (``Default/network-.../MatMul-op19``), its
  type (``MatMul``) and, in ``op_info`` (JSON), ``input_<i>``/``output_<i>`` with ``format``,
  ``data_type`` and ``shape`` (``"2,3,227,227"``).  The timeline names an AI Core op by
  ``op_name`` (``MatMul-op19``), so the join gives each device op its type, scope and shapes.
* ``aicpu_intermediate_{n}.csv``: ``serial_number,kernel_type,total_time,dispatch_time,
  execution_time,run_start,run_end`` -- the AI CPU ops in run order; ``run_start`` is in µs on the
  device clock of the step trace, where the timeline display counts µs from its first op.  The
  same ops in the same order on both give the offset that puts the timeline on the step trace's
  clock (else no op falls inside a step).
* ``aicore_intermediate_{n}_type.csv`` / ``_detail.csv`` are MindInsight's results (per type: total
  ms, count, percent; per op: total ms); perfsight computes its own from the timeline, so they are
  only kept as vendor tables to compare with.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from perfsight import columns
from perfsight.ingest import ascend_files as files
from perfsight.units import NS_PER_US

FRAMEWORK_SCHEMA = pa.schema(
    [
        pa.field("op_name", pa.string()),
        pa.field("full_op_name", pa.string()),
        pa.field("op_type", pa.string()),
        pa.field("input_dims", pa.list_(pa.list_(pa.int64()))),
        pa.field("input_types", pa.list_(pa.string())),
    ]
)
"""One row per graph op of ``framework_raw_{n}.csv``."""

AI_CORE, AI_CPU = "AI_CORE", "AI_CPU"
"""Core types as Ascend's ``kernel_details.csv`` names them (``Accelerator Core``)."""


def _shape(text: object) -> list[int]:
    """``"2,3,227,227"`` -> ``[2, 3, 227, 227]``; ``""`` (a scalar or no tensor) -> ``[]``."""
    parts = [p.strip() for p in str(text or "").split(",") if p.strip()]
    return [int(p) for p in parts if p.lstrip("-").isdigit()]


def _inputs(op_info: object) -> tuple[list[list[int]], list[str]]:
    """The shapes and data types of ``input_0``, ``input_1``, ... of one ``op_info`` cell."""
    try:
        info = json.loads(str(op_info or "{}"))
    except ValueError:
        return [], []
    if not isinstance(info, dict):
        return [], []
    keys = sorted(
        (k for k in info if k.startswith("input_") and k[6:].isdigit() and isinstance(info[k], dict)),
        key=lambda k: int(k[6:]),
    )
    return [_shape(info[k].get("shape")) for k in keys], [str(info[k].get("data_type", "")) for k in keys]


def read_framework_raw(path: Path, problems: files.FileProblems) -> pa.Table:
    """The graph ops of ``framework_raw_{n}.csv`` (:data:`FRAMEWORK_SCHEMA`), one row per op name."""
    table = files.read_csv(path, problems)
    needed = {"full_op_name", "op_name", "op_type"}
    if table.num_rows == 0 or not needed <= set(table.column_names):
        if table.num_rows:
            problems.add(path, f"lacks columns {sorted(needed - set(table.column_names))}")
        return FRAMEWORK_SCHEMA.empty_table()
    infos = (
        table.column("op_info").to_pylist() if "op_info" in table.column_names else [None] * table.num_rows
    )
    shapes = [_inputs(cell) for cell in infos]  # one per graph op, not per executed task
    out = pa.table(
        {
            "op_name": pc.cast(table.column("op_name"), pa.string()),
            "full_op_name": pc.cast(table.column("full_op_name"), pa.string()),
            "op_type": pc.cast(table.column("op_type"), pa.string()),
            "input_dims": pa.array([s[0] for s in shapes], FRAMEWORK_SCHEMA.field("input_dims").type),
            "input_types": pa.array([s[1] for s in shapes], FRAMEWORK_SCHEMA.field("input_types").type),
        },
        schema=FRAMEWORK_SCHEMA,
    )
    _, first = np.unique(np.array(out.column("op_name").to_pylist(), dtype=object), return_index=True)
    return out.take(pa.array(np.sort(first)))  # an op listed twice (two subgraphs) keeps its first row


def timeline_offset_ns(
    path: Path, names: list[str], ts_ns: np.ndarray, problems: files.FileProblems
) -> int | None:
    """The offset from the timeline display's clock to the step trace's, by the AI CPU ops.

    ``names`` / ``ts_ns``: the timeline's AI CPU ops in time order.  ``None`` (and a warning) when
    ``aicpu_intermediate_{n}.csv`` does not list the same ops in the same order."""
    table = files.read_csv(path, problems)
    if table.num_rows == 0 or not {"kernel_type", "run_start"} <= set(table.column_names):
        if table.num_rows:
            problems.add(path, "lacks columns kernel_type/run_start; the timeline keeps its own clock")
        return None
    kinds = [str(v) for v in pc.cast(table.column("kernel_type"), pa.string()).to_pylist()]
    run_start = columns.numpy(pc.cast(table.column("run_start"), pa.float64()), null=np.nan)
    if kinds != names or np.isnan(run_start).any() or not len(names):
        problems.add(path, "its AI CPU ops differ from the timeline's; the timeline keeps its own clock")
        return None
    return int(np.round(np.median(run_start * NS_PER_US - ts_ns)))


def with_op_facts(slices: pa.Table, ai_core: np.ndarray, ai_cpu: np.ndarray, framework: pa.Table) -> pa.Table:
    """``slices`` with the AI Core ops (mask ``ai_core``) named by their full scope name and given
    their type, core and input shapes from ``framework`` (:func:`read_framework_raw`), and the AI CPU
    ops (mask ``ai_cpu``) typed by their kernel name, as MindInsight's AI Core / AI CPU tables do."""
    n = slices.num_rows
    names = slices.column("name").cast(pa.string()).combine_chunks() if n else pa.array([], pa.string())
    row = pc.index_in(names, value_set=framework.column("op_name").combine_chunks())
    found = pc.and_(pc.is_valid(row), pa.array(ai_core))
    take = pc.if_else(found, row, pa.scalar(None, row.type))

    def fill(column: str, framework_value: pa.Array, otherwise: pa.Array | None = None) -> None:
        nonlocal slices
        current = slices.column(column).combine_chunks()
        target_type = slices.schema.field(column).type
        base = current.cast(framework_value.type) if otherwise is None else otherwise
        value = pc.if_else(found, framework_value, base)
        slices = slices.set_column(slices.schema.get_field_index(column), column, value.cast(target_type))

    fill("name", framework.column("full_op_name").combine_chunks().take(take))
    cpu_type = pc.if_else(
        pa.array(ai_cpu), names, slices.column("op_type").combine_chunks().cast(pa.string())
    )
    fill("op_type", framework.column("op_type").combine_chunks().take(take), cpu_type)
    current_core = slices.column("core_type").combine_chunks().cast(pa.string())
    core_type = pc.if_else(pa.array(ai_core), AI_CORE, pc.if_else(pa.array(ai_cpu), AI_CPU, current_core))
    slices = slices.set_column(
        slices.schema.get_field_index("core_type"),
        "core_type",
        core_type.cast(slices.schema.field("core_type").type),
    )
    fill("input_dims", framework.column("input_dims").combine_chunks().take(take))
    fill("input_types", framework.column("input_types").combine_chunks().take(take))
    return slices


AI_CPU_OPS_TABLE = "mindinsight_aicpu_ops"
AI_CPU_OPS_SCHEMA = pa.schema(
    [
        pa.field("rank", pa.int32(), nullable=False),
        pa.field("serial_number", pa.int64()),
        pa.field("kernel_type", pa.string(), nullable=False),
        pa.field("total_ns", pa.int64()),  # the file's total_time: MindInsight's AI CPU time
        pa.field("dispatch_ns", pa.int64()),
        pa.field("execution_ns", pa.int64()),
    ]
)
"""One row per AI CPU op run of ``aicpu_intermediate_{n}.csv``, times in ns (the file writes ms).
MindInsight's AI CPU table sums ``total_time`` per kernel type; the timeline's span of the same op
is shorter (it leaves out the dispatch), so the server's per-type table uses this figure."""


def read_aicpu_ops(path: Path, rank: int, problems: files.FileProblems) -> pa.Table:
    """``aicpu_intermediate_{n}.csv`` as :data:`AI_CPU_OPS_SCHEMA`; empty (and a warning) without
    ``kernel_type`` and ``total_time``."""
    table = files.read_csv(path, problems)
    if table.num_rows == 0 or not {"kernel_type", "total_time"} <= set(table.column_names):
        if table.num_rows:
            problems.add(path, "lacks columns kernel_type/total_time; AI CPU totals follow the timeline")
        return AI_CPU_OPS_SCHEMA.empty_table()

    def ns(column: str) -> pa.Array:
        if column not in table.column_names:
            return pa.nulls(table.num_rows, pa.int64())
        ms = columns.numpy(pc.cast(table.column(column), pa.float64()), null=np.nan)
        return pa.array(np.round(np.nan_to_num(ms) * 1e6).astype(np.int64), mask=np.isnan(ms))

    kinds = pc.cast(table.column("kernel_type"), pa.string())
    keep = pc.is_valid(kinds)
    serial = (
        pc.cast(table.column("serial_number"), pa.float64())
        if "serial_number" in table.column_names
        else pa.nulls(table.num_rows, pa.float64())
    )
    out = pa.table(
        {
            "rank": pa.array(np.full(table.num_rows, rank, np.int32)),
            "serial_number": pc.cast(serial, pa.int64()),
            "kernel_type": kinds,
            "total_ns": ns("total_time"),
            "dispatch_ns": ns("dispatch_time"),
            "execution_ns": ns("execution_time"),
        }
    ).filter(keep)
    return out.cast(AI_CPU_OPS_SCHEMA)
