"""run_2 of MindInsight's own test resources (../shared/data/mindinsight): its MindData pipeline,
queues and host CPU use, and its per-type operator tables, as MindInsight 2.3.1 showed them.

Every expected number below was read once from MindInsight 2.3.1's REST API for the same folder (a
copy of ../shared/data/mindinsight with {"context_mode": "graph"} as
run_N/normal_run/profiler/profiler_info_1.json, served by
``pip install mindinsight==2.3.1 gunicorn`` (a venv outside the repo), then
``mindinsight start --summary-base-dir COPY --port 8090``), with the command given beside it; none
is copied from perfsight's output.  The pages are then checked in a real Chromium: the data page
draws the pipeline with each op's output queue and the bottleneck, the operators page shows each
device op's scope name and input shapes and groups the op types.
"""

# ruff: noqa: F811 - the fixtures imported from _ui are redefined as test parameters, as pytest intends
from __future__ import annotations

import csv
import hashlib
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from _ui import Server, need_browser, own_server_browser, watched_page  # noqa: F401
from perfsight.ingest import read_trace
from perfsight.pipeline import Options, analyse_trace
from shared_data import MINDINSIGHT, require

RUN_2 = "run_2/normal_run/profiler"
API = "http://127.0.0.1:8090/v1/mindinsight/profile"
SHOTS = os.environ.get("PERFSIGHT_SCREENSHOTS")

# (Q = "profile=profiler&train_id=./run_2/normal_run")
#   curl -X POST -d '{"device_id":"1"}' "$API/minddata-pipeline/op-queue?$Q"
#   curl "$API/minddata-pipeline/queue?$Q&device_id=1&op_id=N"  (N = 0..3)
# op_id: (op_type, num_workers, parent op_id, output_queue_size samples, average size, length, usage rate)
MINDINSIGHT_PIPELINE_OPS = {
    0: ("BatchOp", 4, None, None, 1.0, 64, 0.015625),  # /queue: "queue_info": null for the last op
    1: ("MapOp", 8, 0, [0, 0], 0.0, 128, 0.0),
    2: ("MapOp", 8, 1, [0, 0], 0.0, 128, 0.0),
    3: ("ImageFolderOp", 8, 2, [0, 0], 0.0, 128, 0.0),
}
#   curl "$API/process_summary?profile=profiler&train_id=./run_2/normal_run&device_id=1"
#   -> device_queue_info (the host queue) {"empty_batch_count": 1, "full_batch_count": 0, "total_batch": 1},
#      get_next_queue_info (the device's data queue) {"empty_batch_count": 0, "total_batch": 3},
#      data_process "warning", data_transmission "normal"
MINDINSIGHT_HOST_QUEUE = {"empty": 1, "full": 0, "total": 1}
MINDINSIGHT_DATA_QUEUE = {"empty": 0, "total": 3}
#   curl "$API/summary/propose?profile=profiler&train_id=./run_2/normal_run&device_id=1"
MINDINSIGHT_PROPOSALS = {
    "minddata_pipeline-general": ["ImageFolderOp_3"],
    "minddata_pipeline-dataset_op": ["ImageFolderOp_3"],
    "minddata_device_queue": [1, 1, 0, 1],
    "minddata_get_next_queue": [0, 3],
    "minddata_device_queue_rate": {"empty_rate": 100, "empty_warning_threshold": 30},
    "minddata_cpu_utilization": [90],
}
#   curl -X POST -d '{"device_id":"1","cpu_processor_num":100}' \
#     "$API/minddata-cpu-utilization-summary?profile=profiler&train_id=./run_2/normal_run"
# (scope, op_id, metric): (avg_value, the samples it averaged)
MINDINSIGHT_CPU = {
    ("machine", None, "user_utilization"): (15, [10, 20]),
    ("machine", None, "sys_utilization"): (15, [10, 20]),
    ("machine", None, "io_utilization"): (10, [10, 10]),
    ("machine", None, "idle_utilization"): (10, [10, 10]),
    ("machine", None, "runable_processes"): (15, [10, 20]),
    ("machine", None, "context_switch_count"): (15, [10, 20]),
    ("process", None, "user_utilization"): (15, [10, 20]),
    ("process", None, "sys_utilization"): (15, [10, 20]),
    ("op", 1, "user_utilization"): (15, [10, 20]),
    ("op", 1, "sys_utilization"): (15, [10, 20]),
}
#   curl -X POST "$API/ops/search?profile=profiler&train_id=./run_2/normal_run" -d '{"op_type":"aicpu_type",
#     "device_id":"1","filter_condition":{},"sort_condition":{"name":"total_time","type":"descending"}}'
# kernel_type: (total_time µs, execution_frequency, percent)
MINDINSIGHT_AICPU_TYPES = {
    "InitData": (7906.0, 1, 81.56),
    "GetNext": (1181.0, 2, 12.18),
    "EndOfSequence": (607.0, 2, 6.26),
}
# the same with "op_type":"aicore_type": op type -> (total µs, count); these ops each ran once in the step
MINDINSIGHT_AICORE_ONCE = {"MatMul": (20657.74, 9), "Conv2D": (461.07, 5), "Cast": (148.09, 28)}


def _longest_ai_core_op() -> tuple[str, list[str]]:
    """The full name of the longest op of ``aicore_intermediate_1_detail.csv`` and its input shapes
    in ``framework_raw_1.csv`` (``"2,256,6,6"`` per input)."""
    folder = require(MINDINSIGHT / RUN_2)
    with (folder / "aicore_intermediate_1_detail.csv").open(newline="") as handle:
        detail = list(csv.DictReader(handle))
    name = max(detail, key=lambda r: float(r["execution_time"]))["full_op_name"]
    with (folder / "framework_raw_1.csv").open(newline="") as handle:
        [row] = [r for r in csv.DictReader(handle) if r["full_op_name"] == name]
    info = json.loads(row["op_info"])
    inputs = sorted((k for k in info if k.startswith("input_")), key=lambda k: int(k[6:]))
    return name, [info[k]["shape"] for k in inputs]


@pytest.fixture(scope="module")
def tables() -> dict[str, Any]:
    trace = read_trace(require(MINDINSIGHT / RUN_2 / "step_trace_raw_1_detail_time.csv"))
    return analyse_trace(trace, Options()).tables


def test_pipeline_ops_and_their_queues_are_mindinsights(tables: dict[str, Any]) -> None:
    stages = tables["data_stages"].to_pylist()
    by_id = {int(s["stage"].rsplit("_", 1)[1]): s for s in stages}
    assert set(by_id) == set(MINDINSIGHT_PIPELINE_OPS)
    for op_id, (op_type, workers, parent, sizes, mean, length, usage) in MINDINSIGHT_PIPELINE_OPS.items():
        stage = by_id[op_id]
        assert (stage["op_type"], stage["parallelism"]) == (op_type, workers), op_id
        assert (stage["queue_capacity"], stage["queue_mean"]) == (length, mean), op_id
        assert stage["queue_usage"] == pytest.approx(usage), op_id
        if sizes is not None:
            assert stage["queue_samples"] == len(sizes)
            assert stage["queue_empty_ratio"] == sum(s == 0 for s in sizes) / len(sizes)
        # source first: each op's parent (the op it feeds) comes right after it
        if parent is not None:
            assert by_id[parent]["order"] == stage["order"] + 1, op_id
    # the times a DataLoader capture measures are not in MindSpore's files: unknown, not zero
    assert all(s["per_batch_ns"] is None and s["batches"] is None for s in stages)
    flagged = [s["stage"] for s in stages if s["bottleneck"]]
    assert flagged == MINDINSIGHT_PROPOSALS["minddata_pipeline-general"]


def test_queue_summary_verdict_and_suggestions_are_mindinsights(tables: dict[str, Any]) -> None:
    [summary] = tables["data_pipeline_summary"].to_pylist()
    assert (summary["host_queue_empty"], summary["host_queue_full"], summary["host_queue_samples"]) == (
        MINDINSIGHT_HOST_QUEUE["empty"],
        MINDINSIGHT_HOST_QUEUE["full"],
        MINDINSIGHT_HOST_QUEUE["total"],
    )
    assert (summary["device_queue_empty"], summary["requests"]) == (
        MINDINSIGHT_DATA_QUEUE["empty"],
        MINDINSIGHT_DATA_QUEUE["total"],
    )
    assert summary["verdict"] == "data processing"  # MindInsight: data_process "warning"
    assert summary["bottleneck_stage"] == "ImageFolderOp_3"
    rate = MINDINSIGHT_PROPOSALS["minddata_device_queue_rate"]
    reason = summary["reason"]
    assert "The ratio of empty queues on a host is 1/1, and the ratio of non empty queues is 0/1." in reason
    assert "The ratio of empty data queues is 0/3, and the ratio of non empty queues is 3/3." in reason
    assert (
        f"The ratio of empty queues on a host is {rate['empty_rate']}%, "
        f"and the threshold is {rate['empty_warning_threshold']}%."
    ) in reason
    assert "The ImageFolderOp_3 operator in the pipeline may have performance bottlenecks." in reason
    assert "For operator ImageFolderOp_3, you can try to increase or decrease the num_parallel_workers" in (
        reason
    )
    [busy] = MINDINSIGHT_PROPOSALS["minddata_cpu_utilization"]
    assert f"The average CPU usage of the entire system is {busy}%" in reason
    # the queue curves: each GetNext fetch with the data-queue size it found, and the host sample
    queue = tables["data_queue"].to_pylist()
    assert sorted(q["device_queue"] for q in queue if q["device_queue"] is not None) == [1, 2, 3]
    assert [q["host_queue"] for q in queue if q["host_queue"] is not None] == [0]


def test_cpu_utilization_means_are_mindinsights(tables: dict[str, Any]) -> None:
    rows = {(r["scope"], r["op_id"], r["metric"]): r for r in tables["data_cpu_utilization"].to_pylist()}
    assert set(rows) == set(MINDINSIGHT_CPU)
    for key, (average, samples) in MINDINSIGHT_CPU.items():
        row = rows[key]
        assert (round(row["mean"]), row["samples"], row["max"]) == (average, len(samples), max(samples)), key
    assert rows[("op", 1, "user_utilization")]["stage"] == "MapOp_1"


def _tree_hash(folder: Path) -> str:
    digest = hashlib.sha256()
    for path in sorted(folder.rglob("*")):
        digest.update(str(path.relative_to(folder)).encode())
        if path.is_file():
            digest.update(path.read_bytes())
    return digest.hexdigest()


@pytest.fixture(scope="module")
def server() -> Iterator[Server]:
    """``perfsight serve`` on the shared folder itself (the analyses go to the test's cache folder);
    the folder must be byte-for-byte the same afterwards."""
    base = require(MINDINSIGHT)
    before = _tree_hash(base)
    served = Server(base)
    try:
        yield served
    finally:
        served.stop()
    assert _tree_hash(base) == before


def test_kernel_types_group_by_op_type_with_mindinsights_ai_cpu_totals(server: Server) -> None:
    server.wait_ready(RUN_2)
    page = server.get("run/kernel-types", run=RUN_2, limit=100)
    rows = {(r["name"], r["kind"]): r for r in page["rows"]}
    for kernel_type, (total_us, count, percent) in MINDINSIGHT_AICPU_TYPES.items():
        row = rows[(kernel_type, "AI_CPU")]
        assert (row["total_ns"] / 1000, row["count"]) == (total_us, count), kernel_type
        assert round(row["ratio"] * 100, 2) == pytest.approx(percent, abs=0.006), kernel_type
    for op_type, (total_us, count) in MINDINSIGHT_AICORE_ONCE.items():
        row = rows[(op_type, "AI_CORE")]
        assert (round(row["total_ns"] / 1000, 2), row["count"]) == (total_us, count), op_type
    assert not any("/" in name for name, _ in rows)  # types, not graph nodes' scope names
    # a type's row drills down to its ops, each with its full scope name
    matmuls = server.get("run/kernels", run=RUN_2, name="MatMul", limit=100)
    assert matmuls["total"] == MINDINSIGHT_AICORE_ONCE["MatMul"][1]
    assert all(r["name"].split("/")[0] in ("Default", "Gradients") for r in matmuls["rows"])


def test_data_page_draws_the_pipeline_queues_and_cpu_of_run_2(
    server: Server, own_server_browser: Any
) -> None:
    need_browser()
    server.wait_ready(RUN_2)
    api = server.get("run/data-prep", run=RUN_2)
    with watched_page(own_server_browser) as watched:
        page = watched.page
        page.goto(server.page_url("data", RUN_2, tab="processing"))
        graph = page.get_by_test_id("data-graph")
        graph.wait_for()
        stages = [s.get_attribute("data-stage") for s in graph.locator("[data-stage]").all()]
        assert stages == ["ImageFolderOp_3", "MapOp_2", "MapOp_1", "BatchOp_0"]  # source first
        bottleneck = graph.locator(".data-stage.bottleneck")
        assert bottleneck.get_attribute("data-stage") == "ImageFolderOp_3"
        # one output queue per op, with MindInsight's usage rate, then the host and the data queue
        usage = [page.get_by_test_id(f"data-queue-op-{i}").inner_text() for i in range(4)]
        assert "usage 2%" in usage[3] and all("usage 0%" in u for u in usage[:3])  # BatchOp 1.5625 %
        assert "empty 1" in page.get_by_test_id("data-queue-host").inner_text()
        assert "empty 0" in page.get_by_test_id("data-queue-device").inner_text()
        assert page.get_by_test_id("data-host-empty").inner_text().endswith("1 / 1")
        assert "ImageFolderOp_3" in page.get_by_test_id("data-bottleneck").inner_text()
        assert "performance bottlenecks" in page.get_by_test_id("data-reason").inner_text()
        for op_id, (op_type, *_rest) in MINDINSIGHT_PIPELINE_OPS.items():  # MindInsight's queue curves
            sizes = MINDINSIGHT_PIPELINE_OPS[op_id][3]
            if sizes is not None:
                assert api["stage_queues"][f"{op_type}_{op_id}"]["size"] == sizes
        page.get_by_test_id("data-queue-op-3").click()
        assert page.get_by_test_id("data-detail-queue-usage").inner_text().endswith("1.56%")
        queue_chart = page.get_by_test_id("chart-data-stage-queue")
        queue_chart.locator("canvas").first.wait_for()
        assert "Size" in (queue_chart.get_attribute("aria-label") or "")
        cpu = page.get_by_test_id("data-cpu-table").locator("tbody tr")
        assert cpu.count() == len(api["cpu"]) == len(MINDINSIGHT_CPU)
        if SHOTS:
            page.screenshot(path=str(Path(SHOTS) / "mindinsight-run2-data.png"), full_page=True)
        page.goto(server.page_url("data", RUN_2))
        page.get_by_test_id("card-data-queues").wait_for()
        if SHOTS:
            page.screenshot(path=str(Path(SHOTS) / "mindinsight-run2-queues.png"), full_page=True)
        assert not watched.errors and not watched.dialogs


def test_operators_page_shows_scope_names_shapes_and_op_types_of_run_2(
    server: Server, own_server_browser: Any
) -> None:
    need_browser()
    server.wait_ready(RUN_2)
    with watched_page(own_server_browser) as watched:
        page = watched.page
        page.goto(server.page_url("operators", RUN_2))
        types = page.get_by_test_id("kernel-type-table")
        types.locator("tbody tr").first.wait_for()
        first = types.locator("tbody tr").first.locator("td")
        assert [first.nth(0).inner_text(), first.nth(1).inner_text()] == ["MatMul", "AI_CORE"]
        launches = page.get_by_test_id("kernel-table")
        launches.locator("tbody tr").first.wait_for()
        top = launches.locator("tbody tr").first.locator("td")
        # the longest op (MindInsight's per-op table) by its full scope name, with the input shapes
        # framework_raw gives it
        name, shapes = _longest_ai_core_op()
        assert top.nth(0).inner_text() == name
        assert top.nth(9).inner_text() == ", ".join("×".join(s.split(",")) for s in shapes)
        chart = page.get_by_test_id("chart-top-types")  # the device op types (no host operator here)
        chart.locator("canvas").first.wait_for()
        label = chart.get_attribute("aria-label") or ""
        assert all(kind in label for kind in ("MatMul", *MINDINSIGHT_AICPU_TYPES)), label
        if SHOTS:
            page.screenshot(path=str(Path(SHOTS) / "mindinsight-run2-operators.png"), full_page=True)
        assert not watched.errors and not watched.dialogs


#   curl "$API/flops-summary?$Q&device_id=1"  -> {}     curl "$API/flops-scope?$Q&device_id=1"  -> {}
#   curl "$API/memory-summary?$Q&device_id=1" -> error 50546080 "The file dir does not exist."
# (for each of run_2, run_3, run_4: none of them holds flops_*, flops_scope_* or memory files)
@pytest.mark.parametrize("run", ["run_2", "run_3", "run_4"])
def test_no_flops_or_memory_is_invented_where_mindinsight_shows_none(run: str) -> None:
    folder = require(MINDINSIGHT / run / "normal_run/profiler")
    names = [p.name for p in folder.iterdir()]
    assert not [n for n in names if n.startswith(("flops", "memory", "hbm"))]  # as MindInsight found
    trace = read_trace(folder / "step_trace_raw_1_detail_time.csv")
    assert trace.meta.extra["mindinsight"]["flops"] == {}
    assert "mindinsight_flops" not in trace.vendor.tables
    tables = analyse_trace(trace, Options()).tables
    assert tables["memory_curve"].num_rows == tables["operator_memory"].num_rows == 0


def test_damaged_pipeline_and_cpu_files_are_named_and_the_csv_still_gives_the_graph(tmp_path: Path) -> None:
    import shutil

    profiler = Path(shutil.copytree(require(MINDINSIGHT / RUN_2), tmp_path / "run" / "profiler"))
    (profiler / "pipeline_profiling_1.json").write_text('{"op_info": [')  # cut short
    (profiler / "minddata_cpu_utilization_1.json").write_text("[]")
    trace = read_trace(profiler / "step_trace_raw_1_detail_time.csv")
    warnings = "\n".join(trace.meta.warnings)
    assert f"{profiler / 'pipeline_profiling_1.json'}: cannot be read as JSON" in warnings
    assert f"{profiler / 'minddata_cpu_utilization_1.json'}: is not a JSON object" in warnings
    stages = analyse_trace(trace, Options()).tables["data_stages"].to_pylist()
    # the CSV MindInsight reads still gives every op and its queue usage
    assert {s["stage"]: s["queue_usage"] for s in stages} == {
        f"{op_type}_{op_id}": usage for op_id, (op_type, *_, usage) in MINDINSIGHT_PIPELINE_OPS.items()
    }
    assert trace.steps.num_rows == 1
