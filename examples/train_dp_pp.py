"""A 2-D data x pipeline parallel job on 4 ranks: two pipelines of two stages, gradients averaged
across the pipelines.

Why this exists: the cluster analysis must tell pipeline stages apart from data-parallel replicas
in one job -- stages from the p2p traffic, replicas from the all-reduce groups -- and report both.
Ranks 0 -> 1 form pipeline A and ranks 2 -> 3 pipeline B (one GPipe step of ``train_pp``); after
each step, stage s of A and stage s of B average their gradients with ``all_reduce`` on their own
data-parallel group ({0, 2} and {1, 3}).

    python examples/train_dp_pp.py --out runs/dp_pp

It must stay importable without side effects: all work happens under ``main()``.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _cluster_job  # noqa: E402
from train_pp import gpipe_step, make_stage  # noqa: E402

STAGES = 2
REPLICAS = 2


def train(rank: int, world_size: int, out: Path, args: argparse.Namespace) -> None:
    """Rank ``rank`` is stage ``rank % STAGES`` of pipeline ``rank // STAGES``."""
    stage_index, replica = rank % STAGES, rank // STAGES
    # every rank creates every group, in the same order (torch.distributed requires it)
    dp_groups = [
        dist.new_group([s + STAGES * r for r in range(REPLICAS)], group_desc="dp") for s in range(STAGES)
    ]  # "dp": recorded with the group, it tells the analysis what the group is for
    dp_group = dp_groups[stage_index]
    torch.manual_seed(stage_index)  # replicas of a stage start from the same weights
    stage = make_stage(args.layers)
    optimizer = torch.optim.SGD(stage.parameters(), lr=0.01)
    prev = rank - 1 if stage_index > 0 else None
    nxt = rank + 1 if stage_index < STAGES - 1 else None
    with _cluster_job.profiled(out, rank, args.active) as prof:
        for _ in range(_cluster_job.total_steps(args.active)):
            gpipe_step(stage, args.batch_size // args.micro_batches, args.micro_batches, prev, nxt)
            for param in stage.parameters():
                dist.all_reduce(param.grad, group=dp_group)
                param.grad /= REPLICAS
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            prof.step()
    del replica


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("demo_output/dp_pp"), help="run folders go here")
    parser.add_argument("--layers", type=int, default=2, help="linear layers per stage")
    parser.add_argument("--micro-batches", type=int, default=4)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--active", type=int, default=3, help="profiled steps")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    _cluster_job.launch(train, STAGES * REPLICAS, args.out, args)
    print(f"data x pipeline job of {STAGES * REPLICAS} ranks written under {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
