"""Run discovery and background analysis: perfsight run folders, analysed folders, stale inputs, bad files."""

from __future__ import annotations

import gzip
import json
import os
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from _server_helpers import copy_into, wait_ready
from conftest import kineto_file
from perfsight.api import analyse
from perfsight.server import create_app

CPU = "cpu_only/rank-34.Jul_15_10_52_41.1074.pt.trace.json.gz"


def _runs(client: TestClient) -> dict[str, dict]:
    return {r["id"]: r for r in client.get("/api/runs").json()["runs"]}


def test_perfsight_run_folders_are_runs_analysed_into_the_server_cache(tmp_path: Path) -> None:
    base = tmp_path / "base"
    for rank in (0, 1):  # each in a folder of its own: rank folders side by side are one job
        folder = base / f"window{rank}" / f"host_{rank}_20260101000000000000_perfsight"
        copy_into(base, kineto_file(CPU), f"{folder.relative_to(base)}/kineto_trace_{rank}.json.gz")
        info = {
            "rank": rank,
            "world_size": 2,
            "complete": True,
            "files": {"trace": f"kineto_trace_{rank}.json.gz"},
        }
        (folder / f"profiler_info_{rank}.json").write_text(json.dumps(info))
    with TestClient(create_app(base, cache_dir=tmp_path / "cache")) as client:
        runs = _runs(client)
        assert {r["kind"] for r in runs.values()} == {"perfsight_run"}
        assert sorted(r["ranks"][0] for r in runs.values()) == [0, 1]
        run = "window1/host_1_20260101000000000000_perfsight"
        status = wait_ready(client, run)
        assert status["status"] == "ready" and status["ranks"] == [1]  # the rank profiler_info records
        assert not (base / run / "PROFILER_OUTPUT").exists()  # nothing written beside the data
        assert len(list((tmp_path / "cache").rglob("trace_view.json"))) == 1
        assert client.get("/api/run/trace-view", params={"run": run}).status_code == 200
        overview = client.get("/api/run/overview", params={"run": run}).json()
        assert overview["rank"] == 1 and overview["steps"]
        assert _runs(client)[run]["status"] == "ready"


def test_a_folder_analysed_by_the_cli_is_reused_and_refreshed_when_its_input_changes(tmp_path: Path) -> None:
    base = tmp_path / "base"
    trace = copy_into(base, kineto_file(CPU), "run/trace.json.gz")
    analyse(trace, out=base / "analysis")
    before = (base / "analysis" / "rank34" / "cache" / "slices.parquet").stat().st_mtime_ns
    with TestClient(create_app(base, cache_dir=tmp_path / "cache")) as client:
        runs = _runs(client)
        assert list(runs) == ["run/trace.json.gz"]  # the analysis is shown as its input's run
        assert wait_ready(client, "run/trace.json.gz")["status"] == "ready"
        assert (base / "analysis" / "rank34" / "cache" / "slices.parquet").stat().st_mtime_ns == before
        assert not (base / "run" / "trace_perfsight").exists()  # nothing analysed twice
        os.utime(trace, ns=(before + 10**9, before + 10**9))  # the input changed
        import perfsight.server.registry as registry

        registry.DISCOVERY_TTL_S = 0.0
        try:
            assert _runs(client)["run/trace.json.gz"]["status"] == "stale"
            assert wait_ready(client, "run/trace.json.gz")["status"] == "ready"
        finally:
            registry.DISCOVERY_TTL_S = 2.0
        after = (base / "analysis" / "rank34" / "cache" / "slices.parquet").stat().st_mtime_ns
        assert after == before  # re-analysed into the server's cache: the user's analysis is untouched
        assert list((tmp_path / "cache").rglob("slices.parquet"))
        assert client.get("/api/run/timeline/tracks", params={"run": "run/trace.json.gz"}).status_code == 200


def test_bad_files_fail_with_a_reason_and_truncated_ones_are_served_with_a_warning(tmp_path: Path) -> None:
    base = tmp_path / "base"
    (base / "bad").mkdir(parents=True)
    (base / "bad" / "notes.json").write_text("this is not a trace")
    with gzip.open(kineto_file(CPU), "rb") as handle:
        text = handle.read()
    (base / "cut").mkdir()
    (base / "cut" / "cut.json").write_bytes(text[: int(len(text) * 0.7)])
    with TestClient(create_app(base, cache_dir=tmp_path / "cache")) as client:
        failed = wait_ready(client, "bad/notes.json")
        assert failed["status"] == "failed"
        assert "notes.json" in failed["error"] and "Traceback" not in failed["error"]
        # the file is named from the base folder's name on, never by where it lies on the server
        assert "base/bad/notes.json" in failed["error"] and str(tmp_path) not in failed["error"]
        blocked = client.get("/api/run/overview", params={"run": "bad/notes.json"})
        assert blocked.status_code == 409 and blocked.json()["status"]["status"] == "failed"
        cut = wait_ready(client, "cut/cut.json")
        assert cut["status"] == "ready"
        assert any("base/cut/cut.json" in w for w in cut["warnings"]), cut
        overview = client.get("/api/run/overview", params={"run": "cut/cut.json"})
        assert overview.status_code == 200
        assert any("base/cut/cut.json" in w for w in overview.json()["warnings"])
        assert str(tmp_path) not in json.dumps([cut, overview.json()])


@pytest.mark.parametrize("name", ["profiler_metadata.json", ".hidden.json"])
def test_side_files_are_not_runs(tmp_path: Path, name: str) -> None:
    (tmp_path / name).write_text("{}")
    with TestClient(create_app(tmp_path, cache_dir=tmp_path / ".c")) as client:
        assert _runs(client) == {}
