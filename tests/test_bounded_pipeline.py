"""A trace analysed within a tiny memory limit (a step at a time, spilled to disk) gives every
output the whole-trace analysis gives: ``perfsight analyse --memory-limit`` (issue 21)."""

from __future__ import annotations

import gzip
import subprocess
import sys
from pathlib import Path

import pytest

import shared_data
from _compare_outputs import TINY, analyse, same_outputs
from perfsight.export.staging import STAGING_PREFIX
from shared_data import DATA


@pytest.mark.parametrize("export_type", ["text", "text,db"])
def test_every_output_of_df_index_resolver_is_the_same_within_a_tiny_limit(
    df_trace_path: Path, tmp_path: Path, export_type: str
) -> None:
    whole = analyse(df_trace_path, tmp_path / "whole", "--export-type", export_type)
    bounded = analyse(
        df_trace_path, tmp_path / "bounded", "--export-type", export_type, "--memory-limit", TINY
    )
    assert bounded == whole  # what the CLI prints: steps, shares, top operators, findings, warnings
    same_outputs(tmp_path / "whole", tmp_path / "bounded")
    assert not [p for p in (tmp_path / "bounded").rglob("*") if p.name.startswith(STAGING_PREFIX)]


def test_nccl_data_is_the_same_within_a_tiny_limit(nccl_trace_path: Path, tmp_path: Path) -> None:
    assert analyse(nccl_trace_path, tmp_path / "b", "--memory-limit", TINY) == analyse(
        nccl_trace_path, tmp_path / "w"
    )
    same_outputs(tmp_path / "w", tmp_path / "b")


def test_a_trace_cut_mid_way_keeps_every_complete_event_within_a_limit(
    df_trace_path: Path, tmp_path: Path
) -> None:
    text = gzip.decompress(df_trace_path.read_bytes())
    cut = tmp_path / "cut.json"
    cut.write_bytes(text[: int(len(text) * 0.6)])
    whole = analyse(cut, tmp_path / "whole")
    bounded = analyse(cut, tmp_path / "bounded", "--memory-limit", TINY)
    assert bounded == whole
    assert any("truncated" in line or "damaged" in line for line in bounded["warnings"])
    same_outputs(tmp_path / "whole", tmp_path / "bounded")


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
    assert "--memory-limit applies to Kineto traces and perfsight run folders" in done.stderr
    assert str(job) in done.stderr
