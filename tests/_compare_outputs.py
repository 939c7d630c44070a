"""Run ``perfsight analyse`` as a user types it and compare every output file of two analyses.

Why a module of its own: the bounded-memory path (issue 21) promises every output of the
whole-trace path, byte for byte (Parquet: the same table read back), and several test files check
that promise on different inputs (tests/test_bounded_pipeline.py, tests/test_bounded_run_folder.py).
"""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

TINY = "1M"
"""A limit below what any chunk needs: every chunk is the smallest (one step of these traces)."""


def run_analyse(trace: Path, out: Path, *extra: str) -> subprocess.CompletedProcess:
    """``perfsight analyse TRACE --out OUT --json EXTRA...`` in a fresh process."""
    return subprocess.run(
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


def analyse(trace: Path, out: Path, *extra: str) -> dict:
    """The summary the CLI prints for ``trace`` (less its output folder); with ``--memory-limit``,
    checks that the bounded path ran and cut the trace into at least two chunks."""
    done = run_analyse(trace, out, *extra)
    assert done.returncode == 0, done.stderr
    (summary,) = json.loads(done.stdout)
    summary.pop("output_dir")
    if "--memory-limit" in extra:  # the bounded path ran, and says so with the chunks it cut
        assert summary.pop("bounded")["chunks"] >= 2
    return summary


def decoded(table: pa.Table) -> pa.Table:
    """``table`` with its dictionary columns as plain values: the same values, whatever the
    dictionaries.  Why: Parquet stores a dictionary per row group, and the two paths cut row groups
    differently, so the dictionaries read back differ in layout where the values do not."""
    return pa.table(
        {
            field.name: column.cast(field.type.value_type) if pa.types.is_dictionary(field.type) else column
            for field, column in zip(table.schema, table.columns, strict=True)
        }
    )


def output_files(folder: Path) -> dict[str, Path]:
    return {str(p.relative_to(folder)): p for p in sorted(folder.rglob("*")) if p.is_file()}


def same_outputs(whole: Path, bounded: Path) -> None:
    """Every file under ``whole`` is under ``bounded`` with the same content, and no other."""
    expected, got = output_files(whole), output_files(bounded)
    assert sorted(got) == sorted(expected)
    for name, path in expected.items():
        if name.endswith(".parquet"):
            a, b = pq.read_table(path), pq.read_table(got[name])
            assert a.schema.equals(b.schema), name
            assert decoded(a).equals(decoded(b)), f"{name}: the bounded path's table differs"
        elif name.endswith(".db"):
            with sqlite3.connect(path) as x, sqlite3.connect(got[name]) as y:
                assert list(x.iterdump()) == list(y.iterdump()), name
        else:
            assert path.read_bytes() == got[name].read_bytes(), f"{name}: the bounded path's file differs"


def _analyse_job(job: Path, out: Path, *extra: str) -> dict:
    done = run_analyse(job, out, *extra)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def job_is_the_same_within_a_tiny_limit(job: Path, tmp_path: Path, least_chunks: int) -> None:
    """``perfsight analyse JOB`` whole and with ``--memory-limit 1M``: the same summaries and
    files, each rank cut in at least ``least_chunks`` chunks.  Both analyses write to the same
    folder (the whole one's moved aside first), so the files that name their folder (the cluster
    summary) compare byte for byte too."""
    out = tmp_path / "out"
    whole = _analyse_job(job, out)
    out.rename(tmp_path / "whole")
    bounded = _analyse_job(job, out, "--memory-limit", TINY)
    assert len(bounded["ranks"]) == len(whole["ranks"]) >= 2
    for mine in bounded["ranks"]:
        assert mine.pop("bounded")["chunks"] >= least_chunks  # each rank went the bounded way
    assert bounded == whole  # the cluster summary and each rank's: steps, shares, findings, warnings
    same_outputs(tmp_path / "whole", out)  # cluster_analysis_output and rank<N>/
