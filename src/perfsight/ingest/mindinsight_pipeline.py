"""The MindData pipeline graph and the host CPU use of a legacy ``profiler/`` folder, read as
MindInsight 2.3.1 reads them.

Per device ``n``:

* ``minddata_pipeline_raw_{n}.csv`` (what MindInsight's op-queue API reads), else
  ``pipeline_profiling_{n}.json`` (what MindSpore wrote it from): one row per pipeline op, its
  ``num_workers``, its parent and children, and its *output queue*: capacity (``length``), the
  sampled sizes (one per ``sample_interval`` ms), their mean and mean / capacity (the usage rate).
  From the JSON an op without metrics (MindSpore's ``EpochCtrlOp``) is left out, as MindSpore left
  it out of the CSV, and a parent that is left out becomes none.  The JSON also gives each op's
  sampled throughput (kept as written: MindSpore does not document its unit).
* ``minddata_cpu_utilization_{n}.json``: the host's CPU use every ``sampling_interval`` ms for the
  whole machine (``device_info``: user, sys, io, idle %, runnable processes, context switches), the
  training process (``process_info``) and each pipeline op (``op_info``), as one long table.

Output: vendor tables ``mindinsight_pipeline_ops`` (:data:`PIPELINE_OPS_SCHEMA`) and
``mindinsight_cpu_utilization`` (:data:`CPU_UTILIZATION_SCHEMA`), which
``perfsight.analysis.minddata`` turns into the data-preparation tables.  A damaged file is a warning
naming it; the rest of the folder still loads.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pyarrow as pa

from perfsight.ingest import ascend_files as files

PIPELINE_OPS_TABLE, CPU_UTILIZATION_TABLE = "mindinsight_pipeline_ops", "mindinsight_cpu_utilization"

PIPELINE_OPS_SCHEMA = pa.schema(
    [
        pa.field("rank", pa.int32(), nullable=False),
        pa.field("op_id", pa.int64(), nullable=False),  # MindData's: 0 feeds training, its children before it
        pa.field("op_type", pa.string(), nullable=False),  # BatchOp, MapOp, ImageFolderOp, ...
        pa.field("num_workers", pa.int32()),
        pa.field("parent_id", pa.int64()),  # null for the op that feeds training
        pa.field("children", pa.list_(pa.int64())),
        pa.field("queue_capacity", pa.int64()),  # the output queue's length
        pa.field("queue_sizes", pa.list_(pa.int64())),  # sampled sizes, in time order
        pa.field("queue_mean", pa.float64()),  # mean sampled size
        pa.field("queue_usage", pa.float64()),  # mean size / capacity (MindInsight's usage rate)
        pa.field("sample_interval_ms", pa.float64()),
        pa.field("throughput", pa.list_(pa.float64())),  # as the JSON writes it (unit undocumented)
    ]
)
"""One row per MindData pipeline op (a handful)."""

CPU_UTILIZATION_SCHEMA = pa.schema(
    [
        pa.field("rank", pa.int32(), nullable=False),
        pa.field("scope", pa.string(), nullable=False),  # "machine" | "process" | "op"
        pa.field("op_id", pa.int64()),  # the pipeline op (scope "op" only)
        pa.field("metric", pa.string(), nullable=False),  # user_utilization, sys_utilization, ...
        pa.field("sample", pa.int32(), nullable=False),  # position in the file's arrays
        pa.field("time_stamp", pa.float64()),  # the sampler's clock as the file writes it (null: none)
        pa.field("value", pa.float64(), nullable=False),  # % for *_utilization, else a count
    ]
)
"""One row per sample of one metric of one scope, in file order."""


def _load_json(path: Path, problems: files.FileProblems) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_bytes())
    except (OSError, ValueError) as error:
        problems.add(path, f"cannot be read as JSON ({str(error).splitlines()[0]})")
        return None
    if not isinstance(data, dict):
        problems.add(path, "is not a JSON object")
        return None
    return data


def _number(value: Any) -> float | None:
    """A finite number, else ``None`` (the files write numbers, text or nothing)."""
    try:
        number = float(str(value).strip())
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) else None


def _int_list(value: Any) -> list[int]:
    """``[1, 2]`` as JSON or as the CSV's text ``"[1, 2]"``; [] for anything else."""
    if isinstance(value, str):
        try:
            value = json.loads(value) if value.strip() else []
        except ValueError:
            return []
    if not isinstance(value, list):
        return []
    return [int(v) for v in value if _number(v) is not None]


def _op_row(rank: int, op: dict[str, Any]) -> dict[str, Any]:
    sizes = _int_list(op.get("queue_sizes"))
    capacity = _number(op.get("queue_capacity"))
    mean = _number(op.get("queue_mean"))
    if mean is None and sizes:
        mean = sum(sizes) / len(sizes)
    usage = _number(op.get("queue_usage"))
    if usage is None and mean is not None and capacity:
        usage = mean / capacity
    parent = _number(op.get("parent_id"))
    workers = _number(op.get("num_workers"))
    return {
        "rank": rank,
        "op_id": int(op["op_id"]),
        "op_type": str(op.get("op_type") or "?"),
        "num_workers": None if workers is None else int(workers),
        "parent_id": None if parent is None else int(parent),
        "children": _int_list(op.get("children")),
        "queue_capacity": None if capacity is None else int(capacity),
        "queue_sizes": sizes,
        "queue_mean": mean,
        "queue_usage": usage,
        "sample_interval_ms": _number(op.get("sample_interval")),
        "throughput": [float(v) for v in op.get("throughput") or [] if _number(v) is not None],
    }


def _ops_from_csv(table: pa.Table) -> list[dict[str, Any]]:
    """The CSV's rows (a handful), in MindInsight's reading of its columns."""
    ops = []
    for row in table.to_pylist():
        if _number(row.get("op_id")) is None:
            continue
        ops.append(
            {
                "op_id": int(_number(row["op_id"]) or 0),
                "op_type": row.get("op_type"),
                "num_workers": row.get("num_workers"),
                "parent_id": row.get("parent_id"),
                "children": row.get("children_id"),
                "queue_capacity": row.get("output_queue_length"),
                "queue_sizes": row.get("output_queue_size"),
                "queue_mean": row.get("output_queue_average_size"),
                "queue_usage": row.get("output_queue_usage_rate"),
                "sample_interval": row.get("sample_interval"),
            }
        )
    return ops


def _ops_from_json(data: dict[str, Any]) -> list[dict[str, Any]]:
    """The JSON's ops with metrics; parents left out become none (as in MindSpore's CSV)."""
    ops = []
    for op in data.get("op_info") or []:
        if not isinstance(op, dict) or _number(op.get("op_id")) is None:
            continue
        queue = ((op.get("metrics") or {}).get("output_queue")) or None
        if queue is None:
            continue
        ops.append(
            {
                "op_id": int(_number(op["op_id"]) or 0),
                "op_type": op.get("op_type"),
                "num_workers": op.get("num_workers"),
                "children": op.get("children") or [],
                "queue_capacity": queue.get("length"),
                "queue_sizes": queue.get("size"),
                "throughput": queue.get("throughput"),
                "sample_interval": data.get("sampling_interval"),
            }
        )
    kept = {op["op_id"] for op in ops}
    parent_of = {child: op["op_id"] for op in ops for child in _int_list(op["children"])}
    for op in ops:
        op["parent_id"] = parent_of.get(op["op_id"]) if op["op_id"] in kept else None
    return ops


def read_pipeline_ops(
    folder: Path, index: int, rank: int, csv_table: pa.Table | None, problems: files.FileProblems
) -> pa.Table:
    """The pipeline's ops (:data:`PIPELINE_OPS_SCHEMA`): the CSV's rows (``csv_table``, as the legacy
    reader read it) with the JSON's sizes and throughput where the CSV lacks them; empty when
    neither file is there."""
    path = folder / f"pipeline_profiling_{index}.json"
    from_json = []
    if path.is_file():
        data = _load_json(path, problems)
        from_json = _ops_from_json(data) if data is not None else []
    ops = _ops_from_csv(csv_table) if csv_table is not None and csv_table.num_rows else []
    if ops:
        json_by_id = {op["op_id"]: op for op in from_json}
        for op in ops:
            extra = json_by_id.get(op["op_id"], {})
            if not _int_list(op.get("queue_sizes")):
                op["queue_sizes"] = extra.get("queue_sizes")
            op["throughput"] = extra.get("throughput")
    else:
        ops = from_json
    return pa.Table.from_pylist([_op_row(rank, op) for op in ops], schema=PIPELINE_OPS_SCHEMA)


CPU_SCOPES = {"device_info": "machine", "process_info": "process"}


def read_cpu_utilization(folder: Path, index: int, rank: int, problems: files.FileProblems) -> pa.Table:
    """The host's CPU use (:data:`CPU_UTILIZATION_SCHEMA`); empty when the file is not there."""
    path = folder / f"minddata_cpu_utilization_{index}.json"
    if not path.is_file():
        return CPU_UTILIZATION_SCHEMA.empty_table()
    data = _load_json(path, problems)
    if data is None:
        return CPU_UTILIZATION_SCHEMA.empty_table()
    stamps = [_number(v) for v in data.get("time_stamp") or []]
    rows: list[dict[str, Any]] = []
    skipped = 0

    def add(scope: str, op_id: int | None, metrics: Any) -> None:
        nonlocal skipped
        for metric, values in (metrics or {}).items() if isinstance(metrics, dict) else ():
            for i, value in enumerate(values if isinstance(values, list) else []):
                number = _number(value)
                if number is None:
                    skipped += 1
                    continue
                stamp = stamps[i] if i < len(stamps) else None
                rows.append(
                    {"rank": rank, "scope": scope, "op_id": op_id, "metric": str(metric), "sample": i,
                     "time_stamp": stamp, "value": number}
                )  # fmt: skip

    for key, scope in CPU_SCOPES.items():
        add(scope, None, data.get(key))
    for op in data.get("op_info") or []:
        if isinstance(op, dict) and _number(op.get("op_id")) is not None:
            add("op", int(_number(op["op_id"]) or 0), op.get("metrics"))
    if skipped:
        problems.add(path, f"{skipped} value(s) that are not numbers skipped")
    if not rows:
        problems.add(path, "holds no utilisation samples")
    return pa.Table.from_pylist(rows, schema=CPU_UTILIZATION_SCHEMA)
