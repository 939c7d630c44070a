"""``tensorboard_trace_handler``: write each window as a run folder, then (optionally) analyse it.

Why a class with hooks rather than torch's closure: the run folder is created when a window
*starts* (``window_started``), marked incomplete, so that a rank killed mid-window still leaves a
folder that says what happened; at the window's end (``__call__``) the trace, perfsight's capture
tables and the metadata are written under temporary names and renamed into place, and
``profiler_info_{rank}.json`` is rewritten last with ``"complete"``.  The layout is described in
``collect/run_folder.py`` and docs/COLLECTION.md.

Analysis runs in the training process (``async_mode=False``) or in a separate, low-priority
Python process (``async_mode=True``) that shares nothing with training: a crash there cannot
reach the training job, and the training job does not wait for it.  In-process failures are
raised to the profiler's guard, which turns profiling off (never training).

Given to ``torch.profiler.profile`` instead of ``perfsight.profile``, the handler still writes a
run folder (without the window bookkeeping and captures that only perfsight's profiler has).
"""

from __future__ import annotations

import contextlib
import datetime
import logging
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

from perfsight import layout
from perfsight.collect import run_folder

log = logging.getLogger("perfsight.collect")

ANALYSIS_LOG = "analysis.log"
ANALYSIS_LOCK = ".perfsight_analysis.lock"


class TraceHandler:
    """The ``on_trace_ready`` callable returned by :func:`tensorboard_trace_handler`."""

    def __init__(
        self, dir_name: str | os.PathLike[str], worker_name: str | None, analyse_flag: bool, async_mode: bool
    ) -> None:
        self.dir_name = Path(dir_name)
        self.worker_name = worker_name
        self.analyse_flag = analyse_flag
        self.async_mode = async_mode
        self.folders: list[Path] = []
        """Every run folder this handler completed, in order (for callers and tests)."""
        self.background: list[subprocess.Popen[bytes]] = []

    # -------------------------------------------------------------------- window hooks

    def window_started(self, prof: Any) -> None:
        """Create the window's folder with ``"complete": false`` and the incomplete marker."""
        window = getattr(prof, "current_window", None)
        when = window.started if window is not None else datetime.datetime.now(datetime.UTC)
        folder = self._new_folder(when)
        if window is not None:
            window.folder = folder
        self._mark_recording(prof, folder, b"recording: the window has not finished yet\n")

    def _mark_recording(self, prof: Any, folder: Path, why: bytes) -> None:
        """The marker and ``"complete": false`` first: a process killed after this leaves a
        folder that says what happened."""
        run_folder.write_bytes_atomic(folder / layout.INCOMPLETE_MARKER, why)
        run_folder.write_json_atomic(
            folder / layout.info_file(_identity(prof)["rank"]), self._info(prof, status="recording")
        )

    def window_aborted(self, prof: Any) -> None:
        """Profiling was turned off inside the window: say so in the folder (best effort)."""
        window = getattr(prof, "current_window", None)
        if window is None or window.folder is None or not window.folder.exists():
            return
        reason = window.reason or "profiling turned off"
        run_folder.write_bytes_atomic(window.folder / layout.INCOMPLETE_MARKER, f"{reason}\n".encode())
        run_folder.write_json_atomic(
            window.folder / layout.info_file(_identity(prof)["rank"]), self._info(prof, status="aborted")
        )

    def __call__(self, prof: Any) -> None:
        """The window ended: write everything, then analyse (or start the analysis)."""
        window = getattr(prof, "current_window", None)
        folder = window.folder if window is not None and window.folder is not None else None
        prepared = folder is not None and folder.exists()
        if not prepared:  # wrapped by the user's own on_trace_ready, or given to torch's profiler
            folder = self._new_folder(window.started if window else datetime.datetime.now(datetime.UTC))
            if window is not None:
                window.folder = folder
        try:
            if not prepared:
                self._mark_recording(prof, folder, b"writing: the trace export had not finished\n")
            self._write_window(prof, folder)
        except BaseException as exc:
            _mark_failed(folder, exc)
            raise
        self.folders.append(folder)
        if self.analyse_flag:
            self._analyse(prof, folder)

    # ---------------------------------------------------------------------------- helpers

    def _write_window(self, prof: Any, folder: Path) -> None:
        window = getattr(prof, "current_window", None)
        rank = _identity(prof)["rank"]
        run_folder.export_trace_atomic(prof, folder, rank)
        sidecars = window.sidecars if window is not None else {}
        for name, table in sidecars.items():
            run_folder.write_parquet_atomic(folder / layout.sidecar_file(name, rank), table)
        run_folder.write_json_atomic(folder / layout.METADATA_FILE, _metadata(prof))
        complete = window.complete if window is not None and window.complete is not None else True
        if complete:
            (folder / layout.INCOMPLETE_MARKER).unlink(missing_ok=True)
        else:
            run_folder.write_bytes_atomic(folder / layout.INCOMPLETE_MARKER, f"{window.reason}\n".encode())
        run_folder.write_json_atomic(
            folder / layout.info_file(rank),
            self._info(prof, status="complete" if complete else "incomplete", sidecars=sorted(sidecars)),
        )

    def _new_folder(self, when: datetime.datetime) -> Path:
        if self.worker_name is None:
            self.worker_name = run_folder.default_worker_name()
        self.dir_name.mkdir(parents=True, exist_ok=True)
        folder = self.dir_name / run_folder.folder_name(self.worker_name, when)
        suffix = 1
        while folder.exists():  # two windows started within a microsecond: keep both
            folder = self.dir_name / run_folder.folder_name(f"{self.worker_name}-{suffix}", when)
            suffix += 1
        folder.mkdir()
        return folder

    def _info(self, prof: Any, status: str, sidecars: list[str] | None = None) -> dict[str, Any]:
        ident = _identity(prof)
        rank = ident["rank"]
        window = getattr(prof, "current_window", None)
        config = getattr(prof, "config", None)
        schedule = getattr(prof, "perfsight_schedule", None)
        clock = getattr(prof, "clock", None) or {}
        alone = ident["world_size"] <= 1
        info: dict[str, Any] = {
            "format": layout.FORMAT,
            "status": status,
            "complete": status == "complete",
            "incomplete_reason": None if status == "complete" else _reason(window, status),
            **ident,
            "worker_name": self.worker_name,
            "window": window.describe() if window is not None else None,
            "config": {
                "activities": sorted(a.name for a in getattr(prof, "activities", ())),
                "schedule": schedule.describe() if schedule is not None else None,
                "record_shapes": bool(getattr(prof, "record_shapes", False)),
                "profile_memory": bool(getattr(prof, "profile_memory", False)),
                "with_stack": bool(getattr(prof, "with_stack", False)),
                "with_flops": bool(getattr(prof, "with_flops", False)),
                "with_modules": bool(getattr(prof, "with_modules", False)),
                **(config.describe() if config is not None else {}),
                "analyse_flag": self.analyse_flag,
                "async_mode": self.async_mode,
            },
            "devices": run_folder.devices(),
            "versions": run_folder.versions(),
            "clock": {
                "reference_rank": 0,
                "offset_ns": clock.get("offset_ns", 0 if alone else None),
                "uncertainty_ns": clock.get("uncertainty_ns", 0 if alone else None),
                **{k: v for k, v in clock.items() if k not in {"offset_ns", "uncertainty_ns"}},
            },
            "files": {
                "trace": layout.trace_file(rank),
                "metadata": layout.METADATA_FILE,
                "sidecars": {name: layout.sidecar_file(name, rank) for name in sidecars or []},
            },
            "written_utc": datetime.datetime.now(datetime.UTC).isoformat(),
        }
        return info

    def _analyse(self, prof: Any, folder: Path) -> None:
        config = getattr(prof, "config", None)
        export_types = list(config.export_names) if config is not None else ["text"]
        simplify = bool(config.data_simplification) if config is not None else False
        if not self.async_mode:
            from perfsight.collect.offline import analyse_window

            analyse_window(folder, export_types=export_types, simplify=simplify)
            return
        command = [sys.executable, "-m", "perfsight.collect.offline", str(folder)]
        command += ["--export-type", ",".join(export_types), "--lock", str(self.dir_name / ANALYSIS_LOCK)]
        command += ["--simplify"] if simplify else []
        if shutil.which("nice"):
            command = ["nice", "-n", "10", *command]
        with open(folder / ANALYSIS_LOG, "ab") as log_file:
            self.background.append(
                subprocess.Popen(
                    command,
                    stdin=subprocess.DEVNULL,
                    stdout=log_file,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,  # Ctrl-C on the training job does not cut the analysis
                    close_fds=True,
                )
            )
        self.background = [p for p in self.background if p.poll() is None]

    def wait(self, timeout: float | None = None) -> None:
        """Wait for background analyses (tests, scripts that read the outputs right after)."""
        for process in self.background:
            process.wait(timeout)
        self.background.clear()


def _identity(prof: Any) -> dict[str, Any]:
    ident = getattr(prof, "identity", None)
    return ident if isinstance(ident, dict) else run_folder.identity()


def _mark_failed(folder: Path, exc: BaseException) -> None:
    """Best effort (the disk may be full): say in the marker why the window has no trace."""
    with contextlib.suppress(OSError):
        (folder / layout.INCOMPLETE_MARKER).write_text(f"writing the window failed: {exc}\n")


def _reason(window: Any, status: str) -> str:
    if status == "recording":
        return "recording: the window has not finished (the process may have been killed)"
    return getattr(window, "reason", None) or status


def _metadata(prof: Any) -> dict[str, Any]:
    backend, groups = run_folder.process_groups()
    user = dict(getattr(prof, "user_metadata", {}) or {})
    return {
        "user": user,
        "backend": backend,
        "process_groups": groups,
        "parallel_layout": user.get("parallel_layout"),
    }


def tensorboard_trace_handler(
    dir_name: str | os.PathLike[str],
    worker_name: str | None = None,
    analyse_flag: bool = True,
    async_mode: bool = False,
) -> TraceHandler:
    """An ``on_trace_ready`` handler writing one run folder per window under ``dir_name``.

    ``worker_name`` defaults to ``{host}_{pid}``; ``analyse_flag`` writes ``PROFILER_OUTPUT/``
    after each window, ``async_mode`` does so in a background process.
    """
    return TraceHandler(dir_name, worker_name, analyse_flag, async_mode)
