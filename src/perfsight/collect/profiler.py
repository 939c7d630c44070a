"""``perfsight.profile``: ``torch.profiler.profile`` plus levels, run folders and a safety net.

Why a subclass and not a wrapper: code written for ``torch.profiler.profile`` (``key_averages()``,
``export_chrome_trace()``, ``events()``, custom ``on_trace_ready`` callables, torch's own
``schedule``) keeps working unchanged when the import changes.  Op tracing stays Kineto's; this
class adds, around torch's own window transitions (``start_trace``/``stop_trace``/``_trace_ready``):

* the profiler level (``ExperimentalConfig``), which turns on torch switches and perfsight's own
  captures (``collect/capture.py``) for the window;
* the window's bookkeeping: which steps it recorded and whether it was cut short (training
  ended, the job was killed), read by the run-folder handler;
* user metadata kept for every window (``add_metadata`` / ``add_metadata_json``);
* one :class:`~perfsight.collect.safety.Guard`: any failure of ours or of Kineto is logged once and
  profiling is turned off, and every later ``step()`` is a counter increment.

It must not write files itself: that is the handler's job (``collect/handlers.py``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import json
import logging
import warnings
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pyarrow as pa
import torch
from torch.profiler import ProfilerAction

from perfsight.collect import capture, run_folder
from perfsight.collect.levels import ExperimentalConfig, ProfilerLevel, torch_activities
from perfsight.collect.safety import Guard
from perfsight.collect.schedule import Schedule

log = logging.getLogger("perfsight.collect")

_RECORDING = (ProfilerAction.RECORD, ProfilerAction.RECORD_AND_SAVE)


@dataclasses.dataclass
class Window:
    """One recording window: from the step Kineto started recording to the step it stopped."""

    index: int
    first_step: int
    started: datetime.datetime
    end_step: int | None = None  # exclusive: the first step not recorded
    complete: bool | None = None
    reason: str | None = None  # why it is incomplete
    folder: Path | None = None  # set by a run-folder handler
    sidecars: dict[str, pa.Table] = dataclasses.field(default_factory=dict)

    @property
    def steps(self) -> list[int]:
        end = self.end_step if self.end_step is not None else self.first_step
        return list(range(self.first_step, end))

    def describe(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "first_step": self.first_step,
            "last_step": (self.end_step - 1) if self.end_step and self.end_step > self.first_step else None,
            "steps": self.steps,
            "started_utc": self.started.isoformat(),
        }


class profile(torch.profiler.profile):  # noqa: N801 - the name torch users already type
    """Drop-in for ``torch.profiler.profile`` (same arguments), plus ``experimental_config``
    taking a :class:`~perfsight.collect.levels.ExperimentalConfig` (a torch
    ``_ExperimentalConfig`` is passed through to Kineto unchanged)."""

    def __init__(
        self,
        *,
        activities: Iterable[Any] | None = None,
        schedule: Any = None,
        on_trace_ready: Any = None,
        record_shapes: bool = False,
        profile_memory: bool = False,
        with_stack: bool = False,
        with_flops: bool = False,
        with_modules: bool = False,
        experimental_config: Any = None,
        **torch_kwargs: Any,
    ) -> None:
        if isinstance(experimental_config, ExperimentalConfig):
            self.config = experimental_config
            torch_experimental = experimental_config.torch_experimental_config
        else:
            self.config = ExperimentalConfig()
            torch_experimental = experimental_config
        switches = self.config.switches
        torch_acts, missing = torch_activities(activities)
        if missing:
            warnings.warn(
                "perfsight.profile: no accelerator torch can trace on this machine; "
                "tracing CPU activity only",
                UserWarning,
                stacklevel=2,
            )
        if not torch_acts:
            torch_acts = [torch.profiler.ProfilerActivity.CPU]
        self.perfsight_schedule = schedule if isinstance(schedule, Schedule) else None
        self.guard = Guard()
        self.user_metadata: dict[str, Any] = {}
        self.identity: dict[str, Any] = run_folder.identity()
        self.clock: dict[str, Any] | None = None
        self.current_window: Window | None = None  # the window Kineto is recording, if any
        self.last_window: Window | None = None  # the most recent window handed to on_trace_ready
        self.windows_started = 0
        self._captures: list[capture.Capture] | None = None
        self._off = False
        self._stopping = False
        self._torch_internal = False
        super().__init__(
            activities=torch_acts,
            schedule=schedule,
            on_trace_ready=on_trace_ready,
            record_shapes=record_shapes or switches.record_shapes,
            profile_memory=profile_memory or switches.profile_memory,
            with_stack=with_stack or switches.with_stack,
            with_flops=with_flops,
            with_modules=with_modules,
            experimental_config=torch_experimental,
            **torch_kwargs,
        )

    # ------------------------------------------------------------------ what users call

    @property
    def level(self) -> ProfilerLevel:
        return self.config.profiler_level

    @property
    def enabled(self) -> bool:
        """False once profiling was turned off (see ``guard.reason`` for why)."""
        return not self._off

    def start(self) -> None:
        self._stopping = False
        self.identity = run_folder.identity()
        if self.identity["world_size"] > 1 and self.clock is None:
            self.clock = self.guard.call(
                "aligning clocks across ranks", capture.align_clocks, self._context()
            )
        self._install_captures()
        self.guard.call("starting the profiler", super().start)
        self._shutdown_if_tripped()

    def _install_captures(self) -> None:
        """Hook the captures in now, not at the first window: data-loader workers forked before
        the hooks exist would never report, and the iterator is often made before the window.
        Rows recorded before a window are dropped when the window starts."""
        if self._captures is None:
            self._captures = self.guard.call("setting up perfsight's captures", self._create_captures) or []
        for cap in self._captures:
            install = getattr(cap, "install", None)
            if callable(install):
                self.guard.call(f"installing the {cap.name} capture", install)

    def step(self) -> None:
        if self._off:
            self.step_num += 1
            return
        self.guard.call("advancing the profiler step", super().step)
        self._shutdown_if_tripped()

    def stop(self) -> None:
        if self._off:
            self._close_captures()
            return
        self._stopping = True
        self.guard.call("stopping the profiler", super().stop)
        if self.perfsight_schedule is not None:
            shortfall = self.perfsight_schedule.shortfall(self.step_num)
            if shortfall:
                warnings.warn(f"perfsight.profile: {shortfall}", UserWarning, stacklevel=2)
        self._close_captures()
        self._shutdown_if_tripped()

    def __exit__(self, exc_type: Any, exc_val: Any, exc_tb: Any) -> bool:
        self.guard.call("closing the profiler", super().__exit__, exc_type, exc_val, exc_tb)
        return False

    def add_metadata(self, key: str, value: str) -> None:
        """A string kept in ``profiler_metadata.json`` and in every window's Kineto trace."""
        if self._torch_internal:
            super().add_metadata(key, value)
            return
        self.user_metadata[key] = value
        self._remember_metadata(key, json.dumps(str(value)))

    def add_metadata_json(self, key: str, value: str) -> None:
        """A JSON value (given as text) kept as parsed JSON; text that is not JSON is kept as a
        string, with a warning."""
        if self._torch_internal:
            super().add_metadata_json(key, value)
            return
        try:
            self.user_metadata[key] = json.loads(value)
        except (TypeError, ValueError):
            warnings.warn(
                f"perfsight.profile.add_metadata_json: value for {key!r} is not JSON; kept as text",
                UserWarning,
                stacklevel=2,
            )
            self.user_metadata[key] = value
            value = json.dumps(str(value))
        self._remember_metadata(key, value)

    # -------------------------------------------------- torch's window transitions (hooks)

    def start_trace(self) -> None:
        self._torch_internal = True  # torch's start_trace records its switches as metadata
        try:
            super().start_trace()
        finally:
            self._torch_internal = False
        if self._stopping or self.guard.tripped:
            return  # torch's flush of a window stopped in warmup, or profiling is being turned off
        self.current_window = Window(
            index=self.windows_started, first_step=self.step_num, started=datetime.datetime.now(datetime.UTC)
        )
        self.windows_started += 1
        if self._captures is None:
            self._captures = self.guard.call("setting up perfsight's captures", self._create_captures) or []
        for cap in self._captures:
            self.guard.call(f"starting the {cap.name} capture", cap.start)
        started = getattr(self.on_trace_ready, "window_started", None)
        if callable(started):
            self.guard.call("preparing the run folder", started, self)

    def stop_trace(self) -> None:
        window = self.current_window
        for cap in self._captures or []:
            table = self.guard.call(f"stopping the {cap.name} capture", cap.stop)
            if window is not None and table is not None:
                window.sidecars[cap.name] = table
        super().stop_trace()

    def _trace_ready(self) -> None:
        window = self.current_window
        if window is not None:
            window.end_step = self.step_num
            window.complete, window.reason = self._window_completeness(window)
            if not window.complete:
                log.info("perfsight: window %d incomplete: %s", window.index, window.reason)
        if self.on_trace_ready is not None and not self._off:
            self.guard.call("writing the trace (on_trace_ready)", self.on_trace_ready, self)
        self.last_window, self.current_window = window, None

    # ---------------------------------------------------------------------------- internals

    def _window_completeness(self, window: Window) -> tuple[bool, str | None]:
        recorded = len(window.steps)
        if not self._stopping:
            return True, None
        if self.perfsight_schedule is not None:
            wanted = self.perfsight_schedule.active
            if recorded >= wanted:
                return True, None
            return False, (
                f"training ended after {recorded} of the window's {wanted} active steps "
                f"(steps {window.first_step}..{window.first_step + wanted - 1} were scheduled)"
            )
        if self.record_steps:
            return False, f"profiling stopped inside the window, after {recorded} recorded steps"
        return True, None  # no schedule: the window is start() .. stop() by definition

    def _context(self) -> capture.CaptureContext:
        return capture.CaptureContext(
            rank=self.identity["rank"],
            world_size=self.identity["world_size"],
            level=self.level.value,
            record_shapes=self.record_shapes,
        )

    def _create_captures(self) -> list[capture.Capture]:
        names = self.config.switches.captures
        if self.with_modules and not self.with_stack:  # Kineto names modules itself with the tracer on
            names = (*names, "modules")
        return capture.create_captures(names, self._context())

    def _close_captures(self) -> None:
        for cap in self._captures or []:
            self.guard.call(f"closing the {cap.name} capture", cap.close)
        self._captures = None

    def _remember_metadata(self, key: str, json_value: str) -> None:
        # torch forgets metadata at each new window; the preset is re-applied at every start
        self.preset_metadata_json(key, json_value)
        if self.current_action in _RECORDING and self.profiler is not None:
            self.guard.call(
                "adding metadata to the trace", torch.autograd._add_metadata_json, key, json_value
            )

    def _shutdown_if_tripped(self) -> None:
        if self.guard.tripped and not self._off:
            self._shutdown()

    def _shutdown(self) -> None:
        """Turn profiling off for good: stop Kineto if it is recording, unhook every capture,
        and leave torch's state machine idle so later ``step()``/``stop()`` calls do nothing."""
        self._off = True
        if self.step_rec_fn is not None:
            with contextlib.suppress(Exception):
                self.step_rec_fn.__exit__(None, None, None)
            self.step_rec_fn = None
        action = self.current_action
        try:
            if action == ProfilerAction.WARMUP:
                torch.profiler.profile.start_trace(self)
                torch.profiler.profile.stop_trace(self)
            elif action in _RECORDING:
                torch.profiler.profile.stop_trace(self)
        except Exception:  # noqa: BLE001 - Kineto may already be stopped
            log.debug("perfsight: stopping Kineto after a failure", exc_info=True)
        self._close_captures()
        window = self.current_window
        if window is not None and window.complete is None:
            window.complete, window.reason = False, f"profiling turned off: {self.guard.reason}"
            aborted = getattr(self.on_trace_ready, "window_aborted", None)
            if callable(aborted):
                try:
                    aborted(self)
                except Exception:  # noqa: BLE001
                    log.debug("perfsight: marking the window aborted", exc_info=True)
        self.current_action = ProfilerAction.NONE
        self._prev_schedule_action = ProfilerAction.NONE
