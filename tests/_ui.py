"""Shared set-up of the browser tests (tests/test_ui_*.py): a real server, real runs, a real browser.

Why one helper module: every UI test needs the same expensive things -- a traced training run,
a copy of a real Kineto trace, the hostile-names trace, ``perfsight serve`` on a free port and a
Chromium driven by Playwright -- and they are built once per test session (per xdist worker).

The browser is Debian's Chromium at /usr/bin/chromium (``.ci/run`` installs it); Playwright's own
browser downloads are never used.  Without it, or without the built UI, the tests skip and say why.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from shared_data import KINETO, REPO, require

CHROMIUM = Path(os.environ.get("PERFSIGHT_CHROMIUM", "/usr/bin/chromium"))
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--headless",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
STATIC_INDEX = REPO / "src" / "perfsight" / "server" / "static" / "index.html"
EXAMPLE = REPO / "examples" / "train_mlp.py"
NCCL_TRACE = KINETO / "nccl_parser_config" / "nccl_data.json.gz"
AMD_TRACE = KINETO / "amd_trace" / "mi250_minitoy_train_ROCm6_2_kineto.json.gz"  # tiny: a quick analysis
TWO_RANKS = [KINETO / "two_ranks_ws128" / f"sampled_rank-{rank}.json.gz" for rank in (0, 1)]

# The timeline canvas's layout (web/src/timeline/render.ts): tests aim clicks with it.
RULER_H = 26
GUTTER_W = 250
ROW_H = 18
TRACK_GAP = 8

# Run ids (paths relative to the base dir) of the runs the fixtures create.
MLP_RUN = "mlp"
KINETO_RUN = "kineto/nccl_data.json.gz"
HOSTILE_RUN = "hostile"
JOB_RUN = "job"  # a folder of per-rank traces: one run of two ranks


def need_browser() -> None:
    if not CHROMIUM.exists():
        pytest.skip(f"Chromium not found at {CHROMIUM} (.ci/run installs it: apt-get install chromium)")
    pytest.importorskip("playwright.sync_api", reason="playwright is in the dev extra")
    if not STATIC_INDEX.is_file():  # `make test` builds it first; a missing UI is a failure, not a skip
        pytest.fail(f"web UI not built ({STATIC_INDEX} missing): run `make web`")


def _free_port() -> int:
    with contextlib.closing(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _train_mlp(out: Path) -> None:
    result = subprocess.run(
        [
            sys.executable,
            str(EXAMPLE),
            "--out",
            str(out),
            "--steps",
            "3",
            "--batch-size",
            "8",
            "--hidden",
            "32",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stderr


def _write_hostile(folder: Path) -> None:
    """The hostile-names trace as a folder `perfsight analyse` would have written."""
    from _hostile import hostile_trace
    from perfsight.pipeline import Options, analyse_and_write

    analyse_and_write(hostile_trace(), folder / "rank0", Options())


def make_base_dir(base: Path, training_run: Path) -> Path:
    """A base dir with a traced training run, real Kineto traces (one GPU rank, a two-rank job)
    and the hostile-names run."""
    for need in (NCCL_TRACE, AMD_TRACE, *TWO_RANKS):
        require(need)
    shutil.copytree(training_run, base / MLP_RUN)
    (base / "kineto").mkdir(parents=True)
    shutil.copyfile(NCCL_TRACE, base / KINETO_RUN)
    _write_hostile(base / HOSTILE_RUN)
    (base / JOB_RUN).mkdir()
    for trace in TWO_RANKS:
        shutil.copyfile(trace, base / JOB_RUN / trace.name)
    return base


class Server:
    """``perfsight serve`` in a subprocess, with a tiny JSON client for the tests' expectations."""

    def __init__(self, base: Path) -> None:
        self.base = base
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}/"
        # beside the test's files, never beside ``base``: a test may serve a read-only input folder
        self.log = Path(tempfile.mkdtemp(prefix="perfsight-serve-log-")) / f"serve-{self.port}.log"
        self._log_handle = open(self.log, "wb")  # noqa: SIM115 - closed in stop()
        self.process = subprocess.Popen(
            [sys.executable, "-m", "perfsight.cli", "serve", "--summary-base-dir", str(base)]
            + ["--port", str(self.port)],
            stdout=self._log_handle,
            stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"perfsight serve exited: {self.log.read_text(errors='replace')}")
            with contextlib.suppress(OSError):
                self.get("info")
                return
            time.sleep(0.2)
        self.stop()
        raise RuntimeError(
            f"perfsight serve did not answer within 60 s: {self.log.read_text(errors='replace')}"
        )

    def get(self, path: str, **params: Any) -> Any:
        query = urllib.parse.urlencode({k: v for k, v in params.items() if v is not None})
        with urllib.request.urlopen(f"{self.url}api/{path}{'?' + query if query else ''}", timeout=60) as r:
            return json.loads(r.read())

    def wait_ready(self, run: str, timeout_s: float = 180) -> dict[str, Any]:
        """Poll the run's status (which starts its analysis) until it is ready."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            status = self.get("run/status", run=run)
            if status["status"] == "ready":
                return status
            assert status["status"] != "failed", status
            time.sleep(0.3)
        raise AssertionError(f"run {run} not analysed within {timeout_s} s")

    def page_url(self, page: str, run: str, **params: Any) -> str:
        query = urllib.parse.urlencode({"run": run, **params})
        return f"{self.url}#/{page}?{query}"

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
        self._log_handle.close()


@contextlib.contextmanager
def browser_session() -> Iterator[Any]:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            yield browser
        finally:
            browser.close()


class Watched:
    """A page that records what a hostile name could make the browser do (dialogs, uncaught
    errors) and, with ``console=True``, the console's errors too."""

    def __init__(self, page: Any, console: bool = False) -> None:
        self.page = page
        self.dialogs: list[str] = []
        self.errors: list[str] = []
        page.on("dialog", lambda d: (self.dialogs.append(d.message), d.dismiss()))
        page.on("pageerror", lambda e: self.errors.append(str(e)))
        if console:
            page.on("console", lambda m: self.errors.append(m.text) if m.type == "error" else None)
            # the console says only "status of 500": name the request, and what the server answered
            page.on("response", self._server_error)

    def _server_error(self, response: Any) -> None:
        if response.status >= 500:
            try:
                body = response.text()[:500]
            except Exception as exc:  # noqa: BLE001 - the page may be gone already
                body = f"(body unreadable: {exc})"
            self.errors.append(f"{response.status} {response.url}: {body}")


@contextlib.contextmanager
def watched_page(browser: Any) -> Iterator[Watched]:
    """A fresh 1600x1000 page of ``browser`` that records dialogs, uncaught and console errors."""
    context = browser.new_context(viewport={"width": 1600, "height": 1000})
    watched = Watched(context.new_page(), console=True)
    watched.page.set_default_timeout(60_000)
    try:
        yield watched
    finally:
        context.close()


def fmt_ms(ns: float | None, digits: int = 3) -> str:
    """The UI's `fmt.ms` (web/src/format.ts) for the expected text of table cells."""
    return "–" if ns is None else f"{ns / 1e6:.{digits}f}"


def fmt_percent(ratio: float) -> str:
    return f"{ratio * 100:.1f}%"


def fmt_bytes(n: int | None) -> str:
    if n is None:
        return "–"
    units = ["B", "KiB", "MiB", "GiB", "TiB"]
    value, unit = float(n), 0
    while abs(value) >= 1024 and unit < len(units) - 1:
        value /= 1024
        unit += 1
    return f"{int(value)} B" if unit == 0 else f"{value:.2f} {units[unit]}"


# ---------------------------------------------------------------------------------------------- fixtures
# Imported by each tests/test_ui_*.py module.  pytest makes one fixture definition per importing
# module, so the session's server and browser are kept here, once per process (xdist worker);
# the traced training run is made once per test session and shared by the workers.

_shared: dict[str, Any] = {}


def _training_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """examples/train_mlp.py's trace, trained once per session (the first worker trains, under a lock)."""
    from filelock import FileLock

    root = tmp_path_factory.getbasetemp()
    shared = root.parent if os.environ.get("PYTEST_XDIST_WORKER") else root
    folder = shared / "ui-training-run"
    with FileLock(str(shared / "ui-training-run.lock")):
        if not any(folder.glob("*.pt.trace.json*")):
            _train_mlp(folder)
    return folder


@pytest.fixture(scope="session")
def ui_server(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Server:
    if "server" not in _shared:
        need_browser()
        base = tmp_path_factory.mktemp("ui") / "runs"
        make_base_dir(base, _training_run(tmp_path_factory))
        server = Server(base)
        request.session.addfinalizer(server.stop)
        _shared["server"] = server
    return _shared["server"]


def _process_browser(request: pytest.FixtureRequest) -> Any:
    """The one browser of this test process.  Why one: Playwright's sync API keeps its event loop
    running while a session is open, and a second session in the same process fails ("Sync API
    inside the asyncio loop"), so every module's browser tests share this one."""
    if "browser" not in _shared:
        need_browser()
        session = browser_session()
        _shared["browser"] = session.__enter__()
        request.session.addfinalizer(lambda: session.__exit__(None, None, None))
    return _shared["browser"]


@pytest.fixture(scope="session")
def ui_browser(request: pytest.FixtureRequest, ui_server: Server) -> Any:
    return _process_browser(request)


@pytest.fixture(scope="session")
def own_server_browser(request: pytest.FixtureRequest) -> Any:
    """The process's browser for tests that start their own server (no training-run fixture)."""
    return _process_browser(request)


@pytest.fixture
def ui_page(ui_browser: Any) -> Iterator[Watched]:
    context = ui_browser.new_context(viewport={"width": 1500, "height": 950})
    page = context.new_page()
    page.set_default_timeout(60_000)
    watched = Watched(page)
    try:
        yield watched
    finally:
        context.close()


@contextlib.contextmanager
def served_demo(factory: Any, name: str, runs: tuple[str, ...], straggler: bool = False) -> Iterator[Server]:
    """A real ``perfsight serve`` of `make demo`'s jobs (tests/_jobs.py: the DDP job, the pipeline
    job, and with ``straggler`` the job with a slowed rank), each of ``runs`` analysed before the
    tests start; stopped afterwards.  One place for the job-page test modules' server fixture."""
    from _jobs import demo_base

    need_browser()
    server = Server(demo_base(factory, factory.mktemp(name) / "demo_output", straggler=straggler))
    try:
        for run in runs:
            server.wait_ready(run, timeout_s=300)
        yield server
    finally:
        server.stop()


def column(page: Any, rows: str, index: int) -> list[str]:
    """The text of column ``index`` in every row matched by ``rows``."""
    return [row.locator("td").nth(index).inner_text() for row in page.locator(rows).all()]


def sort_by(page: Any, testid: str, label: str, arrow: str) -> None:
    """Click the column header ``label`` and wait until the table shows rows sorted ``arrow``."""
    page.locator(f'[data-testid="{testid}"] th', has_text=label).first.click()
    page.wait_for_selector(f'[data-testid="{testid}"] th:has-text("{label}"):has-text("{arrow}")')
    page.wait_for_selector(f'[data-testid="{testid}"]:not([aria-busy])')
