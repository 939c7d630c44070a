"""Spills and merges shared by the chunked analysis (``chunked_analysis.py``): per-row results
kept on disk as sorted runs, grouped or renumbered on the way back, and exact merges of partials.

Why apart: the carries (``chunked_timeline.py``, ``chunked_rows.py``) and the merge itself all
spill and merge the same way; one definition of each keeps their results in one order.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from perfsight.analysis import grouping
from perfsight.sorted_runs import RunSpill

MERGE_ROWS = 1 << 20
"""Rows buffered over all runs of a table while it is merged back (one batch per run): a table
of many chunks is read back in smaller batches (at least :data:`MIN_BATCH_ROWS`)."""
MIN_BATCH_ROWS = 1024


def merge_in_bounded_batches(spill: RunSpill) -> None:
    """Size ``spill``'s read-back batches so that one batch per run stays within :data:`MERGE_ROWS`."""
    for part in spill.groups.values() if isinstance(spill, GroupedSpill) else [spill]:
        part.batch_rows = max(MIN_BATCH_ROWS, min(part.batch_rows, MERGE_ROWS // max(len(part.runs), 1)))


class GroupedSpill(RunSpill):
    """A :class:`RunSpill` whose rows come back group by group (groups in sorted order), each
    group in its own key order: a table ordered by a group column first (lane, device)."""

    def __init__(self, folder: Path, name: str) -> None:
        super().__init__(folder, name)
        self.groups: dict[Any, RunSpill] = {}

    def add_group(self, group: Any, table: pa.Table, key: np.ndarray) -> None:
        if self.schema is None:
            self.schema = table.schema
        if table.num_rows == 0:
            return
        if group not in self.groups:
            self.groups[group] = RunSpill(self.folder, f"{self.name}.g{len(self.groups)}", self.batch_rows)
        self.groups[group].add(table, key)
        self.rows += table.num_rows

    def add(self, table: pa.Table, key: np.ndarray) -> None:
        raise TypeError(f"{self.name}: rows go in by group (add_group)")

    def merged(self) -> Iterator[pa.Table]:
        for group in sorted(self.groups):
            yield from self.groups[group].merged()

    def remove(self) -> None:
        for spill in self.groups.values():
            spill.remove()


class MappedSpill(RunSpill):
    """A :class:`RunSpill` whose batches pass through ``transform`` as they come back (the
    communication tables' ``op`` and ``comm_row``, known only once every chunk was seen)."""

    transform: Callable[[pa.Table], pa.Table] | None = None

    def merged(self) -> Iterator[pa.Table]:
        for batch in super().merged():
            yield batch if self.transform is None else self.transform(batch)


def set_column(table: pa.Table, name: str, values: np.ndarray | pa.Array) -> pa.Table:
    """``table`` with column ``name`` replaced by ``values`` (same type)."""
    i = table.schema.get_field_index(name)
    field = table.schema.field(i)
    array = values if isinstance(values, pa.Array | pa.ChunkedArray) else pa.array(values)
    return table.set_column(i, field, array.cast(field.type))


def merged_partials(
    so_far: pa.Table | None, part: pa.Table, keys: Iterable[str], aggregations: Iterable[tuple[str, str]]
) -> pa.Table:
    if so_far is None:
        return part
    return grouping.merge_partials([so_far, part], list(keys), list(aggregations))


def concat(parts: list[pa.Table]) -> pa.Table:
    return pa.concat_tables(parts) if len(parts) != 1 else parts[0]
