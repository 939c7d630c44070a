"""The slow-link scenario: a four-stage pipeline job whose ranks live in their own network
namespaces, joined by veth pairs to one bridge, with ``tc`` rate-limiting the traffic from rank 1
to rank 2 only.

Why this exists: a slow link shows only when ranks talk over real sockets that can be slowed one
pair at a time; on loopback every pair is the same.  Everything is set up here, as root (``ip``,
``tc``), and torn down in a ``finally`` -- also when a rank fails or the run is interrupted -- and
any leftover of an earlier, killed run is removed before setting up.

    sudo python examples/scenarios/slow_link.py --out runs/slow_link

Each rank trains a small layer and hands 8 MiB of activations to the next rank of a ring (send and
receive, as pipeline stages do), under ``perfsight.profile`` (examples/_cluster_job.py); the launch
is one process per namespace with ``ip netns exec``.  It must stay importable without side effects.

Scored in the diagnosis benchmark (benchmarks/bench_diagnosis.py, as root): gloo's own ``send`` /
``recv`` slices last microseconds (they only enqueue the transfer), so the link shows through
perfsight's comm capture, which records how long each call blocked in ``wait()``; the trace model's
p2p op lasts until that wait ended (perfsight.ingest.sidecar), and the slow link is 1 -> 2 in
slow_link.csv and the advisor's top finding.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import subprocess
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

PREFIX = "psl"  # names of every namespace, veth and bridge this scenario makes
BRIDGE = f"{PREFIX}br0"
SUBNET = "10.231.7"
WORLD_SIZE = 4
SLOW_SRC, SLOW_DST = 1, 2
SLOW_RATE = "200mbit"
"""The rate of the slow pair.  A token-bucket class (htb) with a u32 filter on the destination: this
machine's kernel has no ``netem`` or ``prio`` qdisc, and a rate limit is the slow link's signature
(bandwidth) anyway."""


def _ip(rank: int) -> str:
    return f"{SUBNET}.{10 + rank}"


def _run(*cmd: str, check: bool = True) -> None:
    subprocess.run(cmd, check=check, capture_output=True, timeout=30)


def teardown() -> None:
    """Remove every namespace and the bridge this scenario makes (missing ones are fine)."""
    for rank in range(WORLD_SIZE):
        _run("ip", "netns", "del", f"{PREFIX}{rank}", check=False)  # takes its veth end with it
        _run("ip", "link", "del", f"{PREFIX}h{rank}", check=False)
    _run("ip", "link", "del", BRIDGE, check=False)


def setup() -> None:
    """Bridge + one namespace per rank + the rate limit on rank SLOW_SRC's traffic to SLOW_DST."""
    teardown()  # a killed earlier run may have left some behind
    _run("ip", "link", "add", BRIDGE, "type", "bridge")
    _run("ip", "link", "set", BRIDGE, "up")
    for rank in range(WORLD_SIZE):
        ns, host, inner = f"{PREFIX}{rank}", f"{PREFIX}h{rank}", f"{PREFIX}v{rank}"
        _run("ip", "netns", "add", ns)
        _run("ip", "link", "add", host, "type", "veth", "peer", "name", inner)
        _run("ip", "link", "set", inner, "netns", ns)
        _run("ip", "link", "set", host, "master", BRIDGE)
        _run("ip", "link", "set", host, "up")
        _run("ip", "netns", "exec", ns, "ip", "addr", "add", f"{_ip(rank)}/24", "dev", inner)
        _run("ip", "netns", "exec", ns, "ip", "link", "set", inner, "up")
        _run("ip", "netns", "exec", ns, "ip", "link", "set", "lo", "up")
    ns, dev = f"{PREFIX}{SLOW_SRC}", f"{PREFIX}v{SLOW_SRC}"
    tc = ("ip", "netns", "exec", ns, "tc")
    _run(*tc, "qdisc", "add", "dev", dev, "root", "handle", "1:", "htb", "default", "10")
    _run(*tc, "class", "add", "dev", dev, "parent", "1:", "classid", "1:10", "htb", "rate", "10gbit")
    _run(*tc, "class", "add", "dev", dev, "parent", "1:", "classid", "1:30", "htb", "rate", SLOW_RATE)
    _run(*tc, "filter", "add", "dev", dev, "protocol", "ip", "parent", "1:0", "prio", "1", "u32",
         "match", "ip", "dst", f"{_ip(SLOW_DST)}/32", "flowid", "1:30")  # fmt: skip


@contextlib.contextmanager
def network() -> Iterator[None]:
    """The namespaces for the duration of the block, torn down whatever happens inside."""
    try:
        setup()
        yield
    finally:
        teardown()


def run(out: Path, active: int = 3) -> Path:
    """Set up, run the four ranks (one per namespace), tear down; returns ``out``."""
    if os.geteuid() != 0:
        raise SystemExit("the slow-link scenario needs root (network namespaces and tc)")
    out.mkdir(parents=True, exist_ok=True)
    with network():
        procs: list[subprocess.Popen] = []
        try:
            for rank in range(WORLD_SIZE):
                env = dict(os.environ, MASTER_ADDR=_ip(0), MASTER_PORT="29531",
                           GLOO_SOCKET_IFNAME=f"{PREFIX}v{rank}")  # fmt: skip
                cmd = ["ip", "netns", "exec", f"{PREFIX}{rank}", sys.executable, __file__,
                       "--rank", str(rank), "--out", str(out), "--active", str(active)]  # fmt: skip
                procs.append(subprocess.Popen(cmd, env=env))
            codes = [p.wait(timeout=300) for p in procs]
        finally:
            for p in procs:  # only the processes started here, by their own handle
                if p.poll() is None:
                    p.kill()
                    p.wait()
        if any(codes):
            raise RuntimeError(f"a rank of the slow-link job failed: exit codes {codes}")
    return out


MESSAGE_FLOATS = 2 * 2**20
"""8 MiB a hand-off: more than a socket's send buffer (4 MiB at most here), so a send lasts as long as
the wire takes -- the sender's transit time, which the communication matrix reads, shows the link."""


def rank_main(rank: int, out: Path, active: int) -> None:
    """One rank inside its namespace: a small training step, then its activations handed to the next
    rank of a ring (a pipeline stage's send and receive), profiled with ``perfsight.profile``."""
    import _cluster_job
    import torch
    import torch.distributed as dist
    from torch import nn

    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=WORLD_SIZE)
    try:
        model = nn.Linear(256, 256)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
        outgoing, incoming = torch.randn(MESSAGE_FLOATS), torch.empty(MESSAGE_FLOATS)
        nxt, prev = (rank + 1) % WORLD_SIZE, (rank - 1) % WORLD_SIZE
        with _cluster_job.profiled(out, rank, active) as prof:
            for _ in range(_cluster_job.total_steps(active)):
                model(torch.randn(64, 256)).pow(2).mean().backward()
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
                if rank % 2 == 0:  # even ranks send first, odd ranks receive first: no deadlock
                    dist.send(outgoing, nxt)
                    dist.recv(incoming, prev)
                else:
                    dist.recv(incoming, prev)
                    dist.send(outgoing, nxt)
                prof.step()
        dist.barrier()
    finally:
        dist.destroy_process_group()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("demo_output/scenarios/slow_link"))
    parser.add_argument("--active", type=int, default=3, help="profiled steps")
    parser.add_argument("--rank", type=int, help=argparse.SUPPRESS)  # set by run() for each namespace
    args = parser.parse_args(argv)
    if args.rank is not None:
        rank_main(args.rank, args.out, args.active)
        return 0
    run(args.out, args.active)
    print(f"slow-link job of {WORLD_SIZE} ranks written under {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
