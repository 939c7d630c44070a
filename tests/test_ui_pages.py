"""The web UI's pages, in a real Chromium, against `perfsight serve` on real runs.

The runs are a training job traced on this machine (examples/train_mlp.py) and a real A100 Kineto
trace from ../shared/data.  Every expected number comes from the JSON API the page is built from,
so these tests prove the page shows the server's numbers, not ones written here.
"""

# ruff: noqa: F811 - the fixtures imported from _ui are redefined as test parameters, as pytest intends
from __future__ import annotations

import shutil
import time
from typing import Any

import pytest

from _ui import (
    AMD_TRACE,
    JOB_RUN,
    MLP_RUN,
    Server,
    Watched,
    column,
    fmt_bytes,
    fmt_ms,
    fmt_percent,
    ui_browser,  # noqa: F401 - fixture
    ui_page,  # noqa: F401 - fixture
    ui_server,  # noqa: F401 - fixture
)

RUNS = ["mlp", "kineto"]
JOB_RANK_ROWS = '[data-testid="job-ranks"] tbody tr'


def run_id(server: Server, which: str) -> str:
    """The id of the traced training run or of the Kineto copy, as the server lists it."""
    runs = server.get("runs")["runs"]
    prefix = f"{MLP_RUN}/" if which == "mlp" else "kineto/"
    ids = [r["id"] for r in runs if r["id"].startswith(prefix)]
    assert len(ids) == 1, runs
    return ids[0]


def open_page(watched: Watched, server: Server, page: str, run: str, ready: str, **params: Any) -> Any:
    server.wait_ready(run)
    watched.page.goto(server.page_url(page, run, **params))
    watched.page.wait_for_selector(ready)
    return watched.page


def chart_label(page: Any, test_id: str) -> str:
    """ECharts' aria description of a chart (it lists the series and their data)."""
    locator = page.locator(f'[data-testid="{test_id}"]')
    locator.locator("canvas").first.wait_for()
    return locator.get_attribute("aria-label") or ""


def test_run_list_shows_each_run_with_its_kind_ranks_and_date(ui_page: Watched, ui_server: Server) -> None:
    runs = ui_server.get("runs")["runs"]
    page = ui_page.page
    page.goto(ui_server.url)
    page.wait_for_selector('[data-testid="run-list"] tbody tr')
    assert page.locator('[data-testid="run-list"] tbody tr').count() == len(runs)
    for run in runs:
        cells = page.locator(f'tr[data-run="{run["id"]}"] td').all_text_contents()
        assert cells[0] == run["name"]
        assert cells[1] == run["kind_label"]
        assert cells[2] == str(len(run["ranks"]))
        assert cells[6].startswith(run["date"][:4])
    assert not ui_page.errors


def test_opening_a_new_run_shows_analysis_progress_then_its_overview(
    ui_page: Watched, ui_server: Server
) -> None:
    folder = ui_server.base / "fresh"
    folder.mkdir()
    shutil.copyfile(AMD_TRACE, folder / "late_arrival.json.gz")
    deadline = time.monotonic() + 30
    while not any(r["id"].startswith("fresh/") for r in ui_server.get("runs")["runs"]):
        assert time.monotonic() < deadline, "the server never listed the new run"
        time.sleep(0.5)
    run = next(r for r in ui_server.get("runs")["runs"] if r["id"].startswith("fresh/"))
    assert run["status"] == "new"
    page = ui_page.page
    page.goto(ui_server.url)
    page.locator(f'tr[data-run="{run["id"]}"] a').click()
    page.wait_for_selector('[data-testid="analysis-progress"]')
    page.wait_for_selector('[data-testid="stat-steps"]', timeout=180_000)
    overview = ui_server.get("run/overview", run=run["id"])
    assert page.text_content('[data-testid="stat-steps"]') == str(len(overview["steps"]))


@pytest.mark.parametrize("which", RUNS)
def test_overview_shows_the_step_breakdown_operator_types_and_time_shares(
    ui_page: Watched, ui_server: Server, which: str
) -> None:
    run = run_id(ui_server, which)
    page = open_page(ui_page, ui_server, "overview", run, '[data-testid="stat-steps"]')
    data = ui_server.get("run/overview", run=run)
    steps = data["steps"]
    assert steps, "a real run has steps"
    assert page.text_content('[data-testid="stat-steps"]') == str(len(steps))
    assert page.text_content('[data-testid="stat-events"]') == f"{data['timeline']['events']:,}"

    shares = data["shares"]
    for label, key in [
        ("Computing", "computing"),
        ("Communication (overlapped)", "communication_overlapped"),
        ("Communication (not overlapped)", "communication_not_overlapped"),
        ("Free", "free"),
        ("Preparing", "preparing"),
    ]:
        assert page.text_content(f'[data-share="{label}"]') == fmt_percent(shares[key])
    # the part of Free the device waited for the host: the GPU trace is launch-bound, the CPU run
    # (host clock) has no launches to wait for, so no such row
    waited = page.locator('[data-share="of which waiting for the host"]')
    assert (shares["free_host_wait"] > 0) == (which == "kineto")
    assert waited.count() == int(which == "kineto")
    if which == "kineto":
        assert waited.text_content() == fmt_percent(shares["free_host_wait"])
        assert shares["free_host_wait"] <= shares["free"]

    breakdown = chart_label(page, "chart-step-breakdown")
    for step in steps:
        assert str(step["step"]) in breakdown
    types = chart_label(page, "chart-operator-types")
    assert data["operator_types"][0]["name"] in types

    has_data_wait = bool(data["data_wait"]["source"] and data["data_wait"]["per_step"])
    assert page.locator('[data-testid="chart-data-wait"]').count() == int(has_data_wait)

    kinds = page.locator('[data-testid="card-by-kind"] tbody tr td:first-child').all_text_contents()
    assert sorted(kinds) == sorted(k["kind"] for k in data["timeline"]["by_kind"])

    page.locator('[data-testid="card-step-breakdown"] a.details-link').click()
    page.wait_for_selector('[data-testid="step-table"]')
    assert "#/steps?" in page.url
    assert not ui_page.errors


@pytest.mark.parametrize("which", RUNS)
def test_step_trace_shows_every_step_its_stages_and_the_fp_bp_ops(
    ui_page: Watched, ui_server: Server, which: str
) -> None:
    run = run_id(ui_server, which)
    page = open_page(ui_page, ui_server, "steps", run, '[data-testid="step-table"] tbody tr')
    data = ui_server.get("run/step-trace", run=run)
    rows = page.locator('[data-testid="step-table"] tbody tr')
    assert rows.count() == len(data["steps"])
    for i, step in enumerate(data["steps"]):
        cells = rows.nth(i).locator("td").all_text_contents()
        assert cells[:5] == [
            str(step["step"]),
            fmt_ms(step["duration_ns"]),
            fmt_ms(step["iteration_interval_ns"]),
            fmt_ms(step["fp_bp_ns"]),
            fmt_ms(step["tail_ns"]),
        ]
    assert page.text_content('[data-testid="fp-ops"]') == (", ".join(data["fp_ops"]) or "–")
    assert page.text_content('[data-testid="bp-ops"]') == (", ".join(data["bp_ops"]) or "–")
    assert chart_label(page, "chart-step-curves")

    # one chosen step: its Gantt rows come from that step's overlap intervals
    last = data["steps"][-1]["step"]
    page.select_option('[data-testid="step-select"]', str(last))
    page.wait_for_url(f"**step={last}**")
    page.wait_for_selector('[data-testid="chart-gantt"] canvas')
    assert page.locator('[data-testid="step-select"]').input_value() == str(last)
    assert not ui_page.errors


@pytest.mark.parametrize("which", RUNS)
def test_operators_table_sorts_searches_and_drills_down_to_instances(
    ui_page: Watched, ui_server: Server, which: str
) -> None:
    run = run_id(ui_server, which)
    table = '[data-testid="operator-type-table"]'
    page = open_page(ui_page, ui_server, "operators", run, f"{table} tbody tr td")
    kernels = ui_server.get("run/kernel-types", run=run, limit=1)["total"]
    measure = "device_total_ns" if kernels else "host_self_ns"
    types = ui_server.get("run/operator-types", run=run, sort=measure, order="desc", limit=25)
    page.wait_for_selector(f'{table}[data-total="{types["total"]}"]')
    first_names = page.locator(f"{table} tbody tr td:first-child").all_text_contents()
    assert first_names == [r["name"] for r in types["rows"]]
    assert types["rows"][0]["name"] in chart_label(page, "chart-top-types")

    # sort by call count (server-side): the first row has the most calls
    page.locator(f'{table} th[data-sort-key="count"]').click()
    by_count = ui_server.get("run/operator-types", run=run, sort="count", order="desc", limit=1)["rows"][0]
    page.wait_for_function(
        "([sel, n]) => document.querySelector(sel + ' tbody tr td:nth-child(2)')?.textContent === n",
        arg=[table, f"{by_count['count']:,}"],
    )

    # fuzzy search on the server: "aten" matches every aten:: type
    query = "aten"
    expected = ui_server.get("run/operator-types", run=run, q=query, limit=1)["total"]
    page.fill(f"{table} input[type=search]", query)
    page.wait_for_selector(f'{table}[data-total="{expected}"]')
    names = page.locator(f"{table} tbody tr td:first-child").all_text_contents()
    assert names and all("aten" in n.lower() for n in names)

    # drill-down: a type's instances with shapes, dtypes, host and device time
    target = page.locator(f"{table} tbody tr").first
    name = target.locator("td").first.text_content()
    target.click()
    page.wait_for_selector(f'[data-testid="drill-type"]:text-is("{name}")')
    instances = ui_server.get("run/operators", run=run, name=name, sort="dur_ns", order="desc", limit=25)
    itable = '[data-testid="operator-instance-table"]'
    page.wait_for_selector(f'{itable}[data-total="{instances["total"]}"]')
    first = page.locator(f"{itable} tbody tr").first.locator("td").all_text_contents()
    row = instances["rows"][0]
    assert first[0] == name
    assert first[3] == fmt_ms(row["dur_ns"])
    headers = page.locator(f"{itable} th").all_text_contents()
    if ui_server.get("run/overview", run=run)["timeline"]["device_tracks"]:
        assert first[5] == fmt_ms(row["device_ns"])
    else:  # a CPU-only run has no device time to show
        assert not any("Device" in h for h in headers)

    kernel_card = page.locator('[data-testid="kernel-type-table"]')
    if kernels:
        kernel_card.locator("tbody tr td").first.wait_for()
        total = ui_server.get("run/kernel-types", run=run, limit=1)["total"]
        page.wait_for_selector(f'[data-testid="kernel-type-table"][data-total="{total}"]')
    else:
        assert kernel_card.count() == 0
    assert not ui_page.errors


@pytest.mark.parametrize("which", RUNS)
def test_memory_page_shows_the_curve_peak_and_top_allocating_operators(
    ui_page: Watched, ui_server: Server, which: str
) -> None:
    run = run_id(ui_server, which)
    data = None
    ui_server.wait_ready(run)
    data = ui_server.get("run/memory", run=run)
    if not data["devices"]:
        page = open_page(ui_page, ui_server, "memory", run, '[data-testid="memory-none"]')
        assert "no memory events" in (page.text_content('[data-testid="memory-none"]') or "")
        return
    page = open_page(ui_page, ui_server, "memory", run, '[data-testid="peak-allocated-0"]')
    on_device = ui_server.get("run/overview", run=run)["timeline"]["device_tracks"] > 0
    for i, device in enumerate(data["devices"]):
        assert page.text_content(f'[data-testid="peak-allocated-{i}"]') == fmt_bytes(
            device["peak_allocated_bytes"]
        )
        label = chart_label(page, f"chart-memory-{i}")
        assert "Allocated" in label
        if device["peak_reserved_bytes"] and on_device:
            assert page.text_content(f'[data-testid="peak-reserved-{i}"]') == fmt_bytes(
                device["peak_reserved_bytes"]
            )
            assert "Reserved" in label
        else:  # no caching allocator (a CPU-only run): no "Peak reserved 0 B"
            assert page.locator(f'[data-testid="peak-reserved-{i}"]').count() == 0
            assert "Reserved" not in label
    rows = page.locator('[data-testid="memory-op-table"] tbody tr')
    assert rows.count() == len(data["top_operators"])
    if data["top_operators"]:
        top = data["top_operators"][0]
        cells = rows.first.locator("td").all_text_contents()
        assert cells[0] == (top["name"] or "(outside any operator)")
        assert cells[2] == fmt_bytes(top["total_bytes"])
    assert not ui_page.errors


def test_a_two_rank_job_switches_rank_and_its_timeline_search_covers_both_ranks(
    ui_page: Watched, ui_server: Server
) -> None:
    page = open_page(ui_page, ui_server, "overview", JOB_RUN, '[data-testid="stat-events"]')
    ranks = ui_server.get("run/status", run=JOB_RUN)["ranks"]
    assert ranks == [0, 1]
    select = page.locator('[data-testid="rank-select"]')
    assert select.is_visible()
    assert select.locator("option").all_text_contents() == ["Rank 0", "Rank 1"]
    for rank in ranks:
        select.select_option(str(rank))
        page.wait_for_url(f"**rank={rank}**")
        events = ui_server.get("run/overview", run=JOB_RUN, rank=rank)["timeline"]["events"]
        page.wait_for_selector(f'[data-testid="stat-events"]:text-is("{events:,}")')

    found = ui_server.get("run/timeline/search", run=JOB_RUN, q="ProfilerStep", limit=100)
    assert {hit["rank"] for hit in found["hits"]} == {0, 1}
    page.goto(ui_server.page_url("timeline", JOB_RUN, ranks="0,1"))  # both ranks shown
    page.wait_for_selector('[data-testid="timeline-canvas"][data-loaded="true"][data-ranks="0,1"]')
    page.fill('[data-testid="timeline-search"]', "ProfilerStep")
    page.press('[data-testid="timeline-search"]', "Enter")
    page.wait_for_selector(f'[data-testid="search-info"]:text-is("{found["total"]:,} results")')
    assert page.locator('[data-testid="search-results"] li').count() == len(found["hits"])
    assert not ui_page.errors


def test_the_gpu_jobs_ranks_show_how_long_each_device_waited_for_its_host(
    ui_page: Watched, ui_server: Server
) -> None:
    page = ui_page.page
    page.goto(ui_server.page_url("job", JOB_RUN))
    page.wait_for_selector(JOB_RANK_ROWS)
    ranks = {r["rank"]: r for r in ui_server.get("job/overview", run=JOB_RUN)["ranks"]}
    assert set(ranks) == {0, 1}
    assert all(r["host_wait_ns"] > 0 and r["after_launch_ns"] > 0 for r in ranks.values())
    headers = page.locator('[data-testid="job-ranks"] th').all_inner_texts()
    at = next(i for i, h in enumerate(headers) if h.startswith("Free: host wait"))
    assert headers[at - 1].startswith("Free (")  # read as parts of the free time beside them
    assert headers[at + 1].startswith("Free: after launch")
    rank_cells = column(page, JOB_RANK_ROWS, 0)
    for offset, part in ((0, "host_wait_ns"), (1, "after_launch_ns")):
        shown = dict(zip(rank_cells, column(page, JOB_RANK_ROWS, at + offset), strict=True))
        assert shown == {str(rank): fmt_ms(r[part]) for rank, r in ranks.items()}, part
    # the findings card: the ranks a job's finding was seen on (its title gives the worst one's numbers)
    findings = ui_server.get("job/findings", run=JOB_RUN)["findings"]
    launch = next(f for f in findings if f["rule"] == "host_wait")
    card = page.locator('[data-testid="findings-top"] [data-rule="host_wait"]')
    card.wait_for()
    assert card.locator('[data-testid="finding-rank"]').all_inner_texts() == [str(r) for r in launch["ranks"]]
    assert not ui_page.errors
