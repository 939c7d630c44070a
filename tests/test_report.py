"""``perfsight report``: one HTML file that opens from disk, in a real Chromium with the network cut.

The runs are a real Kineto GPU trace from the shared data, `make demo`'s jobs (tests/_jobs.py: a
2-stage pipeline job whose stage 1 is overloaded, a DDP job with one rank made slow) and the
hostile-names run.  Each report is made by the command a user types; what its pages show is
compared with the JSON API of `perfsight serve` (a real server process) for the same run, never
with strings we wrote.  The browser's every request is routed through the test, which lets only
the report file itself through.
"""

# ruff: noqa: F811 - the fixtures imported from _ui are redefined as test parameters, as pytest intends
from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from _hostile import HOSTILE_NAMES
from _jobs import PP_JOB, SLOW_RANK, STRAGGLER_JOB, demo_base
from _ui import (  # noqa: F401 - fixture
    HOSTILE_RUN,
    KINETO_RUN,
    NCCL_TRACE,
    Server,
    _write_hostile,
    fmt_ms,
    need_browser,
    own_server_browser,
)
from shared_data import KINETO, require

DOCUMENT = re.compile(r'<script type="application/json" id="perfsight-report">(.*?)</script>', re.DOTALL)
LIMIT_BYTES = 5_000_000  # the default --max-size
HOSTILE_FOLDER = "<img src=x onerror=alert(2)> & \u202e名"  # a run's name is data too


def report_command(target: Path, out: Path, cache: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    """``perfsight report TARGET -o OUT`` as a user runs it (analyses kept in ``cache``)."""
    env = {**os.environ, "PERFSIGHT_CACHE_DIR": str(cache)}
    return subprocess.run(
        [sys.executable, "-m", "perfsight.cli", "report", str(target), "-o", str(out), *extra],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
        check=False,
    )


@dataclasses.dataclass
class Made:
    base: Path
    cache: Path
    reports: dict[str, Path]  # run id on the server -> its report
    server: Server


@pytest.fixture(scope="module")
def made(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Made]:
    need_browser()
    require(NCCL_TRACE)
    root = tmp_path_factory.mktemp("report")
    base = demo_base(tmp_path_factory, root / "demo_output", straggler=True)
    (base / KINETO_RUN).parent.mkdir(parents=True)
    shutil.copyfile(NCCL_TRACE, base / KINETO_RUN)
    _write_hostile(base / HOSTILE_RUN)
    _write_hostile(root / "elsewhere" / HOSTILE_FOLDER)
    reports = {}
    for run in (PP_JOB, STRAGGLER_JOB, KINETO_RUN, HOSTILE_RUN):
        out = root / f"{run.replace('/', '_')}.html"
        result = report_command(base / run, out, root / "cache")
        assert result.returncode == 0, result.stderr[-3000:]
        reports[run] = out
    named = report_command(root / "elsewhere" / HOSTILE_FOLDER, root / "named.html", root / "cache")
    assert named.returncode == 0, named.stderr[-3000:]
    reports[HOSTILE_FOLDER] = root / "named.html"
    server = Server(base)
    try:
        for run in (PP_JOB, STRAGGLER_JOB, KINETO_RUN, HOSTILE_RUN):
            server.wait_ready(run, timeout_s=300)
        yield Made(base, root / "cache", reports, server)
    finally:
        server.stop()


def document(report: Path) -> dict[str, Any]:
    found = DOCUMENT.search(report.read_text(encoding="utf-8"))
    assert found is not None
    return json.loads(found.group(1))


class Offline:
    """A page of a fresh browser context whose every request goes through the test: the report file
    is let through, anything else is refused and recorded."""

    def __init__(self, browser: Any, report: Path) -> None:
        self.file_url = report.resolve().as_uri()
        self.context = browser.new_context(viewport={"width": 1600, "height": 1000})
        self.requests: list[str] = []
        self.refused: list[str] = []
        self.errors: list[str] = []
        self.dialogs: list[str] = []

        def route(r: Any) -> None:
            self.requests.append(r.request.url)
            if r.request.url.split("#")[0] == self.file_url:
                r.continue_()
            else:
                self.refused.append(r.request.url)
                r.abort()

        self.context.route("**/*", route)
        self.page = self.context.new_page()
        self.page.set_default_timeout(60_000)
        self.page.on("console", lambda m: self.errors.append(m.text) if m.type == "error" else None)
        self.page.on("pageerror", lambda e: self.errors.append(str(e)))
        self.page.on("dialog", lambda d: (self.dialogs.append(d.message), d.dismiss()))

    def open(self) -> Any:
        self.page.goto(self.file_url)
        return self.page


@pytest.fixture
def offline(own_server_browser: Any) -> Iterator[Any]:
    opened: list[Offline] = []

    def make(report: Path) -> Offline:
        opened.append(Offline(own_server_browser, report))
        return opened[-1]

    yield make
    for o in opened:
        o.context.close()


def _settled(page: Any) -> None:
    """Wait until the page has drawn its content (or a note, or an error) and no table is loading."""
    page.wait_for_selector("main > *")
    page.wait_for_function("!document.querySelector('[aria-busy]')")


def test_the_report_opens_from_disk_with_no_request_and_every_tab_draws(made: Made, offline: Any) -> None:
    for run in (PP_JOB, KINETO_RUN):
        o = offline(made.reports[run])
        p = o.open()
        _settled(p)
        tabs = p.locator("nav.tabs a").all()
        names = [t.get_attribute("data-page") for t in tabs]
        assert "timeline" not in names  # it asks the server for every window it draws
        assert names[:1] == (["job"] if run == PP_JOB else ["overview"])
        for name in names:
            p.locator(f'nav.tabs a[data-page="{name}"]').click()
            p.wait_for_selector(f'nav.tabs a.active[data-page="{name}"]')
            _settled(p)
            assert p.locator('[role="alert"]').count() == 0, (name, p.inner_text("main"))
            assert p.locator('[data-testid="not-in-report"]').count() == 0, name
            if name == "job-comm":  # the communication page's other tabs open from the report too
                for tab, rows in (("links", "comm-links"), ("ops", "comm-ops")):
                    p.locator(f'[data-testid="comm-tabs"] button[data-value="{tab}"]').click()
                    p.wait_for_selector(f'[data-testid="{rows}"] tbody tr td')
                    _settled(p)
                    assert p.locator('[data-testid="not-in-report"]').count() == 0, tab
                    assert p.locator('[role="alert"]').count() == 0, (tab, p.inner_text("main"))
        assert o.refused == [], o.refused
        assert {u.split("#")[0] for u in o.requests} == {o.file_url}
        assert o.errors == []
        assert made.reports[run].stat().st_size <= LIMIT_BYTES


def test_the_job_report_shows_the_servers_numbers_and_findings(made: Made, offline: Any) -> None:
    run = STRAGGLER_JOB
    o = offline(made.reports[run])
    p = o.open()
    p.wait_for_selector('[data-testid="job-ranks"] tbody tr td')
    overview = made.server.get("job/overview", run=run, sort="duration_ns", order="desc")
    assert p.inner_text('[data-testid="stat-slow-ranks"]') == f"Rank {SLOW_RANK}"
    assert (
        p.inner_text('[data-testid="stat-longest-step"]') == f"Rank {overview['step_spread']['slowest_rank']}"
    )
    rows = p.locator('[data-testid="job-ranks"] tbody tr').all()
    shown = [(r.locator("td").nth(0).inner_text(), r.locator("td").nth(2).inner_text()) for r in rows]
    assert shown == [(str(r["rank"]), fmt_ms(r["duration_ns"])) for r in overview["ranks"]]
    # the findings the advisor made for the job, as the server lists them
    findings = made.server.get("job/findings", run=run)["findings"]
    p.locator('nav.tabs a[data-page="job-findings"]').click()
    p.wait_for_selector('[data-testid="findings-list"] [data-testid="finding"]')
    titles = p.locator('[data-testid="findings-list"] [data-testid="finding-title"]').all_inner_texts()
    assert titles == [f["title"] for f in findings] and titles
    # sorting the rank table in the report (a number: largest first) gives the server's order
    p.locator('nav.tabs a[data-page="job"]').click()
    p.wait_for_selector('[data-testid="job-ranks"] tbody tr td')
    p.locator('[data-testid="job-ranks"] th[data-sort-key="rank"]').click()
    p.wait_for_selector('[data-testid="job-ranks"] th[data-sort-key="rank"]:has-text("▼")')
    by_rank = made.server.get("job/overview", run=run, sort="rank", order="desc")["ranks"]
    assert [
        r.locator("td").nth(0).inner_text() for r in p.locator('[data-testid="job-ranks"] tbody tr').all()
    ] == [str(r["rank"]) for r in by_rank]
    # the slow rank's pages are in the report, with its step count
    p.goto(o.file_url + f"#/overview?run=.&rank={SLOW_RANK}")
    p.wait_for_selector('[data-testid="stat-steps"]')
    steps = made.server.get("run/step-trace", run=run, rank=SLOW_RANK)["steps"]
    assert p.inner_text('[data-testid="stat-steps"]') == str(len(steps))
    assert o.refused == [] and o.errors == []


def test_the_trace_report_shows_the_servers_operators_and_findings(made: Made, offline: Any) -> None:
    run = KINETO_RUN
    o = offline(made.reports[run])
    p = o.open()
    p.locator('nav.tabs a[data-page="findings"]').click()
    p.wait_for_selector('[data-testid="findings-list"] [data-testid="finding"]')
    findings = made.server.get("run/findings", run=run, rank=0)["findings"]
    titles = p.locator('[data-testid="findings-list"] [data-testid="finding-title"]').all_inner_texts()
    assert titles == [f["title"] for f in findings] and titles
    p.locator('nav.tabs a[data-page="operators"]').click()
    p.wait_for_selector('[data-testid="operator-type-table"] tbody tr td')
    top_by = made.server.get("run/overview", run=run)["top_by"]
    expected = made.server.get("run/operator-types", run=run, rank=0, sort=top_by, order="desc", limit=25)
    rows = p.locator('[data-testid="operator-type-table"] tbody tr').all()
    column = 5 if top_by == "device_total_ns" else 3
    shown = [(r.locator("td").nth(0).inner_text(), r.locator("td").nth(column).inner_text()) for r in rows]
    assert shown == [(r["name"], fmt_ms(r[top_by])) for r in expected["rows"]]
    assert p.get_attribute('[data-testid="operator-type-table"]', "data-total") == str(expected["total"])
    # the next page is in the report too
    p.locator('[data-testid="operator-type-table"] .pager button').nth(1).click()
    p.wait_for_selector('[data-testid="operator-type-table"] .pager-info:has-text("Page 2")')
    second = made.server.get(
        "run/operator-types", run=run, rank=0, sort=top_by, order="desc", limit=25, offset=25
    )
    assert p.locator('[data-testid="operator-type-table"] tbody tr td:first-child').all_inner_texts() == [
        r["name"] for r in second["rows"]
    ]
    assert o.refused == [] and o.errors == []


def embedded_body(answers: list[dict[str, Any]], i: int) -> Any:
    """Answer ``i``'s body as web/src/api.ts rebuilds it (a reordering of another answer's list)."""
    a = answers[i]
    if "like" not in a:
        return a["body"]
    base = embedded_body(answers, a["like"])
    if "field" not in a:
        return base
    return {**base, a["field"]: [base[a["field"]][j] for j in a["order"]]}


def _server_run_answer(made: Made, run: str, answer: dict[str, Any]) -> Any:
    params = {**answer["params"], "run": run}
    return made.server.get(answer["path"], **params)


def test_every_embedded_answer_is_the_servers(made: Made) -> None:
    """The report's document holds the server's answers: asked of `perfsight serve` for the same
    run, every embedded body (and every reordered one, rebuilt as the UI rebuilds it) comes back equal."""
    for run in (STRAGGLER_JOB, KINETO_RUN):
        doc = document(made.reports[run])
        answers = doc["answers"]

        checked = 0
        for i, answer in enumerate(answers):
            if answer["status"] != 200 or answer["path"] == "run/status":
                continue
            mine = embedded_body(answers, i)
            theirs = _server_run_answer(made, run, answer)
            if isinstance(mine, dict) and "run" in mine:
                mine = {**mine, "run": theirs.get("run")}
            assert mine == theirs, (answer["path"], answer["params"])
            checked += 1
        assert checked >= 20


def test_a_hostile_op_name_stays_text(made: Made, offline: Any) -> None:
    report = made.reports[HOSTILE_RUN]
    raw = report.read_text(encoding="utf-8")
    # the names are in the file, but none of them as markup: the document holds no "<" at all, and
    # the only elements that end are the document and the UI's script
    found = DOCUMENT.search(raw)
    assert found is not None and "<" not in found.group(1)
    assert len(re.findall("</script", raw, re.IGNORECASE)) == 2
    assert "onerror=alert(1)" in found.group(1)  # the name is there, as data
    o = offline(report)
    p = o.open()
    p.locator('nav.tabs a[data-page="operators"]').click()
    p.wait_for_selector('[data-testid="operator-type-table"] tbody tr td')
    cells = p.locator('[data-testid="operator-type-table"] tbody tr td:first-child').all_text_contents()
    for name in ("</script><img src=x onerror=alert(1)>", '<script>alert("x")</script>'):
        assert name in cells
    assert p.locator("img[src='x']").count() == 0
    assert p.locator("main script").count() == 0
    assert o.dialogs == [] and o.refused == []


def test_a_size_limit_leaves_views_out_and_says_which(made: Made, offline: Any, tmp_path: Path) -> None:
    out = tmp_path / "small.html"
    result = report_command(made.base / PP_JOB, out, made.cache, "--max-size", "0.9")
    assert result.returncode == 0, result.stderr
    assert out.stat().st_size <= 900_000
    assert "left out" in result.stderr
    omitted = document(out)["omitted"]
    assert omitted
    o = offline(out)
    p = o.open()
    p.wait_for_selector('[data-testid="report-omitted"] li')
    assert p.locator('[data-testid="report-omitted"] li').all_inner_texts() == [
        f"{x['what']} ({x['count']})" for x in omitted
    ]
    # a view that was left out says so where it would be, and nothing breaks
    p.goto(o.file_url + "#/timeline?run=.")
    p.wait_for_selector('[data-testid="not-in-report"]')
    assert o.refused == [] and o.errors == []
    # below what the UI itself takes: a clear error, and no file
    tiny = tmp_path / "tiny.html"
    result = report_command(made.base / PP_JOB, tiny, made.cache, "--max-size", "0.3")
    assert result.returncode == 2
    assert "--max-size" in result.stderr and "Traceback" not in result.stderr
    assert not tiny.exists()


def test_bad_inputs_get_one_line_naming_what_is_wrong(made: Made, tmp_path: Path) -> None:
    missing = report_command(tmp_path / "nope", tmp_path / "r.html", made.cache)
    assert missing.returncode == 2
    assert missing.stderr.strip().splitlines() == [
        f"perfsight report: error: {tmp_path / 'nope'}: no such file or folder"
    ]
    several = report_command(made.base, tmp_path / "r.html", made.cache, "-q")
    assert several.returncode == 2
    line = several.stderr.strip()
    assert len(line.splitlines()) == 1 and "runs" in line and PP_JOB in line and KINETO_RUN in line
    assert not (tmp_path / "r.html").exists()


def test_the_hostile_names_survive_the_embedding_byte_for_byte(made: Made) -> None:
    doc = document(made.reports[HOSTILE_RUN])
    names = {
        row["name"]
        for a in doc["answers"]
        if a["path"] == "run/operator-types" and "body" in a
        for row in a["body"]["rows"]
    }
    ops = [n for n in HOSTILE_NAMES if n in names]
    assert len(ops) == len(HOSTILE_NAMES), set(HOSTILE_NAMES) - names


def test_ranks_chooses_the_rank_pages_and_a_left_out_rank_says_so(
    made: Made, offline: Any, tmp_path: Path
) -> None:
    out = tmp_path / "rank1.html"
    result = report_command(made.base / PP_JOB, out, made.cache, "--ranks", "1", "-q")
    assert result.returncode == 0 and result.stderr == ""
    doc = document(out)
    assert (doc["ranks"], doc["all_ranks"]) == ([1], [0, 1])
    o = offline(out)
    p = o.open()
    p.wait_for_selector('[data-testid="job-ranks"] tbody tr td')
    assert p.locator('[data-testid="job-ranks"] tbody tr').count() == 2  # the job pages keep every rank
    p.goto(o.file_url + "#/overview?run=.&rank=0")
    note = p.wait_for_selector('[data-testid="not-in-report"]')
    assert "rank 0" in note.inner_text()
    p.goto(o.file_url + "#/overview?run=.&rank=1")
    p.wait_for_selector('[data-testid="stat-steps"]')
    steps = made.server.get("run/step-trace", run=PP_JOB, rank=1)["steps"]
    assert p.inner_text('[data-testid="stat-steps"]') == str(len(steps))
    assert o.refused == [] and o.errors == []


def test_a_hostile_run_name_stays_text(made: Made, offline: Any) -> None:
    o = offline(made.reports[HOSTILE_FOLDER])
    p = o.open()
    p.wait_for_selector('[data-testid="run-name"]')
    assert p.inner_text('[data-testid="run-name"]') == HOSTILE_FOLDER
    assert p.title() == f"perfsight report: {HOSTILE_FOLDER}"
    _settled(p)
    assert p.locator("img[src='x']").count() == 0
    assert o.dialogs == [] and o.refused == [] and o.errors == []


REGRESSIONS_SHOWN = 10  # web/src/pages/compare.ts


def test_a_compare_report_opens_from_disk_and_shows_what_compare_json_holds(
    offline: Any, tmp_path: Path
) -> None:
    ws128 = require(KINETO / "two_ranks_ws128")
    html = tmp_path / "compare.html"
    result = subprocess.run(
        [sys.executable, "-m", "perfsight.cli", "compare", f"{ws128}:rank0", f"{ws128}:rank1",
         "--out", str(tmp_path), "--html", str(html)],
        capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    written = json.loads((tmp_path / "compare" / "compare.json").read_text())
    o = offline(html)
    p = o.open()
    p.wait_for_selector('[data-testid="compare-head"]')
    assert p.locator('[data-testid="report-badge"]').count() == 1
    assert "rank0" in p.inner_text('[data-testid="compare-base"]')
    assert "rank1" in p.inner_text('[data-testid="compare-new"]')
    # the regressions the page lists are compare.json's real ones, in its order
    real = [r for r in written["regressions"] if r["real"] and (r["delta_ns"] or 0) > 0][:REGRESSIONS_SHOWN]
    shown = p.locator('[data-testid="compare-regressions"] li')
    listed = [(li.get_attribute("data-category"), li.get_attribute("data-table")) for li in shown.all()]
    assert listed == [(r["category"], r["table"]) for r in real]
    if real and real[0]["table"] != "step_breakdown":
        assert real[0]["item"] in shown.first.inner_text()
    assert o.refused == [], o.refused
    assert o.errors == [], o.errors
