"""The communication analyses are tables of the run: ``perfsight.load`` returns them (from the cache
of an analysed folder, or analysed in memory), and ``communication.json`` only formats them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import perfsight
from perfsight.store import cache
from shared_data import DATA, require

LEVEL1 = DATA / "ascend_pt" / "level1"
TABLES = (
    "communication_ops",
    "communication_links",
    "communication_sizes",
    "communication_steps",
    "communication_step_links",
    "communication_step_sizes",
)
TIMES = {
    "Elapse Time(ms)": "elapse_ns",
    "Transit Time(ms)": "transit_ns",
    "Wait Time(ms)": "wait_ns",
    "Synchronization Time(ms)": "synchronization_ns",
    "Idle Time(ms)": "idle_ns",
}


def _kind(row: dict) -> str:
    return "p2p" if row["is_p2p"] else "collective"


def _assert_times(info: dict, row: dict) -> None:
    for field, column in TIMES.items():
        assert info[field] == row[column] / 1e6, (field, info[field], row[column])
    assert info["Wait Time Ratio"] == round(row["wait_ratio"], 4)
    assert info["Synchronization Time Ratio"] == round(row["synchronization_ratio"], 4)


@pytest.fixture(scope="module")
def analysed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("level1")
    perfsight.analyse(require(LEVEL1), out)
    return out


def test_load_returns_per_op_and_per_link_tables_equal_to_communication_json(analysed: Path) -> None:
    loaded = perfsight.load(analysed)
    assert set(TABLES) <= set(loaded.table_names)
    ops = loaded.table("communication_ops").to_pylist()
    links = loaded.table("communication_links").to_pylist()
    assert {r["rank"] for r in ops} == {0, 1} and len(ops) == 8  # 4 all-reduces on each rank
    for rank in (0, 1):
        written = json.loads(
            (analysed / f"rank{rank}" / "PROFILER_OUTPUT" / "communication.json").read_text()
        )
        for row in (r for r in ops if r["rank"] == rank):
            entry = written[f"step{row['step']}"][_kind(row)][f"{row['name']}@{row['group']}"]
            info = entry["Communication Time Info"]
            assert info["Start Timestamp(us)"] == row["start_ns"] / 1000
            _assert_times(info, row)
            assert row["basis"] == "tasks"  # Ascend records HCCL's tasks: the split is the rank's own
            for link in (r for r in links if r["rank"] == rank and r["op"] == row["op"]):
                shown = entry["Communication Bandwidth Info"][link["link"]]
                assert shown["Transit Size(MB)"] == link["bytes"] / 1e6
                assert shown["Transit Time(ms)"] == link["transit_ns"] / 1e6
                assert shown["Bandwidth(GB/s)"] == round(link["bandwidth_gb_s"], 4)
                assert shown["Large Packet Ratio"] == round(link["large_packet_ratio"], 4)
        for total in (r for r in loaded.table("communication_steps").to_pylist() if r["rank"] == rank):
            shown = written[f"step{total['step']}"][_kind(total)]["Total Op Info"]
            _assert_times(shown["Communication Time Info"], total)
    assert sum(r["bytes"] for r in links if r["link"] == "HCCS") > 0  # real traffic was compared


def test_the_tables_are_cached_with_the_other_analyses(analysed: Path) -> None:
    saved = cache.load_tables(analysed / "rank0" / "cache")
    assert set(TABLES) <= set(saved)
    assert saved["communication_ops"].num_rows == 4


def test_a_trace_loaded_without_a_cache_has_the_same_tables(analysed: Path) -> None:
    trace = require(LEVEL1 / "rank0_ascend_pt" / "ASCEND_PROFILER_OUTPUT" / "trace_view.json")
    fresh = perfsight.load(trace)
    cached = perfsight.load(analysed / "rank0")
    for name in TABLES:
        assert fresh.table(name).to_pylist() == cached.table(name).to_pylist(), name


def test_send_recv_is_point_to_point_in_the_tables_and_in_communication_json(tmp_path: Path) -> None:
    """A NCCL ``SendRecv`` kernel (``batch_isend_irecv``) is filed under ``p2p``, as Ascend files
    ``hcom_batchSendRecv``, and the table says so."""
    trace = require(DATA / "kineto" / "two_ranks_ws128" / "sampled_rank-0.json.gz")
    result = perfsight.analyse(trace, tmp_path)
    ops = result.table("communication_ops").to_pylist()
    send_recv = [r for r in ops if r["collective"] == "send_recv"]
    assert send_recv and all(r["is_p2p"] for r in send_recv)
    assert not any(r["is_p2p"] for r in ops if r["collective"] != "send_recv")
    out = result.ranks[0].output_dir
    assert out is not None
    written = json.loads((out / "communication.json").read_text())
    for step in {r["step"] for r in send_recv}:
        assert f"{send_recv[0]['name']}@" in written[f"step{step}"]["p2p"]


def test_the_db_export_holds_the_communication_tables(tmp_path: Path) -> None:
    import sqlite3

    rank = require(LEVEL1 / "rank0_ascend_pt")
    result = perfsight.analyse(rank, tmp_path, export_types=("db",))
    out = result.ranks[0].output_dir
    assert out is not None
    with sqlite3.connect(out / "perfsight_0.db") as db:
        rows = db.execute('SELECT "group", is_p2p, transit_ns FROM communication_ops ORDER BY op').fetchall()
    ops = result.table("communication_ops")
    assert rows == list(
        zip(
            ops.column("group").to_pylist(),
            [int(p) for p in ops.column("is_p2p").to_pylist()],
            ops.column("transit_ns").to_pylist(),
            strict=True,
        )
    )


def test_the_job_per_op_table_splits_an_ascend_op_by_its_tasks_as_the_vendor_does() -> None:
    """cluster_communication_ops.csv and communication.json share one definition: an op whose rank
    recorded HCCL's tasks is split by them (not by when the last rank arrived)."""
    from perfsight.cluster.job import analyse_job

    result = analyse_job(require(LEVEL1), executor="serial", per_rank_outputs=False)
    ops = result.matched.ops
    assert len(ops) == 8 and set(ops["basis"]) == {"tasks"}
    for rank in (0, 1):
        vendor = LEVEL1 / f"rank{rank}_ascend_pt/ASCEND_PROFILER_OUTPUT/communication.json"
        golden = [
            info["Communication Time Info"]
            for step in json.loads(vendor.read_text()).values()
            for name, info in step["collective"].items()
            if name != "Total Op Info"
        ]
        mine = ops.loc[ops["rank"] == rank].sort_values("start_ns")
        assert len(mine) == len(golden)
        for want, (_, row) in zip(golden, mine.iterrows(), strict=True):
            for field, column in TIMES.items():  # 2 ns: Ascend keeps fractions of a nanosecond
                assert abs(row[column] / 1e6 - want[field]) <= 2e-6, (rank, field, row[column], want[field])


def test_send_recv_exchanges_of_a_job_are_point_to_point_and_not_collectives_for_lateness() -> None:
    """The model's one ``is_p2p`` holds across the job: NCCL ``SendRecv`` kernels are matched (by
    order, having no single direction) but never count as collectives for slow-rank lateness."""
    from perfsight.cluster.job import analyse_job

    job = require(DATA / "kineto" / "two_ranks_ws128")
    result = analyse_job(job, executor="serial", per_rank_outputs=False)
    ops, instances = result.matched.ops, result.matched.instances
    exchanges = ops.loc[ops["collective"] == "send_recv"]
    assert len(exchanges) == 20 and exchanges["is_p2p"].all()
    assert instances.loc[instances["collective"] == "send_recv", "is_p2p"].all()
    collectives = instances.loc[instances["complete"] & ~instances["is_p2p"]]
    assert set(collectives["collective"]) == {"all_to_all", "all_reduce", "all_gather"}
    lateness = result.slow_ranks.table.set_index("rank")["instances"]
    assert lateness.to_dict() == {0: len(collectives), 1: len(collectives)}


def test_written_bandwidths_and_ratios_are_ascends_to_1e_4_as_the_docs_say(analysed: Path) -> None:
    """docs/OUTPUTS.md: every bandwidth and ratio within 1e-4 of Ascend's (both round with Python's
    ``round(x, 4)``; a value whose exact ratio straddles a rounding boundary can differ in the 4th
    decimal because the trace model keeps whole nanoseconds and Ascend fractions of one)."""
    compared, equal = 0, 0

    def walk(mine: object, golden: object, key: str) -> None:
        nonlocal compared, equal
        if isinstance(golden, dict):
            assert isinstance(mine, dict) and mine.keys() == golden.keys()
            for k in golden:
                walk(mine[k], golden[k], k)
        elif "Bandwidth" in key or "Ratio" in key:
            assert isinstance(mine, float) and isinstance(golden, (int, float))
            assert abs(mine - golden) <= 1e-4 + 1e-12, (key, mine, golden)
            compared += 1
            equal += mine == golden

    for rank in (0, 1):
        golden = LEVEL1 / f"rank{rank}_ascend_pt/ASCEND_PROFILER_OUTPUT/communication.json"
        mine = analysed / f"rank{rank}/PROFILER_OUTPUT/communication.json"
        walk(json.loads(mine.read_text()), json.loads(golden.read_text()), "")
    assert compared == 100 and equal >= 99
