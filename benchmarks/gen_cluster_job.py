"""Write a synthetic N-rank data-parallel job (one realistic Kineto trace per rank) with stragglers.

Why this exists: cluster analysis and the job pages must stay fast and find the slow ranks and
links at a thousand ranks, and we have no thousand-rank traces to ship.  Each rank is
``benchmarks/gen_kineto_trace.py``'s simulated GPU rank (transformer layers, DDP all-reduce
buckets, memory events, ``ProfilerStep#N`` ranges, ``distributedInfo`` with rank and world size),
with what a real job adds:

* ranks are synchronised at every gradient all-reduce: a rank's NCCL kernel starts when the rank
  reaches it and ends when the slowest rank has arrived plus the transfer, so the others wait;
* ``--stragglers R:F,...`` makes rank R's device compute F times slower (e.g. ``7:1.3``);
* ``--slow-link R:F`` makes rank R's all-reduce transfers F times longer once every rank has
  arrived: its ring link R -> R+1 is the slow one (the default, 519 -> 520, crosses two hosts);
* every collective records its ``Seq`` (the group's sequence number, as recent PyTorch does), so
  ranks are matched by it;
* no random data-loader stalls (the single-rank generator has them), so only the stragglers are
  slow;
* ``host_name`` puts ``--ranks-per-host`` ranks on each host, and every host's clock is skewed by
  a random offset of up to ``--skew-us`` (ranks of one host share its clock; no offset is recorded,
  so the analysis must estimate it).

The slowest straggler is simulated first; its arrival at each bucket is the moment every other
rank's all-reduce can finish.  Then the other ranks are written in parallel processes.

By default a rank is small (``--steps 4 --layers 2``: about 0.4 MiB at 1,024 ranks, most of it the
1,024-rank group lists), so that 1,024 ranks are written in a minute or two: the job pages are
about per-rank summaries, not events.  ``--size-mb`` instead writes as many steps as make each
rank's trace about that size (the cluster-analysis benchmark uses ``--size-mb 2 --layers 4``).

    python benchmarks/gen_cluster_job.py --out /tmp/job1024
    python benchmarks/gen_cluster_job.py --out /tmp/job --ranks 1024 --size-mb 2 --layers 4 \
        --stragglers 17:1.3,600:1.25
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gen_kineto_trace import LAYOUTS, MIB, NCCL_STREAM, Shape, TraceSimulator  # noqa: E402

BASE_TS_US = 4_000_000_000.0


class ClusterRankSimulator(TraceSimulator):
    """One rank of the synchronised job (see the module docstring)."""

    def __init__(
        self,
        rank: int,
        world: int,
        seed: int,
        layers: int,
        slowdown: float,
        skew_us: float,
        ready: dict[tuple[int, int], float] | None,
        ranks_per_host: int = 8,
        link_factor: float = 1.0,
    ) -> None:
        super().__init__(LAYOUTS["classic"], seed * 100_003 + rank, layers, Shape(), rank, world)
        self.slowdown = slowdown
        self.skew_us = skew_us
        self.host = f"node{rank // ranks_per_host:04d}"
        self.ready = ready  # (step, bucket) -> true time the slowest rank arrives; None: record it
        self.arrivals: dict[tuple[int, int], float] = {}
        self.start_ts = BASE_TS_US + skew_us
        self.cpu = {self.main_tid: self.start_ts + 1_000.0, self.bwd_tid: self.start_ts + 1_000.0}
        self.stream_free = {k: self.start_ts for k in self.stream_free}
        self.step_number = 0
        self.bucket = 0
        self.link_factor = link_factor  # >1: this rank's ring link to the next rank is slow
        self.collectives = 0  # the default group's collectives so far: the next one's "Seq"

    def step(self, number: int) -> list[str]:
        self.step_number, self.bucket = number, 0
        return super().step(number)

    def _allreduce(self, tid: int, numel: int) -> None:
        key = (self.step_number, self.bucket)
        self.bucket += 1
        self.collectives += 1
        self.collective_seq = self.collectives  # the same in the dry run and the replay
        # dry run to learn when this rank reaches the bucket, then replay with the wait added
        saved = (self.rng.getstate(), len(self.buffer), dict(self.cpu), dict(self.stream_free))
        saved_ids = (self.correlation, self.external_id, self.ev_idx)
        self._wait_us = 0.0
        super()._allreduce(tid, numel)
        arrival = self._last_nccl_start
        self.arrivals[key] = arrival - self.skew_us
        if self.ready is None or key not in self.ready:
            return
        wait = max(0.0, self.ready[key] + self.skew_us - arrival)
        self.rng.setstate(saved[0])
        del self.buffer[saved[1] :]
        self.cpu, self.stream_free = saved[2], saved[3]
        self.correlation, self.external_id, self.ev_idx = saved_ids
        self._wait_us = wait
        super()._allreduce(tid, numel)

    _wait_us = 0.0
    _last_nccl_start = 0.0

    def _close(self, frame: list) -> None:
        # no random data-loader stalls: they would make an arbitrary rank the slowest at a bucket,
        # and only the designated stragglers may be (the rest of the job synchronises on them)
        if frame[3].startswith("enumerate(DataLoader)"):
            self.cpu[frame[1]] = min(self.cpu[frame[1]], frame[4] + 400.0)
        super()._close(frame)

    def header(self) -> str:
        return (
            super()
            .header()
            .replace('"record_shapes": 1', f'"host_name": "{self.host}",\n  "record_shapes": 1')
        )


def _patch_nccl_launch() -> None:
    """One hook on ``_launch``: compute kernels take ``slowdown`` times longer; an NCCL kernel's
    transfer takes ``link_factor`` times longer, it is stretched by the rank's wait and its start is
    recorded."""
    original = ClusterRankSimulator._launch

    def launch(self, tid, kernel, gpu_us, stream=7, extra="", not_before=0.0):  # type: ignore[no-untyped-def]
        if stream == NCCL_STREAM:
            gpu_us = gpu_us * self.link_factor + self._wait_us
        else:
            gpu_us *= self.slowdown
        start, end = original(self, tid, kernel, gpu_us, stream, extra, not_before)
        if stream == NCCL_STREAM:
            self._last_nccl_start = start
        return start, end

    ClusterRankSimulator._launch = launch  # type: ignore[method-assign]


_patch_nccl_launch()


def write_rank(
    out: Path, rank: int, world: int, steps: int, seed: int, layers: int, slowdown: float, skew_us: float,
    ready: dict[tuple[int, int], float] | None, ranks_per_host: int = 8, link_factor: float = 1.0,
) -> tuple[int, dict[tuple[int, int], float]]:  # fmt: skip
    """Write one rank's trace; returns (bytes, its arrival time at every bucket)."""
    sim = ClusterRankSimulator(
        rank, world, seed, layers, slowdown, skew_us, ready, ranks_per_host, link_factor
    )
    path = out / f"rank{rank:04d}" / f"rank{rank}.pt.trace.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    written = 0
    with path.open("w", encoding="ascii", newline="\n") as handle:
        written += handle.write(sim.header())
        for number in range(1, steps + 1):
            text = ",\n".join(sim.step(number))
            written += handle.write(text if number == 1 else ",\n" + text)
        events, closing = sim.trailer(path.name)
        written += handle.write(",\n" + ",\n".join(events) + "\n" + closing)
    return written, sim.arrivals


def _write_one(args: tuple) -> int:
    return write_rank(*args)[0]


def steps_for_size(size_mb: float, layers: int, seed: int) -> int:
    """Steps that make one rank's trace about ``size_mb`` (measured on a throw-away rank)."""
    sim = ClusterRankSimulator(0, 8, seed, layers, 1.0, 0.0, None)
    size = len(sim.header())
    steps = 0
    while size < size_mb * MIB:
        steps += 1
        size += len(",\n".join(sim.step(steps))) + 2
    return max(steps, 2)


def generate(
    out: Path, ranks: int, size_mb: float | None, stragglers: dict[int, float], seed: int = 0,
    layers: int = 2, skew_us: float = 50_000.0, workers: int = 2, ranks_per_host: int = 8,
    steps: int = 4, slow_link: tuple[int, float] | None = None,
) -> dict:  # fmt: skip
    """Write the job under ``out`` (``rank<NNNN>/rank<N>.pt.trace.json`` and ``.generator.json``,
    the manifest of what was injected); ``size_mb``, when given, decides the steps instead."""
    rng = random.Random(seed)
    hosts = (ranks + ranks_per_host - 1) // ranks_per_host
    host_skews = [0.0] + [rng.uniform(-skew_us, skew_us) for _ in range(hosts - 1)]
    skews = [host_skews[r // ranks_per_host] for r in range(ranks)]
    if size_mb is not None:
        steps = steps_for_size(size_mb, layers, seed)
    link_rank, link_factor = slow_link if slow_link is not None and slow_link[0] < ranks else (-1, 1.0)
    order = sorted(stragglers, key=lambda r: -stragglers[r])
    total = 0
    ready = None
    if order:  # the slowest rank arrives last everywhere: its arrivals are when buckets can finish
        first = order[0]
        written, ready = write_rank(
            out, first, ranks, steps, seed, layers, stragglers[first], skews[first], None, ranks_per_host,
            link_factor if first == link_rank else 1.0,
        )  # fmt: skip
        total += written
    rest = [r for r in range(ranks) if not order or r != order[0]]
    jobs = [
        (out, r, ranks, steps, seed, layers, stragglers.get(r, 1.0), skews[r], ready, ranks_per_host,
         link_factor if r == link_rank else 1.0)
        for r in rest
    ]  # fmt: skip
    with ProcessPoolExecutor(max_workers=workers) as pool:
        total += sum(pool.map(_write_one, jobs, chunksize=16))
    manifest = {
        "ranks": ranks,
        "hosts": hosts,
        "steps": steps,
        "layers": layers,
        "size_mb_per_rank": size_mb,
        "stragglers": {str(r): f for r, f in stragglers.items()},
        "slow_link": (
            {"src": link_rank, "dst": (link_rank + 1) % ranks, "factor": link_factor}
            if link_rank >= 0
            else None
        ),
        "skew_us": {str(r): skews[r] for r in range(ranks)},
        "bytes": total,
    }
    (out / ".generator.json").write_text(json.dumps(manifest, indent=1))
    return manifest


def parse_stragglers(text: str) -> dict[int, float]:
    pairs = [p.split(":") for p in text.split(",") if p.strip()]
    return {int(r): float(f) for r, f in pairs}


def parse_slow_link(text: str) -> tuple[int, float] | None:
    """``R:F`` -> (R, F); an empty text: no slow link."""
    if not text.strip():
        return None
    rank, factor = text.split(":")
    return int(rank), float(factor)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--ranks", type=int, default=1024)
    parser.add_argument("--steps", type=int, default=4, help="profiled steps per rank")
    parser.add_argument(
        "--size-mb", type=float, help="approximate size of each rank's trace (decides the steps instead)"
    )
    parser.add_argument("--stragglers", default="17:1.3,600:1.25", help="RANK:SLOWDOWN,...")
    parser.add_argument(
        "--slow-link", default="519:2", help="RANK:FACTOR: link RANK -> RANK+1 is FACTOR slower ('': none)"
    )
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--skew-us", type=float, default=50_000.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--ranks-per-host", type=int, default=8)
    args = parser.parse_args(argv)
    started = time.perf_counter()
    manifest = generate(
        args.out, args.ranks, args.size_mb, parse_stragglers(args.stragglers), args.seed, args.layers,
        args.skew_us, args.workers, args.ranks_per_host, args.steps, parse_slow_link(args.slow_link),
    )  # fmt: skip
    print(
        f"wrote {args.ranks} ranks x {manifest['steps']} steps ({manifest['bytes'] / MIB:.0f} MiB) "
        f"to {args.out} "
        f"in {time.perf_counter() - started:.1f} s"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
