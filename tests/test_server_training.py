"""The web API on a run traced on this machine (examples/train_mlp.py): shapes, memory, data wait."""

from __future__ import annotations

import collections
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from _server_helpers import wait_ready
from conftest import ns_exact, raw_events_exact
from perfsight.server import create_app

pytest.importorskip("torch")

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "train_mlp.py"


@pytest.fixture(scope="module")
def trained(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[TestClient, str, list[dict[str, Any]]]]:
    base = tmp_path_factory.mktemp("base")
    args = ["--out", str(base / "mlp"), "--steps", "2", "--batch-size", "4", "--hidden", "16"]
    done = subprocess.run(
        [sys.executable, str(EXAMPLE), *args], capture_output=True, text=True, timeout=300, check=False
    )
    assert done.returncode == 0, done.stderr
    trace = next((base / "mlp").glob("*.pt.trace.json*"))
    with TestClient(create_app(base, cache_dir=tmp_path_factory.mktemp("cache"))) as client:
        run = trace.relative_to(base).as_posix()
        assert wait_ready(client, run)["status"] == "ready"
        yield client, run, raw_events_exact(trace) if trace.suffix == ".gz" else _plain(trace)


def _plain(path: Path) -> list[dict[str, Any]]:
    from decimal import Decimal

    return json.loads(path.read_text(encoding="utf-8"), parse_float=Decimal)["traceEvents"]


def test_operator_instances_carry_the_recorded_shapes_and_dtypes(trained: Any) -> None:
    client, run, raw = trained
    origin = min(ns_exact(e["ts"]) for e in raw if e.get("ph") == "X")
    mms = sorted(
        (e for e in raw if e.get("cat") == "cpu_op" and e["name"] == "aten::addmm"), key=lambda e: e["ts"]
    )
    page = client.get(
        "/api/run/operators", params={"run": run, "name": "aten::addmm", "sort": "start_ns", "order": "asc"}
    ).json()
    assert page["total"] == len(mms) > 0
    for row, event in zip(page["rows"], mms, strict=False):
        assert row["start_ns"] == ns_exact(event["ts"]) - origin
        assert json.loads(row["input_dims"]) == event["args"]["Input Dims"]
        assert json.loads(row["input_types"]) == event["args"]["Input type"]
        assert row["flops"] > 0  # a shaped matmul has a FLOP count


def test_memory_curve_keeps_the_peak_and_names_allocating_operators(trained: Any) -> None:
    client, run, raw = trained
    memory = client.get("/api/run/memory", params={"run": run, "points": 50}).json()
    allocated = [int(e["args"]["Total Allocated"]) for e in raw if e.get("name") == "[memory]"]
    (cpu,) = [d for d in memory["devices"] if d["device_type"] == "cpu"]
    assert cpu["points"] == len(allocated) > 50 >= len(cpu["curve"]["ts_ns"]) - 2
    assert cpu["peak_allocated_bytes"] == max(allocated) == max(cpu["curve"]["allocated_bytes"])
    assert memory["top_operators"] and memory["top_operators"][0]["total_bytes"] > 0
    totals = [o["total_bytes"] for o in memory["top_operators"]]
    assert totals == sorted(totals, reverse=True)


def test_overview_reports_time_waiting_for_the_data_loader(trained: Any) -> None:
    client, run, raw = trained
    overview = client.get("/api/run/overview", params={"run": run}).json()
    steps = [e for e in raw if e.get("ph") == "X" and e["name"].startswith("ProfilerStep#")]
    waits: dict[str, int] = collections.Counter()
    for event in raw:
        if event.get("ph") == "X" and event["name"].startswith("enumerate(DataLoader)"):
            inside = [s for s in steps if s["ts"] <= event["ts"] < s["ts"] + s["dur"]]
            if inside:
                waits[inside[0]["name"].split("#")[1]] += ns_exact(event["dur"])
    assert overview["data_wait"]["source"] == "data_loading ranges"
    assert overview["data_wait"]["per_step"] == dict(waits)
    assert overview["top_by"] == "host_self_ns"  # CPU-only run
