"""Web server benchmarks: timeline window queries, first timeline view, overview of a cached run.

Targets (issue "Web UI, part 1"): on a generated 10-million-event trace, p95 of a timeline window
query at 2,000 px <= 100 ms; first timeline view of a 1 GB trace <= 2 s after analysis; overview
API of a cached run <= 200 ms.

What is timed is the whole HTTP round trip through the ASGI app (routing, query, JSON encoding),
with FastAPI's in-process test client, so network and browser time are not included.  Each trace
is analysed first the way ``perfsight serve`` does it (a child process writing the Parquet cache
and the timeline index); "first view" then uses a *fresh* app (nothing opened or memoised) and
times ``/timeline/tracks`` + the full-extent ``/timeline/window`` -- what the timeline page asks
for first.  Windows for the p95 are random: a span log-uniform between 1e-5 and 1 of the trace,
at a random position.

"analyse s" is what opening the run took: a full analysis the first time, seconds when a fresh
cache exists (``--cache`` reused).  "(CPU)" columns are the process CPU time of the request (all
threads): the machine is shared, and wall time includes waiting for a core.

Usage::

    python benchmarks/bench_server.py --trace /tmp/gen10m/rank0.pt.trace.json \\
        [--first-view-trace /tmp/gen1g/rank0.pt.trace.json] [--queries 300] [--write-md docs/BENCHMARKS.md]

A trace path that does not exist is generated with ``benchmarks/gen_kineto_trace.py``
(``--size-mb``: 2800 gives about 10 million events).
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import platform
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent


def _generate(path: Path, size_mb: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, str(HERE / "gen_kineto_trace.py"), "--out", str(path), "--size-mb", str(size_mb)]
    subprocess.run(cmd, check=True)


def _client(base: Path, cache: Path) -> Any:
    from fastapi.testclient import TestClient

    from perfsight.server import create_app

    return TestClient(create_app(base, cache_dir=cache))


def _analyse(trace: Path, cache: Path) -> tuple[str, float]:
    """Open the run in a server and wait for its background analysis; returns (run id, seconds)."""
    base = trace.parent
    run = trace.relative_to(base).as_posix()
    start = time.perf_counter()
    with _client(base, cache) as client:
        while True:
            status = client.get("/api/run/status", params={"run": run}).json()
            if status["status"] == "ready":
                break
            if status["status"] == "failed":
                raise SystemExit(f"analysis of {trace} failed: {status['error']}")
            time.sleep(0.5)
    return run, time.perf_counter() - start


CPU_TIMES: list[float] = []
"""Process CPU seconds of each timed request (server threads included): on a loaded machine the
wall time includes waiting for a core; this is the work the request itself did."""


def _timed(client: Any, path: str, **params: Any) -> tuple[float, Any]:
    start, cpu = time.perf_counter(), time.process_time()
    response = client.get(path, params=params)
    elapsed = time.perf_counter() - start
    CPU_TIMES.append(time.process_time() - cpu)
    if response.status_code != 200:
        raise SystemExit(f"{path} {params}: HTTP {response.status_code} {response.text[:200]}")
    return elapsed, response.json()


def _p95(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[int(0.95 * (len(ordered) - 1))]


def first_view(trace: Path, cache: Path, width: int) -> dict[str, Any]:
    run = trace.relative_to(trace.parent).as_posix()
    with _client(trace.parent, cache) as client:
        t_tracks, tracks = _timed(client, "/api/run/timeline/tracks", run=run)
        t_window, window = _timed(
            client, "/api/run/timeline/window", run=run, start_ns=0, end_ns=tracks["end_ns"], width_px=width
        )
    return {
        "events": sum(t["events"] for t in tracks["tracks"]),
        "tracks_s": t_tracks,
        "window_s": t_window,
        "first_view_s": t_tracks + t_window,
        "returned": window["events"],
    }


def window_p95(trace: Path, cache: Path, width: int, queries: int, seed: int) -> dict[str, Any]:
    rng = random.Random(seed)
    run = trace.relative_to(trace.parent).as_posix()
    times, returned = [], []
    with _client(trace.parent, cache) as client:
        end = client.get("/api/run/timeline/tracks", params={"run": run}).json()["end_ns"]
        CPU_TIMES.clear()
        for _ in range(queries):
            span = max(1000, int(end * 10 ** rng.uniform(-5, 0)))
            lo = rng.randint(0, max(0, end - span))
            elapsed, body = _timed(
                client, "/api/run/timeline/window", run=run, start_ns=lo, end_ns=lo + span, width_px=width
            )
            times.append(elapsed)
            returned.append(body["events"])
    times.sort()
    return {
        "queries": queries,
        "p50_ms": 1000 * statistics.median(times),
        "p95_ms": 1000 * times[int(0.95 * (len(times) - 1))],
        "max_ms": 1000 * times[-1],
        "cpu_p95_ms": 1000 * _p95(CPU_TIMES),
        "mean_returned": statistics.mean(returned),
        "max_returned": max(returned),
    }


def overview(trace: Path, cache: Path, repeats: int = 20) -> dict[str, Any]:
    """Overview of a cached run: the first call of a fresh server, then warm repeats."""
    run = trace.relative_to(trace.parent).as_posix()
    with _client(trace.parent, cache) as client:
        CPU_TIMES.clear()
        cold, body = _timed(client, "/api/run/overview", run=run)
        cold_cpu = CPU_TIMES[-1]
        CPU_TIMES.clear()
        warm = [_timed(client, "/api/run/overview", run=run)[0] for _ in range(repeats)]
    return {
        "steps": len(body["steps"]),
        "cold_ms": 1000 * cold,
        "cold_cpu_ms": 1000 * cold_cpu,
        "warm_p95_ms": 1000 * _p95(warm),
        "warm_cpu_p95_ms": 1000 * _p95(CPU_TIMES),
    }


def machine() -> str:
    load = os.getloadavg()
    return (
        f"{os.cpu_count()} CPUs, {platform.machine()}, Linux {platform.release()}, Python "
        f"{platform.python_version()}; load average at start {load[0]:.1f} / {load[1]:.1f} / {load[2]:.1f}"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--trace", type=Path, required=True, help="the ~10M-event trace (generated if absent)"
    )
    parser.add_argument("--size-mb", type=int, default=2800, help="size when generating --trace")
    parser.add_argument("--first-view-trace", type=Path, help="the 1 GB trace for the first-view figure")
    parser.add_argument("--width", type=int, default=2000)
    parser.add_argument("--queries", type=int, default=300)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--cache", type=Path, help="server cache dir (default: a temporary one)")
    parser.add_argument("--write-md", type=Path, help="append the results as a table to this Markdown file")
    args = parser.parse_args(argv)
    started = machine()
    cache = args.cache or Path(tempfile.mkdtemp(prefix="perfsight-bench-server-"))
    rows = []
    traces = [args.trace] + ([args.first_view_trace] if args.first_view_trace else [])
    for trace in traces:
        if not trace.exists():
            _generate(trace, args.size_mb if trace == args.trace else 1024)
        run, analyse_s = _analyse(trace, cache)
        size_mb = trace.stat().st_size / 2**20
        view = first_view(trace, cache, args.width)
        lod = window_p95(trace, cache, args.width, args.queries, args.seed)
        ov = overview(trace, cache)
        row = {"trace": trace.parent.name + "/" + trace.name, "size_mb": size_mb, "analyse_s": analyse_s}
        row.update(**view, **lod, **ov)
        rows.append(row)
        print(row, flush=True)
    if args.write_md:
        lines = [
            "",
            f"Run of {dt.datetime.now(dt.UTC):%Y-%m-%d %H:%M} UTC. Machine: {started}.",
            f"Command: `python benchmarks/bench_server.py {' '.join(argv or sys.argv[1:])}`",
            "",
            "| trace | MB | events | steps | analyse s | first view s (tracks + full window) | window p50 ms "
            "| window p95 ms (CPU) | window max ms | entries/window mean (max) | overview cold ms (CPU) "
            "| overview warm p95 ms (CPU) |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for r in rows:
            lines.append(
                f"| {r['trace']} | {r['size_mb']:.0f} | {r['events']:,} | {r['steps']:,} | "
                f"{r['analyse_s']:.1f} | {r['first_view_s']:.2f} "
                f"({r['tracks_s']:.2f} + {r['window_s']:.2f}) | "
                f"{r['p50_ms']:.1f} | {r['p95_ms']:.1f} ({r['cpu_p95_ms']:.1f}) | {r['max_ms']:.1f} | "
                f"{r['mean_returned']:.0f} ({r['max_returned']}) | "
                f"{r['cold_ms']:.0f} ({r['cold_cpu_ms']:.0f}) | "
                f"{r['warm_p95_ms']:.0f} ({r['warm_cpu_p95_ms']:.0f}) |"
            )
        with open(args.write_md, "a", encoding="utf-8") as handle:
            handle.write("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
