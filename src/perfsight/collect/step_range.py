"""Profile a range of training steps, driven only by "step N just ended" notifications.

Why: the dynamic monitor, the no-code-change mode and the framework callbacks all learn about
steps the same way -- something tells them a step ended (``monitor.step()``, an optimizer hook,
``on_step_end``) -- and all want the same thing: steps ``first..last`` recorded by one
``perfsight.profile`` window, named ``ProfilerStep#first`` .. ``ProfilerStep#last`` in the trace so
the analyses show the training's own step numbers.  This module is that one recipe; it adds no
profiling of its own and must not write files (``perfsight.profile`` and its handler do).

Steps count from 1 (seed 003: "the first step of training is 1"); ``completed`` is the number of
steps finished so far (0 before the first).  The window opens at the boundary ``completed ==
first - 1`` and closes itself after step ``last``: a perfsight ``schedule(skip_first=first,
active=last - first + 1, repeat=1)`` with the profiler's step counter set to the training's.
"""

from __future__ import annotations

import logging
import os
import warnings
from pathlib import Path
from typing import Any

from perfsight.collect.options import AnalyseMode, CollectOptions

log = logging.getLogger("perfsight.collect")


class StepRange:
    """Records steps ``first..last`` (inclusive, 1-based) into run folders under ``dir_name``."""

    def __init__(
        self,
        first: int,
        last: int,
        options: CollectOptions,
        dir_name: str | os.PathLike[str],
        *,
        clock: dict[str, Any] | None = None,
        worker_name: str | None = None,
    ) -> None:
        if first < 1 or last < first:
            raise ValueError(f"step range {first}..{last}: need 1 <= first <= last")
        self.first = first
        self.last = last
        self.options = options
        self.dir_name = Path(dir_name)
        self.clock = clock
        self.worker_name = worker_name
        self.prof: Any = None
        self.handler: Any = None
        self.finished = False
        self.missed = False

    @property
    def recording(self) -> bool:
        return self.prof is not None and not self.finished

    @property
    def folders(self) -> list[Path]:
        """The run folders written so far (one per finished window)."""
        return list(self.handler.folders) if self.handler is not None else []

    def at_boundary(self, completed: int) -> None:
        """Step ``completed`` just ended (0: training is about to run its first step)."""
        if self.finished:
            return
        if self.prof is not None:
            self.prof.step()
            if completed >= self.last:
                self._finish()
            return
        if completed == self.first - 1:
            self._begin()
        elif completed >= self.first and not self.missed:
            self.missed = True
            self.finished = True
            log.warning(
                "perfsight: steps %d..%d were not profiled: training was already at step %d",
                self.first,
                self.last,
                completed,
            )

    def close(self) -> None:
        """Training ended (or profiling is being turned off): write what was recorded."""
        if self.recording:
            self._finish()
        self.finished = True

    def wait(self, timeout: float | None = None) -> None:
        """Wait for background analyses (``analyse_mode: async``) of this range's windows."""
        if self.handler is not None:
            self.handler.wait(timeout)

    def _begin(self) -> None:
        from perfsight.collect.handlers import tensorboard_trace_handler
        from perfsight.collect.profiler import profile
        from perfsight.collect.schedule import schedule

        mode = self.options.analyse_mode
        self.handler = tensorboard_trace_handler(
            self.dir_name,
            worker_name=self.worker_name,
            analyse_flag=mode is not AnalyseMode.NONE,
            async_mode=mode is AnalyseMode.ASYNC,
        )
        window = schedule(
            wait=0, warmup=0, active=self.last - self.first + 1, repeat=1, skip_first=self.first
        )
        prof = profile(schedule=window, on_trace_ready=self.handler, **self.options.profile_kwargs())
        if self.clock is not None:
            # aligned earlier by the caller at a point every rank reaches: a window started on
            # one rank only must not wait in a collective for ranks that never join
            prof.clock = self.clock
        # the schedule is idle at step first-1; the next step() makes Kineto record step `first`
        prof.step_num = self.first - 1
        self.prof = prof
        prof.start()
        prof.step()

    def _finish(self) -> None:
        self.finished = True
        completed = self.prof.step_num - 1
        if completed >= self.last:
            self.prof.stop()  # the schedule already wrote the window at its last step: a no-op
            return
        # training ended inside the window: the profiler writes it marked incomplete; its
        # warning speaks of schedule parameters this user never set, so say it in step terms
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="perfsight.profile: the schedule spans")
            self.prof.stop()
        warnings.warn(
            f"perfsight: steps {self.first}..{self.last} were requested but training ended after step "
            f"{completed}; the window is written and marked incomplete",
            UserWarning,
            stacklevel=3,
        )
