"""Shared test fixtures: the real traces (``shared_data``), a raw-JSON oracle independent of our
reader, and the count of data-backed tests that every run prints (and fails on, when the data is
present and such a test was skipped)."""

from __future__ import annotations

import gzip
import json
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

import shared_data
from shared_data import DATA, KINETO, REPO

__all__ = ["DATA", "KINETO", "REPO"]


def kineto_file(relative: str) -> Path:
    return shared_data.require(KINETO / relative)


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
    return shared_data.require(path)


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


# -- counting the tests that read shared data ------------------------------------------------

_ran_with_data: set[str] = set()
_skipped_for_data: set[str] = set()
_data_fixtures: set[str] = set()
"""Fixtures whose setup asked for shared data: a test using one is data-backed even when the
fixture's value was cached by an earlier test (module or session scope)."""


@pytest.hookimpl(hookwrapper=True)
def pytest_fixture_setup(fixturedef: pytest.FixtureDef[Any], request: pytest.FixtureRequest) -> Any:
    before = shared_data.take_usage()
    yield
    if shared_data.take_usage():
        _data_fixtures.add(fixturedef.argname)
    if before:  # the test's own earlier require() calls still count for it
        shared_data.require_noted()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[Any]) -> Any:
    """Mark the report of a test that asked ``shared_data.require`` for a file, itself or through
    a fixture (runs where the test ran, so it works under xdist: reports carry user properties)."""
    outcome = yield
    report = outcome.get_result()
    used = shared_data.take_usage() or not _data_fixtures.isdisjoint(getattr(item, "fixturenames", ()))
    if used and ("shared_data", True) not in report.user_properties:
        report.user_properties.append(("shared_data", True))


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.when == "call" and ("shared_data", True) in report.user_properties:
        _ran_with_data.add(report.nodeid)
    skip_reason = str(report.longrepr[2]) if report.skipped and isinstance(report.longrepr, tuple) else ""
    if shared_data.SKIP_PREFIX in skip_reason:
        _skipped_for_data.add(report.nodeid)


def _is_controller(config: pytest.Config) -> bool:
    return not hasattr(config, "workerinput")  # xdist workers report to the controller


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    if not _is_controller(config):
        return
    where = "present" if shared_data.present() else "ABSENT"
    terminalreporter.write_line(
        f"shared data ({shared_data.DATA}, {where}): {len(_ran_with_data)} data-backed tests ran, "
        f"{len(_skipped_for_data)} skipped for lack of it"
    )


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """The data is here but the tests built on it did not run: the run decided nothing, fail it."""
    if not _is_controller(session.config) or not shared_data.present() or exitstatus not in (0, 5):
        return
    if _skipped_for_data:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


@pytest.fixture(autouse=True)
def ctrl_c_as_python_sets_it() -> None:
    """Every test starts with Python's own Ctrl-C handling, however the suite was started.  Why: a
    suite started as a background job of a non-interactive shell (``make test &``, ``nohup ...
    &``) starts with SIGINT ignored, as POSIX says such a job must, and so do pytest's workers;
    the ``perfsight`` subprocesses the Ctrl-C tests interrupt then inherited the ignored signal
    and ran to the end (exit 0 instead of 130)."""
    import signal

    if signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
        signal.signal(signal.SIGINT, signal.default_int_handler)


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
