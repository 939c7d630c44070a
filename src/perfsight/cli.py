"""The ``perfsight`` command: builds the parser from the subcommand modules and dispatches.

Errors the user can fix (missing file, wrong format, bad option) are printed
as one line on stderr with exit code 2 -- never a traceback; Ctrl-C is one line
too, with exit code 130.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys

from perfsight import __version__
from perfsight.terminal import printable_line

COMMANDS = ("analyse", "compare", "serve", "report", "run", "trigger", "collect")
"""Modules under :mod:`perfsight.commands`, in the order ``--help`` lists them."""

INTERRUPTED = 130
"""Exit status after Ctrl-C, as a shell reports a command killed by SIGINT (128 + 2)."""

ANALYSIS_COMMANDS = ("analyse", "compare", "serve", "report")
"""Commands that only read and analyse: none multiplies matrices (see :func:`_one_blas_thread`)."""


def _one_blas_thread(command: str) -> None:
    """Before NumPy is imported by an analysis command, keep OpenBLAS to the calling thread
    (unless the user set ``OPENBLAS_NUM_THREADS``).

    Why: OpenBLAS starts a thread per core when NumPy loads, and each spins for a while waiting
    for matrix work that perfsight never gives it: 0.09-0.12 s of CPU per command on a 2-core
    machine (``perfsight analyse`` of df_index_resolver: 0.64 -> 0.52 s user time, the same
    wall time), taken from the cores the reader's threads and a cluster's worker processes
    (which inherit the setting) use.  ``run`` and ``collect`` are left alone: the user's training
    runs under them and may multiply matrices with NumPy."""
    if command in ANALYSIS_COMMANDS:
        os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="perfsight", description="Performance profiler for deep-learning training."
    )
    parser.add_argument("--version", action="version", version=f"perfsight {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    for name in COMMANDS:
        importlib.import_module(f"perfsight.commands.{name}").register(sub)
    return parser


class _PrintableFormatter(logging.Formatter):
    """Warnings quote names from traces: printed as data, never as terminal controls."""

    def formatMessage(self, record: logging.LogRecord) -> str:  # noqa: N802 - logging's name
        return printable_line(super().formatMessage(record))  # a traceback after it keeps its lines


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    _one_blas_thread(args.handler.__module__.rsplit(".", 1)[-1])  # (``run`` has its own ``command``)
    # reader warnings are listed in the summary printed at the end; as they happen they go to
    # stderr only with --verbose, so that each is shown once
    handler = logging.StreamHandler()
    handler.setFormatter(_PrintableFormatter("perfsight: warning: %(message)s"))
    logging.basicConfig(
        level=logging.WARNING if getattr(args, "verbose", False) else logging.ERROR, handlers=[handler]
    )
    try:
        return args.handler(args)
    except KeyboardInterrupt:  # Ctrl-C: the user knows why it stopped; a traceback would only hide it
        print(f"perfsight {args.command}: interrupted", file=sys.stderr)
        return INTERRUPTED


if __name__ == "__main__":
    sys.exit(main())
