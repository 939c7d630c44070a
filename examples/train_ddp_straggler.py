"""A data-parallel job (gloo DDP on CPU) in which one rank can be made slower on purpose.

Why this exists: the cluster analysis must name the rank the others wait for, and say by how much.
Every rank trains the same tiny MLP under DDP; ``--slow-rank R`` makes rank R do ``--slow-factor``
times the forward compute (extra matrix products whose result is discarded), so R reaches every
gradient all-reduce late and the others wait for it.  (``examples/train_ddp.py`` is the plain DDP
example; this one adds the straggler.)

    python examples/train_ddp_straggler.py --out runs/ddp_slow --world-size 2 --slow-rank 1

It must stay importable without side effects: all work happens under ``main()``.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _cluster_job  # noqa: E402

FEATURES = 128


def train(rank: int, world_size: int, out: Path, args: argparse.Namespace) -> None:
    torch.manual_seed(0)
    model = DistributedDataParallel(
        nn.Sequential(nn.Linear(FEATURES, args.hidden), nn.ReLU(), nn.Linear(args.hidden, 10))
    )
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    extra = torch.randn(args.extra_size, args.extra_size)
    rounds = args.slow_factor if rank == args.slow_rank else 0
    with _cluster_job.profiled(out, rank, args.active) as prof:
        for _ in range(_cluster_job.total_steps(args.active)):
            inputs = torch.randn(args.batch_size, FEATURES)
            with torch.profiler.record_function("straggler_compute"):
                for _ in range(rounds):  # the straggler's extra work, before it can reach the all-reduce
                    extra = torch.tanh(extra @ extra)
            loss = model(inputs).pow(2).mean()
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            prof.step()


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("demo_output/ddp_slow"), help="run folders go here")
    parser.add_argument("--world-size", type=int, default=2)
    parser.add_argument("--slow-rank", type=int, default=-1, help="rank given extra compute (-1: none)")
    parser.add_argument("--slow-factor", type=int, default=20, help="extra matrix products per step")
    parser.add_argument("--extra-size", type=int, default=256, help="side of the extra matrices")
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--active", type=int, default=3, help="profiled steps")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    _cluster_job.launch(train, args.world_size, args.out, args)
    print(f"DDP job of {args.world_size} ranks written under {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
