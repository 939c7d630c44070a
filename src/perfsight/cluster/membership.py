"""Which rank inputs belong to the job: set aside what contradicts it, choose between two of a rank.

Why a module of its own: a rank copied from another job into a job folder must never be analysed
with the job -- its collectives match nothing, it spoils the clock alignment and hides the real
slow rank -- and when two inputs claim one rank, the one that agrees with the rest of the job must
be kept.  Both decisions rest on the same facts, judged here once; ``discovery.assess`` only
reports the outcome.

The rule (docs/CLUSTER.md, "Which ranks make a job"): only facts that really contradict set an
input aside, each compared where *both* inputs record it:

* a different ``job_id`` (torchrun's run id, a scheduler's job id) or ``rendezvous``
  (``MASTER_ADDR:MASTER_PORT``), as perfsight run folders record them;
* a different world size, where both record one above 1 (a reader that knows nothing about the
  job records 1: the Ascend ``db_level0`` ranks do, and still belong together);
* a process group of the same name with other member ranks (group names are handed out in the
  same order on every rank of a job);
* recorded times that do not overlap, beyond :data:`TIME_TOLERANCE_NS` (the ranks of one job
  profile the same steps at the same time);
* a rank number at or above the job's recorded world size.

The job is the input that agrees with inputs of the most other rank numbers (the first listed on
a tie), and every input that does not contradict it.  Of two inputs of one rank that both fit,
the one that agrees with more other ranks is kept, then the one recording more of the job's
facts, then the first listed.  Host names are never a contradiction (a job spans hosts).

This module must not read files or analyse anything: it judges digests.
"""

from __future__ import annotations

import dataclasses
import datetime
import posixpath
from collections import Counter
from collections.abc import Sequence

from perfsight.cluster.rank import RankDigest
from perfsight.collect.run_folder import RUN_FOLDER_SUFFIX

TIME_TOLERANCE_NS = 10_000_000_000
"""Recorded times closer than 10 s count as overlapping: hosts' clocks may differ by this much
before alignment, and the ranks of one job record the same steps at the same time anyway."""

EPOCH_2001_NS = 978_307_200_000_000_000
"""Times above this are taken as Unix nanoseconds when a trace records no base time (old Kineto
traces write Unix microseconds); below it a trace's times are relative and say nothing about when."""


@dataclasses.dataclass(frozen=True)
class JobFacts:
    """What one input says about the job it belongs to (``None``: not recorded)."""

    world_size: int | None
    job_id: str | None
    rendezvous: str | None
    groups: dict[str, tuple[int, ...]]
    wall_span_ns: tuple[int, int] | None


@dataclasses.dataclass(frozen=True)
class SetAside:
    """An input that does not belong to the job, and every fact that says so."""

    source: str
    rank: int
    reasons: tuple[str, ...]

    @property
    def where(self) -> str:
        """The rank's folder when it is a perfsight run folder (what a user moves away), else the file."""
        folder = posixpath.dirname(self.source)
        return folder if folder.endswith(RUN_FOLDER_SUFFIX) else self.source

    def line(self) -> str:
        return (
            f"set aside {self.where}: its rank {self.rank} is from another job and is not analysed "
            f"with this one ({'; '.join(self.reasons)})"
        )


@dataclasses.dataclass
class Membership:
    """The inputs kept (one per rank), the second inputs of a rank, and the inputs set aside."""

    ranks: dict[int, RankDigest]
    duplicates: dict[int, list[str]]  # rank -> inputs of the job ignored because another was kept
    set_aside: list[SetAside]


def facts(digest: RankDigest) -> JobFacts:
    meta = digest.meta
    groups: dict[str, tuple[int, ...]] = {}
    for group in meta.process_groups:
        name, ranks = group.get("name", group.get("pg_name")), group.get("ranks")
        if name is not None and isinstance(ranks, list) and all(isinstance(r, int) for r in ranks):
            groups[str(name)] = tuple(sorted(ranks))
    return JobFacts(
        world_size=meta.world_size if meta.world_size and meta.world_size > 1 else None,
        job_id=_text(meta.extra.get("job_id")),
        rendezvous=_text(meta.extra.get("rendezvous")),
        groups=groups,
        wall_span_ns=_wall_span(digest),
    )


def _text(value: object) -> str | None:
    return value if isinstance(value, str) and value else None


def _wall_span(digest: RankDigest) -> tuple[int, int] | None:
    span = digest.span_ns
    if span is None:
        return None
    base = digest.meta.base_time_ns
    if base is None:
        return span if span[0] > EPOCH_2001_NS else None
    return span[0] + base, span[1] + base


def contradictions(facts_of: JobFacts, job: JobFacts) -> list[str]:
    """Every recorded fact of an input that contradicts the job's, as a phrase a user can check."""
    found = []
    for what, mine, theirs in (
        ("job id", facts_of.job_id, job.job_id),
        ("rendezvous", facts_of.rendezvous, job.rendezvous),
        ("world size", facts_of.world_size, job.world_size),
    ):
        if mine is not None and theirs is not None and mine != theirs:
            found.append(f"{what} {mine}, the job's {theirs}")
    for name in sorted(set(facts_of.groups) & set(job.groups)):
        if facts_of.groups[name] != job.groups[name]:
            found.append(
                f"process group {name!r} of ranks {_ranks(facts_of.groups[name])}, "
                f"the job's of {_ranks(job.groups[name])}"
            )
    if facts_of.wall_span_ns is not None and job.wall_span_ns is not None:
        (start, end), (job_start, job_end) = facts_of.wall_span_ns, job.wall_span_ns
        if start > job_end + TIME_TOLERANCE_NS or end < job_start - TIME_TOLERANCE_NS:
            found.append(f"recorded {_when(start, end)}, the job {_when(job_start, job_end)}")
    return found


def _ranks(ranks: tuple[int, ...]) -> str:
    from perfsight.cluster.discovery import rank_ranges

    return f"[{rank_ranges(ranks)}]"


def _when(start_ns: int, end_ns: int) -> str:
    def stamp(ns: int) -> str:
        return datetime.datetime.fromtimestamp(ns / 1e9, datetime.UTC).strftime("%Y-%m-%d %H:%M:%S")

    return f"{stamp(start_ns)}..{stamp(end_ns)[11:]} UTC"


def _job_facts(members: Sequence[tuple[RankDigest, JobFacts]]) -> JobFacts:
    """The job's value of each fact: the one most members record (first listed on a tie)."""

    def common(values: list) -> object:
        values = [v for v in values if v is not None]
        return Counter(values).most_common(1)[0][0] if values else None

    groups: dict[str, tuple[int, ...]] = {}
    for name in {n for _, f in members for n in f.groups}:
        groups[name] = common([f.groups.get(name) for _, f in members])  # type: ignore[assignment]
    spans = [f.wall_span_ns for _, f in members if f.wall_span_ns is not None]
    return JobFacts(
        world_size=common([f.world_size for _, f in members]),  # type: ignore[arg-type]
        job_id=common([f.job_id for _, f in members]),  # type: ignore[arg-type]
        rendezvous=common([f.rendezvous for _, f in members]),  # type: ignore[arg-type]
        groups=groups,
        wall_span_ns=(min(s for s, _ in spans), max(e for _, e in spans)) if spans else None,
    )


def decide(digests: Sequence[RankDigest]) -> Membership:
    """Split the inputs (in listing order) into the job, second inputs of a rank, and foreign ones."""
    judged = [(d, facts(d)) for d in digests]
    rank_numbers = {d.rank for d in digests}

    def agreeing_ranks(item: tuple[RankDigest, JobFacts]) -> set[int]:
        digest, mine = item
        return {
            other.rank
            for other, theirs in judged
            if other.rank != digest.rank and not contradictions(theirs, mine)
        }

    support = {id(d): len(agreeing_ranks((d, f))) for d, f in judged}
    anchor = max(judged, key=lambda item: support[id(item[0])])  # max keeps the first on a tie
    members = [(d, f) for d, f in judged if d is anchor[0] or not contradictions(f, anchor[1])]
    job = _job_facts(members)
    aside = []
    for digest, mine in judged:
        reasons = contradictions(mine, job)
        if job.world_size is not None and digest.rank >= job.world_size:
            reasons.append(f"rank {digest.rank} is beyond the job's {job.world_size} ranks")
        if reasons:
            aside.append(SetAside(digest.source, digest.rank, tuple(reasons)))
    dropped = {a.source for a in aside}
    kept: dict[int, RankDigest] = {}
    duplicates: dict[int, list[str]] = {}
    for rank in sorted(rank_numbers):
        candidates = [(d, f) for d, f in members if d.rank == rank and d.source not in dropped]
        if not candidates:
            continue
        best = max(candidates, key=lambda item: (support[id(item[0])], _agreement(item[1], job)))
        kept[rank] = best[0]
        others = [d.source for d, _ in candidates if d is not best[0]]
        if others:
            duplicates[rank] = others
    return Membership(kept, duplicates, aside)


def _agreement(mine: JobFacts, job: JobFacts) -> int:
    """How many of the job's facts an input records too (the better-documented input wins a tie)."""
    same = sum(
        1
        for a, b in ((mine.job_id, job.job_id), (mine.rendezvous, job.rendezvous))
        if a is not None and a == b
    )
    return same + sum(1 for name, ranks in mine.groups.items() if job.groups.get(name) == ranks)
