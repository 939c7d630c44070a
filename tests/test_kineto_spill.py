"""The spilled Kineto reader gives the in-memory reader's chunks, row for row, in bounded memory."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pyarrow as pa
import pytest

from conftest import KINETO, kineto_file
from perfsight.ingest import kineto_spill_passes
from perfsight.ingest.kineto import TraceReadError, read_kineto
from perfsight.ingest.kineto_spill import spill_kineto
from perfsight.model import TABLE_SCHEMAS
from perfsight.model_chunks import TraceChunk, split_by_steps

TRACES = sorted(str(p.relative_to(KINETO)) for p in KINETO.glob("**/*.json*") if p.is_file()) or [
    "nccl_parser_config/nccl_data.json.gz"
]


def _by_value(table: pa.Table) -> pa.Table:
    """``table`` with dictionary columns decoded (chunks may hold other dictionaries of the same values)."""
    decoded = {
        name: column.cast(column.type.value_type) if pa.types.is_dictionary(column.type) else column
        for name, column in zip(table.column_names, table.columns, strict=True)
    }
    return pa.table(decoded).combine_chunks()


def _assert_same_chunks(got: list[TraceChunk], expected: list[TraceChunk]) -> None:
    assert [c.steps for c in got] == [c.steps for c in expected]
    assert [(c.number, c.count) for c in got] == [(c.number, c.count) for c in expected]
    for mine, theirs in zip(got, expected, strict=True):
        assert mine.slice_rows.tolist() == theirs.slice_rows.tolist()
        for name in TABLE_SCHEMAS:
            a, b = _by_value(getattr(mine.trace, name)), _by_value(getattr(theirs.trace, name))
            assert a.schema == b.schema, name
            for column in b.column_names:  # column by column, so a failure names the column
                assert a.column(column).equals(b.column(column)), f"chunk {mine.number}: {name}.{column}"
        assert mine.trace.meta.warnings == theirs.trace.meta.warnings


def _spilled_equals_in_memory(path: Path, tmp_path: Path, max_slices: int) -> None:
    whole = read_kineto(path)
    with spill_kineto(path, tmp_path, max_slices) as spilled:
        assert spilled.slices == whole.slices.num_rows
        assert spilled.tracks.equals(whole.tracks)
        assert spilled.steps.equals(whole.steps)
        _assert_same_chunks(list(spilled.chunks()), list(split_by_steps(whole, max_slices)))


@pytest.mark.parametrize("max_slices", [1, 10**9], ids=["step-per-chunk", "one-chunk"])
@pytest.mark.parametrize("relative", TRACES)
def test_spilled_chunks_equal_the_in_memory_chunks(relative: str, max_slices: int, tmp_path: Path) -> None:
    _spilled_equals_in_memory(kineto_file(relative), tmp_path, max_slices)


@pytest.mark.parametrize(
    "relative", ["df_index_resolver/df_index_resolver.json.gz", "nccl_parser_config/nccl_data.json.gz"]
)
def test_rows_split_over_many_small_batches_give_the_same_chunks(
    relative: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Depth, launches and comm picks carried across batch boundaries (a 10 GB trace's case)."""
    monkeypatch.setattr(kineto_spill_passes, "BATCH_ROWS", 97)
    monkeypatch.setattr(kineto_spill_passes, "FLUSH_ROWS", 300)
    monkeypatch.setattr(kineto_spill_passes, "ROW_GROUP_ROWS", 250)
    _spilled_equals_in_memory(kineto_file(relative), tmp_path, 2000)


def test_nesting_across_batch_boundaries_is_exact(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Deep nests, equal starts and zero-length slices at a parent's start, cut by batches of 7 rows."""
    events = [
        {
            "ph": "X",
            "cat": "user_annotation",
            "name": "ProfilerStep#1",
            "pid": 1,
            "tid": 1,
            "ts": 0,
            "dur": 1000,
        }
    ]
    for i in range(40):
        base = 10 + i * 20
        events += [
            {"ph": "X", "cat": "cpu_op", "name": "outer", "pid": 1, "tid": 1, "ts": base, "dur": 15},
            {"ph": "X", "cat": "cpu_op", "name": "same start", "pid": 1, "tid": 1, "ts": base, "dur": 15},
            {"ph": "X", "cat": "cpu_op", "name": "zero", "pid": 1, "tid": 1, "ts": base, "dur": 0},
            {"ph": "X", "cat": "cpu_op", "name": "inner", "pid": 1, "tid": 1, "ts": base + 1, "dur": 5},
            {"ph": "X", "cat": "cpu_op", "name": "zero end", "pid": 1, "tid": 1, "ts": base + 6, "dur": 0},
            {"ph": "X", "cat": "cpu_op", "name": "other thread", "pid": 1, "tid": 2, "ts": base, "dur": 30},
        ]
    events.reverse()  # file order is not time order
    path = tmp_path / "nested.json"
    path.write_text(json.dumps({"traceEvents": events, "distributedInfo": {"rank": 0}}))
    monkeypatch.setattr(kineto_spill_passes, "BATCH_ROWS", 7)
    whole = read_kineto(path)
    assert max(whole.slices.column("depth").to_pylist()) >= 3  # the case is really nested
    _spilled_equals_in_memory(path, tmp_path / "spill", 10**9)


def test_a_cut_trace_gives_the_same_warnings_and_rows(tmp_path: Path, nccl_trace_path: Path) -> None:
    raw = gzip.decompress(nccl_trace_path.read_bytes())
    cut = tmp_path / "cut.json"
    cut.write_bytes(raw[: int(len(raw) * 0.6)])
    whole = read_kineto(cut)
    assert any(str(cut) in w and "truncated" in w for w in whole.meta.warnings)
    with spill_kineto(cut, tmp_path / "spill", 1) as spilled:
        assert spilled.meta.warnings == whole.meta.warnings
        assert spilled.steps.column("complete").to_pylist()[-1] is False
        _assert_same_chunks(list(spilled.chunks()), list(split_by_steps(whole, 1)))


def test_a_file_with_nothing_readable_is_refused_and_leaves_no_spill(tmp_path: Path) -> None:
    broken = tmp_path / "broken.json"
    broken.write_text('{"traceEvents": [{"ph": "X", "na')
    with pytest.raises(TraceReadError, match="broken.json"):
        spill_kineto(broken, tmp_path / "spill", 10)
    assert list((tmp_path / "spill").iterdir()) == []


def test_close_removes_the_spill_and_chunks_can_be_read_again(tmp_path: Path, nccl_trace_path: Path) -> None:
    spill_dir = tmp_path / "spill"
    with spill_kineto(nccl_trace_path, spill_dir, 1) as spilled:
        first = [c.slice_rows.tolist() for c in spilled.chunks()]
        assert [c.slice_rows.tolist() for c in spilled.chunks()] == first
        assert any(spill_dir.rglob("*.parquet"))
    assert list(spill_dir.iterdir()) == []


@pytest.mark.parametrize("label", ["MTIA 0", "Mystery accelerator"])
def test_work_of_an_unknown_device_is_found_and_warned_about_alike(
    label: str, nccl_trace_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The GPU process relabelled and its kernels in a category perfsight does not know: device
    work when the label names a device, unclassified otherwise; both paths warn the same."""
    with gzip.open(nccl_trace_path, "rt", encoding="utf-8") as handle:
        doc = json.load(handle)
    doc.pop("deviceProperties", None)
    for event in doc["traceEvents"]:
        if event.get("ph") == "M" and event.get("name") == "process_labels" and event.get("pid") == 0:
            event["args"]["labels"] = label
        elif event.get("ph") == "X" and event.get("cat") == "kernel":
            event["cat"] = "mtia_ccp_events"
    path = tmp_path / "relabelled.json"
    path.write_text(json.dumps(doc))
    monkeypatch.setattr(kineto_spill_passes, "BATCH_ROWS", 500)
    whole = read_kineto(path)
    assert any("'mtia_ccp_events'" in w for w in whole.meta.warnings)
    _spilled_equals_in_memory(path, tmp_path / "spill", 3000)


def test_a_trace_without_complete_events_gives_its_memory_rows(tmp_path: Path) -> None:
    events = [
        {"ph": "i", "name": "[memory]", "pid": 1, "tid": 1, "ts": 10 + i, "s": "t",
         "args": {"Addr": 100 + i, "Bytes": 64, "Total Allocated": 64 * (i + 1), "Total Reserved": 4096,
                  "Device Type": 1, "Device Id": 0}}
        for i in range(5)
    ]  # fmt: skip
    path = tmp_path / "memory_only.json"
    path.write_text(json.dumps({"traceEvents": events, "distributedInfo": {"rank": 3}}))
    whole = read_kineto(path)
    assert whole.slices.num_rows == 0 and whole.memory.num_rows == 5
    _spilled_equals_in_memory(path, tmp_path / "spill", 10)


def test_bad_times_are_dropped_or_zeroed_and_warned_about_alike(tmp_path: Path) -> None:
    events = [
        {
            "ph": "X",
            "cat": "user_annotation",
            "name": "ProfilerStep#4",
            "pid": 1,
            "tid": 1,
            "ts": 0,
            "dur": 100,
        },
        {"ph": "X", "cat": "cpu_op", "name": "no ts", "pid": 1, "tid": 1, "ts": "soon", "dur": 5},
        {"ph": "X", "cat": "cpu_op", "name": "negative dur", "pid": 1, "tid": 1, "ts": 10, "dur": -3},
        {"ph": "X", "cat": "cpu_op", "name": "fine", "pid": 1, "tid": 1, "ts": 20, "dur": 5},
    ]
    path = tmp_path / "bad_times.json"
    path.write_text(json.dumps({"traceEvents": events}))
    whole = read_kineto(path)
    assert any('"ts"' in w for w in whole.meta.warnings) and any('"dur"' in w for w in whole.meta.warnings)
    _spilled_equals_in_memory(path, tmp_path / "spill", 1)
