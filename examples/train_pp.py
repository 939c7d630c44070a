"""A small pipeline-parallel training job: one stage per rank, micro-batches sent point to point.

Why this exists: the cluster analysis must recognise pipeline stages from a real job's p2p traffic,
measure each stage's compute, bubble and receive waits, and report an overloaded stage.  Each rank
holds one stage (a few linear layers) and ``--overload-stage S`` gives stage S extra layers so that
it dominates the pipeline.  By default the schedule is ``torch.distributed.pipelining``'s
(``PipelineStage`` + ``ScheduleGPipe``, or ``Schedule1F1B`` with ``--schedule 1f1b``) on gloo;
``--schedule manual`` runs the same GPipe step written out with ``dist.send``/``dist.recv`` (the
2-D example reuses it).  Each stage is given its input and output shapes, so the library does no
shape inference at start-up.

    python examples/train_pp.py --out runs/pp --stages 2 --overload-stage 1

It must stay importable without side effects: all work happens under ``main()``.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _cluster_job  # noqa: E402

WIDTH = 64


def make_stage(layers: int) -> nn.Module:
    return nn.Sequential(*[m for _ in range(layers) for m in (nn.Linear(WIDTH, WIDTH), nn.Tanh())])


def gpipe_step(
    stage: nn.Module, micro: int, micro_batches: int, prev: int | None, nxt: int | None
) -> torch.Tensor:
    """One GPipe step of this rank's stage: every micro-batch forward, then every one backward.

    ``prev`` / ``nxt``: global ranks of the previous / next stage (None at the ends of the pipe).
    Returns the mean loss over the micro-batches on the last stage, 0 elsewhere.
    """
    inputs, outputs, losses = [], [], [torch.zeros(())]
    for _ in range(micro_batches):
        if prev is None:
            x = torch.randn(micro, WIDTH)
        else:
            x = torch.empty(micro, WIDTH)
            dist.recv(x, src=prev)
            x.requires_grad_(True)
        y = stage(x)
        if nxt is not None:
            dist.send(y.detach(), dst=nxt)
        inputs.append(x)
        outputs.append(y)
    for x, y in zip(reversed(inputs), reversed(outputs), strict=True):  # last micro-batch first
        if nxt is None:
            loss = y.pow(2).mean()
            loss.backward()
            losses.append(loss.detach() / micro_batches)
        else:
            grad = torch.empty(micro, WIDTH)
            dist.recv(grad, src=nxt)
            y.backward(grad)
        if prev is not None:
            dist.send(x.grad, dst=prev)
    return torch.stack(losses).sum()


def library_schedule(
    stage: nn.Module, rank: int, world_size: int, args: argparse.Namespace
) -> Callable[[], torch.Tensor]:
    """One training step of ``torch.distributed.pipelining`` for this rank's stage; the step
    returns the mean loss on the last stage, 0 elsewhere."""
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

    micro = args.batch_size // args.micro_batches
    pipe_stage = PipelineStage(
        stage,
        stage_index=rank,
        num_stages=world_size,
        device=torch.device("cpu"),
        # shapes given up front: no metadata exchange; received activations need gradients
        input_args=(torch.empty(micro, WIDTH, requires_grad=rank > 0),),
        output_args=torch.empty(micro, WIDTH, requires_grad=True),
    )
    kind = Schedule1F1B if args.schedule == "1f1b" else ScheduleGPipe
    schedule = kind(pipe_stage, n_microbatches=args.micro_batches, loss_fn=lambda y, _t: y.pow(2).mean())
    target = torch.zeros(args.batch_size, WIDTH)

    def step() -> torch.Tensor:
        losses: list[torch.Tensor] = []
        if rank == 0:
            schedule.step(torch.randn(args.batch_size, WIDTH))
        elif rank == world_size - 1:
            schedule.step(target=target, losses=losses)
        else:
            schedule.step()
        return torch.stack(losses).mean().detach() if losses else torch.zeros(())

    return step


def train(rank: int, world_size: int, out: Path, args: argparse.Namespace) -> None:
    """Rank ``rank`` runs pipeline stage ``rank``."""
    torch.manual_seed(rank)
    layers = args.layers * (args.overload_factor if rank == args.overload_stage else 1)
    stage = make_stage(layers)
    optimizer = torch.optim.SGD(stage.parameters(), lr=0.01)
    if args.schedule == "manual":
        prev = rank - 1 if rank > 0 else None
        nxt = rank + 1 if rank < world_size - 1 else None
        micro = args.batch_size // args.micro_batches

        def step() -> torch.Tensor:
            return gpipe_step(stage, micro, args.micro_batches, prev, nxt)
    else:
        step = library_schedule(stage, rank, world_size, args)
    with _cluster_job.profiled(out, rank, args.active) as prof:
        for _ in range(_cluster_job.total_steps(args.active)):
            loss = step()
            if args.report_loss:  # the last stage's loss to every rank, as a training log would
                dist.all_reduce(loss.reshape(1))
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            prof.step()


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("demo_output/pp"), help="run folders go here")
    parser.add_argument("--stages", type=int, default=2, help="pipeline stages = ranks (2-4)")
    parser.add_argument("--layers", type=int, default=2, help="linear layers per stage")
    parser.add_argument("--overload-stage", type=int, default=-1, help="stage given extra layers")
    parser.add_argument("--overload-factor", type=int, default=4, help="how many times the layers")
    parser.add_argument("--micro-batches", type=int, default=4)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument(
        "--report-loss", action="store_true", help="all-reduce the step's loss over every stage"
    )
    parser.add_argument(
        "--schedule", choices=("gpipe", "1f1b", "manual"), default="gpipe",
        help="torch.distributed.pipelining's GPipe or 1F1B, or the explicit send/recv GPipe",
    )  # fmt: skip
    parser.add_argument("--active", type=int, default=3, help="profiled steps")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    _cluster_job.launch(train, args.stages, args.out, args)
    print(f"pipeline job of {args.stages} stages written under {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
