"""Compile ``_eventscan.c`` into the shared library :mod:`perfsight.ingest.eventscan` loads.

Standard library only: the install-time build hook (``hatch_build.py``) runs this file
by path, before perfsight is importable.  Failure is an answer, not an exception: the
reader then uses its portable path.
"""

from __future__ import annotations

import hashlib
import os
import shlex
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from collections.abc import Sequence
from pathlib import Path

HERE = Path(__file__).resolve().parent
SOURCE = HERE / "_eventscan.c"
LIBRARY = HERE / ("_eventscan.dll" if sys.platform == "win32" else "_eventscan.so")

FLAGS = ["-O2", "-shared", "-fPIC", "-fvisibility=default"]


def source_hash(source: Path = SOURCE) -> str:
    """What a library built from ``source`` reports; the loader compares it with the file."""
    return hashlib.sha256(source.read_bytes()).hexdigest()[:16]


def compiler() -> list[str] | None:
    """The C compiler command: $CC, then the one Python was built with, then cc/gcc/clang."""
    for candidate in (os.environ.get("CC"), sysconfig.get_config_var("CC"), "cc", "gcc", "clang"):
        if not candidate:
            continue
        command = shlex.split(candidate)
        if command and shutil.which(command[0]):
            return command
    return None


def build(target: Path = LIBRARY, source: Path = SOURCE, defines: Sequence[str] = ()) -> str | None:
    """Build ``target`` from ``source``; None on success, else one line saying why not.
    ``defines``: preprocessor macros (the tests build ``ES_NO_SIMD``, the portable byte loops)."""
    if sys.platform == "win32":
        return "no native build on Windows"
    command = compiler()
    if command is None:
        return "no C compiler found (set CC)"
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as scratch:
        partial = Path(scratch) / target.name
        try:
            done = subprocess.run(
                [*command, *FLAGS, *(f"-D{name}" for name in defines)]
                + [f'-DES_SOURCE_HASH="{source_hash(source)}"', "-o", str(partial)]
                + [str(source)],
                capture_output=True,
                text=True,
                timeout=300,
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            return f"compiler failed to run: {exc}"
        if done.returncode != 0:
            lines = (done.stderr or done.stdout).strip().splitlines()
            return f"compiler exited {done.returncode}: {lines[0] if lines else ''}"
        os.replace(partial, target)  # atomic: a reader never loads a half-written library
    return None


if __name__ == "__main__":
    problem = build()
    print(problem or f"built {LIBRARY}")
    sys.exit(1 if problem else 0)
