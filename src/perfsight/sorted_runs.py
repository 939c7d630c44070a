"""Tables spilled to disk a sorted run at a time, read back as one table in key order, in batches.

Why: the bounded-memory path analyses a trace chunk by chunk, but a per-row result (every
kernel, every operator instance) must come out in the order the whole-trace analysis gives it,
and the cached trace's slices in their row order.  Each chunk's rows are already in that order
among themselves (a chunk keeps its rows' order), so the whole table is a merge of sorted runs:
each run goes to its own Parquet file, and :meth:`RunSpill.merged` reads all runs a batch at a
time and yields rows up to the smallest key any run still has buffered.  Memory is one batch
per run, whatever the table's size.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from perfsight.parquet_files import spill_options

KEY = "__run_key"
"""The column a run carries its sort key in on disk (dropped from what :meth:`RunSpill.merged` yields)."""


class RunSpill:
    """One table, added as runs sorted by an int64 key, merged back in key order.

    Runs of a table keyed by each row's place in the whole table (unique keys) come back exactly
    in that order.  A key may repeat; equal keys then come out together in a stable order within
    one batch, but their order across runs is not kept when they straddle a batch boundary.
    """

    def __init__(self, folder: Path, name: str, batch_rows: int = 65_536) -> None:
        self.folder = Path(folder)
        self.name = name
        self.batch_rows = batch_rows
        self.runs: list[Path] = []
        self.schema: pa.Schema | None = None
        self.rows = 0

    def add(self, table: pa.Table, key: np.ndarray) -> None:
        """Spill one run: ``table`` with ``key`` (one int64 per row, non-decreasing)."""
        key = np.asarray(key, dtype=np.int64)
        if len(key) != table.num_rows:
            raise ValueError(f"{self.name}: {len(key)} keys for {table.num_rows} rows")
        if len(key) > 1 and np.any(np.diff(key) < 0):
            raise ValueError(f"{self.name}: a run's keys must not decrease")
        if self.schema is None:
            self.schema = table.schema
        if table.num_rows == 0:
            return
        self.folder.mkdir(parents=True, exist_ok=True)
        path = self.folder / f"{self.name}.{len(self.runs):05d}.parquet"
        keyed = table.append_column(KEY, pa.array(key, pa.int64()))
        pq.write_table(keyed, path, row_group_size=self.batch_rows, **spill_options(keyed.schema))
        self.runs.append(path)
        self.rows += table.num_rows

    def merged(self) -> Iterator[pa.Table]:
        """The whole table in key order, a batch at a time (re-iterable)."""
        readers = [_Run(path, self.batch_rows, self._dictionaries()) for path in self.runs]
        live = [r for r in readers if r.fill()]
        while live:
            bound = min(r.last_key() for r in live)
            # only the runs holding a key up to the bound give rows: with a chunk per run, mostly
            # one, whose rows then need no concatenation nor sort (many chunks made every step
            # slice every run)
            givers = [r for r in live if r.first_key() <= bound]
            if len(givers) == 1:
                table = givers[0].take_upto(bound)[1]
            else:
                parts = [r.take_upto(bound) for r in givers]
                keys = np.concatenate([k for k, _ in parts])
                table = pa.concat_tables([t for _, t in parts])
                order = np.argsort(keys, kind="stable")
                if len(order) and np.any(np.diff(order) != 1):
                    table = table.take(pa.array(order))
            yield table.drop_columns([KEY])
            live = [r for r in live if r.fill()]

    def remove(self) -> None:
        """Delete the run files."""
        for path in self.runs:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
        self.runs.clear()

    def _dictionaries(self) -> list[str]:
        if self.schema is None:
            return []
        return [f.name for f in self.schema if pa.types.is_dictionary(f.type)]


class _Run:
    """One run file read a batch at a time, with the rows not yet handed out."""

    def __init__(self, path: Path, batch_rows: int, dictionaries: list[str]) -> None:
        self.batches = pq.ParquetFile(path, read_dictionary=dictionaries).iter_batches(batch_size=batch_rows)
        self.table: pa.Table | None = None
        self.keys = np.zeros(0, np.int64)

    def fill(self) -> bool:
        """Read the next batch when the buffer is empty; False once the run is spent."""
        if self.table is not None and self.table.num_rows:
            return True
        batch = next(self.batches, None)
        if batch is None:
            return False
        self.table = pa.Table.from_batches([batch])
        self.keys = self.table.column(KEY).to_numpy()
        return True

    def first_key(self) -> int:
        return int(self.keys[0])

    def last_key(self) -> int:
        return int(self.keys[-1])

    def take_upto(self, bound: int) -> tuple[np.ndarray, pa.Table]:
        assert self.table is not None
        n = int(np.searchsorted(self.keys, bound, side="right"))
        taken, keys = self.table.slice(0, n), self.keys[:n]
        self.table, self.keys = self.table.slice(n), self.keys[n:]
        return keys, taken
