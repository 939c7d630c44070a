"""Run one computation on a thread beside the caller's, for a reader whose steps are independent.

Why: after the last batch is read, building the trace model is one thread's work while the
machine's other core idles; NumPy's sorts and searches (most of a slice's nesting depth) run
without the GIL, so a step that nothing else waits for can run beside the next ones.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from typing import Any, Generic, TypeVar

T = TypeVar("T")


class _Job(Generic[T]):
    def __init__(self, fn: Callable[..., T], args: tuple[Any, ...], name: str) -> None:
        self._fn, self._args = fn, args
        self._value: T | None = None
        self._error: BaseException | None = None
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            self._value = self._fn(*self._args)
        except BaseException as exc:  # noqa: BLE001 - handed to the caller, which re-raises it
            self._error = exc
        finally:
            self._done.set()  # the thread's last act: waiting on it is waiting for the thread

    def wait(self) -> None:
        self._done.wait()  # interruptible (a Ctrl-C), where a join may leave the thread marked ended
        self._thread.join()  # its last act is done: returns at once

    def result(self) -> T:
        self.wait()
        if self._error is not None:
            raise self._error
        return self._value  # type: ignore[return-value]


@contextlib.contextmanager
def beside(fn: Callable[..., T], *args: Any, name: str, thread: bool = True) -> Iterator[Callable[[], T]]:
    """Start ``fn(*args)`` on a thread named ``name``; the block gets a function that waits for
    its result (or raises its error).  Leaving the block waits for the thread in any case, so
    none outlives it.  ``thread`` False runs ``fn`` at once on the caller's thread instead (where
    the work is too small to pay for a thread)."""
    if not thread:
        value = fn(*args)
        yield lambda: value
        return
    job = _Job(fn, args, name)
    try:
        yield job.result
    finally:
        job.wait()
