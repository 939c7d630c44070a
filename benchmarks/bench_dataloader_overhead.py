"""What the data-loader capture costs a data-heavy loop: many small batches from 2 workers, with and
without capture, paired.

Why beside ``bench_collect_overhead.py``: that benchmark's loop is compute-heavy (a DDP step of
well over 20 ms), where a few microseconds per batch vanish.  Here the step is a small matmul and
each batch is 16 CIFAR-sized samples through a three-transform Compose, so the loop runs at about
a millisecond a batch and every wrapper the capture adds (``__next__``, the sampler, each
transform of each sample, ``collate_fn``, the worker's record) is a visible share of it.  Timing
one transform call costs about 0.8 us on a loaded 2-core machine, so samples whose transforms
take a microsecond each (``--shape 64``) are the worst case: there the capture costs ~17% of the
training process's CPU per batch.

Method: one repetition runs one epoch without capture and one with (order alternating), each with
freshly forked workers (the capture must be installed before the workers start, and both variants
pay the same fork); a variant's figure is its epoch's time per batch, without the epoch's first
``WARMUP`` batches (workers starting).  The overhead is the median over repetitions of the paired
difference as a percentage of the uncaptured time per batch, with a 95% bootstrap interval;
``A/A`` (two uncaptured epochs) gives the method's own noise.  Batches are checked equal between
the variants on every repetition.

Usage::

    python benchmarks/bench_dataloader_overhead.py [--reps 20] [--batches 400] [--workers 2] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time
from pathlib import Path

import torch
from torch.utils.data import DataLoader, Dataset

from perfsight.collect.dataloader_capture import DataLoaderCapture

BATCH = 16
WARMUP = 20


class Compose:
    def __init__(self, transforms: list) -> None:
        self.transforms = transforms

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        for transform in self.transforms:
            x = transform(x)
        return x


class Scale:
    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return x * 0.5


class Shift:
    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return x + 1.0


class Clip:
    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return x.clamp(-3.0, 3.0)


class Samples(Dataset):
    def __init__(self, count: int, shape: tuple[int, ...]) -> None:
        self.count = count
        self.shape = shape
        self.transform = Compose([Scale(), Shift(), Clip()])

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, index: int) -> torch.Tensor:
        generator = torch.Generator().manual_seed(index)
        return self.transform(torch.randn(self.shape, generator=generator))


def epoch(
    batches: int, workers: int, capture: bool, shape: tuple[int, ...]
) -> tuple[float, float, torch.Tensor]:
    """Wall and training-process CPU time per batch (s) after the warm-up, and a checksum of every
    batch received.  (CPU time holds up on a loaded machine; with ``num_workers=0`` it covers every
    wrapper the capture adds, since the training process then runs the whole pipeline.)"""
    installed = DataLoaderCapture() if capture else None
    if installed is not None:
        installed.install()
    try:
        loader = DataLoader(Samples(batches * BATCH, shape), batch_size=BATCH, num_workers=workers)
        weight = torch.randn(shape[-1], 8, generator=torch.Generator().manual_seed(0))
        checksum = torch.zeros(())
        start = cpu = 0.0
        for i, batch in enumerate(loader):
            if i == WARMUP:
                start, cpu = time.perf_counter(), time.process_time()
            checksum += (batch @ weight).sum()
        per_batch = (time.perf_counter() - start) / (batches - WARMUP)
        cpu_per_batch = (time.process_time() - cpu) / (batches - WARMUP)
        if installed is not None:
            rows = installed.table().num_rows
            assert rows > batches, f"the capture saw {rows} rows for {batches} batches"
    finally:
        if installed is not None:
            installed.uninstall()
    return per_batch, cpu_per_batch, checksum


def bootstrap(values: list[float], rounds: int = 2000, seed: int = 0) -> tuple[float, float]:
    rng = random.Random(seed)
    medians = sorted(statistics.median(rng.choices(values, k=len(values))) for _ in range(rounds))
    return medians[int(0.025 * rounds)], medians[int(0.975 * rounds) - 1]


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--reps", type=int, default=20)
    parser.add_argument("--batches", type=int, default=400)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--shape", default="3,32,32", help="one sample (CIFAR-sized by default)")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    torch.set_num_threads(1)
    shape = tuple(int(n) for n in args.shape.split(","))
    epoch(WARMUP + 10, args.workers, capture=False, shape=shape)  # imports, first fork
    overhead, noise, base, cpu_overhead, cpu_base = [], [], [], [], []
    for rep in range(args.reps):
        order = [False, True] if rep % 2 == 0 else [True, False]
        wall, cpu, sums = {}, {}, {}
        for capture in order:
            wall[capture], cpu[capture], sums[capture] = epoch(args.batches, args.workers, capture, shape)
        again, _, _ = epoch(args.batches, args.workers, False, shape)
        assert torch.equal(sums[False], sums[True]), "the capture changed the batches"
        base.append(wall[False])
        cpu_base.append(cpu[False])
        overhead.append((wall[True] - wall[False]) / wall[False] * 100)
        cpu_overhead.append((cpu[True] - cpu[False]) / cpu[False] * 100)
        noise.append((again - wall[False]) / wall[False] * 100)
    result = {
        "batch_us": statistics.median(base) * 1e6,
        "overhead_pct": statistics.median(overhead),
        "overhead_ci_pct": bootstrap(overhead),
        "a_a_pct": statistics.median(noise),
        "cpu_batch_us": statistics.median(cpu_base) * 1e6,
        "cpu_overhead_pct": statistics.median(cpu_overhead),
        "cpu_overhead_ci_pct": bootstrap(cpu_overhead),
        "a_a_ci_pct": bootstrap(noise),
        "reps": args.reps,
        "batches": args.batches,
        "workers": args.workers,
        "batch_size": BATCH,
        "shape": list(shape),
    }
    print(
        f"time per batch without capture: {result['batch_us']:.1f} us (median of {args.reps} epochs, "
        f"{args.workers} workers, {BATCH} samples of {args.shape} x 3 transforms)\n"
        f"capture overhead: {result['overhead_pct']:+.2f}% "
        f"[{result['overhead_ci_pct'][0]:+.2f}, {result['overhead_ci_pct'][1]:+.2f}]\n"
        f"A/A noise:        {result['a_a_pct']:+.2f}% "
        f"[{result['a_a_ci_pct'][0]:+.2f}, {result['a_a_ci_pct'][1]:+.2f}]\n"
        f"training-process CPU per batch: {result['cpu_batch_us']:.1f} us, capture adds "
        f"{result['cpu_overhead_pct']:+.2f}% "
        f"[{result['cpu_overhead_ci_pct'][0]:+.2f}, {result['cpu_overhead_ci_pct'][1]:+.2f}]"
    )
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
