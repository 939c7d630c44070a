"""Turn analysis tables into the summary ``perfsight analyse`` prints (text or JSON).

Only selection and unit conversion for display happen here; every number is
taken from an analysis table.  Names from traces are printed as plain text.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa

from perfsight import advisor, memory_budget, units
from perfsight.advisor.text import lead_lines
from perfsight.analysis.step_trace import duration_spread
from perfsight.pipeline import RankResult
from perfsight.terminal import printable_line

TOP_OPERATORS = 10
SHARES_SHOWN = ("computing", "communication_not_overlapped", "free", "preparing")
"""The rows of ``time_shares`` the summary prints (overlapped communication is inside computing)."""
_STEP_BREAKDOWN = (
    "computing_ns",
    "communication_not_overlapped_ns",
    "free_ns",
    "preparing_ns",
    "overlapped_ns",
    "communication_ns",
)


def _rows(table: pa.Table, columns: list[str]) -> list[dict[str, Any]]:
    present = [c for c in columns if c in table.column_names]
    return table.select(present).to_pylist()


def rank_summary(result: RankResult) -> dict[str, Any]:
    """Everything a user reads first about one rank, as plain JSON-able values (ns, bytes)."""
    t = result.tables
    overlap = t["overlap_breakdown"]
    steps = _rows(
        t["step_trace"],
        ["step", "duration_ns", "iteration_interval_ns", "fp_bp_ns", "tail_ns", "fp_op", "bp_op", "timeline"],
    )
    by_step = {row["step"]: row for row in _rows(overlap, ["step", *_STEP_BREAKDOWN])}
    for row in steps:
        row.update({k: v for k, v in by_step.get(row["step"], {}).items() if k != "step"})
    fractions = {row["share"]: row["fraction"] for row in _rows(t["time_shares"], ["share", "fraction"])}
    shares = {name: fractions[name] for name in SHARES_SHOWN if name in fractions}  # none: unknown
    ranking = t["operator_ranking"]
    top_by = ranking.column("ranked_by")[0].as_py() if ranking.num_rows else "host_self_ns"
    peaks = _rows(
        t["memory_peaks"], ["device_type", "device_index", "peak_allocated_bytes", "peak_reserved_bytes"]
    )
    flops_rows = _rows(t["flops_by_step"], ["step", "flops", "flops_per_s", "mfu"])
    meta = result.trace.meta
    return {
        "rank": meta.rank,
        "world_size": meta.world_size,
        "devices": [d.name for d in meta.devices],
        "steps": steps,
        "time_shares": shares,
        "top_operators_by": top_by,
        "top_operators": _rows(
            ranking.slice(0, TOP_OPERATORS), ["name", "count", "host_self_ns", "device_total_ns", "flops"]
        ),
        "memory_peaks": peaks,
        "flops": flops_rows,
        "output_dir": str(result.output_dir) if result.output_dir else None,
        **({"bounded": result.bounded} if result.bounded else {}),
        "warnings": [*meta.warnings, *result.warnings],
        "findings": result.findings
        if result.findings is not None
        else advisor.rank_findings(t, result.trace),
    }


_STEP_COLUMNS = (
    "duration_ns",
    "iteration_interval_ns",
    "fp_bp_ns",
    "tail_ns",
    "computing_ns",
    "communication_not_overlapped_ns",
    "free_ns",
)


def _device(device_type: str, index: int) -> str:
    return device_type if index < 0 else f"{device_type}:{index}"


def _flops_line(rows: list[dict[str, Any]]) -> str:
    known = [r for r in rows if r.get("flops") is not None]
    if not known:
        return "FLOPs: unknown (no input shapes in the trace; profile with record_shapes=True)"
    total = sum(r["flops"] for r in known)
    mfu = [r["mfu"] for r in known if r.get("mfu") is not None]
    text = f"FLOPs: {units.flop_text(total)} over {len(known)} steps"
    return text + (f", MFU {sum(mfu) / len(mfu):.1%}" if mfu else ", MFU unknown (device peak not known)")


STEP_LINES = 20
"""Most steps the text summary lists one a line.  A long run (a 10 GB trace holds 24,000 steps)
lists its slowest steps instead, in step order, after one line of the spread of all of them:
what a reader acts on is the outliers, and every step is in ``step_trace_time.csv`` and in
``--json``."""


def _steps_shown(steps: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Every step, or the :data:`STEP_LINES` slowest by total time, in step order."""
    if len(steps) <= STEP_LINES:
        return steps
    slowest = sorted(range(len(steps)), key=lambda i: -(steps[i].get("duration_ns") or 0))[:STEP_LINES]
    return [steps[i] for i in sorted(slowest)]


def _step_spread(steps: list[dict[str, Any]], shown: int) -> str:
    """One line: how many steps, the median, 90th percentile and largest total time."""
    totals = np.array([row["duration_ns"] for row in steps if row.get("duration_ns") is not None], np.int64)
    if not len(totals):
        return f"{len(steps)} steps; the first {shown} below (all in step_trace_time.csv)"
    spread = {name: units.ms_text(ns) for name, ns in duration_spread(totals).items()}
    return (
        f"{len(steps)} steps: total median {spread['median_ns']} ms, p90 {spread['p90_ns']} ms,"
        f" max {spread['max_ns']} ms; the {shown} slowest below (all in step_trace_time.csv)"
    )


def format_text(summaries: list[dict[str, Any]]) -> str:
    """A readable report: per-step breakdown, where time goes, top operators, memory peak."""
    lines: list[str] = []
    for s in summaries:
        lines.append(
            f"== rank {s['rank']} of {s['world_size']}"
            + (f" on {', '.join(sorted(set(s['devices'])))}" if s["devices"] else "")
        )
        lines += lead_lines(s.get("findings", []))  # the advisor's top findings lead
        shown = _steps_shown(s["steps"])
        if len(shown) < len(s["steps"]):
            lines.append(_step_spread(s["steps"], len(shown)))
        lines.append(
            "step     total(ms)  gap(ms)  fwd+bwd(ms)  tail(ms)  compute(ms)  comm-exposed(ms)  free(ms)"
        )
        for row in shown:
            cells = [units.ms_text(row.get(column)) for column in _STEP_COLUMNS]
            lines.append(
                f"{row['step']:<8} {cells[0]:>9} {cells[1]:>8} {cells[2]:>12} {cells[3]:>9} {cells[4]:>12} "
                f"{cells[5]:>17} {cells[6]:>9}"
            )
        shares = s["time_shares"]
        lines.append(
            "where the time goes: "
            + (
                ", ".join(f"{label.replace('_', ' ')} {share:.1%}" for label, share in shares.items())
                or "unknown"
            )
        )
        lines.append(f"top operators (by {s['top_operators_by'].replace('_ns', '').replace('_', ' ')}):")
        on_device = s["top_operators_by"] == "device_total_ns"
        for op in s["top_operators"]:
            host = units.ms_text(op["host_self_ns"])
            line = f"  {op['name'][:60]:<60} x{op['count']:<6} host self {host} ms"
            lines.append(line + (f"  device {units.ms_text(op['device_total_ns'])} ms" if on_device else ""))
        for peak in s["memory_peaks"]:
            allocated = units.bytes_text(peak["peak_allocated_bytes"])
            reserved = units.bytes_text(peak["peak_reserved_bytes"])
            device = _device(peak["device_type"], peak["device_index"])
            lines.append(f"memory peak {device}: allocated {allocated}, reserved {reserved}")
        if not s["memory_peaks"]:
            lines.append("memory peak: no allocator events in the trace (profile_memory=False?)")
        lines.append(_flops_line(s["flops"]))
        for warning in s["warnings"]:
            lines.append(f"warning: {warning}")
        if s["output_dir"]:
            lines.append(f"outputs: {s['output_dir']}")
        if s.get("bounded"):
            bounded = s["bounded"]
            least = memory_budget.least_bytes()
            below = bounded["memory_limit_bytes"] < least
            lines.append(
                f"memory limit {units.bytes_text(bounded['memory_limit_bytes'])}: analysed in "
                f"{bounded['chunks']} chunks of whole steps, spilled to disk and merged "
                "(the same outputs as in one piece)"
                + (
                    f"; below the least it needs (about {units.bytes_text(least)}), so the smallest chunks"
                    if below
                    else ""
                )
            )
        lines.append("")
    return "\n".join(printable_line(line) for line in lines)  # names are data (perfsight.terminal)
