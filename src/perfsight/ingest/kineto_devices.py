"""Recognise a Kineto trace's device processes from the trace's own metadata, not a fixed list.

Kineto names what it knows: CUDA / ROCm work has the categories ``kernel``, ``gpu_memcpy``,
``gpu_memset`` on a process labelled ``GPU 0``.  Other accelerators write their own categories on a
process of their own (MTIA: ``mtia_ccp_events`` on "MTIA 9").  Read with the fixed list alone such
work would be taken for host events, and a step would look busy on the host and idle on the device.

Rule (documented in docs/TRACE_MODEL.md):

* a process is a **device process** when its metadata names a device -- its ``process_labels`` or
  ``process_name`` is ``<TYPE> <N>`` with ``TYPE`` other than ``CPU`` (``GPU 0``, ``MTIA 9``,
  ``NPU 3``), or its pid is the id of a device in the trace's ``deviceProperties`` -- and it holds
  no host events (operators, runtime calls, Python frames, user ranges);
* an event of a category perfsight does not know, on a device process, is **device work**
  analysed as a compute kernel, and a warning names the process and the categories;
* events of unknown categories on a process that is neither a host nor a device process cannot be
  classified: they stay ``other`` and a warning names the process and the categories, so the
  summary says what was left out.  Kineto's own profiling span (category ``Trace``) is not work.

This module decides only which rows are device work; it must not compute metrics.
"""

from __future__ import annotations

import re

import numpy as np
import pyarrow as pa

from perfsight import columns

DEVICE_LABEL = re.compile(r"^(?P<type>[A-Za-z][A-Za-z0-9_\-]*) (?P<index>\d+)$")
"""A process label that names a device: a type and an index (``GPU 0``, ``MTIA 9``)."""

HOST_LABELS = ("CPU",)
"""Device-shaped labels that name the host."""

HOST_CATEGORIES = ("cpu_op", "operator", "python_function", "user_annotation", "cuda_runtime", "cuda_driver",
                   "runtime")  # fmt: skip
"""Categories (lower-cased) of host events: a process holding any is a host process."""

NOT_WORK_CATEGORIES = ("trace",)
"""Categories (lower-cased) that are the profiler's own bookkeeping, not work."""


def process_labels(rows: pa.Table | None) -> dict[int, list[str]]:
    """Each process's names and labels from ``process_name`` / ``process_labels`` metadata rows
    (columns ``pid``, ``label``: a handful of rows)."""
    labels: dict[int, list[str]] = {}
    if rows is None:
        return labels
    for pid, label in zip(rows.column("pid").to_pylist(), rows.column("label").to_pylist(), strict=True):
        if pid is not None and label:
            labels.setdefault(pid, []).append(str(label))
    return labels


def _device_label(labels: list[str]) -> str | None:
    for label in labels:
        for part in label.split(","):  # process_labels may list several
            match = DEVICE_LABEL.match(part.strip())
            if match and match.group("type").upper() not in HOST_LABELS:
                return part.strip()
    return None


def unknown_device_work(
    pid: np.ndarray,
    category_code: np.ndarray,
    category_values: list[str],
    known: np.ndarray,
    labels: dict[int, list[str]],
    source: str,
    devices: dict[int, str] | None = None,
) -> tuple[np.ndarray, list[str]]:
    """Which rows are device work of a device perfsight does not know, and the warnings.

    ``category_code`` indexes ``category_values`` (lower-cased category names) per row; ``known``
    says per category value whether perfsight classifies it already; ``devices`` maps the ids of
    ``deviceProperties`` to their names.  Loops over distinct (process, category) pairs, never over
    rows."""
    n = len(pid)
    if n == 0:
        return np.zeros(n, bool), []
    code = np.where(category_code < 0, len(category_values), category_code)
    pairs, inverse, counts = _distinct_pairs(pid, code, len(category_values) + 1)
    pair_is_device, warnings = device_pairs(pairs, counts, category_values, known, labels, source, devices)
    return pair_is_device[inverse], warnings


def device_pairs(
    pairs: np.ndarray,
    counts: np.ndarray,
    category_values: list[str],
    known: np.ndarray,
    labels: dict[int, list[str]],
    source: str,
    devices: dict[int, str] | None = None,
) -> tuple[np.ndarray, list[str]]:
    """Which distinct (process, category) pairs are device work, and the warnings.

    ``pairs`` is 2 x k (pid, category code) in (pid, code) order, ``counts`` each pair's rows;
    a code of ``len(category_values)`` stands for a null category.  A reader that sees its rows
    in parts (the spilled reader) counts the pairs itself and calls this directly."""

    def device_of(p: int) -> str | None:
        label = _device_label(labels.get(p, []))
        if label is None and devices and p in devices:
            label = f"device {p} ({devices[p]})" if devices[p] else f"device {p}"
        return label

    values = np.asarray(list(category_values) + [""], dtype=object)
    is_known = np.append(np.asarray(known, bool), True)
    is_host_cat = np.isin(values, HOST_CATEGORIES)
    is_not_work = np.isin(values, NOT_WORK_CATEGORIES)
    host_pids = {int(p) for p, c in pairs.T.tolist() if is_host_cat[c]}
    unknown: dict[int, dict[str, int]] = {}
    pair_is_device = np.zeros(pairs.shape[1], bool)
    for i, (p, c) in enumerate(pairs.T.tolist()):  # distinct (process, category) pairs: a few
        if p == -1 or is_known[c] or is_not_work[c]:
            continue
        unknown.setdefault(p, {})[str(values[c])] = int(counts[i])
        pair_is_device[i] = p not in host_pids and device_of(p) is not None
    warnings = []
    for p, cats in sorted(unknown.items()):
        device = device_of(p) if p not in host_pids else None
        listed = ", ".join(f"{c!r} ({k} events)" for c, k in sorted(cats.items()))
        if device is not None:
            warnings.append(
                f"{source}: process {device!r} (pid {p}) is a device perfsight does not know; its trace "
                f"metadata names it a device, so its events of categories {listed} are analysed as "
                "device kernels"
            )
        else:
            name = ", ".join(labels.get(p, [])) or "unnamed"
            warnings.append(
                f"{source}: process {name!r} (pid {p}) holds events of categories perfsight cannot classify "
                f"({listed}); they are counted neither as device work nor as host operators"
            )
    return pair_is_device, warnings


def _distinct_pairs(
    pid: np.ndarray, code: np.ndarray, codes: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The distinct (pid, code) pairs in (pid, code) order as a 2 x k array, each row's pair
    number and each pair's row count.  Why not ``np.unique(axis=1)``: it sorts the rows as
    structured records, 4 of the 9 s of reading a 1 GB trace; here one hash of the pids (few
    distinct) and a count over the dense (pid, code) grid do the same work."""
    pids, pid_number = columns.sorted_codes(pid)  # hashed: 6.6 -> 1.7 ms for 123k slices
    key = pid_number.reshape(-1) * codes + code
    if len(pids) * codes > 4 * len(key) + 1024:  # a sparse grid (a hostile trace): sort the keys
        present, inverse, counts = np.unique(key, return_inverse=True, return_counts=True)
        return np.stack([pids[present // codes], present % codes]), inverse.reshape(-1), counts
    grid_counts = np.bincount(key, minlength=len(pids) * codes)
    present = np.flatnonzero(grid_counts)
    pair_of_key = np.zeros(len(grid_counts), np.int64)
    pair_of_key[present] = np.arange(len(present))
    return np.stack([pids[present // codes], present % codes]), pair_of_key[key], grid_counts[present]


def category_codes(cat: pa.ChunkedArray | pa.Array) -> np.ndarray:
    """Per row, the index of its category in the column's dictionary (-1 for null)."""
    array = columns.combined(cat)
    if not isinstance(array, pa.DictionaryArray):
        array = array.dictionary_encode()
    return columns.int64(array.indices, -1)
