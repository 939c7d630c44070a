"""Write ``communication.json`` in the layout of Ascend's per-rank file (seed 003).

::

    {"step50": {"collective": {"hcom_allReduce__586_0_1@<group>": {
                   "Communication Time Info": {"Start Timestamp(us)", "Elapse Time(ms)", "Transit Time(ms)",
                       "Wait Time(ms)", "Synchronization Time(ms)", "Idle Time(ms)", "Wait Time Ratio",
                       "Synchronization Time Ratio"},
                   "Communication Bandwidth Info": {"RDMA"|"HCCS"|"PCIE"|"SDMA"|"SIO": {
                       "Transit Size(MB)", "Transit Time(ms)", "Bandwidth(GB/s)", "Large Packet Ratio",
                       "Size Distribution": {"<packet MB>": [count, transit ms]}}}},
                 ..., "Total Op Info": {...sums, without the start, bandwidth and ratio per link...}},
                "p2p": {...the same for point-to-point ops (perfsight.model.is_p2p)...}}}

Units are Ascend's for this file: milliseconds, microseconds for the start, and *decimal*
megabytes (10^6 bytes: HCCL reports a 2,064,384-byte packet as ``2.064384``), unlike the binary MB
of Ascend's CSV files; ratios and bandwidths rounded to 4 decimals as Ascend does.  Every number
comes from the rank's ``communication_*`` analysis tables (:mod:`perfsight.analysis.communication`,
the same tables ``perfsight.load`` returns); this module only arranges them and converts them with
:mod:`perfsight.units`.

The text is built column-wise, not op by op: every number is converted for all ops at once, each
op's entry comes from one format template mapped over the columns, and the entries of a step are
joined by Arrow's ``binary_join`` over a list array.  The result is the text ``json.dumps`` writes
for the equivalent dict (same key order, same float ``repr``); where one step holds several ops of
the same name, the entry keeps the first op's position and the last op's numbers, as a dict
assignment does.  A long NCCL trace has thousands of ops, so this is the difference between a few
milliseconds and a quarter of a second of Python per rank.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from itertools import repeat
from json.encoder import encode_basestring_ascii
from operator import truediv
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from perfsight import columns
from perfsight.analysis import communication as comm_analysis
from perfsight.model import NO_ID
from perfsight.units import NS_PER_US, bytes_to_decimal_mb, ns_to_ms

KINDS = ("collective", "p2p")
"""Group order of ops within a step (a step's object lists ``p2p`` first, as Ascend does)."""

_LINKS = len(comm_analysis.LINK_TYPES)
_SDMA = comm_analysis.LINK_TYPES.index("SDMA")

_TIME = (
    '"Elapse Time(ms)": {!r}, "Transit Time(ms)": {!r}, "Wait Time(ms)": {!r}, '
    '"Synchronization Time(ms)": {!r}, "Idle Time(ms)": {!r}, "Wait Time Ratio": {!r}, '
    '"Synchronization Time Ratio": {!r}}}'
)
_OP = '{}: {{"Communication Time Info": {{"Start Timestamp(us)": {!r}, ' + _TIME + ", "
_OP += '"Communication Bandwidth Info": {{{}}}}}'
_TOTAL = '"Total Op Info": {{"Communication Time Info": {{' + _TIME + ", "
_TOTAL += '"Communication Bandwidth Info": {{{}}}}}'
_LINK = (
    '"{}": {{"Transit Size(MB)": {!r}, "Transit Time(ms)": {!r}, "Bandwidth(GB/s)": {!r}, '
    '"Large Packet Ratio": {!r}, "Size Distribution": {{{}}}}}'
)
_TOTAL_LINK = '"{}": {{"Transit Time(ms)": {!r}, "Transit Size(MB)": {!r}, "Size Distribution": {{{}}}}}'
_SIZE = '"{!r}": [{}, {!r}]'
_STEP = '"{}": {{"p2p": {{{}}}, "collective": {{{}}}}}'


def _ms(ns: np.ndarray) -> list[float]:
    """Nanoseconds -> ms for every value (the one conversion of :func:`ns_to_ms`, applied by ``map``)."""
    return list(map(ns_to_ms, ns.tolist()))


def _mb(nbytes: np.ndarray) -> list[float]:
    return list(map(bytes_to_decimal_mb, nbytes.tolist()))


def _round4(values: np.ndarray) -> list[float]:
    """Python's correctly rounded ``round(x, 4)`` (NumPy's rounds ``x * 10**4``, which can differ)."""
    return list(map(round, values.tolist(), repeat(4)))


def _joined(texts: list[str], groups: np.ndarray, n_groups: int, separator: str = ", ") -> list[str]:
    """``texts`` (ordered by group) joined per group ``0..n_groups-1``; "" for a group without any."""
    counts = np.bincount(groups, minlength=n_groups) if groups.size else np.zeros(n_groups, np.int64)
    offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int32)
    lists = pa.ListArray.from_arrays(pa.array(offsets, pa.int32()), pa.array(texts, pa.string()))
    return pc.binary_join(lists, separator).to_pylist()


def _pick(texts: list[str], rows: np.ndarray) -> list[str]:
    """``texts[i]`` for each ``i`` of ``rows`` (a gather, not a Python loop)."""
    if rows.size == 0:
        return []
    return np.asarray(texts, dtype=object)[rows].tolist()


def _op_keys(ops: pa.Table) -> pa.Array:
    """``name@group`` of each op ("op" for an op without a name, an empty group when none)."""
    names = pc.fill_null(columns.combined(ops.column("name")).cast(pa.string()), "")
    names = pc.if_else(pc.equal(names, ""), "op", names)
    groups = pc.fill_null(columns.combined(ops.column("group")).cast(pa.string()), "")
    return pc.binary_join_element_wise(names, groups, "@")


def _time_texts(times: pa.Table, start: Iterable[Any] | None = None) -> list[list[Any]]:
    """The converted time columns of ``times`` in the order of the ``_TIME`` fields (``start``, the
    op's start in µs, first when given)."""
    ns = {c: columns.int64(times.column(c)) for c in ("elapse_ns", "transit_ns", "wait_ns")}
    ns.update({c: columns.int64(times.column(c)) for c in ("synchronization_ns", "idle_ns")})
    values = [_ms(v) for v in ns.values()]
    values += [_round4(columns.numpy(times.column(c))) for c in ("wait_ratio", "synchronization_ratio")]
    return ([list(start)] if start is not None else []) + values


def _link_texts(links: pa.Table, sizes: list[str], total: bool) -> list[str]:
    """One text per row of ``links`` (op- or group-major, ``LINK_TYPES`` order within)."""
    names = columns.combined(links.column("link")).cast(pa.string()).to_pylist()
    time_ms = _ms(columns.int64(links.column("transit_ns")))
    size_mb = _mb(columns.int64(links.column("bytes")))
    if total:
        return list(map(_TOTAL_LINK.format, names, time_ms, size_mb, sizes))
    bandwidth = _round4(columns.numpy(links.column("bandwidth_gb_s")))
    ratio = _round4(columns.numpy(links.column("large_packet_ratio")))
    return list(map(_LINK.format, names, size_mb, time_ms, bandwidth, ratio, sizes))


def _size_texts(
    cell: np.ndarray, code: np.ndarray, nbytes: np.ndarray, count: np.ndarray, ns: np.ndarray, n_cells: int
) -> list[str]:
    """Each link cell's "Size Distribution" body (rows ordered by cell); SDMA's stays empty."""
    keep = code != _SDMA
    entries = list(map(_SIZE.format, _mb(nbytes[keep]), count[keep].tolist(), _ms(ns[keep])))
    return _joined(entries, cell[keep], n_cells)


def _link_codes(table: pa.Table) -> np.ndarray:
    return columns.int64(pc.index_in(table.column("link"), pa.array(comm_analysis.LINK_TYPES)))


def communication_json_text(tables: Mapping[str, pa.Table]) -> str:
    """The text of ``communication.json`` for one rank (see the module docstring), from its
    ``communication_*`` analysis tables (``perfsight.pipeline.ANALYSES``, as ``perfsight.load``
    returns them)."""
    ops = tables["communication_ops"]
    n = ops.num_rows
    if n == 0:
        return "{}"
    links = tables["communication_links"]
    size_table = tables["communication_sizes"]
    size_op = columns.int64(size_table.column("op"))
    size_code = _link_codes(size_table)
    size_bytes = columns.int64(size_table.column("packet_bytes"))
    size_count = columns.int64(size_table.column("count"))
    size_ns = columns.int64(size_table.column("transit_ns"))

    # groups: (step, kind) in output order -- steps ascending, collective before p2p
    steps = columns.int64(ops.column("step"), NO_ID)
    is_p2p = columns.numpy(ops.column("is_p2p"), null=False)
    step_values, step_of = np.unique(steps, return_inverse=True)
    group = step_of.reshape(-1) * 2 + is_p2p
    n_groups = 2 * step_values.size

    # one entry per distinct key in a group: first op's position, last op's numbers (dict semantics)
    op_keys = _op_keys(ops)
    key_code = columns.distinct_codes(op_keys)
    joint = group * (int(key_code.max()) + 1) + key_code
    _, first = np.unique(joint, return_index=True)
    _, last_reversed = np.unique(joint[::-1], return_index=True)
    last = n - 1 - last_reversed
    order = np.lexsort((first, group[first]))
    shown_at, shown = first[order], last[order]

    # each shown op's entry
    keys = op_keys.take(pa.array(shown)).to_pylist()
    op_cells = (shown[:, None] * _LINKS + np.arange(_LINKS)).reshape(-1)
    cell_sizes = _size_texts(
        size_op * _LINKS + size_code, size_code, size_bytes, size_count, size_ns, n * _LINKS
    )
    link_texts = _link_texts(links.take(pa.array(op_cells)), _pick(cell_sizes, op_cells), False)
    bandwidth = list(map(", ".join, zip(*(link_texts[i::_LINKS] for i in range(_LINKS)), strict=True)))
    shown_times = ops.take(pa.array(shown))
    start_us = map(truediv, columns.int64(shown_times.column("start_ns")).tolist(), repeat(NS_PER_US))
    entries = list(
        map(
            _OP.format,
            map(encode_basestring_ascii, keys),
            *_time_texts(shown_times, start_us),
            bandwidth,
        )
    )
    bodies = _joined(entries, group[shown_at], n_groups)

    # "Total Op Info" of every group, from the step tables (one row per step and kind)
    def group_of(table: pa.Table) -> np.ndarray:
        step = np.searchsorted(step_values, columns.int64(table.column("step"), NO_ID))
        return step * 2 + columns.numpy(table.column("is_p2p"), null=False)

    total_times = tables["communication_steps"]
    total_links = tables["communication_step_links"]
    total_sizes = tables["communication_step_sizes"]
    present = group_of(total_times)  # groups with ops, ascending
    total_cell = group_of(total_links) * _LINKS + _link_codes(total_links)
    sizes_code = _link_codes(total_sizes)
    size_texts = _size_texts(
        group_of(total_sizes) * _LINKS + sizes_code,
        sizes_code,
        columns.int64(total_sizes.column("packet_bytes")),
        columns.int64(total_sizes.column("count")),
        columns.int64(total_sizes.column("transit_ns")),
        n_groups * _LINKS,
    )
    total_link_texts = _link_texts(total_links, _pick(size_texts, total_cell), True)
    total_bandwidth = _joined(total_link_texts, group_of(total_links), n_groups)
    totals = map(_TOTAL.format, *_time_texts(total_times), _pick(total_bandwidth, present))
    group_text = np.full(n_groups, "", dtype=object)
    group_text[present] = list(map("{}, {}".format, _pick(bodies, present), totals))
    labels = np.array(list(map("step{}".format, step_values.tolist())), dtype=object)
    labels[step_values == NO_ID] = "step"
    steps_text = map(_STEP.format, labels.tolist(), group_text[1::2].tolist(), group_text[0::2].tolist())
    return "{" + ", ".join(steps_text) + "}"


def communication_json(tables: Mapping[str, pa.Table]) -> dict[str, Any]:
    """The content of ``communication.json`` for one rank, as a dict (see the module docstring)."""
    return json.loads(communication_json_text(tables))


def write_communication_json(path: str | Path, tables: Mapping[str, pa.Table]) -> Path:
    """Write :func:`communication_json` of one rank's communication ``tables`` to ``path``; return it."""
    path = Path(path)
    path.write_text(communication_json_text(tables), encoding="utf-8")
    return path


def write_communication_json_by_step(path: str | Path, steps: Iterable[Mapping[str, pa.Table]]) -> Path:
    """The same file from each step's tables in turn, steps ascending (the chunked writers: one
    step's ops held at a time).  A step's tables are those of :func:`communication_json_text`
    cut to its rows: its ops in their order, their links, their sizes with ``op`` counting
    those ops from 0, and the step tables' rows of that step.  A step's entry depends on its
    own rows only, so the text is the whole one's."""
    path = Path(path)
    with path.open("w", encoding="utf-8") as handle:
        handle.write("{")
        separator = ""
        for tables in steps:
            body = communication_json_text(tables)[1:-1]  # the one step's entry, without braces
            if body:
                handle.write(separator + body)
                separator = ", "
        handle.write("}")
    return path
