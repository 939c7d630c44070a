"""Compare ways of parsing a Kineto trace, each in a fresh subprocess.

Prints one row per approach: median wall seconds of the timed step (imports excluded:
each child imports numpy, pyarrow, pyarrow.compute and pandas -- which pyarrow would
import on first use anyway -- before the clock starts), the child's peak RSS, its RSS
after imports, and the wall time as a ratio of the first row (on a shared, noisy
machine the ratios are the numbers to trust).

    python benchmarks/bench_parse.py [TRACE] [--repeats 3] [--only native,portable]

Approaches:
  native      perfsight.ingest.read_trace with the native scanner (the default reader)
  portable    read_trace on the portable path (PERFSIGHT_NATIVE=0: pyarrow.json)
  scan-only   native: decompress + scan to raw tables, no trace model
  gunzip      decompressing the file, nothing else (the floor for a .gz trace)
  duckdb      DuckDB json_extract_string over the events as one string column (parse only,
              a subset of fields; skipped when duckdb is not installed)
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DEFAULT_TRACE = REPO.parent / "shared" / "data" / "kineto" / "df_index_resolver" / "df_index_resolver.json.gz"
APPROACHES = ("native", "portable", "scan-only", "gunzip", "duckdb")


def _rss_mb() -> float:
    with open(f"/proc/{os.getpid()}/statm") as handle:
        return int(handle.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def _child(approach: str, trace: Path) -> dict[str, float]:
    import numpy  # noqa: F401
    import pandas  # noqa: F401
    import pyarrow.compute  # noqa: F401

    from perfsight.ingest import chrome_events, read_trace
    from perfsight.ingest.jsonstream import open_events

    after_imports = _rss_mb()
    start = time.perf_counter()
    if approach in ("native", "portable"):
        read_trace(trace)
    elif approach == "scan-only":
        results, _ = chrome_events.read_events(trace, native=True)
        for _result in results:
            pass
    elif approach == "gunzip":
        stream = open_events(trace)
        for _block in stream.blocks:
            pass
    elif approach == "duckdb":
        _duckdb(trace)
    wall = time.perf_counter() - start
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {"wall_s": wall, "peak_mb": peak, "imports_mb": after_imports}


def _duckdb(trace: Path) -> None:
    import duckdb
    import numpy as np
    import pyarrow as pa

    from perfsight.ingest.jsonstream import stream_events

    con = duckdb.connect()
    paths = ", ".join(f"'$.{k}'" for k in ("ph", "cat", "name", "pid", "tid", "ts", "dur"))
    extra = "'$.args.\"External id\"', '$.args.correlation'"
    batches, _ = stream_events(trace)
    for batch in batches:
        offsets = np.concatenate([[0], batch.ends]).astype(np.int32)
        events = pa.StringArray.from_buffers(len(batch.ends), pa.py_buffer(offsets), pa.py_buffer(batch.data))
        events_table = pa.table({"j": events})  # noqa: F841 - read by the query below
        con.sql(
            f"select e[1] ph, e[2] cat, e[3] name, e[4] pid, e[5] tid, e[6]::DECIMAL(24,3) ts, "
            f"e[7]::DECIMAL(24,3) dur, e[8]::BIGINT ext, e[9]::BIGINT corr "
            f"from (select json_extract_string(j, [{paths}, {extra}]) e from events_table)"
        ).to_arrow_table()


def _run(approach: str, trace: Path) -> dict[str, float] | None:
    env = dict(os.environ)
    if approach == "portable":
        env["PERFSIGHT_NATIVE"] = "0"
    if approach == "duckdb":
        probe = subprocess.run([sys.executable, "-c", "import duckdb"], capture_output=True)
        if probe.returncode:
            return None
    done = subprocess.run(
        [sys.executable, __file__, "--child", approach, str(trace)],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    if done.returncode:
        raise RuntimeError(f"{approach} failed:\n{done.stderr}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("trace", type=Path, nargs="?", default=DEFAULT_TRACE)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--only", help="comma-separated approaches (default: all)")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(_child(args.child, args.trace)))
        return
    chosen = args.only.split(",") if args.only else list(APPROACHES)
    size_mb = args.trace.stat().st_size / 2**20
    print(f"trace: {args.trace} ({size_mb:.1f} MB on disk), {args.repeats} runs each")
    print(f"| {'approach':<10} | wall s | ratio | peak RSS MB | RSS after imports MB |")
    print(f"| {'-' * 10} | -----: | ----: | ----------: | -------------------: |")
    first: float | None = None
    for approach in chosen:
        runs = [_run(approach, args.trace) for _ in range(args.repeats)]
        if any(r is None for r in runs):
            print(f"| {approach:<10} | (not installed) | | | |")
            continue
        wall = statistics.median(r["wall_s"] for r in runs if r)
        peak = max(r["peak_mb"] for r in runs if r)
        imports = statistics.median(r["imports_mb"] for r in runs if r)
        first = first or wall
        print(f"| {approach:<10} | {wall:6.3f} | {wall / first:5.2f} | {peak:11.0f} | {imports:20.0f} |")


if __name__ == "__main__":
    main()
