"""Operator types and their time: the numbers behind ``op_statistic.csv``.

Device work (``kernel_details``: one row per piece of work, communication ops counted once) is
grouped by (``op_type``, ``core_type``): on Ascend the vendor's operator type and core
(``Conv2D`` / ``AI_CORE``), elsewhere the launching host operator (else the kernel's own name) and
the core the kind implies (``GPU``, ``MEMCPY``, ``COMMUNICATION``).  For a trace without device work
(CPU only) the rows are the host operators of ``operator_stats`` with core ``CPU``.

Definitions (integer ns, except ``avg_ns``, a float mean):

* ``count``, ``total_ns``, ``min_ns``, ``avg_ns``, ``max_ns`` of the group's durations;
* ``ratio`` = the group's total / the total of every group that is not communication, 0..1, and
  null on communication rows (device rows); for host rows the operator's share of all host *self*
  time (``operator_stats.host_ratio``), because inclusive times of nested operators overlap and
  would not sum to 1.

Ascend's own ``op_statistic.csv`` lists compute operators only and its ratios are their shares of
each other.  perfsight's also has one row per communication op type (``hcom_allReduce_`` /
``HCCL``, counted once per op), whose time is there to read but left out of the ratios, so that the
ratios of the compute rows equal the vendor's (communication has its own tables).

This module must not read files or convert units; it returns an Arrow table, largest total first.
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

from perfsight import columns
from perfsight.analysis import grouping
from perfsight.analysis.kernels import core_of_kind
from perfsight.model import SliceKind

COMMUNICATION = SliceKind.COMMUNICATION.value
"""``kernel_details.kind`` of a communication op's row: left out of the ratios."""
HOST_CORE_TYPE = "CPU"
"""Core type of rows built from host operators (CPU-only traces)."""

OP_STATISTIC_SCHEMA = pa.schema(
    [
        ("rank", pa.int32()),
        ("op_type", pa.string()),
        ("core_type", pa.string()),
        ("count", pa.int64()),
        ("total_ns", pa.int64()),
        ("min_ns", pa.int64()),
        ("avg_ns", pa.float64()),
        ("max_ns", pa.int64()),
        ("ratio", pa.float64()),
    ]
)


def _text(table: pa.Table, name: str) -> pa.Array | None:
    """Column ``name`` as plain strings, or None when the table lacks it."""
    if name not in table.column_names:
        return None
    return columns.decoded(columns.one_array(table.column(name))).cast(pa.string())


def _device_keys(details: pa.Table) -> tuple[pa.Array, pa.Array]:
    """The (op type, core type) of each row: the recorded ones, else launching op / name and kind."""
    name = _text(details, "name")
    op = _text(details, "op")
    op_type = _text(details, "op_type")
    op_type = pc.coalesce(*(a for a in (op_type, op) if a is not None), pa.scalar(None, pa.string()))
    op_type = pc.if_else(pc.equal(pc.fill_null(op_type, ""), ""), name, op_type)
    core = core_of_kind(details.column("kind"))
    core_type = _text(details, "core_type")
    return op_type, core if core_type is None else pc.coalesce(core_type, core)


OP_STATISTIC_KEYS = ("rank", "op_type", "core_type")
OP_STATISTIC_AGGREGATES = (
    ("is_communication", "max"),
    ("dur_ns", "count"),
    ("dur_ns", "sum"),
    ("dur_ns", "min"),
    ("dur_ns", "max"),
)
"""What :func:`op_statistic` aggregates per (rank, op type, core type) of ``kernel_details``; each
merges from per-chunk partials (:func:`perfsight.analysis.grouping.merge_partials`).  The average is
the sum over the count (the float sum of integer durations is exact below 2**53 ns, 104 days)."""


def op_statistic_groups(details: pa.Table, first_start: bool = False) -> pa.Table:
    """:data:`OP_STATISTIC_AGGREGATES` per key of ``details`` (one chunk's or the whole trace's);
    ``first_start`` adds ``start_ns_min`` (see :func:`perfsight.analysis.kernels.kernel_groups`)."""
    op_type, core_type = _device_keys(details)
    keyed = pa.table(
        {
            "rank": details.column("rank"),
            "op_type": op_type,
            "core_type": core_type,
            "dur_ns": details.column("dur_ns"),
            "is_communication": pc.equal(details.column("kind"), COMMUNICATION).cast(pa.int64()),
            "start_ns": details.column("start_ns"),
        }
    )
    extra = (("start_ns", "min"),) if first_start else ()
    return grouping.aggregate(keyed, OP_STATISTIC_KEYS, OP_STATISTIC_AGGREGATES + extra)


def op_statistic(details: pa.Table | None, operator_stats: pa.Table | None = None) -> pa.Table:
    """One row per (rank, op type, core type); see the module docstring."""
    groups = op_statistic_groups(details) if details is not None and details.num_rows else None
    return op_statistic_of_groups(groups, operator_stats)


def op_statistic_of_groups(grouped: pa.Table | None, operator_stats: pa.Table | None = None) -> pa.Table:
    """:func:`op_statistic` from the :func:`op_statistic_groups` of all device work (whole or merged;
    None or empty without device work, then from ``operator_stats``)."""
    if grouped is not None and grouped.num_rows:
        communication = pc.equal(grouped.column("is_communication_max"), 1)
        computing = pc.if_else(communication, 0, grouped.column("dur_ns_sum"))
        total = pc.sum(computing).as_py() or 0
        share = pc.divide(grouped.column("dur_ns_sum").cast(pa.float64()), float(total) if total else 1.0)
        ratio = pc.if_else(communication, pa.scalar(None, pa.float64()), share)
        mean = pc.divide(
            grouped.column("dur_ns_sum").cast(pa.float64()), grouped.column("dur_ns_count").cast(pa.float64())
        )
        arrays = [
            grouped.column("rank"),
            grouped.column("op_type"),
            grouped.column("core_type"),
            grouped.column("dur_ns_count"),
            grouped.column("dur_ns_sum"),
            grouped.column("dur_ns_min"),
            mean,
            grouped.column("dur_ns_max"),
        ]
        arrays = [a.cast(f.type) for a, f in zip(arrays, OP_STATISTIC_SCHEMA, strict=False)]
        out = pa.Table.from_arrays([*arrays, ratio], schema=OP_STATISTIC_SCHEMA)
    elif operator_stats is not None and operator_stats.num_rows:
        n = operator_stats.num_rows
        out = pa.Table.from_arrays(
            [
                operator_stats.column("rank").cast(pa.int32()),
                operator_stats.column("name").cast(pa.string()),
                pa.repeat(pa.scalar(HOST_CORE_TYPE), n),
                operator_stats.column("count").cast(pa.int64()),
                operator_stats.column("host_total_ns").cast(pa.int64()),
                operator_stats.column("host_min_ns").cast(pa.int64()),
                operator_stats.column("host_avg_ns").cast(pa.float64()),
                operator_stats.column("host_max_ns").cast(pa.int64()),
                operator_stats.column("host_ratio").cast(pa.float64()),
            ],
            schema=OP_STATISTIC_SCHEMA,
        )
    else:
        return OP_STATISTIC_SCHEMA.empty_table()
    return out.sort_by([("total_ns", "descending"), ("op_type", "ascending")])
