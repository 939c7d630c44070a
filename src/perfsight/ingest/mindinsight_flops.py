"""MindSpore's FLOPs files of a legacy ``profiler/`` folder, read as MindInsight reads them.

MindSpore's ``FlopsParser`` writes, per device ``n``:

* ``flops_{n}.txt``: a CSV, header ``op_full_name, MFLOPs(10^6), GFLOPS(10^9), FLOPS utilization(%)``,
  then one line per AI Core op (its FLOPs per run, its FLOPS over its average time, that over the
  device peak);
* ``flops_summary_{n}.json``: ``{"FLOPs": sum of the ops' MFLOPs, "FLOPS": mean of their GFLOPS,
  "FLOPS_Utilization": mean over the steps, %}``, each rounded to 3 decimals -- what MindInsight's
  FLOPs page shows (it reads only this file and ``flops_scope_{n}.json``).

So the summary is the JSON when present, else computed from the per-op lines the same way (sum,
mean; the utilisation needs the per-step times MindSpore kept, so it is left out then).  Older
files of ``name: value`` lines are still read as a summary.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from perfsight import columns
from perfsight.ingest import ascend_files as files
from perfsight.ingest.mindinsight_legacy import numbers_of

FLOPS_OP_SCHEMA = pa.schema(
    [
        pa.field("op", pa.string()),
        pa.field("flops", pa.float64()),  # FLOP per run of the op
        pa.field("flops_per_s", pa.float64()),
        pa.field("utilization_pct", pa.float64()),
    ]
)
"""One row per op of ``flops_{n}.txt``, in FLOP and FLOP/s (perfsight's units)."""

HEADER = "op_full_name"
SUMMARY_KEYS = {"FLOPs": "MFLOPs", "FLOPS": "GFLOPS", "FLOPS_Utilization": "FLOPS utilization %"}
"""``flops_summary_{n}.json``'s keys and the units MindInsight shows them in."""


def read_flops(folder: Path, index: int, problems: files.FileProblems) -> tuple[pa.Table, dict[str, float]]:
    """(per-op FLOPs, MindInsight's summary) of device ``index`` in ``folder``; empty when absent."""
    path = folder / f"flops_{index}.txt"
    summary_file = folder / f"flops_summary_{index}.json"
    ops = FLOPS_OP_SCHEMA.empty_table()
    summary: dict[str, float] = {}
    if path.is_file():
        with path.open("rb") as handle:
            first = handle.readline().decode("utf-8-sig", errors="replace").strip()
        if first.startswith(HEADER):
            ops = _per_op(path, problems)
            if ops.num_rows:
                mflops = columns.numpy(ops.column("flops"), null=np.nan) / 1e6
                gflops = columns.numpy(ops.column("flops_per_s"), null=np.nan) / 1e9
                summary = {
                    "FLOPs": round(float(np.nansum(mflops)), 3),
                    "FLOPS": round(float(np.nanmean(gflops)), 3),
                }
        else:
            summary = _key_values(path, problems)
    if summary_file.is_file():
        doc = files.read_json(summary_file, problems)
        given = {k: float(v) for k, v in doc.items() if k in SUMMARY_KEYS and isinstance(v, (int, float))}
        summary.update(given)
    return ops, summary


def _per_op(path: Path, problems: files.FileProblems) -> pa.Table:
    """The per-op lines; a line that is not ``name, number, number, number`` is skipped with a count."""
    table = files.read_csv(path, problems)
    names = table.column_names
    if table.num_rows == 0 or len(names) < 4:
        if table.num_rows:
            problems.add(path, "has fewer than 4 columns (op, MFLOPs, GFLOPS, utilization)")
        return FLOPS_OP_SCHEMA.empty_table()
    numbers = [numbers_of(table.column(c)) for c in names[1:4]]
    good = ~np.isnan(numbers[0])
    if not good.all():
        problems.add(path, f"{int((~good).sum())} line(s) without a number of MFLOPs skipped")
    return pa.table(
        {
            "op": pc.utf8_trim_whitespace(pc.cast(table.column(names[0]), pa.string())).filter(good),
            "flops": pa.array(numbers[0][good] * 1e6),
            "flops_per_s": pa.array(numbers[1][good] * 1e9),
            "utilization_pct": pa.array(numbers[2][good]),
        },
        schema=FLOPS_OP_SCHEMA,
    )


def _key_values(path: Path, problems: files.FileProblems) -> dict[str, float]:
    """An older summary of ``name: value`` (or ``name,value``) lines."""
    out = {}
    for line in path.read_text(errors="replace").splitlines():  # a few summary lines
        match = re.match(r"^\s*([^,:=]+?)\s*[,:=]\s*([-+0-9.eE]+)\s*$", line)
        if match:
            out[match.group(1)] = float(match.group(2))
        elif line.strip():
            problems.add(path, f"line not understood: {line[:60]!r}")
    return out


def summary_text(summary: dict[str, float]) -> str:
    """MindInsight's FLOPs summary in its units, e.g. ``8,167.743 MFLOPs, 9,868.936 GFLOPS``."""
    return ", ".join(f"{summary[k]:,.3f} {unit}" for k, unit in SUMMARY_KEYS.items() if k in summary)
