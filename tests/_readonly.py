"""Run a test on a read-only copy of real input, and prove that reading it wrote nothing beside it.

A profiler's output folder may sit on a read-only mount, and a reader must never leave files next to
its input (SQLite's ``-wal`` / ``-shm``, caches).  :func:`read_only_copy` copies the input into the
test's ``tmp_path`` and makes the copy read-only: ``chmod -R a-w`` always, and where this machine lets
the test mount (root in a container that allows it) a read-only bind mount on top, because chmod does
not stop root.  On leaving it asserts that the folder holds the same files with the same bytes as
before; without the mount that check is what catches a write made as root.
"""

from __future__ import annotations

import contextlib
import hashlib
import shutil
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

from shared_data import require


def snapshot(folder: Path) -> dict[str, str]:
    """Every file under ``folder`` (relative path) with the SHA-256 of its bytes."""
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


def _chmod_tree(folder: Path, writable: bool) -> None:
    for path in [folder, *folder.rglob("*")]:
        mode = path.stat().st_mode
        path.chmod(mode | 0o200 if writable else mode & ~0o222)


def _bind_read_only(source: Path, target: Path) -> bool:
    """Mount ``source`` read-only at ``target``; False where mounting is not permitted."""
    target.mkdir(parents=True)
    for command in (["mount", "--bind", str(source), str(target)],
                    ["mount", "-o", "remount,ro,bind", str(target)]):  # fmt: skip
        try:
            done = subprocess.run(command, capture_output=True, timeout=30, check=False)
        except (OSError, subprocess.TimeoutExpired):
            return False
        if done.returncode != 0:
            subprocess.run(["umount", str(target)], capture_output=True, timeout=30, check=False)
            return False
    return True


@contextlib.contextmanager
def read_only_copy(source: Path, tmp_path: Path) -> Iterator[Path]:
    """A read-only copy of folder ``source`` (named like it); asserts on exit that it is unchanged."""
    require(source)
    copy = tmp_path / "input" / source.name
    shutil.copytree(source, copy)
    _chmod_tree(copy, writable=False)
    before = snapshot(copy)
    mounted = tmp_path / "read_only" / source.name
    is_mounted = _bind_read_only(copy, mounted)
    try:
        yield mounted if is_mounted else copy
    finally:
        if is_mounted:  # lazily: a file a failed reader left open must not keep the mount
            subprocess.run(["umount", "-l", str(mounted)], capture_output=True, timeout=30, check=False)
        after = snapshot(copy)
        _chmod_tree(copy, writable=True)  # so that pytest can remove tmp_path
    assert after == before, f"reading {source.name} changed its folder: {sorted(set(after) ^ set(before))}"


@contextlib.contextmanager
def read_only_copies(tmp_path: Path) -> Iterator[Callable[[Path], Path]]:
    """A function that makes a :func:`read_only_copy` of a folder; every copy is checked on exit."""
    with contextlib.ExitStack() as stack:
        made: list[Path] = []

        def copy(source: Path) -> Path:
            made.append(source)
            return stack.enter_context(read_only_copy(source, tmp_path / f"copy{len(made)}"))

        yield copy
