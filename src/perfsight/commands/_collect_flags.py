"""The collection switches as command-line flags, shared by ``perfsight run`` and ``perfsight trigger``.

Why: both commands end in the same JSON keys (``PERFSIGHT_PROFILER_OPTIONS`` or
``profiler_config.json``), validated by ``perfsight.collect.options``; the flags only spell them.
Unset flags are left out, so the JSON they are merged into keeps its own values.
"""

from __future__ import annotations

import argparse
from typing import Any


def add_switch_flags(parser: argparse.ArgumentParser) -> None:
    """``--level``, ``--activities``, ... each mapping to one key of the collection options."""
    parser.add_argument("--level", help="profiler_level: Level0, Level1 or Level2 (default Level0)")
    parser.add_argument(
        "--activities", help="comma-separated: cpu, gpu (default: CPU and the accelerator, if any)"
    )
    parser.add_argument("--export-type", help="comma-separated: text, db (default: text)")
    parser.add_argument(
        "--analyse",
        choices=["none", "sync", "async"],
        help="analyse each window: none (default; run `perfsight analyse` later), sync, async",
    )
    for flag, key in (
        ("--profile-memory", "profile_memory"),
        ("--record-shapes", "record_shapes"),
        ("--with-stack", "with_stack"),
        ("--with-modules", "with_modules"),
    ):
        parser.add_argument(flag, dest=key, action="store_true", default=None, help=f"{key}: true")
    parser.add_argument(
        "--no-data-simplification",
        dest="data_simplification",
        action="store_false",
        default=None,
        help="keep the analysis cache next to PROFILER_OUTPUT (data_simplification: false)",
    )


def switch_values(args: argparse.Namespace) -> dict[str, Any]:
    """The JSON keys the user set on the command line (not yet validated)."""
    values: dict[str, Any] = {}
    if args.level is not None:
        values["profiler_level"] = args.level
    if args.activities is not None:
        values["activities"] = [a.strip() for a in args.activities.split(",") if a.strip()]
    if args.export_type is not None:
        values["export_type"] = [e.strip() for e in args.export_type.split(",") if e.strip()]
    if args.analyse is not None:
        values["analyse_mode"] = args.analyse
    for key in ("profile_memory", "record_shapes", "with_stack", "with_modules", "data_simplification"):
        if getattr(args, key) is not None:
            values[key] = getattr(args, key)
    return values
