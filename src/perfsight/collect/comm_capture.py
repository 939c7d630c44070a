"""Capture every ``torch.distributed`` collective and point-to-point op a training process issues.

Why: Kineto records *that* a collective ran (``c10d::allreduce_`` on the calling thread,
``gloo:all_reduce`` on a gloo worker thread, NCCL kernels on a stream), but with gloo in torch
2.13 it records no ``record_param_comms`` event at all, hence no process group, no sequence
number, no peer and no byte count unless ``record_shapes`` is on; and it never records how long
the caller blocked in ``Work.wait()``.  The cluster analysis needs exactly those to find the same
collective instance on every rank.  What comes from where is documented in
docs/COMMUNICATION_CAPTURE.md.

How: every op issued from Python (``dist.all_reduce``, ``dist.batch_isend_irecv``, FSDP's
``all_gather_into_tensor``, the ``*_object`` helpers, ...) ends in a method of the pybind class
``ProcessGroup``; we wrap those methods and ``Work.wait`` on the class, so one backend call is
one row, nothing is counted twice and nothing has to be known about the Python helpers above
them.  Ops issued from C++ (DDP's gradient buckets, ``_broadcast_coalesced``) never reach Python;
when torch's flight recorder is on (it was, by default, in our torch 2.13 gloo runs) its entries
add them, with their group and sequence number (``collect/flight_recorder.py``).  Otherwise
they are still in the Kineto trace, and ``perfsight.ingest.sidecar`` keeps them from there.

Clock: ``time.time_ns()`` (CLOCK_REALTIME).  torch 2.13's Kineto writes ``ts`` as the same clock
minus the trace's ``baseTimeNanoseconds`` (measured: every ``record_function`` range lies inside
the ``time_ns`` taken around it), so ``start_ns - base_time_ns`` is on the trace's own clock.

Sequence numbers: ``seq`` of a collective is the group's collective counter as the backend keeps
it (NCCL's ``seqCollective_``, the flight recorder's ``collective_seq_id``): the n-th collective
this rank issued on the group, C++-issued ones included, so the same instance has the same
number on every rank.  gloo's counter also counts send/recv; the capture measures that per p2p
op and subtracts it (and what ``clock_sync`` issued), so p2p between a subset of ranks does not
shift the collectives' numbers.  A p2p row's ``seq`` is the n-th message from ``src`` to ``dst``
in the group, the same number on the sender and the receiver.

Rules: no per-op work beyond a few clock reads and one ``list.append`` of a tuple (atomic under
the GIL, so DataLoader or autograd threads may issue ops too); Arrow only in :meth:`table`; an
error in our own code is logged once and turns the capture off, the op itself always runs.
"""

from __future__ import annotations

import itertools
import json
import logging
import os
import threading
import time
from typing import Any

import pyarrow as pa

from perfsight.collect import clock_sync, flight_recorder
from perfsight.model import P2P_COLLECTIVES

log = logging.getLogger("perfsight.collect")

COMM_CAPTURE_SCHEMA = pa.schema(
    [
        pa.field("rank", pa.int32(), nullable=False),  # global rank of this process (-1: no group)
        pa.field("source", pa.string(), nullable=False),  # "python" (our wrapper) | "flight_recorder"
        pa.field("collective", pa.string(), nullable=False),  # all_reduce, all_gather, send, ...
        pa.field("api", pa.string(), nullable=False),  # ProcessGroup method / flight-recorder name
        pa.field("group", pa.string()),  # process group name (torch's group_name)
        pa.field("group_desc", pa.string()),
        pa.field("group_ranks", pa.string()),  # JSON list of the group's global ranks
        pa.field("seq", pa.int64()),  # see the module docstring
        pa.field("peer", pa.int64()),  # global rank of the other side of a send/recv
        pa.field("in_bytes", pa.int64()),  # bytes of the input buffers this rank passes in
        pa.field("out_bytes", pa.int64()),  # bytes of the output buffers
        pa.field("dtype", pa.string()),  # torch dtype of the first tensor ("float32")
        pa.field("tid", pa.int64()),  # OS thread id of the caller (Kineto's tid)
        pa.field("start_ns", pa.int64(), nullable=False),  # call entered, CLOCK_REALTIME ns
        pa.field("issue_end_ns", pa.int64()),  # call returned (the op is enqueued or done)
        pa.field("wait_start_ns", pa.int64()),  # first Work.wait() on its result, if any
        pa.field("wait_end_ns", pa.int64()),
        pa.field("end_ns", pa.int64(), nullable=False),  # wait_end_ns, else issue_end_ns
    ]
)
"""The sidecar table ``perfsight_comm_{rank}.parquet``: one row per op instance on this rank."""

# ProcessGroup method -> (collective, index of the input argument, index of the output argument)
_METHODS: dict[str, tuple[str, int | None, int | None]] = {
    "allreduce": ("all_reduce", 0, 0),
    "allreduce_coalesced": ("all_reduce", 0, 0),
    "broadcast": ("broadcast", 0, 0),
    "reduce": ("reduce", 0, 0),
    "allgather": ("all_gather", 1, 0),
    "_allgather_base": ("all_gather", 1, 0),
    "all_gather_single": ("all_gather", 1, 0),
    "allgather_coalesced": ("all_gather", 1, 0),
    "allgather_into_tensor_coalesced": ("all_gather", 1, 0),
    "all_gather_single_coalesced": ("all_gather", 1, 0),
    "reduce_scatter": ("reduce_scatter", 1, 0),
    "_reduce_scatter_base": ("reduce_scatter", 1, 0),
    "reduce_scatter_single": ("reduce_scatter", 1, 0),
    "reduce_scatter_tensor_coalesced": ("reduce_scatter", 1, 0),
    "reduce_scatter_single_coalesced": ("reduce_scatter", 1, 0),
    "alltoall": ("all_to_all", 1, 0),
    "alltoall_base": ("all_to_all", 1, 0),
    "all_to_all_single": ("all_to_all", 1, 0),
    "gather": ("gather", 1, 0),
    "scatter": ("scatter", 1, 0),
    "barrier": ("barrier", None, None),
    "monitored_barrier": ("barrier", None, None),
    "send": ("send", 0, None),
    "recv": ("recv", None, 0),
    "recv_anysource": ("recv", None, 0),
}
_MAX_ROWS = 2_000_000
"""Rows kept per window; past it the capture stops recording (and says so once)."""

_active: CommCapture | None = None  # the capture the class-level wrappers report to
_originals: dict[tuple[type, str], Any] = {}  # (class, attribute) -> what we replaced
_patch_lock = threading.Lock()  # install/uninstall only; never taken on an op's path


_tensor_type: type | None = None  # torch.Tensor, bound at install(): this module does not import torch
_dtype_names: dict[Any, str] = {}  # torch.dtype -> "float32", filled as dtypes are met


def _nbytes(value: Any) -> tuple[int, str | None]:
    """Bytes of a tensor or a (nested) list of tensors, and the first tensor's dtype.  On the op's
    path: an ``isinstance`` first (``hasattr`` on a tensor costs about 1 us)."""
    if _tensor_type is not None and isinstance(value, _tensor_type):
        return value.numel() * value.element_size(), _dtype_name(value.dtype)
    if isinstance(value, list | tuple):
        total, dtype = 0, None
        for item in value:
            size, kind = _nbytes(item)
            total += size
            dtype = dtype or kind
        return total, dtype
    if hasattr(value, "element_size") and hasattr(value, "numel"):  # a tensor-like object
        return value.numel() * value.element_size(), _dtype_name(value.dtype)
    return 0, None


def _dtype_name(dtype: Any) -> str:
    name = _dtype_names.get(dtype)
    if name is None:
        name = _dtype_names[dtype] = str(dtype).removeprefix("torch.")
    return name


class _Group:
    """What the capture knows about one process group (looked up once per group)."""

    __slots__ = ("name", "desc", "ranks", "ranks_json", "counter", "p2p_shift", "pairs")

    def __init__(self, pg: Any) -> None:
        import torch.distributed as dist

        self.name = str(getattr(pg, "group_name", "") or "")
        self.desc = str(getattr(pg, "group_desc", "") or "")
        try:
            self.ranks: list[int] = list(dist.get_process_group_ranks(pg))
        except Exception:  # a group torch does not know (a bare backend object)
            self.ranks = []
        self.ranks_json = json.dumps(self.ranks) if self.ranks else None
        self.counter = getattr(pg, "_get_sequence_number_for_group", None)
        try:
            if self.counter is not None:
                self.counter()
        except Exception:  # backends without a sequence number
            self.counter = None
        self.p2p_shift = 0  # counter steps our p2p wrappers saw (clock_sync's are added apart)
        self.pairs: dict[tuple[int, int], int] = {}

    def global_rank(self, group_rank: Any) -> int | None:
        if isinstance(group_rank, int) and 0 <= group_rank < len(self.ranks):
            return self.ranks[group_rank]
        return None


class CommCapture:
    """Records the communication ops of one process while installed.

    API (used by ``perfsight.profile``): :meth:`install` / :meth:`uninstall` (idempotent; at most
    one capture is active per process, installing a second one replaces the first), :meth:`table`
    (rows so far, :data:`COMM_CAPTURE_SCHEMA`), :meth:`clear`.  The capture protocol of
    ``perfsight.collect.capture`` (``name``, ``start``, ``stop``, ``close``) is provided too.
    """

    name = "comm"

    def __init__(self, rank: int | None = None, flight_recorder: bool = True) -> None:
        self.rank = rank
        self.flight_recorder = flight_recorder
        self.failed: str | None = None
        self._rows: list[tuple] = []
        self._waits: list[tuple[int, int, int]] = []
        self._pending: dict[int, int] = {}  # id(Work) -> row id
        self._ids = itertools.count()
        self._groups: dict[Any, _Group] = {}
        self._window_start_ns = time.time_ns()
        self._uninstalled_ns: int | None = None  # flight-recorder entries after it are not ours
        self._owner_pid = os.getpid()
        self._full_warned = False

    # ------------------------------------------------------------------ lifecycle

    def install(self) -> None:
        """Wrap ``ProcessGroup``'s op methods and ``Work.wait``; a no-op when already installed."""
        global _active, _tensor_type
        if self.failed:
            return
        try:
            import torch
            from torch._C import _distributed_c10d as c10d
        except ImportError:  # torch built without distributed
            return
        _tensor_type = torch.Tensor
        with _patch_lock:
            for cls, method, make in [(c10d.ProcessGroup, m, _op_wrapper) for m in _METHODS] + [
                (c10d.Work, "wait", _wait_wrapper)
            ]:
                # keep the class's own entry (pybind's instancemethod) to put back: what
                # getattr returns on the class is the bare function, which would not bind self
                raw = cls.__dict__.get(method)
                if raw is None or (cls, method) in _originals:
                    continue
                _originals[(cls, method)] = raw
                setattr(cls, method, make(method, getattr(cls, method)))
            _active = self
        self._uninstalled_ns = None
        if self.rank is None:
            self.rank = _global_rank()

    def uninstall(self) -> None:
        """Put every replaced method back (only where our wrapper is still the one installed)."""
        global _active
        with _patch_lock:
            if _active is not self and _active is not None:
                return
            _active = None
            if self._uninstalled_ns is None:
                self._uninstalled_ns = time.time_ns()
            for (cls, attr), original in list(_originals.items()):
                if getattr(cls.__dict__.get(attr), "_perfsight_wrapper", False):
                    setattr(cls, attr, original)
                del _originals[(cls, attr)]

    def clear(self) -> None:
        """Forget recorded rows (a new window starts); group counters are kept."""
        self._rows = []
        self._waits = []
        self._pending = {}
        self._window_start_ns = time.time_ns()

    # capture protocol of perfsight.collect.capture
    def start(self) -> None:
        self.clear()
        self.install()

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
            log.warning(
                "perfsight: communication capture failed (%s); it is off, training continues", self.failed
            )
        self.uninstall()

    def _group(self, pg: Any) -> _Group:
        group = self._groups.get(pg)
        if group is None:
            group = self._groups[pg] = _Group(pg)
        return group

    def _before(self, pg: Any, method: str, args: tuple) -> tuple:
        group = self._group(pg)
        before = group.counter() if group.counter is not None else None
        return (group, before, time.time_ns())

    def _after(self, pre: tuple, method: str, args: tuple, kwargs: dict, work: Any) -> None:
        end = time.time_ns()
        if len(self._rows) >= _MAX_ROWS or os.getpid() != self._owner_pid:
            if not self._full_warned and os.getpid() == self._owner_pid:
                self._full_warned = True
                log.warning(
                    "perfsight: %d communication ops in one window; recording the rest stopped", _MAX_ROWS
                )
            return
        group, before, start = pre
        collective, in_arg, out_arg = _METHODS[method]
        in_bytes, dtype = _nbytes(_arg(args, kwargs, in_arg)) if in_arg is not None else (0, None)
        if out_arg == in_arg:  # in place (all_reduce, broadcast, reduce): the same buffers
            out_bytes, out_dtype = in_bytes, dtype
        else:
            out_bytes, out_dtype = _nbytes(_arg(args, kwargs, out_arg)) if out_arg is not None else (0, None)
        after = group.counter() if group.counter is not None else None
        peer = seq = None
        if collective in P2P_COLLECTIVES:  # the capture has send and recv only
            if before is not None and after is not None:
                group.p2p_shift += after - before  # gloo counts p2p in its collective counter
            peer_arg = args[1] if len(args) > 1 else kwargs.get("dstRank", kwargs.get("srcRank"))
            peer = None if method == "recv_anysource" else group.global_rank(peer_arg)  # arg 1: the tag
            me = self.rank if self.rank is not None else -1
            if peer is not None:
                pair = (me, peer) if collective == "send" else (peer, me)
                seq = group.pairs.get(pair, 0) + 1
                group.pairs[pair] = seq
        elif after is not None:
            seq = after - group.p2p_shift - clock_sync.p2p_counter_shift(group.name)
        row_id = next(self._ids)
        self._rows.append(
            (row_id, collective, method, group, seq, peer, in_bytes, out_bytes, dtype or out_dtype,
             threading.get_native_id(), start, end)
        )  # fmt: skip
        if work is not None:
            if len(self._pending) > 100_000:  # Works nobody waited for
                self._pending.clear()
            self._pending[id(work)] = row_id

    def _waited(self, work: Any, start: int, end: int) -> None:
        row_id = self._pending.pop(id(work), None)
        if row_id is not None:
            self._waits.append((row_id, start, end))

    # ------------------------------------------------------------------ output

    def table(self) -> pa.Table:
        """Rows recorded since the window started, flight-recorder entries added (see schema)."""
        rank = self.rank if self.rank is not None else -1
        waits: dict[int, tuple[int, int]] = {}
        for row_id, start, end in list(self._waits):
            waits.setdefault(row_id, (start, end))
        rows = list(self._rows)
        columns: dict[str, list] = {field.name: [] for field in COMM_CAPTURE_SCHEMA}
        for row_id, collective, method, group, seq, peer, inb, outb, dtype, tid, start, end in rows:
            wait = waits.get(row_id)
            _put(
                columns, rank, "python", collective, method, group.name, group.desc, group.ranks_json, seq,
                peer, inb, outb, dtype, tid, start, end, wait[0] if wait else None,
                wait[1] if wait else None, max(end, wait[1]) if wait else end,
            )  # fmt: skip
        if self.flight_recorder and not self.failed:
            try:
                self._add_flight_recorder(columns, rank, rows)
            except Exception as exc:  # torch's private dump API changed: keep what we have
                log.info("perfsight: flight recorder entries skipped (%s)", exc)
        return pa.table(columns, schema=COMM_CAPTURE_SCHEMA)

    def _add_flight_recorder(self, columns: dict[str, list], rank: int, rows: list[tuple]) -> None:
        """Flight-recorder collectives of this window that our wrappers did not see (DDP's, from
        C++).  An entry created inside one of our calls on the same group is that call."""
        calls: dict[str, list[tuple[int, int]]] = {}
        for row in rows:
            calls.setdefault(row[3].name, []).append((row[10], row[11]))
        for op in flight_recorder.collectives(self._window_start_ns, self._uninstalled_ns):
            if any(start <= op.created_ns <= end for start, end in calls.get(op.group, ())):
                continue
            _put(
                columns, rank, "flight_recorder", op.collective, op.profiling_name, op.group, op.group_desc,
                op.group_ranks, op.seq, None, op.in_bytes, op.out_bytes, op.dtype, None, op.created_ns,
                None, None, None, op.end_ns,
            )  # fmt: skip


class paused:
    """``with paused():`` ops issued inside are not recorded (perfsight's own clock exchange)."""

    def __enter__(self) -> None:
        global _active
        self._capture, _active = _active, None

    def __exit__(self, *exc: object) -> None:
        global _active
        if _active is None and self._capture is not None and not self._capture.failed:
            _active = self._capture


def _put(columns: dict[str, list], *values: Any) -> None:
    for field, value in zip(COMM_CAPTURE_SCHEMA.names, values, strict=True):
        columns[field].append(value)


def _arg(args: tuple, kwargs: dict, index: int | None) -> Any:
    if index is None:
        return None
    if index < len(args):
        return args[index]
    tensors = [v for v in kwargs.values() if isinstance(v, list | tuple) or hasattr(v, "numel")]
    return tensors[index - len(args)] if index - len(args) < len(tensors) else None


def _op_wrapper(method: str, original: Any) -> Any:
    def wrapper(pg: Any, *args: Any, **kwargs: Any) -> Any:
        capture = _active
        if capture is None:
            return original(pg, *args, **kwargs)
        pre = None
        try:
            pre = capture._before(pg, method, args)
        except Exception as exc:
            capture._fail(f"before ProcessGroup.{method}", exc)
        work = original(pg, *args, **kwargs)  # the op's own errors reach the caller untouched
        if pre is not None:
            try:
                capture._after(pre, method, args, kwargs, work)
            except Exception as exc:
                capture._fail(f"after ProcessGroup.{method}", exc)
        return work

    wrapper._perfsight_wrapper = True  # type: ignore[attr-defined]
    wrapper.__name__ = method
    wrapper.__doc__ = getattr(original, "__doc__", None)
    return wrapper


def _wait_wrapper(method: str, original: Any) -> Any:
    def wait(work: Any, *args: Any, **kwargs: Any) -> Any:
        capture = _active
        if capture is None or not capture._pending:
            return original(work, *args, **kwargs)
        start = time.time_ns()
        result = original(work, *args, **kwargs)
        try:
            capture._waited(work, start, time.time_ns())
        except Exception as exc:
            capture._fail("after Work.wait", exc)
        return result

    wait._perfsight_wrapper = True  # type: ignore[attr-defined]
    wait.__doc__ = getattr(original, "__doc__", None)
    return wait


def _global_rank() -> int | None:
    try:
        import torch.distributed as dist

        return dist.get_rank() if dist.is_available() and dist.is_initialized() else None
    except Exception:
        return None


def create_capture(context: Any) -> CommCapture:
    """Entry point of the capture protocol (``perfsight.collect.capture``)."""
    return CommCapture(rank=getattr(context, "rank", None))
