"""A job of many generated ranks, served: one row in the run list, every rank on its overview.

Issue 16's scale acceptance is measured on 1,024 ranks by ``benchmarks/bench_server.py --job``;
this is the same path at 64 ranks (``benchmarks/gen_cluster_job.py``, its injected straggler and
slow link), fast enough for every test run: what a user checks first when opening a big job.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient

from _server_helpers import wait_ready
from perfsight.server import create_app
from shared_data import REPO

sys.path.insert(0, str(REPO / "benchmarks"))
from gen_cluster_job import generate  # noqa: E402

RANKS = 64
PER_HOST = 8
STRAGGLER = 17
SLOW_LINK = (41, 2.0)  # rank 41 -> 42: two hosts' ranks (41 is the last of node0005)


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[TestClient, str]]:
    base = tmp_path_factory.mktemp("generated")
    generate(
        base / "job64", ranks=RANKS, size_mb=None, stragglers={STRAGGLER: 1.3}, steps=3,
        slow_link=SLOW_LINK, workers=1, ranks_per_host=PER_HOST,
    )  # fmt: skip
    client = TestClient(create_app(base, cache_dir=tmp_path_factory.mktemp("cache")))
    with client:
        status = wait_ready(client, "job64", timeout_s=600)
        assert status["status"] == "ready", status
        yield client, "job64"


def test_the_generated_ranks_are_one_job_row_with_every_rank(served: tuple[TestClient, str]) -> None:
    client, run = served
    rows = client.get("/api/runs").json()["runs"]
    assert [r["id"] for r in rows] == [run]  # one row, never one per rank folder
    (row,) = rows
    assert row["kind"] == "job"
    assert row["kind_label"] == f"PyTorch job, {RANKS} ranks"
    assert row["ranks"] == list(range(RANKS))
    assert row["status"] == "ready"
    assert row["steps"] == 3
    assert row["layout"] == f"DP{RANKS}"


def test_the_job_overview_answers_with_every_rank_and_names_the_injected_faults(
    served: tuple[TestClient, str],
) -> None:
    client, run = served
    body = client.get("/api/job/overview", params={"run": run, "sort": "rank", "order": "asc"}).json()
    assert [r["rank"] for r in body["ranks"]] == list(range(RANKS))
    assert body["ranks_total"] == RANKS
    assert body["hosts_total"] == RANKS // PER_HOST
    assert {r["host"] for r in body["ranks"]} == {f"node{h:04d}" for h in range(RANKS // PER_HOST)}
    slow = {r["rank"] for r in body["ranks"] if r["slow"]}
    assert STRAGGLER in slow  # the rank the others wait for
    evidence = {r["rank"]: r for r in body["slowest_ranks"]}
    assert evidence[STRAGGLER]["magnitude_pct"] > 20  # its compute is 30% slower than the others'
    links = [(link["src"], link["dst"]) for link in body["slowest_links"] if link["slow"]]
    assert links == [(SLOW_LINK[0], SLOW_LINK[0] + 1)]


def test_a_page_of_ranks_is_that_slice_of_the_whole_order(served: tuple[TestClient, str]) -> None:
    client, run = served
    whole = client.get("/api/job/overview", params={"run": run}).json()["ranks"]
    page = client.get("/api/job/overview", params={"run": run, "offset": 60, "limit": 10}).json()
    assert page["ranks_total"] == RANKS
    assert page["ranks"] == whole[60:70]  # the last 4 ranks of the slowest-first order
    steps = client.get("/api/job/step-trace", params={"run": run, "step": "2", "limit": 5}).json()
    assert [r["rank"] for r in steps["ranks"]] == [0, 1, 2, 3, 4] and steps["ranks_total"] == RANKS
