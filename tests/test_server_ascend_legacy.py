"""The web UI's run list and overview for Ascend rank folders (a real two-rank ``*_ascend_pt`` job
from ../shared/data/ascend_pt) and MindInsight's legacy ``profiler/`` layout
(tests/fixtures/mindinsight_legacy), over real HTTP from ``perfsight serve`` (tests/_ui.Server)
and, when Chromium is installed, in a real browser."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from _ui import (
    Server,
    Watched,
    fmt_percent,
    own_server_browser,  # noqa: F401 - fixture
)
from shared_data import DATA, require

LEGACY = Path(__file__).parent / "fixtures" / "mindinsight_legacy"
LEGACY_RUN, CLUSTER_RUN, ASCEND_RUN = "old_run/profiler", "old_cluster", "ascend_job"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    level0 = DATA / "ascend_pt" / "level0"
    require(level0)
    base = tmp_path_factory.mktemp("ascend_legacy") / "base"
    shutil.copytree(level0, base / ASCEND_RUN)
    shutil.copytree(LEGACY / "single", base / "old_run")
    shutil.copytree(LEGACY / "cluster", base / CLUSTER_RUN)
    running = Server(base)
    try:
        yield running
    finally:
        running.stop()


def test_ascend_jobs_and_legacy_runs_are_listed_as_runs_and_open(server: Server) -> None:
    runs = {r["id"]: r for r in server.get("runs")["runs"]}
    # one run per job, never one per JSON file of it (trace_view.json, hccl.json, timeline display)
    assert {i: (r["kind"], r["ranks"]) for i, r in runs.items()} == {
        ASCEND_RUN: ("job", [0, 1]),
        CLUSTER_RUN: ("job", [0, 1, 2, 3]),
        LEGACY_RUN: ("job", [0]),
    }

    server.wait_ready(LEGACY_RUN)
    overview = server.get("run/overview", run=LEGACY_RUN)
    steps = overview["steps"]
    # MindInsight's own step trace (fp+bp 7.5 ms in the CSV) is a cross-check, and the page says so
    assert any("MindInsight's own step trace" in w and "vendor_step_trace" in w for w in overview["warnings"])
    # perfsight's step trace: device ops only, no host operator to place FP/BP by: the whole step
    assert [s["fp_bp_ns"] for s in steps] == [10_000_000] * 3
    assert [s["computing_ns"] for s in steps] == [7_800_000] * 3  # perfsight's, from its timeline

    assert server.wait_ready(ASCEND_RUN)["ranks"] == [0, 1]
    for rank in (0, 1):
        body = server.get("run/overview", run=ASCEND_RUN, rank=rank)
        assert body["rank"] == rank and body["ranks"] == [0, 1] and body["steps"]
        assert body["timeline"]["device_tracks"] > 0 and body["shares"]["computing"] > 0

    assert server.wait_ready(CLUSTER_RUN)["ranks"] == [0, 1, 2, 3]
    rank0, rank3 = (server.get("run/overview", run=CLUSTER_RUN, rank=r)["steps"] for r in (0, 3))
    # the slow device of host 2 (13 ms steps against 10 ms); no op timeline, so perfsight's
    # forward+backward is the whole step
    assert sum(s["fp_bp_ns"] for s in rank3) > sum(s["fp_bp_ns"] for s in rank0) == 30_000_000


def test_the_overview_page_shows_a_legacy_run_and_an_ascend_rank(
    server: Server,
    own_server_browser: Any,  # noqa: F811 - the fixture imported above
) -> None:
    context = own_server_browser.new_context()
    try:
        watched = Watched(context.new_page())
        for run, rank in ((LEGACY_RUN, 0), (ASCEND_RUN, 1)):
            server.wait_ready(run)
            data = server.get("run/overview", run=run, rank=rank)
            watched.page.goto(server.page_url("overview", run, rank=rank))
            watched.page.wait_for_selector('[data-testid="stat-steps"]')
            assert watched.page.text_content('[data-testid="stat-steps"]') == str(len(data["steps"]))
            shown = watched.page.text_content('[data-share="Computing"]')
            assert shown == fmt_percent(data["shares"]["computing"])
        assert not watched.errors and not watched.dialogs
    finally:
        context.close()
