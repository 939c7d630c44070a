"""``perfsight.schedule``: which steps a profiler records, with the seed's rules for odd values.

Why not ``torch.profiler.schedule``: its edge cases differ from seed 003 ("schedule配置错误问题"):
torch asserts on ``active=0``, we warn and use 1; torch raises ``AssertionError`` for negatives,
we raise ``ValueError`` naming the parameter; and we know, from the step a run stopped at,
whether a window was cut short or the schedule was longer than the run, so the run folder can say
so.  The returned object is still a plain ``step -> ProfilerAction`` callable, so it also works
with ``torch.profiler.profile``.

Steps count from 0.  ``skip_first`` steps are skipped once, then each cycle is ``wait`` steps
idle, ``warmup`` steps tracing without keeping the events, ``active`` recorded steps; ``repeat``
cycles (0: until training ends).  E.g. ``skip_first=2, wait=1, warmup=1, active=2`` records
steps 4 and 5, as the seed's example.
"""

from __future__ import annotations

import dataclasses
import enum
import warnings


class Phase(enum.Enum):
    """Where a step falls in the schedule (torch's ProfilerAction, without importing torch)."""

    NONE = 0
    WARMUP = 1
    RECORD = 2
    RECORD_AND_SAVE = 3


@dataclasses.dataclass(frozen=True)
class Schedule:
    """A validated schedule; call it with a step number to get torch's ``ProfilerAction``."""

    wait: int
    active: int
    warmup: int = 0
    repeat: int = 0
    skip_first: int = 0

    @property
    def cycle(self) -> int:
        return self.wait + self.warmup + self.active

    @property
    def total_steps(self) -> int | None:
        """Steps the whole schedule spans; ``None`` when it repeats until training ends."""
        return self.skip_first + self.repeat * self.cycle if self.repeat else None

    def phase(self, step: int) -> Phase:
        """The phase of ``step`` (0-based)."""
        position = step - self.skip_first
        if position < 0 or (self.repeat and position >= self.repeat * self.cycle):
            return Phase.NONE
        offset = position % self.cycle
        if offset < self.wait:
            return Phase.NONE
        if offset < self.wait + self.warmup:
            return Phase.WARMUP
        return Phase.RECORD_AND_SAVE if offset == self.cycle - 1 else Phase.RECORD

    def window_of(self, step: int) -> int | None:
        """Index (0-based) of the cycle ``step`` belongs to, ``None`` before or after the schedule."""
        position = step - self.skip_first
        if position < 0 or (self.repeat and position >= self.repeat * self.cycle):
            return None
        return position // self.cycle

    def active_steps(self, window: int) -> range:
        """The recorded steps of cycle ``window``."""
        first = self.skip_first + window * self.cycle + self.wait + self.warmup
        return range(first, first + self.active)

    def shortfall(self, steps_run: int) -> str | None:
        """Why a run of ``steps_run`` steps did not complete this schedule, or ``None`` if it did.

        Only a schedule with a finite ``repeat`` can be longer than the run; with ``repeat=0``
        the window open at the end is reported by the profiler as incomplete instead.
        """
        total = self.total_steps
        if total is None or steps_run >= total:
            return None
        return (
            f"the schedule spans {total} steps (skip_first {self.skip_first} + repeat {self.repeat} x "
            f"(wait {self.wait} + warmup {self.warmup} + active {self.active})) but training ran "
            f"{steps_run}; the data of the last window may be partial"
        )

    def __call__(self, step: int):  # -> torch.profiler.ProfilerAction
        from torch.profiler import ProfilerAction

        return ProfilerAction(self.phase(step).value)

    def describe(self) -> dict[str, int]:
        return dataclasses.asdict(self)


def schedule(*, wait: int, active: int, warmup: int = 0, repeat: int = 0, skip_first: int = 0) -> Schedule:
    """Build a schedule; negatives raise ``ValueError`` naming the parameter, ``active < 1`` warns
    and becomes 1 (seed 003)."""
    values = {"wait": wait, "active": active, "warmup": warmup, "repeat": repeat, "skip_first": skip_first}
    for name, value in values.items():
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"schedule: {name} must be an integer >= 0, got {value!r}")
        if value < 0:
            raise ValueError(f"schedule: {name} must be >= 0, got {value}")
    if active < 1:
        warnings.warn("schedule: active must be >= 1; using active=1", UserWarning, stacklevel=2)
        active = 1
    return Schedule(wait=wait, active=active, warmup=warmup, repeat=repeat, skip_first=skip_first)
