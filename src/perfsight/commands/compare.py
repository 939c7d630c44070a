"""``perfsight compare BASE NEW``: two runs (or two ranks of a job) side by side, regressions first."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def register(sub: argparse._SubParsersAction) -> None:
    """Add the ``compare`` subcommand to the ``perfsight`` parser."""
    compare = sub.add_parser(
        "compare",
        help="compare two runs (or two ranks of a job): what got slower, beyond noise",
        description=(
            "Compare NEW against BASE: step breakdown, operators (by name and input shapes), kernels "
            "by operator, communication per family and group, memory peak, FLOPs, data wait; per-step "
            "means, each difference judged against step-to-step noise.  Writes DIR/compare/ "
            "(CSVs and compare.json)."
        ),
    )
    for name in ("base", "new"):
        compare.add_argument(
            name,
            help=f"{name.upper()}: any input `perfsight analyse` takes (an analysed folder is read from its "
            "cache), or PATH:rankN for one rank of a job",
        )
    compare.add_argument("--out", help="folder to write compare/ into (default: the current folder)")
    compare.add_argument("--json", action="store_true", help="print compare.json instead of the text summary")
    compare.add_argument(
        "--top", type=int, default=10, help="regressions listed in the text summary (default 10)"
    )
    compare.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    import orjson

    from perfsight.compare import CompareInputError, compare
    from perfsight.compare.text import format_text
    from perfsight.terminal import printable_line

    try:
        comparison = compare(args.base, args.new)
    except CompareInputError as exc:
        print(printable_line(f"perfsight compare: error: {exc}"), file=sys.stderr)
        return 2
    out = Path(args.out) if args.out else Path.cwd()
    try:
        folder = comparison.write(out)
    except OSError as exc:
        print(printable_line(f"perfsight compare: error: cannot write under {out}: {exc}"), file=sys.stderr)
        return 2
    if args.json:
        sys.stdout.write(orjson.dumps(comparison.to_dict(), option=orjson.OPT_INDENT_2).decode() + "\n")
    else:
        sys.stdout.write(format_text(comparison, args.top))
        sys.stdout.write(printable_line(f"tables written to {folder}") + "\n")
    return 0
