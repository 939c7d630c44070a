"""The findings endpoints on real analyses: a real Kineto trace and real multi-process jobs.

The oracle is the ``advisor.json`` each analysis wrote (read here with the standard library): the
server must serve exactly those findings, in the advisor's order, and recompute nothing.  The
pipeline job's expectation comes from how it was run (stage 1 given four times the layers).
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from _jobs import DDP_JOB, OVERLOADED_STAGE, PP_JOB, SLOW_RANK, STRAGGLER_JOB, demo_base
from _server_helpers import NCCL, copy_into, wait_ready
from conftest import kineto_file
from perfsight.server import create_app

RUN = "gpu/nccl_data.json.gz"
SEVERITIES = ["critical", "warning", "info"]


@pytest.fixture(scope="module")
def trace_app(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[TestClient, Path]]:
    """The server on a base dir holding one real Kineto trace, analysed into its own cache."""
    base = tmp_path_factory.mktemp("base")
    cache = tmp_path_factory.mktemp("cache")
    copy_into(base, kineto_file(NCCL), RUN)
    with TestClient(create_app(base, cache_dir=cache)) as client:
        assert wait_ready(client, RUN)["status"] == "ready"
        yield client, cache


@pytest.fixture(scope="module")
def jobs_app(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[TestClient, Path, Path]]:
    """The server on `make demo`'s jobs: the DDP job analysed by the CLI beside it, the pipeline and
    straggler jobs analysed by the server into its cache."""
    base = demo_base(tmp_path_factory, tmp_path_factory.mktemp("jobs") / "demo_output", straggler=True)
    cache = tmp_path_factory.mktemp("jobs-cache")
    with TestClient(create_app(base, cache_dir=cache)) as client:
        for run in (DDP_JOB, PP_JOB, STRAGGLER_JOB):
            assert wait_ready(client, run, timeout_s=300)["status"] == "ready"
        yield client, base, cache


def _get(client: TestClient, path: str, **params: Any) -> dict[str, Any]:
    response = client.get(f"/api/{path}", params=params)
    assert response.status_code == 200, response.text
    return response.json()


def _written(folder: Path, pattern: str) -> list[dict[str, Any]]:
    """The findings of the one advisor.json under ``folder`` matching ``pattern``."""
    files = sorted(folder.rglob(pattern))
    assert len(files) == 1, files
    return json.loads(files[0].read_text(encoding="utf-8"))["findings"]


def _check_shape(answer: dict[str, Any]) -> None:
    findings = answer["findings"]
    assert answer["counts"] == {s: sum(f["severity"] == s for f in findings) for s in SEVERITIES}
    ranks = [SEVERITIES.index(f["severity"]) for f in findings]
    assert ranks == sorted(ranks), "most severe first"
    for f in findings:
        assert set(f["texts"]) >= {"en", "zh"}
        assert f["texts"]["en"]["title"] == f["title"]


def test_a_rank_serves_the_findings_its_analysis_wrote(trace_app: tuple[TestClient, Path]) -> None:
    client, cache = trace_app
    answer = _get(client, "run/findings", run=RUN, rank=0)
    assert answer["scope"] == "rank" and answer["rank"] == 0
    assert answer["source"] == "PROFILER_OUTPUT/advisor.json"
    assert answer["findings"] == _written(cache, "PROFILER_OUTPUT/advisor.json")
    assert answer["findings"], "a real GPU training trace gets at least its bound (info) finding"
    _check_shape(answer)
    # without ?rank= it is the run's first rank, as on every rank page
    assert _get(client, "run/findings", run=RUN) == answer


def test_a_single_trace_has_no_job_findings_and_an_unknown_rank_is_404(
    trace_app: tuple[TestClient, Path],
) -> None:
    client, _ = trace_app
    job = client.get("/api/job/findings", params={"run": RUN})
    assert job.status_code == 404 and "cross-rank" in job.json()["detail"]
    assert client.get("/api/run/findings", params={"run": RUN, "rank": 7}).status_code == 404
    assert client.get("/api/run/findings", params={"run": "../etc"}).status_code == 404


def test_a_missing_or_damaged_advisor_json_is_said_not_a_traceback(
    trace_app: tuple[TestClient, Path],
) -> None:
    client, cache = trace_app
    (written,) = cache.rglob("PROFILER_OUTPUT/advisor.json")
    before = written.read_bytes()
    written.unlink()
    missing = client.get("/api/run/findings", params={"run": RUN})
    assert missing.status_code == 404
    detail = missing.json()["detail"]
    assert "advisor.json" in detail and "analyse" in detail and str(cache) not in detail
    written.write_bytes(before[: len(before) // 2])  # truncated: the analysis is set aside and redone
    damaged = client.get("/api/run/findings", params={"run": RUN})
    assert damaged.status_code == 409, damaged.text
    assert "could not be read" in damaged.json()["detail"]
    assert wait_ready(client, RUN)["status"] == "ready"
    again = _get(client, "run/findings", run=RUN)
    (rewritten,) = cache.rglob("PROFILER_OUTPUT/advisor.json")
    assert again["findings"] == json.loads(rewritten.read_text(encoding="utf-8"))["findings"]


def test_the_overloaded_pipeline_stage_is_the_first_job_finding(
    jobs_app: tuple[TestClient, Path, Path],
) -> None:
    client, _, cache = jobs_app
    answer = _get(client, "job/findings", run=PP_JOB)
    assert answer["scope"] == "job" and answer["rank"] is None
    assert answer["source"] == "cluster_analysis_output/advisor.json"
    written = [
        json.loads(p.read_text(encoding="utf-8"))["findings"]
        for p in cache.rglob("cluster_analysis_output/advisor.json")
    ]
    assert answer["findings"] in written  # the pipeline job's, served as written
    _check_shape(answer)
    top = answer["findings"][0]
    assert top["rule"] == "stage_imbalance" and top["severity"] != "info"
    assert top["culprit"] == {"kind": "stage", "name": str(OVERLOADED_STAGE)}


def test_a_job_analysed_beside_its_traces_is_read_from_there(jobs_app: tuple[TestClient, Path, Path]) -> None:
    client, base, _ = jobs_app
    answer = _get(client, "job/findings", run=DDP_JOB)
    assert answer["findings"] == _written(base / "analysis", "cluster_analysis_output/advisor.json")
    _check_shape(answer)
    # each rank's own findings come from that rank's PROFILER_OUTPUT/advisor.json beside it
    for rank in (0, 1):
        mine = _get(client, "run/findings", run=DDP_JOB, rank=rank)
        assert mine["rank"] == rank
        files = [p for p in (base / "analysis").rglob("PROFILER_OUTPUT/advisor.json")]
        assert mine["findings"] in [json.loads(p.read_text(encoding="utf-8"))["findings"] for p in files]


def test_the_straggler_is_named_by_a_rank_finding(jobs_app: tuple[TestClient, Path, Path]) -> None:
    client, _, _ = jobs_app
    answer = _get(client, "job/findings", run=STRAGGLER_JOB)
    above_info = [f for f in answer["findings"] if f["severity"] != "info"]
    assert above_info and above_info[0]["culprit"] == {"kind": "rank", "name": str(SLOW_RANK)}


def test_an_advisor_json_linked_from_outside_the_base_folder_is_not_served(
    jobs_app: tuple[TestClient, Path, Path], tmp_path: Path
) -> None:
    _, base, _ = jobs_app
    own = tmp_path / "base"
    shutil.copytree(base / "analysis", own / "analysis", symlinks=True)
    (written,) = (own / "analysis").rglob("cluster_analysis_output/advisor.json")
    secret = tmp_path / "secret.json"
    doc = json.loads(written.read_text(encoding="utf-8"))
    for finding in doc["findings"]:
        finding["title"] = "SECRET outside the base folder"
    secret.write_text(json.dumps(doc), encoding="utf-8")
    written.unlink()
    os.symlink(secret, written)
    with TestClient(create_app(own, cache_dir=tmp_path / "cache")) as client:
        (run,) = [r["id"] for r in client.get("/api/runs").json()["runs"]]
        assert wait_ready(client, run)["status"] == "ready"
        response = client.get("/api/job/findings", params={"run": run})
        assert response.status_code == 404, response.text
        assert "SECRET" not in response.text and str(tmp_path) not in response.text
        assert client.get("/api/job/overview", params={"run": run}).status_code == 200
