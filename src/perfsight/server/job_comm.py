"""The job's Communication page: per-rank communication and wait time, links, and every op.

Why a module of its own: the cluster analysis already decided every number of this page and wrote
it to ``cluster_analysis_output/``: each op of each rank with its elapse / transit / wait /
synchronization / idle split (``cluster_communication_ops.csv``, ns), each rank's ops summed per
step (``cluster_communication_ranks.parquet``, ``perfsight.cluster.totals``) and each link of each
step, op kind and group (``communication_matrix.json``, seed 003's layout in MB and ms).  The CSV and
JSON files are turned once into Parquet tables in the model's units (ns, bytes) in the server's own
folder for the run, and every request is a DuckDB query over them.  Nothing here decides a number:
a link row is one entry of the matrix file, an op's bandwidth is its bytes over its transit time
(``bandwidth = bytes / transit time``, the definition of docs/OUTPUTS.md).  The heatmap's
aggregation to screen resolution is ``job_matrix``.
"""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from perfsight import layout
from perfsight.server import models, queries
from perfsight.server.job_pages import NoClusterAnalysis, csv_header
from perfsight.server.runs import CLUSTER_FAILED_FILE, CLUSTER_OUTPUT_DIR
from perfsight.units import BYTES_PER_MB, NS_PER_MS  # the matrix file's MB (2**20 bytes) and ms

OPS_FILE = "cluster_communication_ops.csv"
MATRIX_FILE = "communication_matrix.json"
TOTAL = "-total@"
"""Between the op and the group in the matrix file's keys (``all_reduce-total@<group>``)."""
_MATRIX_TYPE = "MAP(VARCHAR, MAP(VARCHAR, MAP(VARCHAR, MAP(VARCHAR, JSON))))"
"""communication_matrix.json as DuckDB reads it: step -> kind -> op@group -> src-dst -> link."""
ALL_STEPS = "all"
"""The ``step`` value that selects every profiled step (rank totals, links and ops of all steps)."""
BYTES_PER_S_PER_GB_S = 1e9
"""communication_matrix.json's GB/s is 10^9 bytes per second."""

TIME_COLUMNS = ("elapse_ns", "transit_ns", "wait_ns", "synchronization_ns", "idle_ns")
"""The per-op times of cluster_communication_ops.csv: perfsight.cluster.op_time.TIME_COLUMNS, not
imported (the server's request path does not load the cluster layer's pandas); a test keeps the two
equal."""
RANK_SORT = tuple(models.CommRankSort.__args__)  # type: ignore[attr-defined]
LINK_SORT = tuple(models.CommLinkSort.__args__)  # type: ignore[attr-defined]
OP_SORT = tuple(models.CommOpSort.__args__)  # type: ignore[attr-defined]


def cluster_file(root: Path | None, name: str) -> Path:
    """``cluster_analysis_output/<name>`` of the run; raises :class:`NoClusterAnalysis` saying why not."""
    folder = None if root is None else root / CLUSTER_OUTPUT_DIR
    if root is not None and (root / CLUSTER_FAILED_FILE).is_file() and not folder.is_dir():  # type: ignore[union-attr]
        raise NoClusterAnalysis(
            (root / CLUSTER_FAILED_FILE).read_text(encoding="utf-8", errors="replace").strip()
        )
    if folder is None or not folder.is_dir():
        raise NoClusterAnalysis(
            "this run has no cross-rank analysis (cluster_analysis_output): open a job of several ranks, "
            "or run `perfsight analyse JOB_FOLDER`"
        )
    path = folder / name
    if not path.is_file():
        raise NoClusterAnalysis(
            f"{CLUSTER_OUTPUT_DIR}/{name} is missing: analyse the job again with this perfsight "
            "(`perfsight analyse JOB_FOLDER`) to see its communication"
        )
    return path


def _sql_path(path: Path) -> str:
    return str(path).replace("'", "''")


def derived_table(saved: Path, name: str, sources: Sequence[Path], sql: str, params: Sequence[Any]) -> Path:
    """The Parquet file ``saved/<name>-<stamp>.parquet`` holding ``sql``'s rows, written once: its
    name is made from the sources' paths, times and sizes, so an analysis written again (or another
    analysis of the run) gets a table of its own and a stale one is never read."""
    stamp = repr([(str(p), p.stat().st_mtime_ns, p.stat().st_size) for p in sources if p.is_file()])
    target = saved / f"{name}-{hashlib.sha256(stamp.encode()).hexdigest()[:16]}.parquet"
    if target.is_file():
        return target
    saved.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.{uuid.uuid4().hex}.tmp")  # two requests may build it at once
    cursor = queries.database().cursor()
    try:
        cursor.execute(f"COPY ({sql}) TO '{_sql_path(tmp)}' (FORMAT parquet)", list(params))
    finally:
        cursor.close()
    tmp.replace(target)
    return target


def _int(column: str, present: Sequence[str] | None = None) -> str:
    """A CSV column read as text, as a whole number (``3``, ``3.0``; null when empty, or when the
    file has no such column: ``present`` lists the file's columns)."""
    if present is not None and column not in present:
        return "CAST(NULL AS BIGINT)"
    return f'CAST(round(TRY_CAST("{column}" AS DOUBLE)) AS BIGINT)'


def _text(column: str, present: Sequence[str]) -> str:
    return f'CAST("{column}" AS VARCHAR)' if column in present else "CAST(NULL AS VARCHAR)"


REQUIRED_OP_COLUMNS = ("rank", "collective", *TIME_COLUMNS)


def ops_table(root: Path | None, saved: Path) -> Path:
    """Every op of every rank (``cluster_communication_ops.csv``) with its times in ns, ``start_ns``
    relative to the job's first op (aligned clocks), and its bandwidth = bytes / transit (B/s).
    Optional columns a file lacks (written by another perfsight) are left empty."""
    source = cluster_file(root, OPS_FILE)
    have = csv_header(source)
    missing = [c for c in REQUIRED_OP_COLUMNS if c not in have]
    if missing:
        raise NoClusterAnalysis(
            f"{CLUSTER_OUTPUT_DIR}/{OPS_FILE} has no column {', '.join(missing)}: analyse the job again "
            "with this perfsight (`perfsight analyse JOB_FOLDER`)"
        )
    times = ", ".join(f"coalesce({_int(c)}, 0) AS {c}" for c in TIME_COLUMNS)
    p2p = "coalesce(TRY_CAST(is_p2p AS BOOLEAN), false)" if "is_p2p" in have else "false"
    sql = f"""
        WITH ops AS (
            SELECT {_int("rank")} AS rank, {_text("collective", have)} AS op,
                {_text("group", have)} AS "group", {_int("step", have)} AS step,
                {_int("instance", have)} AS instance, {p2p} AS is_p2p,
                {_int("peer", have)} AS peer_rank, {_int("start_ns", have)} AS start_at, {times},
                {"TRY_CAST(bytes AS DOUBLE)" if "bytes" in have else "CAST(NULL AS DOUBLE)"} AS bytes,
                {_text("basis", have)} AS basis
            FROM read_csv(?, header = true, all_varchar = true)
        )
        SELECT rank, op, "group", step, instance, is_p2p,
            CASE WHEN is_p2p THEN peer_rank END AS peer,
            start_at - min(start_at) OVER () AS start_ns,
            {", ".join(TIME_COLUMNS)}, bytes,
            CASE WHEN transit_ns > 0 THEN bytes / (transit_ns / 1e9) END AS bandwidth_bytes_per_s,
            basis
        FROM ops WHERE rank IS NOT NULL
    """
    return derived_table(saved, "job_comm_ops", [source], sql, [str(source)])


def links_table(root: Path | None, saved: Path) -> Path:
    """One row per entry of ``communication_matrix.json``: step, kind (``collective``/``p2p``), op,
    group, src, dst, link type, bytes, transit ns and bandwidth (B/s), converted from the file's
    MB, ms and GB/s (nothing else).  A link with no transit time has no bandwidth (null; the file
    writes 0 there).  The file is read by DuckDB as nested maps in one pass: a thousand ranks'
    file (4,096 links) takes tens of milliseconds where walking it with ``json_each`` took seconds."""
    source = cluster_file(root, MATRIX_FILE)
    sql = f"""
        WITH doc AS (
            SELECT CAST(json AS {_MATRIX_TYPE}) AS d
            FROM read_json_objects(?, format = 'unstructured', maximum_object_size = 2147483647)
        ),
        steps AS (SELECT e.key AS step_key, e.value AS kinds FROM doc, unnest(map_entries(d)) AS t(e)),
        kinds AS (
            SELECT step_key, k.key AS kind, k.value AS ops FROM steps, unnest(map_entries(kinds)) AS t(k)
        ),
        ops AS (
            SELECT step_key, kind, o.key AS op_key, o.value AS links
            FROM kinds, unnest(map_entries(ops)) AS t(o)
        ),
        entries AS (
            SELECT step_key, kind, op_key, l.key AS pair, l.value AS link
            FROM ops, unnest(map_entries(links)) AS t(l)
        ),
        typed AS (
            SELECT *,
                CAST(round(TRY_CAST(link ->> 'Transit Time(ms)' AS DOUBLE) * {NS_PER_MS}) AS BIGINT)
                    AS transit,
                TRY_CAST(link ->> 'Bandwidth(GB/s)' AS DOUBLE) * {BYTES_PER_S_PER_GB_S} AS bandwidth
            FROM entries WHERE kind IN ('collective', 'p2p') AND json_type(link) = 'OBJECT'
        )
        SELECT TRY_CAST(regexp_extract(step_key, '^step(-?\\d+)$', 1) AS BIGINT) AS step,
            kind,
            CASE WHEN strpos(op_key, '{TOTAL}') > 0
                THEN op_key[:strpos(op_key, '{TOTAL}') - 1] ELSE op_key END AS op,
            CASE WHEN strpos(op_key, '{TOTAL}') > 0
                THEN op_key[strpos(op_key, '{TOTAL}') + {len(TOTAL)}:] ELSE '' END AS "group",
            TRY_CAST(split_part(pair, '-', 1) AS BIGINT) AS src,
            TRY_CAST(split_part(pair, '-', 2) AS BIGINT) AS dst,
            coalesce(link ->> 'Transport Type', 'UNKNOWN') AS link_type,
            coalesce(TRY_CAST(link ->> 'Transit Size(MB)' AS DOUBLE), 0) * {BYTES_PER_MB} AS bytes,
            coalesce(transit, 0) AS transit_ns,
            CASE WHEN transit > 0 THEN bandwidth END AS bandwidth_bytes_per_s
        FROM typed
    """
    table = derived_table(saved, "job_comm_links", [source], sql, [str(source)])
    return table


def ranks_table(root: Path | None) -> Path:
    """Per rank and step (and ``all`` steps): its ops' counts and summed times and bytes, with its
    host, every rank of the job listed -- as the cluster analysis wrote them
    (``perfsight.cluster.totals.communication_by_rank``).  An analysis made before that table
    existed is answered with :class:`NoClusterAnalysis` asking to analyse the job again."""
    return cluster_file(root, layout.CLUSTER_COMMUNICATION_RANKS_FILE)


def _steps(ops: Path, links: Path) -> list[str]:
    """``all`` and every step that has an op or a link, in order."""
    found = queries.arrow(
        "SELECT DISTINCT step FROM (SELECT step FROM read_parquet(?) UNION SELECT step FROM read_parquet(?)) "
        "WHERE step IS NOT NULL ORDER BY step",
        [str(ops), str(links)],
    )
    return [ALL_STEPS, *(str(s) for s in found.column("step").to_pylist())]


def choices(root: Path | None, saved: Path) -> dict[str, Any]:
    """What the pages' selectors offer (:class:`models.CommChoices`): steps, op families, groups
    (with the ranks that issued their ops) and link types."""
    ops, links = ops_table(root, saved), links_table(root, saved)
    families = queries.rows(
        links, "GROUP BY op, kind ORDER BY kind, op", "op AS name, kind, count(*) AS links"
    )
    groups = queries.rows(
        ops,
        'GROUP BY "group" ORDER BY count(DISTINCT rank) DESC, "group"',
        '"group" AS id, count(DISTINCT rank) AS ranks, list(DISTINCT op ORDER BY op) AS ops',
    )
    types = queries.rows(links, "ORDER BY 1", "DISTINCT link_type")
    return {
        "steps": _steps(ops, links),
        "ops": families,
        "groups": groups,
        "link_types": [t["link_type"] for t in types],
    }


def step_where(step: str, steps: list[str]) -> tuple[str, list[Any]]:
    """The WHERE clause of one step (``TRUE`` for all); raises :class:`NoClusterAnalysis` for a step
    the job does not have (the page shows the message)."""
    if step == ALL_STEPS:
        return "TRUE", []
    if step not in steps:
        raise NoClusterAnalysis(f"no step {step!r} in this job's communication; steps: {', '.join(steps)}")
    return "step = ?", [int(step)]


def op_where(op: str | None) -> tuple[str, list[Any]]:
    """An op family filter: ``collective`` or ``p2p`` (a kind), or one op name (``all_reduce``)."""
    if not op:
        return "TRUE", []
    if op in ("collective", "p2p"):
        return "is_p2p = ?", [op == "p2p"]
    return "op = ?", [op]


def ranks(
    run: str, root: Path | None, saved: Path, step: str, sort: str, order: str, offset: int, limit: int
) -> dict[str, Any]:
    """Every rank's communication in ``step`` (:class:`models.JobCommunication`), one page, sorted."""
    options = choices(root, saved)
    table = ranks_table(root)
    if step != ALL_STEPS and step not in options["steps"]:
        step_where(step, options["steps"])  # raises, naming the steps
    found = queries.page(
        table, list(models.CommRank.model_fields), sortable=RANK_SORT, sort=sort, order=order,
        offset=offset, limit=limit, where=[("step = ?", [step])], tiebreak="rank",
    )  # fmt: skip
    return {"run": run, "step": step, "choices": options, **found}


def links(
    root: Path | None,
    saved: Path,
    *,
    step: str,
    rank: int | None,
    src: int | None,
    dst: int | None,
    link_type: str | None,
    op: str | None,
    group: str | None,
    sort: str,
    order: str,
    offset: int,
    limit: int,
) -> dict[str, Any]:
    """One page of the job's links (:class:`models.CommLinkPage`): entries of communication_matrix.json,
    filtered (``rank``: either end) and sorted."""
    table = links_table(root, saved)
    where = [step_where(step, _steps(ops_table(root, saved), table))]
    if rank is not None:
        where.append(("(src = ? OR dst = ?)", [rank, rank]))
    for column, value in (("src", src), ("dst", dst), ("link_type", link_type), ('"group"', group)):
        if value is not None and value != "":
            where.append((f"{column} = ?", [value]))
    if op in ("collective", "p2p"):
        where.append(("kind = ?", [op]))
    elif op:
        where.append(("op = ?", [op]))
    return queries.page(
        table, [f'"{f}"' for f in models.CommLink.model_fields], sortable=LINK_SORT, sort=sort, order=order,
        offset=offset, limit=limit, where=where, tiebreak='step, src, dst, op, "group"',
    )  # fmt: skip


def ops(
    root: Path | None,
    saved: Path,
    *,
    step: str,
    rank: int | None,
    op: str | None,
    group: str | None,
    q: str | None,
    sort: str,
    order: str,
    offset: int,
    limit: int,
) -> dict[str, Any]:
    """One page of every rank's communication ops (:class:`models.CommOpPage`), filtered (``q``:
    fuzzy over op and group) and sorted."""
    table = ops_table(root, saved)
    where = [step_where(step, _steps(table, links_table(root, saved))), op_where(op)]
    if rank is not None:
        where.append(("rank = ?", [rank]))
    if group:
        where.append(('"group" = ?', [group]))
    where.append(queries.fuzzy_clause(q, ("op", '"group"')))
    return queries.page(
        table, [f'"{f}"' for f in models.CommOp.model_fields], sortable=OP_SORT, sort=sort, order=order,
        offset=offset, limit=limit, where=where, tiebreak="start_ns, rank",
    )  # fmt: skip
