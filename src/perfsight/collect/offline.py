"""Analyse one finished run folder: the handler's in-process step and its background process.

Why a module with a ``__main__``: ``tensorboard_trace_handler(async_mode=True)`` runs
``python -m perfsight.collect.offline FOLDER`` as a separate, low-priority process, so the
analysis shares no memory, threads or signals with training.  The work itself is
``perfsight.api.analyse`` (the same as ``perfsight analyse FOLDER``), which writes
``PROFILER_OUTPUT/`` and the Parquet cache inside the run folder; ``data_simplification``
then removes what re-analysis can rebuild from the raw files (the cache).

It must not import torch: the background process starts quickly and stays small.
"""

from __future__ import annotations

import argparse
import contextlib
import shutil
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path

from perfsight import layout

try:
    import fcntl
except ImportError:  # not POSIX: analyses are not serialised
    fcntl = None  # type: ignore[assignment]


def analyse_window(folder: Path, export_types: Sequence[str] = ("text",), simplify: bool = False) -> Path:
    """Write ``folder/PROFILER_OUTPUT`` from the folder's raw files; return that path."""
    from perfsight.api import analyse

    analyse(folder, export_types=tuple(export_types))
    if simplify:
        shutil.rmtree(folder / layout.CACHE_DIR, ignore_errors=True)
    return folder / layout.OUTPUT_DIR


@contextlib.contextmanager
def _one_at_a_time(lock: Path | None) -> Iterator[None]:
    """Background analyses of one output folder run one after another, not all at once: windows
    of every rank on a host finishing together must not take the cores training runs on."""
    if lock is None or fcntl is None:
        yield
        return
    with open(lock, "a+b") as handle:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX)  # released when the file closes
        yield


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="analyse one perfsight run folder")
    parser.add_argument("folder", type=Path)
    parser.add_argument("--export-type", default="text", help="comma-separated: text, db")
    parser.add_argument("--simplify", action="store_true", help="drop the Parquet cache afterwards")
    parser.add_argument("--lock", type=Path, help="run after other analyses holding this lock file")
    args = parser.parse_args(argv)
    types = [t for t in args.export_type.split(",") if t]
    try:
        with _one_at_a_time(args.lock):
            out = analyse_window(args.folder, types, args.simplify)
    except Exception as exc:  # noqa: BLE001 - one line in analysis.log, not a traceback
        print(f"perfsight: analysis of {args.folder} failed: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    print(f"perfsight: analysis written to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
