"""Memory curve, peaks and per-allocation lifetimes (memory_record.csv, operator_memory.csv).

Unit tests use hand-made allocator events whose pairing is worked out in comments;
real-trace tests compare with plain gzip+json reads of the raw Kineto file.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from decimal import Decimal
from typing import Any

import pyarrow as pa
import pytest

from _trace_builder import make_trace
from conftest import kineto_file, raw_events
from perfsight.analysis.memory import (
    MEMORY_PEAKS_SCHEMA,
    OPERATOR_MEMORY_SCHEMA,
    memory_curve,
    memory_peaks,
    operator_memory,
)
from perfsight.ingest import read_trace
from perfsight.model import MEMORY_SCHEMA, Trace, conform

MAIN, OTHER = 11, 22  # thread ids


def _memory(rows: list[dict[str, Any]]) -> pa.Table:
    defaults = {"rank": 0, "device_type": "cuda", "device_index": 0, "tid": MAIN, "reserved_bytes": 4096}
    rows = [{**defaults, **r} for r in rows]
    return conform(pa.table({k: [r.get(k) for r in rows] for k in rows[0]}), MEMORY_SCHEMA)


def _ops() -> list[dict[str, Any]]:
    """Thread 11: aten::linear [0,100) > aten::addmm [10,60) > record_function [20,40) (an annotation);
    aten::empty [200,210).  Thread 22: aten::zeros [0,500)."""
    return [
        {
            "kind": "cpu_op",
            "name": "aten::linear",
            "track": 0,
            "tid": MAIN,
            "start_ns": 0,
            "dur_ns": 100,
            "depth": 0,
        },
        {
            "kind": "cpu_op",
            "name": "aten::addmm",
            "track": 0,
            "tid": MAIN,
            "start_ns": 10,
            "dur_ns": 50,
            "depth": 1,
        },
        {
            "kind": "annotation",
            "name": "## block ##",
            "track": 0,
            "tid": MAIN,
            "start_ns": 20,
            "dur_ns": 20,
            "depth": 2,
        },
        {
            "kind": "cpu_op",
            "name": "aten::empty",
            "track": 0,
            "tid": MAIN,
            "start_ns": 200,
            "dur_ns": 10,
            "depth": 0,
        },
        {
            "kind": "cpu_op",
            "name": "aten::zeros",
            "track": 1,
            "tid": OTHER,
            "start_ns": 0,
            "dur_ns": 500,
            "depth": 0,
        },
    ]


def _trace(memory: list[dict[str, Any]]) -> Trace:
    return dataclasses.replace(make_trace(_ops(), steps=[]), memory=_memory(memory))


EVENTS = [
    # addr A: alloc 100 at 30 (inside the annotation, inside addmm), freed at 70;
    # re-allocated at 205, never freed
    {"ts_ns": 30, "addr": 0xA, "bytes": 100, "allocated_bytes": 100},
    {"ts_ns": 70, "addr": 0xA, "bytes": -100, "allocated_bytes": 200, "reserved_bytes": 8192},
    {"ts_ns": 205, "addr": 0xA, "bytes": 50, "allocated_bytes": 50},
    # addr B on the other thread: alloc 200 at 50, freed at 300
    {"ts_ns": 50, "addr": 0xB, "bytes": 200, "tid": OTHER, "allocated_bytes": 300},
    {"ts_ns": 300, "addr": 0xB, "bytes": -200, "allocated_bytes": 0},
    # addr C: a release whose allocation happened before the trace window: ignored
    {"ts_ns": 5, "addr": 0xC, "bytes": -64, "allocated_bytes": 36},
    # addr D: alloc at 80 (after addmm ended, linear still running), then allocated again with no release
    {"ts_ns": 80, "addr": 0xD, "bytes": 8, "allocated_bytes": 308},
    {"ts_ns": 150, "addr": 0xD, "bytes": 8, "allocated_bytes": 316},
]


def test_each_allocation_pairs_with_the_next_release_of_its_address() -> None:
    table = operator_memory(_trace(EVENTS))
    assert table.schema == OPERATOR_MEMORY_SCHEMA
    rows = [(r["alloc_ns"], r["size_bytes"], r["release_ns"], r["duration_ns"]) for r in table.to_pylist()]
    assert rows == [
        (30, 100, 70, 40),
        (50, 200, 300, 250),
        (80, 8, None, None),  # the next event at its address is another allocation
        (150, 8, None, None),
        (205, 50, None, None),
    ]


def test_totals_around_allocation_and_release_come_from_those_events() -> None:
    first = operator_memory(_trace(EVENTS)).to_pylist()[0]
    assert (first["allocated_at_alloc_bytes"], first["reserved_at_alloc_bytes"]) == (100, 4096)
    assert (first["allocated_at_release_bytes"], first["reserved_at_release_bytes"]) == (200, 8192)
    assert (first["device_type"], first["device_index"], first["rank"]) == ("cuda", 0, 0)


def test_allocation_is_named_after_the_innermost_host_op_on_its_thread() -> None:
    names = operator_memory(_trace(EVENTS))["name"].to_pylist()
    # 30: inside the annotation inside addmm -> addmm;  50 on thread 22 -> zeros (not addmm);
    # 80: addmm has ended, linear still runs;  150: nothing runs;  205: aten::empty
    assert names == ["aten::addmm", "aten::zeros", "aten::linear", None, "aten::empty"]


def test_release_at_the_same_instant_as_a_reallocation_follows_trace_order() -> None:
    events = [
        {"ts_ns": 10, "addr": 0xA, "bytes": 16, "allocated_bytes": 16},
        {"ts_ns": 20, "addr": 0xA, "bytes": -16, "allocated_bytes": 0},
        {"ts_ns": 20, "addr": 0xA, "bytes": 32, "allocated_bytes": 32},
        {"ts_ns": 25, "addr": 0xA, "bytes": -32, "allocated_bytes": 0},
    ]
    table = operator_memory(_trace(events))
    assert list(zip(table["size_bytes"].to_pylist(), table["release_ns"].to_pylist(), strict=True)) == [
        (16, 20),
        (32, 25),
    ]


def test_same_address_on_another_device_is_another_block() -> None:
    events = [
        {"ts_ns": 10, "addr": 0xA, "bytes": 16, "allocated_bytes": 16},
        {"ts_ns": 20, "addr": 0xA, "bytes": -16, "device_index": 1, "allocated_bytes": 0},
    ]
    assert operator_memory(_trace(events))["release_ns"].to_pylist() == [None]


def test_curve_is_per_device_in_time_order_and_peaks_record_when_first_reached() -> None:
    events = [
        {"ts_ns": 30, "addr": 1, "bytes": 10, "allocated_bytes": 500, "reserved_bytes": 1000},
        {"ts_ns": 10, "addr": 2, "bytes": 10, "allocated_bytes": 100, "reserved_bytes": 2000},
        {"ts_ns": 40, "addr": 1, "bytes": -10, "allocated_bytes": 500, "reserved_bytes": 1000},
        {
            "ts_ns": 20,
            "addr": 3,
            "bytes": 8,
            "device_type": "cpu",
            "device_index": -1,
            "allocated_bytes": 8,
            "reserved_bytes": None,
        },
    ]
    trace = _trace(events)
    curve = memory_curve(trace)
    assert list(zip(curve["device_type"].to_pylist(), curve["ts_ns"].to_pylist(), strict=True)) == [
        ("cpu", 20),
        ("cuda", 10),
        ("cuda", 30),
        ("cuda", 40),
    ]
    peaks = memory_peaks(trace)
    assert peaks.schema == MEMORY_PEAKS_SCHEMA
    assert peaks.to_pylist() == [
        {
            "rank": 0,
            "device_type": "cpu",
            "device_index": -1,
            "peak_allocated_bytes": 8,
            "peak_reserved_bytes": None,
            "peak_ts_ns": 20,
        },
        {
            "rank": 0,
            "device_type": "cuda",
            "device_index": 0,
            "peak_allocated_bytes": 500,
            "peak_reserved_bytes": 2000,
            "peak_ts_ns": 30,
        },
    ]


def test_no_memory_events_give_empty_tables() -> None:
    trace = make_trace(_ops(), steps=[])
    assert (
        memory_curve(trace).num_rows == memory_peaks(trace).num_rows == operator_memory(trace).num_rows == 0
    )


# ---------------------------------------------------------------------------------------------
# real trace


def _ns(value: float | int) -> int:
    return int(Decimal(str(value)) * 1000)


@pytest.fixture(scope="module")
def df_index() -> tuple[Trace, list[dict]]:
    path = kineto_file("df_index_resolver/df_index_resolver.json.gz")
    return read_trace(path), [
        e for e in raw_events(path) if e.get("name") == "[memory]" or e.get("ph") == "X"
    ]


def test_peak_equals_the_largest_total_allocated_in_the_file(df_index: tuple[Trace, list[dict]]) -> None:
    trace, events = df_index
    memory = [e["args"] for e in events if e.get("name") == "[memory]"]
    cuda = [a for a in memory if a["Device Type"] == 1]
    peaks = {(r["device_type"], r["device_index"]): r for r in memory_peaks(trace).to_pylist()}
    assert (
        peaks[("cuda", 1)]["peak_allocated_bytes"] == max(a["Total Allocated"] for a in memory) == 6629508096
    )
    assert peaks[("cuda", 1)]["peak_reserved_bytes"] == max(a["Total Reserved"] for a in cuda)
    assert memory_curve(trace).num_rows == len(memory) == 28010


def test_allocation_pairing_matches_a_sequential_replay_of_the_file(
    df_index: tuple[Trace, list[dict]],
) -> None:
    trace, events = df_index
    memory = sorted(
        ((_ns(e["ts"]), i, e["args"]) for i, e in enumerate(events) if e.get("name") == "[memory]"),
        key=lambda t: (t[0], t[1]),
    )
    pending: dict[tuple, int] = {}  # (device, addr) -> alloc time of the block live there
    lifetimes = []
    allocations = 0
    for ts, _, a in memory:
        key = (a["Device Type"], a["Device Id"], a["Addr"])
        if a["Bytes"] > 0:
            allocations += 1
            pending[key] = ts
        elif key in pending:
            lifetimes.append(ts - pending.pop(key))
    table = operator_memory(trace)
    assert table.num_rows == allocations
    released = [d for d in table["duration_ns"].to_pylist() if d is not None]
    assert len(released) == len(lifetimes) and sum(released) == sum(lifetimes)


def test_allocations_are_named_by_a_replay_of_the_thread_call_stack(
    df_index: tuple[Trace, list[dict]],
) -> None:
    trace, events = df_index
    # per thread, walk ops and allocations in time order keeping the stack of open cpu_ops
    timeline = []
    for e in events:
        if e.get("cat") == "cpu_op":
            timeline.append((e["tid"], _ns(e["ts"]), 0, -_ns(e["dur"]), e["name"]))
        elif e.get("name") == "[memory]" and e["args"]["Bytes"] > 0:
            timeline.append((e["tid"], _ns(e["ts"]), 1, 0, None))
    timeline.sort(key=lambda t: t[:4])
    expected: Counter[str | None] = Counter()
    stack: list[tuple[int, str]] = []
    thread = None
    for tid, ts, is_alloc, neg_dur, name in timeline:
        if tid != thread:
            stack, thread = [], tid
        while stack and stack[-1][0] < ts:
            stack.pop()
        if is_alloc:
            expected[stack[-1][1] if stack else None] += 1
        else:
            stack.append((ts - neg_dur, name))
    got = Counter(operator_memory(trace)["name"].to_pylist())
    assert expected[None] < sum(expected.values()) / 10  # most allocations happen inside an op
    assert got == expected
