"""A small data-parallel training job (gloo DDP on CPU) profiled with ``perfsight.profile``.

Why this exists: the demo, the collection tests and the benchmarks need a genuine multi-process
``torch.distributed`` job -- real DDP gradient all-reduces across ranks, a ``DistributedSampler``,
user ranges, metadata -- whose every rank writes perfsight run folders through
``perfsight.tensorboard_trace_handler``.  The model is a tiny MLP on random data; the job
finishes in seconds on two CPU cores.

Runs either way:

    python examples/train_ddp.py --out demo_output/run --world-size 4      # spawns the ranks
    torchrun --nproc-per-node 4 examples/train_ddp.py --out demo_output/run  # torchrun's ranks

It must stay importable without side effects: all work happens under ``main()``.
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
from collections.abc import Sequence
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

import perfsight

FEATURES = 64
CLASSES = 10


def make_model(hidden: int) -> nn.Module:
    return nn.Sequential(
        nn.Linear(FEATURES, hidden),
        nn.ReLU(),
        nn.Linear(hidden, hidden),
        nn.ReLU(),
        nn.Linear(hidden, CLASSES),
    )


def train(rank: int, world_size: int, args: argparse.Namespace) -> None:
    """One rank's training loop under ``perfsight.profile`` (the process group is already up)."""
    torch.manual_seed(args.seed)
    torch.set_num_threads(1)  # four ranks share two cores: no oversubscription
    steps = args.skip_first + args.wait + args.warmup + args.active
    generator = torch.Generator().manual_seed(args.seed)
    samples = steps * args.batch_size * world_size
    data = TensorDataset(
        torch.randn(samples, FEATURES, generator=generator),
        torch.randint(0, CLASSES, (samples,), generator=generator),
    )
    sampler = DistributedSampler(data, num_replicas=world_size, rank=rank, shuffle=True, seed=args.seed)
    loader = DataLoader(data, batch_size=args.batch_size, sampler=sampler, drop_last=True)
    model = DistributedDataParallel(make_model(args.hidden))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    loss_fn = nn.CrossEntropyLoss()

    with perfsight.profile(
        activities=[perfsight.ProfilerActivity.CPU],
        schedule=perfsight.schedule(
            wait=args.wait, warmup=args.warmup, active=args.active, repeat=1, skip_first=args.skip_first
        ),
        on_trace_ready=perfsight.tensorboard_trace_handler(
            args.out, worker_name=f"rank{rank}", analyse_flag=args.analyse, async_mode=args.async_mode
        ),
        record_shapes=True,
        profile_memory=True,
        with_modules=True,  # each nn.Module forward as a range (the strategy view, the module table)
        experimental_config=perfsight.ExperimentalConfig(
            profiler_level=perfsight.ProfilerLevel[args.level], export_type=[perfsight.ExportType.Text]
        ),
    ) as prof:
        prof.add_metadata("job", "train_ddp example")
        prof.add_metadata_json("parallel_layout", f'{{"data_parallel": {world_size}}}')
        batches = iter(loader)
        for _ in range(steps):
            with perfsight.range("load_batch"):
                inputs, labels = next(batches)
            with perfsight.range("forward_backward"):
                loss = loss_fn(model(inputs), labels)
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
            optimizer.step()
            prof.step()


def _worker(rank: int, world_size: int, port: int, args: argparse.Namespace) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), LOCAL_RANK=str(rank))
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    try:
        train(rank, world_size, args)
        dist.barrier()  # all ranks done before gloo is torn down: torch 2.13 may abort at exit otherwise
    finally:
        dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("demo_output/run"), help="run folders go here")
    parser.add_argument("--world-size", type=int, default=4, help="ranks to spawn (ignored under torchrun)")
    parser.add_argument("--skip-first", type=int, default=1)
    parser.add_argument("--wait", type=int, default=1)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--active", type=int, default=3, help="profiled steps")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--level", choices=["Level0", "Level1", "Level2"], default="Level1")
    parser.add_argument("--analyse", action="store_true", help="analyse each window as it is written")
    parser.add_argument("--async-mode", action="store_true", help="analyse in a background process")
    parser.add_argument("--seed", type=int, default=0)
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:  # launched by torchrun
        dist.init_process_group("gloo")
        try:
            train(dist.get_rank(), dist.get_world_size(), args)
            dist.barrier()  # all ranks done before gloo is torn down: torch 2.13 may abort at exit otherwise
        finally:
            dist.destroy_process_group()
    else:
        torch.multiprocessing.spawn(
            _worker, args=(args.world_size, _free_port(), args), nprocs=args.world_size
        )
    folders = sorted(args.out.glob("*_perfsight"))
    print(f"{len(folders)} run folders written under {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
