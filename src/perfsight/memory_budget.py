"""How much memory an analysis may use, and how many slices a chunk may then hold.

Why a module: ``perfsight analyse --memory-limit`` and the automatic choice of the bounded path
both turn a byte budget into a chunk size, and the cluster path does the same per rank; the
figures behind the conversion (measured, see docs/BENCHMARKS.md "Traces of any size") live here
once.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}

BASE_BYTES = 320 << 20
"""What a bounded analysis holds whatever the chunk size: the interpreter and libraries (≈ 80 MB
after imports), the reader's batch buffers, one batch per spilled run while merging, and the
writers' buffers."""

BYTES_PER_SLICE = 1250
"""Peak bytes per slice of a chunk while it is analysed: the chunk read back from the spill, the
analyses' shared index and per-row results, and their spilled runs being written.  Measured: a
chunk of 1.87 M slices of a generated 2 GB trace raised the process from ≈ 350 MB to 2.0 GB
(880 B a slice; ``benchmarks/bench_big_trace.py --traces ... --memory-limit 2G --timeline``);
with 1,100 B a 10 GB trace peaked at 1,980 MiB (plain) and 2,003 MiB (gzip) under a 2 GiB
limit, too close: 1,250 B leaves room for traces whose slices carry more than these.  Since the
allocation extract stopped making NumPy text of every operator name (2026-11-26) the 10 GB trace
peaks at 1,481-1,494 MiB with 1,250 B: kept, as room for traces with longer names."""

MIN_SLICES = 10_000
"""The smallest chunk worth its overhead (a budget below what this needs is raised to it)."""

AUTO_FRACTION = 0.5
"""Without ``--memory-limit``, a trace whose in-memory analysis is expected to need more than
this share of the memory available goes the bounded way, within that share."""

JSON_BYTES_PER_SLICE = 560
"""Bytes of Kineto JSON per slice (generated and real GPU traces: 1 GB → 1.8 M slices), to
guess a trace's slices from its size before reading it."""

GZIP_RATIO = 9
"""Typical inflation of a gzip-compressed Kineto trace (gzip -6: 8-10×)."""


class BudgetError(ValueError):
    """A memory limit that cannot be read (the message says what was given and what is expected)."""


def parse_size(text: str) -> int:
    """Bytes from ``"2G"``, ``"512MiB"``, ``"1.5GB"`` or a plain number of bytes."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(?:i?b)?\s*", text.lower())
    if not match:
        raise BudgetError(f"a memory limit is a size such as 2G, 1536M or 2GiB, not {text!r}")
    value = int(float(match.group(1)) * _UNITS[match.group(2)])
    if value <= 0:
        raise BudgetError(f"a memory limit must be more than 0, not {text!r}")
    return value


def slices_per_chunk(budget: int) -> int:
    """The most slices a chunk may hold for the analysis to stay within ``budget`` bytes."""
    return max(MIN_SLICES, (budget - BASE_BYTES) // BYTES_PER_SLICE)


def expected_slices(path: Path) -> int:
    """A guess of a trace file's slices from its size (compressed files by a typical ratio)."""
    size = path.stat().st_size
    if path.suffix == ".gz":
        size *= GZIP_RATIO
    return size // JSON_BYTES_PER_SLICE


def available_bytes() -> int:
    """Memory the system can give now (``MemAvailable``), or the physical memory where unknown."""
    try:
        with open("/proc/meminfo", encoding="ascii") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (OSError, ValueError):
        return 8 << 30


READ_SORT_SHARE = 0.4
"""Share of a chunk's memory (``max_slices * BYTES_PER_SLICE``) DuckDB may hold for the read's
launch join and sorts: they run before the first chunk is read, when the process holds little
else (both DuckDB threads)."""

WRITE_SORT_SHARE = 0.2
"""Share of a chunk's memory one writer's DuckDB sort may hold (the timeline index's lanes, a
CSV's rows out of order): they run after the chunks are analysed, beside a writer's batches.

Why shares of the chunk and not fixed limits: DuckDB sorts a 10 GB trace's 18.7 M rows in
several spilled passes within a fixed 256 / 128 MB; a budget's chunk room is idle while they run.
Measured (docs/BENCHMARKS.md, 2026-11-26): within 2G, 768 / 384 MB took a 10 GB trace 216 ->
203 s and a 1 GB one 20.2 -> 19.4 s, at the same peak (1,777 MiB); a small budget keeps the
fixed limits as its floor (a 600M rank worker gets what it got before)."""


def sort_memory(max_slices: int, share: float, least_bytes: int) -> str:
    """A DuckDB ``memory_limit`` for sorts beside chunks of ``max_slices`` slices: ``share`` of a
    chunk's memory, never below ``least_bytes``."""
    limit = max(least_bytes, int(max_slices * BYTES_PER_SLICE * share))
    return f"{limit >> 20}MB"


def needed_bytes(slices: int) -> int:
    """What analysing ``slices`` slices in one piece is expected to need."""
    return BASE_BYTES + slices * BYTES_PER_SLICE


def least_bytes() -> int:
    """What the bounded path needs at the least (its smallest chunks)."""
    return needed_bytes(MIN_SLICES)


def budget_for(path: Path, memory_limit: int | None) -> int | None:
    """The budget to analyse ``path`` within, or None when its whole-trace analysis fits: within
    ``memory_limit`` when given, else within a share of the memory available now."""
    limit = memory_limit if memory_limit is not None else int(available_bytes() * AUTO_FRACTION)
    return limit if needed_bytes(expected_slices(path)) > limit else None
