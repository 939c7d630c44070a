"""``perfsight trigger``: ask a running job's ``DynamicProfilerMonitor`` to collect steps N..M.

It edits ``CFG_DIR/profiler_config.json`` -- keys it is not given keep their values -- validates
the result with the monitor's own rules and replaces the file in one rename, so the job reads
either the old or the new file.  It does not talk to the job: the monitor sees the change at its
next step, so ``--start`` must lie in the job's future.
"""

from __future__ import annotations

import argparse
import sys

from perfsight.commands._collect_flags import add_switch_flags, switch_values


def register(sub: argparse._SubParsersAction) -> None:
    """Add the ``trigger`` subcommand to the ``perfsight`` parser."""
    trigger = sub.add_parser(
        "trigger",
        help="start a collection in a running job (DynamicProfilerMonitor)",
        description="Edit CFG_DIR/profiler_config.json so that a job running a DynamicProfilerMonitor "
        "collects steps START..STOP (steps count from 1).",
    )
    trigger.add_argument(
        "cfg_dir", help="the monitor's cfg_path (folder of profiler_config.json, or the file)"
    )
    trigger.add_argument("--start", type=int, required=True, help="first step to collect (start_step)")
    trigger.add_argument("--stop", type=int, help="last step to collect (stop_step; default: --start)")
    add_switch_flags(trigger)
    trigger.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from perfsight.collect.dynamic_config import (
        ConfigFileError,
        DynamicConfig,
        config_file,
        parse_config,
        read_config,
        write_config_atomic,
    )
    from perfsight.collect.options import OptionError

    path = config_file(args.cfg_dir)
    if not path.parent.is_dir():
        print(f"perfsight trigger: {path.parent}: no such folder", file=sys.stderr)
        return 2
    doc = DynamicConfig().to_json()
    if path.exists():
        try:
            read_config(path)  # only to say what is wrong with the file being replaced
        except (ConfigFileError, OptionError) as exc:
            print(
                f"perfsight trigger: warning: {exc}; its other keys are replaced by defaults", file=sys.stderr
            )
        else:
            import json

            doc = json.loads(path.read_text(encoding="utf-8"))
    doc.update(switch_values(args))
    doc["start_step"] = args.start
    doc["stop_step"] = args.stop if args.stop is not None else args.start
    try:
        config, notes = parse_config(doc, str(path))
    except (ConfigFileError, OptionError) as exc:
        print(f"perfsight trigger: {exc}", file=sys.stderr)
        return 2
    if not config.active:
        print("perfsight trigger: key 'start_step': must be >= 1 to collect", file=sys.stderr)
        return 2
    for note in notes:
        print(f"perfsight trigger: warning: {note}", file=sys.stderr)
    try:
        write_config_atomic(path, doc)
    except OSError as exc:
        print(f"perfsight trigger: cannot write {path}: {exc}", file=sys.stderr)
        return 2
    print(f"perfsight trigger: {path}: steps {config.start_step}..{config.stop_step} requested")
    return 0
