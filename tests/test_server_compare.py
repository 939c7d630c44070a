"""``/api/compare``: the compare page and the job's card comparison read the same comparison as
``perfsight compare`` -- the same numbers for the same ranks, run ids instead of paths, and clear
404s for a run or rank that is not there."""

from __future__ import annotations

from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from _jobs import DDP_JOB, SLOW_RANK, STRAGGLER_JOB, demo_base
from _server_helpers import wait_ready
from perfsight.compare import compare
from perfsight.server import create_app


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return demo_base(
        tmp_path_factory, tmp_path_factory.mktemp("demo-compare") / "demo_output", straggler=True
    )


@pytest.fixture(scope="module")
def client(base: Path, tmp_path_factory: pytest.TempPathFactory) -> TestClient:
    with TestClient(create_app(base, cache_dir=tmp_path_factory.mktemp("cache"))) as client:
        for run in (DDP_JOB, STRAGGLER_JOB):
            assert wait_ready(client, run)["status"] == "ready"
        yield client


def test_card_comparison_is_the_cli_comparison_of_the_same_two_ranks(client: TestClient, base: Path) -> None:
    got = client.get(
        "/api/compare",
        params={"base": STRAGGLER_JOB, "new": STRAGGLER_JOB, "base_rank": 0, "new_rank": SLOW_RANK},
    )
    assert got.status_code == 200, got.text
    doc = got.json()
    assert doc["base"]["input"] == f"{STRAGGLER_JOB}:rank0" and doc["new"]["rank"] == SLOW_RANK
    assert str(base) not in got.text  # run ids, never the server's paths
    expected = compare(f"{base / STRAGGLER_JOB}:rank0", f"{base / STRAGGLER_JOB}:rank{SLOW_RANK}")
    want = {row["metric"]: row for row in expected.to_dict()["step_breakdown"]}
    for row in doc["step_breakdown"]:
        for column in ("base", "new", "delta"):
            assert row[column] == pytest.approx(want[row["metric"]][column]), (row["metric"], column)
    # the slow rank's extra matrix products: its compute grew beyond noise, and it leads the ranking
    computing = next(r for r in doc["step_breakdown"] if r["metric"] == "computing_ns")
    assert computing["delta"] > 0 and computing["beyond_noise"] is True
    real = [r for r in doc["regressions"] if r["real"] and r["delta_ns"] > 0]
    assert real[0]["category"] in ("compute", "operator")


def test_two_runs_compare_and_the_rows_are_capped_by_limit(client: TestClient) -> None:
    doc = client.get("/api/compare", params={"base": DDP_JOB, "new": STRAGGLER_JOB, "limit": 3}).json()
    assert doc["base"]["input"] == f"{DDP_JOB}:rank0" and doc["new"]["input"] == f"{STRAGGLER_JOB}:rank0"
    assert len(doc["operators"]) == 3 < doc["operators_rows"]
    counts = doc["counts"]["operators"]
    assert sum(counts.values()) == doc["operators_rows"]


def test_an_unknown_run_or_rank_is_a_404_naming_it(client: TestClient) -> None:
    missing = client.get("/api/compare", params={"base": "nowhere", "new": DDP_JOB})
    assert missing.status_code == 404 and "nowhere" in missing.json()["detail"]
    rank = client.get("/api/compare", params={"base": DDP_JOB, "new": DDP_JOB, "new_rank": 9})
    assert rank.status_code == 404 and "9" in rank.json()["detail"]
