"""The API behind the single-device polish: FP/BP points chosen by the user, and the timeline's
step marks, readable track labels and rank filter -- on real Kineto traces.

The FP/BP oracle is the step-trace analysis called directly on the same trace with the same
points: the server must give its numbers (it runs that analysis, it has no copy of the rules).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from _server_helpers import NCCL, TWO_RANKS, copy_into, wait_ready
from conftest import kineto_file, raw_events, read_real
from perfsight.analysis.step_trace import step_trace
from perfsight.server import create_app

RUN = "gpu/nccl_data.json.gz"
JOB = "job"


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[TestClient, Path, Path]]:
    base = tmp_path_factory.mktemp("base")
    cache = tmp_path_factory.mktemp("cache")
    copy_into(base, kineto_file(NCCL), RUN)
    for name in TWO_RANKS:
        copy_into(base, kineto_file(name), f"{JOB}/{Path(name).name}")
    with TestClient(create_app(base, cache_dir=cache)) as client:
        for run in (RUN, JOB):
            assert wait_ready(client, run)["status"] == "ready"
        yield client, base, cache


def get(client: TestClient, path: str, **params: Any) -> Any:
    response = client.get(path, params=params)
    assert response.status_code == 200, response.text
    return response.json()


def test_chosen_points_give_the_analysis_own_step_trace_saved_once_outside_the_served_folder(
    served: tuple[TestClient, Path, Path],
) -> None:
    client, base, cache = served
    auto = get(client, "/api/run/step-trace", run=RUN)
    n = len(auto["steps"])
    names = [c["name"] for c in auto["point_candidates"] if c["steps"] == n]
    fp = next(c for c in names if c not in auto["fp_ops"] and not c.startswith("autograd::"))
    bp = next(
        c for c in names if c.startswith("autograd::engine::evaluate_function") and c not in auto["bp_ops"]
    )
    expected = step_trace(read_real(kineto_file(NCCL)), fp_point=fp, bp_point=bp).to_pylist()
    before = sorted(p.relative_to(base) for p in base.rglob("*"))

    got = get(client, "/api/run/step-trace", run=RUN, fp_point=fp, bp_point=bp)
    assert got["fp_point"] == fp and got["bp_point"] == bp and got["point_warnings"] == []
    phases = ("iteration_interval_ns", "fp_bp_ns", "tail_ns", "fp_op", "bp_op")
    assert [{k: s[k] for k in ("step", *phases)} for s in got["steps"]] == [
        {k: r[k] for k in ("step", *phases)} for r in expected
    ]
    assert [s["fp_bp_ns"] for s in got["steps"]] != [s["fp_bp_ns"] for s in auto["steps"]]
    # the other columns (the overlap analysis) do not depend on the points
    assert [s["computing_ns"] for s in got["steps"]] == [s["computing_ns"] for s in auto["steps"]]

    saved = list(cache.rglob("step_trace_rank*_*.parquet"))
    assert len(saved) == 1  # one file for this choice, in the server's cache
    stamp = saved[0].stat().st_mtime_ns
    again = get(
        client, "/api/run/step-trace", run=RUN, fp_point=fp, bp_point=bp, step=got["steps"][0]["step"]
    )
    assert again["steps"] == got["steps"] and again["intervals"]
    assert saved[0].stat().st_mtime_ns == stamp and len(list(cache.rglob("step_trace_rank*_*.parquet"))) == 1
    assert sorted(p.relative_to(base) for p in base.rglob("*")) == before  # nothing written where served

    # no point named: the cached analysis, as before
    assert get(client, "/api/run/step-trace", run=RUN)["steps"] == auto["steps"]


def test_a_point_no_step_holds_is_named_in_a_warning(served: tuple[TestClient, Path, Path]) -> None:
    client, _, _ = served
    got = get(client, "/api/run/step-trace", run=RUN, bp_point="no::such_op")
    auto = get(client, "/api/run/step-trace", run=RUN)
    assert len(got["point_warnings"]) == 1 and "no::such_op" in got["point_warnings"][0]
    assert [s["fp_bp_ns"] for s in got["steps"]] == [s["fp_bp_ns"] for s in auto["steps"]]


def test_candidate_points_are_host_ops_of_the_steps_in_the_order_they_start(
    served: tuple[TestClient, Path, Path],
) -> None:
    client, _, _ = served
    got = get(client, "/api/run/step-trace", run=RUN)
    candidates = got["point_candidates"]
    offsets = [c["offset_ns"] for c in candidates]
    assert offsets == sorted(offsets)
    names = {c["name"] for c in candidates}
    assert set(got["fp_ops"]) <= names and set(got["bp_ops"]) <= names  # the detected ones are offered
    assert all(1 <= c["steps"] <= len(got["steps"]) and c["count"] >= c["steps"] for c in candidates)
    host_ops = {e["name"] for e in raw_events(kineto_file(NCCL)) if e.get("cat") == "cpu_op"}
    assert names <= host_ops  # what Kineto recorded as host operators, nothing else


def test_timeline_tracks_carry_step_marks_labels_and_the_ranks_filter_the_window(
    served: tuple[TestClient, Path, Path],
) -> None:
    client, _, _ = served
    info = get(client, "/api/run/timeline/tracks", run=JOB)
    for rank in info["ranks"]:
        steps = get(client, "/api/run/step-trace", run=JOB, rank=rank)["steps"]
        marks = [m for m in info["steps"] if m["rank"] == rank]
        assert [(m["step"], m["start_ns"], m["end_ns"]) for m in marks] == [
            (s["step"], s["start_ns"], s["end_ns"]) for s in steps
        ]
    assert info["steps_span"] == {
        "start_ns": min(m["start_ns"] for m in info["steps"]),
        "end_ns": max(m["end_ns"] for m in info["steps"]),
    }
    for track in info["tracks"]:
        assert track["label"].startswith(f"rank {track['rank']} · ") and track["label"].endswith(
            track["name"]
        )

    window = dict(run=JOB, start_ns=0, end_ns=info["end_ns"], width_px=500)
    both = {t["rank"] for t in get(client, "/api/run/timeline/window", **window)["tracks"]}
    assert both == {0, 1}
    only = get(client, "/api/run/timeline/window", **window, ranks="1")["tracks"]
    assert only and {t["rank"] for t in only} == {1}
    flows = get(client, "/api/run/timeline/flows", run=JOB, start_ns=0, end_ns=info["end_ns"], ranks="1")
    assert flows["flows"] and {f["rank"] for f in flows["flows"]} == {1}
    hits = get(client, "/api/run/timeline/search", run=JOB, q="ProfilerStep", ranks="0")["hits"]
    assert hits and {h["rank"] for h in hits} == {0}
    bad = client.get("/api/run/timeline/window", params={**window, "ranks": "one"})
    assert bad.status_code == 400 and "ranks" in bad.json()["detail"]
