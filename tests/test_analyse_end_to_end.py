"""A real PyTorch training run, traced by torch.profiler, analysed by the `perfsight` command.

These tests drive the installed CLI in a subprocess, as a user would, and check what a user
would check: the summary's numbers against the raw trace, and the files written.
"""

from __future__ import annotations

import contextlib
import csv
import fcntl
import json
import os
import sqlite3
import struct
import subprocess
import sys
import termios
from pathlib import Path
from typing import Any

import pytest

from conftest import raw_events

pytest.importorskip("torch")

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "examples" / "train_mlp.py"
ACTIVE_STEPS = 3


def _perfsight(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "perfsight.cli", *args],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
        env=env,
    )


@pytest.fixture(scope="module")
def training_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One real training job for the whole module (it takes a few seconds)."""
    out = tmp_path_factory.mktemp("train") / "run"
    result = subprocess.run(
        [sys.executable, str(EXAMPLE), "--out", str(out), "--steps", str(ACTIVE_STEPS),
         "--batch-size", "8", "--hidden", "32"],
        capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    return out


@pytest.fixture(scope="module")
def analysed(
    training_run: Path, tmp_path_factory: pytest.TempPathFactory
) -> tuple[Path, list[dict[str, Any]]]:
    out = tmp_path_factory.mktemp("analysis")
    result = _perfsight("analyse", str(training_run), "--out", str(out), "--json", "--export-type", "text,db")
    assert result.returncode == 0, result.stderr
    return out, json.loads(result.stdout)


def _trace_file(run: Path) -> Path:
    (trace,) = sorted(run.glob("*.pt.trace.json*"))
    return trace


def test_summary_has_every_profiled_step_and_consistent_breakdowns(training_run: Path, analysed) -> None:
    _, summary = analysed
    events = raw_events(_trace_file(training_run))
    marked = sorted(int(e["name"].split("#")[1]) for e in events
                    if e.get("ph") == "X" and str(e.get("name", "")).startswith("ProfilerStep#"))  # fmt: skip
    (rank,) = summary
    assert [s["step"] for s in rank["steps"]] == marked and len(marked) == ACTIVE_STEPS
    for step in rank["steps"]:
        assert step["iteration_interval_ns"] + step["fp_bp_ns"] + step["tail_ns"] == step["duration_ns"]
        assert step["fp_bp_ns"] > 0 and step["fp_op"] and step["bp_op"], "forward/backward were found"
        assert (
            step["computing_ns"]
            + step["communication_not_overlapped_ns"]
            + step["free_ns"]
            + step["preparing_ns"]
            == step["duration_ns"]
        )
    assert sum(rank["time_shares"].values()) == pytest.approx(1.0)


def test_top_operators_and_flops_come_from_the_real_model(analysed) -> None:
    _, (rank,) = analysed
    names = {op["name"] for op in rank["top_operators"]}
    assert names & {
        "aten::addmm",
        "aten::linear",
        "aten::conv2d",
        "aten::convolution",
        "aten::mkldnn_convolution",
    }
    assert all(row["flops"] and row["flops"] > 0 for row in rank["flops"]), (
        "conv/linear FLOPs counted per step"
    )


def test_memory_peak_is_the_largest_total_allocated_in_the_trace(training_run: Path, analysed) -> None:
    _, (rank,) = analysed
    events = raw_events(_trace_file(training_run))
    allocated = [e["args"]["Total Allocated"] for e in events if e.get("name") == "[memory]"]
    assert allocated, "the example profiles memory"
    assert max(p["peak_allocated_bytes"] for p in rank["memory_peaks"]) == max(allocated)


def test_outputs_are_written_with_the_seed_names(analysed) -> None:
    out, (rank,) = analysed
    folder = Path(rank["output_dir"])
    assert folder.parent.parent == out and folder.name == "PROFILER_OUTPUT"
    for name in ("op_statistic.csv", "step_trace_time.csv", "kernel_details.csv", "memory_record.csv",
                 "operator_memory.csv", "trace_view.json", f"perfsight_{rank['rank']}.db"):  # fmt: skip
        assert (folder / name).is_file(), name
    with open(folder / "step_trace_time.csv", newline="") as handle:
        rows = list(csv.DictReader(handle))
    assert [int(r["Step"]) for r in rows] == [s["step"] for s in rank["steps"]]
    for row, step in zip(rows, rank["steps"], strict=True):
        assert float(row["Computing"]) == pytest.approx(step["computing_ns"] / 1000, abs=1e-3)
    view = json.loads((folder / "trace_view.json").read_text())
    process_names = {e["args"]["name"] for e in view["traceEvents"] if e.get("name") == "process_name"}
    assert "Overlap Analysis" in process_names
    with sqlite3.connect(folder / f"perfsight_{rank['rank']}.db") as db:
        tables = {r[0] for r in db.execute("select name from sqlite_master where type='table'")}
        assert {"step_trace", "operator_stats", "slices"} <= tables
        assert db.execute("select count(*) from step_trace").fetchone()[0] == ACTIVE_STEPS


def test_load_reads_the_cache_without_the_original_trace(analysed, tmp_path: Path) -> None:
    import shutil

    import perfsight

    out, (rank,) = analysed
    copy = tmp_path / "copy"
    shutil.copytree(out, copy)
    loaded = perfsight.load(copy)
    steps = loaded.step_trace
    assert list(steps["step"]) == [s["step"] for s in rank["steps"]]
    assert list(steps["duration_ns"]) == [s["duration_ns"] for s in rank["steps"]]
    assert len(loaded.slices) > 0


def test_load_ignores_the_staging_folder_a_killed_analysis_left(analysed, tmp_path: Path) -> None:
    import shutil

    import perfsight
    from perfsight.export.staging import STAGING_PREFIX

    out, (rank,) = analysed
    copy = tmp_path / "copy"
    shutil.copytree(out, copy)
    # a second analysis killed while writing: a half-written cache in its hidden staging folder
    partial = copy / f"{STAGING_PREFIX}killed"
    shutil.copytree(out, partial / "run")
    for table in sorted((partial / "run").glob("**/cache/*.parquet"))[1:]:
        table.unlink()
    loaded = perfsight.load(copy)
    assert list(loaded.step_trace["duration_ns"]) == [s["duration_ns"] for s in rank["steps"]]


def test_fp_and_bp_points_can_be_named(training_run: Path, tmp_path: Path) -> None:
    result = _perfsight("analyse", str(training_run), "--out", str(tmp_path), "--json",
                        "--fp-point", "aten::conv2d", "--bp-point", "aten::convolution_backward")  # fmt: skip
    assert result.returncode == 0, result.stderr
    (rank,) = json.loads(result.stdout)
    assert {s["fp_op"] for s in rank["steps"]} == {"aten::conv2d"}
    assert {s["bp_op"] for s in rank["steps"]} == {"aten::convolution_backward"}


def test_text_summary_names_where_the_time_goes(training_run: Path, tmp_path: Path) -> None:
    result = _perfsight("analyse", str(training_run), "--out", str(tmp_path))
    assert result.returncode == 0, result.stderr
    assert "where the time goes:" in result.stdout and "memory peak cpu" in result.stdout


def test_one_run_without_a_bar_loads_neither_tqdm_nor_the_job_modules(
    training_run: Path, tmp_path: Path
) -> None:
    """A short analysis is mostly imports: the bar's library and the per-rank job step are loaded
    only when used (a bar on a terminal, a job of several ranks)."""
    result = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "perfsight.cli", "analyse", str(training_run),
         "--out", str(tmp_path), "--no-progress"],
        capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    loaded = {
        line.rsplit("|", 1)[-1].strip() for line in result.stderr.splitlines() if "import time:" in line
    }
    assert "perfsight.pipeline" in loaded  # the analysis itself ran
    assert not {"tqdm", "perfsight.cluster.rank", "perfsight.cluster.membership"} & loaded


def test_the_progress_bar_is_shown_on_a_terminal(training_run: Path, tmp_path: Path) -> None:
    main, terminal = os.openpty()
    fcntl.ioctl(terminal, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 120, 0, 0))  # a terminal's width
    try:
        process = subprocess.Popen(
            [sys.executable, "-m", "perfsight.cli", "analyse", str(training_run), "--out", str(tmp_path)],
            stdout=subprocess.DEVNULL, stderr=terminal,
        )  # fmt: skip
        os.close(terminal)
        shown = b""
        with contextlib.suppress(OSError):  # the terminal closes when the process ends
            while chunk := os.read(main, 4096):
                shown += chunk
        assert process.wait(timeout=600) == 0
    finally:
        os.close(main)
    assert b"analysing " in shown and b"100%" in shown


@pytest.mark.parametrize(
    "content, expected",
    [(b"Step,Computing\n1,2\n", "not a Chrome/Kineto trace"), (b'{"traceEvents": [', "truncated")],
)
def test_bad_input_gets_a_clear_message_not_a_traceback(
    tmp_path: Path, content: bytes, expected: str
) -> None:
    bad = tmp_path / "bad.json"
    bad.write_bytes(content)
    result = _perfsight("analyse", str(bad), "--out", str(tmp_path / "out"))
    assert "Traceback" not in result.stderr
    assert str(bad) in result.stderr and expected in result.stderr


def test_missing_path_is_an_error_with_exit_code_2(tmp_path: Path) -> None:
    result = _perfsight("analyse", str(tmp_path / "nope.json"))
    assert result.returncode == 2
    assert "no such file" in result.stderr and "Traceback" not in result.stderr
