"""Kernel details and kernel statistics (kernel_details.csv and the per-kernel table).

Unit tests use hand-made traces with waits worked out in comments; real-trace tests
count and sum straight from the raw Kineto JSON.
"""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from decimal import Decimal

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from _trace_builder import make_trace
from conftest import kineto_file, raw_events
from perfsight.analysis.kernels import KERNEL_DETAILS_SCHEMA, kernel_details, kernel_stats, stream_wait_ns
from perfsight.ingest import read_trace
from perfsight.model import Trace


def _device(
    name: str, start: int, dur: int, *, track: int = 1, stream: int = 7, kind: str = "kernel", **extra: object
) -> dict:
    return {
        "kind": kind,
        "name": name,
        "track": track,
        "tid": stream,
        "pid": 0,
        "is_device": True,
        "start_ns": start,
        "dur_ns": dur,
        **extra,
    }


def _trace() -> Trace:
    """Stream 7: k1 [0,10) k2 [15,20) k3 [18,25) (overlaps k2) copy [30,40);  stream 8: k4 [5,6).
    aten::addmm (ext 3) launches k1 via a runtime call with correlation 100."""
    return make_trace(
        [
            {
                "kind": "cpu_op",
                "name": "aten::addmm",
                "track": 0,
                "start_ns": -50,
                "dur_ns": 40,
                "depth": 0,
                "external_id": 3,
                "input_dims": [[32], [64, 128], [128, 32], [], []],
                "input_types": ["c10::BFloat16", "c10::BFloat16", "c10::BFloat16", "Scalar", "Scalar"],
            },
            {
                "kind": "runtime",
                "name": "cudaLaunchKernel",
                "track": 0,
                "start_ns": -40,
                "dur_ns": 5,
                "depth": 1,
                "external_id": 3,
                "correlation": 100,
            },
            _device("k1", 0, 10, correlation=100, grid=[24, 1, 1], block=[128, 1, 1], occupancy_pct=50.0),
            _device("k2", 15, 5),
            _device("k3", 18, 7),
            _device("copy", 30, 10, kind="memcpy", bytes=4096),
            _device("k4", 5, 1, track=2, stream=8),
            _device("ProfilerStep#1", 0, 100, track=3, stream=9, kind="device_annotation"),
            _device("ncclKernel_AllReduce", 50, 20, track=2, stream=8, kind="communication"),
        ],
        steps=[],
    )


def test_wait_is_the_idle_gap_since_earlier_work_on_the_same_stream_ended() -> None:
    det = kernel_details(_trace())
    wait = dict(zip(det["name"].to_pylist(), det["wait_ns"].to_pylist(), strict=True))
    # k1 first on stream 7; k2 starts 5 after k1 ends; k3 starts while k2 runs; copy 5 after k3 ends;
    # stream 8: k4 first, the NCCL kernel 50 - 6 = 44 after it
    assert wait == {"k1": 0, "k2": 5, "k3": 0, "copy": 5, "k4": 0, "ncclKernel_AllReduce": 44}


def test_wait_uses_the_latest_end_not_the_previous_slice() -> None:
    # [0,100) then [10,20) nested inside it, then [110,120): the gap is 10, not 90
    track = pc.cast([1, 1, 1], "int64").to_numpy()
    start = pc.cast([0, 10, 110], "int64").to_numpy()
    end = pc.cast([100, 20, 120], "int64").to_numpy()
    assert stream_wait_ns(track, start, end).tolist() == [0, 0, 10]


def test_details_name_the_launching_op_and_its_shapes_and_skip_annotations() -> None:
    det = kernel_details(_trace())
    assert det.schema == KERNEL_DETAILS_SCHEMA
    assert "ProfilerStep#1" not in det["name"].to_pylist()
    k1 = det.filter(pc.equal(det["name"], "k1")).to_pylist()[0]
    assert k1["op"] == "aten::addmm" and k1["stream"] == 7 and k1["kind"] == "kernel"
    assert json.loads(k1["grid"]) == [24, 1, 1] and json.loads(k1["block"]) == [128, 1, 1]
    assert k1["occupancy_pct"] == 50.0
    assert json.loads(k1["input_dims"]) == [[32], [64, 128], [128, 32], [], []]
    assert json.loads(k1["input_types"])[0] == "c10::BFloat16"
    k2 = det.filter(pc.equal(det["name"], "k2")).to_pylist()[0]
    assert k2["op"] is None and k2["input_dims"] is None and k2["grid"] is None
    assert det["start_ns"].to_pylist() == sorted(det["start_ns"].to_pylist())


def test_kernel_stats_aggregate_per_name_and_kind() -> None:
    trace = make_trace([_device("gemm", 0, 10), _device("gemm", 20, 30), _device("relu", 60, 60)], steps=[])
    stats = {r["name"]: r for r in kernel_stats(trace).to_pylist()}
    gemm = stats["gemm"]
    assert (gemm["count"], gemm["total_ns"], gemm["avg_ns"], gemm["min_ns"], gemm["max_ns"]) == (
        2,
        40,
        20,
        10,
        30,
    )
    assert gemm["ratio"] == pytest.approx(40 / 100) and stats["relu"]["ratio"] == pytest.approx(0.6)
    assert kernel_stats(trace)["name"].to_pylist() == ["relu", "gemm"]


def test_no_device_work_gives_empty_tables() -> None:
    trace = make_trace(
        [{"kind": "cpu_op", "name": "aten::mm", "track": 0, "start_ns": 0, "dur_ns": 5}], steps=[]
    )
    assert kernel_details(trace).num_rows == 0
    assert kernel_stats(trace).num_rows == 0


# ---------------------------------------------------------------------------------------------
# real traces

_DEVICE_CATS = ("kernel", "gpu_memcpy", "gpu_memset")


def _ns(value: float | int) -> int:
    return int(Decimal(str(value)) * 1000)


@pytest.fixture(scope="module")
def df_index() -> tuple[Trace, list[dict]]:
    path = kineto_file("df_index_resolver/df_index_resolver.json.gz")
    return read_trace(path), raw_events(path)


def test_kernel_count_equals_raw_kernel_events(df_index: tuple[Trace, list[dict]]) -> None:
    trace, events = df_index
    raw = Counter(e.get("cat") for e in events if e.get("ph") == "X")
    det = kernel_details(trace)
    kinds = Counter(det["kind"].to_pylist())
    assert raw["kernel"] == 19370
    assert kinds["kernel"] + kinds["communication"] == raw["kernel"]
    assert kinds["memcpy"] == raw["gpu_memcpy"] and kinds["memset"] == raw["gpu_memset"]


def test_total_wait_equals_raw_per_stream_gaps(df_index: tuple[Trace, list[dict]]) -> None:
    trace, events = df_index
    per_stream: dict[tuple, list[tuple[int, int]]] = defaultdict(list)
    for e in events:
        if e.get("cat") in _DEVICE_CATS and e.get("ph") == "X":
            start = _ns(e["ts"])
            per_stream[(e["pid"], e["tid"])].append((start, start + _ns(e["dur"])))
    expected = 0
    for spans in per_stream.values():
        spans.sort()
        reach = spans[0][1]
        for start, end in spans[1:]:
            expected += max(start - reach, 0)
            reach = max(reach, end)
    det = kernel_details(trace)
    assert int(pc.sum(det["wait_ns"]).as_py()) == expected
    assert int(pc.sum(det["dur_ns"]).as_py()) == sum(
        _ns(e["dur"]) for e in events if e.get("cat") in _DEVICE_CATS and e.get("ph") == "X"
    )


def test_nccl_kernels_are_counted_as_communication() -> None:
    path = kineto_file("nccl_parser_config/nccl_data.json.gz")
    events = raw_events(path)
    raw = Counter(
        e["name"] for e in events if e.get("cat") == "kernel" and e["name"].startswith("ncclKernel")
    )
    stats = kernel_stats(read_trace(path))
    comm = stats.filter(pc.equal(stats["kind"], "communication"))
    assert sum(raw.values()) == 21
    assert dict(zip(comm["name"].to_pylist(), comm["count"].to_pylist(), strict=True)) == dict(raw)
    assert sum(stats["ratio"].to_pylist()) == pytest.approx(1.0)


def _launching_ops_from_raw(events: list[dict]) -> Counter:
    """(kernel name, launching op name) counted straight from the raw events: the kernel's runtime
    call (same correlation), then the innermost ``cpu_op`` of the call's thread that has the call's
    External id and spans its start -- else the innermost ``cpu_op`` spanning it at all."""
    runtime = {
        e["args"]["correlation"]: e
        for e in events
        if e.get("ph") == "X" and e.get("cat") in ("cuda_runtime", "cuda_driver") and "args" in e
    }
    ops_by_thread: dict[tuple, list[dict]] = defaultdict(list)
    ops_by_ext: dict[tuple, list[dict]] = defaultdict(list)
    for e in events:
        if e.get("ph") == "X" and e.get("cat") == "cpu_op":
            ops_by_thread[(e["pid"], e["tid"])].append(e)
            ops_by_ext[(e["pid"], e["tid"], e.get("args", {}).get("External id"))].append(e)

    def innermost(ops: list[dict], at: Decimal) -> str | None:
        spanning = [o for o in ops if _ns(o["ts"]) <= at <= _ns(o["ts"]) + _ns(o["dur"])]
        return max(spanning, key=lambda o: (_ns(o["ts"]), -_ns(o["dur"])))["name"] if spanning else None

    pairs: Counter = Counter()
    for e in events:
        if e.get("ph") != "X" or e.get("cat") != "kernel":
            continue
        call = runtime.get(e.get("args", {}).get("correlation"))
        op = None
        if call is not None:
            thread, at = (call["pid"], call["tid"]), _ns(call["ts"])
            ext = call.get("args", {}).get("External id")
            op = innermost(ops_by_ext.get((*thread, ext), []), at) or innermost(ops_by_thread[thread], at)
        pairs[(e["name"], op)] += 1
    return pairs


def test_each_kernel_is_charged_to_the_innermost_op_that_launched_it() -> None:
    # aten::cudnn_convolution begins with a zero-length child at its own start; that child once
    # took a nesting level from it, and its kernels went to the op around it (aten::_convolution)
    path = kineto_file("critical_path/alexnet/benchmark_result_2869224_1695835535_trace.json.gz")
    det = kernel_details(read_trace(path))
    kernels = det.filter(pc.is_in(det["kind"], pa.array(["kernel", "communication"])))
    found = Counter(zip(kernels["name"].to_pylist(), kernels["op"].to_pylist(), strict=True))
    assert found == _launching_ops_from_raw(raw_events(path))
