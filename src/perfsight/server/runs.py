"""Find the runs under ``--summary-base-dir``: what the run list shows and what a run id means.

Why this is more than a glob: a base dir mixes raw Kineto traces (one file per device, or a folder
of per-rank files from ``tensorboard_trace_handler``), perfsight run folders (``*_perfsight/`` with
``profiler_info_{rank}.json``) and folders ``perfsight analyse`` already wrote (``rank<N>/cache``).
An analysed folder whose inputs are also under the base dir is shown once, as the raw run, already
analysed.  Discovery never parses a trace: ranks come from the first bytes of a file (its
``distributedInfo``) or its name, steps from the cache once analysed.

Nothing outside the base dir is listed or read: symlinked folders are not followed, symlinked files
must resolve inside the base dir, and an analysed rank folder counts only when every path in it
resolves inside the base dir or the server's cache (:func:`contained`).

Nothing is written into the base dir either: the server keeps the analyses it makes in its own
cache folder (``Run.output_root``), and reads the outputs ``perfsight analyse`` already wrote beside
the data (``Run.found_root``) as they are.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import gzip
import hashlib
import json
import os
import re
import zlib
from collections.abc import Callable
from pathlib import Path

import pyarrow.parquet as pq

from perfsight import layout
from perfsight.api import default_output_root
from perfsight.ingest import ASCEND_OUTPUT_DIR, TRACE_SUFFIXES, find_traces
from perfsight.server.security import inside, relative_id

TIMELINE_DIR = "timeline"
CLUSTER_OUTPUT_DIR = "cluster_analysis_output"
"""Where a job's cross-rank outputs are, beside its ``rank<N>/`` folders (as ``perfsight analyse``
writes them; ``perfsight.cluster.discovery.CLUSTER_OUTPUT_DIR``, not imported: the server's run
list must not load the cluster layer's pandas)."""
CLUSTER_FAILED_FILE = "cluster_analysis_failed.txt"
"""Written by the server's analysis, beside the rank folders, when a job's cross-rank step failed
(its ranks are still served): says why, and that the analysis is complete as it is."""
_RANK_DIR = re.compile(r"^rank(\d+)(_(?!\d+_perfsight$).*)?$")
"""An analysed rank folder (``rank3``, ``rank3_<window>``), never a rank's own run folder as the
collector names it (``rank3_<timestamp>_perfsight``)."""
_RANK_IN_NAME = re.compile(r"rank[-_]?(\d+)", re.IGNORECASE)
_RANK_IN_HEAD = re.compile(rb'"distributedInfo"\s*:\s*\{[^}]*?"rank"\s*:\s*(\d+)', re.DOTALL)
_WORLD_IN_HEAD = re.compile(rb'"distributedInfo"\s*:\s*\{[^}]*?"world_size"\s*:\s*(\d+)', re.DOTALL)
_PROFILER_INFO = re.compile(r"^profiler_info_(\d+)\.json$")
_LEGACY_STEP_FILE = re.compile(r"^step_trace_raw_(\d+)_detail_time\.csv$")
_TRACE_SUFFIX = re.compile(r"(\.pt)?(\.trace)?\.json(\.gz)?$")
HEAD_BYTES = 1 << 16


@dataclasses.dataclass
class Run:
    """One entry of the run list, with where its analysis lives (or will live)."""

    id: str
    name: str
    kind: str  # "trace" | "job" | "perfsight_run" | "analysed"
    path: Path
    inputs: list[Path]
    ranks: list[int]
    date: float
    size_bytes: int
    output_root: Path  # where the server writes its analysis: in its cache folder (may not exist yet)
    roots: tuple[Path, ...] = ()  # the folders everything read must resolve into (base dir, cache)
    found_root: Path | None = None  # outputs `perfsight analyse` wrote in the base dir: read, never written
    hosts: list[str] = dataclasses.field(default_factory=list)  # as the collector recorded them, if it did
    family: str = "PyTorch"  # what made the data, in a user's words: PyTorch, Ascend, MindInsight

    @property
    def kind_label(self) -> str:
        """The kind in a user's words, for the run list ("PyTorch job, 4 ranks", "Ascend job")."""
        n = len(self.ranks)
        if self.kind == "job":
            return f"{self.family} job, {n} ranks" if n > 1 else f"{self.family} job"
        if self.kind == "perfsight_run":
            return f"{self.family} run, rank {self.ranks[0]}" if n == 1 else f"{self.family} run, {n} ranks"
        if self.kind == "trace":
            return f"{self.family} trace"
        return f"analysis, {n} ranks" if n > 1 else "analysis"

    def rank_dirs(self, root: Path) -> dict[int, Path]:
        """Analysed ``rank<N>`` folders under ``root`` (one of this run's), by rank; only those whose
        every path resolves inside the run's roots."""
        return rank_dirs(root, self.roots)


def contained(folder: Path, roots: tuple[Path, ...]) -> bool:
    """True when ``folder`` and everything under it resolve inside ``roots``: a symlinked rank folder,
    cache folder or table that leads out of the base dir makes the whole rank folder unreadable.
    Symlinked folders are followed (once each) so that a link inside the roots cannot hide one out.
    Only links are resolved (``os.scandir`` tells them apart without a system call per file), so a
    rank's cache of a few dozen files is checked in a fraction of a millisecond."""
    start = inside(folder, roots)
    if start is None:
        return False
    pending, seen = [start], {start}
    while pending:
        try:
            entries = list(os.scandir(pending.pop()))
        except OSError:
            continue  # unreadable: nothing in it can be served either
        for entry in entries:
            if entry.is_symlink():
                target = inside(entry.path, roots)
                if target is None:
                    return False
                if target.is_dir() and target not in seen:
                    seen.add(target)
                    pending.append(target)
            elif entry.is_dir(follow_symlinks=False):
                pending.append(Path(entry.path))
    return True


def rank_dirs(root: Path, roots: tuple[Path, ...] | None = None) -> dict[int, Path]:
    """Analysed rank folders under ``root``, by rank: ``rank<N>/`` children, or ``root`` itself when it
    holds a ``cache/`` (a perfsight run folder analysed in place).  With ``roots``, a rank folder
    whose ``cache/`` or ``PROFILER_OUTPUT/`` holds a path resolving outside them is left out."""

    def readable(rank_dir: Path) -> bool:
        if not (rank_dir / "cache" / layout.CACHE_META_FILE).is_file():
            return False
        if roots is None:
            return True
        parts = [rank_dir / "cache", rank_dir / "PROFILER_OUTPUT"]
        return inside(rank_dir, roots) is not None and all(
            contained(p, roots) for p in parts if p.exists() or p.is_symlink()
        )

    found: dict[int, Path] = {}
    if not root.is_dir():
        return found
    if readable(root):
        try:
            meta = json.loads((root / "cache" / layout.CACHE_META_FILE).read_text(encoding="utf-8"))
            found[int(meta.get("rank", 0))] = root
        except (OSError, ValueError, TypeError):
            pass
    for child in sorted(root.iterdir()):
        match = _RANK_DIR.match(child.name)
        if match and int(match.group(1)) not in found and readable(child):
            found[int(match.group(1))] = child
    return found


def cache_sources(rank_dir: Path) -> list[Path]:
    """The input files a rank's cache was made from (empty if unknown)."""
    try:
        saved = json.loads((rank_dir / "cache" / layout.CACHE_SOURCE_FILE).read_text(encoding="utf-8"))
        return [Path(f["path"]) for f in saved.get("files", [])]
    except (OSError, ValueError, KeyError, TypeError):
        return []


def _is_trace(path: Path) -> bool:
    name = path.name
    return (
        name.endswith(TRACE_SUFFIXES)
        and not name.startswith(".")
        and not name.startswith("profiler_info")
        and name not in {"profiler_metadata.json", layout.CACHE_META_FILE, layout.CACHE_SOURCE_FILE}
    )


def _head(path: Path) -> bytes:
    try:
        if path.name.endswith(".gz"):
            with gzip.open(path, "rb") as handle:
                return handle.read(HEAD_BYTES)
        with open(path, "rb") as handle:
            return handle.read(HEAD_BYTES)
    except (OSError, EOFError, zlib.error):
        return b""


_head_memo: dict[tuple[str, str, int, int], int | None] = {}
"""What :func:`peek_rank` and :func:`peek_world_size` read, by (what, file, size, mtime): the run
list asks again on every refresh."""


def _peeked(what: str, path: Path, read: Callable[[Path], int | None]) -> int | None:
    """``read(path)``, once per version of the file (see :data:`_head_memo`); None if unreadable."""
    try:
        stat = path.stat()
    except OSError:
        return None
    key = (what, str(path), stat.st_size, stat.st_mtime_ns)
    if key not in _head_memo:
        _head_memo[key] = read(path)
    return _head_memo[key]


def _first_int(match: re.Match[str] | re.Match[bytes] | None) -> int | None:
    return int(match.group(1)) if match else None


def _read_rank(path: Path) -> int | None:
    recorded = _first_int(_RANK_IN_HEAD.search(_head(path)))
    return recorded if recorded is not None else _first_int(_RANK_IN_NAME.search(path.name))


def peek_rank(path: Path) -> int | None:
    """The rank a trace records in its first bytes, else one in its file name, else None."""
    return _peeked("rank", path, _read_rank)


def peek_world_size(path: Path) -> int | None:
    """The world size a trace records in its first bytes (``distributedInfo``), else None."""
    return _peeked("world", path, lambda p: _first_int(_WORLD_IN_HEAD.search(_head(p))))


def _stat_sum(paths: list[Path]) -> tuple[float, int]:
    mtime, size = 0.0, 0
    for path in paths:
        try:
            stat = path.stat()
        except OSError:
            continue
        mtime = max(mtime, stat.st_mtime)
        size += stat.st_size
    return mtime, size


_host_memo: dict[tuple[str, int, int], str | None] = {}


def _recorded_host(info: Path) -> str | None:
    """The host name a rank's ``profiler_info_{rank}.json`` records; read once per version of the
    file (the run list is rediscovered every few seconds, a job may have a thousand ranks)."""
    try:
        stat = info.stat()
    except OSError:
        return None
    key = (str(info), stat.st_size, stat.st_mtime_ns)
    if key not in _host_memo:
        try:
            host = json.loads(info.read_text(encoding="utf-8")).get("host")
        except (OSError, ValueError, AttributeError):
            host = None
        _host_memo[key] = host if isinstance(host, str) and host else None
    return _host_memo[key]


def iso_date(timestamp: float) -> str:
    return dt.datetime.fromtimestamp(timestamp, tz=dt.UTC).isoformat(timespec="seconds")


def _digest(path: Path) -> str:
    return hashlib.sha256(str(path).encode("utf-8", "surrogateescape")).hexdigest()[:16]


class Discovery:
    """Lists the runs under ``base``; the analyses the server makes go under ``cache_dir``."""

    def __init__(self, base: Path, cache_dir: Path) -> None:
        self.base = base.resolve()
        self.cache_dir = cache_dir.resolve()
        # one folder per base dir: two servers of two base dirs sharing a cache never collide
        self.cache_root = self.cache_dir / f"{self.base.name[:40] or 'root'}-{_digest(self.base)}"
        self.roots = (self.base, self.cache_dir)

    # ------------------------------------------------------------------ where outputs go
    def output_root_for(self, path: Path) -> Path:
        """The folder of the server's own analysis of the run at ``path``: in its cache, never beside
        the data (``perfsight analyse --out`` is the way to write outputs there)."""
        return self.cache_root / f"{_TRACE_SUFFIX.sub('', path.name)[:40]}-{_digest(path)}"

    def _run(self, **fields: object) -> Run:
        path = fields["path"]
        assert isinstance(path, Path)
        return Run(**fields, output_root=self.output_root_for(path), roots=self.roots)  # type: ignore[arg-type]

    # ------------------------------------------------------------------ walking
    def _resolved_file(self, path: Path) -> Path | None:
        if path.is_symlink():
            return inside(path, [self.base])
        return path

    def discover(self) -> list[Run]:
        raw: list[Run] = []
        analysed: list[Path] = []
        for folder, dirnames, filenames in os.walk(self.base, followlinks=False):
            here = Path(folder)
            dirnames[:] = sorted(
                d
                for d in dirnames
                if not d.startswith(".")
                and d not in ("PROFILER_OUTPUT", "cache")
                and not (here / d).is_symlink()
            )
            job = self._run_folder_job(here, dirnames) or self._rank_folder_job(here, dirnames, filenames)
            if job is not None:  # the rank folders of one job: one run, never one per rank
                raw.append(job)
                dirnames[:] = []
                continue
            infos = [f for f in filenames if _PROFILER_INFO.match(f)]
            if here.name.endswith("_perfsight") and infos:
                raw.append(self._perfsight_run(here, infos))
                dirnames[:] = []  # its analysis (in place, or under rank<N>/) belongs to it
                continue
            if rank_dirs(here, self.roots):
                analysed.append(here)
                dirnames[:] = []
                continue
            folder_run = self._folder_job(here, dirnames, filenames)
            if folder_run is not None:  # Ascend rank folders / a MindInsight legacy run: one job
                raw.append(folder_run)
                dirnames[:] = []
                continue
            traces = []
            for name in sorted(filenames):
                file = self._resolved_file(here / name)
                if file is not None and file.is_file() and _is_trace(here / name):
                    traces.append(here / name)
            raw.extend(self._trace_runs(here, traces))
        return self._merge(raw, sorted(set(analysed)))

    def _perfsight_run(self, folder: Path, infos: list[str]) -> Run:
        inputs = [
            p
            for p in find_traces(folder)
            if inside(p, [self.base]) is not None and "cache" not in p.relative_to(folder).parts
        ]  # never our own outputs: re-analysing would change the inputs again
        ranks = sorted({int(_PROFILER_INFO.match(name).group(1)) for name in infos})  # type: ignore[union-attr]
        mtime, size = _stat_sum(inputs)
        return self._run(
            id=relative_id(folder, self.base),
            name=folder.name,
            kind="perfsight_run",
            path=folder,
            inputs=inputs,
            ranks=ranks,
            date=mtime,
            size_bytes=size,
            hosts=sorted({h for name in infos if (h := _recorded_host(folder / name))}),
        )

    def _run_folder_job(self, folder: Path, dirnames: list[str]) -> Run | None:
        """The perfsight run folders directly under ``folder`` (``*_perfsight/`` with a
        ``profiler_info_{rank}.json``), as one job when they hold more than one rank: the collector
        writes one such folder per rank and window, and a user thinks of them as one training job.
        Folders of one rank only (several windows, or a lone rank) stay runs of their own."""
        members: list[tuple[Path, list[str]]] = []
        for name in dirnames:
            if not name.endswith("_perfsight"):
                continue
            child = folder / name
            try:
                infos = [f for f in os.listdir(child) if _PROFILER_INFO.match(f)]
            except OSError:
                continue
            if infos:
                members.append((child, infos))
        ranks = {int(_PROFILER_INFO.match(i).group(1)) for _, infos in members for i in infos}  # type: ignore[union-attr]
        if len(ranks) < 2:
            return None
        runs = [self._perfsight_run(child, infos) for child, infos in members]
        inputs = [p for run in runs for p in run.inputs]
        mtime, size = _stat_sum(inputs)
        return self._run(
            id=relative_id(folder, self.base),
            name=folder.name if folder != self.base else self.base.name,
            kind="job",
            path=folder,
            inputs=inputs,
            ranks=sorted(ranks),
            date=mtime,
            size_bytes=size,
            hosts=sorted({h for run in runs for h in run.hosts}),
        )

    def _rank_folder_job(self, folder: Path, dirnames: list[str], filenames: list[str]) -> Run | None:
        """Sub-folders holding one rank's traces each (``job/rank0000/rank0.pt.trace.json``, as a
        launcher's per-rank output folders), as one job: when ``folder`` has no trace of its own, at
        least two such sub-folders, and every trace under them records its rank (each rank once)
        and the same world size of two or more (``distributedInfo``)."""
        if any(_is_trace(folder / name) for name in filenames):
            return None
        traces: list[Path] = []
        for name in dirnames:
            child = folder / name
            try:
                entries = sorted(os.scandir(child), key=lambda e: e.name)
            except OSError:
                continue
            found = [
                Path(e.path) for e in entries if e.is_file(follow_symlinks=False) and _is_trace(Path(e.path))
            ]
            if not found:
                continue
            if any(
                e.is_dir(follow_symlinks=False) and e.name not in ("PROFILER_OUTPUT", "cache")
                for e in entries
            ):
                return None  # a deeper layout: left to the walk
            traces.extend(found)
        ranks = [peek_rank(p) for p in traces]
        folders = {p.parent for p in traces}
        if len(folders) < 2 or None in ranks or len(set(ranks)) != len(ranks):
            return None
        # unrelated runs side by side are not a job: every trace must say it is one rank of the
        # same multi-rank world
        worlds = {peek_world_size(p) for p in traces}
        if len(worlds) != 1 or (worlds.pop() or 0) < 2:
            return None
        mtime, size = _stat_sum(traces)
        return self._run(
            id=relative_id(folder, self.base),
            name=folder.name if folder != self.base else self.base.name,
            kind="job",
            path=folder,
            inputs=traces,
            ranks=sorted(r for r in ranks if r is not None),
            date=mtime,
            size_bytes=size,
        )

    def _folder_job(self, folder: Path, dirnames: list[str], filenames: list[str]) -> Run | None:
        """A folder whose files make one run as a whole, never one run per JSON file: Ascend rank
        folders (``*_ascend_pt``/``*_ascend_ms``: the folder itself, or the job folder holding them)
        and MindInsight's legacy layout (a ``profiler/`` folder, or an r1.3 ``cluster_profiler`` root).
        Ranks come from the file names (``profiler_info_{n}.json``, ``step_trace_raw_{n}_...``)."""
        ascend = (folder / ASCEND_OUTPUT_DIR).is_dir() or any(
            (folder / d / ASCEND_OUTPUT_DIR).is_dir() for d in dirnames
        )
        legacy = "cluster_profiler" in dirnames or any(_LEGACY_STEP_FILE.match(f) for f in filenames)
        if not (ascend or legacy):
            return None
        inputs = [p for p in find_traces(folder) if inside(p, [self.base]) is not None]
        if not inputs:
            return None
        ranks = []
        for path in inputs:
            match = _LEGACY_STEP_FILE.match(path.name)
            if match:
                ranks.append(int(match.group(1)))
                continue
            rank_folder = path.parent.parent if path.parent.name == ASCEND_OUTPUT_DIR else path.parent
            numbers = [
                m.group(1)
                for f in rank_folder.glob("profiler_info_*.json")
                if (m := _PROFILER_INFO.match(f.name))
            ]
            ranks.append(int(numbers[0]) if numbers else len(ranks))
        if "cluster_profiler" in dirnames:  # files are numbered by device id: the rank table has the ranks
            from perfsight.ingest.ascend_files import FileProblems
            from perfsight.ingest.mindinsight_legacy import read_rank_table

            table = read_rank_table(folder, FileProblems()).column("rank").to_pylist()
            ranks = table if len(set(table)) >= len(inputs) else list(range(len(inputs)))
        mtime, size = _stat_sum(inputs)
        return self._run(
            id=relative_id(folder, self.base),
            name=folder.name if folder != self.base else self.base.name,
            kind="job",
            path=folder,
            inputs=inputs,
            ranks=sorted(set(ranks)),
            date=mtime,
            size_bytes=size,
            family="Ascend" if ascend else "MindInsight",
        )

    def _trace_runs(self, folder: Path, traces: list[Path]) -> list[Run]:
        """Several traces of distinct ranks in one folder are one job; otherwise one run per file."""
        if not traces:
            return []
        ranks = [peek_rank(p) for p in traces]
        known = [r for r in ranks if r is not None]
        if len(traces) > 1 and len(known) == len(traces) and len(set(known)) == len(known):
            mtime, size = _stat_sum(traces)
            return [
                self._run(
                    id=relative_id(folder, self.base),
                    name=folder.name if folder != self.base else self.base.name,
                    kind="job",
                    path=folder,
                    inputs=traces,
                    ranks=sorted(known),
                    date=mtime,
                    size_bytes=size,
                )
            ]
        runs = []
        for trace, rank in zip(traces, ranks, strict=True):
            mtime, size = _stat_sum([trace])
            runs.append(
                self._run(
                    id=relative_id(trace, self.base),
                    name=trace.name,
                    kind="trace",
                    path=trace,
                    inputs=[trace],
                    ranks=[rank if rank is not None else 0],
                    date=mtime,
                    size_bytes=size,
                )
            )
        return runs

    def _merge(self, raw: list[Run], analysed: list[Path]) -> list[Run]:
        """Attach analysed folders to the raw run they were made from (``found_root``, read as they
        are while their inputs are unchanged); list the others alone."""
        # resolving every input is a thousand system calls for a thousand-rank job: only when an
        # analysed folder is there to be matched
        by_inputs = (
            {frozenset(p.resolve() for p in run.inputs): run for run in raw if run.inputs} if analysed else {}
        )
        defaults = {default_output_root(run.path): run for run in raw}
        for default, run in defaults.items():  # `perfsight analyse PATH` without --out wrote here
            if rank_dirs(default, self.roots):
                run.found_root = default
        runs = list(raw)
        for root in analysed:
            dirs = rank_dirs(root, self.roots)
            sources = frozenset(p.resolve() for d in dirs.values() for p in cache_sources(d))
            owner = by_inputs.get(sources)
            if owner is not None:
                if owner.found_root is None:
                    owner.found_root = root
                continue
            if root in defaults:
                continue  # the default output of a raw run whose inputs changed: shown as that run
            mtime, size = _stat_sum([d / "cache" / layout.CACHE_META_FILE for d in dirs.values()])
            runs.append(
                self._run(
                    id=relative_id(root, self.base),
                    name=root.name,
                    kind="analysed",
                    path=root,
                    inputs=[],
                    ranks=sorted(dirs),
                    date=mtime,
                    size_bytes=size,
                    found_root=root,
                )
            )
        runs.sort(key=lambda r: r.id)
        return runs


def step_count(rank_dir: Path) -> int | None:
    """Steps recorded in a rank's cache (Parquet metadata only; nothing is decoded)."""
    try:
        return pq.read_metadata(rank_dir / "cache" / "steps.parquet").num_rows
    except (OSError, ValueError):
        return None


_MODE_SHORT = {"data": "DP", "tensor": "TP", "pipeline": "PP", "context": "CP", "expert": "EP"}


def parallel_layout(root: Path) -> str | None:
    """The parallel layout the cluster analysis under ``root`` detected, as a user writes it
    (``"DP2 × PP2"``: each mode and the size of its groups), or None when there is none."""
    try:
        summary = json.loads((root / CLUSTER_OUTPUT_DIR / "cluster_summary.json").read_text(encoding="utf-8"))
        parallel = summary.get("parallel") or {}
        parts = []
        for mode in parallel.get("modes") or []:
            groups = (parallel.get("groups") or {}).get(mode) or []
            size = max((len(g) for g in groups), default=0)
            parts.append(f"{_MODE_SHORT.get(mode, mode)}{size if size else ''}")
    except (OSError, ValueError, TypeError, AttributeError):
        return None
    return " × ".join(parts) or None
