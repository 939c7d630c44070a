"""Shared plumbing for the multi-rank example jobs: spawn ranks, join gloo, profile each rank.

Why this exists: every cluster example (DDP, tensor, pipeline and 2-D parallel) needs the same
three things -- start N local processes that form one ``torch.distributed`` job on the CPU (gloo),
give each a profiler that writes its rank's trace into one job folder, and tear the group down even
when a rank fails.  Keeping them here leaves each example to show only its parallel strategy.

Each rank is profiled with ``perfsight.profile`` (it records process groups, sequence numbers,
peers and clock offsets) and writes a perfsight run folder.  It must stay importable without side
effects.
"""

from __future__ import annotations

import contextlib
import os
import socket
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

WAIT_STEPS = 1
WARMUP_STEPS = 1

Worker = Callable[[int, int, Path, Any], None]
"""``worker(rank, world_size, out_dir, args)``: the body of one rank, run inside the process group."""


def free_port() -> int:
    """A TCP port on 127.0.0.1 that is free now (the rendezvous of this job binds it next)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def launch(worker: Worker, world_size: int, out_dir: Path, args: Any) -> None:
    """Run ``worker`` on ``world_size`` local processes forming one gloo job; raises if a rank fails."""
    out_dir.mkdir(parents=True, exist_ok=True)
    port = free_port()
    mp.spawn(_rank_main, args=(worker, world_size, port, out_dir, args), nprocs=world_size, join=True)


def _rank_main(rank: int, worker: Worker, world_size: int, port: int, out_dir: Path, args: Any) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)  # ranks share a few cores: one thread each keeps timings meaningful
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    try:
        worker(rank, world_size, out_dir, args)
        dist.barrier()  # all ranks done before gloo is torn down: torch 2.13 may abort at exit otherwise
    finally:
        dist.destroy_process_group()


@contextlib.contextmanager
def profiled(out_dir: Path, rank: int, active_steps: int) -> Iterator[Any]:
    """``perfsight.profile`` for one rank: one wait step, one warm-up step, then ``active_steps``.

    Level1 records every collective and point-to-point op with its group, sequence number, peer
    and bytes, and the rank's clock offset; ``with_modules`` names each op's
    ``nn.Module``.  Call ``.step()`` after every training step.
    """
    import perfsight

    with perfsight.profile(
        activities=[perfsight.ProfilerActivity.CPU],
        schedule=perfsight.schedule(wait=WAIT_STEPS, warmup=WARMUP_STEPS, active=active_steps, repeat=1),
        on_trace_ready=perfsight.tensorboard_trace_handler(str(out_dir), worker_name=f"rank{rank}"),
        record_shapes=True,
        profile_memory=True,
        with_flops=True,
        with_modules=True,  # each nn.Module forward as a range: the strategy view's modules, the module table
        experimental_config=perfsight.ExperimentalConfig(profiler_level=perfsight.ProfilerLevel.Level1),
    ) as prof:
        yield prof


def total_steps(active_steps: int) -> int:
    """Steps a job must run so that the profiler's window closes and the trace is written."""
    return WAIT_STEPS + WARMUP_STEPS + active_steps
