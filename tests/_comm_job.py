"""One rank of a real gloo job for tests/test_comm_capture.py and tests/test_clock_sync.py.

Run as ``python tests/_comm_job.py RANK WORLD PORT OUT_DIR``.  It aligns clocks, then, under
``torch.profiler`` with perfsight's comm capture installed, issues every op of the issue's part 4
(tensor sizes chosen so each op's byte count is distinct), p2p between a subset of ranks, an op
on a sub-group, an async all-reduce that rank 0 must wait for, and two DDP training steps.  It
writes ``trace_{rank}.json`` (Kineto), ``comm_{rank}.parquet`` (the capture) and
``clock_{rank}.json``.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pyarrow.parquet as pq
import torch
import torch.distributed as dist
from torch.profiler import ProfilerActivity, profile

from perfsight.collect.clock_sync import estimate_clock_offset
from perfsight.collect.comm_capture import CommCapture

SLOW_RANK_SLEEP_S = 0.2


def run(rank: int, world: int, port: int, out: Path) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    pair = dist.new_group([0, 1])
    clock = estimate_clock_offset(rounds=6)
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(16, 8))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    capture = CommCapture()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        capture.install()
        x = torch.ones(10)
        dist.all_reduce(x)
        dist.broadcast(x, src=0)
        dist.reduce(x, dst=0)
        dist.all_gather([torch.empty(10) for _ in range(world)], x)
        dist.all_gather_into_tensor(torch.empty(10 * world), x)
        dist.reduce_scatter_tensor(torch.empty(5), torch.ones(5 * world))
        dist.reduce_scatter(torch.empty(5), [torch.ones(5) for _ in range(world)])
        dist.all_to_all_single(
            torch.empty(3 * world, dtype=torch.int64), torch.ones(3 * world, dtype=torch.int64)
        )
        dist.all_to_all([torch.empty(4) for _ in range(world)], [torch.ones(4) for _ in range(world)])
        dist.barrier()
        if rank == 0:  # p2p between a subset of the ranks: rank 2 takes no part
            dist.send(torch.ones(7, dtype=torch.float64), dst=1)
            dist.irecv(torch.empty(9), src=1).wait()
        elif rank == 1:
            dist.recv(torch.empty(7, dtype=torch.float64), src=0)
            dist.isend(torch.ones(9), dst=0).wait()
        ring = [
            dist.P2POp(dist.isend, torch.ones(6), (rank + 1) % world),
            dist.P2POp(dist.irecv, torch.empty(6), (rank - 1) % world),
        ]
        for work in dist.batch_isend_irecv(ring):
            work.wait()
        if rank in (0, 1):
            dist.all_reduce(torch.ones(11), group=pair)
        if rank != 0:
            time.sleep(SLOW_RANK_SLEEP_S)  # rank 0 waits for the others in wait()
        dist.all_reduce(torch.ones(12), async_op=True).wait()
        for _ in range(2):
            optimizer.zero_grad()
            model(torch.randn(4, 16)).sum().backward()
            optimizer.step()
        table = capture.table()
        capture.uninstall()
    prof.export_chrome_trace(str(out / f"trace_{rank}.json"))
    pq.write_table(table, out / f"comm_{rank}.parquet")
    (out / f"clock_{rank}.json").write_text(json.dumps(clock.to_dict()))
    dist.barrier()  # all ranks done before gloo is torn down: torch 2.13 may abort at exit otherwise
    dist.destroy_process_group()


if __name__ == "__main__":
    run(int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), Path(sys.argv[4]))
