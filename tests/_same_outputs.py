"""Whether two output folders hold the same outputs: what the bounded-memory tests compare.

Why a module: a single trace (tests/test_bounded_pipeline.py) and a job's ranks
(tests/test_job_bounded_rank.py) are both analysed whole and within a tiny memory limit, and
every file of the two output folders must be the same: text, JSON and CSV byte for byte,
Parquet tables equal (their files differ in writer metadata), SQLite databases dump for dump.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pyarrow.parquet as pq


def files(folder: Path) -> dict[str, Path]:
    """Every file under ``folder`` by its path relative to it."""
    return {str(p.relative_to(folder)): p for p in sorted(folder.rglob("*")) if p.is_file()}


def same_outputs(whole: Path, bounded: Path) -> None:
    """Assert that ``bounded`` holds the files ``whole`` holds, with the same contents; a text file
    that names its own output folder is compared with that folder's path put in common."""
    expected, got = files(whole), files(bounded)
    assert sorted(got) == sorted(expected)
    for name, path in expected.items():
        if name.endswith(".parquet"):
            a, b = pq.read_table(path), pq.read_table(got[name])
            assert a.schema.equals(b.schema), name
            assert a.equals(b), f"{name}: the bounded path's table differs"
        elif name.endswith(".db"):
            with sqlite3.connect(path) as x, sqlite3.connect(got[name]) as y:
                assert list(x.iterdump()) == list(y.iterdump()), name
        else:
            mine = got[name].read_bytes().replace(str(bounded).encode(), str(whole).encode())
            assert path.read_bytes() == mine, f"{name}: the bounded path's file differs"
