"""The same communication op instance on every rank of its group.

Each rank's ``comm`` table may hold two rows per op: the *issue* row (the framework call that
carries the op's metadata: ``c10d::allreduce_``, ``record_param_comms``, perfsight's capture with
group, sequence number, peer and bytes) and the *execution* row (the NCCL kernel on a stream, the
``gloo:all_reduce`` range on gloo's worker thread).  Per rank, the k-th issue row of a collective
kind is paired with the k-th execution row of that kind (both in time order): the op takes its
metadata from the issue row and its timing from the execution row -- when the rank really entered
and left the collective.

Instances are then matched across ranks:

* collectives with a recorded sequence number: by (group, sequence number);
* collectives without: by order -- (group, collective, step, k-th on the rank) -- which holds
  because every rank of a group must issue the group's collectives in the same order;
* sends and receives: the k-th send from a to b with the k-th receive on b from a.

Point-to-point is the model's one definition (``perfsight.model.is_p2p``: send, recv, send_recv).
A ``send_recv`` (a batched exchange: HCCL's ``hcom_batchSendRecv``, NCCL's ``SendRecv`` kernel)
has no single direction, so it is matched by order like a collective; being point-to-point, it is
never used for clock alignment or slow-rank lateness (both ends of an exchange need not meet).

An instance is complete when every member of its group that is in the job has it.  Everything is
vectorised with pandas (group-by and merge), never a loop over ops.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from perfsight import columns
from perfsight.cluster.rank import RankDigest, concat
from perfsight.model import is_p2p

DIRECTED = ("send", "recv")
"""Point-to-point kinds with one direction: matched sender to receiver, not over a group."""

_ISSUE_NAMES = ("c10d::", "record_param_comms")
_DEFAULT_GROUP = "default"


@dataclasses.dataclass
class Matched:
    """Op instances of a job.

    ``ops``: one row per op per rank -- rank, row (index in that rank's ``comm``), collective,
    group, members (tuple of global ranks), seq, peer, src, dst, bytes, step, start_ns, end_ns
    (execution timing, trace clock until aligned), instance (id shared by the same op on all
    ranks; -1 when it cannot be matched).
    ``instances``: one row per instance -- instance, collective, group, step, bytes, expected
    (members present in the job), seen (ranks that have it), complete, is_p2p.
    """

    ops: pd.DataFrame
    instances: pd.DataFrame

    def unmatched_by_rank(self) -> dict[int, int]:
        """Ops of each rank that are not part of a complete instance (only ranks with some)."""
        complete = self.instances.set_index("instance")["complete"]
        ok = self.ops["instance"].map(complete).fillna(False).astype(bool)
        counts = self.ops.loc[~ok].groupby("rank").size()
        return {int(r): int(n) for r, n in counts.items()}


def op_rows(digests: Mapping[int, RankDigest]) -> pd.DataFrame:
    """Every rank's ops, issue metadata joined to execution timing (see the module docstring)."""
    ordered = [digests[r] for r in sorted(digests)]
    comm = concat(ordered, "comm")
    if comm.num_rows == 0:
        return _empty_ops()
    comm = comm.select(
        ["rank", "is_device", "collective", "start_ns", "dur_ns", "step", "bytes", "group", "group_ranks"]
        + ["seq", "peer", "name"]
    )
    # a group's member list (JSON, thousands of characters at 1,024 ranks) repeats on each of its
    # ops: as a category it is held once per group, not once per op (200 MB at 1,024 ranks)
    members = comm.schema.get_field_index("group_ranks")
    rows = comm.set_column(
        members, "group_ranks", pc.dictionary_encode(comm.column("group_ranks"))
    ).to_pandas()
    rows["row"] = np.concatenate([np.arange(d.comm.num_rows) for d in ordered])  # row in its rank's comm
    names = rows["name"].fillna("").astype(str)
    issue_like = names.str.startswith(_ISSUE_NAMES) | rows["seq"].notna()
    has_device = rows.groupby("rank")["is_device"].transform("any")
    execution = np.where(has_device, rows["is_device"], ~issue_like)
    issue = np.where(has_device, ~rows["is_device"], issue_like)
    # a rank with only one kind of row uses it for both roles
    only = ~pd.Series(execution).groupby(rows["rank"]).transform("any") | ~pd.Series(issue).groupby(
        rows["rank"]
    ).transform("any")
    execution = execution | only.to_numpy()
    issue = issue | only.to_numpy()
    exec_rows = rows.loc[execution].sort_values(["rank", "start_ns"], kind="stable")
    issue_rows = rows.loc[issue].sort_values(["rank", "start_ns"], kind="stable")
    for frame in (exec_rows, issue_rows):
        frame["k"] = frame.groupby(["rank", "collective"]).cumcount()
    meta = issue_rows[["rank", "collective", "k", "group", "group_ranks", "seq", "peer", "bytes", "step"]]
    ops = exec_rows.merge(meta, on=["rank", "collective", "k"], how="left", suffixes=("_exec", ""))
    ops["bytes"] = ops["bytes"].fillna(ops["bytes_exec"])
    ops["step"] = ops["step_exec"]
    # issue rows with no execution row (gloo runs send/recv on the caller's thread) time themselves
    paired = (
        issue_rows.merge(
            exec_rows[["rank", "collective", "k"]], on=["rank", "collective", "k"], how="left", indicator=True
        )["_merge"]
        .eq("both")
        .to_numpy()
    )
    alone = issue_rows.loc[~paired]
    ops = pd.concat(
        [ops.drop(columns=[c for c in ops.columns if c.endswith("_exec")]), alone], ignore_index=True
    )
    ops = ops.drop_duplicates(subset=["rank", "row"]).sort_values(["rank", "start_ns"], kind="stable")
    ops["end_ns"] = ops["start_ns"] + ops["dur_ns"]
    return ops.drop(columns=["k", "name", "is_device"]).reset_index(drop=True)


def _empty_ops() -> pd.DataFrame:
    return pd.DataFrame(
        {
            c: pd.Series(dtype="int64")
            for c in ("rank", "row", "start_ns", "dur_ns", "end_ns", "step", "bytes", "seq", "peer")
        }
        | {c: pd.Series(dtype="object") for c in ("collective", "group", "group_ranks")}
    )


def match(digests: Mapping[int, RankDigest]) -> Matched:
    """Match every op instance across the ranks of its group (see the module docstring)."""
    ops = op_rows(digests)
    present = sorted(digests)
    ops["group"] = ops["group"].astype("object").where(ops["group"].notna(), _DEFAULT_GROUP).astype(str)
    members = _group_members(ops, digests, present)
    ops["members"] = _per_group(ops["group"], members)
    ops["is_p2p"] = columns.numpy(is_p2p(pa.array(ops["collective"], pa.string())), null=False)
    directed = ops["collective"].isin(DIRECTED)
    is_send = ops["collective"] == "send"
    ops["src"] = np.where(directed, np.where(is_send, ops["rank"], ops["peer"]), np.nan)
    ops["dst"] = np.where(directed, np.where(is_send, ops["peer"], ops["rank"]), np.nan)
    key = pd.Series("", index=ops.index, dtype=object)
    # collectives (and undirected exchanges) with a sequence number
    with_seq = ~directed & ops["seq"].notna()
    key[with_seq] = (
        "c|" + ops.loc[with_seq, "group"] + "|s" + ops.loc[with_seq, "seq"].astype("int64").astype(str)
    )
    # collectives by order within (group, collective, step)
    by_order = ~directed & ~with_seq
    order = ops.loc[by_order].sort_values("start_ns", kind="stable")
    k = order.groupby(["rank", "group", "collective", "step"]).cumcount()
    key[k.index] = (
        "o|"
        + order["group"]
        + "|"
        + order["collective"]
        + "|"
        + order["step"].astype(str)
        + "|"
        + k.astype(str)
    )
    # sends and receives: k-th transfer from src to dst
    pair = directed & ops["peer"].notna()
    p2p = ops.loc[pair].sort_values("start_ns", kind="stable")
    k = p2p.groupby(["rank", "collective", "peer"]).cumcount()
    key[k.index] = (
        "p|"
        + p2p["src"].astype("int64").astype(str)
        + ">"
        + p2p["dst"].astype("int64").astype(str)
        + "|"
        + k.astype(str)
    )
    codes, _ = pd.factorize(key.where(key != "", None), use_na_sentinel=True)
    ops["instance"] = codes
    return Matched(ops=ops.drop(columns=["group_ranks"]), instances=_instances(ops, present))


def _instances(ops: pd.DataFrame, present: list[int]) -> pd.DataFrame:
    keyed = ops.loc[ops["instance"] >= 0]
    if keyed.empty:
        return pd.DataFrame(
            columns=[
                "instance",
                "collective",
                "group",
                "step",
                "bytes",
                "expected",
                "seen",
                "complete",
                "is_p2p",
            ]
        )
    grouped = keyed.groupby("instance")
    out = grouped.agg(
        collective=("collective", "first"),
        group=("group", "first"),
        step=("step", "min"),
        bytes=("bytes", "max"),
        seen=("rank", "nunique"),
        is_p2p=("is_p2p", "first"),
        members=("members", "first"),
    ).reset_index()
    in_job = set(present)
    out["expected"] = [
        2 if p else len(in_job.intersection(m)) for p, m in zip(out["is_p2p"], out["members"], strict=True)
    ]
    out["complete"] = (out["seen"] >= out["expected"]) & (out["expected"] >= 2)
    return out.drop(columns=["members"])


def _per_group(groups: pd.Series, members: dict[str, tuple[int, ...]]) -> pd.Series:
    """Each op's group members (an object column of tuples).  Not ``Series.map``: on a string
    column pandas tries to make an Arrow list column of the tuples, a second at 1024 ranks."""
    codes, uniques = pd.factorize(groups)
    table = np.empty(len(uniques), dtype=object)
    for i, group in enumerate(uniques):  # one per group, a handful
        table[i] = members[group]
    return pd.Series(table[codes], index=groups.index, dtype=object)


def _group_members(
    ops: pd.DataFrame, digests: Mapping[int, RankDigest], present: list[int]
) -> dict[str, tuple[int, ...]]:
    """Global ranks of each group: recorded on the ops, else in the ranks' process-group metadata,
    else (an unnamed group) every rank of the job."""
    members: dict[str, tuple[int, ...]] = {}
    recorded = ops.dropna(subset=["group_ranks"]).drop_duplicates("group")
    for group, text in zip(recorded["group"], recorded["group_ranks"], strict=True):
        try:
            members[group] = tuple(int(r) for r in json.loads(text))
        except (ValueError, TypeError):
            continue
    for digest in digests.values():
        for pg in digest.meta.process_groups:
            name = str(pg.get("pg_name", pg.get("name", "")))
            ranks = pg.get("ranks")
            if name and name not in members and isinstance(ranks, list) and ranks:
                members[name] = tuple(int(r) for r in ranks)
    world = max((d.meta.world_size for d in digests.values()), default=len(present))
    for group in ops["group"].unique():
        members.setdefault(group, tuple(range(max(world, max(present, default=0) + 1))))
    return members
