"""``perfsight analyse`` on MindInsight's legacy ``profiler/`` layout: one rank, the r1.3 cluster layout,
and damaged files.  Fixtures are written to the documented formats (tests/fixtures/mindinsight_legacy);
the single rank's timeline display follows MindSpore 1.x's numbering (device id = AI Core ops, 9000 AI
CPU, 10000 communication, 12000 its overlap analysis) with ops placed so the breakdown is known:
per 10 ms step, compute 1.5-9.0 ms and 10.5-10.8 ms after the step start, all-reduces 8.2-8.8 ms
(hidden under compute) and 9.1-10.5 ms (exposed)."""

from __future__ import annotations

import csv
import json
import shutil
from pathlib import Path

import pytest

import perfsight
from perfsight.cli import main
from perfsight.ingest import find_traces, read_trace

FIXTURES = Path(__file__).parent / "fixtures" / "mindinsight_legacy"


def _copy(tmp_path: Path, name: str) -> Path:
    return Path(shutil.copytree(FIXTURES / name, tmp_path / name))


def _csv(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as handle:
        return list(csv.DictReader(handle))


def test_a_legacy_profiler_folder_is_analysed_like_any_trace(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = _copy(tmp_path, "single")
    assert main(["analyse", str(run), "--no-progress"]) == 0
    text = capsys.readouterr().out
    assert "== rank 0 of 8 on Ascend NPU" in text  # 8 ranks: ascend_cluster_analyse_data-parallel_1_8_0.csv
    # step, total, gap, fwd+bwd, tail, compute, exposed comm, free: all perfsight's.  The timeline has
    # device ops only, no host operator to place FP/BP by, so the whole 10 ms step is forward+backward
    row = "    10.000    0.000       10.000     0.000        7.800             1.400     0.300"
    for step in (1, 2, 3):
        assert f"{step:<8}{row}" in text
    # MindInsight's own step trace (gap 0.5, fp+bp 7.5, tail 2.0 ms in the CSV) is a named cross-check
    assert "MindInsight's own step trace (iteration interval, forward+backward, tail) is kept" in text
    assert (
        "perfsight's step trace differs from the one the source's tool recorded (table vendor_step_trace) "
        "in 3 step(s); step 1: iteration interval 0.000 vs 0.500 ms, forward+backward 10.000 vs 7.500 ms, "
        "tail 0.000 vs 2.000 ms"
    ) in text
    out = run / "perfsight_output" / "rank0" / "PROFILER_OUTPUT"
    first = _csv(out / "step_trace_time.csv")[0]
    assert (first["Computing"], first["Overlapped"], first["Communication(Not Overlapped)"]) == (
        "7800.000",
        "600.000",
        "1400.000",
    )
    assert first["Preparing"] == "500.000"  # first op 0.5 ms after the step starts
    kernels = {row["Name"] for row in _csv(out / "kernel_details.csv")}
    assert {"Conv2D-op1", "MatMul-op2", "DropoutGenMask-op3", "ReluGrad-op5", "ApplyMomentum-op30"} <= kernels
    assert not kernels & {"computation_op", "free_time", "1", "Default"}  # its own lanes are not ops
    ops = json.loads((out / "communication.json").read_text())
    assert "AllReduce-op22" in json.dumps(ops)

    loaded = perfsight.load(run / "perfsight_output")  # the cache holds the vendor's tables too
    assert loaded.step_trace["fp_bp_ns"].tolist() == [10_000_000] * 3
    assert loaded.vendor_step_trace["fp_bp_ns"].tolist() == [7_500_000] * 3
    assert loaded.trace(0).vendor.step_trace["tail_ns"].to_pylist() == [2_000_000] * 3
    links = loaded.mindinsight_hccl_links
    sdma = links[(links["step"] == 1) & (links["link"] == "SDMA")].iloc[0]
    assert (sdma["bytes"], sdma["transit_ns"]) == (2048 * 1024, 500_000)
    trace = loaded.trace(0)
    assert sorted(set(trace.comm.column("collective").to_pylist())) == ["all_reduce"]
    assert trace.comm.num_rows == 6 and trace.meta.framework == "mindspore"


def test_the_r13_cluster_layout_is_one_job_of_global_ranks(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = _copy(tmp_path, "cluster")
    assert len(find_traces(run)) == 4  # hccl.json is the rank table, not a trace
    assert main(["analyse", str(run), "--no-progress", "--executor", "serial", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    cluster = doc["cluster"]
    assert cluster["ranks"] == 4 and cluster["missing_ranks"] == []
    assert cluster["hosts"] == 2 and cluster["world_size"] == 4  # from hccl.json + host_ips_mapping.txt
    assert [r["rank"] for r in cluster["slow_ranks"]] == [3]  # host 2's device 1: 3 ms more compute
    rank3 = next(r for r in doc["ranks"] if r["rank"] == 3)
    # no op timeline, so no op to place FP/BP by: perfsight's forward+backward is the whole step
    assert [s["fp_bp_ns"] for s in rank3["steps"]] == [s["duration_ns"] for s in rank3["steps"]]
    assert any("rank 3: perfsight's step trace differs" in w and "10.500 ms" in w for w in rank3["warnings"])
    assert rank3["time_shares"] == {}  # no timeline: compute unknown, never "100 % free"
    assert any("ascend_timeline_display_1.json: missing" in w for w in rank3["warnings"])
    assert (run / "perfsight_output" / "cluster_analysis_output" / "cluster_step_trace_time.csv").is_file()
    host2 = run / "cluster_profiler" / "2" / "profiler"
    assert main(["analyse", str(host2), "--no-progress", "--executor", "serial"]) == 0
    assert "ranks missing from this job of 4: 0-1" in capsys.readouterr().out  # one host's folder
    assert main(["analyse", str(host2 / "step_trace_raw_1_detail_time.csv"), "--no-progress"]) == 0
    one = capsys.readouterr().out
    assert "== rank 3 of 4" in one and "where the time goes: unknown" in one


def test_damaged_legacy_files_are_warnings_naming_them_and_the_rest_loads(tmp_path: Path) -> None:
    run = _copy(tmp_path, "single")
    profiler = run / "profiler"
    step_file = profiler / "step_trace_raw_0_detail_time.csv"
    lines = step_file.read_text().splitlines()
    garbage = ",".join(["x"] * len(lines[0].split(",")))  # the right number of cells, no numbers
    truncated = lines[3][:25]
    step_file.write_text("\n".join([lines[0], lines[1], garbage, lines[2], truncated]) + "\n")
    hccl = profiler / "hccl_raw_0.csv"
    hccl.write_text("step_num,communication_cost\n1,1.5\n")  # link_info and wait_cost missing
    timeline = profiler / "ascend_timeline_display_0.json"
    text = timeline.read_text()
    timeline.write_text(text[: text.index("ReluGrad-op5") + 40])  # cut inside an event
    trace = read_trace(step_file)
    warnings = "\n".join(trace.meta.warnings)
    assert f"{step_file}: 1 malformed row(s) skipped" in warnings
    assert f"{step_file}: 1 row(s) without a numeric step_num/start/end skipped" in warnings
    assert f"{hccl}: lacks columns" in warnings
    assert f"{timeline}: damaged after" in warnings
    assert trace.steps.column("step").to_pylist() == [1, 2]  # the good rows
    assert {"Conv2D-op1", "MatMul-op2"} <= set(trace.slices.column("name").cast("string").to_pylist())
    analysis = perfsight.analyse(run, out=tmp_path / "out")
    assert analysis.vendor_step_trace["tail_ns"].tolist() == [2_000_000, 2_000_000]


def test_a_legacy_folder_with_nothing_readable_is_a_one_line_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    profiler = tmp_path / "profiler"
    profiler.mkdir()
    (profiler / "step_trace_raw_0_detail_time.csv").write_text("")
    assert main(["analyse", str(profiler), "--no-progress"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "step_trace_raw_0_detail_time.csv: no readable steps and no timeline" in err[0]


def test_a_step_trace_without_rows_leaves_the_timeline_as_one_step(tmp_path: Path) -> None:
    run = _copy(tmp_path, "single")
    step_file = run / "profiler" / "step_trace_raw_0_detail_time.csv"
    step_file.write_text(step_file.read_text().splitlines()[0] + "\n")  # header only
    trace = read_trace(step_file)
    assert trace.steps.to_pylist()[0]["inferred"] and trace.steps.num_rows == 1
    assert set(trace.slices.column("step").to_pylist()) == {0}
    assert any("the whole timeline is one step" in w for w in trace.meta.warnings)
    result = perfsight.analyse(run, out=tmp_path / "out")  # perfsight's own step trace then
    assert result.overlap_breakdown["computing_ns"].tolist() == [3 * 7_800_000]
