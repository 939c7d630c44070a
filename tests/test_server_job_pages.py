"""The job pages' API: every number is the cluster analysis's, sorted and filtered on the server."""

from __future__ import annotations

from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from _jobs import DDP_JOB, OVERLOADED_STAGE, PP_JOB, demo_base
from _server_helpers import wait_ready
from perfsight.cluster.job import analyse_job
from perfsight.server import create_app

PHASES = [
    "duration_ns",
    "computing_ns",
    "communication_not_overlapped_ns",
    "free_ns",
    "bubble_ns",
    "fp_bp_ns",
]


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return demo_base(tmp_path_factory, tmp_path_factory.mktemp("demo-api") / "demo_output")


@pytest.fixture(scope="module")
def client(base: Path, tmp_path_factory: pytest.TempPathFactory) -> TestClient:
    with TestClient(create_app(base, cache_dir=tmp_path_factory.mktemp("cache"))) as client:
        for run in (DDP_JOB, PP_JOB):
            assert wait_ready(client, run)["status"] == "ready"
        yield client


@pytest.mark.parametrize("run", [DDP_JOB, PP_JOB])
def test_each_ranks_average_step_is_the_cluster_analysis_one(
    client: TestClient, base: Path, run: str
) -> None:
    expected = analyse_job(base / run, executor="serial", per_rank_outputs=False).rank_averages
    got = client.get("/api/job/overview", params={"run": run, "sort": "rank", "order": "asc"}).json()
    assert [r["rank"] for r in got["ranks"]] == expected["rank"].tolist()
    for row, (_, want) in zip(got["ranks"], expected.iterrows(), strict=True):
        for phase in PHASES:  # the CSV keeps ns to the nanosecond (us with 3 decimals)
            assert row[phase] == pytest.approx(int(want[phase]), abs=1), (run, row["rank"], phase)


def test_the_pipeline_jobs_overloaded_stage_does_the_most_work(client: TestClient) -> None:
    got = client.get("/api/job/overview", params={"run": PP_JOB}).json()
    by_stage = {s["stage"]: s for s in got["stages"]}
    assert sorted(by_stage) == [0, 1]
    # the stage given four times the layers does four times the floating-point work (FLOPs are
    # counted, not timed: no other process on the machine can change them)
    assert by_stage[OVERLOADED_STAGE]["flops"] == pytest.approx(
        4 * by_stage[1 - OVERLOADED_STAGE]["flops"], rel=0.3
    )
    assert got["parallel"]["modes"] == ["pipeline"]
    # the busiest stage is the analysis's verdict: the one computing the longest
    longest = max(by_stage.values(), key=lambda s: s["computing_ns"])["stage"]
    assert got["pipeline"]["slowest_stage"] == longest
    ranks = client.get("/api/job/overview", params={"run": PP_JOB, "sort": "computing_ns"}).json()["ranks"]
    assert [r["computing_ns"] for r in ranks] == sorted((r["computing_ns"] for r in ranks), reverse=True)


def test_the_step_trace_shows_one_step_or_one_stage(client: TestClient) -> None:
    average = client.get("/api/job/step-trace", params={"run": PP_JOB}).json()
    assert average["step"] == "average" and average["pipeline"] and average["stages"] == [0, 1]
    step = average["steps"][1]
    one = client.get("/api/job/step-trace", params={"run": PP_JOB, "step": step}).json()
    assert one["step"] == step and len(one["ranks"]) == len(average["ranks"])
    assert [r["duration_ns"] for r in one["ranks"]] != [r["duration_ns"] for r in average["ranks"]]
    stage = client.get("/api/job/step-trace", params={"run": PP_JOB, "stage": OVERLOADED_STAGE}).json()
    assert {r["stage"] for r in stage["ranks"]} == {OVERLOADED_STAGE}


def test_bad_requests_say_what_is_wrong(client: TestClient) -> None:
    missing = client.get("/api/job/step-trace", params={"run": PP_JOB, "step": "999"})
    assert missing.status_code == 404 and "999" in missing.json()["detail"]
    assert client.get("/api/job/overview", params={"run": PP_JOB, "sort": "name; drop"}).status_code == 422
    assert client.get("/api/job/overview", params={"run": "nope"}).status_code == 404


@pytest.mark.parametrize("run", [DDP_JOB, PP_JOB])
def test_the_stacked_parts_of_a_ranks_step_count_each_instant_once(client: TestClient, run: str) -> None:
    """The overview's bars stack computing alone, overlapped, communication alone and free: they
    add up to the rank's stage time (to the ns rounding of the CSV, one per part)."""
    for row in client.get("/api/job/overview", params={"run": run}).json()["ranks"]:
        assert row["computing_not_overlapped_ns"] + row["overlapped_ns"] == pytest.approx(
            row["computing_ns"], abs=1
        )
        parts = ["computing_not_overlapped_ns", "overlapped_ns", "communication_not_overlapped_ns", "free_ns"]
        assert sum(row[p] for p in parts) == pytest.approx(row["stage_ns"], abs=len(parts)), row
