"""The job pages' data: the cross-rank analysis of a multi-rank run, per rank, sortable.

Why a module of its own: the single-device pages read one rank's cache; the job pages read the
job's ``cluster_analysis_output/`` (written by ``perfsight analyse JOB`` or by the server's own
analysis, see ``perfsight.server.worker``).  Its step trace is a CSV in microseconds (the file
MindSpore users know); it is turned once into a Parquet table in nanoseconds, joined with the
slow-rank evidence and the hosts, in the server's own folder for the run, and every request is a
DuckDB query over it (``perfsight.server.queries.page``).  Nothing here decides a number: the
cluster analysis did; this only selects, sorts and shapes.
"""

from __future__ import annotations

import csv
import hashlib
import json
import uuid
from pathlib import Path
from typing import Any

from perfsight.server import models, queries
from perfsight.server.runs import CLUSTER_FAILED_FILE, CLUSTER_OUTPUT_DIR, parallel_layout

RANKS_TABLE = "job_ranks"
"""The step trace of every rank and step (and its average), in ns, in the run's saved folder."""
NS_PER_US = 1000
SORTABLE = tuple(models.JobRankSort.__args__)  # type: ignore[attr-defined]


class NoClusterAnalysis(LookupError):
    """The run has no cross-rank analysis (one rank, or an analysis written without it)."""


def _phase_columns() -> dict[str, str]:
    """ns column -> CSV header (us), the one list the CSV writer uses."""
    from perfsight.export.cluster_csv import STEP_TRACE_COLUMNS

    return STEP_TRACE_COLUMNS


def cluster_folder(root: Path | None) -> Path:
    """The run's ``cluster_analysis_output/``; raises :class:`NoClusterAnalysis` saying why not."""
    folder = None if root is None else root / CLUSTER_OUTPUT_DIR
    failed = None if root is None else root / CLUSTER_FAILED_FILE
    if failed is not None and failed.is_file() and not (root / CLUSTER_OUTPUT_DIR).is_dir():  # type: ignore[operator]
        raise NoClusterAnalysis(failed.read_text(encoding="utf-8", errors="replace").strip())
    if folder is None or not (folder / "cluster_step_trace_time.csv").is_file():
        raise NoClusterAnalysis(
            "this run has no cross-rank analysis (cluster_analysis_output): open a job of several ranks, "
            "or run `perfsight analyse JOB_FOLDER`"
        )
    return folder


def ranks_table(cluster: Path, saved: Path) -> Path:
    """The Parquet table of :data:`RANKS_TABLE` for ``cluster``, written into ``saved`` (the
    server's folder) when missing or older than the CSVs it is made from."""
    sources = [cluster / n for n in ("cluster_step_trace_time.csv", "slow_rank.csv", "cluster_resources.csv")]
    stamp = repr([(str(p), p.stat().st_mtime_ns, p.stat().st_size) for p in sources if p.is_file()])
    # named after the files it is made from: a run read from another analysis gets another table
    target = saved / f"{RANKS_TABLE}-{hashlib.sha256(stamp.encode()).hexdigest()[:16]}.parquet"
    if target.is_file():
        return target
    saved.mkdir(parents=True, exist_ok=True)
    present = set(csv_header(sources[0]))
    phases = ", ".join(
        f'CAST(round(coalesce(TRY_CAST(s."{header}" AS DOUBLE), 0) * {NS_PER_US}) AS BIGINT) AS {column}'
        if header in present
        else f"CAST(0 AS BIGINT) AS {column}"  # a file written before the column was added
        for column, header in _phase_columns().items()
    )
    slow = sources[1].is_file()
    hosts = sources[2].is_file()
    sql = (
        f"SELECT CAST(s.Type AS VARCHAR) AS type, CAST(s.Step AS VARCHAR) AS step, "
        f'CAST(s."Index" AS BIGINT) AS rank, '
        f"CAST(s.Stage AS BIGINT) AS stage, {phases}, "
        f"{_COMPUTING_ALONE} AS computing_not_overlapped_ns, "
        + ("CAST(h.host AS VARCHAR) AS host, " if hosts else "CAST(NULL AS VARCHAR) AS host, ")
        + (
            "CAST(round(TRY_CAST(r.lateness_ns AS DOUBLE)) AS BIGINT) AS lateness_ns, "
            "coalesce(TRY_CAST(r.slow AS BOOLEAN), false) AS slow "
            if slow
            else "CAST(NULL AS BIGINT) AS lateness_ns, false AS slow "
        )
        + "FROM read_csv(?, header = true, all_varchar = false) s "
        + (f"LEFT JOIN read_csv(?, header = true) r ON {_RANK_ROW.format(t='r')} " if slow else "")
        + (f"LEFT JOIN read_csv(?, header = true) h ON {_RANK_ROW.format(t='h')} " if hosts else "")
    )
    params = [str(sources[0])] + ([str(sources[1])] if slow else []) + ([str(sources[2])] if hosts else [])
    tmp = target.with_name(f".{target.name}.{uuid.uuid4().hex}.tmp")  # two requests may build it at once
    cursor = queries.database().cursor()
    try:
        cursor.execute(f"COPY ({sql}) TO '{_sql_path(tmp)}' (FORMAT parquet)", params)
    finally:
        cursor.close()
    tmp.replace(target)
    return target


def csv_header(path: Path) -> list[str]:
    """The column names of the CSV at ``path`` (its first line): what a query over it may select."""
    with path.open(newline="", encoding="utf-8", errors="replace") as handle:
        return next(csv.reader(handle), [])


_COMPUTING_ALONE = (
    f'greatest(0, CAST(round((coalesce(TRY_CAST(s."Computing(us)" AS DOUBLE), 0) '
    f'- coalesce(TRY_CAST(s."Overlapped(us)" AS DOUBLE), 0)) * {NS_PER_US}) AS BIGINT))'
)
"""Computing while no communication runs: the computing time less its part overlapped by
communication, so that computing alone + overlapped + communication not overlapped + free stack
to a rank's busy time without counting the overlap twice."""
_RANK_ROW = """s.Type = 'rank' AND {t}.rank = CAST(s."Index" AS BIGINT)"""
"""Join condition of a per-rank file onto the step trace's rank rows (its stage rows index stages)."""


def _sql_path(path: Path) -> str:
    """A path inside a SQL string literal (COPY TO takes no bound parameter): quotes doubled."""
    return str(path).replace("'", "''")


ALL_RANKS = 1_000_000
"""The default page: every rank (a client that pages asks for fewer)."""


def rank_rows(
    table: Path, step: str, sort: str, order: str, stage: int | None = None, offset: int = 0,
    limit: int = ALL_RANKS,
) -> tuple[list[dict[str, Any]], int]:  # fmt: skip
    """One page of the ranks' rows of ``step`` ("average" or a step number), sorted (an
    allow-listed column), and how many ranks there are in all.  Paged in the query: at a thousand
    ranks a page of rows is what a browser should hold and draw, not the job."""
    where: list[tuple[str, list[Any]]] = [("type = 'rank' AND step = ?", [step])]
    if stage is not None:
        where.append(("stage = ?", [stage]))
    select = list(models.JobRank.model_fields)
    found = queries.page(
        table, select, sortable=SORTABLE, sort=sort, order=order, offset=offset, limit=limit, where=where,
        tiebreak="rank",
    )  # fmt: skip
    return found["rows"], found["total"]


def _extreme(table: Path, direction: str) -> dict[str, Any] | None:
    """The average row of the fastest (``ASC``) or slowest (``DESC``) rank by step time; ties go to
    the lower rank for the fastest and the higher for the slowest."""
    found = queries.arrow(
        "SELECT rank, duration_ns FROM read_parquet(?) WHERE type = 'rank' AND step = 'average' "
        f"ORDER BY duration_ns {direction}, rank {direction} LIMIT 1",
        [str(table)],
    ).to_pylist()
    return found[0] if found else None


def _steps(table: Path) -> list[str]:
    got = (
        queries.arrow("SELECT DISTINCT step FROM read_parquet(?) WHERE type = 'rank'", [str(table)])
        .column("step")
        .to_pylist()
    )
    numbers = sorted((s for s in got if s != "average"), key=lambda s: (len(s), s))
    return (["average"] if "average" in got else []) + numbers


def overview(
    run: str, root: Path | None, saved: Path, sort: str, order: str, offset: int = 0, limit: int = ALL_RANKS
) -> dict[str, Any]:
    """The job overview (:class:`models.JobOverview`): one page of its ranks, the rest of the job
    whole (the spread is over every rank, whatever the page)."""
    cluster = cluster_folder(root)
    table = ranks_table(cluster, saved)
    rows, total = rank_rows(table, "average", sort, order, offset=offset, limit=limit)
    summary = json.loads((cluster / "cluster_summary.json").read_text(encoding="utf-8"))
    spread = None
    fastest, slowest = _extreme(table, "ASC"), _extreme(table, "DESC")
    if fastest is not None and slowest is not None:
        spread = {
            "min_ns": fastest["duration_ns"],
            "median_ns": int(summary.get("median_step_ns") or 0),  # the cluster summary's median
            "max_ns": slowest["duration_ns"],
            "fastest_rank": fastest["rank"],
            "slowest_rank": slowest["rank"],
        }
    members = summary.get("stages") or {}
    averages = queries.arrow(
        "SELECT rank AS stage, duration_ns, computing_ns, bubble_ns FROM read_parquet(?) "
        "WHERE type = 'stage' AND step = 'average' ORDER BY rank",
        [str(table)],
    ).to_pylist()  # the cluster analysis's stage averages (the CSV's stage rows index stages)
    balance = summary.get("pipeline") or {}
    flops = {int(p["stage"]): p.get("flops") for p in balance.get("per_stage", [])}
    stages = [
        {**row, "ranks": members.get(str(row["stage"]), []), "flops": flops.get(row["stage"])}
        for row in averages
    ]
    pipeline = None
    if len(stages) > 1 and "imbalanced" in balance:
        pipeline = {k: balance.get(k) for k in ("imbalanced", "spread", "slowest_stage")}
    return {
        "run": run,
        "ranks": rows,
        "ranks_total": total,
        "hosts_total": queries.arrow(
            "SELECT count(DISTINCT host) AS n FROM read_parquet(?) WHERE type = 'rank' AND step = 'average'",
            [str(table)],
        )
        .column("n")[0]
        .as_py(),
        "step_spread": spread,
        "slow_rank_threshold_ns": summary.get("slow_rank_threshold_ns"),
        "slowest_ranks": summary.get("slowest_ranks", []),
        "slowest_links": summary.get("slowest_links", []),
        "stages": stages,
        "pipeline": pipeline,
        "parallel": summary.get("parallel") or {},
        "layout": parallel_layout(root) if root is not None else None,
        "problems": summary.get("problems", []),
    }


def step_trace(
    run: str, root: Path | None, saved: Path, step: str, stage: int | None, sort: str, order: str,
    offset: int = 0, limit: int = ALL_RANKS,
) -> dict[str, Any]:  # fmt: skip
    """The cluster step trace (:class:`models.JobStepTrace`): one page of the ranks of one step or
    of the average."""
    table = ranks_table(cluster_folder(root), saved)
    steps = _steps(table)
    if step not in steps:
        raise NoClusterAnalysis(f"no step {step!r} in this job; steps: {', '.join(steps)}")
    stages = sorted(
        queries.arrow("SELECT DISTINCT stage FROM read_parquet(?) WHERE type = 'rank'", [str(table)])
        .column("stage")
        .to_pylist()
    )
    rows, total = rank_rows(table, step, sort, order, stage, offset, limit)
    return {
        "run": run,
        "step": step,
        "steps": steps,
        "stages": stages,
        "pipeline": len(stages) > 1,
        "ranks": rows,
        "ranks_total": total,
    }
