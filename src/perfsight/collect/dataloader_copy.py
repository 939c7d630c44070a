"""Time the training loop's copy of each batch to the device: the ``.to(...)`` / ``.cuda()`` of the
batch's tensors right after the DataLoader yields them (the host-to-device stage of issue 19).

Why here and not in the loader: PyTorch's DataLoader never copies to the device; the loop does,
usually as its first statement (``x = x.to(device, non_blocking=True)``), or a device prefetcher
does it for the next batch.  So the capture watches the batch it has just handed out: the wrapped
``__next__`` (``dataloader_capture``) calls :func:`arm` with the yielded batch, and the wrapped
``Tensor.to`` / ``Tensor.cuda`` time a call only when its tensor is one of that batch's (matched by
identity through weak references: the batch lives exactly as long as the user keeps it).  The
watch ends when every tensor of the batch has been moved, or at the next request; its calls make
one ``copy`` row per batch: the start of the first copy, the summed copy time, the bytes read
and the target device.

What counts as a copy: a call that returns a new tensor (another device, or another dtype: a real
copy either way).  A ``.to()`` that returns its own tensor (already there: a CPU-only loop's
``.to("cpu")``) copies nothing and records nothing, so a CPU-only run has no copy stage at all
rather than a row of zero-length noise.  Time: a copy to CUDA is timed by a pair of CUDA events
on the current stream around the call (a ``non_blocking`` copy from pinned memory returns before
the copy is done; the events measure the transfer itself) and resolved when the table is read;
any other copy by the host clock.

Must not: change what the calls return, keep a batch alive, or raise into the training loop
(any failure switches copy timing off and is logged once).  ``torch.compile`` traces through the
wrappers without a graph break (``torch._dynamo.explain``, torch 2.13).  Not verified on a GPU
(none was available): the CUDA event path is the documented ``Event.record`` /
``elapsed_time`` pair on the current stream; a copy to a device other than the current one is
timed on the current device's stream.
"""

from __future__ import annotations

import logging
import time
import weakref
from typing import Any

log = logging.getLogger("perfsight.collect")

MAX_TENSORS = 16
"""Tensors watched per batch at most (a batch is a tensor, a tuple/list/dict of a few)."""

_MAX_DEPTH = 2


class CopyWatch:
    """The batch the loop received last, until its tensors have been moved (or the next request)."""

    __slots__ = ("refs", "batch", "tid", "start", "host_ns", "bytes", "device", "events")

    def __init__(self, refs: dict[int, Any], batch: int, tid: int) -> None:
        self.refs = refs  # id(tensor) -> weakref.ref(tensor)
        self.batch = batch
        self.tid = tid
        self.start = 0  # CLOCK_REALTIME ns of the first copy
        self.host_ns = 0  # summed host time of copies timed by the host clock
        self.bytes = 0
        self.device = ""
        self.events: list[tuple[Any, Any]] = []  # CUDA (start, end) event pairs

    def row(self) -> tuple | None:
        """``(tid, batch, start_ns, host_ns, bytes, device, events)``, or None when nothing was copied."""
        if not self.start:
            return None
        return (self.tid, self.batch, self.start, self.host_ns, self.bytes, self.device, self.events)


_watch: list[CopyWatch | None] = [None]
_sink: list[Any] = [None]  # the callable taking a finished watch's row (the active capture's)
_Tensor: list[Any] = [None]
_failed: list[bool] = [False]


def _collect(data: Any, out: dict[int, Any], depth: int) -> None:
    if isinstance(data, _Tensor[0]):
        if len(out) < MAX_TENSORS:
            out[id(data)] = weakref.ref(data)
    elif depth < _MAX_DEPTH and isinstance(data, (list, tuple)):
        for item in data[:MAX_TENSORS]:
            _collect(item, out, depth + 1)
    elif depth < _MAX_DEPTH and isinstance(data, dict):
        for item in list(data.values())[:MAX_TENSORS]:
            _collect(item, out, depth + 1)


def arm(data: Any, batch: int, tid: int, sink: Any) -> None:
    """Watch the tensors of ``data`` (the batch just yielded) for their copy to the device."""
    finish()
    if _failed[0] or _Tensor[0] is None:
        return
    refs: dict[int, Any] = {}
    _collect(data, refs, 0)
    if refs:
        _sink[0] = sink
        _watch[0] = CopyWatch(refs, batch, tid)


def finish() -> None:
    """End the watch (all tensors moved, or the loop asks for the next batch): hand over its row."""
    watch, _watch[0] = _watch[0], None
    if watch is not None and _sink[0] is not None:
        row = watch.row()
        if row is not None:
            _sink[0](row)


def _fail(exc: BaseException) -> None:
    _watch[0] = None
    if not _failed[0]:
        _failed[0] = True
        log.warning(
            "perfsight: timing the batch's copy to the device failed (%s: %s); it is off",
            type(exc).__name__,
            exc,
        )


def _cuda_events(torch: Any) -> tuple[Any, Any] | None:
    try:
        return torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    except Exception:
        return None


def _timed(original: Any, tensor: Any, args: tuple, kwargs: dict) -> Any:
    """Run ``original`` (``Tensor.to`` / ``.cuda``) on a watched tensor and time it as a copy."""
    watch = _watch[0]
    if watch is None or watch.refs.pop(id(tensor), None) is None:  # another thread ended the watch
        return original(tensor, *args, **kwargs)
    events = None
    try:
        if _cuda[0] is not None and _cuda[0].is_initialized():
            events = _cuda_events(_cuda[0])
            if events is not None:
                events[0].record()
    except Exception as exc:
        _fail(exc)
        return original(tensor, *args, **kwargs)
    start = time.time_ns()
    result = original(tensor, *args, **kwargs)  # the user's errors reach the user untouched
    end = time.time_ns()
    try:
        if result is not tensor:  # a new tensor: something was copied
            device = result.device
            if events is not None and device.type == "cuda":
                events[1].record()
                watch.events.append(events)
            else:
                watch.host_ns += end - start
            watch.start = watch.start or start
            watch.bytes += tensor.nbytes
            watch.device = _device_names.get(device) or _device_names.setdefault(device, str(device))
        if not watch.refs:
            finish()
    except Exception as exc:
        _fail(exc)
    return result


def _torch() -> Any:
    import torch

    return torch


_cuda: list[Any] = [None]  # torch.cuda where a GPU may be used (asked once, at install), else None
_device_names: dict[Any, str] = {}  # torch.device -> "cuda:0" (str() of a device costs a microsecond)


def _method_wrapper(original: Any) -> Any:
    def method(tensor: Any, *args: Any, **kwargs: Any) -> Any:
        watch = _watch[0]
        if watch is None:
            return original(tensor, *args, **kwargs)
        ref = watch.refs.get(id(tensor))
        if ref is None or ref() is not tensor:
            return original(tensor, *args, **kwargs)
        return _timed(original, tensor, args, kwargs)

    method._perfsight_wrapper = True  # type: ignore[attr-defined]
    method.__name__ = getattr(original, "__name__", "to")
    method.__doc__ = getattr(original, "__doc__", None)
    return method


def targets() -> list[tuple[Any, str, Any]]:
    """``(owner, attribute, make_wrapper)`` for ``dataloader_capture._patch``: ``Tensor.to`` and
    ``Tensor.cuda`` (class attributes of ``torch.Tensor``; the C methods stay on its base)."""
    torch = _torch()
    _Tensor[0] = torch.Tensor
    _cuda[0] = torch.cuda if torch.cuda.is_available() else None
    return [(torch.Tensor, "to", _method_wrapper), (torch.Tensor, "cuda", _method_wrapper)]


def resolve(row: tuple) -> tuple[int, int, int, int, int, str]:
    """``(tid, batch, start_ns, end_ns, bytes, device)`` of a watch's row, its CUDA events waited
    for (read at the end of a profiling window, off the training loop's path)."""
    tid, batch, start, host_ns, nbytes, device, events = row
    ns = host_ns
    for begin, end in events:
        try:
            end.synchronize()
            ns += int(begin.elapsed_time(end) * 1e6)  # ms -> ns
        except Exception as exc:  # an event never recorded: that copy's time is unknown
            log.debug("perfsight: a copy's CUDA events could not be read (%s)", exc)
    return tid, batch, start, start + ns, nbytes, device


def reset() -> None:
    """Forget the watch (uninstall)."""
    _watch[0] = None
    _sink[0] = None
    _failed[0] = False
