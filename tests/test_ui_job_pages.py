"""The job pages in a real Chromium, against `perfsight serve` on real multi-process jobs.

The jobs are those of `make demo` (tests/_jobs.py): a gloo DDP job and a 2-stage pipeline job
whose stage 1 is given four times the layers (examples/train_pp.py --overload-stage 1).  What a
user must see is asserted on the rendered page; expected values come from the JSON API the page is
built from, or from how the job was run (which stage was overloaded), never from strings we wrote.
"""

# ruff: noqa: F811 - the fixtures imported from _ui are redefined as test parameters, as pytest intends
from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from _jobs import DDP_JOB, DDP_RANKS, OVERLOADED_STAGE, PP_JOB, SLOW_RANK, STRAGGLER_JOB
from _ui import (  # noqa: F401 - fixture
    Server,
    Watched,
    column,
    fmt_ms,
    own_server_browser,
    served_demo,
    sort_by,
    watched_page,
)

RANK_ROWS = '[data-testid="job-ranks"] tbody tr'
STEP_ROWS = '[data-testid="job-step-table"] tbody tr'


@pytest.fixture(scope="module")
def jobs_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    with served_demo(tmp_path_factory, "ui-jobs", (DDP_JOB, PP_JOB, STRAGGLER_JOB), straggler=True) as server:
        yield server


@pytest.fixture
def page(own_server_browser: Any, jobs_server: Server) -> Iterator[Watched]:
    with watched_page(own_server_browser) as watched:
        yield watched


def test_the_run_list_shows_each_job_once_and_a_job_opens_on_its_overview(
    page: Watched, jobs_server: Server
) -> None:
    runs = {r["id"]: r for r in jobs_server.get("runs")["runs"]}
    assert sorted(runs) == sorted([DDP_JOB, PP_JOB, STRAGGLER_JOB])
    p = page.page
    p.goto(jobs_server.url)
    p.wait_for_selector('[data-testid="run-list"] tbody tr')
    assert p.locator('[data-testid="run-list"] tbody tr').count() == 3
    ddp = p.locator(f'tr[data-run="{DDP_JOB}"] td').all_text_contents()
    assert ddp[1] == f"PyTorch job, {DDP_RANKS} ranks" and ddp[2] == str(DDP_RANKS)
    assert ddp[4] == f"DP{DDP_RANKS}"  # examples/train_ddp.py: every rank in one data-parallel group
    assert p.locator(f'tr[data-run="{PP_JOB}"] td').all_text_contents()[4] == "PP2"
    p.locator(f'tr[data-run="{PP_JOB}"] a').click()
    p.wait_for_selector(RANK_ROWS)
    assert "#/job?" in p.url
    assert p.locator("nav.tabs a.active").inner_text() == "Job overview"
    assert not page.errors


def test_the_overloaded_stage_stands_out_and_the_ranks_sort(page: Watched, jobs_server: Server) -> None:
    p = page.page
    p.goto(jobs_server.page_url("job", PP_JOB))
    p.wait_for_selector(RANK_ROWS)
    overview = jobs_server.get("job/overview", run=PP_JOB)
    # the stage given four times the layers shows four times the FLOPs (counted, not timed)
    flops = {
        int(row.get_attribute("data-stage")): float(
            row.locator('td[data-col="flops"]').get_attribute("data-value")
        )
        for row in p.locator('[data-testid="stages-table"] tbody tr').all()
    }
    assert max(flops, key=flops.__getitem__) == OVERLOADED_STAGE
    # the busiest stage marked is the analysis's verdict (the one computing the longest)
    busiest = p.locator('[data-testid="stages-table"] tr:has([data-testid="busiest-stage"])')
    assert busiest.get_attribute("data-stage") == str(overview["pipeline"]["slowest_stage"])
    # sorting by computing puts the rank computing the longest first, then last
    computing = {r["rank"]: r["computing_ns"] for r in overview["ranks"]}
    order = sorted(computing, key=lambda r: (-computing[r], r))
    sort_by(p, "job-ranks", "Computing", "▼")
    assert [int(x) for x in column(p, RANK_ROWS, 0)] == order
    sort_by(p, "job-ranks", "Computing", "▲")
    assert [int(x) for x in column(p, RANK_ROWS, 0)] == list(reversed(order))
    # the stacked bars are drawn, with every rank
    label = p.locator('[data-testid="chart-rank-time"]').get_attribute("aria-label") or ""
    assert all(f"Rank {r}" in label for r in computing)
    assert p.locator('[data-testid="groups-table"] tr[data-mode="pipeline"]').count() == 1
    assert not page.errors


def test_the_ddp_overview_names_the_slowest_rank_and_opens_a_rank(page: Watched, jobs_server: Server) -> None:
    p = page.page
    p.goto(jobs_server.page_url("job", DDP_JOB))
    p.wait_for_selector(RANK_ROWS)
    overview = jobs_server.get("job/overview", run=DDP_JOB)
    assert p.locator(RANK_ROWS).count() == DDP_RANKS
    slowest = overview["step_spread"]["slowest_rank"]
    assert p.inner_text('[data-testid="stat-longest-step"]') == f"Rank {slowest}"
    # sorted by step time, longest first (the default): the slowest rank heads the table
    assert int(column(p, RANK_ROWS, 0)[0]) == slowest
    assert p.locator('[data-testid="groups-table"] tr[data-mode="data"]').count() == 1
    assert p.locator('[data-testid="slow-ranks-table"] tbody tr').count() == DDP_RANKS
    # a CPU job launches no device work: no columns of zeros for the split of free time
    assert all(r["host_wait_ns"] == 0 and r["after_launch_ns"] == 0 for r in overview["ranks"])
    headers = p.locator('[data-testid="job-ranks"] th').all_inner_texts()
    assert any(h.startswith("Free") for h in headers) and not any(
        "host wait" in h or "after launch" in h for h in headers
    )
    p.locator(RANK_ROWS).first.click()
    p.wait_for_selector('[data-testid="stat-steps"]')
    assert f"rank={slowest}" in p.url and "#/overview?" in p.url
    assert not page.errors


def test_the_cluster_step_trace_sorts_filters_by_stage_and_shows_one_step(
    page: Watched, jobs_server: Server
) -> None:
    p = page.page
    p.goto(jobs_server.page_url("job-steps", PP_JOB))
    p.wait_for_selector(STEP_ROWS)
    average = jobs_server.get("job/step-trace", run=PP_JOB)
    assert p.locator(STEP_ROWS).count() == len(average["ranks"])
    headers = p.locator('[data-testid="job-step-table"] th').all_inner_texts()
    assert any(h.startswith("Bubble") for h in headers) and any(h.startswith("Stage") for h in headers)
    # sorting: forward+backward time, then the other way round
    fp_bp = {r["rank"]: r["fp_bp_ns"] for r in average["ranks"]}
    sort_by(p, "job-step-table", "Fwd+bwd", "▼")
    assert [int(x) for x in column(p, STEP_ROWS, 0)] == sorted(fp_bp, key=lambda r: (-fp_bp[r], r))
    sort_by(p, "job-step-table", "Fwd+bwd", "▲")
    assert [int(x) for x in column(p, STEP_ROWS, 0)] == sorted(fp_bp, key=lambda r: (fp_bp[r], r))
    # the stage filter keeps the overloaded stage's ranks only
    p.select_option('[data-testid="job-stage-select"]', str(OVERLOADED_STAGE))
    p.wait_for_url(f"**stage={OVERLOADED_STAGE}**")
    p.wait_for_function(
        "([sel, n]) => document.querySelectorAll(sel).length === n",
        arg=[STEP_ROWS, sum(r["stage"] == OVERLOADED_STAGE for r in average["ranks"])],
    )
    assert set(column(p, STEP_ROWS, 1)) == {str(OVERLOADED_STAGE)}
    # one step: the numbers shown are that step's
    step = average["steps"][-1]
    p.select_option('[data-testid="job-step-select"]', step)
    p.wait_for_url(f"**step={step}**")
    one = jobs_server.get("job/step-trace", run=PP_JOB, step=step, stage=OVERLOADED_STAGE)
    p.wait_for_selector(STEP_ROWS)
    expected = [fmt_ms(r["duration_ns"]) for r in one["ranks"]]
    p.wait_for_function(
        "([sel, want]) => [...document.querySelectorAll(sel)].map(r => r.cells[3].innerText).join() === want",
        arg=[STEP_ROWS, ",".join(expected)],
    )
    # click-through: a rank's row opens that rank's pages
    rank = int(column(p, STEP_ROWS, 0)[0])
    p.locator(STEP_ROWS).first.click()
    p.wait_for_selector('[data-testid="stat-steps"]')
    assert f"rank={rank}" in p.url
    assert p.locator('[data-testid="rank-select"]').input_value() == str(rank)
    assert not page.errors


def test_the_rank_made_slow_is_flagged_where_the_user_looks(page: Watched, jobs_server: Server) -> None:
    p = page.page
    p.goto(jobs_server.page_url("job", STRAGGLER_JOB))
    p.wait_for_selector(RANK_ROWS)
    # the headline names it, the evidence table marks it, and only it
    assert p.inner_text('[data-testid="stat-slow-ranks"]') == f"Rank {SLOW_RANK}"
    flagged = p.locator('[data-testid="slow-ranks-table"] tbody tr.flagged')
    assert flagged.count() == 1 and flagged.get_attribute("data-rank") == str(SLOW_RANK)
    assert flagged.locator(".badge.slow").count() == 1
    # in the per-rank table, sorted by lateness, it comes first and its verdict says slow
    sort_by(p, "job-ranks", "Lateness", "▼")
    first = p.locator(RANK_ROWS).first.locator("td").all_inner_texts()
    assert first[0] == str(SLOW_RANK) and first[-1] == "slow"
    assert not page.errors
