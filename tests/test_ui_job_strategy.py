"""The parallel-strategy page in a real Chromium, on real gloo jobs (the tensor-parallel job, the
DDP job and the data x pipeline job).

What a user reads off the page is asserted on the rendered DOM against the API it is built from
(itself checked against how the jobs were built in tests/test_server_job_strategy.py): the graph's
ops and special marks per stage, the send -> receive arrows between the stages, a module picked
in the selector highlighting exactly its ops, zoom and pan moving the view and a double-click
resetting it, a clicked op's attributes, the module table's rows.  No console error on any view.
Screenshots at 1600x1000 go to ``PERFSIGHT_SHOTS`` when it is set.
"""

# ruff: noqa: F811 - the fixtures imported from _ui are redefined as test parameters, as pytest intends
from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from _jobs import DDP_JOB, DP_PP_JOB, TP_JOB, demo_base, parallel_jobs
from _ui import Server, Watched, need_browser, own_server_browser, watched_page  # noqa: F401 - fixture

NODE = '[data-testid="strategy-node"]'


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    need_browser()
    base = demo_base(tmp_path_factory, tmp_path_factory.mktemp("ui-strategy") / "demo_output")
    jobs = parallel_jobs(tmp_path_factory)
    for name in (TP_JOB, DP_PP_JOB):
        shutil.copytree(jobs / name, base / name, symlinks=True)
    served = Server(base)
    try:
        for run in (DDP_JOB, TP_JOB, DP_PP_JOB):
            served.wait_ready(run, timeout_s=300)
        yield served
    finally:
        served.stop()


@pytest.fixture
def page(own_server_browser: Any, server: Server) -> Iterator[Watched]:
    with watched_page(own_server_browser) as watched:
        yield watched
        assert not watched.errors, watched.errors
        assert not watched.dialogs, watched.dialogs


def _shot(p: Any, name: str) -> None:
    if folder := os.environ.get("PERFSIGHT_SHOTS"):
        Path(folder).mkdir(parents=True, exist_ok=True)
        p.screenshot(path=str(Path(folder) / f"{name}.png"))


def _open(p: Any, server: Server, run: str) -> None:
    p.goto(server.page_url("job-strategy", run))
    p.wait_for_selector(NODE)
    p.wait_for_selector('[data-testid="module-table"] tbody tr')


def test_the_tensor_parallel_graph_marks_its_redistributions_and_sharded_ops(
    page: Watched, server: Server
) -> None:
    p = page.page
    _open(p, server, TP_JOB)
    api = server.get("job/strategy/graph", run=TP_JOB)
    nodes = [n for st in api["stages"] for n in st["nodes"]]
    assert p.locator(NODE).count() == len(nodes)
    for kind in ("redistribution", "sharded"):
        expected = sum(n["special"] == kind for n in nodes)
        assert expected > 0
        assert p.locator(f'{NODE}[data-special="{kind}"]').count() == expected
        assert (
            f"({expected})"
            in p.locator(f'[data-testid="strategy-legend"] [data-special="{kind}"]').inner_text()
        )
    collectives = p.locator(f'{NODE}[data-category="collective"][data-special="redistribution"]')
    assert collectives.count() == sum(n["category"] == "collective" for n in nodes)
    _shot(p, "strategy-tp")


def test_the_dp_pp_graph_joins_its_two_stages_by_sends_and_receives(page: Watched, server: Server) -> None:
    p = page.page
    _open(p, server, DP_PP_JOB)
    api = server.get("job/strategy/graph", run=DP_PP_JOB)
    for st in api["stages"]:
        assert p.locator(f'{NODE}[data-stage="{st["stage"]}"]').count() == len(st["nodes"])
        aggregating = sum(n["special"] == "gradient_aggregation" for n in st["nodes"])
        assert (
            p.locator(f'{NODE}[data-stage="{st["stage"]}"][data-special="gradient_aggregation"]').count()
            == aggregating
        )
    edges = p.locator('[data-testid="strategy-p2p-edge"]')
    p2p = [e for e in api["edges"] if e["kind"] == "p2p"]
    assert edges.count() == len(p2p) > 0
    drawn = {(e.get_attribute("data-src"), e.get_attribute("data-dst")) for e in edges.all()}
    assert drawn == {(f"{e['src_stage']}:{e['src_node']}", f"{e['dst_stage']}:{e['dst_node']}") for e in p2p}
    for src, _ in drawn:  # every arrow leaves a send
        stage, node = src.split(":")
        assert (
            p.locator(f'{NODE}[data-stage="{stage}"][data-node="{node}"]').get_attribute("data-name")
            == "send"
        )
    _shot(p, "strategy-dp-pp")


def test_a_module_picked_highlights_exactly_its_ops(page: Watched, server: Server) -> None:
    p = page.page
    _open(p, server, TP_JOB)
    api = server.get("job/strategy/graph", run=TP_JOB)
    module = next(m for m in api["modules"] if m.endswith("(Linear)"))
    inside = {
        (st["stage"], n["node"])
        for st in api["stages"]
        for n in st["nodes"]
        if module in (n["modules"] or [])
    }
    assert inside
    p.select_option('[data-testid="strategy-module"]', module)
    lit = p.locator(f"{NODE}.highlight")
    assert {
        (int(e.get_attribute("data-stage")), int(e.get_attribute("data-node"))) for e in lit.all()
    } == inside
    assert p.locator(f"{NODE}.dim").count() == p.locator(NODE).count() - len(inside)
    p.select_option('[data-testid="strategy-module"]', "")
    assert p.locator(f"{NODE}.highlight, {NODE}.dim").count() == 0


def test_the_graph_zooms_pans_and_resets(page: Watched, server: Server) -> None:
    p = page.page
    _open(p, server, DP_PP_JOB)
    graph = p.locator('[data-testid="strategy-graph"]')
    box = graph.bounding_box()
    assert box
    cx, cy = box["x"] + box["width"] / 3, box["y"] + box["height"] / 2
    p.mouse.move(cx, cy)
    p.mouse.wheel(0, -300)
    p.wait_for_function(
        "() => Number(document.querySelector('[data-testid=strategy-graph]').dataset.scale) > 1"
    )
    frame_before = p.locator(".sg-mini-frame").get_attribute("width")
    p.mouse.move(cx, cy)
    p.mouse.down()
    p.mouse.move(cx - 200, cy + 10, steps=5)
    p.mouse.up()
    assert float(graph.get_attribute("data-tx")) < 0  # dragged left: the view moved right
    assert float(p.locator(".sg-mini-frame").get_attribute("width")) == pytest.approx(float(frame_before))
    graph.dblclick(position={"x": 5, "y": 5})
    assert graph.get_attribute("data-scale") == "1.000"
    assert float(graph.get_attribute("data-tx")) == 0


def test_a_clicked_op_shows_its_time_on_each_rank(page: Watched, server: Server) -> None:
    p = page.page
    _open(p, server, DP_PP_JOB)
    api = server.get("job/strategy/graph", run=DP_PP_JOB)
    st = api["stages"][1]
    target = next(n for n in st["nodes"] if n["special"] == "gradient_aggregation")
    node = p.locator(f'{NODE}[data-stage="{st["stage"]}"][data-node="{target["node"]}"]')
    node.dispatch_event("click")  # it may lie outside the view: the click, not the scroll, is tested
    attrs = p.locator('[data-testid="strategy-node-attrs"]')
    assert attrs.get_attribute("data-key") == target["key"]
    assert "gradient aggregation" in attrs.inner_text()
    ranks = attrs.locator("tbody tr")
    assert [int(r.get_attribute("data-rank")) for r in ranks.all()] == target["ranks"]


def test_the_module_table_shows_each_module_on_each_rank(page: Watched, server: Server) -> None:
    p = page.page
    _open(p, server, DP_PP_JOB)
    api = server.get("job/strategy/modules", run=DP_PP_JOB)
    rows = p.locator('[data-testid="module-table"] tbody tr')
    assert rows.count() == len(api["modules"])
    for m, row in zip(api["modules"], rows.all(), strict=True):
        assert row.get_attribute("data-module") == m["module"]
        assert row.get_attribute("data-stage") == str(m["stage"])
        filled = {
            int(c.get_attribute("data-rank")) for c in row.locator("td[data-rank]").all() if c.inner_text()
        }
        assert filled == {r["rank"] for r in m["per_rank"]}
    # the tree of parallel groups stays on the page
    assert p.locator('[data-testid="strategy-tree"] .ps-rank').count() == len(api["ranks"])
    _shot(p, "strategy-modules")
