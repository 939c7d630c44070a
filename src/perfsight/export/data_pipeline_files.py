"""The data-preparation files a MindSpore user knows, from the ``data_pipeline`` analysis tables:
``dataset.csv`` (per stage), ``data_pipeline_raw_{rank}.csv`` (MindData's per-op rows with their
output queues) and ``minddata_pipeline_summary_{rank}.json`` (per-op lists, the queues and the
judgement).  Written only for a rank with a data-loader capture.

Every number comes from ``perfsight.analysis.data_pipeline``; this module only picks, converts
units (ns -> us, ratios -> %) and formats.  Ops are numbered as MindData numbers them: op 0 is the
last stage (the one feeding training: ``to_device`` when the loop copied its batches to the
device, a ``DeviceCopy`` op without an output queue), its child op 1 the stage before, down to the
source.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import orjson
import pyarrow as pa
import pyarrow.compute as pc

from perfsight.analysis.data_pipeline import PIN, TO_DEVICE
from perfsight.export.mindspore_csv import write_table_csv
from perfsight.units import ns_to_ms, ns_to_us, ratio_to_pct

DATASET_CSV = "dataset.csv"


def raw_csv_name(rank: int) -> str:
    return f"data_pipeline_raw_{rank}.csv"


def summary_json_name(rank: int) -> str:
    return f"minddata_pipeline_summary_{rank}.json"


def _custom_info(stages: pa.Table) -> pa.Array:
    parts = [
        pc.binary_join_element_wise("parallelism=", pc.cast(stages.column("parallelism"), pa.string()), ""),
        pc.binary_join_element_wise(
            "share=", pc.cast(ratio_to_pct(stages.column("share")), pa.string()), "%", ""
        ),
        pc.if_else(stages.column("bottleneck"), "bottleneck", ""),
    ]
    return pc.utf8_rtrim(pc.binary_join_element_wise(*parts, "; "), characters="; ")


def write_dataset_csv(folder: Path, stages: pa.Table) -> Path:
    """``dataset.csv``: one row per stage, as Ascend's (Operation, Stage, Occurrences, Avg. time(us))."""
    table = pa.table(
        {
            "Operation": stages.column("stage"),
            "Stage": stages.column("op_type"),
            "Occurrences": stages.column("batches"),
            "Avg. time(us)": ns_to_us(stages.column("per_batch_ns")),
            "Custom Info": _custom_info(stages),
        }
    )
    return write_table_csv(folder / DATASET_CSV, table)


def _op_rows(stages: pa.Table, summary: dict) -> list[dict]:
    """One dict per op, op 0 first (the last stage), with the queue it writes into when known."""
    rows = list(reversed(stages.to_pylist()))  # a handful of stages
    capacity = summary.get("host_queue_capacity") or 0
    worker_last = next((i for i, r in enumerate(rows) if r["runs_in"] == "workers"), None)
    last_loader_op = 1 if rows and rows[0]["stage"] == TO_DEVICE else 0  # the copy feeds training, no queue
    ops = []
    for op_id, row in enumerate(rows):
        queue: dict = {}
        if row["stage"] == PIN:
            queue = {"average": summary.get("device_queue_mean"), "length": capacity}
        elif op_id == worker_last or (worker_last is None and op_id == last_loader_op):
            queue = {"average": summary.get("host_queue_mean"), "length": capacity}
        average, length = queue.get("average"), queue.get("length")
        ops.append(
            {
                "op_id": op_id,
                "op_type": row["op_type"],
                "stage": row["stage"],
                "num_workers": row["parallelism"],
                "output_queue_average_size": average,
                "output_queue_length": length if queue else None,
                "output_queue_usage_rate": (average / length) if average is not None and length else None,
                "parent_id": op_id - 1,
                "children_id": [op_id + 1] if op_id + 1 < len(rows) else [],
                "per_batch_time_us": row["per_batch_ns"] / 1000,
                "throughput_per_s": row["throughput_per_s"],
                "bottleneck": row["bottleneck"],
            }
        )
    return ops


def write_raw_csv(folder: Path, rank: int, ops: list[dict]) -> Path:
    """``data_pipeline_raw_{rank}.csv``: MindData's per-op columns, then the stage's time."""
    table = pa.table(
        {
            "op_id": [o["op_id"] for o in ops],
            "op_type": [o["op_type"] for o in ops],
            "num_workers": [o["num_workers"] for o in ops],
            "output_queue_average_size": [o["output_queue_average_size"] for o in ops],
            "output_queue_length": [o["output_queue_length"] for o in ops],
            "output_queue_usage_rate": [o["output_queue_usage_rate"] for o in ops],
            "parent_id": [o["parent_id"] for o in ops],
            "children_id": [",".join(map(str, o["children_id"])) for o in ops],
            "stage": [o["stage"] for o in ops],
            "per_batch_time(us)": [o["per_batch_time_us"] for o in ops],
            "throughput(batches/s)": [o["throughput_per_s"] for o in ops],
        }
    )
    return write_table_csv(folder / raw_csv_name(rank), table)


def write_summary_json(folder: Path, rank: int, ops: list[dict], summary: dict) -> Path:
    """``minddata_pipeline_summary_{rank}.json``: MindData's per-op lists, the queues, the verdict."""

    def pct(ratio: float | None) -> float | None:
        return None if ratio is None else round(ratio * 100, 3)

    document = {
        "pipeline_ops": [f"{o['stage']}(id={o['op_id']})" for o in ops],
        "num_workers": [o["num_workers"] for o in ops],
        "queue_average_size": [o["output_queue_average_size"] for o in ops],
        "queue_utilization_pct": [pct(o["output_queue_usage_rate"]) for o in ops],
        "children_ids": [o["children_id"] for o in ops],
        "parent_id": [o["parent_id"] for o in ops],
        "per_batch_time": [o["per_batch_time_us"] / 1000 for o in ops],  # ms, as MindData
        "per_pipeline_time": ns_to_ms(summary["loop_ns"]) / max(summary["requests"], 1),
        "host_queue": {
            "capacity": summary["host_queue_capacity"],
            "average_size": summary["host_queue_mean"],
            "utilization_pct": pct(summary["host_queue_usage"]),
            "empty_count": summary["host_queue_empty"],
            "empty_freq_pct": pct(summary["host_queue_empty_ratio"]),
            "full_count": summary["host_queue_full"],
        },
        "device_queue": {
            "average_size": summary["device_queue_mean"],
            "empty_count": summary["device_queue_empty"],
            "empty_freq_pct": pct(summary["device_queue_empty_ratio"]),
        },
        "wait_time_ms": ns_to_ms(summary["wait_ns"]),
        "wait_share_pct": pct(summary["wait_share"]),
        "bottleneck": {
            "verdict": summary["verdict"],
            "stage": summary["bottleneck_stage"],
            "reason": summary["reason"],
        },
    }
    path = folder / summary_json_name(rank)
    path.write_bytes(orjson.dumps(document, option=orjson.OPT_INDENT_2 | orjson.OPT_SERIALIZE_NUMPY))
    return path


def write_all(folder: str | Path, tables: Mapping[str, pa.Table]) -> list[Path]:
    """The three files, when the rank has a data-loader capture (else nothing)."""
    stages, summary = tables.get("data_stages"), tables.get("data_pipeline_summary")
    if stages is None or summary is None or stages.num_rows == 0 or summary.num_rows == 0:
        return []
    if stages.column("per_batch_ns").null_count:  # MindData read from MindSpore's files: they are there
        return []
    folder = Path(folder)
    facts = summary.to_pylist()[0]
    ops = _op_rows(stages, facts)
    rank = int(facts["rank"])
    return [
        write_dataset_csv(folder, stages),
        write_raw_csv(folder, rank, ops),
        write_summary_json(folder, rank, ops, facts),
    ]
