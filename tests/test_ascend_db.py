"""The database export (``ascend_pytorch_profiler_{rank}.db``) reads like the JSON timeline, and the
real database export in ../shared/data gives Ascend's own step trace (``analysis.db``).

The first tests write a database from the real level1 rank 0 timeline in msprof's documented table
layout (STRING_IDS interning, ns, enumeration ids; without the enumeration tables, which the reader
must then know itself) and check that perfsight's analyses of it equal those of ``trace_view.json``.
Every test reads a read-only copy of its input and checks its folder is unchanged afterwards.
"""

from __future__ import annotations

import csv
import json
import shutil
import sqlite3
import subprocess
import sys
from collections.abc import Callable, Iterator
from decimal import Decimal
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from _readonly import read_only_copies, read_only_copy
from perfsight.analysis import communication as comm
from perfsight.analysis.kernels import kernel_details
from perfsight.analysis.overlap import overlap_breakdown
from perfsight.export.mindspore_csv import write_step_trace_time
from perfsight.ingest import TraceReadError, find_traces, read_trace
from perfsight.ingest.ascend import read_ascend, read_outputs
from shared_data import DATA, require

RANK0 = DATA / "ascend_pt" / "level1" / "rank0_ascend_pt"
TRANSPORT = {"SDMA": 0, "RDMA": 1, "LOCAL": 2}
LINK = {"ON_CHIP": 0, "HCCS": 1, "PCIE": 2, "ROCE": 3, "SIO": 4, "HCCS_SW": 5}
DTYPE = {"INT32": 2, "FP16": 3, "FP32": 4}
COMPUTE_TASK_TYPES = {"AI_CORE", "AI_VECTOR_CORE", "AI_CPU", "MIX_AIC", "MIX_AIV", "DSA_SQE"}
"""Task types of the timeline's kernels: the tasks msprof gives a ``COMPUTE_TASK_INFO`` row."""


def _ns(ts: str) -> int:
    return int(Decimal(ts) * 1000)


def _write_db(timeline: Path, db_path: Path) -> None:
    events = json.loads(timeline.read_text())
    procs = {e["pid"]: e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "process_name"}
    ids: dict[str, int] = {}

    def sid(text: str) -> int:
        return ids.setdefault(text, len(ids))

    db = sqlite3.connect(db_path)
    db.executescript(
        "CREATE TABLE STRING_IDS(id INTEGER PRIMARY KEY, value TEXT);"
        "CREATE TABLE PYTORCH_API(startNs TEXT, endNs TEXT, globalTid INTEGER, connectionId INTEGER,"
        " name INTEGER, sequenceNumber INTEGER, fwdThreadId INTEGER, inputDtypes INTEGER,"
        " inputShapes INTEGER, callchainId INTEGER, type INTEGER);"
        "CREATE TABLE CANN_API(startNs INTEGER, endNs INTEGER, type INTEGER, globalTid INTEGER,"
        " connectionId INTEGER, name INTEGER);"
        "CREATE TABLE TASK(startNs INTEGER, endNs INTEGER, deviceId INTEGER, connectionId INTEGER,"
        " globalTaskId INTEGER, globalPid INTEGER, taskType INTEGER, contextId INTEGER, streamId INTEGER,"
        " taskId INTEGER, modelId INTEGER);"
        "CREATE TABLE COMPUTE_TASK_INFO(name INTEGER, globalTaskId INTEGER PRIMARY KEY, blockDim INTEGER,"
        " mixBlockDim INTEGER, taskType INTEGER, opType INTEGER);"
        "CREATE TABLE COMMUNICATION_OP(opName INTEGER, startNs INTEGER, endNs INTEGER, connectionId INTEGER,"
        " groupName INTEGER, opId INTEGER PRIMARY KEY, relay INTEGER, retry INTEGER, dataType INTEGER,"
        " algType INTEGER, count NUMERIC, opType INTEGER);"
        "CREATE TABLE COMMUNICATION_TASK_INFO(name INTEGER, globalTaskId INTEGER, taskType INTEGER,"
        " planeId INTEGER, groupName INTEGER, notifyId INTEGER, rdmaType INTEGER, srcRank INTEGER,"
        " dstRank INTEGER, transportType INTEGER, size INTEGER, dataType INTEGER, linkType INTEGER,"
        " opId INTEGER);"
    )
    api_type = {"cpu_op": 50001, "python_function": 50003}
    task_id = 0
    for e in events:
        if e["ph"] != "X":
            continue
        start, end = _ns(e["ts"]), _ns(e["ts"]) + round(e["dur"] * 1000)
        args, proc = e.get("args", {}), procs.get(e["pid"])
        if proc == "Python" and e.get("cat") in api_type:
            db.execute(
                "INSERT INTO PYTORCH_API(startNs, endNs, globalTid, name, type) VALUES (?,?,?,?,?)",
                (str(start), str(end), (e["pid"] << 32) | e["tid"], sid(e["name"]), api_type[e["cat"]]),
            )
        elif proc == "CANN":
            db.execute(
                "INSERT INTO CANN_API VALUES (?,?,?,?,?,?)",
                (start, end, 5000, e["tid"], args.get("connection_id"), sid(e["name"])),
            )
        elif proc == "Ascend Hardware" and args.get("Task Type") not in (
            "Notify Wait",
            "Write Value",
            "SDMA",
        ):
            task_id += 1
            db.execute(
                "INSERT INTO TASK(startNs, endNs, deviceId, connectionId, globalTaskId, taskType, streamId)"
                " VALUES (?,?,?,?,?,?,?)",
                (start, end, 0, args.get("connection_id"), task_id, sid(args["Task Type"]), e["tid"]),
            )
            if args["Task Type"] in COMPUTE_TASK_TYPES:  # msprof describes kernels only
                db.execute(
                    "INSERT INTO COMPUTE_TASK_INFO(name, globalTaskId) VALUES (?,?)",
                    (sid(e["name"]), task_id),
                )
        elif proc == "HCCL" and e["tid"] == 0:
            db.execute(
                "INSERT INTO COMMUNICATION_OP(opName, startNs, endNs, connectionId, groupName, dataType,"
                " count) VALUES (?,?,?,?,?,?,?)",
                (sid(e["name"]), start, end, args["connection_id"], sid("17522688603477080586"),
                 DTYPE[args["data_type"]], args["count"]),
            )  # fmt: skip
        elif proc == "HCCL":
            task_id += 1
            db.execute(
                "INSERT INTO TASK(startNs, endNs, deviceId, globalTaskId, taskType, streamId)"
                " VALUES (?,?,?,?,?,?)",
                (start, end, 0, task_id, sid(e["name"].replace("_", " ")), args["stream id"]),
            )
            invalid = 4294967295
            db.execute(
                "INSERT INTO COMMUNICATION_TASK_INFO(name, globalTaskId, taskType, planeId, groupName,"
                " srcRank, dstRank, transportType, size, linkType) VALUES (?,?,?,?,?,?,?,?,?,?)",
                (sid(e["name"]), task_id, sid(args["task type"]), e["tid"] - 1, sid("17522688603477080586"),
                 args["src rank"], args["dst rank"], TRANSPORT.get(args["transport type"], invalid),
                 args["size(Byte)"], LINK.get(args["link type"], invalid)),
            )  # fmt: skip
    db.executemany("INSERT INTO STRING_IDS VALUES (?,?)", [(i, v) for v, i in ids.items()])
    db.commit()
    db.close()


@pytest.fixture
def read_only(tmp_path: Path) -> Iterator[Callable[[Path], Path]]:
    with read_only_copies(tmp_path) as copy:
        yield copy


@pytest.fixture
def db_only_rank(tmp_path: Path) -> Path:
    require(RANK0)
    folder = tmp_path / RANK0.name
    (folder / "ASCEND_PROFILER_OUTPUT").mkdir(parents=True)
    shutil.copyfile(RANK0 / "profiler_info_0.json", folder / "profiler_info_0.json")
    _write_db(
        RANK0 / "ASCEND_PROFILER_OUTPUT" / "trace_view.json", folder / "ASCEND_PROFILER_OUTPUT" / "x.db"
    )
    (folder / "ASCEND_PROFILER_OUTPUT" / "x.db").rename(
        folder / "ASCEND_PROFILER_OUTPUT" / "ascend_pytorch_profiler_0.db"
    )
    return folder


def test_the_database_gives_the_same_analyses_as_the_json_timeline(db_only_rank: Path, read_only) -> None:
    [found] = find_traces(read_only(db_only_rank).parent)
    assert found.name == "ascend_pytorch_profiler_0.db"
    from_db = read_trace(found)
    from_json = read_trace(read_only(RANK0) / "ASCEND_PROFILER_OUTPUT" / "trace_view.json")
    assert from_db.rank == 0 and from_db.meta.warnings == []
    assert from_db.comm.column("group").to_pylist() == ["17522688603477080586"] * 4
    assert from_db.comm.column("in_bytes").to_pylist() == from_json.comm.column("in_bytes").to_pylist()
    db_times = comm.op_times(from_db.comm, from_db.comm_tasks).drop_columns(["group"])
    json_times = comm.op_times(from_json.comm, from_json.comm_tasks).drop_columns(["group"])
    assert db_times.equals(json_times)
    assert comm.link_bandwidth(from_db.comm, from_db.comm_tasks).equals(
        comm.link_bandwidth(from_json.comm, from_json.comm_tasks)
    )
    db_steps, json_steps = overlap_breakdown(from_db).to_pylist(), overlap_breakdown(from_json).to_pylist()
    assert len(db_steps) == len(json_steps) == 1
    for column in ("computing_ns", "communication_ns", "free_ns", "stage_ns", "preparing_ns"):
        assert abs(db_steps[0][column] - json_steps[0][column]) <= 1_000, column


def test_a_file_that_is_not_a_database_is_a_one_line_error(db_only_rank: Path, read_only) -> None:
    db = db_only_rank / "ASCEND_PROFILER_OUTPUT" / "ascend_pytorch_profiler_0.db"
    db.write_bytes(b"not sqlite at all" * 100)
    with pytest.raises(TraceReadError, match="ascend_pytorch_profiler_0.db"):
        read_ascend(read_only(db_only_rank))


# --- the real database export (../shared/data/ascend_pt/db_level0) against Ascend's own analysis.db

DB_LEVEL0 = DATA / "ascend_pt" / "db_level0"
STEP_TRACE_COLUMNS = {
    "computing": "Computing",
    "communication_not_overlapped": "Communication(Not Overlapped)",
    "overlapped": "Overlapped",
    "communication": "Communication",
    "free": "Free",
    "stage": "Stage",
    "bubble": "Bubble",
    "communication_not_overlapped_and_exclude_receive": "Communication(Not Overlapped and Exclude Receive)",
    "preparing": "Preparing",
}
"""``StepTraceTime`` column of Ascend's ``analysis.db`` -> perfsight's ``step_trace_time.csv`` header."""


def _vendor_step_trace(rank_folder: Path) -> dict[int, dict[str, float]]:
    """Ascend's step trace of a rank (µs), read with the standard library from ``analysis.db``."""
    path = rank_folder / "ASCEND_PROFILER_OUTPUT" / "analysis.db"
    db = sqlite3.connect(f"{path.resolve().as_uri()}?immutable=1", uri=True)
    try:
        cursor = db.execute("SELECT * FROM StepTraceTime")
        names = [d[0] for d in cursor.description]
        return {int(row[0]): dict(zip(names[1:], map(float, row[1:]), strict=True)) for row in cursor}
    finally:
        db.close()


def _assert_step_trace_matches(mine: dict[int, dict[str, str]], golden: dict[int, dict[str, float]]) -> None:
    assert mine.keys() == golden.keys()
    for step, row in golden.items():
        for vendor, header in STEP_TRACE_COLUMNS.items():
            got, want = float(mine[step][header]), row[vendor]
            # 1e-4 relative; 1 ns where Ascend writes 0
            assert abs(got - want) <= max(1e-4 * abs(want), 1e-3), (step, header, got, want)


def _written_step_trace(path: Path) -> dict[int, dict[str, str]]:
    with path.open(newline="") as handle:
        return {int(r["Step"]): r for r in csv.DictReader(handle)}


@pytest.mark.parametrize("rank", [0, 1])
def test_each_rank_of_the_database_export_has_ascends_step_trace(rank: int, tmp_path: Path) -> None:
    with read_only_copy(DB_LEVEL0 / f"rank{rank}_ascend_pt", tmp_path) as folder:
        trace = read_ascend(folder)
        assert trace.meta.warnings == []
        written = write_step_trace_time(tmp_path / "out", overlap_breakdown(trace))
        golden = _vendor_step_trace(folder)
        assert not list(folder.rglob("*-wal")) and not list(folder.rglob("*-shm"))
    _assert_step_trace_matches(_written_step_trace(written), golden)


def test_the_database_export_analysed_as_a_job_has_ascends_step_trace_per_rank(tmp_path: Path) -> None:
    with read_only_copy(DB_LEVEL0, tmp_path) as job:
        result = subprocess.run(
            [sys.executable, "-m", "perfsight.cli", "analyse", str(job), "--out", str(tmp_path / "out")],
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
        golden = {rank: _vendor_step_trace(job / f"rank{rank}_ascend_pt") for rank in (0, 1)}
    assert result.returncode == 0, result.stderr
    assert "not overlapped 0.0%" not in result.stdout  # the collectives' wait is communication
    with (tmp_path / "out" / "cluster_analysis_output" / "cluster_step_trace_time.csv").open() as handle:
        rows = [r for r in csv.DictReader(handle) if r["Type"] == "rank" and r["Step"] != "average"]
    for rank in (0, 1):
        mine = {
            int(r["Step"]): {h: r[f"{h}(us)"] for h in STEP_TRACE_COLUMNS.values()}
            for r in rows
            if int(r["Index"]) == rank
        }
        _assert_step_trace_matches(mine, golden[rank])
        per_rank = tmp_path / "out" / f"rank{rank}" / "PROFILER_OUTPUT" / "step_trace_time.csv"
        _assert_step_trace_matches(_written_step_trace(per_rank), golden[rank])


def test_tasks_are_classified_by_the_task_info_tables(tmp_path: Path) -> None:
    """Computing is the tasks with a COMPUTE_TASK_INFO row; the HCCL op's own AI_CORE task on the
    communication stream and undescribed kernels are neither computing nor communication."""
    with read_only_copy(DB_LEVEL0 / "rank0_ascend_pt", tmp_path) as folder:
        trace = read_ascend(folder)
        path = folder / "ASCEND_PROFILER_OUTPUT" / "ascend_pytorch_profiler_0.db"
        db = sqlite3.connect(f"{path.resolve().as_uri()}?immutable=1", uri=True)
        compute = db.execute(
            "SELECT count(*), sum(t.endNs - t.startNs) FROM TASK t"
            " JOIN COMPUTE_TASK_INFO c USING (globalTaskId)"
        ).fetchone()
        db.close()
    slices = trace.slices.filter(pc.field("is_device"))
    kernels = slices.filter(pc.equal(slices.column("kind").cast(pa.string()), "kernel"))
    assert (kernels.num_rows, pc.sum(kernels.column("dur_ns")).as_py()) == tuple(compute)
    dsa = pc.equal(kernels.column("core_type").cast(pa.string()), "STARS_COMMON")
    assert pc.sum(dsa).as_py() == 2  # DSA tasks are computing too
    details = kernel_details(trace)  # each collective once: 4 hcom ops, none of their 296 tasks' copies
    comm = details.filter(pc.equal(details.column("kind"), "communication"))
    assert comm.column("name").to_pylist() == trace.comm.column("name").to_pylist()
    assert details.num_rows == compute[0] + trace.comm.num_rows


def test_a_read_only_database_in_wal_mode_opens_without_writing_beside_it(tmp_path: Path) -> None:
    """A database in WAL mode opened with ``mode=ro`` leaves -wal/-shm files beside it, and fails on a
    read-only mount; the reader must do neither."""
    source = tmp_path / "wal" / "rank1_ascend_pt"
    shutil.copytree(require(DB_LEVEL0 / "rank1_ascend_pt"), source)
    for path in [source, *source.rglob("*")]:
        path.chmod(0o755 if path.is_dir() else 0o644)
    for db_path in source.rglob("*.db"):
        db = sqlite3.connect(db_path)
        assert db.execute("PRAGMA journal_mode=WAL").fetchone() == ("wal",)
        db.close()
    assert not list(source.rglob("*-wal"))  # a clean close leaves the database whole
    with read_only_copy(source, tmp_path / "read_only") as folder:
        path = folder / "ASCEND_PROFILER_OUTPUT" / "ascend_pytorch_profiler_1.db"
        assert path.read_bytes()[18:20] == b"\x02\x02"  # the header's WAL read/write versions
        trace = read_ascend(folder)
        assert trace.rank == 1 and trace.comm.num_rows == 4 and trace.meta.warnings == []
        assert read_outputs(folder).databases["analysis.db"]["StepTraceTime"].num_rows == 1
