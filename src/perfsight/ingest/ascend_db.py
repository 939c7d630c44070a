"""Read the database export of Ascend's profilers (``ascend_pytorch_profiler_{rank}.db``,
``ascend_mindspore_profiler_{rank}.db``; ``ExportType.Db``) as the raw events of a timeline.

The database holds the same facts as ``trace_view.json`` in msprof's documented tables, times in
integer nanoseconds (Unix), every string interned in ``STRING_IDS(id, value)``:

* ``PYTORCH_API(startNs, endNs, globalTid, name, type, ...)`` -- framework ops; ``globalTid`` is
  ``pid << 32 | tid``; ``type`` names ``ENUM_API_TYPE`` (op, queue, trace, mstx);
* ``CANN_API(startNs, endNs, type, globalTid, connectionId, name)`` -- runtime calls;
* ``TASK(startNs, endNs, deviceId, connectionId, globalTaskId, taskType, streamId, ...)`` -- every
  device task, named by ``COMPUTE_TASK_INFO(name, globalTaskId, ...)`` or
  ``COMMUNICATION_TASK_INFO(name, globalTaskId, taskType, planeId, groupName, srcRank, dstRank,
  transportType, size, linkType, rdmaType, opId)``;
* ``COMMUNICATION_OP(opName, startNs, endNs, connectionId, groupName, opId, dataType, count, ...)``;
* enumerations ``ENUM_HCCL_TRANSPORT_TYPE``, ``ENUM_HCCL_LINK_TYPE``, ``ENUM_HCCL_DATA_TYPE``,
  ``ENUM_HCCL_RDMA_TYPE``, ``ENUM_API_TYPE`` (``id, name``), used when present.

The joins and string look-ups run in SQLite; the result is a table in the shape of
:data:`perfsight.ingest.ascend_events.FLAT_SCHEMA` (processes Python / CANN / Ascend Hardware /
HCCL, as Ascend's timeline names them), which :mod:`perfsight.ingest.ascend_timeline` turns into
the model exactly as it does the JSON timeline, times as the integer ns the database keeps, and
each device task's kind decided by the task-info tables (:func:`_task_sql`).  Missing tables are
skipped with a warning; the file is opened ``immutable=1`` (nothing is ever written beside it).
Ascend's computed databases (``analysis.db``, ``communication_analyzer.db``) are results, read
whole by :func:`read_tables`.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from perfsight.ingest.ascend_events import flat_table

PIDS = {"Python": 1, "CANN": 2, "Ascend Hardware": 3, "HCCL": 4}
"""Process ids given to the timeline's processes (the database has no such ids)."""

ENUMS = {
    "ENUM_HCCL_TRANSPORT_TYPE": {0: "SDMA", 1: "RDMA", 2: "LOCAL"},
    "ENUM_HCCL_LINK_TYPE": {0: "ON_CHIP", 1: "HCCS", 2: "PCIE", 3: "ROCE", 4: "SIO", 5: "HCCS_SW",
                            6: "STANDARD_ROCE"},
    "ENUM_HCCL_DATA_TYPE": {0: "INT8", 1: "INT16", 2: "INT32", 3: "FP16", 4: "FP32", 5: "INT64", 6: "UINT64",
                            7: "UINT8", 8: "UINT16", 9: "UINT32", 10: "FP64", 11: "BFP16", 12: "INT128"},
    "ENUM_HCCL_RDMA_TYPE": {0: "RDMA_SEND_NOTIFY", 1: "RDMA_SEND_PAYLOAD"},
    "ENUM_API_TYPE": {20000: "acl", 15000: "model", 10000: "node", 5500: "communication", 5000: "runtime",
                      50001: "op", 50002: "queue", 50003: "trace", 50004: "mstx"},
}  # fmt: skip
"""msprof's documented enumeration values, used when the file lacks its enumeration tables."""

API_CATEGORY = {"op": "cpu_op", "queue": "queue", "trace": "python_function", "mstx": "user_annotation"}


class DatabaseError(RuntimeError):
    """The file is not an SQLite database of Ascend's profiler (one line, naming the file)."""


def _connect(path: Path) -> sqlite3.Connection:
    """Open ``path`` so that nothing is ever written beside it: ``immutable=1`` tells SQLite the
    file cannot change, so it takes no locks and creates no ``-wal`` / ``-shm`` files (``mode=ro``
    alone still creates them for a WAL database, and fails on a read-only folder)."""
    try:
        db = sqlite3.connect(f"{path.resolve().as_uri()}?immutable=1", uri=True)
        db.execute("SELECT count(*) FROM sqlite_master").fetchone()
    except sqlite3.Error as error:
        raise DatabaseError(f"{path}: not a readable SQLite database ({error})") from error
    return db


def _tables(db: sqlite3.Connection) -> set[str]:
    return {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}


def _enum_sql(db: sqlite3.Connection, tables: set[str], enum: str, column: str) -> str:
    """SQL giving the name of enumeration value ``column``: the file's own table, else msprof's values."""
    if enum in tables:
        return f"(SELECT name FROM {enum} WHERE id = {column})"
    cases = " ".join(f"WHEN {k} THEN '{v}'" for k, v in ENUMS[enum].items())
    return f"(CASE {column} {cases} ELSE NULL END)"


def _rows(db: sqlite3.Connection, sql: str) -> list[tuple]:
    return db.execute(sql).fetchall()


def read_db_events(path: Path) -> tuple[pa.Table, list[str], dict[str, str]]:
    """The raw timeline events of an Ascend profiler database, warnings naming missing tables, and
    each hcom op's communication group."""
    db = _connect(path)
    try:
        return _events(db, path)
    except sqlite3.Error as error:
        raise DatabaseError(f"{path}: unexpected table layout ({error})") from error
    finally:
        db.close()


def _events(db: sqlite3.Connection, path: Path) -> tuple[pa.Table, list[str], dict[str, str]]:
    tables = _tables(db)
    warnings = [
        f"{path}: no {t} table; its events are absent"
        for t in ("STRING_IDS", "TASK", "PYTORCH_API", "CANN_API")
        if t not in tables
    ]
    if "STRING_IDS" not in tables:
        raise DatabaseError(f"{path}: no STRING_IDS table; not an Ascend profiler database")
    s = "(SELECT value FROM STRING_IDS WHERE id = {})".format
    parts: list[dict[str, Any]] = []

    def add(pid: int, rows: list[tuple], names: tuple[str, ...]) -> None:
        if not rows:
            return
        cols = list(zip(*rows, strict=True))
        part: dict[str, Any] = {n: list(c) for n, c in zip(names, cols, strict=True)}
        part.pop("group", None)
        start = np.asarray(part.pop("start"), dtype=np.int64)
        end = np.asarray(part.pop("end"), dtype=np.int64)
        part["start_ns"] = start  # integer ns as the database keeps them: no text on the way
        part["dur_ns"] = end - start
        part["ph"] = ["X"] * len(start)
        part["pid"] = [pid] * len(start)
        parts.append(part)

    if "PYTORCH_API" in tables:
        api_type = _enum_sql(db, tables, "ENUM_API_TYPE", "type")
        category = " ".join(f"WHEN '{k}' THEN '{v}'" for k, v in API_CATEGORY.items())
        rows = _rows(
            db,
            f"SELECT CAST(startNs AS INTEGER), CAST(endNs AS INTEGER), globalTid & 4294967295, {s('name')}, "
            f"CASE {api_type} {category} ELSE {api_type} END FROM PYTORCH_API",
        )
        add(PIDS["Python"], rows, ("start", "end", "tid", "name", "cat"))
    if "CANN_API" in tables:
        rows = _rows(
            db, f"SELECT startNs, endNs, globalTid & 4294967295, {s('name')}, connectionId FROM CANN_API"
        )
        add(PIDS["CANN"], rows, ("start", "end", "tid", "name", "args.connection_id"))
    if "TASK" in tables:
        rows = _rows(db, _task_sql(tables, s))
        add(
            PIDS["Ascend Hardware"],
            rows,
            ("start", "end", "tid", "name", "args.Task Type", "args.connection_id", "task_info", "op_type",
             "core_type"),
        )  # fmt: skip
    groups: list[str] = []
    group_of: dict[str, str] = {}
    if "COMMUNICATION_OP" in tables:
        dtype = _enum_sql(db, tables, "ENUM_HCCL_DATA_TYPE", "dataType")
        rows = _rows(
            db,
            f"SELECT startNs, endNs, DENSE_RANK() OVER (ORDER BY groupName) - 1, {s('opName')}, "
            f"connectionId, {dtype}, CAST(count AS INTEGER), {s('groupName')} "
            "FROM COMMUNICATION_OP ORDER BY startNs",
        )
        group_of = {r[3]: r[7] or "" for r in rows if r[3]}  # op name -> group, one per op
        groups = [
            g
            for (g,) in _rows(
                db, f"SELECT DISTINCT {s('groupName')} FROM COMMUNICATION_OP ORDER BY groupName"
            )
        ]
        add(
            PIDS["HCCL"],
            rows,
            ("start", "end", "tid", "name", "args.connection_id", "args.data_type", "args.count", "group"),
        )
    if "COMMUNICATION_TASK_INFO" in tables and "TASK" in tables:
        transport = _enum_sql(db, tables, "ENUM_HCCL_TRANSPORT_TYPE", "m.transportType")
        link = _enum_sql(db, tables, "ENUM_HCCL_LINK_TYPE", "m.linkType")
        rdma = _enum_sql(db, tables, "ENUM_HCCL_RDMA_TYPE", "m.rdmaType")
        # a level0 export leaves m.taskType N/A: the hardware task's type names the slice ("Notify
        # Wait" -> "Notify_Wait", as the JSON timeline's plane lanes write it), but the task type the
        # communication analysis reads stays N/A (unknown): a hardware "SDMA" task does not say
        # whether it moved data, so such an op is split as one without tasks (transit = elapse)
        plane_name = f"COALESCE({_known(s('m.taskType'))}, REPLACE({s('t.taskType')}, ' ', '_'))"
        plane_task = s("m.taskType")
        rows = _rows(
            db,
            f"SELECT t.startNs, t.endNs, {len(groups)} + m.planeId, {plane_name}, {plane_task}, "
            f"{transport}, {link}, {rdma}, m.size, m.srcRank, m.dstRank, m.planeId "
            "FROM COMMUNICATION_TASK_INFO m JOIN TASK t ON t.globalTaskId = m.globalTaskId",
        )
        add(
            PIDS["HCCL"],
            rows,
            ("start", "end", "tid", "name", "args.task type", "args.transport type", "args.link type",
             "args.rdma type", "args.size(Byte)", "args.src rank", "args.dst rank", "args.plane id"),
        )  # fmt: skip
        planes = sorted({r[11] for r in rows})
    else:
        planes = []
    meta = [(pid, 0, name) for name, pid in PIDS.items()]
    threads = [(PIDS["HCCL"], i, f"Group {g} Communication") for i, g in enumerate(groups)]  # per lane
    threads += [(PIDS["HCCL"], len(groups) + p, f"Plane {p}") for p in planes]
    parts.append(
        {
            "ph": ["M"] * (len(meta) + len(threads)),
            "name": ["process_name"] * len(meta) + ["thread_name"] * len(threads),
            "pid": [m[0] for m in meta] + [t[0] for t in threads],
            "tid": [m[1] for m in meta] + [t[1] for t in threads],
            "args.name": [m[2] for m in meta] + [t[2] for t in threads],
        }
    )
    tables_out = [flat_table(part, len(part["ph"])) for part in parts]  # one per source table
    return pa.concat_tables(tables_out), warnings, group_of


def _known(sql: str) -> str:
    """``sql``, or NULL where the database writes ``N/A`` (a fact the export level did not record)."""
    return f"(CASE WHEN {sql} IN ('N/A', '') THEN NULL ELSE {sql} END)"


def _task_sql(tables: set[str], s: Any) -> str:
    """SQL for every ``TASK`` row: times, stream, name, task type, connection, which task-info table
    names it (:data:`~perfsight.ingest.ascend_events.SOURCE_FIELDS`), and the vendor's op and core
    type of a compute task.

    The task-info tables decide what a task is, as Ascend's own analysis does: a task with a
    ``COMPUTE_TASK_INFO`` row is computing, one with a ``COMMUNICATION_TASK_INFO`` row is
    communication, any other (the HCCL op's own task on the communication stream, whose taskType is
    ``AI_CORE``; event records and waits; copies; kernels the profiler did not describe) is
    ``"none"``.  ``taskType`` alone would make the HCCL op envelopes computing.  Types written
    ``N/A`` (a level0 export does not describe its kernels) are null."""
    compute = "COMPUTE_TASK_INFO" in tables
    communication = "COMMUNICATION_TASK_INFO" in tables
    # joins, not correlated sub-queries: SQLite indexes the joined side, so this stays n log n
    joins = "LEFT JOIN COMPUTE_TASK_INFO c ON c.globalTaskId = t.globalTaskId " if compute else ""
    joins += (
        "LEFT JOIN (SELECT DISTINCT globalTaskId AS id FROM COMMUNICATION_TASK_INFO) m "
        "ON m.id = t.globalTaskId"
        if communication
        else ""
    )
    names = ([s("c.name")] if compute else []) + [s("t.taskType")]  # HCCL's tasks: "Notify Wait", ...
    info = "CASE"
    info += " WHEN c.globalTaskId IS NOT NULL THEN 'compute'" if compute else ""
    info += " WHEN m.id IS NOT NULL THEN 'communication'" if communication else ""
    info += " ELSE 'none' END" if compute or communication else " ELSE NULL END"
    known = _known
    op_type = known(s("c.opType")) if compute else "NULL"
    core_type = known(s("c.taskType")) if compute else "NULL"
    return (
        f"SELECT t.startNs, t.endNs, t.streamId, COALESCE({', '.join(names)}), {s('t.taskType')}, "
        f"t.connectionId, {info}, {op_type}, {core_type} FROM TASK t {joins}"
    )


def read_tables(path: Path) -> dict[str, pa.Table]:
    """Every table of an SQLite file, whole (for Ascend's result databases)."""
    db = _connect(path)
    try:
        out = {}
        for table in sorted(_tables(db)):
            cursor = db.execute(f'SELECT * FROM "{table}"')
            names = [d[0] for d in cursor.description]
            columns = list(zip(*cursor.fetchall(), strict=True)) or [()] * len(names)
            out[table] = pa.table({n: pa.array(list(c)) for n, c in zip(names, columns, strict=True)})
        return out
    finally:
        db.close()
