"""Put a big generated Kineto trace in a perfsight run folder, for benchmarks of run-folder inputs.

Why: ``benchmarks/gen_kineto_trace.py`` writes traces of any size, but a perfsight run folder (what
``perfsight.profile`` writes) also holds the run info and capture side files, which the reader
merges (``ingest/run_folder.py``, ``ingest/sidecar.py``).  This copies a real job's run folder,
puts the generated trace in it (a hard link, no copy) as its Kineto trace, drops the window's list
of steps (the job's step numbers are not the generated trace's: no step is marked outside the
window), and shifts the capture tables' times onto the generated trace's first steps (their rows
then lie in its steps; whether they match its slices does not matter to the cost).

    python benchmarks/make_run_folder.py --run-folder JOB/rank0_..._perfsight \\
        --trace /tmp/big/t500.pt.trace.json --out /tmp/big/rf/rank0_0_perfsight

Only the head and the tail of the trace are read (its first ``ProfilerStep#`` and its
``baseTimeNanoseconds``), so it works on traces of any size.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from perfsight.ingest import read_trace

TIME_COLUMNS = ("start_ns", "issue_end_ns", "wait_start_ns", "wait_end_ns", "end_ns")
_STEP = re.compile(r'"user_annotation", "name": "ProfilerStep#\d+".*?"ts": ([0-9.]+)', re.S)
_BASE = re.compile(r'"baseTimeNanoseconds": (\d+)')


def generated_facts(trace: Path) -> tuple[int, int]:
    """The generated trace's first step's start (ns, on the trace's clock) and its base time (Unix
    ns), from the head and the tail of the file."""
    with trace.open("rb") as f:
        head = f.read(8 << 20).decode(errors="replace")
        f.seek(max(trace.stat().st_size - (64 << 10), 0))
        tail = f.read().decode(errors="replace")
    first = _STEP.search(head)
    base = _BASE.search(tail)
    if first is None or base is None:
        raise SystemExit(f"{trace}: no ProfilerStep# in its first 8 MB or no baseTimeNanoseconds at its end")
    return round(float(first.group(1)) * 1000), int(base.group(1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run-folder", type=Path, required=True, help="a real job's run folder")
    parser.add_argument("--trace", type=Path, required=True, help="a trace of gen_kineto_trace.py")
    parser.add_argument("--out", type=Path, required=True, help="the run folder to make")
    args = parser.parse_args()
    first_ns, base = generated_facts(args.trace)
    job = read_trace(next(args.run_folder.glob("kineto_trace_*.json")))
    shift = base + first_ns - (job.meta.base_time_ns + job.steps.column("start_ns")[0].as_py())
    info_file = next(args.run_folder.glob("profiler_info_*.json"))
    info = json.loads(info_file.read_text())
    args.out.mkdir(parents=True)
    (args.out / info["files"]["trace"]).hardlink_to(args.trace)
    shutil.copy(args.run_folder / "profiler_metadata.json", args.out)
    for key in ("steps", "first_step", "last_step"):
        info["window"].pop(key, None)
    (args.out / next(args.run_folder.glob("profiler_info_*.json")).name).write_text(
        json.dumps(info, indent=2)
    )
    for file in info["files"].get("sidecars", {}).values():
        table = pq.read_table(args.run_folder / file)
        for name in TIME_COLUMNS:
            if name in table.column_names:
                i = table.schema.get_field_index(name)
                shifted = pc.add(table.column(name), pa.scalar(shift, pa.int64()))
                table = table.set_column(i, table.schema.field(i), shifted)
        pq.write_table(table, args.out / file)
    print(f"{args.out}: captures shifted by {shift} ns")


if __name__ == "__main__":
    main()
