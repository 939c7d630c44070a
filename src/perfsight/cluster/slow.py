"""Slow ranks, slow links, pipeline imbalance, and per-rank memory and FLOPs.

Slow rank -- the rank the others wait for.  For every complete collective instance, each rank's
*lateness* is its aligned arrival (execution start) minus the instance's median arrival; each
instance also votes for the rank that arrived last.  A rank's lateness is the median over its
instances (robust to a few stalls).  A rank is slow when its lateness exceeds
``max(Z * 1.4826 * MAD, MIN_SHARE * median step time)`` above the ranks' median lateness (MAD:
median absolute deviation over ranks; the step-time floor keeps a two-rank job, whose MAD says
nothing, and jitter of microseconds from being called slow; with fewer than ``MIN_RANKS_FOR_MAD``
ranks only the floor applies).  Its *magnitude* is how much longer its compute (``computing_ns``
per averaged step) is than the median of the *other* ranks, in percent (with two ranks: than the
other rank); its *delay* is the lateness as a share of the median step time.

Slow link -- bandwidth outliers among links of the same link type and size bucket (a power of two
of the bytes per transfer): a link whose bandwidth is below the bucket median by more than
``Z * 1.4826 * MAD`` and by at least ``LINK_MIN_DROP``, in a bucket of at least ``MIN_LINKS`` links.
In a bucket of fewer than ``MIN_RANKS_FOR_MAD`` links the MAD says little (one slow link of four
drags the median and the MAD with it), so there a link is also slow when it runs at
``SMALL_BUCKET_SHARE`` or less of the median bandwidth of the *other* links of its bucket.

Pipeline -- per stage: compute per step (mean over its ranks), bubble, receive waits and FLOPs;
``spread`` = (max - min) / max of stage compute; the pipeline is imbalanced when the spread is at
least ``IMBALANCE``, or when the stage with the most compute also has the most FLOPs by that much
(counted FLOPs corroborate a timing blurred by a busy host: the advisor's ``stage_imbalance`` rule).
Memory -- peak allocated vs the device's capacity when the trace records it.
FLOPs -- per rank over averaged steps, normalised by the largest.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import numpy as np
import pandas as pd

from perfsight.analysis.stage_balance import flops_corroborate
from perfsight.cluster.matching import Matched
from perfsight.cluster.rank import RankDigest, concat

Z = 3.5
MAD_SCALE = 1.4826  # MAD * this estimates the standard deviation of normal data
MIN_SHARE = 0.05
LINK_MIN_DROP = 0.3
MIN_LINKS = 3
SMALL_BUCKET_SHARE = 0.25
"""Why a quarter: a balanced 4-rank gloo DDP job on a 2-core machine had one loopback link at 0.48
of the others' median (contention, not a link); the rate-limited link of the slow-link scenario
ran at 1/57 of it."""
IMBALANCE = 0.2
MIN_RANKS_FOR_MAD = 5  # below this the MAD of lateness says nothing; the step-time floor alone decides


@dataclasses.dataclass
class SlowRanks:
    table: (
        pd.DataFrame
    )  # rank, lateness_ns, last_votes, instances, compute_ns, magnitude_pct, delay_pct, slow
    threshold_ns: float

    @property
    def slow(self) -> pd.DataFrame:
        return self.table.loc[self.table["slow"]].sort_values("lateness_ns", ascending=False)


def slow_ranks(matched: Matched, rank_avgs: pd.DataFrame) -> SlowRanks:
    """Lateness, votes and magnitude of every rank (see the module docstring)."""
    complete = matched.instances.loc[matched.instances["complete"] & ~matched.instances["is_p2p"], "instance"]
    ops = matched.ops.loc[
        matched.ops["instance"].isin(complete), ["rank", "instance", "start_ns", "last_rank"]
    ]
    late = ops["start_ns"] - ops.groupby("instance")["start_ns"].transform("median")
    per_rank = pd.DataFrame(
        {
            "lateness_ns": late.groupby(ops["rank"]).median(),
            "instances": ops.groupby("rank")["instance"].nunique(),
        }
    )
    votes = ops.drop_duplicates("instance")["last_rank"].value_counts()
    table = rank_avgs[["rank", "computing_ns", "duration_ns"]].set_index("rank").join(per_rank, how="left")
    table["last_votes"] = votes.reindex(table.index).fillna(0).astype("int64")
    table["instances"] = table["instances"].fillna(0).astype("int64")
    step_ns = float(table["duration_ns"].median() or 0)
    others = _median_of_others(table["computing_ns"].to_numpy(np.float64))
    with np.errstate(divide="ignore", invalid="ignore"):
        table["magnitude_pct"] = np.where(others > 0, (table["computing_ns"] / others - 1.0) * 100, np.nan)
    lateness = table["lateness_ns"]
    centre = lateness.median()
    mad = (lateness - centre).abs().median()
    spread = Z * MAD_SCALE * mad if np.isfinite(mad) and lateness.count() >= MIN_RANKS_FOR_MAD else 0.0
    threshold = max(spread, MIN_SHARE * step_ns)
    table["delay_pct"] = lateness / step_ns * 100 if step_ns else np.nan
    table["slow"] = (lateness - centre > threshold).fillna(False) & (table["instances"] > 0)
    table = table.rename(columns={"computing_ns": "compute_ns"}).reset_index()
    return SlowRanks(table, float(threshold))


def _median_of_others(values: np.ndarray) -> np.ndarray:
    """For each element, the median of all the *other* elements (vectorised: one sort)."""
    n = len(values)
    if n < 2:
        return np.full(n, np.nan)
    order = np.argsort(values, kind="stable")
    ranked = values[order]
    position = np.empty(n, np.int64)
    position[order] = np.arange(n)
    lo, hi = (n - 2) // 2, (n - 1) // 2  # middle indices of the n-1 others

    def reduced(k: int) -> np.ndarray:  # the k-th of the others: skip this element's own slot
        return np.where(k < position, ranked[k], ranked[min(k + 1, n - 1)])

    return (reduced(lo) + reduced(hi)) / 2.0


def slow_links(link_rows: pd.DataFrame) -> pd.DataFrame:
    """Per (src, dst, link type, size bucket): bandwidth, the bucket median, and ``slow``."""
    rows = link_rows.loc[
        (link_rows["bytes"] > 0) & (link_rows["transit_ns"] > 0) & (link_rows["src"] != link_rows["dst"])
    ]
    if rows.empty:
        return pd.DataFrame(
            columns=[
                "src",
                "dst",
                "link_type",
                "size_bucket",
                "bytes",
                "transit_ns",
                "bandwidth",
                "median",
                "slow",
            ]
        )
    rows = rows.assign(size_bucket=np.floor(np.log2(rows["bytes"].astype("float64"))).astype("int64"))
    per_link = rows.groupby(["src", "dst", "link_type", "size_bucket"], as_index=False).agg(
        bytes=("bytes", "sum"), transit_ns=("transit_ns", "sum")
    )
    per_link["bandwidth"] = per_link["bytes"] / (per_link["transit_ns"] / 1e9)
    bucket = per_link.groupby(["link_type", "size_bucket"])["bandwidth"]
    per_link["median"] = bucket.transform("median")
    mad = (
        (per_link["bandwidth"] - per_link["median"])
        .abs()
        .groupby([per_link["link_type"], per_link["size_bucket"]])
        .transform("median")
    )
    size = bucket.transform("size")
    drop = per_link["median"] - per_link["bandwidth"]
    others = bucket.transform(lambda b: pd.Series(_median_of_others(b.to_numpy(np.float64)), index=b.index))
    far_below_others = (size < MIN_RANKS_FOR_MAD) & (per_link["bandwidth"] <= SMALL_BUCKET_SHARE * others)
    per_link["slow"] = (
        (size >= MIN_LINKS)
        & ((drop > Z * MAD_SCALE * mad) | far_below_others)
        & (drop >= LINK_MIN_DROP * per_link["median"])
    )
    return per_link


def pipeline_balance(stage_avgs: pd.DataFrame, flops_by_stage: Mapping[int, float]) -> dict[str, Any]:
    """Stage compute spread, bubble ratio per stage, FLOPs per stage; ``imbalanced`` flag."""
    if len(stage_avgs) < 2:
        return {"stages": len(stage_avgs), "imbalanced": False}
    compute = stage_avgs.set_index("stage")["computing_ns"].astype("float64")
    spread = float((compute.max() - compute.min()) / compute.max()) if compute.max() > 0 else 0.0
    stage_ns = stage_avgs.set_index("stage")["stage_ns"].astype("float64")
    bubble = stage_avgs.set_index("stage")["bubble_ns"].astype("float64")
    flops = pd.DataFrame(
        {"flops": [float(flops_by_stage.get(int(s), 0.0)) for s in compute.index]}, compute.index
    )
    partitioned_unequally = flops_corroborate(flops, int(compute.idxmax()), IMBALANCE)
    return {
        "stages": int(len(stage_avgs)),
        "spread": spread,
        "imbalanced": spread >= IMBALANCE or partitioned_unequally,
        "slowest_stage": int(compute.idxmax()),
        "per_stage": [
            {
                "stage": int(s),
                "compute_ns": int(compute[s]),
                "stage_ns": int(stage_ns[s]),
                "bubble_ns": int(bubble[s]),
                "bubble_ratio": float(bubble[s] / stage_ns[s]) if stage_ns[s] else 0.0,
                "receive_ns": int(stage_avgs.set_index("stage").loc[s, "receive_not_overlapped_ns"]),
                "flops": float(flops_by_stage.get(int(s), 0.0)),
            }
            for s in compute.index
        ],
    }


def resources(digests: Mapping[int, RankDigest], averaged: pd.DataFrame) -> pd.DataFrame:
    """Per rank: host, peak allocated/reserved bytes, device capacity, peak share, FLOPs, FLOPs / max."""
    ordered = [digests[r] for r in sorted(digests)]
    used = averaged.loc[averaged["averaged"], ["rank", "step"]]
    flops = concat(ordered, "flops_by_step").select(["rank", "step", "flops"]).to_pandas()
    flops = flops.merge(used, on=["rank", "step"])
    peaks = concat(ordered, "memory_peaks").to_pandas()
    if not peaks.empty:  # a device's peak when the rank has a device, else the host's
        peaks["is_device"] = peaks["device_type"].astype(str) != "cpu"
        has_device = peaks.groupby("rank")["is_device"].transform("any")
        peaks = peaks.loc[peaks["is_device"] | ~has_device]
    peak = (
        peaks.groupby("rank")["peak_allocated_bytes"].max() if not peaks.empty else pd.Series(dtype="int64")
    )
    rows = [
        {
            "rank": d.rank,
            "host": d.meta.host,
            "capacity_bytes": next((x.memory_bytes for x in d.meta.devices if x.memory_bytes), None),
        }
        for d in ordered  # metadata only: a loop over ranks, not events
    ]
    out = pd.DataFrame(rows)
    out["peak_allocated_bytes"] = out["rank"].map(peak).astype("Int64")
    out["peak_share"] = out["peak_allocated_bytes"] / out["capacity_bytes"].astype("Float64")
    out["flops"] = out["rank"].map(flops.groupby("rank")["flops"].sum()).fillna(0.0).astype("float64")
    out = out[["rank", "host", "peak_allocated_bytes", "capacity_bytes", "peak_share", "flops"]]
    top = out["flops"].max() if not out.empty else 0
    out["flops_normalised"] = out["flops"] / top if top else 0.0
    return out
