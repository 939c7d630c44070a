"""Capture how a training job waits for its data: per batch the wait in the training loop, the
loader's ready queue, and per worker the time spent reading samples, transforming and collating.

Why: Kineto shows ``enumerate(DataLoader)#...__next__`` as one opaque range on the training
thread, and nothing of what the worker processes do.  "Is the step slow because of the data?"
needs the wait, whether batches were already queued (the workers keep up) or not, and which
stage of the workers is the slow one.

How, cheaply enough for Level2:

* ``_BaseDataLoaderIter.__next__`` (one class attribute) is wrapped: two clock reads, and for
  multi-worker loaders the number of batches already received and not yet consumed
  (``_data_queue.qsize()`` plus the out-of-order batches the iterator stashes).
* The dataset fetchers' ``fetch`` (``torch.utils.data._utils.fetch``) is wrapped inside every
  worker: it times the whole batch, its ``collate_fn``, and the dataset's ``transform`` /
  ``target_transform`` / ``transforms`` callables when it has them (torchvision style); the
  dataset read is what remains of ``__getitem__``.  Workers fork from the training process, so
  the wrappers are already there; each worker appends one fixed-size binary record per batch to
  its own file in a private temporary folder (one ``write``, no lock, nothing shared to
  corrupt), which the training process reads at :meth:`DataLoaderCapture.table`.
  Workers started with the ``spawn`` method, or before :meth:`install` (``persistent_workers``),
  are not seen; their waits still are.

Clock: ``time.time_ns()`` in every process, the clock Kineto uses (see ``comm_capture``).
"""

from __future__ import annotations

import array
import contextlib
import logging
import os
import shutil
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import pyarrow as pa

log = logging.getLogger("perfsight.collect")

DATALOADER_CAPTURE_SCHEMA = pa.schema(
    [
        pa.field("rank", pa.int32(), nullable=False),
        pa.field("kind", pa.string(), nullable=False),  # "wait" (training loop) | "fetch" (a worker)
        pa.field("worker", pa.int32(), nullable=False),  # worker id; -1 = the training process
        pa.field("pid", pa.int64(), nullable=False),
        pa.field("tid", pa.int64()),  # OS thread id (waits)
        pa.field("batch", pa.int64()),  # index of the batch within its epoch (waits)
        pa.field("start_ns", pa.int64(), nullable=False),  # CLOCK_REALTIME ns
        pa.field("end_ns", pa.int64(), nullable=False),
        pa.field("ready_batches", pa.int32()),  # batches received and unconsumed at the request
        pa.field("read_ns", pa.int64()),  # fetch: dataset __getitem__ minus transforms
        pa.field("transform_ns", pa.int64()),  # fetch: the dataset's transform callables
        pa.field("collate_ns", pa.int64()),  # fetch: collate_fn
        pa.field("samples", pa.int32()),  # fetch: samples in the batch
    ]
)
"""The sidecar table ``perfsight_dataloader_{rank}.parquet``."""

_RECORD = 8  # int64 values per worker record: worker, pid, start, end, read, transform, collate, samples
_TRANSFORM_ATTRS = ("transform", "target_transform", "transforms")
_MAX_ROWS = 2_000_000

_active: DataLoaderCapture | None = None
_originals: dict[tuple[type, str], Any] = {}
_patch_lock = threading.Lock()


class _Timed:
    """A dataset transform or collate_fn that adds its run time to the capture's counter."""

    _perfsight_wrapper = True

    def __init__(self, function: Any, slot: str) -> None:
        self.function = function
        self.slot = slot

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter_ns()
        try:
            return self.function(*args, **kwargs)
        finally:
            _stage_ns[self.slot] += time.perf_counter_ns() - start

    def __getattr__(self, name: str) -> Any:  # behave like the wrapped callable otherwise
        if name == "function":  # not set yet (unpickling): no recursion
            raise AttributeError(name)
        return getattr(self.function, name)


_stage_ns = {"transform": 0, "collate": 0}  # per process; a fetch runs on one thread at a time


class DataLoaderCapture:
    """Records data-loader waits and worker stages while installed.

    API (used by ``perfsight.profile``): :meth:`install` / :meth:`uninstall` (idempotent; one
    active capture per process), :meth:`table` (:data:`DATALOADER_CAPTURE_SCHEMA`), and the
    capture protocol of ``perfsight.collect.capture`` (``name``, ``start``, ``stop``, ``close``).
    """

    name = "dataloader"

    def __init__(self, rank: int | None = None) -> None:
        self.rank = rank
        self.failed: str | None = None
        self._waits: list[tuple] = []
        self._fetches: list[tuple] = []  # batches fetched in this process (num_workers=0)
        self._owner_pid = os.getpid()
        self._folder: Path | None = None
        self._read_offsets: dict[str, int] = {}
        self._worker_fd: tuple[int, int] | None = None  # (pid, fd) of this worker's record file
        self._wrapped_attrs: list[tuple[Any, str, Any]] = []

    # ------------------------------------------------------------------ lifecycle

    def install(self) -> None:
        global _active
        if self.failed:
            return
        from torch.utils.data import dataloader
        from torch.utils.data._utils import fetch

        if self._folder is None:
            self._folder = Path(tempfile.mkdtemp(prefix="perfsight-dataloader-"))
        with _patch_lock:
            targets = [
                (dataloader._BaseDataLoaderIter, "__next__", _next_wrapper),
                (fetch._MapDatasetFetcher, "fetch", _fetch_wrapper),
                (fetch._IterableDatasetFetcher, "fetch", _fetch_wrapper),
            ]
            for cls, attr, make in targets:
                if (cls, attr) not in _originals:
                    original = cls.__dict__[attr]
                    _originals[(cls, attr)] = original
                    setattr(cls, attr, make(original))
            _active = self
        if self.rank is None:
            from perfsight.collect.comm_capture import _global_rank

            self.rank = _global_rank()

    def uninstall(self) -> None:
        global _active
        with _patch_lock:
            if _active is not None and _active is not self:
                return
            _active = None
            for (cls, attr), original in list(_originals.items()):
                if getattr(cls.__dict__.get(attr), "_perfsight_wrapper", False):
                    setattr(cls, attr, original)
                del _originals[(cls, attr)]
        if os.getpid() == self._owner_pid:
            for owner, attr, original in self._wrapped_attrs:
                with contextlib.suppress(Exception):  # an object that no longer takes attributes
                    setattr(owner, attr, original)
            self._wrapped_attrs.clear()
            if self._folder is not None:
                shutil.rmtree(self._folder, ignore_errors=True)
                self._folder = None

    def clear(self) -> None:
        """A new window: forget rows so far (worker files are read from their current end)."""
        self._waits = []
        self._fetches = []
        if self._folder is not None:
            for path in self._folder.glob("*.bin"):
                self._read_offsets[path.name] = path.stat().st_size

    def start(self) -> None:
        self.install()
        self.clear()

    def stop(self) -> pa.Table:
        table = self.table()
        self.clear()
        return table

    def close(self) -> None:
        self.uninstall()

    # ------------------------------------------------------------------ recording (hot path)

    def _fail(self, what: str, exc: BaseException) -> None:
        if self.failed is None:
            self.failed = f"{what}: {type(exc).__name__}: {exc}"
            if os.getpid() == self._owner_pid:
                log.warning(
                    "perfsight: data-loader capture failed (%s); it is off, training continues", self.failed
                )
        global _active
        _active = None  # in a worker: stop recording there; the training process uninstalls

    def _wait(self, iterator: Any, batch: int, ready: int | None, start: int, end: int) -> None:
        if len(self._waits) < _MAX_ROWS:
            self._waits.append((threading.get_native_id(), batch, start, end, ready))

    def _fetched(
        self, start: int, end: int, transform: int, collate: int, fetch_ns: int, samples: int
    ) -> None:
        from torch.utils.data import get_worker_info

        info = get_worker_info()
        worker = info.id if info is not None else -1
        read = max(fetch_ns - transform - collate, 0)
        record = (worker, os.getpid(), start, end, read, transform, collate, samples)
        if os.getpid() == self._owner_pid:
            if len(self._fetches) < _MAX_ROWS:
                self._fetches.append(record)
            return
        if self._folder is None:
            return
        if self._worker_fd is None or self._worker_fd[0] != os.getpid():
            path = self._folder / f"worker-{os.getpid()}.bin"
            self._worker_fd = (os.getpid(), os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600))
        os.write(self._worker_fd[1], array.array("q", record).tobytes())

    def _wrap_stages(self, fetcher: Any) -> None:
        """Time the fetcher's collate_fn and the dataset's transforms (once per fetcher)."""
        if not isinstance(fetcher.collate_fn, _Timed):
            fetcher.collate_fn = _Timed(fetcher.collate_fn, "collate")
        dataset = fetcher.dataset
        for attr in _TRANSFORM_ATTRS:
            function = getattr(dataset, attr, None)
            if callable(function) and not isinstance(function, _Timed):
                try:
                    setattr(dataset, attr, _Timed(function, "transform"))
                except Exception:
                    continue
                if os.getpid() == self._owner_pid:
                    self._wrapped_attrs.append((dataset, attr, function))

    # ------------------------------------------------------------------ output

    def table(self) -> pa.Table:
        rank = self.rank if self.rank is not None else -1
        columns: dict[str, list] = {field.name: [] for field in DATALOADER_CAPTURE_SCHEMA}
        pid = self._owner_pid
        for tid, batch, start, end, ready in list(self._waits):
            _put(columns, rank, "wait", -1, pid, tid, batch, start, end, ready, None, None, None, None)
        fetches = list(self._fetches) + self._worker_records()
        for worker, wpid, start, end, read, transform, collate, samples in fetches:
            _put(
                columns,
                rank,
                "fetch",
                worker,
                wpid,
                None,
                None,
                start,
                end,
                None,
                read,
                transform,
                collate,
                samples,
            )
        return pa.table(columns, schema=DATALOADER_CAPTURE_SCHEMA)

    def _worker_records(self) -> list[tuple]:
        if self._folder is None:
            return []
        records: list[tuple] = []
        for path in sorted(self._folder.glob("*.bin")):
            try:
                data = path.read_bytes()[self._read_offsets.get(path.name, 0) :]
            except OSError:
                continue
            whole = len(data) - len(data) % (8 * _RECORD)  # a record being written is left for later
            values = array.array("q")
            values.frombytes(data[:whole])
            records.extend(tuple(values[i : i + _RECORD]) for i in range(0, len(values), _RECORD))
        return records


def _put(columns: dict[str, list], *values: Any) -> None:
    for field, value in zip(DATALOADER_CAPTURE_SCHEMA.names, values, strict=True):
        columns[field].append(value)


def _ready_batches(iterator: Any) -> int | None:
    """Batches received from the workers and not yet handed out (multi-worker loaders only)."""
    queue = getattr(iterator, "_data_queue", None)
    if queue is None:
        return None
    try:
        stashed = sum(1 for info in list(iterator._task_info.values()) if len(info) == 2)
        return int(queue.qsize()) + stashed
    except Exception:  # qsize() is not implemented on every platform
        return None


def _next_wrapper(original: Any) -> Any:
    def __next__(iterator: Any) -> Any:
        capture = _active
        if capture is None or os.getpid() != capture._owner_pid:
            return original(iterator)
        try:
            batch = iterator._num_yielded
            ready = _ready_batches(iterator)
        except Exception as exc:
            capture._fail("before DataLoader.__next__", exc)
            return original(iterator)
        start = time.time_ns()
        data = original(iterator)  # StopIteration and loader errors reach the caller untouched
        end = time.time_ns()
        try:
            capture._wait(iterator, batch, ready, start, end)
        except Exception as exc:
            capture._fail("after DataLoader.__next__", exc)
        return data

    __next__._perfsight_wrapper = True  # type: ignore[attr-defined]
    return __next__


def _fetch_wrapper(original: Any) -> Any:
    def fetch(fetcher: Any, possibly_batched_index: Any) -> Any:
        capture = _active
        if capture is None:
            return original(fetcher, possibly_batched_index)
        try:
            capture._wrap_stages(fetcher)
            _stage_ns["transform"] = _stage_ns["collate"] = 0
        except Exception as exc:
            capture._fail("before a dataset fetch", exc)
            return original(fetcher, possibly_batched_index)
        start_wall, start = time.time_ns(), time.perf_counter_ns()
        data = original(fetcher, possibly_batched_index)
        fetch_ns = time.perf_counter_ns() - start
        try:
            samples = len(possibly_batched_index) if fetcher.auto_collation else 1
            capture._fetched(
                start_wall,
                start_wall + fetch_ns,
                _stage_ns["transform"],
                _stage_ns["collate"],
                fetch_ns,
                samples,
            )
        except Exception as exc:
            capture._fail("after a dataset fetch", exc)
        return data

    fetch._perfsight_wrapper = True  # type: ignore[attr-defined]
    return fetch


def create_capture(context: Any) -> DataLoaderCapture:
    """Entry point of the capture protocol (``perfsight.collect.capture``)."""
    return DataLoaderCapture(rank=getattr(context, "rank", None))
