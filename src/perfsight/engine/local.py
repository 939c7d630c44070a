"""Run the per-rank step in worker processes on this machine (the default), or serially.

Why processes: reading and analysing a trace is CPU-bound Python/Arrow work; threads would share
one interpreter lock.  On Linux workers are forked (they start at once, with perfsight already
imported, and work from a notebook or ``python -`` whose main module cannot be re-imported;
Arrow re-creates its thread pools after a fork); elsewhere they are spawned.  Workers are reused
for every rank.  With one input, or one core, no pool is started at all.
"""

from __future__ import annotations

import multiprocessing
import os
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from functools import partial
from typing import Any, TypeVar

R = TypeVar("R")


def default_workers() -> int:
    """One worker per core this process may use."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        return max(1, os.cpu_count() or 1)


class SerialExecutor:
    """Everything in this process: for one rank, debugging, and as the reference result."""

    name = "serial"

    def map(self, fn: Callable[..., R], items: Sequence[Any], *args: Any) -> list[R]:
        return [fn(item, *args) for item in items]

    def close(self) -> None:
        pass


class LocalExecutor:
    """A pool of worker processes, one per core by default."""

    name = "local"

    def __init__(self, workers: int | None = None) -> None:
        self.workers = workers or default_workers()

    def map(self, fn: Callable[..., R], items: Sequence[Any], *args: Any) -> list[R]:
        workers = min(self.workers, len(items))
        if workers <= 1:
            return SerialExecutor().map(fn, items, *args)
        # a few items per message: fewer round trips for a thousand small ranks, still balanced
        chunk = max(1, min(16, len(items) // (workers * 8)))
        method = "fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn"
        context = multiprocessing.get_context(method)
        with ProcessPoolExecutor(max_workers=workers, mp_context=context) as pool:
            return list(pool.map(partial(_call, fn, args), items, chunksize=chunk))

    def close(self) -> None:
        pass


def _call(fn: Callable[..., R], args: tuple[Any, ...], item: Any) -> R:
    return fn(item, *args)
