"""A process that reads many traces (a cluster worker) reuses one native scanner: every read must
give exactly what a read with a fresh scanner gives, and no earlier result may change."""

from __future__ import annotations

import pytest

from conftest import kineto_file
from perfsight.ingest import eventscan, read_trace
from perfsight.model import TABLE_SCHEMAS


def _tables(trace) -> dict:
    return {name: getattr(trace, name) for name in TABLE_SCHEMAS}


def test_reads_with_a_reused_scanner_equal_reads_with_a_fresh_one(monkeypatch: pytest.MonkeyPatch) -> None:
    if not eventscan.available():
        pytest.skip("the native scanner is not built here")
    paths = [
        kineto_file("distributed_info_unavailable/distributed_info_not_found.json.gz"),  # grows a heap
        kineto_file("amd_trace/mi250_minitoy_train_ROCm6_2_kineto.json.gz"),
        kineto_file("cpu_only/rank-34.Jul_15_10_52_41.1074.pt.trace.json.gz"),
    ]
    fresh = {}
    for path in paths:
        monkeypatch.setattr(eventscan, "_IDLE", {})  # no scanner left over from an earlier read
        fresh[path] = _tables(read_trace(path))
    monkeypatch.setattr(eventscan, "_IDLE", {})
    kept = [(path, _tables(read_trace(path))) for path in paths + paths[::-1]]
    kept_idle = sum(len(idle) for idle in eventscan._IDLE.values())
    assert 1 <= kept_idle <= eventscan.KEEP_IDLE, "a few scanners (scanning, converting) served every read"
    for path, tables in kept:  # compared after all reads: a result sharing the buffers would show it
        for name, table in tables.items():
            assert table.equals(fresh[path][name]), f"{path.name}: {name} differs after a reused scanner"
