"""MindInsight's legacy ``profiler/`` folders from its own test resources (../shared/data/mindinsight),
read as MindInsight reads them.  Every expected number is computed here from the vendor's files
(MindInsight's own result tables, or its raw tables), never from perfsight's output:

* steps: MindInsight's ``StepTraceAnalyser`` takes the last row of ``step_trace_raw_<d>_detail_time.csv``
  as its summary (``total_steps = rows - 1``; "step 0" = that row, averages without the first step);
* operators: ``aicore_intermediate_<d>_type.csv`` (per type: ms per step summed over the type's ops,
  and the number of ops) and ``aicpu_intermediate_<d>.csv`` (``run_end - run_start`` in µs);
  ``framework_raw_<d>.csv`` gives each op its full scope name and input shapes."""

from __future__ import annotations

import csv
import hashlib
import json
import shutil
from collections import defaultdict
from pathlib import Path

import pytest

import perfsight
from perfsight.cli import main
from perfsight.ingest import find_traces, read_trace
from shared_data import MINDINSIGHT, require

RUN_2 = "run_2/normal_run/profiler"


def _rows(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as handle:
        return list(csv.DictReader(handle))


def _analyse(tmp_path: Path, run: str) -> Path:
    out = tmp_path / "out"
    assert main(["analyse", str(require(MINDINSIGHT / run)), "--out", str(out), "--no-progress"]) == 0
    [rank_dir] = [p for p in out.iterdir() if p.name.startswith("rank")]
    return rank_dir / "PROFILER_OUTPUT"


@pytest.mark.parametrize("run", ["run_2", "run_3", "run_4"])
def test_steps_are_the_rows_before_mindinsights_summary_row(run: str) -> None:
    step_file = require(MINDINSIGHT / run / "normal_run/profiler/step_trace_raw_1_detail_time.csv")
    rows = _rows(step_file)
    *steps, summary = rows  # MindInsight: total_steps = len(rows) - 1, the last row is the summary
    trace = read_trace(step_file)
    assert trace.steps.column("step").to_pylist() == [int(r["step_num"]) for r in steps]
    vendor = trace.vendor.step_trace.to_pylist()
    assert [(v["iteration_interval_ns"], v["fp_bp_ns"], v["tail_ns"]) for v in vendor] == [
        (int(r["iteration_interval"]) * 10, int(r["fp_and_bp"]) * 10, int(r["tail"]) * 10) for r in steps
    ]  # 10 ns ticks
    ms = {k: int(summary[k]) * 10 / 1e6 for k in ("total", "iteration_interval", "fp_and_bp", "tail")}
    note = (
        "MindInsight's averages (the file's summary row, over the "
        f"{len(steps) - 1} step(s) after the first): "
        f"step {ms['total']:.3f} ms, iteration interval {ms['iteration_interval']:.3f} ms, "
        f"forward+backward {ms['fp_and_bp']:.3f} ms, tail {ms['tail']:.3f} ms"
    )
    assert f"{step_file}: {note}" in trace.meta.warnings


def test_operator_types_agree_with_mindinsights_ai_core_and_ai_cpu_tables(tmp_path: Path) -> None:
    folder = require(MINDINSIGHT / RUN_2)
    out = _analyse(tmp_path, "run_2")
    stats = {(r["OP Type"], r["Core Type"]): r for r in _rows(out / "op_statistic.csv")}
    kernels = _rows(out / "kernel_details.csv")
    mindinsight = _rows(folder / "aicore_intermediate_1_type.csv")
    assert {t["op_type"] for t in mindinsight} == {k for k, core in stats if core == "AI_CORE"}
    by_op: dict[str, list[float]] = defaultdict(list)
    type_of = {}
    for row in kernels:
        if row["Accelerator Core"] == "AI_CORE":
            by_op[row["Name"]].append(float(row["Duration(us)"]))
            type_of[row["Name"]] = row["Type"]
    for vendor in mindinsight:
        op_type, total_us = vendor["op_type"], float(vendor["execution_time"]) * 1000
        ops = [name for name, kind in type_of.items() if kind == op_type]
        # MindInsight: per op, its mean time per run; per type, the sum of those and the number of ops
        assert len(ops) == int(vendor["execution_frequency"]), op_type
        per_step = sum(sum(by_op[name]) / len(by_op[name]) for name in ops)
        assert per_step == pytest.approx(total_us, abs=0.01), op_type
        ours = stats[(op_type, "AI_CORE")]
        if all(len(by_op[name]) == 1 for name in ops):  # each op ran once: the same table row
            assert int(ours["Count"]) == int(vendor["execution_frequency"]), op_type
            assert float(ours["Total Time(us)"]) == pytest.approx(total_us, abs=0.01), op_type
            assert float(ours["Avg Time(us)"]) == pytest.approx(total_us / len(ops), abs=0.01), op_type
    # e.g. MatMul: 20.65774 ms over 9 ops; TransData-op118 ran twice (before and after the step)
    assert stats[("MatMul", "AI_CORE")]["Count"] == "9"
    aicpu: dict[str, list[float]] = defaultdict(list)
    for row in _rows(folder / "aicpu_intermediate_1.csv"):
        aicpu[row["kernel_type"]].append(float(row["run_end"]) - float(row["run_start"]))
    for kernel, durations in aicpu.items():
        ours = stats[(kernel, "AI_CPU")]
        assert int(ours["Count"]) == len(durations)
        assert float(ours["Total Time(us)"]) == pytest.approx(sum(durations), abs=0.01)


def test_device_ops_carry_scope_names_and_shapes_and_share_the_step_traces_clock(tmp_path: Path) -> None:
    folder = require(MINDINSIGHT / RUN_2)
    out = _analyse(tmp_path, "run_2")
    kernels = _rows(out / "kernel_details.csv")
    framework = {r["full_op_name"]: r for r in _rows(folder / "framework_raw_1.csv")}
    core = [k for k in kernels if k["Accelerator Core"] == "AI_CORE"]
    assert core and all(k["Name"] in framework for k in core)  # full scope names, every AI Core op
    for kernel in core:
        info = json.loads(framework[kernel["Name"]]["op_info"])
        inputs = [
            info[k] for k in sorted((k for k in info if k.startswith("input_")), key=lambda k: int(k[6:]))
        ]
        assert kernel["Type"] == framework[kernel["Name"]]["op_type"]
        assert kernel["Input Shapes"] == ";".join(i["shape"] for i in inputs), kernel["Name"]
    # the timeline display counts µs from its first op; aicpu_intermediate's run_start is on the step
    # trace's clock: with the offset, the ops fall inside step 1 and their AI CPU starts agree
    aicpu = _rows(folder / "aicpu_intermediate_1.csv")
    cpu = [k for k in kernels if k["Accelerator Core"] == "AI_CPU"]
    assert [float(k["Start Time(us)"]) for k in cpu] == pytest.approx([float(r["run_start"]) for r in aicpu])
    step = _rows(folder / "step_trace_raw_1_detail_time.csv")[0]
    start_us, end_us = int(step["start_point"]) / 100, int(step["end_point"]) / 100
    inside = [k for k in core if start_us <= float(k["Start Time(us)"]) < end_us]
    assert {k["Step Id"] for k in inside} == {"1"} and len(inside) > 90
    steps = _rows(out / "step_trace_time.csv")
    assert len(steps) == 1 and float(steps[0]["Computing"]) > 0


def test_msprof_fragments_beside_a_profiler_folder_are_not_ranks(tmp_path: Path) -> None:
    profiler = Path(shutil.copytree(require(MINDINSIGHT / RUN_2), tmp_path / "run" / "profiler"))
    timeline = profiler / "PROF_000001_20230101_abc" / "device_1" / "timeline"
    timeline.mkdir(parents=True)
    fragment = [{"name": "hcom_allReduce_1", "ph": "X", "pid": 0, "tid": 0, "ts": 1.0, "dur": 41500.0}]
    (timeline / "hccl_0_2_1.json").write_text(json.dumps(fragment))
    (timeline / "msprof_0_2_1.json").write_text(json.dumps(fragment))
    assert find_traces(tmp_path / "run") == [profiler / "step_trace_raw_1_detail_time.csv"]
    out = tmp_path / "out"
    assert main(["analyse", str(tmp_path / "run"), "--out", str(out), "--no-progress"]) == 0
    assert sorted(p.name for p in out.iterdir() if p.name.startswith("rank")) == ["rank1"]


def _tree_hash(root: Path, skip: str | None = None) -> dict[str, str]:
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file() and (skip is None or skip not in p.relative_to(root).parts)
    }


def test_analyse_leaves_the_input_files_byte_for_byte_unchanged(tmp_path: Path) -> None:
    run = Path(shutil.copytree(require(MINDINSIGHT / "run_2"), tmp_path / "run_2"))
    before = _tree_hash(run)
    assert main(["analyse", str(run), "--no-progress"]) == 0  # outputs into run/perfsight_output
    assert _tree_hash(run, skip="perfsight_output") == before
    assert main(["analyse", str(run), "--out", str(tmp_path / "out"), "--no-progress"]) == 0
    assert _tree_hash(run, skip="perfsight_output") == before


def test_a_per_op_flops_file_is_read_as_flops_with_mindinsights_summary(tmp_path: Path) -> None:
    """``flops_<d>.txt`` as MindSpore's FlopsParser writes it (its header, ``", "``-joined lines), for
    the AI Core ops of run_2's ``framework_raw_1.csv``; MindInsight's summary: the sum of MFLOPs, the
    mean of GFLOPS; ``flops_summary_<d>.json``, when there, is what its FLOPs page shows."""
    profiler = Path(shutil.copytree(require(MINDINSIGHT / RUN_2), tmp_path / "run" / "profiler"))
    names = [r["full_op_name"] for r in _rows(profiler / "framework_raw_1.csv")]
    lines = [f"{name}, {1.25 * (i + 1)}, {0.5 + i / 7}, {i / 3}" for i, name in enumerate(names)]
    header = "op_full_name, MFLOPs(10^6), GFLOPS(10^9), FLOPS utilization(%) \n"
    (profiler / "flops_1.txt").write_text(header + "\n".join(lines) + "\n")
    step_file = profiler / "step_trace_raw_1_detail_time.csv"
    trace = read_trace(step_file)
    assert not [w for w in trace.meta.warnings if "not understood" in w]
    mflops = round(sum(1.25 * (i + 1) for i in range(len(names))), 3)
    gflops = round(sum(0.5 + i / 7 for i in range(len(names))) / len(names), 3)
    assert trace.meta.extra["mindinsight"]["flops"] == {"FLOPs": mflops, "FLOPS": gflops}
    assert (
        f"{profiler / 'flops_1.txt'}: MindInsight's FLOPs summary: {mflops:,.3f} MFLOPs, {gflops:,.3f} GFLOPS"
        in (trace.meta.warnings)
    )
    ops = trace.vendor.tables["mindinsight_flops"]
    assert ops.column("op").to_pylist() == names and ops.num_rows == len(names) > 100
    assert ops.column("flops").to_pylist()[1] == 2.5e6  # FLOP, from 2.5 MFLOPs
    analysis = perfsight.analyse(tmp_path / "run", out=tmp_path / "out")  # kept among the rank's tables
    table = analysis.mindinsight_flops
    assert table["rank"].tolist() == [1] * len(names) and table["flops"].sum() == pytest.approx(mflops * 1e6)
    (profiler / "flops_summary_1.json").write_text(
        '{"FLOPs": 8167.743, "FLOPS": 9868.936, "FLOPS_Utilization": 3.5}'
    )
    summary = read_trace(step_file).meta.extra["mindinsight"]["flops"]
    assert summary == {"FLOPs": 8167.743, "FLOPS": 9868.936, "FLOPS_Utilization": 3.5}


def test_serving_the_folder_leaves_it_byte_for_byte_unchanged(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from _ui import Server

    base = tmp_path / "base"
    shutil.copytree(require(MINDINSIGHT / "run_2"), base / "run_2")
    before = _tree_hash(base)
    monkeypatch.setenv("PERFSIGHT_CACHE_DIR", str(tmp_path / "server_cache"))  # the server's own cache
    server = Server(base)
    try:
        run = "run_2/normal_run/profiler"
        assert {r["id"]: r["ranks"] for r in server.get("runs")["runs"]} == {run: [1]}
        server.wait_ready(run)
        overview = server.get("run/overview", run=run)
        assert [s["step"] for s in overview["steps"]] == [1]
    finally:
        server.stop()
    assert _tree_hash(base) == before  # no file changed, none added (cache/, PROFILER_OUTPUT/, rank*_)


def test_a_device_with_a_timeline_but_no_step_trace_is_still_a_device(tmp_path: Path) -> None:
    """MindInsight lists devices by their files (``ascend_timeline_display_<d>``, ``profiler_info_<d>``);
    the step trace is not required: without it the device's timeline is read, as one step."""
    source = require(MINDINSIGHT / RUN_2)
    profiler = Path(
        shutil.copytree(
            source, tmp_path / "run" / "profiler", ignore=shutil.ignore_patterns("step_trace_raw_*")
        )
    )
    timeline = profiler / "ascend_timeline_display_1.json"
    assert find_traces(tmp_path / "run") == [timeline]
    trace = read_trace(timeline)
    events = json.loads((source / "ascend_timeline_display_1.json").read_text())
    assert trace.rank == 1 and trace.steps.num_rows == 1
    assert trace.slices.num_rows == sum(1 for e in events if e.get("ph") == "X")
    assert any("no steps; the whole timeline is one step" in w for w in trace.meta.warnings)


# What MindInsight 2.3.1 showed for the same folders, read once from its API (a copy of
# ../shared/data/mindinsight with {"context_mode": "graph"} as profiler/profiler_info_1.json, served by
#   pip install mindinsight==2.3.1 gunicorn   (in a venv outside the repo)
#   mindinsight start --summary-base-dir COPY --port 8090
#   curl 'http://127.0.0.1:8090/v1/mindinsight/profile/devices?profile=profiler&train_id=./run_N/normal_run'
#   curl 'http://127.0.0.1:8090/v1/mindinsight/profile/training-trace/graph?dir=./run_N/normal_run&type=T&device_id=1'
#   curl -X POST 'http://127.0.0.1:8090/v1/mindinsight/profile/ops/search?profile=profiler&train_id=./run_2/normal_run'
#        -d '{"op_type":"aicore_type","device_id":"1","filter_condition":{},
#             "sort_condition":{"name":"total_time","type":"descending"}}'     (and "op_type":"aicpu_type")
MINDINSIGHT_DEVICES = ["1"]  # /profile/devices, each of run_2, run_3, run_4
MINDINSIGHT_STEP_1_MS = {"total": 23.7091, "iteration_interval": 0.0, "fp_and_bp": 23.6681, "tail": 0.041}
MINDINSIGHT_SUMMARY = {  # type=0: total_steps and the averages of the summary row, ms
    "run_2": (1, {"iteration_interval": 12.4321, "fp_and_bp": 0.0, "tail": 0.0}),
    "run_3": (1, {"iteration_interval": 0.0, "fp_and_bp": 0.0, "tail": 0.0}),
    "run_4": (1, {"iteration_interval": 0.0, "fp_and_bp": 0.0, "tail": 0.0}),
}
MINDINSIGHT_AICORE_TYPE_US = {  # op type: (total µs, count, average µs)
    "MatMul": (20657.74, 9, 2295.304),
    "ApplyMomentum": (1241.28, 11, 112.844),
    "Conv2D": (461.07, 5, 92.214),
    "TransData": (193.765, 3, 64.588),
    "Cast": (148.09, 28, 5.289),
    "Conv2DBackpropFilter": (106.74, 5, 21.348),
    "Conv2DBackpropInput": (85.94, 4, 21.485),
    "MaxPoolGrad": (54.18, 3, 18.06),
    "ReLUV2": (33.28, 5, 6.656),
    "ReluGradV2": (30.79, 5, 6.158),
    "AtomicAddrClean": (30.12, 9, 3.347),
    "MaxPool": (12.23, 3, 4.077),
    "ReluGrad": (8.5, 2, 4.25),
    "BiasAddGrad": (5.04, 3, 1.68),
    "AssignAdd": (4.92, 3, 1.64),
    "ReLU": (4.77, 2, 2.385),
    "SoftmaxCrossEntropyWithLogits": (3.64, 1, 3.64),
    "OneHot": (1.76, 1, 1.76),
    "GatherV2": (1.53, 1, 1.53),
    "ReduceMean": (1.39, 1, 1.39),
    "Mul": (1.32, 1, 1.32),
}
MINDINSIGHT_AICPU_TYPE = {"InitData": 1, "GetNext": 2, "EndOfSequence": 2}  # kernel type: count


@pytest.mark.parametrize("run", ["run_2", "run_3", "run_4"])
def test_steps_and_averages_as_mindinsight_2_3_1_showed_them(run: str) -> None:
    step_file = require(MINDINSIGHT / run / "normal_run/profiler/step_trace_raw_1_detail_time.csv")
    assert find_traces(step_file.parent) == [step_file]  # one device, "1", as MINDINSIGHT_DEVICES
    assert [str(int(p.name.split("_")[3])) for p in find_traces(step_file.parent)] == MINDINSIGHT_DEVICES
    trace = read_trace(step_file)
    total_steps, averages = MINDINSIGHT_SUMMARY[run]
    assert trace.steps.num_rows == total_steps
    [step] = trace.vendor.step_trace.to_pylist()
    assert round(step["duration_ns"] / 1e6, 4) == MINDINSIGHT_STEP_1_MS["total"]
    assert round(step["iteration_interval_ns"] / 1e6, 4) == MINDINSIGHT_STEP_1_MS["iteration_interval"]
    assert round(step["fp_bp_ns"] / 1e6, 4) == MINDINSIGHT_STEP_1_MS["fp_and_bp"]
    assert round(step["tail_ns"] / 1e6, 4) == MINDINSIGHT_STEP_1_MS["tail"]
    assert round((trace.steps["end_ns"][0].as_py() - trace.steps["start_ns"][0].as_py()) / 1e6, 4) == 23.7091
    [note] = [w for w in trace.meta.warnings if "MindInsight's averages" in w]
    assert f"iteration interval {averages['iteration_interval']:.3f} ms" in note
    assert f"forward+backward {averages['fp_and_bp']:.3f} ms, tail {averages['tail']:.3f} ms" in note


def test_operator_tables_as_mindinsight_2_3_1_showed_them(tmp_path: Path) -> None:
    out = _analyse(tmp_path, "run_2")
    stats = {(r["OP Type"], r["Core Type"]): r for r in _rows(out / "op_statistic.csv")}
    runs: dict[str, list[float]] = defaultdict(list)
    type_of = {}
    for row in _rows(out / "kernel_details.csv"):
        if row["Accelerator Core"] == "AI_CORE":
            runs[row["Name"]].append(float(row["Duration(us)"]))
            type_of[row["Name"]] = row["Type"]
    assert {t for t, core in stats if core == "AI_CORE"} == set(MINDINSIGHT_AICORE_TYPE_US)
    for op_type, (total, count, average) in MINDINSIGHT_AICORE_TYPE_US.items():
        ops = [name for name, kind in type_of.items() if kind == op_type]
        per_step = sum(sum(runs[n]) / len(runs[n]) for n in ops)  # MindInsight's: per op, mean per run
        assert (round(per_step, 3), len(ops)) == (pytest.approx(total, abs=0.005), count), op_type
        ours = stats[(op_type, "AI_CORE")]
        if all(len(runs[n]) == 1 for n in ops):  # every op ran once: perfsight's own row is MindInsight's
            assert (float(ours["Total Time(us)"]), int(ours["Count"])) == (
                pytest.approx(total, abs=0.005),
                count,
            )
            assert float(ours["Avg Time(us)"]) == pytest.approx(average, abs=0.0015)
    # TransData-op118 and AssignAdd-op142 also ran outside the step (data loop): perfsight counts each run
    assert (stats[("TransData", "AI_CORE")]["Count"], stats[("AssignAdd", "AI_CORE")]["Count"]) == ("4", "4")
    assert {t: int(stats[(t, "AI_CPU")]["Count"]) for t in MINDINSIGHT_AICPU_TYPE} == MINDINSIGHT_AICPU_TYPE


# MindInsight 2.3.1, same copy and server as above:
#   curl 'http://127.0.0.1:8090/v1/mindinsight/profile/process_summary?profile=profiler&train_id=./run_2/normal_run&device_id=1'
#   curl -X POST -d '{"device_id":"1"}' \
#     'http://127.0.0.1:8090/v1/mindinsight/profile/minddata-pipeline/op-queue?profile=profiler&train_id=./run_2/normal_run'
MINDINSIGHT_PROCESS_SUMMARY = {
    "device_queue_info": {"summary": {"empty_batch_count": 1, "full_batch_count": 0, "total_batch": 1}},
    "get_next_queue_info": {"summary": {"empty_batch_count": 0, "total_batch": 3}},
    "data_process": {"status": "warning"},
    "data_transmission": {"status": "normal"},
}
MINDINSIGHT_OP_QUEUE_USAGE = {
    0: ("BatchOp", 0.015625),
    1: ("MapOp", 0.0),
    2: ("MapOp", 0.0),
    3: ("ImageFolderOp", 0.0),
}


def test_minddata_queues_as_mindinsight_2_3_1_showed_them(tmp_path: Path) -> None:
    step_file = require(MINDINSIGHT / RUN_2 / "step_trace_raw_1_detail_time.csv")
    trace = read_trace(step_file)
    summary = trace.meta.extra["mindinsight"]["minddata"]
    expected = MINDINSIGHT_PROCESS_SUMMARY
    assert summary["device_queue"] == expected["device_queue_info"]["summary"]
    assert summary["get_next_queue"] == expected["get_next_queue_info"]["summary"]
    assert (
        summary["verdict"] == "data processing"
    )  # MindInsight: data_process "warning", transmission "normal"
    assert {
        q["op_id"]: (q["op_type"], q["usage_rate"]) for q in summary["op_queues"]
    } == MINDINSIGHT_OP_QUEUE_USAGE
    line = next(w for w in trace.meta.warnings if "MindInsight's data queues" in w)
    assert "device queue empty in 1 of 1 batch(es), full in 0; GetNext found it empty 0 of 3 time(s)" in line
    assert "BatchOp 1.56%" in line
    # the GetNext fetches on the device clock of the step trace (µs in the file): inside the run
    fetches = trace.vendor.tables["mindinsight_get_next"].to_pylist()
    raw = [line.split() for line in (step_file.parent / "minddata_aicpu_1.txt").read_text().splitlines()]
    assert [(f["start_ns"], f["end_ns"], f["queue_size"]) for f in fetches] == [
        (int(r[1]) * 1000, int(r[2]) * 1000, int(r[3])) for r in raw
    ]


def test_damaged_minddata_files_are_named_and_the_rest_loads(tmp_path: Path) -> None:
    profiler = Path(shutil.copytree(require(MINDINSIGHT / RUN_2), tmp_path / "run" / "profiler"))
    queue = profiler / "device_queue_profiling_1.txt"
    queue.write_text(queue.read_text() + "1 64 x\n1 64 2 64 10\n")  # a short line, then a full queue
    (profiler / "minddata_aicpu_1.txt").write_text("")
    trace = read_trace(profiler / "step_trace_raw_1_detail_time.csv")
    assert f"{queue}: 1 line(s) with another number of fields skipped" in trace.meta.warnings
    summary = trace.meta.extra["mindinsight"]["minddata"]
    assert summary["device_queue"] == {"total_batch": 2, "empty_batch_count": 1, "full_batch_count": 1}
    assert "get_next_queue" not in summary and trace.steps.num_rows == 1
