"""The per-op communication definitions, on hand-made ops whose numbers follow from arithmetic."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa

from perfsight.analysis import communication as comm
from perfsight.model import COMM_SCHEMA, COMM_TASK_SCHEMA, NO_ID, conform


def _comm(*ops: dict[str, Any]) -> pa.Table:
    rows = [
        {"rank": 0, "slice": i, "is_device": True, "collective": "all_reduce", "step": 1, "group": "g", **op}
        for i, op in enumerate(ops)
    ]
    return conform(pa.Table.from_pylist(rows), COMM_SCHEMA)


def _task(op: int, plane: int, task_type: str, start: int, dur: int, **extra: Any) -> dict[str, Any]:
    return {"rank": 0, "op": op, "slice": NO_ID, "plane": plane, "task_type": task_type,
            "start_ns": start, "dur_ns": dur, "transport": "SDMA", "bytes": 0, **extra}  # fmt: skip


def _tasks(*rows: dict[str, Any]) -> pa.Table:
    return conform(pa.Table.from_pylist(list(rows)), COMM_TASK_SCHEMA)


def _two_plane_all_reduce() -> tuple[pa.Table, pa.Table]:
    """One all-reduce [0, 1000): plane 0 only copies locally, plane 1 is the main plane."""
    ops = _comm({"name": "hcom_allReduce_1", "start_ns": 0, "dur_ns": 1000})
    tasks = _tasks(
        _task(0, 0, "Memcpy", 0, 50, link="ON_CHIP", bytes=4_000_000),  # local copy: not traffic
        _task(0, 1, "Notify_Wait", 10, 300),  # before any transit: synchronization
        _task(0, 1, "Reduce_Inline", 320, 100, link="HCCS", bytes=2_000_000),
        _task(0, 1, "Notify_Wait", 430, 40),  # after transit: wait, not synchronization
        _task(0, 1, "Memcpy", 480, 60, link="HCCS", bytes=1_000_000),
        _task(0, 2, "Memcpy", 480, 200, link="PCIE", bytes=40_000_000),  # other plane: bandwidth only
        _task(0, 2, "Notify_Wait", 700, 250),  # other plane's waits do not count
    )
    return ops, tasks


def test_times_come_from_the_main_plane_and_waits_before_the_first_transfer_are_synchronization() -> None:
    ops, tasks = _two_plane_all_reduce()
    row = comm.op_times(ops, tasks).to_pylist()[0]
    assert row["basis"] == "tasks"
    assert row["elapse_ns"] == 1000
    assert row["transit_ns"] == 160  # 100 + 60 on plane 1
    assert row["wait_ns"] == 340  # 300 + 40
    assert row["synchronization_ns"] == 300
    assert row["idle_ns"] == 1000 - 160 - 340
    assert row["wait_ratio"] == 340 / 500 and row["synchronization_ratio"] == 300 / 460


def test_bandwidth_counts_every_plane_per_link_and_sdma_sums_hccs_pcie_sio() -> None:
    ops, tasks = _two_plane_all_reduce()
    links = {r["link"]: r for r in comm.link_bandwidth(ops, tasks).to_pylist()}
    assert list(links) == list(comm.LINK_TYPES)
    assert (links["HCCS"]["bytes"], links["HCCS"]["transit_ns"]) == (3_000_000, 160)
    assert links["HCCS"]["bandwidth_gb_s"] == 3_000_000 / 160  # bytes per ns == GB/s
    assert (links["PCIE"]["bytes"], links["PCIE"]["transit_ns"]) == (40_000_000, 200)
    assert links["PCIE"]["large_packet_ratio"] == 1.0  # 40 MB > 32 MB
    assert links["HCCS"]["large_packet_ratio"] == 0.0
    assert (links["SDMA"]["bytes"], links["SDMA"]["transit_ns"]) == (43_000_000, 360)
    assert links["SDMA"]["large_packet_ratio"] == 0.0  # Ascend leaves it 0 for SDMA
    assert links["RDMA"]["bytes"] == 0 and links["RDMA"]["bandwidth_gb_s"] == 0.0
    sizes = {(s["link"], s["packet_bytes"]): (s["count"], s["transit_ns"])
             for s in comm.size_distribution(ops, tasks).to_pylist()}  # fmt: skip
    assert sizes == {
        ("HCCS", 2_000_000): (1, 100),
        ("HCCS", 1_000_000): (1, 60),
        ("PCIE", 40_000_000): (1, 200),
    }


def test_an_rdma_transfer_spans_its_tasks_and_its_notify_wait_is_not_waiting() -> None:
    ops = _comm({"name": "hcom_allReduce_2", "start_ns": 0, "dur_ns": 500})
    rdma = {"transport": "RDMA", "link": "ROCE"}
    tasks = _tasks(
        _task(0, 0, "Notify_Wait", 0, 20),
        _task(0, 0, "RDMASend", 30, 10, bytes=1_000_000, **rdma),
        _task(0, 0, "RDMASend", 45, 5, **rdma),
        _task(0, 0, "Notify_Wait", 55, 100),
        _task(0, 0, "RDMASend", 160, 5, **rdma),
        _task(0, 0, "Notify_Wait", 170, 30),  # the transfer (5 tasks) ends here: 30 .. 200
        _task(0, 0, "Notify_Wait", 210, 40),
    )
    row = comm.op_times(ops, tasks).to_pylist()[0]
    assert (row["transit_ns"], row["wait_ns"], row["synchronization_ns"]) == (170, 60, 20)
    links = {r["link"]: r for r in comm.link_bandwidth(ops, tasks).to_pylist()}
    assert (links["RDMA"]["bytes"], links["RDMA"]["transit_ns"], links["RDMA"]["packets"]) == (
        1_000_000,
        170,
        1,
    )
    assert links["RDMA"]["large_packet_ratio"] == 1.0  # 1 MB > 0.5 MB


def test_without_tasks_the_last_arrival_splits_an_op_into_waiting_and_transit() -> None:
    ops = _comm(
        {"name": "nccl:all_reduce", "start_ns": 100, "dur_ns": 400},
        {"name": "nccl:all_reduce", "start_ns": 600, "dur_ns": 100},
        {"name": "nccl:broadcast", "start_ns": 800, "dur_ns": 50},
    )
    arrivals = pa.table(
        {"op": pa.array([0, 1], pa.int64()), "last_arrival_ns": pa.array([350, 900], pa.int64())}
    )
    rows = comm.op_times(ops, None, arrivals).to_pylist()
    assert [r["basis"] for r in rows] == ["arrivals", "arrivals", "elapse"]
    assert (rows[0]["synchronization_ns"], rows[0]["wait_ns"], rows[0]["transit_ns"]) == (250, 250, 150)
    assert (rows[1]["wait_ns"], rows[1]["transit_ns"]) == (100, 0)  # clipped to the op's own length
    assert (rows[2]["wait_ns"], rows[2]["transit_ns"], rows[2]["idle_ns"]) == (0, 50, 0)


def test_primary_ops_prefers_device_rows_and_reindexes_tasks() -> None:
    ops = _comm(
        {"is_device": False, "start_ns": 0, "dur_ns": 10},
        {"is_device": True, "start_ns": 5, "dur_ns": 10},
    )
    tasks = _tasks(_task(1, 0, "Notify_Wait", 5, 3))
    chosen, moved = comm.primary_ops(ops, tasks)
    assert chosen.column("is_device").to_pylist() == [True]
    assert moved is not None and moved.column("op").to_pylist() == [0]
    assert comm.op_times(chosen, moved).column("wait_ns").to_pylist() == [3]


def test_step_totals_add_ops_and_recompute_ratios() -> None:
    ops, tasks = _two_plane_all_reduce()
    times = comm.op_times(ops, tasks)
    total = comm.step_times(pa.concat_tables([times, times])).to_pylist()
    assert len(total) == 1 and total[0]["transit_ns"] == 320 and total[0]["wait_ratio"] == 680 / 1000
    links = comm.step_links(comm.link_bandwidth(ops, tasks)).to_pylist()
    assert {r["link"]: r["bytes"] for r in links}["SDMA"] == 43_000_000


def test_empty_inputs_give_empty_tables_with_the_documented_columns() -> None:
    empty = COMM_SCHEMA.empty_table()
    assert comm.op_times(empty).schema == comm.OP_TIME_SCHEMA
    assert comm.link_bandwidth(empty).schema == comm.LINK_SCHEMA
    assert comm.size_distribution(empty).schema == comm.SIZE_SCHEMA
    assert comm.step_times(comm.op_times(empty)).schema == comm.STEP_TIME_SCHEMA


def test_a_real_nccl_rank_is_analysed_on_its_kernels_with_elapse_as_transit(nccl_trace_path: Path) -> None:
    from perfsight.ingest import read_trace

    trace = read_trace(nccl_trace_path)
    ops, tasks = comm.primary_ops(trace.comm, trace.comm_tasks)
    assert ops.num_rows and all(ops.column("is_device").to_pylist())  # the NCCL kernels, not host calls
    times = comm.op_times(ops, tasks)
    assert set(times.column("basis").to_pylist()) == {"elapse"}
    assert times.column("transit_ns").to_pylist() == ops.column("dur_ns").to_pylist()
    assert sum(comm.link_bandwidth(ops, tasks).column("bytes").to_pylist()) == 0  # no per-link tasks


def test_tasks_that_do_not_say_what_they_are_leave_the_op_split_as_one_without_tasks() -> None:
    """A level0 db export lists HCCL's tasks with type, transport and link all ``N/A``: they cannot
    show transit or waiting, so the op keeps transit = elapse rather than being read as all idle."""
    ops = _comm({"name": "hcom_allReduce_3", "start_ns": 0, "dur_ns": 800})
    unknown = {"task_type": "N/A", "transport": "N/A", "link": "N/A"}
    tasks = _tasks(
        {**_task(0, NO_ID, "N/A", 10, 300), **unknown}, {**_task(0, NO_ID, "N/A", 400, 50), **unknown}
    )
    row = comm.op_times(ops, tasks).to_pylist()[0]
    assert row["basis"] == "elapse"
    assert (row["transit_ns"], row["wait_ns"], row["idle_ns"]) == (800, 0, 0)
