"""What the data-loader capture costs a data-heavy loop: many small batches from 2 workers, with and
without capture, in fresh processes, paired, with an A/A control that shows the machine's noise.

Why beside ``bench_collect_overhead.py``: that benchmark's loop is compute-heavy (a DDP step of
well over 20 ms), where a few microseconds per batch vanish.  Here the step is a small matmul and
each batch is 16 CIFAR-sized samples through a three-transform Compose, so the loop runs at about
a millisecond a batch and every wrapper the capture adds (``__next__``, the sampler, each
transform of each sample, ``collate_fn``, the worker's record) is a visible share of it.

Method (built for a shared, noisy machine):

* every run is a fresh process (``--child``): imports, its own DataLoader workers, one epoch of
  ``--batches`` batches; with capture, the capture is installed before the workers start;
* per step (one loop iteration: ``next()`` plus the matmul) the run records the wall time and the
  training process's own CPU time (``process_time``: all its threads, not the workers); the run's
  figure is the mean step after ``WARMUP`` steps (not the median: with 2 workers the steps are
  bimodal, batches arriving in pairs, and the median jumps between the modes).  The workers' CPU
  time per batch comes from ``RUSAGE_CHILDREN`` once they have exited;
* one repetition runs six processes ``X Y Z Z Y X`` (ABBA-nested, so a linear drift of the
  machine cancels), ``X`` uncaptured, ``Y``/``Z`` the captured run and a second uncaptured run
  (``A'``), swapping places every repetition;
* each captured run is paired with the uncaptured run at the mirrored position, and each ``A'``
  likewise: the overhead is the median of the paired differences (as % of the uncaptured run),
  with a 95% bootstrap interval over the pairs; the same estimator on the ``A'`` pairs is the
  noise floor the capture's figure must be read against.

Batches are checked equal between every captured run and its uncaptured pair.

Under that noise floor, the capture's cost is also measured directly (``direct``): the thread CPU
time its wrappers add per batch on the training thread and on a worker's fetch path, in blocks
with and without capture alternating in one process, and as a share of the CPU one uncaptured
batch costs (training process + workers; with workers an upper bound, the training thread's
figure including the fetch path that the workers run).

Usage::

    python benchmarks/bench_dataloader_overhead.py [--reps 10] [--batches 600] [--workers 2] [--json OUT]
    python benchmarks/bench_dataloader_overhead.py --direct-only [--direct-reps 60]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset

BATCH = 16
WARMUP = 30
METRICS = {
    "wall_us": "wall time per step",
    "cpu_us": "training-process CPU per step",
    "worker_cpu_us": "workers' CPU per batch",
}


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


def child(batches: int, workers: int, capture: bool, shape: tuple[int, ...]) -> dict:
    """One run in this (fresh) process: per-step figures of one epoch, and a checksum of the batches."""
    torch.set_num_threads(1)
    installed = None
    if capture:
        from perfsight.collect.dataloader_capture import DataLoaderCapture

        installed = DataLoaderCapture()
        installed.install()
    loader = DataLoader(Samples(batches * BATCH, shape), batch_size=BATCH, num_workers=workers)
    weight = torch.randn(shape[-1], 8, generator=torch.Generator().manual_seed(0))
    checksum = torch.zeros(())
    walls, cpus = [], []
    wall, cpu = time.perf_counter_ns(), time.process_time_ns()
    iterator = iter(loader)
    for batch in iterator:
        checksum += (batch @ weight).sum()
        now_wall, now_cpu = time.perf_counter_ns(), time.process_time_ns()
        walls.append(now_wall - wall)
        cpus.append(now_cpu - cpu)
        wall, cpu = now_wall, now_cpu
    del iterator  # workers joined: their CPU time is in RUSAGE_CHILDREN
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    rows = 0
    if installed is not None:
        rows = installed.table().num_rows
        installed.uninstall()
        assert rows > batches, f"the capture saw {rows} rows for {batches} batches"
    return {
        "wall_us": statistics.fmean(walls[WARMUP:]) / 1e3,
        "cpu_us": statistics.fmean(cpus[WARMUP:]) / 1e3,
        "worker_cpu_us": (children.ru_utime + children.ru_stime) / batches * 1e6 if workers else None,
        "checksum": float(checksum),
        "rows": rows,
    }


def _direct_blocks(run_block, reps: int) -> list[float]:
    """Paired blocks, order alternating: (captured - uncaptured) thread CPU us per batch."""
    from perfsight.collect.dataloader_capture import DataLoaderCapture

    diffs = []
    run_block()  # warm: imports, first allocations
    for rep in range(reps):
        per = {}
        for capture in (True, False) if rep % 2 else (False, True):
            installed = DataLoaderCapture() if capture else None
            if installed is not None:
                installed.install()
            try:
                per[capture] = run_block()
            finally:
                if installed is not None:
                    installed.table()
                    installed.uninstall()
        diffs.append(per[True] - per[False])
    return diffs


def direct(reps: int) -> dict:
    """What the capture's wrappers cost per batch, on the thread that runs them (thread CPU time,
    which a busy machine inflates far less than wall time): blocks of 50 batches with and without
    capture, alternating, in this process.  The samples are one-element tensors through the same
    three transforms, so a batch costs little besides the wrappers and the difference stands out
    of the noise; the wrappers' cost does not grow with the sample's size, except timing each
    transform, which the capture keeps within 0.5% of the fetch time after the first 8 fetches
    (``dataloader_stages.DETAIL_BUDGET``) and which these cheap fetches rarely reach.

    * ``training_us``: a ``num_workers=0`` loop whose loop also copies each batch (``.to(float64)``):
      every wrapper of the training process (``__next__``, sampler, queue probes, the copy watch)
      plus the fetch wrapper run on the training thread;
    * ``worker_us``: one worker's fetch path (a forked child of a capturing process, as a worker
      is: transforms, collate, the record written to its file)."""
    import multiprocessing

    from torch.utils.data._utils.collate import default_collate
    from torch.utils.data._utils.fetch import _MapDatasetFetcher

    torch.set_num_threads(1)
    dataset = Samples(50 * BATCH, (1,))  # one-element samples: the wrappers' cost is most of a batch

    def training_block() -> float:
        loader = DataLoader(dataset, batch_size=BATCH, num_workers=0)
        start = time.thread_time_ns()
        for batch in loader:
            batch.to(torch.float64)
        return (time.thread_time_ns() - start) / 50 / 1e3

    def worker_block() -> float:
        fetcher = _MapDatasetFetcher(dataset, True, default_collate, False)
        start = time.thread_time_ns()
        for i in range(50):
            fetcher.fetch(list(range(i * BATCH, (i + 1) * BATCH)))
        return (time.thread_time_ns() - start) / 50 / 1e3

    def in_worker(queue: Any) -> None:  # a forked process, as a DataLoader worker is
        queue.put(_direct_blocks(worker_block, reps))

    training = _direct_blocks(training_block, reps)
    from perfsight.collect.dataloader_capture import DataLoaderCapture

    owner = DataLoaderCapture()
    owner.install()  # the worker writes its records into this capture's folder, as a real worker
    try:
        context = multiprocessing.get_context("fork")
        queue = context.Queue()
        child_process = context.Process(target=in_worker, args=(queue,))
        child_process.start()
        worker = queue.get()
        child_process.join()
    finally:
        owner.uninstall()
    return {"training_us": training, "worker_us": worker}


def run_child(args: argparse.Namespace, capture: bool) -> dict:
    command = [
        sys.executable, __file__, "--child", "capture" if capture else "plain",
        "--batches", str(args.batches), "--workers", str(args.workers), "--shape", args.shape,
    ]  # fmt: skip
    out = subprocess.run(command, check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def bootstrap(values: list[float], rounds: int = 4000, seed: int = 0) -> tuple[float, float]:
    """95% interval of the median of ``values`` (pairs resampled with replacement)."""
    rng = random.Random(seed)
    medians = sorted(statistics.median(rng.choices(values, k=len(values))) for _ in range(rounds))
    return medians[int(0.025 * rounds)], medians[int(0.975 * rounds) - 1]


def paired(pairs: list[tuple[dict, dict]], metric: str) -> dict | None:
    """Median paired difference (% of the uncaptured run, and in us) with its bootstrap interval."""
    pairs = [(a, b) for a, b in pairs if a[metric] is not None and b[metric] is not None]
    if not pairs:
        return None
    pct = [(b[metric] - a[metric]) / a[metric] * 100 for a, b in pairs]
    us = [b[metric] - a[metric] for a, b in pairs]
    return {
        "base_us": statistics.median(a[metric] for a, _ in pairs),
        "pct": statistics.median(pct),
        "pct_ci": bootstrap(pct),
        "us": statistics.median(us),
        "us_ci": bootstrap(us),
        "pairs": len(pairs),
    }


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--reps", type=int, default=10)
    parser.add_argument("--batches", type=int, default=600)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--shape", default="3,32,32", help="one sample (CIFAR-sized by default)")
    parser.add_argument("--json", default=None)
    parser.add_argument("--direct-reps", type=int, default=60, help="pairs of blocks for the direct cost")
    parser.add_argument("--direct-only", action="store_true", help="only the direct cost (no ABBA runs)")
    parser.add_argument("--child", choices=("plain", "capture", "direct"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    shape = tuple(int(n) for n in args.shape.split(","))
    if args.child == "direct":
        print(json.dumps(direct(args.direct_reps)))
        return 0
    if args.child:
        print(json.dumps(child(args.batches, args.workers, args.child == "capture", shape)))
        return 0
    captured: list[tuple[dict, dict]] = []
    control: list[tuple[dict, dict]] = []
    for rep in range(0 if args.direct_only else args.reps):
        middle, inner = ("B", "A'") if rep % 2 == 0 else ("A'", "B")
        order = ["A", middle, inner, inner, middle, "A"]
        runs = [run_child(args, capture=(name == "B")) for name in order]
        for a, other, name in ((runs[0], runs[1], middle), (runs[5], runs[4], middle)) + (
            (runs[0], runs[2], inner),
            (runs[5], runs[3], inner),
        ):
            (captured if name == "B" else control).append((a, other))
        for a, b in captured[-2:]:
            assert a["checksum"] == b["checksum"], "the capture changed the batches"
        print(f"repetition {rep + 1}/{args.reps} done", file=sys.stderr, flush=True)
    command = [sys.executable, __file__, "--child", "direct", "--direct-reps", str(args.direct_reps)]
    costs = json.loads(
        subprocess.run(command, check=True, capture_output=True, text=True).stdout.splitlines()[-1]
    )
    direct_costs: dict[str, Any] = {
        name: {"us": statistics.median(values), "us_ci": bootstrap(values)} for name, values in costs.items()
    }
    result: dict[str, Any] = {
        "direct": direct_costs,
        "reps": args.reps,
        "batches": args.batches,
        "workers": args.workers,
        "batch_size": BATCH,
        "shape": list(shape),
        "machine": f"{platform.node()}: {os.cpu_count()} CPUs, {platform.platform()}",
        "load_average": os.getloadavg(),
    }
    training, worker = direct_costs["training_us"], direct_costs["worker_us"]
    print(
        f"direct cost per batch (thread CPU, {args.direct_reps} pairs of 50-batch blocks): "
        f"training thread (num_workers=0, all wrappers) {training['us']:+.2f} us "
        f"[{training['us_ci'][0]:+.2f}, {training['us_ci'][1]:+.2f}]; "
        f"worker fetch path {worker['us']:+.2f} us [{worker['us_ci'][0]:+.2f}, {worker['us_ci'][1]:+.2f}]"
    )
    if captured:
        result["capture"] = {m: paired(captured, m) for m in METRICS}
        result["a_a"] = {m: paired(control, m) for m in METRICS}
        print(
            f"{args.workers} workers, {BATCH} samples of {args.shape} x 3 transforms per batch, "
            f"{args.batches} batches per run, {args.reps} repetitions ({len(captured)} pairs each)"
        )
        for metric, label in METRICS.items():
            c, n = result["capture"][metric], result["a_a"][metric]
            if c is None or n is None:
                continue
            print(
                f"{label}: {c['base_us']:.1f} us; capture {c['pct']:+.2f}% [{c['pct_ci'][0]:+.2f}, "
                f"{c['pct_ci'][1]:+.2f}] ({c['us']:+.1f} us); A/A {n['pct']:+.2f}% "
                f"[{n['pct_ci'][0]:+.2f}, {n['pct_ci'][1]:+.2f}]"
            )
        # the direct cost as a share of the CPU one batch costs uncaptured (CPU against CPU: a busy
        # machine stretches wall time by descheduling, which thread CPU time does not see); with
        # workers, an upper bound: the training thread's figure includes the fetch path it does not run
        base = statistics.median(a["cpu_us"] for a, _ in captured)
        added = costs["training_us"]
        if args.workers:
            base += statistics.median(a["worker_cpu_us"] for a, _ in captured)
            added = [t + w for t, w in zip(costs["training_us"], costs["worker_us"], strict=False)]
        share = {"pct": statistics.median(added) / base * 100}
        share["pct_ci"] = tuple(v / base * 100 for v in bootstrap(added))
        share["batch_cpu_us"] = base
        direct_costs["share_of_batch_cpu"] = share
        print(
            f"direct cost as a share of the CPU of one batch ({base:.0f} us): {share['pct']:.2f}% "
            f"[{share['pct_ci'][0]:.2f}, {share['pct_ci'][1]:.2f}]"
        )
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
