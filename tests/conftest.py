"""Shared test fixtures: where the real traces live, and a raw-JSON oracle independent of our reader."""

from __future__ import annotations

import gzip
import json
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[1]
DATA = REPO.parent / "shared" / "data"
KINETO = DATA / "kineto"


def kineto_file(relative: str) -> Path:
    path = KINETO / relative
    if not path.exists():
        pytest.skip(f"real trace {path} is not available (../shared/data is outside the repo)")
    return path


def raw_events(path: Path) -> list[dict]:
    """The trace's events as the standard library reads them: the oracle our reader must agree with."""
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as handle:
        doc = json.load(handle)
    return doc["traceEvents"] if isinstance(doc, dict) else doc


@pytest.fixture
def nccl_trace_path() -> Path:
    return kineto_file("nccl_parser_config/nccl_data.json.gz")


@pytest.fixture
def df_trace_path() -> Path:
    return kineto_file("df_index_resolver/df_index_resolver.json.gz")


def need_file(path: Path) -> Path:
    if not path.is_file():
        pytest.skip(f"shared Kineto sample {path} is not on this machine")
    return path


def read_real(path: Path) -> Any:
    """A real trace through our reader (``perfsight.ingest.read_trace``)."""
    from perfsight.ingest import read_trace

    return read_trace(need_file(path))


def raw_events_exact(path: Path) -> list[dict[str, Any]]:
    """Like ``raw_events`` but with timestamps as exact Decimals (for nanosecond oracles)."""
    with gzip.open(need_file(path), "rt", encoding="utf-8") as handle:
        return json.load(handle, parse_float=Decimal)["traceEvents"]


def ns_exact(micros: Any) -> int:
    return int(Decimal(micros) * 1000)


@pytest.fixture(scope="session", autouse=True)
def server_cache_in_tmp(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """Every ``perfsight serve`` a test starts (in process or as a subprocess, which inherits the
    environment) keeps its analyses in a temporary folder, never in the real ``~/.cache``."""
    import os

    before = os.environ.get("PERFSIGHT_CACHE_DIR")
    os.environ["PERFSIGHT_CACHE_DIR"] = str(tmp_path_factory.mktemp("perfsight-serve-cache"))
    yield
    if before is None:
        os.environ.pop("PERFSIGHT_CACHE_DIR", None)
    else:
        os.environ["PERFSIGHT_CACHE_DIR"] = before
