"""The trace index: NumPy columns, kind masks and derived relations of one trace, computed once.

Every analysis starts from the same questions about ``Trace.slices``: its times and ids as NumPy
arrays, which rows are host operators or device work, each slice's parent, which runtime call
launched which kernel.  Asked separately, each analysis would convert, sort and join the same
columns again.  :func:`index_of` returns the one :class:`TraceIndex` of a trace instead: a column
or mask is built the first time someone asks for it and kept while the trace lives.  Relations
that other modules define (parents and launches in :mod:`~perfsight.analysis.hierarchy`, step
windows in :mod:`~perfsight.analysis.clock`) are kept with :meth:`TraceIndex.derived`, so each
module still owns its own computation.

The index is derived data, not state: it is keyed on the :class:`~perfsight.model.Trace` object
and rebuilt when any of the trace's tables has been replaced, so analyses stay pure functions of
the trace.  Arrays it hands out are read-only: writing into one raises instead of silently
changing another analysis's input.

This module must not compute metrics or build output tables, and must not import the modules
whose results it keeps.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from numpy.typing import NDArray

from perfsight import columns
from perfsight.model import DEVICE_ACTIVITY_KINDS, HOST_OP_KINDS, NO_ID, SliceKind, Trace

T = TypeVar("T")


def _frozen(value: T) -> T:
    """``value`` with every NumPy array in it (or in a tuple of them) made read-only."""
    if isinstance(value, np.ndarray):
        value.flags.writeable = False
    elif isinstance(value, tuple):
        for item in value:
            _frozen(item)
    elif hasattr(value, "__dataclass_fields__"):
        for name in value.__dataclass_fields__:
            _frozen(getattr(value, name))
    return value


def dictionary_mask(
    column: pa.ChunkedArray | pa.Array, predicate: Callable[[pa.Array], pa.Array]
) -> NDArray[np.bool_]:
    """``predicate`` (Arrow strings -> booleans) for every row of a string or dictionary column.

    On a dictionary column the predicate runs once per distinct value; null rows are False.
    """
    chunks = column.chunks if isinstance(column, pa.ChunkedArray) else [column]
    parts: list[NDArray[np.bool_]] = []
    for chunk in chunks:
        if pa.types.is_dictionary(chunk.type):
            per_value = columns.numpy(predicate(chunk.dictionary.cast(pa.string())), null=False)
            if len(per_value) == 0:
                parts.append(np.zeros(len(chunk), bool))
                continue
            hit = per_value[columns.numpy(chunk.indices, null=0)]
            if chunk.null_count:
                hit &= columns.numpy(chunk.is_valid())
            parts.append(hit)
        else:
            parts.append(columns.numpy(predicate(chunk.cast(pa.string())), null=False).copy())
    return np.concatenate(parts) if parts else np.zeros(0, bool)


class TraceIndex:
    """Columns, masks and derived relations of one trace's tables (see the module docstring).

    Built by :func:`index_of` for a :class:`~perfsight.model.Trace`; can also be built directly
    from a bare slices table (then ``flows`` is empty and nothing is cached across calls).
    """

    def __init__(self, slices: pa.Table, flows: pa.Table | None = None, trace: Trace | None = None) -> None:
        self.slices = slices
        self.flows = flows
        self._tables = tuple(getattr(trace, name) for name in _TABLES) if trace is not None else None
        self.n = slices.num_rows
        self._derived: dict[Any, Any] = {}
        self._lock = threading.RLock()

    def describes(self, trace: Trace) -> bool:
        """Whether this index was built from ``trace``'s current tables."""
        return self._tables is not None and all(
            mine is getattr(trace, name) for mine, name in zip(self._tables, _TABLES, strict=True)
        )

    def derived(self, key: Any, compute: Callable[[], T]) -> T:
        """The value stored under ``key``, computed by ``compute()`` (and made read-only) on first use."""
        try:
            return self._derived[key]
        except KeyError:
            pass
        with self._lock:
            if key not in self._derived:
                self._derived[key] = _frozen(compute())
            return self._derived[key]

    # ---------------------------------------------------------------------------------- columns

    def column(self, name: str) -> NDArray[np.integer]:
        """An integer slices column as NumPy in its own width (``NO_ID`` where null); a view of the
        Arrow buffer when it has one chunk and no nulls."""
        return self.derived(("column", name), lambda: columns.numpy(self.slices.column(name), NO_ID))

    start = property(lambda self: self.column("start_ns"), doc="``start_ns`` (int64 ns).")
    track = property(lambda self: self.column("track"), doc="Track index of each row (int32).")
    depth = property(lambda self: self.column("depth"), doc="Nesting level on its track (int16).")
    rank = property(lambda self: self.column("rank"))
    tid = property(lambda self: self.column("tid"))
    correlation = property(lambda self: self.column("correlation"))
    external_id = property(lambda self: self.column("external_id"))
    step = property(lambda self: self.column("step"))

    @property
    def dur(self) -> NDArray[np.int64]:
        """Duration floored at 0 (a negative duration is an empty slice)."""
        return self.derived("dur", lambda: np.maximum(columns.numpy(self.slices.column("dur_ns"), 0), 0))

    @property
    def end(self) -> NDArray[np.int64]:
        """``start + dur``."""
        return self.derived("end", lambda: self.start + self.dur)

    @property
    def is_device(self) -> NDArray[np.bool_]:
        return self.derived("is_device", lambda: columns.numpy(self.slices.column("is_device"), False))

    # ------------------------------------------------------------------------------------ masks

    def of_kind(self, kinds: Iterable[str]) -> NDArray[np.bool_]:
        """Rows whose ``kind`` is one of ``kinds`` (host or device)."""
        key = tuple(sorted(set(kinds)))
        value_set = pa.array(key, pa.string())
        return self.derived(
            ("kind", key),
            lambda: dictionary_mask(
                self.slices.column("kind"), lambda values: pc.is_in(values, value_set=value_set)
            ),
        )

    def kind_mask(self, kinds: Iterable[str], is_device: bool) -> NDArray[np.bool_]:
        """Rows whose kind is one of ``kinds`` and whose ``is_device`` equals ``is_device``."""
        key = tuple(sorted(set(kinds)))
        return self.derived(
            ("kind_on", key, is_device), lambda: self.of_kind(key) & (self.is_device == is_device)
        )

    @property
    def host_op(self) -> NDArray[np.bool_]:
        """Host operator rows: ``cpu_op`` and host-side ``communication`` slices."""
        return self.kind_mask(HOST_OP_KINDS, is_device=False)

    @property
    def device_work(self) -> NDArray[np.bool_]:
        """Device rows that occupy a stream: kernels, copies, fills and communication kernels."""
        return self.kind_mask(DEVICE_ACTIVITY_KINDS, is_device=True)

    @property
    def runtime(self) -> NDArray[np.bool_]:
        """Host-side accelerator API calls (``cudaLaunchKernel``)."""
        return self.kind_mask((SliceKind.RUNTIME.value,), is_device=False)

    def name_mask(self, predicate: Callable[[pa.Array], pa.Array], key: Any) -> NDArray[np.bool_]:
        """Rows whose ``name`` satisfies ``predicate``, kept under ``key`` (evaluated per distinct name)."""
        return self.derived(("name", key), lambda: dictionary_mask(self.slices.column("name"), predicate))


_TABLES = ("slices", "tracks", "memory", "flows", "steps", "comm")

_INDEXES: dict[int, TraceIndex] = {}
_REGISTRY_LOCK = threading.Lock()


def release(trace: Trace) -> None:
    """Drop what is kept for ``trace`` now rather than when it is collected (the pipeline calls
    this once its analyses are done: the trace outlives them in the results it returns)."""
    with _REGISTRY_LOCK:
        index = _INDEXES.get(id(trace))
        if index is not None and index.describes(trace):
            del _INDEXES[id(trace)]


def index_of(trace: Trace) -> TraceIndex:
    """The :class:`TraceIndex` of ``trace``, built on first use and kept while ``trace`` lives."""
    key = id(trace)
    index = _INDEXES.get(key)
    if index is not None and index.describes(trace):
        return index
    with _REGISTRY_LOCK:
        index = _INDEXES.get(key)
        if index is None or not index.describes(trace):
            if index is None:
                weakref.finalize(trace, _INDEXES.pop, key, None)
            index = _INDEXES[key] = TraceIndex(trace.slices, trace.flows, trace)
        return index
