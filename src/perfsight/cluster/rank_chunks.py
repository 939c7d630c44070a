"""A job's rank whose trace is too large to read whole: analysed in bounded memory, chunk of steps
by chunk, with the same digest as the whole-trace path.

Why a module: ``perfsight analyse JOBDIR --memory-limit SIZE`` (or a rank that would need more
than its share of the memory available) sends a Kineto rank (alone or in a perfsight run
folder) through the single-trace
bounded path (``pipeline_bounded``: spilled reader, chunked analyses and writers), and the
cross-rank step still needs the rank's extras -- ``step_ops``, ``op_context``,
``module_statistic``, the ``comm`` rows and the time span -- which the whole-trace path computes
from the whole trace.  Here they are computed from the chunks as the bounded path reads them
(one pass, no second read of the spill), by the analysis modules' own part and merge functions:

* ``step_ops``: :class:`~perfsight.analysis.step_ops.StepOpsMerge` (the device-or-host choice,
  the main thread, the busiest memory device and the nesting across chunks decided over all; the
  FLOPs rows per chunk, as ``chunked_analysis``' ``flops_by_step``: an op and a recognised op
  holding it are in one chunk);
* ``op_context``: each chunk's op candidates' facts (:func:`~perfsight.analysis.op_context.op_facts`)
  and ranges (``context_ranges``), placed once the ops are known;
* module forwards: each chunk's :func:`~perfsight.analysis.modules.range_rows`, nested over all
  (a forward that spans a chunk boundary holds the ops of both);
* ``comm``: :func:`~perfsight.cluster.rank.comm_rows` of each chunk, its ``slice`` put back to the
  whole trace's row and the rows to the whole ``comm`` table's order;
* the time span: the earliest start and latest end over the chunks.

What the limit covers: the bounded path's own peak (``memory_budget``) plus the digest, which
the cross-rank step needs whole and which grows with the trace (a ``step_ops`` row per outermost
op and per allocator event: about 100 bytes a slice, sent to the parent as one more copy); a rank
of 1 GB of JSON within 600 MB peaks at 1.2 GB, against 1.4 GB whole (docs/BENCHMARKS.md, "A
job's large ranks").

What it must not do: compute a metric its own way (every value comes from the functions the
whole-trace path calls), or hold a per-row table of the whole trace beyond what the digest keeps.
"""

from __future__ import annotations

import dataclasses
import logging
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from perfsight import columns, memory_budget
from perfsight.analysis import communication, modules, op_context, step_ops
from perfsight.cluster.rank import (
    CLUSTER_TABLES,
    RankDigest,
    RankFailure,
    RankTask,
    claim_rank_dir,
    comm_rows,
    time_span,
)
from perfsight.ingest import mindinsight_cluster as vendor_cluster
from perfsight.model import RunMetadata, Trace
from perfsight.model_chunks import TraceChunk, in_whole_order, whole_rows

log = logging.getLogger(__name__)


def rank_budget(path: Path, task: RankTask) -> int | None:
    """The memory budget a rank's trace at ``path`` is analysed within, or None for the whole
    trace: within ``task.memory_limit`` when given (per rank: each worker holds one rank at a
    time), else when it would need more than its share of the memory available now (the share
    of one of ``task.workers`` ranks analysed side by side, of the fraction a single trace may
    take, ``memory_budget.AUTO_FRACTION``)."""
    from perfsight.ingest import BOUNDED_INPUTS, bounded_input

    if not bounded_input(path):
        if task.memory_limit is not None:
            # the command line warns for a local job's inputs before they are read
            log.info("%s: read whole (the memory limit applies to %s)", path, BOUNDED_INPUTS)
        return None
    limit = task.memory_limit
    if limit is None:
        limit = int(memory_budget.available_bytes() * memory_budget.AUTO_FRACTION / max(1, task.workers))
    return memory_budget.budget_for(path, limit)


def run_rank_bounded(
    path: Path, source: str, label: str, task: RankTask, budget: int
) -> RankDigest | RankFailure:
    """One rank through the bounded path (:mod:`perfsight.pipeline_bounded`) with its digest;
    the outputs go under ``task.out_root`` as the whole-trace path writes them, or, with no
    outputs asked for, the analysis spills to a temporary folder deleted afterwards."""
    from perfsight.ingest import TraceReadError
    from perfsight.pipeline import OutputError
    from perfsight.pipeline_bounded import analyse_and_write_bounded

    extras = RankExtras()
    try:
        if task.out_root is None:
            meta, steps, tables = _analyse_only(path, task, budget, extras)
            summary = None
            output_dir = None
        else:
            root = Path(task.out_root)
            result = analyse_and_write_bounded(
                path,
                root,
                lambda rank: claim_rank_dir(root, rank, label, task.token),
                task.options,
                budget,
                observe=extras.add,
            )
            meta, steps = result.trace.meta, result.trace.steps
            tables = {name: result.tables[name] for name in CLUSTER_TABLES if name in result.tables}
            tables["communication_ops"] = _cached(result.output_dir.parent, "communication_ops")
            output_dir = str(result.output_dir)
            from perfsight.summary import rank_summary

            summary = rank_summary(result)
    except (TraceReadError, ValueError) as exc:
        return RankFailure(source, str(exc))
    except OutputError as exc:  # disk full, no permission: this rank's files, not the job, are lost
        return RankFailure(source, f"outputs not written ({exc})")
    except OSError as exc:
        return RankFailure(source, f"{path}: {exc}")
    meta.sources = [source]
    tables = {name: tables[name] for name in CLUSTER_TABLES}
    tables[vendor_cluster.TABLE] = vendor_cluster.SCHEMA.empty_table()  # a Kineto rank has none
    tables.update(extras.tables(meta.rank))
    return RankDigest(
        source=source,
        meta=meta,
        comm=extras.comm(),
        steps=steps,
        tables=tables,
        output_dir=output_dir,
        summary=summary,
        span_ns=extras.span,
    )


def _cached(rank_dir: Path, name: str) -> pa.Table:
    """A per-row table the bounded path left in the rank folder's cache (it holds none in memory)."""
    from perfsight import layout
    from perfsight.store import cache

    return cache.load_tables(rank_dir / layout.CACHE_DIR, [name])[name]


def _analyse_only(
    path: Path, task: RankTask, budget: int, extras: RankExtras
) -> tuple[RunMetadata, pa.Table, dict[str, pa.Table]]:
    """The analysis without outputs (a job above the per-rank-outputs limit): the rank's
    metadata, steps and cluster tables, spilled to a temporary folder deleted afterwards."""
    from perfsight.chunked_analysis import analyse_chunks
    from perfsight.ingest import spill_trace
    from perfsight.pipeline_bounded import observed

    with tempfile.TemporaryDirectory(prefix="perfsight-rank-") as tmp:
        spill = Path(tmp)
        max_slices = memory_budget.slices_per_chunk(budget)
        with spill_trace(path, spill / "trace", max_slices, rank=task.options.rank) as spilled:
            chunked = analyse_chunks(observed(spilled.chunks(), extras.add), task.options, spill / "rows")
            tables = {name: chunked.tables[name] for name in CLUSTER_TABLES if name in chunked.tables}
            rows = chunked.rows["communication_ops"]
            batches = list(rows.merged())
            tables["communication_ops"] = (
                pa.concat_tables(batches) if batches else communication.OP_TIME_SCHEMA.empty_table()
            )
            return dataclasses.replace(spilled.meta), chunked.steps, tables


class RankExtras:
    """The digest's extras of one rank from its chunks, added in order (:class:`TraceChunk`)."""

    def __init__(self) -> None:
        self.step_ops = step_ops.StepOpsMerge()
        self.device_facts: list[pa.Table] = []
        self.host_facts: list[pa.Table] = []
        self.ranges: list[pd.DataFrame] = []
        self.context: list[op_context.ContextRanges] = []
        self.comm_parts: list[pa.Table] = []
        self.comm_keys: list[np.ndarray] = []
        self.span: tuple[int, int] | None = None

    def add(self, chunk: TraceChunk) -> None:
        """Take what the extras need of one chunk (its rows are the whole trace's ``slice_rows``)."""
        trace, rows = chunk.trace, chunk.slice_rows
        part = step_ops.step_ops_part(trace, rows)
        self.step_ops.add(part)
        self.device_facts.append(_facts(trace, rows, part.device))
        if self.step_ops.has_device:
            self.host_facts.clear()
        else:
            self.host_facts.append(_facts(trace, rows, part.host))
        self.ranges.append(modules.range_rows(trace, rows))
        self.context.append(op_context.context_ranges(trace, rows))
        comm = comm_rows(trace)
        whole = whole_rows(columns.int64(comm.column("slice"), null=-1), rows)
        at = comm.schema.get_field_index("slice")
        comm = comm.set_column(
            at, comm.schema.field(at), pa.array(whole, comm.schema.field(at).type, mask=whole < 0)
        )
        self.comm_parts.append(comm)
        self.comm_keys.append(chunk.table_rows.get("comm", np.arange(comm.num_rows)))
        span = time_span(trace)
        if span is not None:
            self.span = (
                span if self.span is None else (min(self.span[0], span[0]), max(self.span[1], span[1]))
            )

    def tables(self, rank: int) -> dict[str, pa.Table]:
        """``step_ops``, ``op_context`` and ``module_statistic``, as the whole trace gives them."""
        ops = self.step_ops.table(rank)
        ranges = modules.nest_ranges(pd.concat(self.ranges, ignore_index=True))
        facts = _by_slice(self.device_facts if self.step_ops.has_device else self.host_facts)
        op_rows = ops.filter(pc.equal(ops.column("level"), "op")).column("slice").to_numpy()
        if op_rows.size:
            known = facts.column("slice").to_numpy()
            facts = facts.take(pa.array(np.searchsorted(known, op_rows), pa.int64()))
            context = op_context.context_of(
                rank, facts, ranges, op_context.ContextRanges.merged(self.context)
            )
        else:
            context = op_context.OP_CONTEXT_SCHEMA.empty_table()
        return {
            "step_ops": ops,
            "op_context": context,
            "module_statistic": modules.module_statistic_of(rank, ranges),
        }

    def comm(self) -> pa.Table:
        """The rank's ``comm_rows``, in the whole ``comm`` table's order."""
        return in_whole_order(self.comm_parts, self.comm_keys)


def _facts(trace: Trace, rows: np.ndarray, candidates: pd.DataFrame) -> pa.Table:
    """:func:`op_context.op_facts` of a chunk's op candidates (the crossing rows are never ops)."""
    picked = candidates.loc[candidates["candidate"].astype(bool), "slice"].to_numpy(np.int64)
    return op_context.op_facts(trace, np.searchsorted(rows, picked), rows)


def _by_slice(parts: list[pa.Table]) -> pa.Table:
    table = pa.concat_tables(parts)
    return table.take(pa.array(np.argsort(table.column("slice").to_numpy(), kind="stable"), pa.int64()))
