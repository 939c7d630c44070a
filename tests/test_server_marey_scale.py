"""The Marey view of a job larger than one page of device rows, served: a generated 40-rank
data-parallel job (``benchmarks/gen_cluster_job.py``, rank 17's compute made 1.3x slower).

Issue 18's scale acceptance is measured on 1,024 ranks by ``bench_server.py --job``; this is the
same path past the 32-row page, fast enough for every test run: the job opens folded, a stage
unfolds a page of devices at a time, and no op is dropped on any page.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient

from _marey import intervals
from _server_helpers import wait_ready
from perfsight.server import create_app
from shared_data import REPO

sys.path.insert(0, str(REPO / "benchmarks"))
from gen_cluster_job import generate  # noqa: E402

RANKS = 40
STRAGGLER = 17
ROWS = 32  # server/job_parallel.py's MAREY_ROWS: device rows a page


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[TestClient, str]]:
    base = tmp_path_factory.mktemp("marey-scale")
    generate(
        base / "job40", ranks=RANKS, size_mb=None, stragglers={STRAGGLER: 1.3}, steps=3, workers=1,
        layers=4, slow_link=None,
    )  # fmt: skip
    client = TestClient(create_app(base, cache_dir=tmp_path_factory.mktemp("cache")))
    with client:
        status = wait_ready(client, "job40", timeout_s=600)
        assert status["status"] == "ready", status
        yield client, "job40"


def _marey(client: TestClient, run: str, **params: object) -> dict:
    response = client.get("/api/job/marey", params={"run": run, **params})
    assert response.status_code == 200, response.text
    return response.json()


def test_a_job_larger_than_a_page_opens_folded_with_every_op(served: tuple[TestClient, str]) -> None:
    client, run = served
    data = _marey(client, run)
    assert data["stages"] == [{"stage": 0, "devices": RANKS, "folded": True}]
    assert data["devices"] == [] and data["device_rows"] == 0
    assert all(intervals(data, op) == [] and op["start_ns"] <= op["end_ns"] for op in data["ops"])
    assert sum(op["ops"] for op in data["ops"]) == data["matched_ops"] > 0


def test_an_unfolded_stage_pages_its_devices_and_each_page_holds_every_op(
    served: tuple[TestClient, str],
) -> None:
    client, run = served
    pages = [_marey(client, run, unfold="0"), _marey(client, run, unfold="0", first=ROWS)]
    assert [[d["rank"] for d in p["devices"]] for p in pages] == [list(range(ROWS)), list(range(ROWS, RANKS))]
    for page in pages:
        assert page["device_rows"] == RANKS and page["rows"] == ROWS
        assert sum(op["ops"] for op in page["ops"]) == page["matched_ops"]
        for d in page["devices"]:  # every op of every drawn device is in some item
            counted = sum(n for op in page["ops"] for r, _, _, n in intervals(page, op) if r == d["rank"])
            assert counted == d["ops"]
            assert d["flops_line"]["bins"] and d["memory_line"]["bins"]


def test_the_slowed_rank_has_the_widest_compute_on_its_page(served: tuple[TestClient, str]) -> None:
    client, run = served
    page = _marey(client, run, unfold="0")
    drawn = {d["rank"]: 0 for d in page["devices"]}
    for op in (op for op in page["ops"] if op["category"] == "compute"):
        for r, s, e, _ in intervals(page, op):
            drawn[r] += e - s
    assert max(drawn, key=lambda r: drawn[r]) == STRAGGLER
    device = {d["rank"]: d for d in page["devices"]}
    assert max(device, key=lambda r: device[r]["compute_ns"]) == STRAGGLER
