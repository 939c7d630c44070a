"""`perfsight serve` reads only inside the base folder, never writes there, and survives damaged caches.

Built the way the damage happens: real traces analysed by ``perfsight analyse`` (``perfsight.api``),
then a rank folder, a cache folder or a table replaced by a symlink out of the base folder, a cache
table truncated on disk, or a whole base folder hashed before and after a server opened every run.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient

from _serve_process import start_serve
from _server_helpers import TWO_RANKS, copy_into, wait_ready
from conftest import kineto_file
from perfsight.api import analyse
from perfsight.server import create_app

CPU = "cpu_only/rank-34.Jul_15_10_52_41.1074.pt.trace.json.gz"
AMD = "amd_trace/mi250_minitoy_train_ROCm6_2_kineto.json.gz"
# every query parameter any /api/run/* endpoint requires; each endpoint ignores the others
PARAMS = {"start_ns": 0, "end_ns": 10**15, "width_px": 100, "id": 0, "q": "a"}


def run_endpoints(client: TestClient) -> list[str]:
    """Every documented endpoint that serves a run's data (from the app's own OpenAPI)."""
    paths = client.get("/openapi.json").json()["paths"]
    found = sorted(p for p in paths if p.startswith("/api/run/") and p != "/api/run/status")
    assert len(found) >= 12, found
    return found


def snapshot(folder: Path) -> dict[str, str]:
    """Every file, folder and link under ``folder`` with a hash of its bytes (or its link target)."""
    seen = {}
    for here, dirnames, filenames in os.walk(folder):
        for name in dirnames + filenames:
            path = Path(here) / name
            rel = str(path.relative_to(folder))
            if path.is_symlink():
                seen[rel] = "link:" + os.readlink(path)
            elif path.is_dir():
                seen[rel] = "dir"
            else:
                seen[rel] = hashlib.sha256(path.read_bytes()).hexdigest()
    return seen


@pytest.fixture(scope="module")
def analysed(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """``perfsight analyse`` outputs of two different real traces, outside any base folder."""
    root = tmp_path_factory.mktemp("analysed")
    cpu = copy_into(root, kineto_file(CPU), "traces/cpu.pt.trace.json.gz")
    amd = copy_into(root, kineto_file(AMD), "traces/amd.pt.trace.json.gz")
    analyse(cpu, out=root / "cpu")
    analyse(amd, out=root / "amd")
    return {"cpu": root / "cpu", "amd": root / "amd", "cpu_trace": cpu}


def only_rank(folder: Path) -> Path:
    (rank_dir,) = [d for d in folder.iterdir() if d.name.startswith("rank")]
    return rank_dir


# ---------------------------------------------------------------------------------------------- symlinks
@pytest.fixture(scope="module")
def linked(analysed: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """A base folder whose analysed folders lead out of it by a symlinked rank folder, cache folder,
    table file or trace_view.json; the AMD analysis outside is the secret."""
    root = tmp_path_factory.mktemp("linked")
    base, secret = root / "base", only_rank(analysed["amd"])
    shutil.copytree(analysed["cpu"], base / "own")  # a plain copy: served
    (base / "rank_link").mkdir(parents=True)
    os.symlink(secret, base / "rank_link" / secret.name)
    (base / "cache_link" / secret.name).mkdir(parents=True)
    os.symlink(secret / "cache", base / "cache_link" / secret.name / "cache")
    shutil.copytree(secret.parent, base / "table_link")
    table = base / "table_link" / secret.name / "cache" / "analysis" / "operator_stats.parquet"
    table.unlink()
    os.symlink(secret / "cache" / "analysis" / "operator_stats.parquet", table)
    shutil.copytree(secret.parent, base / "view_link")
    view = base / "view_link" / secret.name / "PROFILER_OUTPUT" / "trace_view.json"
    view.unlink()
    os.symlink(secret / "PROFILER_OUTPUT" / "trace_view.json", view)
    # a raw trace whose default output folder (`<stem>_perfsight`) is a link to the secret analysis
    copy_into(base, kineto_file(CPU), "raw/cpu.pt.trace.json.gz")
    os.symlink(secret.parent, base / "raw" / "cpu_perfsight")
    with TestClient(create_app(base, cache_dir=root / "cache")) as client:
        yield {"client": client, "base": base}


@pytest.mark.parametrize("run", ["rank_link", "cache_link", "table_link", "view_link"])
def test_an_analysis_linked_from_outside_the_base_folder_is_served_by_no_endpoint(
    linked: dict[str, Any], run: str
) -> None:
    client = linked["client"]
    assert run not in {r["id"] for r in client.get("/api/runs").json()["runs"]}
    for endpoint in ["/api/run/status", *run_endpoints(client)]:
        response = client.get(endpoint, params={"run": run, **PARAMS})
        assert response.status_code == 404, (endpoint, response.text[:300])


def test_a_plain_copy_beside_them_is_served_by_every_endpoint(linked: dict[str, Any]) -> None:
    client = linked["client"]
    assert wait_ready(client, "own")["seen"] == ["ready"]  # read as it is: no analysis started
    for endpoint in run_endpoints(client):
        response = client.get(endpoint, params={"run": "own", **PARAMS})
        assert response.status_code == 200, (endpoint, response.text[:300])


def test_a_raw_trace_whose_output_folder_links_out_is_analysed_by_the_server_itself(
    linked: dict[str, Any],
) -> None:
    client, run = linked["client"], "raw/cpu.pt.trace.json.gz"
    status = wait_ready(client, run)
    assert status["status"] == "ready" and status["seen"][0] != "ready"  # analysed, not read
    kernels = client.get("/api/run/kernel-types", params={"run": run}).json()
    assert kernels["total"] == 0  # the CPU-only trace's own analysis, not the AMD one (kernels) linked in


# ---------------------------------------------------------------------------------------------- damage
def truncate(path: Path) -> None:
    """A table cut in the middle, as a full disk or an interrupted copy leaves it."""
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


@pytest.mark.parametrize(
    ("table", "endpoint"),
    [("analysis/operator_stats.parquet", "/api/run/operator-types"), ("tracks.parquet", "/api/run/overview")],
)
def test_a_damaged_table_of_the_servers_analysis_is_analysed_again(
    tmp_path: Path, table: str, endpoint: str
) -> None:
    base, cache_dir = tmp_path / "base", tmp_path / "cache"
    copy_into(base, kineto_file(CPU), "cpu/trace.pt.trace.json.gz")
    run = "cpu/trace.pt.trace.json.gz"
    with TestClient(create_app(base, cache_dir=cache_dir)) as client:
        assert wait_ready(client, run)["status"] == "ready"
        before = client.get(endpoint, params={"run": run})
        assert before.status_code == 200
    (damaged,) = cache_dir.rglob(f"cache/{table}")
    truncate(damaged)
    with TestClient(create_app(base, cache_dir=cache_dir)) as client:  # a fresh server: nothing in memory
        response = client.get(endpoint, params={"run": run})
        assert response.status_code == 409, response.text[:300]
        assert response.json()["status"]["status"] in ("queued", "analysing")
        assert "Traceback" not in response.text
        assert wait_ready(client, run)["status"] == "ready"
        after = client.get(endpoint, params={"run": run})
        assert after.status_code == 200 and after.json() == before.json()


def test_a_damaged_analysis_without_its_trace_fails_with_a_message_and_is_not_written(
    analysed: dict[str, Path], tmp_path: Path
) -> None:
    base = tmp_path / "base"
    shutil.copytree(analysed["cpu"], base / "only_outputs")
    truncate(next((base / "only_outputs").rglob("cache/analysis/operator_stats.parquet")))
    before = snapshot(base)
    with TestClient(create_app(base, cache_dir=tmp_path / "cache")) as client:
        response = client.get("/api/run/operator-types", params={"run": "only_outputs"})
        assert response.status_code == 409
        status = client.get("/api/run/status", params={"run": "only_outputs"}).json()
        assert status["status"] == "failed"
        assert "operator_stats.parquet" in status["error"] and "damaged" in status["error"]
        assert str(tmp_path) not in status["error"]  # named from the base folder's name on
        listed = {r["id"]: r for r in client.get("/api/runs").json()["runs"]}["only_outputs"]
        assert listed["status"] == "failed"
        assert snapshot(base) == before
        analyse(analysed["cpu_trace"], out=base / "only_outputs")  # the user analyses it again
        assert client.get("/api/run/status", params={"run": "only_outputs"}).json()["status"] == "ready"
        assert client.get("/api/run/operator-types", params={"run": "only_outputs"}).json()["total"] > 0


# ---------------------------------------------------------------------------------------------- read only
def test_opening_every_run_leaves_the_base_folder_byte_for_byte_unchanged(
    analysed: dict[str, Path], tmp_path: Path
) -> None:
    base, cache_dir = tmp_path / "base", tmp_path / "cache"
    copy_into(base, kineto_file(CPU), "single/cpu.pt.trace.json.gz")
    for name in TWO_RANKS:
        copy_into(base, kineto_file(name), f"job/{Path(name).name}")
    shutil.copytree(analysed["cpu"], base / "cli_output")  # `perfsight analyse --out`, trace elsewhere
    shutil.copytree(analysed["cpu"], base / "no_index")  # one made before analyses had a timeline index
    shutil.rmtree(only_rank(base / "no_index") / "cache" / "timeline")
    beside = copy_into(base, kineto_file(AMD), "beside/amd.pt.trace.json.gz")
    analyse(beside, out=base / "beside" / "analysis")  # analysed beside its trace, inputs unchanged
    before = snapshot(base)
    with TestClient(create_app(base, cache_dir=cache_dir)) as client:
        runs = client.get("/api/runs").json()["runs"]
        assert {r["id"] for r in runs} == {
            "single/cpu.pt.trace.json.gz",
            "job",
            "cli_output",
            "no_index",
            "beside/amd.pt.trace.json.gz",
        }
        for run in runs:
            status = wait_ready(client, run["id"])
            assert status["status"] == "ready", status
            if run["id"] in ("cli_output", "beside/amd.pt.trace.json.gz"):
                assert status["seen"] == ["ready"]  # the CLI's outputs are read, not analysed again
            if run["id"] == "no_index":
                assert status["seen"][0] != "ready"  # indexed first: a copy, in the server's cache
            for endpoint in run_endpoints(client):
                response = client.get(endpoint, params={"run": run["id"], **PARAMS})
                assert response.status_code in (200, 404), (run["id"], endpoint, response.text[:200])
    assert snapshot(base) == before
    assert list(cache_dir.rglob("slices.parquet"))  # the server's own analyses went to its cache


def test_two_base_folders_sharing_a_cache_keep_their_analyses_apart(tmp_path: Path) -> None:
    cache_dir = tmp_path / "cache"
    kernels = {}
    for name, trace in (("one", CPU), ("two", AMD)):
        base = tmp_path / name / "data"
        copy_into(base, kineto_file(trace), "run/trace.pt.trace.json.gz")  # the same run id in both
        with TestClient(create_app(base, cache_dir=cache_dir)) as client:
            assert wait_ready(client, "run/trace.pt.trace.json.gz")["status"] == "ready"
            kernels[name] = client.get(
                "/api/run/kernel-types", params={"run": "run/trace.pt.trace.json.gz"}
            ).json()
    assert kernels["one"]["total"] == 0 and kernels["two"]["total"] > 0
    assert len(list(cache_dir.rglob("slices.parquet"))) == 2


# ---------------------------------------------------------------------------------------------- CLI
def _serve_until_ready(base: Path, run: str, *extra: str, env: dict[str, str] | None = None) -> None:
    """``perfsight serve`` in a subprocess, as a user starts it; opens ``run`` and waits until ready."""
    process, port = start_serve(base, *extra, stderr=subprocess.DEVNULL, env=env)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                status = httpx.get(
                    f"http://127.0.0.1:{port}/api/run/status", params={"run": run}, timeout=5
                ).json()
            except httpx.TransportError:
                status = {}
            if status.get("status") == "ready":
                return
            assert status.get("status") != "failed", status
            time.sleep(0.3)
        raise AssertionError(f"{run} not ready: {status}")
    finally:
        process.terminate()
        process.wait(timeout=10)


def test_serve_keeps_its_analyses_in_the_cache_dir_option_else_the_environments(tmp_path: Path) -> None:
    base = tmp_path / "base"
    copy_into(base, kineto_file(CPU), "cpu.pt.trace.json.gz")
    before = snapshot(base)
    _serve_until_ready(base, "cpu.pt.trace.json.gz", "--cache-dir", str(tmp_path / "chosen"))
    assert len(list((tmp_path / "chosen").rglob("slices.parquet"))) == 1
    env = {**os.environ, "PERFSIGHT_CACHE_DIR": str(tmp_path / "from_env")}
    _serve_until_ready(base, "cpu.pt.trace.json.gz", env=env)
    assert len(list((tmp_path / "from_env").rglob("slices.parquet"))) == 1
    assert snapshot(base) == before
