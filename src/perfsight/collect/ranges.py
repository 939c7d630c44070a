"""``perfsight.range``: a named user range, shown in the timeline and the analyses.

Why on ``torch.profiler.record_function``: Kineto records it as a ``user_annotation`` slice, the
reader makes it an ``annotation`` row of the trace model, and it costs nothing when no profiler
is running.  Usable as a context manager or a decorator.
"""

from __future__ import annotations

from typing import Any

import torch


class range(torch.profiler.record_function):  # noqa: A001,N801 - reads as ``perfsight.range("x")``
    """``with perfsight.range("load_batch"): ...`` or ``@perfsight.range("forward")``."""

    def __init__(self, name: str, args: str | None = None) -> None:
        if not isinstance(name, str) or not name:
            raise ValueError(f"perfsight.range: name must be a non-empty string, got {name!r}")
        super().__init__(name, args)

    def __call__(self, fn: Any) -> Any:
        import functools

        @functools.wraps(fn)
        def wrapped(*a: Any, **kw: Any) -> Any:
            with range(self.name, self.args):
                return fn(*a, **kw)

        return wrapped
