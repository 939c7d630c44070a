"""Reading Ascend profiler output folders: every real file loads, quirks survive, damage is named.

Every test reads a read-only copy of its input (after the test's own damage, where it makes some)
and checks that the folder is byte-for-byte unchanged afterwards.
"""

from __future__ import annotations

import csv
import json
import shutil
from collections.abc import Callable, Iterator
from decimal import Decimal
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pytest

import perfsight
from _readonly import read_only_copies
from perfsight.ingest import find_traces, read_trace
from perfsight.ingest.ascend import find_ascend_outputs, read_ascend, read_outputs
from perfsight.model import TABLE_SCHEMAS
from shared_data import DATA, require

ASCEND = DATA / "ascend_pt"


@pytest.fixture
def read_only(tmp_path: Path) -> Iterator[Callable[[Path], Path]]:
    with read_only_copies(tmp_path) as copy:
        yield copy


def _folders(read_only: Callable[[Path], Path]) -> list[Path]:
    """Every rank folder of a read-only copy of the shared Ascend data."""
    return find_ascend_outputs(read_only(ASCEND))


def _copy_rank(tmp_path: Path, level: str = "level1", rank: int = 0) -> Path:
    source = ASCEND / level / f"rank{rank}_ascend_pt"
    require(source)
    target = tmp_path / source.name
    shutil.copytree(source, target)
    for path in target.rglob("*"):
        path.chmod(0o644 if path.is_file() else 0o755)
    return target


def _raw_timeline(path: Path) -> list[dict]:
    return json.loads(path.read_text())


def test_every_rank_folder_under_the_real_data_loads_without_warnings(read_only) -> None:
    found = _folders(read_only)
    assert [f.parent.name for f in found] == ["db_level0"] * 2 + ["level0"] * 2 + ["level1"] * 2
    folders = [f for f in found if f.parent.name != "db_level0"]  # the text exports (db: test_ascend_db)
    assert [f.name for f in folders] == ["rank0_ascend_pt", "rank1_ascend_pt"] * 2
    for folder in folders:
        trace = read_ascend(folder)
        assert trace.meta.warnings == []
        assert trace.rank == int(folder.name[4]) and trace.meta.rank_source == "trace"
        for name, schema in TABLE_SCHEMAS.items():
            assert getattr(trace, name).schema.equals(schema), name
        assert trace.slices.num_rows and trace.steps.num_rows == 1 and trace.comm.num_rows == 4
        assert trace.memory.num_rows > 0
        assert "ENV_VARIABLES" in trace.meta.extra["ascend"]["metadata"]  # profiler_metadata.json
        assert trace.meta.extra["ascend"]["config"]["common_config"]["record_shapes"] is True
        outputs = read_outputs(folder)
        assert outputs.warnings == []
        out = folder / "ASCEND_PROFILER_OUTPUT"
        for name, table in outputs.tables.items():
            with (out / name).open(newline="") as handle:
                assert table.num_rows == sum(1 for _ in csv.reader(handle)) - 1, name
        assert set(outputs.json) == {p.name for p in out.glob("communication*.json")}
        readable = {p.name for p in out.iterdir()} - {"trace_view.json"}  # the timeline is the trace
        assert set(outputs.tables) | set(outputs.json) == readable


def test_the_timeline_keeps_every_raw_event_that_is_a_slice(read_only) -> None:
    out = read_only(ASCEND / "level1" / "rank1_ascend_pt") / "ASCEND_PROFILER_OUTPUT"
    raw = _raw_timeline(out / "trace_view.json")
    processes = {
        e["pid"]: e["args"]["name"] for e in raw if e.get("ph") == "M" and e["name"] == "process_name"
    }
    slices = [e for e in raw if e.get("ph") == "X" and processes.get(e["pid"]) != "Overlap Analysis"]
    trace = read_trace(out / "trace_view.json")
    assert trace.slices.num_rows == len(slices)
    first = min(slices, key=lambda e: Decimal(e["ts"]))  # decimal-string timestamps, exact to the ns
    assert pc.min(trace.slices.column("start_ns")).as_py() == int(Decimal(first["ts"]) * 1000)
    hccl = [e for e in slices if processes[e["pid"]] == "HCCL"]
    assert trace.comm.num_rows == sum(1 for e in hccl if e["tid"] == 0)
    assert trace.comm_tasks.num_rows == sum(1 for e in hccl if e["tid"] != 0)
    moved = sum(e["args"]["size(Byte)"] for e in hccl if e["tid"] != 0)
    assert pc.sum(trace.comm_tasks.column("bytes")).as_py() == moved
    kinds = {
        r["values"]: r["counts"]
        for r in pc.value_counts(trace.slices.column("kind").cast("string")).to_pylist()
    }
    kernel_types = ("AI_CORE", "AI_VECTOR_CORE", "MIX_AIV", "MIX_AIC", "AI_CPU", "DSA_SQE")
    hardware = [e for e in slices if processes[e["pid"]] == "Ascend Hardware"]
    assert kinds["step"] == 1
    assert kinds["kernel"] == sum(1 for e in hardware if e["args"].get("Task Type") in kernel_types)


def test_csv_quirks_are_cleaned(read_only) -> None:
    out = read_only(ASCEND / "level1" / "rank0_ascend_pt") / "ASCEND_PROFILER_OUTPUT"
    tables = read_outputs(out.parent).tables
    kernels = tables["kernel_details.csv"]
    with (out / "kernel_details.csv").open(newline="") as handle:
        rows = list(csv.DictReader(handle))
    first = rows[0]
    assert first["Start Time(us)"].endswith("\t") and first["Input Shapes"].startswith('"')
    assert kernels.column("Start Time(us)")[0].as_py() == Decimal(first["Start Time(us)"].strip())
    assert kernels.column("Input Shapes")[0].as_py() == first["Input Shapes"].strip('"')
    assert kernels.column("Context ID").null_count == sum(r["Context ID"] == "N/A" for r in rows) > 0
    memory = tables["memory_record.csv"]
    assert memory.column("Total Allocated(MB)").null_count > 0  # empty cells: null, not zero


def test_a_truncated_timeline_is_read_up_to_the_damage_and_named(tmp_path: Path, read_only) -> None:
    folder = _copy_rank(tmp_path)
    timeline = folder / "ASCEND_PROFILER_OUTPUT" / "trace_view.json"
    whole = read_ascend(read_only(folder))
    data = timeline.read_bytes()
    timeline.write_bytes(data[: len(data) * 6 // 10])
    damaged = read_only(folder)
    trace = read_ascend(damaged)
    timeline = damaged / "ASCEND_PROFILER_OUTPUT" / "trace_view.json"
    assert any(str(timeline) in w and "truncated" in w for w in trace.meta.warnings)
    assert 0 < trace.slices.num_rows < whole.slices.num_rows
    assert trace.memory.num_rows == whole.memory.num_rows  # the other files still load


def test_a_missing_column_and_garbage_rows_are_warnings_naming_the_file(tmp_path: Path, read_only) -> None:
    folder = _copy_rank(tmp_path)
    out = folder / "ASCEND_PROFILER_OUTPUT"
    kernels = out / "kernel_details.csv"
    lines = kernels.read_text().splitlines()
    lines[0] = lines[0].replace("Duration(us)", "Dur")
    kernels.write_text("\n".join(lines) + "\n")
    memory = out / "memory_record.csv"
    memory.write_text(memory.read_text() + "garbage\n1,2\n\x00\x01 not a row at all,,,,,,,,,,\n")
    communication = out / "communication.json"
    communication.write_text(communication.read_text()[:100])
    folder = read_only(folder)
    out = folder / "ASCEND_PROFILER_OUTPUT"
    kernels, memory, communication = (out / f.name for f in (kernels, memory, communication))
    outputs = read_outputs(folder)
    assert any(str(kernels) in w and "Duration(us)" in w for w in outputs.warnings)
    assert any(str(memory) in w and "3 malformed row(s)" in w for w in outputs.warnings)
    assert any(str(communication) in w and "not valid JSON" in w for w in outputs.warnings)
    assert (
        outputs.tables["memory_record.csv"].num_rows == 1004 and outputs.tables["op_statistic.csv"].num_rows
    )
    trace = read_ascend(folder)
    assert trace.memory.num_rows > 0 and trace.comm.num_rows == 4
    assert any(str(communication) in w for w in trace.meta.warnings)


def test_a_folder_without_any_profiler_output_is_a_one_line_error(tmp_path: Path, read_only) -> None:
    folder = tmp_path / "rank0_ascend_pt" / "ASCEND_PROFILER_OUTPUT"
    folder.mkdir(parents=True)
    (folder / "trace_view.json").write_text("this is not json")
    with pytest.raises(perfsight.ingest.TraceReadError, match="trace_view.json"):
        read_ascend(read_only(folder.parent))


def test_the_two_ranks_open_as_one_job_in_analyse(tmp_path: Path, read_only) -> None:
    level = read_only(ASCEND / "level1")
    assert [p.name for p in find_traces(level)] == ["trace_view.json", "trace_view.json"]
    analysis = perfsight.analyse(level, out=tmp_path / "out")
    assert sorted(analysis.ranks) == [0, 1]
    for rank in (0, 1):
        assert analysis.trace(rank).meta.world_size == 8  # HCCL's peers: an 8-rank group
        written = tmp_path / "out" / f"rank{rank}" / "PROFILER_OUTPUT" / "step_trace_time.csv"
        with written.open(newline="") as handle:
            mine = next(csv.DictReader(handle))
        with (
            level / f"rank{rank}_ascend_pt" / "ASCEND_PROFILER_OUTPUT" / "step_trace_time.csv"
        ).open() as handle:
            golden = next(csv.DictReader(handle))
        assert abs(float(mine["Stage"]) - float(golden["Stage"])) <= 1.0


def test_columns_that_differ_between_versions_read_under_one_name(tmp_path: Path, read_only) -> None:
    folder = _copy_rank(tmp_path, "level0", 1)
    out = folder / "ASCEND_PROFILER_OUTPUT"
    kernels = out / "kernel_details.csv"
    lines = kernels.read_text().splitlines()
    lines = [f"Device_id,{lines[0].replace('Block Dim', 'Block Num')}"] + [f"1,{line}" for line in lines[1:]]
    kernels.write_text("\n".join(lines) + "\n")
    steps = out / "step_trace_time.csv"
    rows = [line.rsplit(",", 1)[0] for line in steps.read_text().splitlines()]  # an older file: no Preparing
    steps.write_text("\n".join(rows) + "\n")
    outputs = read_outputs(read_only(folder))
    assert outputs.warnings == []
    table = outputs.tables["kernel_details.csv"]
    assert set(table.column("Device Id").to_pylist()) == {1.0}
    assert table.column("Block Dim").null_count < table.num_rows
    assert "Preparing" not in outputs.tables["step_trace_time.csv"].column_names
    assert outputs.tables["step_trace_time.csv"].column("Free").to_pylist()[0] > 0


def test_garbage_events_in_the_timeline_are_named_and_the_good_ones_kept(tmp_path: Path, read_only) -> None:
    timeline = tmp_path / "r_ascend_pt" / "ASCEND_PROFILER_OUTPUT" / "trace_view.json"
    timeline.parent.mkdir(parents=True)
    proc = '{"ph": "M", "name": "process_name", "pid": 1, "tid": 0, "args": {"name": "Python"}}'
    good = '{"ph": "X", "name": "aten::mm", "pid": 1, "tid": 1, "ts": "10.5", "dur": 2, "cat": "cpu_op"}'
    no_time = '{"ph": "X", "name": "aten::add", "pid": 1, "tid": 1, "ts": "soon", "dur": 2, "cat": "cpu_op"}'
    timeline.write_text(f"[{proc}, {good}, {no_time}, {{not json at all}}, {good}]")
    folder = read_only(timeline.parent.parent)
    timeline = folder / "ASCEND_PROFILER_OUTPUT" / "trace_view.json"
    trace = read_ascend(folder)
    assert trace.slices.column("name").to_pylist() == ["aten::mm"]
    assert trace.slices.column("start_ns").to_pylist() == [10_500]
    warnings = "\n".join(trace.meta.warnings)
    assert f"{timeline}: 1 slice event(s) without a usable timestamp" in warnings
    assert f"{timeline}: damaged" in warnings and "not valid JSON" in warnings


def test_a_timeline_copied_out_of_its_folder_is_still_read_as_ascends(tmp_path: Path) -> None:
    """A user who copies (or renames) ``trace_view.json`` alone gets the device's numbers, not a
    host-only reading of it: the same slices and overlap breakdown as in its rank folder, rank 0
    with warnings that say why; the bounded path leaves it to this reader."""
    from perfsight.analysis.overlap import overlap_breakdown
    from perfsight.ingest import bounded_input

    source = ASCEND / "level1" / "rank1_ascend_pt" / "ASCEND_PROFILER_OUTPUT" / "trace_view.json"
    require(source)
    lone = tmp_path / "copied" / "rank1_timeline.json"
    lone.parent.mkdir()
    shutil.copyfile(source, lone)
    in_place, alone = read_trace(source), read_trace(lone)
    assert alone.rank == 0 and alone.meta.backend == "hccl"
    assert any(
        str(lone) in w and "outside an ASCEND_PROFILER_OUTPUT folder" in w for w in alone.meta.warnings
    )
    assert any("no profiler_info" in w for w in alone.meta.warnings)
    assert alone.slices.num_rows == in_place.slices.num_rows
    assert (
        pc.sum(alone.slices.column("is_device")).as_py()
        == pc.sum(in_place.slices.column("is_device")).as_py()
    )
    assert _without_rank(overlap_breakdown(alone)) == _without_rank(overlap_breakdown(in_place))
    assert not bounded_input(lone)


def _without_rank(table: pa.Table) -> list[dict]:
    return table.drop_columns(["rank"]).to_pylist()
