"""MindSpore/Ascend-compatible CSV files written from the analysis tables.

A MindSpore user opens ``ASCEND_PROFILER_OUTPUT/kernel_details.csv`` and friends in a spreadsheet
or feeds them to msprof-analyze; these writers produce the same file names, the same headers (for
every column whose concept exists on our traces) and the same units: microseconds with three
decimals, binary MB for allocator totals, binary KB for allocation sizes.  Every column and unit is
documented in ``docs/OUTPUTS.md``; the header lists below are the single source of the headers.

Input is the analysis tables of ``docs/ANALYSIS_CONTRACT.md`` (ns, bytes), for *one rank* — a
MindSpore output folder is per rank, so a table mixing ranks is refused rather than merged.
Writing is vectorised: each output column is built with ``pyarrow.compute`` and the body is written
by ``pyarrow.csv.write_csv``; the header line is written by the ``csv`` module so it is not quoted
(Ascend's headers are bare).  Cells are bare too, as Ascend writes them, unless some string cell
of the file holds a comma, quote or line break: then every string cell is quoted (pyarrow's
``needed`` style), which every CSV reader accepts.

This module must not compute analyses (``op_statistic``'s rows and ratios are
``analysis.op_statistic``'s), convert units other than through ``units.py``, or loop over rows.
"""

from __future__ import annotations

import csv
import functools
import io
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pcsv

from perfsight import columns
from perfsight.analysis.kernels import core_of_kind
from perfsight.analysis.op_statistic import op_statistic
from perfsight.export import text
from perfsight.heap import return_freed_memory
from perfsight.model import NO_ID
from perfsight.units import bytes_to_kb, bytes_to_mb, ns_to_us, ratio_to_pct, round3
from perfsight.write_behind import open_written_behind

ColumnBuilder = Callable[[pa.Table], pa.Array]

KERNEL_DETAILS = "kernel_details.csv"
OP_STATISTIC = "op_statistic.csv"
STEP_TRACE_TIME = "step_trace_time.csv"
MEMORY_RECORD = "memory_record.csv"
OPERATOR_MEMORY = "operator_memory.csv"

MEMORY_COMPONENT = "PTA"
"""``memory_record.csv``'s Component: the PyTorch caching allocator (Ascend calls its own "PTA")."""


# ---------------------------------------------------------------------------------------------
# column helpers (each returns one output column for a whole table)


def _col(table: pa.Table, name: str) -> pa.Array:
    """A column as it is written: its one chunk as it stands (joining a single chunk copies every
    name of a large table, 1.7 ms on kernel_details), dictionaries decoded."""
    column = table.column(name)
    return text.plain(column.chunk(0) if column.num_chunks == 1 else column)


def _id_or_null(values: pa.Array) -> pa.Array:
    """Integer ids with the model's ``NO_ID`` sentinel shown as an empty cell."""
    arr = text.combined(values)
    return pc.if_else(pc.equal(arr, NO_ID), pa.nulls(len(arr), arr.type), arr)


def _us(name: str) -> ColumnBuilder:
    return lambda t: ns_to_us(t.column(name))


def _mb(name: str) -> ColumnBuilder:
    return lambda t: bytes_to_mb(t.column(name))


def _opt_mb(name: str) -> ColumnBuilder:
    """MB of a column the analysis may not provide (then an empty column)."""
    return lambda t: (
        bytes_to_mb(t.column(name)) if name in t.column_names else pa.nulls(t.num_rows, pa.float64())
    )


def device_type_text(device_type: pa.Array, device_index: pa.Array) -> pa.Array:
    """``("cuda", 0)`` -> ``"CUDA:0"``; an index of ``NO_ID`` gives just ``"CPU"``."""
    types, indices = text.plain(device_type).cast(pa.string()), text.combined(device_index)
    codes = columns.joint_codes(types, indices)  # a handful of devices: each text is made once
    first = pa.array(columns.first_rows(codes))
    kind, index = pc.utf8_upper(types.take(first)), indices.take(first)
    with_index = text.concat(kind, ":", index.cast(pa.string()))
    texts = pc.if_else(pc.and_(pc.is_valid(index), pc.greater_equal(index, 0)), with_index, kind)
    return columns.spread(texts, codes)


def _device_type(t: pa.Table) -> pa.Array:
    return device_type_text(t.column("device_type"), t.column("device_index"))


def _triple(name: str) -> ColumnBuilder:
    return lambda t: text.join_ints(t.column(name), ",")


# ---------------------------------------------------------------------------------------------
# the files: header -> column builder, in Ascend's column order

KERNEL_DETAILS_COLUMNS: dict[str, ColumnBuilder] = {
    "Step Id": lambda t: _id_or_null(t.column("step")),
    "Stream ID": lambda t: _id_or_null(t.column("stream")),
    "Name": lambda t: _col(t, "name"),
    "Type": lambda t: (
        _col(t, "op_type" if "op_type" in t.column_names else "op").cast(pa.string()).fill_null("")
    ),
    "Accelerator Core": lambda t: (
        _col(t, "core_type") if "core_type" in t.column_names else core_of_kind(t.column("kind"))
    ),
    "Start Time(us)": _us("start_ns"),
    "Duration(us)": _us("dur_ns"),
    "Wait Time(us)": _us("wait_ns"),
    "Block Dim": _triple("grid"),
    "Block": _triple("block"),
    "Occupancy(%)": lambda t: round3(t.column("occupancy_pct")),
    "Input Shapes": lambda t: text.shapes_text(t.column("input_dims")),
    "Input Data Types": lambda t: text.types_text(t.column("input_types")),
}
"""``kernel_details.csv`` from ``analysis.kernels.kernel_details``: one row per device kernel."""

OP_STATISTIC_COLUMNS: dict[str, ColumnBuilder] = {
    "OP Type": lambda t: _col(t, "op_type"),
    "Core Type": lambda t: _col(t, "core_type"),
    "Count": lambda t: _col(t, "count"),
    "Total Time(us)": _us("total_ns"),
    "Min Time(us)": _us("min_ns"),
    "Avg Time(us)": _us("avg_ns"),
    "Max Time(us)": _us("max_ns"),
    "Ratio(%)": lambda t: ratio_to_pct(t.column("ratio")),
}
"""``op_statistic.csv`` from ``analysis.op_statistic.op_statistic``."""

STEP_TRACE_TIME_COLUMNS: dict[str, ColumnBuilder] = {
    "Step": lambda t: _id_or_null(t.column("step")),
    "Computing": _us("computing_ns"),
    "Communication(Not Overlapped)": _us("communication_not_overlapped_ns"),
    "Overlapped": _us("overlapped_ns"),
    "Communication": _us("communication_ns"),
    "Free": _us("free_ns"),
    "Stage": _us("stage_ns"),
    "Bubble": _us("bubble_ns"),
    "Communication(Not Overlapped and Exclude Receive)": _us(
        "communication_not_overlapped_exclude_receive_ns"
    ),
    "Preparing": _us("preparing_ns"),
}
"""``step_trace_time.csv`` from ``analysis.overlap.overlap_breakdown``: one row per step, µs."""

MEMORY_RECORD_COLUMNS: dict[str, ColumnBuilder] = {
    "Component": lambda t: pa.repeat(pa.scalar(MEMORY_COMPONENT), t.num_rows),
    "Timestamp(us)": _us("ts_ns"),
    "Total Allocated(MB)": _mb("allocated_bytes"),
    "Total Reserved(MB)": _mb("reserved_bytes"),
    "Total Active(MB)": _opt_mb("active_bytes"),
    "Stream Ptr": lambda t: pa.nulls(t.num_rows, pa.int64()),
    "Device Type": _device_type,
}
"""``memory_record.csv`` from ``analysis.memory.memory_curve`` (or ``Trace.memory``, same columns)."""

OPERATOR_MEMORY_COLUMNS: dict[str, ColumnBuilder] = {
    "Name": lambda t: _col(t, "name"),
    "Size(KB)": lambda t: bytes_to_kb(t.column("size_bytes")),
    "Allocation Time(us)": _us("alloc_ns"),
    "Release Time(us)": _us("release_ns"),
    "Duration(us)": _us("duration_ns"),
    "Allocation Total Allocated(MB)": _mb("allocated_at_alloc_bytes"),
    "Allocation Total Reserved(MB)": _mb("reserved_at_alloc_bytes"),
    "Release Total Allocated(MB)": _mb("allocated_at_release_bytes"),
    "Release Total Reserved(MB)": _mb("reserved_at_release_bytes"),
    "Device Type": _device_type,
}
"""``operator_memory.csv`` from ``analysis.memory.operator_memory``: one row per allocation."""

FILES: dict[str, dict[str, ColumnBuilder]] = {
    KERNEL_DETAILS: KERNEL_DETAILS_COLUMNS,
    OP_STATISTIC: OP_STATISTIC_COLUMNS,
    STEP_TRACE_TIME: STEP_TRACE_TIME_COLUMNS,
    MEMORY_RECORD: MEMORY_RECORD_COLUMNS,
    OPERATOR_MEMORY: OPERATOR_MEMORY_COLUMNS,
}
"""Every CSV this module writes, by file name: the docs test checks each header is documented."""


# ---------------------------------------------------------------------------------------------
# building and writing


def _ranks(table: pa.Table) -> set[int]:
    return set(pc.unique(table.column("rank")).to_pylist()) if "rank" in table.column_names else set()


def _one_rank(ranks: set[int], what: str) -> None:
    if len(ranks) > 1:
        raise ValueError(
            f"{what}: table holds ranks {sorted(ranks)}; MindSpore files are per rank, pass one rank's rows"
        )


def build(columns: Mapping[str, ColumnBuilder], table: pa.Table) -> pa.Table:
    """The output table of one file: one column per header, built from ``table``."""
    return pa.table({header: builder(table) for header, builder in columns.items()})


def write_table_csv(path: str | Path, table: pa.Table) -> Path:
    """``table`` as CSV at ``path``: a bare header line, then pyarrow's vectorised body."""
    return _write_csv(path, table.column_names, [table], _needs_quotes(table))


def _write_csv(path: str | Path, header: list[str], parts: Iterable[pa.Table], quoted: bool) -> Path:
    """The header line, then each of ``parts`` (tables with those columns) as CSV rows; string
    cells all quoted when ``quoted`` (some cell of the whole file needs it)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    header_line = io.StringIO(newline="")
    csv.writer(header_line, lineterminator="\n").writerow(header)
    options = pcsv.WriteOptions(include_header=False, quoting_style="needed" if quoted else "none")
    with open_written_behind(path) as handle:  # one open: the header, then the body
        handle.write(header_line.getvalue().encode("utf-8"))
        for part in parts:
            if part.num_rows:
                pcsv.write_csv(part, handle, options)
    return path


QUOTED_CELL = r'[,"\r\n]'
"""What a CSV cell must be quoted for (a comma, a quote, a line break)."""


def _needs_quotes(table: pa.Table) -> bool:
    """Whether any string cell holds a character that CSV must quote (comma, quote, line break)."""
    return any(
        _text_needs_quotes(chunk)
        for column in table.columns
        if columns.is_text(column.type)
        for chunk in column.chunks
    )


def _text_needs_quotes(chunk: pa.Array) -> bool:
    """:func:`_needs_quotes` for one text array.  A string array whose cells are the one run of bytes
    between its first and last offset (null cells empty, as Arrow's kernels make them) is searched
    as that run, which stops at the first match (kernel names with commas: at once) instead of
    testing every cell; any other array (a dictionary, a null cell with bytes) cell by cell."""
    if not len(chunk):
        return False
    large = pa.types.is_large_string(chunk.type)
    if not (large or pa.types.is_string(chunk.type)):
        return bool(pc.any(pc.match_substring_regex(chunk, QUOTED_CELL)).as_py())
    _, offsets, data = chunk.buffers()
    bounds = np.frombuffer(offsets, np.int64 if large else np.int32)
    bounds = bounds[chunk.offset : chunk.offset + len(chunk) + 1]
    if chunk.null_count and np.diff(bounds)[~columns.numpy(chunk.is_valid())].any():
        return bool(pc.any(pc.match_substring_regex(chunk, QUOTED_CELL)).as_py())
    run_offsets = pa.py_buffer(np.array([bounds[0], bounds[-1]], bounds.dtype).tobytes())
    run = pa.Array.from_buffers(pa.large_binary() if large else pa.binary(), 1, [None, run_offsets, data])
    return bool(pc.match_substring_regex(run, QUOTED_CELL)[0].as_py())


def _in_order(table: pa.Table, keys: list[tuple[str, str]]) -> bool:
    """Whether ``table`` is already sorted by ``keys`` (ascending integer keys without nulls; any
    other key says no): analysis tables usually are, and a stable sort would then copy for nothing."""
    ascending = np.ones(max(table.num_rows - 1, 0), bool)
    tied = np.ones_like(ascending)
    for name, direction in keys:
        column = table.column(name)
        if direction != "ascending" or not pa.types.is_integer(column.type) or column.null_count:
            return False
        values = columns.int64(column)
        ascending &= ~tied | (values[1:] >= values[:-1])
        tied &= values[1:] == values[:-1]
    return bool(ascending.all())


def _write(folder: str | Path, file_name: str, table: pa.Table, sort_keys: list[tuple[str, str]]) -> Path:
    if not table.num_rows:  # the header alone: building no rows still costs a millisecond a file
        return _write_csv(Path(folder) / file_name, list(FILES[file_name]), [], quoted=False)
    _one_rank(_ranks(table), file_name)
    if sort_keys and not _in_order(table, sort_keys):
        table = table.sort_by(sort_keys)
    return write_table_csv(Path(folder) / file_name, build(FILES[file_name], table))


SORT_KEYS: dict[str, list[tuple[str, str]]] = {
    "kernel_details": [("start_ns", "ascending"), ("stream", "ascending")],
    "memory_curve": [("ts_ns", "ascending")],
    "operator_memory": [("alloc_ns", "ascending")],
}
"""The row order of each per-row file, by its source table (rows out of it are sorted, stably)."""

ROW_FILES = {
    "kernel_details": KERNEL_DETAILS,
    "memory_curve": MEMORY_RECORD,
    "operator_memory": OPERATOR_MEMORY,
}
"""The files written a row per row of a (possibly huge) analysis table, by that table."""


def write_csv_batches(
    folder: str | Path,
    table_name: str,
    batches: Callable[[], Iterator[pa.Table]],
    sort: Callable[[list[tuple[str, str]]], Callable[[], Iterator[pa.Table]]],
) -> Path:
    """The file of :data:`ROW_FILES` for ``table_name`` from its rows given a batch at a time
    (``batches()`` may be called twice): the bytes :func:`write_all` writes for the whole table.
    A first pass checks the rank, the order and whether cells need quotes; rows out of order are
    put in order by ``sort(keys)`` (an external stable sort: the caller's spill)."""
    file_name, keys = ROW_FILES[table_name], SORT_KEYS[table_name]
    ranks: set[int] = set()
    quoted, ordered = False, True
    last: pa.Table | None = None
    for batch in _slices(batches):
        if not batch.num_rows:
            continue
        ranks |= _ranks(batch)
        quoted = quoted or _needs_quotes(build(FILES[file_name], batch))
        joined = batch if last is None else pa.concat_tables([last, batch.select(last.column_names)])
        ordered = ordered and _in_order(joined, keys)
        last = batch.slice(batch.num_rows - 1)
    _one_rank(ranks, file_name)
    source = batches if ordered else sort(keys)
    parts = (build(FILES[file_name], batch) for batch in _slices(source))
    return _write_csv(Path(folder) / file_name, list(FILES[file_name]), parts, quoted)


CSV_BATCH_ROWS = 16_384
"""Rows formatted at once by :func:`write_csv_batches`: its text is a few times the rows' size."""


def _slices(batches: Callable[[], Iterator[pa.Table]]) -> Iterator[pa.Table]:
    for batch in batches():
        for lo in range(0, max(batch.num_rows, 1), CSV_BATCH_ROWS):
            yield batch.slice(lo, CSV_BATCH_ROWS)


def write_kernel_details(folder: str | Path, kernels: pa.Table) -> Path:
    """``kernel_details.csv`` from ``kernel_details(trace)``, in start-time order."""
    return _write(folder, KERNEL_DETAILS, kernels, SORT_KEYS["kernel_details"])


def write_op_statistic(folder: str | Path, op_stats: pa.Table) -> Path:
    """``op_statistic.csv`` from ``analysis.op_statistic.op_statistic`` (rows in its order)."""
    return _write(folder, OP_STATISTIC, op_stats, [])


def write_step_trace_time(folder: str | Path, breakdown: pa.Table) -> Path:
    """``step_trace_time.csv`` from ``overlap_breakdown(trace)``: one row per step."""
    return _write(folder, STEP_TRACE_TIME, breakdown, [("step", "ascending")])


def write_memory_record(folder: str | Path, curve: pa.Table) -> Path:
    """``memory_record.csv`` from ``memory_curve(trace)`` (``Trace.memory`` has the same columns)."""
    return _write(folder, MEMORY_RECORD, curve, SORT_KEYS["memory_curve"])


def write_operator_memory(folder: str | Path, op_memory: pa.Table) -> Path:
    """``operator_memory.csv`` from ``operator_memory(trace)``, in allocation order."""
    return _write(folder, OPERATOR_MEMORY, op_memory, SORT_KEYS["operator_memory"])


def write_all(folder: str | Path, tables: Mapping[str, pa.Table]) -> list[Path]:
    """Every CSV whose source table is in ``tables`` (see :func:`csv_writers`), one after the other."""
    written = [write() for write in csv_writers(folder, tables)]
    return_freed_memory()  # the CSV texts: gone before the next writer grows the heap
    return written


def csv_writers(folder: str | Path, tables: Mapping[str, pa.Table]) -> list[Callable[[], Path]]:
    """A writer for each CSV whose source table is in ``tables`` (keys are the analysis function
    names: ``kernel_details``, ``op_statistic``, ``overlap_breakdown``, ``memory_curve``,
    ``operator_memory``), each writing one file; without an ``op_statistic`` table,
    ``op_statistic.csv`` is made from ``kernel_details`` / ``operator_stats`` by the same analysis.

    Why writers and not the files: the pipeline shares them between two threads
    (``staging.run_shared``), so each file is one piece of work."""
    writers: list[Callable[[], Path]] = []
    if "kernel_details" in tables:
        writers.append(functools.partial(write_kernel_details, folder, tables["kernel_details"]))
    if "op_statistic" in tables:
        writers.append(functools.partial(write_op_statistic, folder, tables["op_statistic"]))
    elif "kernel_details" in tables or "operator_stats" in tables:
        kernels, operators = tables.get("kernel_details"), tables.get("operator_stats")
        writers.append(lambda: write_op_statistic(folder, op_statistic(kernels, operators)))
    if "overlap_breakdown" in tables:
        writers.append(functools.partial(write_step_trace_time, folder, tables["overlap_breakdown"]))
    if "memory_curve" in tables:
        writers.append(functools.partial(write_memory_record, folder, tables["memory_curve"]))
    if "operator_memory" in tables:
        writers.append(functools.partial(write_operator_memory, folder, tables["operator_memory"]))
    return writers
