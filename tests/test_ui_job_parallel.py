"""The pipeline chart and the Marey view in a real Chromium, on `make demo`'s real jobs.

What a user reads off the pages is asserted on the rendered DOM against the API the pages are
built from (itself checked against the cluster analysis in tests/test_server_job_parallel.py):
the overloaded stage named as the pacing stage with the longer blocks, a hover that names an op
and its times on each device, a brush that zooms and a double-click that resets, a click on a
device that opens its rank.  Screenshots at 1600x1000 go to ``PERFSIGHT_SHOTS`` when it is set.
"""

# ruff: noqa: F811 - the fixtures imported from _ui are redefined as test parameters, as pytest intends
from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from _jobs import DDP_JOB, PP_JOB, SLOW_RANK, STRAGGLER_JOB
from _marey import intervals, name
from _ui import Server, Watched, own_server_browser, served_demo, watched_page  # noqa: F401 - fixture


@pytest.fixture(scope="module")
def jobs_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    with served_demo(
        tmp_path_factory, "ui-parallel", (DDP_JOB, PP_JOB, STRAGGLER_JOB), straggler=True
    ) as server:
        yield server


@pytest.fixture
def page(own_server_browser: Any, jobs_server: Server) -> Iterator[Watched]:
    with watched_page(own_server_browser) as watched:
        yield watched


def _shot(p: Any, name: str) -> None:
    if folder := os.environ.get("PERFSIGHT_SHOTS"):
        Path(folder).mkdir(parents=True, exist_ok=True)
        p.screenshot(path=str(Path(folder) / f"{name}.png"))


def test_the_pipeline_chart_names_the_pacing_stage_and_draws_every_block_to_one_scale(
    page: Watched, jobs_server: Server
) -> None:
    p = page.page
    p.goto(jobs_server.page_url("job-pipeline", PP_JOB))
    p.wait_for_selector('[data-testid="pp-chart"] .pp-block')
    api = jobs_server.get("job/pipeline", run=PP_JOB)
    # the stage named as pacing the step is the API's: the overloaded one on most steps (the server
    # tests ask that of every step; one step can turn around when CI deschedules a rank)
    pacing = api["pacing_stage"]
    assert pacing in (0, 1)
    assert p.locator('[data-testid="pp-pacing"]').get_attribute("data-stage") == str(pacing)
    assert p.locator('[data-testid="pp-pacing"]').inner_text().startswith(f"Stage {pacing} paces")
    # the stage named as idling most is the API's (which one it is follows the machine's scheduling)
    idlest = max(api["stages"], key=lambda s: s["idle_ns"])["stage"]
    assert p.locator('[data-testid="pp-idlest"]').get_attribute("data-stage") == str(idlest)
    # each block is drawn as long as the API's block (one scale for every stage); which stage's
    # blocks span longer follows the machine's scheduling, the compute inside them the overload
    scale: list[float] = []
    compute: dict[int, int] = {}
    for stage in api["stages"]:
        blocks = p.locator(f'[data-testid="pp-stage-{stage["stage"]}"] .pp-block')
        assert blocks.count() == len(stage["blocks"])
        drawn = sum(float(b.locator("rect").get_attribute("width")) for b in blocks.all())
        scale.append(drawn / sum(b["end_ns"] - b["start_ns"] for b in stage["blocks"]))
        compute[stage["stage"]] = sum(b["compute_ns"] for b in stage["blocks"])
    assert max(scale) == pytest.approx(min(scale), rel=0.02)
    assert compute[pacing] == max(compute.values())
    assert p.locator('[data-testid="pp-chart"] .pp-arrow').count() == len(api["arrows"])
    assert p.locator('[data-testid="pp-table"] tbody tr').count() == len(api["stages"])
    _shot(p, "pipeline")
    assert not page.errors


def test_a_step_picked_on_the_pipeline_chart_travels_in_the_url(page: Watched, jobs_server: Server) -> None:
    p = page.page
    p.goto(jobs_server.page_url("job-pipeline", PP_JOB))
    picker = p.locator('[data-testid="parallel-step"]')
    picker.wait_for()
    steps = jobs_server.get("job/pipeline", run=PP_JOB)["steps"]
    picker.select_option(steps[-1])
    p.wait_for_url(f"**step={steps[-1]}**")
    p.wait_for_selector(f'[data-testid="card-pipeline"] h2:has-text("step {steps[-1]}")')
    p.locator('.tabs a[href*="job-marey"]').first.click()  # the step goes along to the Marey view
    p.wait_for_selector('[data-testid="marey-chart"]')
    assert f"step {steps[-1]}" in p.locator('[data-testid="card-marey"]').inner_text()
    assert not page.errors


LABEL, RIGHT = 206, 10  # job-marey.ts: the label column's width and the right margin (px)


def _marey_api(jobs_server: Server, p: Any, run: str, **params: Any) -> dict[str, Any]:
    """The API's answer for the chart as the page drew it (its width in px, its window)."""
    px = p.locator('[data-testid="marey-box"]').get_attribute("data-px")
    return jobs_server.get("job/marey", run=run, px=px, **params)


def _pixel(p: Any, x: float, y: float) -> list[int]:
    """The canvas's colour at page point (x, y)."""
    return p.evaluate(
        """([x, y]) => { const c = document.querySelector('[data-testid="marey-canvas"]');
            const r = c.getBoundingClientRect(), k = c.width / r.width;
            const g = c.getContext('2d');
            return Array.from(g.getImageData((x - r.left) * k, (y - r.top) * k, 1, 1).data); }""",
        [x, y],
    )


def test_the_marey_view_draws_every_op_merged_or_alone_and_shows_its_times_on_hover(
    page: Watched, jobs_server: Server
) -> None:
    p = page.page
    p.goto(jobs_server.page_url("job-marey", STRAGGLER_JOB))
    p.wait_for_selector('[data-testid="marey-chart"] .mv-device')
    box = p.locator('[data-testid="marey-box"]')
    api = _marey_api(jobs_server, p, STRAGGLER_JOB)
    assert p.locator('[data-testid="marey-chart"] .mv-device').count() == len(api["devices"])
    # the page drew what the API answered at its width: every op of the step, in items
    assert int(box.get_attribute("data-items")) == len(api["ops"])
    assert int(box.get_attribute("data-ops")) == api["matched_ops"]
    assert str(api["matched_ops"]) in p.locator('[data-testid="marey-shown"]').inner_text()
    # hover the longest all-reduce on the slowed rank's row: its name and one line per device
    comm = max(
        (op for op in api["ops"] if op["category"] == "communication" and op["ops"] == 1),
        key=lambda op: op["longest_ns"],
    )
    ran = intervals(api, comm)
    _, start, end, _ = next(v for v in ran if v[0] == SLOW_RANK)
    area = p.locator('[data-testid="marey-chart"]').bounding_box()
    plot = area["width"] - LABEL - RIGHT
    x = area["x"] + LABEL + plot * (start + end) / 2 / api["span_ns"]
    row = p.locator(f'.mv-device[data-rank="{SLOW_RANK}"] rect').first.bounding_box()
    y = row["y"] + row["height"] / 2
    r, g, b, _ = _pixel(p, x, y)
    assert r > 200 and 100 < g < 180 and b < 60, (r, g, b)  # orange: communication
    p.mouse.move(x, y)
    card = p.locator('[data-testid="marey-card"]')
    card.wait_for(state="visible")
    assert box.get_attribute("data-hover-key") == comm["key"]
    assert name(comm) in card.inner_text()
    assert card.locator("[data-rank]").count() == len(ran)
    _shot(p, "marey")
    assert not page.errors


def test_a_brush_asks_the_server_for_the_window_at_a_finer_resolution_and_double_click_resets(
    page: Watched, jobs_server: Server
) -> None:
    p = page.page
    p.goto(jobs_server.page_url("job-marey", DDP_JOB))
    p.wait_for_selector('[data-testid="marey-chart"] .mv-device')
    box = p.locator('[data-testid="marey-box"]')
    full = (int(box.get_attribute("data-view-start")), int(box.get_attribute("data-view-end")))
    full_bin = float(box.get_attribute("data-bin-ns"))
    area = box.bounding_box()
    y = area["y"] + area["height"] / 2
    with p.expect_response(lambda r: "api/job/marey" in r.url and "start_ns=" in r.url) as asked:
        p.mouse.move(area["x"] + area["width"] * 0.4, y)
        p.mouse.down()
        p.mouse.move(area["x"] + area["width"] * 0.6, y, steps=5)
        p.mouse.up()
    zoomed_api = asked.value.json()
    p.wait_for_function(
        "v => document.querySelector('[data-testid=\"marey-box\"]').dataset.viewStart === v",
        arg=str(zoomed_api["window_start_ns"]),
    )
    zoomed = (int(box.get_attribute("data-view-start")), int(box.get_attribute("data-view-end")))
    assert full[0] < zoomed[0] < zoomed[1] < full[1]
    assert zoomed[1] - zoomed[0] < (full[1] - full[0]) / 3
    # the server drew the window at the same width: a pixel is fewer ns, and every op is there
    assert float(box.get_attribute("data-bin-ns")) < full_bin / 3
    assert int(box.get_attribute("data-ops")) == zoomed_api["window_ops"] > 0
    with p.expect_response(lambda r: "api/job/marey" in r.url and "start_ns=" not in r.url):
        box.dblclick(position={"x": area["width"] * 0.5, "y": 5})
    p.wait_for_function(
        "v => document.querySelector('[data-testid=\"marey-box\"]').dataset.viewEnd === v", arg=str(full[1])
    )
    assert (int(box.get_attribute("data-view-start")), int(box.get_attribute("data-view-end"))) == full
    assert not page.errors


def test_the_flops_and_memory_lines_are_drawn_for_each_device_and_can_be_hidden(
    page: Watched, jobs_server: Server
) -> None:
    p = page.page
    p.goto(jobs_server.page_url("job-marey", STRAGGLER_JOB))
    p.wait_for_selector('[data-testid="marey-chart"] .mv-device')
    api = _marey_api(jobs_server, p, STRAGGLER_JOB)
    assert [d["rank"] for d in api["devices"]] == [0, 1]
    assert all(d["flops_line"]["bins"] for d in api["devices"])

    def purple_under(rank: int) -> int:
        """Purple pixels in the gap under a device's row, where its lines are drawn."""
        row = p.locator(f'.mv-device[data-rank="{rank}"] rect').first.bounding_box()
        area = p.locator('[data-testid="marey-chart"]').bounding_box()
        return p.evaluate(
            """([x, y, w, h]) => { const c = document.querySelector('[data-testid="marey-canvas"]');
                const r = c.getBoundingClientRect(), k = c.width / r.width;
                const g = c.getContext('2d');
                const d = g.getImageData((x - r.left) * k, (y - r.top) * k, w * k, h * k).data;
                let n = 0; for (let i = 0; i < d.length; i += 4)
                  if (d[i] > 90 && d[i] < 150 && d[i + 1] < 110 && d[i + 2] > 180) n++;
                return n; }""",
            [area["x"] + LABEL, row["y"] + row["height"], area["width"] - LABEL - RIGHT, 30],
        )

    assert all(purple_under(rank) > 0 for rank in (0, 1))
    p.locator('[data-testid="marey-lines"]').uncheck()
    assert all(purple_under(rank) == 0 for rank in (0, 1))
    assert not page.errors


def test_a_click_on_a_device_opens_its_rank(page: Watched, jobs_server: Server) -> None:
    p = page.page
    p.goto(jobs_server.page_url("job-marey", STRAGGLER_JOB))
    p.wait_for_selector('[data-testid="marey-chart"] .mv-device')
    p.locator(f'.mv-device[data-rank="{SLOW_RANK}"] text').click()
    p.wait_for_url(f"**#/timeline?**rank={SLOW_RANK}**")
    assert not page.errors


def test_the_strategy_tree_lists_every_rank_and_opens_one(page: Watched, jobs_server: Server) -> None:
    p = page.page
    p.goto(jobs_server.page_url("job-strategy", PP_JOB))
    p.wait_for_selector('[data-testid="strategy-tree"] .ps-rank')
    api = jobs_server.get("job/strategy", run=PP_JOB)
    assert p.locator(".ps-stage").count() == len(api["stages"])
    assert p.locator(".ps-rank").count() == sum(
        len(rep["ranks"]) for s in api["stages"] for rep in s["replicas"]
    )
    assert "pipeline" in p.locator('[data-testid="strategy-modes"]').inner_text()
    _shot(p, "strategy")
    p.locator('.ps-rank[data-rank="1"] a').click()
    p.wait_for_url("**#/overview?**rank=1**")
    assert not page.errors


def test_a_stage_folds_into_one_row_and_unfolds(page: Watched, jobs_server: Server) -> None:
    p = page.page
    p.goto(jobs_server.page_url("job-marey", STRAGGLER_JOB))
    p.wait_for_selector('[data-testid="marey-chart"] .mv-device')
    api = jobs_server.get("job/marey", run=STRAGGLER_JOB)
    with p.expect_response(lambda r: "api/job/marey" in r.url and "unfold=none" in r.url):
        p.locator('.mv-stage[data-stage="0"]').click()
    p.wait_for_selector('.mv-stage-row[data-stage="0"]', state="attached")
    assert p.locator(".mv-device").count() == 0
    assert f"{len(api['devices'])} devices" in p.locator('.mv-stage[data-stage="0"]').text_content()
    box = p.locator('[data-testid="marey-box"]')
    assert int(box.get_attribute("data-ops")) == api["matched_ops"]  # folded, nothing is dropped
    p.locator('.mv-stage[data-stage="0"]').click()
    p.wait_for_selector(".mv-device")
    assert p.locator(".mv-device").count() == len(api["devices"])
    assert not page.errors
