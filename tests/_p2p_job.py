"""One rank of a real two-rank gloo job for tests/test_collect_p2p_timing.py.

Run as ``python tests/_p2p_job.py RANK PORT OUT_DIR``.  Under ``perfsight.profile`` (the real
collector) each profiled step does three point-to-point hand-offs whose transfer lasts far longer
than the call that enqueues it, as a slow link's would:

* rank 0 sends 64 MiB (more than the sockets buffer) to rank 1, which posts its receive only after
  sleeping ``LATE_S``: the sender's ``dist.send`` blocks in ``wait()`` until the data is taken;
* rank 1 sleeps ``LATE_S`` again and sends a small reply that rank 0 receives with ``dist.recv``;
* rank 0 ``isend``s a small tensor, computes for a while, then waits (the transfer is long done:
  the wait returns at once and must not make the compute look like transfer time).
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

import perfsight

LATE_S = 0.3
BIG_FLOATS = 16 * 2**20  # 64 MiB
STEPS = 2


def run(rank: int, port: int, out: Path) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=2)
    big = torch.ones(BIG_FLOATS) if rank == 0 else torch.empty(BIG_FLOATS)
    small = torch.ones(16)
    with perfsight.profile(
        activities=[perfsight.ProfilerActivity.CPU],
        schedule=perfsight.schedule(wait=0, warmup=0, active=STEPS, repeat=1),
        on_trace_ready=perfsight.tensorboard_trace_handler(str(out), worker_name=f"rank{rank}"),
        record_shapes=True,
        experimental_config=perfsight.ExperimentalConfig(profiler_level=perfsight.ProfilerLevel.Level1),
    ) as prof:
        for _ in range(STEPS):
            dist.barrier()  # both ranks start the step together: rank 1's sleep is all rank 0's wait
            if rank == 0:
                dist.send(big, dst=1)
                dist.recv(small, src=1)
                work = dist.isend(small, dst=1)
                a = torch.randn(256, 256)
                for _ in range(200):  # compute while the small send is long done
                    a = (a @ a).tanh()
                work.wait()
            else:
                time.sleep(LATE_S)
                dist.recv(big, src=0)
                time.sleep(LATE_S)
                dist.send(small, dst=0)
                dist.recv(small, src=0)
            prof.step()
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    run(int(sys.argv[1]), int(sys.argv[2]), Path(sys.argv[3]))
