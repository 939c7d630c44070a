"""perfsight: a performance profiler and analysis workbench for deep-learning training.

``perfsight.analyse(path)`` analyses traces and writes MindSpore-style outputs;
``perfsight.load(path)`` returns the same tables in memory for notebooks.
Heavy modules load on first use, so ``import perfsight`` stays cheap inside a
training process.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

if TYPE_CHECKING:
    from perfsight.api import Analysis, analyse, load

__all__ = ["Analysis", "__version__", "analyse", "load"]


def __getattr__(name: str) -> Any:
    if name in {"analyse", "load", "Analysis"}:
        from perfsight import api

        return getattr(api, name)
    raise AttributeError(f"module 'perfsight' has no attribute {name!r}")
