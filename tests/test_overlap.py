"""Overlap breakdown (step_trace_time.csv) and the interval arithmetic under it.

Unit tests use hand-made traces whose every column is worked out in comments;
real-trace tests check the documented invariants and compare with an oracle
computed in plain Python straight from the raw Kineto JSON.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pytest

from _trace_builder import make_trace
from conftest import ns_exact as _ns
from conftest import raw_events_exact as _raw_events
from conftest import read_real as _read
from perfsight import intervals as iv
from perfsight.analysis.overlap import OVERLAP_SCHEMA, overlap_breakdown, overlap_intervals, time_shares
from perfsight.model import Trace
from shared_data import KINETO

NCCL = KINETO / "nccl_parser_config" / "nccl_data.json.gz"
DF_INDEX = KINETO / "df_index_resolver" / "df_index_resolver.json.gz"
CPU_ONLY = KINETO / "cpu_only" / "rank-34.Jul_15_10_52_41.1074.pt.trace.json.gz"


# ---------------------------------------------------------------------------------------------
# intervals


def _pairs(sets: iv.Intervals) -> list[tuple[int, int]]:
    return list(zip(sets[0].tolist(), sets[1].tolist(), strict=True))


def test_union_merges_nested_touching_and_unsorted_intervals_and_drops_empty_ones() -> None:
    merged = iv.union([30, 0, 5, 10, 40, 50], [35, 10, 7, 20, 40, 49])
    assert _pairs(merged) == [(0, 20), (30, 35)]  # [10,20) touches [0,10); [40,40) and [50,49) are empty
    assert iv.total([30, 0, 5, 10], [35, 10, 7, 20]) == 25
    assert _pairs(iv.union([], [])) == []


def test_intersect_and_subtract_split_time_between_two_sets() -> None:
    a = ([0, 20, 50], [10, 40, 60])
    b = ([5, 30, 55], [25, 52, 70])
    assert _pairs(iv.intersect(a, b)) == [(5, 10), (20, 25), (30, 40), (50, 52), (55, 60)]
    assert _pairs(iv.subtract(a, b)) == [(0, 5), (25, 30), (52, 55)]
    assert _pairs(iv.subtract(b, a)) == [(10, 20), (40, 50), (60, 70)]
    assert _pairs(iv.intersect(a, iv.empty())) == []
    assert _pairs(iv.subtract(a, iv.empty())) == [(0, 10), (20, 40), (50, 60)]


def test_clip_cuts_to_the_window_and_drops_what_falls_outside() -> None:
    assert _pairs(iv.clip([0, 20, 90], [30, 50, 95], 10, 40)) == [(10, 30), (20, 40)]


def test_window_queries_measure_first_covered_and_contains_agree_with_hand_counts() -> None:
    merged = iv.union([10, 40], [20, 60])
    assert iv.measure(merged, [0, 15, 45, 70], [100, 45, 50, 80]).tolist() == [30, 10, 5, 0]
    assert iv.first_covered(merged, [0, 15, 25, 65], [100, 30, 35, 80]).tolist() == [10, 15, 35, 80]
    assert iv.contains(merged, [9, 10, 19, 20, 59, 60]).tolist() == [False, True, True, False, True, False]
    assert iv.measure(iv.empty(), [0], [10]).tolist() == [0]


def _cover(sets: iv.Intervals, size: int) -> np.ndarray:
    mask = np.zeros(size, bool)
    for start, end in zip(sets[0].tolist(), sets[1].tolist(), strict=True):
        mask[max(start, 0) : max(end, 0)] = True
    return mask


def test_interval_functions_agree_with_a_nanosecond_by_nanosecond_count_on_random_sets() -> None:
    rng = np.random.default_rng(7)
    for _ in range(200):
        a_s = rng.integers(0, 90, 12)
        a = (a_s, a_s + rng.integers(-3, 15, 12))
        b_s = rng.integers(0, 90, 9)
        b = (b_s, b_s + rng.integers(0, 20, 9))
        ca, cb = _cover(a, 128), _cover(b, 128)
        u = iv.union(*a)
        assert (_cover(u, 128) == ca).all() and iv.total(*a) == ca.sum()
        assert (np.diff(u[0]) > 0).all() and (u[0][1:] > u[1][:-1]).all()  # sorted, disjoint, not touching
        assert (_cover(iv.intersect(a, b), 128) == (ca & cb)).all()
        assert (_cover(iv.subtract(a, b), 128) == (ca & ~cb)).all()
        lo, hi = sorted(rng.integers(0, 128, 2).tolist())
        assert iv.measure(u, [lo], [hi]).tolist() == [int(ca[lo:hi].sum())]
        first = np.flatnonzero(ca[lo:hi])
        assert iv.first_covered(u, [lo], [hi]).tolist() == [lo + int(first[0]) if first.size else hi]
        points = rng.integers(0, 128, 5)
        assert iv.contains(u, points).tolist() == ca[points].tolist()


# ---------------------------------------------------------------------------------------------
# overlap on hand-made traces

HOST, STREAM_A, STREAM_B, STREAM_NCCL = 0, 1, 2, 3


def _kernel(
    track: int, start: int, end: int, corr: int = -1, kind: str = "kernel", name: str = "k"
) -> dict[str, Any]:
    return {
        "kind": kind,
        "name": name,
        "track": track,
        "pid": 0,
        "tid": 7 + track,
        "is_device": True,
        "start_ns": start,
        "dur_ns": end - start,
        "correlation": corr,
    }


def _runtime(start: int, corr: int) -> dict[str, Any]:
    return {
        "kind": "runtime",
        "name": "cudaLaunchKernel",
        "track": HOST,
        "start_ns": start,
        "dur_ns": 1,
        "depth": 1,
        "correlation": corr,
    }


def _three_step_device_trace() -> Trace:
    """Three host steps of 100 ns; step 2's last work runs until 230, after step 3 began on the host."""
    slices = [
        *[
            {
                "kind": "step",
                "name": f"ProfilerStep#{i}",
                "track": HOST,
                "start_ns": 100 * (i - 1),
                "dur_ns": 100,
            }
            for i in (1, 2, 3)
        ],
        # step 1: compute [10,50) [60,70); communication [40,80)
        _kernel(STREAM_A, 10, 30),
        _kernel(STREAM_B, 25, 50),
        _kernel(STREAM_A, 60, 70),
        _kernel(STREAM_NCCL, 40, 80, kind="communication", name="ncclKernel_AllReduce"),
        # step 2: compute [120,150) [210,220); a receive [140,180); an all-reduce [200,230)
        _kernel(STREAM_A, 120, 150),
        _kernel(STREAM_NCCL, 140, 180, kind="communication", name="ncclDevKernel_SendRecv"),
        _runtime(150, corr=10),
        _kernel(STREAM_NCCL, 200, 230, corr=10, kind="communication", name="ncclAllReduce"),
        _runtime(160, corr=11),
        _kernel(STREAM_A, 210, 220, corr=11),
        # step 3: compute [240,260)
        _kernel(STREAM_A, 240, 260),
    ]
    steps = [{"step": i, "start_ns": 100 * (i - 1), "end_ns": 100 * i} for i in (1, 2, 3)]
    # the SendRecv kernel (row 8) is a receive according to the comm table
    comm = [{"slice": 8, "is_device": True, "collective": "recv"}]
    return make_trace(slices, steps, comm=comm)


CSV_ORDER = OVERLAP_SCHEMA.names[2:]
"""step, computing, comm not overlapped, overlapped, comm, free, stage, bubble, comm excl. recv, preparing."""


def _by_step(table: Any) -> dict[int, tuple[int, ...]]:
    return {row["step"]: tuple(row[c] for c in CSV_ORDER) for row in table.to_pylist()}


def test_breakdown_of_a_hand_made_three_step_device_trace_matches_hand_arithmetic() -> None:
    got = _by_step(overlap_breakdown(_three_step_device_trace()))
    # step 1, window [0,100): busy [10,80) -> preparing 10, stage 90; compute [10,50)+[60,70) = 50;
    # comm [40,80) = 40, of which [40,50)+[60,70) = 20 overlapped; free = 90 - 50 - 20.
    assert got[1] == (100, 50, 20, 20, 40, 20, 90, 0, 20, 10)
    # step 2, window [100,230) (its all-reduce, launched at 150, ends at 230): compute [120,150)+[210,220)
    # = 40; comm [140,180)+[200,230) = 70, overlapped [140,150)+[210,220) = 20; receive alone [150,180) = 30.
    assert got[2] == (130, 40, 50, 20, 70, 20, 110, 30, 20, 20)
    # step 3 starts where step 2's window ends: [230,300); compute [240,260).
    assert got[3] == (70, 20, 0, 0, 0, 40, 60, 0, 0, 10)


def test_overlap_lanes_are_the_merged_intervals_behind_the_breakdown() -> None:
    lanes: dict[str, list[tuple[int, int]]] = {}
    for row in overlap_intervals(_three_step_device_trace()).to_pylist():
        lanes.setdefault(row["lane"], []).append((row["start_ns"], row["end_ns"]))
    assert lanes["Computing"] == [(10, 50), (60, 70), (120, 150), (210, 220), (240, 260)]
    assert lanes["Communication"] == [(40, 80), (140, 180), (200, 230)]
    assert lanes["Communication(Not Overlapped)"] == [(50, 60), (70, 80), (150, 180), (200, 210), (220, 230)]
    assert lanes["Free"] == [(80, 100), (180, 200), (260, 300)]


def test_a_receive_is_recognised_through_the_host_op_that_launched_it() -> None:
    slices = [
        {"kind": "step", "name": "ProfilerStep#0", "track": HOST, "start_ns": 0, "dur_ns": 100},
        {
            "kind": "communication",
            "name": "c10d::recv_",
            "track": HOST,
            "start_ns": 5,
            "dur_ns": 10,
            "depth": 1,
            "external_id": 77,
        },
        _runtime(6, corr=1) | {"depth": 2, "external_id": 77},
        _kernel(STREAM_NCCL, 20, 60, corr=1, kind="communication", name="ncclDevKernel_SendRecv"),
        _kernel(STREAM_A, 50, 70),
    ]
    row = overlap_breakdown(make_trace(slices, [{"step": 0, "start_ns": 0, "end_ns": 100}])).to_pylist()[0]
    # receive [20,60) minus compute [50,70) = 30 ns of bubble; nothing else is communication.
    assert (row["communication_ns"], row["overlapped_ns"], row["bubble_ns"]) == (40, 10, 30)
    assert row["communication_not_overlapped_exclude_receive_ns"] == 0


def test_host_timeline_counts_cpu_ops_outside_collectives_and_data_loading_as_compute() -> None:
    main, gloo = 0, 1
    slices = [
        {"kind": "step", "name": "ProfilerStep#3", "track": main, "start_ns": 0, "dur_ns": 100},
        {
            "kind": "data_loading",
            "name": "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__",
            "track": main,
            "start_ns": 0,
            "dur_ns": 10,
            "depth": 1,
        },
        {"kind": "cpu_op", "name": "aten::stack", "track": main, "start_ns": 2, "dur_ns": 6, "depth": 2},
        {"kind": "cpu_op", "name": "aten::linear", "track": main, "start_ns": 15, "dur_ns": 25, "depth": 1},
        {
            "kind": "cpu_op",
            "name": "autograd::engine::evaluate_function: AccumulateGrad",
            "track": main,
            "start_ns": 42,
            "dur_ns": 13,
            "depth": 1,
        },
        {
            "kind": "communication",
            "name": "c10d::allreduce_",
            "track": main,
            "start_ns": 45,
            "dur_ns": 5,
            "depth": 2,
        },
        {
            "kind": "communication",
            "name": "gloo:all_reduce",
            "track": gloo,
            "tid": 2,
            "start_ns": 46,
            "dur_ns": 24,
        },
        {
            "kind": "cpu_op",
            "name": "aten::copy_",
            "track": gloo,
            "tid": 2,
            "start_ns": 50,
            "dur_ns": 2,
            "depth": 1,
        },
    ]
    row = overlap_breakdown(make_trace(slices, [{"step": 3, "start_ns": 0, "end_ns": 100}])).to_pylist()[0]
    # compute: [15,40) + [42,55) minus the allreduce call [45,50) = 33 (aten::stack is data loading,
    # aten::copy_ runs inside gloo's collective); communication [45,70) = 25, of which [50,55) overlaps.
    assert row["computing_ns"] == 33
    assert (row["communication_ns"], row["overlapped_ns"], row["communication_not_overlapped_ns"]) == (
        25,
        5,
        20,
    )
    assert (row["preparing_ns"], row["stage_ns"], row["free_ns"]) == (15, 85, 32)


def test_a_trace_without_steps_gives_empty_tables_with_the_contract_columns() -> None:
    empty = make_trace([], [])
    assert overlap_breakdown(empty).schema == OVERLAP_SCHEMA
    assert overlap_breakdown(empty).num_rows == 0
    assert overlap_intervals(empty).column_names == ["rank", "lane", "start_ns", "end_ns"]


# ---------------------------------------------------------------------------------------------
# real Kineto traces


def _union_length(pairs: list[tuple[int, int]]) -> int:
    """Plain-Python union length: the oracle, independent of perfsight.intervals."""
    total, reach = 0, None
    for start, end in sorted(pairs):
        if reach is None or start > reach:
            total += end - start
            reach = end
        elif end > reach:
            total += end - reach
            reach = end
    return total


def _clip(events: list[dict[str, Any]], lo: int, hi: int) -> list[tuple[int, int]]:
    pairs = [(max(_ns(e["ts"]), lo), min(_ns(e["ts"]) + _ns(e["dur"]), hi)) for e in events]
    return [(s, e) for s, e in pairs if e > s]


@pytest.fixture(scope="module")
def nccl() -> Trace:
    return _read(NCCL)


def _check_invariants(table: Any) -> None:
    b = table.to_pandas()
    assert (b.computing_ns + b.communication_not_overlapped_ns + b.free_ns == b.stage_ns).all()
    assert (b.stage_ns + b.preparing_ns == b.step_ns).all()
    assert (b.communication_not_overlapped_ns == b.communication_ns - b.overlapped_ns).all()
    assert (b.drop(columns=["rank", "step"]) >= 0).all().all()


def test_nccl_trace_compute_and_communication_equal_unions_computed_from_the_raw_json(nccl: Trace) -> None:
    events = _raw_events(NCCL)
    markers = sorted(
        (e for e in events if str(e.get("name", "")).startswith("ProfilerStep#")), key=lambda e: e["ts"]
    )
    table = overlap_breakdown(nccl)
    _check_invariants(table)
    rows = table.to_pylist()
    assert [r["step"] for r in rows] == [int(m["name"].split("#")[1]) for m in markers] == [4, 5, 6]
    gpu = [e for e in events if e.get("ph") == "X" and e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]
    nccl_kernels = [e for e in gpu if e["name"].startswith("nccl")]
    compute = [e for e in gpu if not e["name"].startswith("nccl")]
    for row, marker in zip(rows, markers, strict=True):
        lo, hi = _ns(marker["ts"]), _ns(marker["ts"]) + _ns(marker["dur"])
        # every GPU op of this trace finishes before the host step marker ends: the window is the marker
        assert row["step_ns"] == hi - lo
        assert row["communication_ns"] == _union_length(_clip(nccl_kernels, lo, hi)) > 0
        assert row["computing_ns"] == _union_length(_clip(compute, lo, hi)) > 0
        first_gpu = min(s for s, _ in _clip(gpu, lo, hi))
        assert row["preparing_ns"] == first_gpu - lo
        assert row["bubble_ns"] == 0  # all-reduce and broadcast only: no receive


def test_nccl_trace_overlap_lanes_add_up_to_the_breakdown(nccl: Trace) -> None:
    totals = overlap_breakdown(nccl).to_pandas().sum()
    lanes = overlap_intervals(nccl).to_pandas()
    length = (lanes.end_ns - lanes.start_ns).groupby(lanes.lane).sum()
    assert length["Computing"] == totals.computing_ns
    assert length["Communication"] == totals.communication_ns
    assert length["Communication(Not Overlapped)"] == totals.communication_not_overlapped_ns
    assert length["Free"] == totals.free_ns


def test_five_step_trace_has_one_row_per_profiler_step_and_keeps_the_invariants() -> None:
    trace = _read(DF_INDEX)
    markers = [e for e in _raw_events(DF_INDEX) if str(e.get("name", "")).startswith("ProfilerStep#")]
    table = overlap_breakdown(trace)
    assert table.num_rows == len(markers) == 5
    _check_invariants(table)
    assert (np.asarray(table.column("communication_ns")) > 0).all()


def test_cpu_only_gloo_trace_is_judged_on_the_host_timeline_with_gloo_threads_as_communication() -> None:
    trace = _read(CPU_ONLY)
    events = _raw_events(CPU_ONLY)
    (marker,) = [e for e in events if str(e.get("name", "")).startswith("ProfilerStep#")]
    lo, hi = _ns(marker["ts"]), _ns(marker["ts"]) + _ns(marker["dur"])
    gloo = _clip([e for e in events if str(e.get("name", "")).startswith("gloo:")], lo, hi)
    ops_in_step = [e for e in events if e.get("cat") == "cpu_op" and lo <= _ns(e["ts"]) < hi]
    (row,) = overlap_breakdown(trace).to_pylist()
    _check_invariants(overlap_breakdown(trace))
    assert ops_in_step == [] and row["computing_ns"] == 0  # the file's four cpu_ops come after the step
    assert row["communication_ns"] == _union_length(gloo) > 0
    assert row["preparing_ns"] == min(s for s, _ in gloo) - lo


def test_time_shares_sum_each_column_over_steps_and_divide_by_all_steps_time() -> None:
    """Two 100 ns steps: computing 60 + 20, not-overlapped communication 10 + 30, free 30 + 40,
    preparing 0 + 10, overlapped 5 + 0 (inside computing): shares of 200 ns."""
    rows = [
        {"rank": 2, "step": 1, "step_ns": 100, "computing_ns": 60, "communication_not_overlapped_ns": 10,
         "overlapped_ns": 5, "communication_ns": 15, "free_ns": 30, "stage_ns": 100, "bubble_ns": 0,
         "communication_not_overlapped_exclude_receive_ns": 10, "preparing_ns": 0},
        {"rank": 2, "step": 2, "step_ns": 100, "computing_ns": 20, "communication_not_overlapped_ns": 30,
         "overlapped_ns": 0, "communication_ns": 30, "free_ns": 40, "stage_ns": 90, "bubble_ns": 0,
         "communication_not_overlapped_exclude_receive_ns": 30, "preparing_ns": 10},
    ]  # fmt: skip
    shares = {
        r["share"]: r for r in time_shares(pa.Table.from_pylist(rows, schema=OVERLAP_SCHEMA)).to_pylist()
    }
    assert {name: (r["ns"], r["fraction"]) for name, r in shares.items()} == {
        "computing": (80, 0.4),
        "communication_overlapped": (5, 0.025),
        "communication_not_overlapped": (40, 0.2),
        "free": (70, 0.35),
        "preparing": (10, 0.05),
    }
    assert {r["total_ns"] for r in shares.values()} == {200} and {r["rank"] for r in shares.values()} == {2}
    assert time_shares(OVERLAP_SCHEMA.empty_table()).num_rows == 0  # nothing broken down: unknown
