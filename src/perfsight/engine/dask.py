"""Run the per-rank step on a Dask distributed cluster, for jobs one machine cannot handle.

``dask://HOST:PORT`` (or ``tcp://HOST:PORT``) connects to a running scheduler; ``dask-local``
starts a ``LocalCluster`` here (one worker process per core, one thread each; it and its
dashboard listen on 127.0.0.1 only).  The function and its results are the same as with the local
executor, so the cluster outputs are identical; only where the per-rank work runs changes.  Needs
the ``dask`` extra (``pip install 'perfsight[dask]'``).  The inputs must be readable from the
workers: a shared folder or an fsspec URL.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from perfsight.engine import ExecutorError

R = TypeVar("R")


class DaskExecutor:
    """Submits one task per rank input to a Dask cluster and gathers the results in order."""

    name = "dask"

    def __init__(self, spec: str, workers: int | None = None, cluster: Any = None) -> None:
        try:
            from distributed import Client, LocalCluster
        except ImportError as exc:
            raise ExecutorError(
                f"executor {spec!r} needs Dask: pip install 'perfsight[dask]' ({exc})"
            ) from None
        self._cluster = None
        if cluster is not None:
            self.client = Client(cluster)
        elif spec == "dask-local":
            from perfsight.engine.local import default_workers

            self._cluster = LocalCluster(
                n_workers=workers or default_workers(),
                threads_per_worker=1,
                host="127.0.0.1",
                dashboard_address="127.0.0.1:0",
            )
            self.client = Client(self._cluster)
        else:
            address = "tcp://" + spec.split("://", 1)[1]
            try:
                self.client = Client(address, timeout="10s")
            except OSError as exc:
                raise ExecutorError(f"cannot reach the Dask scheduler at {address}: {exc}") from None

    def map(self, fn: Callable[..., R], items: Sequence[Any], *args: Any) -> list[R]:
        if not items:
            return []
        futures = self.client.map(fn, list(items), *[[a] * len(items) for a in args], pure=False)
        return list(self.client.gather(futures))

    def close(self) -> None:
        self.client.close()
        if self._cluster is not None:
            self._cluster.close()
