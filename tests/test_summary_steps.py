"""The printed summary of a run with many steps lists its slowest steps, not all of them: a 10 GB
trace holds 24,000 steps, and a reader acts on the outliers (every step stays in --json and in
step_trace_time.csv)."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path

import pytest

from perfsight.summary import STEP_LINES
from perfsight.units import ms_text

REPO = Path(__file__).resolve().parents[1]
HEADER = "step     total(ms)"


def _perfsight(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "perfsight.cli", *args], capture_output=True, text=True, timeout=300
    )


@pytest.fixture(scope="module")
def many_steps(tmp_path_factory: pytest.TempPathFactory) -> Path:
    trace = tmp_path_factory.mktemp("trace") / "many_steps.json"
    generator = REPO / "benchmarks" / "gen_kineto_trace.py"
    args = ["--out", str(trace), "--size-mb", "2", "--layers", "1", "--seed", "0"]
    subprocess.run([sys.executable, str(generator), *args], check=True, capture_output=True)
    return trace


def _table_rows(stdout: str) -> list[list[str]]:
    lines = stdout.splitlines()
    start = lines.index(next(line for line in lines if line.startswith(HEADER))) + 1
    rows = []
    for line in lines[start:]:
        if line.startswith("where the time goes"):
            return rows
        rows.append(line.split())
    raise AssertionError("the step table has no end")


def test_a_long_run_prints_its_slowest_steps_in_step_order(many_steps: Path, tmp_path: Path) -> None:
    text = _perfsight("analyse", str(many_steps), "--out", str(tmp_path / "text"), "--no-progress")
    assert text.returncode == 0, text.stderr
    as_json = _perfsight("analyse", str(many_steps), "--out", str(tmp_path / "json"), "--json")
    assert as_json.returncode == 0, as_json.stderr
    (rank,) = json.loads(as_json.stdout)
    steps = rank["steps"]
    assert len(steps) > STEP_LINES, "the generated trace should hold more steps than the summary lists"

    rows = _table_rows(text.stdout)
    assert len(rows) == STEP_LINES
    printed = [int(row[0]) for row in rows]
    by_total = sorted(steps, key=lambda s: -s["duration_ns"])  # stable: ties in step order
    assert printed == sorted(s["step"] for s in by_total[:STEP_LINES])
    spread = next(line for line in text.stdout.splitlines() if line.startswith(f"{len(steps)} steps: "))
    assert f"max {ms_text(by_total[0]['duration_ns'])} ms" in spread and "step_trace_time.csv" in spread

    csv_path = next((tmp_path / "text").rglob("step_trace_time.csv"))
    with csv_path.open(newline="") as handle:
        assert len(list(csv.DictReader(handle))) == len(steps), "the file keeps every step"
