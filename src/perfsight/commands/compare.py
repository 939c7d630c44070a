"""``perfsight compare BASE NEW``: two runs (or two ranks of a job) side by side, regressions first."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

HTML_ROWS = 5000
"""Rows per table in ``--html`` (what ``/api/compare`` sends the compare page by default);
``compare/`` keeps them all."""


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
    compare.add_argument(
        "--html",
        metavar="FILE",
        help="also write the comparison as one self-contained HTML page (opens from disk, no server)",
    )
    compare.set_defaults(handler=run)


def write_html(comparison: dict, base: str, new: str, out: Path) -> Path:
    """The compare page as one HTML file (the web UI in its static mode, docs/REPORT.md), written
    whole or not at all."""
    import datetime as dt

    from perfsight import __version__
    from perfsight.collect.run_folder import write_bytes_atomic
    from perfsight.server.report_bundle import compare_document
    from perfsight.server.report_html import page

    generated = dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
    title = f"perfsight compare: {Path(base).name} vs {Path(new).name}"
    html = page(compare_document(comparison, base, new, title, generated, __version__), title)
    out.parent.mkdir(parents=True, exist_ok=True)
    write_bytes_atomic(out, html)
    return out


def run(args: argparse.Namespace) -> int:
    import orjson

    from perfsight.compare import CompareInputError, compare
    from perfsight.compare.text import format_text
    from perfsight.server.report_html import UiNotBuilt
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
    if args.html:
        try:
            written = write_html(comparison.to_dict(HTML_ROWS), args.base, args.new, Path(args.html))
        except (OSError, UiNotBuilt) as exc:
            print(printable_line(f"perfsight compare: error: --html {args.html}: {exc}"), file=sys.stderr)
            return 2
        size_mb = written.stat().st_size / 1e6
        print(printable_line(f"perfsight compare: wrote {written} ({size_mb:.2f} MB)"), file=sys.stderr)
    if args.json:
        sys.stdout.write(orjson.dumps(comparison.to_dict(), option=orjson.OPT_INDENT_2).decode() + "\n")
    else:
        sys.stdout.write(format_text(comparison, args.top))
        sys.stdout.write(printable_line(f"tables written to {folder}") + "\n")
    return 0
