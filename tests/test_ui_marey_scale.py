"""The Marey page of a job larger than one page of device rows, in a real Chromium: a generated
40-rank job (``benchmarks/gen_cluster_job.py``) opens with its stage folded, a click on the stage
draws its first 32 devices, the pager the other 8, with no console error."""

# ruff: noqa: F811 - the fixtures imported from _ui are redefined as test parameters, as pytest intends
from __future__ import annotations

import sys
from collections.abc import Iterator
from typing import Any

import pytest

from _ui import Server, Watched, need_browser, own_server_browser, watched_page  # noqa: F401 - fixture
from shared_data import REPO

sys.path.insert(0, str(REPO / "benchmarks"))
from gen_cluster_job import generate  # noqa: E402

RANKS = 40
ROWS = 32  # server/job_parallel.py's MAREY_ROWS


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    need_browser()
    base = tmp_path_factory.mktemp("ui-marey-scale") / "jobs"
    generate(
        base / "job40", ranks=RANKS, size_mb=None, stragglers={17: 1.3}, steps=3, workers=1, slow_link=None
    )
    served = Server(base)
    try:
        served.wait_ready("job40", timeout_s=300)
        yield served
    finally:
        served.stop()


@pytest.fixture
def page(own_server_browser: Any, server: Server) -> Iterator[Watched]:
    with watched_page(own_server_browser) as watched:
        yield watched


def test_a_large_job_opens_folded_and_pages_its_devices(page: Watched, server: Server) -> None:
    p = page.page
    p.goto(server.page_url("job-marey", "job40"))
    p.wait_for_selector('.mv-stage[data-stage="0"]')
    box = p.locator('[data-testid="marey-box"]')
    api = server.get("job/marey", run="job40")
    assert p.locator(".mv-device").count() == 0
    assert p.locator('.mv-stage-row[data-stage="0"]').count() == 1
    assert f"{RANKS} devices" in p.locator('.mv-stage[data-stage="0"]').text_content()
    assert int(box.get_attribute("data-ops")) == api["matched_ops"]  # folded, every op drawn
    with p.expect_response(lambda r: "api/job/marey" in r.url and "unfold=0" in r.url):
        p.locator('.mv-stage[data-stage="0"]').click()
    p.wait_for_selector(".mv-device")
    ranks = [int(r) for r in p.locator(".mv-device").evaluate_all("els => els.map(e => e.dataset.rank)")]
    assert ranks == list(range(ROWS))
    pager = p.locator('[data-testid="marey-pager"]')
    assert f"1–{ROWS} of {RANKS}" in pager.inner_text()
    with p.expect_response(lambda r: "api/job/marey" in r.url and f"first={ROWS}" in r.url):
        p.locator('[data-testid="marey-next"]').click()
    p.wait_for_selector(f'.mv-device[data-rank="{ROWS}"]')
    ranks = [int(r) for r in p.locator(".mv-device").evaluate_all("els => els.map(e => e.dataset.rank)")]
    assert ranks == list(range(ROWS, RANKS))
    assert f"{ROWS + 1}–{RANKS} of {RANKS}" in pager.inner_text()
    assert int(box.get_attribute("data-ops")) == api["matched_ops"]
    assert not page.errors
