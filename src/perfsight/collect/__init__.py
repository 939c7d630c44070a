"""Collection for PyTorch: ``profile``, ``schedule``, handlers, levels and user ranges.

Names resolve on first use so that ``import perfsight.collect`` (and ``import perfsight``) never
imports torch; modules that need torch (``profiler``, ``ranges``) load when asked for.
"""

from __future__ import annotations

import importlib
from typing import Any

# Eager (no torch): binding ``schedule`` here keeps the function, not the submodule of that name.
from perfsight.collect.levels import ExperimentalConfig, ExportType, ProfilerActivity, ProfilerLevel
from perfsight.collect.schedule import Schedule, schedule

_EXPORTS = {
    "profile": "perfsight.collect.profiler",
    "Window": "perfsight.collect.profiler",
    "range": "perfsight.collect.ranges",
    "tensorboard_trace_handler": "perfsight.collect.handlers",
    "TraceHandler": "perfsight.collect.handlers",
    "ProfilingDisabledWarning": "perfsight.collect.safety",
}

__all__ = [
    "ExperimentalConfig",
    "ExportType",
    "ProfilerActivity",
    "ProfilerLevel",
    "ProfilingDisabledWarning",
    "Schedule",
    "TraceHandler",
    "Window",
    "profile",
    "range",
    "schedule",
    "tensorboard_trace_handler",
]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'perfsight.collect' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
