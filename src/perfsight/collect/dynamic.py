"""``DynamicProfilerMonitor``: start a collection in a running job by editing a JSON file.

Seed 003 ("方式二"): the training loop calls ``monitor.step()`` after each step; the monitor
watches ``{cfg_path}/profiler_config.json`` (written with defaults when missing) and, when it
changes, schedules the steps ``start_step..stop_step`` it asks for.  Each window lands in
``{output_path}/rank{r}_start{a}_stop{b}/`` as a normal run folder.  ``perfsight trigger``
edits the file from another shell.

Why a ``stat`` per step and no thread: one ``os.stat`` costs about a microsecond, is exact about
which step the change is seen at, and needs no locking with the training thread (MindSpore polls
from a separate process every two seconds).  ``poll_interval`` spaces the checks out on slow
network filesystems.

Rules that keep the training job safe:

* a bad file (not JSON, nested too deeply to parse, a wrong value; a FIFO, device or folder,
  which are never opened blocking; more than 1 MiB) gets one warning naming the file and the
  key, and the previous configuration stays in force;
* a window whose ``start_step`` has already run is refused with a warning (as the seed: a new
  ``start_step`` must lie after the previous window);
* changes made while a window records are read when it ends;
* with several ranks, the clocks are aligned once at a point every rank reaches (construction or
  the first ``step()`` after ``torch.distributed`` is initialised) and reused for every window, so
  a window seen by one rank only never waits in a collective for the others;
* any failure of perfsight's own turns the monitor off (``perfsight.collect.safety.Guard``).
"""

from __future__ import annotations

import atexit
import logging
import os
import sys
import time
import warnings
from pathlib import Path
from typing import Any

from perfsight.collect import run_folder
from perfsight.collect.dynamic_config import (
    ConfigFileError,
    DynamicConfig,
    config_file,
    create_default,
    read_config,
    signature,
)
from perfsight.collect.options import OptionError
from perfsight.collect.safety import Guard
from perfsight.collect.step_range import StepRange

log = logging.getLogger("perfsight.collect")


class DynamicConfigWarning(UserWarning):
    """``profiler_config.json`` asked for something the monitor cannot do; training goes on."""


def window_folder_name(rank: int, start_step: int, stop_step: int) -> str:
    """``rank{r}_start{a}_stop{b}``, as the seed names a dynamic window's output."""
    return f"rank{rank}_start{start_step}_stop{stop_step}"


class DynamicProfilerMonitor:
    """Call :meth:`step` once per training step; edit ``profiler_config.json`` to collect.

    ``cfg_path`` is the folder holding ``profiler_config.json`` (or the file itself); every rank
    of a job may share it.  ``output_path`` receives one ``rank{r}_start{a}_stop{b}`` folder per
    window and rank.
    """

    def __init__(
        self,
        cfg_path: str | os.PathLike[str],
        output_path: str | os.PathLike[str] = "./dyn_profile_data",
        poll_interval: float = 0.0,
    ) -> None:
        self.config_path = config_file(cfg_path)
        self.output_path = Path(output_path)
        self.poll_interval = float(poll_interval)
        self.step_num = 0
        """Training steps finished so far (the step running now is ``step_num + 1``)."""
        self.config: DynamicConfig | None = None
        self.guard = Guard()
        self._range: StepRange | None = None
        self._finished: list[StepRange] = []
        self._seen: tuple[int, int, int, int] | None = None
        self._last_poll = float("-inf")
        self._clock: dict[str, Any] | None = None
        self._clock_done = False
        self.guard.call("reading the dynamic profiler config", self._setup)
        atexit.register(self.close)

    # ------------------------------------------------------------------ what users call

    def step(self) -> None:
        """One training step ended: advance the window, then look for a new configuration."""
        self.step_num += 1
        if self.guard.tripped:
            return
        self.guard.call("dynamic profiling", self._boundary)
        if self.guard.tripped:
            self._shutdown()

    def close(self) -> None:
        """Training is over: write the window being recorded, if any (also run at exit)."""
        if self._range is not None:
            rng, self._range = self._range, None
            self.guard.call("closing the dynamic profiling window", rng.close)
            self._finished.append(rng)

    @property
    def enabled(self) -> bool:
        return not self.guard.tripped

    @property
    def folders(self) -> list[Path]:
        """Run folders written so far, in order."""
        ranges = self._finished + ([self._range] if self._range is not None else [])
        return [folder for rng in ranges for folder in rng.folders]

    def wait(self, timeout: float | None = None) -> None:
        """Wait for background analyses (``analyse_mode: async``) of finished windows."""
        for rng in self._finished:
            rng.wait(timeout)

    # ---------------------------------------------------------------------------- internals

    def _setup(self) -> None:
        if create_default(self.config_path):
            log.info("perfsight: wrote the default dynamic profiler config %s", self.config_path)
        self._align_clocks_once()
        self._poll(force=True)

    def _boundary(self) -> None:
        self._align_clocks_once()
        if self._range is not None:
            self._range.at_boundary(self.step_num)
            if self._range.finished:
                self._finished.append(self._range)
                self._range = None
        if self._range is None or not self._range.recording:
            self._poll()

    def _poll(self, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self._last_poll < self.poll_interval:
            return
        self._last_poll = now
        sig = signature(self.config_path)
        if sig == self._seen:
            return
        self._seen = sig
        if sig is None:
            return  # deleted: nothing new asked; a pending window stays pending
        try:
            config, notes = read_config(self.config_path)
        except (ConfigFileError, OptionError) as exc:
            _warn(f"perfsight: {exc}; the previous configuration stays in force")
            return
        for note in notes:
            _warn(f"perfsight: {note}")
        self._apply(config)

    def _apply(self, config: DynamicConfig) -> None:
        self.config = config
        if self._range is not None and not self._range.recording:
            self._range = None  # a pending window is replaced by what the file says now
        if not config.active:
            return
        upcoming = self.step_num + 1
        if config.start_step < upcoming:
            _warn(
                f"perfsight: {self.config_path}: key 'start_step': step {config.start_step} has already "
                f"run (step {upcoming} runs next); nothing collected, choose a later start_step"
            )
            return
        rank = run_folder.identity()["rank"]
        self._range = StepRange(
            config.start_step,
            config.stop_step,
            config.options,
            self.output_path / window_folder_name(rank, config.start_step, config.stop_step),
            clock=self._clock,
        )
        log.info("perfsight: rank %d will profile steps %d..%d", rank, config.start_step, config.stop_step)
        self._range.at_boundary(self.step_num)  # opens now when start_step is the next step

    def _align_clocks_once(self) -> None:
        """Align clocks the first time every rank is here with an initialised process group."""
        if self._clock_done:
            return
        dist = sys.modules.get("torch.distributed")  # cheap check, once per step until true
        if dist is None or not dist.is_available() or not dist.is_initialized():
            return
        self._clock_done = True
        ident = run_folder.identity()
        if ident["world_size"] <= 1:
            return
        from perfsight.collect import capture

        context = capture.CaptureContext(rank=ident["rank"], world_size=ident["world_size"], level="dynamic")
        # {} (not None) also when no clock module is installed: the profiler must not try later
        self._clock = self.guard.call("aligning clocks across ranks", capture.align_clocks, context) or {}

    def _shutdown(self) -> None:
        rng, self._range = self._range, None
        if rng is not None and rng.prof is not None:
            try:
                rng.close()
            except Exception:  # noqa: BLE001 - the guard already reported the first failure
                log.debug("perfsight: closing the window after a failure", exc_info=True)


def _warn(message: str) -> None:
    try:
        warnings.warn(message, DynamicConfigWarning, stacklevel=4)
    except Warning:
        log.warning(message)  # warnings turned into errors must not reach the training loop
