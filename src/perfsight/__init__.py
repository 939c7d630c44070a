"""perfsight: a performance profiler and analysis workbench for deep-learning training.

``perfsight.analyse(path)`` analyses traces and writes MindSpore-style outputs;
``perfsight.load(path)`` returns the same tables in memory for notebooks;
``perfsight.profile(...)`` collects them from a PyTorch training job (a drop-in for
``torch.profiler.profile``).  Heavy modules load on first use, so ``import perfsight`` stays
cheap inside a training process and never imports torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

if TYPE_CHECKING:
    from perfsight.api import Analysis, analyse, load
    from perfsight.collect import (
        ExperimentalConfig,
        ExportType,
        ProfilerActivity,
        ProfilerLevel,
        profile,
        range,
        schedule,
        tensorboard_trace_handler,
    )
    from perfsight.collect.callbacks import PerfsightCallback, PerfsightLightningCallback
    from perfsight.collect.dynamic import DynamicProfilerMonitor

_LAZY: dict[str, str] = {
    # analysis
    "analyse": "perfsight.api",
    "load": "perfsight.api",
    "Analysis": "perfsight.api",
    # collection (perfsight.collect resolves each name on first use)
    "profile": "perfsight.collect",
    "schedule": "perfsight.collect",
    "tensorboard_trace_handler": "perfsight.collect",
    "ProfilerActivity": "perfsight.collect",
    "ProfilerLevel": "perfsight.collect",
    "ExportType": "perfsight.collect",
    "ExperimentalConfig": "perfsight.collect",
    "range": "perfsight.collect",
    "DynamicProfilerMonitor": "perfsight.collect.dynamic",
    "PerfsightCallback": "perfsight.collect.callbacks",
    "PerfsightLightningCallback": "perfsight.collect.callbacks",
}
"""Public name -> module that defines it; add a line here to export a new name lazily."""

__all__ = [
    "Analysis",
    "DynamicProfilerMonitor",
    "ExperimentalConfig",
    "ExportType",
    "PerfsightCallback",
    "PerfsightLightningCallback",
    "ProfilerActivity",
    "ProfilerLevel",
    "__version__",
    "analyse",
    "load",
    "profile",
    "range",
    "schedule",
    "tensorboard_trace_handler",
]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'perfsight' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
