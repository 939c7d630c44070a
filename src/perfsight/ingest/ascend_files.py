"""Read the CSV and JSON files of an Ascend profiler output folder, surviving their quirks.

Real files have ``Start Time(us)`` values ending in a TAB, shapes written
``"\"\"32,3,224,224\"\""`` (three quotes each side), ``N/A`` for missing values, empty and negative memory
fields, and columns that differ between versions (``Device_id`` present or not,
``Block Dim`` or ``Block Num``, ``Preparing`` optional).  Every reader here:

* parses with ``pyarrow.csv`` (vectorised), every column as text first, then
  strips whitespace and quotes and turns ``N/A``/empty cells into nulls;
* skips rows with the wrong number of cells (garbage lines, a truncated last line)
  and says how many, naming the file;
* names a missing required column in a warning and returns what it could read
  (an empty table when the file is unusable), never raising.

Numbers stay in the files' own units here (us, MB, KB): these tables are Ascend's
results as Ascend wrote them, used as references and for display; the trace model's
tables (ns, bytes) are built by :mod:`perfsight.ingest.ascend`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pcsv

NULL_TEXT = ("", "N/A", "NA", "n/a", "None", "null", "-")
"""Cell texts that mean "no value"."""

ALIASES = {"Block Num": "Block Dim", "Device_id": "Device Id", "Device ID": "Device Id"}
"""Column names that changed between versions -> the name perfsight uses."""

REQUIRED: dict[str, tuple[str, ...]] = {
    "kernel_details.csv": ("Name", "Type", "Accelerator Core", "Start Time(us)", "Duration(us)"),
    "op_statistic.csv": ("OP Type", "Core Type", "Count", "Total Time(us)"),
    "step_trace_time.csv": ("Step", "Computing", "Communication(Not Overlapped)", "Free"),
    "memory_record.csv": ("Component", "Timestamp(us)", "Total Allocated(MB)", "Device Type"),
    "operator_memory.csv": ("Name", "Size(KB)", "Allocation Time(us)"),
    "npu_module_mem.csv": ("Component", "Timestamp(us)", "Total Reserved(MB)"),
    "api_statistic.csv": ("Level", "API Name", "Time(us)", "Count"),
    "l2_cache.csv": ("Stream Id", "Task Id", "Hit Rate"),
    "operator_details.csv": ("Name",),
}
"""Columns without which a file's table is not usable (others are optional)."""

TIME_POINTS = ("Start Time(us)", "Timestamp(us)", "Allocation Time(us)", "Release Time(us)",
               "Active Release Time(us)")  # fmt: skip
"""Instants in Unix microseconds: kept exact as decimal128(24, 3) (float64 would lose the nanoseconds)."""

_TIME = pa.decimal128(24, 3)


class FileProblems:
    """Collects one-line warnings, each naming the file it is about."""

    def __init__(self) -> None:
        self.warnings: list[str] = []

    def add(self, path: Path, what: str) -> None:
        self.warnings.append(f"{path}: {what}")


def _clean(column: pa.Array) -> pa.Array:
    text = pc.utf8_trim(pc.utf8_trim_whitespace(column), '"')
    return pc.if_else(pc.is_in(text, value_set=pa.array(NULL_TEXT)), pa.scalar(None, pa.string()), text)


_NUMBER = r"^[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?$"


def _typed(name: str, column: pa.Array) -> pa.Array:
    """Time points as exact decimals; a column whose every value is a number as float64; else text.
    A time point that is not a number becomes null."""
    looks = pc.match_substring_regex(pc.fill_null(column, ""), _NUMBER)
    if name in TIME_POINTS:
        plain = pc.match_substring_regex(pc.fill_null(column, ""), r"^[+-]?\d{1,21}(\.\d{1,3})?$")
        return pc.cast(pc.if_else(plain, column, pa.scalar(None, pa.string())), _TIME)
    if column.null_count == len(column) or not pc.all(pc.or_(looks, pc.is_null(column))).as_py():
        return column
    return pc.cast(column, pa.float64())


def read_csv(path: Path, problems: FileProblems) -> pa.Table:
    """One Ascend CSV as a table: text cleaned, unit columns as float64, bad rows skipped.

    Returns an empty table (and a warning) when the file cannot be read or lacks a required column.
    """
    try:
        with path.open("rb") as handle:
            header = handle.readline().decode("utf-8-sig", errors="replace").strip()
    except OSError as error:
        problems.add(path, f"cannot be read ({error.strerror or error})")
        return pa.table({})
    names = [ALIASES.get(n.strip(), n.strip()) for n in next(iter(_split_header(header)), [])]
    if not names or not any(names):
        problems.add(path, "is empty or has no header line")
        return pa.table({})
    skipped = 0

    def skip(_row: Any) -> str:
        nonlocal skipped
        skipped += 1
        return "skip"

    try:
        table = pcsv.read_csv(
            path,
            read_options=pcsv.ReadOptions(column_names=names, skip_rows=1, encoding="utf-8"),
            parse_options=pcsv.ParseOptions(invalid_row_handler=skip, newlines_in_values=True),
            convert_options=pcsv.ConvertOptions(
                column_types={n: pa.string() for n in names}, strings_can_be_null=False
            ),
        )
    except (pa.ArrowInvalid, OSError, UnicodeDecodeError) as error:
        problems.add(path, f"is not a readable CSV ({str(error).splitlines()[0]})")
        return pa.table({})
    if skipped:
        problems.add(path, f"{skipped} malformed row(s) skipped (wrong number of cells)")
    missing = [c for c in REQUIRED.get(path.name, ()) if c not in names]
    if missing:
        problems.add(path, f"lacks column(s) {', '.join(missing)}; not used")
        return pa.table({})
    arrays = []
    for name in table.column_names:
        arrays.append(_typed(name, _clean(table.column(name).combine_chunks())))
    return pa.Table.from_arrays(arrays, names=table.column_names)


def _split_header(line: str) -> list[list[str]]:
    import csv  # the header only: one line

    return list(csv.reader([line]))


def read_json(path: Path, problems: FileProblems) -> dict[str, Any]:
    """A JSON object file (``communication.json``, ``profiler_info_N.json``...); ``{}`` with a warning
    when it is missing, truncated or not an object."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except OSError as error:
        problems.add(path, f"cannot be read ({error.strerror or error})")
        return {}
    except ValueError as error:
        problems.add(path, f"is not valid JSON ({error}); ignored")
        return {}
    if not isinstance(data, dict):
        problems.add(path, "is not a JSON object; ignored")
        return {}
    return data


def groups_of_ops(communication: dict[str, Any]) -> dict[str, str]:
    """hcom op name -> communication group, from ``communication.json``'s ``name@group`` keys."""
    out: dict[str, str] = {}
    for step in communication.values():
        if not isinstance(step, dict):
            continue
        for kind in ("collective", "p2p"):
            ops = step.get(kind)
            for key in ops if isinstance(ops, dict) else ():
                name, sep, group = str(key).rpartition("@")
                if sep and name:
                    out[name] = group
    return out
