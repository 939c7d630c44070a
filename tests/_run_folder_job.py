"""A real two-rank gloo job profiled by ``perfsight.profile`` at Level2, for the tests of the
bounded-memory path on perfsight run folders (tests/test_bounded_run_folder.py).

Why a job of its own: the scenarios (examples/scenarios) profile at Level1, which records no
data-loader capture, and their only collectives are DDP's (flight-recorder rows).  Each profiled
step here does what puts every kind of capture row into the run folder: a batch from a DataLoader
with a worker process (the data-loader capture), a DDP backward (flight-recorder all-reduces), an
all-reduce issued from Python (capture rows matched by thread) and a batched send/recv ring (gloo's
recv nested in the send's range: a capture row that claims a slice the reader made no comm row for).

    python tests/_run_folder_job.py OUT_DIR [--active N]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, Dataset

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "examples"))
import _cluster_job  # noqa: E402

WORLD_SIZE = 2
BATCH = 16
PYTHON_CALLS = 12_000
"""Python calls per step (each a slice under Level2's stack tracing): a step then holds more slices
than the smallest chunk (``memory_budget.MIN_SLICES``), so ``--memory-limit 1M`` cuts one step per
chunk."""


class Samples(Dataset):
    def __init__(self, count: int) -> None:
        self.inputs = torch.randn(count, 32)

    def __len__(self) -> int:
        return len(self.inputs)

    def __getitem__(self, index: int) -> torch.Tensor:
        return self.inputs[index] * 2.0


def _python_work(calls: int) -> int:
    """Bookkeeping in Python, as a training loop's logging and metrics do."""
    return sum(abs(i) for i in range(calls))


def train(rank: int, world_size: int, out: Path, args: argparse.Namespace) -> None:
    import perfsight

    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(
        torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.Linear(64, 4))
    )
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    steps = _cluster_job.total_steps(args.active)
    loader = DataLoader(Samples(BATCH * steps), batch_size=BATCH, num_workers=1)
    with perfsight.profile(
        activities=[perfsight.ProfilerActivity.CPU],
        schedule=perfsight.schedule(
            wait=_cluster_job.WAIT_STEPS, warmup=_cluster_job.WARMUP_STEPS, active=args.active, repeat=1
        ),
        on_trace_ready=perfsight.tensorboard_trace_handler(
            str(out), worker_name=f"rank{rank}", analyse_flag=False
        ),
        record_shapes=True,
        profile_memory=True,
        experimental_config=perfsight.ExperimentalConfig(profiler_level=perfsight.ProfilerLevel.Level2),
    ) as prof:
        for inputs in loader:
            _python_work(PYTHON_CALLS)
            model(inputs).pow(2).mean().backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            total = torch.ones(8) * rank
            dist.all_reduce(total)
            ring = [
                dist.P2POp(dist.isend, torch.ones(6), (rank + 1) % world_size),
                dist.P2POp(dist.irecv, torch.empty(6), (rank - 1) % world_size),
            ]
            for work in dist.batch_isend_irecv(ring):
                work.wait()
            prof.step()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--active", type=int, default=4)
    args = parser.parse_args()
    _cluster_job.launch(train, WORLD_SIZE, args.out, args)


if __name__ == "__main__":
    main()
