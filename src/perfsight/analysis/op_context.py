"""What the parallel-strategy view says about each op of a step: its module, its class, whether
it ran on sharded tensors, and its input shapes.

Why a table of its own: ``perfsight.analysis.step_ops`` keeps each step's outermost ops in
execution order (what the Marey view and the pipeline chart need); the strategy view (issue 18,
seed 000 fig. 3) also groups them by ``nn.Module`` and marks the seed's special ops.  Those facts
sit in the rank's own trace (the ranges and ops nested around and inside each op), so they are
decided here, one row per op row of ``step_ops`` (joined on ``slice``):

* ``module`` / ``modules``: the innermost ``nn.Module`` forward holding the op, and every module
  holding it, outermost first (``perfsight.analysis.modules``); "" / [] outside any forward
  (backward, optimizer, the loss).  Only host ops on the module ranges' track can be placed; a
  device kernel gets none.
* ``op_class``: ``optimizer`` inside an ``Optimizer.step#...`` / ``Optimizer.zero_grad#...`` range,
  ``memory copy`` for copies (device memcpy/memset, ``aten::copy_``, ``aten::to`` ...), else
  ``compute``.  (Collective and point-to-point ops are the cluster's matched ops, not rows here.)
* ``sharded``: the op dispatched to a tensor subclass -- a ``PythonSubclass`` op inside it, which
  is what a DTensor (tensor-parallel) op records: the op on the global DTensor, the same op on the
  local shard inside.  ``redistribution`` marks DTensor's own ``Redistribute`` ops (a placement
  change, with the collective it needs inside).

What it must not do: decide cross-rank facts (groups, the data- or tensor-parallel role of a
collective): ``perfsight.cluster.strategy_graph`` does.  Vectorised: one sorted search per nesting
level, no loop over ops.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from perfsight import columns
from perfsight.analysis import modules
from perfsight.analysis.index import dictionary_mask
from perfsight.model import Trace

OP_CONTEXT_SCHEMA = pa.schema(
    [
        ("rank", pa.int32()),
        ("slice", pa.int64()),  # row in the rank's ``slices`` (joins ``step_ops.slice``)
        ("module", pa.string()),
        ("modules", pa.list_(pa.string())),  # outermost first
        ("op_class", pa.string()),  # "compute" | "memory copy" | "optimizer"
        ("sharded", pa.bool_()),
        ("redistribution", pa.bool_()),
        ("input_dims", pa.list_(pa.list_(pa.int64()))),
    ]
)

OPTIMIZER_PATTERN = r"^Optimizer\.(step|zero_grad)#"
"""Ranges PyTorch's optimizers record around ``step()`` and ``zero_grad()`` (``Optimizer.step#SGD.step``)."""
MEMORY_COPY_OPS = ("aten::copy_", "aten::to", "aten::_to_copy", "aten::clone", "aten::contiguous")
MEMORY_COPY_KINDS = ("memcpy", "memset")
SUBCLASS_DISPATCH = "PythonSubclass"
"""The op a tensor subclass's ``__torch_dispatch__`` records (DTensor's sharded ops)."""
REDISTRIBUTE_OPS = ("Redistribute", "NestedRedistribute")


def op_context(trace: Trace, step_ops: pa.Table, ranges: pd.DataFrame | None = None) -> pa.Table:
    """One row per op row (``level == "op"``) of ``step_ops`` (:data:`OP_CONTEXT_SCHEMA`);
    ``ranges``: the trace's :func:`modules.module_ranges`, when the caller has them already."""
    ops = step_ops.filter(pc.equal(step_ops.column("level"), "op")).column("slice").to_numpy()
    if ops.size == 0:
        return OP_CONTEXT_SCHEMA.empty_table()
    ranges = modules.module_ranges(trace) if ranges is None else ranges
    return context_of(trace.rank, op_facts(trace, ops), ranges, context_ranges(trace))


def op_facts(trace: Trace, local: np.ndarray, rows: np.ndarray | None = None) -> pa.Table:
    """What :func:`context_of` reads of each op: ``slice`` (its row in the whole trace: ``rows``
    of ``local`` for a chunk whose slices are the whole trace's ``rows``), ``kind``, ``name``,
    ``track``, ``start_ns``, ``dur_ns``, ``depth`` and ``input_dims`` (``local``: rows of ``trace``)."""
    index = pa.array(local, pa.int64())
    picked = trace.slices.select(["kind", "name", "track", "start_ns", "dur_ns", "depth", "input_dims"]).take(
        index
    )
    whole = local if rows is None else np.asarray(rows, np.int64)[local]
    return picked.append_column("slice", pa.array(whole, pa.int64()))


@dataclasses.dataclass
class ContextRanges:
    """The host ranges :func:`context_of` places ops in, besides the module forwards (each with
    ``row``, its slice's row in the whole trace)."""

    optimizer: pd.DataFrame
    """``Optimizer.step#`` / ``Optimizer.zero_grad#`` ranges."""
    dispatch: pd.DataFrame
    """``PythonSubclass`` slices (a tensor subclass's dispatch)."""

    @classmethod
    def merged(cls, parts: list[ContextRanges]) -> ContextRanges:
        """The whole trace's from its chunks' (in the whole trace's slice order)."""

        def concat(frames: list[pd.DataFrame]) -> pd.DataFrame:
            whole = pd.concat(frames, ignore_index=True)
            return whole.sort_values("row", kind="stable").reset_index(drop=True)

        return cls(concat([p.optimizer for p in parts]), concat([p.dispatch for p in parts]))


def context_ranges(trace: Trace, rows: np.ndarray | None = None) -> ContextRanges:
    """The :class:`ContextRanges` of ``trace`` (a whole trace, or a chunk whose slices are the
    whole trace's ``rows``)."""
    return ContextRanges(
        optimizer=_named(trace, lambda n: pc.match_substring_regex(n, OPTIMIZER_PATTERN), rows),
        dispatch=_named(trace, lambda n: pc.equal(n, SUBCLASS_DISPATCH), rows),
    )


def context_of(rank: int, facts: pa.Table, ranges: pd.DataFrame, context: ContextRanges) -> pa.Table:
    """:data:`OP_CONTEXT_SCHEMA` rows of the ops ``facts`` describes (:func:`op_facts`, in
    ``step_ops`` order), placed in the module forwards ``ranges`` and the ``context`` ranges."""
    ops = facts.column("slice").to_numpy()
    if ops.size == 0:
        return OP_CONTEXT_SCHEMA.empty_table()
    tracks = columns.int64(facts.column("track"))
    starts = columns.int64(facts.column("start_ns"))
    ends = starts + columns.int64(facts.column("dur_ns"))
    levels = columns.int64(facts.column("depth"))

    held = modules.enclosing(ranges, tracks, starts, levels)
    inner = modules.innermost(held)
    labels = ranges["module"].to_numpy(object) if not ranges.empty else np.array([], object)
    module = np.where(inner >= 0, labels[np.maximum(inner, 0)] if labels.size else "", "")
    chain = _chains(held, labels)

    marks = context.optimizer
    in_optimizer = modules.innermost(modules.enclosing(marks, tracks, starts, levels)) >= 0
    copy = _one_of(facts.column("kind"), MEMORY_COPY_KINDS) | _one_of(facts.column("name"), MEMORY_COPY_OPS)
    op_class = np.where(in_optimizer, "optimizer", np.where(copy, "memory copy", "compute"))

    sharded = _holds(context.dispatch, tracks, starts, ends)
    return pa.table(
        {
            "rank": pa.array(np.full(ops.size, rank), pa.int32()),
            "slice": pa.array(ops, pa.int64()),
            "module": pa.array(module.astype(str), pa.string()),
            "modules": pa.array(chain, pa.list_(pa.string())),
            "op_class": pa.array(op_class, pa.string()),
            "sharded": pa.array(sharded, pa.bool_()),
            "redistribution": pa.array(_one_of(facts.column("name"), REDISTRIBUTE_OPS), pa.bool_()),
            "input_dims": facts.column("input_dims"),
        },
        schema=OP_CONTEXT_SCHEMA,
    )


def _one_of(text: pa.ChunkedArray, values: tuple[str, ...]) -> np.ndarray:
    """Which rows of a text column hold one of ``values`` (tested once per distinct text)."""
    value_set = pa.array(values, pa.string())
    return dictionary_mask(text, lambda distinct: pc.is_in(distinct, value_set=value_set))


def _chains(held: np.ndarray, labels: np.ndarray) -> pa.Array:
    """Per op, the labels of the ranges holding it, outermost first, as one Arrow list array
    (built from flat arrays: no Python list per op)."""
    n, width = held.shape
    if width == 0:
        return pa.ListArray.from_arrays(pa.array(np.zeros(n + 1, np.int32)), pa.array([], pa.string()))
    found = held >= 0
    counts = found.sum(axis=1)
    offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int32)
    flat = labels[held[found]]  # row-major: each op's levels in order of depth, outermost first
    return pa.ListArray.from_arrays(pa.array(offsets), pa.array(flat.astype(str), pa.string()))


def _named(
    trace: Trace, test: Callable[[pa.Array], pa.Array], rows: np.ndarray | None = None
) -> pd.DataFrame:
    """Host ranges whose name passes ``test`` (an Arrow string predicate), in the shape
    :func:`modules.enclosing` reads, with ``row`` (the slice's row in the whole trace)."""
    slices = trace.slices
    keep = modules.name_mask(slices.column("name"), test) & ~columns.numpy(
        slices.column("is_device"), null=False
    )
    at = np.flatnonzero(keep)
    start = columns.int64(slices.column("start_ns"))[at]  # NumPy views, the few rows taken
    return pd.DataFrame(
        {
            "track": columns.int64(slices.column("track"))[at],
            "start_ns": start,
            "end_ns": start + columns.int64(slices.column("dur_ns"))[at],
            "slice_depth": columns.int64(slices.column("depth"))[at],
            "row": at if rows is None else np.asarray(rows, np.int64)[at],
        }
    )


def _holds(inside: pd.DataFrame, tracks: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """Whether each op (an outermost op: they do not overlap on a track) holds a slice of ``inside``."""
    out = np.zeros(starts.size, bool)
    if inside.empty:
        return out
    for track in np.unique(tracks):  # one pass per track (a handful), not per op
        mine = np.flatnonzero(tracks == track)
        order = mine[np.argsort(starts[mine], kind="stable")]
        points = inside.loc[inside["track"] == track, "start_ns"].to_numpy()
        at = np.searchsorted(starts[order], points, side="right") - 1
        ok = at >= 0
        ok[ok] &= points[ok] < ends[order[at[ok]]]
        out[order[at[ok]]] = True
    return out
