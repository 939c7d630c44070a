"""``communication_matrix.json`` for a whole job (seed 003's layout, global ranks).

Layout: ``{"step<N>": {"collective": {KEY: {"<src>-<dst>": LINK}}, "p2p": {KEY: {...}}}}`` with
``KEY = "<op>-total@<group>"`` (all instances of that op kind in the group during the step, summed;
under ``p2p`` when ``perfsight.model.is_p2p`` says the op kind is point-to-point)
and ``LINK = {"Transport Type", "Transit Size(MB)", "Transit Time(ms)", "Bandwidth(GB/s)",
"Op Name"}``; MB = 10**6 bytes and GB/s = 10**9 bytes per second, as Ascend's own
``communication_matrix.json`` and ``communication.json`` count them (HCCL's 37,781,504-byte link
is 37.781504 MB there).  Values come from ``perfsight.cluster.matrix.matrix``; this module only
converts units.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pandas as pd
import pyarrow as pa

from perfsight import columns
from perfsight.model import is_p2p
from perfsight.units import NS_PER_MS, bytes_to_decimal_mb


def communication_matrix(totals: pd.DataFrame) -> dict[str, Any]:
    """The JSON document as a dict (see the module docstring)."""
    doc: dict[str, Any] = {}
    ordered = totals.sort_values(["step", "collective", "group", "src", "dst"])
    p2p = columns.numpy(is_p2p(pa.array(ordered["collective"].astype(str), pa.string())), null=False)
    for row, point_to_point in zip(ordered.itertuples(index=False), p2p.tolist(), strict=True):
        kind = "p2p" if point_to_point else "collective"
        step = doc.setdefault(f"step{int(row.step)}", {"collective": {}, "p2p": {}})
        entry = step[kind].setdefault(f"{row.collective}-total@{row.group}", {})
        entry[f"{int(row.src)}-{int(row.dst)}"] = {
            "Transport Type": row.link_type,
            "Transit Size(MB)": round(bytes_to_decimal_mb(float(row.bytes)), 6),
            "Transit Time(ms)": round(float(row.transit_ns) / NS_PER_MS, 6),
            "Bandwidth(GB/s)": round(float(row.bandwidth_bytes_per_s) / 1e9, 4),
            "Op Name": f"{row.collective}@{row.group}",
        }
    return doc


def write_communication_matrix(path: str | Path, totals: pd.DataFrame) -> Path:
    path = Path(path)
    path.write_bytes(orjson.dumps(communication_matrix(totals), option=orjson.OPT_INDENT_2))
    return path
