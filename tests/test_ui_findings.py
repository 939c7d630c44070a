"""The advisor's findings in a real Chromium, against `perfsight serve` on real runs.

The runs are `make demo`'s jobs (tests/_jobs.py: a 2-stage pipeline job whose stage 1 is given four
times the layers, a DDP job with one rank made slow) and a real Kineto GPU trace.  What the pages
show is compared with /api/*/findings (which serve advisor.json as written) and with how the jobs
were run (which stage was overloaded, which rank was slowed), never with strings we wrote.
"""

# ruff: noqa: F811 - the fixtures imported from _ui are redefined as test parameters, as pytest intends
from __future__ import annotations

import shutil
from collections.abc import Iterator
from typing import Any

import pytest

from _jobs import OVERLOADED_STAGE, PP_JOB, SLOW_RANK, STRAGGLER_JOB, demo_base
from _ui import (  # noqa: F401 - fixture
    HOSTILE_RUN,
    KINETO_RUN,
    NCCL_TRACE,
    Server,
    Watched,
    _write_hostile,
    need_browser,
    own_server_browser,
    watched_page,
)
from shared_data import require

FINDINGS = '[data-testid="findings-list"] [data-testid="finding"]'


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    need_browser()
    require(NCCL_TRACE)
    base = demo_base(tmp_path_factory, tmp_path_factory.mktemp("ui-findings") / "demo_output", straggler=True)
    (base / KINETO_RUN).parent.mkdir(parents=True)
    shutil.copyfile(NCCL_TRACE, base / KINETO_RUN)
    _write_hostile(base / HOSTILE_RUN)
    running = Server(base)
    try:
        for run in (PP_JOB, STRAGGLER_JOB, KINETO_RUN, HOSTILE_RUN):
            running.wait_ready(run, timeout_s=300)
        yield running
    finally:
        running.stop()


@pytest.fixture
def page(own_server_browser: Any, server: Server) -> Iterator[Watched]:
    with watched_page(own_server_browser) as watched:
        yield watched


def _above_info(findings: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [f for f in findings if f["severity"] != "info"]


def test_the_job_overview_leads_with_the_overloaded_stage(page: Watched, server: Server) -> None:
    p = page.page
    p.goto(server.page_url("job", PP_JOB))
    card = p.locator('[data-testid="card-findings"]')
    card.locator('[data-testid="findings-top"]').wait_for()
    # the card is the first thing on the page
    assert p.locator("main > *").first.get_attribute("data-testid") == "card-findings"
    answer = server.get("job/findings", run=PP_JOB)
    top = card.locator('[data-testid="finding"]')
    expected = _above_info(answer["findings"])[: top.count()]
    assert top.count() >= 1
    assert top.locator('[data-testid="finding-title"]').all_inner_texts() == [f["title"] for f in expected]
    first = top.first
    assert first.locator(".badge.severity").get_attribute("data-severity") == expected[0]["severity"]
    culprit = first.locator('[data-testid="finding-culprit"]')
    assert (culprit.get_attribute("data-kind"), culprit.get_attribute("data-name")) == (
        "stage",
        str(OVERLOADED_STAGE),
    )
    # "details" opens the job's findings tab
    card.locator('[data-testid="findings-details"]').click()
    p.wait_for_selector(FINDINGS)
    assert "#/job-findings?" in p.url
    assert p.locator("nav.tabs a.active").get_attribute("data-page") == "job-findings"
    assert not page.errors


def test_the_findings_page_lists_every_finding_with_its_evidence_in_either_language(
    page: Watched, server: Server
) -> None:
    p = page.page
    p.goto(server.page_url("job-findings", PP_JOB))
    p.wait_for_selector(FINDINGS)
    answer = server.get("job/findings", run=PP_JOB)["findings"]
    items = p.locator(FINDINGS)
    assert items.count() == len(answer)
    assert items.locator('[data-testid="finding-title"]').all_inner_texts() == [f["title"] for f in answer]
    assert items.locator('[data-testid="finding-suggestion"]').all_inner_texts() == [
        f["suggestion"] for f in answer
    ]
    assert items.locator('[data-testid="finding-category"]').all_inner_texts() == [
        f["category"] for f in answer
    ]
    # the evidence opens on demand: one row per metric, with the file that shows it
    first = items.first
    assert not first.locator('[data-testid="finding-evidence"]').is_visible()
    first.locator("details summary").click()
    rows = first.locator('[data-testid="finding-evidence"] tbody tr')
    assert rows.count() == len(answer[0]["evidence"])
    cells = [rows.nth(i).locator("td").all_inner_texts() for i in range(rows.count())]
    assert [c[0] for c in cells] == [e["metric"] for e in answer[0]["evidence"]]
    assert [c[3] for c in cells] == [e["source"] for e in answer[0]["evidence"]]
    # the language switch shows the advisor's Chinese texts, and back
    p.locator('[data-testid="findings-language"] button[data-value="zh"]').click()
    p.wait_for_function(
        "want => document.querySelector('[data-testid=\"finding-title\"]').innerText === want",
        arg=answer[0]["texts"]["zh"]["title"],
    )
    assert answer[0]["texts"]["zh"]["title"] != answer[0]["title"]
    assert items.locator('[data-testid="finding-title"]').all_inner_texts() == [
        f["texts"]["zh"]["title"] for f in answer
    ]
    # the choice is kept: the overview's card shows the same language
    p.goto(server.page_url("job", PP_JOB))
    p.locator('[data-testid="findings-top"]').wait_for()
    assert (
        p.locator('[data-testid="card-findings"] [data-testid="finding-title"]').first.inner_text()
        == (_above_info(answer)[0]["texts"]["zh"]["title"])
    )
    p.locator(
        '[data-testid="card-findings"] [data-testid="findings-language"] button[data-value="en"]'
    ).click()
    p.wait_for_function(
        'want => document.querySelector(\'[data-testid="card-findings"] [data-testid="finding-title"]\')'
        ".innerText === want",
        arg=_above_info(answer)[0]["title"],
    )
    assert not page.errors


def test_a_rank_culprit_opens_that_rank(page: Watched, server: Server) -> None:
    p = page.page
    p.goto(server.page_url("job-findings", STRAGGLER_JOB))
    p.wait_for_selector(FINDINGS)
    answer = server.get("job/findings", run=STRAGGLER_JOB)["findings"]
    assert _above_info(answer)[0]["culprit"] == {"kind": "rank", "name": str(SLOW_RANK)}
    link = p.locator(f'{FINDINGS} a[data-testid="finding-culprit"][data-kind="rank"]').first
    assert link.inner_text() == f"Rank {SLOW_RANK}"
    link.click()
    p.wait_for_selector('[data-testid="stat-steps"]')
    assert "#/overview?" in p.url and f"rank={SLOW_RANK}" in p.url
    assert p.locator('[data-testid="rank-select"]').input_value() == str(SLOW_RANK)
    # that rank's overview opens with its own findings (its PROFILER_OUTPUT/advisor.json)
    mine = server.get("run/findings", run=STRAGGLER_JOB, rank=SLOW_RANK)
    p.locator('[data-testid="findings-counts"]').wait_for()
    counts = mine["counts"]
    assert p.inner_text('[data-testid="findings-counts"]') == (
        f"{counts['critical']} critical · {counts['warning']} warning · {counts['info']} info"
    )
    assert not page.errors


def test_a_single_device_overview_and_findings_tab(page: Watched, server: Server) -> None:
    p = page.page
    p.goto(server.page_url("overview", KINETO_RUN))
    p.wait_for_selector('[data-testid="stat-steps"]')
    answer = server.get("run/findings", run=KINETO_RUN)
    card = p.locator('[data-testid="card-findings"]')
    above = _above_info(answer["findings"])
    if above:
        card.locator('[data-testid="findings-top"]').wait_for()
        assert card.locator('[data-testid="finding-title"]').first.inner_text() == above[0]["title"]
    else:
        card.locator('[data-testid="findings-none"]').wait_for()
        assert f"({answer['counts']['info']} informative" in card.inner_text()
    p.locator('nav.tabs a[data-page="findings"]').click()
    p.wait_for_selector(FINDINGS)
    assert p.locator(FINDINGS).count() == len(answer["findings"])
    assert not page.errors


def test_a_hostile_culprit_name_is_shown_as_text(page: Watched, server: Server) -> None:
    p = page.page
    answer = server.get("run/findings", run=HOSTILE_RUN)["findings"]
    hostile = [f for f in answer if f["culprit"]["kind"] == "op"]
    assert hostile and "<" in hostile[0]["culprit"]["name"]  # the trace's markup-like operator name
    p.goto(server.page_url("findings", HOSTILE_RUN))
    p.wait_for_selector(FINDINGS)
    item = p.locator(f'{FINDINGS}[data-rule="{hostile[0]["rule"]}"]')
    name = hostile[0]["culprit"]["name"]
    assert item.locator('[data-testid="finding-culprit"]').inner_text() == f"Operator {name}"
    assert item.locator('[data-testid="finding-title"]').inner_text() == hostile[0]["title"]
    item.locator("details summary").click()
    p.wait_for_timeout(300)
    assert p.locator("main img, main script").count() == 0
    assert not page.dialogs and not page.errors
