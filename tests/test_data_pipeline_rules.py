"""The seed's data-preparation judgement on hand-made capture rows whose numbers are worked out on
paper: what no CPU-only test machine can produce for real (a ``pin_memory`` thread needs an
accelerator), and the boundaries of the rules.  The real loaders are in test_data_pipeline.py."""

from __future__ import annotations

import pyarrow as pa

from _trace_builder import make_trace
from perfsight.analysis.data_pipeline import data_pipeline_summary, data_stages
from perfsight.model import DATALOADER_SCHEMA

MS = 1_000_000


def _trace(
    host: int, device: int | None, wait_ms: int, pin_ms: int = 1, read_ms: int = 4, copy_ms: float = 0
) -> object:
    """10 requests 10 ms apart, each waiting ``wait_ms`` and finding the given queue sizes (capacity
    4); two workers fetching batches of ``read_ms`` read and 1 ms collate; pinning ``pin_ms``; the
    loop copying each batch (4 MB) to the device in ``copy_ms`` after it arrives."""
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
        if copy_ms:
            copy = {"kind": "copy", "worker": -1, "batch": i, "start_ns": start + wait_ms * MS}
            rows.append(
                {**common, **copy, "dur_ns": int(copy_ms * MS), "bytes": 4_000_000, "stage": "cuda:0"}
            )
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


def test_ready_batches_and_a_long_copy_name_the_copy_to_the_device() -> None:
    # the host queue is full, the loop waits 0 ms but copies 3 of every 10 ms: 4 MB in 3 ms
    summary = data_pipeline_summary(_trace(host=4, device=None, wait_ms=0, copy_ms=3)).to_pylist()[0]
    assert summary["verdict"] == "host to device" and summary["bottleneck_stage"] == "to_device"
    # judged: batches 1-9, 9 copies of 3 ms over the 80 ms from request 1 to request 9
    assert "34% of its time (3.000 ms per batch at 1.33 GB/s)" in summary["reason"]
    stages = data_stages(_trace(host=4, device=None, wait_ms=0, copy_ms=3)).to_pylist()
    assert [s["stage"] for s in stages][-1] == "to_device" and stages[-1]["per_batch_ns"] == 3 * MS


def test_a_starved_host_queue_is_named_before_the_copy() -> None:
    # the workers are too slow (empty queue, half the time waiting): the copy is not the first fix
    summary = data_pipeline_summary(_trace(host=0, device=None, wait_ms=5, copy_ms=2)).to_pylist()[0]
    assert summary["verdict"] == "data processing" and summary["bottleneck_stage"] == "read"


def test_a_short_copy_is_shown_but_no_bottleneck() -> None:
    trace = _trace(host=4, device=None, wait_ms=0, copy_ms=0.5)  # 5% of the loop: under the 10% bound
    summary = data_pipeline_summary(trace).to_pylist()[0]
    assert summary["verdict"] == "none" and summary["bottleneck_stage"] is None
    stages = {s["stage"]: s for s in data_stages(trace).to_pylist()}
    assert stages["to_device"]["per_batch_ns"] == MS // 2 and not stages["to_device"]["bottleneck"]


def test_the_copy_is_op_0_of_the_mindspore_files_and_feeds_training_without_a_queue(tmp_path) -> None:
    import csv
    import json

    from perfsight.export.data_pipeline_files import write_all

    trace = _trace(host=4, device=None, wait_ms=0, copy_ms=3)
    stages = data_stages(trace)
    write_all(
        tmp_path, {"data_stages": stages, "data_pipeline_summary": data_pipeline_summary(trace, stages)}
    )
    with (tmp_path / "data_pipeline_raw_0.csv").open() as f:
        ops = list(csv.DictReader(f))
    assert (ops[0]["stage"], ops[0]["op_type"], ops[0]["output_queue_length"]) == (
        "to_device",
        "DeviceCopy",
        "",
    )
    assert ops[1]["stage"] == "collate" and ops[1]["output_queue_length"] == "4"  # the host queue
    document = json.loads((tmp_path / "minddata_pipeline_summary_0.json").read_text())
    assert document["pipeline_ops"][0] == "to_device(id=0)"
    assert document["bottleneck"]["stage"] == "to_device"
    with (tmp_path / "dataset.csv").open() as f:
        assert "to_device" in [row["Operation"] for row in csv.DictReader(f)]
