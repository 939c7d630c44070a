"""A job's ranks seen side by side: how long each rank's device waited for its host, and how long
it sat idle once its work was launched.

The cluster step trace carries both parts of each rank's free time (``device_idle``) per step, in
the CSV users open and in the slow-card finding: a rank whose free time stands out because its host
launches its work later is told to look at its host, one whose device starts launched work later
is told to look at its card, each with the time measured.

Real data: the two-rank A100 NCCL pair, checked step by step against a split computed in plain
Python from the raw JSON (``test_device_idle.split_from_raw``), and the two Ascend ranks of
``ascend_pt/level1`` against each rank's own analysis.  The slow host: a two-rank job written here,
whose numbers are worked out on paper -- the same kernels on both ranks, launched every 20 us on
rank 0 and every 60 us on rank 1; the slow card: the same job with rank 1's launch calls all made
at its step's start, its kernels keeping their spacing.
"""

from __future__ import annotations

import csv
import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from _server_helpers import TWO_RANKS, copy_into, wait_ready
from conftest import kineto_file, read_real
from perfsight import advisor
from perfsight.analysis.device_idle import device_idle
from perfsight.analysis.step_trace import step_trace
from perfsight.cluster.job import analyse_job, write_cluster_outputs
from perfsight.ingest import read_trace
from perfsight.server import create_app
from shared_data import ASCEND, KINETO, require
from test_device_idle import split_from_raw

HOST_WAIT = "Free(Waiting for Host)(us)"
AFTER_LAUNCH = "Free(After Launch)(us)"
STEP_CSV = "cluster_step_trace_time.csv"


def _csv_rows(out: Path) -> list[dict[str, str]]:
    with (out / "cluster_analysis_output" / STEP_CSV).open(newline="") as handle:
        return list(csv.DictReader(handle))


def _host_wait_ns(row: dict[str, str]) -> int:
    return round(float(row[HOST_WAIT]) * 1000)


def test_each_ranks_host_wait_per_step_is_the_raw_jsons(tmp_path: Path) -> None:
    pair = require(KINETO / "two_ranks_ws128")
    job = tmp_path / "job"
    shutil.copytree(pair, job)
    result = analyse_job(job, executor="serial", per_rank_outputs=False)
    write_cluster_outputs(result, tmp_path / "out")
    want: dict[tuple[int, int], int] = {}
    after: dict[tuple[int, int], int] = {}  # the device idle once its work was launched
    for path in sorted(job.glob("*.json.gz")):
        trace = read_real(path)
        split = split_from_raw(path, trace, step_trace(trace))
        want.update({(trace.rank, step): parts[1] for step, parts in split.items()})
        after.update({(trace.rank, step): parts[2] for step, parts in split.items()})
    assert len(want) == 4 and all(v > 0 for v in want.values()) and all(v > 0 for v in after.values())
    got = {(int(r["rank"]), int(r["step"])): int(r["host_wait_ns"]) for _, r in result.steps.iterrows()}
    assert got == want
    got = {(int(r["rank"]), int(r["step"])): int(r["after_launch_ns"]) for _, r in result.steps.iterrows()}
    assert got == after
    rows = _csv_rows(tmp_path / "out")
    in_csv = {
        (int(r["Index"]), int(r["Step"])): _host_wait_ns(r)
        for r in rows
        if r["Type"] == "rank" and r["Step"] != "average"
    }
    assert in_csv == want
    in_csv = {
        (int(r["Index"]), int(r["Step"])): round(float(r[AFTER_LAUNCH]) * 1000)
        for r in rows
        if r["Type"] == "rank" and r["Step"] != "average"
    }
    assert in_csv == after
    averages = {
        int(r["Index"]): _host_wait_ns(r) for r in rows if r["Type"] == "rank" and r["Step"] == "average"
    }
    used = result.steps.loc[result.steps["averaged"]]
    for rank, mean in used.groupby("rank")["host_wait_ns"].mean().items():
        assert averages[int(rank)] == round(mean)


def test_the_job_overview_shows_each_ranks_split_of_its_free_time(tmp_path: Path) -> None:
    base = tmp_path / "base"
    for name in TWO_RANKS:
        copy_into(base, kineto_file(name), f"job/{Path(name).name}")
    result = analyse_job(base / "job", executor="serial", per_rank_outputs=False)
    used = result.steps.loc[result.steps["averaged"]].groupby("rank")
    with TestClient(create_app(base, cache_dir=tmp_path / "cache")) as client:
        assert wait_ready(client, "job")["status"] == "ready"
        ranks = client.get("/api/job/overview", params={"run": "job"}).json()["ranks"]
    assert len(ranks) == 2
    for row in ranks:  # the averaged steps' mean, as the CSV's average row gives it (in us)
        for part in ("host_wait_ns", "after_launch_ns"):
            assert row[part] > 0 and abs(row[part] - used[part].mean().loc[row["rank"]]) <= 1, (row, part)


def test_ascend_ranks_host_wait_is_each_ranks_own_analysis(tmp_path: Path) -> None:
    level1 = require(ASCEND / "level1")
    write_cluster_outputs(analyse_job(level1, executor="serial", per_rank_outputs=False), tmp_path / "out")
    rows = [r for r in _csv_rows(tmp_path / "out") if r["Type"] == "rank" and r["Step"] != "average"]
    want = {}
    for folder in sorted(level1.glob("rank*_ascend_pt")):
        trace = read_trace(folder / "ASCEND_PROFILER_OUTPUT" / "trace_view.json")
        for row in device_idle(trace, step_trace(trace)).to_pylist():
            want[(row["rank"], row["step"])] = row["host_wait_ns"]
    assert len(want) == 2 and all(v > 0 for v in want.values())
    assert {(int(r["Index"]), int(r["Step"])): _host_wait_ns(r) for r in rows} == want


# ---------------------------------------------------------------------------------------------
# a slow host, worked out on paper

STEPS, KERNELS, KERNEL_US = 5, 10, 15
"""Each step: an ``aten::mm`` launches KERNELS kernels of KERNEL_US one after the other on one
stream, one every ``launch_every_us``, the first 10 us into the step; the step ends 10 us after the
last launch slot (a synchronisation): 220 us on rank 0, 620 us on rank 1."""


def _rank_trace(rank: int, launch_every_us: int, launched_at_once: bool) -> dict[str, Any]:
    """One rank's Kineto trace.  Each kernel starts 2 us after its launch call; with
    ``launched_at_once`` every call is made at the step's start instead and the kernels keep their
    spacing (the device then waits after the launch -- on a dependency -- not for it)."""
    host = {"ph": "X", "pid": 100 + rank, "tid": 1}
    device = {"ph": "X", "pid": 0, "tid": 7}
    step_us = 20 + KERNELS * launch_every_us
    events: list[dict[str, Any]] = []
    correlation = 0
    for step in range(STEPS):
        begin, ext = step * step_us, {"External id": step + 1}
        events.append(
            {**host, "cat": "user_annotation", "name": f"ProfilerStep#{step}", "ts": begin, "dur": step_us}
        )
        events.append(
            {**host, "cat": "cpu_op", "name": "aten::mm", "ts": begin + 5, "dur": step_us - 10, "args": ext}
        )
        for k in range(KERNELS):
            correlation += 1
            kernel_at = begin + 10 + k * launch_every_us + 2
            call_at = begin + 10 + k if launched_at_once else kernel_at - 2
            ids = {"correlation": correlation, **ext}
            events.append(
                {
                    **host,
                    "cat": "cuda_runtime",
                    "name": "cudaLaunchKernel",
                    "ts": call_at,
                    "dur": 1,
                    "args": ids,
                }
            )
            events.append(
                {
                    **device,
                    "cat": "kernel",
                    "name": "gemm_kernel",
                    "ts": kernel_at,
                    "dur": KERNEL_US,
                    "args": {**ids, "stream": 7, "device": 0},
                }
            )
    return {"distributedInfo": {"rank": rank, "world_size": 2, "backend": "nccl"}, "traceEvents": events}


def _job(folder: Path, rank1_launched_at_once: bool) -> Path:
    folder.mkdir()
    (folder / "rank0.pt.trace.json").write_text(json.dumps(_rank_trace(0, 20, False)))
    (folder / "rank1.pt.trace.json").write_text(json.dumps(_rank_trace(1, 60, rank1_launched_at_once)))
    return folder


def _slow_card(findings: list[dict[str, Any]]) -> dict[str, Any]:
    found = [f for f in findings if f["rule"] == "slow_rank"]
    assert len(found) == 1, [(f["rule"], f["title"]) for f in findings]
    return found[0]


def test_a_rank_whose_host_launches_later_is_told_to_look_at_its_host(tmp_path: Path) -> None:
    result = analyse_job(_job(tmp_path / "job", False), executor="serial", per_rank_outputs=False)
    # per step, between the first kernel's start and the last one's end, 9 gaps: 20 - 15 = 5 us on
    # rank 0, 60 - 15 = 45 us on rank 1, of which the last 2 us follow the launch call
    waits = result.steps.groupby("rank")["host_wait_ns"].agg(["min", "max"])
    assert waits.loc[0].tolist() == [9 * 3_000] * 2
    assert waits.loc[1].tolist() == [9 * 43_000] * 2
    # free: 620 - 150 = 470 us against 220 - 150 = 70 us, 400 us longer, 360 us of it host wait
    card = _slow_card(advisor.job_findings(result))
    assert card["culprit"] == {"kind": "rank", "name": "1"} and card["category"] == "host"
    assert "waits 0.36 ms a step longer than the others' for its host to launch work" in card["suggestion"]
    evidence = {e["metric"]: e["value"] for e in card["evidence"]}
    assert evidence["of which the device waiting for its host to launch work, per step"] == 9 * 40_000


def test_a_rank_whose_device_waits_after_the_launch_is_told_to_look_at_its_card(tmp_path: Path) -> None:
    job = _job(tmp_path / "job", True)
    result = analyse_job(job, executor="serial", per_rank_outputs=False)
    # rank 1's calls all come first: its 9 gaps of 45 us a step follow their launch calls; rank 0's
    # gaps of 5 us have their last 2 us after the call
    steps = result.steps.set_index("rank")
    assert steps.loc[1, "host_wait_ns"].eq(0).all()
    assert steps.loc[1, "after_launch_ns"].eq(9 * 45_000).all()
    assert steps.loc[0, "after_launch_ns"].eq(9 * 2_000).all()
    card = _slow_card(advisor.job_findings(result))
    assert card["culprit"] == {"kind": "rank", "name": "1"} and card["category"] == "host"
    assert "for its host to launch work" not in card["suggestion"]
    told = "sits idle 0.387 ms a step longer than the others' after its work was launched"
    assert told in card["suggestion"]
    evidence = {e["metric"]: e["value"] for e in card["evidence"]}
    assert "of which the device waiting for its host to launch work, per step" not in evidence
    assert evidence["of which the device idle after its work was launched, per step"] == 9 * 43_000
    # the same per-step split in the file a user opens
    write_cluster_outputs(result, tmp_path / "out")
    rows = [r for r in _csv_rows(tmp_path / "out") if r["Type"] == "rank" and r["Step"] != "average"]
    in_csv = {(int(r["Index"]), round(float(r[AFTER_LAUNCH]) * 1000)) for r in rows}
    assert in_csv == {(0, 18_000), (1, 405_000)}


@pytest.fixture(autouse=True)
def _no_stray_output(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # nothing a job writes lands in the repository


def test_the_job_summary_names_the_ranks_a_finding_was_seen_on(tmp_path: Path) -> None:
    level1 = require(ASCEND / "level1")
    cli = [sys.executable, "-m", "perfsight.cli"]
    command = [*cli, "analyse", str(level1), "--out", str(tmp_path), "--no-progress"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    doc = json.loads((tmp_path / "cluster_analysis_output" / "advisor.json").read_text(encoding="utf-8"))
    launch = next(f for f in doc["findings"] if f["rule"] == "host_wait")
    assert launch["ranks"] == [0, 1]  # both ranks wait for their hosts; the title gives the worse one
    line = next(x for x in done.stdout.splitlines() if launch["title"] in x)
    assert "[seen on ranks 0-1]:" in line
