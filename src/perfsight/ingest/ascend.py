"""Read an Ascend / MindSpore profiler output folder (``*_ascend_pt``, ``*_ascend_ms``) as one rank.

Layout (seed 003)::

    rank0_ascend_pt/
        profiler_info_0.json          rank_id, config, start/end clocks
        profiler_metadata.json        environment, user metadata
        ASCEND_PROFILER_OUTPUT/
            trace_view.json           the raw timeline -> slices, tracks, flows, steps, comm, comm_tasks
            memory_record.csv         allocator totals over time -> memory
            kernel_details.csv, op_statistic.csv, step_trace_time.csv, communication.json,
            communication_matrix.json, operator_memory.csv, npu_module_mem.csv, api_statistic.csv
                                      Ascend's own results -> :class:`AscendOutputs` (references)

The trace model is built from the raw timeline only, so that perfsight's own
analyses can be checked against the files Ascend computed (the golden numbers),
never copied from them.  The one thing taken from a computed file is naming:
``communication.json`` keys give each hcom op its communication group.

Every problem (a missing, truncated or malformed file, a missing column) becomes
a warning in ``meta.warnings`` naming the file; whatever else is there still loads.
A folder with neither ``trace_view.json`` nor anything else readable raises
:class:`~perfsight.ingest.kineto.TraceReadError`.
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from perfsight import columns
from perfsight.ingest import ascend_files as files
from perfsight.ingest.ascend_db import DatabaseError, read_db_events, read_tables
from perfsight.ingest.ascend_framework import read_execute_timestamps, read_input_shapes
from perfsight.ingest.ascend_timeline import Timeline, read_timeline, timeline_from_events
from perfsight.ingest.chrome_events import micros_to_ns
from perfsight.ingest.jsonstream import NotATraceError
from perfsight.ingest.kineto import TraceReadError
from perfsight.model import (
    MEMORY_SCHEMA,
    NO_ID,
    DeviceInfo,
    RunMetadata,
    Trace,
    conform,
)
from perfsight.units import BYTES_PER_MB

OUTPUT_DIR = "ASCEND_PROFILER_OUTPUT"
FOLDER_SUFFIXES = ("_ascend_pt", "_ascend_ms")

MEMORY_COMPONENTS = ("PTA+GE", "PTA", "MindSpore", "MS", "GE", "APP")
"""``memory_record.csv`` components, in the order one is chosen as the memory curve: the framework's
allocator and graph engine together when recorded, else the first present."""

REFERENCE_CSVS = (
    "step_trace_time.csv",
    "kernel_details.csv",
    "op_statistic.csv",
    "api_statistic.csv",
    "memory_record.csv",
    "operator_memory.csv",
    "npu_module_mem.csv",
    "l2_cache.csv",
    "operator_details.csv",
)
REFERENCE_JSONS = ("communication.json", "communication_matrix.json")
REFERENCE_DBS = ("analysis.db", "communication_analyzer.db")


@dataclasses.dataclass
class AscendOutputs:
    """The files Ascend's tools computed for one rank, as they wrote them (units of the files)."""

    folder: Path
    tables: dict[str, pa.Table]  # file name -> table (e.g. "step_trace_time.csv")
    json: dict[str, dict[str, Any]]  # file name -> parsed object (e.g. "communication.json")
    warnings: list[str]
    databases: dict[str, dict[str, pa.Table]] = dataclasses.field(default_factory=dict)  # name -> tables


def output_dir(folder: Path) -> Path:
    """The ``ASCEND_PROFILER_OUTPUT`` folder of a rank folder (or the folder itself)."""
    return folder if folder.name == OUTPUT_DIR else folder / OUTPUT_DIR


def is_ascend_output(path: str | Path) -> bool:
    """True for a rank folder (``*_ascend_pt``/``*_ascend_ms`` or one holding ``ASCEND_PROFILER_OUTPUT``),
    its ``ASCEND_PROFILER_OUTPUT`` folder, or a ``trace_view.json`` inside one."""
    path = Path(path)
    if path.is_file():
        return path.parent.name == OUTPUT_DIR
    return path.is_dir() and (path.name == OUTPUT_DIR or (path / OUTPUT_DIR).is_dir())


def rank_folder(path: str | Path) -> Path:
    """The rank folder of any path :func:`is_ascend_output` accepts."""
    path = Path(path)
    if path.is_file():
        path = path.parent
    return path.parent if path.name == OUTPUT_DIR else path


def find_ascend_outputs(folder: str | Path) -> list[Path]:
    """Every rank folder under ``folder`` (itself included), sorted; nested ones are not searched."""
    folder = Path(folder)
    if is_ascend_output(folder):
        return [rank_folder(folder)]
    found = sorted({p.parent for p in folder.rglob(OUTPUT_DIR) if p.is_dir()})
    return [p for p in found if not any(q != p and q in p.parents for q in found)]


def profiler_db(out: Path) -> Path | None:
    """The profiler database of an output folder (``ascend_pytorch_profiler_{rank}.db`` or
    ``ascend_mindspore_profiler_{rank}.db``), when the database export was chosen."""
    found = sorted(out.glob("ascend_*_profiler*.db"))
    return found[0] if found else None


def read_outputs(folder: str | Path) -> AscendOutputs:
    """Ascend's own computed files of one rank folder (missing ones are simply absent)."""
    folder = rank_folder(folder)
    out = output_dir(folder)
    problems = files.FileProblems()
    tables = {n: files.read_csv(out / n, problems) for n in REFERENCE_CSVS if (out / n).is_file()}
    jsons = {n: files.read_json(out / n, problems) for n in REFERENCE_JSONS if (out / n).is_file()}
    databases = {}
    for name in REFERENCE_DBS:
        if (out / name).is_file():
            try:
                databases[name] = read_tables(out / name)
            except DatabaseError as error:
                problems.warnings.append(str(error))
    return AscendOutputs(folder, tables, jsons, problems.warnings, databases)


def _rank_info(folder: Path, problems: files.FileProblems) -> tuple[int | None, dict[str, Any]]:
    infos = sorted(folder.glob("profiler_info*.json"))
    for path in infos:
        info = files.read_json(path, problems)
        rank = info.get("rank_id")
        if isinstance(rank, int) and rank >= 0:
            return rank, info
        match = re.fullmatch(r"profiler_info_(\d+)\.json", path.name)
        if match:
            return int(match.group(1)), info
    return None, {}


def _device_index(memory: pa.Table | None, rank: int) -> int:
    if memory is not None and "Device Type" in memory.column_names and memory.num_rows:
        match = re.search(r"(\d+)$", str(memory.column("Device Type")[0].as_py() or ""))
        if match:
            return int(match.group(1))
    return rank


def _memory(table: pa.Table | None, rank: int, device: int) -> pa.Table:
    """``memory_record.csv`` (totals in MB over time) as allocator events of one component."""
    if table is None or table.num_rows == 0:
        return MEMORY_SCHEMA.empty_table()
    present = set(pc.unique(pc.fill_null(table.column("Component"), "")).to_pylist())
    component = next((c for c in MEMORY_COMPONENTS if c in present), None)
    if component is None:
        return MEMORY_SCHEMA.empty_table()
    rows = table.filter(pc.equal(table.column("Component"), component))
    rows = rows.filter(pc.is_valid(rows.column("Timestamp(us)")))
    ts_ns = columns.int64(micros_to_ns(rows.column("Timestamp(us)")))

    def mib(name: str) -> pa.Array:
        if name not in rows.column_names:
            return pa.nulls(rows.num_rows, pa.int64())
        values = columns.numpy(rows.column(name), null=np.nan)
        return pa.array(
            np.round(np.nan_to_num(values) * BYTES_PER_MB).astype(np.int64), pa.int64(), mask=np.isnan(values)
        )

    allocated = mib("Total Allocated(MB)")
    level = columns.int64(pc.fill_null(allocated, 0))
    delta = np.diff(level, prepend=level[:1]) if level.size else level
    n = rows.num_rows
    return conform(
        pa.table(
            {
                "rank": np.full(n, rank, np.int32),
                "device_type": pa.array(["npu"] * n).dictionary_encode(),
                "device_index": np.full(n, device, np.int32),
                "ts_ns": ts_ns,
                "tid": np.full(n, NO_ID, np.int64),
                "addr": np.full(n, NO_ID, np.int64),
                "bytes": delta.astype(np.int64),
                "allocated_bytes": allocated,
                "reserved_bytes": mib("Total Reserved(MB)"),
                "active_bytes": mib("Total Active(MB)"),
            }
        ),
        MEMORY_SCHEMA,
    )


@dataclasses.dataclass
class _FrameworkFiles:
    """MindSpore's raw CPU-op files of a rank folder (``FRAMEWORK/``), when present."""

    timestamps: Path | None
    shapes: Path | None
    rank: int | None  # from the file name: MindSpore's CPU output has no profiler_info file


def _framework_files(folder: Path) -> _FrameworkFiles:
    stamps = sorted((folder / "FRAMEWORK").glob("cpu_op_execute_timestamp_*.txt"))
    shapes = sorted((folder / "FRAMEWORK").glob("cpu_framework_*.txt"))
    match = re.search(r"_(\d+)\.txt$", stamps[0].name) if stamps else None
    return _FrameworkFiles(
        stamps[0] if stamps else None, shapes[0] if shapes else None, int(match.group(1)) if match else None
    )


def _with_input_shapes(slices: pa.Table, shapes: dict[str, list[list[int]]]) -> pa.Table:
    """Fill ``input_dims`` of cpu_op slices from MindSpore's shapes, matched by the op's last name part
    (``Default/BiasAdd-op0`` -> ``BiasAdd-op0``); computed once per distinct name."""
    if not shapes or slices.num_rows == 0:
        return slices
    names = columns.combined(slices.column("name"))
    values = names.dictionary.to_pylist() if isinstance(names, pa.DictionaryArray) else None
    if values is None:
        return slices
    per_value = pa.array(
        [shapes.get(str(v).rsplit("/", 1)[-1]) for v in values], pa.list_(pa.list_(pa.int64()))
    )
    dims = per_value.take(names.indices)
    is_op = pc.equal(slices.column("kind").cast(pa.string()), "cpu_op")
    current = slices.column("input_dims")
    filled = pc.if_else(pc.and_(is_op, pc.is_valid(dims)), dims, current)
    return slices.set_column(slices.schema.get_field_index("input_dims"), "input_dims", filled)


def _with_kernel_types(slices: pa.Table, kernels: pa.Table | None) -> pa.Table:
    """Fill ``op_type`` / ``core_type`` of device tasks from Ascend's ``kernel_details.csv``.

    ``trace_view.json`` does not record a task's operator type (``Conv2D``) or core (``AI_CORE``,
    ``AI_VECTOR_CORE``, ``MIX_AIV``): the text export keeps them only in ``kernel_details.csv``
    (the database in ``COMPUTE_TASK_INFO``).  They are names, not results, so they are taken from
    there like the communication groups of ``communication.json``: a row names the device task with
    the same name and start time (exact ns); durations, counts and waits stay perfsight's own.
    A type the file gives replaces the timeline's stand-in (the task type, ``AI_CORE``)."""
    needed = ("Name", "Type", "Accelerator Core", "Start Time(us)")
    if kernels is None or kernels.num_rows == 0 or any(c not in kernels.column_names for c in needed):
        return slices
    named = pa.table(
        {
            "name": pc.cast(kernels.column("Name"), pa.string()),
            "start_ns": columns.int64(micros_to_ns(kernels.column("Start Time(us)")), NO_ID),
            "vendor_op_type": pc.cast(kernels.column("Type"), pa.string()),
            "vendor_core_type": pc.cast(kernels.column("Accelerator Core"), pa.string()),
        }
    )
    named = named.group_by(["name", "start_ns"], use_threads=False).aggregate(
        [("vendor_op_type", "first"), ("vendor_core_type", "first")]
    )  # one type per task, should a file repeat a row
    keys = pa.table(
        {
            "name": slices.column("name").cast(pa.string()),
            "start_ns": slices.column("start_ns"),
            "row": pa.array(np.arange(slices.num_rows, dtype=np.int64)),
        }
    ).filter(slices.column("is_device"))
    found = keys.join(named, ["name", "start_ns"], join_type="inner")
    if found.num_rows == 0:
        return slices
    match = np.full(slices.num_rows, -1, np.int64)  # per slice: its row of ``found``, -1 if none
    match[columns.int64(found.column("row"))] = np.arange(found.num_rows)
    take = pa.array(match, mask=match < 0)
    for column, vendor in (("op_type", "vendor_op_type_first"), ("core_type", "vendor_core_type_first")):
        current = slices.column(column).cast(pa.string())
        filled = pc.coalesce(found.column(vendor).take(take), current)
        index = slices.schema.get_field_index(column)
        slices = slices.set_column(index, column, filled.cast(slices.schema.field(column).type))
    return slices


def read_ascend(path: str | Path, rank: int | None = None) -> Trace:
    """One rank of an Ascend / MindSpore profiler output as a :class:`Trace` (see module docstring).

    ``rank`` is used when ``profiler_info_*.json`` does not give one.
    """
    # a file outside an output folder is the timeline itself (read_trace sends one here only when
    # perfsight.ingest._lone_ascend_timeline says so); the folder holding it is its rank folder:
    # siblings there are read too
    lone = Path(path).is_file() and Path(path).parent.name != OUTPUT_DIR
    folder = Path(path).parent if lone else rank_folder(path)
    out = folder if lone else output_dir(folder)
    problems = files.FileProblems()
    if lone:
        problems.add(Path(path), f"an Ascend timeline outside an {OUTPUT_DIR} folder; read as one")
    found_rank, info = _rank_info(folder, problems)
    rank_source = "trace" if found_rank is not None else ("option" if rank is not None else "default")
    the_rank = found_rank if found_rank is not None else (rank if rank is not None else 0)
    framework_files = _framework_files(folder)
    if found_rank is None and rank is None and framework_files.rank is not None:
        the_rank, rank_source = framework_files.rank, "file name"
    memory_csv = (
        files.read_csv(out / "memory_record.csv", problems) if (out / "memory_record.csv").is_file() else None
    )
    communication = (
        files.read_json(out / "communication.json", problems)
        if (out / "communication.json").is_file()
        else {}
    )
    device = _device_index(memory_csv, the_rank)
    timeline_path = Path(path) if lone else out / "trace_view.json"
    sources = [str(p) for p in sorted(folder.glob("profiler_*.json"))]
    if timeline_path.is_file():
        sources.append(str(timeline_path))
        try:
            timeline = read_timeline(timeline_path, the_rank, device, files.groups_of_ops(communication))
        except NotATraceError as error:
            raise TraceReadError(f"{timeline_path}: not an Ascend timeline ({error})") from error
        problems.warnings.extend(timeline.warnings)
        max_rank = timeline.max_rank_seen
    elif (database := profiler_db(out)) is not None:
        sources.append(str(database))
        try:
            events, db_warnings, db_groups = read_db_events(database)
        except DatabaseError as error:
            raise TraceReadError(str(error)) from error
        problems.warnings.extend(db_warnings)
        timeline = timeline_from_events(
            events, the_rank, device, {**db_groups, **files.groups_of_ops(communication)}
        )
        problems.warnings.extend(f"{database}: {w}" for w in timeline.warnings)
        max_rank = timeline.max_rank_seen
    elif framework_files.timestamps is not None:
        sources.append(str(framework_files.timestamps))
        timeline = timeline_from_events(read_execute_timestamps(framework_files.timestamps), the_rank, device)
        problems.warnings.extend(f"{framework_files.timestamps}: {w}" for w in timeline.warnings)
        problems.add(
            timeline_path, f"missing; the timeline is rebuilt from {framework_files.timestamps.name}"
        )
        max_rank = -1
    elif memory_csv is None:
        raise TraceReadError(f"{folder}: no {OUTPUT_DIR}/trace_view.json or other readable profiler output")
    else:
        problems.add(timeline_path, "missing; only memory is read")
        timeline = Timeline.empty()
        max_rank = -1
    tables = timeline.tables()
    if (out / "kernel_details.csv").is_file():
        sources.append(str(out / "kernel_details.csv"))
        tables["slices"] = _with_kernel_types(
            tables["slices"], files.read_csv(out / "kernel_details.csv", problems)
        )
    if memory_csv is not None:
        sources.append(str(out / "memory_record.csv"))
    if framework_files.shapes is not None:
        sources.append(str(framework_files.shapes))
        tables["slices"] = _with_input_shapes(tables["slices"], read_input_shapes(framework_files.shapes))
    config = info.get("config", {}) if isinstance(info.get("config"), dict) else {}
    metadata_file = folder / "profiler_metadata.json"
    metadata = files.read_json(metadata_file, problems) if metadata_file.is_file() else {}
    framework = "mindspore" if folder.name.endswith("_ascend_ms") else "pytorch"
    meta = RunMetadata(
        rank=the_rank,
        world_size=max(the_rank + 1, max_rank + 1, 1),
        rank_source=rank_source,
        framework=framework,
        devices=[DeviceInfo(index=device, name="Ascend NPU")],
        backend="hccl",
        base_time_ns=0,  # Ascend timestamps are Unix time already
        sources=sources,
        warnings=problems.warnings,
        extra={
            "stage_end": "last_work",
            "ascend": {"folder": str(folder), "config": config, "metadata": metadata},
        },
    )
    if rank_source != "trace":
        meta.warnings.append(
            f"{folder}: no profiler_info_*.json with a rank; rank {the_rank} ({rank_source})"
        )
    return Trace(memory=_memory(memory_csv, the_rank, device), meta=meta, **tables)
