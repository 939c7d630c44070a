"""The heatmaps' and time overview's API on real jobs: each number is the cluster analysis's own
(cluster_resources.csv, cluster_step_trace_time.csv, cluster_communication_ops.csv), only selected."""

from __future__ import annotations

import csv
import subprocess
import sys
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from _jobs import DDP_JOB, DDP_RANKS, OVERLOADED_STAGE, PP_JOB, demo_base
from _server_helpers import wait_ready
from perfsight.server import create_app
from shared_data import REPO


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return demo_base(tmp_path_factory, tmp_path_factory.mktemp("views-api") / "demo_output")


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("views-cache")


@pytest.fixture(scope="module")
def client(base: Path, cache: Path) -> TestClient:
    with TestClient(create_app(base, cache_dir=cache)) as client:
        for run in (DDP_JOB, PP_JOB):
            assert wait_ready(client, run)["status"] == "ready"
        yield client


def _cluster_file(base: Path, cache: Path, run: str, name: str) -> Path:
    """The job's own analysis file: the server's (in its cache, in a folder named after the run)
    when it analysed the job itself, else the CLI's (``analysis/``, the DDP job)."""
    found = sorted(cache.rglob(f"{run}-*/cluster_analysis_output/{name}"))
    assert len(found) <= 1, found
    if found:
        return found[0]
    assert run == DDP_JOB, f"the server did not analyse {run}"
    return base / "analysis" / "cluster_analysis_output" / name


def _csv(path: Path) -> list[dict[str, str]]:
    with path.open(newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


def _num(text: str) -> float | None:
    return float(text) if text not in ("", None) else None


@pytest.mark.parametrize("run", [DDP_JOB, PP_JOB])
def test_each_heatmap_cell_is_the_ranks_row_of_cluster_resources(
    client: TestClient, base: Path, cache: Path, run: str
) -> None:
    got = client.get("/api/job/heatmaps", params={"run": run}).json()
    want = {int(r["rank"]): r for r in _csv(_cluster_file(base, cache, run, "cluster_resources.csv"))}
    assert sorted(c["rank"] for c in got["cells"]) == sorted(want)
    for cell in got["cells"]:
        row = want[cell["rank"]]
        assert cell["host"] == (row["host"] or None)
        assert cell["peak_allocated_bytes"] == (
            int(float(row["peak_allocated_bytes"])) if row["peak_allocated_bytes"] else None
        )
        assert cell["flops"] == pytest.approx(_num(row["flops"]))
        assert cell["flops_normalised"] == pytest.approx(_num(row["flops_normalised"]))
        assert cell["peak_share"] == (
            None if not row["peak_share"] else pytest.approx(float(row["peak_share"]))
        )
    # rows = hosts: every cell of a host is listed together, under the host the API names
    assert [c["host"] for c in got["cells"]] == sorted(
        (c["host"] for c in got["cells"]), key=got["hosts"].index
    )
    # a CPU job records no device capacity: the colour is a share of the largest peak, and says so
    if all(not r["capacity_bytes"] for r in want.values()):
        assert got["memory_basis"] == "max_peak"
        largest = max(c["peak_allocated_bytes"] for c in got["cells"])
        assert max(c["peak_of_max"] for c in got["cells"]) == pytest.approx(1.0)
        assert got["max_peak_bytes"] == largest


def test_the_overloaded_stages_rank_is_the_heaviest_in_the_flops_heatmap(client: TestClient) -> None:
    got = client.get("/api/job/heatmaps", params={"run": PP_JOB}).json()
    by_stage = {c["stage"]: c for c in got["cells"]}  # one rank per stage in the 2-stage job
    assert by_stage[OVERLOADED_STAGE]["flops_normalised"] == pytest.approx(1.0)
    # four times the layers: about a quarter of the work on the other stage (FLOPs are counted)
    assert by_stage[1 - OVERLOADED_STAGE]["flops_normalised"] == pytest.approx(0.25, abs=0.1)


@pytest.mark.parametrize("run", [DDP_JOB, PP_JOB])
def test_the_time_overview_is_the_cluster_step_trace_per_step(
    client: TestClient, base: Path, cache: Path, run: str
) -> None:
    got = client.get("/api/job/time-overview", params={"run": run}).json()
    trace = [
        r for r in _csv(_cluster_file(base, cache, run, "cluster_step_trace_time.csv"))
        if r["Type"] == "rank" and r["Step"] != "average"
    ]  # fmt: skip
    waits: dict[tuple[str, int], float] = defaultdict(float)
    for op in _csv(_cluster_file(base, cache, run, "cluster_communication_ops.csv")):
        waits[(op["step"], int(op["rank"]))] += float(op["wait_ns"] or 0)
    steps = sorted({r["Step"] for r in trace}, key=int)
    assert [s["step"] for s in got["steps"]] == steps
    for s in got["steps"]:
        rows = [r for r in trace if r["Step"] == s["step"]]
        times = {int(r["Index"]): float(r["Step Time(us)"]) * 1000 for r in rows}
        assert s["ranks"] == len(rows)
        assert s["min_ns"] == pytest.approx(min(times.values()), abs=1)
        assert s["max_ns"] == pytest.approx(max(times.values()), abs=1)
        assert times[s["slowest_rank"]] == pytest.approx(max(times.values()), abs=1)
        comm = [float(r["Communication(us)"]) * 1000 for r in rows]
        assert s["mean_communication_ns"] == pytest.approx(sum(comm) / len(comm), abs=1)
        wait = [waits[(s["step"], rank)] for rank in times]
        assert s["mean_wait_ns"] == pytest.approx(sum(wait) / len(wait), abs=1)
    # few ranks: one line per rank, each of its steps' times
    assert [r["rank"] for r in got["series"]] == sorted({int(r["Index"]) for r in trace})
    if run == DDP_JOB:
        assert got["rank_count"] == DDP_RANKS
    for line in got["series"]:
        for step, value in zip(steps, line["durations_ns"], strict=True):
            row = next(r for r in trace if r["Step"] == step and int(r["Index"]) == line["rank"])
            assert value == pytest.approx(float(row["Step Time(us)"]) * 1000, abs=1)


def test_an_unknown_run_is_a_404_that_names_it(client: TestClient) -> None:
    missing = client.get("/api/job/heatmaps", params={"run": "no-such-run"})
    assert missing.status_code == 404 and "no-such-run" in missing.json()["detail"]


BAND_RANKS = 72  # more than the time overview draws as lines (job_views.SERIES_MAX_RANKS)
RANKS_PER_HOST = 8


@pytest.fixture(scope="module")
def wide_job(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[TestClient, Path]]:
    """A synthetic 72-rank data-parallel job on 9 hosts (benchmarks/gen_cluster_job.py), analysed
    by the server."""
    base = tmp_path_factory.mktemp("views-wide")
    result = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "gen_cluster_job.py"), "--out", str(base / "job")]
        + ["--ranks", str(BAND_RANKS), "--size-mb", "0.2", "--layers", "2", "--stragglers", "5:1.3"]
        + ["--ranks-per-host", str(RANKS_PER_HOST)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    cache = tmp_path_factory.mktemp("views-wide-cache")
    with TestClient(create_app(base, cache_dir=cache)) as client:
        assert wait_ready(client, "job", timeout_s=600)["status"] == "ready"
        yield client, cache


def test_a_wide_job_is_one_heatmap_row_per_host_and_a_band_of_step_times(
    wide_job: tuple[TestClient, Path],
) -> None:
    client, cache = wide_job
    heat = client.get("/api/job/heatmaps", params={"run": "job"}).json()
    assert len(heat["cells"]) == BAND_RANKS
    assert len(heat["hosts"]) == BAND_RANKS // RANKS_PER_HOST
    for host in heat["hosts"]:
        assert len([c for c in heat["cells"] if c["host"] == host]) == RANKS_PER_HOST
    # the generator records each GPU's memory: the heatmap is a share of capacity, as the CSV's
    want = {
        int(r["rank"]): r for r in _csv(next(cache.rglob("cluster_analysis_output/cluster_resources.csv")))
    }
    assert heat["memory_basis"] == "capacity"
    for cell in heat["cells"]:
        assert cell["peak_share"] == pytest.approx(float(want[cell["rank"]]["peak_share"]))
    overview = client.get("/api/job/time-overview", params={"run": "job"}).json()
    assert overview["rank_count"] == BAND_RANKS and overview["series"] == []  # too many ranks for lines
    trace = [
        r for r in _csv(next(cache.rglob("cluster_analysis_output/cluster_step_trace_time.csv")))
        if r["Type"] == "rank" and r["Step"] != "average"
    ]  # fmt: skip
    for s in overview["steps"]:
        times = [float(r["Step Time(us)"]) * 1000 for r in trace if r["Step"] == s["step"]]
        assert s["ranks"] == BAND_RANKS
        assert (s["min_ns"], s["max_ns"]) == (
            pytest.approx(min(times), abs=1),
            pytest.approx(max(times), abs=1),
        )
        assert min(times) <= s["median_ns"] <= max(times)
