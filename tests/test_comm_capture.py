"""perfsight's communication capture in a real 3-rank gloo job (tests/_comm_job.py).

What a user checks: every op appears on every rank that took part, with the same sequence number,
the byte counts of the tensors passed, the right peers, the group's ranks, the wait of an async
op, DDP's gradient all-reduces, and rows that line up with the Kineto trace of the same run.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pyarrow.parquet as pq
import pytest

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")
if not dist.is_available():
    pytest.skip("torch built without distributed", allow_module_level=True)

from perfsight.collect.comm_capture import COMM_CAPTURE_SCHEMA, CommCapture  # noqa: E402
from perfsight.ingest.kineto import read_kineto  # noqa: E402
from perfsight.ingest.sidecar import merge_sidecars  # noqa: E402

WORLD = 3
JOB = Path(__file__).with_name("_comm_job.py")
F32 = 4


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def run_job(out: Path, world: int) -> None:
    """Start ``world`` ranks of tests/_comm_job.py and wait for all of them (with a deadline)."""
    port = free_port()
    env = {**os.environ, "TORCH_FR_BUFFER_SIZE": "2000", "OMP_NUM_THREADS": "1"}
    procs = [
        subprocess.Popen(
            [sys.executable, str(JOB), str(rank), str(world), str(port), str(out)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        for rank in range(world)
    ]
    logs = []
    try:
        for proc in procs:
            logs.append(proc.communicate(timeout=150)[0].decode(errors="replace"))
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
    assert all(p.returncode == 0 for p in procs), "\n".join(log[-3000:] for log in logs)


@pytest.fixture(scope="module")
def job(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("comm_job")
    run_job(out, WORLD)
    return out


def rows(job: Path, rank: int, source: str = "python") -> list[dict]:
    table = pq.read_table(job / f"comm_{rank}.parquet")
    assert table.schema.equals(COMM_CAPTURE_SCHEMA, check_metadata=False)
    return [r for r in table.to_pylist() if r["source"] == source]


def world_collectives(job: Path, rank: int) -> list[tuple]:
    return [
        (r["collective"], r["api"], r["seq"], r["in_bytes"], r["out_bytes"], r["dtype"])
        for r in rows(job, rank)
        if r["collective"] not in ("send", "recv") and r["group_ranks"] == json.dumps(list(range(WORLD)))
    ]


def test_every_collective_appears_on_every_rank_with_the_same_sequence_number(job: Path) -> None:
    per_rank = [world_collectives(job, rank) for rank in range(WORLD)]
    assert per_rank[0] == per_rank[1] == per_rank[2]
    names = [c[0] for c in per_rank[0]]
    for op in ("all_reduce", "broadcast", "reduce", "all_gather", "reduce_scatter", "all_to_all", "barrier"):
        assert op in names, op
    seqs = [c[2] for c in per_rank[0]]
    assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs), seqs


def test_byte_counts_are_the_sizes_of_the_tensors_passed(job: Path) -> None:
    got = [(c[0], c[3], c[4], c[5]) for c in world_collectives(job, 0)]
    w = WORLD
    expected = [
        ("all_reduce", 10 * F32, 10 * F32, "float32"),
        ("broadcast", 10 * F32, 10 * F32, "float32"),
        ("reduce", 10 * F32, 10 * F32, "float32"),
        ("all_gather", 10 * F32, 10 * w * F32, "float32"),  # list version
        ("all_gather", 10 * F32, 10 * w * F32, "float32"),  # into one tensor
        ("reduce_scatter", 5 * w * F32, 5 * F32, "float32"),
        ("reduce_scatter", 5 * w * F32, 5 * F32, "float32"),
        ("all_to_all", 3 * w * 8, 3 * w * 8, "int64"),
        ("all_to_all", 4 * w * F32, 4 * w * F32, "float32"),
        ("barrier", 0, 0, None),
        ("all_reduce", 12 * F32, 12 * F32, "float32"),  # the async one
    ]
    assert got == expected


def test_point_to_point_rows_name_their_peer_and_pair_up_across_ranks(job: Path) -> None:
    sends = Counter()
    recvs = Counter()
    for rank in range(WORLD):
        for r in rows(job, rank):
            if r["collective"] == "send":
                sends[(rank, r["peer"], r["seq"], r["in_bytes"])] += 1
            elif r["collective"] == "recv":
                recvs[(r["peer"], rank, r["seq"], r["out_bytes"])] += 1
    assert sends == recvs
    # rank 0 -> 1 twice (send, then the ring), 1 -> 0 once (isend), and the ring's 1 -> 2, 2 -> 0
    assert sorted(sends) == [
        (0, 1, 1, 7 * 8),
        (0, 1, 2, 6 * F32),
        (1, 0, 1, 9 * F32),
        (1, 2, 1, 6 * F32),
        (2, 0, 1, 6 * F32),
    ]


def test_sub_group_ops_carry_the_group_ranks_and_only_its_members_see_them(job: Path) -> None:
    sub = [[r for r in rows(job, rank) if r["group_ranks"] == "[0, 1]"] for rank in range(WORLD)]
    assert sub[2] == []
    assert [(r["collective"], r["seq"], r["in_bytes"]) for r in sub[0]] == [("all_reduce", 1, 11 * F32)]
    assert [(r["group"], r["seq"]) for r in sub[0]] == [(r["group"], r["seq"]) for r in sub[1]]


def test_async_op_records_the_time_rank_zero_waited_for_the_slow_ranks(job: Path) -> None:
    last = [r for r in rows(job, 0) if r["collective"] == "all_reduce" and r["in_bytes"] == 12 * F32][0]
    waited = last["wait_end_ns"] - last["wait_start_ns"]
    assert waited > 0.5 * 0.2e9, waited  # the other ranks slept 0.2 s before joining
    assert last["end_ns"] == last["wait_end_ns"] >= last["issue_end_ns"] >= last["start_ns"]
    fast = [r for r in rows(job, 1) if r["collective"] == "all_reduce" and r["in_bytes"] == 12 * F32][0]
    assert fast["wait_end_ns"] - fast["wait_start_ns"] < waited


def test_ddp_gradient_all_reduces_are_captured_on_every_rank(job: Path) -> None:
    grads = (16 * 8 + 8) * F32  # Linear(16, 8): one bucket
    per_rank = [
        [(r["collective"], r["seq"], r["in_bytes"]) for r in rows(job, rank, "flight_recorder")]
        for rank in range(WORLD)
    ]
    assert per_rank[0] == per_rank[1] == per_rank[2]
    # one bucket per training step (between them DDP broadcasts its rebuilt bucket order, from C++ too)
    assert [c[0] for c in per_rank[0] if c[2] == grads] == ["all_reduce", "all_reduce"]
    python_seqs = [c[2] for c in world_collectives(job, 0)]
    assert min(s for _, s, _ in per_rank[0]) > max(python_seqs)  # numbered after the ops before them


def test_capture_rows_land_on_the_kineto_slices_of_the_same_run(job: Path) -> None:
    for rank in range(WORLD):
        trace = read_kineto(job / f"trace_{rank}.json", rank=rank)
        merged = merge_sidecars(trace, {"comm": job / f"comm_{rank}.parquet"}).comm.to_pylist()
        captured = len(rows(job, rank)) + len(rows(job, rank, "flight_recorder"))
        joined = [r for r in merged if r["source"] in ("trace+capture", "trace+flight_recorder")]
        assert len(joined) == captured  # same clock and thread ids: nothing left unmatched
        names = {trace.slices.column("name")[r["slice"]].as_py() for r in joined}
        assert all(name.startswith("c10d::") for name in names), names  # the calling thread's op
        slow = [r for r in joined if r["collective"] == "all_reduce" and r["in_bytes"] == 12 * F32]
        if rank == 0:  # the time blocked in wait() reaches the model's comm table
            assert slow[0]["host_wait_ns"] > 0.5 * 0.2e9
        ddp = [r for r in joined if r["source"] == "trace+flight_recorder"]
        assert all(r["group_ranks"] == "[0, 1, 2]" and r["seq"] is not None for r in ddp)


def test_install_and_uninstall_are_idempotent_and_leave_torch_working(tmp_path: Path) -> None:
    from torch._C import _distributed_c10d as c10d

    def entries() -> tuple:
        return tuple(c10d.ProcessGroup.__dict__[m] for m in ("allreduce", "send")) + (
            c10d.Work.__dict__["wait"],
        )

    before = entries()
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        for _ in range(2):  # a second profiling session in the same process works as the first
            capture = CommCapture()
            capture.install()
            capture.install()
            x = torch.ones(3)
            dist.all_reduce(x)
            assert [(r["collective"], r["in_bytes"]) for r in capture.table().to_pylist()] == [
                ("all_reduce", 12)
            ]
            capture.uninstall()
            capture.uninstall()
            assert entries() == before
            dist.all_reduce(x)  # torch's own methods are back, callable as before
            assert capture.table().num_rows == 1
    finally:
        dist.destroy_process_group()


class OddTensor(torch.Tensor):
    """A user tensor subclass whose Python-side ``element_size`` fails (torch's C++ never calls it)."""

    def element_size(self) -> int:
        raise RuntimeError("element_size is not available on this tensor type")


def test_a_failure_inside_the_capture_turns_it_off_once_and_the_op_still_runs(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from torch._C import _distributed_c10d as c10d

    before = c10d.ProcessGroup.__dict__["allreduce"]
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        capture = CommCapture()
        capture.install()
        odd = torch.full((3,), 2.0).as_subclass(OddTensor)
        with caplog.at_level("WARNING", logger="perfsight.collect"):
            dist.all_reduce(odd)
            dist.all_reduce(odd)
        assert torch.equal(odd.as_subclass(torch.Tensor), torch.full((3,), 2.0))  # the op ran
        assert capture.failed and "element_size" in capture.failed
        assert sum("communication capture failed" in r.getMessage() for r in caplog.records) == 1
        assert c10d.ProcessGroup.__dict__["allreduce"] is before  # it took itself out
        dist.all_reduce(torch.ones(2))
        assert capture.table().num_rows == 0
    finally:
        dist.destroy_process_group()


def test_an_unreadable_sidecar_is_a_warning_naming_it_and_the_trace_is_kept(
    tmp_path: Path, nccl_trace_path: Path
) -> None:
    trace = read_kineto(nccl_trace_path)
    bad = tmp_path / "perfsight_comm_0.parquet"
    bad.write_bytes(b"PAR1 cut short by a full disk")
    merged = merge_sidecars(trace, {"comm": bad})
    assert merged.comm.equals(trace.comm)
    assert any(str(bad) in w and "unreadable" in w for w in merged.meta.warnings)
