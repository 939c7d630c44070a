"""Collection options written as JSON by users: one parser for every way of turning profiling on.

Why one module: ``profiler_config.json`` (``DynamicProfilerMonitor``), ``PERFSIGHT_PROFILER_OPTIONS``
(no code change), ``perfsight run`` / ``perfsight trigger`` flags and the training-framework
callbacks all take the same switches (level, activities, memory, stacks, export types, analysis).
They are validated here once, each error naming the key and where it came from, and turned into
``perfsight.profile`` arguments by :meth:`CollectOptions.profile_kwargs` -- nowhere else.

Values follow seed 003 (``MS_PROFILER_OPTIONS`` / ``profiler_config.json``): readable names
(``"Level1"``, ``["CPU", "GPU"]``, ``["text", "db"]``) and the seed's integer codes
(``profiler_level: 1``, ``activities: 0``, ``export_type: 2``, ``analyse_mode: -1``).

It must not import torch: the launcher and ``perfsight trigger`` validate options without it.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Mapping
from typing import Any, TypeVar

from perfsight.collect.levels import ExperimentalConfig, ExportType, ProfilerActivity, ProfilerLevel

_E = TypeVar("_E", ProfilerActivity, ExportType)


class OptionError(ValueError):
    """An option a user wrote is wrong; the message names the key and the source."""

    def __init__(self, source: str, key: str, problem: str) -> None:
        self.source = source
        self.key = key
        self.problem = problem
        super().__init__(f"{source}: key {key!r}: {problem}")


class AnalyseMode(str, enum.Enum):
    """When a finished window is analysed: not at all (``perfsight analyse`` later), in the
    training process, or in a separate low-priority process (seed: analyse_mode -1/0/1)."""

    NONE = "none"
    SYNC = "sync"
    ASYNC = "async"


ACTIVITY_CODES = {0: ("CPU", "GPU"), 1: ("CPU",), 2: ("GPU",)}
"""The seed's integer codes for ``activities`` (NPU there, the machine's accelerator here)."""
EXPORT_CODES = {0: ("text",), 1: ("db",), 2: ("text", "db")}
ANALYSE_CODES = {-1: AnalyseMode.NONE, 0: AnalyseMode.SYNC, 1: AnalyseMode.ASYNC}

ASCEND_ONLY_KEYS = frozenset(
    {"aic_metrics", "aicore_metrics", "l2_cache", "mstx", "mstx_domain_include", "mstx_domain_exclude",
     "parallel_strategy", "host_sys", "sys_io", "sys_interconnection", "is_rank_all", "rank_list"}
)  # fmt: skip
"""Keys of the seed's Ascend formats that have no meaning on PyTorch/Kineto: accepted, ignored."""


@dataclasses.dataclass(frozen=True)
class CollectOptions:
    """What to record in a window and what to do with it; defaults are the seed's defaults."""

    profiler_level: ProfilerLevel = ProfilerLevel.Level0
    activities: tuple[ProfilerActivity, ...] | None = None  # None: CPU + the accelerator, if any
    profile_memory: bool = False
    record_shapes: bool = False
    with_stack: bool = False
    with_modules: bool = False
    export_type: tuple[ExportType, ...] = (ExportType.Text,)
    data_simplification: bool = True
    analyse_mode: AnalyseMode = AnalyseMode.NONE

    def profile_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for ``perfsight.profile`` (everything but schedule and handler)."""
        return {
            "activities": list(self.activities) if self.activities is not None else None,
            "profile_memory": self.profile_memory,
            "record_shapes": self.record_shapes,
            "with_stack": self.with_stack,
            "with_modules": self.with_modules,
            "experimental_config": ExperimentalConfig(
                profiler_level=self.profiler_level,
                export_type=self.export_type,
                data_simplification=self.data_simplification,
            ),
        }

    def to_json(self) -> dict[str, Any]:
        """The readable JSON form (what ``perfsight trigger`` and the default config write)."""
        return {
            "profiler_level": self.profiler_level.value,
            "activities": [a.value for a in self.activities] if self.activities is not None else None,
            "profile_memory": self.profile_memory,
            "record_shapes": self.record_shapes,
            "with_stack": self.with_stack,
            "with_modules": self.with_modules,
            "export_type": [e.value for e in self.export_type],
            "data_simplification": self.data_simplification,
            "analyse_mode": self.analyse_mode.value,
        }


SWITCH_KEYS = frozenset(f.name for f in dataclasses.fields(CollectOptions))


def parse_options(raw: Mapping[str, Any], source: str, base: CollectOptions | None = None) -> CollectOptions:
    """The switches in ``raw`` (other keys are the caller's business), over ``base`` or defaults.

    Raises :class:`OptionError` naming the first wrong key.
    """
    values = dataclasses.asdict(base or CollectOptions())
    for key in SWITCH_KEYS & raw.keys():
        values[key] = _PARSERS[key](raw[key], source, key)
    return CollectOptions(**values)


def int_value(raw: Mapping[str, Any], key: str, source: str, default: int, minimum: int) -> int:
    """An integer key (JSON numbers only; ``true`` is not 1), at least ``minimum``."""
    value = raw.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int):
        raise OptionError(source, key, f"must be an integer, got {value!r}")
    if value < minimum:
        raise OptionError(source, key, f"must be >= {minimum}, got {value}")
    return value


def bool_value(value: Any, source: str, key: str) -> bool:
    if not isinstance(value, bool):
        raise OptionError(source, key, f"must be true or false, got {value!r}")
    return value


def unknown_keys(raw: Mapping[str, Any], own_keys: frozenset[str] | set[str]) -> list[str]:
    """Keys that are neither switches, the caller's own, nor the seed's Ascend-only ones."""
    return sorted(k for k in raw if k not in SWITCH_KEYS and k not in own_keys and k not in ASCEND_ONLY_KEYS)


def _level(value: Any, source: str, key: str) -> ProfilerLevel:
    try:
        return ProfilerLevel.parse(value)
    except ValueError:
        raise OptionError(
            source, key, f"{value!r} is not one of Level0, Level1, Level2 (or 0, 1, 2)"
        ) from None


def _members(
    value: Any,
    source: str,
    key: str,
    enum_type: type[_E],
    codes: Mapping[int, tuple[str, ...]],
    codes_text: str,
) -> tuple[_E, ...]:
    """A list of ``enum_type`` members given as names, one name, or one of the seed's integer
    ``codes`` (meaning ``codes_text``); duplicates dropped, order kept."""
    names = " or ".join(member.value for member in enum_type)
    if isinstance(value, int) and not isinstance(value, bool):
        if value not in codes:
            raise OptionError(source, key, f"code {value} is not {codes_text}")
        value = list(codes[value])
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not value:
        example = "[" + ", ".join(f'"{member.value}"' for member in enum_type) + "]"
        raise OptionError(source, key, f"must be a non-empty list such as {example}, got {value!r}")
    try:
        return tuple(dict.fromkeys(enum_type.parse(v) for v in value))
    except ValueError:
        raise OptionError(source, key, f"{value!r}: each entry must be {names}") from None


def _activities(value: Any, source: str, key: str) -> tuple[ProfilerActivity, ...] | None:
    if value is None:
        return None
    return _members(value, source, key, ProfilerActivity, ACTIVITY_CODES, "0 (CPU+GPU), 1 (CPU) or 2 (GPU)")


def _export_type(value: Any, source: str, key: str) -> tuple[ExportType, ...]:
    return _members(value, source, key, ExportType, EXPORT_CODES, "0 (text), 1 (db) or 2 (text and db)")


def _analyse_mode(value: Any, source: str, key: str) -> AnalyseMode:
    if isinstance(value, int) and not isinstance(value, bool) and value in ANALYSE_CODES:
        return ANALYSE_CODES[value]
    if isinstance(value, str) and value.strip().lower() in {m.value for m in AnalyseMode}:
        return AnalyseMode(value.strip().lower())
    raise OptionError(source, key, f"{value!r} is not none, sync or async (or -1, 0, 1)")


_PARSERS = {
    "profiler_level": _level,
    "activities": _activities,
    "profile_memory": bool_value,
    "record_shapes": bool_value,
    "with_stack": bool_value,
    "with_modules": bool_value,
    "export_type": _export_type,
    "data_simplification": bool_value,
    "analyse_mode": _analyse_mode,
}
