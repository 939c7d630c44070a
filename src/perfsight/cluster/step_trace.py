"""The cluster step trace: every rank's step phases side by side, and pipeline stages.

Per rank and step it joins the rank's own ``step_trace`` (data parallel: iteration gap,
forward+backward, tail) and ``overlap_breakdown`` (tensor parallel: computing, communication not
overlapped = pure communication; pipeline: stage, bubble, receive alone, collective communication
alone) -- no phase is recomputed here.  Stage rows average the ranks of each pipeline stage.

Stage membership comes from the job's point-to-point traffic and process groups: for each pair of
ranks that exchange p2p ops, the direction of their first transfer is "forward" (micro-batch 0's
activations go first); a rank's stage is the length of the longest forward chain that reaches it.
"First" is read on each rank's own clock (is its first p2p op with that peer a send or a
receive?), never by comparing start times across ranks, whose clocks differ by more than the gap
between a send and the reply to it.  When the two ranks of a pair disagree (both send first, as
in an exchange), the lower rank is taken as upstream.
The ranks of a data- or tensor-parallel group share one stage (``perfsight.cluster.parallel``): a
rank without p2p traffic takes the stage of its group's ranks that have some.  Other ranks without
p2p traffic are stage 0 (no pipeline).

Bubble and receive (pipeline ranks): a rank alone knows only the time spent in receive ops and
nothing else (``|R \\ C|`` of ``perfsight.analysis.overlap``, its own file's Bubble).  Matched with
the sends that feed them, each receive's time splits in two (``perfsight.cluster.op_time``: before
the sending rank arrived is waiting, the rest transit): ``bubble_ns`` is the share spent waiting for
the previous stage to send (the stage idles), ``receive_not_overlapped_ns`` the share spent moving
the data.  So ``communication_not_overlapped = ..._exclude_receive + receive_not_overlapped +
bubble``; a rank whose receives matched no send keeps all of it as receive (its waiting is unknown).

Warm-up policy (for the averages): steps cut by the profiling window (``complete = false``) are
never used; the first profiled step is dropped when at least three complete steps remain (it pays
for lazy initialisation, allocator growth and cold caches); every other step counts equally.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import pandas as pd
import pyarrow as pa

from perfsight.analysis.step_trace import MIN_STEPS_TO_DROP_WARMUP
from perfsight.cluster.matching import Matched
from perfsight.cluster.rank import RankDigest, concat
from perfsight.ingest import mindinsight_cluster as vendor_cluster

PHASES = [
    "duration_ns",
    "iteration_interval_ns",
    "fp_bp_ns",
    "tail_ns",
    "computing_ns",
    "communication_not_overlapped_ns",
    "overlapped_ns",
    "communication_ns",
    "free_ns",
    "stage_ns",
    "bubble_ns",
    "communication_not_overlapped_exclude_receive_ns",
    "receive_not_overlapped_ns",
    "preparing_ns",
    "host_wait_ns",
    "after_launch_ns",
]
"""Per-step phases, in ns, in the order of cluster_step_trace_time.csv.  ``host_wait_ns`` and
``after_launch_ns`` are the parts of ``free_ns`` the device spent waiting for its host to launch
work, and idle once its work was launched (``perfsight.analysis.device_idle``): a rank whose free
time stands out shows there whether its host issued the work late or its device started it late."""
IDLE_PARTS = ["host_wait_ns", "after_launch_ns"]
"""The phases taken from each rank's ``device_idle`` table (0 for ranks that launch no device work)."""

PERFSIGHT_SOURCE = "perfsight"
VENDOR_SOURCE = "MindSpore ascend_cluster_analyse file"
"""``source`` of a rank-step row: perfsight's own overlap breakdown, or MindSpore's file (ms there)."""
VENDOR_PHASES = [
    "computing_ns",
    "communication_not_overlapped_ns",
    "stage_ns",
    "receive_not_overlapped_ns",
    "communication_not_overlapped_exclude_receive_ns",
]
"""The phases MindSpore's model/pipeline-parallel file gives (its data-parallel one repeats the step
trace, which perfsight reads itself)."""


def stages(matched: Matched, ranks: list[int], same_stage: Sequence[Sequence[int]] = ()) -> dict[int, int]:
    """Pipeline stage of every rank from p2p traffic and the groups whose ranks share a stage
    (see the module docstring)."""
    ops = matched.ops
    p2p = ops.loc[ops["collective"].isin(("send", "recv")) & ops["peer"].notna()]
    stage = dict.fromkeys(ranks, 0)
    if p2p.empty:
        return stage
    forward = _forward_pairs(p2p)
    src = forward["src"].astype("int64").to_numpy()
    dst = forward["dst"].astype("int64").to_numpy()
    index = {r: i for i, r in enumerate(ranks)}
    keep = np.array([s in index and d in index for s, d in zip(src, dst, strict=True)], dtype=bool)
    s_idx = np.array([index[s] for s in src[keep]], dtype=np.int64)
    d_idx = np.array([index[d] for d in dst[keep]], dtype=np.int64)
    depth = np.zeros(len(ranks), np.int64)
    for _ in range(len(ranks)):  # longest forward chain; converges in (stages - 1) rounds
        before = depth.copy()
        np.maximum.at(depth, d_idx, depth[s_idx] + 1)
        if np.array_equal(before, depth):
            break
    stage = {r: int(depth[i]) for r, i in index.items()}
    in_pipeline = set(src[keep].tolist()) | set(dst[keep].tolist())
    for group in same_stage:  # a handful of groups; ranks without p2p join their group's stage
        known = sorted({stage[r] for r in group if r in in_pipeline})
        if len(known) == 1:
            stage.update({r: known[0] for r in group if r in stage and r not in in_pipeline})
    return stage


def _forward_pairs(p2p: pd.DataFrame) -> pd.DataFrame:
    """``src -> dst`` for every pair of ranks that exchange p2p ops: each rank's first op with a
    peer, on its own clock, votes (a send says "I am upstream"); a pair whose two votes disagree
    takes the lower rank as upstream."""
    first = p2p.sort_values(["rank", "start_ns"], kind="stable").groupby(["rank", "peer"], sort=False).head(1)
    me = first["rank"].astype("int64").to_numpy()
    peer = first["peer"].astype("int64").to_numpy()
    sends = (first["collective"] == "send").to_numpy()
    votes = pd.DataFrame({"src": np.where(sends, me, peer), "dst": np.where(sends, peer, me)})
    votes = votes.drop_duplicates()
    src, dst = votes["src"].to_numpy(), votes["dst"].to_numpy()
    pair = pd.Series(np.minimum(src, dst) * (int(max(src.max(), dst.max())) + 1) + np.maximum(src, dst))
    disputed = pair.duplicated(keep=False).to_numpy()
    return votes.loc[~disputed | (src < dst)]


def rank_steps(digests: Mapping[int, RankDigest], stage_of: Mapping[int, int]) -> pd.DataFrame:
    """One row per rank and step: every phase of PHASES, the stage, and whether it is averaged."""
    ordered = [digests[r] for r in sorted(digests)]
    trace_steps = concat(ordered, "step_trace")
    overlap = concat(ordered, "overlap_breakdown")
    if trace_steps.num_rows == 0 and overlap.num_rows == 0:
        return pd.DataFrame(columns=["rank", "step", "stage", "averaged", "complete", *PHASES, "source"])
    keys = ["rank", "step"]
    out = (
        trace_steps.select([*keys, "duration_ns", "iteration_interval_ns", "fp_bp_ns", "tail_ns"])
        .to_pandas()
        .merge(overlap.to_pandas(), on=keys, how="outer")
    )
    out["receive_not_overlapped_ns"] = (
        out["communication_not_overlapped_ns"] - out["communication_not_overlapped_exclude_receive_ns"]
    )
    idle = concat(ordered, "device_idle")
    if idle.num_rows:
        out = out.merge(idle.select([*keys, *IDLE_PARTS]).to_pandas(), on=keys, how="left")
    else:  # no rank has device work launched from a host (CPU jobs, a vendor's file alone)
        out = out.assign(**dict.fromkeys(IDLE_PARTS, 0))
    vendor = concat([d for d in ordered if vendor_cluster.TABLE in d.tables], vendor_cluster.TABLE)
    out = _from_vendor_file(out, vendor)
    complete = concat(ordered, "steps").select([*keys, "complete"]).to_pandas()
    out = out.merge(complete, on=keys, how="left")
    out["complete"] = out["complete"].fillna(False).astype(bool)
    out["stage"] = out["rank"].map(stage_of).fillna(0).astype("int64")
    out["averaged"] = _after_warmup(out)
    for column in PHASES:
        out[column] = out[column].fillna(0).astype("int64")
    return out[["rank", "step", "stage", "averaged", "complete", *PHASES, "source"]]


def _from_vendor_file(out: pd.DataFrame, vendor: pa.Table) -> pd.DataFrame:
    """``out`` with the phases of MindSpore's ``ascend_cluster_analyse_*`` file (vendor table
    ``mindinsight_cluster_analyse``, see ``perfsight.ingest.mindinsight_cluster``) on the rank-steps
    that have no overlap breakdown of perfsight's own (a legacy rank without an op timeline);
    ``source`` says which rows came from the file.  Its receive time stays as the file has it (it
    does not split waiting from transfer), so ``split_bubble`` leaves those rows alone."""
    out["source"] = PERFSIGHT_SOURCE
    phases = [p for p in VENDOR_PHASES if p in vendor.column_names]
    if vendor.num_rows == 0 or not phases:
        return out
    keys = ["rank", "step"]
    file_rows = vendor.select([*keys, *phases]).to_pandas().dropna(subset=phases, how="all")
    own = out.loc[out["computing_ns"].notna(), keys]
    file_rows = file_rows.merge(own, on=keys, how="left", indicator=True)
    file_rows = file_rows.loc[file_rows["_merge"] == "left_only"].drop(columns="_merge")
    if file_rows.empty:
        return out
    # only the rank's own steps: the file's average row (step 0) and rows past them are no step
    merged = out.merge(file_rows, on=keys, how="left", suffixes=("", "_file"), indicator=True)
    from_file = (merged["_merge"] == "both").to_numpy()
    for phase in phases:
        merged.loc[from_file, phase] = merged.loc[from_file, f"{phase}_file"]
    merged.loc[from_file, "source"] = VENDOR_SOURCE
    return merged.drop(columns=[*(f"{p}_file" for p in phases), "_merge"])


def source_notes(steps: pd.DataFrame) -> list[str]:
    """One line naming the ranks whose breakdown is MindSpore's file's (empty when none is)."""
    if "source" not in steps or not (from_file := steps["source"] == VENDOR_SOURCE).any():
        return []
    from perfsight.cluster.discovery import rank_ranges

    ranks = rank_ranges(sorted(set(steps.loc[from_file, "rank"].astype(int))))
    return [
        f"ranks {ranks}: computing, communication not overlapped, stage, receive and collective "
        f"communication not overlapped are read from MindSpore's ascend_cluster_analyse file (ms there), "
        "not computed: no op timeline was recorded; overlapped, communication and free time are unknown (0)"
    ]


def split_bubble(steps: pd.DataFrame, ops: pd.DataFrame) -> pd.DataFrame:
    """``steps`` (of :func:`rank_steps`) with each rank-step's receive-only time split into
    ``bubble_ns`` (waiting for the sender) and ``receive_not_overlapped_ns`` (transfer) by the share
    of its matched receive ops' elapse spent waiting (see the module docstring)."""
    if steps.empty:
        return steps
    receive_only = (
        steps["communication_not_overlapped_ns"] - steps["communication_not_overlapped_exclude_receive_ns"]
    )
    share = pd.Series(0.0, index=steps.index)
    if {"wait_ns", "elapse_ns"} <= set(ops.columns):
        recv = ops.loc[(ops["collective"] == "recv") & (ops["instance"] >= 0) & ops["elapse_ns"].notna()]
        per = recv.groupby(["rank", "step"])[["wait_ns", "elapse_ns"]].sum()
        waited = per["wait_ns"].astype("float64").div(per["elapse_ns"].where(per["elapse_ns"] > 0))
        keys = pd.MultiIndex.from_frame(steps[["rank", "step"]].astype("int64"))
        share = pd.Series(waited.reindex(keys).fillna(0.0).clip(0.0, 1.0).to_numpy(), index=steps.index)
    out = steps.copy()
    out["bubble_ns"] = (receive_only * share).round().astype("int64")
    out["receive_not_overlapped_ns"] = receive_only - out["bubble_ns"]
    from_file = (
        (steps["source"] == VENDOR_SOURCE).to_numpy() if "source" in steps else np.zeros(len(steps), bool)
    )
    out.loc[from_file, "bubble_ns"] = 0  # the file's receive time, waiting included, as it has it
    out.loc[from_file, "receive_not_overlapped_ns"] = steps.loc[from_file, "receive_not_overlapped_ns"]
    return out


def _after_warmup(steps: pd.DataFrame) -> pd.Series:
    """The warm-up policy of the module docstring, per rank."""
    usable = steps["complete"].copy()
    counts = usable.groupby(steps["rank"]).transform("sum")
    first = steps.loc[usable].groupby("rank")["step"].transform("min").reindex(steps.index)
    drop = usable & (counts >= MIN_STEPS_TO_DROP_WARMUP) & (steps["step"] == first)
    return usable & ~drop


def averages(steps: pd.DataFrame, by: str) -> pd.DataFrame:
    """Mean of every phase over the averaged steps, per ``by`` (``rank`` or ``stage``)."""
    used = steps.loc[steps["averaged"]]
    if used.empty:
        used = steps  # nothing survives the policy: average what there is, rather than nothing
    out = used.groupby(by)[PHASES].mean().round().astype("int64").reset_index()
    out["steps"] = used.groupby(by)["step"].nunique().to_numpy()
    return out


def stage_steps(steps: pd.DataFrame) -> pd.DataFrame:
    """Per stage and step: the mean over the stage's ranks (stage rows of the CSV)."""
    out = steps.groupby(["stage", "step"])[PHASES].mean().round().astype("int64").reset_index()
    out["averaged"] = steps.groupby(["stage", "step"])["averaged"].all().to_numpy()
    return out
