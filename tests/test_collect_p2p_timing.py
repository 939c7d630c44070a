"""The collector times point-to-point transfers: a real two-rank gloo job (tests/_p2p_job.py).

What a user checks: gloo's own ``c10d::send``/``c10d::recv_`` slices last only as long as enqueueing
the transfer, so a slow link cannot show in them.  perfsight's comm capture records how long the
caller blocked in ``wait()`` (op, peer, bytes, group with it), and the trace model's p2p op lasts
until that wait ended -- when the caller waited at once; a late wait that returned at once adds
nothing, so compute done meanwhile is never counted as transfer.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")
if not dist.is_available():
    pytest.skip("torch built without distributed", allow_module_level=True)

from perfsight.ingest import find_traces, read_trace  # noqa: E402

JOB = Path(__file__).with_name("_p2p_job.py")
LATE_NS = 0.3e9  # tests/_p2p_job.py's LATE_S
BIG_BYTES = 64 * 2**20


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="module")
def job(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("p2p_job")
    port = _free_port()
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    procs = [
        subprocess.Popen(
            [sys.executable, str(JOB), str(rank), str(port), str(out)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        for rank in range(2)
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
    return out


def _comm(job: Path, rank: int) -> list[dict]:
    """Rank ``rank``'s comm rows as the trace model holds them, with their slice's own duration."""
    (path,) = [p for p in find_traces(job) if f"rank{rank}_" in str(p)]
    trace = read_trace(path)
    slice_dur = trace.slices.column("dur_ns").to_pylist()
    rows = trace.comm.to_pylist()
    for row in rows:
        row["slice_dur_ns"] = slice_dur[row["slice"]] if row["slice"] >= 0 else None
    return rows


def test_the_capture_records_how_long_the_sender_waited_with_peer_bytes_and_group(job: Path) -> None:
    (sidecar,) = job.glob("rank0_*/perfsight_comm_0.parquet")
    big = [
        r
        for r in pq.read_table(sidecar).to_pylist()
        if r["collective"] == "send" and r["in_bytes"] == BIG_BYTES
    ]
    assert len(big) == 2  # one per profiled step
    for row in big:
        assert row["peer"] == 1 and row["group"] is not None
        waited = row["wait_end_ns"] - row["wait_start_ns"]
        assert waited > 0.5 * LATE_NS  # the receiver took the data only after sleeping
        assert row["issue_end_ns"] - row["start_ns"] < waited  # the call itself only enqueued it


def test_a_blocking_p2p_op_lasts_until_its_transfer_ended_in_the_trace_model(job: Path) -> None:
    rows = _comm(job, 0)
    sends = [r for r in rows if r["collective"] == "send" and r["in_bytes"] == BIG_BYTES]
    recvs = [r for r in rows if r["collective"] == "recv" and r["peer"] == 1]
    assert len(sends) == 2 and len(recvs) == 2
    for row in sends + recvs:  # each one waited ~LATE_S for rank 1
        assert row["dur_ns"] > 0.5 * LATE_NS, row
        assert row["slice_dur_ns"] is None or row["slice_dur_ns"] < row["dur_ns"]
        assert row["dur_ns"] >= row["host_wait_ns"]


def test_a_late_wait_that_returned_at_once_adds_no_transfer_time(job: Path) -> None:
    rows = _comm(job, 0)
    small_sends = [r for r in rows if r["collective"] == "send" and r["in_bytes"] == 16 * 4]
    assert len(small_sends) == 2
    for row in small_sends:  # the isend completed during the 200 matmuls before its wait
        assert row["dur_ns"] < 0.1 * LATE_NS, row
