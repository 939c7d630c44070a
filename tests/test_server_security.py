"""`perfsight serve` security: containment in the base dir, tokens, read-only, CSP, hostile names."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from fastapi.testclient import TestClient

from _hostile import HOSTILE_NAMES, hostile_trace
from _serve_process import start_serve
from _server_helpers import copy_into, wait_ready
from conftest import kineto_file
from perfsight.pipeline import Options, analyse_and_write
from perfsight.server import create_app

CPU = "cpu_only/rank-34.Jul_15_10_52_41.1074.pt.trace.json.gz"


@pytest.fixture(scope="module")
def layout(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A base dir with one real trace and a hostile analysed run; a secret trace outside it, linked in."""
    root = tmp_path_factory.mktemp("sec")
    base, outside = root / "base", root / "outside"
    copy_into(base, kineto_file(CPU), "cpu/trace.json.gz")
    secret = copy_into(outside, kineto_file(CPU), "secret/secret.pt.trace.json.gz")
    (outside / "secret.txt").write_text("top secret")
    os.symlink(outside / "secret", base / "linked_dir")  # a folder symlink out of the base
    os.symlink(secret, base / "cpu" / "linked.pt.trace.json.gz")  # a file symlink out of the base
    os.symlink(outside / "secret.txt", base / "cpu" / "secret.txt")
    analyse_and_write(hostile_trace(), base / "hostile_perfsight" / "rank0", Options())
    static = root / "static"
    static.mkdir()
    (static / "index.html").write_text("<!doctype html><title>ui</title>")
    os.symlink(outside / "secret.txt", static / "leak.txt")
    return {"root": root, "base": base, "outside": outside, "static": static}


@pytest.fixture(scope="module")
def client(layout: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestClient]:
    app = create_app(layout["base"], cache_dir=tmp_path_factory.mktemp("cache"), static_dir=layout["static"])
    with TestClient(app) as test_client:
        yield test_client


def test_symlinks_out_of_the_base_dir_are_not_listed(client: TestClient) -> None:
    ids = {r["id"] for r in client.get("/api/runs").json()["runs"]}
    assert ids == {"cpu/trace.json.gz", "hostile_perfsight"}


@pytest.mark.parametrize(
    "run",
    [
        "../outside/secret/secret.pt.trace.json.gz",
        "cpu/../../outside/secret/secret.pt.trace.json.gz",
        "%2e%2e/outside/secret/secret.pt.trace.json.gz",
        "..%2foutside%2fsecret",
        "/etc/passwd",
        "linked_dir/secret.pt.trace.json.gz",
        "cpu/linked.pt.trace.json.gz",
        "cpu/secret.txt",
        "cpu\\..\\..\\outside",
        "cpu/trace.json.gz\x00.txt",
    ],
)
def test_run_ids_that_leave_the_base_dir_are_refused(
    client: TestClient, layout: dict[str, Path], run: str
) -> None:
    for endpoint in ("/api/run/status", "/api/run/trace-view", "/api/run/overview"):
        response = client.get(endpoint, params={"run": run})
        assert response.status_code == 404, (endpoint, run, response.text)
        assert "top secret" not in response.text
    absolute = str(layout["outside"] / "secret" / "secret.pt.trace.json.gz")
    assert client.get("/api/run/status", params={"run": absolute}).status_code == 404


@pytest.mark.parametrize(
    "path",
    [
        "/../outside/secret.txt",
        "/%2e%2e/%2e%2e/outside/secret.txt",
        "/..%2f..%2foutside%2fsecret.txt",
        "/%2e%2e%2f%2e%2e%2fetc%2fpasswd",
        "/leak.txt",
        "//etc/passwd",
        "/static/../../outside/secret.txt",
        "/%00",
        "/index.html%00.js",
        "/assets/%00/x",
    ],
)
def test_static_paths_that_leave_the_ui_folder_are_refused(layout: dict[str, Path], path: str) -> None:
    app = create_app(layout["base"], cache_dir=layout["root"] / "c2", static_dir=layout["static"])
    with TestClient(app) as raw_client:
        # send the path as written: no client-side normalisation of .. or %2e
        request = raw_client.build_request("GET", "http://testserver/")
        request.url = request.url.copy_with(raw_path=path.encode())
        response = raw_client.send(request)
    assert "top secret" not in response.text and "root:" not in response.text
    assert response.status_code in (200, 404)
    if response.status_code == 200:  # an unknown route falls back to the UI's index page
        assert response.text == "<!doctype html><title>ui</title>"


def test_only_reads_are_allowed(client: TestClient) -> None:
    for method in ("POST", "PUT", "DELETE", "PATCH"):
        response = client.request(method, "/api/runs")
        assert response.status_code == 405 and response.headers["allow"] == "GET, HEAD"


def test_every_response_carries_the_security_headers(client: TestClient) -> None:
    for path in ("/api/runs", "/", "/no/such/page", "/api/nope", "/openapi.json"):
        response = client.get(path)
        csp = response.headers["content-security-policy"]
        assert (
            "default-src 'self'" in csp
            and "script-src 'self'" in csp
            and "unsafe-inline" not in csp.split("style-src")[0]
        )
        assert response.headers["x-content-type-options"] == "nosniff"
    assert client.post("/api/runs").headers["content-security-policy"]


def test_hostile_names_come_back_as_json_data(client: TestClient) -> None:
    run = "hostile_perfsight"
    assert wait_ready(client, run)["status"] == "ready"  # its timeline index is built on first open
    rows = client.get("/api/run/operator-types", params={"run": run, "limit": 100}).json()["rows"]
    assert set(HOSTILE_NAMES) <= {r["name"] for r in rows}
    end = client.get("/api/run/timeline/tracks", params={"run": run}).json()
    window = client.get(
        "/api/run/timeline/window",
        params={"run": run, "start_ns": 0, "end_ns": end["end_ns"], "width_px": 100000 // 10},
    )
    assert window.headers["content-type"] == "application/json"
    assert {f"kernel {n}" for n in HOSTILE_NAMES} <= set(window.json()["names"])
    assert 'thread <b>11</b> "main"\n' in {t["name"] for t in end["tracks"]}
    for name in HOSTILE_NAMES:
        found = client.get("/api/run/timeline/search", params={"run": run, "q": name})
        assert found.headers["content-type"] == "application/json"
        assert name in {h["name"] for h in found.json()["hits"]}
    missing = client.get("/api/run/overview", params={"run": "<script>alert(1)</script>"})
    assert missing.status_code == 404 and missing.headers["content-type"] == "application/json"


def test_a_token_is_required_when_one_is_set(layout: dict[str, Path]) -> None:
    app = create_app(
        layout["base"], token="s3cret", cache_dir=layout["root"] / "c3", static_dir=layout["static"]
    )
    with TestClient(app) as anonymous:
        assert anonymous.get("/api/runs").status_code == 401
        assert anonymous.get("/api/runs", params={"token": "wrong"}).status_code == 401
        assert anonymous.get("/api/runs", headers={"Authorization": "token s3cret"}).status_code == 200
        first = anonymous.get("/", params={"token": "s3cret"}, follow_redirects=False)
        assert "httponly" in first.headers["set-cookie"].lower()
        # the token leaves the address bar and the history: the same page again, without it
        assert first.status_code == 303 and first.headers["location"] == "/"
        assert anonymous.get(first.headers["location"]).status_code == 200  # the cookie now carries it
        assert anonymous.get("/api/runs").status_code == 200
    with TestClient(app) as browser:
        landed = browser.get("/index.html?token=s3cret&x=1")
        assert landed.status_code == 200 and str(landed.url).endswith("/index.html?x=1")
        assert [r.status_code for r in landed.history] == [303]
        # a script calling the API with ?token= gets its answer, not a redirect
        assert browser.get("/api/runs", params={"token": "s3cret"}, follow_redirects=False).status_code == 200
    with TestClient(app) as attacker:  # "//host" must not become a redirect to another site
        request = attacker.build_request("GET", "http://testserver/")
        request.url = request.url.copy_with(raw_path=b"//evil.example/x?token=s3cret")
        moved = attacker.send(request, follow_redirects=False)
        assert moved.status_code == 303 and moved.headers["location"] == "/evil.example/x"


def test_a_loopback_server_refuses_other_host_names(layout: dict[str, Path]) -> None:
    app = create_app(
        layout["base"], cache_dir=layout["root"] / "c4", allowed_hosts=frozenset({"127.0.0.1", "localhost"})
    )
    with TestClient(app, base_url="http://127.0.0.1") as local:
        assert local.get("/api/runs").status_code == 200
        assert local.get("/api/runs", headers={"host": "attacker.example"}).status_code == 403


def _serve(base: Path, *extra: str) -> tuple[subprocess.Popen[str], str, int]:
    process, port = start_serve(base, *extra, stderr=subprocess.PIPE)
    line = process.stderr.readline() if process.stderr else ""
    return process, line, port


def _get(url: str) -> httpx.Response:
    deadline = time.monotonic() + 30
    while True:
        try:
            return httpx.get(url, timeout=5)
        except httpx.TransportError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def _raw_get(port: int, target: str) -> bytes:
    """A GET whose request target goes on the wire exactly as written (no client normalisation)."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(f"GET {target} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n".encode())
        chunks = []
        while chunk := sock.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks)


def test_serve_binds_loopback_by_default_and_needs_a_printed_token_elsewhere(layout: dict[str, Path]) -> None:
    process, line, port = _serve(layout["base"])
    try:
        assert f"http://127.0.0.1:{port}/" in line and "token" not in line
        assert _get(f"http://127.0.0.1:{port}/api/info").json()["auth"] is False
        for target in (
            "/../../../../etc/passwd",
            "/%2e%2e/%2e%2e/%2e%2e/etc/passwd",
            "/..%2f..%2f..%2fetc%2fpasswd",
        ):
            reply = _raw_get(port, target)
            assert b"root:" not in reply and reply.startswith(b"HTTP/1.1 "), reply[:200]
    finally:
        process.terminate()
        process.wait(timeout=10)
    process, line, port = _serve(layout["base"], "--host", "0.0.0.0")
    try:
        token = re.search(r"\?token=([0-9a-f]{32,})", line)
        assert token, line
        assert _get(f"http://127.0.0.1:{port}/api/runs").status_code == 401
        assert _get(f"http://127.0.0.1:{port}/api/runs?token={token.group(1)}").status_code == 200
    finally:
        process.terminate()
        process.wait(timeout=10)


def test_serve_rejects_a_missing_base_dir(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "perfsight.cli", "serve", "--summary-base-dir", str(tmp_path / "nope")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and "not a folder" in done.stderr
