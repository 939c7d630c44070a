"""Cluster analysis of real multi-process gloo jobs (the examples), checked as a user would."""

from __future__ import annotations

import csv
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from perfsight.cluster.job import analyse_job

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = REPO / "examples"
JOB_TIMEOUT = 600

HIDDEN = 256
FEATURES = 128  # examples/train_ddp_straggler.py's MLP: Linear(128, 256) -> ReLU -> Linear(256, 10)
DDP_PARAM_BYTES = 4 * (FEATURES * HIDDEN + HIDDEN + HIDDEN * 10 + 10)
# the pipeline fixture's --batch-size, and train_pp.py's width and micro-batches
PP_BATCH, PP_WIDTH, PP_MICRO_BATCHES = 256, 64, 4
PP_MICRO = PP_BATCH // PP_MICRO_BATCHES


def _run_example(script: str, *args: str) -> None:
    result = subprocess.run(
        [sys.executable, str(EXAMPLES / script), *args],
        capture_output=True,
        text=True,
        timeout=JOB_TIMEOUT,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]


@pytest.fixture(scope="module")
def straggler_job(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("ddp_slow")
    _run_example(
        "train_ddp_straggler.py", "--out", str(out), "--world-size", "2",
        "--slow-rank", "1", "--slow-factor", "40", "--active", "5",
    )  # fmt: skip
    return out


@pytest.fixture(scope="module")
def pipeline_job(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("pp_overloaded")
    _run_example(
        "train_pp.py", "--out", str(out), "--stages", "2", "--overload-stage", "1",
        "--batch-size", str(PP_BATCH),
    )  # fmt: skip
    # batch 256: compute in ms per step, well above a preempted op's noise on a loaded 2-core machine
    return out


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "perfsight.cli", "analyse", *args],
        capture_output=True,
        text=True,
        timeout=JOB_TIMEOUT,
        check=False,
    )


def test_every_collective_is_matched_on_every_rank_with_its_tensor_bytes(straggler_job: Path) -> None:
    result = analyse_job(straggler_job, executor="serial", per_rank_outputs=False)
    assert result.ranks == [0, 1] and result.job.problems() == []
    instances = result.matched.instances
    assert len(instances) >= 3  # at least one gradient all-reduce per profiled step
    assert instances["complete"].all()
    ops = result.matched.ops
    assert (ops.groupby("instance")["rank"].nunique() == 2).all()
    assert result.matched.unmatched_by_rank() == {}
    # DDP's gradient all-reduces run on the default group, which records no role: assumed data parallel
    assert result.parallel.modes == ["data"] and result.parallel.groups == {"data": [(0, 1)]}
    # DDP reduces every gradient once per step: the all-reduced bytes of a step are the model's
    reduced = ops.loc[(ops["collective"] == "all_reduce") & (ops["rank"] == 0)].groupby("step")["bytes"].sum()
    assert set(reduced.astype("int64")) == {DDP_PARAM_BYTES}


def test_the_rank_made_slower_is_reported_as_the_slow_rank_with_its_magnitude(
    straggler_job: Path, tmp_path: Path
) -> None:
    result = _cli(str(straggler_job), "--out", str(tmp_path), "--json")
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout)["cluster"]
    assert [row["rank"] for row in summary["slow_ranks"]] == [1]
    slow = summary["slow_ranks"][0]
    assert slow["magnitude_pct"] > 50  # 40 extra 256x256 matrix products against a tiny MLP
    assert slow["lateness_ns"] > 0 and slow["last_votes"] >= 1
    text = _cli(str(straggler_job), "--out", str(tmp_path / "again"), "--no-progress")
    assert "slow rank 1:" in text.stdout
    rows = list(csv.DictReader((tmp_path / "cluster_analysis_output" / "slow_rank.csv").open()))
    assert {row["rank"]: row["slow"] for row in rows} == {"0": "False", "1": "True"}
    assert (tmp_path / "rank0" / "PROFILER_OUTPUT" / "step_trace_time.csv").is_file()


def test_a_pipeline_with_an_overloaded_stage_is_reported_imbalanced(
    pipeline_job: Path, tmp_path: Path
) -> None:
    result = _cli(str(pipeline_job), "--out", str(tmp_path), "--json")
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout)["cluster"]
    assert summary["stages"] == {"0": [0], "1": [1]}  # from the p2p traffic, not from rank numbers
    pipeline = summary["pipeline"]
    assert pipeline["imbalanced"] is True and pipeline["slowest_stage"] == 1
    per_stage = {row["stage"]: row for row in pipeline["per_stage"]}
    # 4x the layers: 4x the FLOPs, counted; the timed compute only has to point the same way
    # (CI's busy cores blurred a timed 1.5x once)
    assert per_stage[1]["flops"] > 3 * per_stage[0]["flops"]
    assert per_stage[1]["compute_ns"] > per_stage[0]["compute_ns"]
    out = tmp_path / "cluster_analysis_output"
    step_trace = pd.read_csv(out / "cluster_step_trace_time.csv")
    assert set(step_trace["Type"]) == {"rank", "stage"}
    averages = step_trace.loc[(step_trace["Step"] == "average") & (step_trace["Type"] == "stage")]
    assert list(averages["Index"]) == [0, 1]
    matrix = json.loads((out / "communication_matrix.json").read_text())
    step = next(iter(matrix.values()))
    forward = step["p2p"]["send-total@0"]["0-1"]
    activation_bytes = PP_MICRO * PP_WIDTH * 4 * PP_MICRO_BATCHES
    assert forward["Transit Size(MB)"] == pytest.approx(activation_bytes / 1e6, rel=1e-6)  # MB as Ascend's
    assert "1-0" in step["p2p"]["send-total@0"]  # gradients flow back


def test_dask_local_cluster_gives_identical_results(straggler_job: Path) -> None:
    distributed = pytest.importorskip("distributed")
    from perfsight.engine.dask import DaskExecutor

    reference = analyse_job(straggler_job, executor="serial", per_rank_outputs=False)
    with distributed.LocalCluster(
        n_workers=1, threads_per_worker=2, processes=False, dashboard_address="127.0.0.1:0"
    ) as lc:
        executor = DaskExecutor("dask-local", cluster=lc)
        try:
            on_dask = analyse_job(straggler_job, executor=executor, per_rank_outputs=False)
        finally:
            executor.close()
    pd.testing.assert_frame_equal(reference.matched.ops, on_dask.matched.ops)
    pd.testing.assert_frame_equal(reference.steps, on_dask.steps)
    pd.testing.assert_frame_equal(reference.slow_ranks.table, on_dask.slow_ranks.table)
    pd.testing.assert_frame_equal(reference.matrix, on_dask.matrix)


def test_a_recorded_parallel_layout_names_the_mode_of_an_unnamed_group(
    straggler_job: Path, tmp_path: Path
) -> None:
    # what prof.add_metadata_json("parallel_layout", '{"tensor_parallel": 2}') writes in each run
    # folder: the job's all-reduces on the default group are then tensor-, not data-parallel
    job = tmp_path / "job"
    shutil.copytree(straggler_job, job)
    for path in job.glob("*/profiler_metadata.json"):
        metadata = json.loads(path.read_text())
        metadata["parallel_layout"] = {"tensor_parallel": 2, "data_parallel": 1}
        path.write_text(json.dumps(metadata))
    result = analyse_job(job, executor="serial", per_rank_outputs=False)
    assert result.parallel.modes == ["tensor"]
    assert result.parallel.groups == {"tensor": [(0, 1)]}
    assert result.parallel.evidence["tensor"][0] == "parallel_layout tensor_parallel = 2"
