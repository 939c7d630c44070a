"""The diagnosis scenarios: small real training jobs (torch, gloo, CPU), each with one injected
bottleneck, plus a clean baseline, and what the advisor should name for each.

Why this exists: an advisor is only as good as the bottlenecks it names correctly.  Each scenario
runs a two-rank data-parallel MLP (or the pipeline example) for a few profiled steps with
``perfsight.profile`` (examples/_cluster_job.py) and injects exactly one cause; the benchmark
(benchmarks/bench_diagnosis.py) and the tests analyse the job and compare the top finding with the
expected category and culprit.

    python examples/scenarios/scenarios.py --list
    python examples/scenarios/scenarios.py slow_data --out runs/slow_data

Injections (each on top of the baseline):

* ``slow_data``: every sample takes 0.6 ms to load (an I/O wait in ``__getitem__``) on all ranks.
* ``straggler``: rank 1 does extra matrix products before its forward pass.
* ``pipeline_imbalance``: examples/train_pp.py with stage 1 given four times the layers.
* ``tiny_buckets``: DDP with ``bucket_cap_mb`` of a few KB: one all-reduce per gradient tensor.
* ``dtype_casts``: every layer's activations make float32 -> float64 -> float32 round trips.
* ``host_syncs``: the loss of every sample is read with ``.item()`` inside the step.
* ``gc_stall``: rank 1 holds a large heap of Python objects and runs a full ``gc.collect()``
  between its forward and backward passes.
* ``memory_churn``: every step allocates and fills large temporary buffers and drops them.
* ``slow_link`` (root only): a four-rank ring in network namespaces with ``tc`` rate-limiting the
  link from rank 1 to rank 2 (examples/scenarios/slow_link.py).

It must stay importable without side effects: all work happens under ``main()``.
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import BatchSampler, DataLoader, Dataset, SequentialSampler

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import _cluster_job  # noqa: E402

FEATURES = 128
WORLD_SIZE = 2


@dataclasses.dataclass(frozen=True)
class Scenario:
    """One injected bottleneck and what the advisor's top finding should say about it."""

    name: str
    category: str  # expected category of the top finding ("" for the baseline: nothing above info)
    culprit_kind: str
    culprit: str  # expected culprit name ("" when any name of that kind is right)
    fast: bool  # under ~30 s on two loaded cores: the tests run it
    steps: int = 5  # profiled steps (the first is dropped as warm-up)
    needs_root: bool = False  # sets up network namespaces and tc: skipped when not run as root


SCENARIOS: dict[str, Scenario] = {
    s.name: s
    for s in (
        Scenario("baseline", "", "", "", True),
        Scenario("slow_data", "data", "module", "DataLoader", True),
        Scenario("straggler", "compute", "rank", "1", True),
        Scenario("pipeline_imbalance", "compute", "stage", "1", True),
        # more steps: its exposed communication varies most from step to step on a shared machine
        Scenario("tiny_buckets", "communication", "module", "", False, steps=9),
        Scenario("dtype_casts", "compute", "op", "aten::_to_copy", False),
        Scenario("host_syncs", "scheduling", "op", "", False),
        Scenario("gc_stall", "host", "rank", "1", False),
        Scenario("memory_churn", "memory", "op", "", False),
        Scenario("slow_link", "communication", "link", "1->2", False, needs_root=True),
    )
}


class SlowDataset(Dataset):
    """Random samples read a batch at a time; ``delay_s`` per sample stands for a slow read (disk,
    network, decoding).

    Why a batch at a time: read sample by sample and collated, a profiled loader costs about 0.6 ms
    a step (one recorded op per sample), close to a tenth of this small model's step; on a loaded
    machine that crossed the data rule's threshold in the clean baseline.  One indexing op a batch
    keeps the baseline's loader negligible, as a fast store's would be; ``slow_data`` still waits
    ``delay_s`` for every sample.
    """

    def __init__(self, samples: int, delay_s: float) -> None:
        self.inputs = torch.randn(samples, FEATURES)
        self.delay_s = delay_s

    def __len__(self) -> int:
        return len(self.inputs)

    def __getitem__(self, indices: list[int]) -> torch.Tensor:
        if self.delay_s:
            time.sleep(self.delay_s * len(indices))
        return self.inputs[indices]


class Net(nn.Module):
    """An MLP whose forward pass can add dtype round trips and host syncs."""

    def __init__(self, hidden: int, layers: int, casts: int) -> None:
        super().__init__()
        sizes = [FEATURES] + [hidden] * layers
        self.layers = nn.ModuleList(nn.Linear(a, b) for a, b in zip(sizes, sizes[1:], strict=False))
        self.head = nn.Linear(hidden, 10)
        self.casts = casts

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = torch.relu(layer(x))
            for _ in range(self.casts):  # redundant precision round trips
                x = x.double().float()
        return self.head(x)


def _params(name: str) -> dict[str, Any]:
    return {
        "delay_s": 0.0006 if name == "slow_data" else 0.0,
        "straggler_rounds": 40 if name == "straggler" else 0,
        "bucket_cap_mb": 0.004 if name == "tiny_buckets" else 25.0,
        "layers": 8 if name == "tiny_buckets" else 4,
        "casts": 16 if name == "dtype_casts" else 0,
        "syncs": name == "host_syncs",
        "gc_heap": 1_500_000 if name == "gc_stall" else 0,
        "churn_buffers": 20 if name == "memory_churn" else 0,
    }


def train(rank: int, world_size: int, out: Path, args: argparse.Namespace) -> None:
    """One rank of the DDP scenario job (see the module docstring for the injections)."""
    p = _params(args.scenario)
    torch.manual_seed(0)
    model = DistributedDataParallel(
        Net(args.hidden, p["layers"], p["casts"]), bucket_cap_mb=p["bucket_cap_mb"]
    )
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    steps = _cluster_job.total_steps(args.active)
    dataset = SlowDataset(args.batch_size * steps, p["delay_s"])
    batches = BatchSampler(SequentialSampler(dataset), args.batch_size, drop_last=False)
    loader = DataLoader(dataset, batch_size=None, sampler=batches)  # the dataset reads whole batches
    extra = torch.randn(256, 256)
    rounds = p["straggler_rounds"] if rank == 1 else 0
    heap = [{"i": i} for i in range(p["gc_heap"])] if rank == 1 else []  # live objects a full GC walks
    with _cluster_job.profiled(out, rank, args.active) as prof:
        for inputs in loader:
            for _ in range(rounds):  # the straggler's extra work before it reaches the all-reduce
                extra = torch.tanh(extra @ extra)
            per_sample = model(inputs).pow(2).mean(dim=1)
            if heap:
                gc.collect()  # a full collection over the big heap: a host stall outside any op
            if p["syncs"]:
                _ = [value.item() for value in per_sample]  # per-sample logging: one sync each
            for _ in range(p["churn_buffers"]):  # large temporaries allocated, filled and dropped
                torch.ones(4 * 2**20).sum()
            per_sample.mean().backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            prof.step()
    del heap


def run(name: str, out: Path, active: int | None = None) -> Path:
    """Run scenario ``name`` (``active`` profiled steps, default the scenario's) into ``out``."""
    if name not in SCENARIOS:
        raise SystemExit(f"unknown scenario {name!r}; choose from {', '.join(SCENARIOS)}")
    active = active or SCENARIOS[name].steps
    if name == "pipeline_imbalance":
        import train_pp

        train_pp.main(
            ["--out", str(out), "--overload-stage", "1", "--batch-size", "256", "--active", str(active)]
        )
        return out
    if name == "slow_link":
        import slow_link

        return slow_link.run(out, active)
    args = argparse.Namespace(scenario=name, hidden=256, batch_size=64, active=active)
    _cluster_job.launch(train, WORLD_SIZE, out, args)
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("scenario", nargs="?", help="scenario name (see --list)")
    parser.add_argument("--out", type=Path, help="job folder (default: demo_output/scenarios/<name>)")
    parser.add_argument("--active", type=int, help="profiled steps (default: the scenario's)")
    parser.add_argument("--list", action="store_true", help="list the scenarios and what they expect")
    args = parser.parse_args(argv)
    if args.list or not args.scenario:
        for s in SCENARIOS.values():
            expected = (
                f"{s.category} / {s.culprit_kind} {s.culprit}".strip() if s.category else "nothing above info"
            )
            note = " (root)" if s.needs_root else "" if s.fast else "  (slow)"
            print(f"{s.name:<20} {expected}{note}")
        return 0
    out = args.out or Path("demo_output/scenarios") / args.scenario
    run(args.scenario, out, args.active)
    print(f"scenario {args.scenario} written under {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
