"""A tiny single-process training job under ``perfsight.profile``, run by the collection tests.

Why a script: the "never hurt the training job" tests need a separate process they can kill with
SIGKILL or run on a size-limited filesystem, and must see the job's own exit status.  It prints
``trained N steps`` when the training loop finished, whatever happened to profiling.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys

import torch

import perfsight


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--active", type=int, default=2)
    parser.add_argument("--kill-at", type=int, default=None, help="SIGKILL this process at this step")
    parser.add_argument("--analyse", action="store_true")
    parser.add_argument(
        "--wrap", action="store_true", help="the user's own on_trace_ready calls perfsight's handler"
    )
    parser.add_argument("--extra-ops", type=int, default=0, help="small ops per step (a bigger trace)")
    args = parser.parse_args()

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    handler = perfsight.tensorboard_trace_handler(args.out, analyse_flag=args.analyse)

    def users_own_handler(prof: object) -> None:  # as users write them: log, then hand on
        print(f"window ready at step {prof.step_num}", flush=True)
        handler(prof)

    with perfsight.profile(
        schedule=perfsight.schedule(wait=0, warmup=0, active=args.active, repeat=0),
        on_trace_ready=users_own_handler if args.wrap else handler,
        record_shapes=True,
    ) as prof:
        for step in range(args.steps):
            if step == args.kill_at:
                os.kill(os.getpid(), signal.SIGKILL)
            small = torch.ones(4)
            for _ in range(args.extra_ops):
                small = small.add(1)
            loss = model(torch.randn(8, 32)).square().mean()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            prof.step()
    print(f"trained {args.steps} steps; profiling {'on' if prof.enabled else 'off'}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
