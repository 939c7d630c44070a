"""Estimate each rank's clock offset to rank 0 at the start of profiling (NTP-style).

Why: every rank stamps its events with its own host clock (Kineto: CLOCK_REALTIME).  On one
host those agree; across hosts they differ by up to milliseconds, more than a collective lasts,
so a cluster timeline or a "who waited for whom" analysis needs each rank's offset and how sure
we are of it.

How: rank 0 of the group serves the other ranks one after the other.  In each round rank r sends
its time ``t0``; rank 0 stamps the arrival ``t1`` and its reply ``t2``; rank r stamps the reply's
arrival ``t3``.  Then ``offset = ((t0 - t1) + (t3 - t2)) / 2`` (rank r's clock minus rank 0's)
and the round trip is ``(t3 - t0) - (t2 - t1)``; the round with the smallest round trip is kept,
and half of it bounds the error (the one-way delays are unknown but positive).  The first round
is a warm-up: rank r may send it before rank 0 has got to it.

Rules: it never hangs -- every wait has a deadline, a missing rank costs at most ``timeout_s``
and yields ``uncertainty_ns = None``; without an initialised process group it returns offset 0
and uncertainty ``None`` at once.  The messages are point-to-point ops on the group: gloo counts
those in its collective counter, so the steps they cause are recorded here
(:func:`p2p_counter_shift`) for ``comm_capture``'s sequence numbers.  It must not be called from
inside a collective, and every rank of the group must call it (it is collective).
"""

from __future__ import annotations

import dataclasses
import datetime
import logging
import time
from typing import Any

log = logging.getLogger("perfsight.collect")

_TAG = 0x7E57C10C & 0x7FFFFFFF  # a tag of our own, so a late message never matches a user's recv
_counter_shift: dict[str, int] = {}


@dataclasses.dataclass(frozen=True)
class ClockOffset:
    """This rank's clock minus the reference rank's (subtract it from this rank's times)."""

    offset_ns: int
    uncertainty_ns: int | None  # half the best round trip; None: not measured (no group, timeout)
    rounds: int  # rounds that completed (the warm-up not counted)
    reference_rank: int = 0

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def p2p_counter_shift(group_name: str) -> int:
    """How far this module's messages moved the group's collective counter (0 on NCCL)."""
    return _counter_shift.get(group_name, 0)


def estimate_clock_offset(group: Any = None, rounds: int = 8, timeout_s: float = 10.0) -> ClockOffset:
    """This rank's offset to the group's first rank; see the module docstring.  Collective."""
    try:
        import torch.distributed as dist
    except ImportError:
        return ClockOffset(0, None, 0)
    if not (dist.is_available() and dist.is_initialized()):
        return ClockOffset(0, None, 0)
    group = group if group is not None else dist.group.WORLD
    ranks = list(dist.get_process_group_ranks(group))
    me = dist.get_rank()
    if me not in ranks:
        return ClockOffset(0, None, 0)
    if len(ranks) == 1:
        return ClockOffset(0, 0, 0, ranks[0])
    from perfsight.collect import comm_capture

    exchange = _Exchange(group, ranks, timeout_s)
    before = exchange.counter()
    try:
        with comm_capture.paused():
            if me == ranks[0]:
                result = exchange.serve(rounds)
            else:
                result = exchange.ask(rounds)
    finally:
        after = exchange.counter()
        if before is not None and after is not None:
            name = str(getattr(group, "group_name", ""))
            _counter_shift[name] = _counter_shift.get(name, 0) + (after - before)
    return result


def align_clocks(context: Any = None) -> dict[str, Any]:
    """``perfsight.collect.capture``'s clock entry point: the world's offsets as a dict."""
    return estimate_clock_offset().to_dict()


class _Exchange:
    def __init__(self, group: Any, ranks: list[int], timeout_s: float) -> None:
        import torch
        import torch.distributed as dist

        self.torch, self.dist, self.group, self.ranks = torch, dist, group, ranks
        self.timeout_s = timeout_s
        backend = str(dist.get_backend(group)).lower()
        self.cpu = "gloo" in backend or "mpi" in backend or "nccl" not in backend
        self.device = torch.device("cpu") if self.cpu else torch.device("cuda", torch.cuda.current_device())
        self.tag = _TAG if self.cpu else 0  # NCCL has no tags

    def counter(self) -> int | None:
        try:
            return int(self.group._get_sequence_number_for_group())
        except Exception:
            return None

    def _wait(self, work: Any, deadline: float) -> None:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError("clock exchange timed out")
        if self.cpu:
            work.wait(timeout=datetime.timedelta(seconds=remaining))
            return
        while not work.is_completed():  # NCCL: a host-side wait has no deadline
            if time.monotonic() > deadline:
                raise TimeoutError("clock exchange timed out")
            time.sleep(0)
        work.wait()

    def _recv(self, values: int, peer: int, deadline: float) -> list[int]:
        buffer = self.torch.zeros(values, dtype=self.torch.int64, device=self.device)
        self._wait(self.dist.irecv(buffer, src=peer, group=self.group, tag=self.tag), deadline)
        return buffer.tolist()

    def _send(self, values: list[int], peer: int, deadline: float) -> None:
        tensor = self.torch.tensor(values, dtype=self.torch.int64, device=self.device)
        self._wait(self.dist.isend(tensor, dst=peer, group=self.group, tag=self.tag), deadline)

    def serve(self, rounds: int) -> ClockOffset:
        """Rank 0: answer every other rank in turn; a rank that does not answer is skipped."""
        for peer in self.ranks[1:]:
            deadline = time.monotonic() + self.timeout_s
            try:
                for _ in range(rounds + 1):
                    self._recv(1, peer, deadline)
                    t1 = time.time_ns()
                    self._send([t1, time.time_ns()], peer, deadline)
            except Exception as exc:
                log.warning(
                    "perfsight: clock exchange with rank %d failed (%s); its offset is unknown", peer, exc
                )
        return ClockOffset(0, 0, rounds, self.ranks[0])

    def ask(self, rounds: int) -> ClockOffset:
        """Any other rank: several rounds against rank 0, keep the one with the least round trip."""
        root = self.ranks[0]
        deadline = time.monotonic() + self.timeout_s * len(self.ranks)  # rank 0 serves in turn
        best: tuple[int, int] | None = None  # (round trip, offset)
        done = 0
        try:
            for index in range(rounds + 1):
                t0 = time.time_ns()
                self._send([t0], root, deadline)
                t1, t2 = self._recv(2, root, deadline)
                t3 = time.time_ns()
                if index == 0:
                    continue  # warm-up: rank 0 may not have been listening yet
                trip = (t3 - t0) - (t2 - t1)
                offset = ((t0 - t1) + (t3 - t2)) // 2
                done += 1
                if best is None or trip < best[0]:
                    best = (trip, offset)
        except Exception as exc:
            log.warning("perfsight: clock exchange with rank %d failed (%s)", root, exc)
        if best is None:
            return ClockOffset(0, None, 0, root)
        return ClockOffset(best[1], max(best[0], 0) // 2, done, root)
