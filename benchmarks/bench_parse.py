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

The well-kept general parsers below (issue 21's notes) each do a *subset* of the native
scanner's work: decompress (ISA-L, the same as the reader's), parse, and build Arrow columns of
the nine fields every trace needs (ph, cat, name, pid, tid, ts, dur, args' External id and
correlation), with ``ts``/``dur`` as float microseconds, not exact nanoseconds, and none of the
other 29 ``args`` columns.  One that is slower than the native row even so cannot replace it.
Each is skipped when its package is not installed (they are not dependencies of perfsight):

  orjson      orjson.loads of the whole file, then the columns from the list of dicts
  yyjson      yyjson.loads (Python objects), then the same
  simdjson    pysimdjson's Parser.parse (lazy proxies: only the nine fields are touched)
  msgspec     msgspec.json.decode into typed Structs of the nine fields (others skipped in C)
  polars      Polars' read_ndjson with an explicit schema over the events, one per line (the
              events split by perfsight's own splitter, as for duckdb)
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
APPROACHES = (
    "native", "portable", "scan-only", "gunzip", "duckdb",
    "orjson", "yyjson", "simdjson", "msgspec", "polars",
)  # fmt: skip
GENERAL = ("orjson", "yyjson", "simdjson", "msgspec")
"""The whole-document parsers: they decode the decompressed file in one call."""
MODULES = {name: name for name in ("duckdb", "yyjson", "simdjson", "msgspec", "polars")}
"""Optional packages: an approach is skipped when its module is not importable."""


def _rss_mb() -> float:
    with open(f"/proc/{os.getpid()}/statm") as handle:
        return int(handle.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def _cpu_s() -> float:
    """CPU seconds of this process, all threads (the steadier figure on a shared machine)."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _child(approach: str, trace: Path) -> dict[str, float]:
    import numpy  # noqa: F401
    import pandas  # noqa: F401
    import pyarrow.compute  # noqa: F401

    from perfsight.ingest import chrome_events, read_trace
    from perfsight.ingest.jsonstream import open_events

    after_imports = _rss_mb()
    start, cpu_start = time.perf_counter(), _cpu_s()
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
    elif approach == "polars":
        _polars(trace)
    elif approach in GENERAL:
        _general(approach, trace)
    wall, cpu = time.perf_counter() - start, _cpu_s() - cpu_start
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {"wall_s": wall, "cpu_s": cpu, "peak_mb": peak, "imports_mb": after_imports}


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


NINE = ("ph", "cat", "name", "pid", "tid", "ts", "dur")
"""The event's own fields every approach converts (plus two ``args`` keys)."""


def _decompressed(trace: Path) -> bytes:
    """The whole JSON text (ISA-L inflate, as perfsight's reader uses)."""
    data = trace.read_bytes()
    if trace.suffix != ".gz":
        return data
    from isal import igzip

    return igzip.decompress(data)


def _columns(events: list, get) -> object:
    """Arrow table of the nine fields from per-event objects (``get(event, key)``)."""
    import pyarrow as pa

    def ids(values: list) -> pa.Array:  # Kineto's pid/tid are ints or labels ("Spans")
        return pa.array([v if isinstance(v, int) else None for v in values], pa.int64())

    cols = {key: [get(e, key) for e in events] for key in NINE}
    args = [get(e, "args") or {} for e in events]
    return pa.table(
        {
            "ph": pa.array(cols["ph"], pa.string()),
            "cat": pa.array(cols["cat"], pa.string()),
            "name": pa.array(cols["name"], pa.string()),
            "pid": ids(cols["pid"]),
            "tid": ids(cols["tid"]),
            "ts": pa.array(cols["ts"], pa.float64()),
            "dur": pa.array(cols["dur"], pa.float64()),
            "external_id": pa.array([a.get("External id") for a in args], pa.int64()),
            "correlation": pa.array([a.get("correlation") for a in args], pa.int64()),
        }
    )


def _general(approach: str, trace: Path) -> None:
    data = _decompressed(trace)
    if approach == "orjson":
        import orjson

        _columns(orjson.loads(data)["traceEvents"], dict.get)
    elif approach == "yyjson":
        import yyjson

        _columns(yyjson.loads(data)["traceEvents"], dict.get)
    elif approach == "simdjson":
        import simdjson

        events = simdjson.Parser().parse(data)["traceEvents"]

        def get(event, key):  # proxies: convert only what is read
            value = event.get(key)
            return value.as_dict() if key == "args" and value is not None else value

        _columns(list(events), get)
    else:
        _msgspec(data)


def _msgspec(data: bytes) -> None:
    import msgspec

    # built with defstruct: class bodies here would have string annotations (future import)
    args = msgspec.defstruct(
        "Args", [("external_id", int | None, msgspec.field(default=None, name="External id")),
                 ("correlation", int | None, None)],
    )  # fmt: skip
    optional = [(key, int | str | None if key in ("pid", "tid") else str | None, None) for key in NINE[1:5]]
    event = msgspec.defstruct(
        "Event",
        [("ph", str, ""), *optional, ("ts", float | None, None), ("dur", float | None, None),
         ("args", args | None, None)],
    )  # fmt: skip
    document = msgspec.defstruct("Document", [("traceEvents", list[event])])
    events = msgspec.json.decode(data, type=document).traceEvents

    def get(event, key):
        if key == "args":
            a = event.args
            return None if a is None else {"External id": a.external_id, "correlation": a.correlation}
        return getattr(event, key)

    _columns(events, get)


def _polars(trace: Path) -> None:
    import numpy as np
    import polars as pl

    from perfsight.ingest.jsonstream import stream_events

    schema = {
        "ph": pl.String, "cat": pl.String, "name": pl.String, "pid": pl.Int64, "tid": pl.Int64,
        "ts": pl.Float64, "dur": pl.Float64,
        "args": pl.Struct({"External id": pl.Int64, "correlation": pl.Int64}),
    }  # fmt: skip
    batches, _ = stream_events(trace)
    for batch in batches:
        ends = np.asarray(batch.ends, np.int64)
        data = np.frombuffer(batch.data, np.uint8)[: ends[-1] if len(ends) else 0].copy()
        data[(data == ord("\n")) | (data == ord("\r"))] = ord(" ")  # raw breaks are layout only
        lines = np.insert(data, ends[:-1], ord("\n")).tobytes()  # an event per line
        pl.read_ndjson(lines, schema=schema, ignore_errors=True).to_arrow()


def _run(approach: str, trace: Path) -> dict[str, float] | None:
    env = dict(os.environ)
    if approach == "portable":
        env["PERFSIGHT_NATIVE"] = "0"
    if approach in MODULES:
        probe = subprocess.run([sys.executable, "-c", f"import {MODULES[approach]}"], capture_output=True)
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
    print(f"| {'approach':<10} | wall s | ratio | CPU s | CPU ratio | peak RSS MB | RSS after imports MB |")
    print(f"| {'-' * 10} | -----: | ----: | ----: | --------: | ----------: | -------------------: |")
    first: float | None = None
    first_cpu: float | None = None
    for approach in chosen:
        runs = [_run(approach, args.trace) for _ in range(args.repeats)]
        if any(r is None for r in runs):
            print(f"| {approach:<10} | (not installed) | | | | | |")
            continue
        wall = statistics.median(r["wall_s"] for r in runs if r)
        peak = max(r["peak_mb"] for r in runs if r)
        imports = statistics.median(r["imports_mb"] for r in runs if r)
        cpu = statistics.median(r["cpu_s"] for r in runs if r)
        first, first_cpu = first or wall, first_cpu or cpu
        print(
            f"| {approach:<10} | {wall:6.3f} | {wall / first:5.2f} | {cpu:5.3f} | {cpu / first_cpu:9.2f} "
            f"| {peak:11.0f} | {imports:20.0f} |"
        )


if __name__ == "__main__":
    main()
