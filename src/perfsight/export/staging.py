"""Write output folders so that each is either complete or absent, never half-written.

An analysis that fails, or is stopped with Ctrl-C, used to leave ``PROFILER_OUTPUT/`` with some
CSVs and a cut ``trace_view.json``, and a ``cache/`` the server then served as if whole.  Here
the writers fill a hidden staging folder beside the outputs (``.perfsight-partial-<id>/``,
which trace discovery and the server both skip), and only when every writer has finished is
each output folder renamed into place, replacing the one an earlier analysis left.  On any
failure the staging folder is deleted and the earlier outputs stay as they were.

A rename within one folder is atomic, so a reader sees the old folder or the new one.  Between
the renames of two folders (``PROFILER_OUTPUT`` then ``cache``) a reader may see the new one
beside the old other; both are complete.  A process killed outright (SIGKILL, power loss) can
leave a hidden staging folder behind, never a partial output folder.

This module knows nothing about what the files are.
"""

from __future__ import annotations

import contextlib
import os
import queue
import shutil
import threading
import uuid
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")

STAGING_PREFIX = ".perfsight-partial-"


@contextlib.contextmanager
def staged(folder: Path, names: tuple[str, ...]) -> Iterator[Path]:
    """A fresh staging folder inside ``folder``: write ``<stage>/<name>/...`` for each of
    ``names``; when the block ends normally each ``<stage>/<name>`` replaces ``folder/<name>``.

    Folders that this call had to create (``folder`` and missing parents) are removed again
    when the block fails and they are still empty.
    """
    created = _missing_ancestors(folder)
    stage = folder / f"{STAGING_PREFIX}{uuid.uuid4().hex[:12]}"
    try:  # from the first mkdir: a Ctrl-C landing just after it must clean up too
        folder.mkdir(parents=True, exist_ok=True)
        stage.mkdir()
        yield stage
        for name in names:
            if (stage / name).exists():
                _replace(stage / name, folder / name)
    except BaseException:
        _remove(stage)
        for path in created:  # deepest first
            with contextlib.suppress(OSError):
                path.rmdir()  # only when empty
        raise
    _remove(stage)


def remove_folder(path: Path) -> None:
    """Delete a scratch folder (a spill) completely, even when a Ctrl-C lands during it."""
    _remove(path)


def _remove(path: Path) -> None:
    """Delete ``path`` (a folder tree or a file), finishing even when a Ctrl-C lands during it
    (the interrupt is raised once it is gone).

    Why: a Ctrl-C in the middle of deleting the emptied staging folder, or the earlier outputs
    moved aside, left that hidden folder behind after an otherwise clean stop."""
    interrupted: BaseException | None = None
    while True:
        try:
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path, ignore_errors=True)
            else:
                path.unlink(missing_ok=True)
            break
        except KeyboardInterrupt as exc:
            interrupted = exc
    if interrupted is not None:
        raise interrupted


class BackgroundWriter:
    """One writer thread beside the analysis: ``submit`` queues a write and returns its future.

    Why not a ``ThreadPoolExecutor``: with Ctrl-C landing at the wrong moment its thread escapes
    being waited for -- a ``KeyboardInterrupt`` inside ``submit`` (which starts the thread lazily,
    waiting for it to start) leaves a running thread the pool never joins, and one inside
    ``Thread.join`` on Python 3.11 marks the still-running thread as stopped.  Either way the
    writer went on writing into a staging folder already deleted (a hidden folder holding
    ``cache/dataloader.parquet`` was left once in CI).  Here the thread is started before any
    write is queued, ``submit`` only puts on a queue, and the end is awaited on an event that
    the thread sets as its very last act.
    """

    def __init__(self, name: str) -> None:
        self._queue: queue.SimpleQueue[tuple[Future[Any], Callable[..., Any], tuple[Any, ...]] | None] = (
            queue.SimpleQueue()
        )
        self._finished = threading.Event()
        self._cancelled = False
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def submit(self, fn: Callable[..., Any], /, *args: Any) -> Future[Any]:
        future: Future[Any] = Future()
        self._queue.put((future, fn, args))
        return future

    def _run(self) -> None:
        try:
            while (item := self._queue.get()) is not None:
                future, fn, args = item
                if self._cancelled or not future.set_running_or_notify_cancel():
                    continue
                try:
                    future.set_result(fn(*args))
                except BaseException as exc:  # handed to whoever waits on the future
                    future.set_exception(exc)
        finally:
            self._finished.set()

    def start(self) -> None:
        self._thread.start()

    def stop(self, cancel: bool) -> None:
        """Let the thread finish the write under way (and, unless ``cancel``, those queued), then
        return; a Ctrl-C during the wait is raised once the thread has ended."""
        self._cancelled = cancel
        self._queue.put(None)
        if not self._thread.ident:  # never started: nothing ran
            return
        interrupted: BaseException | None = None
        while True:
            try:
                self._finished.wait()
                break
            except KeyboardInterrupt as exc:
                interrupted = exc
        if interrupted is not None:
            raise interrupted


def run_shared(
    background: BackgroundWriter, tasks: list[Callable[[], Any]], costs: Sequence[float] | None = None
) -> None:
    """Run every one of ``tasks`` (in no promised order) on this thread and on ``background``'s,
    whichever is free, and return once all are done; raise what the first failed one raised.

    Why: the writers of a rank take 5-50 ms each and their costs change with the trace (a trace
    with no kernels has a tiny ``kernel_details.csv``, one with many allocations a large
    ``memory_record.csv``), so no fixed split between two threads keeps both busy.  All are
    queued on ``background`` (which takes them from the front, after what it already had); this
    thread takes back, from the end, each one the writer has not started.  A task that must follow
    another waits for it itself (a future's ``result()``); nothing here orders them.

    ``costs`` (one rough estimate per task, any unit): the tasks are queued largest first from
    both ends, so the two threads meet on the smallest.  Why: in the order given, two 30 ms CSV
    writers met in the middle of df_index_resolver's list, and one thread wrote the last of them
    alone while the other had finished (25 ms of a 0.6 s analysis).
    """
    if costs is not None:
        tasks = _balanced_order(tasks, costs)
    futures = [background.submit(task) for task in tasks]
    for task, future in zip(reversed(tasks), reversed(futures), strict=True):
        if future.cancel():  # not started by the writer thread: run it here
            task()
    for future in futures:
        if not future.cancelled():
            future.result()  # raises what the writer thread raised


def _balanced_order(tasks: list[T], costs: Sequence[float]) -> list[T]:
    """``tasks`` by decreasing cost at the front and, taken from the end, at the back: the largest
    ones are started first by whichever thread takes them, the smallest are left for the end."""
    largest_first = [tasks[i] for i in sorted(range(len(tasks)), key=lambda i: -costs[i])]
    return largest_first[0::2] + largest_first[1::2][::-1]


@contextlib.contextmanager
def background_writer(name: str) -> Iterator[BackgroundWriter]:
    """A :class:`BackgroundWriter` for writers into a staging folder, stopped before the block is
    left: every write is waited for, a Ctrl-C during the wait included (it is raised once the
    writer has stopped); on failure, writes not yet started are cancelled."""
    writer = BackgroundWriter(name)
    try:
        writer.start()
    except BaseException:  # a Ctrl-C while the thread starts: it may run; nothing is queued
        writer.stop(cancel=True)
        raise
    failed = True
    try:
        yield writer
        failed = False
    finally:
        writer.stop(cancel=failed)


def _missing_ancestors(folder: Path) -> list[Path]:
    """``folder`` and its parents that do not exist yet, deepest first."""
    missing = []
    path = folder.absolute()
    while not path.exists() and path != path.parent:
        missing.append(path)
        path = path.parent
    return missing


def _replace(new: Path, target: Path) -> None:
    """Put ``new`` at ``target``; an existing ``target`` is moved aside first and deleted after."""
    old = None
    if target.exists() or target.is_symlink():
        old = target.with_name(f"{STAGING_PREFIX}old-{uuid.uuid4().hex[:12]}")
        os.replace(target, old)
    os.replace(new, target)
    if old is not None:
        _remove(old)
