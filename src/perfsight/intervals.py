"""Interval arithmetic on integer-nanosecond timelines: the one place it is written.

Overlap (computing vs. communication), step trace (where a step's work starts and
ends) and memory (lifetimes) all reduce to the same few questions about sets of
half-open intervals ``[start, end)``: what do they cover, where do two sets meet,
what is left of one after removing another, how much of a set lies inside a
window.  Every function here answers one of them with NumPy, in
``O(n log n)`` and without a Python loop over intervals.

Conventions
-----------
* An interval set is a pair of equal-length ``int64`` arrays ``(starts, ends)``.
  Inputs may overlap, nest, touch, be unsorted or be empty (``end <= start``).
* A *merged* set (what :func:`union` returns and every set-valued function here
  returns) is sorted, disjoint and non-touching, with no empty intervals:
  ``starts[i] < ends[i] < starts[i + 1]``.  Touching intervals ``[0, 5) + [5, 9)``
  merge into ``[0, 9)``.
* Lengths are integer nanoseconds; nothing is converted or rounded.

One question is about *nesting* rather than sets: :func:`outermost` says which of
a group's intervals no other one of the same group encloses (the group is any key
array, such as a track id).

This module must not know about traces, tables, kinds or steps; it takes arrays
and returns arrays.  Callers choose which intervals mean what.  It is a leaf of the
package (it imports nothing of perfsight), so readers, analyses and writers may all
use it.
"""

from __future__ import annotations

from typing import TypeAlias

import numpy as np
from numpy.typing import ArrayLike, NDArray

Intervals: TypeAlias = tuple[NDArray[np.int64], NDArray[np.int64]]
"""``(starts, ends)``: two int64 arrays of the same length."""

_EMPTY = np.empty(0, dtype=np.int64)


def _arrays(starts: ArrayLike, ends: ArrayLike) -> Intervals:
    s = np.asarray(starts, dtype=np.int64).ravel()
    e = np.asarray(ends, dtype=np.int64).ravel()
    if s.shape != e.shape:
        raise ValueError(f"starts and ends differ in length ({s.size} != {e.size})")
    return s, e


def empty() -> Intervals:
    """The empty interval set."""
    return _EMPTY.copy(), _EMPTY.copy()


def union(starts: ArrayLike, ends: ArrayLike) -> Intervals:
    """Merge any intervals into a merged set (sorted, disjoint, non-touching, non-empty)."""
    s, e = _arrays(starts, ends)
    keep = e > s
    if not keep.all():
        s, e = s[keep], e[keep]
    if s.size == 0:
        return empty()
    if not (s[1:] >= s[:-1]).all():  # merged sets and sweeps' output come sorted: no sort then
        order = np.argsort(s, kind="stable")
        s, e = s[order], e[order]
    reach = np.maximum.accumulate(e)  # furthest end seen so far
    breaks = s[1:] > reach[:-1]  # a gap before interval i+1
    first = np.concatenate(([True], breaks))
    last = np.concatenate((breaks, [True]))
    return s[first], reach[last]


def total(starts: ArrayLike, ends: ArrayLike) -> int:
    """Nanoseconds covered by the intervals, overlaps counted once."""
    s, e = union(starts, ends)
    return int((e - s).sum())


def _combine(a: Intervals, b: Intervals, keep_a: bool, keep_b: bool) -> Intervals:
    """Segments covered by ``a`` (or not, per ``keep_a``) and by ``b`` (or not, per ``keep_b``).

    A sweep over the boundaries of the two merged sets: coverage of each set is
    0 or 1 between consecutive boundaries, so the wanted segments are read off
    two cumulative sums.
    """
    a_s, a_e = union(*a)
    b_s, b_e = union(*b)
    pos = np.concatenate((a_s, a_e, b_s, b_e))
    if pos.size == 0:
        return empty()
    na, nb = a_s.size, b_s.size
    da, db = np.zeros(pos.size, np.int64), np.zeros(pos.size, np.int64)
    da[:na], da[na : 2 * na] = 1, -1
    db[2 * na : 2 * na + nb], db[2 * na + nb :] = 1, -1
    order = np.argsort(pos, kind="stable")
    pos, ca, cb = pos[order], np.cumsum(da[order]), np.cumsum(db[order])
    # After the last boundary at a position, coverage is the cumulative sum there.
    last_at_pos = np.concatenate((pos[1:] != pos[:-1], [True]))
    pos, ca, cb = pos[last_at_pos], ca[last_at_pos], cb[last_at_pos]
    in_a = ca > 0 if keep_a else ca == 0
    in_b = cb > 0 if keep_b else cb == 0
    seg = (in_a & in_b)[:-1]  # segment [pos[i], pos[i+1])
    return union(pos[:-1][seg], pos[1:][seg])


def intersect(a: Intervals, b: Intervals) -> Intervals:
    """Time covered by both ``a`` and ``b``, as a merged set."""
    return _combine(a, b, keep_a=True, keep_b=True)


def subtract(a: Intervals, b: Intervals) -> Intervals:
    """Time covered by ``a`` but not by ``b``, as a merged set."""
    return _combine(a, b, keep_a=True, keep_b=False)


def clip(starts: ArrayLike, ends: ArrayLike, lo: ArrayLike, hi: ArrayLike) -> Intervals:
    """Cut every interval to ``[lo, hi)``; intervals left empty are dropped.

    ``lo``/``hi`` are scalars or arrays aligned with the intervals (one window per
    interval).  The result is not merged: call :func:`union` for that.
    """
    s, e = _arrays(starts, ends)
    cs = np.maximum(s, np.asarray(lo, dtype=np.int64))
    ce = np.minimum(e, np.asarray(hi, dtype=np.int64))
    keep = ce > cs
    return cs[keep], ce[keep]


def covered_before(merged: Intervals, points: ArrayLike) -> NDArray[np.int64]:
    """For each point ``x``, nanoseconds of the merged set that lie before ``x``."""
    s, e = merged
    x = np.asarray(points, dtype=np.int64)
    if s.size == 0:
        return np.zeros(x.shape, dtype=np.int64)
    prefix = np.concatenate(([0], np.cumsum(e - s)))  # length of the first k intervals
    k = np.searchsorted(s, x, side="right")  # intervals starting at or before x
    last = np.maximum(k - 1, 0)  # the one of them that may contain x
    inside = np.where(k > 0, np.minimum(x, e[last]) - s[last], 0)
    return prefix[last] + inside


def measure(merged: Intervals, lo: ArrayLike, hi: ArrayLike) -> NDArray[np.int64]:
    """Nanoseconds of the merged set inside each window ``[lo[i], hi[i])`` (vectorised over windows)."""
    lo_a = np.asarray(lo, dtype=np.int64)
    hi_a = np.maximum(np.asarray(hi, dtype=np.int64), lo_a)
    return covered_before(merged, hi_a) - covered_before(merged, lo_a)


def first_covered(merged: Intervals, lo: ArrayLike, hi: ArrayLike) -> NDArray[np.int64]:
    """For each window ``[lo, hi)``, the first covered instant in it, or ``hi`` when none is."""
    s, e = merged
    lo_a = np.asarray(lo, dtype=np.int64)
    hi_a = np.asarray(hi, dtype=np.int64)
    if s.size == 0:
        return hi_a.copy()
    k = np.searchsorted(e, lo_a, side="right")  # first interval ending after lo
    inside = k < s.size
    start = np.where(inside, np.maximum(lo_a, s[np.minimum(k, s.size - 1)]), hi_a)
    return np.minimum(start, np.maximum(hi_a, lo_a))


def contains(merged: Intervals, points: ArrayLike) -> NDArray[np.bool_]:
    """Whether each point lies inside the merged set (``start <= x < end``)."""
    s, e = merged
    x = np.asarray(points, dtype=np.int64)
    if s.size == 0:
        return np.zeros(x.shape, dtype=bool)
    k = np.searchsorted(s, x, side="right") - 1
    return (k >= 0) & (x < e[np.maximum(k, 0)])


def outermost(
    track: np.ndarray, start: np.ndarray, end: np.ndarray, mask: np.ndarray, depth: np.ndarray | None = None
) -> NDArray[np.bool_]:
    """True for masked intervals that no other masked interval of the same ``track`` (a group key)
    encloses.

    Used to count nested instrumentation once (a collective's host wrappers, a
    matmul's inner calls).  Loops over tracks; within a track, sorted by start and
    longest first, a running maximum of end times says whether an earlier slice
    still covers this one.  Of identical intervals the first row (or, given
    ``depth``, the shallowest) is the outer one.
    """
    result = np.zeros(len(mask), bool)
    rows = np.flatnonzero(mask)
    if not len(rows):
        return result
    t, s, e = track[rows], start[rows], end[rows]
    keys = (-e, s, t) if depth is None else (depth[rows], -e, s, t)
    order = np.lexsort(keys)
    t, s, e = t[order], s[order], e[order]
    outer = s >= reach_before(t, e)
    result[rows[order[outer]]] = True
    return result


def reach_before(track: np.ndarray, end: np.ndarray) -> NDArray[np.int64]:
    """For intervals sorted by ``track`` (a group key), the latest ``end`` among the earlier
    intervals of the same track: what still covers an interval starting there (the smallest int64
    for a track's first interval).  One running maximum per track."""
    reach = np.empty(len(end), np.int64)
    bounds = np.flatnonzero(np.r_[True, track[1:] != track[:-1], True])
    for lo, hi in zip(bounds[:-1], bounds[1:], strict=True):
        reach[lo] = np.iinfo(np.int64).min
        reach[lo + 1 : hi] = np.maximum.accumulate(end[lo : hi - 1])
    return reach
