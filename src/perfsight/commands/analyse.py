"""``perfsight analyse``: analyse traces or run folders, write the outputs, print the summary."""

from __future__ import annotations

import argparse
import contextlib
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson


def register(sub: argparse._SubParsersAction) -> None:
    """Add the ``analyse`` subcommand (alias ``analyze``) to the ``perfsight`` parser."""
    analyse = sub.add_parser("analyse", aliases=["analyze"], help="analyse traces and write the outputs")
    analyse.add_argument(
        "paths", nargs="+", help="trace file (.json/.json.gz), folder of traces, or run folder"
    )
    analyse.add_argument("--out", help="output folder (default: next to the input)")
    analyse.add_argument("--json", action="store_true", help="print the summary as JSON")
    analyse.add_argument(
        "--rank",
        type=_rank,
        help="rank of the trace, overriding the one it records (default: the trace's, else its file name's)",
    )
    analyse.add_argument(
        "--fp-point", help="op name where forward starts (default: detected; env PERFSIGHT_FP_POINT)"
    )
    analyse.add_argument(
        "--bp-point", help="op name where backward ends (default: detected; env PERFSIGHT_BP_POINT)"
    )
    analyse.add_argument("--export-type", default="text", help="comma-separated: text, db (default: text)")
    analyse.add_argument(
        "--memory-limit",
        type=_size,
        metavar="SIZE",
        help="keep the analysis of a large Kineto trace (alone or in a perfsight run folder) within SIZE "
        "(e.g. 2G): it is read and analysed a "
        "few steps at a time, spilling under the output folder; same outputs (default: half the memory "
        "available, for a trace that would need more).  For a job, SIZE is per rank (each worker "
        "analyses one rank at a time; default: each worker's share of half the memory available)",
    )
    analyse.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    analyse.add_argument(
        "-v", "--verbose", action="store_true", help="also print reader warnings as they happen"
    )
    analyse.add_argument(
        "--executor",
        help="where a multi-rank job's per-rank work runs: local (default), serial, dask-local, dask://HOST:PORT",
    )
    analyse.add_argument(
        "--per-rank-outputs",
        choices=("auto", "all", "none"),
        default="auto",
        help="a job's rank<N>/ folders: all, none, or auto (all up to 128 ranks, none above)",
    )
    analyse.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from perfsight.api import InputError, analyse, trace_files
    from perfsight.cluster.cli import is_job
    from perfsight.ingest import BOUNDED_INPUTS, TraceReadError
    from perfsight.pipeline import Options, OutputError
    from perfsight.summary import format_text, rank_summary
    from perfsight.terminal import printable_line

    cluster_summaries: list[dict] = []

    export_types = tuple(t.strip() for t in args.export_type.split(",") if t.strip())
    summaries = []
    for index, path in enumerate(args.paths):
        out = args.out
        if out and len(args.paths) > 1:
            out = f"{out}/{index}"
        if is_job(path):  # several ranks (or a URL): per-rank analysis in parallel, then the cluster step
            # imported here: the cluster code loads pandas, which a single-rank analysis never needs
            from perfsight.cluster.cli import read_whole, run_job
            from perfsight.cluster.job import JobInputError
            from perfsight.engine import ExecutorError

            for source in read_whole(path) if args.memory_limit is not None else ():  # not silently
                print(
                    printable_line(
                        f"perfsight: warning: --memory-limit applies to {BOUNDED_INPUTS}; "
                        f"{source} is read whole"
                    ),
                    file=sys.stderr,
                )
            try:
                job = run_job(
                    path,
                    out,
                    Options.from_env(
                        fp_point=args.fp_point,
                        bp_point=args.bp_point,
                        export_types=export_types,
                        rank=args.rank,
                    ),
                    args.executor,
                    args.per_rank_outputs,
                    args.memory_limit,
                )
            except (InputError, OutputError, TraceReadError, JobInputError, ExecutorError) as exc:
                print(printable_line(f"perfsight: error: {exc}"), file=sys.stderr)
                return 2
            cluster_summaries.append(job)
            continue
        try:
            with _progress_bar(path, len(trace_files(Path(path))) * 3, args) as bar:
                result = analyse(
                    path,
                    out,
                    fp_point=args.fp_point,
                    bp_point=args.bp_point,
                    export_types=export_types,
                    rank=args.rank,
                    memory_limit=args.memory_limit,
                    progress=bar,
                )
        except (InputError, OutputError, TraceReadError) as exc:
            print(printable_line(f"perfsight: error: {exc}"), file=sys.stderr)
            return 2
        summaries.extend(rank_summary(r) for _, r in sorted(result.ranks.items()))
    if cluster_summaries:  # a multi-rank job: the cluster summary (JSON: with each rank's summary)
        if args.json:
            doc = cluster_summaries[0] if len(cluster_summaries) == 1 and not summaries else cluster_summaries
            sys.stdout.write(
                orjson.dumps(doc, option=orjson.OPT_INDENT_2 | orjson.OPT_NON_STR_KEYS).decode() + "\n"
            )
        else:
            from perfsight.cluster.summary import format_text as cluster_text

            sys.stdout.write(
                "".join(cluster_text(job["cluster"]) + _bounded_ranks(job) for job in cluster_summaries)
            )
        if not summaries:
            return 0
    if args.json:
        sys.stdout.write(orjson.dumps(summaries, option=orjson.OPT_INDENT_2).decode() + "\n")
    else:
        sys.stdout.write(format_text(summaries))
    return 0


@contextlib.contextmanager
def _progress_bar(path: str, stages: int, args: argparse.Namespace) -> Iterator[Any]:
    """A tqdm bar of ``stages`` steps on the terminal, or None where none is shown (``--no-progress``,
    ``--json``, stderr not a terminal): tqdm is imported only for a bar, since its import is a tenth
    of a short run's time."""
    if args.no_progress or args.json or not sys.stderr.isatty():
        yield None
        return
    from tqdm import tqdm

    with tqdm(total=stages, desc=f"analysing {path}", file=sys.stderr) as bar:
        yield bar


def _bounded_ranks(job: dict) -> str:
    """The line that tells a job's user which of its ranks were analysed within the memory limit
    (the cluster summary itself is the same either way); empty when none were."""
    from perfsight import units

    bounded = [r["bounded"] for r in job["ranks"] if r.get("bounded")]
    if not bounded:
        return ""
    chunks = sorted(b["chunks"] for b in bounded)
    each = f"{chunks[0]}" if chunks[0] == chunks[-1] else f"{chunks[0]}-{chunks[-1]}"
    return (
        f"memory limit {units.bytes_text(bounded[0]['memory_limit_bytes'])} per rank: {len(bounded)} of "
        f"{len(job['ranks'])} analysed ranks read in chunks of whole steps ({each} "
        f"chunk{'' if chunks[-1] == 1 else 's'} each), spilled to disk "
        "and merged (the same outputs as in one piece)\n"
    )


def _rank(text: str) -> int:
    """A rank is a whole number from 0 (argparse turns the error into a one-line usage error)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"a rank is a whole number, not {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"a rank is 0 or more, not {value}")
    return value


def _size(text: str) -> int:
    """A memory size such as 2G or 1536M (argparse turns the error into a one-line usage error)."""
    from perfsight.memory_budget import BudgetError, parse_size

    try:
        return parse_size(text)
    except BudgetError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
