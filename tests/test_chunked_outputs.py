"""The chunked writers write the same files as the whole-trace pipeline, and serve the same timeline.

Each case analyses a real trace twice: ``pipeline.analyse_and_write`` on the whole trace, and
``write_outputs_chunked`` fed one step per chunk and the per-row tables in batches of 997 rows
(small spill batches too, so that runs merge across many batches).  Every file must match: the
same bytes for JSON, CSV, the SQLite db and the timeline index, the same table (schema and
metadata included) read back from each Parquet file.
"""

from __future__ import annotations

import dataclasses
import filecmp
from pathlib import Path

import orjson
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from conftest import kineto_file, need_file
from perfsight import advisor, pipeline
from perfsight.export import chunked_outputs, spilled_trace
from perfsight.export.chunked_outputs import write_outputs_chunked
from perfsight.ingest import read_trace
from perfsight.model import Trace
from perfsight.model_chunks import split_by_steps
from perfsight.pipeline import ROW_TABLES
from perfsight.server import timeline
from perfsight.server.registry import OpenedRun, open_ranks
from shared_data import ASCEND

INPUTS = {
    "df_index_resolver": lambda: kineto_file("df_index_resolver/df_index_resolver.json.gz"),
    "nccl_data": lambda: kineto_file("nccl_parser_config/nccl_data.json.gz"),
    "ascend_level1": lambda: need_file(
        ASCEND / "level1" / "rank0_ascend_pt" / "ASCEND_PROFILER_OUTPUT" / "trace_view.json"
    ),
}


@pytest.fixture(scope="module", params=list(INPUTS))
def trace(request: pytest.FixtureRequest) -> Trace:
    return read_trace(INPUTS[request.param]())


def _both(trace: Trace, root: Path, export_types: tuple[str, ...]) -> tuple[Path, Path]:
    """The rank folder written whole (A) and chunked (B)."""
    options = pipeline.Options(export_types=export_types)
    whole, chunked = root / "whole", root / "chunked"
    pipeline.analyse_and_write(trace, whole, options)
    result = pipeline.analyse_trace(trace, options)
    small = {name: table for name, table in result.tables.items() if name not in ROW_TABLES}
    rows = {name: (lambda t=result.tables[name]: iter(t.to_batches(997))) for name in ROW_TABLES}
    chunks = list(split_by_steps(trace, 1))
    write_outputs_chunked(
        chunked,
        lambda: iter(chunks),
        small,
        rows,
        trace.steps,
        options,
        advisor.rank_findings(result.tables, trace),
    )
    return whole, chunked


def _files(folder: Path) -> list[Path]:
    return sorted(p.relative_to(folder) for p in folder.rglob("*") if p.is_file())


def _assert_same_outputs(whole: Path, chunked: Path) -> None:
    assert _files(chunked) == _files(whole)
    for name in _files(whole):
        a, b = whole / name, chunked / name
        if name.suffix == ".parquet":
            ta, tb = pq.read_table(a), pq.read_table(b)
            assert tb.schema.equals(ta.schema, check_metadata=True), name
            assert tb.equals(ta), name
        else:
            assert filecmp.cmp(a, b, shallow=False), f"{name} differs"


@pytest.mark.parametrize("export_types", [("text",), ("text", "db")])
def test_chunked_writers_write_the_whole_pipelines_files(
    trace: Trace, export_types: tuple[str, ...], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(spilled_trace, "MERGE_ROWS", 1000)  # runs merge across many batches
    monkeypatch.setattr(spilled_trace, "MIN_BATCH_ROWS", 100)
    monkeypatch.setattr(chunked_outputs, "RUN_ROWS", 300)  # communication ops in several runs by step
    whole, chunked = _both(trace, tmp_path, export_types)
    assert (whole / "PROFILER_OUTPUT" / "trace_view.json").stat().st_size > 0
    assert ("db" in export_types) == any((whole / "PROFILER_OUTPUT").glob("*.db"))
    _assert_same_outputs(whole, chunked)
    assert not [p for p in chunked.iterdir() if p.name not in ("PROFILER_OUTPUT", "cache")]  # spill gone


def test_serve_answers_the_same_timeline_windows_from_both_caches(trace: Trace, tmp_path: Path) -> None:
    whole, chunked = _both(trace, tmp_path, ("text",))
    answers = []
    for folder in (whole, chunked):
        ranks, origin, end = open_ranks({trace.rank: folder})
        opened = OpenedRun(run=None, ranks=ranks, origin_ns=origin, end_ns=end)  # type: ignore[arg-type]
        zoomed = [timeline.window(opened, lo, lo + end // 20, 1600, None, None) for lo in (0, end // 3)]
        first = trace.slices.num_rows // 2
        answers.append(
            (
                timeline.window(opened, 0, end, 1600, None, None),
                zoomed,
                timeline.event(opened, None, first),
                timeline.flows(opened, 0, end, None, 10**6) if trace.flows.num_rows else None,
            )
        )
    assert answers[0][0]["tracks"], "the whole-trace window shows events"
    as_sent = [orjson.dumps(a, option=orjson.OPT_SERIALIZE_NUMPY) for a in answers]  # what the API sends
    assert as_sent[1] == as_sent[0]


def test_a_per_row_table_that_yields_no_batch_is_written_empty(tmp_path: Path) -> None:
    trace = read_trace(INPUTS["nccl_data"]())
    options = pipeline.Options()
    result = pipeline.analyse_trace(trace, options)
    assert result.tables["memory_curve"].num_rows == 0  # this trace has no allocator events
    small = {name: table for name, table in result.tables.items() if name not in ROW_TABLES}
    rows = {name: (lambda t=result.tables[name]: iter(t.to_batches())) for name in ROW_TABLES}
    write_outputs_chunked(tmp_path, lambda: split_by_steps(trace, 1), small, rows, trace.steps, options, [])
    header = (tmp_path / "PROFILER_OUTPUT" / "memory_record.csv").read_text().splitlines()
    assert header == [",".join(chunked_outputs.mindspore_csv.MEMORY_RECORD_COLUMNS)]
    saved = pq.read_table(tmp_path / "cache" / "analysis" / "memory_curve.parquet")
    assert saved.num_rows == 0 and saved.schema.equals(result.tables["memory_curve"].schema)
    assert isinstance(saved, pa.Table)


def test_a_chunk_that_does_not_say_where_its_rows_go_is_refused_by_name(tmp_path: Path) -> None:
    trace = read_trace(INPUTS["nccl_data"]())
    result = pipeline.analyse_trace(trace, pipeline.Options())
    small = {name: table for name, table in result.tables.items() if name not in ROW_TABLES}
    chunks = [dataclasses.replace(c, table_rows={}) for c in split_by_steps(trace, 1)]
    with pytest.raises(ValueError, match=r"table_rows\['flows'\]"):
        write_outputs_chunked(
            tmp_path / "rank", lambda: iter(chunks), small, {}, trace.steps, pipeline.Options(), []
        )
    assert not (tmp_path / "rank").exists()  # nothing half-written is left
