"""The per-rank step of a cluster analysis: read one rank, analyse it, keep a small digest.

Why a digest: a thousand-rank job cannot hold a thousand traces in one process.  Each rank is read
and analysed where it lies (a worker process, a Dask worker); only the tables the cross-rank step
needs travel back -- communication op instances, steps, the step trace, the overlap breakdown,
FLOPs and memory peaks -- a few kilobytes per rank.  This module computes no metric itself: the
numbers come from ``perfsight.pipeline`` / ``perfsight.analysis``.  A Kineto rank (alone or in a
run folder) too large to read whole (``RankTask.memory_limit``, or more than its worker's share of
the memory) is analysed chunk of steps by chunk with the same digest (``perfsight.cluster.rank_chunks``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import posixpath
import shutil
import tempfile
import uuid
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from perfsight import columns
from perfsight.ingest import mindinsight_cluster as vendor_cluster
from perfsight.model import RunMetadata, Trace
from perfsight.pipeline import Options

if TYPE_CHECKING:
    from perfsight.cluster.discovery import RankInput

CLUSTER_TABLES = (
    "step_trace", "overlap_breakdown", "device_idle", "flops_by_step", "memory_peaks",
    "communication_ops", "communication_peers",
)  # fmt: skip
"""The per-rank analysis tables the cross-rank step reads (see docs/ANALYSIS_CONTRACT.md)."""

ELEMENT_BYTES = {
    "float": 4, "float32": 4, "half": 2, "float16": 2, "bfloat16": 2, "c10::bfloat16": 2,
    "c10::half": 2, "double": 8, "float64": 8, "int": 4, "int32": 4, "long": 8, "int64": 8,
    "short": 2, "int16": 2, "byte": 1, "uint8": 1, "char": 1, "int8": 1, "bool": 1,
    "complexfloat": 8,
}  # fmt: skip
"""Element sizes by the ``Input type`` names Kineto writes for a collective's tensor argument."""


@dataclasses.dataclass
class RankDigest:
    """What the cross-rank step needs from one rank (picklable; Arrow tables travel as IPC)."""

    source: str
    meta: RunMetadata
    comm: pa.Table  # the rank's ``comm`` rows plus ``name``, ``track`` and ``bytes`` (see comm_rows)
    steps: pa.Table
    tables: dict[str, pa.Table]
    output_dir: str | None = None
    summary: dict[str, Any] | None = None  # the single-rank summary, when the rank was fully analysed
    span_ns: tuple[int, int] | None = None  # first start and last end of its slices (trace clock)
    files: dict[str, str] = dataclasses.field(default_factory=dict)
    """Tables of ``tables`` held in an Arrow IPC file (name -> path) and read memory-mapped: a
    large rank's per-op tables (``cluster.rank_chunks``), which would otherwise be copied whole
    into the pickle that carries the digest to the parent and again out of it.  Pickled as their
    path; the parent maps the file again and pages the rows in as its readers read them."""

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["tables"] = {name: t for name, t in self.tables.items() if name not in self.files}
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self.tables.update({name: mapped_table(path) for name, path in self.files.items()})

    def release(self, table: str) -> None:
        """Drop one table (its rows now live in a cross-rank table; its file, if any, stays until
        the job's digest folder is removed)."""
        self.tables.pop(table, None)
        self.files.pop(table, None)

    def __post_init__(self) -> None:
        """Text that repeats a few values over a rank's rows travels and stays dictionary-encoded:
        a collective's group member list (a JSON list of up to thousands of ranks) on each of its
        ops, and each step op's kernel name, level, category and phase (kernel names of about 180
        characters, over millions of rows for a large rank).  Held as text, they were most of a
        digest: about 0.6 GB of the driver at 1,024 ranks (docs/BENCHMARKS.md, "The cross-rank
        step's memory").  Readers cast them back to text or read them as categories."""
        self.comm = dictionary_encoded(self.comm, COMPACT_COMM)
        if STEP_OPS in self.tables:
            self.tables[STEP_OPS] = compact_table(STEP_OPS, self.tables[STEP_OPS])

    @property
    def rank(self) -> int:
        return self.meta.rank


STEP_OPS = "step_ops"
COMPACT_COMM = ("group_ranks",)
COMPACT_STEP_OPS = ("level", "name", "category", "phase")
"""The digest's text columns held dictionary-encoded (see :meth:`RankDigest.__post_init__`)."""


def compact_table(name: str, table: pa.Table) -> pa.Table:
    """A digest's table ``name`` in the form the digest holds it (:meth:`RankDigest.__post_init__`)."""
    return dictionary_encoded(table, COMPACT_STEP_OPS) if name == STEP_OPS else table


def dictionary_encoded(table: pa.Table, names: Iterable[str]) -> pa.Table:
    """``table`` with its columns ``names`` (where present and not already) dictionary-encoded."""
    for name in names:
        i = table.schema.get_field_index(name)
        if i >= 0 and not pa.types.is_dictionary(table.schema.field(i).type):
            table = table.set_column(i, name, pc.dictionary_encode(table.column(i)).combine_chunks())
    return table


def write_table_file(table: pa.Table, path: Path) -> str:
    """Write ``table`` as an uncompressed Arrow IPC file (what :func:`mapped_table` maps without
    a copy); returns its path."""
    with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_file(sink, table.schema) as writer:
        writer.write_table(table, max_chunksize=1 << 20)
    return str(path)


def mapped_table(path: str) -> pa.Table:
    """The table of an Arrow IPC file, its buffers pointing into a memory map of the file (the
    pages are read as they are touched and can be dropped again by the OS: they are the file's)."""
    return pa.ipc.open_file(pa.memory_map(path)).read_all()


def concat(digests: Iterable[RankDigest], table: str) -> pa.Table:
    """One Arrow table over all ranks (``comm``, ``steps`` or an analysis table name): the
    cross-rank step converts it to pandas once, not once per rank."""
    parts = [getattr(d, table) if table in ("comm", "steps") else d.tables[table] for d in digests]
    parts = [p for p in parts if p is not None]
    if not parts:
        return pa.table({})
    return pa.concat_tables(parts, promote_options="permissive")


@dataclasses.dataclass
class RankFailure:
    """An input that could not be read; reported by source, the rest of the job is analysed."""

    source: str
    message: str


def comm_rows(trace: Trace) -> pa.Table:
    """The ``comm`` table with the op's name, its track and a ``bytes`` column filled where possible.

    ``bytes`` is the collective's input size: ``in_bytes`` when the trace (or perfsight's capture)
    recorded it (``out_bytes`` for a receive, which has no input), else the first tensor argument's
    element count times its element size, from the op's ``Input Dims`` / ``Input type`` (what
    plain ``torch.profiler`` records for gloo ops).
    """
    comm = trace.comm
    slice_rows = columns.int64(comm.column("slice"), null=-1)
    known = slice_rows >= 0
    rows = pa.array(np.where(known, slice_rows, 0), pa.int64(), mask=~known)
    names = pc.cast(pc.take(trace.slices.column("name"), rows), pa.string())
    if "name" in comm.column_names:
        names = pc.coalesce(comm.column("name"), names)
        comm = comm.drop_columns(["name"])
    tracks = pc.take(trace.slices.column("track"), rows)
    dims = pc.take(trace.slices.column("input_dims"), rows)
    types = pc.take(trace.slices.column("input_types"), rows)
    from_args = _first_tensor_bytes(dims, types)
    recorded_in = columns.int64(comm.column("in_bytes"), null=-1)
    recorded_out = columns.int64(comm.column("out_bytes"), null=-1)
    recorded = np.where(recorded_in > 0, recorded_in, recorded_out)  # a receive records only its output
    nbytes = np.where(recorded >= 0, recorded, from_args)
    return (
        comm.append_column("name", names)
        .append_column("track", tracks)
        .append_column("bytes", pa.array(nbytes, pa.int64(), mask=nbytes < 0))
    )


def _first_tensor_bytes(dims: pa.ChunkedArray, types: pa.ChunkedArray) -> np.ndarray:
    """Bytes of each row's first argument (-1 where its shape or dtype is unknown); vectorised."""
    out = np.full(len(dims), -1, np.int64)
    shapes, has_shape = _first_items(dims)
    dtypes, has_type = _first_items(types)
    usable = has_shape & has_type
    if not usable.any():
        return out
    shapes = shapes.filter(pa.array(usable[has_shape]))
    dtypes = dtypes.filter(pa.array(usable[has_type]))
    lengths = columns.int64(pc.list_value_length(shapes), null=0)
    flat = columns.int64(pc.list_flatten(shapes), null=0)
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]])
    products = np.multiply.reduceat(np.append(flat, 1), starts) if flat.size else np.ones(len(lengths))
    numel = np.where(lengths > 0, products, 1).astype(np.int64)  # a 0-d tensor has one element
    keys = pa.array(list(ELEMENT_BYTES))
    index = columns.int64(pc.index_in(pc.utf8_lower(pc.cast(dtypes, pa.string())), keys), null=-1)
    sizes = np.array(list(ELEMENT_BYTES.values()), np.int64)
    elem = np.where(index >= 0, sizes[np.maximum(index, 0)], -1)
    out[usable] = np.where(elem > 0, numel * elem, -1)
    return out


def _first_items(lists: pa.ChunkedArray) -> tuple[pa.Array, np.ndarray]:
    """Each row's first list item (for rows that have one) and the mask of rows that have one."""
    combined = columns.combined(lists).fill_null([])
    lengths = columns.int64(pc.list_value_length(combined), null=0)
    firsts = np.cumsum(lengths) - lengths
    flat = pc.list_flatten(combined)
    return flat.take(pa.array(firsts[lengths > 0], pa.int64())), lengths > 0


@dataclasses.dataclass(frozen=True)
class RankTask:
    """What the per-rank step is asked to do; picklable, so it travels to workers as is."""

    out_root: str | None  # write ``rank<N>/`` outputs under this folder; None: analyse only
    options: Options = dataclasses.field(default_factory=Options)
    token: str = dataclasses.field(default_factory=lambda: uuid.uuid4().hex)  # one per analysis
    memory_limit: int | None = None
    """Bytes each rank's analysis may use (``--memory-limit``: per rank, so per worker); a plain
    Kineto rank that would need more is analysed in bounded memory (``cluster.rank_chunks``)."""
    workers: int = 1
    """Ranks analysed side by side on one machine: without ``memory_limit``, a rank goes the bounded
    way when it would need more than this share of the memory a single trace may take."""
    digest_dir: str | None = None
    """A folder the parent process can read (the job's, removed after the cross-rank step) where
    a rank analysed in bounded memory leaves its per-op digest tables as files (``RankDigest.files``);
    None (a Dask cluster's workers, whose folders the parent may not see): they travel in the digest."""


def run_rank(item: RankInput, task: RankTask) -> RankDigest | RankFailure:
    """Read, analyse and (optionally) write one rank; never raises for a bad input.

    Runs in a worker process or on a Dask worker, so it returns plain data: a digest, or a failure
    that names the input and what is wrong with it.
    """
    from perfsight.analysis import index
    from perfsight.cluster import rank_chunks
    from perfsight.ingest import TraceReadError, eventscan, read_trace

    try:
        with _local_copy(item) as path:
            budget = rank_chunks.rank_budget(path, task)
            if budget is not None:  # too large to read whole: chunk of steps by chunk, same digest
                return rank_chunks.run_rank_bounded(path, item.trace, item.label, task, budget)
            with eventscan.pages_kept():  # this process reads rank after rank
                trace = read_trace(path, rank=task.options.rank)
        trace.meta.sources = [item.trace]
    except (TraceReadError, OSError, ValueError) as exc:
        return RankFailure(item.trace, str(exc))
    try:
        return _digest(item, task, trace)
    finally:
        index.release(trace)


def _digest(item: RankInput, task: RankTask, trace: Trace) -> RankDigest | RankFailure:
    """The digest of a rank read whole.  The trace's index (:mod:`perfsight.analysis.index`) is
    shared by the analyses and the step ops: the caller releases it once both are done."""
    from perfsight.analysis.modules import module_ranges, module_statistic
    from perfsight.analysis.op_context import op_context
    from perfsight.analysis.step_ops import step_ops
    from perfsight.pipeline import ANALYSES, analyse_and_write

    if task.out_root is None:
        tables = _cluster_tables(trace, task.options, ANALYSES)
        summary = None
        output_dir = None
    else:
        try:
            rank_dir = claim_rank_dir(Path(task.out_root), trace.rank, item.label, task.token)
            result = analyse_and_write(trace, rank_dir, task.options)
            output_dir = str(result.output_dir)
        except OSError as exc:  # disk full, no permission: this rank's files, not the job, are lost
            return RankFailure(item.trace, f"rank {trace.rank}: outputs not written ({exc})")
        tables = {name: result.tables[name] for name in CLUSTER_TABLES}
        from perfsight.summary import rank_summary

        summary = rank_summary(result)
    # MindSpore's own per-step breakdown of a legacy rank (the cluster step trace's fallback)
    tables[vendor_cluster.TABLE] = trace.vendor.tables.get(
        vendor_cluster.TABLE, vendor_cluster.SCHEMA.empty_table()
    )
    tables["step_ops"] = step_ops(trace)  # the parallel-execution views' ops (perfsight.cluster.execution)
    ranges = module_ranges(trace)  # nn.Module forwards, read once for the next two
    tables["op_context"] = op_context(
        trace, tables["step_ops"], ranges
    )  # ops' modules and marks (strategy_graph)
    tables["module_statistic"] = module_statistic(trace, ranges)  # time per nn.Module (cluster.module_table)
    return RankDigest(
        source=item.trace,
        meta=trace.meta,
        comm=comm_rows(trace),
        steps=trace.steps,
        tables=tables,
        output_dir=output_dir,
        summary=summary,
        span_ns=time_span(trace),
    )


def time_span(trace: Trace) -> tuple[int, int] | None:
    """When the rank recorded (trace clock, ns): what tells a rank of another run apart in time."""
    slices = trace.slices
    if not slices.num_rows:
        return None
    first = pc.min(slices.column("start_ns")).as_py()
    last = pc.max(pc.add(slices.column("start_ns"), slices.column("dur_ns"))).as_py()
    return (int(first), int(last)) if first is not None and last is not None else None


def _cluster_tables(trace: Trace, options: Options, analyses: dict) -> dict[str, pa.Table]:
    """Only the analyses the cross-rank step reads, in pipeline order (a fraction of the full set)."""
    done: dict[str, pa.Table] = {}
    needed = set(CLUSTER_TABLES) | {"memory_curve"}
    for name, run in analyses.items():
        if name in needed:
            done[name] = run(trace, options, done)
    return {name: done[name] for name in CLUSTER_TABLES}


def claim_rank_dir(root: Path, rank: int, label: str, token: str) -> Path:
    """``rank<N>`` for the first input of a rank in this analysis (an earlier analysis' folder is
    reused, as a single-rank analysis does), ``rank<N>_<label>`` for later ones.  Workers race for
    the name, so the claim is an exclusively created marker named by this analysis' token."""
    claims = root / ".perfsight-claims"
    claims.mkdir(parents=True, exist_ok=True)
    try:
        os.close(os.open(claims / f"{token}-rank{rank}", os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        name = f"rank{rank}"
    except FileExistsError:
        name = f"rank{rank}_{_safe(label)}"
    return root / name  # made by the writer, which removes it again if writing fails


def _safe(label: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in label)[:80] or "input"


@contextlib.contextmanager
def _local_copy(item: RankInput) -> Iterator[Path]:
    """The input as a local file; a remote input and its companions are copied into a temp folder
    (deleted afterwards), keeping their folder name so the run-folder reader recognises it."""
    from perfsight.cluster.discovery import is_remote

    if not is_remote(item.trace):
        yield Path(item.trace.removeprefix("file://"))
        return
    import fsspec

    with tempfile.TemporaryDirectory(prefix="perfsight-") as tmp:
        folder = Path(tmp) / _safe(item.label)
        folder.mkdir()
        for url in (item.trace, *item.companions):
            with fsspec.open(url, "rb") as remote, open(folder / posixpath.basename(url), "wb") as local:
                shutil.copyfileobj(remote, local, 1 << 22)
        yield folder / posixpath.basename(item.trace)
