"""Peak memory of the rank writers fed the whole trace vs fed chunk by chunk (issue 21).

Why this exists: ``export/chunked_outputs.write_outputs_chunked`` must write every output of a
rank without holding the whole trace or a whole per-row table, so that a trace larger than
memory can be written.  This script measures that on a generated trace:

1. ``gen_kineto_trace.py --size-mb N`` writes the trace (skipped with ``--trace``);
2. one process reads and analyses it, then saves what each writer needs on disk: the trace cut
   into chunks of whole steps (``model_chunks.split_by_steps``, each chunk a cache folder), the
   per-row tables (``chunked_outputs.ROW_TABLES``) and the other tables as Parquet, the advisor's
   findings as JSON;
3. a fresh process per mode writes the rank's outputs from those files and reports its peak RSS
   (``VmHWM``) and its RSS before the writers started:

   * ``whole``: the trace and every table loaded whole, then the writers of
     ``pipeline.analyse_and_write`` (cached trace, ``_write_tables``, advisor.json);
   * ``chunked``: ``write_outputs_chunked`` reading each chunk from its folder when asked and
     each per-row table a Parquet batch at a time.

Last, every output file of the two modes is compared (bytes; Parquet: the table read back).

Usage::

    python benchmarks/bench_chunked_writers.py --size-mb 256 [--export-types text,db] [--keep]
"""

from __future__ import annotations

import argparse
import filecmp
import json
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BATCH_ROWS = 65_536
"""Rows per batch of the per-row tables fed to the chunked writers."""


def _rss_mb() -> float:
    with open("/proc/self/statm", encoding="ascii") as statm:
        return int(statm.read().split()[1]) * resource.getpagesize() / 2**20


def _peak_mb() -> float:
    """This process's peak RSS (``VmHWM``: unlike ``ru_maxrss``, not inherited from the parent
    that forked it, which held the whole trace while preparing)."""
    with open("/proc/self/status", encoding="ascii") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def prepare(trace_path: Path, work: Path, max_slices: int, export_types: tuple[str, ...]) -> dict:
    """Read and analyse the trace once; save the chunks and tables the two writer runs read."""
    import numpy as np
    import pyarrow.parquet as pq

    from perfsight import advisor, pipeline
    from perfsight.export.chunked_outputs import ROW_TABLES
    from perfsight.ingest import read_trace
    from perfsight.model_chunks import split_by_steps
    from perfsight.store import cache

    trace = read_trace(trace_path)
    cache.save_trace(trace, work / "trace")
    result = pipeline.analyse_trace(trace, pipeline.Options(export_types=export_types))
    (work / "tables").mkdir(parents=True)
    for name, table in result.tables.items():  # row groups of a batch: read back one at a time
        pq.write_table(table, work / "tables" / f"{name}.parquet", row_group_size=BATCH_ROWS)
    (work / "findings.json").write_text(json.dumps(advisor.rank_findings(result.tables, trace), default=str))
    count = 0
    for chunk in split_by_steps(trace, max_slices):
        folder = work / "chunks" / f"{chunk.number:05d}"
        cache.save_trace(chunk.trace, folder)
        np.savez(
            folder / "rows.npz", slice_rows=chunk.slice_rows, steps=np.array(chunk.steps), **chunk.table_rows
        )
        count = chunk.count
    return {
        "slices": trace.slices.num_rows,
        "steps": trace.steps.num_rows,
        "chunks": count,
        "order": list(result.tables),
        "row_tables": [n for n in result.tables if n in ROW_TABLES],
    }


def _chunks(work: Path) -> Iterator:
    import numpy as np

    from perfsight.model_chunks import TraceChunk
    from perfsight.store import cache

    folders = sorted((work / "chunks").iterdir())
    for number, folder in enumerate(folders):
        saved = np.load(folder / "rows.npz")
        rows = {k: saved[k] for k in saved.files if k not in ("slice_rows", "steps")}
        yield TraceChunk(
            trace=cache.load_trace(folder),
            slice_rows=saved["slice_rows"],
            steps=tuple(int(s) for s in saved["steps"]),
            number=number,
            count=len(folders),
            table_rows=rows,
        )


def write(mode: str, work: Path, out: Path, export_types: tuple[str, ...]) -> dict:
    """One mode's writers, in this (fresh) process; returns its memory figures and time."""
    import pyarrow.parquet as pq

    from perfsight import heap, pipeline
    from perfsight.export.chunked_outputs import ROW_TABLES, write_outputs_chunked
    from perfsight.export.staging import background_writer, staged
    from perfsight.store import cache

    heap.prefer_returning_pool()  # as in `perfsight analyse`, where reading the trace sets it
    options = pipeline.Options(export_types=export_types)
    info = json.loads((work / "info.json").read_text())
    findings = json.loads((work / "findings.json").read_text())
    if mode == "whole":
        trace = cache.load_trace(work / "trace")
        tables = {name: pq.read_table(work / "tables" / f"{name}.parquet") for name in info["order"]}
        before, start = _rss_mb(), time.perf_counter()
        with (
            staged(out, (pipeline.OUTPUT_DIR, pipeline.CACHE_DIR)) as stage,
            background_writer("bench-writer") as background,
        ):
            cached = background.submit(cache.save_trace, trace, stage / pipeline.CACHE_DIR)
            result = pipeline.RankResult(trace=trace, tables=tables)
            pipeline._write_tables(result, stage, options, background, cached)  # advisor.json too
    else:
        small = {
            name: pq.read_table(work / "tables" / f"{name}.parquet")
            for name in info["order"]
            if name not in ROW_TABLES
        }

        def batches(name: str) -> Iterator:
            return pq.ParquetFile(work / "tables" / f"{name}.parquet").iter_batches(BATCH_ROWS)

        rows = {name: (lambda n=name: batches(n)) for name in info["row_tables"]}
        steps = cache.load_trace_table(work / "trace", "steps")
        before, start = _rss_mb(), time.perf_counter()
        write_outputs_chunked(out, lambda: _chunks(work), small, rows, steps, options, findings)
    return {
        "mode": mode,
        "rss_before_mb": before,
        "peak_mb": _peak_mb(),
        "wall_s": time.perf_counter() - start,
    }


def _same_outputs(a: Path, b: Path) -> list[str]:
    import pyarrow.parquet as pq

    names = sorted({p.relative_to(a) for p in a.rglob("*") if p.is_file()})
    other = sorted({p.relative_to(b) for p in b.rglob("*") if p.is_file()})
    differ = [str(n) for n in set(names) ^ set(other)]
    for name in names:
        if name.suffix == ".parquet":
            same = pq.read_table(a / name).equals(pq.read_table(b / name))
        else:
            same = (b / name).is_file() and filecmp.cmp(a / name, b / name, shallow=False)
        if not same:
            differ.append(str(name))
    return differ


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size-mb", type=int, default=256)
    parser.add_argument("--trace", type=Path, help="an existing trace instead of a generated one")
    parser.add_argument("--max-slices", type=int, default=1, help="chunk budget (1: one step per chunk)")
    parser.add_argument("--export-types", default="text", help="comma-separated: text,db")
    parser.add_argument("--keep", action="store_true", help="keep the work folder")
    parser.add_argument("--mode", choices=("whole", "chunked"), help=argparse.SUPPRESS)
    parser.add_argument("--work", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    export_types = tuple(args.export_types.split(","))
    if args.mode:  # the child process of one mode
        figures = write(args.mode, args.work, args.work / f"out_{args.mode}", export_types)
        print(json.dumps(figures))
        return 0
    work = Path(tempfile.mkdtemp(prefix="bench_chunked_writers_"))
    try:
        trace = args.trace
        if trace is None:
            trace = work / "big.pt.trace.json"
            subprocess.run(
                [sys.executable, str(ROOT / "benchmarks" / "gen_kineto_trace.py"), "--out", str(trace),
                 "--size-mb", str(args.size_mb), "--seed", "0"],
                check=True, stdout=subprocess.DEVNULL,
            )  # fmt: skip
        info = prepare(trace, work, args.max_slices, export_types)
        (work / "info.json").write_text(json.dumps(info))
        size = trace.stat().st_size / 2**20
        print(
            f"trace {size:.0f} MB: {info['slices']:,} slices, {info['steps']} steps, {info['chunks']} chunks"
        )
        print(f"{'mode':<8} {'RSS before writers MB':>22} {'peak RSS MB':>12} {'writers s':>10}")
        for mode in ("whole", "chunked"):
            child = subprocess.run(
                [sys.executable, __file__, "--mode", mode, "--work", str(work),
                 "--export-types", args.export_types],
                check=True, capture_output=True, text=True,
            )  # fmt: skip
            f = json.loads(child.stdout.strip().splitlines()[-1])
            print(f"{mode:<8} {f['rss_before_mb']:>22.0f} {f['peak_mb']:>12.0f} {f['wall_s']:>10.1f}")
        differ = _same_outputs(work / "out_whole", work / "out_chunked")
        print("outputs identical" if not differ else f"outputs differ: {differ}")
        return 1 if differ else 0
    finally:
        if args.keep:
            print(f"kept {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
