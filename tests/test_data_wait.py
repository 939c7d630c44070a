"""Data wait per step (analysis/data_wait.py): the capture when there is one, else the trace's
data_loading ranges summed per host step."""

from __future__ import annotations

import pyarrow as pa

from _trace_builder import make_trace
from perfsight.analysis.data_wait import CAPTURE, RANGES, data_wait
from perfsight.model import DATALOADER_SCHEMA, conform

STEPS = [{"step": 4, "start_ns": 0, "end_ns": 100}, {"step": 5, "start_ns": 100, "end_ns": 200}]


def _loading(start: int, dur: int) -> dict:
    return {"kind": "data_loading", "name": "enumerate(DataLoader)#_MultiProcessingDataLoaderIter.__next__",
            "track": 0, "start_ns": start, "dur_ns": dur}  # fmt: skip


def test_data_loading_ranges_are_summed_in_the_step_where_they_start() -> None:
    # step 4: 10 + 5 ns; step 5: one 30 ns range starting at 190 (it runs past the step's end);
    # a range starting at 250 lies in no step
    trace = make_trace([_loading(10, 10), _loading(50, 5), _loading(190, 30), _loading(250, 9)], STEPS)
    rows = data_wait(trace).to_pylist()
    assert [(r["step"], r["data_wait_ns"], r["source"]) for r in rows] == [(4, 15, RANGES), (5, 30, RANGES)]


def test_the_data_loader_capture_wins_over_the_trace_ranges() -> None:
    trace = make_trace([_loading(10, 10)], STEPS)
    base = {"rank": 0, "worker": -1, "pid": 1, "start_ns": 0}
    trace.dataloader = conform(
        pa.Table.from_pylist(
            [
                {**base, "kind": "wait", "step": 5, "dur_ns": 7},
                {**base, "kind": "wait", "step": 5, "dur_ns": 3},
                {**base, "kind": "fetch", "step": 5, "worker": 0, "dur_ns": 1000},  # a worker: not a wait
                {**base, "kind": "wait", "step": -1, "dur_ns": 50},  # before the first step
            ]
        ),
        DATALOADER_SCHEMA,
    )
    rows = data_wait(trace).to_pylist()
    assert [(r["step"], r["data_wait_ns"], r["source"]) for r in rows] == [(5, 10, CAPTURE)]


def test_a_rank_without_either_has_no_rows() -> None:
    assert data_wait(make_trace([], STEPS)).num_rows == 0
