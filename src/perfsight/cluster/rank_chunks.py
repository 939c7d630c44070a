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

What the limit covers: the bounded path's own peak (``memory_budget``) and the digest.  The
digest's per-op tables grow with the trace (a ``step_ops`` row per outermost op and per
allocator event, an ``op_context`` row per op: 1.35 M and 0.44 M rows for a generated rank of
1 GB of JSON), so none is held beside the analysis: each chunk's step-op candidates and op facts
are written to a scratch folder as the chunk passes (:class:`RankExtras`) and read back once the
analysis has ended and its memory is freed; the tables are then made one at a time, their text
as codes (never spelt out per row), each written to an Arrow IPC file in the job's digest folder
before the next is made (:class:`DigestFiles`).  The worker and the parent map those files
rather than hold the rows, and the digest is pickled to the parent with their paths (the rows
were one more whole copy on each side); the job removes the folder after the cross-rank step
(``cluster.job``).  Making the tables peaks below the analysis (a 1 GB rank: ~440 MiB against
~480 MiB), so a rank's worker peaks where the bounded analysis alone does: 467-488 MiB within
600M, against 898-915 MiB when the digest was held and pickled (docs/BENCHMARKS.md, "A job's
large ranks").  Below the bounded path's own floor (400M for that rank) the worker, like the
single-trace analysis, goes over the limit by what its smallest chunks need.

What it must not do: compute a metric its own way (every value comes from the functions the
whole-trace path calls), or hold a per-row table of the whole trace beyond what the digest keeps.
"""

from __future__ import annotations

import dataclasses
import logging
import pickle
import tempfile
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from perfsight import columns, heap, memory_budget
from perfsight.analysis import communication, modules, op_context, step_ops
from perfsight.cluster.rank import (
    CLUSTER_TABLES,
    COMPACT_STEP_OPS,
    RankDigest,
    RankFailure,
    RankTask,
    claim_rank_dir,
    comm_rows,
    compact_table,
    mapped_table,
    time_span,
    write_table_file,
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
    outputs asked for, the analysis spills to a temporary folder deleted afterwards.  The
    extras' per-chunk parts wait on disk meanwhile (:class:`RankExtras`), and the per-op tables
    are made once the analysis' memory is freed, one at a time, each left in a file of
    ``task.digest_dir`` (:class:`DigestFiles`) before the next is made."""
    from perfsight.ingest import TraceReadError
    from perfsight.pipeline import OutputError
    from perfsight.pipeline_bounded import analyse_and_write_bounded

    files = DigestFiles(task.digest_dir)
    try:
        with tempfile.TemporaryDirectory(prefix="perfsight-extras-", dir=files.scratch()) as parts:
            extras = RankExtras(Path(parts))
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
                del result
            heap.return_freed_memory()  # the analysis' transients, before the per-op tables are made
            tables.update(extras.tables(meta.rank, files.keep))
    except (TraceReadError, ValueError) as exc:
        return RankFailure(source, str(exc))
    except OutputError as exc:  # disk full, no permission: this rank's files, not the job, are lost
        return RankFailure(source, f"outputs not written ({exc})")
    except OSError as exc:
        return RankFailure(source, f"{path}: {exc}")
    meta.sources = [source]
    tables = {
        **{name: tables[name] for name in CLUSTER_TABLES},
        vendor_cluster.TABLE: vendor_cluster.SCHEMA.empty_table(),  # a Kineto rank has none
        **{name: tables[name] for name in EXTRA_TABLES},
    }
    return RankDigest(
        source=source,
        meta=meta,
        comm=extras.comm(),
        steps=steps,
        tables=tables,
        output_dir=output_dir,
        summary=summary,
        span_ns=extras.span,
        files=files.paths,
    )


class DigestFiles:
    """Where a large rank's per-op digest tables are held once made: each in an Arrow IPC file
    of the job's digest folder (``RankTask.digest_dir``), memory-mapped, so neither the worker
    nor the pickle that carries the digest to the parent holds its rows (``RankDigest.files``);
    in memory where the job has no such folder (a Dask cluster)."""

    def __init__(self, folder: str | None) -> None:
        self.folder = None if folder is None else Path(folder)
        self.paths: dict[str, str] = {}

    def scratch(self) -> str | None:
        """A folder for the extras' parts: the digest folder (made here by the first rank that
        needs it), else the system's temporary folder (None)."""
        if self.folder is None:
            return None
        self.folder.mkdir(parents=True, exist_ok=True)
        return str(self.folder)

    def keep(self, name: str, table: pa.Table) -> pa.Table:
        """``table`` as the digest will hold it: in its compact form (``RankDigest``), from a file
        when there is a folder."""
        table = compact_table(name, table)
        if self.folder is None:
            return table
        path = self.folder / f"{uuid.uuid4().hex}-{name}.arrow"
        self.paths[name] = write_table_file(table, path)
        del table
        heap.return_freed_memory()
        return mapped_table(self.paths[name])


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


EXTRA_TABLES = ("step_ops", "op_context", "module_statistic")
"""The digest's tables :class:`RankExtras` makes (the whole-trace path: ``rank.run_rank``)."""


class RankExtras:
    """The digest's extras of one rank from its chunks, added in order (:class:`TraceChunk`).

    What grows with the trace -- the step ops' candidates (:class:`~perfsight.analysis.step_ops.StepOpsPart`)
    and the op candidates' facts -- is written to ``spill`` chunk by chunk when given (a folder
    the caller removes), and read back only by :meth:`tables`, once the chunks' analysis is over:
    during the chunks it would add to the bounded analysis' own peak.  The rest (module and
    context ranges, ``comm`` rows, the span) is a few rows a step and stays in memory."""

    def __init__(self, spill: Path | None = None) -> None:
        self.parts = _Parts(spill, "step-ops")
        self.facts = _Parts(spill, "facts")
        self.has_device = False
        self.ranges: list[pd.DataFrame] = []
        self.context: list[op_context.ContextRanges] = []
        self.comm_parts: list[pa.Table] = []
        self.comm_keys: list[np.ndarray] = []
        self.span: tuple[int, int] | None = None

    def add(self, chunk: TraceChunk) -> None:
        """Take what the extras need of one chunk (its rows are the whole trace's ``slice_rows``)."""
        trace, rows = chunk.trace, chunk.slice_rows
        part = step_ops.step_ops_part(trace, rows)
        self.has_device |= not part.device.empty
        device = _facts(trace, rows, part.device)
        host = None if self.has_device else _facts(trace, rows, part.host)  # only without device ops
        if self.has_device:
            part.host = part.host.none()
        self.parts.append(part)
        self.facts.append((device, host))
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

    def tables(
        self, rank: int, keep: Callable[[str, pa.Table], pa.Table] = lambda name, table: table
    ) -> dict[str, pa.Table]:
        """``step_ops``, ``op_context`` and ``module_statistic``, as the whole trace gives them;
        each passed to ``keep`` as soon as it is made (what it returns is kept), and what made
        it let go before the next is made."""
        merge = step_ops.StepOpsMerge()
        for part in self.parts.read():
            merge.add(part)
        ops = keep("step_ops", merge.table(rank, encoded=COMPACT_STEP_OPS))
        del merge
        op_rows = ops.filter(pc.equal(ops.column("level"), "op")).column("slice").to_numpy()
        ranges = modules.nest_ranges(pd.concat(self.ranges, ignore_index=True))
        if op_rows.size:
            device, host = zip(*self.facts.read(), strict=True)
            facts = _by_slice(list(device) if self.has_device else [h for h in host if h is not None])
            del device, host
            known = facts.column("slice").to_numpy()
            facts = facts.take(pa.array(np.searchsorted(known, op_rows), pa.int64()))
            context = op_context.context_of(
                rank, facts, ranges, op_context.ContextRanges.merged(self.context)
            )
            del facts
        else:
            context = op_context.OP_CONTEXT_SCHEMA.empty_table()
        return {
            "step_ops": ops,
            "op_context": keep("op_context", context),
            "module_statistic": modules.module_statistic_of(rank, ranges),
        }

    def comm(self) -> pa.Table:
        """The rank's ``comm_rows``, in the whole ``comm`` table's order."""
        return in_whole_order(self.comm_parts, self.comm_keys)


class _Parts:
    """One object per chunk, appended in order and read back in that order: written to a file
    of ``folder`` each (pickled: this process writes and reads its own files, in a folder it
    made), or held in memory without a folder."""

    def __init__(self, folder: Path | None, name: str) -> None:
        self.folder = folder
        self.name = name
        self.items: list[Any] = []

    def append(self, item: Any) -> None:
        if self.folder is None:
            self.items.append(item)
            return
        path = self.folder / f"{self.name}-{len(self.items)}.pickle"
        with open(path, "wb") as file:
            pickle.dump(item, file, protocol=pickle.HIGHEST_PROTOCOL)
        self.items.append(path)

    def read(self) -> Iterator[Any]:
        for item in self.items:
            if self.folder is None:
                yield item
                continue
            with open(item, "rb") as file:
                yield pickle.load(file)  # noqa: S301 -- our own file, written above


def _facts(trace: Trace, rows: np.ndarray, candidates: step_ops.Rows) -> pa.Table:
    """:func:`op_context.op_facts` of a chunk's op candidates (the crossing rows are never ops)."""
    picked = candidates["slice"][candidates["candidate"]].astype(np.int64)
    return op_context.op_facts(trace, np.searchsorted(rows, picked), rows)


def _by_slice(parts: list[pa.Table]) -> pa.Table:
    table = pa.concat_tables(parts)
    return table.take(pa.array(np.argsort(table.column("slice").to_numpy(), kind="stable"), pa.int64()))
