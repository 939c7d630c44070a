"""The data-preparation page in a real Chromium, against `perfsight serve` on a real data-bound run.

The run is tests/_data_prep_job.py with two workers and a Compose whose second transform sleeps
(``transform[1] Blur``), its loop converting each batch with ``.to(torch.float64)``; the page must
name that stage, mark it in the pipeline graph, draw the copy as the stage before the loop, show
the host queue's empty count the API reports, and render both of the seed's tabs with no console
error.  On a 2-rank gloo job whose rank 1 alone reads slowly, the page compares the ranks' waits.
A run recorded without the capture says how to enable it.
"""

# ruff: noqa: F811 - the fixtures imported from _ui are redefined as test parameters, as pytest intends
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from _ui import AMD_TRACE, Server, Watched, need_browser, own_server_browser, watched_page  # noqa: F401
from shared_data import require

JOB = Path(__file__).with_name("_data_prep_job.py")
SLOW_STAGE = "transform[1] Blur"
SLOW_RANK = 1  # of the 2-rank job: only its reads are slow
SHOTS = os.environ.get("PERFSIGHT_SCREENSHOTS")  # a folder: the tests leave their screenshots there


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    need_browser()
    require(AMD_TRACE)
    base = tmp_path_factory.mktemp("ui-data") / "runs"
    result = subprocess.run(
        [
            *(sys.executable, str(JOB), "--out", str(base / "loader")),
            *("--workers", "2", "--slow", "transform", "--copy"),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    job = [
        sys.executable,
        str(JOB),
        "--out",
        str(base / "job"),
        "--ranks",
        "2",
        "--slow-rank",
        str(SLOW_RANK),
    ]
    result = subprocess.run(
        [*job, "--slow", "read"], capture_output=True, text=True, timeout=300, check=False
    )
    assert result.returncode == 0, result.stderr[-3000:]
    shutil.copyfile(AMD_TRACE, base / AMD_TRACE.name)
    running = Server(base)
    try:
        yield running
    finally:
        running.stop()


def _run_id(server: Server, part: str) -> str:
    ids = [r["id"] for r in server.get("runs")["runs"] if part in r["id"]]
    assert len(ids) == 1, ids
    server.wait_ready(ids[0], timeout_s=300)
    return ids[0]


@pytest.fixture
def page(own_server_browser: Any) -> Iterator[Watched]:
    with watched_page(own_server_browser) as watched:
        yield watched


def _shot(watched: Watched, name: str) -> None:
    if SHOTS:
        watched.page.screenshot(path=str(Path(SHOTS) / name), full_page=True)


def test_the_page_names_the_slow_stage_and_draws_both_tabs(server: Server, page: Watched) -> None:
    run = _run_id(server, "loader")
    api = server.get("run/data-prep", run=run)
    assert api["summary"]["bottleneck_stage"] == SLOW_STAGE
    p = page.page
    p.goto(server.page_url("data", run))
    assert p.get_by_test_id("data-bottleneck").inner_text() == SLOW_STAGE
    empty = api["summary"]["host_queue_empty"]
    assert empty > 0
    assert p.get_by_test_id("data-host-empty-count").inner_text() == f"{empty:,}"
    p.get_by_test_id("chart-data-queues").locator("canvas").first.wait_for()
    _shot(page, "data-gap.png")

    p.locator('.seg button[data-value="processing"]').click()
    graph = p.get_by_test_id("data-graph")
    graph.wait_for()
    marked = graph.locator(".data-stage.bottleneck")
    assert marked.count() == 1 and marked.get_attribute("data-stage") == SLOW_STAGE
    assert p.get_by_test_id("data-detail").locator("h3").first.inner_text() == SLOW_STAGE
    p.get_by_test_id("chart-data-stage").locator("canvas").first.wait_for()  # its time per batch
    assert SLOW_STAGE in api["stage_batches"]
    _shot(page, "data-stage.png")
    # the loop's .to(float64) of each batch: the last stage before the loop, with the API's time
    copy = next(s for s in api["stages"] if s["stage"] == "to_device")
    assert copy["batches"] == len(api["queue"]) and copy["op_type"] == "DeviceCopy"
    assert graph.locator(".data-stage").last.get_attribute("data-stage") == "to_device"
    assert p.get_by_test_id("data-copy-none").count() == 0
    rows = p.get_by_test_id("data-worker-table").locator("tbody tr")
    assert rows.count() == len(api["workers"]) == 2
    p.get_by_test_id("data-queue-host").click()
    p.get_by_test_id("chart-data-queue-host").locator("canvas").first.wait_for()
    _shot(page, "data-processing.png")
    assert page.errors == [] and page.dialogs == []


def test_a_run_without_capture_says_how_to_enable_it(server: Server, page: Watched) -> None:
    run = _run_id(server, AMD_TRACE.name)
    p = page.page
    p.goto(server.page_url("data", run))
    text = p.get_by_test_id("data-none").inner_text()
    assert "Level2" in text and "profiler_level" in text
    assert page.errors == []


def test_a_job_compares_the_ranks_wait_for_data(server: Server, page: Watched) -> None:
    run = _run_id(server, "job")
    ranks = server.get("run/data-prep", run=run, rank=0)["ranks"]
    assert [r["rank"] for r in ranks] == [0, 1]
    slow, other = ranks[SLOW_RANK], ranks[1 - SLOW_RANK]
    assert slow["bottleneck_stage"] == "read" and other["bottleneck_stage"] is None
    # the slow rank sleeps in every read, so a good share of its loop waits for data; which rank
    # waits more overall followed CI's load (its healthy rank waited 0.65 of its loop, the slow 0.60)
    assert slow["wait_share"] > 0.2 and slow["wait_ns"] > 0
    p = page.page
    p.goto(server.page_url("data", run, rank=SLOW_RANK))
    assert p.get_by_test_id("data-bottleneck").inner_text() == "read"
    bars = p.get_by_test_id("chart-data-ranks")
    bars.locator("canvas").first.wait_for()
    assert "Rank 0" in (bars.get_attribute("aria-label") or "")
    _shot(page, "data-job.png")
    p.locator('.seg button[data-value="processing"]').click()
    note = p.get_by_test_id("data-copy-none")  # this job's loop copies nothing: no copy stage
    note.wait_for()
    assert p.locator('.data-stage[data-stage="to_device"]').count() == 0
    assert page.errors == []
