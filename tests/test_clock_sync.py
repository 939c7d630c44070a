"""Clock alignment over a real gloo process group (tests/_clock_job.py), and without one."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")

from perfsight.collect.clock_sync import ClockOffset, estimate_clock_offset  # noqa: E402

JOB = Path(__file__).with_name("_clock_job.py")
LEVELS_JOB = Path(__file__).with_name("_clock_levels_job.py")


def start_job(out: Path, world: int, absent: int | None, job: Path = JOB) -> list[subprocess.Popen]:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    extra = [] if absent is None else [str(absent)]
    return [
        subprocess.Popen(
            [sys.executable, str(job), str(rank), str(world), str(port), str(out), *extra],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        for rank in range(world)
    ]


def collect_logs(procs: list[subprocess.Popen]) -> list[str]:
    try:
        return [proc.communicate(timeout=180)[0].decode(errors="replace") for proc in procs]
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()


def finish_job(procs: list[subprocess.Popen], out: Path, absent: int) -> dict[int, dict]:
    logs = collect_logs(procs)
    results = {}
    for rank in range(len(procs)):
        path = out / f"clock_{rank}.json"
        if path.exists():
            results[rank] = json.loads(path.read_text())
    assert set(results) == set(range(len(procs))) - {absent}, "\n".join(logs)
    return results


@pytest.fixture(scope="module")
def jobs(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[int, dict], dict[int, dict]]:
    """Two jobs at once (process start-up dominates): rank 2 of 3 silent; the reference of 2 silent."""
    late, early = tmp_path_factory.mktemp("late_rank"), tmp_path_factory.mktemp("no_reference")
    first, second = start_job(late, world=3, absent=2), start_job(early, world=2, absent=0)
    return finish_job(first, late, absent=2), finish_job(second, early, absent=0)


@pytest.fixture(scope="module")
def profiled_levels(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real 2-rank gloo DDP job profiled by ``perfsight.profile`` once at each level."""
    out = tmp_path_factory.mktemp("levels")
    procs = start_job(out, world=2, absent=None, job=LEVELS_JOB)
    logs = collect_logs(procs)
    assert [proc.returncode for proc in procs] == [0, 0], "\n".join(logs)
    return out


def test_offsets_on_one_host_are_within_their_uncertainty_and_a_silent_rank_costs_one_timeout(jobs) -> None:
    results = jobs[0]
    assert results[0]["offset_ns"] == 0 and results[0]["uncertainty_ns"] == 0
    one = results[1]
    assert one["rounds"] == 6 and one["reference_rank"] == 0
    # one host, one clock: the true offset is 0, and NTP's bound (half the round trip) must hold
    assert one["uncertainty_ns"] is not None and 0 < one["uncertainty_ns"] < 50_000_000
    assert abs(one["offset_ns"]) <= one["uncertainty_ns"]
    assert results[0]["elapsed_s"] < 1.0 + 5.0  # waited one timeout for rank 2, then went on


def test_a_missing_reference_rank_yields_no_uncertainty_instead_of_a_hang(jobs) -> None:
    results = jobs[1]
    assert results[1]["uncertainty_ns"] is None and results[1]["offset_ns"] == 0
    assert results[1]["elapsed_s"] < 2 * 1.0 + 5.0


def test_without_a_process_group_the_offset_is_zero_and_unmeasured() -> None:
    assert estimate_clock_offset() == ClockOffset(0, None, 0)


@pytest.mark.parametrize("level", ["Level0", "Level1", "Level2"])
def test_every_rank_records_its_clock_offset_and_uncertainty_at_every_level(
    profiled_levels: Path, level: str
) -> None:
    infos = {}
    for path in (profiled_levels / level).glob("*_perfsight/profiler_info_*.json"):
        info = json.loads(path.read_text())
        infos[info["rank"]] = info
    assert sorted(infos) == [0, 1]
    assert infos[0]["clock"]["offset_ns"] == 0 and infos[0]["clock"]["uncertainty_ns"] == 0
    clock = infos[1]["clock"]
    assert clock["reference_rank"] == 0 and clock["rounds"] >= 1
    assert isinstance(clock["offset_ns"], int) and isinstance(clock["uncertainty_ns"], int)
    # one host, one clock: the true offset 0 lies within the measured offset +- its uncertainty
    assert 0 < clock["uncertainty_ns"] < 50_000_000 and abs(clock["offset_ns"]) <= clock["uncertainty_ns"]


def test_the_cluster_analysis_aligns_ranks_with_the_recorded_offsets(profiled_levels: Path) -> None:
    from perfsight.cluster.job import analyse_job

    recorded = {}
    for path in (profiled_levels / "Level1").glob("*_perfsight/profiler_info_*.json"):
        info = json.loads(path.read_text())
        recorded[info["rank"]] = info["clock"]["offset_ns"]
    result = analyse_job(profiled_levels / "Level1", executor="serial", per_rank_outputs=False)
    assert result.alignment.method == "recorded"
    assert result.alignment.offset_ns == recorded
