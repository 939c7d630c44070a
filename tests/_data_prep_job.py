"""A training loop fed by a real torch DataLoader under ``perfsight.profile`` (Level2), with one
stage of its data pipeline slow on purpose; run by the data-preparation tests and the UI demo.

Why a script: DataLoader workers are processes (``spawn`` re-imports this module), and the
tests must see the job's own exit status.  It prints ``trained N steps`` and writes the batches it
received to ``--batches`` (a ``torch.save`` file), so a test can compare them with and without
capture.  The slow stage sleeps, so its share of the time holds on any machine, however loaded.
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
import time

import torch
from torch.utils.data import DataLoader, Dataset, IterableDataset

import perfsight

SAMPLES, BATCH = 96, 4
SLOW_S = 0.008  # per sample (read, transform) or per batch x 4 (collate)
FAST_S = 0.0  # no sleep at all: a loaded machine stretches even a short sleep by milliseconds


class Compose:
    """torchvision's ``transforms.Compose``, without torchvision: a list of callables, in order."""

    def __init__(self, transforms: list) -> None:
        self.transforms = transforms

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        for transform in self.transforms:
            x = transform(x)
        return x


class Normalize:
    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return (x - 1.0) / 2.0


class Blur:
    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.seconds:
            time.sleep(self.seconds)
        return x * 0.5 + x.roll(1) * 0.5


def _sample(index: int, read_s: float) -> torch.Tensor:
    if read_s:
        time.sleep(read_s)  # reading and decoding one image
    return torch.arange(8, dtype=torch.float32) + index


class Images(Dataset):
    """Map-style: ``__getitem__`` reads, then applies ``self.transform`` (torchvision's habit)."""

    def __init__(self, read_s: float, transform_s: float) -> None:
        self.read_s = read_s
        self.transform = Compose([Normalize(), Blur(transform_s)])

    def __len__(self) -> int:
        return SAMPLES

    def __getitem__(self, index: int) -> torch.Tensor:
        return self.transform(_sample(index, self.read_s))


class ImageStream(IterableDataset):
    """Iterable-style: each worker streams its share of the samples."""

    def __init__(self, read_s: float, transform_s: float) -> None:
        self.read_s = read_s
        self.transform = Compose([Normalize(), Blur(transform_s)])

    def __iter__(self):
        info = torch.utils.data.get_worker_info()
        first, stride = (0, 1) if info is None else (info.id, info.num_workers)
        for index in range(first, SAMPLES, stride):
            yield self.transform(_sample(index, self.read_s))


class Collate:
    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    def __call__(self, samples: list) -> torch.Tensor:
        if self.seconds:
            time.sleep(self.seconds)
        return torch.stack(samples)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default=None, help="profile into this folder (no capture without it)")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--slow", choices=["read", "transform", "collate", "none"], default="read")
    parser.add_argument("--iterable", action="store_true")
    parser.add_argument("--spawn", action="store_true")
    parser.add_argument("--persistent", action="store_true")
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--step-ms", type=float, default=None, help="compute per step (default: fast)")
    parser.add_argument("--batches", default=None, help="torch.save the batches received here")
    parser.add_argument("--ranks", type=int, default=1, help="a gloo job of this many ranks")
    parser.add_argument("--slow-rank", type=int, default=None, help="only this rank's --slow stage is slow")
    parser.add_argument(
        "--copy", action="store_true", help="move each batch with .to(torch.float64): a real copy on a CPU"
    )
    args = parser.parse_args()
    if args.ranks > 1:
        import torch.multiprocessing as mp

        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", str(_free_port()))
        mp.spawn(_rank_main, args=(args,), nprocs=args.ranks, join=True)
        print(f"trained {SAMPLES // BATCH * args.epochs} steps on {args.ranks} ranks", flush=True)
        return 0
    return _train(args)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank_main(rank: int, args: argparse.Namespace) -> None:
    import torch.distributed as dist

    dist.init_process_group("gloo", rank=rank, world_size=args.ranks)
    if args.slow_rank is not None and rank != args.slow_rank:
        args.slow = "none"
    try:
        _train(args)
    finally:
        dist.destroy_process_group()


def _train(args: argparse.Namespace) -> int:

    read_s = SLOW_S if args.slow == "read" else FAST_S
    transform_s = SLOW_S if args.slow == "transform" else FAST_S
    collate_s = SLOW_S * BATCH if args.slow == "collate" else FAST_S
    default_ms = 5.0 if args.ranks > 1 else 40.0 if args.slow == "none" else 1.0
    step_s = (args.step_ms if args.step_ms is not None else default_ms) / 1000
    dataset = (ImageStream if args.iterable else Images)(read_s, transform_s)
    loader = DataLoader(
        dataset,
        batch_size=BATCH,
        num_workers=args.workers,
        collate_fn=Collate(collate_s),
        persistent_workers=args.persistent and args.workers > 0,
        multiprocessing_context="spawn" if args.spawn and args.workers > 0 else None,
    )
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 1).to(torch.float64 if args.copy else torch.float32)
    received: list[torch.Tensor] = []

    def train(step_done) -> int:
        steps = 0
        for _ in range(args.epochs):
            for batch in loader:
                received.append(batch)
                if args.copy:  # as a GPU loop's batch.to(device): the copy the capture times
                    batch = batch.to(torch.float64)
                model(batch).sum().backward()
                time.sleep(step_s)  # the rest of a training step
                steps += 1
                step_done()
        return steps

    if args.out is None:
        steps = train(lambda: None)
    else:
        with perfsight.profile(
            schedule=perfsight.schedule(wait=0, warmup=0, active=SAMPLES // BATCH * args.epochs, repeat=1),
            on_trace_ready=perfsight.tensorboard_trace_handler(args.out, analyse_flag=True),
            experimental_config=perfsight.ExperimentalConfig(profiler_level="Level2"),
        ) as prof:
            steps = train(prof.step)
    if args.batches:
        torch.save(received, args.batches)
    print(f"trained {steps} steps", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
