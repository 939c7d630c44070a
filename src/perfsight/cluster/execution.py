"""Every rank's ops of every step on the job's common clock, each with the key that matches it
across the devices of its stage: the data of the Marey view and the pipeline chart (seed 000).

Why here: matching the same op on several devices and shifting each rank onto one clock are
cross-rank facts (``perfsight.cluster.matching`` and ``.alignment`` decide them); the per-rank rows
come from ``perfsight.analysis.step_ops``.  This module only joins them:

* ``stage`` from the cluster step trace's stage of each rank;
* ``instance``: a communication op's matched instance (the same collective on every rank of its
  group, a send with its receive) -- -1 for compute and for an op that matched nothing;
* ``key``: what makes "the same op" on two devices of a stage.  A collective: its group and
  sequence number (the matched instance); any other op: its name and how many ops of that name
  came before it in the step (``aten::linear#3``); a micro-batch block: its phase and micro-batch
  (``forward#2``).  Rows of one stage with one key in one step are one op of the Marey view.
  The FLOPs and memory rows (``level`` ``flops`` / ``memory``: series with a ``value``, drawn as
  lines over the timelines) have no key.

Times are shifted by the alignment's offsets (``start_ns``/``end_ns`` on the common clock, ns).
Vectorised with Arrow kernels and NumPy sorts, no loop over ops.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from perfsight import columns
from perfsight.analysis.step_ops import SAMPLE_LEVELS
from perfsight.cluster.alignment import Alignment
from perfsight.cluster.matching import Matched
from perfsight.cluster.rank import RankDigest, concat
from perfsight.parquet_files import text_columns, writer_options

STEP_OPS_TABLE = "step_ops"
"""The per-rank table (``perfsight.analysis.step_ops``) each digest carries."""
OUTPUT_FILE = "cluster_step_ops.parquet"
"""Its cross-rank form in ``cluster_analysis_output/`` (columns: :data:`COLUMNS`)."""
ROW_GROUP_ROWS = 65_536
"""Rows per Parquet row group of :data:`OUTPUT_FILE`: its rows are sorted by step and rank, so the
Marey view's read of a page of devices' rows skips the other ranks' groups (pyarrow's default, a million
rows, spans hundreds of ranks at a few thousand rows a rank)."""
COLUMNS = [
    "step", "rank", "stage", "level", "order", "key", "name", "category", "phase", "micro_batch",
    "instance", "is_p2p", "peer", "start_ns", "end_ns", "slice", "value",
]  # fmt: skip
"""``slice``: the row in its rank's ``slices`` (joins the rank's ``op_context``); -1 for a
communication op (its row is the cluster's matched op)."""


def step_ops(
    digests: Mapping[int, RankDigest], matched: Matched, aligned: Alignment, stage_of: Mapping[int, int]
) -> pa.Table:
    """Every rank's step ops on the common clock with stage, matched instance and key (:data:`COLUMNS`).

    Compute ops and micro-batch blocks come from each rank's ``step_ops`` (shifted by the rank's
    clock offset); communication ops are the matched ops themselves (already on the common clock),
    named by their collective (``all_reduce``, ``send``, ``recv``).

    The text columns are dictionary-encoded (:func:`write` writes them as plain text): at 1,024 ranks
    the table has millions of rows whose names and keys repeat a few thousand values, and holding
    them as text (or sorting and counting them in pandas) took 16 s and 2 GB of the cross-rank step
    (docs/BENCHMARKS.md, "The cross-rank step's memory").  Built with NumPy sorts and group counts
    on integer codes, one column at a time: no second copy of the whole table is ever held."""
    ordered = [digests[r] for r in sorted(digests) if STEP_OPS_TABLE in digests[r].tables]
    own = concat(ordered, STEP_OPS_TABLE)
    own = own if own.num_rows else None
    comm = _comm_rows(matched.ops)
    if own is None and comm is None:
        return pa.table({c: pa.nulls(0) for c in COLUMNS})
    shift = _per_rank(columns.int64(own.column("rank")), aligned.offset_ns) if own is not None else None

    def numbers(name: str) -> np.ndarray:  # one column over the ranks' rows, then the matched ops
        parts = [] if own is None else [_own_numbers(own, name, shift)]
        return np.concatenate(parts + ([] if comm is None else [columns.numpy(comm.column(name))]))

    def text(name: str) -> tuple[np.ndarray, np.ndarray]:
        chunks = [] if own is None else own.column(name).chunks
        return _codes(chunks + ([] if comm is None else comm.column(name).chunks))

    level_codes, levels = text("level")
    level_rank = np.argsort(np.argsort(levels, kind="stable"), kind="stable")  # codes in text order
    rank, step = numbers("rank"), numbers("step")
    by = columns.lexsort((numbers("start_ns"), level_rank[level_codes], rank, step))
    rank, step, level_codes = rank[by], step[by], level_codes[by]
    out: dict[str, pa.Array] = {"step": pa.array(step), "rank": pa.array(rank)}
    out["stage"] = pa.array(_per_rank(rank, stage_of))
    out["level"] = _dictionary(level_codes, levels)
    run = _runs(step, rank, level_codes)  # one (step, rank, level) group, contiguous once sorted
    del rank, step
    out["order"] = pa.array(_position_in_group(run))
    coded = {"level": (level_codes, levels)}
    for name in ("name", "category", "phase"):
        codes, values = text(name)
        coded[name] = (codes[by], values)
        out[name] = _dictionary(*coded[name])
    for name in ("micro_batch", "instance", "is_p2p", "peer", "start_ns", "end_ns", "slice"):
        out[name] = pa.array(numbers(name)[by])
    values = [] if own is None else own.column("value").cast(pa.float64()).chunks
    values += [] if comm is None else comm.column("value").chunks
    out["value"] = columns.combined(pa.chunked_array(values, pa.float64()).take(pa.array(by)))
    del by
    keyed = ~np.isin(levels, SAMPLE_LEVELS)[level_codes]  # the FLOPs and memory series have no key
    name_codes = coded["name"][0]
    nth = np.zeros(len(run), np.int64)  # how many ops of its name came before it in its group
    nth[keyed] = _position_in_group(run[keyed] * (int(name_codes.max(initial=0)) + 2) + name_codes[keyed] + 1)
    del run
    instance = columns.numpy(out["instance"])
    kind = np.where(
        ~keyed, 0, np.where((levels == "micro_batch")[level_codes], 1, np.where(instance >= 0, 2, 3))
    )
    out["key"] = _keys(kind, nth, instance, columns.numpy(out["micro_batch"]), coded["name"], coded["phase"])
    if comm is None:  # only the ranks' own rows: their own integer types, as pandas kept them
        for name in ("rank", "step", "micro_batch"):
            out[name] = out[name].cast(pa.int32())
    return pa.table({c: out[c] for c in COLUMNS})


def write(table: pa.Table, path: Path) -> None:
    """Write :func:`step_ops`' table as :data:`OUTPUT_FILE`, a row group of :data:`ROW_GROUP_ROWS`
    rows at a time, read back with its text columns as plain text.

    Why the text columns go in as they are held, dictionary-encoded: Parquet stores text as a
    dictionary anyway, and decoding each row group to text only for the writer to build the same
    dictionary again was most of this file's cost (1,024 ranks, 2.9 M rows: 1.9 -> 0.5 s of CPU,
    docs/BENCHMARKS.md).  Arrow's own schema is not stored, so every reader (DuckDB, pyarrow,
    pandas) sees text columns, not dictionaries; statistics are kept for the number columns, by
    which the Marey view's queries skip the row groups of other steps and ranks."""
    if not table.num_rows:
        empty = pd.DataFrame({c: pd.Series(dtype="object") for c in COLUMNS})
        empty.to_parquet(path, index=False, row_group_size=ROW_GROUP_ROWS)
        return
    text = set(text_columns(table.schema))
    numbers = [name for name in table.column_names if name not in text]
    options = writer_options(table.schema, statistics=numbers)
    with pq.ParquetWriter(path, table.schema, store_schema=False, **options) as writer:
        for offset in range(0, table.num_rows, ROW_GROUP_ROWS):
            writer.write_table(table.slice(offset, ROW_GROUP_ROWS), row_group_size=ROW_GROUP_ROWS)


def _own_numbers(own: pa.Table, name: str, shift: np.ndarray) -> np.ndarray:
    """A number column of the ranks' own rows (compute ops, micro-batch blocks, FLOPs and memory
    series): times shifted onto the common clock; no instance, not point-to-point, no peer."""
    if name in ("instance", "peer"):
        return np.full(own.num_rows, -1, np.int64)
    if name == "is_p2p":
        return np.zeros(own.num_rows, bool)
    values = columns.int64(own.column(name))
    return values - shift if name in ("start_ns", "end_ns") else values


def _comm_rows(ops: pd.DataFrame) -> pa.Table | None:
    """The matched communication ops of a step (already on the common clock), as op rows named by
    their collective; None when there are none."""
    comm = ops[ops["step"].notna() & (ops["step"] >= 0)] if not ops.empty else ops
    if comm.empty:
        return None
    n = len(comm)
    return pa.table(
        {
            "rank": pa.array(comm["rank"].astype("int64").to_numpy()),
            "step": pa.array(comm["step"].astype("int64").to_numpy()),
            "level": pa.array(["op"] * n, pa.string()),
            "name": pa.array(comm["collective"].astype(str), pa.string()),
            "category": pa.array(["communication"] * n, pa.string()),
            "phase": pa.array([""] * n, pa.string()),
            "micro_batch": pa.array(np.full(n, -1, np.int64)),
            "instance": pa.array(comm["instance"].fillna(-1).astype("int64").to_numpy()),
            "is_p2p": pa.array(comm["is_p2p"].fillna(False).astype(bool).to_numpy()),
            "peer": pa.array(comm["peer"].fillna(-1).astype("int64").to_numpy()),
            "slice": pa.array(np.full(n, -1, np.int64)),
            "start_ns": pa.array(comm["start_ns"].astype("int64").to_numpy()),
            "end_ns": pa.array(comm["end_ns"].astype("int64").to_numpy()),
            "value": pa.nulls(n, pa.float64()),
        }
    )


def _keys(
    kind: np.ndarray,
    nth: np.ndarray,
    instance: np.ndarray,
    block: np.ndarray,
    name: tuple[np.ndarray, np.ndarray],
    phase: tuple[np.ndarray, np.ndarray],
) -> pa.DictionaryArray:
    """``phase#micro_batch`` for a micro-batch block (``kind`` 1), ``comm#instance`` for a matched
    communication op (2), ``name#nth`` for any other op (3); "" for the FLOPs and memory series (0)
    (module docstring).  ``name``, ``phase``: the rows' codes and the values they index.  Each
    distinct key is spelt once, from the first row that has it; the rows hold its code."""
    first = np.select([kind == 1, kind == 2, kind == 3], [block, instance, name[0]], 0)
    second = np.select([kind == 1, kind == 3], [phase[0], nth], 0)
    codes = columns.joint_codes(pa.array(kind), pa.array(first), pa.array(second))
    at = columns.first_rows(codes)
    kinds, text = pa.array(kind[at]), pa.string()

    def spelt(coded: tuple[np.ndarray, np.ndarray]) -> pa.Array:
        codes_at = coded[0][at]
        return pa.array(coded[1], text).take(pa.array(codes_at, mask=codes_at < 0))

    by_block = pc.binary_join_element_wise(spelt(phase), pa.array(block[at]).cast(text), "#")
    by_instance = pc.binary_join_element_wise("comm", pa.array(instance[at]).cast(text), "#")
    by_name = pc.binary_join_element_wise(spelt(name), pa.array(nth[at]).cast(text), "#")
    keys = pc.if_else(
        pc.equal(kinds, 1),
        by_block,
        pc.if_else(pc.equal(kinds, 2), by_instance, pc.if_else(pc.equal(kinds, 3), by_name, "")),
    )
    return _dictionary(codes, columns.combined(keys))


def _dictionary(codes: np.ndarray, values: pa.Array | np.ndarray) -> pa.DictionaryArray:
    """Rows' codes into ``values`` as a dictionary column (-1: null)."""
    values = values if isinstance(values, pa.Array) else pa.array(values, pa.string())
    return pa.DictionaryArray.from_arrays(pa.array(codes, pa.int32(), mask=codes < 0), values)


def _codes(chunks: list[pa.Array]) -> tuple[np.ndarray, np.ndarray]:
    """A code per row of ``chunks`` (text, plain or dictionary-encoded; -1: null) and the distinct
    values (an object array) the codes index.

    Why the dictionaries are unified and not the text hashed again: the ranks' own rows arrive
    dictionary-encoded, a chunk per rank, and decoding 2.9 M names to text only to hash them back
    into codes took 0.8 s of the cross-rank step at 1,024 ranks (docs/BENCHMARKS.md); a chunk's
    codes are only renumbered into the shared dictionary (which may list a value no row uses)."""
    coded = [_dictionary_chunk(chunk) for chunk in chunks]
    if not coded:
        return np.zeros(0, np.int64), np.array([], dtype=object)
    unified = pa.chunked_array(coded).unify_dictionaries()
    codes = np.concatenate([columns.int64(chunk.indices, -1) for chunk in unified.chunks])
    return codes, np.array(unified.chunk(0).dictionary.to_pylist(), dtype=object)


def _dictionary_chunk(chunk: pa.Array) -> pa.DictionaryArray:
    """``chunk`` as a dictionary of ``int32`` codes into ``string`` values."""
    if not pa.types.is_dictionary(chunk.type):
        chunk = pc.dictionary_encode(chunk.cast(pa.string()))
    return pa.DictionaryArray.from_arrays(chunk.indices.cast(pa.int32()), chunk.dictionary.cast(pa.string()))


def _runs(*keys: np.ndarray) -> np.ndarray:
    """For rows sorted by ``keys``, the index of each row's run of equal keys (0, 1, ...)."""
    n = len(keys[0])
    change = np.zeros(n, bool)
    change[:1] = True
    for key in keys:
        change[1:] |= key[1:] != key[:-1]
    return np.cumsum(change) - 1


def _position_in_group(codes: np.ndarray) -> np.ndarray:
    """Each row's position among the earlier rows with its code (a group count, in row order)."""
    n = len(codes)
    order = np.argsort(codes, kind="stable")
    ordered = codes[order]
    first = np.zeros(n, bool)
    first[:1] = True
    first[1:] = ordered[1:] != ordered[:-1]
    start = np.maximum.accumulate(np.where(first, np.arange(n), 0))
    position = np.empty(n, np.int64)
    position[order] = np.arange(n) - start
    return position


def _per_rank(rank: np.ndarray, values: Mapping[int, int]) -> np.ndarray:
    """``values`` of each row's rank (0 where it has none): one look-up per rank, not per row.

    Ranks are numbered from 0 to the world size, so a table indexed by rank serves every row; it
    replaced a sort of every row (``np.unique``: 0.4 s for 2.9 M rows at 1,024 ranks).  Rank
    numbers spread wider than the rows and the known ranks could fill still go through the sort."""
    if not len(rank):
        return np.zeros(0, np.int64)
    low, high = int(rank.min()), int(rank.max())
    if high - low >= 4 * (len(rank) + len(values)) + 1024:
        ranks, at = np.unique(rank, return_inverse=True)
        return np.array([int(values.get(int(r)) or 0) for r in ranks], np.int64)[at]
    table = np.zeros(high - low + 1, np.int64)
    for known, value in values.items():
        if low <= known <= high and value is not None:
            table[known - low] = int(value)
    return table[rank - low]
