"""The example training job produces a real torch.profiler trace that perfsight can rely on."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "train_mlp.py"
ACTIVE_STEPS = 3


def _load_trace(path: Path) -> dict[str, Any]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as handle:
        return json.load(handle)


def test_example_training_writes_a_kineto_trace_with_steps_and_shaped_matmuls(tmp_path: Path) -> None:
    out_dir = tmp_path / "run"
    result = subprocess.run(
        [
            sys.executable,
            str(EXAMPLE),
            "--out",
            str(out_dir),
            "--steps",
            str(ACTIVE_STEPS),
            "--batch-size",
            "4",
            "--hidden",
            "16",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stderr

    traces = sorted(out_dir.glob("*.pt.trace.json")) + sorted(out_dir.glob("*.pt.trace.json.gz"))
    assert len(traces) == 1, f"expected one trace in {out_dir}, found {traces}"
    assert str(traces[0]) in result.stdout

    events = _load_trace(traces[0])["traceEvents"]
    steps = [
        event
        for event in events
        if event.get("cat") == "user_annotation" and event.get("name", "").startswith("ProfilerStep#")
    ]
    assert len(steps) == ACTIVE_STEPS

    shaped_matmuls = [
        event
        for event in events
        if event.get("cat") == "cpu_op"
        and event.get("name") in ("aten::addmm", "aten::mm")
        and event.get("args", {}).get("Input Dims")
    ]
    assert shaped_matmuls, "no aten::addmm / aten::mm with Input Dims: was record_shapes lost?"
