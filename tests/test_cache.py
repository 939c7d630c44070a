"""The Parquet run cache: lossless round trips, and freshness that follows the input files."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pyarrow as pa
import pytest

from _hostile import hostile_trace
from perfsight.analysis.kernels import kernel_details
from perfsight.analysis.overlap import overlap_breakdown
from perfsight.ingest import read_trace
from perfsight.model import TABLE_SCHEMAS, Trace
from perfsight.store import CacheError, is_fresh, load_tables, load_trace, save_tables, save_trace
from shared_data import KINETO, require

DF_INDEX = KINETO / "df_index_resolver" / "df_index_resolver.json.gz"
NCCL = KINETO / "nccl_parser_config" / "nccl_data.json.gz"


def _assert_same(a: Trace, b: Trace) -> None:
    for name, schema in TABLE_SCHEMAS.items():
        left, right = getattr(a, name), getattr(b, name)
        assert right.schema.equals(schema), name
        assert left.equals(right), name
    assert a.meta == b.meta


def test_real_trace_round_trips_losslessly(tmp_path: Path) -> None:
    trace = read_trace(require(DF_INDEX))
    assert trace.memory.num_rows and trace.comm.num_rows  # every table is exercised
    save_trace(trace, tmp_path / "cache")
    _assert_same(trace, load_trace(tmp_path / "cache"))
    assert {p.name for p in (tmp_path / "cache").iterdir()} == {
        *(f"{n}.parquet" for n in TABLE_SCHEMAS),
        "meta.json",
        "source.json",
    }


def test_hostile_trace_round_trips_losslessly(tmp_path: Path) -> None:
    trace = hostile_trace()
    save_trace(trace, tmp_path)
    _assert_same(trace, load_trace(tmp_path))


def test_cache_is_fresh_until_the_input_changes(tmp_path: Path) -> None:
    source = tmp_path / "input" / "nccl_data.json.gz"
    source.parent.mkdir()
    shutil.copyfile(require(NCCL), source)
    trace = read_trace(source)
    cache = tmp_path / "cache"
    save_trace(trace, cache, sources=[source])
    assert is_fresh(cache, [source])
    assert not is_fresh(cache, [source, NCCL])  # a different set of inputs
    stat = source.stat()
    os.utime(source, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000))
    assert not is_fresh(cache, [source])
    save_trace(trace, cache, sources=[source])
    assert is_fresh(cache, [source])
    (cache / "slices.parquet").unlink()
    assert not is_fresh(cache, [source])
    with pytest.raises(CacheError, match="slices.parquet"):
        load_trace(cache)


def test_an_interrupted_save_is_never_fresh(tmp_path: Path) -> None:
    trace = hostile_trace()
    save_trace(trace, tmp_path, sources=[])
    assert is_fresh(tmp_path, [])
    (tmp_path / "source.json").unlink()  # what a save cut before its last file leaves
    assert not is_fresh(tmp_path, [])


def test_analysis_tables_round_trip(tmp_path: Path) -> None:
    trace = read_trace(require(NCCL))
    tables = {  # large and small (written uncompressed) tables, and an empty one
        "kernel_details": kernel_details(trace),
        "overlap_breakdown": overlap_breakdown(trace),
        "empty": pa.table({"x": pa.array([], pa.int64())}),
    }
    save_tables(tmp_path, tables)
    assert sorted(p.name for p in (tmp_path / "analysis").iterdir()) == sorted(f"{n}.parquet" for n in tables)
    loaded = load_tables(tmp_path)
    assert loaded.keys() == tables.keys()
    for name, table in tables.items():
        assert loaded[name].equals(table), name
    assert load_tables(tmp_path, ["overlap_breakdown"]).keys() == {"overlap_breakdown"}
    assert load_tables(tmp_path / "nothing") == {}
    with pytest.raises(ValueError):
        save_tables(tmp_path, {"../escape": tables["empty"]})


def test_loading_an_analysed_folder_whose_cache_lost_its_metadata_names_the_missing_file(
    tmp_path: Path,
) -> None:
    import perfsight

    perfsight.analyse(require(NCCL), out=tmp_path)
    (tmp_path / "rank0" / "cache" / "meta.json").unlink()
    # not a fall-back that reads the cache's own JSON files as traces
    with pytest.raises(CacheError, match=r"rank0/cache/meta\.json"):
        perfsight.load(tmp_path)


def test_what_the_vendor_recorded_round_trips_beside_the_trace(tmp_path: Path) -> None:
    """MindInsight's own step trace and hccl tables live in ``Trace.vendor``; a run without an op
    timeline says so in ``meta.compute_recorded``.  Both survive the cache."""
    fixtures = Path(__file__).parent / "fixtures" / "mindinsight_legacy"
    trace = read_trace(fixtures / "single" / "profiler" / "step_trace_raw_0_detail_time.csv")
    assert trace.vendor.step_trace.num_rows == 3 and trace.vendor.tables  # hccl_raw_0.csv: steps, links
    save_trace(trace, tmp_path)
    loaded = load_trace(tmp_path)
    _assert_same(trace, loaded)
    assert loaded.vendor.step_trace.equals(trace.vendor.step_trace)
    assert loaded.vendor.tables.keys() == trace.vendor.tables.keys()
    assert all(loaded.vendor.tables[n].equals(t) for n, t in trace.vendor.tables.items())

    cluster = fixtures / "cluster" / "cluster_profiler" / "2" / "profiler"
    no_timeline = read_trace(cluster / "step_trace_raw_1_detail_time.csv")
    assert no_timeline.meta.compute_recorded is False
    save_trace(no_timeline, tmp_path / "other")
    assert load_trace(tmp_path / "other").meta.compute_recorded is False
