"""The in-app timeline in a real Chromium: level-of-detail windows, zoom, pan, search, details, and
a trace whose names are HTML/script that must show as text and run nothing.

The visible window is read from the canvas's data-start-ns / data-end-ns attributes (the same
numbers the "Visible" line shows); expectations come from the server's JSON API.
"""

# ruff: noqa: F811 - the fixtures imported from _ui are redefined as test parameters, as pytest intends
from __future__ import annotations

import math
import urllib.parse
from pathlib import Path
from typing import Any

import pytest

from _hostile import HOSTILE_NAMES
from _ui import (
    GUTTER_W,
    HOSTILE_RUN,
    KINETO_RUN,
    ROW_H,
    RULER_H,
    Server,
    Watched,
    own_server_browser,  # noqa: F401 - fixture
    ui_browser,  # noqa: F401 - fixture
    ui_page,  # noqa: F401 - fixture
    ui_server,  # noqa: F401 - fixture
    watched_page,
)

CANVAS = '[data-testid="timeline-canvas"]'


def open_timeline(watched: Watched, server: Server, run: str) -> Any:
    server.wait_ready(run)
    page = watched.page
    page.goto(server.page_url("timeline", run))
    page.wait_for_selector(f'{CANVAS}[data-loaded="true"]')
    return page


def visible(page: Any) -> tuple[int, int]:
    attrs = page.eval_on_selector(CANVAS, "c => [c.dataset.startNs, c.dataset.endNs]")
    return int(attrs[0]), int(attrs[1])


def plot_width(page: Any) -> float:
    return page.eval_on_selector(CANVAS, "c => c.clientWidth") - GUTTER_W


def wait_view_change(page: Any, before: tuple[int, int]) -> tuple[int, int]:
    page.wait_for_function(
        "([sel, s, e]) => { const c = document.querySelector(sel);"
        " return c.dataset.startNs !== s || c.dataset.endNs !== e; }",
        arg=[CANVAS, str(before[0]), str(before[1])],
    )
    return visible(page)


def window_requests(page: Any) -> list[dict[str, float]]:
    """Every /timeline/window request the page has made (query parameters as numbers)."""
    found = []
    for url in page.evaluate("performance.getEntriesByType('resource').map(e => e.name)"):
        parsed = urllib.parse.urlparse(url)
        if parsed.path.endswith("/api/run/timeline/window"):
            q = urllib.parse.parse_qs(parsed.query)
            found.append({k: float(q[k][0]) for k in ("start_ns", "end_ns", "width_px")})
    return found


def test_timeline_zooms_and_pans_with_keys_wheel_and_drag_fetching_windows_at_screen_width(
    ui_page: Watched, ui_server: Server
) -> None:
    page = open_timeline(ui_page, ui_server, KINETO_RUN)
    span = ui_server.get("run/timeline/tracks", run=KINETO_RUN)["steps_span"]
    assert visible(page) == (span["start_ns"], span["end_ns"])  # it opens on the profiled steps
    assert int(page.eval_on_selector(CANVAS, "c => c.dataset.events")) > 0
    width = plot_width(page)

    page.focus(CANVAS)
    start0, end0 = visible(page)
    page.keyboard.press("w")  # zoom in around the centre
    start1, end1 = wait_view_change(page, (start0, end0))
    assert (end1 - start1) == pytest.approx(0.8 * (end0 - start0), abs=2)
    assert (start1 + end1) / 2 == pytest.approx((start0 + end0) / 2, abs=2)
    page.keyboard.press("w")  # again, leaving room to pan both ways
    start1, end1 = wait_view_change(page, (start1, end1))
    assert (end1 - start1) == pytest.approx(0.64 * (end0 - start0), abs=4)

    page.keyboard.press("d")  # pan right by 15% of the screen
    start2, end2 = wait_view_change(page, (start1, end1))
    assert start2 - start1 == pytest.approx(0.15 * (end1 - start1), abs=2)
    assert end2 - start2 == pytest.approx(end1 - start1, abs=2)

    page.keyboard.press("a")
    start3, end3 = wait_view_change(page, (start2, end2))
    assert (start3, end3) == pytest.approx((start1, end1), abs=2)

    page.keyboard.press("s")  # zoom back out
    start4, end4 = wait_view_change(page, (start3, end3))
    assert end4 - start4 == pytest.approx(0.8 * (end0 - start0), abs=4)

    # wheel up zooms in and keeps the time under the mouse where it is
    box = page.locator(CANVAS).bounding_box()
    x = GUTTER_W + width * 0.3
    anchor = start4 + (x - GUTTER_W) / width * (end4 - start4)
    page.mouse.move(box["x"] + x, box["y"] + 200)
    page.mouse.wheel(0, -400)
    start5, end5 = wait_view_change(page, (start4, end4))
    assert end5 - start5 < 0.7 * (end4 - start4)
    assert start5 + (x - GUTTER_W) / width * (end5 - start5) == pytest.approx(anchor, rel=1e-3)

    # dragging 200 px to the left moves the view 200 px' worth of time later
    page.mouse.down()
    page.mouse.move(box["x"] + x - 100, box["y"] + 200, steps=5)
    page.mouse.move(box["x"] + x - 200, box["y"] + 200, steps=5)
    page.mouse.up()
    start6, end6 = wait_view_change(page, (start5, end5))
    assert start6 - start5 == pytest.approx(200 / width * (end5 - start5), rel=0.02)

    # the data on screen comes from a window request at the canvas's resolution covering the view
    page.wait_for_selector(f'{CANVAS}[data-loaded="true"]')
    last = window_requests(page)[-1]
    assert last["start_ns"] <= start6 and last["end_ns"] >= end6
    ns_per_px = (last["end_ns"] - last["start_ns"]) / last["width_px"]
    assert ns_per_px == pytest.approx((end6 - start6) / width, rel=0.05)
    assert not ui_page.errors


def test_timeline_search_covers_the_whole_trace_and_jumps_to_a_result(
    ui_page: Watched, ui_server: Server
) -> None:
    page = open_timeline(ui_page, ui_server, KINETO_RUN)
    query = "ncclKernel_AllReduce"
    found = ui_server.get("run/timeline/search", run=KINETO_RUN, q=query, limit=100)
    assert found["total"] > 0
    page.fill('[data-testid="timeline-search"]', query)
    page.press('[data-testid="timeline-search"]', "Enter")
    page.wait_for_selector(f'[data-testid="search-info"]:text-is("{found["total"]:,} results")')
    items = page.locator('[data-testid="search-results"] li')
    assert items.count() == len(found["hits"])
    assert all(query in text for text in items.all_text_contents())

    # the view jumps to the first hit and shows its details
    hit = found["hits"][0]
    page.wait_for_selector('[data-testid="event-details"] dd')
    start, end = visible(page)
    assert start <= hit["start_ns"] and hit["start_ns"] + hit["dur_ns"] <= end
    assert page.locator('[data-testid="event-details"] dd').first.text_content() == hit["name"]

    # a later result, from anywhere in the trace, is one click away
    last = found["hits"][-1]
    before = visible(page)
    items.nth(len(found["hits"]) - 1).click()
    start, end = wait_view_change(page, before)
    assert start <= last["start_ns"] <= end


def test_a_kernel_launch_shows_its_flow_to_the_kernel_and_the_trace_downloads(
    ui_page: Watched, ui_server: Server
) -> None:
    page = open_timeline(ui_page, ui_server, KINETO_RUN)
    launch = ui_server.get("run/timeline/search", run=KINETO_RUN, q="cudaLaunchKernel", limit=1)["hits"][0]
    event = ui_server.get("run/timeline/event", run=KINETO_RUN, rank=launch["rank"], id=launch["id"])
    out = [f for f in event["flows"] if f["direction"] == "out"]
    assert out, "a kernel launch has a flow to its kernel"
    page.fill('[data-testid="timeline-search"]', "cudaLaunchKernel")
    page.press('[data-testid="timeline-search"]', "Enter")
    flow_item = page.locator('[data-testid="event-details"] li').first
    flow_item.wait_for()
    assert flow_item.text_content() == f"→ {out[0]['kind']}: {out[0]['name']}"
    flow_item.click()  # follows the arrow to the kernel
    page.wait_for_function(
        "([name]) => document.querySelector('[data-testid=\"event-details\"] dd')?.textContent === name",
        arg=[out[0]["name"]],
    )

    href = page.get_attribute('[data-testid="download-trace"]', "href")
    response = page.request.get(urllib.parse.urljoin(ui_server.url, href))
    assert response.status == 200
    assert "traceEvents" in response.json()


def test_hostile_names_are_shown_as_text_and_run_no_script(ui_page: Watched, ui_server: Server) -> None:
    # a name that ran as script would call alert(): record it instead of showing a dialog
    ui_page.page.add_init_script("window.alert = (...args) => { window.__pwned = args; };")
    page = open_timeline(ui_page, ui_server, HOSTILE_RUN)
    tracks = ui_server.get("run/timeline/tracks", run=HOSTILE_RUN)
    width = plot_width(page)
    start, end = visible(page)
    window = ui_server.get(
        "run/timeline/window", run=HOSTILE_RUN, start_ns=start, end_ns=end, width_px=int(width)
    )
    host = tracks["tracks"][0]
    lane = next(
        lane
        for tw in window["tracks"]
        if (tw["rank"], tw["track"]) == (host["rank"], host["track"])
        for lane in tw["lanes"]
        if lane["depth"] == 1
    )
    box = page.locator(CANVAS).bounding_box()
    shown = []
    for i in range(len(lane["start_ns"])):
        middle = lane["start_ns"][i] + lane["dur_ns"][i] / 2
        x = GUTTER_W + (middle - start) / (end - start) * width
        y = RULER_H + lane["depth"] * ROW_H + ROW_H / 2  # the first track starts at the top
        page.mouse.click(box["x"] + x, box["y"] + y)
        name = window["names"][lane["name"][i]]
        page.wait_for_function(
            "([name]) => document.querySelector('[data-testid=\"event-details\"] dd')?.textContent === name",
            arg=[name],
        )
        shown.append(name)
    assert set(HOSTILE_NAMES) <= set(shown)

    page.fill('[data-testid="timeline-search"]', "script")
    page.press('[data-testid="timeline-search"]', "Enter")
    page.wait_for_selector('[data-testid="search-results"] li')
    texts = page.locator('[data-testid="search-results"] li').all_text_contents()
    assert any(t.endswith('<script>alert("x")</script>') for t in texts)
    assert any(t.endswith("</script><img src=x onerror=alert(1)>") for t in texts)

    # the operator table and overview render the same names as text
    page.goto(ui_server.page_url("operators", HOSTILE_RUN))
    page.wait_for_selector('[data-testid="operator-type-table"] tbody td')
    names = page.locator('[data-testid="operator-type-table"] tbody tr td:first-child').all_text_contents()
    assert set(HOSTILE_NAMES) <= set(names)
    # ECharts builds tooltips as HTML: hovering each slice of the operator-type ring (one per
    # hostile name, equal shares) must show that name as the tooltip's text
    page.goto(ui_server.page_url("overview", HOSTILE_RUN))
    chart = page.locator('[data-testid="chart-operator-types"]')
    chart.locator("canvas").first.wait_for()
    types = ui_server.get("run/overview", run=HOSTILE_RUN)["operator_types"]
    area = chart.bounding_box()
    cx, cy = area["x"] + area["width"] / 2, area["y"] + area["height"] * 0.52
    radius = min(area["width"], area["height"]) / 2 * (0.35 + 0.68) / 2  # the ring's middle
    titles = set()
    start = 0.0
    for op in types:
        middle = math.radians(90 - 360 * (start + op["share"] / 2))  # clockwise from 12 o'clock
        start += op["share"]
        page.mouse.move(cx + radius * math.cos(middle), cy - radius * math.sin(middle))
        page.wait_for_function(
            # (HTML parsing turns CR LF into LF: the one change text inside markup undergoes)
            "([sel, name]) => [...document.querySelectorAll(sel + ' b')]"
            ".some(b => b.textContent === name.replace(/\\r\\n?/g, '\\n'))",
            arg=['[data-testid="chart-operator-types"]', op["name"]],
            timeout=15_000,
        )
        titles.add(op["name"])
    assert set(HOSTILE_NAMES) <= titles

    assert ui_page.dialogs == []
    assert ui_page.errors == []
    assert page.evaluate("document.querySelectorAll('img').length") == 0
    assert page.evaluate("document.querySelectorAll('script').length") == 1  # the UI's own bundle
    assert page.evaluate("typeof window.__pwned") == "undefined"


def test_a_convolutions_details_show_its_recorded_stride_and_padding(
    own_server_browser: Any, tmp_path: Path
) -> None:
    """A real profiled convolution: its details list the scalar arguments PyTorch recorded
    (stride, padding, dilation, groups) beside its shapes, each tensor input named as one."""
    torch = pytest.importorskip("torch")
    base = tmp_path / "runs"
    base.mkdir()
    conv = torch.nn.Conv2d(3, 8, 3, stride=2, padding=1)
    with torch.profiler.profile(record_shapes=True) as prof:
        conv(torch.randn(2, 3, 16, 16))
    prof.export_chrome_trace(str(base / "conv.json"))
    server = Server(base)
    try:
        server.wait_ready("conv.json")
        hit = server.get("run/timeline/search", run="conv.json", q="aten::conv2d", limit=1)["hits"][0]
        event = server.get("run/timeline/event", run="conv.json", rank=hit["rank"], id=hit["id"])
        assert event["concrete_inputs"] == ["", "", "", "[2, 2]", "[1, 1]", "[1, 1]", "1"]
        with watched_page(own_server_browser) as watched:
            page = watched.page
            page.goto(server.page_url("timeline", "conv.json"))
            page.wait_for_selector(f'{CANVAS}[data-loaded="true"]')
            page.fill('[data-testid="timeline-search"]', "aten::conv2d")
            page.press('[data-testid="timeline-search"]', "Enter")
            details = page.locator('[data-testid="event-details"]')
            details.locator('dt:text-is("Scalar arguments")').wait_for()
            terms = details.locator("dt").all_text_contents()
            values = details.locator("dd").all_text_contents()
            shown = dict(zip(terms, values, strict=True))
            assert shown["Name"] == "aten::conv2d"
            assert shown["Scalar arguments"] == "tensor, tensor, tensor, [2, 2], [1, 1], [1, 1], 1"
            assert not watched.errors and not watched.dialogs
    finally:
        server.stop()
