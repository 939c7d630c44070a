"""Read MindSpore's raw CPU-op files (``FRAMEWORK/cpu_op_execute_timestamp_{rank}.txt`` and
``FRAMEWORK/cpu_framework_{rank}.txt``), which a CPU run writes beside ``trace_view.json``.

* ``cpu_op_execute_timestamp``: one line per op, ``<full name>;<type>;`` then space-separated
  ``<start ns>,<duration ms>,<thread>`` entries -- every execution, in nanoseconds since the epoch.
* ``cpu_framework``: ``<op type>;<op name>;<graph id>;input_1:[16, 64];input_2:[64];...`` lines
  (empty ``;;id;`` lines between them) -- the input shapes of each op.

They give the op timeline when ``trace_view.json`` is absent (as raw events in the shape
:mod:`perfsight.ingest.ascend_timeline` reads) and the input shapes it lacks.  Parsing is one
regular expression over the whole text (C), no loop over executions in Python.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pyarrow as pa

from perfsight.ingest.ascend_events import flat_table
from perfsight.units import us_text

_LINE = re.compile(r"^([^;\n]+);([^;\n]*);(.*)$", re.M)
_ENTRY = re.compile(r"(\d+),([0-9.eE+-]+),(\d+)")
_SHAPE = re.compile(r"input_\d+:(\[[^\]]*\]|[^;]*)")
CPU_PID = 0
"""Process id given to the CPU-op lane built from these files (the files record none)."""


def read_execute_timestamps(path: Path) -> pa.Table:
    """Every op execution of ``path`` as raw event rows (``ascend_events.FLAT_SCHEMA``) of process
    "CPU OP" (plus its name)."""
    text = path.read_text(encoding="utf-8", errors="replace")
    names: list[str] = []
    types: list[str] = []
    starts: list[np.ndarray] = []
    durs: list[np.ndarray] = []
    tids: list[np.ndarray] = []
    for line in _LINE.finditer(text):  # one per op name, not per execution
        entries = np.array(_ENTRY.findall(line.group(3)), dtype=object).reshape(-1, 3)
        if not len(entries):
            continue
        names.extend([line.group(1)] * len(entries))
        types.extend([line.group(2)] * len(entries))
        starts.append(entries[:, 0].astype(np.int64))
        durs.append(entries[:, 1].astype(np.float64))
        tids.append(entries[:, 2].astype(np.int64))
    start = np.concatenate(starts) if starts else np.zeros(0, np.int64)
    dur_us = np.concatenate(durs) * 1000.0 if durs else np.zeros(0)
    n = start.size
    columns = {
        "ph": ["M"] + ["X"] * n,
        "name": ["process_name", *names],
        "cat": [None] + types,
        "pid": np.full(n + 1, CPU_PID, np.int64),
        "tid": np.concatenate([[0], np.concatenate(tids) if tids else np.zeros(0, np.int64)]),
        "ts": pa.concat_arrays([pa.nulls(1, pa.string()), us_text(start)]),
        "dur": np.concatenate([[np.nan], dur_us]),
        "args.name": ["CPU OP"] + [None] * n,
    }
    return flat_table(columns, n + 1)


def read_input_shapes(path: Path) -> dict[str, list[list[int]]]:
    """Op name (``BiasAdd-op0``) -> one shape per input (``[]`` for a scalar or no shape)."""
    shapes: dict[str, list[list[int]]] = {}
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():  # one per op
        parts = line.split(";", 3)
        if len(parts) < 4 or not parts[1]:
            continue
        dims = []
        for shape in _SHAPE.findall(parts[3]):
            numbers = re.findall(r"-?\d+", shape) if shape.startswith("[") else []
            dims.append([int(x) for x in numbers])
        shapes[parts[1]] = dims
    return shapes
