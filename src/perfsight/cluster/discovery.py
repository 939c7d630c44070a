"""Which inputs form one job, and which ranks it has, lacks, or has twice.

A job is the set of rank outputs under a folder or an fsspec URL (``s3://bucket/job/``,
``memory://job``): perfsight run folders, Kineto traces of many ranks, Ascend rank folders.  This
module only lists inputs (``list_inputs``) and, once each input has been read, judges the set
(``assess``): which inputs belong to the job is decided in ``cluster.membership``; what is missing,
twice, damaged or cut is reported here.  Rank, world size and host come from each input's
metadata (``RunMetadata``), never from its file name alone: a rank whose number only its file
name gave is reported as such.
"""

from __future__ import annotations

import dataclasses
import posixpath
import re
from collections import Counter
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from perfsight.ingest import ASCEND_OUTPUT_DIR, TRACE_SUFFIXES, find_traces

if TYPE_CHECKING:  # imported where used: listing a job's inputs (``perfsight analyse`` asks for
    # every path whether it is a job) must not load the per-rank step
    from perfsight.cluster.membership import SetAside
    from perfsight.cluster.rank import RankDigest, RankFailure

CLUSTER_OUTPUT_DIR = "cluster_analysis_output"
"""Where the cross-rank outputs go, beside the per-rank ``rank<N>/`` folders (as msprof-analyze)."""

_NOT_TRACES = {
    "profiler_metadata.json",
    "profiler_info.json",
    "communication.json",
    "communication_matrix.json",
}
_OUTPUT_DIRS = {"PROFILER_OUTPUT", CLUSTER_OUTPUT_DIR, "cache"}


@dataclasses.dataclass(frozen=True)
class RankInput:
    """One rank's input: its trace file and, for remote jobs, the files beside it the reader needs
    (``profiler_info_{rank}.json``, capture sidecars), fetched with it."""

    trace: str
    companions: tuple[str, ...] = ()

    @property
    def label(self) -> str:
        return posixpath.basename(posixpath.dirname(self.trace)) or self.trace


def is_remote(location: str) -> bool:
    """True for an fsspec URL other than a plain local path (``file://`` counts as local)."""
    return "://" in location and not location.startswith("file://")


def list_inputs(location: str | Path) -> list[RankInput]:
    """Every rank input under ``location``; an empty list when there is none."""
    location = str(location)
    if not is_remote(location):
        path = Path(location.removeprefix("file://"))
        if path.is_file():
            return [RankInput(str(path))]
        found = find_traces(path) if path.is_dir() else []
        return [RankInput(str(p)) for p in found if CLUSTER_OUTPUT_DIR not in p.parts]
    import fsspec

    fs, root = fsspec.core.url_to_fs(location)
    protocol = location.split("://", 1)[0]
    files = sorted(fs.find(root))
    by_folder: dict[str, list[str]] = {}
    for name in files:
        by_folder.setdefault(posixpath.dirname(name), []).append(name)
    inputs = []
    for name in files:
        relative = posixpath.relpath(name, root).split("/")
        if not _is_trace(relative):
            continue
        siblings = tuple(
            f"{protocol}://{s}"
            for s in by_folder[posixpath.dirname(name)]
            if s != name and not _is_trace([s])
        )
        inputs.append(RankInput(f"{protocol}://{name}", siblings))
    return inputs


def cut_windows(location: str | Path) -> list[str]:
    """The profiling windows under a local job folder that were cut before their trace was
    written (``perfsight.ingest.run_folder.incomplete_windows``); nothing for a URL."""
    location = str(location)
    if is_remote(location):
        return []
    from perfsight.ingest import run_folder

    path = Path(location.removeprefix("file://"))
    return run_folder.incomplete_windows(path) if path.is_dir() else []


def _is_trace(parts: Sequence[str]) -> bool:
    """The same choice ``perfsight.ingest.find_traces`` makes, for a remote listing."""
    name = parts[-1].rsplit("/", 1)[-1]
    if not name.endswith(TRACE_SUFFIXES) or name.startswith(".") or name in _NOT_TRACES:
        return False
    if name.startswith("profiler_info_") or any(p in _OUTPUT_DIRS for p in parts[:-1]):
        return False
    return len(parts) < 2 or parts[-2] != ASCEND_OUTPUT_DIR or name == "trace_view.json"


DAMAGE_WORDS = re.compile(r"truncat|damage|corrupt|incomplete|read error|crc", re.IGNORECASE)
"""Reader warnings that say a rank's input lost events: named in the job's problems, not only in
that rank's own warnings (the text summary shows the problems)."""


@dataclasses.dataclass
class JobAssessment:
    """The ranks of a job as its inputs describe them."""

    ranks: dict[int, RankDigest]  # one input per rank, chosen by agreement with the job
    world_size: int
    missing: list[int]
    duplicates: dict[int, list[str]]  # rank -> the inputs ignored because another one was kept
    failures: list[RankFailure]
    inconsistent: list[str]  # one line per problem, naming the input
    set_aside: list[SetAside] = dataclasses.field(default_factory=list)  # another job's inputs
    damaged: list[str] = dataclasses.field(default_factory=list)  # one line per damaged input
    cut_windows: list[str] = dataclasses.field(default_factory=list)  # windows that left no trace

    @property
    def hosts(self) -> dict[int, str | None]:
        return {rank: d.meta.host for rank, d in self.ranks.items()}

    def problems(self) -> list[str]:
        """Every problem as one line each, ranks named by number; inputs set aside first."""
        lines = [aside.line() for aside in self.set_aside]
        if self.missing:
            lines.append(
                f"ranks missing from this job of {self.world_size}: {rank_ranges(self.missing)} "
                f"({len(self.missing)} of {self.world_size}); the other ranks are analysed"
            )
        for rank, sources in sorted(self.duplicates.items()):
            kept = self.ranks[rank].source
            lines.append(f"rank {rank} appears more than once: using {kept}, ignoring {', '.join(sources)}")
        lines.extend(  # a reader's message usually names the file already
            f"unreadable input {f.message}" if f.message.startswith(str(f.source)) else
            f"unreadable input {f.source}: {f.message}"
            for f in self.failures
        )  # fmt: skip
        lines.extend(self.cut_windows)  # each names its folder and says "no trace written"
        lines.extend(self.damaged)
        lines.extend(self.inconsistent)
        return lines


def assess(results: Iterable[RankDigest | RankFailure]) -> JobAssessment:
    """Judge the inputs of a job once read: which belong (``membership``), world size, and the
    missing, duplicate, damaged and inconsistent ranks."""
    from perfsight.cluster import membership
    from perfsight.cluster.rank import RankFailure

    digests: list[RankDigest] = []
    failures: list[RankFailure] = []
    for result in results:
        (failures if isinstance(result, RankFailure) else digests).append(result)
    members = membership.decide(digests)
    ranks = members.ranks
    sizes = Counter(d.meta.world_size for d in ranks.values())
    world_size = max(sizes.most_common(1)[0][0] if sizes else 1, max(ranks, default=-1) + 1)
    inconsistent = []
    damaged = []
    for rank, digest in sorted(ranks.items()):
        meta = digest.meta
        if meta.world_size != world_size:
            inconsistent.append(
                f"{digest.source}: rank {rank} records world size {meta.world_size}, "
                f"the job {world_size}; analysed with the job"
            )
        if meta.rank_source in {"file name", "default"}:
            how = "its file name" if meta.rank_source == "file name" else "nowhere (assumed 0)"
            inconsistent.append(f"{digest.source}: rank {rank} is taken from {how}, not from the trace")
        damaged.extend(
            f"rank {rank} input damaged or cut short, analysed with what was kept: {warning}"
            for warning in meta.warnings
            if DAMAGE_WORDS.search(warning)
        )
    missing = sorted(set(range(world_size)) - set(ranks))
    return JobAssessment(
        ranks, world_size, missing, members.duplicates, failures, inconsistent, members.set_aside, damaged
    )


def rank_ranges(ranks: Iterable[int]) -> str:
    """``[0, 1, 2, 5, 7, 8]`` -> ``"0-2, 5, 7-8"``: a thousand missing ranks stay one line."""
    values = sorted(set(ranks))
    parts = []
    start = prev = None
    for value in values + [None]:
        if start is None:
            start = prev = value
        elif value is not None and value == prev + 1:
            prev = value
        else:
            parts.append(str(start) if start == prev else f"{start}-{prev}")
            start = prev = value
    return ", ".join(parts)
