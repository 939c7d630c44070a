"""Training-framework callbacks that profile a step range: Hugging Face ``Trainer`` and Lightning.

Seed 001/003 ("CallBack方式"): the framework tells the callback where steps begin and end, the
callback starts and steps the profiler.  Both callbacks here do only that translation -- the
framework's global step (optimizer steps, counted from 1) to
:class:`~perfsight.collect.step_range.StepRange` -- so their windows are the same run folders,
with the same ``ProfilerStep#N`` numbering, as every other way of collecting.

Neither library is a perfsight dependency: the classes are created on first access
(``from perfsight.collect.callbacks import PerfsightCallback``), importing the library then.

    trainer = Trainer(..., callbacks=[PerfsightCallback(start_step=5, stop_step=7,
                                                        output_path="./perfsight_data")])
    trainer = lightning.Trainer(..., callbacks=[PerfsightLightningCallback(start_step=5, stop_step=7)])

A failure of perfsight's own is logged once and profiling stops; training goes on.
"""

from __future__ import annotations

import functools
import importlib
import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from perfsight.collect.options import CollectOptions, parse_options

LIGHTNING_PACKAGES = ("lightning.pytorch", "pytorch_lightning")


class StepRangeHooks:
    """Framework-independent part: steps ``start_step..stop_step`` (global steps, from 1).

    ``options`` is a :class:`CollectOptions` or a mapping of the same JSON keys as
    ``PERFSIGHT_PROFILER_OPTIONS`` (``{"profiler_level": "Level1", "profile_memory": true}``).
    """

    def __init__(
        self,
        start_step: int = 2,
        stop_step: int | None = None,
        output_path: str | os.PathLike[str] = "./perfsight_data",
        options: CollectOptions | Mapping[str, Any] | None = None,
    ) -> None:
        from perfsight.collect.safety import Guard

        stop_step = start_step if stop_step is None else stop_step
        for name, value in (("start_step", start_step), ("stop_step", stop_step)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{type(self).__name__}: {name} must be an integer >= 1, got {value!r}")
        if stop_step < start_step:
            raise ValueError(
                f"{type(self).__name__}: stop_step {stop_step} is before start_step {start_step}"
            )
        if isinstance(options, Mapping):
            options = parse_options(options, f"{type(self).__name__} options")
        self.start_step = start_step
        self.stop_step = stop_step
        self.output_path = Path(output_path)
        self.options = options or CollectOptions()
        self.guard = Guard()
        self.range: Any = None
        self._last_completed: int | None = None

    @property
    def folders(self) -> list[Path]:
        """Run folders written so far."""
        return self.range.folders if self.range is not None else []

    def at_global_step(self, completed: int) -> None:
        """The framework's global step is ``completed`` (called again with the same value under
        gradient accumulation: only changes count)."""
        if completed == self._last_completed or self.guard.tripped:
            return
        self._last_completed = completed
        self.guard.call("profiling from the training callback", self._advance, completed)

    def finish(self) -> None:
        """Training ended: write a window still open (marked incomplete)."""
        if self.range is not None and not self.range.finished:
            self.guard.call("writing the profiling window", self.range.close)

    def _advance(self, completed: int) -> None:
        if self.range is None:
            from perfsight.collect.step_range import StepRange

            self.range = StepRange(self.start_step, self.stop_step, self.options, self.output_path)
        self.range.at_boundary(completed)


@functools.cache
def huggingface_callback_class() -> type:
    """``PerfsightCallback``: a ``transformers.TrainerCallback`` (imports transformers)."""
    from transformers import TrainerCallback

    class PerfsightCallback(StepRangeHooks, TrainerCallback):
        """Profiles global steps ``start_step..stop_step`` of a Hugging Face ``Trainer``."""

        def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            self.at_global_step(state.global_step)

        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            self.at_global_step(state.global_step)

        def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            self.finish()

    PerfsightCallback.__qualname__ = PerfsightCallback.__name__
    return PerfsightCallback


@functools.cache
def lightning_callback_class(package: str | None = None) -> type:
    """``PerfsightLightningCallback`` for ``package`` (``"lightning.pytorch"`` or
    ``"pytorch_lightning"``; default: the one already imported, else the one installed)."""
    if package is None:
        package = next((p for p in LIGHTNING_PACKAGES if p in sys.modules), None)
    candidates = [package] if package else list(LIGHTNING_PACKAGES)
    module = None
    for name in candidates:
        try:
            module = importlib.import_module(name)
            break
        except ModuleNotFoundError:
            continue
    if module is None:
        raise ModuleNotFoundError("PerfsightLightningCallback needs `lightning` or `pytorch-lightning`")

    class PerfsightLightningCallback(StepRangeHooks, module.Callback):
        """Profiles global steps ``start_step..stop_step`` of a Lightning ``Trainer``."""

        def on_train_start(self, trainer: Any, pl_module: Any) -> None:
            self.at_global_step(trainer.global_step)

        def on_train_batch_end(
            self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, idx: int
        ) -> None:
            self.at_global_step(trainer.global_step)

        def on_train_end(self, trainer: Any, pl_module: Any) -> None:
            self.finish()

        def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
            self.finish()

    PerfsightLightningCallback.__qualname__ = PerfsightLightningCallback.__name__
    return PerfsightLightningCallback


def __getattr__(name: str) -> Any:
    if name == "PerfsightCallback":
        return huggingface_callback_class()
    if name == "PerfsightLightningCallback":
        return lightning_callback_class()
    raise AttributeError(f"module 'perfsight.collect.callbacks' has no attribute {name!r}")
