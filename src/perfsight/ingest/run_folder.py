"""Read perfsight run folders: the facts ``profiler_info`` records, not what file names suggest.

A trace inside a run folder (``{worker}_{timestamp}_perfsight/kineto_trace_{rank}.json``) is read
by the Kineto reader with the rank from ``profiler_info_{rank}.json``; then the run's facts
(world size, local rank, host, clock offset, whether the window was complete, user metadata,
process groups with global ranks) are put on ``Trace.meta`` and perfsight's capture tables
(``perfsight_{capture}_{rank}.parquet``) are merged through ``perfsight.ingest.sidecar`` when
that module is installed.  The layout names live in ``perfsight.collect.run_folder`` (no torch).

This module must not analyse anything or write files.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc

from perfsight import layout
from perfsight.model import DeviceInfo, RunMetadata, Trace

if TYPE_CHECKING:
    from perfsight.ingest.kineto_spill import SpilledTrace


@dataclasses.dataclass
class RunInfo:
    """``profiler_info_{rank}.json`` of one run folder, read and checked.  ``problem`` says why
    it cannot be used (then the trace's own rank and facts are used, with that warning)."""

    folder: Path
    path: Path
    data: dict[str, Any]
    problem: str | None = None

    @property
    def rank(self) -> int | None:
        return None if self.problem else int(self.data["rank"])

    @property
    def complete(self) -> bool:
        return self.data.get("complete") is True

    @property
    def trace_name(self) -> str | None:
        files = self.data.get("files")
        name = files.get("trace") if isinstance(files, dict) else None
        return name if isinstance(name, str) else None


def is_run_folder(path: Path) -> bool:
    """A folder holding a ``profiler_info_{rank}.json`` (one window of one rank)."""
    return path.is_dir() and any(path.glob("profiler_info_*.json"))


def _load_info(path: Path) -> RunInfo:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        return RunInfo(
            path.parent, path, {}, f"{path}: unreadable run info ({exc}); used the trace's own facts"
        )
    if not isinstance(data, dict) or not _is_int(data.get("rank")):
        return RunInfo(
            path.parent, path, {}, f"{path}: run info without an integer 'rank'; used the trace's own facts"
        )
    return RunInfo(folder=path.parent, path=path, data=data)


def info_for(trace_path: Path) -> RunInfo | None:
    """The run info of the folder holding ``trace_path``, when it is a perfsight run folder."""
    infos = [_load_info(p) for p in sorted(trace_path.parent.glob("profiler_info_*.json"))]
    for info in infos:
        if info.trace_name == trace_path.name:
            return info
    return infos[0] if len(infos) == 1 else None


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _typed(data: dict[str, Any], key: str, kind: type | tuple[type, ...], problems: list[str]) -> Any:
    """``data[key]`` when it has the expected type; otherwise ``None`` and a note naming the key."""
    value = data.get(key)
    if value is None:
        return None
    if isinstance(value, kind) and not (isinstance(value, bool) and kind is int):
        return value
    problems.append(key)
    return None


def apply(trace: Trace, info: RunInfo, rank_from_option: bool = False) -> Trace:
    """Put the run folder's facts on ``trace.meta`` and merge its sidecar tables.

    A value of the wrong type is skipped with a warning naming the file and the key; the trace
    is never lost over its run info."""
    steps, files = apply_facts(trace.meta, trace.steps, info, rank_from_option)
    if steps is not trace.steps:
        trace = dataclasses.replace(trace, steps=steps)
    merge = sidecar_merge("merge_sidecars") if files else None
    return merge(trace, files) if merge is not None else trace


def apply_to_spilled(spilled: SpilledTrace, info: RunInfo, rank_from_option: bool = False) -> None:
    """:func:`apply` for a trace read in chunks (``perfsight.ingest.spill_trace``): the same facts
    on its metadata, the same steps marked, and its chunks given with the sidecar tables merged
    as ``merge_sidecars`` merges them into the whole trace (``perfsight.ingest.sidecar_chunks``)."""
    spilled.steps, files = apply_facts(spilled.meta, spilled.steps, info, rank_from_option)
    if files and sidecar_merge("merge_sidecars") is not None:
        from perfsight.ingest.sidecar_chunks import merge_sidecars_in_chunks

        spilled.merged = merge_sidecars_in_chunks(spilled.kineto_chunks, spilled.steps, spilled.meta, files)


def apply_facts(
    meta: RunMetadata, steps: pa.Table, info: RunInfo, rank_from_option: bool = False
) -> tuple[pa.Table, dict[str, Path]]:
    """What :func:`apply` does before the sidecars are merged, for a trace whole or read in chunks
    (``perfsight.ingest.spill_trace``): the run's facts put on ``meta`` (warnings included), the
    step table with the steps outside the recorded window marked, and the sidecar files to merge
    (capture name -> file; those listed but missing are named in a warning)."""
    if info.problem:
        meta.warnings.append(info.problem)
        return steps, {}
    data, bad = info.data, []
    if not rank_from_option:
        meta.rank_source = "run folder"
    world = _typed(data, "world_size", int, bad)
    meta.world_size = world if world and world > 0 else meta.world_size
    meta.local_rank = _typed(data, "local_rank", int, bad)
    meta.host = _typed(data, "host", str, bad) or meta.host
    cpus = _typed(data, "host_cpus", int, bad)
    if cpus and cpus > 0:  # cores this rank could run on (older run folders do not say)
        meta.extra["host_cpus"] = cpus
    clock = _typed(data, "clock", dict, bad) or {}
    meta.clock_offset_ns = _typed(clock, "offset_ns", int, bad)
    meta.clock_uncertainty_ns = _typed(clock, "uncertainty_ns", int, bad)
    versions = _typed(data, "versions", dict, bad) or {}
    meta.versions = {**meta.versions, **{str(k): str(v) for k, v in versions.items()}}
    if not meta.devices:
        meta.devices = _devices(_typed(data, "devices", list, bad) or [], bad)
    for key in ("job_id", "rendezvous"):  # what tells this job from another (cluster membership)
        value = _typed(data, key, str, bad)
        if value:
            meta.extra[key] = value
    meta.complete = info.complete
    if not info.complete:
        reason = data.get("incomplete_reason") or data.get("status") or "incomplete"
        meta.warnings.append(f"{info.folder}: profiling window incomplete: {reason}")
    if bad:
        meta.warnings.append(
            f"{info.path}: ignored values of the wrong type for {', '.join(sorted(set(bad)))}"
        )
    meta.extra["run_folder"] = str(info.folder)
    meta.extra["window"] = data.get("window")
    meta.extra["profiler_config"] = data.get("config")
    metadata = _read_metadata(info.folder, meta.warnings)
    if metadata:
        user = metadata.get("user")
        meta.extra["user_metadata"] = user if isinstance(user, dict) else {}
        groups = metadata.get("process_groups")
        if isinstance(groups, list) and groups:
            meta.process_groups = [g for g in groups if isinstance(g, dict)]
        if isinstance(metadata.get("backend"), str):
            meta.backend = metadata["backend"]
        if metadata.get("parallel_layout") is not None:
            meta.extra["parallel_layout"] = metadata["parallel_layout"]
    steps = mark_steps_outside_window(steps, data.get("window"))
    return steps, _sidecar_files(info, meta.warnings)


def mark_steps_outside_window(steps: pa.Table, window: Any) -> pa.Table:
    """A window stopped early also holds the step that was running when it stopped (torch
    records its ``ProfilerStep#N`` up to the stop): that step is not one the window recorded in
    full, so it is marked ``complete = false`` (the seed: its data is abnormal).  Returns
    ``steps`` itself when the window does not say which steps it recorded."""
    recorded = window.get("steps") if isinstance(window, dict) else None
    if not isinstance(recorded, list) or not all(_is_int(s) for s in recorded) or not steps.num_rows:
        return steps
    inside = pc.is_in(steps.column("step"), value_set=pa.array(recorded, pa.int32()))
    flags = pc.and_(steps.column("complete"), inside)
    index = steps.schema.get_field_index("complete")
    return steps.set_column(index, steps.schema.field(index), flags)


def _devices(entries: list[Any], bad: list[str]) -> list[DeviceInfo]:
    fields = {f.name for f in dataclasses.fields(DeviceInfo)}
    devices = []
    for entry in entries:
        if isinstance(entry, dict) and _is_int(entry.get("index")):
            devices.append(DeviceInfo(**{k: v for k, v in entry.items() if k in fields}))
        else:
            bad.append("devices")
    return devices


def _read_metadata(folder: Path, warnings: list[str]) -> dict[str, Any] | None:
    path = folder / layout.METADATA_FILE
    if not path.exists():
        return None
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        warnings.append(f"{path}: unreadable ({exc}); user metadata and process groups skipped")
        return None
    return data if isinstance(data, dict) else None


def _sidecar_files(info: RunInfo, warnings: list[str]) -> dict[str, Path]:
    """The capture tables the run info lists that are present (capture name -> file); those
    missing are named in a warning."""
    listed = info.data.get("files") if isinstance(info.data.get("files"), dict) else {}
    files = listed.get("sidecars") if isinstance(listed.get("sidecars"), dict) else {}
    files = {str(name): Path(str(file)).name for name, file in files.items()}  # a name, never a path
    present = {name: info.folder / file for name, file in files.items() if (info.folder / file).is_file()}
    missing = sorted(set(files) - set(present))
    if missing:
        warnings.append(f"{info.folder}: capture files missing for {', '.join(missing)}")
    return present


def sidecar_merge(name: str) -> Any:
    """Function ``name`` of ``perfsight.ingest.sidecar`` (the module that knows the capture
    tables' schemas), or None without that module: then the Kineto trace alone is used."""
    try:
        sidecar = importlib.import_module("perfsight.ingest.sidecar")
    except ModuleNotFoundError:
        return None
    merge = getattr(sidecar, name, None)
    return merge if callable(merge) else None


def incomplete_windows(root: Path) -> list[str]:
    """One line per window under ``root`` that left no readable trace, saying what is known.

    Three kinds of leftovers: a run folder whose ``profiler_info`` says ``"recording"`` (killed
    mid-window); a run folder without ``profiler_info`` holding only a partial export
    (``.kineto_trace_0.json.tmp.tmp``: a user-wrapped ``on_trace_ready`` killed while writing);
    a folder holding only a ``WINDOW_INCOMPLETE`` marker, maybe empty (the disk was full when the
    collector tried to say why).  ``perfsight analyse`` names each instead of skipping it silently.
    """
    lines = []
    described: set[Path] = set()
    for info_path in sorted(root.rglob("profiler_info_*.json")):
        if layout.OUTPUT_DIR in info_path.parts:
            continue
        info = _load_info(info_path)
        described.add(info.folder)
        if info.problem:
            continue
        trace_name = info.trace_name or layout.trace_file(info.rank)
        if not (info.folder / trace_name).exists():
            status = (
                _marker_text(info.folder) or info.data.get("incomplete_reason") or info.data.get("status")
            )
            lines.append(
                f"{info.folder}: rank {info.rank}: no trace written ({status}){_partial(info.folder)}"
            )
    for folder in _undescribed_window_folders(root, described):
        marker = folder / layout.INCOMPLETE_MARKER
        if marker.is_file():
            why = _marker_text(folder) or (
                "its WINDOW_INCOMPLETE marker is empty: the collector was cut off while writing it, "
                "as on a full disk"
            )
        else:
            why = "no WINDOW_INCOMPLETE marker and no profiler_info"
        lines.append(f"{folder}: window incomplete, no trace written ({why}){_partial(folder)}")
    return lines


def _undescribed_window_folders(root: Path, described: set[Path]) -> list[Path]:
    """Folders without ``profiler_info`` and without a trace that only a cut window leaves: a
    ``WINDOW_INCOMPLETE`` marker or a partial trace export inside."""
    candidates = {p.parent for p in root.rglob(layout.INCOMPLETE_MARKER)}
    candidates |= {p.parent for p in root.rglob(f".{layout.TRACE_PREFIX}*.tmp")}
    if root.is_dir() and root.name.endswith(layout.RUN_FOLDER_SUFFIX):
        candidates.add(root)
    found = []
    for folder in sorted(candidates - described):
        if layout.OUTPUT_DIR in folder.parts or any(folder.glob(f"{layout.TRACE_PREFIX}*.json*")):
            continue
        found.append(folder)
    return found


def _partial(folder: Path) -> str:
    """What a cut trace export left (Kineto writes ``<name>.tmp`` and renames it when done)."""
    leftovers = sorted(folder.glob(f".{layout.TRACE_PREFIX}*.tmp"))
    if not leftovers:
        return ""
    sizes = ", ".join(f"{p.name} ({_size(p)} bytes)" for p in leftovers)
    return f"; the trace export was cut: only {sizes} left"


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def _marker_text(folder: Path) -> str | None:
    """The collector's last word on a window it could not finish (written best effort)."""
    try:
        text = (folder / layout.INCOMPLETE_MARKER).read_text(errors="replace").strip()
    except OSError:
        return None
    return text[:300] or None
