"""The seed's data-preparation judgement on hand-made capture rows whose numbers are worked out on
paper: what no CPU-only test machine can produce for real (a ``pin_memory`` thread needs an
accelerator), and the boundaries of the rules.  The real loaders are in test_data_pipeline.py."""

from __future__ import annotations

import pyarrow as pa

from _trace_builder import make_trace
from perfsight.analysis.data_pipeline import data_pipeline_summary, data_stages
from perfsight.model import DATALOADER_SCHEMA

MS = 1_000_000


def _trace(host: int, device: int | None, wait_ms: int, pin_ms: int = 1, read_ms: int = 4) -> object:
    """10 requests 10 ms apart, each waiting ``wait_ms`` and finding the given queue sizes (capacity
    4); two workers fetching batches of ``read_ms`` read and 1 ms collate; pinning ``pin_ms``."""
    rows = []
    for i in range(10):
        start = i * 10 * MS
        common = {"rank": 0, "step": i, "pid": 1}
        rows.append(
            {
                **common,
                "kind": "wait",
                "worker": -1,
                "batch": i,
                "start_ns": start,
                "dur_ns": wait_ms * MS,
                "host_queue": host,
                "device_queue": device,
                "queue_capacity": 4,
            }
        )
        rows.append(
            {
                **common,
                "kind": "fetch",
                "worker": i % 2,
                "pid": 10 + i % 2,
                "start_ns": start,
                "dur_ns": (read_ms + 1) * MS,
                "read_ns": read_ms * MS,
                "transform_ns": 0,
                "collate_ns": MS,
                "samples": 4,
            }
        )
        if device is not None:
            rows.append({**common, "kind": "pin", "worker": -1, "start_ns": start, "dur_ns": pin_ms * MS})
    trace = make_trace([], [])
    trace.dataloader = pa.Table.from_pylist(rows, schema=DATALOADER_SCHEMA)  # every row, every key
    return trace


def test_a_full_host_queue_and_an_empty_device_queue_name_the_copy_to_the_device() -> None:
    trace = _trace(host=4, device=0, wait_ms=5, pin_ms=5)
    summary = data_pipeline_summary(trace).to_pylist()[0]
    assert summary["verdict"] == "host to device"
    assert summary["bottleneck_stage"] == "pin_memory"
    assert summary["device_queue_empty"] == 9  # the first request is not judged


def test_an_empty_host_queue_names_the_slowest_worker_stage() -> None:
    summary = data_pipeline_summary(_trace(host=0, device=None, wait_ms=5)).to_pylist()[0]
    assert summary["verdict"] == "data processing" and summary["bottleneck_stage"] == "read"
    stages = {s["stage"]: s for s in data_stages(_trace(host=0, device=None, wait_ms=5)).to_pylist()}
    assert stages["read"]["per_batch_ns"] == 4 * MS and stages["read"]["throughput_per_s"] == 500.0


def test_short_waits_are_no_bottleneck_even_with_an_empty_queue() -> None:
    # 0 of every 10 ms waiting: below the 10% bound, whatever the queue
    trace = _trace(host=0, device=None, wait_ms=0)
    summary = data_pipeline_summary(trace).to_pylist()[0]
    assert summary["verdict"] == "none" and summary["bottleneck_stage"] is None


def test_a_rank_without_capture_has_no_summary() -> None:
    assert data_pipeline_summary(make_trace([], [])).num_rows == 0
