"""The ``nn.Module`` forwards of a rank's trace, and the time each module takes per step.

Why: the parallel-strategy view groups a stage's ops by the module that ran them, and the module
table (msprof-analyze's ``module_statistic``) says how long each ``nn.Module`` takes on each rank.
Both start from the same ranges: ``nn.Module: X`` slices -- Kineto's Python tracer writes them as
``python_function`` events (``with_stack=True``: ``nn.Module: Linear_0``), perfsight's
``with_modules`` capture as ``user_annotation`` ranges (``nn.Module: Sequential.0 (Linear)``,
``perfsight.collect.module_ranges``).  A module's name is the text after the prefix.

What it decides, and only here: which module range holds a point of a track (the innermost one:
module ranges nest), and a module's time in a step (the sum of its forward ranges' durations,
wall time including its children).  Backward passes are not module calls and are not counted.
Vectorised: one ``searchsorted`` per nesting depth (a handful), no loop over ranges.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from perfsight import columns
from perfsight.model import Trace

PREFIX = "nn.Module: "
MODULE_KINDS = ("annotation", "python")
"""Slice kinds a module range is recorded as (perfsight's capture, Kineto's Python tracer)."""

MODULE_STATISTIC_SCHEMA = pa.schema(
    [
        ("rank", pa.int32()),
        ("step", pa.int32()),
        ("module", pa.string()),  # its name after "nn.Module: " (path and class for perfsight's ranges)
        ("parent", pa.string()),  # the module whose forward holds it; "" for an outermost module
        ("depth", pa.int32()),  # 0 = outermost module
        ("calls", pa.int64()),  # forward calls in the step
        ("total_ns", pa.int64()),  # sum of those calls' wall time (children included)
    ]
)


def module_ranges(trace: Trace) -> pd.DataFrame:
    """Every module forward of the trace's host tracks: ``track``, ``start_ns``, ``end_ns``,
    ``step``, ``module``, ``depth`` (0 = outermost *module*, counted among module ranges only),
    ``parent`` (the module holding it, "" for none) and ``slice_depth`` (its nesting on the track)."""
    return nest_ranges(range_rows(trace))


def range_rows(trace: Trace, rows: np.ndarray | None = None) -> pd.DataFrame:
    """The module forwards of ``trace`` (a whole trace, or a chunk whose slices are the whole
    trace's ``rows``) before :func:`nest_ranges`: ``track``, ``start_ns``, ``end_ns``, ``step``,
    ``module``, ``slice_depth`` and ``row`` (the slice's row in the whole trace).  A chunk's
    forwards, concatenated in ``row`` order, are the whole trace's: nesting is decided over all."""
    slices = trace.slices
    keep = name_mask(slices.column("name"), lambda n: pc.starts_with(n, PREFIX))
    keep &= name_mask(slices.column("kind"), lambda k: pc.is_in(k, pa.array(MODULE_KINDS)))
    keep &= ~columns.numpy(slices.column("is_device"), null=False)
    if not keep.any():
        return _empty_ranges(without=("depth", "parent"), row=True)
    at = np.flatnonzero(keep)
    ranges = (
        slices.filter(pa.array(keep))
        .select(["name", "track", "start_ns", "dur_ns", "depth", "step"])
        .to_pandas()
    )
    ranges["name"] = ranges["name"].astype(str)
    return pd.DataFrame(
        {
            "track": ranges["track"].astype("int64").to_numpy(),
            "start_ns": ranges["start_ns"].astype("int64").to_numpy(),
            "end_ns": (ranges["start_ns"] + ranges["dur_ns"]).astype("int64").to_numpy(),
            "step": ranges["step"].astype("int64").to_numpy(),
            "module": ranges["name"].str.slice(len(PREFIX)).to_numpy(),
            "slice_depth": ranges["depth"].astype("int64").to_numpy(),
            "row": at if rows is None else np.asarray(rows, np.int64)[at],
        }
    )


def nest_ranges(ranges: pd.DataFrame) -> pd.DataFrame:
    """:func:`module_ranges` from :func:`range_rows` (of the whole trace, or of its chunks
    concatenated): each forward's module depth and parent, in the whole trace's slice order."""
    if ranges.empty:
        return _empty_ranges()
    ranges = ranges.sort_values("row", kind="stable").drop(columns=["row"]).reset_index(drop=True)
    held = enclosing(
        ranges, ranges["track"].to_numpy(), ranges["start_ns"].to_numpy(), ranges["slice_depth"].to_numpy()
    )
    ranges["depth"] = (held >= 0).sum(axis=1).astype("int64")
    inner = innermost(held)
    ranges["parent"] = np.where(inner >= 0, ranges["module"].to_numpy()[np.maximum(inner, 0)], "")
    return ranges


def name_mask(values: pa.ChunkedArray, test: Callable[[pa.Array], pa.Array]) -> np.ndarray:
    """``test`` (an Arrow string predicate) over a text column as a NumPy mask; a dictionary
    column is tested once per distinct name, not once per row."""
    parts = []
    for chunk in values.chunks:
        if pa.types.is_dictionary(chunk.type):
            verdict = columns.numpy(test(chunk.dictionary), null=False)
            codes = columns.int64(chunk.indices, null=-1)
            parts.append(
                np.where(codes >= 0, verdict[np.maximum(codes, 0)] if verdict.size else False, False)
            )
        else:
            parts.append(columns.numpy(test(chunk), null=False))
    return np.concatenate(parts).astype(bool) if parts else np.zeros(0, bool)


RANGE_COLUMNS = {
    "track": np.int64,
    "start_ns": np.int64,
    "end_ns": np.int64,
    "step": np.int64,
    "module": object,
    "depth": np.int64,
    "parent": object,
    "slice_depth": np.int64,
}
""":func:`module_ranges`' columns and types."""


def _empty_ranges(without: tuple[str, ...] = (), row: bool = False) -> pd.DataFrame:
    """No module forward, in :data:`RANGE_COLUMNS` (less ``without``; with :func:`range_rows`' ``row``).
    Made from NumPy arrays: a frame of typed empty Series costs ~1 ms, on every rank of a job
    without module forwards."""
    empty = {name: np.zeros(0, kind) for name, kind in RANGE_COLUMNS.items() if name not in without}
    if row:
        empty["row"] = np.zeros(0, np.int64)
    return pd.DataFrame(empty)


def enclosing(
    ranges: pd.DataFrame, tracks: np.ndarray, points: np.ndarray, levels_of: np.ndarray
) -> np.ndarray:
    """For each point (a slice's start on its track, at nesting level ``levels_of``), the row of
    ``ranges`` holding it at each shallower nesting level: an array (points x levels) of row
    positions, -1 where no range of that level holds it.

    Ranges of one track and one ``slice_depth`` (the trace's nesting level) never overlap, so one
    sorted search per (track, level) finds the candidate; only levels above the point's own count
    (a child starting on its parent's first nanosecond is still inside it)."""
    if ranges.empty or len(points) == 0:
        return np.full((len(points), 0), -1, np.int64)
    ranges = ranges.reset_index(drop=True)  # group indices below are row positions
    levels = sorted(ranges.groupby(["track", "slice_depth"]).groups.items())
    depths = sorted(ranges["slice_depth"].unique())
    out = np.full((len(points), len(depths)), -1, np.int64)
    starts_all = ranges["start_ns"].to_numpy()
    ends_all = ranges["end_ns"].to_numpy()
    for (track, depth), index in levels:  # one pass per track and nesting level, not per range
        rows = np.asarray(index)
        rows = rows[np.argsort(starts_all[rows], kind="stable")]
        starts, ends = starts_all[rows], ends_all[rows]
        at = np.searchsorted(starts, points, side="right") - 1
        ok = (at >= 0) & (tracks == track) & (levels_of > depth)
        ok[ok] &= points[ok] < ends[at[ok]]
        out[ok, depths.index(depth)] = rows[at[ok]]
    return out


def innermost(held: np.ndarray) -> np.ndarray:
    """The deepest holding range per point (row position, -1 for none) of :func:`enclosing`'s result."""
    if held.shape[1] == 0:
        return np.full(held.shape[0], -1, np.int64)
    found = held >= 0
    last = held.shape[1] - 1 - np.argmax(found[:, ::-1], axis=1)
    return np.where(found.any(axis=1), held[np.arange(held.shape[0]), last], -1)


def module_statistic(trace: Trace, ranges: pd.DataFrame | None = None) -> pa.Table:
    """Per step and module: forward calls and their summed wall time (:data:`MODULE_STATISTIC_SCHEMA`);
    ``ranges``: the trace's :func:`module_ranges`, when the caller has them already."""
    return module_statistic_of(trace.rank, module_ranges(trace) if ranges is None else ranges)


def module_statistic_of(rank: int, ranges: pd.DataFrame) -> pa.Table:
    """:func:`module_statistic` of a rank from its :func:`module_ranges` (of the whole trace, or
    nested from its chunks' :func:`range_rows`)."""
    ranges = ranges[ranges["step"] >= 0]
    if ranges.empty:
        return MODULE_STATISTIC_SCHEMA.empty_table()
    ranges = ranges.assign(dur=ranges["end_ns"] - ranges["start_ns"])
    table = (
        ranges.groupby(["step", "module", "parent", "depth"], sort=True)
        .agg(calls=("dur", "size"), total_ns=("dur", "sum"))
        .reset_index()
    )
    table["rank"] = rank
    return pa.Table.from_pandas(
        table[MODULE_STATISTIC_SCHEMA.names], schema=MODULE_STATISTIC_SCHEMA, preserve_index=False
    )
