"""MindSpore's own profiler output, made by a real MindSpore 2.10 CPU run
(``scripts/make_mindspore_fixture.py`` regenerates ``tests/fixtures/mindspore_cpu``)."""

from __future__ import annotations

import json
import re
import shutil
from decimal import Decimal
from pathlib import Path

import pyarrow.compute as pc

import perfsight
from perfsight.ingest import find_traces, read_trace
from perfsight.ingest.ascend import read_ascend

FIXTURE = Path(__file__).parent / "fixtures" / "mindspore_cpu" / "cpu_ascend_ms"
TIMELINE = FIXTURE / "ASCEND_PROFILER_OUTPUT" / "trace_view.json"
STAMPS = FIXTURE / "FRAMEWORK" / "cpu_op_execute_timestamp_0.txt"


def _executions() -> list[tuple[str, int]]:
    """(op name, start ns) of every execution in the raw FRAMEWORK file, read independently."""
    out = []
    for line in STAMPS.read_text().splitlines():
        name, _type, entries = line.split(";", 2)
        out += [(name, int(start)) for start, _dur, _tid in re.findall(r"(\d+),([\d.]+),(\d+)", entries)]
    return out


def test_the_cpu_timeline_holds_every_op_of_trace_view_as_a_cpu_op() -> None:
    raw = json.loads(TIMELINE.read_text())
    ops = [e for e in raw if e["ph"] == "X" and e["pid"] == 2]  # process "CPU OP"
    trace = read_trace(TIMELINE)
    assert trace.meta.framework == "mindspore" and trace.rank == 0
    assert any("rank 0" in w for w in trace.meta.warnings)  # no profiler_info file: said, not hidden
    cpu_ops = trace.slices.filter(pc.equal(trace.slices.column("kind").cast("string"), "cpu_op"))
    assert cpu_ops.num_rows == len(ops) == len(_executions())
    starts = sorted(int(Decimal(e["ts"]) * 1000) for e in ops)
    assert sorted(cpu_ops.column("start_ns").to_pylist()) == starts


def test_input_shapes_come_from_cpu_framework() -> None:
    trace = read_ascend(FIXTURE)
    bias = trace.slices.filter(pc.equal(trace.slices.column("name").cast("string"), "Default/BiasAdd-op1"))
    assert bias.num_rows and set(map(str, bias.column("input_dims").to_pylist())) == {"[[16, 4], [4], []]"}


def test_without_trace_view_the_timeline_is_rebuilt_from_the_framework_files(tmp_path: Path) -> None:
    folder = tmp_path / FIXTURE.name
    shutil.copytree(FIXTURE, folder)
    (folder / "ASCEND_PROFILER_OUTPUT" / "trace_view.json").unlink()
    trace = read_ascend(folder)
    assert any("trace_view.json" in w and "rebuilt" in w for w in trace.meta.warnings)
    assert sorted(trace.slices.column("start_ns").to_pylist()) == sorted(s for _, s in _executions())
    assert set(trace.slices.column("kind").cast("string").to_pylist()) == {"cpu_op"}


def test_analyse_opens_the_mindspore_folder(tmp_path: Path) -> None:
    assert find_traces(FIXTURE.parent) == [TIMELINE]
    analysis = perfsight.analyse(FIXTURE.parent, out=tmp_path)
    stats = analysis.table("operator_stats").to_pylist()
    assert {s["name"] for s in stats} >= {"MatMul", "Default/BiasAdd-op0"}
    assert (tmp_path / "rank0" / "PROFILER_OUTPUT" / "op_statistic.csv").is_file()
