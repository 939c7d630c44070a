"""The data behind the overview, step-trace and memory pages, read from the analysis tables.

Why only reads: every number here was computed once by ``perfsight.analysis`` and saved by the
pipeline (``store.cache.save_tables``); the server selects, joins and reduces
curves for drawing, and never re-derives a metric from raw events.  Timestamps are made relative to
the run's origin (see ``models``) so the browser can hold them exactly.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from perfsight import __version__
from perfsight.analysis.operators import RANKING_MEASURES
from perfsight.analysis.overlap import PART_SHARES, SHARES
from perfsight.server import memory_curve, models, queries, step_points
from perfsight.server.kernel_types import top_op_types
from perfsight.server.registry import OpenedRun, RankData

TOP_OPERATOR_TYPES = 20
MEMO_ENTRIES = 64
OVERVIEW_SUFFIX = ".idx"
"""The saved overview (first line: its key; then the body), in the server's cache folder of the run
(``RankData.overview_file``); not named ``*.json``, which trace discovery would take for a trace."""
OVERVIEW_FORMAT = 3  # 2: warnings left out of the saved body; 3: shares.free_host_wait
_memo: dict[tuple[str, str], Any] = {}
_memo_lock = threading.Lock()


def _memoised(data: RankData, key: str, compute: Any) -> Any:
    """Per rank-cache results that need a scan of a big table, kept while the cache is unchanged."""
    stamp = (str(data.cache_folder), key + data.timeline.meta.get("stamp", ""))
    with _memo_lock:
        if stamp in _memo:
            return _memo[stamp]
    value = compute()
    with _memo_lock:
        _memo[stamp] = value
        while len(_memo) > MEMO_ENTRIES:  # old stamps (re-analysed runs) and closed runs go first
            _memo.pop(next(iter(_memo)))
    return value


def clear_memo() -> None:
    """Forget every memoised result, as a restarted server would (tests and benchmarks start several
    servers in one process)."""
    with _memo_lock:
        _memo.clear()


def step_table(data: RankData, origin: int, steps: Path | None = None) -> pa.Table:
    """step_trace (``steps``: another file of its schema, e.g. with the user's FP/BP points) joined
    with overlap_breakdown, one row per step (an empty table if missing)."""
    st, ob = steps or data.table_path("step_trace"), data.table_path("overlap_breakdown")
    if not st.is_file() or not ob.is_file():
        return pa.table({"step": pa.array([], pa.int32())})
    sql = """
        SELECT coalesce(s.step, o.step) AS step,
               s.start_ns - ? AS start_ns, s.end_ns - ? AS end_ns,
               coalesce(s.duration_ns, o.step_ns) AS duration_ns,
               s.fp_start_ns - ? AS fp_start_ns, s.bp_end_ns - ? AS bp_end_ns,
               s.iteration_interval_ns, s.fp_bp_ns, s.tail_ns, s.fp_op, s.bp_op, s.timeline,
               o.computing_ns, o.communication_ns, o.overlapped_ns, o.communication_not_overlapped_ns,
               o.free_ns, o.preparing_ns, o.step_ns
        FROM read_parquet(?) s FULL OUTER JOIN read_parquet(?) o USING (step)
        ORDER BY step
    """
    return queries.arrow(sql, [origin, origin, origin, origin, str(st), str(ob)])


def data_wait(data: RankData) -> dict[str, Any]:
    """Time waiting for data per step, from the ``data_wait`` analysis table (its ``source`` says
    whether perfsight's data-loader capture or the trace's ``data_loading`` ranges gave it)."""
    rows = queries.rows(data.table_path("data_wait"), "ORDER BY step", "step, data_wait_ns, source")
    if not rows:
        return {"source": None, "per_step": {}}
    return {"source": rows[0]["source"], "per_step": {str(r["step"]): int(r["data_wait_ns"]) for r in rows}}


def _shares(data: RankData) -> dict[str, Any]:
    """The ``time_shares`` analysis table as the overview's ``shares`` object (fractions and ns; all
    0 when no step could be broken down, and a part without its row -- a cache written before
    ``device_idle`` -- 0 too)."""
    rows = queries.rows(data.table_path("time_shares"), "", "share, ns, total_ns, fraction")
    names = [name for name, _ in (*SHARES, *PART_SHARES)]
    shares: dict[str, Any] = {"total_ns": rows[0]["total_ns"] if rows else 0}
    shares |= {name: 0.0 for name in names} | {r["share"]: r["fraction"] for r in rows}
    return shares | {f"{name}_ns": 0 for name in names} | {f"{r['share']}_ns": r["ns"] for r in rows}


def _top_operators(data: RankData) -> tuple[str, list[dict[str, Any]]]:
    """(what they are ranked by, the first rows of the ``operator_ranking`` analysis table)."""
    rows = queries.rows(
        data.table_path("operator_ranking"),
        f"ORDER BY position LIMIT {TOP_OPERATOR_TYPES}",
        "name, count, host_self_ns, device_total_ns, share, ranked_by",
    )
    if not rows:  # device ops only (a MindSpore graph run): its op types by device time
        device_types = top_op_types(data, TOP_OPERATOR_TYPES)
        if device_types:
            return "device_total_ns", device_types
    top_by = rows[0]["ranked_by"] if rows else RANKING_MEASURES[-1]
    return top_by, [{k: v for k, v in row.items() if k != "ranked_by"} for row in rows]


def overview_json(opened: OpenedRun, data: RankData) -> bytes:
    """The ``/overview`` response: :func:`overview_body` with the run's id as its first member and
    the rank's warnings as its last.  The warnings are not in the saved body: the server states
    them without its own paths (``Registry.opened``), which the analysis that saved it still had."""
    body = overview_body(opened, data)
    return (
        b'{"run":' + orjson.dumps(opened.run.id) + b"," + body[1:-1]
        + b',"warnings":' + orjson.dumps(list(data.meta.warnings)) + b"}"
    )  # fmt: skip


def _overview_key(opened: OpenedRun, data: RankData) -> bytes:
    """What the overview of ``data`` depends on besides its tables: the cache (its index's stamp),
    the run's origin and ranks, and the code that wrote it."""
    return orjson.dumps(
        {
            "format": OVERVIEW_FORMAT,
            "version": __version__,
            "stamp": data.timeline.meta.get("stamp", ""),
            "origin": opened.origin_ns,
            "ranks": sorted(opened.ranks),
        }
    )


def overview_body(opened: OpenedRun, data: RankData) -> bytes:
    """The overview as a JSON object without its ``run`` member, computed once per analysed cache (it
    cannot change until re-analysis): kept in memory, and saved in the cache's timeline folder so a
    fresh server (or the first visit after a background analysis, which writes it) reads it in a
    millisecond instead of running some 100-200 ms of DuckDB queries over the step tables."""
    key = _overview_key(opened, data)
    return _memoised(data, "overview:" + key.decode(), lambda: _saved_overview(opened, data, key))


def _saved_overview(opened: OpenedRun, data: RankData, key: bytes) -> bytes:
    path = data.overview_file
    if path is None:  # no folder of the server's own to keep it in
        return orjson.dumps(overview(opened, data), option=orjson.OPT_SERIALIZE_NUMPY)
    try:
        with open(path, "rb") as handle:
            if handle.readline().rstrip(b"\n") == key:
                return handle.read()
    except OSError:
        pass
    body = orjson.dumps(overview(opened, data), option=orjson.OPT_SERIALIZE_NUMPY)
    tmp = path.with_name(path.name + ".tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_bytes(key + b"\n" + body)
        tmp.replace(path)
    except OSError:  # a read-only cache: the next server computes it again
        tmp.unlink(missing_ok=True)
    return body


def overview(opened: OpenedRun, data: RankData) -> dict[str, Any]:
    """The overview of one rank, without the run's id and the warnings (see :func:`overview_json`)."""
    table = step_table(data, opened.origin_ns)
    waits = data_wait(data)
    per_step = waits["per_step"]
    wait_table = pa.table(
        {
            "step": np.array([int(k) for k in per_step], np.int64),
            "data_wait_ns": np.array(list(per_step.values()), np.int64),
        }
    )
    kept = ", ".join(
        f"t.{c}" for c in (
            "duration_ns", "iteration_interval_ns", "fp_bp_ns", "tail_ns", "computing_ns", "communication_ns",
            "overlapped_ns", "communication_not_overlapped_ns", "free_ns", "preparing_ns",
        )
    )  # fmt: skip
    breakdown = (
        queries.json_list(
            f"SELECT t.step, {kept}, w.data_wait_ns FROM t LEFT JOIN w ON t.step = w.step",
            {"t": table, "w": wait_table},
            "x.step",
        )
        if table.num_rows
        else []
    )
    shares = _shares(data)
    top_by, top = _top_operators(data)
    meta = data.timeline.meta
    tracks = data.tracks
    device = data.meta.devices[0].name if data.meta.devices else None
    peaks = queries.rows(
        data.table_path("memory_peaks"),
        "ORDER BY device_type, device_index",
        "device_type::VARCHAR AS device_type, device_index, peak_allocated_bytes, peak_reserved_bytes, "
        f"peak_ts_ns - {int(opened.origin_ns)} AS peak_ts_ns",
    )
    flops_path = data.table_path("flops_by_step")
    flops = (
        queries.json_list(
            "SELECT step, flops, flops_per_s, mfu FROM f",
            {"f": pq.ParquetFile(flops_path).read(columns=["step", "flops", "flops_per_s", "mfu"])},
            "x.step",
        )
        if flops_path.is_file()
        else []
    )
    return {
        "rank": data.rank,
        "ranks": sorted(opened.ranks),
        "device": device,
        "steps": breakdown,
        "shares": shares,
        "top_by": top_by,
        "operator_types": top,
        "data_wait": waits,
        "timeline": {
            "duration_ns": int(meta["last_ns"] - meta["first_ns"]) if meta["events"] else 0,
            "events": int(meta["events"]),
            "tracks": tracks.num_rows,
            "device_tracks": int(pc.sum(tracks.column("is_device")).as_py() or 0),
            "by_kind": meta["by_kind"],
        },
        "memory_peaks": peaks,
        "flops": flops,
    }


AVERAGED = tuple(models.StepAverage.model_fields)
"""The stages ``/step-trace`` averages over steps: the fields of its response's ``average``."""


def step_trace(
    opened: OpenedRun,
    data: RankData,
    step: int | None,
    fp_point: str | None = None,
    bp_point: str | None = None,
) -> dict[str, Any]:
    """The ``/step-trace`` response; with ``fp_point``/``bp_point``, the step trace the analysis
    computes with those points (``step_points``), the rest unchanged."""
    steps_path = step_points.step_trace_path(data, fp_point, bp_point)
    table = step_table(data, opened.origin_ns, steps_path)
    if table.num_rows:
        table = table.filter(pc.is_valid(table.column("start_ns")))
    keep = list(models.StepRow.model_fields)  # the response row declares the columns, once
    steps = (
        queries.json_list(f"SELECT {', '.join(keep)} FROM t", {"t": table}, "x.step")
        if table.num_rows
        else []
    )
    average = None
    if table.num_rows:
        average = {k: float(pc.mean(table.column(k).fill_null(0)).as_py()) for k in AVERAGED}
    intervals: list[dict[str, Any]] = []
    chosen = None
    if step is not None and table.num_rows:
        hit = table.filter(pc.equal(table.column("step"), step))
        chosen = (
            {k: hit.column(k)[0].as_py() for k in ("step", "start_ns", "end_ns")} if hit.num_rows else None
        )
    if chosen is not None:
        lo, hi = chosen["start_ns"] + opened.origin_ns, chosen["end_ns"] + opened.origin_ns
        origin = int(opened.origin_ns)
        intervals = queries.rows(
            data.table_path("overlap_intervals"),
            "WHERE end_ns > ? AND start_ns < ? ORDER BY lane, start_ns",
            f"lane::VARCHAR AS lane, greatest(start_ns, {int(lo)}) - {origin} AS start_ns, "
            f"least(end_ns, {int(hi)}) - {origin} AS end_ns",
            [lo, hi],
        )
    return {
        "run": opened.run.id,
        "rank": data.rank,
        "steps": steps,
        "average": average,
        "fp_ops": sorted({str(op) for op in pc.unique(table.column("fp_op")).to_pylist() if op})
        if table.num_rows
        else [],
        "bp_ops": sorted({str(op) for op in pc.unique(table.column("bp_op")).to_pylist() if op})
        if table.num_rows
        else [],
        "step": chosen["step"] if chosen is not None else None,
        "intervals": intervals,
        "fp_point": fp_point or None,
        "bp_point": bp_point or None,
        "point_warnings": step_points.warnings(steps_path, fp_point, bp_point),
        "point_candidates": _memoised(data, "step-points", lambda: step_points.candidates(data)),
    }


def memory(opened: OpenedRun, data: RankData, points: int, top: int) -> dict[str, Any]:
    peaks = {
        (r["device_type"], r["device_index"]): r
        for r in queries.rows(
            data.table_path("memory_peaks"),
            "",
            "device_type::VARCHAR AS device_type, device_index, "
            "peak_allocated_bytes, peak_reserved_bytes, peak_ts_ns",
        )
    }
    devices = []
    for curve in memory_curve.reduced_curves(data.table_path("memory_curve"), points):
        peak = peaks.get((curve["device_type"], curve["device_index"]), {})
        devices.append(
            {
                "device_type": curve["device_type"],
                "device_index": curve["device_index"],
                "peak_allocated_bytes": peak.get("peak_allocated_bytes"),
                "peak_reserved_bytes": peak.get("peak_reserved_bytes"),
                "peak_ts_ns": None
                if peak.get("peak_ts_ns") is None
                else peak["peak_ts_ns"] - opened.origin_ns,
                "points": curve["points"],
                "curve": {
                    "ts_ns": [t - opened.origin_ns for t in curve["ts_ns"]],
                    "allocated_bytes": curve["allocated_bytes"],
                    "reserved_bytes": curve["reserved_bytes"],
                },
            }
        )
    top_ops = queries.rows(
        data.table_path("operator_memory"),
        "WHERE size_bytes > 0 GROUP BY name ORDER BY total_bytes DESC, name LIMIT ?",
        "name, count(*) AS count, sum(size_bytes)::BIGINT AS total_bytes, max(size_bytes) AS max_bytes, "
        "avg(duration_ns) AS avg_lifetime_ns",
        [top],
    )
    return {"run": opened.run.id, "rank": data.rank, "devices": devices, "top_operators": top_ops}
