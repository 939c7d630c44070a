"""Helpers for the server tests: a base dir of real traces and an app that has analysed them."""

from __future__ import annotations

import shutil
import time
from pathlib import Path
from typing import Any

from fastapi.testclient import TestClient

NCCL = "nccl_parser_config/nccl_data.json.gz"
TWO_RANKS = ("two_ranks_ws128/sampled_rank-0.json.gz", "two_ranks_ws128/sampled_rank-1.json.gz")


def copy_into(base: Path, source: Path, relative: str) -> Path:
    """Copy a real trace into the test's base dir (shared data is read-only and outside the repo)."""
    target = base / relative
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(source, target)
    return target


def wait_ready(client: TestClient, run: str, timeout_s: float = 240.0) -> dict[str, Any]:
    """Open ``run`` (GET /api/run/status starts its analysis) and poll until it is ready or failed."""
    deadline = time.monotonic() + timeout_s
    seen = []
    while True:
        response = client.get("/api/run/status", params={"run": run})
        assert response.status_code == 200, response.text
        status = response.json()
        seen.append(status["status"])
        if status["status"] in ("ready", "failed"):
            status["seen"] = seen
            return status
        assert time.monotonic() < deadline, f"{run} still {status} after {timeout_s} s"
        time.sleep(0.2)
