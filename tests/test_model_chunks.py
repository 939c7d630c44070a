"""Cutting a rank's trace into chunks of whole steps (the bounded-memory path's unit of work)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from perfsight.ingest.kineto import read_kineto
from perfsight.model import NO_ID, Trace
from perfsight.model_chunks import split_by_steps


@pytest.fixture
def df_trace(df_trace_path: Path) -> Trace:
    return read_kineto(df_trace_path)


def test_one_step_per_chunk_owns_every_row_once(df_trace: Trace) -> None:
    chunks = list(split_by_steps(df_trace, max_slices=1))
    assert [c.steps for c in chunks] == [(s,) for s in sorted(df_trace.steps.column("step").to_pylist())]
    rows = np.concatenate([c.slice_rows for c in chunks])
    assert np.array_equal(np.sort(rows), np.arange(df_trace.slices.num_rows))
    for c in chunks:
        assert np.all(np.diff(c.slice_rows) > 0)
        assert c.trace.slices.equals(df_trace.slices.take(pa.array(c.slice_rows)))
        assert c.trace.steps.column("step").to_pylist() == list(c.steps)
    assert sum(c.trace.memory.num_rows for c in chunks) == df_trace.memory.num_rows
    assert sum(c.trace.comm.num_rows for c in chunks) == df_trace.comm.num_rows


def test_flows_and_comm_point_at_the_same_slices_inside_a_chunk(df_trace: Trace) -> None:
    whole_names = df_trace.slices.column("name").to_pylist()
    whole_pairs = sorted(
        (whole_names[s], whole_names[d])
        for s, d in zip(
            df_trace.flows.column("src").to_pylist(), df_trace.flows.column("dst").to_pylist(), strict=True
        )
    )
    pairs = []
    for c in split_by_steps(df_trace, max_slices=1):
        names = c.trace.slices.column("name").to_pylist()
        src, dst = c.trace.flows.column("src").to_numpy(), c.trace.flows.column("dst").to_numpy()
        assert np.all(src != NO_ID) and np.all(dst != NO_ID)
        pairs += [(names[s], names[d]) for s, d in zip(src, dst, strict=True)]
        comm_slices = c.trace.comm.column("slice").to_numpy()
        assert np.array_equal(
            c.trace.comm.column("start_ns").to_numpy(),
            c.trace.slices.column("start_ns").to_numpy()[comm_slices],
        )
    assert sorted(pairs) == whole_pairs


def test_a_large_budget_keeps_the_trace_whole(df_trace: Trace) -> None:
    (only,) = split_by_steps(df_trace, max_slices=10**9)
    assert only.count == 1 and only.is_last
    assert only.trace.slices.equals(df_trace.slices)
    assert only.trace.flows.equals(df_trace.flows)
    assert only.trace.memory.equals(df_trace.memory)


def test_steps_are_packed_up_to_the_budget(df_trace: Trace) -> None:
    per_step = df_trace.slices.num_rows // df_trace.steps.num_rows
    chunks = list(split_by_steps(df_trace, max_slices=2 * per_step + 10))
    assert [len(c.steps) for c in chunks] == [2, 2, 1]
    assert all(c.trace.slices.num_rows <= 2 * per_step + 10 for c in chunks)
