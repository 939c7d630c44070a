"""The analysis child process of ``perfsight serve`` (``python -m perfsight.server.worker SPEC``).

Why a module of its own: it runs in a fresh interpreter started by ``perfsight.server.jobs``, and
must not import the web app (nor be imported by it), so that starting it costs only the analysis
imports.  It reports progress by rewriting a small JSON file; any failure becomes one line there.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import sys
from pathlib import Path
from typing import Any

from perfsight.server.runs import CLUSTER_FAILED_FILE, CLUSTER_OUTPUT_DIR, rank_dirs
from perfsight.store import cache, timeline_index


def _write_progress(
    path: Path, done: int, total: int, stage: str, error: str | None = None, warnings: list[str] | None = None
) -> None:
    tmp = path.with_name(path.name + ".tmp")
    data = {"done": done, "total": total, "stage": stage, "error": error, "warnings": warnings or []}
    tmp.write_text(json.dumps(data), encoding="utf-8")
    tmp.replace(path)


class _FileProgress:
    """The tqdm-like object ``perfsight.api.analyse`` reports to, mirrored into the progress file."""

    def __init__(self, path: Path, total: int, stages: list[str]) -> None:
        self.path, self.total, self.done, self.stages = path, max(1, total), 0, stages

    def stage(self) -> str:
        return self.stages[min(self.done, len(self.stages) - 1)]

    def update(self, n: int = 1) -> None:
        self.done += n
        _write_progress(self.path, min(self.done, self.total), self.total, self.stage())


def _child(spec: dict[str, Any]) -> None:
    """Entry point of the child process: any failure ends up as one line in the progress file."""
    try:
        _analyse(spec)
    except Exception as error:
        _write_progress(Path(spec["progress"]), 0, 1, "failed", error=str(error) or type(error).__name__)
        raise SystemExit(1) from None


def _analyse(spec: dict[str, Any]) -> None:
    """Analyse the run with ``perfsight.api.analyse`` (the same outputs as ``perfsight analyse``),
    then write the timeline index of every rank cache that lacks a current one."""
    from perfsight.api import analyse

    root, progress_path = Path(spec["output_root"]), Path(spec["progress"])
    inputs = [Path(p) for p in spec["inputs"]]
    warnings: list[str] = []
    indexed: set[Path] = set()
    job_failed = None
    if inputs and spec.get("job"):
        _write_progress(progress_path, 0, 1, f"analysing {len(inputs)} inputs and the job as a whole")
        try:
            warnings.extend(_analyse_job(spec["path"], root))
        except Exception as error:  # the ranks are still worth serving: analyse them one by one
            job_failed = f"the cross-rank analysis of this job failed: {error or type(error).__name__}"
            warnings.append(job_failed)
    if inputs and (not spec.get("job") or job_failed is not None):
        n = len(inputs)
        stages = [f"reading {p.name}" for p in inputs] + ["analysing", "writing outputs"] * n
        progress = _FileProgress(progress_path, 3 * n + 1, stages + ["indexing the timeline"])
        _write_progress(progress_path, 0, progress.total, progress.stage())
        result = analyse(spec["path"], out=root, progress=progress)
        for rank_result in result.ranks.values():
            warnings.extend([*rank_result.trace.meta.warnings, *rank_result.warnings])
            if rank_result.output_dir is not None:  # the pipeline writes the index; older ones did not
                folder = rank_result.output_dir.parent / "cache"
                if not timeline_index.is_current(folder):
                    timeline_index.write_timeline_index(rank_result.trace, folder)
                indexed.add(folder)
    if spec.get("seed"):
        _write_progress(progress_path, 0, 1, "copying the analysis into the server's cache")
        _copy_analysis(Path(spec["seed"]), root)
    stale = [d / "cache" for d in rank_dirs(root).values() if not timeline_index.is_current(d / "cache")]
    for i, folder in enumerate(f for f in stale if f not in indexed):
        _write_progress(progress_path, i, len(stale), f"indexing {folder.parent.name}", warnings=warnings)
        timeline_index.write_timeline_index(cache.load_trace(folder), folder)
    if job_failed is not None:
        (root / CLUSTER_FAILED_FILE).write_text(job_failed + "\n", encoding="utf-8")
    _save_overview(root)
    _write_progress(progress_path, 1, 1, "done", warnings=sorted(set(warnings)))


SERIAL_JOB_RANKS = 8
"""Up to this many inputs a job's ranks are analysed one after the other in this process: starting
worker processes costs more than it saves on a small job."""


def _analyse_job(path: str, root: Path) -> list[str]:
    """The per-rank and cross-rank analysis of a multi-rank run, as ``perfsight analyse JOB`` writes
    it (``rank<N>/`` and ``cluster_analysis_output/`` under ``root``); returns its warnings."""
    from perfsight.cluster import discovery
    from perfsight.cluster.cli import run_job
    from perfsight.pipeline import Options

    serial = len(discovery.list_inputs(path)) <= SERIAL_JOB_RANKS
    # every rank's outputs, however many: the server serves a job when its ranks are analysed (a
    # rank opens its single-device pages), and without them a job above the command's per-rank
    # limit would never be ready and be analysed again and again
    job = run_job(path, str(root), Options.from_env(), "serial" if serial else None, per_rank="all")
    return [str(line) for line in job["cluster"].get("problems", [])]


def _copy_analysis(seed: Path, root: Path) -> None:
    """Copy the rank folders of an analysis found in the base dir (``cache/`` and ``PROFILER_OUTPUT/``
    of each) into ``root``, the server's own folder, where its timeline index can be written: the
    server never writes into the folders it serves."""
    for rank, rank_dir in rank_dirs(seed).items():
        target = root / f"rank{rank}"
        if target.exists():
            shutil.rmtree(target)
        for part in ("cache", "PROFILER_OUTPUT"):
            if (rank_dir / part).is_dir():
                shutil.copytree(rank_dir / part, target / part)
    cluster = seed / CLUSTER_OUTPUT_DIR  # a job's cross-rank outputs, read by the job pages
    if cluster.is_dir() and not cluster.is_symlink():
        shutil.rmtree(root / CLUSTER_OUTPUT_DIR, ignore_errors=True)
        shutil.copytree(cluster, root / CLUSTER_OUTPUT_DIR)


def _save_overview(root: Path) -> None:
    """Compute and save the overview of the run's first rank (the page a run opens on), so its first
    visit reads a file instead of querying the step tables (``perfsight.server.pages``).  Only the
    first rank: a 1024-rank job would otherwise pay a fraction of a second per rank here."""
    from perfsight.server import pages
    from perfsight.server.registry import SAVED_FOLDER, OpenedRun, open_ranks

    # only a head start: on any failure here the server computes it (and reports errors) itself
    with contextlib.suppress(Exception):
        ranks, origin, end = open_ranks(rank_dirs(root), root / SAVED_FOLDER)
        if ranks:
            opened = OpenedRun(run=None, ranks=ranks, origin_ns=origin, end_ns=end)  # type: ignore[arg-type]
            pages.overview_body(opened, opened.rank(None))


if __name__ == "__main__":
    _child(json.loads(sys.argv[1]))
