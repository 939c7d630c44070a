"""The data of the parallel-execution job pages of seed 000: the pipeline chart and the Marey view.

Why a module of its own: both read ``cluster_analysis_output/cluster_step_ops.parquet`` (every
rank's ops of every step on the common clock, keyed to match across a stage:
``perfsight.cluster.execution``) for one selected step, and the cluster step trace for the stage
bubble.  Every request is one DuckDB query over the step's rows; nothing re-parses a trace.

What it decides, and only here: how a view of those rows is drawn.  A micro-batch block's compute
time is the time of the compute ops inside it on its rank (a block's span also holds the waits for
the neighbouring stage, which are not work of this stage); a stage's idle time in the step is the
step's span less its blocks' compute; the pacing stage is the one with the most block compute.  The
Marey view is aggregated to the screen's resolution: the client names its width in pixels and the
window it shows, ops narrower than a pixel are merged into runs (never dropped), and a brushed
window is asked for again at full resolution; at most :data:`MAREY_ROWS` device rows are drawn at
once (a job with more opens folded, a stage per row).  A device's FLOPS block is its FLOPs of the
step over its compute time in the step (the sum of its compute ops' durations).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from perfsight.server import job_pages, job_views, queries
from perfsight.server.runs import CLUSTER_OUTPUT_DIR

OPS_FILE = "cluster_step_ops.parquet"
"""perfsight.cluster.execution.OUTPUT_FILE (not imported: the request path does not load pandas)."""
MAREY_PX = 1200
"""Pixels across the Marey view's window when the client names none."""
MAREY_ROWS = 32
"""Device rows drawn at once; a job with more devices opens with every stage folded."""


def _ops_file(root: Path | None) -> Path:
    cluster = job_pages.cluster_folder(root)
    path = cluster / OPS_FILE
    if not path.is_file():
        raise job_pages.NoClusterAnalysis(
            f"{CLUSTER_OUTPUT_DIR}/{OPS_FILE} is missing (the ops of each step per rank): analyse the job "
            "again with this perfsight (`perfsight analyse JOB_FOLDER`)"
        )
    return path


def _steps(ops: Path, saved: Path) -> list[str]:
    """The steps that have ops (read from the small per-step table, not the whole file)."""
    table = _marey_tables(ops, saved)["steps"]
    got = queries.arrow("SELECT step FROM read_parquet(?) WHERE t0 IS NOT NULL ORDER BY step", [str(table)])
    return [str(s) for s in got.column("step").to_pylist()]


def _digest(text: str) -> str:
    """A short hash of a table's query: a new perfsight with another query makes a new table."""
    import hashlib

    return hashlib.sha256(text.encode()).hexdigest()[:8]


def _marey_tables(ops: Path, saved: Path) -> dict[str, Path]:
    """What every request of these views reads first, made once per analysis from
    ``cluster_step_ops.parquet`` into ``saved`` (at 1,024 ranks a scan of its millions of rows takes
    seconds; these tables are small):

    * ``steps``: per step, its first op's start (``t0``, the origin of every time sent), its span,
      the highest allocated bytes and the highest op FLOP/s of any device (the lines' scales);
    * ``keys``: per step, stage and key (one op matched across the stage's devices): its name,
      category, order, its longest interval on any device and its first start / last end (ns from
      ``t0``) -- what decides whether it is drawn alone or merged;
    * ``stages``: per step and stage, its lowest rank (the one the pipeline chart draws), its ranks
      and its first start and last end (ns, the common clock);
    * ``devices``: per step and rank, its stage, ops, compute and communication time, last end and
      FLOPs of the step.
    """
    origin = "(SELECT step, min(start_ns) AS t0 FROM read_parquet(?) WHERE level = 'op' GROUP BY step) t"
    sql = {
        "steps": f"""SELECT s.step, any_value(t.t0) AS t0,
                max(end_ns) FILTER (WHERE level = 'op') - any_value(t.t0) AS span_ns,
                max(value) FILTER (WHERE level = 'memory') AS memory_max,
                max(value / nullif(end_ns - start_ns, 0)) FILTER (WHERE level = 'flops') * 1e9 AS flops_max
            FROM read_parquet(?) s LEFT JOIN {origin} USING (step) GROUP BY s.step""",
        "keys": f"""SELECT step, stage, key, name, category,
                CAST(row_number() OVER (PARTITION BY step, stage ORDER BY first, key) - 1 AS BIGINT) AS o,
                longest, a, b
            FROM (SELECT s.step, stage, key, any_value(name) AS name, any_value(category) AS category,
                    min("order") AS first, max(end_ns - start_ns) AS longest,
                    min(start_ns) - any_value(t.t0) AS a, max(end_ns) - any_value(t.t0) AS b
                FROM read_parquet(?) s JOIN {origin} USING (step) WHERE level = 'op'
                GROUP BY s.step, stage, key)
            ORDER BY step, stage, o""",
        "stages": """SELECT step, stage, min(rank) AS rank, list(DISTINCT rank ORDER BY rank) AS ranks,
                min(start_ns) AS s0, max(end_ns) AS s1
            FROM read_parquet(?) WHERE level IN ('op', 'micro_batch') AND ? IS NOT NULL
            GROUP BY step, stage""",
        "devices": f"""SELECT s.step, rank, any_value(stage) FILTER (WHERE level = 'op') AS stage,
                count(*) FILTER (WHERE level = 'op') AS ops,
                CAST(coalesce(sum(end_ns - start_ns) FILTER (WHERE level = 'op' AND category = 'compute'), 0)
                    AS BIGINT) AS compute_ns,
                CAST(coalesce(sum(end_ns - start_ns)
                    FILTER (WHERE level = 'op' AND category = 'communication'), 0) AS BIGINT)
                    AS communication_ns,
                max(end_ns) FILTER (WHERE level = 'op') - any_value(t.t0) AS end_ns,
                sum(value) FILTER (WHERE level = 'flops') AS step_flops
            FROM read_parquet(?) s JOIN {origin} USING (step)
            GROUP BY s.step, rank HAVING count(*) FILTER (WHERE level = 'op') > 0""",
    }
    return {  # (each query names the file twice; "stages" takes the second as a no-op condition)
        name: job_views._cached(saved, f"marey_{name}_{_digest(text)}", [ops], text, [str(ops), str(ops)])
        for name, text in sql.items()
    }


def _pick_step(steps: list[str], step: str | None) -> str:
    """The requested step, or by default the second profiled step (the first pays for warm-up)."""
    if step is not None:
        if step not in steps:
            known = ", ".join(steps)
            raise job_pages.NoClusterAnalysis(f"step {step} is not among the job's steps ({known})")
        return step
    if not steps:
        raise job_pages.NoClusterAnalysis("the job's analysis recorded no op in any step")
    return steps[1] if len(steps) > 1 else steps[0]


def pipeline(run: str, root: Path | None, saved: Path, step: str | None) -> dict[str, Any]:
    """The pipeline chart (:class:`models.JobPipeline`) of one step: per stage, its first rank's
    Forward/Backward blocks and point-to-point ops, and the send -> receive pairs between stages."""
    ops = _ops_file(root)
    steps = _steps(ops, saved)
    chosen = _pick_step(steps, step)
    ranks = job_pages.ranks_table(job_pages.cluster_folder(root), saved)
    params = [str(ops), int(chosen)]
    base = "SELECT * FROM read_parquet(?) WHERE step = ? AND level IN ('op', 'micro_batch')"
    shown = queries.records(
        queries.arrow(
            "SELECT stage, rank, ranks, s1 - s0 AS span_ns, s0, s1 FROM read_parquet(?) WHERE step = ? "
            "ORDER BY stage",
            [str(_marey_tables(ops, saved)["stages"]), int(chosen)],
        )
    )
    t0, t1 = min(s.pop("s0") for s in shown), max(s.pop("s1") for s in shown)
    reps = [s["rank"] for s in shown]
    # only the drawn ranks' rows (the file is sorted by step and rank: their row groups)
    base = f"{base} AND rank BETWEEN {min(reps)} AND {max(reps)} AND rank IN ({', '.join(map(str, reps))})"
    blocks = queries.records(
        queries.arrow(
            f"""WITH s AS ({base}), b AS (SELECT * FROM s WHERE level = 'micro_batch'),
                c AS (SELECT * FROM s WHERE level = 'op' AND category = 'compute')
            SELECT b.rank, b.stage, b.phase, b.micro_batch, b.start_ns - ? AS start_ns,
                b.end_ns - ? AS end_ns,
                CAST(coalesce(sum(least(c.end_ns, b.end_ns) - greatest(c.start_ns, b.start_ns)), 0) AS BIGINT)
                    AS compute_ns
            FROM b LEFT JOIN c ON c.rank = b.rank AND c.start_ns < b.end_ns AND c.end_ns > b.start_ns
            WHERE b.rank IN (SELECT unnest(?))
            GROUP BY b.rank, b.stage, b.phase, b.micro_batch, b.start_ns, b.end_ns
            ORDER BY b.stage, b.start_ns""",
            [*params, t0, t0, reps],
        )
    )
    p2p = queries.records(
        queries.arrow(
            f"SELECT rank, stage, name, instance, peer, start_ns - ? AS start_ns, end_ns - ? AS end_ns "
            f"FROM ({base}) WHERE is_p2p AND level = 'op' AND rank IN (SELECT unnest(?)) ORDER BY start_ns",
            [t0, t0, *params, reps],
        )
    )
    arrows = queries.records(
        queries.arrow(
            f"""WITH s AS ({base} AND is_p2p AND level = 'op')
            SELECT a.instance, a.rank AS src_rank, a.stage AS src_stage, b.rank AS dst_rank,
                b.stage AS dst_stage, a.start_ns - ? AS send_start_ns, b.end_ns - ? AS recv_end_ns
            FROM s a JOIN s b ON a.instance = b.instance AND a.name LIKE '%send%' AND b.name LIKE '%recv%'
            WHERE a.rank IN (SELECT unnest(?)) AND b.rank IN (SELECT unnest(?)) ORDER BY a.start_ns""",
            [*params, t0, t0, reps, reps],
        )
    )
    bubbles = {
        (r["stage"]): r
        for r in queries.rows(
            ranks,
            "WHERE type = 'stage' AND step = ?",
            "stage, bubble_ns, duration_ns",
            [chosen],
        )
    }
    stages = []
    for s in shown:  # a loop over stages (a handful), not over ops
        own = [b for b in blocks if b["rank"] == s["rank"]]
        compute = sum(b["compute_ns"] for b in own)
        trace = bubbles.get(s["stage"], {})
        stages.append(
            {
                "stage": s["stage"],
                "rank": s["rank"],
                "ranks": s["ranks"],
                "blocks": own,
                "p2p": [p for p in p2p if p["rank"] == s["rank"]],
                "compute_ns": compute,
                "idle_ns": max(0, (t1 - t0) - compute),
                "idle_share": (max(0, (t1 - t0) - compute) / (t1 - t0)) if t1 > t0 else None,
                "bubble_ns": trace.get("bubble_ns"),
                "step_ns": trace.get("duration_ns"),
            }
        )
    busy = [s for s in stages if s["blocks"]]
    return {
        "run": run,
        "step": chosen,
        "steps": steps,
        "span_ns": t1 - t0,
        "has_blocks": bool(busy),
        "pacing_stage": max(busy, key=lambda s: s["compute_ns"])["stage"] if busy else None,
        "stages": stages,
        "arrows": arrows,
    }


def marey(
    run: str,
    root: Path | None,
    saved: Path,
    step: str | None,
    px: int = MAREY_PX,
    start_ns: int | None = None,
    end_ns: int | None = None,
    unfold: str | None = None,
    first: int = 0,
) -> dict[str, Any]:
    """The Marey view (:class:`models.JobMarey`) of one step, at ``px`` pixels across the window
    ``[start_ns, end_ns)`` (ns from the step's first op; the whole step by default).

    Every matched op of the window is in the answer, drawn or merged: an op at least one pixel long
    on some device is an item of its own; the ops narrower than a pixel between two such ops of a
    stage (in the stage's op order) that start in the same pixel are merged into one item, which
    keeps their count, their category (``mixed`` when they differ) and, per device, the first start,
    the last end and the count of that device's ops.  ``unfold`` names the stages drawn device by
    device (comma-separated; by default every stage when the job has at most :data:`MAREY_ROWS`
    devices, else none); the others are one row each, an item's span on it from its first start
    to its last end on any device.  Of the unfolded stages' devices, :data:`MAREY_ROWS` from the
    ``first`` are drawn, each with its FLOPS and memory lines binned to the same pixels.  An
    item's ``name`` is null where its ``key`` is ``<name>#<k>`` (most ops: long kernel names sent once).

    An item's per-device intervals are columns aligned with its stage's drawn devices (``starts``:
    ns after the item's ``start_ns``; ``durs``: ns; ``counts`` only for a run): at 1,024 ranks a
    page is 32 devices x ~1,100 items, and a rank, two absolute times and a count per device made
    the answer 1.7 MiB, most of its time spent writing and reading those digits.
    """
    ops = _ops_file(root)
    tables = _marey_tables(ops, saved)
    steps = _steps(ops, saved)
    chosen = _pick_step(steps, step)
    head = queries.arrow("SELECT * FROM read_parquet(?) WHERE step = ?", [str(tables["steps"]), int(chosen)])
    info = (
        head.to_pylist()[0]
        if head.num_rows
        else {"t0": 0, "span_ns": 0, "memory_max": None, "flops_max": None}
    )
    t0, total = int(info["t0"] or 0), int(info["span_ns"] or 0)
    w0 = min(max(0, start_ns or 0), max(0, total - 1))
    w1 = min(total, end_ns) if end_ns is not None else total
    w1 = max(w1, w0 + 1)
    bin_ns = (w1 - w0) / px
    devices = queries.records(
        queries.arrow(
            "SELECT * EXCLUDE (step) FROM read_parquet(?) WHERE step = ? ORDER BY stage, rank",
            [str(tables["devices"]), int(chosen)],
        )
    )
    rates = [
        d["step_flops"] / d["compute_ns"] * 1e9 if d["step_flops"] and d["compute_ns"] else None
        for d in devices
    ]
    top_rate = max((r for r in rates if r), default=None)
    stage_sizes: dict[int, int] = {}
    for d, rate in zip(devices, rates, strict=True):  # a loop over devices, not ops
        d["flops_per_s"] = rate
        d["flops_per_s_of_max"] = rate / top_rate if rate and top_rate else None
        stage_sizes[d["stage"]] = stage_sizes.get(d["stage"], 0) + 1
    if unfold is None:
        unfolded = set(stage_sizes) if len(devices) <= MAREY_ROWS else set()
    else:
        unfolded = {int(x) for x in unfold.split(",") if x.strip().lstrip("-").isdigit()}
    rows = [d for d in devices if d["stage"] in unfolded]
    first = max(0, min(first, max(0, len(rows) - 1)))
    shown = rows[first : first + MAREY_ROWS]
    shown_ranks = [d["rank"] for d in shown]
    _device_shares(devices, root, saved)
    # the drawn devices' rows only: the file is sorted by step and rank, so the rank range prunes it
    lo, hi = (min(shown_ranks), max(shown_ranks)) if shown_ranks else (0, -1)
    src = (
        "SELECT * FROM read_parquet(?) WHERE step = ? AND rank BETWEEN ? AND ? AND rank IN (SELECT unnest(?))"
    )
    params = [str(ops), int(chosen), lo, hi, shown_ranks]
    # read once, used by the items' and the lines' queries (three scans of the file cost more)
    drawn_rows = queries.arrow(
        f"SELECT stage, rank, key, level, start_ns - ? AS a, end_ns - ? AS b, value FROM ({src}) "
        "WHERE level IN ('op', 'flops', 'memory')",
        [t0, t0, *params],
    )
    items_sql = """WITH g AS (SELECT stage, key, name, category, o, longest, a, b FROM read_parquet(?)
              WHERE step = ? AND b >= ? AND a <= ?),
        k AS (SELECT *, longest >= ? AS wide,
                sum(CAST(longest >= ? AS INT)) OVER (PARTITION BY stage ORDER BY o ROWS UNBOUNDED PRECEDING)
                    AS seg,
                CAST(floor((greatest(a, ?) - ?) / ?) AS BIGINT) AS cell FROM g),
        m AS (SELECT *,
                CASE WHEN wide THEN o ELSE min(o) OVER (PARTITION BY stage, wide, seg, cell) END AS item
              FROM k),
        items AS (SELECT stage, item,
                CASE WHEN count(*) = 1 THEN any_value(key) ELSE 'run:' || item END AS key,
                arg_min(name, o) AS name, min(o) AS "order", count(*) AS ops,
                CASE WHEN count(DISTINCT category) = 1 THEN any_value(category) ELSE 'mixed' END AS category,
                max(longest) AS longest_ns, min(a) AS start_ns, max(b) AS end_ns
              FROM m GROUP BY stage, item),
        s AS (SELECT stage, rank, key, a, b FROM drawn_rows WHERE level = 'op'),
        dev AS (SELECT m.stage, m.item, s.rank, min(s.a) AS a, max(s.b) AS b, count(*) AS n
              FROM s JOIN m USING (stage, key) GROUP BY m.stage, m.item, s.rank),
        drawn AS (SELECT unnest(?) AS rank, unnest(?) AS stage, unnest(?) AS at),
        per AS (SELECT i.stage, i.item, list(d.a - i.start_ns ORDER BY w.at) AS starts,
                list(d.b - d.a ORDER BY w.at) AS durs,
                CASE WHEN i.ops > 1 THEN list(d.n ORDER BY w.at) END AS counts
              FROM items i JOIN drawn w ON w.stage = i.stage
              LEFT JOIN dev d ON d.stage = i.stage AND d.item = i.item AND d.rank = w.rank
              GROUP BY i.stage, i.item, i.ops)
        SELECT i.* EXCLUDE (item, name),
            CASE WHEN starts_with(i.key, i.name || '#')
                    AND NOT contains(substr(i.key, length(i.name) + 2), '#')
                THEN NULL ELSE i.name END AS name,
            coalesce(p.starts, []) AS starts, coalesce(p.durs, []) AS durs,
            CASE WHEN i.ops > 1 THEN coalesce(p.counts, []) END AS counts
        FROM items i LEFT JOIN per p ON p.stage = i.stage AND p.item = i.item"""
    at = [sum(1 for e in shown[:k] if e["stage"] == d["stage"]) for k, d in enumerate(shown)]
    drawn = [shown_ranks, [d["stage"] for d in shown], at]
    items_params = [str(tables["keys"]), int(chosen), w0, w1, bin_ns, bin_ns, w0, w0, bin_ns, *drawn]
    items = _json_rows(items_sql, items_params, 'stage, "order"', drawn_rows)
    counts = queries.arrow(
        "SELECT count(*) AS matched, count(*) FILTER (WHERE b >= ? AND a <= ?) AS in_window "
        "FROM read_parquet(?) WHERE step = ?",
        [w0, w1, str(tables["keys"]), int(chosen)],
    ).to_pylist()[0]
    lines = _lines(drawn_rows, w0, w1, bin_ns, px, shown_ranks)
    for d in shown:  # a loop over the devices drawn (MAREY_ROWS at most)
        d["flops_line"], d["memory_line"] = lines.get(d["rank"], (_EMPTY_LINE, _EMPTY_LINE))
    memory_max, flops_max = info["memory_max"], info["flops_max"]
    capacity = next((d.get("capacity_bytes") for d in devices if d.get("capacity_bytes")), None)
    return {
        "run": run,
        "step": chosen,
        "steps": steps,
        "span_ns": total,
        "px": int(px),
        "window_start_ns": int(w0),
        "window_end_ns": int(w1),
        "bin_ns": bin_ns,
        "matched_ops": int(counts["matched"] or 0),
        "window_ops": int(counts["in_window"] or 0),
        "stages": [
            {"stage": st, "devices": n, "folded": st not in unfolded} for st, n in sorted(stage_sizes.items())
        ],
        "device_rows": len(rows),
        "first": first,
        "rows": MAREY_ROWS,
        "flops_line_max_per_s": flops_max,
        "memory_line_max_bytes": capacity or memory_max,
        "devices": shown,
        "ops": items,
    }


_EMPTY_LINE: dict[str, list[float]] = {"bins": [], "values": []}


def _over(drawn_rows: Any, sql: str, params: list[Any]) -> Any:
    """``sql`` with ``params`` as an Arrow table, where ``drawn_rows`` names the drawn devices' rows
    (read once per request; its own cursor, as :func:`queries.arrow`)."""
    cur = queries.database().cursor()
    try:
        cur.register("drawn_rows", drawn_rows)
        relation = cur.sql(sql, params=params)
        method = getattr(relation, "to_arrow_table", None) or relation.arrow  # DuckDB 2 / DuckDB 1
        return method()
    finally:
        cur.close()


def _json_rows(sql: str, params: list[Any], order_by: str, drawn_rows: Any) -> Any:
    """The rows of ``sql`` as a ready JSON array of objects, written by DuckDB (an item holds a list
    per device: building Python dicts for 32 devices x thousands of items would take longer)."""
    import orjson

    text = (
        _over(
            drawn_rows,
            f"SELECT coalesce(to_json(list(x ORDER BY {order_by})), '[]')::VARCHAR AS j FROM ({sql}) x",
            params,
        )
        .column("j")[0]
        .as_py()
    )
    return orjson.Fragment(text)


def _lines(
    drawn_rows: Any, w0: int, w1: int, bin_ns: float, px: int, ranks: list[int]
) -> dict[int, tuple[dict[str, list[float]], dict[str, list[float]]]]:
    """Per drawn device, its FLOPS and memory over the window, one value per pixel that has one.

    FLOPS: each op's FLOPs spread evenly over its interval, summed per pixel, over the pixel's time
    (FLOP/s).  Memory: the allocated total's highest value in each pixel (bytes), and at pixel -1
    the total when the window opens (the last event before it), so the line starts at its level.
    """
    if not ranks:
        return {}
    flops = queries.records(
        _over(
            drawn_rows,
            """WITH f2 AS (SELECT rank, a, b, value FROM drawn_rows
                    WHERE level = 'flops' AND b >= ? AND a <= ?),
                c AS (SELECT rank, a, b, value, unnest(range(CAST(floor((greatest(a, ?) - ?) / ?) AS BIGINT),
                        CAST(floor((least(b, ?) - ?) / ?) AS BIGINT) + 1)) AS i FROM f2),
                o AS (SELECT rank, i, sum(value * CASE WHEN b > a THEN greatest(0, least(b, ? + (i + 1) * ?)
                        - greatest(a, ? + i * ?)) / (b - a) ELSE 1 END) / ? * 1e9 AS v
                      FROM c WHERE i >= 0 AND i < ? GROUP BY rank, i)
            SELECT rank, list(i ORDER BY i) AS bins, list(v ORDER BY i) AS "values" FROM o GROUP BY rank""",
            [w0, w1, w0, w0, bin_ns, w1, w0, bin_ns, w0, bin_ns, w0, bin_ns, bin_ns, px],
        )
    )
    memory = queries.records(
        _over(
            drawn_rows,
            """WITH m AS (SELECT rank, a, value FROM drawn_rows WHERE level = 'memory' AND a <= ?),
                o AS (SELECT rank, -1 AS i, arg_max(value, a) AS v FROM m WHERE a < ? GROUP BY rank
                      UNION ALL
                      SELECT rank, CAST(floor((a - ?) / ?) AS BIGINT) AS i, max(value) AS v FROM m
                      WHERE a >= ? GROUP BY rank, i)
            SELECT rank, list(i ORDER BY i) AS bins, list(v ORDER BY i) AS "values" FROM o
            WHERE i < ? GROUP BY rank""",
            [w1, w0, w0, bin_ns, w0, px],
        )
    )
    out: dict[int, tuple[dict[str, list[float]], dict[str, list[float]]]] = {}
    by_rank = {r["rank"]: {"bins": r["bins"], "values": r["values"]} for r in flops}
    mem_by_rank = {r["rank"]: {"bins": r["bins"], "values": r["values"]} for r in memory}
    for rank in ranks:  # a loop over the devices drawn
        out[rank] = (by_rank.get(rank, _EMPTY_LINE), mem_by_rank.get(rank, _EMPTY_LINE))
    return out


def _device_shares(devices: list[dict[str, Any]], root: Path | None, saved: Path) -> None:
    """Each device's FLOPs over the heaviest device's and its peak memory over its capacity (or over
    the largest peak), from the cluster analysis's resources table (averages over the profiled steps)."""
    resources = job_views.resources_table(job_pages.cluster_folder(root), saved)
    if resources is None:
        return
    by_rank = {
        r["rank"]: r
        for r in queries.rows(
            resources,
            "",
            "rank, flops_normalised, peak_share, capacity_bytes, "
            "peak_allocated_bytes / nullif(max(peak_allocated_bytes) OVER (), 0) AS peak_of_max",
        )
    }
    for d in devices:  # a loop over devices, not ops
        r = by_rank.get(d["rank"], {})
        d["flops_of_max"] = r.get("flops_normalised")
        d["peak_share"] = r.get("peak_share")
        d["peak_of_max"] = r.get("peak_of_max")
        d["capacity_bytes"] = r.get("capacity_bytes")
