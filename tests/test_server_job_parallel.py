"""The pipeline chart's and the Marey view's API on real jobs (examples/train_pp.py with an
overloaded stage, a gloo DDP job, and a DDP job with one slowed rank).

Expected values come from how the jobs were run (which stage was given four times the layers,
which rank forty extra matrix products) or from the cluster analysis's own step trace file, never
from numbers copied from our output.
"""

from __future__ import annotations

import csv
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from _jobs import DDP_JOB, DDP_RANKS, OVERLOADED_STAGE, PP_JOB, SLOW_RANK, STRAGGLER_JOB, demo_base
from _marey import intervals, name
from _server_helpers import wait_ready
from perfsight.server import create_app

MICRO_BATCHES = 4  # examples/train_pp.py's default


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("parallel-cache")


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("parallel-api") / "demo_output"
    return demo_base(tmp_path_factory, folder, straggler=True)


@pytest.fixture(scope="module")
def client(base: Path, cache: Path) -> TestClient:
    with TestClient(create_app(base, cache_dir=cache)) as client:
        for run in (DDP_JOB, PP_JOB, STRAGGLER_JOB):
            assert wait_ready(client, run)["status"] == "ready"
        yield client


def _get(client: TestClient, path: str, **params: object) -> dict:
    response = client.get(f"/api/{path}", params=params)
    assert response.status_code == 200, response.text
    return response.json()


def _step_trace(cache: Path) -> list[dict[str, str]]:
    found = sorted(cache.rglob("cluster_analysis_output/cluster_step_trace_time.csv"))
    pp = [f for f in found if "straggler" not in str(f) and "/run" not in str(f)]
    rows: list[dict[str, str]] = []
    for path in pp or found:
        with path.open(newline="", encoding="utf-8") as f:
            got = list(csv.DictReader(f))
        if {r["Stage"] for r in got} == {"0", "1"}:
            rows = got
    assert rows, found
    return rows


def test_the_overloaded_stage_paces_the_pipeline_and_the_light_stage_idles(
    client: TestClient, cache: Path
) -> None:
    data = _get(client, "job/pipeline", run=PP_JOB)
    assert data["has_blocks"]
    # which stage paces one step is timed, and a rank descheduled on CI's two busy cores can turn
    # one step around (it did once): the overloaded stage paces most of the profiled steps
    paced = [_get(client, "job/pipeline", run=PP_JOB, step=step)["pacing_stage"] for step in data["steps"]]
    assert len(paced) >= 3 and paced.count(OVERLOADED_STAGE) > len(paced) / 2, (data["steps"], paced)
    by_stage = {s["stage"]: s for s in data["stages"]}
    assert sorted(by_stage) == [0, 1]
    for stage in by_stage.values():  # every micro-batch's forward and backward, on every stage
        blocks = {(b["phase"], b["micro_batch"]) for b in stage["blocks"]}
        assert blocks == {(p, m) for p in ("forward", "backward") for m in range(MICRO_BATCHES)}
        assert all(0 <= b["start_ns"] < b["end_ns"] <= data["span_ns"] for b in stage["blocks"])
        assert all(0 < b["compute_ns"] <= b["end_ns"] - b["start_ns"] for b in stage["blocks"])
    heavy, light = by_stage[OVERLOADED_STAGE], by_stage[1 - OVERLOADED_STAGE]
    # the step's pacing stage is the one whose blocks hold the most compute
    total = {s["stage"]: sum(b["compute_ns"] for b in s["blocks"]) for s in (heavy, light)}
    assert data["pacing_stage"] == max(total, key=total.__getitem__), total
    # the bubble beside it is the cluster step trace's own number for that stage and step
    rows = _step_trace(cache)
    for stage in (heavy, light):
        row = next(
            r for r in rows
            if r["Type"] == "stage" and r["Index"] == str(stage["stage"]) and r["Step"] == data["step"]
        )  # fmt: skip
        assert stage["bubble_ns"] == pytest.approx(float(row["Bubble(us)"]) * 1000, abs=1)
    # Which stage idles longer is not asserted: on CI's two busy cores either rank's process is
    # descheduled for tens of milliseconds now and then, which turned the two stages' idle and
    # bubble times around in one full run (5.8 against 20.4 ms); the compute in the blocks above
    # is what the overload decides.


def test_each_arrow_joins_a_send_to_its_receive_on_the_next_stage(client: TestClient) -> None:
    data = _get(client, "job/pipeline", run=PP_JOB)
    assert data["arrows"]
    p2p = {(p["rank"], p["instance"]): p for s in data["stages"] for p in s["p2p"]}
    for arrow in data["arrows"]:
        assert abs(arrow["src_stage"] - arrow["dst_stage"]) == 1
        send, recv = p2p[(arrow["src_rank"], arrow["instance"])], p2p[(arrow["dst_rank"], arrow["instance"])]
        assert "send" in send["name"] and "recv" in recv["name"]
        assert send["peer"] == arrow["dst_rank"] and recv["peer"] == arrow["src_rank"]


def test_a_step_can_be_chosen_and_an_unknown_one_is_refused(client: TestClient) -> None:
    first = _get(client, "job/pipeline", run=PP_JOB)
    other = first["steps"][0]
    assert _get(client, "job/pipeline", run=PP_JOB, step=other)["step"] == other
    assert _get(client, "job/marey", run=PP_JOB, step=other)["step"] == other
    response = client.get("/api/job/marey", params={"run": PP_JOB, "step": "999"})
    assert response.status_code == 404 and "999" in response.json()["detail"]


def _matched_in_window(path: Path, step: str, w0: int, w1: int) -> int:
    """Matched ops of a step overlapping a window, counted straight from the cluster analysis's
    ``cluster_step_ops.parquet`` (one (stage, key) is one op matched across a stage's devices)."""
    import duckdb

    sql = f"""WITH s AS (SELECT * FROM read_parquet('{path}') WHERE level = 'op' AND step = {int(step)}),
        t AS (SELECT min(start_ns) AS t0 FROM s)
        SELECT count(*) FROM (SELECT stage, key, min(start_ns) - any_value(t0) AS a,
            max(end_ns) - any_value(t0) AS b FROM s, t GROUP BY stage, key) WHERE b >= {w0} AND a <= {w1}"""
    return duckdb.sql(sql).fetchall()[0][0]


def test_sub_pixel_ops_are_merged_into_runs_and_never_dropped(client: TestClient) -> None:
    for px in (50, 1200, 8000):  # a narrow chart merges many, a wide one few
        data = _get(client, "job/marey", run=DDP_JOB, px=px)
        devices = [d["rank"] for d in data["devices"]]
        assert devices == list(range(DDP_RANKS))
        # every matched op of the step is in some item: the items' op counts sum to it
        assert sum(op["ops"] for op in data["ops"]) == data["window_ops"] == data["matched_ops"] > 0
        # and every op of every device: the per-device counts of the items sum to its ops
        for d in data["devices"]:
            assert d["ops"] == sum(
                n for op in data["ops"] for r, _, _, n in intervals(data, op) if r == d["rank"]
            )
        # an item drawn alone is at least a pixel long on some device; a run is made of ops that
        # are not (ops of both kinds in a run are marked "mixed")
        for op in data["ops"]:
            assert (op["ops"] == 1) or (op["key"].startswith("run:") and op["longest_ns"] < data["bin_ns"])
            assert op["category"] in ("compute", "communication", "mixed")
            assert all(
                op["start_ns"] <= s <= e <= min(op["end_ns"], data["span_ns"])
                for _, s, e, _ in intervals(data, op)
            )
    narrow = _get(client, "job/marey", run=DDP_JOB, px=50)
    wide = _get(client, "job/marey", run=DDP_JOB, px=8000)
    assert len(narrow["ops"]) < len(wide["ops"])
    assert any(op["ops"] > 1 for op in narrow["ops"])
    # the all-reduces, long enough to be drawn alone, keep their key: the group's matched instance
    collectives = [op for op in wide["ops"] if op["category"] == "communication" and op["ops"] == 1]
    assert collectives
    assert all(name(op) == "all_reduce" and op["key"].startswith("comm#") for op in collectives)
    assert all([r for r, *_ in intervals(wide, op)] == list(range(DDP_RANKS)) for op in collectives)


def test_a_brushed_window_is_drawn_again_at_a_finer_resolution(client: TestClient, base: Path) -> None:
    full = _get(client, "job/marey", run=DDP_JOB, px=200)
    # brush the run that merges the most ops among those at least a pixel wide, as a user brushes
    # what they see (where the job's time went varies from run to run: a run a few ns wide holds
    # ops that no resolution parts)
    runs = [op for op in full["ops"] if op["ops"] > 1 and op["end_ns"] - op["start_ns"] >= full["bin_ns"]]
    assert runs
    run = max(runs, key=lambda op: op["ops"])
    w0, w1 = run["start_ns"], max(run["end_ns"], run["start_ns"] + 1)
    zoom = _get(client, "job/marey", run=DDP_JOB, px=200, start_ns=w0, end_ns=w1)
    assert (zoom["window_start_ns"], zoom["window_end_ns"]) == (w0, w1)
    assert zoom["bin_ns"] == pytest.approx((w1 - w0) / 200) and zoom["bin_ns"] < full["bin_ns"]
    # every op overlapping the window is there, counted from the analysis's own file
    assert sum(op["ops"] for op in zoom["ops"]) == zoom["window_ops"]
    assert zoom["window_ops"] == _matched_in_window(
        base / "analysis" / "cluster_analysis_output" / "cluster_step_ops.parquet", zoom["step"], w0, w1
    )
    # the brushed run comes apart: its ops are all there, and more items are drawn for the window
    # than the whole step's view drew over it (its first and last ops now lie pixels apart)
    assert zoom["window_ops"] >= run["ops"]
    drawn_before = [op for op in full["ops"] if op["start_ns"] < w1 and op["end_ns"] > w0]
    assert all(op["start_ns"] <= w1 and op["end_ns"] >= w0 for op in zoom["ops"])
    assert len(zoom["ops"]) > len(drawn_before)


def test_the_slowed_rank_computes_longer_and_the_other_waits_in_the_all_reduce(client: TestClient) -> None:
    data = _get(client, "job/marey", run=STRAGGLER_JOB)
    device = {d["rank"]: d for d in data["devices"]}
    other = 1 - SLOW_RANK
    # more compute on the slowed rank (by how much follows the load of CI's two shared cores:
    # 1.85x in one fresh-clone run, over 2x in others)
    assert device[SLOW_RANK]["compute_ns"] > device[other]["compute_ns"]
    # its forty extra `tanh(extra @ extra)` per step (--slow-factor 40: a matmul and a tanh each)
    # are ops the other rank lacks
    assert device[SLOW_RANK]["ops"] - device[other]["ops"] == 2 * 40
    # the slowed rank's bands are the wide ones: over the compute items drawn on each row, its
    # intervals add up longer (its single longest is not asserted: one op of the other rank was
    # descheduled for 8.9 ms on CI's busy cores in one run)
    drawn: dict[int, list[int]] = {0: [], 1: []}
    for op in (op for op in data["ops"] if op["category"] == "compute"):
        for r, s, e, _ in intervals(data, op):
            drawn[r].append(e - s)
    assert sum(drawn[SLOW_RANK]) > sum(drawn[other])
    # the first all-reduce of the step: the punctual rank enters it early and waits for the slow one
    first = min(
        (op for op in data["ops"] if op["category"] == "communication" and op["ops"] == 1),
        key=lambda op: op["start_ns"],
    )
    length = {r: e - s for r, s, e, _ in intervals(data, first)}
    assert length[other] > length[SLOW_RANK]  # the other rank waits in it for the slowed one
    # FLOPs / max per device: the slow rank did the most work; FLOP/s over its compute time known
    assert device[SLOW_RANK]["flops_of_max"] == pytest.approx(1.0)
    assert device[SLOW_RANK]["step_flops"] > device[other]["step_flops"]
    assert max(d["flops_per_s_of_max"] for d in data["devices"]) == pytest.approx(1.0)


def test_each_drawn_device_has_its_flops_and_memory_lines_within_the_window(client: TestClient) -> None:
    data = _get(client, "job/marey", run=STRAGGLER_JOB, px=400)
    assert [d["rank"] for d in data["devices"]] == [0, 1]
    for d in data["devices"]:
        flops, memory = d["flops_line"], d["memory_line"]
        assert flops["bins"] and len(flops["bins"]) == len(flops["values"])
        assert all(0 <= b < data["px"] for b in flops["bins"]) and flops["bins"] == sorted(flops["bins"])
        assert all(v >= 0 for v in flops["values"])
        # FLOP/s per pixel times the pixel's time adds up to the device's FLOPs of the step
        assert sum(flops["values"]) * data["bin_ns"] / 1e9 == pytest.approx(d["step_flops"], rel=1e-6)
        assert max(flops["values"]) <= data["flops_line_max_per_s"] * (1 + 1e-9)
        if memory["bins"]:
            assert all(-1 <= b < data["px"] for b in memory["bins"])
            assert max(memory["values"]) <= data["memory_line_max_bytes"]
    # the slowed rank's extra products: more FLOPs on its line
    line = {d["rank"]: sum(d["flops_line"]["values"]) for d in data["devices"]}
    assert line[SLOW_RANK] > line[1 - SLOW_RANK]


def test_a_stage_folds_to_one_row_and_a_large_job_pages_its_devices(client: TestClient) -> None:
    data = _get(client, "job/marey", run=PP_JOB, unfold="1")
    assert {st["stage"]: st["folded"] for st in data["stages"]} == {0: True, 1: False}
    assert [d["stage"] for d in data["devices"]] == [1]
    # the folded stage's items have their span and no device intervals; nothing is dropped
    stage0 = [op for op in data["ops"] if op["stage"] == 0]
    assert stage0 and all(intervals(data, op) == [] and op["start_ns"] <= op["end_ns"] for op in stage0)
    assert sum(op["ops"] for op in data["ops"]) == data["matched_ops"]
    none = _get(client, "job/marey", run=PP_JOB, unfold="none")
    assert none["devices"] == [] and none["device_rows"] == 0
    assert sum(op["ops"] for op in none["ops"]) == none["matched_ops"]


def test_the_strategy_tree_puts_each_stage_and_replica_with_its_ranks_step_time(
    client: TestClient, cache: Path
) -> None:
    pp = _get(client, "job/strategy", run=PP_JOB)
    assert "pipeline" in pp["modes"]
    assert [[r["rank"] for rep in s["replicas"] for r in rep["ranks"]] for s in pp["stages"]] == [[0], [1]]
    rows = _step_trace(cache)
    for stage in pp["stages"]:
        for rank in (r for rep in stage["replicas"] for r in rep["ranks"]):
            row = next(
                x
                for x in rows
                if x["Type"] == "rank" and x["Index"] == str(rank["rank"]) and x["Step"] == "average"
            )
            assert rank["duration_ns"] == pytest.approx(float(row["Step Time(us)"]) * 1000, abs=1)
    ddp = _get(client, "job/strategy", run=STRAGGLER_JOB)
    assert ddp["modes"] == ["data"]
    (stage,) = ddp["stages"]
    leaves = {r["rank"]: r for rep in stage["replicas"] for r in rep["ranks"]}
    assert sorted(leaves) == [0, 1] and {r["data_group"] for r in leaves.values()} == {0}
    assert leaves[SLOW_RANK]["slow"] and not leaves[1 - SLOW_RANK]["slow"]
