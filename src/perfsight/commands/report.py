"""``perfsight report RUN -o report.html``: one HTML file with a run's pages, to open anywhere.

RUN is anything ``perfsight serve`` lists (a trace, a folder of traces, a run folder, a job, an
analysis); it is analysed as the server would (into the server's cache, never beside the data),
then the answers the report's pages need are embedded in one self-contained file
(``perfsight.server.report_bundle``, ``report_html``).  See docs/REPORT.md.
"""

from __future__ import annotations

import argparse
import datetime as dt
import signal
import sys
from pathlib import Path

DEFAULT_MAX_MB = 5.0


def register(sub: argparse._SubParsersAction) -> None:
    """Add the ``report`` subcommand to the ``perfsight`` parser."""
    report = sub.add_parser("report", help="write a self-contained HTML report of a run or job")
    report.add_argument("run", help="trace file, folder of traces, run folder, job folder or analysis")
    report.add_argument(
        "-o", "--output", default="report.html", help="HTML file to write (default: report.html)"
    )
    report.add_argument(
        "--max-size",
        type=float,
        default=DEFAULT_MAX_MB,
        metavar="MB",
        help=f"largest file to write, in MB (default: {DEFAULT_MAX_MB:g}); what does not fit is "
        "left out and listed in the report",
    )
    report.add_argument(
        "--ranks",
        type=_ranks,
        help="ranks whose pages to include, e.g. 0,3,7 (default: as many as fit, the slow ranks first)",
    )
    report.add_argument(
        "--cache-dir",
        help="where analyses are kept, as for perfsight serve (default: $PERFSIGHT_CACHE_DIR, else "
        "$XDG_CACHE_HOME/perfsight, else ~/.cache/perfsight)",
    )
    report.add_argument("-q", "--quiet", action="store_true", help="print only errors")
    report.set_defaults(handler=run)


def _ranks(text: str) -> list[int]:
    try:
        ranks = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of ranks") from None
    if not ranks or min(ranks) < 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of ranks")
    return ranks


def _error(message: str) -> int:
    from perfsight.terminal import printable_line

    print(printable_line(f"perfsight report: error: {message}"), file=sys.stderr)
    return 2


def run(args: argparse.Namespace) -> int:
    from perfsight.terminal import printable_line

    path = Path(args.run)
    if not path.exists():
        return _error(f"{path}: no such file or folder")
    if args.max_size <= 0:
        return _error(f"--max-size {args.max_size:g}: must be more than 0 MB")
    out = Path(args.output)
    if out.is_dir():
        return _error(f"{out}: is a folder; give the HTML file to write")

    def say(message: str) -> None:
        if not args.quiet:
            print(printable_line(f"perfsight report: {message}"), file=sys.stderr, flush=True)

    from perfsight import __version__
    from perfsight.server import create_app
    from perfsight.server.report_bundle import ReportTooLarge, build_report
    from perfsight.server.report_client import AppClient, ReportInputError
    from perfsight.server.report_html import UiNotBuilt, overhead, page

    limit = int(args.max_size * 1_000_000)
    try:
        budget = limit - overhead()
    except UiNotBuilt as error:
        return _error(str(error))
    if budget <= 0:
        return _error(
            f"--max-size {args.max_size:g} MB is smaller than the web UI itself ({overhead() / 1e6:.1f} MB)"
        )
    base = path if path.is_dir() else path.parent
    client = AppClient(create_app(base.resolve(), cache_dir=args.cache_dir))
    # stopped by a signal, the analysis child is stopped too (``finally``), never left running
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))
    try:
        found = client.find_run(path)
        say(f"{found.kind_label} {found.name}: analysing (as perfsight serve does, into its cache)")
        status = client.wait_ready(found, lambda stage: say(f"  {stage}"))
        for warning in (status.data.get("warnings") or [])[:10]:
            say(f"warning: {warning}")
        report = build_report(client, found.id, found.name, status, budget, args.ranks, say)
    except (ReportInputError, ValueError) as error:
        return _error(str(error))
    except ReportTooLarge as error:
        return _error(f"the report would exceed --max-size {args.max_size:g} MB: {error}")
    finally:
        client.close()
    generated = dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
    html = page(report.document(generated, __version__), f"perfsight report: {found.name}")
    if len(html) > limit:  # the budget keeps it under; this is the promise, checked
        return _error(f"the report came to {len(html) / 1e6:.2f} MB, over --max-size {args.max_size:g} MB")
    from perfsight.collect.run_folder import write_bytes_atomic

    out.parent.mkdir(parents=True, exist_ok=True)
    write_bytes_atomic(out, html)  # a reader never sees half a report
    left = ", ".join(f"{o} ({n})" for o, n in report.omitted.items())
    ranks = report.ranks if len(report.ranks) <= 8 else f"{len(report.ranks)} of {len(report.all_ranks)}"
    say(f"wrote {out} ({len(html) / 1e6:.2f} MB; pages of rank(s) {ranks})")
    if left:
        say(f"left out to stay under {args.max_size:g} MB: {left}")
    return 0
