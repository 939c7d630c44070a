"""Which ranks make a job: a rank of another job is set aside and named, two inputs of one rank are
decided by agreement with the rest of the job, a damaged rank is named in the text summary.

Every job here is real: ``examples/train_ddp_straggler.py`` run as gloo DDP jobs, one after the
other (each launch gets its own rendezvous), and the shared 128-rank Kineto pair as the stranger.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import DATA, KINETO, need_file
from perfsight.cluster.job import analyse_job

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = REPO / "examples"
JOB_TIMEOUT = 600
SLOW_RANK = 0
pytestmark = pytest.mark.timeout(900)


def _run_example(out: Path, *args: str) -> Path:
    result = subprocess.run(
        [sys.executable, str(EXAMPLES / "train_ddp_straggler.py"), "--out", str(out), "--active", "5", *args],
        capture_output=True,
        text=True,
        timeout=JOB_TIMEOUT,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return out


@pytest.fixture(scope="module")
def jobs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """``other``: a 2-rank job run first; ``job``: the 2-rank job under study, rank 0 made slow;
    ``bigger``: a 3-rank job.  Three launches, three rendezvous."""
    root = tmp_path_factory.mktemp("membership")
    other = _run_example(root / "other", "--world-size", "2")
    job = _run_example(
        root / "job", "--world-size", "2", "--slow-rank", str(SLOW_RANK), "--slow-factor", "40"
    )
    bigger = _run_example(root / "bigger", "--world-size", "3")
    return {"other": other, "job": job, "bigger": bigger}


def _folder(job: Path, rank: int) -> Path:
    (folder,) = job.glob(f"rank{rank}_*_perfsight")
    return folder


def _analyse(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "perfsight.cli", "analyse", *args, "--no-progress"],
        capture_output=True,
        text=True,
        timeout=JOB_TIMEOUT,
        check=False,
    )


def _mixed(tmp_path: Path, jobs: dict[str, Path], *strangers: Path) -> Path:
    """The job's own rank folders, and the strangers copied in beside them."""
    mixed = tmp_path / "mixed"
    shutil.copytree(jobs["job"], mixed)
    for stranger in strangers:
        if stranger.is_dir():
            shutil.copytree(stranger, mixed / stranger.name)
        else:
            shutil.copy(stranger, mixed / stranger.name)
    return mixed


def test_a_rank_of_a_bigger_job_is_set_aside_named_and_the_real_slow_rank_is_found(
    jobs: dict[str, Path], tmp_path: Path
) -> None:
    stranger = _folder(jobs["bigger"], 2)
    mixed = _mixed(tmp_path, jobs, stranger)
    result = _analyse(str(mixed), "--out", str(tmp_path / "out"), "--json")
    assert result.returncode == 0, result.stderr[-3000:]
    summary = json.loads(result.stdout)["cluster"]
    assert (summary["ranks"], summary["world_size"], summary["missing_ranks"]) == (2, 2, [])
    (aside,) = summary["set_aside"]
    assert aside["rank"] == 2 and Path(aside["source"]).parent.name == stranger.name
    reasons = " | ".join(aside["reasons"])
    assert "world size 3, the job's 2" in reasons and "rendezvous" in reasons
    comm = summary["communication"]
    assert comm["instances"] >= 5 and comm["complete_instances"] == comm["instances"]
    assert summary["clock_alignment"]["method"] == "recorded"
    assert [row["rank"] for row in summary["slow_ranks"]] == [SLOW_RANK]
    assert sorted(p.name for p in (tmp_path / "out").iterdir() if p.name.startswith("rank")) == [
        "rank0",
        "rank1",
    ]  # no rank2/ among this job's outputs

    text = _analyse(str(mixed), "--out", str(tmp_path / "out_text"))
    assert text.returncode == 0, text.stderr[-3000:]
    assert f"set aside {mixed / stranger.name}: its rank 2 is from another job" in text.stdout
    assert "world size 3, the job's 2" in text.stdout
    assert f"slow rank {SLOW_RANK}:" in text.stdout


def test_a_rank_of_the_shared_128_rank_job_is_set_aside_beside_the_real_rank(
    jobs: dict[str, Path], tmp_path: Path
) -> None:
    stranger = need_file(KINETO / "two_ranks_ws128" / "sampled_rank-1.json.gz")
    mixed = _mixed(tmp_path, jobs)
    (mixed / "a_stranger").mkdir()  # listed before the job's own rank 1: the old rule kept it
    shutil.copy(stranger, mixed / "a_stranger" / stranger.name)
    result = analyse_job(mixed, executor="serial", per_rank_outputs=False)
    assert result.ranks == [0, 1] and result.job.world_size == 2 and result.job.missing == []
    assert result.job.ranks[1].source.startswith(str(_folder(mixed, 1)))
    (aside,) = result.job.set_aside
    assert aside.source == str(mixed / "a_stranger" / stranger.name)
    assert "world size 128, the job's 2" in aside.reasons
    assert any(r.startswith("recorded 2023-04-28") for r in aside.reasons)  # the trace's own times
    assert result.alignment.method == "recorded"
    assert len(result.matched.instances) >= 5 and result.matched.instances["complete"].all()
    assert list(result.slow_ranks.slow["rank"]) == [SLOW_RANK]


def test_of_two_inputs_of_one_rank_the_one_that_agrees_with_the_job_is_kept(
    jobs: dict[str, Path], tmp_path: Path
) -> None:
    # the other job's rank 0 ran first, so it is listed first: the old rule kept it
    stranger = _folder(jobs["other"], 0)
    mixed = _mixed(tmp_path, jobs, stranger)
    assert sorted(p.name for p in mixed.iterdir())[0] == stranger.name
    result = analyse_job(mixed, executor="serial", per_rank_outputs=False)
    assert Path(result.job.ranks[0].source).parent.name == _folder(jobs["job"], 0).name
    (aside,) = result.job.set_aside
    assert aside.rank == 0 and Path(aside.source).parent.name == stranger.name
    assert any(r.startswith("rendezvous") for r in aside.reasons)
    assert result.matched.instances["complete"].all()
    assert list(result.slow_ranks.slow["rank"]) == [SLOW_RANK]  # not rank 1

    # the stranger was read first and took rank0/; the job's own rank 0 is moved there
    out = tmp_path / "out"
    cli = _analyse(str(mixed), "--out", str(out), "--json")
    assert cli.returncode == 0, cli.stderr[-3000:]
    assert sorted(p.name for p in out.iterdir() if p.name.startswith("rank")) == ["rank0", "rank1"]
    assert json.loads(cli.stdout)["ranks"][0]["output_dir"] == str(out / "rank0" / "PROFILER_OUTPUT")
    (read,) = json.loads((out / "rank0" / "cache" / "source.json").read_text())["files"]
    assert Path(read["path"]).parent.name == _folder(jobs["job"], 0).name


def test_ranks_that_record_world_size_1_are_still_one_job() -> None:
    # Ascend's db_level0 ranks record world size 1 in a job of 2: no contradiction, one job
    info = need_file(DATA / "ascend_pt" / "db_level0" / "rank0_ascend_pt" / "profiler_info_0.json")
    folder = info.parents[1]
    result = analyse_job(folder, executor="serial", per_rank_outputs=False)
    assert result.ranks == [0, 1] and result.job.set_aside == []
    assert any("records world size 1, the job 2; analysed with the job" in p for p in result.job.problems())


def test_a_truncated_rank_is_named_in_the_text_summary(jobs: dict[str, Path], tmp_path: Path) -> None:
    job = tmp_path / "job"
    shutil.copytree(jobs["job"], job)
    (trace,) = _folder(job, 1).glob("kineto_trace_1.json")
    data = trace.read_bytes()
    trace.write_bytes(data[: len(data) * 2 // 3])  # the disk filled up two thirds into the file
    text = _analyse(str(job), "--out", str(tmp_path / "out"))
    assert text.returncode == 0, text.stderr[-3000:]
    named = [
        line for line in text.stdout.splitlines() if line.startswith("  ! rank 1 input damaged or cut short")
    ]
    assert len(named) == 1 and str(trace) in named[0] and "truncated" in named[0], text.stdout


TWO_WINDOWS = """
import sys, time
from pathlib import Path
import torch
from torch.nn.parallel import DistributedDataParallel
sys.path.insert(0, sys.argv[2])
import _cluster_job
import perfsight


def train(rank, world_size, out, args):
    torch.manual_seed(0)
    model = DistributedDataParallel(torch.nn.Linear(16, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with perfsight.profile(
        schedule=perfsight.schedule(wait=1, active=2, repeat=2),
        on_trace_ready=perfsight.tensorboard_trace_handler(str(out), worker_name=f"rank{rank}"),
    ) as prof:
        for step in range(6):  # step 0 waits, 1-2 recorded, 3 waits, 4-5 recorded
            if step == 3:
                time.sleep(12)  # the second window starts well after the first one ended
            model(torch.randn(8, 16)).sum().backward()
            opt.step()
            opt.zero_grad()
            prof.step()


if __name__ == "__main__":
    _cluster_job.launch(train, 2, Path(sys.argv[1]), None)
"""


def test_a_later_window_of_the_same_launch_is_set_aside_as_such(tmp_path: Path) -> None:
    script, out = tmp_path / "two_windows.py", tmp_path / "job"
    script.write_text(TWO_WINDOWS)
    run = subprocess.run(
        [sys.executable, str(script), str(out), str(EXAMPLES)],
        capture_output=True, text=True, timeout=JOB_TIMEOUT, check=False,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    assert len(list(out.glob("rank*_perfsight"))) == 4  # two windows of two ranks
    result = analyse_job(out, executor="serial", per_rank_outputs=False)
    assert result.ranks == [0, 1] and result.job.duplicates == {}
    first = {rank: sorted(out.glob(f"rank{rank}_*_perfsight"))[0].name for rank in (0, 1)}
    assert {r: Path(d.source).parent.name for r, d in result.job.ranks.items()} == first
    lines = [aside.line() for aside in result.job.set_aside]
    assert len(lines) == 2 and all("another profiling window of this job" in line for line in lines)
    assert result.matched.instances["complete"].all()
