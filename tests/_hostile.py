"""A small synthetic Trace whose names try to break every output format.

Operator, kernel, category and thread names carry HTML/script tags, both quote kinds,
backslashes, commas, semicolons, line breaks, tabs, control characters and non-ASCII text, so
the export and store tests can prove that names come back byte for byte.  Timestamps are
nanosecond-resolution Unix times (~1.7e18 ns), the case where a viewer's double loses precision.
"""

from __future__ import annotations

import dataclasses

import pyarrow as pa

from _trace_builder import make_trace
from perfsight.model import MEMORY_SCHEMA, Trace, conform

HOSTILE_NAMES = [
    '<script>alert("x")</script>',
    'it\'s a "quoted" name, with commas; and semicolons',
    "back\\slash \\n not-a-newline \\u0041",
    "new\nline\r\nand\ttab",
    "unicode 名前 ✓ 🚀 Ünïcödé",
    "control \x01\x1f chars and \u2028 separator",
    "</script><img src=x onerror=alert(1)>",
]
"""Every name here must survive each writer exactly."""

BASE_NS = 1_700_000_000_123_456_789
"""A wall-clock start with nanosecond digits: too fine for a double holding microseconds."""


def hostile_trace() -> Trace:
    """Host ops (one per hostile name) launching one device kernel each, in one step, plus memory."""
    slices = [
        {
            "kind": "step",
            "name": "ProfilerStep#1",
            "track": 0,
            "pid": 10,
            "tid": 11,
            "start_ns": BASE_NS,
            "dur_ns": 1_000_000,
            "step": 1,
            "category": "user_annotation",
        }
    ]
    flows = []
    for i, name in enumerate(HOSTILE_NAMES):
        start = BASE_NS + 1_000 + i * 100_000
        slices.append(
            {
                "kind": "cpu_op",
                "name": name,
                "track": 0,
                "pid": 10,
                "tid": 11,
                "start_ns": start,
                "dur_ns": 50_001,
                "depth": 1,
                "step": 1,
                "external_id": 100 + i,
                "category": f"cat {name}",
                "input_dims": [[2, 3], [], [7]],
                "input_types": ["float", name, "int64"],
            }
        )
        launch = len(slices)
        slices.append(
            {
                "kind": "runtime",
                "name": "cudaLaunchKernel",
                "track": 0,
                "pid": 10,
                "tid": 11,
                "start_ns": start + 10_003,
                "dur_ns": 5_007,
                "depth": 2,
                "step": 1,
                "correlation": 500 + i,
                "external_id": 100 + i,
                "category": "cuda_runtime",
            }
        )
        kernel = len(slices)
        slices.append(
            {
                "kind": "kernel",
                "name": f"kernel {name}",
                "track": 1,
                "pid": 0,
                "tid": 7,
                "is_device": True,
                "start_ns": start + 20_011,
                "dur_ns": 30_013,
                "step": 1,
                "correlation": 500 + i,
                "external_id": 100 + i,
                "category": "kernel",
                "grid": [i + 1, 2, 3],
                "block": [128, 1, 1],
                "occupancy_pct": 12.5,
            }
        )
        flows.append({"kind": "launch", "src": launch, "dst": kernel})
    trace = make_trace(
        slices,
        [{"step": 1, "start_ns": BASE_NS, "end_ns": BASE_NS + 1_000_000}],
        track_names={0: 'thread <b>11</b> "main"\n', 1: "stream 7 ✓"},
        flows=flows,
    )
    n = len(HOSTILE_NAMES)
    memory = conform(
        pa.table(
            {
                "rank": [0] * n,
                "device_type": ["cuda"] * n,
                "device_index": [0] * n,
                "ts_ns": [BASE_NS + 2_000 + i * 100_000 for i in range(n)],
                "tid": [11] * n,
                "addr": [4096 * (i + 1) for i in range(n)],
                "bytes": [2**20 * (i + 1) for i in range(n)],
                "allocated_bytes": [2**20 * (i + 1) * (i + 2) // 2 for i in range(n)],
                "reserved_bytes": [2**30] * n,
            }
        ),
        MEMORY_SCHEMA,
    )
    meta = dataclasses.replace(trace.meta, sources=[])
    return dataclasses.replace(trace, memory=memory, meta=meta)
