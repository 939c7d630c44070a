"""The reader's fast slice order and nesting depth agree with the plain definitions they replace."""

from __future__ import annotations

import numpy as np
import pytest

from perfsight import columns
from perfsight.ingest import assemble


def _depth_by_definition(track: np.ndarray, start: np.ndarray, dur: np.ndarray) -> np.ndarray:
    """Depth counted slice by slice: the open slices of its track that enclose it (a parent starts
    earlier, or at the same time and lasts longer, or as long and comes first, and ends after the
    slice starts: a zero-length slice encloses nothing)."""
    end = start + np.maximum(dur, 0)
    depth = np.zeros(len(track), np.int64)
    for i in range(len(track)):
        for j in range(len(track)):
            if i == j or track[i] != track[j]:
                continue
            before = (start[j], -dur[j], j) < (start[i], -dur[i], i)
            still_open = end[j] > start[i]
            if before and still_open:
                depth[i] += 1
    return depth


@pytest.mark.parametrize("seed", range(40))
def test_track_time_order_is_lexsort_by_track_start_and_longest_first(seed: int) -> None:
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 400))
    big_tracks = seed % 4 == 0  # past 16 bits: the track key cannot sort by radix
    track = rng.integers(0, 5, n) * (100_000 if big_tracks else 1)
    start = rng.integers(0, 30, n) * 1_000  # many equal starts: ties to break by duration
    dur = rng.integers(-1, 4, n) * 500  # equal durations too: ties kept in row order
    expected = np.lexsort((-dur, start, track))
    assert np.array_equal(assemble.track_time_order(track, start, dur), expected)


def test_nested_slices_get_the_depth_of_their_open_parents() -> None:
    # one track: a step, an op inside it, two launches inside the op, one zero-length marker
    # inside the op; a second track with its own nesting and a slice starting as
    # its neighbour ends (not nested)
    track = np.array([0, 0, 0, 0, 0, 1, 1, 1])
    start = np.array([0, 10, 15, 20, 30, 5, 5, 50])
    dur = np.array([100, 50, 0, 5, 5, 45, 10, 10])
    depth = assemble.nesting_depth(track, start, dur)
    assert depth.tolist() == _depth_by_definition(track, start, dur).tolist() == [0, 1, 2, 2, 2, 0, 1, 0]


def test_a_zero_length_first_child_leaves_its_parent_at_its_depth() -> None:
    # a step [0, 100) holding an op [10, 60) whose first child is a zero-length marker at 10,
    # then a launch [30, 35) and two zero-length markers at its start: inside it (on equal starts
    # the longer slice is the parent) and not inside each other
    track = np.zeros(6, np.int64)
    start = np.array([0, 10, 10, 30, 30, 30])
    dur = np.array([100, 50, 0, 0, 0, 5])
    depth = assemble.nesting_depth(track, start, dur)
    assert depth.tolist() == _depth_by_definition(track, start, dur).tolist() == [0, 1, 2, 3, 3, 2]


@pytest.mark.parametrize("seed", range(10))
def test_nesting_depth_of_random_proper_nesting_matches_the_definition(seed: int) -> None:
    rng = np.random.default_rng(100 + seed)
    rows: list[tuple[int, int, int]] = []

    def nest(track: int, lo: int, hi: int, level: int) -> None:
        t = lo
        while t < hi and level < 4:
            # zero-length slices too, also at their parent's very start (once counted as closed
            # before the parent opened, which took a level from the parent)
            length = int(rng.integers(0, max(hi - t, 1) + 1))
            rows.append((track, t, length))
            nest(track, t, t + length, level + 1)
            t += length + int(rng.integers(0, 3))

    for track in range(3):
        nest(track, 0, 60, 0)
    order = rng.permutation(len(rows))  # readers see rows in file order, not time order
    track, start, dur = (np.array([rows[i][k] for i in order], np.int64) for k in range(3))
    expected = _depth_by_definition(track, start, dur).tolist()
    assert assemble.nesting_depth(track, start, dur).tolist() == expected


def test_sorted_codes_are_numpy_unique_with_its_inverse() -> None:
    rng = np.random.default_rng(7)
    for values in (
        rng.choice([-(2**62), -1, 0, 5, 785246, 2**62], size=5_000),  # lane ids repeat
        rng.integers(-(2**40), 2**40, size=3_000),  # all distinct
        np.zeros(0, np.int64),
    ):
        distinct, inverse = columns.sorted_codes(values)
        expected, expected_inverse = np.unique(values, return_inverse=True)
        assert np.array_equal(distinct, expected) and np.array_equal(inverse, expected_inverse)
        assert np.array_equal(distinct[inverse], values)
