"""Write ``communication.json`` in the layout of Ascend's per-rank file (seed 003).

::

    {"step50": {"collective": {"hcom_allReduce__586_0_1@<group>": {
                   "Communication Time Info": {"Start Timestamp(us)", "Elapse Time(ms)", "Transit Time(ms)",
                       "Wait Time(ms)", "Synchronization Time(ms)", "Idle Time(ms)", "Wait Time Ratio",
                       "Synchronization Time Ratio"},
                   "Communication Bandwidth Info": {"RDMA"|"HCCS"|"PCIE"|"SDMA"|"SIO": {
                       "Transit Size(MB)", "Transit Time(ms)", "Bandwidth(GB/s)", "Large Packet Ratio",
                       "Size Distribution": {"<packet MB>": [count, transit ms]}}}},
                 ..., "Total Op Info": {...sums, without the start, bandwidth and ratio per link...}},
                "p2p": {...the same for send/receive ops...}}}

Units are Ascend's for this file: milliseconds, microseconds for the start, and *decimal*
megabytes (10^6 bytes: HCCL reports a 2,064,384-byte packet as ``2.064384``), unlike the binary MB
of Ascend's CSV files; ratios and bandwidths rounded to 4 decimals as Ascend does.  The numbers
come from :mod:`perfsight.analysis.communication`; this module only arranges them and converts
them with :mod:`perfsight.export.units`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from perfsight import columns
from perfsight.analysis import communication as comm_analysis
from perfsight.export.units import NS_PER_US, bytes_to_decimal_mb, ns_to_ms
from perfsight.model import NO_ID, Trace

P2P = ("send", "recv", "send_recv")
"""Collectives listed under ``p2p`` rather than ``collective``."""


def _time_info(row: dict[str, Any], with_start: bool) -> dict[str, Any]:
    info: dict[str, Any] = {"Start Timestamp(us)": row["start_ns"] / NS_PER_US} if with_start else {}
    info.update(
        {
            "Elapse Time(ms)": ns_to_ms(row["elapse_ns"]),
            "Transit Time(ms)": ns_to_ms(row["transit_ns"]),
            "Wait Time(ms)": ns_to_ms(row["wait_ns"]),
            "Synchronization Time(ms)": ns_to_ms(row["synchronization_ns"]),
            "Idle Time(ms)": ns_to_ms(row["idle_ns"]),
            "Wait Time Ratio": round(row["wait_ratio"], 4),
            "Synchronization Time Ratio": round(row["synchronization_ratio"], 4),
        }
    )
    return info


def _link_info(link: dict[str, Any], sizes: list[dict[str, Any]], total: bool) -> dict[str, Any]:
    distribution = {
        str(bytes_to_decimal_mb(s["packet_bytes"])): [s["count"], ns_to_ms(s["transit_ns"])] for s in sizes
    }
    if link["link"] == "SDMA":
        distribution = {}
    if total:
        return {
            "Transit Time(ms)": ns_to_ms(link["transit_ns"]),
            "Transit Size(MB)": bytes_to_decimal_mb(link["bytes"]),
            "Size Distribution": distribution,
        }
    return {
        "Transit Size(MB)": bytes_to_decimal_mb(link["bytes"]),
        "Transit Time(ms)": ns_to_ms(link["transit_ns"]),
        "Bandwidth(GB/s)": round(link["bandwidth_gb_s"], 4),
        "Large Packet Ratio": round(link["large_packet_ratio"], 4),
        "Size Distribution": distribution,
    }


def _op_names(trace: Trace, comm: pa.Table) -> list[str]:
    """``name@group`` of each op: its recorded name, else its slice's name."""
    names = comm.column("name").to_pylist()
    rows = columns.int64(comm.column("slice"), NO_ID)
    missing = [i for i, n in enumerate(names) if not n]  # ops without a recorded name only
    if missing and trace.slices.num_rows:
        valid = [i for i in missing if 0 <= rows[i] < trace.slices.num_rows]
        taken = trace.slices.column("name").take(pa.array(rows[valid])).cast(pa.string()).to_pylist()
        for i, name in zip(valid, taken, strict=True):
            names[i] = name
    groups = comm.column("group").to_pylist()
    return [f"{n or 'op'}@{g or ''}" for n, g in zip(names, groups, strict=True)]


def _total_sizes(sizes: pa.Table, ops: np.ndarray, link: str) -> list[dict[str, Any]]:
    """Packets of ``ops`` on ``link`` summed per packet size (for "Total Op Info")."""
    mine = sizes.filter(
        pa.array(
            np.isin(columns.int64(sizes.column("op")), ops)
            & (np.array(sizes.column("link").to_pylist()) == link)
        )
    )
    if mine.num_rows == 0:
        return []
    grouped = mine.group_by("packet_bytes", use_threads=False).aggregate(
        [("count", "sum"), ("transit_ns", "sum")]
    )
    return [
        {"packet_bytes": r["packet_bytes"], "count": r["count_sum"], "transit_ns": r["transit_ns_sum"]}
        for r in grouped.to_pylist()
    ]


def communication_json(trace: Trace, arrivals: pa.Table | None = None) -> dict[str, Any]:
    """The content of ``communication.json`` for one rank (see the module docstring).

    ``arrivals``: as in :func:`perfsight.analysis.communication.op_times`, indexed like
    ``primary_ops(trace.comm)``.
    """
    comm, tasks = comm_analysis.primary_ops(trace.comm, trace.comm_tasks)
    times = comm_analysis.op_times(comm, tasks, arrivals)
    links = comm_analysis.link_bandwidth(comm, tasks)
    size_table = comm_analysis.size_distribution(comm, tasks)
    sizes = size_table.to_pylist()
    keys = _op_names(trace, comm)
    kinds = np.where(
        np.isin(np.array(comm.column("collective").to_pylist(), dtype=object), P2P), "p2p", "collective"
    )
    steps = columns.int64(comm.column("step"), NO_ID)
    sizes_of: dict[tuple[int, str], list[dict[str, Any]]] = {}
    for s in sizes:  # grouped once; a handful of packet sizes per op and link
        sizes_of.setdefault((s["op"], s["link"]), []).append(s)
    link_rows = links.to_pylist()
    out: dict[str, Any] = {}
    for step in sorted(set(steps.tolist())):
        label = f"step{step}" if step != NO_ID else "step"
        out[label] = {"p2p": {}, "collective": {}}
        for kind in ("collective", "p2p"):
            ops = np.flatnonzero((steps == step) & (kinds == kind))
            if not ops.size:
                continue
            target = out[label][kind]
            for op in ops.tolist():  # one entry per op instance of the output
                bandwidth = {
                    r["link"]: _link_info(r, sizes_of.get((op, r["link"]), []), total=False)
                    for r in link_rows[
                        op * len(comm_analysis.LINK_TYPES) : (op + 1) * len(comm_analysis.LINK_TYPES)
                    ]
                }
                target[keys[op]] = {
                    "Communication Time Info": _time_info(times.slice(op, 1).to_pylist()[0], with_start=True),
                    "Communication Bandwidth Info": bandwidth,
                }
            chosen = pa.array(ops, pa.int64())
            total_time = comm_analysis.step_times(times.take(chosen)).to_pylist()[0]
            total_links = comm_analysis.step_links(
                links.filter(pa.array(np.isin(columns.int64(links.column("op")), ops)))
            )
            total_bandwidth = {
                r["link"]: _link_info(r, _total_sizes(size_table, ops, r["link"]), total=True)
                for r in total_links.to_pylist()
            }
            target["Total Op Info"] = {
                "Communication Time Info": _time_info(total_time, with_start=False),
                "Communication Bandwidth Info": total_bandwidth,
            }
    return out


def write_communication_json(path: str | Path, trace: Trace, arrivals: pa.Table | None = None) -> Path:
    """Write :func:`communication_json` of ``trace`` to ``path``; return the path."""
    path = Path(path)
    path.write_text(json.dumps(communication_json(trace, arrivals)), encoding="utf-8")
    return path
