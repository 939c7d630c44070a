"""Where the real traces live (``../shared/data`` beside the repo), and the one way a test asks for one.

Tests built on real traces decide nothing on a machine without them, so their count is part of
every run's result (``conftest.py`` prints it and fails the run when the data is present and such
a test skipped anyway).  The rule of :func:`require`:

- the data folder is absent (a clone used elsewhere): the test is skipped, and counted as such;
- the data folder is present but the file is not (moved, renamed, a typo): the test fails --
  a silent skip would hide that it no longer checks anything.

``PERFSIGHT_SHARED_DATA`` points elsewhere when the data is not beside the repo.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
DATA = Path(os.environ.get("PERFSIGHT_SHARED_DATA") or REPO.parent / "shared" / "data")
KINETO = DATA / "kineto"
ASCEND = DATA / "ascend_pt"
MINDINSIGHT = DATA / "mindinsight"

SKIP_PREFIX = "shared data absent"
"""Start of the skip reason of a test whose data folder is missing (counted by conftest.py)."""

_used_by_current_test = False


def present() -> bool:
    """Whether the shared data folder is on this machine."""
    return DATA.is_dir()


def require(path: Path | str) -> Path:
    """``path`` (absolute, or relative to the data folder), for a test that reads it: skip when the
    whole data folder is absent, fail when only this path is (see the module docstring)."""
    require_noted()
    full = Path(path) if Path(path).is_absolute() else DATA / path
    if not present():
        pytest.skip(f"{SKIP_PREFIX}: {DATA} is not on this machine (needed: {full.name})")
    if not full.exists():
        pytest.fail(f"{full} is missing although {DATA} is present: this test would check nothing")
    return full


def require_noted() -> None:
    """Note that the current test asked for shared data (the conftest's bookkeeping)."""
    global _used_by_current_test
    _used_by_current_test = True


def take_usage() -> bool:
    """Whether the test that just ran asked for shared data (and reset for the next one)."""
    global _used_by_current_test
    used, _used_by_current_test = _used_by_current_test, False
    return used
