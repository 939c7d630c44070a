"""Background analysis of runs opened in the UI: one at a time, in a child process, with progress.

Why a child process: parsing and analysing a gigabyte trace holds the GIL and gigabytes of memory
for seconds to minutes; in the server's own process it would freeze every request.  The child
(a fresh ``python -m perfsight.server.worker``, sharing no state with the server) runs
``perfsight.api.analyse`` -- the same outputs as ``perfsight analyse`` -- then writes the timeline
index, and reports progress by rewriting a small JSON file the server reads on each status
request.  One worker thread runs the queue, so two analyses never compete for the machine and a
run is never analysed twice at once.

A run is *ready* when one of its analyses -- the outputs ``perfsight analyse`` wrote in the base
dir, else the server's own in its cache folder -- has every rank's cache fresh for its input
(``store.cache.is_fresh``) and a current timeline index (:func:`plan`); a changed input makes it
*stale*, and opening it again re-analyses into the server's cache.  Runs that are only an analysed
folder (their traces are gone) are ready as they are; if their timeline index is missing, they are
copied into the server's cache and indexed there: the base dir is never written.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import queue
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from perfsight import layout
from perfsight.server.runs import CLUSTER_FAILED_FILE, CLUSTER_OUTPUT_DIR, Run, cache_sources
from perfsight.store import cache, timeline_index

log = logging.getLogger(__name__)
PROGRESS_FILE = ".perfsight_progress.json"


@dataclasses.dataclass
class JobState:
    status: str  # queued | analysing | ready | failed
    progress: float = 0.0
    stage: str = ""
    error: str | None = None
    warnings: list[str] = dataclasses.field(default_factory=list)
    progress_file: Path | None = None
    started: float = 0.0
    fingerprint: Any = None  # inputs as they were when the job was queued


def _inputs_fingerprint(run: Run) -> Any:
    """Each input's path, mtime, size and inode, from ``os.stat`` alone: asked on every status and
    page request, where resolving a thousand-rank job's paths took a few hundred milliseconds."""
    return tuple((str(p), _stat(str(p), follow=True)) for p in run.inputs) if run.inputs else None


def missing_work(run: Run, dirs: dict[int, Path]) -> tuple[list[Path], list[Path]]:
    """(inputs whose cache in ``dirs`` is missing or stale, rank cache folders whose timeline index
    is stale)."""
    fresh_sources: set[Path] = set()
    stale_index = []
    for rank_dir in dirs.values():
        folder = rank_dir / "cache"
        sources = cache_sources(rank_dir)
        if run.inputs and not cache.is_fresh(folder, sources):
            continue
        fresh_sources.update(p.resolve() for p in sources)
        if not timeline_index.is_current(folder):
            stale_index.append(folder)
    todo = [p for p in run.inputs if p.resolve() not in fresh_sources]
    return todo, stale_index


def _cross_rank_done(root: Path) -> bool:
    """The job's cross-rank step ran under ``root``: its outputs are there, or why it failed."""
    return (root / CLUSTER_OUTPUT_DIR).is_dir() or (root / CLUSTER_FAILED_FILE).is_file()


@dataclasses.dataclass
class Plan:
    """What serving a run needs now: read ``root`` (ready), or analyse, or index (see :func:`plan`)."""

    root: Path | None = None  # a complete, current analysis to read
    dirs: dict[int, Path] = dataclasses.field(default_factory=dict)  # root's rank folders, by rank
    todo: list[Path] = dataclasses.field(default_factory=list)  # inputs to analyse into output_root
    seed: Path | None = None  # an analysis to copy into output_root, there to build its timeline index
    index: bool = False  # output_root holds a current analysis whose timeline index is missing

    @property
    def ready(self) -> bool:
        return self.root is not None

    @property
    def possible(self) -> bool:
        return self.ready or bool(self.todo) or self.seed is not None or self.index


def plan(run: Run, damaged: set[Path] = frozenset()) -> Plan:  # type: ignore[assignment]
    """Where to read ``run`` from, or the work that makes it readable.

    The outputs ``perfsight analyse`` wrote in the base dir (``found_root``) are read first while
    they match their inputs, then the server's own analysis (``output_root``); an analysis found
    damaged (``damaged``) is never chosen.  The base dir is never written: an analysis there that
    lacks a timeline index is copied into the server's cache and indexed there."""
    candidates = [r for r in (run.found_root, run.output_root) if r is not None and r not in damaged]
    usable = []
    for root in candidates:
        dirs = run.rank_dirs(root)
        if not dirs:
            continue
        todo, stale_index = missing_work(run, dirs)
        if todo or (run.inputs and len(run.ranks) > 1 and not _cross_rank_done(root)):
            continue  # a job's analysis includes its cross-rank outputs (the job pages read them)
        if not stale_index:
            return Plan(root=root, dirs=dirs)
        usable.append(root)
    if run.output_root in usable:
        return Plan(index=True)
    if usable:
        return Plan(seed=usable[0])
    return Plan(todo=list(run.inputs))


_STAMPED_PARTS = ("", "/cache", "/cache/" + layout.CACHE_SOURCE_FILE, "/cache/" + layout.CACHE_META_FILE)
_STAMPED_PARTS += ("/cache/timeline", "/cache/timeline/meta.idx", "/cache/analysis", "/PROFILER_OUTPUT")


def _stat(path: str, follow: bool = False) -> tuple[int, int, int] | None:
    try:
        stat = os.stat(path, follow_symlinks=follow)
    except OSError:
        return None
    return stat.st_mtime_ns, stat.st_size, stat.st_ino


def plan_stamp(run: Run) -> tuple[Any, ...]:
    """A fingerprint of what :func:`plan` reads, from ``os.stat`` alone: each input, and in each
    analysis folder its entries and, per entry, its cache's folders and stamp files.

    Why: :func:`plan` resolves, walks and hashes every rank folder (seconds at a thousand ranks),
    and the run list and every page ask for it; this costs a few stats per rank.  It changes
    whenever :func:`plan`'s answer can: caches, indexes and outputs are written by renaming into
    place, which changes the folder's mtime, and an added link or file changes its folder's."""
    stamps: list[Any] = [_stat(str(p), follow=True) for p in run.inputs]
    for root in (run.found_root, run.output_root):
        if root is None:
            continue
        top = str(root)
        stamps.append(_stat(top))
        stamps.extend(_stat(top + part) for part in _STAMPED_PARTS[1:])  # a run analysed in place
        try:
            with os.scandir(top) as entries:
                names = sorted(e.name for e in entries)
        except OSError:
            continue
        for name in names:
            stamps.append(name)
            stamps.extend(_stat(f"{top}/{name}{part}") for part in _STAMPED_PARTS)
    return tuple(stamps)


class JobManager:
    """Queues analyses of runs and runs them one at a time in a child process."""

    def __init__(self) -> None:
        self._states: dict[str, JobState] = {}
        self._queue: queue.Queue[tuple[Run, Plan, bool]] = queue.Queue()
        self._lock = threading.Lock()
        self._worker: threading.Thread | None = None
        self._stopping = threading.Event()
        self._current: subprocess.Popen[bytes] | None = None

    def state(self, run: Run) -> JobState | None:
        with self._lock:
            state = self._states.get(run.id)
        if state is None:
            return None
        if state.status == "analysing" and state.progress_file is not None:
            try:
                data = json.loads(state.progress_file.read_text(encoding="utf-8"))
                state.progress = min(0.99, data["done"] / max(1, data["total"]))
                state.stage = str(data["stage"])
                state.warnings = list(data.get("warnings") or [])
            except (OSError, ValueError, KeyError, TypeError):
                pass
        if state.status in ("ready", "failed") and state.fingerprint != _inputs_fingerprint(run):
            return None  # the inputs changed since: the old outcome no longer applies
        return state

    def submit(self, run: Run, work: Plan, clear: bool = False) -> JobState:
        """Queue ``work`` for ``run`` unless it is already queued or running; returns its state.
        ``clear`` empties the run's output root first (the server's own analysis, found damaged)."""
        with self._lock:
            state = self._states.get(run.id)
            if state is not None and state.status in ("queued", "analysing"):
                return state
            state = JobState(status="queued", stage="waiting for another analysis")
            state.fingerprint = _inputs_fingerprint(run)
            self._states[run.id] = state
            self._queue.put((run, work, clear))
            if self._worker is None or not self._worker.is_alive():
                self._worker = threading.Thread(target=self._work, name="perfsight-jobs", daemon=True)
                self._worker.start()
        return state

    def _work(self) -> None:
        while not self._stopping.is_set():
            try:
                run, work, clear = self._queue.get(timeout=0.5)
            except queue.Empty:
                continue
            state = self._states[run.id]
            try:
                self._run_one(run, work, clear, state)
            except Exception as error:  # the server must survive any analysis failure
                log.warning("analysis of %s failed: %s", run.id, error)
                state.status, state.error = "failed", str(error)

    def forget(self, run: Run) -> None:
        """Drop the outcome of ``run``'s last job (its analysis was found damaged since)."""
        with self._lock:
            state = self._states.get(run.id)
            if state is not None and state.status in ("ready", "failed"):
                del self._states[run.id]

    def _run_one(self, run: Run, work: Plan, clear: bool, state: JobState) -> None:
        if clear and run.output_root.is_dir():
            shutil.rmtree(run.output_root)  # the server's own folder in its cache, never the base dir
        run.output_root.mkdir(parents=True, exist_ok=True)
        progress = run.output_root / PROGRESS_FILE
        progress.write_text(json.dumps({"done": 0, "total": 1, "stage": "starting"}), encoding="utf-8")
        state.progress_file, state.started, state.status = progress, time.time(), "analysing"
        state.stage = "starting"
        spec = {
            "path": str(run.path),
            "inputs": [str(p) for p in work.todo] and [str(p) for p in run.inputs],  # the whole run, if any
            "seed": None if work.seed is None else str(work.seed),
            "output_root": str(run.output_root),
            "progress": str(progress),
            "job": len(run.ranks) > 1,  # several ranks: the cross-rank analysis too (the job pages)
        }
        # a fresh interpreter (not multiprocessing): nothing of the server, or of whatever script
        # embeds it, is re-imported or shared
        process = subprocess.Popen(
            [sys.executable, "-m", "perfsight.server.worker", json.dumps(spec)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        self._current = process
        while process.poll() is None and not self._stopping.is_set():
            time.sleep(0.1)
        if process.poll() is None:
            process.terminate()
            process.wait(timeout=10)
        self._current = None
        try:
            data = json.loads(progress.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            data = {}
        state.warnings = list(data.get("warnings") or [])
        if process.returncode == 0:
            state.status, state.progress, state.stage = "ready", 1.0, "done"
        else:
            state.status = "failed"
            state.error = data.get("error") or (
                f"{state.stage or 'analysis'}: the analysis process ended with exit code {process.returncode}"
            )
        progress.unlink(missing_ok=True)

    def stop(self) -> None:
        """Stop the worker (and a running child) -- for server shutdown and tests."""
        self._stopping.set()
        current = self._current
        if current is not None and current.poll() is None:
            current.terminate()
