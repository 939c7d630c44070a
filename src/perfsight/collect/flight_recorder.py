"""Read torch's flight recorder: the collectives a process issued, including those from C++.

Why: DDP's reducer issues its gradient all-reduces from C++, so no Python wrapper sees them; the
flight recorder (a ring buffer kept by ProcessGroupGloo/NCCL; on in our torch 2.13 gloo runs
without any setting, sized by ``TORCH_FR_BUFFER_SIZE`` before ``init_process_group``) does, with
the group and the collective sequence number.  ``comm_capture`` adds these entries to its table.

This module only reads and reshapes a dump; it is called at ``table()`` time, never per op.  The
dump API is private to torch: any failure yields no entries, never an error.
"""

from __future__ import annotations

import dataclasses
import json
import pickle
from typing import Any

ELEMENT_BYTES = {
    "Float": 4, "Double": 8, "Half": 2, "BFloat16": 2, "Long": 8, "Int": 4, "Short": 2,
    "Char": 1, "Byte": 1, "Bool": 1, "Float8_e4m3fn": 1, "Float8_e5m2": 1, "ComplexFloat": 8,
}  # fmt: skip
"""Element sizes by the c10 dtype names the flight recorder writes."""


@dataclasses.dataclass(frozen=True)
class RecordedCollective:
    collective: str  # all_reduce, broadcast, ... (the profiling name without its backend prefix)
    profiling_name: str  # gloo:all_reduce, nccl:all_reduce
    group: str
    group_desc: str
    group_ranks: str | None  # JSON list of global ranks
    seq: int | None  # collective_seq_id
    in_bytes: int | None
    out_bytes: int | None
    dtype: str | None  # torch's name: float32
    created_ns: int  # CLOCK_REALTIME, when the op was enqueued
    end_ns: int  # completion when recorded (NCCL with timing), else created_ns


def collectives(since_ns: int, until_ns: int | None = None) -> list[RecordedCollective]:
    """Collectives (not p2p) created in [since_ns, until_ns], oldest first."""
    groups = _known_groups()
    found = []
    for entry in _entries():
        created = entry.get("time_created_ns")
        if not isinstance(created, int) or created < since_ns or entry.get("is_p2p"):
            continue
        if until_ns is not None and created > until_ns:
            continue
        name, desc = (list(entry.get("process_group") or ()) + ["", ""])[:2]
        finished = entry.get("time_discovered_completed_ns")
        profiling = str(entry.get("profiling_name") or "")
        found.append(
            RecordedCollective(
                collective=profiling.split(":", 1)[-1],
                profiling_name=profiling,
                group=str(name),
                group_desc=str(desc),
                group_ranks=groups.get(str(name)),
                seq=entry.get("collective_seq_id"),
                in_bytes=_bytes(entry.get("input_sizes"), entry.get("input_dtypes")),
                out_bytes=_bytes(entry.get("output_sizes"), entry.get("output_dtypes")),
                dtype=_dtype(entry.get("input_dtypes")),
                created_ns=created,
                end_ns=finished if isinstance(finished, int) else created,
            )
        )
    return sorted(found, key=lambda op: op.created_ns)


def _entries() -> list[dict[str, Any]]:
    """Every entry of torch's flight recorder(s), or nothing when they are off."""
    try:
        from torch._C import _distributed_c10d as c10d
    except ImportError:
        return []
    entries: list[dict[str, Any]] = []
    for dump in ("_dump_fr_trace", "_dump_nccl_trace"):
        function = getattr(c10d, dump, None)
        if function is None:
            continue
        try:
            data = pickle.loads(function())
        except Exception:
            continue
        entries.extend(e for e in data.get("entries", ()) if isinstance(e, dict))
    return entries


def _known_groups() -> dict[str, str]:
    """Group name -> JSON list of global ranks, for every group torch knows in this process."""
    try:
        import torch.distributed as dist
        from torch.distributed import distributed_c10d as c10d

        return {
            str(name): json.dumps(list(dist.get_process_group_ranks(pg)))
            for pg, name in c10d._world.pg_names.items()
        }
    except Exception:
        return {}


def _bytes(sizes: Any, dtypes: Any) -> int | None:
    if not isinstance(sizes, list) or not isinstance(dtypes, list):
        return None
    total = 0
    for shape, dtype in zip(sizes, dtypes, strict=False):
        count = 1
        for dim in shape:
            count *= int(dim)
        total += count * ELEMENT_BYTES.get(str(dtype), 0)
    return total


def _dtype(dtypes: Any) -> str | None:
    if not isinstance(dtypes, list) or not dtypes:
        return None
    import torch

    kind = getattr(torch, str(dtypes[0]).lower(), None)
    return str(kind).removeprefix("torch.") if isinstance(kind, torch.dtype) else str(dtypes[0])
