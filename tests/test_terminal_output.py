"""Names from a trace printed by the CLI are data: escape sequences, bidi overrides and line breaks
in them are shown as escapes, never handed to the user's terminal (perfsight.terminal)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from perfsight.terminal import printable_line

EVIL = "evil\x1b]0;pwned\x07\x1b[2J\u202eop\nforged line"


def _trace_with_an_evil_op_name(path: Path) -> Path:
    at = {"ph": "X", "pid": 1, "tid": 1}
    events = [{**at, "cat": "user_annotation", "name": "ProfilerStep#1", "ts": 0, "dur": 1000}]
    events += [
        {**at, "cat": "cpu_op", "name": name, "ts": ts, "dur": 100}
        for name, ts in ((EVIL, 10), ("aten::mm", 200))
    ]  # fmt: skip
    path.write_text(json.dumps({"distributedInfo": {"rank": 0, "world_size": 1}, "traceEvents": events}))
    return path


def test_an_op_name_cannot_drive_the_terminal_or_forge_a_report_line(tmp_path: Path) -> None:
    trace = _trace_with_an_evil_op_name(tmp_path / "evil.pt.trace.json")
    result = subprocess.run(
        [sys.executable, "-m", "perfsight.cli", "analyse", str(trace), "--out", str(tmp_path / "out")],
        capture_output=True, text=True, timeout=300, check=True,
    )  # fmt: skip
    out = result.stdout
    assert "\x1b" not in out and "\x07" not in out and "\u202e" not in out
    assert not any(line.startswith("forged line") for line in out.splitlines())
    assert "evil\\x1b]0;pwned\\x07\\x1b[2J\\u202eop\\x0aforged line" in out  # shown, escaped, on its line
    assert "aten::mm" in out


def test_ordinary_names_print_unchanged() -> None:
    for name in ("aten::mm", "ncclKernel_AllReduce_RING_LL_Sum_float", "注意力 層", "tab\tstays"):
        assert printable_line(name) == name
