"""``perfsight collect``: copy a job's rank outputs from its hosts into one job folder (SSH keys only)."""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from pathlib import Path


def register(sub: argparse._SubParsersAction) -> None:
    """Add the ``collect`` subcommand to the ``perfsight`` parser."""
    collect = sub.add_parser(
        "collect", help="gather rank outputs from hosts over SSH (keys, never passwords)"
    )
    collect.add_argument(
        "--hosts", required=True, help="h1,h2,... or @FILE (one per line); '.' = this machine"
    )
    collect.add_argument("--remote-dir", required=True, help="folder holding the rank outputs on every host")
    collect.add_argument(
        "--job-dir", required=True, help="local job folder; each host's outputs go to a subfolder"
    )
    collect.add_argument("--user", help="SSH user (default: your SSH config)")
    collect.add_argument("--tool", choices=["rsync", "scp"], default="rsync")
    collect.add_argument("--ssh-option", action="append", default=[], help="extra ssh argument, e.g. -p2222")
    collect.add_argument("--alias-file", help="JSON {name: alias} or 'name alias' lines; stays with you")
    collect.add_argument(
        "--anonymise",
        action="store_true",
        help="alias hosts as host-1..N; the map is written to --alias-file",
    )
    collect.add_argument("--dry-run", action="store_true", help="print the copy commands, copy nothing")
    collect.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from perfsight.cluster import gather

    try:
        hosts = gather.parse_hosts(args.hosts)
        if not hosts:
            raise gather.GatherError("no hosts given")
        job_dir = Path(args.job_dir)
        aliases: dict[str, str] = {}
        if args.anonymise:
            if not args.alias_file:
                raise gather.GatherError(
                    "--anonymise needs --alias-file (where the map is kept, outside the job)"
                )
            alias_path = Path(args.alias_file).resolve()
            if job_dir.resolve() in alias_path.parents:
                raise gather.GatherError(f"{alias_path}: the alias map must not be inside the job folder")
            aliases = gather.auto_aliases(hosts)
            alias_path.write_text(json.dumps(aliases, indent=1))
        elif args.alias_file:
            aliases = gather.load_aliases(args.alias_file)
        plans = gather.plan(
            hosts, args.remote_dir, job_dir, user=args.user, tool=args.tool, aliases=aliases,
            ssh_options=[o for opt in args.ssh_option for o in opt.split()],
        )  # fmt: skip
        for copy in plans:
            if args.dry_run:
                print(
                    shlex.join(copy.command) if copy.command else f"copy {args.remote_dir} -> {copy.target}"
                )
                continue
            gather.run_plan(copy, args.remote_dir)
            changed = gather.apply_aliases(copy.target, aliases)
            print(
                f"{copy.host}: copied to {copy.target}"
                + (f", {len(changed)} file(s) aliased" if changed else "")
            )
    except (gather.GatherError, OSError) as exc:
        print(f"perfsight: error: {exc}", file=sys.stderr)
        return 2
    return 0
