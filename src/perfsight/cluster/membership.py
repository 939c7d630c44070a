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

The job's value of each fact is the one most inputs record (the first listed on a tie; for times,
the span that overlaps most others); an input contradicting any of them is set aside.  Of two
inputs of one rank that both fit, the one recording more of the job's facts is kept, then the
first listed.  Host names are never a contradiction (a job spans hosts).  Every input is compared
with the job once, never with every other input: a thousand ranks stay fast.

This module must not read files or analyse anything: it judges digests.
"""

from __future__ import annotations

import dataclasses
import datetime
import posixpath
from collections import Counter
from collections.abc import Sequence

import numpy as np

from perfsight.cluster.rank import RankDigest
from perfsight.layout import RUN_FOLDER_SUFFIX

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
    same_launch: bool = False  # only its time differs, and it records the job's id or rendezvous

    @property
    def where(self) -> str:
        """The rank's folder when it is a perfsight run folder (what a user moves away), else the file."""
        folder = posixpath.dirname(self.source)
        return folder if folder.endswith(RUN_FOLDER_SUFFIX) else self.source

    def line(self) -> str:
        what = (
            "was recorded in another profiling window of this job"
            if self.same_launch
            else "is from another job"
        )
        return (
            f"set aside {self.where}: its rank {self.rank} {what} and is not analysed "
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
        if name is None or not isinstance(ranks, list):
            continue
        try:  # sorted in C: a 4096-rank default group costs microseconds, not a Python loop
            groups[str(name)] = tuple(sorted(ranks))
        except TypeError:  # members of mixed types: not evidence
            continue
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


def _job_facts(judged: Sequence[JobFacts]) -> JobFacts:
    """The job's value of each fact: the one most inputs record (the first listed on a tie).

    Times: the job's span is the union of the spans that overlap the span overlapping most
    others (one vectorised comparison of every pair: a thousand ranks are a million booleans)."""

    def common(values: list) -> object:
        values = [v for v in values if v is not None]
        return Counter(values).most_common(1)[0][0] if values else None  # stable: first on a tie

    members_of: dict[str, Counter] = {}
    for f in judged:  # one pass over every group of every input
        for name, ranks in f.groups.items():
            members_of.setdefault(name, Counter())[ranks] += 1
    groups = {name: counts.most_common(1)[0][0] for name, counts in members_of.items()}
    return JobFacts(
        world_size=common([f.world_size for f in judged]),  # type: ignore[arg-type]
        job_id=common([f.job_id for f in judged]),  # type: ignore[arg-type]
        rendezvous=common([f.rendezvous for f in judged]),  # type: ignore[arg-type]
        groups=groups,  # type: ignore[arg-type]
        wall_span_ns=_common_span([f.wall_span_ns for f in judged if f.wall_span_ns is not None]),
    )


def _common_span(spans: list[tuple[int, int]]) -> tuple[int, int] | None:
    if not spans:
        return None
    bounds = np.array(spans, dtype=np.int64)
    start, end = bounds[:, 0], bounds[:, 1]
    overlaps = (start[:, None] <= end[None, :] + TIME_TOLERANCE_NS) & (
        end[:, None] >= start[None, :] - TIME_TOLERANCE_NS
    )
    reference = int(np.argmax(overlaps.sum(axis=1)))  # argmax: the first on a tie
    members = overlaps[reference]
    return int(start[members].min()), int(end[members].max())


def decide(digests: Sequence[RankDigest]) -> Membership:
    """Split the inputs (in listing order) into the job, second inputs of a rank, and foreign ones."""
    judged = [facts(d) for d in digests]
    job = _job_facts(judged)
    aside = []
    members: dict[int, list[tuple[RankDigest, JobFacts]]] = {}
    for digest, mine in zip(digests, judged, strict=True):
        reasons = contradictions(mine, job)
        if job.world_size is not None and digest.rank >= job.world_size:
            reasons.append(f"rank {digest.rank} is beyond the job's {job.world_size} ranks")
        if reasons:
            launch = (mine.job_id is not None and mine.job_id == job.job_id) or (
                mine.rendezvous is not None and mine.rendezvous == job.rendezvous
            )
            only_time = all(r.startswith("recorded ") for r in reasons)
            aside.append(SetAside(digest.source, digest.rank, tuple(reasons), launch and only_time))
        else:
            members.setdefault(digest.rank, []).append((digest, mine))
    kept: dict[int, RankDigest] = {}
    duplicates: dict[int, list[str]] = {}
    for rank, candidates in sorted(members.items()):
        best = max(candidates, key=lambda item: _agreement(item[1], job))  # max: the first on a tie
        kept[rank] = best[0]
        if len(candidates) > 1:
            duplicates[rank] = [d.source for d, _ in candidates if d is not best[0]]
    return Membership(kept, duplicates, aside)


def _agreement(mine: JobFacts, job: JobFacts) -> int:
    """How many of the job's facts an input records too (the better-documented input wins a tie)."""
    same = sum(
        1
        for a, b in ((mine.job_id, job.job_id), (mine.rendezvous, job.rendezvous))
        if a is not None and a == b
    )
    overlaps = (
        mine.wall_span_ns is not None
        and job.wall_span_ns is not None
        and mine.wall_span_ns[0] <= job.wall_span_ns[1]
        and mine.wall_span_ns[1] >= job.wall_span_ns[0]
    )
    return (
        same + int(overlaps) + sum(1 for name, ranks in mine.groups.items() if job.groups.get(name) == ranks)
    )
