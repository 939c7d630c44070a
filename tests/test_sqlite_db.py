"""SQLite export: every table lands as one SQL table, values and names unchanged, lists as JSON."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pyarrow as pa
import pytest

from _hostile import HOSTILE_NAMES, hostile_trace
from perfsight.analysis.kernels import kernel_details
from perfsight.analysis.overlap import overlap_breakdown
from perfsight.export.sqlite_db import write_db
from perfsight.ingest import read_trace
from shared_data import KINETO, require

NCCL = KINETO / "nccl_parser_config" / "nccl_data.json.gz"


def test_real_trace_slices_and_analyses_are_queryable(tmp_path: Path) -> None:
    trace = read_trace(require(NCCL))
    tables = {
        "slices": trace.slices,
        "steps": trace.steps,
        "overlap_breakdown": overlap_breakdown(trace),
        "kernel_details": kernel_details(trace),
    }
    path = write_db(tmp_path / f"perfsight_{trace.rank}.db", tables)
    with sqlite3.connect(path) as db:
        for name, table in tables.items():
            assert db.execute(f"SELECT COUNT(*) FROM {name}").fetchone()[0] == table.num_rows
            columns = [row[1] for row in db.execute(f"PRAGMA table_info({name})")]
            assert columns == table.column_names
        count, total = db.execute("SELECT COUNT(*), SUM(dur_ns) FROM slices").fetchone()
        assert total == sum(trace.slices.column("dur_ns").to_pylist())
        names = [r[0] for r in db.execute("SELECT name FROM slices ORDER BY rowid")]
        assert names == trace.slices.column("name").to_pylist()
        grids = [r[0] for r in db.execute("SELECT grid FROM slices ORDER BY rowid")]
        parsed = [json.loads(g) if g is not None else None for g in grids]
        assert parsed == trace.slices.column("grid").to_pylist()
        types = dict(db.execute("SELECT name, type FROM pragma_table_info('slices')").fetchall())
        assert types["start_ns"] == "INTEGER" and types["name"] == "TEXT" and types["occupancy_pct"] == "REAL"
        steps = [r[0] for r in db.execute("SELECT step FROM overlap_breakdown ORDER BY step")]
        assert steps == sorted(trace.steps.column("step").to_pylist())


def test_hostile_names_and_nested_lists_round_trip(tmp_path: Path) -> None:
    trace = hostile_trace()
    odd = pa.table({'weird column "name"': HOSTILE_NAMES, "flag": [True, False] * 3 + [True]})
    path = write_db(tmp_path / "perfsight_0.db", {"slices": trace.slices, "odd": odd})
    with sqlite3.connect(path) as db:
        names = {r[0] for r in db.execute("SELECT name FROM slices")}
        assert set(HOSTILE_NAMES) <= names
        query = "SELECT input_dims, input_types FROM slices WHERE name = ?"
        dims = db.execute(query, (HOSTILE_NAMES[3],)).fetchone()
        assert json.loads(dims[0]) == [[2, 3], [], [7]]
        assert json.loads(dims[1]) == ["float", HOSTILE_NAMES[3], "int64"]
        rows = db.execute('SELECT "weird column ""name""", flag FROM odd ORDER BY rowid').fetchall()
        assert [r[0] for r in rows] == HOSTILE_NAMES and rows[0][1] == 1 and rows[1][1] == 0


def test_rewriting_replaces_the_file_and_a_bad_name_writes_nothing(tmp_path: Path) -> None:
    path = tmp_path / "perfsight_0.db"
    write_db(path, {"a": pa.table({"x": [1, 2]})})
    write_db(path, {"b": pa.table({"y": [3]})})
    with sqlite3.connect(path) as db:
        assert [r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type='table'")] == ["b"]
    with pytest.raises(ValueError, match="identifier"):
        write_db(tmp_path / "other.db", {"drop table; --": pa.table({"x": [1]})})
    assert not (tmp_path / "other.db").exists()
    assert not list(tmp_path.glob("*.tmp"))
