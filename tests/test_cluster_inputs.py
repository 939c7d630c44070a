"""What makes a job: real and synthetic multi-rank inputs, missing/duplicate/bad ranks, remote URLs."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import fsspec
import pandas as pd
import pytest

from conftest import KINETO, need_file
from perfsight.cluster.job import analyse_job

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))
from gen_cluster_job import generate  # noqa: E402

STRAGGLER = 5


@pytest.fixture(scope="module")
def synthetic_job(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """8 GPU ranks, 2 per host, host clocks skewed by up to 20 ms, rank 5's compute 30% slower."""
    out = tmp_path_factory.mktemp("synthetic")
    generate(
        out,
        ranks=8,
        size_mb=0.8,
        stragglers={STRAGGLER: 1.3},
        seed=3,
        skew_us=20_000.0,
        workers=1,
        ranks_per_host=2,
    )
    return out


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "perfsight.cli", "analyse", *args],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def test_the_real_two_rank_pair_of_a_128_rank_job_is_analysed_as_one_job() -> None:
    folder = need_file(KINETO / "two_ranks_ws128" / "sampled_rank-0.json.gz").parent
    result = analyse_job(folder, executor="serial", per_rank_outputs=False)
    assert result.ranks == [0, 1] and result.job.world_size == 128
    assert result.job.set_aside == []  # two sampled ranks of a bigger job are not strangers
    assert result.job.missing == list(range(2, 128))
    assert any("2-127" in line for line in result.job.problems())
    instances = result.matched.instances
    assert len(instances) > 0 and instances["complete"].all()
    # no host names and no recorded offsets: the clocks are estimated, with a residual per rank
    assert result.alignment.method == "estimated" and set(result.alignment.residual_ns) == {0, 1}
    assert set(result.steps["step"]) == {551, 552}


def test_an_injected_straggler_is_found_and_skewed_clocks_are_recovered(synthetic_job: Path) -> None:
    result = analyse_job(synthetic_job, executor="serial", per_rank_outputs=False)
    assert list(result.slow_ranks.slow["rank"]) == [STRAGGLER]
    slow = result.slow_ranks.slow.iloc[0]
    assert slow["magnitude_pct"] == pytest.approx(30, abs=5)  # device compute made 1.3x slower
    assert result.alignment.method == "estimated"
    skew_us = json.loads((synthetic_job / ".generator.json").read_text())["skew_us"]
    for rank, offset in result.alignment.offset_ns.items():
        true = (skew_us[str(rank)] - skew_us["0"]) * 1000
        assert abs(offset - true) < 200_000, rank  # within 0.2 ms of a skew of up to 20 ms
    hosts = {d.meta.host for d in result.job.ranks.values()}
    assert hosts == {"node0000", "node0001", "node0002", "node0003"}
    # the ring 0 -> 1 -> ... -> 7 -> 0 stays on a host from even to odd ranks only
    link_type = result.links.drop_duplicates(["src", "dst"]).set_index("src")["link_type"]
    assert link_type[0] == "INTRA_HOST" and link_type[1] == "INTER_HOST" and link_type[7] == "INTER_HOST"


def test_missing_duplicate_and_unreadable_ranks_are_reported_by_number(
    synthetic_job: Path, tmp_path: Path
) -> None:
    job = tmp_path / "job"
    shutil.copytree(synthetic_job, job)
    shutil.rmtree(job / "rank0002")
    shutil.copytree(job / "rank0001", job / "rank0001_again")
    (job / "rank0009").mkdir()
    (job / "rank0009" / "rank9.pt.trace.json").write_text("this is not a trace")
    result = _cli(str(job), "--out", str(tmp_path / "out"), "--json")
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout)["cluster"]
    assert summary["missing_ranks"] == [2] and summary["duplicate_ranks"] == [1]
    problems = "\n".join(summary["problems"])
    assert "rank 1 appears more than once" in problems and "rank9.pt.trace.json" in problems
    assert summary["ranks"] == 7
    assert sorted(p.name for p in (tmp_path / "out").iterdir() if p.name.startswith("rank")) == [
        "rank0", "rank1", "rank1_rank0001_again", "rank3", "rank4", "rank5", "rank6", "rank7",
    ]  # fmt: skip
    text = _cli(str(job), "--out", str(tmp_path / "out2"), "--no-progress")
    assert "ranks missing from this job of 8: 2 " in text.stdout


def test_a_job_behind_an_fsspec_url_gives_the_same_results_as_the_folder(synthetic_job: Path) -> None:
    memory = fsspec.filesystem("memory")
    for path in synthetic_job.rglob("*.json"):
        memory.pipe(f"/job/{path.relative_to(synthetic_job).as_posix()}", path.read_bytes())
    try:
        remote = analyse_job("memory://job", executor="serial", per_rank_outputs=False)
    finally:
        memory.rm("/job", recursive=True)
    local = analyse_job(synthetic_job, executor="serial", per_rank_outputs=False)
    assert remote.ranks == local.ranks
    pd.testing.assert_frame_equal(remote.matched.instances, local.matched.instances)
    pd.testing.assert_frame_equal(remote.slow_ranks.table, local.slow_ranks.table)
    assert remote.location == "memory://job"


def test_an_unknown_executor_is_a_one_line_error(synthetic_job: Path, tmp_path: Path) -> None:
    result = _cli(str(synthetic_job), "--out", str(tmp_path), "--executor", "carrier-pigeon")
    assert result.returncode == 2
    assert result.stderr.strip().count("\n") == 0 and "unknown executor 'carrier-pigeon'" in result.stderr


@pytest.mark.parametrize("job", [False, True], ids=["one trace", "a job"])
def test_an_output_folder_that_cannot_be_made_is_a_one_line_error(
    job: bool, synthetic_job: Path, tmp_path: Path
) -> None:
    source = synthetic_job if job else need_file(KINETO / "nccl_parser_config" / "nccl_data.json.gz")
    in_the_way = tmp_path / "a_file"
    in_the_way.write_text("not a folder")
    result = _cli(str(source), "--out", str(in_the_way / "out"))
    assert result.returncode == 2
    assert "Traceback" not in result.stderr and result.stderr.strip().count("\n") == 0
    assert "cannot write the outputs under" in result.stderr and str(in_the_way / "out") in result.stderr
    assert "Not a directory" in result.stderr


def test_per_rank_outputs_can_be_left_out_and_the_cluster_results_stay_the_same(
    synthetic_job: Path, tmp_path: Path
) -> None:
    full = _cli(str(synthetic_job), "--out", str(tmp_path / "full"), "--json")
    lean = _cli(str(synthetic_job), "--out", str(tmp_path / "lean"), "--json", "--per-rank-outputs", "none")
    assert full.returncode == 0 and lean.returncode == 0, full.stderr + lean.stderr
    # 8 ranks are under the limit: by default every rank's folder is written, with its analysis
    assert len(list((tmp_path / "full").glob("rank*/PROFILER_OUTPUT/step_trace_time.csv"))) == 8
    assert not list((tmp_path / "lean").glob("rank*"))
    lean_summary = json.loads(lean.stdout)["cluster"]
    assert "not written for 8 ranks" in lean_summary["per_rank_outputs"]
    assert json.loads(full.stdout)["cluster"]["per_rank_outputs"].endswith("rank<N>")
    for name in ("cluster_step_trace_time.csv", "communication_matrix.json", "slow_rank.csv"):
        full_file = tmp_path / "full" / "cluster_analysis_output" / name
        assert full_file.read_bytes() == (tmp_path / "lean" / "cluster_analysis_output" / name).read_bytes()


def test_ctrl_c_during_a_job_stops_it_with_one_line_and_exit_130(
    tmp_path_factory: pytest.TempPathFactory, tmp_path: Path
) -> None:
    job = tmp_path_factory.mktemp("interrupted_job")
    generate(job, ranks=24, size_mb=2, stragglers={}, seed=1, workers=2)
    out = tmp_path / "out"
    process = subprocess.Popen(
        [sys.executable, "-m", "perfsight.cli", "analyse", str(job), "--out", str(out), "--no-progress"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
    )  # fmt: skip
    deadline = time.monotonic() + 120
    while not any(out.glob("rank*")) and process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)  # until the workers write their first rank: the job is under way
    assert process.poll() is None, "the job ended before it could be interrupted"
    os.killpg(process.pid, signal.SIGINT)  # what Ctrl-C in a terminal does: the whole process group
    _, err = process.communicate(timeout=120)
    assert process.returncode == 130
    assert err.strip() == "perfsight analyse: interrupted"
