"""One clock for every rank of a job.

Policy, in order (``Alignment.method`` says which applied):

1. ``recorded``: every rank's run folder records its clock offset to rank 0 (perfsight's collector
   measures it at start-up); times are shifted by it.
2. ``same host``: every rank ran on one host, so they read one clock; no shift.
3. ``estimated``: otherwise the offsets are estimated from matched collectives: the same
   collective instance finishes at nearly the same moment on every rank of its group (nobody
   leaves before the last rank has contributed).  Ranks that report the same host share one clock
   and so one offset.  For each clock, the offset is the median, over its ranks' complete
   collective instances, of (their end - the instance's median end); three rounds of this spread
   the estimate through groups that share ranks.  The lowest rank's clock is the reference (0).

Whatever the method, the *residual* of each rank -- the median absolute distance between its
aligned collective ends and the instances' median ends -- says how well the clocks agree after
alignment (it also contains real skew in when ranks finish, e.g. gloo's concurrent workers).
Point-to-point ops are never used: a send and its receive need not end together.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

import numpy as np
import pandas as pd

from perfsight.cluster.matching import Matched
from perfsight.cluster.rank import RankDigest

ROUNDS = 3


@dataclasses.dataclass
class Alignment:
    """Offsets to subtract from each rank's times (ns) and the residual error after alignment."""

    method: str  # "recorded", "same host", "estimated", "none" (one rank / nothing matched)
    offset_ns: dict[int, int]
    residual_ns: dict[int, int]  # rank -> median |aligned end - instance median end|; absent if unknown

    def table(self) -> pd.DataFrame:
        ranks = sorted(self.offset_ns)
        return pd.DataFrame(
            {
                "rank": ranks,
                "offset_ns": [self.offset_ns[r] for r in ranks],
                "residual_ns": [self.residual_ns.get(r) for r in ranks],
                "method": self.method,
            }
        )


def align(digests: Mapping[int, RankDigest], matched: Matched) -> Alignment:
    """Choose the offsets by the policy above and shift ``matched.ops`` onto the common clock."""
    ranks = sorted(digests)
    recorded = {r: digests[r].meta.clock_offset_ns for r in ranks}
    hosts = {digests[r].meta.host for r in ranks}
    if len(ranks) > 1 and all(v is not None for k, v in recorded.items() if k != ranks[0]):
        method, offsets = "recorded", {r: int(recorded[r] or 0) for r in ranks}
    elif len(hosts) == 1 and None not in hosts:
        method, offsets = "same host", {r: 0 for r in ranks}
    else:
        ends = _collective_ends(matched)
        if ends.empty or len(ranks) < 2:
            method, offsets = "none", {r: 0 for r in ranks}
        else:
            clock = {r: digests[r].meta.host or f"rank {r}" for r in ranks}  # ranks of a host share its clock
            method, offsets = "estimated", _estimate(ends, ranks, clock)
    shift = matched.ops["rank"].map(offsets).fillna(0).astype("int64")
    matched.ops["start_ns"] = matched.ops["start_ns"] - shift
    matched.ops["end_ns"] = matched.ops["end_ns"] - shift
    return Alignment(method, offsets, _residuals(_collective_ends(matched)))


def _collective_ends(matched: Matched) -> pd.DataFrame:
    complete = matched.instances.loc[matched.instances["complete"] & ~matched.instances["is_p2p"], "instance"]
    ops = matched.ops
    return ops.loc[ops["instance"].isin(complete), ["rank", "instance", "end_ns"]]


def _estimate(ends: pd.DataFrame, ranks: list[int], clock: dict[int, str]) -> dict[int, int]:
    clocks = ends["rank"].map(clock)
    offsets = pd.Series(0.0, index=sorted(set(clock.values())))
    end = ends["end_ns"].astype("float64")
    for _ in range(ROUNDS):
        shifted = end - clocks.map(offsets)
        median_end = shifted.groupby(ends["instance"]).transform("median")
        offsets = offsets.add((shifted - median_end).groupby(clocks).median(), fill_value=0.0)
        offsets -= offsets.loc[clock[ranks[0]]]
    return {r: int(round(offsets.loc[clock[r]])) for r in ranks}


def _residuals(ends: pd.DataFrame) -> dict[int, int]:
    if ends.empty:
        return {}
    end = ends["end_ns"].astype("float64")
    distance = (end - end.groupby(ends["instance"]).transform("median")).abs()
    return {int(r): int(v) for r, v in distance.groupby(ends["rank"]).median().items() if np.isfinite(v)}
