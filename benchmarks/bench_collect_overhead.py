"""What collection costs a real training step: no profiler vs torch.profiler vs perfsight, side by side.

Why this exists: the issue's targets are relative -- perfsight Level0 within 1% of step time of
``torch.profiler`` with the same activities, and the communication and data-loader captures each
adding at most 1% of step time.  A relative figure is only meaningful when the variants run in
the same job, interleaved, on the same warm process, and when the benchmark says how small a
difference it can resolve: this script does both.

The job: ``--ranks`` processes (gloo, CPU, one thread each) train a DDP MLP on batches from a
DataLoader with one forked worker, and all-reduce the loss for the log each step (DDP's own
gradient all-reduce is issued from C++; the loss all-reduce reaches the Python capture); a step
costs well over 20 ms of CPU.  Variants, each a block of ``--steps`` measured steps after 2
warm-up steps, after a ``gc.collect()``; the loader's worker is forked once, before them all (see
``_train``: a fork per variant adds copy-on-write page faults that swamp the effects measured):

* ``none`` and ``none (A/A)`` -- no profiler, twice: their difference is the benchmark's own noise;
* ``torch.profiler``      -- ``torch.profiler.profile(activities=[CPU])``;
* ``perfsight Level0/1/2`` -- ``perfsight.profile(activities=[CPU], experimental_config=...)``;
* ``comm capture``        -- no profiler, perfsight's communication capture installed;
* ``dataloader capture``  -- no profiler, perfsight's data-loader capture installed (in the training
  process: the worker forked before it; its worker-side wrappers are timed in ``_micro_costs``).

Order: one repetition runs every variant once; the orders of consecutive repetitions form a
Williams square (every variant follows every other exactly once per ``len(variants)``
repetitions), with the variant names shuffled by a per-run seed.  Why: a variant's cost also
depends on what ran before it (the memory the previous variant freed is faulted back in, a
profiler's teardown); a fixed order turns that into a systematic bias that repeats in every run.

Measures per step (rank 0): wall time, CPU time of the training process (``process_time``: all
its threads, gloo's included), CPU time of the training thread (``thread_time``: where the
wrappers run) and minor page faults.  A variant's figure in a repetition is its median step; the
overhead is the median over repetitions of the *paired* difference (variant - ``none`` in the same
repetition) as a percentage of the ``none`` step, with a 95% bootstrap interval.  The interval of
``none (A/A)`` is the resolution of the whole-step method on this machine.  Under that
resolution, each cost is measured directly as well: microseconds per ``prof.step()``, per
captured op and per batch (``_micro_costs``), with the number of ops and batches the captures
actually saw per step.

Usage::

    python benchmarks/bench_collect_overhead.py [--ranks 2] [--reps 16] [--steps 6] [--seed N] [--json OUT]
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import os
import random
import resource
import socket
import statistics
import sys
import tempfile
import time
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.utils.data import DataLoader, Dataset

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

import perfsight  # noqa: E402
from perfsight.collect.comm_capture import CommCapture  # noqa: E402
from perfsight.collect.dataloader_capture import DataLoaderCapture  # noqa: E402

WARMUP_STEPS = 2
HIDDEN = 512
BATCH = 256
CLOCKS = ("wall", "process", "thread")


class Samples(Dataset):
    """Synthetic samples with a little per-sample work (normalisation), as a real dataset has."""

    def __len__(self) -> int:
        return 10**6

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        g = torch.Generator().manual_seed(index)
        x = torch.randn(HIDDEN, generator=g)
        return (x - x.mean()) / (x.std() + 1e-6), torch.randn(HIDDEN, generator=g)


def _perfsight(level: str, steps: int) -> Any:
    """Recording from the first step to past the last (each with its own ``schedule``, as a user
    switching imports writes it): what is timed is the step while recording, not the export."""
    config = perfsight.ExperimentalConfig(profiler_level=perfsight.ProfilerLevel(level))
    window = perfsight.schedule(wait=0, warmup=0, active=steps + WARMUP_STEPS + 2, repeat=1)
    return perfsight.profile(
        activities=[perfsight.ProfilerActivity.CPU], schedule=window, experimental_config=config
    )


def _torch_profiler(steps: int) -> Any:
    window = torch.profiler.schedule(wait=0, warmup=0, active=steps + WARMUP_STEPS + 2, repeat=1)
    return torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], schedule=window)


@contextlib.contextmanager
def _installed(capture: Any) -> Iterator[Any]:
    capture.install()
    try:
        yield capture
    finally:
        capture.uninstall()


VARIANTS: dict[str, Callable[[int], Any]] = {
    "none": lambda steps: contextlib.nullcontext(),
    "none (A/A)": lambda steps: contextlib.nullcontext(),
    "torch.profiler": _torch_profiler,
    "perfsight Level0": lambda steps: _perfsight("Level0", steps),
    "perfsight Level1": lambda steps: _perfsight("Level1", steps),
    "perfsight Level2": lambda steps: _perfsight("Level2", steps),
    "comm capture": lambda steps: _installed(CommCapture()),
    "dataloader capture": lambda steps: _installed(DataLoaderCapture()),
}


def williams_orders(names: list[str], reps: int, seed: int) -> list[list[str]]:
    """Orders for ``reps`` repetitions: rows of a Williams square over the shuffled names, so that
    over each ``len(names)`` rows every name directly follows every other name exactly once
    (for an even count; an odd count gets each pair once in each direction over two squares)."""
    n = len(names)
    shuffled = random.Random(seed).sample(names, n)
    first, low, high = [0], 1, n - 1
    while len(first) < n:
        first.append(low)
        low += 1
        if len(first) < n:
            first.append(high)
            high -= 1
    rows = [[shuffled[(j + i) % n] for j in first] for i in range(n)]
    if n % 2:
        rows += [list(reversed(row)) for row in rows]
    return [rows[rep % len(rows)] for rep in range(reps)]


def _train(rank: int, world: int, port: int, reps: int, steps: int, seed: int, out: str) -> None:
    warnings.filterwarnings("ignore", category=UserWarning)  # schedules longer than a block, on purpose
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    torch.manual_seed(0)
    layers: list[torch.nn.Module] = []
    for _ in range(4):
        layers += [torch.nn.Linear(HIDDEN, HIDDEN), torch.nn.ReLU()]
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Sequential(*layers))
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    names = list(VARIANTS)
    # figures[clock][variant] = per repetition, the measured steps' values; faults likewise
    figures: dict[str, dict[str, list[list[float]]]] = {
        c: {n: [] for n in names} for c in (*CLOCKS, "faults")
    }
    seen: dict[str, list[float]] = {"comm python ops": [], "comm flight-recorder ops": [], "batches": []}
    # one loader for the whole run, its worker forked before any variant: a worker forked per variant
    # makes every page the training process then writes a copy-on-write fault (hundreds per step,
    # varying with what the previous variant left in the heap) -- noise larger than the effects
    # measured here.  The data-loader capture's worker side is timed by _micro_costs instead.
    dataset = Samples()
    loader = iter(
        DataLoader(
            dataset, batch_size=BATCH, num_workers=1, prefetch_factor=4, multiprocessing_context="fork"
        )
    )
    for order in williams_orders(names, reps, seed):  # same order on every rank: DDP keeps lockstep
        for name in order:
            gc.collect()  # the previous variant's garbage (a profiler's events) is not this one's cost
            with VARIANTS[name](steps) as prof:
                per_step: dict[str, list[float]] = {c: [] for c in (*CLOCKS, "faults")}
                for index in range(WARMUP_STEPS + steps):
                    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
                    wall, cpu, thread = time.perf_counter(), time.process_time(), time.thread_time()
                    x, y = next(loader)
                    optimizer.zero_grad()
                    loss = torch.nn.functional.mse_loss(model(x), y)
                    loss.backward()
                    optimizer.step()
                    dist.all_reduce(loss.detach())  # the mean loss for the log, as training scripts do
                    if hasattr(prof, "step"):
                        prof.step()
                    if index >= WARMUP_STEPS:
                        per_step["thread"].append(time.thread_time() - thread)
                        per_step["process"].append(time.process_time() - cpu)
                        per_step["wall"].append(time.perf_counter() - wall)
                        per_step["faults"].append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults)
                _count_seen(prof, seen, WARMUP_STEPS + steps)
            for clock, values in per_step.items():
                figures[clock][name].append(values)
    if rank == 0:
        Path(out).write_text(json.dumps({"figures": figures, "seen": seen}))
    dist.destroy_process_group()


def _count_seen(capture: Any, seen: dict[str, list[float]], steps: int) -> None:
    """What a capture intercepted per step (outside the timed steps): the evidence for its cost."""
    if isinstance(capture, CommCapture):
        sources = capture.table().column("source").to_pylist()
        seen["comm python ops"].append(sources.count("python") / steps)
        seen["comm flight-recorder ops"].append(sources.count("flight_recorder") / steps)
    elif isinstance(capture, DataLoaderCapture):
        kinds = capture.table().column("kind").to_pylist()
        seen["batches"].append(kinds.count("wait") / steps)


class Tiny(Dataset):
    """Samples that cost nothing, with a transform: what is timed is the loader machinery."""

    def __init__(self) -> None:
        self.transform = torch.neg

    def __len__(self) -> int:
        return 10**7

    def __getitem__(self, index: int) -> torch.Tensor:
        return self.transform(torch.zeros(1))


def _micro_costs(rounds: int, calls: int) -> dict[str, float]:
    """Microseconds per call, measured directly (CPU time of the calling thread, off and on
    interleaved, median over rounds): ``prof.step()`` of torch.profiler and of perfsight.profile
    at Level0 while recording, one all_reduce on a 1-rank gloo group in this process with and
    without the comm capture, one ``next()`` on a DataLoader with and without the data-loader
    capture.  These are what the noise of a whole training step hides."""
    samples: dict[str, list[float]] = {}

    def timed(name: str, body: Callable[[], None]) -> None:
        started = time.thread_time()
        body()
        samples.setdefault(name, []).append((time.thread_time() - started) / calls * 1e6)

    def steps(prof: Any) -> None:
        for _ in range(calls):
            prof.step()

    def all_reduces(x: torch.Tensor) -> None:
        for _ in range(calls):
            dist.all_reduce(x)

    def batches(loader: Iterator[Any]) -> None:
        for _ in range(calls):
            next(loader)

    with tempfile.TemporaryDirectory() as folder:
        dist.init_process_group("gloo", init_method=f"file://{folder}/store", rank=0, world_size=1)
        x = torch.ones(1)
        for round_index in range(rounds):
            for on in (False, True) if round_index % 2 else (True, False):
                prof = _perfsight("Level0", calls) if on else _torch_profiler(calls)
                prof.start()
                timed("perfsight step" if on else "torch step", lambda prof=prof: steps(prof))
                prof.stop()
                with _installed(CommCapture()) if on else contextlib.nullcontext():
                    timed(f"comm {on}", lambda: all_reduces(x))
                with _installed(DataLoaderCapture()) if on else contextlib.nullcontext():
                    loader = iter(DataLoader(Tiny(), batch_size=1, num_workers=0))
                    timed(f"loader {on}", lambda loader=loader: batches(loader))
        dist.destroy_process_group()
    med = {name: statistics.median(values) for name, values in samples.items()}
    return {
        "torch_step_us": med["torch step"],
        "perfsight_step_us": med["perfsight step"],
        "step_extra_us": med["perfsight step"] - med["torch step"],
        "all_reduce_us": med["comm False"],
        "comm_us_per_op": med["comm True"] - med["comm False"],
        "next_us": med["loader False"],
        "loader_us_per_batch": med["loader True"] - med["loader False"],
    }


def paired_overhead(variant: list[float], base: list[float], resamples: int = 4000) -> tuple[float, ...]:
    """Median over repetitions of (variant - base) as % of the median base, and its 95% bootstrap
    interval (repetitions resampled with replacement)."""
    diffs = np.asarray(variant) - np.asarray(base)
    scale = 100 / statistics.median(base)
    boot = np.median(np.random.default_rng(0).choice(diffs, (resamples, diffs.size)), axis=1)
    low, high = np.percentile(boot, [2.5, 97.5])
    return float(np.median(diffs) * scale), float(low * scale), float(high * scale)


def report(figures: dict[str, dict[str, list[list[float]]]], seen: dict[str, list[float]]) -> dict[str, Any]:
    """Print the tables and return the summary (also written by ``--json``).  A block's figure is
    its median step; the training thread's CPU time also with the block's fastest step, which
    interference from other processes (caches, memory bandwidth) can only make slower."""
    summary: dict[str, Any] = {}
    for clock, label, block_stat in (
        ("thread", "CPU time of the training thread", statistics.median),
        ("thread", "CPU time of the training thread, fastest step of each block", min),
        ("process", "CPU time of the training process", statistics.median),
        ("wall", "wall-clock", statistics.median),
    ):
        times = {name: [block_stat(steps) for steps in reps] for name, reps in figures[clock].items()}
        base = times["none"]
        key = clock if block_stat is not min else f"{clock} (block min)"
        print(f"\n{label}, rank 0 (ms per step; overhead = paired median difference, 95% bootstrap CI):")
        print(f"{'variant':<20} {'median':>8} {'min..max over reps':>19} {'vs none':>8} {'95% CI':>17}")
        rows = summary[key] = {}
        for name, values in times.items():
            mid, low, high = paired_overhead(values, base)
            rows[name] = {"ms": statistics.median(values) * 1e3, "vs_none_pct": [mid, low, high]}
            spread = f"{min(values) * 1e3:.1f}..{max(values) * 1e3:.1f}"
            ci = f"[{low:+.2f}, {high:+.2f}]" if name != "none" else ""
            vs = f"{mid:+.2f}%" if name != "none" else "-"
            print(f"{name:<20} {statistics.median(values) * 1e3:>8.2f} {spread:>19} {vs:>8} {ci:>17}")
        mid, low, high = paired_overhead(times["perfsight Level0"], times["torch.profiler"])
        # as % of the torch.profiler step; the target reads "of step time"
        rows["Level0 - torch.profiler"] = [mid, low, high]
        print(f"perfsight Level0 - torch.profiler: {mid:+.2f}% of step [{low:+.2f}, {high:+.2f}]")
    faults = {name: statistics.median(sum(reps, [])) for name, reps in figures["faults"].items()}
    summary["minor_faults_per_step"] = faults
    print("\nminor page faults per step (median): " + ", ".join(f"{k} {v:.0f}" for k, v in faults.items()))
    summary["seen_per_step"] = {name: statistics.median(v) for name, v in seen.items() if v}
    print(
        "intercepted per step: "
        + ", ".join(f"{name} {value:.2f}" for name, value in summary["seen_per_step"].items())
    )
    return summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--reps", type=int, default=16, help="repetitions (a multiple of 8 balances order)")
    parser.add_argument("--steps", type=int, default=6, help="measured steps per variant and repetition")
    parser.add_argument("--seed", type=int, default=None, help="shuffles the variant order (default: random)")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args()
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(10**6)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    started, load = time.monotonic(), os.getloadavg()
    with tempfile.TemporaryDirectory() as folder:
        result = Path(folder) / "rank0.json"
        mp.spawn(_train, args=(args.ranks, port, args.reps, args.steps, seed, str(result)), nprocs=args.ranks)
        measured = json.loads(result.read_text())
    print(
        f"{args.ranks} ranks (gloo, 1 thread each), {args.reps} repetitions x {len(VARIANTS)} variants x "
        f"{args.steps} steps, order seed {seed}, load average {load[0]:.1f} at start, "
        f"{os.getloadavg()[0]:.1f} at end, {time.monotonic() - started:.0f} s"
    )
    summary = report(measured["figures"], measured["seen"])
    warnings.filterwarnings("ignore", category=UserWarning)
    micro = _micro_costs(rounds=7, calls=2000)
    thread_ms = summary["thread"]["none"]["ms"]
    process_ms = summary["process"]["none"]["ms"]
    seen = summary["seen_per_step"]
    print(
        f"\nper call (calling thread's CPU, 7 interleaved rounds x 2000 calls): prof.step() torch.profiler "
        f"{micro['torch_step_us']:.1f} us, perfsight Level0 {micro['perfsight_step_us']:.1f} us "
        f"({micro['step_extra_us']:+.1f} us); comm capture {micro['comm_us_per_op']:+.1f} us per op "
        f"(all_reduce itself {micro['all_reduce_us']:.1f} us); data-loader capture "
        f"{micro['loader_us_per_batch']:+.1f} us per batch (next() itself {micro['next_us']:.1f} us)"
    )
    comm_pct = 100 * seen.get("comm python ops", 0) * micro["comm_us_per_op"] / 1e3 / process_ms
    loader_pct = 100 * seen.get("batches", 0) * micro["loader_us_per_batch"] / 1e3 / process_ms
    step_pct = 100 * micro["step_extra_us"] / 1e3 / process_ms
    print(
        f"scaled to the step above ({process_ms:.1f} ms process CPU, {thread_ms:.1f} ms thread CPU, with the "
        f"ops and batches intercepted per step): perfsight Level0 step() {step_pct:+.4f}% vs torch.profiler, "
        f"comm capture {comm_pct:+.4f}%, data-loader capture {loader_pct:+.4f}%"
    )
    if args.json:
        args.json.write_text(
            json.dumps({"measured": measured, "summary": summary, "micro_us": micro, "seed": seed}, indent=1)
        )


if __name__ == "__main__":
    main()
