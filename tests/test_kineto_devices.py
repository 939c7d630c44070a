"""Device work on a process perfsight does not know is analysed as device work or named in a
warning -- never silently taken for host time.

The traces are the shared NCCL trace with its GPU renamed at test time (an MTIA-like device: its
kernels in category ``mtia_ccp_events`` on a process labelled ``MTIA 0``).
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import numpy as np

from perfsight.analysis.overlap import overlap_breakdown
from perfsight.ingest import read_trace
from perfsight.ingest.kineto_devices import _distinct_pairs


def _renamed(source: Path, target: Path, label: str, *, keep_devices: bool = True) -> Path:
    """``source`` with the GPU process relabelled ``label`` and its kernels in an unknown category
    (and without ``deviceProperties`` unless ``keep_devices``)."""
    with gzip.open(source, "rt", encoding="utf-8") as handle:
        doc = json.load(handle)
    if not keep_devices:
        doc.pop("deviceProperties")
    gpu = {e["pid"] for e in doc["traceEvents"] if e.get("cat") == "kernel"}
    assert gpu == {0}
    for event in doc["traceEvents"]:
        if event.get("ph") == "M" and event.get("name") == "process_labels" and event.get("pid") == 0:
            event["args"]["labels"] = label
        elif event.get("ph") == "X" and event.get("cat") == "kernel":
            event["cat"] = "mtia_ccp_events"
    with gzip.open(target, "wt", encoding="utf-8") as handle:
        json.dump(doc, handle)
    return target


def test_work_on_an_unknown_device_is_analysed_as_device_work_and_named(
    nccl_trace_path: Path, tmp_path: Path
) -> None:
    original = read_trace(nccl_trace_path)
    renamed = read_trace(_renamed(nccl_trace_path, tmp_path / "mtia.json.gz", "MTIA 0"))
    warnings = "\n".join(renamed.meta.warnings)
    assert "'MTIA 0'" in warnings and "'mtia_ccp_events'" in warnings and "device kernels" in warnings
    mine = {r["step"]: r for r in overlap_breakdown(renamed).to_pylist()}
    want = {r["step"]: r for r in overlap_breakdown(original).to_pylist()}
    assert mine.keys() == want.keys() and want
    for step, row in want.items():
        assert row["computing_ns"] > 0
        for column in ("computing_ns", "communication_ns", "free_ns"):
            assert mine[step][column] == row[column], (step, column)


def test_work_on_a_process_that_names_no_device_is_warned_about_by_name(
    nccl_trace_path: Path, tmp_path: Path
) -> None:
    renamed = _renamed(
        nccl_trace_path, tmp_path / "unknown.json.gz", "Mystery accelerator", keep_devices=False
    )
    renamed = read_trace(renamed)
    [warning] = [w for w in renamed.meta.warnings if "Mystery accelerator" in w]
    assert "'mtia_ccp_events' (2700 events)" in warning and "cannot classify" in warning


def test_a_process_whose_pid_is_a_listed_device_is_that_device(nccl_trace_path: Path, tmp_path: Path) -> None:
    """Without a device label, the trace's ``deviceProperties`` still say which process is the device."""
    renamed = _renamed(nccl_trace_path, tmp_path / "unlabelled.json.gz", "")
    renamed = read_trace(renamed)
    [warning] = [w for w in renamed.meta.warnings if "mtia_ccp_events" in w]
    assert "'device 0 (NVIDIA A100-PG509-200)'" in warning and "device kernels" in warning


def test_process_category_pairs_are_grouped_as_numpy_groups_them() -> None:
    """The dense-grid grouping of (pid, category) pairs gives numpy's sorted unique pairs, row
    numbers and counts, on a few processes (the grid) and on very many (the sorted fallback)."""
    rng = np.random.default_rng(7)
    for rows, processes, categories in ((5000, 4, 6), (20000, 15000, 30), (1, 1, 1)):
        pid = rng.choice(np.append(rng.integers(0, 1 << 40, processes - 1), -1), rows)
        code = rng.integers(0, categories, rows)
        pairs, inverse = np.unique(np.stack([pid, code]), axis=1, return_inverse=True)
        got_pairs, got_inverse, got_counts = _distinct_pairs(pid, code, categories)
        assert np.array_equal(got_pairs, pairs)
        assert np.array_equal(got_inverse, inverse.reshape(-1))
        assert np.array_equal(got_counts, np.bincount(inverse.reshape(-1)))
