"""A real two-rank gloo DDP job profiled with plain ``torch.profiler`` (no perfsight), for tests
that need plain Kineto traces of a job with ``nn.Module`` ranges and several steps.

Why plain torch: perfsight's own capture writes run folders (side files beside the trace), which
the reader takes apart from a lone Kineto file; a user's ``torch.profiler`` job writes only the
Chrome traces.  ``with_stack=True`` makes Kineto's Python tracer record each module forward as a
``python_function`` event ``nn.Module: <Class>_<n>``.

Usage: ``python tests/_plain_kineto_job.py OUT_DIR`` writes ``OUT_DIR/rank{0,1}*.pt.trace.json``.
"""

from __future__ import annotations

import os
import socket
import sys
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn
from torch.profiler import ProfilerActivity, profile, schedule, tensorboard_trace_handler

WORLD_SIZE = 2
ACTIVE_STEPS = 5


def _rank(rank: int, port: int, out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=WORLD_SIZE)
    try:
        torch.manual_seed(0)
        model = nn.parallel.DistributedDataParallel(
            nn.Sequential(
                nn.Linear(64, 128),
                nn.ReLU(),
                nn.Sequential(nn.Linear(128, 128), nn.ReLU()),
                nn.Linear(128, 8),
            )
        )
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
        with profile(
            activities=[ProfilerActivity.CPU],
            schedule=schedule(wait=1, warmup=1, active=ACTIVE_STEPS, repeat=1),
            on_trace_ready=tensorboard_trace_handler(out, worker_name=f"rank{rank}"),
            record_shapes=True,
            profile_memory=True,
            with_stack=True,
        ) as prof:
            for _ in range(2 + ACTIVE_STEPS):
                x = torch.randn(32, 64)
                loss = model(x).square().mean()
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
                prof.step()
        dist.barrier()
    finally:
        dist.destroy_process_group()


def main() -> None:
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    mp.spawn(_rank, args=(port, str(out)), nprocs=WORLD_SIZE, join=True)


if __name__ == "__main__":
    main()
