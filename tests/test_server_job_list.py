"""The run list of a base dir like `make demo`'s: one row per job, whatever is opened.

Regression for issue 16: the rank folders a multi-process job writes (``rank<N>_<ts>_perfsight``)
were listed as unrelated one-rank runs, and opening one changed how the others were listed.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from _jobs import DDP_JOB, DDP_RANKS, PP_JOB, demo_base
from _server_helpers import wait_ready
from perfsight.server import create_app


def _rows(client: TestClient) -> dict[str, dict]:
    return {r["id"]: r for r in client.get("/api/runs").json()["runs"]}


def _listing(rows: dict[str, dict]) -> dict[str, tuple]:
    """What must not change when a run is opened: the rows and what each says about its run."""
    return {
        i: (r["name"], r["kind"], r["kind_label"], tuple(r["ranks"]), tuple(r["hosts"]))
        for i, r in rows.items()
    }


def _files(base: Path) -> dict[str, int]:
    return {str(p.relative_to(base)): p.stat().st_mtime_ns for p in base.rglob("*")}


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return demo_base(tmp_path_factory, tmp_path_factory.mktemp("demo") / "demo_output")


def test_each_job_is_one_row_and_opening_any_row_changes_no_other(base: Path, tmp_path: Path) -> None:
    before = _files(base)
    with TestClient(create_app(base, cache_dir=tmp_path / "cache")) as client:
        rows = _rows(client)
        # the DDP job's rank folders are one job; its CLI analysis is shown as that job, not apart
        assert sorted(rows) == [PP_JOB, DDP_JOB]
        ddp, pp = rows[DDP_JOB], rows[PP_JOB]
        assert ddp["kind"] == pp["kind"] == "job"
        assert ddp["ranks"] == list(range(DDP_RANKS)) and pp["ranks"] == [0, 1]
        assert ddp["kind_label"] == f"PyTorch job, {DDP_RANKS} ranks"
        assert ddp["hosts"] and len(ddp["hosts"]) == 1  # every rank ran on this machine
        assert ddp["status"] == "ready"  # `perfsight analyse run --out analysis` is read as it is
        assert pp["status"] == "new"
        listed = _listing(rows)
        for run in sorted(rows):
            status = wait_ready(client, run)
            assert status["status"] == "ready", status
            assert status["ranks"] == rows[run]["ranks"]
            after = _rows(client)
            assert _listing(after) == listed, f"opening {run} changed the list"
            assert after[run]["steps"] and after[run]["status"] == "ready"
            # every other page of the job answers for it (never "no run ... under the base dir")
            for rank in rows[run]["ranks"]:
                overview = client.get("/api/run/overview", params={"run": run, "rank": rank})
                assert overview.status_code == 200, overview.text
                assert overview.json()["rank"] == rank
    assert _files(base) == before  # the server wrote nothing into the served folder


def test_a_rank_folder_analysed_in_place_stays_part_of_its_job(base: Path, tmp_path: Path) -> None:
    """A user analyses one rank's folder with the CLI (its outputs land in that folder): the job
    is still one row of every rank, and that folder is not taken for an analysed rank."""
    rank_folder = sorted((base / PP_JOB).glob("rank1_*_perfsight"))[0]
    result = subprocess.run(
        [sys.executable, "-m", "perfsight.cli", "analyse", str(rank_folder)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert (rank_folder / "cache").is_dir()
    with TestClient(create_app(base, cache_dir=tmp_path / "cache")) as client:
        rows = _rows(client)
        assert sorted(rows) == [PP_JOB, DDP_JOB]
        assert rows[PP_JOB]["ranks"] == [0, 1] and rows[PP_JOB]["kind"] == "job"


def test_per_rank_subfolders_of_one_world_are_one_job_and_unrelated_runs_are_not(tmp_path: Path) -> None:
    """A launcher's layout (``job/rank0000/rank0.pt.trace.json``...) is one job; two unrelated
    traces in sibling folders stay two runs."""
    from _server_helpers import copy_into
    from conftest import kineto_file
    from shared_data import REPO

    base = tmp_path / "base"
    result = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "gen_cluster_job.py"), "--out", str(base / "job")]
        + ["--ranks", "4", "--size-mb", "0.2", "--stragglers", "2:1.3"],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert len([d for d in (base / "job").iterdir() if d.is_dir()]) == 4
    copy_into(
        base, kineto_file("cpu_only/rank-34.Jul_15_10_52_41.1074.pt.trace.json.gz"), "other/a/cpu.json.gz"
    )
    copy_into(
        base, kineto_file("amd_trace/mi250_minitoy_train_ROCm6_2_kineto.json.gz"), "other/b/amd.json.gz"
    )
    with TestClient(create_app(base, cache_dir=tmp_path / "cache")) as client:
        rows = _rows(client)
        assert rows["job"]["kind"] == "job" and rows["job"]["ranks"] == [0, 1, 2, 3]
        assert not [i for i in rows if i.startswith("job/")]
        assert {i for i in rows if i.startswith("other/")} == {"other/a/cpu.json.gz", "other/b/amd.json.gz"}
