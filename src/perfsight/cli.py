"""The ``perfsight`` command: builds the parser from the subcommand modules and dispatches.

Errors the user can fix (missing file, wrong format, bad option) are printed
as one line on stderr with exit code 2 -- never a traceback; Ctrl-C is one line
too, with exit code 130.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys

from perfsight import __version__
from perfsight.terminal import printable_line

COMMANDS = ("analyse", "compare", "serve", "report", "run", "trigger", "collect")
"""Modules under :mod:`perfsight.commands`, in the order ``--help`` lists them."""

INTERRUPTED = 130
"""Exit status after Ctrl-C, as a shell reports a command killed by SIGINT (128 + 2)."""


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
