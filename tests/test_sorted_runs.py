"""Sorted runs spilled to disk come back as one table in key order (bounded-memory path)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from perfsight.sorted_runs import RunSpill


def test_interleaved_runs_merge_back_to_the_whole_table(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    n = 10_000
    whole = pa.table(
        {
            "row": np.arange(n),
            "name": pa.array([f"op{i % 37}" for i in range(n)]).dictionary_encode(),
            "value": rng.normal(size=n),
        }
    )
    run_of = rng.integers(0, 5, n)  # rows dealt to 5 runs, each run keeps its rows' order
    spill = RunSpill(tmp_path, "ops", batch_rows=333)
    for run in range(5):
        rows = np.flatnonzero(run_of == run)
        spill.add(whole.take(pa.array(rows)), rows)
    batches = list(spill.merged())
    assert len(batches) > 5  # read back a batch at a time, not whole
    merged = pa.concat_tables(batches)
    assert merged.column("row").to_pylist() == list(range(n))
    assert merged.column("value").to_pylist() == whole.column("value").to_pylist()
    assert merged.column("name").to_pylist() == whole.column("name").to_pylist()
    assert pa.types.is_dictionary(merged.schema.field("name").type)
    assert pa.concat_tables(spill.merged()).equals(merged)  # re-iterable
    spill.remove()
    assert not list(tmp_path.iterdir())


def test_runs_in_blocks_merge_back_to_the_whole_table(tmp_path: Path) -> None:
    """A chunk's rows in a table ordered by track then time: one block per track in each run, so
    most merge steps take rows from one run only (and some from two, where blocks meet)."""
    chunks, tracks, per_block = 4, 6, 250
    n = chunks * tracks * per_block
    names = pa.array([f"k{i % 11}" for i in range(n)]).dictionary_encode()
    whole = pa.table({"row": np.arange(n), "name": names})
    spill = RunSpill(tmp_path, "slices", batch_rows=100)
    for chunk in range(chunks):
        rows = np.concatenate(
            [track * chunks * per_block + chunk * per_block + np.arange(per_block) for track in range(tracks)]
        )
        spill.add(whole.take(pa.array(rows)), rows)
    merged = pa.concat_tables(spill.merged())
    assert merged.column("row").to_pylist() == list(range(n))
    assert merged.column("name").to_pylist() == whole.column("name").to_pylist()


def test_a_run_out_of_order_is_refused(tmp_path: Path) -> None:
    spill = RunSpill(tmp_path, "t")
    with pytest.raises(ValueError, match="must not decrease"):
        spill.add(pa.table({"a": [1, 2]}), np.array([2, 1]))
    assert list(spill.merged()) == []
