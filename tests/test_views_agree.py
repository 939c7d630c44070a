"""The CLI and the UI show the same numbers for a run: ``perfsight analyse --json`` and the server's
``/api/run/overview`` (what the overview and operator pages draw) agree on the top operators, what
they are ranked by, and where the time goes.  Each side analyses the shared trace on its own (the
CLI in this process, the server in its background job), so a number decided twice would show here.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from _server_helpers import NCCL, copy_into, wait_ready
from conftest import kineto_file
from perfsight.cli import main
from perfsight.server import create_app

CPU_ONLY = "cpu_only/rank-34.Jul_15_10_52_41.1074.pt.trace.json.gz"
AMD = "amd_trace/mi250_minitoy_train_ROCm6_2_kineto.json.gz"
TRACES = {"gpu": NCCL, "cpu": CPU_ONLY, "rocm": AMD}
"""Ranked by device time (NCCL/CUDA, ROCm) and by host self time (a CPU-only gloo rank)."""
SHOWN_SHARES = ("computing", "communication_not_overlapped", "free", "preparing")


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[TestClient, dict[str, Path]]]:
    base = tmp_path_factory.mktemp("base")
    copies = {
        label: copy_into(base, kineto_file(path), f"{label}/{Path(path).name}")
        for label, path in TRACES.items()
    }
    app = create_app(base, cache_dir=tmp_path_factory.mktemp("cache"))
    with TestClient(app) as client:
        yield client, copies


def _cli(path: Path, out: Path, capsys: pytest.CaptureFixture[str]) -> dict[str, Any]:
    assert main(["analyse", str(path), "--json", "--no-progress", "--out", str(out)]) == 0
    (summary,) = json.loads(capsys.readouterr().out)
    return summary


def _api(client: TestClient, run: str) -> dict[str, Any]:
    assert wait_ready(client, run)["status"] == "ready"
    response = client.get("/api/run/overview", params={"run": run})
    assert response.status_code == 200, response.text
    return response.json()


@pytest.mark.parametrize("label", sorted(TRACES))
def test_cli_and_api_show_the_same_top_operators_and_time_shares(
    label: str,
    served: tuple[TestClient, dict[str, Path]],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    client, copies = served
    path = copies[label]
    cli = _cli(path, tmp_path / "out", capsys)
    api = _api(client, f"{label}/{path.name}")

    assert cli["top_operators"], "a rank with operators"
    assert api["top_by"] == cli["top_operators_by"]
    shown = len(cli["top_operators"])  # the CLI prints the first 10, the UI the first 20
    fields = ("name", "count", "host_self_ns", "device_total_ns")
    assert [{k: op[k] for k in fields} for op in api["operator_types"][:shown]] == [
        {k: op[k] for k in fields} for op in cli["top_operators"]
    ]

    shares = api["shares"]
    assert {name: shares[name] for name in SHOWN_SHARES} == cli["time_shares"]
    assert (
        sum(shares[f"{n}_ns"] for n in ("computing", "communication_not_overlapped", "free", "preparing"))
        == (shares["total_ns"])
    )  # the four the CLI prints cover the whole time (overlapped communication is inside computing)
