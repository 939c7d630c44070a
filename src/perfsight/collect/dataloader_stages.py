"""Time the stages inside a data-loader fetch: each transform of a dataset's pipeline and the
``collate_fn``, and carry those times from a worker process back to the training process.

Why a module of its own: ``dataloader_capture`` decides *when* to record (the wrapped
``__next__`` / ``fetch``); this module knows *what a stage is* (a ``transform`` callable, each
element of a torchvision ``Compose`` / ``v2.Compose`` or any object with a ``transforms`` list) and
*how a worker's records travel* (one binary record per batch appended to the worker's own file,
stage names in a small text file beside it).  Nothing here may change what a stage returns, and
every wrapper must pickle (spawn / forkserver workers receive the dataset by pickling).

Stage names: ``transform`` for a plain callable, ``transform[1] RandomCrop`` for the second
element of a Compose held in ``dataset.transform``; the same with ``target_transform`` and
``transforms``.  ``collate`` is the ``collate_fn``.
"""

from __future__ import annotations

import array
import contextlib
import os
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

TRANSFORM_ATTRS = ("transform", "target_transform", "transforms")
COLLATE = "collate"

stage_ns: defaultdict[str, int] = defaultdict(int)
"""Nanoseconds per stage in the fetch that is running in this process (cleared per fetch)."""

_clock = time.perf_counter_ns


class Timed:
    """A transform or ``collate_fn`` that adds its run time to :data:`stage_ns` under ``slot``."""

    _perfsight_wrapper = True

    def __init__(self, function: Callable[..., Any], slot: str) -> None:
        self.function = function
        self.slot = slot

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        # the hot path (every sample x every transform): no try/finally, no .get -- a stage that
        # raises fails its batch, whose time is then not recorded anyway
        start = _clock()
        result = self.function(*args, **kwargs)
        stage_ns[self.slot] += _clock() - start
        return result

    def __getattr__(self, name: str) -> Any:  # behave like the wrapped callable otherwise
        if name == "function":  # not set yet (unpickling): no recursion
            raise AttributeError(name)
        return getattr(self.function, name)


def _pipeline_steps(function: Any) -> list | None:
    """The elements of a Compose-like pipeline (a list/tuple ``transforms`` of callables), else None."""
    steps = getattr(function, "transforms", None)
    if isinstance(steps, (list, tuple)) and steps and all(callable(s) for s in steps):
        return list(steps)
    return None


DETAIL_FIRST = 8
"""Per process, the first 8 fetches time each transform."""

CPU_EVERY = 8
"""After the first fetches, every 8th fetch reads its thread's CPU time (two system calls)."""

DETAIL_BUDGET = 0.005
TIMED_CALL_NS = 1000
"""After the first fetches, a fetch times each transform only while the estimated cost of timing
them so far (``TIMED_CALL_NS`` per timed call: measured 0.6-0.8 us on a loaded 2-core machine)
is within 0.5% of the process's fetch time: cheap transforms on small samples are timed on about
one fetch in 20, transforms of a millisecond on every fetch.  The other fetches time the whole
fetch and ``collate_fn`` only, and record the read and transform times as unknown."""


class StageSwitch:
    """The timed stand-ins for a dataset's transforms, put in place only for a detailed fetch.

    A Compose-like pipeline gets each element timed (its ``transforms`` attribute is replaced by a
    new list for the fetch: the user's list object is never mutated); any other callable is timed
    whole.  Between detailed fetches the user's own objects are in place, at no cost.
    """

    def __init__(self, dataset: Any) -> None:
        self.swaps: list[tuple[Any, str, Any, Any]] = []  # (owner, attribute, original, timed)
        self.timed_per_sample = 0  # transform calls timed per sample of a detailed fetch
        for attr in TRANSFORM_ATTRS:
            function = getattr(dataset, attr, None)
            if not callable(function) or isinstance(function, Timed):
                continue
            steps = _pipeline_steps(function)
            if steps is not None and not any(isinstance(s, Timed) for s in steps):
                container = list if isinstance(function.transforms, list) else tuple
                timed = container(Timed(s, f"{attr}[{i}] {type(s).__name__}") for i, s in enumerate(steps))
                self.swaps.append((function, "transforms", function.transforms, timed))
                self.timed_per_sample += len(timed)
            elif steps is None:
                self.swaps.append((dataset, attr, function, Timed(function, attr)))
                self.timed_per_sample += 1

    def on(self) -> None:
        for owner, attr, _, timed in self.swaps:
            setattr(owner, attr, timed)

    def off(self) -> None:
        for owner, attr, original, _ in reversed(self.swaps):
            with contextlib.suppress(Exception):  # an object that no longer takes attributes
                setattr(owner, attr, original)


def wrap_collate(fetcher: Any) -> None:
    """Time the fetcher's ``collate_fn`` (the fetcher belongs to one iterator, so no undo)."""
    if not isinstance(fetcher.collate_fn, Timed):
        fetcher.collate_fn = Timed(fetcher.collate_fn, COLLATE)


# ---------------------------------------------------------------- worker records

FETCH_FIELDS = (
    "worker",
    "pid",
    "start_ns",
    "end_ns",
    "read_ns",
    "transform_ns",
    "collate_ns",
    "samples",
    "cpu_ns",
)
"""The fixed part of a worker's record, in order; then the count of stages and (id, ns) pairs."""


LIVENESS_EVERY = 64
"""A worker checks every 64 records whether its file still exists (one ``fstat``)."""


class RecordWriter:
    """One worker's append-only record file (``worker-{pid}.bin``) and stage names (``.names``).

    One ``os.write`` per batch (no lock, nothing shared to corrupt); a stage name is written to
    the names file before the first record that uses it.
    """

    def __init__(self, folder: Path) -> None:
        pid = os.getpid()
        flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND
        self.pid = pid
        self._fd = os.open(folder / f"worker-{pid}.bin", flags, 0o600)
        self._names_fd = os.open(folder / f"worker-{pid}.names", flags, 0o600)
        self._ids: dict[str, int] = {}
        self._writes = 0

    def write(self, fixed: tuple[int, ...], stages: dict[str, int]) -> bool:
        """Append one record; False once the training process has removed the folder (profiling
        is over, but a persistent worker lives on): the caller stops recording in this worker."""
        self._writes += 1
        if self._writes % LIVENESS_EVERY == 0 and os.fstat(self._fd).st_nlink == 0:
            os.close(self._fd)
            os.close(self._names_fd)
            return False
        pairs: list[int] = []
        for name, ns in stages.items():
            if name not in self._ids:
                self._ids[name] = len(self._ids)
                os.write(self._names_fd, f"{self._ids[name]}\t{name}\n".encode())
            pairs += (self._ids[name], ns)
        values = (len(fixed) + 1 + len(pairs), *fixed, len(pairs) // 2, *pairs)
        os.write(self._fd, array.array("q", values).tobytes())
        return True


def read_records(path: Path, offset: int) -> tuple[list[tuple[tuple[int, ...], dict[str, int]]], int]:
    """The whole records of ``path`` from byte ``offset``: ``[(fixed, {stage: ns})]`` and the
    offset after the last whole record (a record being written is left for the next read)."""
    try:
        data = path.read_bytes()[offset:]
        names_text = path.with_suffix(".names").read_text()
    except OSError:
        return [], offset
    names = {}
    for line in names_text.splitlines():
        key, _, name = line.partition("\t")
        if key.isdigit():
            names[int(key)] = name
    values = array.array("q")
    values.frombytes(data[: len(data) - len(data) % 8])
    records, i, n_fixed = [], 0, len(FETCH_FIELDS)
    while i < len(values):
        length = values[i]
        if length < n_fixed + 1 or i + 1 + length > len(values):
            break
        fixed = tuple(values[i + 1 : i + 1 + n_fixed])
        count = values[i + 1 + n_fixed]
        pairs = values[i + 2 + n_fixed : i + 1 + length]
        stages = {names.get(pairs[2 * k], f"stage {pairs[2 * k]}"): pairs[2 * k + 1] for k in range(count)}
        records.append((fixed, stages))
        i += 1 + length
    return records, offset + 8 * i
