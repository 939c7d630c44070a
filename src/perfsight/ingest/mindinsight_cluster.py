"""MindSpore's own cluster step analysis of one rank, ``ascend_cluster_analyse_{mode}-parallel_*.csv``.

Why read it: a legacy run without an op timeline has no compute intervals, so perfsight cannot
compute the overlap breakdown of a model- or pipeline-parallel rank itself; MindSpore's profiler
did, and wrote its result into this file for MindInsight's cluster page.  It is kept as the vendor
table :data:`TABLE`, in the model's ns, labelled as MindSpore's, and the cluster step trace takes
it where the rank has no breakdown of its own (``perfsight.cluster.step_trace``).

What MindInsight 2.3.1 makes of it (``ClusterStepTraceAnalyser``): row ``k`` is step ``k`` and the
last row is what it shows as the average (step 0); the columns, by parallel mode:

* data parallel: ``iteration_interval, fp_and_bp, tail`` in 10 ns ticks, the same numbers as the
  step trace (MindInsight shows the step trace's, never this file's);
* model parallel: ``computation, communication_alone_time`` in ms;
* pipeline parallel: those and ``stage_time, receive_alone_time, collective_communication_time``.

In perfsight's names: computation -> ``computing_ns``, communication alone ->
``communication_not_overlapped_ns``, stage -> ``stage_ns``, receive alone (receive ops not hidden
by compute, waiting included: the file does not split waiting from transfer) ->
``receive_not_overlapped_ns``, collective communication alone ->
``communication_not_overlapped_exclude_receive_ns``.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from perfsight.ingest import ascend_files as files
from perfsight.units import NS_PER_MS

TABLE = "mindinsight_cluster_analyse"
"""The vendor table's name among a rank's tables."""

TICK_NS = 10
"""The data-parallel file counts in the step trace's 10 ns ticks."""

COLUMNS_MS = {
    "computation": "computing_ns",
    "communication_alone_time": "communication_not_overlapped_ns",
    "stage_time": "stage_ns",
    "receive_alone_time": "receive_not_overlapped_ns",
    "collective_communication_time": "communication_not_overlapped_exclude_receive_ns",
}
"""Model/pipeline-parallel column (ms) -> phase (ns)."""
COLUMNS_TICKS = {"iteration_interval": "iteration_interval_ns", "fp_and_bp": "fp_bp_ns", "tail": "tail_ns"}
"""Data-parallel column (10 ns ticks) -> phase (ns)."""
PHASES = [*COLUMNS_TICKS.values(), *COLUMNS_MS.values()]

SCHEMA = pa.schema(
    [("rank", pa.int32()), ("step", pa.int32()), ("mode", pa.string())]
    + [(phase, pa.int64()) for phase in PHASES]
)
"""One row per row of the file; a phase the file's mode does not have is null."""


def read_cluster_analyse(
    path: Path, mode: str, rank: int, problems: files.FileProblems, steps: int | None = None
) -> pa.Table:
    """The rows of ``path`` (parallel mode ``mode``, e.g. ``"model"``) as :data:`SCHEMA` rows.

    Row ``k`` is step ``k``; when the file has one row more than the rank's ``steps``, that last row
    is MindInsight's average and gets step 0 (its "step 0").  A cell that is not a number is null,
    and the file is named in a warning with the column."""
    table = files.read_csv(path, problems)
    n = table.num_rows
    known = {
        **{c: (p, NS_PER_MS) for c, p in COLUMNS_MS.items()},
        **{c: (p, TICK_NS) for c, p in COLUMNS_TICKS.items()},
    }
    present = [c for c in table.column_names if c in known]
    if n and not present:
        problems.add(path, f"none of the columns MindInsight reads ({', '.join(known)}); not used")
        return SCHEMA.empty_table()
    by_phase: dict[str, pa.Array] = {}
    for column in present:
        values = _numbers(table.column(column).combine_chunks())
        phase, scale = known[column]
        if values.null_count:
            problems.add(path, f"{values.null_count} cell(s) of {column} not a number; left empty")
        by_phase[phase] = pc.cast(pc.round(pc.multiply(values, float(scale))), pa.int64())
    if not by_phase:
        return SCHEMA.empty_table()
    arrays = [
        pa.array(np.full(n, rank, np.int32)),
        pa.array(_step_numbers(n, steps)),
        pa.array([mode] * n, pa.string()),
    ] + [by_phase.get(phase, pa.nulls(n, pa.int64())) for phase in PHASES]
    return pa.Table.from_arrays(arrays, schema=SCHEMA)


def _step_numbers(rows: int, steps: int | None) -> np.ndarray:
    """1..rows, the last 0 when it is the average row (one row more than the steps)."""
    numbers = np.arange(1, rows + 1, dtype=np.int32)
    if steps is not None and rows == steps + 1 and rows > 1:
        numbers[-1] = 0
    return numbers


def _numbers(values: pa.Array) -> pa.Array:
    """``values`` as float64: a cell that is not a number (``files.read_csv`` keeps such a column as
    text) becomes null."""
    if pa.types.is_floating(values.type) or pa.types.is_integer(values.type):
        return pc.cast(values, pa.float64())
    text = pc.utf8_trim_whitespace(pc.cast(values, pa.string()))
    number = pc.fill_null(pc.match_substring_regex(text, files._NUMBER), False)
    return pc.cast(pc.if_else(number, text, pa.scalar(None, pa.string())), pa.float64())


def summary_text(table: pa.Table) -> str:
    """The row MindInsight shows as the average (the file's last), in the file's ms, labelled."""
    row = table.slice(table.num_rows - 1).to_pylist()[0]
    names = {
        "computing_ns": "computation",
        "communication_not_overlapped_ns": "communication alone",
        "stage_ns": "stage",
        "receive_not_overlapped_ns": "receive alone",
        "communication_not_overlapped_exclude_receive_ns": "collective communication alone",
        "iteration_interval_ns": "iteration interval",
        "fp_bp_ns": "forward+backward",
        "tail_ns": "tail",
    }
    parts = [
        f"{label} {row[phase] / NS_PER_MS:.4f} ms" for phase, label in names.items() if row[phase] is not None
    ]
    return (
        f"MindSpore's cluster analysis ({row['mode']} parallel; the row MindInsight shows as the average, "
        f"of {table.num_rows} row(s)): " + ", ".join(parts) + f"; kept as table {TABLE}"
    )
