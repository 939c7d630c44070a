"""The chunked analysis' per-row tables that need state across chunks: allocations waiting for
their release (:class:`Allocations`) and the communication tables, whose ``op`` and ``comm_row``
are known only once every chunk was seen (:class:`Communication`).

Split from ``chunked_analysis.py``, which drives them.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pyarrow as pa

from perfsight import columns
from perfsight.analysis import communication, memory
from perfsight.chunked_spills import MappedSpill, set_column
from perfsight.model import Trace
from perfsight.sorted_runs import RunSpill


class Allocations:
    """operator_memory chunk by chunk: allocations whose address sees no later event in their
    chunk wait (with their operator's name) for the chunks that may release them."""

    def __init__(self, folder: Path) -> None:
        self.spill = RunSpill(folder, "operator_memory")
        self.open: pa.Table | None = None  # raw memory rows of the waiting allocations, by time
        self.open_names = pa.array([], pa.string())
        self.open_keys = np.zeros(0, np.int64)
        self.next_key = 0

    def add(self, trace: Trace) -> pa.Table | None:
        """Spill what the chunk settles; returns the allocations it made (time, size, operator)."""
        if trace.memory.num_rows == 0:
            return None
        carried = 0 if self.open is None else self.open.num_rows
        rows = trace.memory if self.open is None else pa.concat_tables([self.open, trace.memory])
        alloc, following = memory.allocations(rows)
        new = alloc >= carried  # allocations sort by time: the carried (earlier) ones come first
        names = pa.concat_arrays(
            [
                self.open_names,
                columns.combined(memory.allocating_ops(trace, trace.memory, alloc[new] - carried)),
            ]
        )
        keys = np.concatenate([self.open_keys, self.next_key + np.arange(int(new.sum()), dtype=np.int64)])
        self.next_key += int(new.sum())
        waiting = following < 0
        self._emit(
            rows, alloc[~waiting], following[~waiting], names.filter(pa.array(~waiting)), keys[~waiting]
        )
        self.open = rows.take(pa.array(alloc[waiting], pa.int64()))
        self.open_names = names.filter(pa.array(waiting))
        self.open_keys = keys[waiting]
        made = alloc[new]
        return pa.table(
            {
                "alloc_ns": pa.array(columns.int64(rows.column("ts_ns"))[made], pa.int64()),
                "size_bytes": pa.array(columns.int64(rows.column("bytes"))[made], pa.int64()),
                "name": names.slice(carried),
            }
        )

    def _emit(
        self, rows: pa.Table, alloc: np.ndarray, following: np.ndarray, names: pa.Array, keys: np.ndarray
    ) -> None:
        table = memory.allocation_rows(rows, alloc, following, names)
        order = np.argsort(keys, kind="stable")
        self.spill.add(table.take(pa.array(order, pa.int64())), keys[order])

    def finish(self) -> RunSpill:
        if self.open is not None and self.open.num_rows:
            none = np.full(self.open.num_rows, -1, np.int64)
            self._emit(self.open, np.arange(self.open.num_rows), none, self.open_names, self.open_keys)
        if self.spill.schema is None:
            self.spill.schema = memory.OPERATOR_MEMORY_SCHEMA
        return self.spill


# -------------------------------------------------------------------------------------- communication


class Communication:
    """The communication tables of the chunks of one kind (with device rows, or host rows only)."""

    def __init__(self, folder: Path, bucket: str) -> None:
        self.ops = MappedSpill(folder, f"communication_ops.{bucket}")
        self.links = MappedSpill(folder, f"communication_links.{bucket}")
        self.sizes: list[pa.Table] = []
        self.peers: list[pa.Table] = []
        self.step_times: list[pa.Table] = []
        self.step_links: list[pa.Table] = []
        self.primary: list[np.ndarray] = []
        self.seen = False

    def add(self, trace: Trace, keys: np.ndarray) -> None:
        """One chunk's tables, its ops named by ``keys`` (each comm row's row in the whole ``Trace.comm``)."""
        self.seen = True
        primary = keys[communication.primary_rows(trace.comm)]
        self.primary.append(primary)
        ops = communication.communication_ops(trace)
        links = communication.communication_links(trace)
        self.step_times.append(communication.step_times(ops))
        self.step_links.append(communication.step_links(links))
        op_key = keys[columns.int64(ops.column("comm_row"))] if ops.num_rows else np.zeros(0, np.int64)
        self.ops.add(set_column(set_column(ops, "op", op_key), "comm_row", op_key), op_key)
        link_key = primary[columns.int64(links.column("op"))] if links.num_rows else np.zeros(0, np.int64)
        per_op = len(communication.LINK_TYPES)
        self.links.add(
            set_column(links, "op", link_key), link_key * per_op + np.arange(len(link_key)) % per_op
        )
        sizes = communication.communication_sizes(trace)
        self.sizes.append(
            set_column(sizes, "op", primary[columns.int64(sizes.column("op"))]) if sizes.num_rows else sizes
        )
        peers = communication.communication_peers(trace)
        self.peers.append(
            set_column(peers, "comm_row", keys[columns.int64(peers.column("comm_row"))])
            if peers.num_rows
            else peers
        )

    def remove(self) -> None:
        self.ops.remove()
        self.links.remove()

    def finish(self, comm_keys: np.ndarray) -> tuple[dict[str, pa.Table], dict[str, RunSpill]]:
        """The tables once every chunk was seen: keys become ``op`` (place among the op instances)
        and ``comm_row`` (place in ``Trace.comm``)."""
        primary = np.sort(np.concatenate(self.primary)) if self.primary else np.zeros(0, np.int64)

        def op_of(values: pa.ChunkedArray | pa.Array) -> np.ndarray:
            return np.searchsorted(primary, columns.int64(values))

        def row_of(values: pa.ChunkedArray | pa.Array) -> np.ndarray:
            return np.searchsorted(comm_keys, columns.int64(values))

        self.ops.transform = lambda t: set_column(
            set_column(t, "op", op_of(t.column("op"))), "comm_row", row_of(t.column("comm_row"))
        )
        self.links.transform = lambda t: set_column(t, "op", op_of(t.column("op")))
        for spill, schema in (
            (self.ops, communication.OP_TIME_SCHEMA),
            (self.links, communication.LINK_SCHEMA),
        ):
            spill.schema = spill.schema or schema
        sizes = renumbered(self.sizes, "op", op_of, communication.SIZE_SCHEMA)
        peers = renumbered(self.peers, "comm_row", row_of, communication.PEER_SCHEMA)
        tables = {
            "communication_sizes": sizes,
            "communication_peers": peers,
            "communication_steps": communication.step_times(
                concat_or(self.step_times, communication.STEP_TIME_SCHEMA)
            ),
            "communication_step_links": communication.step_links(
                concat_or(self.step_links, communication.LINK_SCHEMA)
            ),
            "communication_step_sizes": communication.step_sizes(sizes),
        }
        return tables, {"communication_ops": self.ops, "communication_links": self.links}


def concat_or(parts: list[pa.Table], schema: pa.Schema) -> pa.Table:
    return pa.concat_tables(parts) if parts else schema.empty_table()


def renumbered(
    parts: list[pa.Table], column: str, number: Callable[[pa.ChunkedArray], np.ndarray], schema: pa.Schema
) -> pa.Table:
    """The chunks' rows with ``column`` renumbered, stable-sorted by it (each chunk's rows are
    already in the whole table's order within one op)."""
    table = concat_or([p for p in parts if p.num_rows], schema)
    if table.num_rows == 0:
        return schema.empty_table()
    values = number(table.column(column))
    table = set_column(table, column, values)
    return table.take(pa.array(np.argsort(values, kind="stable"), pa.int64()))
