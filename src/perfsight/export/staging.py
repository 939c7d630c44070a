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
import shutil
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

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


@contextlib.contextmanager
def background_writer(name: str) -> Iterator[ThreadPoolExecutor]:
    """A one-thread executor for writers into a staging folder, stopped before the block is left.

    Why: a Ctrl-C that lands while the main thread waits for the writer used to leave the
    writer running, so it went on writing into a staging folder already deleted (re-creating
    it).  Here the thread is always waited for, a Ctrl-C during the wait included (it is raised
    once the writer has stopped); writes not yet started are cancelled.
    """
    pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix=name)
    interrupted: BaseException | None = None
    try:
        yield pool
    finally:
        while True:
            try:
                pool.shutdown(wait=True, cancel_futures=True)
                break
            except KeyboardInterrupt as exc:
                interrupted = exc
        if interrupted is not None:
            raise interrupted


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
