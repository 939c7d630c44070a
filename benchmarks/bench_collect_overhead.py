"""What collection costs a real training step: no profiler vs torch.profiler vs perfsight, side by side.

Why this exists: the issue's targets are relative -- perfsight Level0 within 1% of step time of
``torch.profiler`` with the same activities, and the communication and data-loader captures each
adding at most 1% of step time.  A relative figure is only meaningful when the variants run in
the same job, interleaved, on the same warm process: this script does exactly that.

The job: ``--ranks`` processes (gloo, CPU, one thread each) train a DDP MLP on batches from a
DataLoader with one worker process, and all-reduce the loss for the log each step (DDP's own
gradient all-reduce is issued from C++ and never reaches the Python capture; the loss all-reduce
does); a step is well above 20 ms.  Every repetition runs every variant once, in a shuffled
order (seeded, the same on every rank: DDP keeps the ranks in lockstep), after a ``gc.collect()``:

* ``none``                -- no profiler;
* ``torch.profiler``      -- ``torch.profiler.profile(activities=[CPU])``;
* ``perfsight Level0/1/2`` -- ``perfsight.profile(activities=[CPU], experimental_config=...)``
  (skipped, and said so, when ``perfsight.profile`` cannot be imported);
* ``comm capture``        -- no profiler, perfsight's communication capture installed;
* ``dataloader capture``  -- no profiler, perfsight's data-loader capture installed.

Profilers run with a schedule whose active window covers every measured step and no
``on_trace_ready``: what is timed is the step while recording, not writing the trace afterwards.
A variant's figure is the median step time of rank 0 over its steps, then the median over the
repetitions; overheads are differences of those medians, as a percentage of the ``none`` step.
Two clocks: wall time (what a user waits for) and the training process's CPU time (what the
instrumentation itself costs; on a shared, overloaded machine the wall clock mostly measures the
neighbours).  Work done inside DataLoader worker processes is in neither CPU figure.

Usage::

    python benchmarks/bench_collect_overhead.py [--ranks 2] [--reps 5] [--steps 15] [--json OUT]

Last, because a 1% difference drowns in the noise of whole steps on a shared machine, the cost
of each capture per call is measured directly (``_per_call_costs``) and scaled to the step.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import os
import random
import socket
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.utils.data import DataLoader, Dataset

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from perfsight.collect.comm_capture import CommCapture  # noqa: E402
from perfsight.collect.dataloader_capture import DataLoaderCapture  # noqa: E402

WARMUP_STEPS = 2
OPS_PER_STEP = 1  # Python-issued collectives per training step (the loss all-reduce)
HIDDEN = 512
BATCH = 256


class Samples(Dataset):
    """Synthetic samples with a little per-sample work (normalisation), as a real dataset has."""

    def __len__(self) -> int:
        return 10**6

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        g = torch.Generator().manual_seed(index)
        x = torch.randn(HIDDEN, generator=g)
        return (x - x.mean()) / (x.std() + 1e-6), torch.randn(HIDDEN, generator=g)


def _variants() -> dict[str, Callable[[int], contextlib.AbstractContextManager[Any]]]:
    """Variant name -> factory(steps) of a context manager whose value has ``step()`` (or None)."""

    def window(steps: int) -> Any:
        return torch.profiler.schedule(wait=0, warmup=0, active=steps + WARMUP_STEPS + 2, repeat=1)

    def torch_profiler(steps: int) -> Any:
        return torch.profiler.profile(
            activities=[torch.profiler.ProfilerActivity.CPU], schedule=window(steps)
        )

    @contextlib.contextmanager
    def installed(capture: Any) -> Iterator[None]:
        capture.install()
        try:
            yield None
        finally:
            capture.uninstall()

    variants: dict[str, Callable[[int], Any]] = {
        "none": lambda steps: contextlib.nullcontext(),
        "torch.profiler": torch_profiler,
    }
    try:
        import perfsight

        for level in ("Level0", "Level1", "Level2"):

            def perfsight_profile(steps: int, level: str = level) -> Any:
                config = perfsight.ExperimentalConfig(profiler_level=perfsight.ProfilerLevel(level))
                return perfsight.profile(
                    activities=[perfsight.ProfilerActivity.CPU],
                    schedule=window(steps),
                    experimental_config=config,
                )

            variants[f"perfsight {level}"] = perfsight_profile
    except (ImportError, AttributeError) as exc:
        print(f"perfsight.profile not available ({exc}); its levels are not measured", file=sys.stderr)
    variants["comm capture"] = lambda steps: installed(CommCapture())
    variants["dataloader capture"] = lambda steps: installed(DataLoaderCapture())
    return variants


def _train(rank: int, world: int, port: int, reps: int, steps: int, out: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    torch.manual_seed(0)
    layers: list[torch.nn.Module] = []
    for _ in range(4):
        layers += [torch.nn.Linear(HIDDEN, HIDDEN), torch.nn.ReLU()]
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Sequential(*layers))
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    variants = _variants()
    names = list(variants)
    times: dict[str, list[float]] = {name: [] for name in names}
    cpu: dict[str, list[float]] = {name: [] for name in names}
    for rep in range(reps):
        order = random.Random(rep).sample(names, len(names))  # same order on every rank, new each rep
        for name in order:
            gc.collect()  # the previous variant's garbage (a profiler's events) is not this one's cost
            with variants[name](steps) as prof:
                loader = iter(
                    DataLoader(
                        Samples(),
                        batch_size=BATCH,
                        num_workers=1,
                        prefetch_factor=4,
                        multiprocessing_context="fork",
                    )
                )  # fork, as under torchrun (mp.spawn's children would spawn their workers)
                step_s, step_cpu_s = [], []
                for index in range(WARMUP_STEPS + steps):
                    started, started_cpu = time.perf_counter(), time.process_time()
                    x, y = next(loader)
                    optimizer.zero_grad()
                    loss = torch.nn.functional.mse_loss(model(x), y)
                    loss.backward()
                    optimizer.step()
                    dist.all_reduce(loss.detach())  # the mean loss for the log, as training scripts do
                    if prof is not None:
                        prof.step()
                    if index >= WARMUP_STEPS:
                        step_s.append(time.perf_counter() - started)
                        step_cpu_s.append(time.process_time() - started_cpu)
                del loader
            times[name].append(statistics.median(step_s))
            cpu[name].append(statistics.median(step_cpu_s))
    if rank == 0:
        Path(out).write_text(json.dumps({"wall": times, "cpu": cpu}))
    dist.destroy_process_group()


class Tiny(Dataset):
    """Samples that cost nothing, with a transform: what is timed is the loader machinery."""

    def __init__(self) -> None:
        self.transform = torch.neg

    def __len__(self) -> int:
        return 10**7

    def __getitem__(self, index: int) -> torch.Tensor:
        return self.transform(torch.zeros(1))


def _per_call_costs(rounds: int, calls: int) -> dict[str, float]:
    """Microseconds each capture adds per op / per batch, measured directly (1-rank gloo group in
    this process, capture off and on interleaved, median over rounds): a figure the noise of a
    whole training step hides.  CPU time of the calling thread, where the wrappers run (gloo's
    own work runs on its worker thread and is the same with and without the capture)."""
    import tempfile

    results: dict[str, list[float]] = {"comm off": [], "comm on": [], "loader off": [], "loader on": []}
    with tempfile.TemporaryDirectory() as folder:
        dist.init_process_group("gloo", init_method=f"file://{folder}/store", rank=0, world_size=1)
        x = torch.ones(1)
        for _ in range(rounds):
            for on in (False, True):
                capture = CommCapture()
                if on:
                    capture.install()
                started = time.thread_time()
                for _ in range(calls):
                    dist.all_reduce(x)
                results["comm on" if on else "comm off"].append((time.thread_time() - started) / calls)
                capture.uninstall()
                loader_capture = DataLoaderCapture()
                if on:
                    loader_capture.install()
                batches = iter(DataLoader(Tiny(), batch_size=1, num_workers=0))
                started = time.thread_time()
                for _ in range(calls):
                    next(batches)
                results["loader on" if on else "loader off"].append((time.thread_time() - started) / calls)
                loader_capture.uninstall()
        dist.destroy_process_group()
    med = {name: statistics.median(values) * 1e6 for name, values in results.items()}
    return {
        "comm_us_per_op": med["comm on"] - med["comm off"],
        "all_reduce_us": med["comm off"],
        "loader_us_per_batch": med["loader on"] - med["loader off"],
        "next_us": med["loader off"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--steps", type=int, default=15)
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args()
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    result = Path(f"/tmp/perfsight_bench_collect_{os.getpid()}.json")
    mp.spawn(_train, args=(args.ranks, port, args.reps, args.steps, str(result)), nprocs=args.ranks)
    measured = json.loads(result.read_text())
    result.unlink()
    print(
        f"{args.ranks} ranks (gloo, 1 thread each), {args.reps} interleaved repetitions x {args.steps} steps"
    )
    medians = {}
    for clock, label in (("wall", "wall-clock"), ("cpu", "CPU time of the training process")):
        times = measured[clock]
        median = medians[clock] = {name: statistics.median(values) for name, values in times.items()}
        base = median["none"]
        print(f"\n{label}, rank 0:")
        print(f"{'variant':<22} {'step ms (median)':>17} {'min..max over reps':>20} {'vs none':>9}")
        for name, value in median.items():
            spread = f"{min(times[name]) * 1e3:.1f}..{max(times[name]) * 1e3:.1f}"
            print(f"{name:<22} {value * 1e3:>17.2f} {spread:>20} {100 * (value - base) / base:>+8.2f}%")
        if "perfsight Level0" in median:
            extra = 100 * (median["perfsight Level0"] - median["torch.profiler"]) / base
            print(f"perfsight Level0 vs torch.profiler: {extra:+.2f}% of step")
    costs = _per_call_costs(rounds=7, calls=2000)
    step_ms = medians["cpu"]["none"] * 1e3
    print(
        f"\nper call (calling thread's CPU; 1-rank gloo, 7 interleaved rounds x 2000 calls): comm capture "
        f"{costs['comm_us_per_op']:+.1f} us per op (all_reduce itself {costs['all_reduce_us']:.1f} us); "
        f"data-loader capture {costs['loader_us_per_batch']:+.1f} us per batch (next() itself "
        f"{costs['next_us']:.1f} us, num_workers=0: wait and fetch wrappers both in this process)"
    )
    print(
        f"in the training step above ({OPS_PER_STEP} Python-issued op, 1 batch, {step_ms:.1f} ms CPU): "
        f"comm capture {100 * OPS_PER_STEP * costs['comm_us_per_op'] / 1e3 / step_ms:.3f}% of the step, "
        f"data-loader capture {100 * costs['loader_us_per_batch'] / 1e3 / step_ms:.3f}%"
    )
    if args.json:
        args.json.write_text(
            json.dumps({"times_s": measured, "median_s": medians, "per_call": costs}, indent=1)
        )


if __name__ == "__main__":
    main()
