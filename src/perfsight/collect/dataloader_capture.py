"""Capture how a training job waits for its data: per batch the wait in the training loop, the
loader's queues, and per worker the time of each stage (read, each transform, collate).

Why: Kineto shows ``enumerate(DataLoader)#...__next__`` as one opaque range on the training
thread, and nothing of what the worker processes do.  "Is the step slow because of the data?"
needs the wait, whether batches were already queued (the workers keep up) or not, and which
stage of the workers is the slow one.

How, cheaply enough for Level2:

* ``_BaseDataLoaderIter.__next__`` (one class attribute) is wrapped: two clock reads, and for
  multi-worker loaders the batches waiting in the workers' result queue (the *host* queue,
  including out-of-order batches the iterator stashes) and, when ``pin_memory`` runs its thread,
  the batches pinned and ready (the *device-side* queue), with the queue's capacity
  (``prefetch_factor x num_workers``).  The sampler's time (``_next_index``) is added to the next
  wait row.  ``pin_memory`` (the module function both iterators call) is timed as ``pin`` rows.
* The yielded batch is watched until the loop copies its tensors to the device (``Tensor.to`` /
  ``.cuda`` wrapped; see ``dataloader_copy``): one ``copy`` row per batch that was copied.
* The dataset fetchers' ``fetch`` (``torch.utils.data._utils.fetch``) is wrapped inside every
  worker: it times the whole batch, its ``collate_fn``, and each transform of the dataset (see
  ``dataloader_stages``); the dataset read is what remains of ``__getitem__``; the worker's CPU
  time during the fetch is ``cpu_ns``.  Each worker appends one binary record per batch to its own
  file in a private temporary folder, which the training process reads at
  :meth:`DataLoaderCapture.table`.  Forked workers inherit the wrappers; spawn / forkserver
  workers get them from a picklable ``worker_init_fn`` wrapper set for the time the iterator
  starts its workers (the user's function still runs, after it).  Workers started before
  :meth:`install` (``persistent_workers`` from an earlier window) are not seen; their waits are.

Clock: ``time.time_ns()`` in every process, the clock Kineto uses (see ``comm_capture``).
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import pyarrow as pa

from perfsight.collect import dataloader_copy as copies
from perfsight.collect import dataloader_stages as stages

log = logging.getLogger("perfsight.collect")

DATALOADER_CAPTURE_SCHEMA = pa.schema(
    [
        pa.field("rank", pa.int32(), nullable=False),
        # "wait" (training loop) | "fetch" (a batch in a worker) | "stage" (one stage of a fetch) | "pin"
        # | "copy" (the loop's .to()/.cuda() of a batch's tensors: dataloader_copy)
        pa.field("kind", pa.string(), nullable=False),
        pa.field("worker", pa.int32(), nullable=False),  # worker id; -1 = the training process
        pa.field("pid", pa.int64(), nullable=False),
        pa.field("tid", pa.int64()),  # OS thread id (waits)
        pa.field("batch", pa.int64()),  # index of the batch within its epoch (waits)
        pa.field("start_ns", pa.int64(), nullable=False),  # CLOCK_REALTIME ns (stage: its fetch's start)
        pa.field("end_ns", pa.int64(), nullable=False),  # stage: start + the stage's time in that fetch
        pa.field("ready_batches", pa.int32()),  # wait: batches received and unconsumed at the request
        pa.field("host_queue", pa.int32()),  # wait: batches in the workers' result queue (0 without workers)
        pa.field("device_queue", pa.int32()),  # wait: batches pinned and ready (pin_memory thread only)
        pa.field("queue_capacity", pa.int32()),  # wait: prefetch_factor x num_workers (0 without workers)
        pa.field("sampler_ns", pa.int64()),  # wait: time in the sampler since the previous wait
        pa.field("read_ns", pa.int64()),  # fetch: dataset __getitem__ minus transforms
        pa.field("transform_ns", pa.int64()),  # fetch: the dataset's transform callables
        pa.field("collate_ns", pa.int64()),  # fetch: collate_fn
        pa.field("samples", pa.int32()),  # fetch: samples in the batch
        pa.field("cpu_ns", pa.int64()),  # fetch: CPU time of the fetching thread (sampled: null on others)
        pa.field("stage", pa.string()),  # stage: its name (see dataloader_stages); copy: the target device
        pa.field("bytes", pa.int64()),  # copy: bytes of the batch's tensors copied
    ]
)
"""The sidecar table ``perfsight_dataloader_{rank}.parquet``."""

_MAX_ROWS = 2_000_000

_active: DataLoaderCapture | None = None
_pid = [os.getpid()]
"""This process's id: ``os.getpid()`` is a system call (~0.15 us), asked several times a batch."""
os.register_at_fork(after_in_child=lambda: _pid.__setitem__(0, os.getpid()))
_native_ids: dict[int, int] = {}  # threading.get_ident() -> OS thread id (get_native_id is a system call)


def _thread_id() -> int:
    """This thread's OS id, asked of the OS once per thread."""
    ident = threading.get_ident()
    tid = _native_ids.get(ident)
    if tid is None:
        tid = _native_ids[ident] = threading.get_native_id()
    return tid


_originals: dict[tuple[Any, str], Any] = {}
_patch_lock = threading.Lock()
_INHERITED = object()  # an attribute patched on a class that only inherited it: deleted at uninstall
_sampler_ns = [0]  # time in _next_index since the last wait row (training process, one loader thread)
_pinning = threading.local()  # pin_memory recurses into containers: time the outermost call only


class DataLoaderCapture:
    """Records data-loader waits, queues and worker stages while installed.

    API (used by ``perfsight.profile``): :meth:`install` / :meth:`uninstall` (idempotent; one
    active capture per process), :meth:`table` (:data:`DATALOADER_CAPTURE_SCHEMA`), and the
    capture protocol of ``perfsight.collect.capture`` (``name``, ``start``, ``stop``, ``close``).
    """

    name = "dataloader"

    def __init__(self, rank: int | None = None) -> None:
        self.rank = rank
        self.failed: str | None = None
        self._waits: list[tuple] = []
        self._pins: list[tuple[int, int]] = []
        self._copies: list[tuple] = []  # batches copied to the device by the loop (dataloader_copy)
        self._fetches: list[tuple] = []  # batches fetched in this process (num_workers=0)
        self._owner_pid = os.getpid()
        self._folder: Path | None = None
        self._read_offsets: dict[str, int] = {}
        self._writer: stages.RecordWriter | None = None  # this worker's record file

    # ------------------------------------------------------------------ lifecycle

    def install(self) -> None:
        global _active
        if self.failed:
            return
        if self._folder is None:
            self._folder = Path(tempfile.mkdtemp(prefix="perfsight-dataloader-"))
        _patch(with_training_side=True)
        with _patch_lock:
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
            for (owner, attr), original in list(_originals.items()):
                if getattr(getattr(owner, "__dict__", {}).get(attr), "_perfsight_wrapper", False):
                    if original is _INHERITED:
                        delattr(owner, attr)  # the base class's method shows through again
                    else:
                        setattr(owner, attr, original)
                del _originals[(owner, attr)]
            copies.reset()
        if os.getpid() == self._owner_pid and self._folder is not None:
            shutil.rmtree(self._folder, ignore_errors=True)
            self._folder = None

    def clear(self) -> None:
        """A new window: forget rows so far (worker files are read from their current end)."""
        self._waits = []
        self._pins = []
        self._copies = []
        self._fetches = []
        _sampler_ns[0] = 0
        if self._folder is not None:
            for path in self._folder.glob("*.bin"):
                _, self._read_offsets[path.name] = stages.read_records(
                    path, self._read_offsets.get(path.name, 0)
                )

    def start(self) -> None:
        self.install()
        self.clear()

    def stop(self) -> pa.Table:
        copies.finish()  # the window ends after its last step: that batch's copy is over
        table = self.table()
        self.clear()
        return table

    def close(self) -> None:
        self.uninstall()

    # ------------------------------------------------------------------ recording (hot path)

    def _fail(self, what: str, exc: BaseException) -> None:
        if self.failed is None:
            self.failed = f"{what}: {type(exc).__name__}: {exc}"
            if _pid[0] == self._owner_pid:
                log.warning(
                    "perfsight: data-loader capture failed (%s); it is off, training continues", self.failed
                )
        global _active
        _active = None  # in a worker: stop recording there; the training process uninstalls

    def _wait(self, batch: int, queues: tuple, start: int, end: int) -> None:
        sampler = _sampler_ns[0]
        _sampler_ns[0] = 0
        if len(self._waits) < _MAX_ROWS:
            self._waits.append((_thread_id(), batch, start, end, *queues, sampler))

    def _copied(self, row: tuple) -> None:
        """A batch's copy to the device (``dataloader_copy``), resolved when the table is read."""
        if len(self._copies) < _MAX_ROWS and _active is self:
            self._copies.append(row)

    def _pinned(self, start: int, end: int) -> None:
        if len(self._pins) < _MAX_ROWS:
            self._pins.append((start, end))

    def _fetched(
        self, start: int, fetch_ns: int, cpu_ns: int, samples: int, times: dict[str, int], detailed: bool
    ) -> None:
        pid = _pid[0]
        worker = _worker_id()
        collate = times.get(stages.COLLATE, 0)
        if detailed:
            transform = sum(times.values()) - collate
            read = max(fetch_ns - transform - collate, 0)
        else:  # transforms not timed in this fetch: read and transform unknown (-1)
            read = transform = -1
        fixed = (worker, pid, start, start + fetch_ns, read, transform, collate, samples, cpu_ns)
        if pid == self._owner_pid:
            if len(self._fetches) < _MAX_ROWS:
                self._fetches.append((fixed, dict(times)))
            return
        if self._folder is None:
            return
        if self._writer is None or self._writer.pid != pid:
            self._writer = stages.RecordWriter(self._folder)
        if not self._writer.write(fixed, times):
            global _active
            _active = None  # profiling ended while this (persistent) worker lives on: stop here

    def _stage_switch(self, fetcher: Any) -> stages.StageSwitch:
        """The fetcher's timed transforms (made once per fetcher); its collate_fn timed for good."""
        switch = getattr(fetcher, "_perfsight_stages", None)
        if switch is None:
            stages.wrap_collate(fetcher)
            switch = fetcher._perfsight_stages = stages.StageSwitch(fetcher.dataset)
        return switch

    # ------------------------------------------------------------------ output

    def table(self) -> pa.Table:
        rank = self.rank if self.rank is not None else -1
        columns: dict[str, list] = {field.name: [] for field in DATALOADER_CAPTURE_SCHEMA}
        pid = self._owner_pid

        def put(**values: Any) -> None:
            for name in columns:
                columns[name].append(values.get(name))

        for tid, batch, start, end, ready, host, device, capacity, sampler in list(self._waits):
            put(
                rank=rank, kind="wait", worker=-1, pid=pid, tid=tid, batch=batch, start_ns=start, end_ns=end,
                ready_batches=ready, host_queue=host, device_queue=device, queue_capacity=capacity,
                sampler_ns=sampler,
            )  # fmt: skip
        for start, end in list(self._pins):
            put(rank=rank, kind="pin", worker=-1, pid=pid, start_ns=start, end_ns=end)
        for row in list(self._copies):
            tid, batch, start, end, nbytes, device = copies.resolve(row)
            put(
                rank=rank, kind="copy", worker=-1, pid=pid, tid=tid, batch=batch, start_ns=start, end_ns=end,
                bytes=nbytes, stage=device,
            )  # fmt: skip
        for fixed, times in list(self._fetches) + self._worker_records():
            row = dict(zip(stages.FETCH_FIELDS, fixed, strict=True))
            for unknown in ("read_ns", "transform_ns", "cpu_ns"):
                row[unknown] = None if row[unknown] < 0 else row[unknown]
            put(rank=rank, kind="fetch", **row)
            for name, ns in times.items():
                start = row["start_ns"]
                put(
                    rank=rank, kind="stage", worker=row["worker"], pid=row["pid"], start_ns=start,
                    end_ns=start + ns, stage=name,
                )  # fmt: skip
        return pa.table(columns, schema=DATALOADER_CAPTURE_SCHEMA)

    def _worker_records(self) -> list[tuple]:
        if self._folder is None:
            return []
        records: list[tuple] = []
        for path in sorted(self._folder.glob("*.bin")):
            found, self._read_offsets[path.name] = stages.read_records(
                path, self._read_offsets.get(path.name, 0)
            )
            records += found
        return records


def _patch(with_training_side: bool) -> None:
    """Wrap the loader's methods (once per process; the originals are kept for uninstall)."""
    from torch.utils.data import dataloader
    from torch.utils.data._utils import fetch, pin_memory

    targets: list[tuple[Any, str, Any]] = [
        (fetch._MapDatasetFetcher, "fetch", _fetch_wrapper),
        (fetch._IterableDatasetFetcher, "fetch", _fetch_wrapper),
    ]
    if with_training_side:
        targets += [
            (dataloader._BaseDataLoaderIter, "__next__", _next_wrapper),
            (dataloader._BaseDataLoaderIter, "_next_index", _next_index_wrapper),
            (dataloader._MultiProcessingDataLoaderIter, "__init__", _workers_init_wrapper),
            (pin_memory, "pin_memory", _pin_wrapper),
            *copies.targets(),
        ]
    with _patch_lock:
        for owner, attr, make in targets:
            if (owner, attr) not in _originals:
                own = owner.__dict__.get(attr, _INHERITED)  # Tensor.to lives on its C base class
                _originals[(owner, attr)] = own
                setattr(owner, attr, make(getattr(owner, attr) if own is _INHERITED else own))


def _queues(iterator: Any) -> tuple[int | None, int | None, int | None, int | None]:
    """(ready, host, device, capacity) batches of ``iterator`` at a request (see the schema)."""
    queue = getattr(iterator, "_data_queue", None)
    if queue is None:
        return None, 0, None, 0
    try:
        task_info = iterator._task_info
        stashed = 0  # out-of-order batches received: entries beyond the outstanding tasks, if any
        if len(task_info) > iterator._tasks_outstanding:
            stashed = sum(1 for info in list(task_info.values()) if len(info) == 2)
        ready = int(queue.qsize()) + stashed
        capacity = int(iterator._prefetch_factor) * int(iterator._num_workers)
        if getattr(iterator, "_pin_memory_thread", None) is not None:
            return ready, int(iterator._worker_result_queue.qsize()), ready, capacity
        return ready, ready, None, capacity
    except Exception:  # qsize() is not implemented on every platform
        return None, None, None, None


def _next_wrapper(original: Any) -> Any:
    def __next__(iterator: Any) -> Any:
        capture = _active
        if capture is None or _pid[0] != capture._owner_pid:
            return original(iterator)
        try:
            copies.finish()  # the previous batch's copy to the device is over
            batch = iterator._num_yielded
            queues = _queues(iterator)
        except Exception as exc:
            capture._fail("before DataLoader.__next__", exc)
            return original(iterator)
        start = time.time_ns()
        data = original(iterator)  # StopIteration and loader errors reach the caller untouched
        end = time.time_ns()
        try:
            capture._wait(batch, queues, start, end)
            copies.arm(data, batch, _thread_id(), capture._copied)
        except Exception as exc:
            capture._fail("after DataLoader.__next__", exc)
        return data

    __next__._perfsight_wrapper = True  # type: ignore[attr-defined]
    return __next__


def _next_index_wrapper(original: Any) -> Any:
    def _next_index(iterator: Any) -> Any:
        if _active is None:
            return original(iterator)
        start = time.perf_counter_ns()
        try:
            return original(iterator)
        finally:
            _sampler_ns[0] += time.perf_counter_ns() - start

    _next_index._perfsight_wrapper = True  # type: ignore[attr-defined]
    return _next_index


def _pin_wrapper(original: Any) -> Any:
    def pin_memory(data: Any, device: Any = None) -> Any:
        capture = _active
        if capture is None or getattr(_pinning, "on", False):
            return original(data, device)
        _pinning.on = True
        start = time.time_ns()
        try:
            return original(data, device)
        finally:
            _pinning.on = False
            try:
                capture._pinned(start, time.time_ns())
            except Exception as exc:
                capture._fail("after pin_memory", exc)

    pin_memory._perfsight_wrapper = True  # type: ignore[attr-defined]
    return pin_memory


class WorkerInit:
    """The ``worker_init_fn`` a capturing iterator gives its workers: installs the fetch wrappers
    in the worker (needed under spawn / forkserver, harmless under fork), then runs the user's."""

    def __init__(self, user_fn: Any, folder: str, owner_pid: int, rank: int | None) -> None:
        self.user_fn = user_fn
        self.folder = folder
        self.owner_pid = owner_pid
        self.rank = rank

    def __call__(self, worker_id: int) -> None:
        global _active
        try:
            if _active is None and Path(self.folder).is_dir():
                capture = DataLoaderCapture(rank=self.rank)
                capture._folder = Path(self.folder)
                capture._owner_pid = self.owner_pid
                _patch(with_training_side=False)
                _active = capture
        except Exception as exc:  # the worker loads data without capture
            log.warning("perfsight: data-loader capture not started in worker %d (%s)", worker_id, exc)
        if self.user_fn is not None:
            self.user_fn(worker_id)


def _workers_init_wrapper(original: Any) -> Any:
    def __init__(iterator: Any, loader: Any) -> None:
        capture = _active
        user_fn = getattr(loader, "worker_init_fn", None)
        swapped = False
        if capture is not None and capture._folder is not None and os.getpid() == capture._owner_pid:
            try:
                loader.worker_init_fn = WorkerInit(
                    user_fn, str(capture._folder), capture._owner_pid, capture.rank
                )
                swapped = True
            except Exception as exc:
                capture._fail("before starting data-loader workers", exc)
        try:
            original(iterator, loader)
        finally:
            if swapped:
                loader.worker_init_fn = user_fn

    __init__._perfsight_wrapper = True  # type: ignore[attr-defined]
    return __init__


_worker_ids = [0, -1]  # (pid, worker id): a worker's id is fixed for its life


def _worker_id() -> int:
    """This process's data-loader worker id (-1 in the training process), asked once per process."""
    if _worker_ids[0] != _pid[0]:
        from torch.utils.data import get_worker_info

        info = get_worker_info()
        _worker_ids[:] = [_pid[0], info.id if info is not None else -1]
    return _worker_ids[1]


_detail = [0, 0, 0, 0]  # (pid, fetches, estimated ns spent timing transforms, ns of all fetches)


def _sample_now(timed_per_sample: int, samples: int) -> tuple[bool, bool]:
    """(time each transform, read the thread's CPU time) in this fetch.

    Each transform: a process's first ``DETAIL_FIRST`` fetches, then whenever the estimated cost
    of timing so far is within ``DETAIL_BUDGET`` of its fetch time (see ``dataloader_stages``):
    heavy transforms are timed on every fetch, cheap ones rarely; a dataset without transforms
    needs no timing (read = fetch - collate on every fetch).  CPU time: the first fetches and
    every ``CPU_EVERY``-th (a CPU clock read is a system call, about a microsecond here)."""
    state = _detail
    if state[0] != _pid[0]:
        state[:] = [_pid[0], 0, 0, 0]
    n = state[1] = state[1] + 1
    cpu = n <= stages.DETAIL_FIRST or n % stages.CPU_EVERY == 0
    if not timed_per_sample:
        return True, cpu
    if n > stages.DETAIL_FIRST and state[2] > stages.DETAIL_BUDGET * state[3]:
        return False, cpu
    state[2] += timed_per_sample * samples * stages.TIMED_CALL_NS
    return True, cpu


def _fetch_wrapper(original: Any) -> Any:
    def fetch(fetcher: Any, possibly_batched_index: Any) -> Any:
        capture = _active
        if capture is None:
            return original(fetcher, possibly_batched_index)
        switch = None
        try:
            switch = fetcher.__dict__.get("_perfsight_stages") or capture._stage_switch(fetcher)
            stages.stage_ns.clear()
            samples = len(possibly_batched_index) if fetcher.auto_collation else 1
            detailed, with_cpu = _sample_now(switch.timed_per_sample, samples)
            if detailed:
                switch.on()
        except Exception as exc:
            if switch is not None:
                switch.off()  # the user's own transforms back (off never raises)
            capture._fail("before a dataset fetch", exc)
            return original(fetcher, possibly_batched_index)
        cpu = time.thread_time_ns() if with_cpu else 0
        start = time.time_ns()
        try:
            data = original(fetcher, possibly_batched_index)
        finally:
            if detailed:
                switch.off()
        end = time.time_ns()
        cpu_ns = time.thread_time_ns() - cpu if with_cpu else -1
        _detail[3] += end - start
        try:
            capture._fetched(start, end - start, cpu_ns, samples, stages.stage_ns, detailed)
        except Exception as exc:
            capture._fail("after a dataset fetch", exc)
        return data

    fetch._perfsight_wrapper = True  # type: ignore[attr-defined]
    return fetch


def create_capture(context: Any) -> DataLoaderCapture:
    """Entry point of the capture protocol (``perfsight.collect.capture``)."""
    return DataLoaderCapture(rank=getattr(context, "rank", None))
