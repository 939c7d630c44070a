"""Single-rank rules: small pure functions from one rank's analysis tables to findings.

Each reads tables the analyses wrote (``step_trace``, ``overlap_breakdown``, ``operator_instances``,
``operator_stats``, ``memory_peaks``, ``operator_memory``) and the trace's own ``slices`` /
``dataloader`` / ``meta`` for what no analysis summarises (are DataLoader ranges present, how many
batches were queued); it recomputes no metric an analysis owns.  Per-step values are averaged over
the steps the cluster analysis averages (complete steps, the first dropped when three or more
remain), and their step-to-step noise bounds every finding's confidence.

Must not import the pipeline, the summaries, the server or the commands.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from perfsight import columns
from perfsight.advisor.finding import (
    Evidence,
    Finding,
    bound_finding,
    confidence,
    ms,
    pct,
    robust_effect,
    severity_for,
)
from perfsight.advisor.rules import RULES, threshold
from perfsight.analysis.step_trace import MIN_STEPS_TO_DROP_WARMUP
from perfsight.model import SliceKind, Trace

CAST_OPS = ("aten::_to_copy",)
"""Every dtype conversion (``.to(dtype)``, ``.float()``, ``.half()``, ``type_as``) runs this op."""

SYNC_OPS = (
    "aten::_local_scalar_dense",  # .item(), bool(tensor), int(tensor)
    "cudaStreamSynchronize",
    "cudaDeviceSynchronize",
    "cudaEventSynchronize",
    "aclrtSynchronizeStream",
)
"""Operators and runtime calls that make the host wait for the device."""

NOT_COMPUTE = r"^(gloo:|nccl:|c10d::|record_param_comms|ProfilerStep|hccl|Optimizer\.|enumerate\(DataLoader)"
"""Operator names that are communication, step markers or data loading, not computation."""


@dataclasses.dataclass
class RankView:
    """What the rules read about one rank: its analysis tables, its trace, and the steps used."""

    tables: dict[str, pa.Table]
    trace: Trace
    steps: np.ndarray  # the step numbers averaged over
    step_ns: np.ndarray  # their durations, in the same order

    @property
    def rank(self) -> int:
        return int(self.trace.meta.rank)

    @property
    def mean_step_ns(self) -> float:
        return float(self.step_ns.mean()) if len(self.step_ns) else 0.0

    @property
    def on_device(self) -> bool:
        """The steps are on a device timeline (perfsight.analysis.timeline), not the host's."""
        st = self.tables.get("step_trace")
        return bool(st is not None and st.num_rows and "device" in st.column("timeline").to_pylist())

    def per_step(self, table: str, column: str) -> np.ndarray:
        """``column`` of ``table`` for the used steps, in step order (0 where a step has no row)."""
        t = self.tables.get(table)
        if t is None or t.num_rows == 0 or column not in t.column_names:
            return np.zeros(len(self.steps))
        steps = columns.int64(t.column("step"))
        values = columns.int64(t.column(column), null=0)
        out = np.zeros(len(self.steps))
        where = np.searchsorted(self.steps, steps)
        ok = (where < len(self.steps)) & (self.steps[np.minimum(where, len(self.steps) - 1)] == steps)
        np.add.at(out, where[ok], values[ok])
        return out

    def sum_by_step(self, starts: np.ndarray, values: np.ndarray, step_of: np.ndarray) -> np.ndarray:
        """Sum ``values`` into the used steps by their step number ``step_of`` (others dropped)."""
        out = np.zeros(len(self.steps))
        where = np.searchsorted(self.steps, step_of)
        ok = (where < len(self.steps)) & (self.steps[np.minimum(where, len(self.steps) - 1)] == step_of)
        np.add.at(out, where[ok], values[ok])
        return out


def rank_view(tables: dict[str, pa.Table], trace: Trace) -> RankView:
    """The used steps of a rank: complete steps of ``step_trace``, minus a warm-up step."""
    st = tables.get("step_trace")
    if st is None or st.num_rows == 0:
        return RankView(tables, trace, np.zeros(0, np.int64), np.zeros(0))
    steps = columns.int64(st.column("step"))
    durations = columns.int64(st.column("duration_ns"), null=0).astype(np.float64)
    complete = np.ones(len(steps), bool)
    if trace.steps.num_rows:
        known = dict(
            zip(
                columns.int64(trace.steps.column("step")).tolist(),
                trace.steps.column("complete").to_pylist(),
                strict=True,
            )
        )  # one entry per step: a loop over steps, not events
        complete = np.array([bool(known.get(int(s), True)) for s in steps])
    order = np.argsort(steps, kind="stable")
    steps, durations, complete = steps[order], durations[order], complete[order]
    if complete.sum() >= MIN_STEPS_TO_DROP_WARMUP:
        first = np.flatnonzero(complete)[0]
        complete[first] = False
    if not complete.any():
        complete[:] = True
    return RankView(tables, trace, steps[complete], durations[complete])


def _finding(rule: str, view: RankView, **fields) -> Finding:
    fields.setdefault("category", RULES[rule].category)
    fields.setdefault("ranks", [view.rank])
    return Finding(rule=rule, **fields)


def _slices_of_kind(trace: Trace, kind: SliceKind) -> pa.Table:
    kinds = pc.cast(trace.slices.column("kind"), pa.string())
    return trace.slices.filter(pc.equal(kinds, kind.value))


def data_wait(view: RankView) -> list[Finding]:
    """Iteration gap: data loading (DataLoader ranges cover it) or host work before the step."""
    rule = "data_wait"
    if not len(view.steps) or view.mean_step_ns <= 0:
        return []
    gaps = view.per_step("step_trace", "iteration_interval_ns")
    gap, error, _ = robust_effect(gaps.tolist())
    share = gap / view.mean_step_ns
    if share < threshold(rule, "min_share") or gap < threshold(rule, "min_gap_ns"):
        return []
    conf = confidence(gap, error)
    if conf <= 0:
        return []
    loading = _slices_of_kind(view.trace, SliceKind.DATA_LOADING)
    loader_ns = view.sum_by_step(
        columns.int64(loading.column("start_ns")),
        columns.int64(loading.column("dur_ns")).astype(np.float64),
        columns.int64(loading.column("step")),
    )
    cover = float(loader_ns.mean()) / gap if gap else 0.0
    from_loader = cover >= threshold(rule, "loader_cover")
    evidence = [
        Evidence(
            "iteration gap per step",
            int(gap),
            "ns",
            int(threshold(rule, "min_gap_ns")),
            RULES[rule].sources[0],
        ),
        Evidence(
            "iteration gap share of step",
            share,
            "share",
            threshold(rule, "min_share"),
            RULES[rule].sources[0],
        ),
        Evidence("DataLoader ranges / gap", cover, "share", threshold(rule, "loader_cover"), "timeline"),
    ]
    queue = ""
    waits = view.trace.dataloader
    if waits.num_rows and "ready_batches" in waits.column_names:
        waits = waits.filter(pc.equal(waits.column("kind"), "wait"))
        ready = columns.int64(waits.column("ready_batches"), null=-1)
        ready = ready[ready >= 0]
        if len(ready):
            empty = float((ready == 0).mean())
            evidence.append(
                Evidence("loader queue empty at request", empty, "share", 0.5, "data preparation page")
            )
            queue = f"; the loader's queue was empty at {pct(empty)}% of requests"
    params = {"gap_ms": ms(gap), "share_pct": pct(share), "queue": queue, "culprit": ""}
    summary = view.tables.get("data_pipeline_summary")  # the data-preparation judgement, if captured
    stage = (
        summary.column("bottleneck_stage")[0].as_py() if summary is not None and summary.num_rows else None
    )
    if stage:
        evidence.append(Evidence("slowest data-loader stage", stage, "", None, "dataset.csv"))
    if from_loader:
        params["culprit"] = f"DataLoader stage {stage}" if stage else "DataLoader"
        key, category, culprit = "data.loader", "data", params["culprit"]
    else:
        params["culprit"] = f"rank {view.rank}"
        key, category, culprit = "host.before_step", "host", "host code before the forward pass"
    severity = severity_for(share, threshold(rule, "warning"), threshold(rule, "critical"))
    return [
        _finding(
            rule,
            view,
            category=category,
            severity=severity,
            culprit_kind="module",
            culprit=culprit,
            key=key,
            params=params,
            evidence=evidence,
            effect_ns=gap,
            error_ns=error,
            confidence=conf,
        )
    ]


def _op_per_step(view: RankView, names: tuple[str, ...]) -> tuple[np.ndarray, np.ndarray]:
    """Time and calls per used step of the operators named ``names`` (operator_instances): host
    time on a host-only trace, the device time of the kernels they launched when there is a device."""
    ops = view.tables.get("operator_instances")
    if ops is None or ops.num_rows == 0:
        return np.zeros(len(view.steps)), np.zeros(len(view.steps))
    picked = ops.filter(pc.is_in(pc.cast(ops.column("name"), pa.string()), pa.array(names)))
    step_of = columns.int64(picked.column("step"), null=-1)
    # with a device, the time the ops cost the device (the kernels they launched), as computing_ns is
    column = "device_ns" if view.on_device and "device_ns" in ops.column_names else "dur_ns"
    dur = columns.int64(picked.column(column), null=0).astype(np.float64)
    starts = columns.int64(picked.column("start_ns"))
    return view.sum_by_step(starts, dur, step_of), view.sum_by_step(starts, np.ones(len(dur)), step_of)


def dtype_casts(view: RankView) -> list[Finding]:
    """Conversions between dtypes that take a noticeable share of the step (seed 004: Cast ops)."""
    rule = "dtype_casts"
    if not len(view.steps) or view.mean_step_ns <= 0:
        return []
    time_ns, calls = _op_per_step(view, CAST_OPS)
    if view.on_device and not time_ns.any():
        # the device time of the casts is not linked (no launch ids): their host span cannot be held
        # against device computing time, and a host-to-device copy (also aten::_to_copy) looks alike
        return []
    effect, error, _ = robust_effect(time_ns.tolist())
    computing = float(view.per_step("overlap_breakdown", "computing_ns").mean())
    share = effect / computing if computing > 0 else 0.0  # of the compute time, as the seed reads it
    if share < threshold(rule, "min_share"):
        return []
    conf = confidence(effect, error)
    if conf <= 0:
        return []
    src = RULES[rule].sources[0]
    return [
        _finding(
            rule,
            view,
            severity=severity_for(share, threshold(rule, "warning"), threshold(rule, "critical")),
            culprit_kind="op",
            culprit=CAST_OPS[0],
            key="compute.casts",
            params={
                "culprit": CAST_OPS[0],
                "cast_ms": ms(effect),
                "share_pct": pct(share),
                "count": int(round(calls.mean())),
            },
            evidence=[
                Evidence("cast time per step", int(effect), "ns", None, src),
                Evidence("cast share of computing time", share, "share", threshold(rule, "min_share"), src),
                Evidence("cast calls per step", float(calls.mean()), "count", None, src),
            ],
            effect_ns=effect,
            error_ns=error,
            confidence=conf,
        )
    ]


def host_syncs(view: RankView) -> list[Finding]:
    """Host-device synchronisations inside the step (``.item()``, ``cudaStreamSynchronize``)."""
    rule = "host_syncs"
    if not len(view.steps) or view.mean_step_ns <= 0:
        return []
    time_ns, calls = _op_per_step(view, SYNC_OPS)
    runtime = _slices_of_kind(view.trace, SliceKind.SYNC)
    if runtime.num_rows:
        time_ns = time_ns + view.sum_by_step(
            columns.int64(runtime.column("start_ns")),
            columns.int64(runtime.column("dur_ns")).astype(np.float64),
            columns.int64(runtime.column("step")),
        )
    per_step = float(calls.mean())
    if per_step < threshold(rule, "min_per_step"):
        return []
    effect, error, _ = robust_effect(time_ns.tolist())
    conf = confidence(effect, error)
    if conf <= 0:
        return []
    share = effect / view.mean_step_ns
    severity = "critical" if share >= threshold(rule, "critical_share") else "warning"
    src = RULES[rule].sources[0]
    return [
        _finding(
            rule,
            view,
            severity=severity,
            culprit_kind="op",
            culprit=".item() / synchronize",
            key="scheduling.host_syncs",
            params={
                "culprit": ", ".join(SYNC_OPS[:1]) + " ...",
                "count": int(round(per_step)),
                "sync_ms": ms(effect),
            },
            evidence=[
                Evidence(
                    "synchronisations per step", per_step, "count", threshold(rule, "min_per_step"), src
                ),
                Evidence("synchronisation time per step", int(effect), "ns", None, src),
            ],
            effect_ns=effect,
            error_ns=error,
            confidence=conf,
        )
    ]


def memory_churn(view: RankView) -> list[Finding]:
    """Large blocks allocated and freed every step, many times the peak (allocator churn)."""
    rule = "memory_churn"
    mem = view.tables.get("operator_memory")
    peaks = view.tables.get("memory_peaks")
    if not len(view.steps) or mem is None or mem.num_rows == 0 or peaks is None or peaks.num_rows == 0:
        return []
    peak = float(pc.max(peaks.column("peak_allocated_bytes")).as_py() or 0)
    st = view.tables["step_trace"]
    starts = columns.int64(st.column("start_ns"))
    step_numbers = columns.int64(st.column("step"))
    order = np.argsort(starts)
    alloc = columns.int64(mem.column("alloc_ns"))
    which = np.searchsorted(starts[order], alloc, side="right") - 1
    step_of = np.where(which >= 0, step_numbers[order][np.maximum(which, 0)], -1)
    size = columns.int64(mem.column("size_bytes"), null=0).astype(np.float64)
    per_step = view.sum_by_step(alloc, size, step_of)
    allocated = float(per_step.mean())
    churn = allocated / peak if peak > 0 else 0.0
    if churn < threshold(rule, "min_churn") or allocated < threshold(rule, "min_bytes_per_step"):
        return []
    names = _outermost_op(view, alloc)
    fallback = pc.cast(mem.column("name"), pa.string()).to_numpy(zero_copy_only=False).astype(str)
    names = np.where(names == "", fallback, names)
    used = np.isin(step_of, view.steps)
    uniq, inverse = np.unique(names[used], return_inverse=True)
    by_name = np.bincount(inverse, weights=size[used], minlength=len(uniq))
    culprit = str(uniq[int(np.argmax(by_name))]) if len(uniq) else "?"
    op_time, _ = _op_per_step(view, (culprit,))
    effect, error, _ = robust_effect(op_time.tolist())
    conf = confidence(effect, error)
    if conf <= 0:
        return []
    share = effect / view.mean_step_ns if view.mean_step_ns else 0.0
    src = RULES[rule].sources[0]
    return [
        _finding(
            rule,
            view,
            severity=severity_for(
                max(share, threshold(rule, "warning")),
                threshold(rule, "warning"),
                threshold(rule, "critical"),
            ),
            culprit_kind="op",
            culprit=culprit,
            key="memory.churn",
            params={
                "culprit": culprit,
                "alloc_mb": round(allocated / 2**20, 1),
                "peak_mb": round(peak / 2**20, 1),
                "churn": round(churn, 1),
            },
            evidence=[
                Evidence(
                    "bytes allocated per step",
                    int(allocated),
                    "bytes",
                    int(threshold(rule, "min_bytes_per_step")),
                    src,
                ),
                Evidence("allocated per step / peak", churn, "", threshold(rule, "min_churn"), src),
                Evidence(f"{culprit} time per step", int(effect), "ns", None, OP_SOURCE),
            ],
            effect_ns=effect,
            error_ns=error,
            confidence=conf,
        )
    ]


OP_SOURCE = RULES["top_operator"].sources[0]


def _outermost_op(view: RankView, at_ns: np.ndarray) -> np.ndarray:
    """Name of the outermost operator on the main thread (the one with the most operators) running
    at each instant of ``at_ns``, "" where none is.  Why: an allocation's innermost op is
    ``aten::empty``; the op a user wrote (``torch.ones``, ``torch.cat``) is the outermost one, and its
    time includes filling the fresh memory."""
    ops = view.tables.get("operator_instances")
    out = np.full(len(at_ns), "", dtype=object)
    if ops is None or ops.num_rows == 0 or not len(at_ns):
        return out.astype(str)
    thread = columns.int64(ops.column("thread"))
    values, counts = np.unique(thread, return_counts=True)
    main = thread == values[int(np.argmax(counts))]
    start = columns.int64(ops.column("start_ns"))[main]
    end = start + columns.int64(ops.column("dur_ns"), null=0)[main]
    name = pc.cast(ops.column("name"), pa.string()).to_numpy(zero_copy_only=False)[main].astype(str)
    order = np.lexsort((-end, start))  # by start; the longer first among equal starts
    start, end, name = start[order], end[order], name[order]
    reach = np.maximum.accumulate(end)
    outer = np.concatenate([[True], start[1:] >= reach[:-1]])  # not inside an earlier op
    start, end, name = start[outer], end[outer], name[outer]
    which = np.searchsorted(start, at_ns, side="right") - 1
    inside = (which >= 0) & (at_ns < end[np.maximum(which, 0)])
    out[inside] = name[which[inside]]
    return out.astype(str)


def memory_capacity(view: RankView) -> list[Finding]:
    """Peak reserved memory close to the device's capacity (when the trace records it)."""
    rule = "memory_capacity"
    peaks = view.tables.get("memory_peaks")
    capacity = next((d.memory_bytes for d in view.trace.meta.devices if d.memory_bytes), None)
    if peaks is None or peaks.num_rows == 0 or not capacity:
        return []
    peak = float(pc.max(peaks.column("peak_reserved_bytes")).as_py() or 0)
    share = peak / capacity
    if share < threshold(rule, "min_peak_share"):
        return []
    return [
        _finding(
            rule,
            view,
            severity="critical" if share >= 0.97 else "warning",
            culprit_kind="rank",
            culprit=str(view.rank),
            key="memory.capacity",
            params={
                "culprit": f"rank {view.rank}",
                "peak_mb": round(peak / 2**20, 1),
                "capacity_mb": round(capacity / 2**20, 1),
                "share_pct": pct(share),
            },
            evidence=[
                Evidence(
                    "peak reserved / capacity",
                    share,
                    "share",
                    threshold(rule, "min_peak_share"),
                    RULES[rule].sources[0],
                )
            ],
            effect_ns=0.0,
            error_ns=0.0,
            confidence=1.0,
        )
    ]


def _shares(view: RankView) -> dict[str, float]:
    total = float(view.per_step("overlap_breakdown", "step_ns").sum())
    if total <= 0:
        return {}
    return {
        name: float(view.per_step("overlap_breakdown", column).sum()) / total
        for name, column in (
            ("compute", "computing_ns"),
            ("scheduling", "free_ns"),
            ("communication", "communication_not_overlapped_ns"),
        )
    }


def exposed_communication(view: RankView) -> list[Finding]:
    """Communication left exposed (informative: the job's rules name the cause)."""
    rule = "exposed_communication"
    comm = view.per_step("overlap_breakdown", "communication_not_overlapped_ns")
    if not len(view.steps) or view.mean_step_ns <= 0:
        return []
    effect, error, _ = robust_effect(comm.tolist())
    share = effect / view.mean_step_ns
    if share < threshold(rule, "min_share") or confidence(effect, error) <= 0:
        return []
    return [
        _finding(
            rule,
            view,
            severity="info",
            culprit_kind="rank",
            culprit=str(view.rank),
            key="communication.exposed",
            params={"comm_ms": ms(effect), "share_pct": pct(share)},
            evidence=[
                Evidence(
                    "communication not overlapped per step", int(effect), "ns", None, RULES[rule].sources[0]
                ),
                Evidence(
                    "share of step", share, "share", threshold(rule, "min_share"), RULES[rule].sources[0]
                ),
            ],
            effect_ns=effect,
            error_ns=error,
            confidence=confidence(effect, error),
        )
    ]


def top_operator(view: RankView) -> list[Finding]:
    """Where forward+backward goes when it dominates the step (informative)."""
    rule = "top_operator"
    stats = view.tables.get("operator_stats")
    if not len(view.steps) or view.mean_step_ns <= 0 or stats is None or stats.num_rows == 0:
        return []
    fp_bp = view.per_step("step_trace", "fp_bp_ns")
    share = float(fp_bp.mean()) / view.mean_step_ns
    if share < threshold(rule, "min_share"):
        return []
    by = "device_total_ns" if (pc.sum(stats.column("device_total_ns")).as_py() or 0) > 0 else "host_self_ns"
    names = pc.cast(stats.column("name"), pa.string())
    compute = pc.invert(pc.match_substring_regex(names, NOT_COMPUTE))
    stats = stats.filter(compute)
    if stats.num_rows == 0:
        return []
    values = columns.int64(stats.column(by), null=0)
    top = int(np.argmax(values))
    name = str(stats.column("name")[top].as_py())
    op_share = float(values[top] / values.sum()) if values.sum() else 0.0
    return [
        _finding(
            rule,
            view,
            severity="info",
            culprit_kind="op",
            culprit=name,
            key="compute.top_operator",
            params={"culprit": name, "share_pct": pct(share), "op_share_pct": pct(op_share)},
            evidence=[
                Evidence(
                    "forward+backward share of step",
                    share,
                    "share",
                    threshold(rule, "min_share"),
                    RULES["data_wait"].sources[0],
                ),
                Evidence(f"{name} share of operator time ({by})", op_share, "share", None, OP_SOURCE),
            ],
            effect_ns=float(fp_bp.mean()) * op_share,
            error_ns=0.0,
            confidence=1.0,
        )
    ]


def bound(view: RankView) -> list[Finding]:
    """Seed 003's delimiting for this rank (informative)."""
    shares = _shares(view)
    if not shares:
        return []
    finding = bound_finding(
        "bound", shares, "rank", str(view.rank), f"rank {view.rank}", RULES["bound"].sources[0]
    )
    finding.ranks = [view.rank]
    return [finding]


RANK_RULES: dict[str, Callable[[RankView], list[Finding]]] = {
    "data_wait": data_wait,
    "dtype_casts": dtype_casts,
    "host_syncs": host_syncs,
    "memory_churn": memory_churn,
    "memory_capacity": memory_capacity,
    "exposed_communication": exposed_communication,
    "top_operator": top_operator,
    "bound": bound,
}
"""Every single-rank rule, by its id in ``perfsight.advisor.rules.RULES``."""
