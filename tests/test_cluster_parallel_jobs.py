"""Cluster analysis of the real tensor-, pipeline- and data x pipeline-parallel example jobs.

Each test runs an example from ``examples/`` (gloo, CPU, profiled with ``perfsight.profile``) and
checks what a user would: every op matched on every rank with the bytes of the tensors the model
sends, the parallel mode the job really used (from its process groups and traffic), the pipeline
stages, and the cluster step trace's rows.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from _jobs import run_example
from perfsight.cluster.job import ClusterResult, analyse_job, write_cluster_outputs
from perfsight.cluster.summary import cluster_summary

FLOAT32 = 4

# examples/train_tp.py defaults: 2 blocks of Linear(64, 256) -> GELU -> Linear(256, 64), batch 32
TP_WIDTH, TP_BATCH = 64, 32
# examples/train_pp.py / train_dp_pp.py: stages of 2 x Linear(64, 64); batch split in 4 micro-batches
PP_WIDTH, PP_LAYERS, PP_MICRO_BATCHES = 64, 2, 4
PP_BATCH, DP_PP_BATCH = 64, 32


def _analyse(job: Path, out: Path) -> tuple[ClusterResult, pd.DataFrame]:
    result = analyse_job(job, executor="serial", per_rank_outputs=False)
    folder = write_cluster_outputs(result, out)
    return result, pd.read_csv(folder / "cluster_step_trace_time.csv")


def _assert_every_op_matched(result: ClusterResult, ranks: list[int]) -> None:
    assert result.ranks == ranks and result.job.problems() == []
    assert len(result.matched.instances) > 0 and result.matched.instances["complete"].all()
    assert result.matched.unmatched_by_rank() == {}


def _per_step(ops: pd.DataFrame) -> pd.DataFrame:
    """Count and bytes of each (rank, step, collective, peer)."""
    return (
        ops.assign(peer=ops["peer"].fillna(-1).astype("int64"))
        .groupby(["rank", "step", "collective", "peer"])["bytes"]
        .agg(["size", "min", "max"])
        .reset_index()
    )


def test_tensor_parallel_job_is_recognised_with_its_all_reduces_and_compute_vs_communication(
    tmp_path: Path,
) -> None:
    job = tmp_path / "tp"
    run_example("train_tp.py", job)
    result, step_trace = _analyse(job, tmp_path)
    _assert_every_op_matched(result, [0, 1])

    # per step: an all-reduce of the (batch, width) activation per block in forward, and one of
    # the second block's input gradient in backward -- on both ranks, in the mesh's "tp" group
    ops = result.matched.ops
    assert set(ops["collective"]) == {"all_reduce"}
    activation = TP_BATCH * TP_WIDTH * FLOAT32
    per_step = _per_step(ops)
    assert len(per_step) == 2 * 3  # 2 ranks x 3 profiled steps
    assert (per_step["size"] == 3).all()
    assert (per_step["min"] == activation).all() and (per_step["max"] == activation).all()
    assert set(ops["members"]) == {(0, 1)}

    layout = result.parallel
    assert layout.modes == ["tensor"]  # not data parallel, though the ops are all-reduces
    assert layout.groups == {"tensor": [(0, 1)]}
    assert "mesh_tp" in layout.evidence["tensor"][0]
    assert cluster_summary(result)["parallel"]["modes"] == ["tensor"]

    ranks = step_trace.loc[(step_trace["Type"] == "rank") & (step_trace["Step"] != "average")]
    assert sorted(set(ranks["Index"])) == [0, 1] and len(ranks) == 6
    # the model-parallel columns: computing, pure (not overlapped) communication, free time
    assert (ranks["Computing(us)"] > 0).all()
    assert (ranks["Communication(us)"] > 0).all()
    assert (ranks["Communication(Not Overlapped)(us)"] <= ranks["Communication(us)"] + 0.001).all()
    parts = (
        ranks["Computing(us)"]
        + ranks["Communication(Not Overlapped)(us)"]
        + ranks["Free(us)"]
        + ranks["Preparing(us)"]
    )
    assert parts.to_numpy() == pytest.approx(ranks["Step Time(us)"].to_numpy(), abs=0.01)


def test_torch_pipelining_job_with_an_overloaded_stage_is_reported_imbalanced(tmp_path: Path) -> None:
    job = tmp_path / "pp"
    run_example("train_pp.py", job, "--schedule", "1f1b", "--overload-stage", "1", "--report-loss")
    result, step_trace = _analyse(job, tmp_path)
    _assert_every_op_matched(result, [0, 1])

    # torch.distributed.pipelining's 1F1B: per step, every micro-batch's activation goes 0 -> 1
    # and its gradient 1 -> 0, each a (micro-batch, width) float32 tensor
    micro_bytes = PP_BATCH // PP_MICRO_BATCHES * PP_WIDTH * FLOAT32
    ops = result.matched.ops
    per_step = _per_step(ops.loc[ops["collective"] != "all_reduce"])
    assert set(per_step["collective"]) == {"send", "recv"}
    assert len(per_step) == 2 * 2 * 3  # 2 ranks x (send, recv) x 3 steps
    assert (per_step["size"] == PP_MICRO_BATCHES).all()
    assert (per_step["min"] == micro_bytes).all() and (per_step["max"] == micro_bytes).all()

    # --report-loss: one all-reduce of the scalar loss per step over the default group, which
    # records no role; it spans both stages, so it is not taken for data parallelism
    reduces = ops.loc[ops["collective"] == "all_reduce"]
    assert len(reduces) == 2 * 3 and set(reduces["bytes"]) == {FLOAT32}
    assert result.stage_of == {0: 0, 1: 1}  # from which way the first transfer went
    assert result.parallel.modes == ["pipeline"] and result.parallel.groups == {"pipeline": [(0, 1)]}
    assert result.parallel.problems == []
    summary = cluster_summary(result)
    assert summary["pipeline"]["imbalanced"] is True and summary["pipeline"]["slowest_stage"] == 1
    per_stage = {row["stage"]: row for row in summary["pipeline"]["per_stage"]}
    # 4x the layers: 4x the FLOPs, counted; the timed compute only has to point the same way
    assert per_stage[1]["flops"] > 3 * per_stage[0]["flops"]
    assert per_stage[1]["compute_ns"] > per_stage[0]["compute_ns"]
    # both stages spend time receiving, split into waiting for the sender (bubble) and transfer.
    # How it splits is timing: which stage waits longer is left to docs/DIAGNOSIS.md's figures
    # (on two busy cores a descheduled rank can turn the two bubbles around), and a stage whose
    # sender always started after its receive was posted has waited all of it (transfer 0)
    for s in (0, 1):
        assert per_stage[s]["bubble_ns"] >= 0 and per_stage[s]["receive_ns"] >= 0
        assert per_stage[s]["bubble_ns"] + per_stage[s]["receive_ns"] > 0
    averages = step_trace.loc[step_trace["Step"] == "average"]
    assert sorted(averages.loc[averages["Type"] == "stage", "Index"]) == [0, 1]


def test_data_x_pipeline_job_has_the_right_stages_and_data_parallel_groups(tmp_path: Path) -> None:
    job = tmp_path / "dp_pp"
    run_example("train_dp_pp.py", job)
    result, step_trace = _analyse(job, tmp_path)
    _assert_every_op_matched(result, [0, 1, 2, 3])

    # pipelines 0 -> 1 and 2 -> 3; replicas of a stage average their gradients in a "dp" group
    assert result.stage_of == {0: 0, 1: 1, 2: 0, 3: 1}
    layout = result.parallel
    assert layout.modes == ["data", "pipeline"]
    assert layout.groups == {"data": [(0, 2), (1, 3)], "pipeline": [(0, 1), (2, 3)]}
    assert layout.problems == []
    assert cluster_summary(result)["stages"] == {"0": [0, 2], "1": [1, 3]}

    ops = result.matched.ops
    reduces = ops.loc[ops["collective"] == "all_reduce"]
    assert {r: m for r, m in zip(reduces["rank"], reduces["members"], strict=True)} == {
        0: (0, 2),
        2: (0, 2),
        1: (1, 3),
        3: (1, 3),
    }
    stage_param_bytes = PP_LAYERS * (PP_WIDTH * PP_WIDTH + PP_WIDTH) * FLOAT32
    assert set(reduces.groupby(["rank", "step"])["bytes"].sum()) == {stage_param_bytes}
    sends = ops.loc[ops["collective"] == "send"]
    micro_bytes = DP_PP_BATCH // PP_MICRO_BATCHES * PP_WIDTH * FLOAT32
    assert set(sends["bytes"]) == {micro_bytes}
    assert set(zip(sends["rank"], sends["peer"].astype("int64"), strict=True)) == {
        (0, 1),
        (1, 0),
        (2, 3),
        (3, 2),
    }

    # stage rows: per step, the mean of the stage's ranks; every rank row carries its stage
    rows = step_trace.loc[step_trace["Step"] != "average"]
    ranks = rows.loc[rows["Type"] == "rank"]
    assert dict(zip(ranks["Index"], ranks["Stage"], strict=False)) == {0: 0, 1: 1, 2: 0, 3: 1}
    stage_rows = rows.loc[rows["Type"] == "stage"].set_index(["Step", "Index"])
    columns = ["Step Time(us)", "Computing(us)", "Bubble(us)", "Receive(Not Overlapped)(us)"]
    expected = ranks.groupby(["Step", "Stage"])[columns].mean()
    expected.index = expected.index.set_names(["Step", "Index"])
    assert sorted(stage_rows.index) == sorted(expected.index)
    assert len(stage_rows) == 2 * 3  # 2 stages x 3 steps
    for column in columns:
        got = stage_rows.loc[expected.index, column].to_numpy()
        assert got == pytest.approx(expected[column].to_numpy(), abs=0.002), column
    assert (stage_rows["Receive(Not Overlapped)(us)"] > 0).all()  # both stages wait for p2p
