"""What the server does with a job's analysis that is not about one page's numbers: a rank of a job
opens alone, and an analysis older than the job totals the pages read is answered plainly.

On the real 4-rank gloo DDP job of `make demo` (tests/_jobs.py), analysed by the CLI into
``analysis/`` beside it, as a user would have it.
"""

from __future__ import annotations

import csv
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from _jobs import DDP_JOB, DDP_RANKS, demo_base
from _server_helpers import wait_ready
from perfsight import layout
from perfsight.export.cluster_csv import STEP_TRACE_COLUMNS
from perfsight.server import create_app

IDLE_COLUMNS = (STEP_TRACE_COLUMNS["host_wait_ns"], STEP_TRACE_COLUMNS["after_launch_ns"])


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return demo_base(tmp_path_factory, tmp_path_factory.mktemp("job-tables") / "demo_output")


@pytest.fixture
def client(base: Path, tmp_path: Path) -> Iterator[TestClient]:
    """A fresh server (nothing opened) over the demo base, its own cache."""
    with TestClient(create_app(base, cache_dir=tmp_path / "cache")) as client:
        assert wait_ready(client, DDP_JOB)["seen"] == ["ready"]  # the CLI's analysis, read as it is
        yield client


def test_opening_one_rank_of_a_job_opens_that_rank_only(client: TestClient) -> None:
    registry = client.app.state.registry
    rank = DDP_RANKS - 2
    overview = client.get("/api/run/overview", params={"run": DDP_JOB, "rank": rank})
    assert overview.status_code == 200, overview.text[:300]
    assert overview.json()["ranks"] == list(range(DDP_RANKS))  # the job's ranks are all listed
    assert registry.opened(DDP_JOB).ranks.opened == [rank]  # and only the one asked for is opened
    tracks = client.get("/api/run/timeline/tracks", params={"run": DDP_JOB, "rank": rank}).json()
    assert {t["rank"] for t in tracks["tracks"]} == {rank}
    assert registry.opened(DDP_JOB).ranks.opened == [rank]
    # the job's timeline page asks for every rank's tracks and steps: listed without opening them
    every = client.get("/api/run/timeline/tracks", params={"run": DDP_JOB}).json()
    assert {t["rank"] for t in every["tracks"]} == set(range(DDP_RANKS))
    assert {m["rank"] for m in every["steps"]} == set(range(DDP_RANKS))
    assert registry.opened(DDP_JOB).ranks.opened == [rank]
    assert every["origin_ns"] == tracks["origin_ns"]


def test_a_jobs_track_list_is_each_ranks_own_track_list(client: TestClient) -> None:
    """The job-wide list (one query over the ranks' track tables, lanes from each index's meta)
    must say what each rank's own list says once the rank is opened."""
    every = client.get("/api/run/timeline/tracks", params={"run": DDP_JOB}).json()
    assert client.app.state.registry.opened(DDP_JOB).ranks.opened == []
    one_by_one = [
        client.get("/api/run/timeline/tracks", params={"run": DDP_JOB, "rank": r}).json()
        for r in range(DDP_RANKS)
    ]
    assert every["tracks"] == [t for answer in one_by_one for t in answer["tracks"]]
    assert every["steps"] == [m for answer in one_by_one for m in answer["steps"]]
    assert all(t["events"] > 0 for t in every["tracks"] if t["max_depth"] > 0)


def test_the_jobs_origin_is_its_earliest_event_whichever_rank_opens_first(
    client: TestClient, base: Path
) -> None:
    """Opening ranks one by one must not shift the clock the pages share: the origin is the
    earliest first event among every rank's timeline, known before any rank is opened."""
    import json

    firsts = [
        json.loads(meta.read_text())["first_ns"]
        for meta in (base / "analysis").glob("rank*/cache/timeline/meta.idx")
    ]
    assert len(firsts) == DDP_RANKS
    last = client.get("/api/run/timeline/tracks", params={"run": DDP_JOB, "rank": DDP_RANKS - 1}).json()
    assert last["origin_ns"] == min(firsts)
    assert client.app.state.registry.opened(DDP_JOB).ranks.opened == [DDP_RANKS - 1]


def test_an_analysis_older_than_the_job_totals_asks_to_be_analysed_again(
    tmp_path_factory: pytest.TempPathFactory, tmp_path: Path
) -> None:
    # a base of its own: a copy would move the traces, and the CLI's analysis records their paths
    old = demo_base(tmp_path_factory, tmp_path / "old")
    folder = old / "analysis" / "cluster_analysis_output"
    for name in (layout.CLUSTER_STEP_SPREAD_FILE, layout.CLUSTER_COMMUNICATION_RANKS_FILE):
        (folder / name).unlink()  # as a perfsight before these files wrote it
    step_trace = folder / "cluster_step_trace_time.csv"
    with step_trace.open(newline="") as handle:
        rows = list(csv.DictReader(handle))
    columns = [c for c in rows[0] if c not in IDLE_COLUMNS]  # nor these columns
    assert len(columns) == len(rows[0]) - len(IDLE_COLUMNS)
    with step_trace.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, columns, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)
    with TestClient(create_app(old, cache_dir=tmp_path / "cache")) as client:
        assert wait_ready(client, DDP_JOB)["seen"] == ["ready"]
        for endpoint, name in (
            ("/api/job/time-overview", layout.CLUSTER_STEP_SPREAD_FILE),
            ("/api/job/communication", layout.CLUSTER_COMMUNICATION_RANKS_FILE),
        ):
            response = client.get(endpoint, params={"run": DDP_JOB})
            assert response.status_code == 404, (endpoint, response.text[:300])
            detail = response.json()["detail"]
            assert name in detail and "perfsight analyse" in detail, detail
            assert str(tmp_path) not in detail
        # the job's other pages are read as before, the ranks' split of free time as none
        overview = client.get("/api/job/overview", params={"run": DDP_JOB})
        assert overview.status_code == 200
        for part in ("host_wait_ns", "after_launch_ns"):
            assert [r[part] for r in overview.json()["ranks"]] == [0] * DDP_RANKS
        assert client.get("/api/job/communication/ops", params={"run": DDP_JOB}).status_code == 200
