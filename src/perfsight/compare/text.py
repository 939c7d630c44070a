"""The printed summary of ``perfsight compare``: the biggest real regressions first.

Only selection and formatting: the ranking and the noise verdicts come from
:mod:`perfsight.compare.result`.  Names from traces are printed as plain text.
"""

from __future__ import annotations

import math
from typing import Any

from perfsight import units
from perfsight.compare.inputs import Side
from perfsight.compare.result import Comparison, records, top_improvements, top_regressions
from perfsight.terminal import printable_line

METRIC_LABELS = {
    "step_ns": "step time",
    "iteration_interval_ns": "iteration gap",
    "fp_bp_ns": "forward+backward",
    "tail_ns": "tail",
    "computing_ns": "computing",
    "communication_not_overlapped_ns": "communication not overlapped",
    "overlapped_ns": "communication overlapped",
    "free_ns": "free",
    "host_wait_ns": "free, waiting for the host",
    "preparing_ns": "preparing",
    "communication_ns": "communication (all ops)",
    "communication_wait_ns": "communication wait",
    "data_wait_ns": "data wait",
    "flops": "FLOPs",
    "mfu": "MFU",
    "peak_allocated_bytes": "peak memory allocated",
    "peak_reserved_bytes": "peak memory reserved",
}
"""How each step-breakdown metric is named for people (the UI has the same words in its i18n)."""


def _value(value: Any, unit: str) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    if unit == "ns":
        return f"{units.ms_text(value)} ms"
    if unit == "bytes":
        return units.bytes_text(int(value))
    if unit == "flop":
        return units.flop_text(abs(value)) if value >= 0 else "-" + units.flop_text(-value)
    if unit == "ratio":
        return f"{100 * value:.1f} %"
    return f"{value:g}"


def _signed(value: Any, unit: str) -> str:
    text = _value(value, unit)
    return text if text == "-" or text.startswith("-") else "+" + text


def verdict_text(beyond: Any) -> str:
    """The noise verdict in words: a user must see "noise" before chasing a difference."""
    if beyond is None:
        return "noise unknown (one step)"
    return "beyond noise" if beyond else "within noise"


def _steps_text(side: Side) -> str:
    if not side.steps_used:
        return "no steps: the whole window"
    used = side.steps_used
    run = len(used) > 1 and used == list(range(used[0], used[-1] + 1))
    span = f"{used[0]}-{used[-1]}" if run else ", ".join(map(str, used))
    return f"{len(used)} of {len(side.steps_all)} step(s) averaged ({span})"


def _item(row: Any) -> str:
    if row["table"] == "step_breakdown":
        return f"{row['category']}: {METRIC_LABELS.get(row['item'], row['item'])}"
    detail = f" {row['detail']}" if row["detail"] else ""
    return f"{row['category']}: {row['item']}{detail}"


def format_text(comparison: Comparison, limit: int = 10) -> str:
    """The summary: the two sides, the step time, the real regressions, the breakdown, the counts."""
    c = comparison
    lines = [
        f"BASE  {c.base.spec} (rank {c.base.rank}): {_steps_text(c.base)}",
        f"NEW   {c.new.spec} (rank {c.new.rank}): {_steps_text(c.new)}",
        "",
    ]
    step = c.step_metric("step_ns")
    if step is not None:
        lines.append(
            f"Step time: {_value(step['base'], 'ns')} -> {_value(step['new'], 'ns')} "
            f"({_signed(step['delta'], 'ns')}{_pct(step['delta_pct'])}, {verdict_text(step['beyond_noise'])})"
        )
    regressions = top_regressions(c, limit)
    lines.append("")
    lines.append(
        "Biggest regressions beyond noise (per step):" if len(regressions) else "No regression beyond noise."
    )
    for position, row in enumerate(records(regressions), 1):
        why = "beyond noise" if row["beyond_noise"] is True else "count changed" if row["structural"] else ""
        lines.append(
            f"  {position:>2}. {_item(row)}: {_signed(row['delta_ns'], 'ns')}{_pct(row['delta_pct'])} "
            f"[{row['status']}, {why}]"
        )
    improvements = top_improvements(c)
    if len(improvements):
        lines.append("Biggest improvements beyond noise (per step):")
        for row in records(improvements):
            lines.append(f"      {_item(row)}: {_signed(row['delta_ns'], 'ns')}{_pct(row['delta_pct'])}")
    lines += ["", "Step breakdown (mean per step)       BASE            NEW          delta  verdict"]
    for row in records(c.step_breakdown):
        lines.append(
            f"  {METRIC_LABELS.get(row['metric'], row['metric']):<32} {_value(row['base'], row['unit']):>14} "
            f"{_value(row['new'], row['unit']):>14} {_signed(row['delta'], row['unit']):>14}  "
            f"{verdict_text(row['beyond_noise']) if row['metric'] not in _NO_SPREAD else ''}"
        )
    lines.append("")
    for name, label in (
        ("operators", "Operators"),
        ("kernels_by_operator", "Kernels by operator"),
        ("communication", "Communication"),
    ):
        counts = c.table(name)["status"].value_counts()
        lines.append(
            f"{label}: "
            + ", ".join(f"{int(counts.get(s, 0))} {s}" for s in ("added", "removed", "changed", "same"))
        )
    if c.notes:
        lines.append("")
        lines += [f"note: {n}" for n in c.notes]
    return "".join(printable_line(line) + "\n" for line in lines)


def _pct(value: Any) -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return ""
    return f", {value:+.1f} %"


_NO_SPREAD = {"peak_allocated_bytes", "peak_reserved_bytes"}
"""One value per run: no step-to-step spread to judge them by."""
