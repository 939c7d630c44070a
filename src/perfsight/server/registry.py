"""The server's view of runs: discovery (briefly cached), status, and the opened data of ready runs.

Why a registry: every request names a run by id; the id must map to a run that discovery found
(never to an arbitrary path), and a ready run's memory-mapped timeline index and metadata should be
opened once, not per request.  Opened runs are keyed by their caches' stamps, so a re-analysis is
picked up without restarting the server.
"""

from __future__ import annotations

import dataclasses
import json
import math
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq

from perfsight import layout
from perfsight.model import RunMetadata
from perfsight.server import models
from perfsight.server.jobs import JobManager, Plan, plan, plan_stamp
from perfsight.server.runs import Discovery, Run, iso_date, parallel_layout, step_count
from perfsight.server.security import safe_relative, without_roots
from perfsight.store import cache, timeline_index

DISCOVERY_TTL_S = 2.0
READY_TTL_S = 1.0
"""How long an opened run is served without re-checking that its caches are still current: the
check reads and hashes several files per rank (a millisecond or more), which would otherwise be
paid by every timeline window of a user panning; an input changed on disk shows within a second."""
MAX_OPEN_RUNS = 4
SAVED_FOLDER = "saved"
"""The subfolder of a run's output root (in the server's cache) with the overviews it saved."""


class UnknownRun(LookupError):
    """No run with that id under the base dir."""


class NotReady(RuntimeError):
    """The run is not analysed yet; carries its status."""

    def __init__(self, status: models.RunStatus) -> None:
        super().__init__(f"run {status.id!r} is {status.status}")
        self.status = status


@dataclasses.dataclass
class RankData:
    """One analysed rank: where its tables are and its memory-mapped timeline index."""

    rank: int
    cache_folder: Path
    output_dir: Path
    meta: RunMetadata
    timeline: timeline_index.TimelineArrays
    tracks: pa.Table
    overview_file: Path | None = None  # where the server may save this rank's overview (its cache)

    def table_path(self, name: str) -> Path:
        return self.cache_folder / cache.ANALYSIS_DIR / f"{name}.parquet"

    def has_table(self, name: str) -> bool:
        return self.table_path(name).is_file()


@dataclasses.dataclass
class OpenedRun:
    run: Run
    ranks: Mapping[int, RankData]  # a LazyRanks when opened by the registry: ranks open on first use
    origin_ns: int
    end_ns: int
    root: Path | None = None  # the analysis folder it was read from

    def table_path(self, rank: int, name: str) -> Path:
        """``rank``'s analysis table ``name``, without opening the rank (a job-wide query over a
        table of every rank must not open a thousand ranks' timelines)."""
        ranks = self.ranks
        folder = ranks.cache_folder(rank) if isinstance(ranks, LazyRanks) else ranks[rank].cache_folder
        return folder / cache.ANALYSIS_DIR / f"{name}.parquet"

    def rank(self, rank: int | None) -> RankData:
        if rank is None:
            return self.ranks[min(self.ranks)]
        if rank not in self.ranks:
            raise UnknownRun(f"run {self.run.id!r} has no rank {rank}; ranks: {sorted(self.ranks)}")
        return self.ranks[rank]


@dataclasses.dataclass
class ReadyJob:
    """A ready run as the job pages need it: which run, and the analysis folder to read."""

    run: Run
    root: Path | None


OPEN_ERRORS: tuple[type[Exception], ...] = (OSError, ValueError, KeyError, TypeError, duckdb.Error)
"""What opening a damaged rank cache raises: unreadable or malformed ``meta.json`` (ValueError,
KeyError, TypeError), a truncated memory-mapped array (ValueError), Arrow's and DuckDB's errors."""
READ_ERRORS: tuple[type[Exception], ...] = (OSError, pa.ArrowException, duckdb.Error)
"""What reading a damaged table of an opened run raises (Arrow's ``ArrowInvalid`` is one of
``pa.ArrowException``).  Narrower than :data:`OPEN_ERRORS`: a plain ValueError while answering a
request is a fault of the server's code, not of a file."""


class DamagedAnalysis(RuntimeError):
    """A file of an analysis could not be read; names the file (when known) and what is wrong."""


def open_rank(rank: int, rank_dir: Path, saved_in: Path | None = None) -> RankData:
    """One analysed rank folder, opened: its metadata, tracks and memory-mapped timeline index.
    ``saved_in`` is the server's folder for the overviews it saves (never the served folders).
    Raises :class:`DamagedAnalysis` when a file of it cannot be read."""
    folder = rank_dir / "cache"
    try:
        meta_data = json.loads((folder / layout.CACHE_META_FILE).read_text(encoding="utf-8"))
        return RankData(
            rank=rank,
            cache_folder=folder,
            output_dir=rank_dir / "PROFILER_OUTPUT",
            meta=RunMetadata.from_dict(meta_data),
            timeline=timeline_index.TimelineArrays(folder),
            # read_table imports datasets (3 s); a few hundred rows need no thread pool (2x faster)
            tracks=pq.ParquetFile(folder / "tracks.parquet").read(use_threads=False),
            overview_file=None if saved_in is None else saved_in / f"overview_rank{rank}.idx",
        )
    except OPEN_ERRORS as error:
        raise DamagedAnalysis(f"{folder}: {error}") from error


class LazyRanks(Mapping[int, RankData]):
    """The ranks of an opened run, by rank, each opened (:func:`open_rank`) on first use.

    Why: a page of one rank of a thousand-rank job reads that rank only; opening every rank's
    metadata, tracks and timeline index took 13 s before its first answer.  Listing the ranks
    (iterating, ``in``, ``len``) opens none; ``ranks[r]`` opens ``r`` once.  ``clean`` rewrites each
    opened rank's warnings (the server's own paths replaced by their labels); ``damaged`` turns a
    rank that cannot be opened into the exception to raise instead (the registry's: set the
    analysis aside, answer with the run's new status)."""

    def __init__(
        self,
        dirs: Mapping[int, Path],
        saved_in: Path | None = None,
        clean: Callable[[str], str] | None = None,
        damaged: Callable[[DamagedAnalysis], Exception] | None = None,
        lanes: Mapping[int, tuple[tuple[int, int, int], ...]] | None = None,
    ) -> None:
        self._dirs = dict(sorted(dirs.items()))
        self._lanes = dict(lanes or {})
        self._saved_in = saved_in
        self._clean = clean
        self._damaged = damaged
        self._open: dict[int, RankData] = {}
        self._once: dict[str, Any] = {}
        self._lock = threading.Lock()

    def __getitem__(self, rank: int) -> RankData:
        found = self._open.get(rank)
        if found is not None:
            return found
        if rank not in self._dirs:
            raise KeyError(rank)
        with self._lock:  # two requests for one rank open it once
            found = self._open.get(rank)
            if found is None:
                try:
                    found = open_rank(rank, self._dirs[rank], self._saved_in)
                except DamagedAnalysis as error:
                    if self._damaged is None:
                        raise
                    raise self._damaged(error) from None
                if self._clean is not None:
                    found.meta.warnings = [self._clean(w) for w in found.meta.warnings]
                self._open[rank] = found
        return found

    def __contains__(self, rank: object) -> bool:
        return rank in self._dirs

    def __iter__(self) -> Iterator[int]:
        return iter(self._dirs)

    def __len__(self) -> int:
        return len(self._dirs)

    def cache_folder(self, rank: int) -> Path:
        """Where ``rank``'s cache is, without opening it (its analysis tables are under it)."""
        return self._dirs[rank] / "cache"

    def once(self, key: str, make: Callable[[], Any]) -> Any:
        """``make()``, computed once for these ranks (they are replaced when their analysis
        changes): what every rank's tables give, asked again by each page of the job."""
        with self._lock:
            if key not in self._once:
                self._once[key] = make()
            return self._once[key]

    def lanes(self, rank: int) -> tuple[tuple[int, int, int], ...] | None:
        """``rank``'s timeline lanes as (track, depth, events), read before any rank was opened;
        None when not known (then open the rank and read its index)."""
        return self._lanes.get(rank)

    @property
    def opened(self) -> list[int]:
        """The ranks opened so far."""
        return sorted(self._open)


@dataclasses.dataclass(frozen=True)
class Spans:
    """What the run's timeline indexes say before any rank is opened: the ranks whose index can be
    read, their indexes' stamps (what changes when one is rebuilt), and the run's time span."""

    dirs: dict[int, Path]
    stamps: tuple[tuple[int, str, str], ...]
    origin_ns: int
    end_ns: int
    lanes: dict[int, tuple[tuple[int, int, int], ...]] = dataclasses.field(default_factory=dict)
    """Per rank, its index's lanes as (track, depth, events): the track list of a job without
    opening its ranks."""


def timeline_spans(dirs: Mapping[int, Path]) -> Spans:
    """Each rank's timeline ``meta.idx`` alone (a small JSON file; the index's arrays stay closed):
    the run's origin is the earliest event of any rank, its end the latest, relative to the origin.
    A rank whose index cannot be read is left out, as one whose index is missing."""
    kept: dict[int, Path] = {}
    lanes: dict[int, tuple[tuple[int, int, int], ...]] = {}
    stamps = []
    firsts, lasts = [], []
    for rank, rank_dir in sorted(dirs.items()):  # one small file per rank
        try:
            index = rank_dir / "cache" / timeline_index.FOLDER / timeline_index.META
            meta = json.loads(index.read_text(encoding="utf-8"))
            listed = tuple((int(x["track"]), int(x["depth"]), int(x["count"])) for x in meta["lanes"])
        except (OSError, ValueError, KeyError, TypeError):
            continue
        kept[rank] = rank_dir
        stamps.append((rank, str(rank_dir), str(meta.get("stamp"))))
        lanes[rank] = listed
        if meta.get("events"):
            firsts.append(int(meta["first_ns"]))
            lasts.append(int(meta["last_ns"]))
    origin = min(firsts) if firsts else 0
    return Spans(kept, tuple(stamps), origin, (max(lasts) - origin) if lasts else 0, lanes)


def open_ranks(dirs: dict[int, Path], saved_in: Path | None = None) -> tuple[LazyRanks, int, int]:
    """The ranks of ``dirs`` (rank folders) whose timeline index can be read, each opened on first
    use (:class:`LazyRanks`), with the run's origin (earliest event of any rank) and its end
    relative to that origin."""
    spans = timeline_spans(dirs)
    return LazyRanks(spans.dirs, saved_in, lanes=spans.lanes), spans.origin_ns, spans.end_ns


def _written(root: Path) -> tuple[int, ...]:
    """When the rank caches under ``root`` were last written (their ``meta.json``, which every
    analysis rewrites): a damaged analysis written again since is considered again."""
    stamps = []
    for meta in sorted(root.glob(f"*/cache/{layout.CACHE_META_FILE}")) + [
        root / "cache" / layout.CACHE_META_FILE
    ]:
        try:
            stamps.append(meta.stat().st_mtime_ns)
        except OSError:
            stamps.append(0)
    return tuple(stamps)


class Registry:
    def __init__(self, base: Path, cache_dir: Path) -> None:
        self.discovery = Discovery(base, cache_dir)
        # what errors and warnings say instead of the server's own paths (see without_roots)
        found = self.discovery
        self._labels = {found.base: found.base.name, found.cache_dir: "<server cache>"}
        self.jobs = JobManager()
        self._runs: dict[str, Run] = {}
        self._when = 0.0
        self._lock = threading.Lock()
        self._opened: dict[str, tuple[tuple[Any, ...], OpenedRun, Plan]] = {}  # with the plan it read
        self._checked: dict[str, float] = {}  # run id -> when it was last found ready and opened
        # analyses a file of which could not be read, with their stamps then: not served until
        # rewritten (another `perfsight analyse` changes the stamp)
        self._damaged: dict[Path, tuple[int, ...]] = {}
        self._damage_errors: dict[str, str] = {}  # run id -> what was damaged (for a failed status)
        # run id -> (what the plan was made from, the plan, the discovered run it was checked for)
        self._plans: dict[str, tuple[Any, Plan, Run]] = {}

    def public(self, text: str) -> str:
        """``text`` as the API may show it: the server's own paths replaced by their labels."""
        return without_roots(text, self._labels)

    # ------------------------------------------------------------------ discovery
    def runs(self) -> dict[str, Run]:
        with self._lock:
            if time.monotonic() - self._when > DISCOVERY_TTL_S:
                self._runs = {run.id: run for run in self.discovery.discover()}
                self._when = time.monotonic()
            return self._runs

    def run(self, run_id: str) -> Run:
        if not safe_relative(run_id):
            raise UnknownRun(f"no run {run_id!r} under the base dir")
        found = self.runs().get(run_id)
        if found is None:
            raise UnknownRun(f"no run {run_id!r} under the base dir")
        return found

    # ------------------------------------------------------------------ status
    def plan(self, run: Run) -> Plan:
        """Where ``run`` is read from now, or what work it needs (:func:`jobs.plan`).

        Made again only when a stat of what it reads changed (:func:`jobs.plan_stamp`), and that is
        checked once per discovery of the run (every :data:`DISCOVERY_TTL_S`): at a thousand ranks
        a plan takes seconds, and the run list and every page ask for it."""
        with self._lock:
            damaged = dict(self._damaged)
            hit = self._plans.get(run.id)
        bad = frozenset(root for root, stamp in damaged.items() if _written(root) == stamp)
        job = self.jobs.state(run)  # an analysis that started or ended since makes another plan
        what = (bad, None if job is None else (id(job), job.status), run.found_root, run.output_root)
        if hit is not None and hit[0][0] == what and hit[2] is run:
            return hit[1]
        key = (what, tuple(run.inputs), plan_stamp(run))
        if hit is not None and hit[0] == key:
            found = hit[1]
        else:
            found = plan(run, set(bad))
        with self._lock:
            self._plans[run.id] = (key, found, run)
        return found

    def status(self, run: Run, start: bool = False) -> models.RunStatus:
        """The run's status; with ``start``, queue its analysis when it is new or stale."""
        state = self.jobs.state(run)
        if state is not None and state.status in ("queued", "analysing", "failed"):
            return self._status(run, state.status, state.progress, state.stage, state.error, state.warnings)
        work = self.plan(run)
        if work.ready:
            warnings = state.warnings if state is not None else []
            return self._status(run, "ready", 1.0, "done", None, warnings, work.dirs)
        if not work.possible:  # only an analysis, found damaged, and no trace to analyse again
            error = self._damage_errors.get(run.id, "its analysis cannot be read")
            return self._status(run, "failed", 0.0, "", error, [])
        if start:
            with self._lock:  # the server's own damaged analysis is emptied before the new one
                clear = self._damaged.pop(run.output_root, None) is not None
            state = self.jobs.submit(run, work, clear=clear)
            return self._status(run, state.status, state.progress, state.stage, state.error, [])
        analysed_before = any(run.rank_dirs(r) for r in (run.found_root, run.output_root) if r is not None)
        return self._status(run, "stale" if analysed_before else "new", 0.0, "", None, [])

    def _status(
        self,
        run: Run,
        status: str,
        progress: float,
        stage: str,
        error: str | None,
        warnings: list[str],
        dirs: dict[int, Path] | None = None,
    ) -> models.RunStatus:
        ranks = sorted(dirs) if dirs is not None else run.ranks  # a ready analysis's rank folders
        return models.RunStatus(
            id=run.id,
            status=status,  # type: ignore[arg-type]
            progress=progress,
            stage=stage,
            error=None if error is None else without_roots(error, self._labels),
            ranks=ranks or run.ranks,
            warnings=[without_roots(w, self._labels) for w in warnings],
        )

    def run_info(self, run: Run) -> models.RunInfo:
        status = self.status(run)
        work = self.plan(run) if status.status == "ready" else Plan()
        root, dirs = work.root, work.dirs
        steps = step_count(dirs[min(dirs)]) if dirs else None
        layout = parallel_layout(root) if root is not None and len(dirs) > 1 else None
        return models.RunInfo(
            id=run.id,
            name=run.name,
            kind=run.kind,  # type: ignore[arg-type]
            kind_label=run.kind_label,
            ranks=status.ranks,
            hosts=run.hosts,
            layout=layout,
            steps=steps,
            date=iso_date(run.date),
            size_bytes=run.size_bytes,
            status=status.status,
            error=status.error,
        )

    # ------------------------------------------------------------------ damaged analyses
    def damaged(self, run_id: str, error: BaseException) -> models.RunStatus:
        """Set aside the analysis ``run_id`` was read from (a file of it could not be read) and
        start another: a new analysis of the run's traces into the server's cache, or, for an
        analysis without its traces, a failed status saying what is damaged."""
        run = self.run(run_id)
        with self._lock:
            hit = self._opened.pop(run.id, None)
            self._checked.pop(run.id, None)
        root = hit[1].root if hit is not None else self.plan(run).root
        if root is not None:
            with self._lock:
                self._damaged[root] = _written(root)
                self._damage_errors[run.id] = f"the analysis in {root} is damaged ({error})"
        self.jobs.forget(run)
        return self.status(run, start=True)

    # ------------------------------------------------------------------ opened data
    def ready_job(self, run_id: str) -> ReadyJob:
        """The ready run and the analysis it is read from, its ranks left closed: the job pages read
        the job's own outputs only, and opening a thousand ranks takes seconds.  Raises
        :class:`NotReady` (and starts the analysis) otherwise."""
        run = self.run(run_id)
        status = self.status(run, start=True)
        if status.status != "ready":
            raise NotReady(status)
        return ReadyJob(run=run, root=self.plan(run).root)

    def opened(self, run_id: str) -> OpenedRun:
        """The ready run's data; raises :class:`NotReady` (and starts the analysis) otherwise."""
        with self._lock:
            hit = self._opened.get(run_id)
            if hit is not None and time.monotonic() - self._checked.get(run_id, -math.inf) < READY_TTL_S:
                return hit[1]
        run = self.run(run_id)
        status = self.status(run, start=True)
        if status.status != "ready":
            raise NotReady(status)
        work = self.plan(run)
        root, dirs = work.root, work.dirs
        with self._lock:  # the same plan as when it was opened: nothing it read has changed
            hit = self._opened.get(run.id)
            if hit is not None and hit[2] is work:
                self._checked[run.id] = time.monotonic()
                return hit[1]
        spans = timeline_spans(dirs)  # one small file a rank; no rank is opened here
        stamps = spans.stamps
        with self._lock:
            hit = self._opened.get(run.id)
            if hit is not None and hit[0] == stamps:
                self._opened[run.id] = (stamps, hit[1], work)
                self._checked[run.id] = time.monotonic()
                return hit[1]
        if not spans.dirs:
            raise NotReady(self._status(run, "stale", 0.0, "timeline index missing", None, []))
        ranks = LazyRanks(
            spans.dirs,
            run.output_root / SAVED_FOLDER,
            clean=self.public,
            damaged=lambda error: NotReady(self.damaged(run.id, error)),
            lanes=spans.lanes,
        )
        origin, end = spans.origin_ns, spans.end_ns
        opened = OpenedRun(run=run, ranks=ranks, origin_ns=origin, end_ns=end, root=root)
        with self._lock:
            self._opened[run.id] = (stamps, opened, work)
            self._checked[run.id] = time.monotonic()
            while len(self._opened) > MAX_OPEN_RUNS:
                self._opened.pop(next(iter(self._opened)))
        return opened
