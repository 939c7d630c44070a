"""Serving one big analysed trace: the server's peak RSS and latency per route (issue 21, target 1).

Why a benchmark of its own: ``bench_server.py`` times queries in-process; what matters here is the
memory of a real ``perfsight serve`` process while a browser opens the overview, the operators
page (its tables, a sort, a search, a later page) and the timeline (first view, a zoomed window),
then the memory and step-trace pages, on one rank whose trace is gigabytes.  The analysis is made
beforehand by ``perfsight analyse`` (``--out`` beside the trace, so the server analyses nothing).

How memory is measured: before each request the process's peak RSS is reset (``5`` written to
``/proc/PID/clear_refs``, Linux >= 4.0), so ``VmHWM`` after the request is the peak *during* it
(mapped pages of the timeline index included, as ``/usr/bin/time`` counts them).  Each route is
asked once cold (first request, nothing memoised) and ``--repeat`` times more for the p50 latency.

Usage::

    python benchmarks/bench_serve_big.py --base /tmp/sb/base1 [--repeat 5] [--port 8765]
    python benchmarks/bench_serve_big.py --base /tmp/sb/base2 --operators-times 5
    python benchmarks/bench_serve_big.py --base /tmp/sb/base2 --memory-times 5

The last two forms stand in for a trace too big to analyse here: the base's ``operator_instances``
table (or ``memory_curve``) is written five times over into one file and deep pages of it (or the
memory page) are asked, each in a fresh process, their rise in peak RSS printed (run it with
``PYTHONPATH`` on an older ``src`` to compare).

``--base`` holds the trace and the folder ``perfsight analyse TRACE --out`` wrote (the one run of
that base dir must be ready at once).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

PLOT_PX = 1400
"""The timeline canvas's plot width at a 1,600-pixel window (what the UI tests use)."""


def _status(pid: int) -> dict[str, int]:
    """VmRSS and VmHWM of ``pid`` in MB."""
    out = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            out[key] = int(value.split()[0]) // 1024
    return out


def _reset_peak(pid: int) -> None:
    Path(f"/proc/{pid}/clear_refs").write_text("5")


class Server:
    """``perfsight serve`` in a child process, with a private cache folder (nothing saved before)."""

    def __init__(self, base: Path, port: int) -> None:
        self.cache = Path(tempfile.mkdtemp(prefix="bench_serve_big_"))
        exe = Path(sys.executable).with_name("perfsight")
        cmd = [
            str(exe),
            "serve",
            "--summary-base-dir",
            str(base),
            "--port",
            str(port),
            "--cache-dir",
            str(self.cache),
        ]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        self.url = f"http://127.0.0.1:{port}"
        for _ in range(600):
            try:
                self.get("/api/info")
                return
            except OSError:
                if self.proc.poll() is not None:
                    raise SystemExit(f"server exited: {self.proc.stderr.read().decode()[-2000:]}") from None
                time.sleep(0.1)
        raise SystemExit("server did not start")

    def get(self, path: str, **params: Any) -> bytes:
        query = urllib.parse.urlencode({k: v for k, v in params.items() if v is not None})
        with urllib.request.urlopen(f"{self.url}{path}?{query}", timeout=600) as response:
            return response.read()

    def close(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=30)
        shutil.rmtree(self.cache, ignore_errors=True)


def browser_requests(run: str, end_ns: int, span: tuple[int, int]) -> list[tuple[str, str, dict[str, Any]]]:
    """(route label, path, params) in the order the UI asks them (see web/src/pages)."""
    r = {"run": run, "rank": 0}
    ops = {**r, "limit": 25}
    lo, hi = span  # the steps' span: where the timeline opens
    width = hi - lo
    first = (max(0, lo - width // 2), min(end_ns, hi + width // 2))
    first_px = round((first[1] - first[0]) / width * PLOT_PX)
    mid = (lo + hi) // 2
    zoom = max(1000, width // 100)
    zoomed = (max(0, mid - zoom), min(end_ns, mid + zoom))  # 1 % of the steps, half a screen either side
    return [
        ("overview: findings", "/api/run/findings", r),
        ("overview: overview", "/api/run/overview", r),
        (
            "operators: kernel-types top 20",
            "/api/run/kernel-types",
            {**r, "limit": 20, "sort": "total_ns", "order": "desc"},
        ),
        (
            "operators: operator-types page",
            "/api/run/operator-types",
            {**ops, "sort": "device_total_ns", "order": "desc"},
        ),
        ("operators: operators page 1", "/api/run/operators", {**ops, "sort": "dur_ns", "order": "desc"}),
        (
            "operators: kernel-types page",
            "/api/run/kernel-types",
            {**ops, "sort": "total_ns", "order": "desc"},
        ),
        ("operators: kernels page 1", "/api/run/kernels", {**ops, "sort": "dur_ns", "order": "desc"}),
        ("operators: operators by start", "/api/run/operators", {**ops, "sort": "start_ns", "order": "asc"}),
        ("operators: operators by name", "/api/run/operators", {**ops, "sort": "name", "order": "asc"}),
        (
            "operators: operators page 1001",
            "/api/run/operators",
            {**ops, "sort": "dur_ns", "order": "desc", "offset": 25_000},
        ),
        (
            "operators: operators search",
            "/api/run/operators",
            {**ops, "sort": "dur_ns", "order": "desc", "q": "flash backward"},
        ),
        (
            "operators: one type's operators",
            "/api/run/operators",
            {**ops, "sort": "dur_ns", "order": "desc", "name": "aten::mm"},
        ),
        (
            "operators: kernels search",
            "/api/run/kernels",
            {**ops, "sort": "dur_ns", "order": "desc", "q": "allreduce"},
        ),
        ("timeline: tracks", "/api/run/timeline/tracks", {"run": run}),
        (
            "timeline: first window",
            "/api/run/timeline/window",
            {"run": run, "start_ns": first[0], "end_ns": first[1], "width_px": first_px},
        ),
        (
            "timeline: first flows",
            "/api/run/timeline/flows",
            {"run": run, "start_ns": first[0], "end_ns": first[1], "limit": 2000},
        ),
        (
            "timeline: zoomed window",
            "/api/run/timeline/window",
            {"run": run, "start_ns": zoomed[0], "end_ns": zoomed[1], "width_px": 2 * PLOT_PX},
        ),
        (
            "timeline: zoomed flows",
            "/api/run/timeline/flows",
            {"run": run, "start_ns": zoomed[0], "end_ns": zoomed[1], "limit": 2000},
        ),
        ("timeline: search", "/api/run/timeline/search", {"run": run, "q": "all_reduce", "limit": 100}),
        ("memory page", "/api/run/memory", r),
        ("step-trace page", "/api/run/step-trace", r),
    ]


def measure(base: Path, port: int, repeat: int) -> dict[str, Any]:
    server = Server(base, port)
    try:
        pid = server.proc.pid
        runs = json.loads(server.get("/api/runs"))["runs"]
        if len(runs) != 1:
            raise SystemExit(f"{base}: expected one run, found {[x['id'] for x in runs]}")
        run = runs[0]["id"]
        status = json.loads(server.get("/api/run/status", run=run))
        if status["status"] != "ready":
            raise SystemExit(f"run {run} is {status['status']}: analyse it with --out beside the trace first")
        started = _status(pid)
        tracks = json.loads(server.get("/api/run/timeline/tracks", run=run))
        span = tracks["steps_span"] or {"start_ns": 0, "end_ns": tracks["end_ns"]}
        plan = browser_requests(run, tracks["end_ns"], (span["start_ns"], span["end_ns"]))
        rows = []
        for label, path, params in plan:
            peaks, rises, times = [], [], []
            for i in range(1 + repeat):
                _reset_peak(pid)
                before = _status(pid)["VmRSS"]
                t0 = time.perf_counter()
                server.get(path, **params)
                times.append(time.perf_counter() - t0)
                peaks.append(_status(pid)["VmHWM"])
                rises.append(peaks[-1] - before)
                if i == 0:
                    cold = times[0]
            rows.append(
                {
                    "route": label,
                    "peak_mb": max(peaks),
                    "rise_mb": max(rises),
                    "cold_ms": cold * 1e3,
                    "p50_ms": statistics.median(times[1:] or times) * 1e3,
                    "rss_after_mb": _status(pid)["VmRSS"],
                }
            )
            print(
                f"{label:34s} peak {rows[-1]['peak_mb']:6d} MB (+{rows[-1]['rise_mb']:4d})  "
                f"cold {rows[-1]['cold_ms']:8.1f} ms  "
                f"p50 {rows[-1]['p50_ms']:8.1f} ms  rss {rows[-1]['rss_after_mb']} MB",
                flush=True,
            )
        return {
            "run": run,
            "started_rss_mb": started["VmRSS"],
            "rows": rows,
            "peak_mb": max(r["peak_mb"] for r in rows),
            "load": os.getloadavg(),
        }
    finally:
        server.close()


PROBE_PAGES = (("dur_ns", 0), ("dur_ns", 25_000), ("start_ns", "90%"), ("name", "40%"))
"""(sort, offset) of the operator pages probed on a scaled table: the first page, a page past
DuckDB's top-N, and two deep ones (an offset ending in % is that share of the table)."""


def probe_page(path: Path, sort: str, offset: int) -> None:
    """One operators page of ``path`` in this (fresh) process: prints its rise in peak RSS."""
    from perfsight.server import queries

    queries.database()
    getattr(queries, "pages_database", lambda: None)()  # absent before the bounded pages
    before = _status(os.getpid())["VmHWM"]
    t0 = time.perf_counter()
    page = queries.view_page(queries.OPERATORS, path, sort=sort, order="desc", offset=offset, limit=25)
    elapsed = time.perf_counter() - t0
    rise = _status(os.getpid())["VmHWM"] - before
    print(json.dumps({"sort": sort, "offset": offset, "rise_mb": rise, "s": elapsed, "total": page["total"]}))


def scaled_operators(base: Path, times: int) -> dict[str, Any]:
    """The base's ``operator_instances`` written ``times`` over into one file (slice ids shifted so
    they stay unique), as a trace ``times`` larger would have it; each of :data:`PROBE_PAGES`
    asked of it in a fresh process."""
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    (source,) = base.glob("*/rank*/cache/analysis/operator_instances.parquet")
    table = pq.read_table(source)
    shift = int(pc.max(table.column("slice")).as_py()) + 1
    folder = Path(tempfile.mkdtemp(prefix="bench_serve_big_ops_"))
    target = folder / "operator_instances.parquet"
    try:
        with pq.ParquetWriter(target, table.schema) as writer:
            for k in range(times):
                column = table.schema.get_field_index("slice")
                writer.write_table(
                    table.set_column(column, "slice", pc.add(table.column("slice"), k * shift))
                )
        rows = table.num_rows * times
        del table
        out = []
        for sort, at in PROBE_PAGES:
            offset = int(rows * int(at[:-1]) / 100) if isinstance(at, str) else at
            cmd = [sys.executable, __file__, "--probe-page", str(target), sort, str(offset)]
            done = subprocess.run(cmd, check=True, capture_output=True, text=True)
            out.append(json.loads(done.stdout.splitlines()[-1]))
            print(
                f"{rows:,} rows, sort {sort}, offset {offset:,}: "
                f"+{out[-1]['rise_mb']} MB, {out[-1]['s']:.2f} s"
            )
        return {"rows": rows, "pages": out, "load": os.getloadavg()}
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def probe_memory(folder: Path) -> None:
    """The memory page's curves of the rank folder ``folder`` in this (fresh) process: prints the
    rise in peak RSS."""
    import types

    from perfsight.server import pages, queries

    queries.database()
    getattr(queries, "pages_database", lambda: None)()
    data = types.SimpleNamespace(
        rank=0, table_path=lambda name: folder / "cache" / "analysis" / f"{name}.parquet"
    )
    opened = types.SimpleNamespace(origin_ns=0, run=types.SimpleNamespace(id="probe"))
    before = _status(os.getpid())["VmHWM"]
    t0 = time.perf_counter()
    body = pages.memory(opened, data, 2000, 20)  # type: ignore[arg-type]
    elapsed = time.perf_counter() - t0
    rise = _status(os.getpid())["VmHWM"] - before
    print(json.dumps({"rise_mb": rise, "s": elapsed, "rows": sum(d["points"] for d in body["devices"])}))


def scaled_memory(base: Path, times: int) -> dict[str, Any]:
    """The base's ``memory_curve`` written ``times`` over (each copy later in time), its memory page
    asked in a fresh process."""
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    (source,) = base.glob("*/rank*/cache/analysis/memory_curve.parquet")
    table = pq.read_table(source)
    span = int(pc.max(table.column("ts_ns")).as_py()) - int(pc.min(table.column("ts_ns")).as_py()) + 1
    folder = Path(tempfile.mkdtemp(prefix="bench_serve_big_mem_"))
    try:
        (folder / "cache" / "analysis").mkdir(parents=True)
        column = table.schema.get_field_index("ts_ns")
        with pq.ParquetWriter(folder / "cache" / "analysis" / "memory_curve.parquet", table.schema) as writer:
            for k in range(times):
                writer.write_table(table.set_column(column, "ts_ns", pc.add(table.column("ts_ns"), k * span)))
        del table
        cmd = [sys.executable, __file__, "--probe-memory", str(folder)]
        done = subprocess.run(cmd, check=True, capture_output=True, text=True)
        found = json.loads(done.stdout.splitlines()[-1])
        print(f"memory page of {found['rows']:,} curve rows: +{found['rise_mb']} MB, {found['s']:.2f} s")
        return {**found, "load": os.getloadavg()}
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def main() -> None:
    if len(sys.argv) == 5 and sys.argv[1] == "--probe-page":
        probe_page(Path(sys.argv[2]), sys.argv[3], int(sys.argv[4]))
        return
    if len(sys.argv) == 3 and sys.argv[1] == "--probe-memory":
        probe_memory(Path(sys.argv[2]))
        return
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--base", type=Path, required=True, help="folder with the trace and its analysis")
    parser.add_argument("--repeat", type=int, default=5, help="requests per route after the first")
    parser.add_argument("--port", type=int, default=8765)
    parser.add_argument("--json", type=Path, help="also write the figures here")
    parser.add_argument(
        "--operators-times",
        type=int,
        help="instead: the operators pages of the base's operator table repeated this many times",
    )
    parser.add_argument(
        "--memory-times",
        type=int,
        help="instead: the memory page of the base's memory curve repeated this many times",
    )
    args = parser.parse_args()
    if args.operators_times:
        result = scaled_operators(args.base, args.operators_times)
    elif args.memory_times:
        result = scaled_memory(args.base, args.memory_times)
    else:
        result = measure(args.base, args.port, args.repeat)
        print(
            f"server RSS after opening: {result['started_rss_mb']} MB; "
            f"peak of any route: {result['peak_mb']} MB; "
            f"load average {result['load'][0]:.2f}"
        )
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
