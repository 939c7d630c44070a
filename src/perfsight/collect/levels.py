"""The switches of ``perfsight.profile``: levels, activities, export types, the experimental config.

Why a module of its own: these are plain values a user builds before any profiling starts (and
that ``DynamicProfilerMonitor`` and ``PERFSIGHT_PROFILER_OPTIONS`` parse from JSON), so they must
be importable and comparable without torch.  Only :func:`torch_activities` and
:meth:`ExperimentalConfig.torch_config` touch torch, and they import it when called.

What each level records is documented in docs/COLLECTION.md; :data:`LEVEL_SWITCHES` is the one
place that decides it.
"""

from __future__ import annotations

import dataclasses
import enum
import logging
from collections.abc import Iterable, Sequence
from typing import Any

log = logging.getLogger(__name__)


class ProfilerLevel(str, enum.Enum):
    """How much is recorded, cheapest first; each level includes the one before it."""

    Level0 = "Level0"  # steps, host operators, device kernels/copies, user ranges
    Level1 = "Level1"  # + communication details (perfsight's capture) and memory
    Level2 = "Level2"  # + input shapes, Python stacks, data-loader stages

    @classmethod
    def parse(cls, value: Any) -> ProfilerLevel:
        """Accept the enum, its name (``"Level1"``, ``"level1"``) or the seed's integer (``1``)."""
        if isinstance(value, cls):
            return value
        if isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= 2:
            return list(cls)[value]
        if isinstance(value, str):
            for level in cls:
                if value.strip().lower() in {level.value.lower(), level.value[-1]}:
                    return level
        raise ValueError(f"profiler_level: {value!r} is not one of Level0, Level1, Level2 (or 0, 1, 2)")


class ProfilerActivity(str, enum.Enum):
    """What to trace: host activity, accelerator activity.  ``GPU`` means whatever accelerator
    torch offers on this machine (CUDA, ROCm through CUDA, XPU, MTIA, a PrivateUse1 device)."""

    CPU = "CPU"
    GPU = "GPU"

    @classmethod
    def parse(cls, value: Any) -> ProfilerActivity:
        """Accept the enum, a name (``"cpu"``, ``"gpu"``, ``"cuda"``, ``"npu"``) or torch's enum."""
        if isinstance(value, cls):
            return value
        name = getattr(value, "name", value)
        if isinstance(name, str):
            upper = name.strip().upper()
            if upper == "CPU":
                return cls.CPU
            if upper in {"GPU", "CUDA", "XPU", "MTIA", "HPU", "NPU", "PRIVATEUSE1", "DEVICE"}:
                return cls.GPU
        raise ValueError(f"activities: {value!r} is not CPU or GPU")


class ExportType(str, enum.Enum):
    """Which outputs the analysis writes: seed-named text files (CSV/JSON) and/or an SQLite db."""

    Text = "text"
    Db = "db"

    @classmethod
    def parse(cls, value: Any) -> ExportType:
        if isinstance(value, cls):
            return value
        if isinstance(value, str):
            for member in cls:
                if value.strip().lower() in {member.value, member.name.lower()}:
                    return member
        raise ValueError(f"export_type: {value!r} is not Text or Db")


@dataclasses.dataclass(frozen=True)
class LevelSwitches:
    """What a level turns on, on top of the user's own switches (never off: an explicit
    ``record_shapes=True`` at Level0 still records shapes)."""

    profile_memory: bool = False
    record_shapes: bool = False
    with_stack: bool = False
    captures: tuple[str, ...] = ()  # perfsight's own instrumentation, by capture name


LEVEL_SWITCHES: dict[ProfilerLevel, LevelSwitches] = {
    ProfilerLevel.Level0: LevelSwitches(),
    ProfilerLevel.Level1: LevelSwitches(profile_memory=True, captures=("comm",)),
    ProfilerLevel.Level2: LevelSwitches(
        profile_memory=True, record_shapes=True, with_stack=True, captures=("comm", "dataloader")
    ),
}
"""The one table of what each level records (docs/COLLECTION.md describes it for users)."""


@dataclasses.dataclass
class ExperimentalConfig:
    """perfsight's extensions, as the seed's ``_ExperimentalConfig``.

    ``torch_experimental_config`` passes a ``torch.profiler._ExperimentalConfig`` through to
    Kineto untouched (for options perfsight does not model).
    """

    profiler_level: ProfilerLevel = ProfilerLevel.Level0
    export_type: Sequence[ExportType] = (ExportType.Text,)
    data_simplification: bool = True
    torch_experimental_config: Any = None

    def __post_init__(self) -> None:
        self.profiler_level = ProfilerLevel.parse(self.profiler_level)
        kinds = [self.export_type] if isinstance(self.export_type, str | ExportType) else self.export_type
        self.export_type = tuple(dict.fromkeys(ExportType.parse(k) for k in kinds))
        if not self.export_type:
            raise ValueError("export_type: choose at least one of Text, Db")
        self.data_simplification = bool(self.data_simplification)

    @property
    def switches(self) -> LevelSwitches:
        return LEVEL_SWITCHES[self.profiler_level]

    @property
    def export_names(self) -> tuple[str, ...]:
        """Export types as ``perfsight.api.analyse`` spells them (``"text"``, ``"db"``)."""
        return tuple(k.value for k in self.export_type)

    def describe(self) -> dict[str, Any]:
        """JSON-ready form, recorded in ``profiler_info_{rank}.json``."""
        return {
            "profiler_level": self.profiler_level.value,
            "export_type": list(self.export_names),
            "data_simplification": self.data_simplification,
        }


def torch_activities(activities: Iterable[Any] | None) -> tuple[list[Any], list[str]]:
    """torch's activities for ours, and the names of the ones this machine cannot trace.

    ``None`` means CPU plus the machine's accelerator, as torch's default.  torch's own
    ``ProfilerActivity`` values pass through unchanged (drop-in code).
    """
    from torch.profiler import ProfilerActivity as TorchActivity
    from torch.profiler import supported_activities

    supported = supported_activities()
    if activities is None:
        return sorted(supported, key=lambda a: a.name), []
    chosen: list[Any] = []
    missing: list[str] = []
    for item in activities:
        if isinstance(item, TorchActivity | dict):
            chosen.append(item)
            continue
        activity = ProfilerActivity.parse(item)
        if activity is ProfilerActivity.CPU:
            chosen.append(TorchActivity.CPU)
            continue
        device = _accelerator_activity(supported)
        if device is None:
            missing.append("GPU")
        else:
            chosen.append(device)
    return list(dict.fromkeys(chosen)), missing


def _accelerator_activity(supported: set[Any]) -> Any:
    """The accelerator activity torch can trace here: CUDA first (ROCm reports as CUDA)."""
    from torch.profiler import ProfilerActivity as TorchActivity

    for name in ("CUDA", "XPU", "MTIA", "HPU", "PrivateUse1"):
        activity = getattr(TorchActivity, name, None)
        if activity is not None and activity in supported and _device_present(name):
            return activity
    return None


def _device_present(name: str) -> bool:
    """Kineto may list an activity its runtime cannot use (CUPTI built in, no GPU present)."""
    import torch

    if name == "CUDA":
        return bool(torch.cuda.is_available())
    backend = getattr(torch, name.lower(), None)
    available = getattr(backend, "is_available", None)
    return bool(available()) if callable(available) else name == "PrivateUse1"
