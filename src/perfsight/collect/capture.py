"""The plug-in point for perfsight's own instrumentation (communication, data loader, clock).

Why: ``perfsight.profile`` drives Kineto; what Kineto does not record (per-group sequence
numbers, peers, wait time of async ops, data-loader queue depth, clock offsets) is captured by
separate modules that the profiler switches on per level.  They share one small contract so the
profiler, the run-folder writer and the safety rules stay in one place:

* A **capture** module (listed in :data:`CAPTURE_MODULES`) exposes ``create_capture(context)``
  returning an object with

  - ``name: str`` -- the sidecar's stem: the run folder gets ``perfsight_{name}_{rank}.parquet``;
  - ``start() -> None`` -- a window starts recording (called right after Kineto starts);
  - ``stop() -> pyarrow.Table | None`` -- the window ends; the rows recorded in it;
  - ``close() -> None`` -- profiling is over (or turned off): remove every hook.

* The **clock** module ``perfsight.collect.clock_sync`` exposes ``align_clocks(context) -> dict``
  with at least ``offset_ns`` and ``uncertainty_ns`` (this rank's clock minus rank 0's); it is
  called once in ``profile.start()`` on every rank of an initialised process group.

Every call goes through :class:`perfsight.collect.safety.Guard`: a capture that raises turns
profiling off, never the training run.  A module that is not installed is simply absent.
"""

from __future__ import annotations

import dataclasses
import importlib
import logging
from collections.abc import Callable
from typing import Any, Protocol

import pyarrow as pa

log = logging.getLogger(__name__)

CAPTURE_MODULES: dict[str, str] = {
    "comm": "perfsight.collect.comm_capture",
    "dataloader": "perfsight.collect.dataloader_capture",
    "modules": "perfsight.collect.module_ranges",
}
"""Capture name (as listed in ``levels.LEVEL_SWITCHES``) -> module providing ``create_capture``."""

CLOCK_MODULE = "perfsight.collect.clock_sync"


class Capture(Protocol):
    name: str

    def start(self) -> None: ...

    def stop(self) -> pa.Table | None: ...

    def close(self) -> None: ...


@dataclasses.dataclass
class CaptureContext:
    """What a capture may need to know about the profiler that owns it."""

    rank: int
    world_size: int
    level: str
    record_shapes: bool = False
    extra: dict[str, Any] = dataclasses.field(default_factory=dict)


def _entry_point(module_name: str, attribute: str) -> Callable[..., Any] | None:
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name != module_name:
            raise
        log.debug("perfsight: %s is not available", module_name)
        return None
    return getattr(module, attribute, None)


def create_captures(names: tuple[str, ...], context: CaptureContext) -> list[Capture]:
    """The captures a level asks for that are installed (raises what a factory raises)."""
    captures = []
    for name in names:
        module = CAPTURE_MODULES.get(name)
        factory = _entry_point(module, "create_capture") if module else None
        if factory is None:
            continue
        capture = factory(context)
        if capture is not None:
            captures.append(capture)
    return captures


def align_clocks(context: CaptureContext) -> dict[str, Any] | None:
    """This rank's clock offset to rank 0, or ``None`` when no clock module is installed."""
    align = _entry_point(CLOCK_MODULE, "align_clocks")
    return align(context) if align is not None else None
