"""The job's Communication and Communication matrix pages in a real Chromium, against
`perfsight serve` on the real jobs of `make demo` (tests/_jobs.py: a gloo DDP job and a 2-stage
pipeline job).  What a user sees is asserted on the rendered page; expected values come from the
JSON API the page is built from (itself checked against the analysis's files in
tests/test_server_job_comm.py).
"""

# ruff: noqa: F811 - the fixtures imported from _ui are redefined as test parameters, as pytest intends
from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from _jobs import DDP_JOB, PP_JOB
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

RANK_ROWS = '[data-testid="comm-ranks"] tbody tr'
LINK_ROWS = '[data-testid="comm-links"] tbody tr'
OP_ROWS = '[data-testid="comm-ops"] tbody tr'
DIALOG_ROWS = '[data-testid="rank-links"] tbody tr'


@pytest.fixture(scope="module")
def jobs_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    with served_demo(tmp_path_factory, "ui-comm", (DDP_JOB, PP_JOB)) as server:
        yield server


@pytest.fixture
def page(own_server_browser: Any, jobs_server: Server) -> Iterator[Watched]:
    with watched_page(own_server_browser) as watched:
        yield watched


def _wait_rows(page: Any, rows: str, n: int) -> None:
    page.wait_for_function("([sel, n]) => document.querySelectorAll(sel).length === n", arg=[rows, n])


@pytest.mark.parametrize("run", [DDP_JOB, PP_JOB])
def test_each_ranks_communication_and_wait_time_show_and_sort(
    page: Watched, jobs_server: Server, run: str
) -> None:
    p = page.page
    p.goto(jobs_server.page_url("job-comm", run))
    p.wait_for_selector(RANK_ROWS)
    api = jobs_server.get("job/communication", run=run)["rows"]
    assert p.locator(RANK_ROWS).count() == len(api) > 1
    assert p.locator("nav.tabs a.active").inner_text() == "Communication"
    # the bars carry every rank (ECharts describes its data in aria-label)
    label = p.locator('[data-testid="chart-comm-ranks"]').get_attribute("aria-label") or ""
    assert all(f"Rank {r['rank']}" in label for r in api)
    # by default the longest communication time first; each row shows the API's numbers
    elapse = {r["rank"]: r for r in api}
    order = sorted(elapse, key=lambda r: (-elapse[r]["elapse_ns"], r))
    assert [int(x) for x in column(p, RANK_ROWS, 0)] == order
    assert column(p, RANK_ROWS, 5) == [fmt_ms(elapse[r]["wait_ns"]) for r in order]
    # sorting by wait time, one way then the other
    waits = sorted(elapse, key=lambda r: (-elapse[r]["wait_ns"], r))
    sort_by(p, "comm-ranks", "Wait", "▼")
    assert [int(x) for x in column(p, RANK_ROWS, 0)] == waits
    sort_by(p, "comm-ranks", "Wait", "▲")
    assert [int(x) for x in column(p, RANK_ROWS, 0)] == sorted(
        elapse, key=lambda r: (elapse[r]["wait_ns"], r)
    )
    # choosing a step shows that step's times
    step = jobs_server.get("job/communication", run=run)["choices"]["steps"][-1]
    p.select_option('[data-testid="comm-step-select"]', step)
    p.wait_for_url(f"**step={step}**")
    one = {r["rank"]: r for r in jobs_server.get("job/communication", run=run, step=step)["rows"]}
    want = ",".join(fmt_ms(one[r]["elapse_ns"]) for r in sorted(one, key=lambda r: (-one[r]["elapse_ns"], r)))
    shown = "[...document.querySelectorAll(sel)].map((r) => r.children[3].textContent).join()"
    p.wait_for_function(f"([sel, want]) => {shown} === want", arg=[RANK_ROWS, want])
    assert not page.errors


def test_clicking_a_rank_opens_its_links_and_the_dialog_reaches_the_rank(
    page: Watched, jobs_server: Server
) -> None:
    p = page.page
    p.goto(jobs_server.page_url("job-comm", DDP_JOB))
    p.wait_for_selector(RANK_ROWS)
    rank = int(column(p, RANK_ROWS, 0)[0])
    p.locator(RANK_ROWS).first.click()
    dialog = p.locator('[data-testid="rank-links-dialog"]')
    dialog.wait_for(state="visible")
    assert dialog.get_attribute("data-rank") == str(rank)
    links = jobs_server.get("job/communication/links", run=DDP_JOB, rank=rank, limit=1000)
    _wait_rows(p, DIALOG_ROWS, len(links["rows"]))
    assert links["total"] > 0
    # each link is the rank's: its peer is another rank, the direction says which way
    peers = [int(x) for x in column(p, DIALOG_ROWS, 1)]
    directions = column(p, DIALOG_ROWS, 0)
    want = sorted((("→", r["dst"]) if r["src"] == rank else ("←", r["src"])) for r in links["rows"])
    assert sorted(zip(directions, peers, strict=True)) == want and rank not in peers
    # sorted by bandwidth, slowest first by default; sorting by time reorders on the server
    sort_by(p, "rank-links", "Time", "▼")
    times = sorted((r["transit_ns"] for r in links["rows"]), reverse=True)
    assert column(p, DIALOG_ROWS, 6) == [fmt_ms(t) for t in times]
    p.locator('[data-testid="dialog-close"]').click()
    dialog.wait_for(state="detached")
    # the dialog's link opens the rank's own pages
    p.locator(RANK_ROWS).first.click()
    p.locator('[data-testid="dialog-open-rank"]').click()
    p.wait_for_selector('[data-testid="stat-steps"]')
    assert f"rank={rank}" in p.url and "#/overview?" in p.url
    assert not page.errors


def test_all_links_filter_by_source_and_type_and_sort(page: Watched, jobs_server: Server) -> None:
    p = page.page
    p.goto(jobs_server.page_url("job-comm", PP_JOB, tab="links"))
    p.wait_for_selector(LINK_ROWS)
    everything = jobs_server.get("job/communication/links", run=PP_JOB, limit=1000)["rows"]
    assert p.locator(LINK_ROWS).count() == len(everything) > 1
    src = everything[0]["src"]
    p.fill('[data-testid="links-src"]', str(src))
    p.dispatch_event('[data-testid="links-src"]', "change")
    _wait_rows(p, LINK_ROWS, sum(r["src"] == src for r in everything))
    assert set(column(p, LINK_ROWS, 3)) == {str(src)}
    # a link type no link has: the table says so
    p.fill('[data-testid="links-src"]', "")
    p.dispatch_event('[data-testid="links-src"]', "change")
    _wait_rows(p, LINK_ROWS, len(everything))
    types = {r["link_type"] for r in everything}
    p.select_option('[data-testid="links-type"]', sorted(types)[0])
    _wait_rows(p, LINK_ROWS, sum(r["link_type"] == sorted(types)[0] for r in everything))
    sort_by(p, "comm-links", "Time", "▼")
    kept = [r["transit_ns"] for r in everything if r["link_type"] == sorted(types)[0]]
    assert column(p, LINK_ROWS, 6) == [fmt_ms(t) for t in sorted(kept, reverse=True)]
    assert not page.errors


def test_the_ops_table_searches_and_sorts(page: Watched, jobs_server: Server) -> None:
    p = page.page
    p.goto(jobs_server.page_url("job-comm", PP_JOB, tab="ops"))
    p.wait_for_selector(OP_ROWS)
    total = jobs_server.get("job/communication/ops", run=PP_JOB)["total"]
    assert p.locator('[data-testid="comm-ops"]').get_attribute("data-total") == str(total)
    sends = jobs_server.get("job/communication/ops", run=PP_JOB, q="send", limit=1000)
    assert 0 < sends["total"] < total
    p.fill('[data-testid="comm-ops"] input[type="search"]', "send")
    p.wait_for_selector(f'[data-testid="comm-ops"][data-total="{sends["total"]}"]:not([aria-busy])')
    assert all("send" in op for op in column(p, OP_ROWS, 1))
    sort_by(p, "comm-ops", "Wait", "▼")
    waits = sorted((r["wait_ns"] for r in sends["rows"]), reverse=True)[: p.locator(OP_ROWS).count()]
    assert column(p, OP_ROWS, 8) == [fmt_ms(w) for w in waits]
    assert not page.errors


def _cell_point(canvas: Any, row: int, col: int) -> tuple[float, float]:
    """Page coordinates of the centre of block (row, col) of the matrix canvas."""
    box = canvas.bounding_box()
    left, top, cell = (float(canvas.get_attribute(f"data-{k}")) for k in ("left", "top", "cell"))
    return box["x"] + left + (col + 0.5) * cell, box["y"] + top + (row + 0.5) * cell


@pytest.mark.parametrize("run", [DDP_JOB, PP_JOB])
def test_the_matrix_shows_each_link_on_hover_and_a_click_opens_the_source_rank(
    page: Watched, jobs_server: Server, run: str
) -> None:
    p = page.page
    p.goto(jobs_server.page_url("job-matrix", run))
    canvas = p.locator('[data-testid="matrix-canvas"][data-block]')
    canvas.wait_for()
    matrix = jobs_server.get("job/communication/matrix", run=run, cells=256)
    assert canvas.get_attribute("data-block") == "1" == str(matrix["block"])  # a few ranks: one a cell
    cells = matrix["cells"]
    assert cells["value"], "the demo job has links"
    # the slowest link (lowest bandwidth), as the API gives it
    i = min(range(len(cells["value"])), key=cells["value"].__getitem__)
    src, dst = cells["src_block"][i], cells["dst_block"][i]
    p.mouse.move(*_cell_point(canvas, src, dst))
    hover = p.locator('[data-testid="matrix-hover"]')
    p.wait_for_selector(f'[data-testid="matrix-hover"][data-src="{src}"][data-dst="{dst}"]')
    assert p.locator('[data-testid="matrix-tip"]').is_visible()
    assert f"{src} → {dst}" in p.locator('[data-testid="matrix-tip"]').inner_text()
    text = hover.inner_text()
    assert "Links" in text and cells["link_types"][i] in text
    # another metric: the page asks the server again
    p.locator('[data-testid="matrix-metric"] button[data-value="size"]').click()
    canvas = p.locator('[data-testid="matrix-canvas"][data-metric="size"][data-block]')
    canvas.wait_for()
    # clicking a cell opens the source rank's pages
    p.mouse.click(*_cell_point(canvas, src, dst))
    p.wait_for_selector('[data-testid="stat-steps"]')
    assert f"rank={src}" in p.url and "#/overview?" in p.url
    assert not page.errors


def test_the_matrix_filters_by_op_family(page: Watched, jobs_server: Server) -> None:
    p = page.page
    # by size: every link counts (a link without transit time has no bandwidth to show)
    p.goto(jobs_server.page_url("job-matrix", PP_JOB, metric="size"))
    p.locator('[data-testid="matrix-canvas"][data-block]').wait_for()
    families = jobs_server.get("job/communication/matrix", run=PP_JOB)["choices"]["ops"]
    name = families[0]["name"]
    p.select_option('[data-testid="matrix-op"]', name)
    canvas = p.locator(f'[data-testid="matrix-canvas"][data-op="{name}"][data-block]')
    canvas.wait_for()
    one = jobs_server.get("job/communication/matrix", run=PP_JOB, op=name, metric="size")
    assert canvas.get_attribute("data-links") == str(sum(one["cells"]["links"])) == str(families[0]["links"])
    assert not page.errors


def test_a_step_carried_from_another_job_page_that_has_no_communication_shows_all_steps(
    page: Watched, jobs_server: Server
) -> None:
    """The cluster step trace's "average" (or a step without communication) travels in the URL
    when the user switches tab: the pages show every step instead of an error."""
    p = page.page
    p.goto(jobs_server.page_url("job-comm", DDP_JOB, step="average"))
    p.wait_for_selector(RANK_ROWS)
    assert p.locator('[data-testid="comm-step-select"]').input_value() == "all"
    p.goto(jobs_server.page_url("job-matrix", DDP_JOB, step="999"))
    p.locator('[data-testid="matrix-canvas"][data-block]').wait_for()
    assert p.locator('[data-testid="comm-step-select"]').input_value() == "all"
    assert not p.locator('[role="alert"]').count()
    assert not page.errors
