"""The MindData (input pipeline) queue files of a legacy ``profiler/`` folder, read as MindInsight's
``MinddataAnalyser`` reads them.

Per device ``n``:

* ``device_queue_profiling_{n}.txt`` (else ``dataset_iterator_profiling_{n}.txt``): space-separated
  lines ``<type> <a> <step> <value> ...``.  Type ``1`` is a queue sample: ``a`` the queue's capacity,
  ``value`` its size at that step (empty when 0, full when equal to the capacity).  Type ``0`` is a
  time: ``a`` 0 get, 1 push, 2 total; ``value`` in ms.
* ``minddata_aicpu_{n}.txt``: ``GetNext_dequeue_wait <start µs> <end µs> <queue size>`` per fetch by
  the device's GetNext (empty when the size is 0).
* ``minddata_pipeline_raw_{n}.csv``: per pipeline op its output queue (``output_queue_usage_rate``,
  average size, length), its parent and children.

The summary is MindInsight's: per queue the batches, the empty and full ones; the two warnings of
its status rule (the device queue empty in more than 30 % of the batches: data processing; else
any empty GetNext fetch: data transmission) and the op queues' usage.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.csv as pcsv

from perfsight.ingest import ascend_files as files
from perfsight.ingest.mindinsight_legacy import numbers_of

EMPTY_WARNING_SHARE = 0.3
"""MindInsight's ``DEVICE_QUEUE_EMPTY_WARNING_THRESHOLD``: the share of empty device-queue batches
above which it flags data processing."""

DEVICE_QUEUE_SCHEMA = pa.schema(
    [("rank", pa.int32()), ("step", pa.int64()), ("size", pa.int64()), ("capacity", pa.int64())]
)
"""One row per device-queue sample (type ``1`` lines), in step order."""

GET_NEXT_SCHEMA = pa.schema(
    [("rank", pa.int32()), ("start_ns", pa.int64()), ("end_ns", pa.int64()), ("queue_size", pa.int64())]
)
"""One row per GetNext fetch of ``minddata_aicpu_{n}.txt`` (device clock, ns)."""


def _columns(path: Path, problems: files.FileProblems) -> list[np.ndarray] | None:
    """The space-separated columns of ``path`` as text arrays; ``None`` (and a warning) if unreadable."""
    skipped = 0

    def skip(_row: Any) -> str:
        nonlocal skipped
        skipped += 1
        return "skip"

    try:
        table = pcsv.read_csv(
            path,
            read_options=pcsv.ReadOptions(autogenerate_column_names=True),
            parse_options=pcsv.ParseOptions(delimiter=" ", invalid_row_handler=skip),
            convert_options=pcsv.ConvertOptions(
                column_types={f"f{i}": pa.string() for i in range(16)}, strings_can_be_null=True
            ),
        )
    except (OSError, pa.ArrowInvalid) as error:
        problems.add(path, f"cannot be read ({str(error).splitlines()[0]})")
        return None
    if skipped:
        problems.add(path, f"{skipped} line(s) with another number of fields skipped")
    return [table.column(i).combine_chunks() for i in range(table.num_columns)]


def read_device_queue(folder: Path, index: int, rank: int, problems: files.FileProblems) -> pa.Table:
    """The device queue's samples (:data:`DEVICE_QUEUE_SCHEMA`); empty when neither file is there."""
    path = folder / f"device_queue_profiling_{index}.txt"
    if not path.is_file():
        path = folder / f"dataset_iterator_profiling_{index}.txt"
    if not path.is_file():
        return DEVICE_QUEUE_SCHEMA.empty_table()
    cols = _columns(path, problems)
    if cols is None or len(cols) < 4:
        if cols is not None:
            problems.add(path, "has fewer than 4 fields per line (type, capacity, step, size)")
        return DEVICE_QUEUE_SCHEMA.empty_table()
    kind, capacity, step, size = (numbers_of(c) for c in cols[:4])
    queue = (kind == 1) & ~np.isnan(capacity) & ~np.isnan(step) & ~np.isnan(size)
    order = np.argsort(step[queue], kind="stable")  # MindInsight sorts the samples by step
    return pa.table(
        {
            "rank": np.full(int(queue.sum()), rank, np.int32),
            "step": step[queue][order].astype(np.int64),
            "size": size[queue][order].astype(np.int64),
            "capacity": capacity[queue][order].astype(np.int64),
        },
        schema=DEVICE_QUEUE_SCHEMA,
    )


def read_get_next(folder: Path, index: int, rank: int, problems: files.FileProblems) -> pa.Table:
    """The device's GetNext fetches (:data:`GET_NEXT_SCHEMA`); empty when the file is not there."""
    path = folder / f"minddata_aicpu_{index}.txt"
    if not path.is_file():
        return GET_NEXT_SCHEMA.empty_table()
    cols = _columns(path, problems)
    if cols is None or len(cols) < 4:
        if cols is not None:
            problems.add(path, "has fewer than 4 fields per line (name, start, end, queue size)")
        return GET_NEXT_SCHEMA.empty_table()
    name = np.asarray(cols[0].fill_null("").to_numpy(zero_copy_only=False), dtype=str)
    start, end, size = (numbers_of(c) for c in cols[1:4])
    keep = np.char.startswith(name, "GetNext") & ~np.isnan(start) & ~np.isnan(end) & ~np.isnan(size)
    return pa.table(
        {
            "rank": np.full(int(keep.sum()), rank, np.int32),
            "start_ns": np.round(start[keep] * 1000).astype(np.int64),
            "end_ns": np.round(end[keep] * 1000).astype(np.int64),
            "queue_size": size[keep].astype(np.int64),
        },
        schema=GET_NEXT_SCHEMA,
    )


def queue_summary(device_queue: pa.Table, get_next: pa.Table, pipeline: pa.Table | None) -> dict[str, Any]:
    """MindInsight's queue summary: batches, empty and full ones, its verdict, the op queues' usage."""
    out: dict[str, Any] = {}
    if device_queue.num_rows:
        size = device_queue.column("size").to_numpy()
        capacity = device_queue.column("capacity").to_numpy()
        out["device_queue"] = {
            "total_batch": int(size.size),
            "empty_batch_count": int((size == 0).sum()),
            "full_batch_count": int((size == capacity).sum()),
        }
    if get_next.num_rows:
        fetched = get_next.column("queue_size").to_numpy()
        out["get_next_queue"] = {
            "total_batch": int(fetched.size),
            "empty_batch_count": int((fetched == 0).sum()),
        }
    if "device_queue" in out:
        queue = out["device_queue"]
        if queue["empty_batch_count"] > queue["total_batch"] * EMPTY_WARNING_SHARE:
            out["verdict"] = "data processing"  # the host pipeline does not keep the device queue fed
        elif out.get("get_next_queue", {}).get("empty_batch_count", 0) > 0:
            out["verdict"] = "data transmission"
    needed = {"op_id", "op_type", "output_queue_usage_rate"}
    if pipeline is not None and pipeline.num_rows and needed <= set(pipeline.column_names):
        usage = numbers_of(pipeline.column("output_queue_usage_rate"))
        out["op_queues"] = [
            {"op_id": int(op_id), "op_type": str(op_type), "usage_rate": float(rate)}
            for op_id, op_type, rate in zip(
                numbers_of(pipeline.column("op_id")),
                pipeline.column("op_type").to_pylist(),
                usage,
                strict=True,
            )
            if not np.isnan(op_id) and not np.isnan(rate)
        ]  # one per pipeline op: a handful
    return out


def summary_text(summary: dict[str, Any]) -> str:
    """The queue summary as one labelled line."""
    parts = []
    if "device_queue" in summary:
        q = summary["device_queue"]
        parts.append(
            f"device queue empty in {q['empty_batch_count']} of {q['total_batch']} batch(es), "
            f"full in {q['full_batch_count']}"
        )
    if "get_next_queue" in summary:
        q = summary["get_next_queue"]
        parts.append(f"GetNext found it empty {q['empty_batch_count']} of {q['total_batch']} time(s)")
    if summary.get("op_queues"):
        usage = ", ".join(f"{q['op_type']} {q['usage_rate'] * 100:.2f}%" for q in summary["op_queues"])
        parts.append(f"op output queue usage: {usage}")
    if "verdict" in summary:
        parts.append(f"MindInsight would point at: {summary['verdict']}")
    return "MindInsight's data queues: " + "; ".join(parts)
