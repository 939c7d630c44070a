"""``perfsight run [options] -- COMMAND...``: profile an unmodified training command.

It validates the options, sets ``PERFSIGHT_PROFILER_OPTIONS`` and puts perfsight's start-up hook
(``perfsight/collect/_site/sitecustomize.py``) first on ``PYTHONPATH``, then *execs* COMMAND: the
command replaces this process, so its exit status, its signals (Ctrl-C, a scheduler's SIGTERM)
and its pid are exactly those of the command run alone.  Every Python process COMMAND starts
inherits the environment -- ``torchrun`` and its workers, ``python -m ...`` -- so each rank
writes its own run folder.  (``python -I`` / ``-E`` ignore ``PYTHONPATH``: not supported.)

Options given here override those already in ``PERFSIGHT_PROFILER_OPTIONS``; ``output_path`` is
made absolute so that processes that change directory still write to the same place.
"""

from __future__ import annotations

import argparse
import os
import sys

from perfsight.commands._collect_flags import add_switch_flags, switch_values

ENV_VAR = "PERFSIGHT_PROFILER_OPTIONS"


def register(sub: argparse._SubParsersAction) -> None:
    """Add the ``run`` subcommand to the ``perfsight`` parser."""
    run_parser = sub.add_parser(
        "run",
        help="profile an unmodified training command (perfsight run -- torchrun ... train.py)",
        description="Profile steps START..STOP (optimizer steps, counted from 1) of every process of "
        "COMMAND, without changing the script.",
    )
    run_parser.add_argument("--output-path", help="where run folders go (default: ./perfsight_data)")
    run_parser.add_argument("--start-step", type=int, help="first step to record (default 2, at least 2)")
    run_parser.add_argument("--stop-step", type=int, help="last step to record (default start + 4)")
    add_switch_flags(run_parser)
    run_parser.add_argument(
        "--print-env",
        action="store_true",
        help="print the environment as shell `export` lines instead of running a command",
    )
    run_parser.add_argument("command", nargs=argparse.REMAINDER, help="-- then the command to run")
    run_parser.set_defaults(handler=run)


def site_dir() -> str:
    """The folder holding perfsight's ``sitecustomize.py``."""
    import perfsight.collect

    return os.path.join(os.path.dirname(os.path.abspath(perfsight.collect.__file__)), "_site")


def build_environment(args: argparse.Namespace, environ: dict[str, str]) -> dict[str, str]:
    """The command's environment; raises ``ValueError`` (one line, naming the key) on bad options."""
    import json

    from perfsight.collect.autostart import parse_env, parse_mapping

    doc: dict = {}
    existing = environ.get(ENV_VAR, "").strip()
    if existing:
        parse_env(existing)  # reports a wrong key in the user's own variable by name
        doc.update(json.loads(existing))
    doc.update(switch_values(args))
    if args.output_path is not None:
        doc["output_path"] = args.output_path
    if args.start_step is not None:
        doc["start_step"] = args.start_step
    if args.stop_step is not None:
        doc["stop_step"] = args.stop_step
    doc["start"] = True
    source = "perfsight run options" if not existing else f"perfsight run options (with ${ENV_VAR})"
    settings = parse_mapping(doc, source)
    assert settings is not None  # start is true
    resolved = settings.to_json()
    resolved["output_path"] = os.path.abspath(settings.output_path)
    env = dict(environ)
    env[ENV_VAR] = json.dumps(resolved)
    paths = [site_dir()] + [p for p in environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
    return env


def run(args: argparse.Namespace) -> int:
    import json
    import shlex

    command = list(args.command)
    if command and command[0] == "--":
        command = command[1:]
    if not command and not args.print_env:
        print("perfsight run: give the command to profile after --, e.g. -- python train.py", file=sys.stderr)
        return 2
    try:
        env = build_environment(args, dict(os.environ))
    except ValueError as exc:
        print(f"perfsight run: {exc}", file=sys.stderr)
        return 2
    if args.print_env:
        for key in ("PYTHONPATH", ENV_VAR):
            print(f"export {key}={shlex.quote(env[key])}")
        return 0
    settings = json.loads(env[ENV_VAR])
    print(
        f"perfsight run: recording steps {settings['start_step']}..{settings['stop_step']} of each process "
        f"into {settings['output_path']} (then: perfsight analyse {shlex.quote(settings['output_path'])})",
        file=sys.stderr,
        flush=True,
    )
    sys.stdout.flush()
    try:
        os.execvpe(command[0], command, env)
    except FileNotFoundError:
        print(f"perfsight run: {command[0]}: command not found", file=sys.stderr)
        return 127
    except OSError as exc:
        print(f"perfsight run: cannot run {command[0]}: {exc.strerror}", file=sys.stderr)
        return 126
    return 0  # not reached: exec replaced this process
