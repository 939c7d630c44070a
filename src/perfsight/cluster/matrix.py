"""The communication matrix: bytes, time, bandwidth and link type from each rank to each rank.

Point-to-point ops give their pair directly (sender -> receiver, the send's bytes and transit).
A collective is attributed to links by the logical pattern of the ring algorithm NCCL and gloo use
by default, over the group's members in rank order (member i sends to member i+1, the last to the
first), with the per-link traffic of the nccl-tests "bus bandwidth" formulas, S being the op's
input bytes on one rank and n the group size:

* ``all_reduce``: 2(n-1)/n * S per ring link;
* ``reduce_scatter``: (n-1)/n * S;  ``all_gather``: (n-1) * S (each rank's S is one chunk);
* ``broadcast``, ``reduce``: S on every ring link (a pipelined chain);
* ``all_to_all``: S/n from every member to every other member (direct, not a ring);
* ``barrier`` and zero-byte ops carry no traffic.

The time of a link is the sending rank's transit time of the op (``perfsight.cluster.op_time``:
its split by HCCL's tasks when the rank recorded them, else its elapse minus the time it waited for
the last rank to arrive), so bandwidth = bytes / transit.  Link type: ``LOCAL``
(a rank to itself), ``INTRA_HOST`` (both ranks report the same host), ``INTER_HOST`` (different
hosts), ``UNKNOWN`` (a host is not recorded).  This is a logical view: the physical route (NVLink,
PCIe, network) is not in Kineto traces.

Where a rank recorded the links themselves (Ascend's HCCL tasks name each transfer's destination
rank and link), its ops take those instead: bytes and transit per peer as Ascend's own
``communication_matrix.json`` counts them, and the link type is the transport (HCCS, PCIE, SIO,
RDMA, LOCAL).
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import pandas as pd
import pyarrow as pa

from perfsight.cluster.matching import Matched
from perfsight.cluster.rank import RankDigest

LINK_COLUMNS = ["step", "collective", "group", "instance", "src", "dst", "bytes", "transit_ns", "link_type"]


def links(matched: Matched, digests: Mapping[int, RankDigest]) -> pd.DataFrame:
    """One row per op instance and link it used: the links a rank recorded (see
    :func:`_recorded`), else the logical pattern of the module docstring."""
    recorded = _recorded(matched, digests)
    complete = matched.instances.loc[matched.instances["complete"], "instance"]
    ops = matched.ops.loc[matched.ops["instance"].isin(complete) & matched.ops["bytes"].notna()]
    if not recorded.empty:
        covered = pd.MultiIndex.from_frame(recorded[["src", "row"]].drop_duplicates())
        ops = ops.loc[~pd.MultiIndex.from_frame(ops[["rank", "row"]]).isin(covered)]
    parts = [_p2p(ops), _ring(ops), _all_to_all(ops)]
    out = (
        pd.concat([p for p in parts if not p.empty], ignore_index=True)
        if any(not p.empty for p in parts)
        else pd.DataFrame(columns=LINK_COLUMNS)
    )
    hosts = {rank: d.meta.host for rank, d in digests.items()}
    src_host = out["src"].map(hosts)
    dst_host = out["dst"].map(hosts)
    out["link_type"] = np.select(
        [out["src"] == out["dst"], src_host.isna() | dst_host.isna(), src_host == dst_host],
        ["LOCAL", "UNKNOWN", "INTRA_HOST"],
        "INTER_HOST",
    )
    if not recorded.empty:
        out = pd.concat([out[LINK_COLUMNS], recorded[LINK_COLUMNS]], ignore_index=True)
    return out[LINK_COLUMNS]


def _recorded(matched: Matched, digests: Mapping[int, RankDigest]) -> pd.DataFrame:
    """The links that ranks recorded themselves, op by op (Ascend's HCCL tasks name their peer:
    ``analysis.communication.peer_links``), with the op's step, collective, group and instance;
    ``link_type`` is the recorded transport (HCCS, PCIE, SIO, RDMA, LOCAL), ``row`` the op's row
    in its rank's comm table.  Why: measured per-link bytes and transit beat any estimate -- the
    ring estimate of an 8-rank HCCS all-reduce is the op's bytes over the op's transit, 7x the
    vendor's per-link 15-17 GB/s."""
    parts = [d.tables.get("communication_peers") for d in digests.values()]
    parts = [p for p in parts if p is not None and p.num_rows]
    if not parts:
        return pd.DataFrame(columns=[*LINK_COLUMNS, "row"])
    peers = pa.concat_tables(parts).to_pandas()
    keys = matched.ops[["rank", "row", "collective", "group", "instance"]]
    joined = peers.merge(keys, left_on=["src", "comm_row"], right_on=["rank", "row"], how="inner")
    return pd.DataFrame(
        {
            "step": joined["step"],
            "collective": joined["collective"],
            "group": joined["group"],
            "instance": joined["instance"],
            "src": joined["src"].astype("int64"),
            "dst": joined["dst"].astype("int64"),
            "bytes": joined["bytes"].astype("float64"),
            "transit_ns": joined["transit_ns"],
            "link_type": joined["transport"],
            "row": joined["row"],
        }
    )


def _p2p(ops: pd.DataFrame) -> pd.DataFrame:
    sends = ops.loc[ops["collective"] == "send"]
    return pd.DataFrame(
        {
            "step": sends["step"],
            "collective": "send",
            "group": sends["group"],
            "instance": sends["instance"],
            "src": sends["src"].astype("int64"),
            "dst": sends["dst"].astype("int64"),
            "bytes": sends["bytes"].astype("float64"),
            "transit_ns": sends["transit_ns"],
        }
    )


_RING_FACTOR = {
    "all_reduce": lambda n: 2.0 * (n - 1) / n,
    "reduce_scatter": lambda n: (n - 1) / n,
    "all_gather": lambda n: float(n - 1),
    "broadcast": lambda n: 1.0,
    "reduce": lambda n: 1.0,
}


def _ring(ops: pd.DataFrame) -> pd.DataFrame:
    ring = ops.loc[ops["collective"].isin(list(_RING_FACTOR)) & ops["members"].map(len).gt(1)]
    if ring.empty:
        return pd.DataFrame(columns=LINK_COLUMNS)
    next_rank = {}
    for group, members in ring.drop_duplicates("group")[["group", "members"]].itertuples(index=False):
        ordered = sorted(members)  # one loop per group, not per op
        next_rank[group] = dict(zip(ordered, ordered[1:] + ordered[:1], strict=True))
    nxt = np.array(
        [next_rank[g].get(r, -1) for g, r in zip(ring["group"], ring["rank"], strict=True)], dtype=np.int64
    )
    n = ring["members"].map(len).to_numpy()
    factor = np.array([_RING_FACTOR[c](k) for c, k in zip(ring["collective"], n, strict=True)])
    keep = nxt >= 0
    return pd.DataFrame(
        {
            "step": ring["step"].to_numpy()[keep],
            "collective": ring["collective"].to_numpy()[keep],
            "group": ring["group"].to_numpy()[keep],
            "instance": ring["instance"].to_numpy()[keep],
            "src": ring["rank"].to_numpy()[keep],
            "dst": nxt[keep],
            "bytes": (ring["bytes"].to_numpy() * factor)[keep],
            "transit_ns": ring["transit_ns"].to_numpy()[keep],
        }
    )


def _all_to_all(ops: pd.DataFrame) -> pd.DataFrame:
    a2a = ops.loc[ops["collective"] == "all_to_all"]
    if a2a.empty:
        return pd.DataFrame(columns=LINK_COLUMNS)
    exploded = a2a.assign(dst=a2a["members"].map(list)).explode("dst")
    exploded = exploded.loc[exploded["dst"] != exploded["rank"]]
    n = exploded["members"].map(len)
    return pd.DataFrame(
        {
            "step": exploded["step"],
            "collective": "all_to_all",
            "group": exploded["group"],
            "instance": exploded["instance"],
            "src": exploded["rank"],
            "dst": exploded["dst"].astype("int64"),
            "bytes": exploded["bytes"] / n,
            "transit_ns": exploded["transit_ns"],
        }
    )


def matrix(link_rows: pd.DataFrame) -> pd.DataFrame:
    """Totals per (step, collective, group, src, dst): bytes, transit time, bandwidth, link type, ops."""
    if link_rows.empty:
        return pd.DataFrame(
            columns=["step", "collective", "group", "src", "dst", "link_type", "bytes", "transit_ns", "ops"]
            + ["bandwidth_bytes_per_s"]
        )
    keys = ["step", "collective", "group", "src", "dst", "link_type"]
    out = link_rows.groupby(keys, as_index=False).agg(
        bytes=("bytes", "sum"), transit_ns=("transit_ns", "sum"), ops=("instance", "nunique")
    )
    out["bandwidth_bytes_per_s"] = np.where(
        out["transit_ns"] > 0, out["bytes"] / (out["transit_ns"] / 1e9), 0.0
    )
    return out
