"""MindSpore-compatible CSV files: Ascend headers, exact units, escaping, and agreement with the trace.

Real-trace tests write the five files from the analyses of real Kineto traces and check them
against the trace and against an oracle computed straight from the raw JSON with the standard
library; unit tests use small hand-built tables whose numbers can be checked on paper.
"""

from __future__ import annotations

import csv
import gzip
import json
import re
from decimal import Decimal
from pathlib import Path

import pyarrow as pa
import pytest

from _hostile import HOSTILE_NAMES, hostile_trace
from perfsight.analysis.kernels import kernel_details
from perfsight.analysis.memory import memory_curve, operator_memory
from perfsight.analysis.op_statistic import HOST_CORE_TYPE, op_statistic
from perfsight.analysis.operators import operator_stats
from perfsight.analysis.overlap import overlap_breakdown
from perfsight.export import mindspore_csv as ms
from perfsight.ingest import read_trace
from perfsight.model import NO_ID, Trace
from perfsight.units import ns_to_us
from shared_data import KINETO, require

NCCL = KINETO / "nccl_parser_config" / "nccl_data.json.gz"
DF_INDEX = KINETO / "df_index_resolver" / "df_index_resolver.json.gz"
CPU_ONLY = KINETO / "cpu_only" / "rank-34.Jul_15_10_52_41.1074.pt.trace.json.gz"
ASCEND_OUTPUT = KINETO.parent / "ascend_pt" / "level1" / "rank0_ascend_pt" / "ASCEND_PROFILER_OUTPUT"
OUTPUTS_MD = Path(__file__).resolve().parents[1] / "docs" / "OUTPUTS.md"

PERFSIGHT_ONLY_COLUMNS = {"kernel_details.csv": {"Block", "Occupancy(%)"}}
"""Columns we add that Ascend's files lack (documented as such in docs/OUTPUTS.md)."""


def _read(path: Path) -> tuple[list[str], list[dict[str, str]]]:
    with path.open(newline="", encoding="utf-8") as handle:
        reader = csv.DictReader(handle)
        rows = list(reader)
        return list(reader.fieldnames or []), rows


def _analyses(trace: Trace) -> dict[str, pa.Table]:
    return {
        "kernel_details": kernel_details(trace),
        "operator_stats": operator_stats(trace),
        "overlap_breakdown": overlap_breakdown(trace),
        "memory_curve": memory_curve(trace),
        "operator_memory": operator_memory(trace),
    }


@pytest.fixture(scope="module")
def nccl_files(tmp_path_factory: pytest.TempPathFactory) -> tuple[Trace, dict[str, pa.Table], Path]:
    trace = read_trace(require(NCCL))
    tables = _analyses(trace)
    folder = tmp_path_factory.mktemp("nccl_csv")
    ms.write_all(folder, tables)
    return trace, tables, folder


@pytest.fixture(scope="module")
def df_files(tmp_path_factory: pytest.TempPathFactory) -> tuple[Trace, dict[str, pa.Table], Path]:
    trace = read_trace(require(DF_INDEX))
    tables = {"memory_curve": memory_curve(trace), "operator_memory": operator_memory(trace)}
    folder = tmp_path_factory.mktemp("df_csv")
    ms.write_all(folder, tables)
    return trace, tables, folder


# ---------------------------------------------------------------------------------------------
# headers and documentation


@pytest.mark.parametrize("file_name", sorted(ms.FILES))
def test_headers_are_ascends_own_where_the_concept_exists(file_name: str) -> None:
    ascend = require(ASCEND_OUTPUT / file_name)
    with ascend.open(newline="", encoding="utf-8") as handle:
        ascend_header = next(csv.reader(handle))
    ours = list(ms.FILES[file_name])
    extra = PERFSIGHT_ONLY_COLUMNS.get(file_name, set())
    assert [h for h in ours if h not in extra] == [h for h in ascend_header if h in ours]
    assert set(ours) - set(ascend_header) == extra


def test_every_csv_column_is_documented_with_its_file() -> None:
    doc = OUTPUTS_MD.read_text(encoding="utf-8")
    sections = dict(re.findall(r"^## (\S+)\n(.*?)(?=^## |\Z)", doc, flags=re.M | re.S))
    for file_name, columns in ms.FILES.items():
        assert file_name in sections, f"docs/OUTPUTS.md has no section for {file_name}"
        documented = set(re.findall(r"^\| ([^|]+?) \|", sections[file_name], flags=re.M))
        missing = set(columns) - documented
        assert not missing, f"{file_name}: columns not documented: {sorted(missing)}"


# ---------------------------------------------------------------------------------------------
# units


def test_microseconds_are_exact_with_three_decimals(tmp_path: Path) -> None:
    ns = pa.array([1736408883704643212, 53741, 0, 999, None], pa.int64())
    assert ns_to_us(ns).cast(pa.string()).to_pylist() == [
        "1736408883704643.212",
        "53.741",
        "0.000",
        "0.999",
        None,
    ]
    breakdown = pa.table(
        {
            "rank": pa.array([0], pa.int32()),
            "step": pa.array([7], pa.int32()),
            **{
                c: pa.array([1_000_000_000_123_456_789], pa.int64())
                for c in [
                    "computing_ns",
                    "communication_not_overlapped_ns",
                    "overlapped_ns",
                    "communication_ns",
                    "free_ns",
                    "stage_ns",
                    "bubble_ns",
                    "communication_not_overlapped_exclude_receive_ns",
                    "preparing_ns",
                ]
            },
        }
    )
    header, rows = _read(ms.write_step_trace_time(tmp_path, breakdown))
    assert header == list(ms.STEP_TRACE_TIME_COLUMNS)
    assert rows[0]["Step"] == "7"
    assert all(rows[0][h] == "1000000000123456.789" for h in header[1:])


def test_memory_is_binary_megabytes_and_kilobytes(tmp_path: Path) -> None:
    op_memory = pa.table(
        {
            "rank": pa.array([0, 0], pa.int32()),
            "name": ["aten::empty", "aten::mm"],
            "size_bytes": [1536, 2**20],
            "alloc_ns": [1_000, 2_000],
            "release_ns": pa.array([5_500, None], pa.int64()),
            "duration_ns": pa.array([4_500, None], pa.int64()),
            "allocated_at_alloc_bytes": [3 * 2**19, 2**21],
            "reserved_at_alloc_bytes": [2**30, 2**30],
            "allocated_at_release_bytes": pa.array([2**20, None], pa.int64()),
            "reserved_at_release_bytes": pa.array([2**30, None], pa.int64()),
            "device_type": ["cuda", "cuda"],
            "device_index": pa.array([1, 1], pa.int32()),
        }
    )
    _, rows = _read(ms.write_operator_memory(tmp_path, op_memory))
    assert rows[0] == {
        "Name": "aten::empty",
        "Size(KB)": "1.5",
        "Allocation Time(us)": "1.000",
        "Release Time(us)": "5.500",
        "Duration(us)": "4.500",
        "Allocation Total Allocated(MB)": "1.5",
        "Allocation Total Reserved(MB)": "1024",
        "Release Total Allocated(MB)": "1",
        "Release Total Reserved(MB)": "1024",
        "Device Type": "CUDA:1",
    }
    unreleased = rows[1]
    assert unreleased["Release Time(us)"] == unreleased["Duration(us)"] == ""
    assert unreleased["Release Total Allocated(MB)"] == ""


# ---------------------------------------------------------------------------------------------
# real traces


def test_kernel_details_has_one_row_per_device_work_with_exact_times(nccl_files) -> None:
    trace, tables, folder = nccl_files
    header, rows = _read(folder / ms.KERNEL_DETAILS)
    assert header == list(ms.KERNEL_DETAILS_COLUMNS)
    kernels = tables["kernel_details"]
    assert len(rows) == kernels.num_rows > 0
    starts = sorted(kernels.column("start_ns").to_pylist())
    assert [int(Decimal(r["Start Time(us)"]) * 1000) for r in rows] == starts
    total_ns = sum(kernels.column("dur_ns").to_pylist())
    assert sum(int(Decimal(r["Duration(us)"]) * 1000) for r in rows) == total_ns
    assert {r["Accelerator Core"] for r in rows} >= {"GPU", "COMMUNICATION"}
    assert all(re.fullmatch(r"\d+,\d+,\d+", r["Block Dim"]) for r in rows if r["Accelerator Core"] == "GPU")
    steps = set(trace.steps.column("step").to_pylist())
    assert {int(r["Step Id"]) for r in rows if r["Step Id"]} <= steps


def test_op_statistic_groups_device_time_by_launching_operator(nccl_files) -> None:
    _, tables, folder = nccl_files
    header, rows = _read(folder / ms.OP_STATISTIC)
    assert header == list(ms.OP_STATISTIC_COLUMNS)
    kernels = tables["kernel_details"]
    assert sum(int(r["Count"]) for r in rows) == kernels.num_rows
    total_ns = sum(kernels.column("dur_ns").to_pylist())
    assert sum(int(Decimal(r["Total Time(us)"]) * 1000) for r in rows) == total_ns
    # ratios are shares of device time outside communication, whose rows carry none (as Ascend's)
    assert sum(float(r["Ratio(%)"]) for r in rows if r["Core Type"] != "COMMUNICATION") == pytest.approx(
        100, abs=0.05
    )
    assert all(r["Ratio(%)"] == "" for r in rows if r["Core Type"] == "COMMUNICATION")
    totals = [Decimal(r["Total Time(us)"]) for r in rows]
    assert totals == sorted(totals, reverse=True)
    for r in rows:
        assert Decimal(r["Min Time(us)"]) <= Decimal(r["Avg Time(us)"]) <= Decimal(r["Max Time(us)"])
    comms = [r for r in rows if r["Core Type"] == "COMMUNICATION"]
    assert comms and all(r["OP Type"] for r in comms)


def test_step_trace_time_has_one_row_per_step_and_adds_up(nccl_files) -> None:
    trace, _, folder = nccl_files
    header, rows = _read(folder / ms.STEP_TRACE_TIME)
    assert header == list(ms.STEP_TRACE_TIME_COLUMNS)
    assert len(rows) == trace.steps.num_rows
    assert [int(r["Step"]) for r in rows] == sorted(trace.steps.column("step").to_pylist())
    for r in rows:
        d = {k: Decimal(v) for k, v in r.items() if k != "Step"}
        assert d["Computing"] + d["Communication(Not Overlapped)"] + d["Free"] == d["Stage"]
        assert d["Communication(Not Overlapped)"] + d["Overlapped"] == d["Communication"]


def test_memory_record_peak_is_the_raw_traces_total_allocated(df_files) -> None:
    _, _, folder = df_files
    with gzip.open(DF_INDEX, "rt") as handle:
        raw = json.load(handle)
    events = raw["traceEvents"] if isinstance(raw, dict) else raw
    memory_events = [e for e in events if e.get("name") == "[memory]"]
    raw_peak = max(e["args"]["Total Allocated"] for e in memory_events)
    header, rows = _read(folder / ms.MEMORY_RECORD)
    assert header == list(ms.MEMORY_RECORD_COLUMNS)
    assert len(rows) == len(memory_events)
    assert max(float(r["Total Allocated(MB)"]) for r in rows) * 2**20 == raw_peak
    assert {r["Component"] for r in rows} == {ms.MEMORY_COMPONENT}
    assert "CUDA:1" in {r["Device Type"] for r in rows}
    stamps = [Decimal(r["Timestamp(us)"]) for r in rows]
    assert stamps == sorted(stamps)


def test_operator_memory_sizes_and_lifetimes_match_the_analysis(df_files) -> None:
    _, tables, folder = df_files
    header, rows = _read(folder / ms.OPERATOR_MEMORY)
    assert header == list(ms.OPERATOR_MEMORY_COLUMNS)
    ops = tables["operator_memory"].sort_by("alloc_ns")
    assert len(rows) == ops.num_rows > 0
    assert [float(r["Size(KB)"]) * 1024 for r in rows] == ops.column("size_bytes").to_pylist()
    for r in rows[:2000]:
        if r["Release Time(us)"]:
            lifetime = Decimal(r["Release Time(us)"]) - Decimal(r["Allocation Time(us)"])
            assert lifetime == Decimal(r["Duration(us)"])


def test_cpu_only_trace_reports_host_operators(tmp_path: Path) -> None:
    trace = read_trace(require(CPU_ONLY))
    tables = _analyses(trace)
    assert tables["kernel_details"].num_rows == 0
    ms.write_all(tmp_path, tables)
    _, rows = _read(tmp_path / ms.OP_STATISTIC)
    assert rows and {r["Core Type"] for r in rows} == {HOST_CORE_TYPE}
    assert sum(int(r["Count"]) for r in rows) == sum(tables["operator_stats"].column("count").to_pylist())
    _, kernel_rows = _read(tmp_path / ms.KERNEL_DETAILS)
    assert kernel_rows == []


# ---------------------------------------------------------------------------------------------
# hostile input and edge cases


def _hostile_kernels() -> pa.Table:
    n = len(HOSTILE_NAMES)
    return pa.table(
        {
            "rank": pa.array([0] * n, pa.int32()),
            "step": pa.array([1] * (n - 1) + [NO_ID], pa.int32()),
            "name": HOSTILE_NAMES,
            "kind": ["kernel"] * (n - 1) + ["memcpy"],
            "op": list(reversed(HOSTILE_NAMES)),
            "stream": pa.array([7] * n, pa.int64()),
            "start_ns": list(range(1000, 1000 + n)),
            "dur_ns": [5] * n,
            "wait_ns": [0] * n,
            "grid": ["[1, 2, 3]"] * n,
            "block": ["[128, 1, 1]"] * n,
            "occupancy_pct": pa.array([12.5] * n, pa.float32()),
            "input_dims": ["[[32, 3], [], [64]]"] * n,
            "input_types": ['["float", "int64"]'] * n,
        }
    )


def test_hostile_names_round_trip_through_csv(tmp_path: Path) -> None:
    kernels = _hostile_kernels()
    _, rows = _read(ms.write_kernel_details(tmp_path, kernels))
    assert [r["Name"] for r in rows] == HOSTILE_NAMES
    assert [r["Type"] for r in rows] == list(reversed(HOSTILE_NAMES))
    assert rows[0]["Input Shapes"] == "32,3;;64" and rows[0]["Input Data Types"] == "float;int64"
    assert rows[0]["Block Dim"] == "1,2,3" and rows[0]["Block"] == "128,1,1"
    assert rows[-1]["Step Id"] == "" and rows[-1]["Accelerator Core"] == "MEMCPY"
    _, stats = _read(ms.write_op_statistic(tmp_path, op_statistic(kernels)))
    assert sorted(r["OP Type"] for r in stats) == sorted(HOSTILE_NAMES)
    trace = hostile_trace()
    _, op_rows = _read(ms.write_operator_memory(tmp_path, operator_memory(trace)))
    assert op_rows and {r["Name"] for r in op_rows} <= set(HOSTILE_NAMES)


def test_plain_files_are_written_without_quotes(tmp_path: Path) -> None:
    curve = pa.table(
        {
            "rank": pa.array([0], pa.int32()),
            "device_type": ["cuda"],
            "device_index": pa.array([0], pa.int32()),
            "ts_ns": [1_500],
            "allocated_bytes": [2**20],
            "reserved_bytes": [2**21],
            "active_bytes": pa.array([None], pa.int64()),
        }
    )
    path = ms.write_memory_record(tmp_path, curve)
    assert path.read_text(encoding="utf-8").splitlines()[1] == "PTA,1.500,1,2,,,CUDA:0"


def test_cells_are_quoted_exactly_when_one_of_the_written_cells_needs_it(tmp_path: Path) -> None:
    """The file is quoted for a comma in a cell it writes (after a null one too), not for one in
    the rest of a sliced column, whose bytes it shares."""
    names = pa.array(["a,b", "plain", "also plain", 'say "x"'])
    assert ms.write_table_csv(tmp_path / "whole.csv", pa.table({"Name": names})).read_text(
        encoding="utf-8"
    ).splitlines()[1:] == ['"a,b"', '"plain"', '"also plain"', '"say ""x"""']
    inner = pa.table({"Name": names.slice(1, 2)})
    assert ms.write_table_csv(tmp_path / "inner.csv", inner).read_text(encoding="utf-8") == (
        "Name\nplain\nalso plain\n"
    )
    quoted_after_null = pa.table({"Name": pa.array([None, "p,q"])})
    assert ms.write_table_csv(tmp_path / "q.csv", quoted_after_null).read_text(encoding="utf-8") == (
        'Name\n\n"p,q"\n'
    )


def test_empty_tables_give_header_only_files(tmp_path: Path) -> None:
    trace = hostile_trace()
    empty = {name: table.slice(0, 0) for name, table in _analyses(trace).items()}
    for path in ms.write_all(tmp_path, empty):
        assert path.read_text(encoding="utf-8").count("\n") == 1


def test_a_table_mixing_ranks_is_refused(tmp_path: Path) -> None:
    kernels = _hostile_kernels()
    mixed = kernels.set_column(0, "rank", pa.array([0, 1] + [0] * (kernels.num_rows - 2), pa.int32()))
    with pytest.raises(ValueError, match="ranks"):
        ms.write_kernel_details(tmp_path, mixed)


def test_a_file_with_no_rows_is_its_header_alone_as_a_built_empty_table_writes_it(
    nccl_files: tuple[Trace, dict[str, pa.Table], Path], tmp_path: Path
) -> None:
    # nccl_data records no allocator events: its memory files have no rows, and are written
    # without building their columns; the bytes must be those of the built, empty table
    _, tables, folder = nccl_files
    empty_files = (("memory_curve", ms.MEMORY_RECORD), ("operator_memory", ms.OPERATOR_MEMORY))
    for table_name, file_name in empty_files:
        assert tables[table_name].num_rows == 0
        built = ms.write_table_csv(tmp_path / file_name, ms.build(ms.FILES[file_name], tables[table_name]))
        written = (folder / file_name).read_bytes()
        assert written == built.read_bytes(), file_name
        assert next(csv.reader(written.decode().splitlines())) == list(ms.FILES[file_name])
