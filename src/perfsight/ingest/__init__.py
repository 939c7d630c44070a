"""Readers: every supported input becomes a :class:`perfsight.model.Trace`.

``read_trace`` picks the reader for one file; ``find_traces`` lists the trace
files under a folder.  Readers never raise on damaged input past the first
event: they keep what they could read and record a warning.
"""

from __future__ import annotations

from pathlib import Path

from perfsight.ingest.kineto import TraceReadError, read_kineto
from perfsight.model import Trace

TRACE_SUFFIXES = (".json", ".json.gz")

__all__ = ["TraceReadError", "find_traces", "read_trace"]


def read_trace(path: str | Path, rank: int | None = None) -> Trace:
    """Read one trace file; raises :class:`TraceReadError` with a one-line reason if impossible."""
    path = Path(path)
    if not path.is_file():
        raise TraceReadError(f"{path}: no such file")
    if not path.name.endswith(TRACE_SUFFIXES):
        raise TraceReadError(f"{path}: not a trace file (expected .json or .json.gz)")
    return read_kineto(path, rank=rank)


def find_traces(folder: str | Path) -> list[Path]:
    """Kineto/Chrome trace files under ``folder`` (recursively), skipping our own outputs."""
    folder = Path(folder)
    found = [
        p
        for p in sorted(folder.rglob("*"))
        if p.is_file()
        and p.name.endswith(TRACE_SUFFIXES)
        and "PROFILER_OUTPUT" not in p.parts
        and not p.name.startswith(".")
    ]
    return [
        p
        for p in found
        if p.name not in {"profiler_info.json", "profiler_metadata.json"}
        and not p.name.startswith("profiler_info_")
    ]
