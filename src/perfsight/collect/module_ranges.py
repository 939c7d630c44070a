"""Record every ``nn.Module`` forward as a profiler range, cheaply: ``with_modules=True`` for eager jobs.

Why: torch's own ``with_modules`` only names modules through the Python tracer (``with_stack=True``,
which records every Python call and costs far more than the ops), or for TorchScript.  The
parallel-strategy view and the module table (issue 18) need each op's ``nn.Module`` and nothing
else, so with ``with_modules=True`` and no Python tracer this capture adds two global module hooks
(``torch.nn.modules.module.register_module_forward_pre_hook`` / ``..._forward_hook``) that open a
``record_function`` range ``nn.Module: <path> (<Class>)`` around each module's forward while a
window records -- the same kind of ``user_annotation`` range ``perfsight.range`` writes, one pair
of hook calls per module call.  ``<path>`` is the module's dotted name under the outermost module
that was called (``Sequential.0 (Linear)``; the outermost is its class name alone), so two layers of
one class stay apart.  Kineto's own ``nn.Module: Linear_0`` events (``with_stack=True``) are read
the same way by ``perfsight.analysis.module_ops``, so this capture stays off when the tracer is on.

What it must not do: change what a module computes or returns (the hooks return ``None``), or
raise into the training step (the profiler's Guard wraps install/close; a hook that fails only
loses its range).  A forward that raises still closes its range (the exit hook is ``always_call``),
so the ranges after it nest right.  Backward passes are not module calls and get no range.
"""

from __future__ import annotations

import threading
import weakref
from typing import Any

import torch
from torch.nn.modules import module as nn_module

PREFIX = "nn.Module: "
"""The range name's prefix, as Kineto's Python tracer writes it."""


def _range_ops() -> tuple[Any, Any]:
    """Open / close a ``user_annotation`` range, the cheapest way this torch offers: the resolved
    tensor-handle ops (about 6 us a range here), where ``record_function``'s script-object exit
    costs about 20 us on a busy CPU; the script-object pair where the older ops are gone.
    (``torch._C._profiler._RecordFunctionFast`` is cheaper still but records a ``cpu_op``, which
    the analyses would take for an operator.)"""
    ops = torch.ops.profiler
    try:
        return ops._record_function_enter.default, ops._record_function_exit.default
    except (AttributeError, RuntimeError):
        return ops._record_function_enter_new.default, ops._record_function_exit._RecordFunction


_OPEN, _CLOSE = _range_ops()


class ModuleRanges:
    """The capture object (``perfsight.collect.capture`` contract); writes no sidecar."""

    name = "modules"

    def __init__(self) -> None:
        self._handles: list[Any] = []
        self._recording = False
        self._local = threading.local()
        self._paths: weakref.WeakKeyDictionary[torch.nn.Module, str] = weakref.WeakKeyDictionary()

    def install(self) -> None:
        if not self._handles:
            self._handles = [
                nn_module.register_module_forward_pre_hook(self._enter),
                nn_module.register_module_forward_hook(self._exit, always_call=True),  # on a raise too
            ]

    def start(self) -> None:
        self.install()
        self._recording = True

    def stop(self) -> None:
        self._recording = False
        return None

    def close(self) -> None:
        self._recording = False
        for handle in self._handles:
            handle.remove()
        self._handles = []

    def _stack(self) -> list[tuple[int, Any]]:
        stack = getattr(self._local, "stack", None)
        if stack is None:
            stack = self._local.stack = []
        return stack

    def _label(self, module: torch.nn.Module, outermost: bool) -> str:
        path = self._paths.get(module)
        if path is None:
            if outermost:  # name the whole tree once, from the module the user called
                root = type(module).__name__
                for sub, mod in module.named_modules(prefix=root, remove_duplicate=False):
                    self._paths.setdefault(mod, sub if mod is module else f"{sub} ({type(mod).__name__})")
                path = self._paths.get(module, root)
            else:
                path = type(module).__name__
        return PREFIX + path

    def _enter(self, module: torch.nn.Module, _inputs: Any) -> None:
        if not self._recording:
            return
        try:
            stack = self._stack()
            stack.append((id(module), _OPEN(self._label(module, not stack), None)))
        except Exception:  # noqa: BLE001 - a lost range, never a failed forward
            pass

    def _exit(self, module: torch.nn.Module, _inputs: Any, _output: Any) -> None:
        stack = getattr(self._local, "stack", None)
        if not stack:
            return
        try:
            key = id(module)
            while stack:  # a range left open (a hook that failed to close it) is dropped, ours closed
                owner, handle = stack.pop()
                if owner == key:
                    _CLOSE(handle)
                    return
        except Exception:  # noqa: BLE001
            pass


def create_capture(_context: Any) -> ModuleRanges:
    return ModuleRanges()
