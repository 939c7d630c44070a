"""The single-device pages' polish in a real Chromium (issue 16): where the timeline opens, what its
tracks are called, its step boundaries and its rank filter; how a CPU-only run differs from a
device run; and the FP/BP points a user picks on the step-trace page.

The runs are real: the shared Kineto traces (a CPU-only one, an A100 one, a two-rank job) and
`make demo`'s gloo DDP and 2-stage pipeline jobs (tests/_jobs.py).  Expected values come from the
JSON API the page is built from, from the raw trace files, or from calling the analysis directly
-- never from strings the UI planted.
"""

# ruff: noqa: F811 - the fixtures imported from _ui are redefined as test parameters, as pytest intends
from __future__ import annotations

import gzip
import json
import shutil
import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from _jobs import DDP_JOB, PP_JOB, trained_jobs
from _ui import (
    GUTTER_W,
    NCCL_TRACE,
    RULER_H,
    TWO_RANKS,
    Server,
    Watched,
    fmt_ms,
    need_browser,
    own_server_browser,  # noqa: F401 - fixture
    watched_page,
)
from shared_data import KINETO, require

CANVAS = '[data-testid="timeline-canvas"]'
CPU_ONLY = KINETO / "cpu_only" / "rank-34.Jul_15_10_52_41.1074.pt.trace.json.gz"
CPU_RUN = f"cpu/{CPU_ONLY.name}"
GPU_RUN = f"gpu/{NCCL_TRACE.name}"
JOB_RUN = "job"  # the two-rank A100 job (Kineto traces, one per rank)
STEP_MARK_RGB = (0x8C, 0x96, 0xA8)  # web/src/palette.ts STAGE_COLORS.step, the colour of a step mark


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    need_browser()
    for need in (CPU_ONLY, NCCL_TRACE, *TWO_RANKS):
        require(need)
    base = tmp_path_factory.mktemp("ui-single") / "runs"
    for folder, traces in (("cpu", [CPU_ONLY]), ("gpu", [NCCL_TRACE]), (JOB_RUN, TWO_RANKS)):
        (base / folder).mkdir(parents=True)
        for trace in traces:
            shutil.copyfile(trace, base / folder / trace.name)
    jobs = trained_jobs(tmp_path_factory)
    for name in (DDP_JOB, PP_JOB):
        shutil.copytree(jobs / name, base / name, symlinks=True)
    server = Server(base)
    try:
        for run in (CPU_RUN, GPU_RUN, JOB_RUN, DDP_JOB, PP_JOB):
            server.wait_ready(run, timeout_s=300)
        yield server
    finally:
        server.stop()


@pytest.fixture
def page(own_server_browser: Any, server: Server) -> Iterator[Watched]:
    with watched_page(own_server_browser) as watched:
        yield watched


def open_timeline(watched: Watched, server: Server, run: str, **params: Any) -> Any:
    p = watched.page
    p.goto(server.page_url("timeline", run, **params))
    p.wait_for_selector(f'{CANVAS}[data-loaded="true"]')
    return p


def visible(p: Any) -> tuple[int, int]:
    attrs = p.eval_on_selector(CANVAS, "c => [c.dataset.startNs, c.dataset.endNs]")
    return int(attrs[0]), int(attrs[1])


def track_labels(p: Any) -> list[str]:
    return p.locator('[data-testid="track-list"] li').all_text_contents()


def window_ranks(p: Any) -> list[str | None]:
    """The ?ranks= of every /timeline/window request the page made (None: all ranks)."""
    found = []
    for url in p.evaluate("performance.getEntriesByType('resource').map(e => e.name)"):
        parsed = urllib.parse.urlparse(url)
        if parsed.path.endswith("/api/run/timeline/window"):
            found.append(urllib.parse.parse_qs(parsed.query).get("ranks", [None])[0])
    return found


def thread_names(trace: Path) -> dict[int, str]:
    """tid -> thread name, from the raw trace's ``thread_name`` metadata events (the oracle)."""
    with gzip.open(trace, "rt", encoding="utf-8") as handle:
        events = json.load(handle)["traceEvents"]
    return {
        int(e["tid"]): e["args"]["name"]
        for e in events
        if e.get("ph") == "M" and e.get("name") == "thread_name" and isinstance(e.get("tid"), int)
    }


def step_cells(p: Any) -> list[list[str]]:
    """The cells of the step-trace page's table of steps, row by row."""
    rows = p.locator('[data-testid="step-table"] tbody tr')
    return [r.locator("td").all_text_contents() for r in rows.all()]


# ------------------------------------------------------------------------------------------ timeline
@pytest.mark.parametrize("run", [DDP_JOB, JOB_RUN, CPU_RUN])
def test_the_timeline_opens_on_the_profiled_steps_not_on_the_whole_profiler_event(
    page: Watched, server: Server, run: str
) -> None:
    info = server.get("run/timeline/tracks", run=run)
    rank = info["ranks"][0]
    steps = server.get("run/step-trace", run=run, rank=rank)["steps"]
    first, last = min(s["start_ns"] for s in steps), max(s["end_ns"] for s in steps)
    # the premise: a profiler-wide event makes the whole trace several times longer than the steps
    assert info["end_ns"] > 2.5 * (last - first)
    p = open_timeline(page, server, run)
    start, end = visible(p)
    assert first <= start < end <= last
    assert end - start >= 0.99 * (last - first)  # the steps fill the view

    p.click('[data-testid="whole-trace"]')
    p.wait_for_function(f"() => document.querySelector('{CANVAS}').dataset.startNs === '0'")
    assert visible(p) == (0, info["end_ns"])
    p.click('[data-testid="steps-view"]')  # "Reset view" goes back to the steps
    p.wait_for_function(f"() => document.querySelector('{CANVAS}').dataset.startNs === '{start}'")
    assert visible(p) == (start, end)
    assert not page.errors


def test_tracks_are_named_by_rank_thread_name_and_stream(page: Watched, server: Server) -> None:
    p = open_timeline(page, server, JOB_RUN, rank=1)
    labels = track_labels(p)
    tracks = [t for t in server.get("run/timeline/tracks", run=JOB_RUN)["tracks"] if t["rank"] == 1]
    assert len(labels) == len(tracks) and all(label.startswith("rank 1 · ") for label in labels)
    names = thread_names(TWO_RANKS[1])
    for label, track in zip(labels, tracks, strict=True):
        if track["is_device"]:
            assert label.endswith(f"stream {track['stream']}"), label
            assert f"device {track['device_index']}" in label
        elif track["tid"] in names:  # the thread's own name, from the trace's metadata
            assert names[track["tid"]] in label and str(track["tid"]) in label, label
    assert any(names[t["tid"]] in label for t, label in zip(tracks, labels, strict=True) if t["tid"] in names)
    assert not page.errors


def test_a_pipeline_jobs_tracks_name_each_ranks_stage(page: Watched, server: Server) -> None:
    # which stage each rank is in: the cluster analysis's, as the job overview states it
    stages = {
        rank: s["stage"] for s in server.get("job/overview", run=PP_JOB)["stages"] for rank in s["ranks"]
    }
    assert len(set(stages.values())) == 2  # examples/train_pp.py --stages 2
    for rank, stage in stages.items():
        p = open_timeline(page, server, PP_JOB, rank=rank)
        labels = track_labels(p)
        assert labels and all(label.startswith(f"rank {rank} · stage {stage} · ") for label in labels)
    assert not page.errors


def test_step_boundaries_are_marked_on_the_timeline(page: Watched, server: Server) -> None:
    p = open_timeline(page, server, DDP_JOB)
    steps = server.get("run/step-trace", run=DDP_JOB, rank=0)["steps"]
    marks = p.locator('[data-testid="step-marks"] li')
    got = [(int(m.get_attribute("data-step")), int(m.get_attribute("data-start-ns"))) for m in marks.all()]
    assert got == [(s["step"], s["start_ns"]) for s in steps]
    # each step's label is painted in the ruler at its start, in the step colour
    start, end = visible(p)
    width = p.eval_on_selector(CANVAS, "c => c.clientWidth") - GUTTER_W
    for s in steps:
        x = GUTTER_W + (s["start_ns"] - start) / (end - start) * width
        pixel = p.eval_on_selector(
            CANVAS,
            "(c, [x, y]) => { const r = window.devicePixelRatio || 1; const g = c.getContext('2d');"
            " return Array.from(g.getImageData(Math.round(x * r), Math.round(y * r), 1, 1).data); }",
            [x + 1.5, RULER_H - 10],
        )
        assert tuple(pixel[:3]) == STEP_MARK_RGB, (s["step"], pixel)
    assert not page.errors


def test_the_rank_filter_chooses_the_ranks_the_timeline_shows(page: Watched, server: Server) -> None:
    tracks = server.get("run/timeline/tracks", run=JOB_RUN)["tracks"]
    per_rank = {r: sum(t["rank"] == r for t in tracks) for r in (0, 1)}
    p = open_timeline(page, server, JOB_RUN)  # the rank selector's rank (0) alone
    assert {label.split(" · ")[0] for label in track_labels(p)} == {"rank 0"}
    assert len(track_labels(p)) == per_rank[0]
    assert window_ranks(p)[-1] == "0"  # the server is asked for that rank only

    p.click('[data-testid="rank-filter-summary"]')
    p.check('[data-testid="rank-filter"] input[data-rank="1"]')
    p.wait_for_function(f"() => document.querySelector('{CANVAS}').dataset.ranks === '0,1'")
    p.wait_for_selector(f'{CANVAS}[data-loaded="true"]')
    assert len(track_labels(p)) == per_rank[0] + per_rank[1]
    assert window_ranks(p)[-1] is None  # every rank: no filter
    assert "ranks=0%2C1" in p.url or "ranks=0,1" in p.url

    p.uncheck('[data-testid="rank-filter"] input[data-rank="0"]')
    p.wait_for_function(f"() => document.querySelector('{CANVAS}').dataset.ranks === '1'")
    assert {label.split(" · ")[0] for label in track_labels(p)} == {"rank 1"}

    # the header's rank selector filters the timeline too
    p.goto(server.page_url("timeline", JOB_RUN))
    p.wait_for_selector(f'{CANVAS}[data-loaded="true"]')
    p.select_option('[data-testid="rank-select"]', "1")
    p.wait_for_function(f"() => document.querySelector('{CANVAS}')?.dataset.ranks === '1'")
    assert {label.split(" · ")[0] for label in track_labels(p)} == {"rank 1"}
    assert not page.errors


# ------------------------------------------------------------------------------------------ colours
def test_each_stage_and_overlap_category_has_one_colour_on_every_chart(page: Watched, server: Server) -> None:
    """Iteration gap, forward+backward, tail, computing, communication... keep their colour from chart
    to chart (as drawn: each chart states its series' colours), and no two of them share one."""
    p = page.page
    charts = [
        ("overview", GPU_RUN, "chart-step-breakdown"),
        ("steps", GPU_RUN, "chart-step-curves"),
        ("job-steps", DDP_JOB, "chart-job-steps"),
        ("job", DDP_JOB, "chart-rank-time"),
        ("job-steps", PP_JOB, "chart-job-steps"),
    ]
    colour_of: dict[str, set[str]] = {}
    for name, run, chart in charts:
        p.goto(server.page_url(name, run))
        p.wait_for_selector(f'[data-testid="{chart}"] canvas')
        for series, colour in json.loads(p.get_attribute(f'[data-testid="{chart}"]', "data-series-colors")):
            colour_of.setdefault(series, set()).add(colour.lower())
    assert {"Iteration gap", "Forward + backward", "Tail"} <= set(colour_of)
    assert all(len(colours) == 1 for colours in colour_of.values()), colour_of
    # and no two meanings share a colour (the tail was computing's green: it is mostly not computing)
    assert len({c for colours in colour_of.values() for c in colours}) == len(colour_of), colour_of
    assert not page.errors


# ------------------------------------------------------------------------------------------ CPU only
@pytest.mark.parametrize("run", [CPU_RUN, DDP_JOB])  # the shared CPU trace; make demo's gloo DDP job on CPU
def test_a_cpu_only_run_says_so_once_and_hides_its_empty_device_widgets(
    page: Watched, server: Server, run: str
) -> None:
    with gzip.open(CPU_ONLY, "rt", encoding="utf-8") as handle:  # the premise, from the raw file
        cats = {e.get("cat") for e in json.load(handle)["traceEvents"]}
    assert not cats & {"kernel", "gpu_memcpy", "gpu_memset", "cuda_runtime"}
    p = page.page
    for name, ready in (
        ("overview", "stat-tracks"),
        ("operators", "operator-type-table"),
        ("memory", "no-device"),
    ):
        p.goto(server.page_url(name, run))
        p.wait_for_selector(f'[data-testid="{ready}"]')
        assert p.locator('[data-testid="no-device"]').count() == 1, name
        assert "no device activity" in p.inner_text('[data-testid="no-device"]')
        if name == "overview":
            assert "device" not in p.inner_text('[data-testid="stat-tracks"]')
        if name == "operators":
            p.wait_for_selector('[data-testid="operator-type-table"] tbody tr td')
            headers = p.locator("table th").all_text_contents()
            assert headers and not any("Device" in h for h in headers)
            assert p.locator('[data-testid="card-top-types"] button', has_text="device time").count() == 0
        if name == "memory":  # host memory may be shown, but no device allocator's "Peak reserved 0 B"
            devices = server.get("run/memory", run=run)["devices"]
            selector = '[data-testid="peak-allocated-0"]' if devices else '[data-testid="memory-none"]'
            p.wait_for_selector(selector)
            assert p.locator('[data-testid^="peak-reserved-"]').count() == 0
            assert "Reserved" not in p.inner_text("main")
    assert not page.errors


def test_a_device_run_keeps_its_device_widgets(page: Watched, server: Server) -> None:
    p = page.page
    p.goto(server.page_url("overview", GPU_RUN))
    p.wait_for_selector('[data-testid="stat-tracks"]')
    device_tracks = server.get("run/overview", run=GPU_RUN)["timeline"]["device_tracks"]
    assert device_tracks > 0
    assert f"{device_tracks} device" in p.inner_text('[data-testid="stat-tracks"]')
    assert p.locator('[data-testid="no-device"]').count() == 0
    p.goto(server.page_url("operators", GPU_RUN))
    p.wait_for_selector('[data-testid="operator-type-table"] tbody tr td')
    headers = p.locator('[data-testid="operator-type-table"] th').all_text_contents()
    assert any(h.startswith("Device total (ms)") for h in headers)
    assert p.locator('[data-testid="card-top-types"] button', has_text="device time").count() == 1
    assert p.locator('[data-testid="no-device"]').count() == 0
    assert not page.errors


# ------------------------------------------------------------------------------------------ FP / BP
def test_picked_fp_and_bp_ops_recompute_the_step_trace_as_the_analysis_does(
    page: Watched, server: Server
) -> None:
    from perfsight.analysis.step_trace import step_trace
    from perfsight.ingest import read_trace

    auto = server.get("run/step-trace", run=GPU_RUN)
    n = len(auto["steps"])
    everywhere = [c["name"] for c in auto["point_candidates"] if c["steps"] == n]
    fp = next(c for c in everywhere if c not in auto["fp_ops"] and not c.startswith("autograd::"))
    bp = next(
        c
        for c in everywhere
        if c.startswith("autograd::engine::evaluate_function") and c not in auto["bp_ops"]
    )
    expected = step_trace(read_trace(NCCL_TRACE), fp_point=fp, bp_point=bp).to_pylist()
    assert [r["fp_bp_ns"] for r in expected] != [s["fp_bp_ns"] for s in auto["steps"]]  # it matters

    p = page.page
    p.goto(server.page_url("steps", GPU_RUN))
    p.wait_for_selector('[data-testid="point-form"]')
    p.fill('[data-testid="fp-point"]', fp)
    p.fill('[data-testid="bp-point"]', bp)
    p.click('[data-testid="apply-points"]')
    p.wait_for_url("**fp_point=**")
    p.wait_for_selector('[data-testid="reset-points"]')
    cells = step_cells(p)
    assert [c[0] for c in cells] == [str(r["step"]) for r in expected]
    assert [c[3] for c in cells] == [fmt_ms(r["fp_bp_ns"]) for r in expected]  # Fwd+bwd (ms)
    assert [c[2] for c in cells] == [fmt_ms(r["iteration_interval_ns"]) for r in expected]
    assert [c[5] for c in cells] == [fp] * n and [c[6] for c in cells] == [bp] * n
    assert p.input_value('[data-testid="fp-point"]') == fp

    # automatic detection again: the cached analysis's numbers
    p.click('[data-testid="reset-points"]')
    p.wait_for_selector('[data-testid="point-form"]:not(:has([data-testid="reset-points"]))')
    cells = step_cells(p)
    assert [c[3] for c in cells] == [fmt_ms(s["fp_bp_ns"]) for s in auto["steps"]]
    assert not page.errors


def test_a_misspelt_point_is_named_and_its_steps_fall_back_to_automatic_detection(
    page: Watched, server: Server
) -> None:
    auto = server.get("run/step-trace", run=GPU_RUN)
    p = page.page
    p.goto(server.page_url("steps", GPU_RUN, fp_point="aten::no_such_op"))
    p.wait_for_selector('[data-testid="point-warning"]')
    text = p.inner_text('[data-testid="point-warning"]')
    assert "aten::no_such_op" in text and "automatic detection" in text
    cells = step_cells(p)
    assert [c[3] for c in cells] == [fmt_ms(s["fp_bp_ns"]) for s in auto["steps"]]
    assert not page.errors
