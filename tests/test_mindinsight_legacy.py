"""MindInsight's legacy ``profiler/`` layout and the r1.3 cluster layout, from fixtures written to the
documented formats (tests/fixtures/mindinsight_legacy)."""

from __future__ import annotations

import shutil
from pathlib import Path

from perfsight.ingest.mindinsight_legacy import is_legacy_folder, read_legacy
from perfsight.model import STEP_PHASES_SCHEMA

FIXTURES = Path(__file__).parent / "fixtures" / "mindinsight_legacy"


def test_step_trace_ticks_become_nanoseconds_in_perfsights_step_trace_columns() -> None:
    run = read_legacy(FIXTURES / "single")
    # nothing is wrong with the folder: its only note says where the cluster numbers come from
    problems = [w for w in run.warnings if "MindSpore's cluster analysis" not in w]
    assert problems == [] and is_legacy_folder(FIXTURES / "single" / "profiler")
    [rank] = run.ranks
    assert rank.step_trace.schema == STEP_PHASES_SCHEMA
    first = rank.step_trace.to_pylist()[0]
    # row 1: start 100000, end 1100000, fp 150000, bp 900000 ticks of 10 ns
    assert (first["step"], first["start_ns"], first["end_ns"]) == (1, 1_000_000, 11_000_000)
    assert (first["fp_start_ns"], first["bp_end_ns"]) == (1_500_000, 9_000_000)
    assert first["iteration_interval_ns"] + first["fp_bp_ns"] + first["tail_ns"] == first["duration_ns"]
    assert rank.step_trace.num_rows == 3  # the "-" average row is kept apart
    assert rank.step_trace_average["total"] == 10_000_000
    streams = rank.stream_communication.to_pylist()
    assert len(streams) == 3 and streams[0]["stream"] == "stream_10_parallel_0"
    assert streams[0]["dur_ns"] == 1_400_000 == streams[0]["end_ns"] - streams[0]["start_ns"]


def test_hccl_raw_json_cells_become_links_in_bytes_and_nanoseconds() -> None:
    [rank] = read_legacy(FIXTURES / "single").ranks
    assert rank.hccl_steps.to_pylist()[0] == {
        "rank": 0,
        "step": 1,
        "communication_ns": 1_750_000,
        "wait_ns": 250_000,
    }
    links = {(r["step"], r["link"]): r for r in rank.hccl_links.to_pylist()}
    sdma = links[(1, "SDMA")]
    assert (sdma["src_rank"], sdma["dst_rank"], sdma["transit_ns"], sdma["bytes"]) == (
        0,
        1,
        500_000,
        2048 * 1024,
    )
    assert links[(2, "RDMA")]["bandwidth_bytes_per_s"] == 819200.0 * 1024
    assert rank.hccl_ops.to_pylist()[0]["values"] == [2.0, 1.75, 0.875]


def test_the_other_legacy_files_are_kept() -> None:
    [rank] = read_legacy(FIXTURES / "single").ranks
    assert rank.parallel == {"mode": "data", "stages": 1, "ranks": 8}
    assert rank.flops["total_flops"] == 1.2e9
    assert rank.tables["minddata_pipeline_raw_0.csv"].column("op_type").to_pylist() == ["Batch", "Map"]
    assert rank.timeline_events is not None and rank.timeline_events.num_rows == 42
    assert rank.info["rank_id"] == 0


def test_the_cluster_layout_maps_host_and_device_to_the_global_rank() -> None:
    run = read_legacy(FIXTURES / "cluster")
    assert run.warnings == []
    assert [(r.rank, r.host, r.device_id) for r in run.ranks] == [
        (0, "1", 0),
        (1, "1", 1),
        (2, "2", 0),
        (3, "2", 1),
    ]
    assert run.rank_table.column("host_ip").to_pylist() == ["10.0.0.1"] * 2 + ["10.0.0.2"] * 2
    slowest = max(run.ranks, key=lambda r: sum(r.step_trace.column("fp_bp_ns").to_pylist()))
    assert slowest.rank == 3  # host 2's device 1 computes 3 ms longer per step


def test_damaged_legacy_files_are_named_and_the_rest_still_loads(tmp_path: Path) -> None:
    shutil.copytree(FIXTURES / "cluster", tmp_path / "cluster")
    profiler = tmp_path / "cluster" / "cluster_profiler" / "2" / "profiler"
    step_file = profiler / "step_trace_raw_1_detail_time.csv"
    step_file.write_text(step_file.read_text() + "garbage,row\n")
    (profiler / "step_trace_raw_7_detail_time.csv").write_text(step_file.read_text())
    hccl = profiler / "hccl_raw_0.csv"
    header = "step_num,communication_cost,wait_cost,link_info,communication_operator_cost\n"
    hccl.write_text(header + '1,2.0,0.5,"{not json",\n')
    (tmp_path / "cluster" / "host_ips_mapping.txt").write_text("10.0.0.1 1\n10.0.0.2 2\nbroken\n")
    run = read_legacy(tmp_path / "cluster")
    warnings = "\n".join(run.warnings)
    assert f"{step_file}: 1 malformed row(s) skipped" in warnings
    assert f"{hccl}: step 1: link_info is not JSON" in warnings
    assert "host_ips_mapping.txt: line 3" in warnings
    assert "device 7 is not in the rank table" in warnings
    assert [r.rank for r in run.ranks] == [0, 1, 2, 3, 7]
    rank2 = next(r for r in run.ranks if r.rank == 2)
    assert rank2.hccl_steps.to_pylist()[0]["communication_ns"] == 2_000_000 and rank2.hccl_links.num_rows == 0
