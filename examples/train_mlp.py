"""A small, real PyTorch training job traced with plain ``torch.profiler``.

Why this exists: perfsight's demo, tests and benchmarks need a genuine Kineto trace produced on
this machine by this torch version -- real ``aten::`` operators with shapes, a real
``DataLoader``, an optimizer step, memory events and ``ProfilerStep#N`` markers -- rather than a
hand-written fixture.  The job is a tiny CNN followed by an MLP, trained with Adam on random
images for a few steps on the CPU; it finishes in seconds.

It deliberately uses ``torch.profiler.profile`` directly (not ``perfsight.profile``) so the trace
is exactly what any PyTorch user would hand us.  It must stay importable without side effects:
all work happens under ``main()``.

Usage::

    python examples/train_mlp.py --out demo_output/run --steps 4
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import torch
from torch import nn
from torch.profiler import ProfilerActivity, profile, schedule, tensorboard_trace_handler
from torch.utils.data import DataLoader, Dataset

WAIT_STEPS = 1
WARMUP_STEPS = 1
WORKER_NAME = "rank0"
NUM_CLASSES = 10
IMAGE_CHANNELS = 3
IMAGE_SIZE = 16


class RandomImages(Dataset[tuple[torch.Tensor, torch.Tensor]]):
    """Deterministic random images and labels, with a small per-sample transform.

    The transform (normalise, then flip every other sample) runs in ``__getitem__`` so that data
    loading shows up in the trace as real work, as it does in real training jobs.
    """

    def __init__(self, length: int, seed: int = 0) -> None:
        self.length = length
        self.seed = seed
        self.mean = torch.full((IMAGE_CHANNELS, 1, 1), 0.5)
        self.std = torch.full((IMAGE_CHANNELS, 1, 1), 0.25)

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        generator = torch.Generator().manual_seed(self.seed * 1_000_003 + index)
        image = torch.rand(IMAGE_CHANNELS, IMAGE_SIZE, IMAGE_SIZE, generator=generator)
        label = torch.randint(0, NUM_CLASSES, (), generator=generator)
        image = (image - self.mean) / self.std
        if index % 2:
            image = torch.flip(image, dims=(2,))
        return image, label


class SmallConvNet(nn.Module):
    """Two convolutions feeding a three-layer MLP classifier."""

    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(IMAGE_CHANNELS, 8, kernel_size=3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(8, 16, kernel_size=3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),
        )
        flat = 16 * (IMAGE_SIZE // 4) ** 2
        self.classifier = nn.Sequential(
            nn.Flatten(),
            nn.Linear(flat, hidden),
            nn.ReLU(),
            nn.Linear(hidden, hidden),
            nn.ReLU(),
            nn.Linear(hidden, NUM_CLASSES),
        )

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(images))


def train(
    out_dir: Path,
    active_steps: int = 4,
    batch_size: int = 32,
    hidden: int = 256,
    workers: int = 0,
    seed: int = 0,
) -> Path:
    """Train for ``wait + warmup + active_steps`` steps under the profiler; return the trace path."""
    if active_steps < 1:
        raise ValueError("active_steps must be at least 1")
    torch.manual_seed(seed)
    total_steps = WAIT_STEPS + WARMUP_STEPS + active_steps
    loader = DataLoader(
        RandomImages(total_steps * batch_size, seed=seed),
        batch_size=batch_size,
        shuffle=True,
        num_workers=workers,
        drop_last=True,
    )
    model = SmallConvNet(hidden)
    loss_fn = nn.CrossEntropyLoss()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)

    out_dir.mkdir(parents=True, exist_ok=True)
    started = time.time()
    with profile(
        activities=[ProfilerActivity.CPU],
        schedule=schedule(wait=WAIT_STEPS, warmup=WARMUP_STEPS, active=active_steps, repeat=1),
        record_shapes=True,
        profile_memory=True,
        on_trace_ready=tensorboard_trace_handler(str(out_dir), worker_name=WORKER_NAME),
    ) as prof:
        for images, labels in loader:
            optimizer.zero_grad(set_to_none=True)
            loss = loss_fn(model(images), labels)
            loss.backward()
            optimizer.step()
            prof.step()

    # tensorboard_trace_handler names files "<worker>.<time_ns>.pt.trace.json"; take this run's.
    written = [
        path
        for path in out_dir.glob(f"{WORKER_NAME}.*.pt.trace.json*")
        if path.stat().st_mtime >= started - 1
    ]
    if not written:
        raise RuntimeError(f"torch.profiler wrote no trace under {out_dir}")
    return max(written, key=lambda path: path.stat().st_mtime)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("demo_output/run"), help="trace directory")
    parser.add_argument("--steps", type=int, default=4, help="number of profiled (active) steps")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--hidden", type=int, default=256, help="width of the MLP's hidden layers")
    parser.add_argument("--workers", type=int, default=0, help="DataLoader worker processes")
    parser.add_argument("--seed", type=int, default=0)
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    trace = train(
        args.out,
        active_steps=args.steps,
        batch_size=args.batch_size,
        hidden=args.hidden,
        workers=args.workers,
        seed=args.seed,
    )
    print(f"trace written to {trace}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
