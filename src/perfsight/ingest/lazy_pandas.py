"""Keep pandas out of the process until someone really uses it.

pyarrow 26 imports pandas the first time any Python or NumPy data is converted (``pa.array``,
``pa.scalar``, a compute function given a Python number), only to ask whether the input is a
pandas object.  perfsight converts NumPy arrays all the time and never needs pandas to read,
analyse or write a trace, yet that probe costs about 0.4 s of CPU and 32 MB of resident memory
per process -- a fifth of the peak of a typical single-rank analysis (docs/BENCHMARKS.md).

Inside :func:`pandas_deferred`, ``import pandas`` fails: pyarrow's Python side probes once and
records "no pandas"; its C++ side (converting Python values) tries the import on each
conversion, fails at the first import finder (microseconds) and goes on without it.  Nothing is
lost afterwards: every pyarrow function that needs pandas (``to_pandas``, ``Table.from_pandas``,
...) imports it again on its own, and when pandas is imported later by anyone, a one-shot import
hook tells pyarrow right away, so that converting a pandas object with ``pa.array`` behaves
exactly as it would have.  When pandas is already imported (a notebook), nothing changes.
"""

from __future__ import annotations

import contextlib
import importlib.abc
import importlib.machinery
import sys
from collections.abc import Iterator
from types import ModuleType

import pyarrow as pa

_ACTIVE: list[object] = []  # the blocker while a deferred region runs
_HOOKED: list[bool] = []  # the one-shot import hook is installed


class _NoPandas(importlib.abc.MetaPathFinder):
    """Makes ``import pandas`` fail, for the moment pyarrow probes for it."""

    def find_spec(self, name: str, path: object = None, target: object = None) -> None:
        if name == "pandas" or name.startswith("pandas."):
            raise ModuleNotFoundError("pandas deferred by perfsight", name=name)
        return None


class _TellPyarrowWhenImported(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """On the first later ``import pandas``: import it as usual, then let pyarrow know."""

    def __init__(self) -> None:
        self._spec: importlib.machinery.ModuleSpec | None = None

    def find_spec(
        self, name: str, path: object = None, target: object = None
    ) -> importlib.machinery.ModuleSpec | None:
        # one shot; it stays listed: removing it during the import's own lookup would skip a finder
        if name != "pandas" or self._spec is not None or "pandas" in sys.modules:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return spec
        self._spec = spec
        wrapped = importlib.machinery.ModuleSpec(name, self, origin=spec.origin, is_package=True)
        wrapped.submodule_search_locations = spec.submodule_search_locations
        wrapped.has_location = spec.has_location
        wrapped.cached = spec.cached
        return wrapped

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        assert self._spec is not None and self._spec.loader is not None
        return self._spec.loader.create_module(self._spec)

    def exec_module(self, module: ModuleType) -> None:
        assert self._spec is not None and self._spec.loader is not None
        module.__spec__ = self._spec
        module.__loader__ = self._spec.loader
        self._spec.loader.exec_module(module)
        _tell_pyarrow()


def _tell_pyarrow() -> None:
    """pyarrow re-imports pandas (now in ``sys.modules``) and uses it from here on."""
    with contextlib.suppress(ImportError, AttributeError):
        pa.lib._pandas_api.pd  # noqa: B018  (the property's side effect is the point)


@contextlib.contextmanager
def pandas_deferred() -> Iterator[None]:
    """While inside, pandas cannot be imported and pyarrow knows it (see the module docstring).

    For a process's own single-rank work only (the CLI's and ``perfsight.analyse``'s reading,
    analyses and writers, none of which uses pandas): another thread importing pandas meanwhile
    would get an ImportError.  A no-op where pandas is already imported; re-entrant.
    """
    if "pandas" in sys.modules or _ACTIVE:
        yield
        return
    blocker = _NoPandas()
    sys.meta_path.insert(0, blocker)
    _ACTIVE.append(blocker)
    try:
        with contextlib.suppress(Exception):  # an unexpected pyarrow: the blocker still keeps pandas out
            pa.lib._pandas_api.have_pandas  # noqa: B018  (the probe, answered "no" once and for all)
        yield
    finally:
        _ACTIVE.remove(blocker)
        sys.meta_path.remove(blocker)
        if not _HOOKED:
            _HOOKED.append(True)
            sys.meta_path.insert(0, _TellPyarrowWhenImported())
