"""The parallel-strategy graph's and the module table's API on real gloo jobs: the tensor-parallel
job (examples/train_tp.py), the DDP job (examples/train_ddp.py) and the 2 x 2 data x pipeline job
(examples/train_dp_pp.py).

What is expected comes from how the jobs are built -- train_tp shards two MLP blocks Megatron-style
(three all-reduces of the tensor-parallel group per step), train_dp_pp runs four micro-batches
through two stages and all-reduces each stage's four parameters on its "dp" group, DDP averages
gradients over all ranks -- never from numbers copied from our output.  Times are only checked to
be there and consistent with each other (CI's busy cores make their ratios flake).
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from _jobs import DDP_JOB, DDP_RANKS, DP_PP_JOB, TP_JOB, demo_base, parallel_jobs
from _server_helpers import wait_ready
from perfsight.server import create_app

TP_ALL_REDUCES = 3  # train_tp: one per block in forward, one in backward
TP_LINEARS = 4  # two blocks, each a column-wise and a row-wise Linear
DP_PP_MICRO_BATCHES = 4  # train_dp_pp's default
DP_PP_PARAMETERS = 4  # per stage: two Linear layers, a weight and a bias each


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> TestClient:
    base = demo_base(tmp_path_factory, tmp_path_factory.mktemp("strategy-api") / "demo_output")
    jobs = parallel_jobs(tmp_path_factory)
    for name in (TP_JOB, DP_PP_JOB):
        shutil.copytree(jobs / name, base / name, symlinks=True)
    cache = tmp_path_factory.mktemp("strategy-cache")
    with TestClient(create_app(base, cache_dir=cache)) as client:
        for run in (DDP_JOB, TP_JOB, DP_PP_JOB):
            assert wait_ready(client, run)["status"] == "ready"
        client.cache_dir = cache  # type: ignore[attr-defined]
        yield client


def _get(client: TestClient, path: str, **params: object) -> dict:
    response = client.get(f"/api/{path}", params=params)
    assert response.status_code == 200, response.text
    return response.json()


def _nodes(graph: dict) -> list[dict]:
    return [n for st in graph["stages"] for n in st["nodes"]]


def test_the_tensor_parallel_job_shows_redistribution_between_sharded_compute(client: TestClient) -> None:
    graph = _get(client, "job/strategy/graph", run=TP_JOB)
    assert [(st["stage"], st["ranks"]) for st in graph["stages"]] == [(0, [0, 1])]
    nodes = graph["stages"][0]["nodes"]
    assert [n["node"] for n in nodes] == list(range(len(nodes)))  # execution order, no gap
    redistributing = [n for n in nodes if n["special"] == "redistribution" and n["category"] == "collective"]
    assert len(redistributing) == TP_ALL_REDUCES
    for n in redistributing:
        assert n["collective"] == "all_reduce"
        assert n["group_ranks"] == [0, 1]
        assert n["bytes"] and n["bytes"] > 0
        before, after = nodes[n["node"] - 1], nodes[n["node"] + 1]  # between compute, as the seed draws it
        assert before["category"] == "compute" and after["category"] == "compute"
    # DTensor's own placement changes are marked too, inside the modules that own them
    assert any(n["name"] == "Redistribute" and n["special"] == "redistribution" for n in nodes)
    linears = [n for n in nodes if n["name"] == "aten::linear"]
    assert len(linears) == TP_LINEARS
    assert all(n["special"] == "sharded" for n in linears)
    assert {n["module"].split(" ")[-1] for n in linears} == {"(Linear)"}
    assert graph["specials"]["gradient_aggregation"] == 0  # no data-parallel group in this job
    assert graph["specials"]["redistribution"] == sum(n["special"] == "redistribution" for n in nodes)
    order = [e for e in graph["edges"] if e["kind"] == "order"]
    assert len(order) == len(nodes) - 1
    assert not [e for e in graph["edges"] if e["kind"] == "p2p"]


def test_the_ddp_job_shows_gradient_aggregation_over_every_rank(client: TestClient) -> None:
    graph = _get(client, "job/strategy/graph", run=DDP_JOB)
    assert len(graph["stages"]) == 1
    assert graph["stages"][0]["ranks"] == list(range(DDP_RANKS))
    nodes = graph["stages"][0]["nodes"]
    aggregating = [n for n in nodes if n["special"] == "gradient_aggregation"]
    assert aggregating
    for n in aggregating:
        assert n["category"] == "collective"
        assert n["collective"] == "all_reduce"
        assert n["group_ranks"] == list(range(DDP_RANKS))
        assert n["ranks"] == list(range(DDP_RANKS))
    assert not [n for n in nodes if n["special"] in ("redistribution", "sharded")]
    # every node's time is given per rank, and its mean lies within its range
    for n in nodes:
        assert len(n["durations_ns"]) == len(n["starts_ns"]) == len(n["ranks"])
        assert n["min_ns"] == min(n["durations_ns"]) and n["max_ns"] == max(n["durations_ns"])
        assert n["min_ns"] <= n["mean_ns"] <= n["max_ns"]
    assert "optimizer" in {n["category"] for n in nodes}  # SGD.step's ops


def test_the_dp_pp_job_shows_two_stages_joined_by_their_sends_and_receives(client: TestClient) -> None:
    graph = _get(client, "job/strategy/graph", run=DP_PP_JOB)
    assert [(st["stage"], st["ranks"]) for st in graph["stages"]] == [(0, [0, 2]), (1, [1, 3])]
    by = {(st["stage"], n["node"]): n for st in graph["stages"] for n in st["nodes"]}
    p2p = [e for e in graph["edges"] if e["kind"] == "p2p"]
    forward = [e for e in p2p if (e["src_stage"], e["dst_stage"]) == (0, 1)]
    backward = [e for e in p2p if (e["src_stage"], e["dst_stage"]) == (1, 0)]
    assert len(forward) == len(backward) == DP_PP_MICRO_BATCHES
    for e in forward:
        assert e["pairs"] == ["0->1", "2->3"]  # both pipelines, one edge
    for e in backward:
        assert e["pairs"] == ["1->0", "3->2"]
    for e in p2p:
        assert by[(e["src_stage"], e["src_node"])]["name"] == "send"
        assert by[(e["dst_stage"], e["dst_node"])]["name"] == "recv"
        assert e["bytes"] and e["bytes"] > 0
    for st, group in ((0, [0, 2]), (1, [1, 3])):
        aggregating = [n for (s, _), n in by.items() if s == st and n["special"] == "gradient_aggregation"]
        assert len(aggregating) == DP_PP_PARAMETERS
        assert all(n["group_ranks"] == group and n["collective"] == "all_reduce" for n in aggregating)


def test_a_step_can_be_picked_and_an_unknown_one_is_refused(client: TestClient) -> None:
    graph = _get(client, "job/strategy/graph", run=DP_PP_JOB)
    other = next(s for s in graph["steps"] if s != graph["step"])
    assert _get(client, "job/strategy/graph", run=DP_PP_JOB, step=other)["step"] == other
    response = client.get("/api/job/strategy/graph", params={"run": DP_PP_JOB, "step": "999"})
    assert response.status_code == 404
    assert "999" in response.json()["detail"]


def test_the_module_table_lists_each_stage_s_modules_with_a_time_per_rank(client: TestClient) -> None:
    tp = _get(client, "job/strategy/modules", run=TP_JOB)
    names = {m["module"] for m in tp["modules"]}
    # train_tp's model: nn.Sequential of (Linear, GELU, Linear) x 2
    assert names == {"Sequential"} | {
        f"Sequential.{i} ({cls})" for i, cls in enumerate(["Linear", "GELU", "Linear"] * 2)
    }
    assert tp["ranks"] == [0, 1]
    for m in tp["modules"]:
        times = [p["time_ns"] for p in m["per_rank"]]
        assert [p["rank"] for p in m["per_rank"]] == [0, 1]
        assert all(t > 0 for t in times)
        assert (m["min_ns"], m["max_ns"]) == (min(times), max(times))
        assert m["spread"] == pytest.approx((max(times) - min(times)) / m["mean_ns"], rel=1e-3, abs=1e-4)
        assert m["slowest_rank"] == m["per_rank"][times.index(max(times))]["rank"]
        assert m["depth"] == (0 if m["module"] == "Sequential" else 1)
    dp_pp = _get(client, "job/strategy/modules", run=DP_PP_JOB)
    for stage, ranks in ((0, [0, 2]), (1, [1, 3])):
        rows = [m for m in dp_pp["modules"] if m["stage"] == stage]
        assert {m["module"] for m in rows} == {"Sequential"} | {
            f"Sequential.{i} ({cls})" for i, cls in enumerate(["Linear", "Tanh"] * 2)
        }
        for m in rows:  # one forward per micro-batch
            assert [p["rank"] for p in m["per_rank"]] == ranks
            assert all(p["calls_per_step"] == DP_PP_MICRO_BATCHES for p in m["per_rank"])
    ddp = _get(client, "job/strategy/modules", run=DDP_JOB)
    classes = {m["module"].rsplit("(", 1)[-1].rstrip(")") for m in ddp["modules"] if m["depth"] > 0}
    assert {"Sequential", "Linear", "ReLU"} <= classes  # DistributedDataParallel.module (Sequential) ...


def test_the_module_table_is_written_as_csv_in_the_cluster_output(client: TestClient) -> None:
    cache: Path = client.cache_dir  # type: ignore[attr-defined]
    outputs = [p for p in cache.rglob("cluster_analysis_output") if TP_JOB in str(p.parent.name)]
    assert outputs
    for name in ("module_statistic.csv", "cluster_module_statistic.csv", "cluster_strategy_graph.parquet"):
        assert (outputs[0] / name).is_file(), name
    header = (outputs[0] / "cluster_module_statistic.csv").read_text().splitlines()[0].split(",")
    assert {"stage", "module", "mean_ns", "min_ns", "max_ns", "slowest_rank", "spread"} <= set(header)


def test_a_job_analysed_without_the_graph_says_how_to_get_it(client: TestClient) -> None:
    cache: Path = client.cache_dir  # type: ignore[attr-defined]
    folder = next(p for p in cache.rglob("cluster_analysis_output") if DP_PP_JOB in str(p.parent.name))
    graph = folder / "cluster_strategy_graph.parquet"
    kept = graph.read_bytes()
    graph.unlink()
    try:
        response = client.get("/api/job/strategy/graph", params={"run": DP_PP_JOB})
        assert response.status_code in (404, 409), response.text
        assert "cluster_strategy_graph.parquet" in response.text
    finally:
        graph.write_bytes(kept)


def test_a_many_rank_node_comes_without_its_lists_and_is_asked_for_alone(client: TestClient) -> None:
    full = _get(client, "job/strategy/graph", run=DP_PP_JOB)
    slim = _get(client, "job/strategy/graph", run=DP_PP_JOB, per_rank_limit=1)
    assert [st["ranks"] for st in slim["stages"]] == [st["ranks"] for st in full["stages"]]
    for st_full, st_slim in zip(full["stages"], slim["stages"], strict=True):
        for a, b in zip(st_full["nodes"], st_slim["nodes"], strict=True):
            assert b["ranks"] == b["starts_ns"] == b["durations_ns"] == []
            assert b["rank_count"] == a["rank_count"] == len(a["ranks"]) == 2
            assert b["first_start_ns"] == a["first_start_ns"] == min(a["starts_ns"])
            assert a["slowest_rank"] == a["ranks"][a["durations_ns"].index(max(a["durations_ns"]))]
    target = full["stages"][1]["nodes"][3]
    alone = _get(client, "job/strategy/node", run=DP_PP_JOB, step=full["step"], stage=1, node=target["node"])
    assert alone == target
    missing = client.get(
        "/api/job/strategy/node", params={"run": DP_PP_JOB, "step": full["step"], "stage": 1, "node": 99999}
    )
    assert missing.status_code == 404


def test_the_graphs_span_is_the_latest_end_of_any_op_on_any_rank(client: TestClient) -> None:
    """The span the page scales its lanes to: read from the nodes' latest ends, it must equal the
    maximum of start + duration over every rank of every node (what the lists hold)."""
    for run in (DP_PP_JOB, DDP_JOB):
        graph = _get(client, "job/strategy/graph", run=run, per_rank_limit=100_000)
        ends = [s + d for n in _nodes(graph) for s, d in zip(n["starts_ns"], n["durations_ns"], strict=True)]
        assert ends and graph["span_ns"] == max(ends)
