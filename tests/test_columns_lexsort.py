"""columns.lexsort must give np.lexsort's order exactly: keys of every integer width, negative
values, ties (stable), and keys too wide to pack together (then np.lexsort itself)."""

from __future__ import annotations

import numpy as np
import pytest

from perfsight import columns
from perfsight.ingest import read_trace


@pytest.mark.parametrize("seed", range(40))
def test_same_order_as_numpy_for_mixed_integer_keys_with_ties(seed: int) -> None:
    rng = np.random.default_rng(seed)
    n = int(rng.integers(0, 3000))
    dtypes = [np.int16, np.int32, np.int64, np.uint8, np.uint64, np.bool_]
    keys = []
    for _ in range(int(rng.integers(1, 4))):
        dtype = dtypes[int(rng.integers(len(dtypes)))]
        if dtype is np.bool_:
            keys.append(rng.random(n) < 0.5)
            continue
        info = np.iinfo(dtype)
        width = int(rng.choice([3, 40, 1 << 20, 1 << 40]))
        low = int(rng.integers(max(info.min, -(1 << 50)), min(info.max, 1 << 50) - min(width, info.max) + 1))
        high = min(low + width, info.max)
        keys.append(rng.integers(low, high, n, endpoint=True).astype(dtype))
    assert np.array_equal(columns.lexsort(keys), np.lexsort(keys))


def test_keys_too_wide_to_pack_and_extreme_values() -> None:
    big = np.array([np.iinfo(np.int64).max, np.iinfo(np.int64).min, 0, -1, 5, 0], np.int64)
    small = np.array([1, 0, 1, 0, 1, 1], np.int16)
    unsigned = np.array([2**64 - 1, 0, 2**63, 2**63, 1, 0], np.uint64)
    for keys in ((big,), (small, big), (unsigned,), (small, unsigned), (unsigned, big)):
        assert np.array_equal(columns.lexsort(keys), np.lexsort(keys))


def test_a_real_traces_rows_by_track_start_and_depth(df_trace_path) -> None:
    slices = read_trace(df_trace_path).slices
    keys = tuple(columns.numpy(slices.column(c)) for c in ("depth", "start_ns", "track"))
    assert np.array_equal(columns.lexsort(keys), np.lexsort(keys))
