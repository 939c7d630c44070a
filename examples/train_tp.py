"""A small tensor-parallel training job on 2 ranks with ``torch.distributed.tensor.parallel``.

Why this exists: in tensor (model) parallelism communication sits inside forward and backward, so
the cluster analysis must split each rank's step into computation and pure (not overlapped)
communication rather than gap / forward+backward / tail, and must recognise the job as tensor
parallel from its process groups.  The model is two MLP blocks, each sharded Megatron-style: the
first linear column-wise, the second row-wise.  Per step that is three all-reduces of a
(batch, width) activation: one per block in forward (the row-wise output), and one in backward
(the input gradient of the second block; the first block's input needs none).

The 1-D CPU device mesh names its dimension ``tp`` and gets its own gloo group, so the group is
recorded as ``mesh_tp`` -- as every dimension of a multi-dimensional mesh is.  (A 1-D mesh over
the whole world would otherwise reuse the unnamed default group, and nothing in the trace would
say the traffic is tensor parallel.)

    python examples/train_tp.py --out runs/tp

It must stay importable without side effects: all work happens under ``main()``.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

import torch
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _cluster_job  # noqa: E402

BLOCKS = 2


def train(rank: int, world_size: int, out: Path, args: argparse.Namespace) -> None:
    torch.manual_seed(0)  # every rank builds the same full model, then keeps its shard
    width, hidden = args.width, 4 * args.width
    block = nn.Sequential(
        *[m for _ in range(BLOCKS) for m in (nn.Linear(width, hidden), nn.GELU(), nn.Linear(hidden, width))]
    )
    mesh = init_device_mesh("cpu", (world_size,), mesh_dim_names=("tp",), backend_override={"tp": "gloo"})
    plan = {str(3 * b): ColwiseParallel() for b in range(BLOCKS)}
    plan |= {str(3 * b + 2): RowwiseParallel() for b in range(BLOCKS)}
    block = parallelize_module(block, mesh, plan)
    optimizer = torch.optim.SGD(block.parameters(), lr=0.01)
    generator = torch.Generator().manual_seed(1)  # the same batch on every rank, as TP requires
    with _cluster_job.profiled(out, rank, args.active) as prof:
        for _ in range(_cluster_job.total_steps(args.active)):
            inputs = torch.randn(args.batch_size, args.width, generator=generator)
            block(inputs).pow(2).mean().backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            prof.step()


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("demo_output/tp"), help="run folders go here")
    parser.add_argument("--world-size", type=int, default=2)
    parser.add_argument("--width", type=int, default=64)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--active", type=int, default=3, help="profiled steps")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    _cluster_job.launch(train, args.world_size, args.out, args)
    print(f"tensor-parallel job of {args.world_size} ranks written under {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
