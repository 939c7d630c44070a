"""Executors: where the per-rank step of a cluster analysis runs.

An executor maps one picklable function over the rank inputs and returns the results in input
order.  ``local`` (processes on this machine, the default) and ``dask`` (a Dask distributed
cluster) run the same function, so they give the same results; the cross-rank step always runs
in the calling process.  Executors hold no analysis logic.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol, TypeVar

T = TypeVar("T")
R = TypeVar("R")


class Executor(Protocol):
    """Runs ``fn(item, *args)`` for every item; results in the order of ``items``."""

    name: str

    def map(self, fn: Callable[..., R], items: Sequence[Any], *args: Any) -> list[R]: ...

    def close(self) -> None: ...


class ExecutorError(ValueError):
    """The executor named on the command line cannot be used; the message says why."""


def make_executor(spec: str | None, workers: int | None = None) -> Executor:
    """``None``/``"local"``: worker processes here; ``"serial"``: this process;
    ``"dask-local"``: a Dask LocalCluster started here; ``"dask://HOST:PORT"`` (or ``tcp://``):
    an existing Dask scheduler."""
    spec = (spec or "local").strip()
    if spec in {"local", "processes"}:
        from perfsight.engine.local import LocalExecutor

        return LocalExecutor(workers)
    if spec == "serial":
        from perfsight.engine.local import SerialExecutor

        return SerialExecutor()
    if spec == "dask-local" or spec.startswith(("dask://", "tcp://")):
        from perfsight.engine.dask import DaskExecutor

        return DaskExecutor(spec, workers)
    raise ExecutorError(f"unknown executor {spec!r}; use local, serial, dask-local or dask://HOST:PORT")
