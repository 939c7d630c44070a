"""Operator instances and statistics (the operator page, op_statistic-style tables).

Unit tests use hand-made traces whose numbers are worked out in comments; real-trace
tests compare with an oracle computed in plain Python from the raw Kineto JSON.
"""

from __future__ import annotations

import json
from collections import Counter
from decimal import Decimal

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from _trace_builder import make_trace
from conftest import kineto_file, raw_events
from perfsight.analysis.hierarchy import parent_rows
from perfsight.analysis.operators import (
    OPERATOR_INSTANCES_SCHEMA,
    OPERATOR_STATS_SCHEMA,
    operator_instances,
    operator_ranking,
    operator_stats,
)
from perfsight.ingest import read_trace
from perfsight.model import Trace

HOST, STREAM, OTHER_THREAD = 1, 7, 2


def _op(name: str, start: int, dur: int, depth: int, **extra: object) -> dict:
    return {
        "kind": "cpu_op",
        "name": name,
        "track": 0,
        "tid": HOST,
        "start_ns": start,
        "dur_ns": dur,
        "depth": depth,
        **extra,
    }


def _nested_trace() -> Trace:
    """Thread 1:  A [0,100) > B [10,60) > C [20,30);  B > launch [40,45);  A > D [70,90).
    Thread 2 has an op E [0,100) at the same times, to prove parents never cross tracks."""
    return make_trace(
        [
            _op("A", 0, 100, 0, external_id=1),
            _op(
                "B",
                10,
                50,
                1,
                external_id=2,
                input_dims=[[64, 128], [128, 32]],
                input_types=["float", "float"],
            ),
            _op("C", 20, 10, 2, external_id=3),
            {
                "kind": "runtime",
                "name": "cudaLaunchKernel",
                "track": 0,
                "tid": HOST,
                "start_ns": 40,
                "dur_ns": 5,
                "depth": 2,
                "external_id": 2,
                "correlation": 500,
            },
            _op("D", 70, 20, 1, external_id=4),
            {
                "kind": "cpu_op",
                "name": "E",
                "track": 1,
                "tid": OTHER_THREAD,
                "start_ns": 0,
                "dur_ns": 100,
                "depth": 0,
                "external_id": 5,
            },
            {
                "kind": "kernel",
                "name": "gemm",
                "track": 2,
                "tid": STREAM,
                "pid": 0,
                "is_device": True,
                "start_ns": 50,
                "dur_ns": 300,
                "correlation": 500,
                "external_id": 2,
            },
        ],
        steps=[],
    )


def test_parent_is_the_enclosing_slice_one_level_up_on_the_same_track() -> None:
    parents = parent_rows(_nested_trace().slices)
    #                        A   B  C  launch D  E   gemm
    assert parents.tolist() == [-1, 0, 1, 1, 0, -1, -1]


def test_self_time_subtracts_direct_children_only() -> None:
    inst = operator_instances(_nested_trace())
    self_ns = dict(zip(inst["name"].to_pylist(), inst["self_ns"].to_pylist(), strict=True))
    # A: 100 - B 50 - D 20 = 30 (C is B's child, not A's);  B: 50 - C 10 - launch 5 = 35
    assert self_ns == {"A": 30, "B": 35, "C": 10, "D": 20, "E": 100}


def test_device_time_goes_to_the_op_that_issued_the_launch() -> None:
    inst = operator_instances(_nested_trace())
    device = dict(zip(inst["name"].to_pylist(), inst["device_ns"].to_pylist(), strict=True))
    assert device == {"A": 0, "B": 300, "C": 0, "D": 0, "E": 0}


def test_launch_found_by_flow_when_correlation_is_missing() -> None:
    trace = make_trace(
        [
            _op("aten::mm", 0, 50, 0, external_id=9),
            {
                "kind": "runtime",
                "name": "cudaLaunchKernel",
                "track": 0,
                "tid": HOST,
                "start_ns": 10,
                "dur_ns": 5,
                "depth": 1,
                "external_id": 9,
            },
            {
                "kind": "kernel",
                "name": "gemm",
                "track": 1,
                "tid": STREAM,
                "is_device": True,
                "start_ns": 60,
                "dur_ns": 40,
            },
        ],
        steps=[],
        flows=[{"kind": "launch", "src": 1, "dst": 2}],
    )
    assert operator_instances(trace)["device_ns"].to_pylist() == [40]


def test_instances_carry_shapes_as_json_text_and_own_flops() -> None:
    inst = operator_instances(_nested_trace())
    b = inst.filter(pc.equal(inst["name"], "B")).to_pylist()[0]
    assert json.loads(b["input_dims"]) == [[64, 128], [128, 32]]
    assert json.loads(b["input_types"]) == ["float", "float"]
    assert b["flops"] is None  # "B" is not a recognised op
    assert b["slice"] == 1 and b["thread"] == HOST and b["dur_ns"] == 50


def test_operator_stats_aggregate_per_name() -> None:
    trace = make_trace(
        [
            _op("aten::mm", 0, 10, 0, input_dims=[[64, 128], [128, 32]]),
            _op("aten::mm", 20, 30, 0, input_dims=[[64, 128], [128, 32]]),
            _op("aten::relu", 60, 40, 0),
        ],
        steps=[],
    )
    stats = operator_stats(trace)
    assert stats.schema == OPERATOR_STATS_SCHEMA
    rows = {r["name"]: r for r in stats.to_pylist()}
    mm = rows["aten::mm"]
    assert (mm["count"], mm["host_total_ns"], mm["host_avg_ns"], mm["host_min_ns"], mm["host_max_ns"]) == (
        2,
        40,
        20,
        10,
        30,
    )
    assert mm["host_ratio"] == pytest.approx(40 / 80)
    assert mm["flops"] == 2 * (2 * 64 * 128 * 32)
    assert rows["aten::relu"]["flops"] is None
    assert sum(r["host_ratio"] for r in rows.values()) == pytest.approx(1.0)
    assert stats["name"].to_pylist() == ["aten::mm", "aten::relu"]  # largest self time first


def test_operators_are_ranked_by_device_time_when_any_else_host_self_time_ties_by_name() -> None:
    """Self times (docstring of _nested_trace): A 30, B 35, C 10, D 20, E 100; only B launched device
    work.  With device time the order is B, then the rest by host self time; without, host self
    time alone; equal times fall back to the name.  Shares are of the ranked measure."""
    stats = operator_stats(_nested_trace())
    ranking = operator_ranking(stats)
    assert ranking["name"].to_pylist() == ["B", "E", "A", "D", "C"]
    assert set(ranking["ranked_by"].to_pylist()) == {"device_total_ns"}
    assert ranking["position"].to_pylist() == [1, 2, 3, 4, 5]
    assert ranking["share"].to_pylist() == [1.0, 0.0, 0.0, 0.0, 0.0]

    no_device = stats.set_column(
        stats.schema.get_field_index("device_total_ns"), "device_total_ns", pa.array([0] * stats.num_rows)
    )
    by_host = operator_ranking(no_device)
    assert by_host["name"].to_pylist() == ["E", "B", "A", "D", "C"]
    assert set(by_host["ranked_by"].to_pylist()) == {"host_self_ns"}
    assert by_host["share"].to_pylist() == pytest.approx([100 / 195, 35 / 195, 30 / 195, 20 / 195, 10 / 195])

    tied = no_device.set_column(
        no_device.schema.get_field_index("host_self_ns"), "host_self_ns", pa.array([7] * stats.num_rows)
    )
    assert operator_ranking(tied)["name"].to_pylist() == ["A", "B", "C", "D", "E"]
    assert operator_ranking(stats.slice(0, 0)).num_rows == 0


def test_empty_trace_gives_empty_tables_with_the_contract_columns() -> None:
    empty = make_trace([], steps=[])
    assert operator_instances(empty).schema == OPERATOR_INSTANCES_SCHEMA
    assert operator_instances(empty).num_rows == 0
    assert operator_stats(empty).num_rows == 0


# ---------------------------------------------------------------------------------------------
# real traces


def _ns(value: float | int) -> int:
    return int(Decimal(str(value)) * 1000)


@pytest.fixture(scope="module")
def nccl() -> tuple[Trace, list[dict]]:
    path = kineto_file("nccl_parser_config/nccl_data.json.gz")
    return read_trace(path), raw_events(path)


def test_operator_counts_equal_raw_event_counts(nccl: tuple[Trace, list[dict]]) -> None:
    trace, events = nccl
    raw = Counter(e["name"] for e in events if e.get("cat") == "cpu_op" and e.get("ph") == "X")
    stats = operator_stats(trace)
    counts = dict(zip(stats["name"].to_pylist(), stats["count"].to_pylist(), strict=True))
    assert raw["aten::mm"] == 6
    assert counts["aten::mm"] == raw["aten::mm"]
    assert {name: counts.get(name) for name in raw} == dict(raw)


def test_operator_device_time_equals_raw_kernel_time_by_launching_op(nccl: tuple[Trace, list[dict]]) -> None:
    trace, events = nccl
    op_by_ext = {e["args"]["External id"]: e["name"] for e in events if e.get("cat") == "cpu_op"}
    runtime_ext = {
        e["args"]["correlation"]: e["args"].get("External id")
        for e in events
        if e.get("cat") == "cuda_runtime"
    }
    expected: Counter[str] = Counter()
    for e in events:
        if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset") and e.get("ph") == "X":
            name = op_by_ext.get(runtime_ext.get(e["args"]["correlation"]))
            if name is not None:
                expected[name] += _ns(e["dur"])
    stats = operator_stats(trace)
    got = {
        n: d
        for n, d in zip(stats["name"].to_pylist(), stats["device_total_ns"].to_pylist(), strict=True)
        if d
    }
    assert len(expected) > 10
    assert got == dict(expected)


def test_self_time_never_exceeds_wall_time_and_sums_to_thread_coverage(
    nccl: tuple[Trace, list[dict]],
) -> None:
    trace, _ = nccl
    inst = operator_instances(trace)
    self_ns = inst["self_ns"].to_numpy()
    assert (self_ns >= 0).all() and (self_ns <= inst["dur_ns"].to_numpy()).all()
    # summed self time of every slice of a track == the span its top-level slices cover
    slices = trace.slices
    parents = parent_rows(slices)
    dur = slices["dur_ns"].to_numpy()
    child = np.zeros(len(dur), np.int64)
    np.add.at(child, parents[parents >= 0], dur[parents >= 0])
    top = slices["depth"].to_numpy() == 0
    assert int(np.maximum(dur - child, 0).sum()) == int(dur[top].sum())


def test_every_parent_is_the_last_slice_one_level_up_on_its_track_of_a_real_trace(
    nccl: tuple[Trace, list[dict]],
) -> None:
    """The vectorised parents against a walk over the rows in (track, start, depth) order that
    remembers the last slice seen at each depth of each track (nccl: 7 levels deep)."""
    slices = nccl[0].slices
    track = slices.column("track").to_pylist()
    start = slices.column("start_ns").to_pylist()
    depth = slices.column("depth").to_pylist()
    expected = [-1] * len(track)
    last: dict[tuple[int, int], int] = {}
    for row in sorted(range(len(track)), key=lambda r: (track[r], start[r], depth[r], r)):
        expected[row] = last.get((track[row], depth[row] - 1), -1) if depth[row] > 0 else -1
        last[(track[row], depth[row])] = row
    assert max(depth) >= 3
    assert parent_rows(slices).tolist() == expected
