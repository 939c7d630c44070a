"""Profile an unmodified training script: ``PERFSIGHT_PROFILER_OPTIONS`` (seed 003, "方式三").

How it turns on: ``perfsight run`` puts ``perfsight/collect/_site`` first on ``PYTHONPATH``; its
``sitecustomize.py`` (run by Python at start-up, in every process of the job, torchrun's workers
included) calls :func:`install`.  Without the variable, or with ``"start": false``, nothing
happens.  ``install`` imports nothing heavy: it waits for ``torch.optim.optimizer`` to be
imported by the script, then registers one global optimizer post-step hook
(``torch.optim.optimizer.register_optimizer_step_post_hook``).

Steps are the optimizer's steps: step N ends when ``optimizer.step()`` returns for the N-th time
(only the first optimizer the process steps is counted, so GAN-style loops with two optimizers
still count training steps).  Steps ``start_step..stop_step`` are recorded (``start_step >= 2``:
step 1 starts before anything shows that the script trains); each rank writes its own run folder
under ``output_path``.  The hook removes itself once the window is written.

Safety: invalid options print one line naming the key on stderr and the script runs unprofiled;
any failure later turns profiling off (``collect/safety.py``).  A window still open when the
process exits (training shorter than ``stop_step``) is written at exit, marked incomplete.
"""

from __future__ import annotations

import atexit
import dataclasses
import importlib.abc
import importlib.machinery
import json
import logging
import os
import sys
import weakref
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from perfsight.collect.options import CollectOptions, OptionError, int_value, parse_options, unknown_keys

log = logging.getLogger("perfsight.collect")

ENV_VAR = "PERFSIGHT_PROFILER_OPTIONS"
OWN_KEYS = frozenset({"start", "output_path", "start_step", "stop_step"})
DEFAULT_OUTPUT = "./perfsight_data"
DEFAULT_START_STEP = 2
DEFAULT_STEPS = 5
HOOKED_MODULE = "torch.optim.optimizer"


@dataclasses.dataclass(frozen=True)
class AutostartOptions:
    """``PERFSIGHT_PROFILER_OPTIONS`` once validated."""

    output_path: Path
    start_step: int
    stop_step: int
    options: CollectOptions

    def to_json(self) -> dict[str, Any]:
        return {
            "start": True,
            "output_path": str(self.output_path),
            "start_step": self.start_step,
            "stop_step": self.stop_step,
            **self.options.to_json(),
        }


def parse_env(text: str, source: str = ENV_VAR) -> AutostartOptions | None:
    """The options in ``text`` (JSON), or ``None`` when ``start`` is not true.

    Raises :class:`OptionError` naming the key; unknown keys are errors too, so that a typo such
    as ``stop_stpe`` does not silently profile the wrong steps.
    """
    try:
        doc = json.loads(text)
    except ValueError as exc:
        raise OptionError(source, "(whole value)", f"not valid JSON ({exc})") from None
    if not isinstance(doc, Mapping):
        raise OptionError(source, "(whole value)", f"must be a JSON object, got {type(doc).__name__}")
    return parse_mapping(doc, source)


def parse_mapping(doc: Mapping[str, Any], source: str = ENV_VAR) -> AutostartOptions | None:
    """As :func:`parse_env`, for options already parsed from JSON (``perfsight run`` flags)."""
    unknown = unknown_keys(doc, OWN_KEYS)
    if unknown:
        raise OptionError(source, unknown[0], "is not a perfsight option (see docs/COLLECTION.md)")
    start = doc.get("start", False)
    if not isinstance(start, bool):
        raise OptionError(source, "start", f"must be true or false, got {start!r}")
    output = doc.get("output_path", DEFAULT_OUTPUT)
    if not isinstance(output, str) or not output.strip():
        raise OptionError(source, "output_path", f"must be a non-empty path, got {output!r}")
    first = int_value(doc, "start_step", source, default=DEFAULT_START_STEP, minimum=1)
    if first < 2:
        raise OptionError(
            source,
            "start_step",
            "must be >= 2: steps are counted by optimizer.step(), and step 1 starts before the "
            "first one shows that the script trains",
        )
    last = int_value(doc, "stop_step", source, default=first + DEFAULT_STEPS - 1, minimum=1)
    if last < first:
        raise OptionError(source, "stop_step", f"{last} is before start_step {first}")
    options = parse_options(doc, source)
    if not start:
        return None
    return AutostartOptions(Path(output).expanduser(), first, last, options)


class OptimizerStepProfiler:
    """Counts the optimizer's steps and records steps ``start_step..stop_step`` of this process."""

    def __init__(self, settings: AutostartOptions) -> None:
        from perfsight.collect.safety import Guard

        self.settings = settings
        self.guard = Guard()
        self.completed = 0
        self.range: Any = None  # perfsight.collect.step_range.StepRange, created at the first step
        self._optimizer: weakref.ref[Any] | None = None
        self._handle: Any = None
        self._pid = os.getpid()

    def attach(self, optimizer_module: Any) -> None:
        """Register the global post-step hook (``optimizer_module`` is ``torch.optim.optimizer``)."""
        self._handle = optimizer_module.register_optimizer_step_post_hook(self._after_step)
        atexit.register(self.close)

    def close(self) -> None:
        """Write an open window (training ended before ``stop_step``) and unhook."""
        if os.getpid() != self._pid:
            return  # a forked child (data-loader worker) does not own the window
        if self.range is not None and not self.range.finished:
            self.guard.call("writing the profiling window at exit", self.range.close)
        self._detach()

    def _after_step(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        counted = self._optimizer() if self._optimizer is not None else None
        if counted is None:
            self._optimizer = weakref.ref(optimizer)
        elif counted is not optimizer:
            return
        self.completed += 1
        self.guard.call(f"profiling ({ENV_VAR})", self._boundary)
        if self.guard.tripped or (self.range is not None and self.range.finished):
            self._detach()

    def _boundary(self) -> None:
        if self.range is None:
            from perfsight.collect.step_range import StepRange

            s = self.settings
            self.range = StepRange(s.start_step, s.stop_step, s.options, s.output_path)
        self.range.at_boundary(self.completed)

    def _detach(self) -> None:
        if self._handle is not None:
            self._handle.remove()
            self._handle = None


_active: OptimizerStepProfiler | None = None


def active() -> OptimizerStepProfiler | None:
    """The profiler :func:`install` set up in this process, if any."""
    return _active


def install(environ: Mapping[str, str] | None = None) -> OptimizerStepProfiler | None:
    """Read ``PERFSIGHT_PROFILER_OPTIONS`` and hook the optimizer once torch is imported.

    Never raises: a wrong value is reported on stderr (naming the key) and nothing is profiled.
    """
    global _active
    text = (os.environ if environ is None else environ).get(ENV_VAR, "")
    if not text.strip() or _active is not None:
        return _active
    try:
        settings = parse_env(text)
    except OptionError as exc:
        sys.stderr.write(f"perfsight: {exc}; this process runs without profiling\n")
        return None
    if settings is None:
        return None
    _active = OptimizerStepProfiler(settings)
    when_imported(HOOKED_MODULE, _active.attach)
    return _active


# ------------------------------------------------------------------- run code after an import


def when_imported(name: str, callback: Callable[[Any], None]) -> None:
    """Call ``callback(module)`` once module ``name`` has been imported (now, if it already is).

    Why not import it ourselves: importing torch at interpreter start-up would slow down every
    Python process of the job (the launcher, tools) and could change the order in which the
    script initialises things.
    """
    module = sys.modules.get(name)
    if module is not None:
        _notify(callback, module)
        return
    sys.meta_path.insert(0, _ImportWatcher(name, callback))


def _notify(callback: Callable[[Any], None], module: Any) -> None:
    try:
        callback(module)
    except Exception as exc:  # noqa: BLE001 - the training script must import normally
        sys.stderr.write(f"perfsight: cannot hook {module.__name__} ({exc}); not profiling\n")


class _ImportWatcher(importlib.abc.MetaPathFinder):
    """Finds ``name`` with the other finders and wraps its loader to call back after it ran."""

    def __init__(self, name: str, callback: Callable[[Any], None]) -> None:
        self.name = name
        self.callback = callback

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname != self.name:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                break
        else:
            return None
        if spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        spec.loader = _NotifyingLoader(spec.loader, self)
        return spec

    def loaded(self, module: Any) -> None:
        if self in sys.meta_path:
            sys.meta_path.remove(self)
        _notify(self.callback, module)


class _NotifyingLoader(importlib.abc.Loader):
    def __init__(self, loader: Any, watcher: _ImportWatcher) -> None:
        self.loader = loader
        self.watcher = watcher

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> Any:
        return self.loader.create_module(spec)

    def exec_module(self, module: Any) -> None:
        self.loader.exec_module(module)
        self.watcher.loaded(module)

    def __getattr__(self, attribute: str) -> Any:  # get_source, get_filename, ... for tracebacks
        return getattr(self.loader, attribute)
