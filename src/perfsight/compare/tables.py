"""The tables of a comparison, one function per topic, each from the two sides' analysis tables.

Every number is a per-step mean of a single-rank analysis table (step_trace, overlap_breakdown,
communication_*, data_wait, flops_by_step, memory_peaks, operator_instances, kernel_details) over
the steps :mod:`perfsight.compare.inputs` chose; nothing here re-derives a step phase, an
operator's self time or a communication split -- it selects, sums per step and hands the per-step
rows to :func:`perfsight.compare.align.align`.

Why per-step means: two runs rarely profile the same number of steps; a mean per step compares
them, and the spread between steps is what the noise verdict needs.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from perfsight.compare.align import align, beyond_noise, per_step_stats
from perfsight.compare.inputs import Side


@dataclasses.dataclass(frozen=True)
class Metric:
    """One row of the step breakdown: which analysis table and column it is the per-step mean of."""

    name: str
    table: str
    column: str
    unit: str  # ns | flop | ratio
    category: str  # what a regression of it points at: step, data, compute, communication, idle
    absent_is_zero: bool = False  # an empty table means none of it (no waits), not unknown


METRICS = (
    Metric("step_ns", "step_trace", "duration_ns", "ns", "step"),
    Metric("iteration_interval_ns", "step_trace", "iteration_interval_ns", "ns", "data"),
    Metric("fp_bp_ns", "step_trace", "fp_bp_ns", "ns", "compute"),
    Metric("tail_ns", "step_trace", "tail_ns", "ns", "tail"),
    Metric("computing_ns", "overlap_breakdown", "computing_ns", "ns", "compute"),
    Metric(
        "communication_not_overlapped_ns",
        "overlap_breakdown",
        "communication_not_overlapped_ns",
        "ns",
        "communication",
    ),
    Metric("overlapped_ns", "overlap_breakdown", "overlapped_ns", "ns", "communication"),
    Metric("free_ns", "overlap_breakdown", "free_ns", "ns", "idle"),
    Metric("host_wait_ns", "device_idle", "host_wait_ns", "ns", "idle"),
    Metric("preparing_ns", "overlap_breakdown", "preparing_ns", "ns", "data"),
    Metric("communication_ns", "communication_steps", "elapse_ns", "ns", "communication", True),
    Metric("communication_wait_ns", "communication_steps", "wait_ns", "ns", "communication", True),
    Metric("data_wait_ns", "data_wait", "data_wait_ns", "ns", "data", True),
    Metric("flops", "flops_by_step", "flops", "flop", "compute"),
    Metric("mfu", "flops_by_step", "mfu", "ratio", "compute"),
)
"""The step breakdown, in the order it is shown: step time, its phases (gap, forward+backward,
tail), the overlap breakdown (computing, communication not overlapped, overlapped, free -- and
the part of it the device waited for the host, ``device_idle`` -- preparing), communication and
data wait, FLOPs and MFU."""


def _in_steps(frame: pd.DataFrame, side: Side) -> pd.DataFrame:
    """Rows of the steps ``side`` averages (all rows, as step -1, for a run without steps)."""
    if not side.steps_used:
        return frame.assign(step=-1)
    return frame[frame["step"].isin(side.steps_used)]


def _frame(side: Side, name: str, columns: list[str]) -> pd.DataFrame:
    table: pa.Table = side.table(name)
    present = [c for c in columns if c in table.column_names]
    frame = table.select(present).to_pandas()
    for column in set(columns) - set(present):
        frame[column] = pd.Series(dtype="float64")
    return frame


NO_OPERATOR = "(no operator)"
"""The launching operator of kernels no host operator launched (or whose launch was not traced)."""


def _text(table: pa.Table, column: str) -> pa.ChunkedArray:
    if column not in table.column_names:
        return pa.chunked_array([pa.nulls(table.num_rows, pa.string())])
    return table.column(column).cast(pa.string())


def _keys(table: pa.Table, keys: list[str]) -> pa.Table:
    """``step`` and the ``keys`` as they are (dictionary or text; a missing key column is null)."""
    step = table.column("step") if "step" in table.column_names else pa.nulls(table.num_rows, pa.int32())
    missing = pa.nulls(table.num_rows, pa.string())
    return pa.table(
        {"step": step, **{k: table.column(k) if k in table.column_names else missing for k in keys}}
    )


def _plain_keys(frame: pd.DataFrame, keys: list[str]) -> pd.DataFrame:
    """Grouped key columns as plain text, null as "" (a few thousand rows: pandas is fine here)."""
    for key in keys:
        frame[key] = frame[key].astype(object).where(frame[key].notna(), "").astype(str)
    return frame


def _in_steps_arrow(table: pa.Table, side: Side) -> pa.Table:
    """Rows of the steps ``side`` averages (all rows, as step -1, for a run without steps)."""
    if not side.steps_used:
        return table.set_column(
            table.column_names.index("step"), "step", pa.array(np.full(table.num_rows, -1, np.int32))
        )
    steps = pa.array(side.steps_used, pa.int64())
    return table.filter(pc.is_in(table.column("step").cast(pa.int64()), value_set=steps))


def _step_sums(table: pa.Table, side: Side, keys: list[str], values: list[str], count: str) -> pd.DataFrame:
    """Per key and step of the steps ``side`` averages: the sums of ``values`` and the rows
    (``count``).  Grouped in Arrow: an analysis table can hold millions of rows, and only the
    grouped rows (thousands) become pandas."""
    columns: dict[str, pa.Array | pa.ChunkedArray] = {}
    grouped = _keys(table, keys)
    for value in values:
        column = table.column(value).cast(pa.float64()) if value in table.column_names else None
        columns[value] = (
            pc.fill_null(column, 0.0) if column is not None else pa.array(np.zeros(table.num_rows))
        )
    for name, column in columns.items():
        grouped = grouped.append_column(name, column)
    grouped = grouped.append_column(count, pa.array(np.ones(table.num_rows)))
    grouped = _in_steps_arrow(grouped, side)
    sums = grouped.group_by(["step", *keys]).aggregate([(v, "sum") for v in [*values, count]])
    frame = _plain_keys(sums.to_pandas(), keys).rename(columns={f"{v}_sum": v for v in [*values, count]})
    # a null key and an empty one are both "": their rows are one group
    return frame.groupby([*keys, "step"], sort=False)[[count, *values]].sum().reset_index()


def _metric_rows(side: Side) -> pd.DataFrame:
    """Per metric and step: the value of the step (long form)."""
    parts = []
    for metric in METRICS:
        frame = _in_steps(_frame(side, metric.table, ["step", metric.column]), side)
        values = frame.groupby("step")[metric.column].sum(min_count=1).dropna()
        if values.empty and not metric.absent_is_zero:
            continue  # unknown on this side (no overlap breakdown, no FLOPs): never 0
        if values.empty:
            values = pd.Series([0.0], index=[side.steps_used[0] if side.steps_used else -1])
        parts.append(
            pd.DataFrame({"metric": metric.name, "step": values.index, "value": values.to_numpy(float)})
        )
    return pd.concat(parts, ignore_index=True) if parts else pd.DataFrame(columns=["metric", "step", "value"])


def _peak(side: Side, column: str) -> float | None:
    table = side.table("memory_peaks")
    if column not in table.column_names or not table.num_rows:
        return None
    value = pa.compute.max(table.column(column)).as_py()
    return None if value is None else float(value)


def step_breakdown(base: Side, new: Side) -> pd.DataFrame:
    """One row per metric of :data:`METRICS` plus the memory peaks: base, new, delta and the verdict.

    Columns: metric, unit, category, status, base, new, delta, delta_pct, base_std, new_std,
    beyond_noise.  A metric one side does not know is *added*/*removed* (never compared with 0).
    """
    stats = [
        per_step_stats(_metric_rows(side), ["metric"], ["value"], side.step_count) for side in (base, new)
    ]
    out = align(*stats, ["metric"], ["value"], "value", (base.step_count, new.step_count))
    out = out.rename(
        columns={
            "base_value": "base",
            "new_value": "new",
            "delta_value": "delta",
            "base_value_std": "base_std",
            "new_value_std": "new_std",
        }
    )
    peaks = []
    for column in ("peak_allocated_bytes", "peak_reserved_bytes"):
        b, n = _peak(base, column), _peak(new, column)
        if b is None and n is None:
            continue
        status = "removed" if n is None else "added" if b is None else "same" if b == n else "changed"
        peaks.append(
            {
                "metric": column,
                "status": status,
                "base": b if b is not None else np.nan,
                "new": n if n is not None else np.nan,
                "delta": (n - b) if (b is not None and n is not None) else np.nan,
                "delta_pct": 100.0 * (n - b) / b if (b and n is not None) else np.nan,
                "beyond_noise": pd.NA,  # one peak per run: no spread to judge it against
            }
        )
    if peaks:
        out = pd.concat([out, pd.DataFrame(peaks)], ignore_index=True)
    info = {m.name: m for m in METRICS}
    out["unit"] = [info[m].unit if m in info else "bytes" for m in out["metric"]]
    out["category"] = [info[m].category if m in info else "memory" for m in out["metric"]]
    order = {
        name: i
        for i, name in enumerate([m.name for m in METRICS] + ["peak_allocated_bytes", "peak_reserved_bytes"])
    }
    out = out.sort_values("metric", key=lambda s: s.map(order)).reset_index(drop=True)
    out["beyond_noise"] = out["beyond_noise"].astype("boolean")
    return out[
        [
            "metric",
            "unit",
            "category",
            "status",
            "base",
            "new",
            "delta",
            "delta_pct",
            "base_std",
            "new_std",
            "beyond_noise",
        ]
    ]


def _operator_rows(side: Side) -> pd.DataFrame:
    return _step_sums(
        side.table("operator_instances"),
        side,
        ["name", "input_dims"],
        ["self_ns", "device_ns", "dur_ns"],
        "calls",
    )


def operator_basis(base: Side, new: Side) -> str:
    """The time operators are ranked by: device time when both runs have it, else host self time
    (the choice of ``operator_ranking``, made for the pair)."""
    has_device = [
        bool(pa.compute.sum(side.table("operator_instances").column("device_ns")).as_py() or 0)
        if "device_ns" in side.table("operator_instances").column_names
        else False
        for side in (base, new)
    ]
    return "device_ns" if all(has_device) else "self_ns"


def operators(base: Side, new: Side) -> pd.DataFrame:
    """Operators aligned by name and input shapes, per step: calls, host self, host total and device
    time; largest regression (``delta_time_ns``, of the basis :func:`operator_basis`) first.

    ``time`` columns are the basis; ``mean`` columns are per call (time / calls)."""
    basis = operator_basis(base, new)
    values = ["calls", "self_ns", "device_ns", "dur_ns"]
    stats = [
        per_step_stats(_operator_rows(side), ["name", "input_dims"], values, side.step_count)
        for side in (base, new)
    ]
    out = align(
        *stats, ["name", "input_dims"], values, basis, (base.step_count, new.step_count), count="calls"
    )
    out["basis"] = basis
    for side in ("base", "new"):
        out[f"{side}_time_ns"] = out[f"{side}_{basis}"]
        with np.errstate(divide="ignore", invalid="ignore"):
            out[f"{side}_mean_ns"] = np.where(
                out[f"{side}_calls"] > 0, out[f"{side}_time_ns"] / out[f"{side}_calls"], np.nan
            )
    out["delta_time_ns"] = out["new_time_ns"] - out["base_time_ns"]
    out["delta_mean_ns"] = out["new_mean_ns"] - out["base_mean_ns"]
    out = out.rename(columns={f"base_{basis}_std": "base_time_std_ns", f"new_{basis}_std": "new_time_std_ns"})
    return _largest_first(out)[
        [
            "name",
            "input_dims",
            "status",
            "basis",
            "base_calls",
            "new_calls",
            "delta_calls",
            "base_time_ns",
            "new_time_ns",
            "delta_time_ns",
            "delta_pct",
            "base_mean_ns",
            "new_mean_ns",
            "delta_mean_ns",
            "base_self_ns",
            "new_self_ns",
            "base_device_ns",
            "new_device_ns",
            "base_dur_ns",
            "new_dur_ns",
            "base_time_std_ns",
            "new_time_std_ns",
            "beyond_noise",
        ]
    ]


def _largest_first(out: pd.DataFrame) -> pd.DataFrame:
    """Regressions first (largest increase), then improvements (largest decrease last)."""
    return out.sort_values("delta_time_ns", ascending=False, kind="stable").reset_index(drop=True)


def _launcher(frame: pd.DataFrame) -> pd.Series:
    """The operator a kernel is grouped under: its launching host operator, else the vendor's op
    type (Ascend kernels often record no host launch, but always their type, e.g. ``Conv2D``)."""
    op = frame["op"].where(frame["op"] != "", frame["op_type"])
    return op.where(op != "", NO_OPERATOR)


def _kernel_rows(side: Side) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Per launching operator (:func:`_launcher`) and step: kernels and device time; and per
    operator its distinct kernel names (the first three, sorted)."""
    table = side.table("kernel_details")
    per_step = _step_sums(table, side, ["op", "op_type"], ["dur_ns"], "kernels")
    per_step = per_step.assign(op=_launcher(per_step)).groupby(["op", "step"], sort=False)[
        ["kernels", "dur_ns"]
    ]
    per_step = per_step.sum().reset_index()
    keys = ["op", "op_type", "name"]
    pairs = _in_steps_arrow(_keys(table, keys), side).group_by(keys).aggregate([])
    pairs = _plain_keys(pairs.to_pandas(), keys)
    pairs = pairs.assign(op=_launcher(pairs))[["op", "name"]].drop_duplicates().sort_values(["op", "name"])
    names = (
        pairs.groupby("op")
        .agg(distinct=("name", "size"), names=("name", lambda s: " | ".join(s.iloc[:3])))
        .reset_index()
    )
    return per_step, names


def kernels_by_operator(base: Side, new: Side) -> pd.DataFrame:
    """Device kernels grouped by the operator that launched them, per step: kernel launches and
    device time.  Why by operator: kernel names differ across hardware and libraries (a GEMM is
    ``ampere_sgemm_...`` on one card and ``MatMulV2`` on another); the operator is what both
    runs share.  ``names_differ`` says where the kernels themselves changed."""
    rows = [_kernel_rows(side) for side in (base, new)]
    stats = [
        per_step_stats(per_step, ["op"], ["kernels", "dur_ns"], side.step_count)
        for (per_step, _), side in zip(rows, (base, new), strict=True)
    ]
    out = align(
        *stats, ["op"], ["kernels", "dur_ns"], "dur_ns", (base.step_count, new.step_count), count="kernels"
    )
    for (_, names), side in zip(rows, ("base", "new"), strict=True):
        names = names.rename(
            columns={"distinct": f"{side}_distinct_kernels", "names": f"{side}_kernel_names"}
        )
        out = out.merge(names, on="op", how="left")
        out[f"{side}_distinct_kernels"] = out[f"{side}_distinct_kernels"].fillna(0).astype("int64")
        out[f"{side}_kernel_names"] = out[f"{side}_kernel_names"].fillna("")
    out["names_differ"] = (
        (out["base_kernel_names"] != out["new_kernel_names"])
        & (out["status"] != "added")
        & (out["status"] != "removed")
    )
    out = out.rename(
        columns={
            "base_dur_ns": "base_time_ns",
            "new_dur_ns": "new_time_ns",
            "delta_dur_ns": "delta_time_ns",
            "base_dur_ns_std": "base_time_std_ns",
            "new_dur_ns_std": "new_time_std_ns",
        }
    )
    return _largest_first(out)[
        [
            "op",
            "status",
            "base_kernels",
            "new_kernels",
            "delta_kernels",
            "base_time_ns",
            "new_time_ns",
            "delta_time_ns",
            "delta_pct",
            "base_time_std_ns",
            "new_time_std_ns",
            "beyond_noise",
            "base_distinct_kernels",
            "new_distinct_kernels",
            "base_kernel_names",
            "new_kernel_names",
            "names_differ",
        ]
    ]


def _communication_rows(side: Side) -> pd.DataFrame:
    """Per op family, group and step: calls, elapsed, transit and wait time, and bytes moved (the
    op's links summed)."""
    ops = side.table("communication_ops")
    links = side.table("communication_links")
    if {"op", "bytes"} <= set(links.column_names) and "op" in ops.column_names and links.num_rows:
        moved = links.group_by("op").aggregate([("bytes", "sum")]).rename_columns(["op", "bytes"])
        ops = ops.join(moved, "op", join_type="left outer")
    if ops.num_rows:
        collective = pc.fill_null(_text(ops, "collective"), "")
        family = pc.if_else(pc.equal(collective, ""), pc.fill_null(_text(ops, "name"), ""), collective)
        ops = ops.append_column("family", family)
    else:
        ops = ops.append_column("family", pa.array([], pa.string()))
    return _step_sums(
        ops, side, ["family", "group"], ["elapse_ns", "transit_ns", "wait_ns", "bytes"], "calls"
    )


def _regroup(base: pd.DataFrame, new: pd.DataFrame, values: list[str]) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Where a family's groups are named differently in the two runs (process-group names are
    hashes or counters of each run: Ascend's level0 writes ``Group 0`` where level1 writes a
    hash), align that family on its name alone; its group reads ``base groups -> new groups``."""
    names = [r.groupby("family")["group"].agg(lambda g: ",".join(sorted(set(g)))) for r in (base, new)]
    both = names[0].index.intersection(names[1].index)
    renamed = {f: f"{names[0][f]} -> {names[1][f]}" for f in both if names[0][f] != names[1][f]}
    if not renamed:
        return base, new
    out = []
    for r in (base, new):
        hit = r["family"].isin(list(renamed))
        r = r.assign(group=r["group"].where(~hit, r["family"].map(renamed)))
        out.append(r.groupby(["family", "group", "step"], sort=False)[values].sum().reset_index())
    return out[0], out[1]


def communication(base: Side, new: Side) -> pd.DataFrame:
    """Communication per op family (all_reduce, broadcast, send, ...) and group, per step: calls,
    elapsed time, wait, bytes moved, and bandwidth (bytes over transit time, GB/s = bytes/ns)."""
    values = ["calls", "elapse_ns", "transit_ns", "wait_ns", "bytes"]
    rows = _regroup(_communication_rows(base), _communication_rows(new), values)
    stats = [
        per_step_stats(r, ["family", "group"], values, side.step_count)
        for r, side in zip(rows, (base, new), strict=True)
    ]
    out = align(
        *stats, ["family", "group"], values, "elapse_ns", (base.step_count, new.step_count), count="calls"
    )
    for side in ("base", "new"):
        with np.errstate(divide="ignore", invalid="ignore"):
            transit = out[f"{side}_transit_ns_total"]
            moved = out[f"{side}_bytes_total"]  # no bytes recorded (gloo on CPU): unknown, not 0 GB/s
            out[f"{side}_bandwidth_gb_s"] = np.where((transit > 0) & (moved > 0), moved / transit, np.nan)
    out = out.rename(
        columns={
            "base_elapse_ns": "base_time_ns",
            "new_elapse_ns": "new_time_ns",
            "delta_elapse_ns": "delta_time_ns",
            "base_elapse_ns_std": "base_time_std_ns",
            "new_elapse_ns_std": "new_time_std_ns",
        }
    )
    return _largest_first(out)[
        [
            "family",
            "group",
            "status",
            "base_calls",
            "new_calls",
            "delta_calls",
            "base_time_ns",
            "new_time_ns",
            "delta_time_ns",
            "delta_pct",
            "base_time_std_ns",
            "new_time_std_ns",
            "beyond_noise",
            "base_wait_ns",
            "new_wait_ns",
            "base_bytes",
            "new_bytes",
            "base_bandwidth_gb_s",
            "new_bandwidth_gb_s",
        ]
    ]


__all__ = ["METRICS", "beyond_noise", "communication", "kernels_by_operator", "operators", "step_breakdown"]
