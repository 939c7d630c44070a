"""One rank of a real 2-rank gloo DDP job for tests/test_clock_sync.py: one profiled window per level.

``python tests/_clock_levels_job.py RANK WORLD PORT OUT_DIR`` -- trains a tiny DDP model under
``perfsight.profile`` three times, at Level0, Level1 and Level2, each time a fresh profiler (so
each ``start()`` aligns the clocks itself) writing its run folder to ``OUT_DIR/{level}/``
(unanalysed: the test reads ``profiler_info`` and runs the cluster analysis itself).
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
import torch.distributed as dist

import perfsight

LEVELS = ("Level0", "Level1", "Level2")


def run(rank: int, world: int, port: int, out: Path) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(16, 4))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    for level in LEVELS:
        with perfsight.profile(
            activities=[perfsight.ProfilerActivity.CPU],
            schedule=perfsight.schedule(wait=0, active=2, repeat=1),
            on_trace_ready=perfsight.tensorboard_trace_handler(
                str(out / level), worker_name=f"rank{rank}", analyse_flag=False
            ),
            experimental_config=perfsight.ExperimentalConfig(profiler_level=perfsight.ProfilerLevel(level)),
        ) as prof:
            for _ in range(2):
                model(torch.randn(8, 16)).sum().backward()
                optimizer.step()
                optimizer.zero_grad()
                dist.all_reduce(torch.ones(4))
                prof.step()
    dist.barrier()  # all ranks done before gloo is torn down: torch 2.13 may abort at exit otherwise
    dist.destroy_process_group()


if __name__ == "__main__":
    run(int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), Path(sys.argv[4]))
