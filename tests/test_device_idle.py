"""Device idle time split by what the device waited for (``analysis.device_idle``).

A hand-made trace is worked out on paper; on the real Kineto traces every step's split is checked
against one computed in plain Python from the raw JSON (kernels, memcpys and memsets matched to
their runtime launch calls by correlation id), and against ``overlap_breakdown``'s free time.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from _trace_builder import make_trace
from conftest import ns_exact as _ns
from conftest import raw_events_exact as _raw_events
from conftest import read_real as _read
from perfsight.analysis.clock import step_windows
from perfsight.analysis.device_idle import DEVICE_IDLE_SCHEMA, device_idle
from perfsight.analysis.overlap import overlap_breakdown, overlap_intervals
from perfsight.analysis.step_trace import step_trace
from perfsight.model import Trace
from shared_data import KINETO

HOST, STREAM = 0, 1
_FP_SCHEMA = pa.schema([("step", pa.int32()), ("fp_start_ns", pa.int64())])

DF_INDEX = KINETO / "df_index_resolver" / "df_index_resolver.json.gz"
NCCL = KINETO / "nccl_parser_config" / "nccl_data.json.gz"
CPU_ONLY = KINETO / "cpu_only" / "rank-34.Jul_15_10_52_41.1074.pt.trace.json.gz"


def _step(number: int, start: int, end: int) -> dict[str, Any]:
    return {
        "kind": "step",
        "name": f"ProfilerStep#{number}",
        "track": HOST,
        "start_ns": start,
        "dur_ns": end - start,
    }


def _op(name: str, start: int, end: int, ext: int) -> dict[str, Any]:
    return {"kind": "cpu_op", "name": name, "track": HOST, "start_ns": start, "dur_ns": end - start,
            "depth": 1, "external_id": ext}  # fmt: skip


def _launch(start: int, corr: int, ext: int) -> dict[str, Any]:
    return {"kind": "runtime", "name": "cudaLaunchKernel", "track": HOST, "start_ns": start, "dur_ns": 1,
            "depth": 2, "correlation": corr, "external_id": ext}  # fmt: skip


def _kernel(start: int, end: int, corr: int) -> dict[str, Any]:
    return {"kind": "kernel", "name": f"k{corr}", "track": STREAM, "pid": 0, "tid": 7, "is_device": True,
            "start_ns": start, "dur_ns": end - start, "correlation": corr}  # fmt: skip


def _two_step_trace() -> Trace:
    """Step 1 [0,100): k1 [10,20) launched at 2; k2 [40,50) launched at 30 by aten::add; k3 [70,80)
    launched early, at 5.  Step 2 [100,200): k4 [110,120) launched at 101; k5 [150,160) launched at
    140 by aten::mul; k6 [160,170) launched at 125 by aten::add, running right after k5."""
    slices = [
        _step(1, 0, 100),
        _op("aten::relu", 1, 6, ext=1),
        _launch(2, corr=1, ext=1),
        _launch(5, corr=3, ext=1),
        _op("aten::add", 29, 32, ext=2),
        _launch(30, corr=2, ext=2),
        _kernel(10, 20, corr=1),
        _kernel(40, 50, corr=2),
        _kernel(70, 80, corr=3),
        _step(2, 100, 200),
        _op("aten::relu", 100, 103, ext=3),
        _launch(101, corr=4, ext=3),
        _op("aten::add", 124, 127, ext=5),
        _launch(125, corr=6, ext=5),
        _op("aten::mul", 139, 142, ext=4),
        _launch(140, corr=5, ext=4),
        _kernel(110, 120, corr=4),
        _kernel(150, 160, corr=5),
        _kernel(160, 170, corr=6),
    ]
    steps = [{"step": 1, "start_ns": 0, "end_ns": 100}, {"step": 2, "start_ns": 100, "end_ns": 200}]
    return make_trace(slices, steps)


def test_each_free_interval_is_cut_at_the_launch_call_of_the_work_that_ends_it() -> None:
    rows = {r["step"]: r for r in device_idle(_two_step_trace()).to_pylist()}
    # step 1: stage [10,100); free [20,40) [50,70) [80,100).
    #   [20,40) ends with k2, launched at 30: 10 waiting for the host, then 10 after the launch;
    #   [50,70) ends with k3, launched at 5: all 20 after the launch (k3 waited on something else);
    #   [80,100) ends with the window: unattributed.
    one = rows[1]
    assert (one["free_ns"], one["host_wait_ns"], one["after_launch_ns"], one["unattributed_ns"]) == (
        60,
        10,
        30,
        20,
    )
    assert (one["gaps"], one["median_gap_ns"], one["longest_gap_ns"]) == (3, 20, 20)
    assert (one["device_work"], one["median_work_ns"]) == (3, 10)
    assert (one["top_wait_op"], one["top_wait_op_ns"]) == ("aten::add", 10)
    # step 2: stage [110,200); free [120,150) (k5 launched at 140: 20 + 10) and [170,200) (window end);
    # k6 follows k5 with no gap, so aten::add's early launch cuts nothing
    two = rows[2]
    assert (two["free_ns"], two["host_wait_ns"], two["after_launch_ns"], two["unattributed_ns"]) == (
        60,
        20,
        10,
        30,
    )
    assert (two["gaps"], two["median_gap_ns"], two["longest_gap_ns"]) == (2, 30, 30)
    assert (two["top_wait_op"], two["top_wait_op_ns"]) == ("aten::mul", 20)


def _parts(row: dict[str, Any]) -> int:
    return row["before_forward_ns"] + row["host_wait_ns"] + row["after_launch_ns"] + row["unattributed_ns"]


def test_free_time_is_overlap_breakdowns_and_the_four_parts_add_up_to_it() -> None:
    trace = _two_step_trace()
    idle = device_idle(trace, step_trace(trace)).to_pylist()
    free = [r["free_ns"] for r in overlap_breakdown(trace).to_pylist()]
    assert [r["free_ns"] for r in idle] == free
    assert all(_parts(r) == r["free_ns"] for r in idle)


def test_free_time_before_the_forward_start_is_left_to_the_iteration_gap() -> None:
    """With step 1's forward pass starting at 30, the first 10 of the free interval [20,40) are the
    iteration gap's; the 10 after it are still split at k2's launch call (30)."""
    forward = pa.table({"step": [1, 2], "fp_start_ns": [30, None]}, schema=_FP_SCHEMA)
    rows = {r["step"]: r for r in device_idle(_two_step_trace(), forward).to_pylist()}
    one = rows[1]
    assert (one["free_ns"], one["before_forward_ns"], one["host_wait_ns"], one["after_launch_ns"]) == (
        60,
        10,
        0,
        30,
    )
    assert (one["gaps"], one["longest_gap_ns"]) == (3, 20)  # [30,40) [50,70) [80,100)
    assert one["top_wait_op"] is None  # nothing waited for the host after the forward start
    assert rows[2]["before_forward_ns"] == 0  # forward start unknown: the window's start


def test_a_trace_without_steps_gives_an_empty_table_of_the_schema() -> None:
    trace = make_trace([_kernel(10, 20, corr=1)], [])
    table = device_idle(trace)
    assert table.schema == DEVICE_IDLE_SCHEMA and table.num_rows == 0


# ---------------------------------------------------------------------------------------------
# real Kineto traces


def split_from_raw(path: Path, trace: Trace, steps: pa.Table) -> dict[int, tuple[int, ...]]:
    """Per step: (before the forward start, host wait, after launch, unattributed, gaps, longest gap)
    in plain Python.

    The free intervals are ``overlap_intervals``' Free lane (checked against the raw JSON in
    test_overlap.py) cut at ``step_trace``'s forward start; what ends each one is found here from
    the raw events alone: the device events that start at its end, and the earliest runtime call
    with one of their correlation ids."""
    events = _raw_events(path)
    calls: dict[int, int] = {}
    for e in events:
        if (
            e.get("ph") == "X"
            and e.get("cat") in ("cuda_runtime", "cuda_driver")
            and "correlation" in e.get("args", {})
        ):
            corr = int(e["args"]["correlation"])
            calls[corr] = min(calls.get(corr, _ns(e["ts"])), _ns(e["ts"]))
    launched_at: dict[int, int | None] = {}  # device start -> earliest launch call of what starts there
    for e in events:
        if (
            e.get("ph") == "X"
            and e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")
            and _ns(e["dur"]) > 0
        ):
            start, call = _ns(e["ts"]), calls.get(int(e.get("args", {}).get("correlation", -1)))
            known = [t for t in (launched_at.get(start), call) if t is not None]
            launched_at[start] = min(known) if known else None
    windows = step_windows(trace).to_pylist()
    free = [r for r in overlap_intervals(trace).to_pylist() if r["lane"] == "Free"]
    forward = {r["step"]: r["fp_start_ns"] for r in steps.to_pylist()}
    out: dict[int, list[int]] = {w["step"]: [0, 0, 0, 0, 0, 0] for w in windows}
    for interval in free:
        lo, hi = interval["start_ns"], interval["end_ns"]
        step = next(w["step"] for w in windows if w["start_ns"] <= lo < w["end_ns"])
        row = out[step]
        fp = forward.get(step)
        if fp is not None and fp > lo:
            row[0] += min(fp, hi) - lo
            lo = min(fp, hi)
        if lo == hi:
            continue
        call = launched_at.get(hi)
        host = min(max(call - lo, 0), hi - lo) if call is not None else 0
        after = hi - lo - host if call is not None else 0
        row[1] += host
        row[2] += after
        row[3] += hi - lo - host - after
        row[4] += 1
        row[5] = max(row[5], hi - lo)
    return {step: tuple(row) for step, row in out.items()}  # type: ignore[misc]


@pytest.mark.parametrize("path", [DF_INDEX, NCCL], ids=["df_index_resolver", "nccl_data"])
def test_real_traces_split_equals_the_raw_json_launch_calls(path: Path) -> None:
    trace = _read(path)
    steps = step_trace(trace)
    want = split_from_raw(path, trace, steps)
    rows = device_idle(trace, steps).to_pylist()
    got = {
        r["step"]: (
            r["before_forward_ns"],
            r["host_wait_ns"],
            r["after_launch_ns"],
            r["unattributed_ns"],
            r["gaps"],
            r["longest_gap_ns"],
        )
        for r in rows
    }
    assert got == want
    free = {r["step"]: r["free_ns"] for r in overlap_breakdown(trace).to_pylist()}
    assert {r["step"]: r["free_ns"] for r in rows} == free
    # these two traces are launch-bound: most of the device's idle time waits for the host
    assert sum(r["host_wait_ns"] for r in rows) > 0.5 * sum(free.values())
    assert all(_parts(r) == r["free_ns"] for r in rows)


def test_a_host_only_trace_has_no_launches_to_wait_for() -> None:
    rows = device_idle(_read(CPU_ONLY)).to_pylist()
    assert rows
    assert all(r["host_wait_ns"] == r["after_launch_ns"] == 0 for r in rows)
    assert all(r["unattributed_ns"] == r["free_ns"] for r in rows)
