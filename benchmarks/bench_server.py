"""Web server benchmarks: timeline window queries, first timeline view, overview of a cached run.

Targets (issue "Web UI, part 1"): on a generated 10-million-event trace, p95 of a timeline window
query at 2,000 px <= 100 ms; first timeline view of a 1 GB trace <= 2 s after analysis; overview
API of a cached run <= 200 ms.

What is timed is the whole HTTP round trip through the ASGI app (routing, query, JSON encoding),
with FastAPI's in-process test client, so network and browser time are not included.  Each trace
is analysed first the way ``perfsight serve`` does it (a child process writing the Parquet cache
and the timeline index); "first view" then uses a *fresh* app (nothing opened or memoised) and
times ``/timeline/tracks`` + the full-extent ``/timeline/window`` -- what the timeline page asks
for first.  Windows for the p95 are random: a span log-uniform between 1e-5 and 1 of the trace,
at a random position.

"analyse s" is what opening the run took: a full analysis the first time, seconds when a fresh
cache exists (``--cache`` reused).  "(CPU)" columns are the process CPU time of the request (all
threads): the machine is shared, and wall time includes waiting for a core.

Window queries are also timed *in the server alone*: the request is handed to the ASGI app directly
(no test client, no HTTP parsing), so the process CPU time around it is the server's own work --
middleware, routing, parameter validation, the query and JSON encoding -- which is what a loaded
machine multiplies.  The test client itself costs about 3 ms of CPU per request.  Per zoom level
(whole trace, 10 %, 1 %, 0.01 %), ``--per-zoom`` random windows each give p50/p95 of that server
CPU and wall time.

The trace may also be an already analysed run folder (``perfsight analyse`` output): it is opened
as it is, nothing is generated.

Usage::

    python benchmarks/bench_server.py --trace /tmp/gen10m/rank0.pt.trace.json \\
        [--first-view-trace /tmp/gen1g/rank0.pt.trace.json] [--queries 300] [--per-zoom 50] \\
        [--write-md docs/BENCHMARKS.md]

A trace path that does not exist is generated with ``benchmarks/gen_kineto_trace.py``
(``--size-mb``: the default 5700 gives about 10.4 million events, 13,301 steps; 1024 for the
first-view trace).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import datetime as dt
import os
import platform
import random
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent


def _generate(path: Path, size_mb: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, str(HERE / "gen_kineto_trace.py"), "--out", str(path), "--size-mb", str(size_mb)]
    subprocess.run(cmd, check=True)


def _client(base: Path, cache: Path) -> Any:
    from fastapi.testclient import TestClient

    from perfsight.server import create_app

    return TestClient(create_app(base, cache_dir=cache))


def _analyse(trace: Path, cache: Path) -> tuple[str, float]:
    """Open the run in a server and wait for its background analysis; returns (run id, seconds)."""
    base = trace.parent
    run = trace.relative_to(base).as_posix()
    start = time.perf_counter()
    with _client(base, cache) as client:
        while True:
            status = client.get("/api/run/status", params={"run": run}).json()
            if status["status"] == "ready":
                break
            if status["status"] == "failed":
                raise SystemExit(f"analysis of {trace} failed: {status['error']}")
            time.sleep(0.5)
    return run, time.perf_counter() - start


CPU_TIMES: list[float] = []
"""Process CPU seconds of each timed request (server threads included): on a loaded machine the
wall time includes waiting for a core; this is the work the request itself did."""


def _timed(client: Any, path: str, **params: Any) -> tuple[float, Any]:
    start, cpu = time.perf_counter(), time.process_time()
    response = client.get(path, params=params)
    elapsed = time.perf_counter() - start
    CPU_TIMES.append(time.process_time() - cpu)
    if response.status_code != 200:
        raise SystemExit(f"{path} {params}: HTTP {response.status_code} {response.text[:200]}")
    return elapsed, response.json()


def _p95(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[int(0.95 * (len(ordered) - 1))]


class DirectASGI:
    """GET requests handed straight to the ASGI app: the process CPU time around one is the server's
    work alone (no test client, no HTTP parsing).

    The app runs on an event loop in a thread of its own under one long-lived task, as under
    uvicorn: AnyIO keeps a sync route's worker thread only as long as the task that started it."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.loop = asyncio.new_event_loop()
        ready = threading.Event()

        async def serve() -> None:
            self._stop = asyncio.Event()
            ready.set()
            await self._stop.wait()

        self.thread = threading.Thread(target=self.loop.run_until_complete, args=(serve(),), daemon=True)
        self.thread.start()
        ready.wait()

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self._stop.set)
        self.thread.join()

    def get(self, path: str, **params: Any) -> tuple[int, bytes]:
        scope = {
            "type": "http",
            "asgi": {"version": "3.0"},
            "http_version": "1.1",
            "method": "GET",
            "scheme": "http",
            "path": path,
            "raw_path": path.encode(),
            "query_string": urllib.parse.urlencode(params).encode(),
            "root_path": "",
            "headers": [(b"host", b"127.0.0.1:8080")],
            "client": ("127.0.0.1", 50000),
            "server": ("127.0.0.1", 8080),
        }
        status, body = [0], []

        async def receive() -> dict[str, Any]:
            return {"type": "http.request", "body": b"", "more_body": False}

        async def send(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                status[0] = message["status"]
            else:
                body.append(message.get("body", b""))

        asyncio.run_coroutine_threadsafe(self.app(scope, receive, send), self.loop).result()
        return status[0], b"".join(body)


ZOOMS = (1.0, 0.1, 0.01, 1e-4)


def server_windows(trace: Path, cache: Path, width: int, per_zoom: int, seed: int) -> dict[str, Any]:
    """Server-only CPU and wall time of window queries at fixed zoom levels (random positions)."""
    import orjson

    from perfsight.server import create_app

    rng = random.Random(seed + 1)
    run = trace.relative_to(trace.parent).as_posix()
    direct = DirectASGI(create_app(trace.parent, cache_dir=cache))
    code, body = direct.get("/api/run/timeline/tracks", run=run)
    if code != 200:
        raise SystemExit(f"/timeline/tracks: HTTP {code} {body[:200]!r}")
    end = orjson.loads(body)["end_ns"]
    direct.get("/api/run/timeline/window", run=run, start_ns=0, end_ns=end, width_px=width)  # opens it
    out: dict[str, Any] = {}
    every_cpu: list[float] = []
    for zoom in ZOOMS:
        cpu, wall, entries = [], [], []
        span = max(1000, int(end * zoom))
        for _ in range(per_zoom):
            lo = rng.randint(0, max(0, end - span))
            start, cpu0 = time.perf_counter(), time.process_time()
            code, body = direct.get(
                "/api/run/timeline/window", run=run, start_ns=lo, end_ns=lo + span, width_px=width
            )
            wall.append(time.perf_counter() - start)
            cpu.append(time.process_time() - cpu0)
            if code != 200:
                raise SystemExit(f"window {lo}+{span}: HTTP {code} {body[:200]!r}")
            entries.append(orjson.loads(body)["events"])
        every_cpu.extend(cpu)
        out[zoom] = {
            "cpu_p50_ms": 1000 * statistics.median(cpu),
            "cpu_p95_ms": 1000 * _p95(cpu),
            "wall_p50_ms": 1000 * statistics.median(wall),
            "wall_p95_ms": 1000 * _p95(wall),
            "entries": statistics.mean(entries),
        }
    direct.close()
    return {"zooms": out, "zoom_cpu_p95_ms": 1000 * _p95(every_cpu)}


def first_view(trace: Path, cache: Path, width: int) -> dict[str, Any]:
    run = trace.relative_to(trace.parent).as_posix()
    with _client(trace.parent, cache) as client:
        t_tracks, tracks = _timed(client, "/api/run/timeline/tracks", run=run)
        t_window, window = _timed(
            client, "/api/run/timeline/window", run=run, start_ns=0, end_ns=tracks["end_ns"], width_px=width
        )
    return {
        "events": sum(t["events"] for t in tracks["tracks"]),
        "tracks_s": t_tracks,
        "window_s": t_window,
        "first_view_s": t_tracks + t_window,
        "returned": window["events"],
    }


def window_p95(trace: Path, cache: Path, width: int, queries: int, seed: int) -> dict[str, Any]:
    """Random windows through the test client (round trip), then the same windows in the server alone."""
    from perfsight.server import create_app

    rng = random.Random(seed)
    run = trace.relative_to(trace.parent).as_posix()
    times, returned, windows = [], [], []
    with _client(trace.parent, cache) as client:
        end = client.get("/api/run/timeline/tracks", params={"run": run}).json()["end_ns"]
        CPU_TIMES.clear()
        for _ in range(queries):
            span = max(1000, int(end * 10 ** rng.uniform(-5, 0)))
            lo = rng.randint(0, max(0, end - span))
            windows.append((lo, lo + span))
            elapsed, body = _timed(
                client, "/api/run/timeline/window", run=run, start_ns=lo, end_ns=lo + span, width_px=width
            )
            times.append(elapsed)
            returned.append(body["events"])
    direct = DirectASGI(create_app(trace.parent, cache_dir=cache))
    direct.get("/api/run/timeline/window", run=run, start_ns=0, end_ns=end, width_px=width)  # opens it
    server_cpu, server_wall = [], []
    for lo, hi in windows:
        start, cpu0 = time.perf_counter(), time.process_time()
        direct.get("/api/run/timeline/window", run=run, start_ns=lo, end_ns=hi, width_px=width)
        server_wall.append(time.perf_counter() - start)
        server_cpu.append(time.process_time() - cpu0)
    direct.close()
    times.sort()
    return {
        "queries": queries,
        "p50_ms": 1000 * statistics.median(times),
        "p95_ms": 1000 * times[int(0.95 * (len(times) - 1))],
        "max_ms": 1000 * times[-1],
        "cpu_p95_ms": 1000 * _p95(CPU_TIMES),
        "server_wall_p95_ms": 1000 * _p95(server_wall),
        "server_cpu_p50_ms": 1000 * statistics.median(server_cpu),
        "server_cpu_p95_ms": 1000 * _p95(server_cpu),
        "mean_returned": statistics.mean(returned),
        "max_returned": max(returned),
    }


def pyramid_vs_raw(trace: Path, cache: Path, width: int, per_zoom: int, seed: int) -> dict[float, float]:
    """CPU of the window query + JSON encoding, side by side in one run: with the index's
    level-of-detail pyramid, and with the raw arrays only (the lanes' ``levels`` hidden: the
    per-pixel binary search the index had before).  Returns p95 raw / p95 pyramid per zoom level."""
    import copy

    import orjson

    from perfsight.server import create_app, timeline

    run = trace.relative_to(trace.parent).as_posix()
    app = create_app(trace.parent, cache_dir=cache)
    app.state.registry.status(app.state.registry.run(run), start=True)
    pyramid = app.state.registry.opened(run)
    raw = copy.copy(pyramid)
    raw.ranks = {}
    for rank, data in pyramid.ranks.items():
        arrays = copy.copy(data.timeline)
        arrays.meta = {**arrays.meta, "lanes": [{**lane, "levels": []} for lane in arrays.meta["lanes"]]}
        raw.ranks[rank] = dataclasses.replace(data, timeline=arrays)
    rng = random.Random(seed + 2)
    end = pyramid.end_ns
    ratios = {}
    for zoom in ZOOMS:
        span = max(1000, int(end * zoom))
        cpu: dict[str, list[float]] = {"pyramid": [], "raw": []}
        for _ in range(per_zoom):
            lo = rng.randint(0, max(0, end - span))
            for name, opened in (("pyramid", pyramid), ("raw", raw)):
                cpu0 = time.process_time()
                body = timeline.window(opened, lo, lo + span, width, None, None)
                orjson.dumps(body, option=orjson.OPT_SERIALIZE_NUMPY)
                cpu[name].append(time.process_time() - cpu0)
        ratios[zoom] = _p95(cpu["raw"]) / max(_p95(cpu["pyramid"]), 1e-9)
        print(
            f"zoom {zoom:g}: window()+JSON CPU p95 raw {1000 * _p95(cpu['raw']):.1f} ms, "
            f"pyramid {1000 * _p95(cpu['pyramid']):.1f} ms",
            flush=True,
        )
    return ratios


def overview(trace: Path, cache: Path, repeats: int = 20) -> dict[str, Any]:
    """Overview of a cached run: the first call of a fresh server, warm repeats, then the first call of
    another fresh server (which reads the overview saved in the cache by the analysis or the first)."""
    from perfsight.server import pages

    run = trace.relative_to(trace.parent).as_posix()
    pages.clear_memo()  # the memo is per process: start as a restarted server would
    with _client(trace.parent, cache) as client:
        CPU_TIMES.clear()
        cold, body = _timed(client, "/api/run/overview", run=run)
        cold_cpu = CPU_TIMES[-1]
        CPU_TIMES.clear()
        warm = [_timed(client, "/api/run/overview", run=run)[0] for _ in range(repeats)]
    pages.clear_memo()
    with _client(trace.parent, cache) as client:  # another fresh server: the saved overview
        CPU_TIMES.clear()
        saved = _timed(client, "/api/run/overview", run=run)[0]
    return {
        "saved_ms": 1000 * saved,
        "saved_cpu_ms": 1000 * CPU_TIMES[-1],
        "steps": len(body["steps"]),
        "cold_ms": 1000 * cold,
        "cold_cpu_ms": 1000 * cold_cpu,
        "warm_p95_ms": 1000 * _p95(warm),
        "warm_cpu_p95_ms": 1000 * _p95(CPU_TIMES),
    }


def machine() -> str:
    load = os.getloadavg()
    return (
        f"{os.cpu_count()} CPUs, {platform.machine()}, Linux {platform.release()}, Python "
        f"{platform.python_version()}; load average at start {load[0]:.1f} / {load[1]:.1f} / {load[2]:.1f}"
    )


# ====================================================================== job pages at scale
# Issue 16's acceptance: on a synthetic 1,024-rank job (benchmarks/gen_cluster_job.py), once
# analysed, every job page's API answers with p95 <= 200 ms and every job page paints its main
# content within 2 s in Chromium.  ``--job DIR`` runs this part instead of the timeline one.

JOB_ENDPOINTS: list[tuple[str, str, dict[str, Any]]] = [
    # (label, path, query without ``run``); "{step}" / "{stage}": the job's first step / stage.
    # Add the job pages' new endpoints here: one that the server does not have (404) is reported
    # as absent, not as a failure, so the list may run ahead of the server.
    ("run list", "/api/runs", {}),
    ("status", "/api/run/status", {}),
    ("overview, first page (the UI's)", "/api/job/overview", {"limit": 64}),
    ("overview, a later page by rank", "/api/job/overview", {"sort": "rank", "offset": 512, "limit": 64}),
    ("overview, every rank", "/api/job/overview", {}),
    ("overview by rank", "/api/job/overview", {"sort": "rank", "order": "asc"}),
    ("overview by lateness", "/api/job/overview", {"sort": "lateness_ns", "order": "desc"}),
    ("step trace, first page (the UI's)", "/api/job/step-trace", {"limit": 64}),
    ("step trace, every rank", "/api/job/step-trace", {}),
    ("step trace, one step", "/api/job/step-trace", {"step": "{step}"}),
    ("step trace by duration", "/api/job/step-trace", {"sort": "duration_ns", "order": "desc"}),
    ("step trace, one stage", "/api/job/step-trace", {"stage": "{stage}"}),
    ("findings", "/api/job/findings", {}),
    ("communication per rank", "/api/job/communication", {}),
    ("communication links", "/api/job/communication/links", {}),
    ("communication ops", "/api/job/communication/ops", {}),
    ("communication matrix", "/api/job/communication/matrix", {}),
    ("heatmaps", "/api/job/heatmaps", {}),
    ("time overview", "/api/job/time-overview", {}),
    ("pipeline chart", "/api/job/pipeline", {}),
    ("Marey view", "/api/job/marey", {}),
    ("Marey view, a stage unfolded (32 devices drawn)", "/api/job/marey", {"unfold": "{stage}"}),
    ("Marey view, the next 32 devices", "/api/job/marey", {"unfold": "{stage}", "first": 32}),
    (
        "Marey view, a 2 ms window unfolded",
        "/api/job/marey",
        {"unfold": "{stage}", "start_ns": 10_000_000, "end_ns": 12_000_000},
    ),
    ("parallel strategy", "/api/job/strategy", {}),
    ("parallel-strategy graph", "/api/job/strategy/graph", {}),
    ("module table", "/api/job/strategy/modules", {}),
]

JOB_PAGES: list[tuple[str, str]] = [
    # (hash route, CSS selector of the page's main content once rendered); a page the UI does not
    # have (its content never appears) is reported as not seen, so the list may run ahead too
    ("job", "[data-testid=job-ranks] tbody tr"),
    ("job-steps", "[data-testid=job-step-table] tbody tr"),
    ("job-time", "[data-testid=job-time-table] tbody tr"),
    ("job-heatmaps", "[data-testid^=heatmap-] .hm-grid, .hm-grid[data-testid^=heatmap-]"),
    ("job-comm", "[data-testid=comm-ranks] tbody tr"),
    ("job-matrix", "[data-testid=matrix-legend]"),
    ("job-findings", "[data-testid=findings-page] [data-testid=findings-counts]"),
    ("job-strategy", "[data-testid=strategy-tree] .ps-rank"),
    ("job-pipeline", "[data-testid=pp-chart]"),
    ("job-marey", "[data-testid=marey-chart]"),
]
PAGE_TIMEOUT_S = 30.0

_FIRST_MATCH = """
window.__perfsightPainted = null;
const selector = %s;
const mark = () => {
  if (window.__perfsightPainted === null && document.querySelector(selector)) {
    // the frame after the content is in the DOM: when it is on screen
    requestAnimationFrame(() => { window.__perfsightPainted = performance.now(); });
    return true;
  }
  return false;
};
new MutationObserver((_, observer) => { if (mark()) observer.disconnect(); })
  .observe(document, { childList: true, subtree: true });
"""


def _serve(base: Path, cache: Path) -> tuple[subprocess.Popen[bytes], int]:
    """``perfsight serve`` as a user starts it, on a free loopback port."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    command = [sys.executable, "-m", "perfsight.cli", "serve", "--summary-base-dir", str(base)]
    process = subprocess.Popen(
        [*command, "--port", str(port), "--cache-dir", str(cache)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    for _ in range(600):
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return process, port
        except OSError:
            time.sleep(0.1)
    process.terminate()
    raise SystemExit("perfsight serve did not start listening within 60 s")


class Http:
    """One keep-alive HTTP connection to the server: each GET timed from request to parsed JSON."""

    def __init__(self, port: int) -> None:
        import http.client

        self.connection = http.client.HTTPConnection("127.0.0.1", port, timeout=600)

    def get(self, path: str, params: dict[str, Any]) -> tuple[int, float, int, Any]:
        import json

        url = path + ("?" + urllib.parse.urlencode(params) if params else "")
        start = time.perf_counter()
        self.connection.request("GET", url)
        response = self.connection.getresponse()
        body = response.read()
        data = json.loads(body) if response.status == 200 else None
        return response.status, time.perf_counter() - start, len(body), data


def _wait_analysed(http: Http, run: str, timeout_s: float) -> float:
    start = time.perf_counter()
    while True:
        code, _, _, status = http.get("/api/run/status", {"run": run})
        if code != 200:
            raise SystemExit(f"/api/run/status: HTTP {code}")
        if status["status"] == "ready":
            return time.perf_counter() - start
        if status["status"] == "failed":
            raise SystemExit(f"the analysis of {run} failed: {status['error']}")
        if time.perf_counter() - start > timeout_s:
            raise SystemExit(f"{run} not analysed after {timeout_s:.0f} s ({status['stage']})")
        time.sleep(1.0)


def job_api(http: Http, run: str, requests: int, only: str | None = None) -> list[dict[str, Any]]:
    """Every endpoint of :data:`JOB_ENDPOINTS`, ``requests`` times each, in turns (so that each
    endpoint also sees what the others leave behind); the first answer of each is reported apart."""
    code, _, _, trace = http.get("/api/job/step-trace", {"run": run})
    if code != 200:
        raise SystemExit(f"/api/job/step-trace: HTTP {code}")
    fill = {"{step}": next((s for s in trace["steps"] if s != "average"), "average")}
    fill["{stage}"] = str(trace["stages"][0]) if trace["stages"] else "0"
    calls = []
    for label, path, query in JOB_ENDPOINTS:
        if only and not re.search(only, path):
            continue
        params = {k: fill.get(str(v), v) for k, v in query.items()}
        calls.append((label, path, params if path == "/api/runs" else {"run": run, **params}))
    times: dict[str, list[float]] = {label: [] for label, _, _ in calls}
    info: dict[str, dict[str, Any]] = {}
    for _ in range(requests):
        for label, path, params in calls:
            if info.get(label, {}).get("absent"):
                continue
            code, elapsed, size, _ = http.get(path, params)
            if code == 404 and path.startswith("/api/job/") and label not in info:
                info[label] = {"absent": True}
                continue
            if code != 200:
                raise SystemExit(f"{path} {params}: HTTP {code}")
            info.setdefault(label, {"first_ms": 1000 * elapsed, "bytes": size})
            times[label].append(elapsed)
    rows = []
    for label, path, params in calls:
        shown = {k: v for k, v in params.items() if k != "run"}
        row = {"endpoint": path + ("?" + urllib.parse.urlencode(shown) if shown else ""), "label": label}
        if info.get(label, {}).get("absent"):
            rows.append({**row, "absent": True})
            continue
        values = times[label]
        rows.append(
            {
                **row,
                **info[label],
                "n": len(values),
                "p50_ms": 1000 * statistics.median(values),
                "p95_ms": 1000 * _p95(values),
                "max_ms": 1000 * max(values),
            }
        )
    return rows


RANK_PAGES = (("overview", "/api/run/overview"), ("timeline tracks", "/api/run/timeline/tracks"))
"""What a rank's single-device pages ask for first: timed on ranks not opened before."""


def rank_open(http: Http, run: str, ranks: list[int]) -> list[dict[str, Any]]:
    """Opening single ranks of the job, as a click on a rank of a job page does: the first request
    of a rank's pages on a fresh server (the first rank opened), on another rank, then again; and
    every rank's timeline tracks, which the timeline page of a job's rank asks for."""
    chosen = [ranks[len(ranks) // 2], ranks[-1]]
    rows = []
    for which, rank in (("first rank opened", chosen[0]), ("another rank", chosen[1])):
        for label, path in RANK_PAGES:
            for when in ("cold", "again"):
                code, elapsed, _, _ = http.get(path, {"run": run, "rank": rank})
                if code != 200:
                    raise SystemExit(f"{path} rank {rank}: HTTP {code}")
                what = f"{which} ({rank}), {label}, {when}"
                rows.append({"what": what, "path": path, "ms": 1000 * elapsed})
    for when in ("cold", "again"):  # what the timeline page of a rank of a job asks first
        code, elapsed, _, _ = http.get("/api/run/timeline/tracks", {"run": run})
        if code != 200:
            raise SystemExit(f"/api/run/timeline/tracks: HTTP {code}")
        what = f"every rank's timeline tracks (the timeline page), {when}"
        rows.append({"what": what, "path": "/api/run/timeline/tracks", "ms": 1000 * elapsed})
    return rows


def _painted(page: Any, timeout_s: float = PAGE_TIMEOUT_S) -> float | None:
    """The page's own record of when its content appeared, None if it did not within ``timeout_s``
    (polled: the UI's Content Security Policy forbids the string evaluation Playwright's
    wait_for_function uses)."""
    deadline = time.perf_counter() + timeout_s
    while time.perf_counter() < deadline:
        value = page.evaluate("() => window.__perfsightPainted")
        if value is not None:
            return float(value)
        time.sleep(0.02)
    return None


def job_first_paint(port: int, run: str, repeats: int, only: str | None = None) -> list[dict[str, Any]]:
    """Per page of :data:`JOB_PAGES`: ms from navigation start until its main content is on screen,
    in a fresh browser context each time (nothing cached), Debian's Chromium headless."""
    import json

    from playwright.sync_api import sync_playwright

    rows = []
    with sync_playwright() as p:
        browser = p.chromium.launch(
            executable_path=os.environ.get("PERFSIGHT_CHROMIUM", "/usr/bin/chromium"),
            args=["--no-sandbox", "--headless", "--disable-gpu"],
        )
        try:
            for page_name, selector in JOB_PAGES:
                if only and not re.search(only, page_name):
                    continue
                url = f"http://127.0.0.1:{port}/#/{page_name}?" + urllib.parse.urlencode({"run": run})
                painted, fcp = [], []
                errors: list[str] = []

                def console(message: Any, errors: list[str] = errors) -> None:
                    if message.type == "error":
                        errors.append(message.text)

                for _ in range(repeats):
                    context = browser.new_context(viewport={"width": 1600, "height": 1000})
                    page = context.new_page()
                    page.on("console", console)
                    page.add_init_script(_FIRST_MATCH % json.dumps(selector))
                    page.goto(url)
                    seen = _painted(page)
                    if seen is None:  # a page this UI lacks, or one that failed: no more tries
                        context.close()
                        break
                    painted.append(seen)
                    fcp.append(
                        page.evaluate(
                            "performance.getEntriesByName('first-contentful-paint')[0]?.startTime ?? null"
                        )
                    )
                    rows_shown = page.locator(selector).count()
                    context.close()
                if not painted:
                    rows.append({"page": f"#/{page_name}", "selector": selector, "absent": True})
                    continue
                rows.append(
                    {
                        "page": f"#/{page_name}",
                        "selector": selector,
                        "n": len(painted),
                        "paint_p50_ms": statistics.median(painted),
                        "paint_max_ms": max(painted),
                        "fcp_p50_ms": statistics.median([f for f in fcp if f is not None] or [0.0]),
                        "elements": rows_shown,
                        "console_errors": errors[:3],
                    }
                )
        finally:
            browser.close()
    return rows


def job_bench(args: argparse.Namespace) -> int:
    job: Path = args.job
    if not job.exists():
        cmd = [
            sys.executable,
            str(HERE / "gen_cluster_job.py"),
            "--out",
            str(job),
            "--ranks",
            str(args.ranks),
        ]
        subprocess.run(cmd, check=True)
    started = machine()
    cache = args.cache or Path(tempfile.mkdtemp(prefix="perfsight-bench-job-"))
    run = job.name
    process, port = _serve(job.parent, cache)
    try:
        http = Http(port)
        analyse_s = _wait_analysed(http, run, args.analysis_timeout)
        ranks = len(http.get("/api/run/status", {"run": run})[3]["ranks"])
        print(f"{run}: {ranks} ranks, ready after {analyse_s:.1f} s", flush=True)
        opening = rank_open(http, run, http.get("/api/run/status", {"run": run})[3]["ranks"])
        for row in opening:
            print(row, flush=True)
        api = job_api(http, run, args.requests, args.only)
        for row in api:
            print(row, flush=True)
        paint = job_first_paint(port, run, args.paint_repeats, args.only) if not args.no_browser else []
        for row in paint:
            print(row, flush=True)
    finally:
        process.terminate()
        process.wait(timeout=30)
    if args.write_md:
        lines = [
            "",
            f"Run of {dt.datetime.now(dt.UTC):%Y-%m-%d %H:%M} UTC, {ranks} ranks. Machine: {started}.",
            f"Command: `python benchmarks/bench_server.py {' '.join(sys.argv[1:])}`; the job was ready "
            f"{analyse_s:.0f} s after it was opened (the server's own analysis, or reading --cache's).",
            "",
        ]
        lines += ["| opening one rank (fresh server) | ms |", "|---|---:|"]
        lines += [f"| {r['what']}: `{r['path']}` | {r['ms']:.0f} |" for r in opening]
        lines += ["", "| endpoint | first ms | p50 ms | p95 ms | max ms | n | KiB | p95 <= 200 ms |"]
        lines += ["|---|---:|---:|---:|---:|---:|---:|---|"]
        for r in api:
            if r.get("absent"):
                lines.append(f"| `{r['endpoint']}` | absent (404) | | | | | | |")
                continue
            lines.append(
                f"| `{r['endpoint']}` | {r['first_ms']:.0f} | {r['p50_ms']:.1f} | {r['p95_ms']:.1f} | "
                f"{r['max_ms']:.0f} | {r['n']} | {r['bytes'] / 1024:.0f} | "
                f"{'yes' if r['p95_ms'] <= 200 else '**no**'} |"
            )
        if paint:
            lines += [
                "",
                "| page | first paint p50 ms | max ms | first contentful paint p50 ms | n "
                "| elements of the selector | <= 2 s |",
                "|---|---:|---:|---:|---:|---:|---|",
            ]
            for r in paint:
                if r.get("absent"):
                    lines.append(f"| `{r['page']}` | not seen in {PAGE_TIMEOUT_S:.0f} s | | | | | |")
                    continue
                lines.append(
                    f"| `{r['page']}` (`{r['selector']}`) | {r['paint_p50_ms']:.0f} | "
                    f"{r['paint_max_ms']:.0f} | "
                    f"{r['fcp_p50_ms']:.0f} | {r['n']} | {r['elements']} | "
                    f"{'yes' if r['paint_max_ms'] <= 2000 else '**no**'} |"
                )
        with open(args.write_md, "a", encoding="utf-8") as handle:
            handle.write("\n".join(lines) + "\n")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--trace", type=Path, help="the ~10M-event trace (generated if absent)")
    parser.add_argument(
        "--job", type=Path, help="instead: the job pages on this job folder (generated if absent)"
    )
    parser.add_argument("--ranks", type=int, default=1024, help="ranks when generating --job")
    parser.add_argument("--requests", type=int, default=30, help="requests per job endpoint")
    parser.add_argument("--paint-repeats", type=int, default=3, help="page loads per job page")
    parser.add_argument("--no-browser", action="store_true", help="job: the API only")
    parser.add_argument(
        "--only", help="job: only the endpoints and pages whose path matches this regular expression"
    )
    parser.add_argument("--analysis-timeout", type=float, default=1800.0)
    parser.add_argument("--size-mb", type=int, default=5700, help="size when generating --trace")
    parser.add_argument("--first-view-trace", type=Path, help="the 1 GB trace for the first-view figure")
    parser.add_argument("--width", type=int, default=2000)
    parser.add_argument("--queries", type=int, default=300)
    parser.add_argument("--per-zoom", type=int, default=50, help="windows per fixed zoom level")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--cache", type=Path, help="server cache dir (default: a temporary one)")
    parser.add_argument("--write-md", type=Path, help="append the results as a table to this Markdown file")
    args = parser.parse_args(argv)
    if args.job is not None:
        return job_bench(args)
    if args.trace is None:
        parser.error("--trace or --job is required")
    started = machine()
    cache = args.cache or Path(tempfile.mkdtemp(prefix="perfsight-bench-server-"))
    rows = []
    traces = [args.trace] + ([args.first_view_trace] if args.first_view_trace else [])
    for trace in traces:
        if not trace.exists():
            _generate(trace, args.size_mb if trace == args.trace else 1024)
        run, analyse_s = _analyse(trace, cache)
        files = [trace] if trace.is_file() else [p for p in trace.rglob("*") if p.is_file()]
        size_mb = sum(p.stat().st_size for p in files) / 2**20
        view = first_view(trace, cache, args.width)
        lod = window_p95(trace, cache, args.width, args.queries, args.seed)
        zooms = server_windows(trace, cache, args.width, args.per_zoom, args.seed)
        zooms["raw_over_pyramid"] = pyramid_vs_raw(trace, cache, args.width, args.per_zoom, args.seed)
        ov = overview(trace, cache)
        row = {"trace": trace.parent.name + "/" + trace.name, "size_mb": size_mb, "analyse_s": analyse_s}
        row.update(**view, **lod, **zooms, **ov)
        rows.append(row)
        print(row, flush=True)
    if args.write_md:
        lines = [
            "",
            f"Run of {dt.datetime.now(dt.UTC):%Y-%m-%d %H:%M} UTC. Machine: {started}.",
            f"Command: `python benchmarks/bench_server.py {' '.join(argv or sys.argv[1:])}`",
            "",
            "| trace | MB | events | steps | analyse s | first view s (tracks + full window) | window p50 ms "
            "| window p95 ms (CPU) | window max ms | server alone: window CPU p50 / p95 ms (wall p95) "
            "| entries/window mean (max) | overview cold ms (CPU) | overview warm p95 ms (CPU) "
            "| overview, next fresh server ms (CPU) |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for r in rows:
            lines.append(
                f"| {r['trace']} | {r['size_mb']:.0f} | {r['events']:,} | {r['steps']:,} | "
                f"{r['analyse_s']:.1f} | {r['first_view_s']:.2f} "
                f"({r['tracks_s']:.2f} + {r['window_s']:.2f}) | "
                f"{r['p50_ms']:.1f} | {r['p95_ms']:.1f} ({r['cpu_p95_ms']:.1f}) | {r['max_ms']:.1f} | "
                f"{r['server_cpu_p50_ms']:.1f} / {r['server_cpu_p95_ms']:.1f} "
                f"({r['server_wall_p95_ms']:.1f}) | "
                f"{r['mean_returned']:.0f} ({r['max_returned']}) | "
                f"{r['cold_ms']:.0f} ({r['cold_cpu_ms']:.0f}) | "
                f"{r['warm_p95_ms']:.0f} ({r['warm_cpu_p95_ms']:.0f}) | "
                f"{r['saved_ms']:.0f} ({r['saved_cpu_ms']:.0f}) |"
            )
        lines += [
            "",
            "Server alone, per zoom level (fraction of the trace; random positions): CPU p50 / p95 ms, "
            "wall p50 / p95 ms, entries per window; last row per trace: CPU p95 of the query + JSON "
            "without the pyramid / with it, same windows, same run:",
            "",
            "| trace | " + " | ".join(f"{z:g}" for z in ZOOMS) + " |",
            "|---|" + "---:|" * len(ZOOMS),
        ]
        for r in rows:
            cells = [
                f"{z['cpu_p50_ms']:.1f} / {z['cpu_p95_ms']:.1f}; "
                f"{z['wall_p50_ms']:.1f} / {z['wall_p95_ms']:.1f}; {z['entries']:.0f}"
                for z in r["zooms"].values()
            ]
            lines.append(f"| {r['trace']} | " + " | ".join(cells) + " |")
            ratios = [f"{r['raw_over_pyramid'][z]:.1f}x" for z in ZOOMS]
            lines.append("| raw arrays / pyramid | " + " | ".join(ratios) + " |")
        with open(args.write_md, "a", encoding="utf-8") as handle:
            handle.write("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
