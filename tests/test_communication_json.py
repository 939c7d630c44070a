"""``communication.json`` as written for a real NCCL rank: every op's numbers land under its step and
kind, repeated names keep the last op's numbers (as a dict assignment would), totals sum every op."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from perfsight.analysis import communication as comm
from perfsight.export.communication_json import communication_json_text, write_communication_json
from perfsight.ingest import read_trace
from perfsight.pipeline import Options, analyse_trace


def test_each_step_lists_its_ops_with_the_last_numbers_of_a_repeated_name_and_totals_of_all(
    df_trace_path: Path, tmp_path: Path
) -> None:
    trace = read_trace(df_trace_path)
    ops, tasks = comm.primary_ops(trace.comm, trace.comm_tasks)
    times = comm.op_times(ops, tasks).to_pylist()
    slice_names = trace.slices.column("name").to_pylist()
    for t, row in zip(times, ops.column("slice").to_pylist(), strict=True):
        t["key"] = f"{t['name'] or slice_names[row]}@{t['group'] or ''}"  # unnamed op: its kernel's name
    tables = analyse_trace(trace, Options()).tables
    written = json.loads(write_communication_json(tmp_path / "communication.json", tables).read_text())

    by_step: dict[str, list[dict]] = {}
    for t in times:
        by_step.setdefault(f"step{t['step']}", []).append(t)
    assert list(written) == sorted(by_step, key=lambda s: int(s[4:]))
    for step, step_ops in by_step.items():
        assert list(written[step]) == ["p2p", "collective"]  # Ascend's order, even when p2p is empty
        collective = written[step]["collective"]
        names = list(dict.fromkeys(t["key"] for t in step_ops))
        assert list(collective) == [*names, "Total Op Info"]
        assert len(step_ops) > len(names)  # this trace repeats names within a step
        for name in names:
            last = [t for t in step_ops if t["key"] == name][-1]
            info = collective[name]["Communication Time Info"]
            assert info["Start Timestamp(us)"] == last["start_ns"] / 1000
            assert info["Elapse Time(ms)"] == last["elapse_ns"] / 1e6
            assert set(collective[name]["Communication Bandwidth Info"]) == set(comm.LINK_TYPES)
        total = collective["Total Op Info"]["Communication Time Info"]
        assert total["Elapse Time(ms)"] == pytest.approx(sum(t["elapse_ns"] for t in step_ops) / 1e6)
        assert total["Transit Time(ms)"] == pytest.approx(sum(t["transit_ns"] for t in step_ops) / 1e6)


def test_the_text_is_what_json_dumps_writes_for_the_same_content(nccl_trace_path: Path) -> None:
    text = communication_json_text(analyse_trace(read_trace(nccl_trace_path), Options()).tables)
    assert text == json.dumps(json.loads(text))  # same separators, key order and float repr
