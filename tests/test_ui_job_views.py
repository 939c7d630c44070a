"""The time overview and the memory and FLOPs heatmaps in a real Chromium, on `make demo`'s real jobs.

What a user must see is asserted on the rendered page: the pipeline job's overloaded stage
(examples/train_pp.py --overload-stage 1) as the darkest FLOPs cell, a cell that opens its rank,
and a step chosen in the time overview that the cluster step trace then shows.  Expected values
come from the API the pages are built from (itself checked against the CSVs in
tests/test_server_job_views.py) or from how the job was run, never from strings we wrote.
"""

# ruff: noqa: F811 - the fixtures imported from _ui are redefined as test parameters, as pytest intends
from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from _jobs import DDP_JOB, OVERLOADED_STAGE, PP_JOB
from _ui import Server, Watched, fmt_ms, own_server_browser, served_demo, watched_page  # noqa: F401 - fixture


@pytest.fixture(scope="module")
def jobs_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    with served_demo(tmp_path_factory, "ui-views", (DDP_JOB, PP_JOB)) as server:
        yield server


@pytest.fixture
def page(own_server_browser: Any, jobs_server: Server) -> Iterator[Watched]:
    with watched_page(own_server_browser) as watched:
        yield watched


def _cells(p: Any, metric: str) -> dict[int, float]:
    cells = p.locator(f'[data-testid="heatmap-{metric}"] .hm-cell').all()
    return {int(c.get_attribute("data-rank")): float(c.get_attribute("data-share")) for c in cells}


def test_the_overloaded_stage_is_the_darkest_cell_of_the_flops_heatmap(
    page: Watched, jobs_server: Server
) -> None:
    p = page.page
    p.goto(jobs_server.page_url("job-heatmaps", PP_JOB))
    p.wait_for_selector('[data-testid="heatmap-flops"] .hm-cell')
    api = jobs_server.get("job/heatmaps", run=PP_JOB)
    stage_of = {c["rank"]: c["stage"] for c in api["cells"]}
    flops = _cells(p, "flops")
    assert flops == pytest.approx({c["rank"]: c["flops_normalised"] for c in api["cells"]})
    heaviest = max(flops, key=flops.get)
    assert stage_of[heaviest] == OVERLOADED_STAGE  # the stage given four times the layers
    assert min(flops.values()) < 0.5  # and the other stage visibly lighter
    # the cell says which rank and stage it is and its share, as a user reads it
    cell = p.locator(f'[data-testid="heatmap-flops"] .hm-cell[data-rank="{heaviest}"]')
    assert cell.inner_text().split() == [str(heaviest), "·", f"S{OVERLOADED_STAGE}", "100%"]
    summary = p.locator('[data-testid="heatmap-flops-summary"]').inner_text()
    assert summary.startswith(f"Heaviest: rank {heaviest} of stage {OVERLOADED_STAGE}")
    # the memory heatmap: no device capacity on a CPU job, so a share of the largest peak, said so
    memory = _cells(p, "memory")
    assert memory == pytest.approx({c["rank"]: c["peak_of_max"] for c in api["cells"]})
    assert "largest peak" in p.locator('[data-testid="card-heatmap-memory"] .hm-legend').inner_text()
    # the hover card names the rank, its host and its FLOPs
    cell.hover()
    card = p.locator('[data-testid="heatmap-flops"] .hm-card')
    card.wait_for(state="visible")
    assert card.inner_text().startswith(f"Rank {heaviest}")
    host = next(c["host"] for c in api["cells"] if c["rank"] == heaviest)
    assert f"Host: {host}" in card.inner_text()
    assert not page.errors


def test_a_heatmap_cell_opens_its_rank(page: Watched, jobs_server: Server) -> None:
    p = page.page
    p.goto(jobs_server.page_url("job-heatmaps", PP_JOB))
    p.wait_for_selector('[data-testid="heatmap-memory"] .hm-cell')
    p.locator('[data-testid="heatmap-memory"] .hm-cell[data-rank="1"]').click()
    p.wait_for_url("**/#/memory?*")
    p.wait_for_selector('[data-testid="rank-select"]:not([hidden])')
    assert p.locator('[data-testid="rank-select"]').input_value() == "1"
    assert p.locator("nav.tabs a.active").inner_text() == "Memory"
    p.go_back()
    p.wait_for_selector('[data-testid="heatmap-flops"] .hm-cell')
    p.locator('[data-testid="heatmap-flops"] .hm-cell[data-rank="0"]').click()
    p.wait_for_url("**/#/operators?*")
    p.wait_for_selector('[data-testid="rank-select"]:not([hidden])')
    assert p.locator('[data-testid="rank-select"]').input_value() == "0"
    assert not page.errors


def test_a_step_chosen_in_the_time_overview_is_the_step_the_cluster_step_trace_shows(
    page: Watched, jobs_server: Server
) -> None:
    p = page.page
    api = jobs_server.get("job/time-overview", run=DDP_JOB)
    steps = [s["step"] for s in api["steps"]]
    assert len(steps) >= 2
    p.goto(jobs_server.page_url("job-time", DDP_JOB))
    p.wait_for_selector('[data-testid="job-time-table"] tbody tr')
    p.wait_for_selector('[data-testid="chart-job-time"] canvas')
    # the table is the chart's data: per step the slowest rank and its time
    rows = p.locator('[data-testid="job-time-table"] tbody tr').all()
    assert [r.get_attribute("data-step") for r in rows] == steps
    for row, want in zip(rows, api["steps"], strict=True):
        cells = row.locator("td").all_inner_texts()
        assert cells[4] == fmt_ms(want["max_ns"]) and cells[5] == f"Rank {want['slowest_rank']}"
    # choosing the last step (a row click) selects it, and the job's other pages open on it
    chosen = steps[-1]
    p.locator(f'[data-testid="job-time-table"] tr[data-step="{chosen}"]').click()
    p.wait_for_selector(f'[data-testid="job-time-table"] tr.selected[data-step="{chosen}"]')
    assert p.locator('[data-testid="job-time-step"]').input_value() == chosen
    p.locator('nav.tabs a[data-page="job-steps"]').click()
    p.wait_for_selector('[data-testid="job-step-table"] tbody tr')
    assert p.locator('[data-testid="job-step-select"]').input_value() == chosen
    shown = jobs_server.get("job/step-trace", run=DDP_JOB, step=chosen)
    durations = [
        row.locator("td").nth(2).inner_text()
        for row in p.locator('[data-testid="job-step-table"] tbody tr').all()
    ]
    assert durations == [fmt_ms(r["duration_ns"]) for r in sorted(shown["ranks"], key=lambda r: r["rank"])]
    # and the chart's own pick: a click in another step's column selects that step
    p.go_back()
    # the page drawn again, on the step chosen before (a click on a page still being drawn, or
    # scrolled back under the pointer, would land elsewhere: seen once in CI)
    p.wait_for_selector(f'[data-testid="job-time-table"] tr.selected[data-step="{chosen}"]')
    chart = p.locator('[data-testid="chart-job-time"]')
    chart.locator("canvas").first.wait_for()
    box = chart.bounding_box()
    grid_left, grid_right = 70, box["width"] - 80  # the chart's grid margins
    first_x = grid_left + (grid_right - grid_left) / len(steps) / 2
    chart.click(position={"x": first_x, "y": box["height"] / 2})  # scrolled into view, once still
    p.wait_for_selector(f'[data-testid="job-time-table"] tr.selected[data-step="{steps[0]}"]')
    assert f"step={steps[0]}" in p.url
    assert not page.errors
