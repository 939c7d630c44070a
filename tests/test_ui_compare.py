"""The compare page and the job's card comparison in a real Chromium, against `perfsight serve` on
the real jobs of `make demo` (a gloo DDP job, and a DDP job one rank of which does 40 extra matrix
products per step).  Expected values come from the JSON API the pages are built from, or from how
the jobs were run (which rank was slowed), never from strings we wrote."""

# ruff: noqa: F811 - the fixtures imported from _ui are redefined as test parameters, as pytest intends
from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from _jobs import DDP_JOB, SLOW_RANK, STRAGGLER_JOB
from _ui import Server, Watched, own_server_browser, served_demo, watched_page  # noqa: F401 - fixture

OPERATOR_ROWS = '[data-testid="compare-table-operators"] tbody tr'


@pytest.fixture(scope="module")
def jobs_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    with served_demo(tmp_path_factory, "ui-compare", (DDP_JOB, STRAGGLER_JOB), straggler=True) as server:
        yield server


@pytest.fixture
def page(own_server_browser: Any, jobs_server: Server) -> Iterator[Watched]:
    with watched_page(own_server_browser) as watched:
        yield watched


def _deltas(p: Any) -> list[str]:
    return [row.locator("td").nth(7).inner_text() for row in p.locator(OPERATOR_ROWS).all()]


def _ms_value(text: str) -> float:
    """A duration cell ("+1.234 ms", "-56.000 µs") in ms, to check an order."""
    number, unit = text.replace("+", "").split()
    return float(number) * {"s": 1e3, "ms": 1.0, "µs": 1e-3, "ns": 1e-6}[unit]


def test_two_runs_picked_in_the_run_list_open_side_by_side(
    page: Watched, jobs_server: Server, tmp_path
) -> None:
    p = page.page
    p.goto(jobs_server.url)
    p.wait_for_selector('[data-testid="run-list"] tbody tr')
    button = p.locator('[data-testid="compare-picked"]')
    assert button.is_disabled()
    p.locator(f'input[data-pick="{DDP_JOB}"]').check()
    assert button.is_disabled()  # one run is not a comparison
    p.locator(f'input[data-pick="{STRAGGLER_JOB}"]').check()
    button.click()
    p.wait_for_selector('[data-testid="compare-breakdown"]')
    assert "#/compare?" in p.url and f"base={DDP_JOB}" in p.url and f"new={STRAGGLER_JOB}" in p.url
    doc = jobs_server.get("compare", base=DDP_JOB, new=STRAGGLER_JOB)
    assert p.locator('[data-testid="compare-base"]').inner_text().startswith(doc["base"]["input"])
    shown = p.locator('[data-testid="compare-breakdown"] tbody tr')
    assert [r.get_attribute("data-metric") for r in shown.all()] == [
        r["metric"] for r in doc["step_breakdown"]
    ]
    # the diff table: regressions first, then sorted the other way by a click, then searched
    p.wait_for_selector(f'[data-testid="compare-table-operators"][data-total="{doc["operators_rows"]}"]')
    first = [_ms_value(x) for x in _deltas(p)]
    assert first == sorted(first, reverse=True)
    p.locator('[data-testid="compare-table-operators"] th', has_text="Δ time/step").click()
    p.wait_for_selector('[data-testid="compare-table-operators"] th:has-text("▲")')
    ascending = [_ms_value(x) for x in _deltas(p)]
    assert ascending == sorted(ascending) and ascending != first
    name = doc["operators"][0]["name"]
    p.locator('[data-testid="compare-table-operators"] input[type="search"]').fill(name)
    matching = [
        r for r in doc["operators"] if name.lower() in (r["name"] + r["input_dims"] + r["status"]).lower()
    ]
    p.wait_for_selector(f'[data-testid="compare-table-operators"][data-total="{len(matching)}"]')
    names = {row.locator("td").first.inner_text() for row in p.locator(OPERATOR_ROWS).all()}
    assert name in names and names <= {r["name"] for r in matching}
    p.screenshot(path=str(tmp_path / "compare.png"), full_page=False)
    assert not page.errors


def test_card_comparison_shows_the_slow_ranks_extra_compute(
    page: Watched, jobs_server: Server, tmp_path
) -> None:
    p = page.page
    p.goto(jobs_server.page_url("job", STRAGGLER_JOB))
    p.locator('nav.tabs a[data-page="job-compare"]').click()
    p.wait_for_selector('[data-testid="compare-breakdown"]')
    doc = jobs_server.get("compare", base=STRAGGLER_JOB, new=STRAGGLER_JOB, base_rank=0, new_rank=SLOW_RANK)
    assert (
        p.locator('[data-testid="compare-new"]').inner_text().startswith(f"{STRAGGLER_JOB}:rank{SLOW_RANK}")
    )
    # the slowed rank computes longer beyond noise: its row is flagged and says so
    computing = p.locator('[data-testid="compare-breakdown"] tr[data-metric="computing_ns"]')
    assert "flagged" in (computing.get_attribute("class") or "")
    assert "beyond noise" in computing.inner_text()
    real = [r for r in doc["regressions"] if r["real"] and r["delta_ns"] > 0]
    items = p.locator('[data-testid="compare-regressions"] li')
    assert items.count() == min(10, len(real))
    assert items.first.get_attribute("data-category") == real[0]["category"]
    # the straggler's own matrix products are operators only rank 1 runs
    p.locator('[data-testid="compare-table-operators"] input[type="search"]').fill("aten::tanh")
    tanh = [r for r in doc["operators"] if "aten::tanh" in r["name"] + r["input_dims"] + r["status"]]
    assert tanh and {r["status"] for r in tanh} == {"added"}
    p.wait_for_selector(f'[data-testid="compare-table-operators"][data-total="{len(tanh)}"]')
    assert all("added" in row.inner_text() for row in p.locator(OPERATOR_ROWS).all())
    p.screenshot(path=str(tmp_path / "card.png"), full_page=True)
    # swapping the ranks with the selectors reloads the comparison the other way round
    p.locator('[data-testid="compare-rank-a"]').select_option(str(SLOW_RANK))
    p.wait_for_url(f"**a={SLOW_RANK}**")
    p.wait_for_selector(f'[data-testid="compare-base"]:has-text("rank{SLOW_RANK}")')
    assert not page.errors
