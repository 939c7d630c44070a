"""The per-run Parquet cache: a parsed trace and its analysis tables, saved once, read many times.

Parsing a large trace takes seconds; the web UI and the cluster analyses must not pay that on
every request.  After the first read, a rank's :class:`~perfsight.model.Trace` is saved in a
folder the caller chooses::

    {folder}/slices.parquet, tracks.parquet, ...   one file per Trace table (LZ4; under 64 KiB: none)
    {folder}/vendor/{name}.parquet                 Trace.vendor: step_trace and its other tables
    {folder}/meta.json                             RunMetadata.to_dict()
    {folder}/source.json                           fingerprint of the inputs (written last)
    {folder}/analysis/{name}.parquet               analysis outputs (save_tables / load_tables)

``source.json`` records each input file's absolute path, size and modification time, the cache
format and a digest of the model's schemas; :func:`is_fresh` compares it with the inputs as they
are now, so an edited trace or a changed trace model invalidates the cache.  It is written last,
so a cache interrupted mid-write is never fresh.  Every file is written under a temporary name
and renamed into place.

Loading is lossless: tables come back with the model's exact schema (dictionary columns, nested
shape lists, nullability), so ``load_trace(save_trace(t))`` equals ``t`` table for table.

This module must not parse raw traces, run analyses, or pick the folder: callers choose where the
cache lives (never inside the user's data folder unless the user asked for it).
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from perfsight.columns import is_text
from perfsight.heap import return_freed_memory
from perfsight.layout import CACHE_META_FILE, CACHE_SOURCE_FILE
from perfsight.model import STEP_PHASES_SCHEMA, TABLE_SCHEMAS, RunMetadata, Trace, VendorResults, conform
from perfsight.parquet_files import SMALL_TABLE_BYTES, writer_options

CACHE_FORMAT = 2
"""Bump when the layout of a cache folder changes (2: Trace.vendor in vendor/, meta.compute_recorded)."""

ANALYSIS_DIR = "analysis"
VENDOR_DIR = "vendor"
VENDOR_STEP_TRACE = "step_trace"
"""File stem of ``Trace.vendor.step_trace`` under :data:`VENDOR_DIR`; its other tables keep their names."""


class CacheError(RuntimeError):
    """A cache folder that cannot be loaded (missing or unreadable files), with the reason."""


def schema_digest() -> str:
    """A short digest of the trace model's schemas: a cache written for other schemas is stale."""
    text = "\n".join(
        f"{name}:{schema.to_string(show_schema_metadata=False)}"
        for name, schema in sorted(TABLE_SCHEMAS.items())
    )
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def fingerprint(sources: Iterable[str | os.PathLike[str]]) -> dict[str, Any]:
    """What ``source.json`` holds for ``sources``: path, size and mtime of each input file.

    A missing input is recorded with ``size`` and ``mtime_ns`` of ``None`` (so it never matches a
    fingerprint taken while it existed).
    """
    files = []
    for source in sources:
        path = Path(source).resolve()
        try:
            stat = path.stat()
            files.append({"path": str(path), "size": stat.st_size, "mtime_ns": stat.st_mtime_ns})
        except OSError:
            files.append({"path": str(path), "size": None, "mtime_ns": None})
    files.sort(key=lambda f: f["path"])
    return {"format": CACHE_FORMAT, "schema": schema_digest(), "files": files}


def _write_bytes(path: Path, data: bytes) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(data)
    tmp.replace(path)


def _write_parquet(path: Path, table: pa.Table) -> None:
    """``table`` as Parquet (see :func:`perfsight.parquet_files.writer_options`)."""
    tmp = path.with_name(path.name + ".tmp")
    # the buffers' size, not ``nbytes``: that walks every buffer of a dictionary column's chunks
    # (1 ms for a rank's thirty tables, here and in the pipeline's ordering of its writers)
    small = table.get_total_buffer_size() < SMALL_TABLE_BYTES
    pq.write_table(table, tmp, **writer_options(table.schema, small=small))
    tmp.replace(path)


def write_parquet_batches(path: Path, schema: pa.Schema, batches: Iterable[pa.Table]) -> None:
    """A table given a batch at a time (in its row order) as Parquet, one row group per batch or
    more: what :func:`_write_parquet` writes for the whole table, read back equal, in the memory
    of one batch (the chunked writers' cached trace and analysis tables)."""
    tmp = path.with_name(path.name + ".tmp")
    with pq.ParquetWriter(tmp, schema, **writer_options(schema)) as writer:
        for batch in batches:
            if batch.num_rows:
                writer.write_table(batch.cast(schema) if batch.schema != schema else batch)
    tmp.replace(path)


def _read_parquet(path: Path, columns: Iterable[str] | None = None) -> pa.Table:
    """The table at ``path``; with ``columns``, only those of them the file has, its text columns
    dictionary-encoded as written (a tenth of the time of decoding every name of a large table)."""
    try:
        if columns is None:
            return pq.read_table(path)
        schema = pq.read_schema(path)
        wanted = [c for c in columns if c in schema.names]
        text = [c for c in wanted if is_text(schema.field(c).type)]
        return pq.read_table(path, columns=wanted, read_dictionary=text)
    except (OSError, pa.ArrowException) as error:
        raise CacheError(f"{path}: cannot read cached table ({error})") from error


def save_trace(
    trace: Trace, folder: str | Path, sources: Iterable[str | os.PathLike[str]] | None = None
) -> Path:
    """Save every table of ``trace`` plus its metadata under ``folder``; return the folder.

    ``sources`` are the input files the trace was read from (default: ``trace.meta.sources``); their
    fingerprint is what :func:`is_fresh` checks later.
    """
    folder = Path(folder)
    start_trace(folder)
    for name in TABLE_SCHEMAS:
        _write_parquet(folder / f"{name}.parquet", getattr(trace, name))
    return finish_trace(folder, trace, sources)


def start_trace(folder: Path) -> None:
    """Make ``folder`` and mark its cache not fresh while its tables are (re)written."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / CACHE_SOURCE_FILE).unlink(missing_ok=True)  # not fresh while being rewritten


def finish_trace(folder: Path, trace: Trace, sources: Iterable[str | os.PathLike[str]] | None = None) -> Path:
    """After the tables of :data:`TABLE_SCHEMAS` are written: ``trace``'s vendor results, metadata
    and, last, the sources' fingerprint (a chunk of the trace has the same as the whole)."""
    _save_vendor(trace.vendor, folder / VENDOR_DIR)
    return_freed_memory()  # the encoder's buffers: gone before the next writer grows the heap
    _write_bytes(folder / CACHE_META_FILE, json.dumps(trace.meta.to_dict(), indent=1, default=str).encode())
    inputs = list(trace.meta.sources if sources is None else sources)
    _write_bytes(folder / CACHE_SOURCE_FILE, json.dumps(fingerprint(inputs), indent=1).encode())
    return folder


def load_trace(folder: str | Path) -> Trace:
    """The :class:`Trace` saved by :func:`save_trace` in ``folder``; :class:`CacheError` if incomplete."""
    folder = Path(folder)
    meta = load_meta(folder)
    tables = {name: load_trace_table(folder, name) for name in TABLE_SCHEMAS}
    return Trace(meta=meta, vendor=_load_vendor(folder / VENDOR_DIR), **tables)


def load_meta(folder: str | Path) -> RunMetadata:
    """The run metadata saved in ``folder``, without its tables (a run-vs-run diff needs only it
    and the analysis tables, not the trace's millions of slices)."""
    meta_path = Path(folder) / CACHE_META_FILE
    try:
        return RunMetadata.from_dict(json.loads(meta_path.read_text(encoding="utf-8")))
    except (OSError, ValueError, TypeError) as error:
        raise CacheError(f"{meta_path}: cannot read run metadata ({error})") from error


def load_trace_table(folder: str | Path, name: str) -> pa.Table:
    """One table of the saved trace (``name`` a key of ``TABLE_SCHEMAS``), with the model's schema."""
    path = Path(folder) / f"{name}.parquet"
    if not path.is_file():
        raise CacheError(f"{path}: missing from the cache")
    try:
        return conform(_read_parquet(path), TABLE_SCHEMAS[name])
    except (KeyError, pa.ArrowException) as error:
        raise CacheError(f"{path}: does not match the trace model ({error})") from error


def _save_vendor(vendor: VendorResults, target: Path) -> None:
    """What the source's tool recorded, one Parquet file per non-empty table (none: no folder)."""
    named = {VENDOR_STEP_TRACE: vendor.step_trace, **vendor.tables}
    named = {name: table for name, table in named.items() if table.num_rows}
    for stale in target.glob("*.parquet") if target.is_dir() else ():
        stale.unlink()  # a re-read source may have recorded less
    if named:
        target.mkdir(exist_ok=True)
    for name, table in named.items():
        _write_parquet(target / f"{name}.parquet", table)


def _load_vendor(target: Path) -> VendorResults:
    vendor = VendorResults()
    for path in sorted(target.glob("*.parquet")) if target.is_dir() else ():
        table = _read_parquet(path)
        if path.stem == VENDOR_STEP_TRACE:
            try:
                vendor.step_trace = conform(table, STEP_PHASES_SCHEMA)
            except (KeyError, pa.ArrowException) as error:
                raise CacheError(f"{path}: does not match the trace model ({error})") from error
        else:
            vendor.tables[path.stem] = table
    return vendor


def is_fresh(folder: str | Path, sources: Iterable[str | os.PathLike[str]]) -> bool:
    """True when ``folder`` holds a complete cache made from ``sources`` exactly as they are now."""
    folder = Path(folder)
    try:
        saved = json.loads((folder / CACHE_SOURCE_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    if saved != fingerprint(sources):
        return False
    return (folder / CACHE_META_FILE).is_file() and all(
        (folder / f"{name}.parquet").is_file() for name in TABLE_SCHEMAS
    )


def save_tables(folder: str | Path, tables: Mapping[str, pa.Table]) -> Path:
    """Save analysis outputs as ``{folder}/analysis/{name}.parquet``; return that folder."""
    for write in table_writers(folder, tables):
        write()
    return_freed_memory()
    return Path(folder) / ANALYSIS_DIR


def table_writers(folder: str | Path, tables: Mapping[str, pa.Table]) -> list[Callable[[], None]]:
    """What :func:`save_tables` does, as one writer per table (the folder is made here).  Why: the
    pipeline shares its writers between two threads (``export.staging.run_shared``, which orders
    them by size), and thirty tables written as one piece of work were the longest piece of a
    small trace's run."""
    paths = _analysis_paths(folder, tables)
    return [functools.partial(_write_parquet, paths[name], table) for name, table in tables.items()]


def save_table_batches(folder: str | Path, name: str, schema: pa.Schema, batches: Iterable[pa.Table]) -> Path:
    """One analysis output given a batch at a time, saved as :func:`save_tables` saves it whole."""
    path = _analysis_path(folder, name)
    write_parquet_batches(path, schema, batches)
    return path


def _analysis_path(folder: str | Path, name: str) -> Path:
    return _analysis_paths(folder, [name])[name]


def _analysis_paths(folder: str | Path, names: Iterable[str]) -> dict[str, Path]:
    """Where each analysis table of ``names`` is saved under ``folder`` (made here, once)."""
    target = Path(folder) / ANALYSIS_DIR
    paths = {}
    for name in names:
        if not name or "/" in name or "\\" in name or name.startswith("."):
            raise ValueError(f"analysis table name {name!r} is not a plain file name")
        paths[name] = target / f"{name}.parquet"
    target.mkdir(parents=True, exist_ok=True)
    return paths


def load_tables(
    folder: str | Path, names: Iterable[str] | None = None, columns: Mapping[str, Iterable[str]] | None = None
) -> dict[str, pa.Table]:
    """Analysis outputs saved by :func:`save_tables` (all of them, or only ``names``; absent ones
    are left out).  A folder without analysis tables gives ``{}``.  ``columns``: for the tables it
    names, only those columns, text ones dictionary-encoded (see :func:`_read_parquet`)."""
    target = Path(folder) / ANALYSIS_DIR
    if not target.is_dir():
        return {}
    wanted = None if names is None else set(names)
    chosen = columns or {}
    return {
        path.name[: -len(".parquet")]: _read_parquet(path, chosen.get(path.name[: -len(".parquet")]))
        for path in sorted(target.glob("*.parquet"))
        if wanted is None or path.name[: -len(".parquet")] in wanted
    }
