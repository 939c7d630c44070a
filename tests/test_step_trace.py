"""Step trace: iteration interval, forward+backward and tail of every step.

A hand-made one-step trace pins down FP/BP detection and its device mapping;
real Kineto traces check step counts, the exact sum, and facts read straight
from the raw JSON.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pyarrow as pa

from _trace_builder import make_trace
from conftest import need_file
from conftest import ns_exact as _ns
from conftest import raw_events_exact as _raw_events
from conftest import read_real as _read
from perfsight.analysis.step_trace import STEP_TRACE_SCHEMA, named_point_warnings, step_trace
from perfsight.model import Trace
from shared_data import KINETO

NCCL = KINETO / "nccl_parser_config" / "nccl_data.json.gz"
DF_INDEX = KINETO / "df_index_resolver" / "df_index_resolver.json.gz"
CPU_ONLY = KINETO / "cpu_only" / "rank-34.Jul_15_10_52_41.1074.pt.trace.json.gz"

MAIN, AUTOGRAD, STREAM, NCCL_STREAM = 0, 1, 2, 3
TRACK_NAMES = {
    MAIN: "thread 1 (pt_main_thread)",
    AUTOGRAD: "thread 2 (pt_autograd_0)",
    STREAM: "stream 7",
    NCCL_STREAM: "stream 20",
}
EVALUATE_MM = "autograd::engine::evaluate_function: MmBackward0"


def _host(
    kind: str, name: str, track: int, start: int, end: int, depth: int, corr: int = -1
) -> dict[str, Any]:
    return {
        "kind": kind,
        "name": name,
        "track": track,
        "tid": 1 + track,
        "start_ns": start,
        "dur_ns": end - start,
        "depth": depth,
        "correlation": corr,
    }


def _device(kind: str, track: int, start: int, end: int, corr: int) -> dict[str, Any]:
    return {
        "kind": kind,
        "name": f"{kind} {corr}",
        "track": track,
        "pid": 0,
        "tid": 7 + track,
        "is_device": True,
        "start_ns": start,
        "dur_ns": end - start,
        "correlation": corr,
    }


def _one_step(backward_name: str = EVALUATE_MM, with_device: bool = True) -> Trace:
    """One 100 ns step: data loading, a forward op, a backward node, DDP's bucket copy, an optimizer op."""
    slices = [
        _host("step", "ProfilerStep#1", MAIN, 0, 100, 0),
        _host("data_loading", "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__", MAIN, 2, 12, 1),
        _host("cpu_op", "aten::stack", MAIN, 4, 8, 2),  # collating: inside data loading, not the forward
        _host("cpu_op", "aten::linear", MAIN, 15, 30, 1),
        _host("runtime", "cudaLaunchKernel", MAIN, 16, 17, 2, corr=1),
        _host("cpu_op", backward_name, AUTOGRAD, 35, 50, 0),
        _host("runtime", "cudaLaunchKernel", AUTOGRAD, 36, 37, 1, corr=2),
        _host("runtime", "cudaLaunchKernel", AUTOGRAD, 45, 46, 1, corr=4),  # the gradient all-reduce
        _host("cpu_op", "torch.distributed.ddp.reducer::copy_bucket_to_grad", AUTOGRAD, 52, 54, 0),
        _host("runtime", "cudaMemcpyAsync", AUTOGRAD, 52, 53, 1, corr=3),
        _host("cpu_op", "aten::add_", MAIN, 60, 90, 1),
        _host("runtime", "cudaLaunchKernel", MAIN, 61, 62, 2, corr=5),
    ]
    if with_device:
        slices += [
            _device("kernel", STREAM, 20, 28, corr=1),  # forward
            _device("kernel", STREAM, 40, 55, corr=2),  # backward
            _device("communication", NCCL_STREAM, 56, 68, corr=4),  # all-reduce, launched from backward
            _device("memcpy", STREAM, 70, 72, corr=3),  # bucket -> grad copy, after the all-reduce
            _device("kernel", STREAM, 75, 85, corr=5),  # optimizer
        ]
    return make_trace(slices, [{"step": 1, "start_ns": 0, "end_ns": 100}], track_names=TRACK_NAMES)


def _row(table: Any) -> dict[str, Any]:
    (row,) = table.to_pylist()
    return row


def _phases(row: dict[str, Any]) -> tuple[int, int, int]:
    return row["iteration_interval_ns"], row["fp_bp_ns"], row["tail_ns"]


def test_device_fp_is_the_first_kernel_launched_by_the_first_op_after_data_loading() -> None:
    row = _row(step_trace(_one_step()))
    assert (row["fp_op"], row["fp_start_ns"]) == ("aten::linear", 20)


def test_device_bp_is_the_last_compute_launched_by_a_backward_node_and_the_all_reduce_is_tail() -> None:
    row = _row(step_trace(_one_step()))
    assert (row["bp_op"], row["bp_end_ns"]) == (EVALUATE_MM, 55)
    assert _phases(row) == (20, 35, 45)
    assert row["timeline"] == "device"


def test_host_timeline_uses_the_host_ops_own_times() -> None:
    row = _row(step_trace(_one_step(with_device=False)))
    assert (row["timeline"], row["fp_start_ns"], row["bp_end_ns"]) == ("host", 15, 50)
    assert _phases(row) == (15, 35, 50)


def test_without_autograd_node_slices_the_autograd_threads_ops_are_the_backward() -> None:
    row = _row(step_trace(_one_step(backward_name="MmBackward0")))
    # the bucket copy on the autograd thread is now the last backward op; its memcpy ends at 72
    assert (row["bp_op"], row["bp_end_ns"]) == ("torch.distributed.ddp.reducer::copy_bucket_to_grad", 72)


def test_bp_point_names_the_op_whose_device_work_ends_the_backward() -> None:
    row = _row(step_trace(_one_step(), bp_point="aten::add_"))
    assert (row["bp_op"], row["bp_end_ns"]) == ("aten::add_", 85)
    assert _phases(row) == (20, 65, 15)


def test_points_that_cut_the_step_backwards_count_as_failed_detection() -> None:
    row = _row(step_trace(_one_step(), fp_point="aten::add_"))  # FP at 75 would come after BP at 55
    assert (row["fp_op"], row["bp_op"]) == ("", "")
    assert (row["fp_start_ns"], row["bp_end_ns"]) == (0, 100)
    assert _phases(row) == (0, 100, 0)


def test_an_absent_fp_point_falls_back_to_automatic_detection_with_a_warning() -> None:
    table = step_trace(_one_step(), fp_point="no_such_op")
    row = _row(table)
    assert (row["fp_op"], row["fp_start_ns"]) == ("aten::linear", 20)
    (line,) = named_point_warnings(table, "no_such_op", None)
    assert "FP point 'no_such_op'" in line and "1 of 1 steps" in line
    assert named_point_warnings(step_trace(_one_step(), bp_point="aten::add_"), None, "aten::add_") == []


def test_a_misspelt_fp_point_is_in_the_summary_of_perfsight_analyse(tmp_path: Path) -> None:
    trace = need_file(NCCL)
    result = subprocess.run(
        [sys.executable, "-m", "perfsight.cli", "analyse", str(trace), "--out", str(tmp_path), "--json",
         "--fp-point", "aten::no_such_op"],
        capture_output=True, text=True, timeout=300, check=True,
    )  # fmt: skip
    (summary,) = json.loads(result.stdout)  # one summary per rank analysed
    steps = len(summary["steps"])
    assert any(
        "FP point 'aten::no_such_op'" in w and f"{steps} of {steps} steps" in w for w in summary["warnings"]
    )


def test_a_step_without_backward_is_reported_whole_as_forward_and_backward() -> None:
    slices = [_host("step", "ProfilerStep#7", MAIN, 0, 50, 0), _host("cpu_op", "aten::mm", MAIN, 5, 20, 1)]
    row = _row(step_trace(make_trace(slices, [{"step": 7, "start_ns": 0, "end_ns": 50}])))
    assert _phases(row) == (0, 50, 0)
    assert (row["fp_op"], row["bp_op"], row["step"]) == ("", "", 7)


def test_a_trace_without_steps_gives_an_empty_table_with_the_contract_columns() -> None:
    table = step_trace(make_trace([], []))
    assert table.num_rows == 0 and table.schema == STEP_TRACE_SCHEMA


# ---------------------------------------------------------------------------------------------
# real Kineto traces


def _markers(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return sorted(
        (e for e in events if str(e.get("name", "")).startswith("ProfilerStep#")), key=lambda e: e["ts"]
    )


def _check_sums(table: Any) -> None:
    t = table.to_pandas()
    assert (t.iteration_interval_ns + t.fp_bp_ns + t.tail_ns == t.duration_ns).all()
    assert (t.duration_ns == t.end_ns - t.start_ns).all()
    assert ((t.start_ns <= t.fp_start_ns) & (t.fp_start_ns <= t.bp_end_ns) & (t.bp_end_ns <= t.end_ns)).all()


def test_nccl_trace_steps_split_at_the_first_gpu_op_and_just_before_the_last_gradient_all_reduce() -> None:
    trace = _read(NCCL)
    events = _raw_events(NCCL)
    markers = _markers(events)
    table = step_trace(trace)
    _check_sums(table)
    rows = table.to_pylist()
    assert [r["step"] for r in rows] == [int(m["name"].split("#")[1]) for m in markers] == [4, 5, 6]
    gpu = [e for e in events if e.get("ph") == "X" and e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]
    for row, marker in zip(rows, markers, strict=True):
        lo, hi = _ns(marker["ts"]), _ns(marker["ts"]) + _ns(marker["dur"])
        in_step = [e for e in gpu if lo <= _ns(e["ts"]) < hi]
        all_reduces = [e for e in in_step if e["name"].startswith("ncclKernel_AllReduce")]
        last_all_reduce = max(all_reduces, key=lambda e: e["ts"])
        assert (row["start_ns"], row["end_ns"], row["timeline"]) == (lo, hi, "device")
        # the forward starts with the step's first GPU op (DDP's buffer broadcast: a concatenation kernel)
        assert row["fp_start_ns"] == min(_ns(e["ts"]) for e in in_step)
        # BP ends at the end of a real GPU op, before the last gradient all-reduce begins (which is tail)
        assert row["bp_end_ns"] in {_ns(e["ts"]) + _ns(e["dur"]) for e in in_step}
        assert row["bp_end_ns"] <= _ns(last_all_reduce["ts"])
        assert row["bp_op"].startswith("autograd::engine::evaluate_function")
        assert row["fp_op"] != "" and row["iteration_interval_ns"] > 0 and row["tail_ns"] > 0


def test_five_step_trace_finds_forward_and_backward_in_every_step() -> None:
    trace = _read(DF_INDEX)
    table = step_trace(trace)
    assert table.num_rows == len(_markers(_raw_events(DF_INDEX))) == 5
    _check_sums(table)
    assert all(op != "" for op in table.column("fp_op").to_pylist() + table.column("bp_op").to_pylist())


def test_cpu_only_step_without_operators_is_reported_whole_on_the_host_timeline() -> None:
    trace = _read(CPU_ONLY)
    (marker,) = _markers(_raw_events(CPU_ONLY))
    row = _row(step_trace(trace))
    assert (row["step"], row["timeline"], row["duration_ns"]) == (551, "host", _ns(marker["dur"]))
    assert _phases(row) == (0, row["duration_ns"], 0)
    assert (row["fp_op"], row["bp_op"]) == ("", "")


def test_a_vendor_step_trace_is_a_cross_check_beside_ours_never_in_its_place() -> None:
    """The vendor says step 1 is 20 ns gap, 60 ns fp+bp, 20 ns tail; ours (above: FP at 20, BP at 55
    on a 0-100 window) is 20 / 35 / 45.  The step trace stays ours; the vendor's is its own table,
    and the phases that differ are listed with both values and said in a warning."""
    from perfsight.model import STEP_PHASES_SCHEMA
    from perfsight.pipeline import Options, analyse_trace

    trace = _one_step()
    vendor_row = {"rank": 0, "step": 1, "start_ns": 0, "end_ns": 100, "duration_ns": 100, "fp_start_ns": 20}
    vendor_row |= {"bp_end_ns": 80, "iteration_interval_ns": 20, "fp_bp_ns": 60, "tail_ns": 20}
    trace.vendor.step_trace = pa.Table.from_pylist([vendor_row], schema=STEP_PHASES_SCHEMA)
    result = analyse_trace(trace, Options())
    assert _phases(_row(result.tables["step_trace"])) == (20, 35, 45)
    assert _phases(_row(result.tables["vendor_step_trace"])) == (20, 60, 20)
    differences = result.tables["vendor_step_differences"].to_pylist()
    assert [(d["phase"], d["perfsight_ns"], d["vendor_ns"]) for d in differences] == [
        ("fp_bp_ns", 35, 60),
        ("tail_ns", 45, 20),
    ]
    assert result.warnings == [
        "rank 0: perfsight's step trace differs from the one the source's tool recorded "
        "(table vendor_step_trace) in 1 step(s); step 1: forward+backward 0.000 vs 0.000 ms, "
        "tail 0.000 vs 0.000 ms"
    ]


def test_without_a_vendor_step_trace_there_is_nothing_to_compare() -> None:
    from perfsight.pipeline import Options, analyse_trace

    result = analyse_trace(_one_step(), Options())
    assert result.tables["vendor_step_differences"].num_rows == 0
    assert "vendor_step_trace" not in result.tables and result.warnings == []
