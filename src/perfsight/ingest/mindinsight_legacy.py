"""Read MindInsight's legacy profiler layout (MindSpore 1.x ``profiler/`` folders), for old runs.

These folders hold results MindInsight computed, not a raw op timeline, so they become tables in
perfsight's units (ns, bytes) rather than a :class:`~perfsight.model.Trace`:

* ``step_trace_raw_{rank}_detail_time.csv``: ``step_num,start_point,end_point,total,fp_point,
  bp_point,iteration_interval,fp_and_bp,tail`` then, per stream, a ``<name>_start_point,
  <name>_end_point,<name>`` triple of communication times.  Times are 10 ns ticks; the last row
  (``step_num`` ``-``, or ``0`` in older files) is MindInsight's summary, whose averages leave out
  the first (warm-up) step; it is returned apart (:func:`summary_rows`).  The steps come out in the columns
  of :data:`perfsight.model.STEP_PHASES_SCHEMA`, so old and new step traces compare.
* ``hccl_raw_{rank}.csv``: ``step_num,communication_cost,wait_cost,link_info,
  communication_operator_cost``; costs in ms; ``link_info`` is JSON such as
  ``{"1-0": {"SDMA": [time_ms, size_KB, bandwidth_KB_per_s]}}`` -> one row per step and link;
  ``communication_operator_cost`` is JSON ``{"<op>": [numbers...]}`` kept as numbers per op.
* ``ascend_cluster_analyse_{data|model|pipeline}-parallel_{stages}_{ranks}_{rank}.csv``,
  ``minddata_pipeline_raw_{rank}.csv``: kept as read (Ascend CSV quirks handled), with the
  parallel mode, stage and rank counts taken from the documented file name pattern.
* ``flops_{rank}.txt`` / ``flops_summary_{rank}.json`` (:mod:`perfsight.ingest.mindinsight_flops`),
  ``profiler_info_{rank}.json``,
  ``ascend_timeline_display_{rank}.json`` (its raw events, not converted: their meaning is not
  documented well enough to label them).
* The r1.3 cluster layout (seed 002): a rank table JSON (``hccl.json``, any name, with
  ``server_list``), ``host_ips_mapping.txt`` (``<host ip> <mapped id>`` lines) and
  ``cluster_profiler/<mapped id>/profiler/`` per host, whose files are numbered by device id;
  the rank table turns (host, device) into the global rank.

Bad files become warnings naming the file; nothing else is lost.
"""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from perfsight import columns
from perfsight.ingest import ascend_files as files
from perfsight.ingest.ascend_events import read_ascend_events
from perfsight.ingest.jsonstream import NotATraceError
from perfsight.ingest.mindinsight_cluster import read_cluster_analyse
from perfsight.ingest.mindinsight_cluster import summary_text as cluster_summary_text
from perfsight.model import STEP_PHASES_SCHEMA
from perfsight.units import BYTES_PER_KB, NS_PER_MS

TICK_NS = 10
"""MindInsight's step trace counts time in 10 ns ticks."""

STEP_TRACE_FILE = re.compile(r"^step_trace_raw_(\d+)_detail_time\.csv$")
TIMELINE_FILE = re.compile(r"^ascend_timeline_display_(\d+)\.json$")


def device_file(path: Path) -> int | None:
    """The device a legacy folder's file stands for, as MindInsight lists devices: its
    ``step_trace_raw_{n}_detail_time.csv``, or, for a device without one, its
    ``ascend_timeline_display_{n}.json``; ``None`` for any other file (read with its device's)."""
    match = STEP_TRACE_FILE.match(path.name)
    if match:
        return int(match.group(1))
    match = TIMELINE_FILE.match(path.name)
    if match and not (path.parent / f"step_trace_raw_{match.group(1)}_detail_time.csv").exists():
        return int(match.group(1))
    return None


CLUSTER_ANALYSE_FILE = re.compile(r"^ascend_cluster_analyse_(\w+)-parallel_(\d+)_(\d+)_(\d+)\.csv$")
STEP_COLUMNS = ("step_num", "start_point", "end_point", "total", "fp_point", "bp_point",
                "iteration_interval", "fp_and_bp", "tail")  # fmt: skip


def _per_step(*fields: pa.Field) -> pa.Schema:
    """A table of one rank's steps: ``rank`` and ``step`` (int32, as in the step trace), then ``fields``."""
    return pa.schema([pa.field("rank", pa.int32()), pa.field("step", pa.int32()), *fields])


STREAM_SCHEMA = _per_step(
    pa.field("stream", pa.string()),
    pa.field("start_ns", pa.int64()),
    pa.field("end_ns", pa.int64()),
    pa.field("dur_ns", pa.int64()),
)
"""Per-stream communication of each step (the triples of ``step_trace_raw``)."""

HCCL_STEP_SCHEMA = _per_step(pa.field("communication_ns", pa.int64()), pa.field("wait_ns", pa.int64()))
HCCL_LINK_SCHEMA = _per_step(
    pa.field("src_rank", pa.int64()),
    pa.field("dst_rank", pa.int64()),
    pa.field("link", pa.string()),
    pa.field("transit_ns", pa.int64()),
    pa.field("bytes", pa.int64()),
    pa.field("bandwidth_bytes_per_s", pa.float64()),
)
HCCL_OP_SCHEMA = _per_step(pa.field("op", pa.string()), pa.field("values", pa.list_(pa.float64())))


RANK_TABLE_SCHEMA = pa.schema(
    [("rank", pa.int32()), ("host_ip", pa.string()), ("host", pa.string()), ("device_id", pa.int32()),
     ("device_ip", pa.string())]
)  # fmt: skip
"""The r1.3 cluster layout's (host, device) -> global rank table."""


@dataclasses.dataclass
class LegacyRank:
    """One rank's legacy ``profiler/`` results, in ns and bytes."""

    rank: int
    folder: Path
    host: str | None = None  # mapped host id in the r1.3 cluster layout
    device_id: int | None = None
    step_trace: pa.Table = dataclasses.field(default_factory=STEP_PHASES_SCHEMA.empty_table)
    step_trace_average: dict[str, float] = dataclasses.field(default_factory=dict)  # ns, the "-" row
    stream_communication: pa.Table = dataclasses.field(default_factory=STREAM_SCHEMA.empty_table)
    hccl_steps: pa.Table = dataclasses.field(default_factory=HCCL_STEP_SCHEMA.empty_table)
    hccl_links: pa.Table = dataclasses.field(default_factory=HCCL_LINK_SCHEMA.empty_table)
    hccl_ops: pa.Table = dataclasses.field(default_factory=HCCL_OP_SCHEMA.empty_table)
    tables: dict[str, pa.Table] = dataclasses.field(default_factory=dict)  # other CSVs, as read
    parallel: dict[str, Any] = dataclasses.field(default_factory=dict)  # mode, stages, ranks
    cluster_analyse: pa.Table | None = None  # ascend_cluster_analyse_*.csv (mindinsight_cluster), ns
    flops: dict[str, float] = dataclasses.field(default_factory=dict)  # MindInsight's FLOPs summary
    flops_ops: pa.Table | None = None  # per-op FLOPs of flops_{rank}.txt (FLOP, FLOP/s)
    info: dict[str, Any] = dataclasses.field(default_factory=dict)  # profiler_info_{rank}.json
    timeline_events: pa.Table | None = None  # ascend_timeline_display_{rank}.json, raw


@dataclasses.dataclass
class LegacyRun:
    """A legacy run: one ``profiler/`` folder, or an r1.3 cluster of them."""

    root: Path
    ranks: list[LegacyRank]
    rank_table: pa.Table  # rank, host_ip, host (mapped id), device_id, device_ip; empty if none
    warnings: list[str]


def is_legacy_folder(path: str | Path) -> bool:
    """A ``profiler/`` folder with step trace files, or an r1.3 cluster root."""
    path = Path(path)
    return path.is_dir() and (
        any(STEP_TRACE_FILE.match(p.name) for p in path.iterdir() if p.is_file())
        or (path / "cluster_profiler").is_dir()
    )


def _int(value: Any) -> int | None:
    try:
        return int(str(value).strip())
    except (TypeError, ValueError):
        return None


def read_rank_table(root: Path, problems: files.FileProblems) -> pa.Table:
    """(rank, host_ip, host, device_id, device_ip) from the rank table JSON and ``host_ips_mapping.txt``."""
    mapping: dict[str, str] = {}
    mapping_file = root / "host_ips_mapping.txt"
    if mapping_file.is_file():
        for number, line in enumerate(mapping_file.read_text(errors="replace").splitlines(), 1):  # per host
            parts = line.split()
            if len(parts) == 2:
                mapping[parts[0]] = parts[1]
            elif line.strip():
                problems.add(mapping_file, f"line {number} is not '<host ip> <mapped id>'; skipped")
    rows: list[dict[str, Any]] = []
    for candidate in sorted(root.glob("*.json")):
        doc = files.read_json(candidate, problems)
        for server in doc.get("server_list", []) if isinstance(doc.get("server_list"), list) else []:
            host_ip = str(server.get("server_id", ""))
            for device in server.get("device", []) if isinstance(server, dict) else []:  # per device
                rank, device_id = _int(device.get("rank_id")), _int(device.get("device_id"))
                if rank is None or device_id is None:
                    problems.add(candidate, f"device entry without rank_id/device_id: {device!r:.80}")
                    continue
                rows.append(
                    {
                        "rank": rank,
                        "host_ip": host_ip,
                        "host": mapping.get(host_ip),
                        "device_id": device_id,
                        "device_ip": device.get("device_ip"),
                    }
                )
    return pa.Table.from_pylist(rows, schema=RANK_TABLE_SCHEMA)


def _no_rank_table() -> pa.Table:
    return RANK_TABLE_SCHEMA.empty_table()


def numbers_of(column: pa.ChunkedArray | pa.Array) -> np.ndarray:
    """A column as float64 with NaN for anything that is not a number (garbage rows read as text)."""
    if pa.types.is_string(column.type) or pa.types.is_large_string(column.type):
        text = pc.utf8_trim_whitespace(column)
        column = pc.if_else(pc.match_substring_regex(pc.fill_null(text, ""), files._NUMBER), text, None)
    return columns.numpy(pc.cast(column, pa.float64()), null=np.nan)


def summary_rows(step_num: pa.ChunkedArray | pa.Array) -> np.ndarray:
    """Which rows of a step trace are its summary, as MindInsight reads the file.

    MindInsight takes the last row as the summary (the averages it shows for "step 0": every step
    but the first, warm-up one) and the rows before it as the steps (``total_steps`` = rows - 1).
    MindSpore writes that row with ``step_num`` ``-``; the files in MindInsight's own test resources
    write ``0`` there.  So a ``-`` row anywhere, or a last row numbered 0 (steps count from 1), is the
    summary; a last row that continues the step numbers is a step (a file cut before its summary)."""
    text = pc.fill_null(pc.utf8_trim_whitespace(pc.cast(step_num, pa.string())), "-")
    mask = columns.numpy(pc.equal(text, "-"), null=False)
    if len(mask) and not mask.any() and _int(text[-1].as_py()) == 0:
        mask[-1] = True
    return mask


def read_step_trace_raw(
    path: Path, rank: int, problems: files.FileProblems
) -> tuple[pa.Table, dict, pa.Table]:
    """(steps in STEP_PHASES_SCHEMA, the average row in ns, per-stream communication) of one file.

    A row whose step number or start/end point is not a number is skipped with a warning naming
    the file; the other rows load."""
    table = files.read_csv(path, problems)
    if table.num_rows == 0 or not set(STEP_COLUMNS) <= set(table.column_names):
        if table.num_rows:
            problems.add(path, f"lacks columns {sorted(set(STEP_COLUMNS) - set(table.column_names))}")
        return STEP_PHASES_SCHEMA.empty_table(), {}, STREAM_SCHEMA.empty_table()
    average_mask = summary_rows(table.column("step_num"))
    average = {}
    if average_mask.any():
        last = table.filter(pa.array(average_mask)).slice(0, 1).to_pylist()[0]
        average = {
            k: float(v) * TICK_NS for k, v in last.items() if isinstance(v, (int, float)) and k != "step_num"
        }
    steps = table.filter(pa.array(~average_mask))
    usable = ~np.isnan(numbers_of(steps.column("step_num")))
    for name in ("start_point", "end_point"):
        usable &= ~np.isnan(numbers_of(steps.column(name)))
    if not usable.all():
        problems.add(path, f"{int((~usable).sum())} row(s) without a numeric step_num/start/end skipped")
        steps = steps.filter(pa.array(usable))

    def ns(name: str) -> np.ndarray:
        return np.round(np.nan_to_num(numbers_of(steps.column(name))) * TICK_NS).astype(np.int64)

    n = steps.num_rows
    start, end = ns("start_point"), ns("end_point")
    out = pa.Table.from_arrays(
        [
            pa.array(np.full(n, rank, np.int32)),
            pa.array(numbers_of(steps.column("step_num")).astype(np.int32)),
            pa.array(start),
            pa.array(end),
            pa.array(ns("total")),
            pa.array(ns("fp_point")),
            pa.array(ns("bp_point")),
            pa.array(ns("iteration_interval")),
            pa.array(ns("fp_and_bp")),
            pa.array(ns("tail")),
        ],
        schema=STEP_PHASES_SCHEMA,
    )
    extra = [c for c in table.column_names[len(STEP_COLUMNS) :] if c]
    streams = [c[: -len("_start_point")] for c in extra if c.endswith("_start_point")]
    parts = []
    for stream in streams:  # a few streams per file
        if {f"{stream}_end_point", stream} <= set(extra):
            parts.append(
                pa.table(
                    {
                        "rank": pa.array(np.full(n, rank, np.int32)),
                        "step": out.column("step"),
                        "stream": pa.array([stream] * n, pa.string()),
                        "start_ns": pa.array(ns(f"{stream}_start_point")),
                        "end_ns": pa.array(ns(f"{stream}_end_point")),
                        "dur_ns": pa.array(ns(stream)),
                    },
                    schema=STREAM_SCHEMA,
                )
            )
    return out, average, pa.concat_tables(parts) if parts else STREAM_SCHEMA.empty_table()


def read_hccl_raw(path: Path, rank: int, problems: files.FileProblems) -> tuple[pa.Table, pa.Table, pa.Table]:
    """(per-step communication and wait, per-step links, per-step operator costs) of one file."""
    table = files.read_csv(path, problems)
    needed = {"step_num", "communication_cost", "wait_cost", "link_info"}
    if table.num_rows == 0 or not needed <= set(table.column_names):
        if table.num_rows:
            problems.add(path, f"lacks columns {sorted(needed - set(table.column_names))}")
        return HCCL_STEP_SCHEMA.empty_table(), HCCL_LINK_SCHEMA.empty_table(), HCCL_OP_SCHEMA.empty_table()
    steps, links, ops = [], [], []
    for row in table.to_pylist():  # one row per step: a handful
        step = _int(row["step_num"]) if not isinstance(row["step_num"], float) else int(row["step_num"])
        if step is None:
            continue
        ms = [row.get("communication_cost"), row.get("wait_cost")]
        steps.append(
            {
                "rank": rank,
                "step": step,
                "communication_ns": round(float(ms[0]) * NS_PER_MS) if isinstance(ms[0], float) else None,
                "wait_ns": round(float(ms[1]) * NS_PER_MS) if isinstance(ms[1], float) else None,
            }
        )
        for column, target in (("link_info", links), ("communication_operator_cost", ops)):
            text = row.get(column)
            if not text:
                continue
            try:
                cell = json.loads(str(text).replace("'", '"'))
            except ValueError:
                problems.add(path, f"step {step}: {column} is not JSON; skipped")
                continue
            if not isinstance(cell, dict):
                continue
            if column == "link_info":
                for pair, by_link in cell.items():
                    src, _, dst = str(pair).partition("-")
                    for link, values in (by_link or {}).items():
                        if isinstance(values, list) and len(values) >= 3:
                            target.append(
                                {"rank": rank, "step": step, "src_rank": _int(src), "dst_rank": _int(dst),
                                 "link": link, "transit_ns": round(float(values[0]) * NS_PER_MS),
                                 "bytes": round(float(values[1]) * BYTES_PER_KB),
                                 "bandwidth_bytes_per_s": float(values[2]) * BYTES_PER_KB}
                            )  # fmt: skip
            else:
                for op, values in cell.items():
                    numbers = values if isinstance(values, list) else [values]
                    target.append(
                        {"rank": rank, "step": step, "op": str(op),
                         "values": [float(v) for v in numbers if isinstance(v, (int, float))]}
                    )  # fmt: skip
    return (
        pa.Table.from_pylist(steps, schema=HCCL_STEP_SCHEMA),
        pa.Table.from_pylist(links, schema=HCCL_LINK_SCHEMA),
        pa.Table.from_pylist(ops, schema=HCCL_OP_SCHEMA),
    )


def read_profiler_folder(folder: Path, index: int, rank: int, problems: files.FileProblems) -> LegacyRank:
    """Every file of rank ``rank`` (numbered ``index`` in the file names) in one ``profiler/`` folder."""
    result = LegacyRank(rank=rank, folder=folder)
    step_file = folder / f"step_trace_raw_{index}_detail_time.csv"
    if step_file.is_file():
        result.step_trace, result.step_trace_average, result.stream_communication = read_step_trace_raw(
            step_file, rank, problems
        )
    hccl_file = folder / f"hccl_raw_{index}.csv"
    if hccl_file.is_file():
        result.hccl_steps, result.hccl_links, result.hccl_ops = read_hccl_raw(hccl_file, rank, problems)
    for path in sorted(folder.glob(f"ascend_cluster_analyse_*_{index}.csv")):
        match = CLUSTER_ANALYSE_FILE.match(path.name)
        if match:
            mode, stages, ranks, _ = match.groups()
            result.parallel = {"mode": mode, "stages": int(stages), "ranks": int(ranks)}
            result.cluster_analyse = read_cluster_analyse(
                path, mode, rank, problems, steps=result.step_trace.num_rows if step_file.is_file() else None
            )
            if result.cluster_analyse.num_rows:
                problems.add(path, cluster_summary_text(result.cluster_analyse))
    minddata = folder / f"minddata_pipeline_raw_{index}.csv"
    if minddata.is_file():
        result.tables[minddata.name] = files.read_csv(minddata, problems)
    from perfsight.ingest.mindinsight_flops import read_flops  # it reads numbers as this module does

    result.flops_ops, result.flops = read_flops(folder, index, problems)
    info = folder / f"profiler_info_{index}.json"
    if info.is_file():
        result.info = files.read_json(info, problems)
    timeline = folder / f"ascend_timeline_display_{index}.json"
    if timeline.is_file():
        try:
            events = read_ascend_events(timeline)
            result.timeline_events = events.table
            if events.report.problem or events.report.truncated:
                problems.add(timeline, f"damaged after {events.report.events} events; the rest is kept")
        except NotATraceError as error:
            problems.add(timeline, f"not a timeline ({error})")
    return result


def cluster_location(folder: Path) -> tuple[Path | None, str | None]:
    """(cluster root, mapped host id) of a ``profiler/`` folder in the r1.3 layout
    ``<root>/cluster_profiler/<host>/profiler/``; ``(None, None)`` for a lone ``profiler/`` folder."""
    if folder.name == "profiler" and folder.parent.parent.name == "cluster_profiler":
        return folder.parent.parent.parent, folder.parent.name
    return None, None


def global_rank(
    by_device: dict[tuple[Any, Any], int], host: str | None, index: int, step_file: Path,
    problems: files.FileProblems,
) -> int:  # fmt: skip
    """The global rank of file number ``index``: the rank table's, in the cluster layout; else ``index``."""
    if host is None:
        return index
    if (host, index) not in by_device:
        problems.add(step_file, f"host {host} device {index} is not in the rank table; rank {index} used")
    return by_device.get((host, index), index)


def read_rank_of(step_file: Path, problems: files.FileProblems) -> tuple[LegacyRank, pa.Table]:
    """The rank a ``step_trace_raw_{n}_detail_time.csv`` (or :func:`device_file`) stands for (every
    file of its folder numbered ``n``), with the rank table of its cluster (empty outside the r1.3 layout)."""
    folder = step_file.parent
    index = device_file(step_file)
    if index is None:
        raise ValueError(f"{step_file}: not a step trace or timeline display file of a legacy folder")
    root, host = cluster_location(folder)
    rank_table = read_rank_table(root, problems) if root is not None else _no_rank_table()
    by_device = {(r["host"], r["device_id"]): r["rank"] for r in rank_table.to_pylist()}
    read = read_profiler_folder(
        folder, index, global_rank(by_device, host, index, step_file, problems), problems
    )
    read.host, read.device_id = host, index
    return read, rank_table


def read_legacy(path: str | Path) -> LegacyRun:
    """A legacy ``profiler/`` folder (or its parent), or an r1.3 cluster root, as a :class:`LegacyRun`."""
    root = Path(path)
    problems = files.FileProblems()
    rank_table = read_rank_table(root, problems)
    by_device = {(r["host"], r["device_id"]): r["rank"] for r in rank_table.to_pylist()}
    folders: list[tuple[Path, str | None]] = []
    if (root / "cluster_profiler").is_dir():
        for host_dir in sorted(p for p in (root / "cluster_profiler").iterdir() if p.is_dir()):
            folders.append((host_dir / "profiler", host_dir.name))
    else:
        folder = root / "profiler" if (root / "profiler").is_dir() else root
        folders.append((folder, None))
    ranks = []
    for folder, host in folders:
        for step_file in sorted(folder.glob("step_trace_raw_*_detail_time.csv")):
            index = int(STEP_TRACE_FILE.match(step_file.name).group(1))  # type: ignore[union-attr]
            rank = global_rank(by_device, host, index, step_file, problems)
            read = read_profiler_folder(folder, index, rank, problems)
            read.host, read.device_id = host, index
            ranks.append(read)
    if not ranks:
        problems.add(root, "no step_trace_raw_*_detail_time.csv found: not a MindInsight profiler folder")
    ranks.sort(key=lambda r: r.rank)
    return LegacyRun(root=root, ranks=ranks, rank_table=rank_table, warnings=problems.warnings)
