"""The web API on real traces: run discovery, background analysis, pages, timeline LOD and search.

Oracles are the raw trace files read with the standard library (``raw_events_exact``), not our
reader: step durations, op counts and event times must agree with what Kineto wrote.
"""

from __future__ import annotations

import collections
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from _server_helpers import NCCL, TWO_RANKS, copy_into, wait_ready
from conftest import kineto_file, ns_exact, raw_events_exact
from perfsight.server import create_app, pages

RUN = "gpu/nccl_data.json.gz"
JOB = "job"


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("cache")


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory, cache_dir: Path) -> Iterator[tuple[TestClient, Path]]:
    base = tmp_path_factory.mktemp("base")
    copy_into(base, kineto_file(NCCL), RUN)
    for name in TWO_RANKS:
        copy_into(base, kineto_file(name), f"{JOB}/{Path(name).name}")
    app = create_app(base, cache_dir=cache_dir)
    with TestClient(app) as client:
        yield client, base


@pytest.fixture(scope="module")
def raw() -> list[dict[str, Any]]:
    return [e for e in raw_events_exact(kineto_file(NCCL)) if e.get("ph") == "X"]


@pytest.fixture(scope="module")
def ready(served: tuple[TestClient, Path]) -> TestClient:
    client, _ = served
    status = wait_ready(client, RUN)
    assert status["status"] == "ready", status
    return client


def get(client: TestClient, path: str, **params: Any) -> Any:
    response = client.get(path, params={"run": RUN, **params})
    assert response.status_code == 200, response.text
    return response.json()


def test_run_list_shows_single_trace_and_two_rank_job_before_analysis(
    served: tuple[TestClient, Path],
) -> None:
    client, _ = served
    runs = {r["id"]: r for r in client.get("/api/runs").json()["runs"]}
    assert set(runs) == {RUN, JOB}
    assert runs[RUN]["kind"] == "trace" and runs[RUN]["ranks"] == [0]
    assert runs[JOB]["kind"] == "job" and runs[JOB]["ranks"] == [0, 1]
    assert runs[JOB]["size_bytes"] == sum(kineto_file(n).stat().st_size for n in TWO_RANKS)
    assert all(r["date"].endswith("+00:00") for r in runs.values())


def test_opening_a_run_analyses_it_in_the_background(
    served: tuple[TestClient, Path], cache_dir: Path
) -> None:
    client, base = served
    early = client.get("/api/run/overview", params={"run": JOB})
    if early.status_code == 409:  # not analysed yet: the body says how far it is
        assert early.json()["status"]["status"] in ("queued", "analysing")
    status = wait_ready(client, JOB)
    assert status["status"] == "ready", status
    assert status["ranks"] == [0, 1] and status["progress"] == 1.0
    # the outputs `perfsight analyse` would write, in the server's cache: nothing beside the input
    assert not (base / JOB / "perfsight_output").exists()
    assert len(list(cache_dir.glob("*/job-*/rank1/PROFILER_OUTPUT/trace_view.json"))) == 1
    listed = {r["id"]: r for r in client.get("/api/runs").json()["runs"]}[JOB]
    assert listed["status"] == "ready" and listed["steps"] == 2
    rank1 = client.get("/api/run/overview", params={"run": JOB, "rank": 1}).json()
    assert rank1["rank"] == 1 and rank1["ranks"] == [0, 1]
    tracks = client.get("/api/run/timeline/tracks", params={"run": JOB}).json()
    assert {t["rank"] for t in tracks["tracks"]} == {0, 1}
    assert client.get("/api/run/overview", params={"run": JOB, "rank": 5}).status_code == 404


def test_overview_steps_and_shares_match_the_raw_trace(ready: TestClient, raw: list[dict[str, Any]]) -> None:
    overview = get(ready, "/api/run/overview")
    steps = {
        int(e["name"].split("#")[1]): ns_exact(e["dur"]) for e in raw if e["name"].startswith("ProfilerStep#")
    }
    assert {s["step"]: s["duration_ns"] for s in overview["steps"]} == steps
    for s in overview["steps"]:
        assert s["iteration_interval_ns"] + s["fp_bp_ns"] + s["tail_ns"] == s["duration_ns"]
    shares = overview["shares"]
    parts = ("computing", "communication_not_overlapped", "free", "preparing")
    assert sum(shares[p] for p in parts) == pytest.approx(1.0, abs=1e-6)
    assert 0 < shares["communication_overlapped"] < 1
    assert overview["top_by"] == "device_total_ns"  # a GPU trace: ranked by device time
    device = [t["device_total_ns"] for t in overview["operator_types"]]
    assert device == sorted(device, reverse=True) and len(device) == 20
    assert overview["device"] and "A100" in overview["device"]
    by_kind = {k["kind"]: k["count"] for k in overview["timeline"]["by_kind"]}
    assert by_kind["kernel"] + by_kind["communication"] >= sum(1 for e in raw if e["cat"] == "kernel")


def test_a_fresh_server_serves_the_overview_the_analysis_saved_and_only_while_it_matches(
    served: tuple[TestClient, Path], ready: TestClient, cache_dir: Path
) -> None:
    _, base = served
    first = get(ready, "/api/run/overview")
    saved = list(cache_dir.glob("*/nccl_data-*/saved/overview_rank*.idx"))
    assert len(saved) == 1  # written by the background analysis, in the server's cache
    key, _, body = saved[0].read_bytes().partition(b"\n")
    pages.clear_memo()
    with TestClient(create_app(base, cache_dir=cache_dir)) as fresh:
        assert get(fresh, "/api/run/overview") == first
    saved[0].write_bytes(key + b"\n" + body.replace(b'"rank":0', b'"rank":7'))
    pages.clear_memo()
    with TestClient(create_app(base, cache_dir=cache_dir)) as fresh:  # it is read, not recomputed
        assert get(fresh, "/api/run/overview")["rank"] == 7
    # a saved body whose key no longer matches (another origin, other code) is not served
    stale = key.replace(b'"origin":', b'"origin":1') + b"\n" + body.replace(b'"rank":0', b'"rank":7')
    saved[0].write_bytes(stale)
    pages.clear_memo()
    with TestClient(create_app(base, cache_dir=cache_dir)) as fresh:
        assert get(fresh, "/api/run/overview") == first
    assert saved[0].read_bytes().partition(b"\n")[0] == key  # and it was saved again


def test_operator_types_sort_and_page_like_one_sorted_list(
    ready: TestClient, raw: list[dict[str, Any]]
) -> None:
    full = get(ready, "/api/run/operator-types", sort="count", order="desc", limit=1000)
    # host operators: cpu_op events, plus the host collectives Kineto records as annotations
    host_ops = [
        e for e in raw if e["cat"] == "cpu_op" or e["cat"] == "user_annotation" and "nccl:" in e["name"]
    ]
    counts = collections.Counter(e["name"] for e in host_ops)
    assert full["total"] == len(counts)
    assert {r["name"]: r["count"] for r in full["rows"]} == dict(counts)
    assert [r["count"] for r in full["rows"]] == sorted(counts.values(), reverse=True)
    pages = [
        get(ready, "/api/run/operator-types", sort="count", offset=o, limit=7)["rows"] for o in (0, 7, 14)
    ]
    assert [r["name"] for page in pages for r in page] == [r["name"] for r in full["rows"][:21]]
    ascending = get(ready, "/api/run/operator-types", sort="name", order="asc", limit=1000)["rows"]
    assert [r["name"] for r in ascending] == sorted(counts)


def test_operator_drill_down_and_fuzzy_search(ready: TestClient, raw: list[dict[str, Any]]) -> None:
    raw_mm = [e for e in raw if e["cat"] == "cpu_op" and e["name"] == "aten::convolution_backward"]
    page = get(ready, "/api/run/operators", name="aten::convolution_backward", sort="start_ns", order="asc")
    assert page["total"] == len(raw_mm) > 0
    first = min(raw_mm, key=lambda e: e["ts"])
    assert page["rows"][0]["dur_ns"] == ns_exact(first["dur"])
    assert page["rows"][0]["start_ns"] == ns_exact(first["ts"]) - min(ns_exact(e["ts"]) for e in raw)
    fuzzy = get(ready, "/api/run/operator-types", q="BACKWARD conv", limit=1000)["rows"]
    assert "aten::convolution_backward" in {r["name"] for r in fuzzy}
    assert all("conv" in r["name"].lower() and "backward" in r["name"].lower() for r in fuzzy)
    assert get(ready, "/api/run/operator-types", q="%")["total"] == 0  # no SQL wildcards


def test_kernels_list_every_device_activity(ready: TestClient, raw: list[dict[str, Any]]) -> None:
    device = [e for e in raw if e["cat"] in ("kernel", "gpu_memcpy", "gpu_memset")]
    page = get(ready, "/api/run/kernels", sort="dur_ns", order="desc", limit=5)
    assert page["total"] == len(device)
    assert page["rows"][0]["dur_ns"] == max(ns_exact(e["dur"]) for e in device)
    nccl = get(ready, "/api/run/kernels", q="allreduce NCCL", limit=1000)
    assert nccl["total"] == sum(1 for e in device if "ncclKernel_AllReduce" in e["name"]) > 0
    types = get(ready, "/api/run/kernel-types", limit=1000)
    assert sum(r["count"] for r in types["rows"]) == len(device)


def test_step_trace_gives_stages_average_and_step_intervals(ready: TestClient) -> None:
    trace = get(ready, "/api/run/step-trace")
    steps = trace["steps"]
    assert trace["average"]["duration_ns"] == pytest.approx(sum(s["duration_ns"] for s in steps) / len(steps))
    assert trace["fp_ops"] and trace["bp_ops"]
    one = get(ready, "/api/run/step-trace", step=steps[1]["step"])
    lanes = {i["lane"] for i in one["intervals"]}
    assert {"Computing", "Communication"} <= lanes
    assert all(
        steps[1]["start_ns"] <= i["start_ns"] < i["end_ns"] <= steps[1]["end_ns"] for i in one["intervals"]
    )


def test_timeline_window_keeps_long_events_and_merges_sub_pixel_ones(
    ready: TestClient, raw: list[dict[str, Any]]
) -> None:
    tracks = get(ready, "/api/run/timeline/tracks")
    origin, end = tracks["origin_ns"], tracks["end_ns"]
    assert origin == min(ns_exact(e["ts"]) for e in raw)
    width = 800
    window = get(ready, "/api/run/timeline/window", start_ns=0, end_ns=end, width_px=width)
    px = window["ns_per_px"]
    singles: set[tuple[str, int, int]] = set()
    merged = total = 0
    for track in window["tracks"]:
        for lane in track["lanes"]:
            assert len(lane["id"]) <= 2 * width + 2
            total += sum(lane["count"])
            merged += sum(1 for c in lane["count"] if c > 1)
            for name, start, dur, count in zip(
                lane["name"], lane["start_ns"], lane["dur_ns"], lane["count"], strict=True
            ):
                if count == 1:
                    singles.add((window["names"][name], start + origin, dur))
    assert total == tracks_events(tracks)  # merging conserves events: each counted exactly once
    assert merged > 0 and window["events"] < total
    long = {(e["name"], ns_exact(e["ts"]), ns_exact(e["dur"])) for e in raw if ns_exact(e["dur"]) >= px}
    assert long and long <= singles  # every event a pixel or longer is there as itself


def tracks_events(tracks: dict[str, Any]) -> int:
    return sum(t["events"] for t in tracks["tracks"])


def test_a_long_event_stays_visible_at_every_zoom(ready: TestClient, raw: list[dict[str, Any]]) -> None:
    origin = get(ready, "/api/run/timeline/tracks")["origin_ns"]
    step = next(e for e in raw if e["name"].startswith("ProfilerStep#"))
    start, dur = ns_exact(step["ts"]) - origin, ns_exact(step["dur"])
    for span in (dur * 4, dur, dur // 100, 10_000, 100):  # from overview down to 100 ns
        lo = start + dur // 2 - span // 2
        window = get(ready, "/api/run/timeline/window", start_ns=lo, end_ns=lo + span, width_px=2000)
        found = [
            (s, d)
            for t in window["tracks"]
            for lane in t["lanes"]
            for n, s, d, c in zip(lane["name"], lane["start_ns"], lane["dur_ns"], lane["count"], strict=True)
            if c == 1 and window["names"][n] == step["name"]
        ]
        assert (start, dur) in found, span


def test_search_finds_an_event_anywhere_and_details_match(
    ready: TestClient, raw: list[dict[str, Any]]
) -> None:
    origin = get(ready, "/api/run/timeline/tracks")["origin_ns"]
    last_kernel = max((e for e in raw if e["cat"] == "kernel"), key=lambda e: e["ts"])
    name = last_kernel["name"]
    found = get(ready, "/api/run/timeline/search", q=name[5:40].upper(), limit=1000)
    assert found["total"] == sum(1 for e in raw if name[5:40].lower() in e["name"].lower())
    hit = next(h for h in found["hits"] if h["start_ns"] + origin == ns_exact(last_kernel["ts"]))
    detail = get(ready, "/api/run/timeline/event", id=hit["id"])
    assert detail["name"] == name and detail["dur_ns"] == ns_exact(last_kernel["dur"])
    assert detail["correlation"] == last_kernel["args"]["correlation"]
    launch = [f for f in detail["flows"] if f["direction"] == "in"]
    assert launch and launch[0]["name"].startswith("cuda")
    starts = [h["start_ns"] for h in get(ready, "/api/run/timeline/search", q="aten::", limit=50)["hits"]]
    assert starts == sorted(starts)


def test_flows_in_a_window_link_launches_to_kernels(ready: TestClient) -> None:
    end = get(ready, "/api/run/timeline/tracks")["end_ns"]
    flows = get(ready, "/api/run/timeline/flows", start_ns=0, end_ns=end // 10, limit=20000)
    assert flows["total"] == len(flows["flows"]) > 0 and not flows["truncated"]
    assert all(f["dst_ts_ns"] >= f["src_ts_ns"] for f in flows["flows"])
    capped = get(ready, "/api/run/timeline/flows", start_ns=0, end_ns=end, limit=5)
    assert capped["truncated"] and len(capped["flows"]) == 5


def test_memory_and_trace_view_download(ready: TestClient) -> None:
    memory = get(ready, "/api/run/memory")
    assert memory["devices"] == []  # this trace recorded no allocator events
    response = ready.get("/api/run/trace-view", params={"run": RUN})
    assert response.status_code == 200
    assert "attachment" in response.headers["content-disposition"]
    assert "traceEvents" in response.json()


def test_unknown_run_and_bad_parameters_are_client_errors(ready: TestClient) -> None:
    assert ready.get("/api/run/overview", params={"run": "nope.json"}).status_code == 404
    assert ready.get("/api/run/operators", params={"run": RUN, "sort": "name; DROP"}).status_code == 422
    bad = {"run": RUN, "start_ns": 10, "end_ns": 5, "width_px": 100}
    assert ready.get("/api/run/timeline/window", params=bad).status_code == 400
    assert ready.get("/api/run/timeline/event", params={"run": RUN, "id": 10**12}).status_code == 404
    assert ready.get("/api/nothing").status_code == 404
