"""A trace analysed within a tiny memory limit (a step at a time, spilled to disk) gives every
output the whole-trace analysis gives: ``perfsight analyse --memory-limit`` (issue 21)."""

from __future__ import annotations

import gzip
import json
import sqlite3
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest

import shared_data
from perfsight.export.staging import STAGING_PREFIX
from shared_data import DATA

TINY = "1M"
"""A limit below what any chunk needs: every chunk is the smallest (one step of these traces)."""


def _analyse(trace: Path, out: Path, *extra: str) -> dict:
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            "from perfsight.cli import main; main()",
            "analyse",
            str(trace),
            "--out",
            str(out),
            "--json",
            *extra,
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr
    (summary,) = json.loads(done.stdout)
    summary.pop("output_dir")
    if "--memory-limit" in extra:  # the bounded path ran, and says so with the chunks it cut
        assert summary.pop("bounded")["chunks"] >= 2
    return summary


def _files(folder: Path) -> dict[str, Path]:
    return {str(p.relative_to(folder)): p for p in sorted(folder.rglob("*")) if p.is_file()}


def _same_outputs(whole: Path, bounded: Path) -> None:
    expected, got = _files(whole), _files(bounded)
    assert sorted(got) == sorted(expected)
    for name, path in expected.items():
        if name.endswith(".parquet"):
            a, b = pq.read_table(path), pq.read_table(got[name])
            assert a.schema.equals(b.schema), name
            assert a.equals(b), f"{name}: the bounded path's table differs"
        elif name.endswith(".db"):
            with sqlite3.connect(path) as x, sqlite3.connect(got[name]) as y:
                assert list(x.iterdump()) == list(y.iterdump()), name
        else:
            assert path.read_bytes() == got[name].read_bytes(), f"{name}: the bounded path's file differs"


@pytest.mark.parametrize("export_type", ["text", "text,db"])
def test_every_output_of_df_index_resolver_is_the_same_within_a_tiny_limit(
    df_trace_path: Path, tmp_path: Path, export_type: str
) -> None:
    whole = _analyse(df_trace_path, tmp_path / "whole", "--export-type", export_type)
    bounded = _analyse(
        df_trace_path, tmp_path / "bounded", "--export-type", export_type, "--memory-limit", TINY
    )
    assert bounded == whole  # what the CLI prints: steps, shares, top operators, findings, warnings
    _same_outputs(tmp_path / "whole", tmp_path / "bounded")
    assert not [p for p in (tmp_path / "bounded").rglob("*") if p.name.startswith(STAGING_PREFIX)]


def test_nccl_data_is_the_same_within_a_tiny_limit(nccl_trace_path: Path, tmp_path: Path) -> None:
    assert _analyse(nccl_trace_path, tmp_path / "b", "--memory-limit", TINY) == _analyse(
        nccl_trace_path, tmp_path / "w"
    )
    _same_outputs(tmp_path / "w", tmp_path / "b")


def test_a_trace_cut_mid_way_keeps_every_complete_event_within_a_limit(
    df_trace_path: Path, tmp_path: Path
) -> None:
    text = gzip.decompress(df_trace_path.read_bytes())
    cut = tmp_path / "cut.json"
    cut.write_bytes(text[: int(len(text) * 0.6)])
    whole = _analyse(cut, tmp_path / "whole")
    bounded = _analyse(cut, tmp_path / "bounded", "--memory-limit", TINY)
    assert bounded == whole
    assert any("truncated" in line or "damaged" in line for line in bounded["warnings"])
    _same_outputs(tmp_path / "whole", tmp_path / "bounded")


def test_the_python_api_gives_the_per_row_tables_of_a_bounded_analysis_from_its_cache(
    df_trace_path: Path, tmp_path: Path
) -> None:
    import perfsight

    whole = perfsight.analyse(df_trace_path, out=tmp_path / "whole")
    bounded = perfsight.analyse(df_trace_path, out=tmp_path / "bounded", memory_limit=1 << 20)
    (result,) = bounded.ranks.values()
    assert result.bounded is not None and result.bounded["chunks"] == 5
    assert "kernel_details" not in result.tables  # kept on disk, not in memory
    assert bounded.table_names == whole.table_names
    for name in ("kernel_details", "operator_instances", "step_trace", "operator_stats"):
        assert bounded.table(name).equals(whole.table(name)), name


def test_a_memory_limit_on_a_job_is_not_ignored_silently(tmp_path: Path) -> None:
    job = shared_data.require(DATA / "ascend_pt" / "level1")  # two ranks: a job
    done = subprocess.run(
        [sys.executable, "-c", "from perfsight.cli import main; main()", "analyse", str(job)]
        + ["--out", str(tmp_path / "out"), "--memory-limit", "1G"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr
    assert "--memory-limit applies to plain Kineto trace files" in done.stderr and str(job) in done.stderr
