"""The scheduling rules: host-device synchronisations inside the step (``.item()``,
``cudaStreamSynchronize``), each of which stops the host until the device is idle; and the device
idling inside the step until the host issues its next work (launch- or host-bound).
"""

from __future__ import annotations

import numpy as np

from perfsight import columns
from perfsight.advisor.finding import (
    Evidence,
    Finding,
    confidence,
    ms,
    pct,
    robust_effect,
    severity_for,
)
from perfsight.advisor.rank_rules.view import RankView, finding_for, op_per_step, slices_of_kind
from perfsight.advisor.rules import RULES, threshold
from perfsight.model import SliceKind

SYNC_OPS = (
    "aten::_local_scalar_dense",  # .item(), bool(tensor), int(tensor)
    "cudaStreamSynchronize",
    "cudaDeviceSynchronize",
    "cudaEventSynchronize",
    "aclrtSynchronizeStream",
)
"""Operators and runtime calls that make the host wait for the device."""


def host_syncs(view: RankView) -> list[Finding]:
    """Host-device synchronisations inside the step (``.item()``, ``cudaStreamSynchronize``)."""
    rule = "host_syncs"
    if not len(view.steps) or view.mean_step_ns <= 0:
        return []
    time_ns, calls = op_per_step(view, SYNC_OPS)
    runtime = slices_of_kind(view.trace, SliceKind.SYNC)
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
        finding_for(
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


def host_wait(view: RankView) -> list[Finding]:
    """The device idle inside the step until the host issues its next work (``device_idle``):
    launch-bound with short device work, host-bound otherwise."""
    rule = "host_wait"
    if not len(view.steps) or view.mean_step_ns <= 0 or not view.on_device:
        return []
    effect, error, _ = robust_effect(view.per_step("device_idle", "host_wait_ns").tolist())
    share = effect / view.mean_step_ns
    conf = confidence(effect, error)
    if share < threshold(rule, "min_share") or conf <= 0:
        return []
    free = float(np.median(view.per_step("device_idle", "free_ns")))
    work = float(np.median(view.per_step("device_idle", "device_work")))
    work_ns = float(np.median(view.per_step("device_idle", "median_work_ns")))
    gaps = float(np.median(view.per_step("device_idle", "gaps")))
    gap_ns = float(np.median(view.per_step("device_idle", "median_gap_ns")))
    longest_ns = float(np.median(view.per_step("device_idle", "longest_gap_ns")))
    op, op_ns = _top_wait_op(view)
    short = threshold(rule, "short_work_ns")
    stall = longest_ns >= threshold(rule, "stall_share") * effect  # one wait, not many launches
    launch_bound = 0 < work_ns < short and not stall
    npu = _on_ascend(view)
    src, table = RULES[rule].sources[0], RULES[rule].sources[1]
    return [
        finding_for(
            rule,
            view,
            severity=severity_for(share, threshold(rule, "warning"), threshold(rule, "critical")),
            culprit_kind="op" if op else "module",
            culprit=op or ("kernel launches" if launch_bound else "host code between launches"),
            key="scheduling.launch_bound" if launch_bound else "scheduling.host_bound",
            params={
                "culprit": f"rank {view.rank}",
                "wait_ms": ms(effect),
                "share_pct": pct(share),
                "of_free_pct": pct(effect / free) if free > 0 else 0.0,
                "work": int(round(work)),
                "work_us": round(work_ns / 1e3, 1),
                "gap_us": round(gap_ns / 1e3, 1),
                "longest_ms": ms(longest_ns),
                "remedy": ASCEND_REMEDY[0] if npu else CUDA_REMEDY[0],
                "remedy_zh": ASCEND_REMEDY[1] if npu else CUDA_REMEDY[1],
                "op_note": f"; the most before {op}'s work ({ms(op_ns)} ms a step)" if op else "",
                "op_note_zh": f";等待最多的是 {op} 的设备任务(每迭代 {ms(op_ns)} ms)" if op else "",
            },
            evidence=[
                Evidence("device idle waiting for the host per step", int(effect), "ns", None, table),
                Evidence("share of step", share, "share", threshold(rule, "min_share"), src),
                Evidence(
                    "share of the device's free time",
                    effect / free if free > 0 else 0.0,
                    "share",
                    None,
                    table,
                ),
                Evidence("free intervals per step", int(round(gaps)), "count", None, table),
                Evidence("median free interval", int(gap_ns), "ns", None, table),
                Evidence("longest free interval per step", int(longest_ns), "ns", None, "timeline"),
                Evidence("device work items per step", int(round(work)), "count", None, table),
                Evidence("median device work duration", int(work_ns), "ns", short, table),
                *(
                    [Evidence(f"wait before {op}'s device work per step", int(op_ns), "ns", None, table)]
                    if op
                    else []
                ),
            ],
            effect_ns=effect,
            error_ns=error,
            confidence=conf,
        )
    ]


CUDA_REMEDY = (
    'capture the step in a CUDA graph (torch.compile with mode="reduce-overhead", or torch.cuda.graphs)',
    '用 CUDA Graph 捕获整个迭代(torch.compile 的 mode="reduce-overhead",或 torch.cuda.graphs)',
)
ASCEND_REMEDY = (
    "let torch_npu dispatch on its second pipeline (TASK_QUEUE_ENABLE=2), bind its threads to cores "
    "(CPU_AFFINITY_CONF=1), or run the step in graph mode",
    "开启 torch_npu 二级流水下发(TASK_QUEUE_ENABLE=2)、绑核(CPU_AFFINITY_CONF=1),或以图模式执行迭代",
)
"""How to issue work faster, by platform: the ``{remedy}`` of ``scheduling.launch_bound.fix``."""


def _on_ascend(view: RankView) -> bool:
    """An Ascend NPU rank (HCCL, or a device the reader named Ascend)."""
    meta = view.trace.meta
    return meta.backend == "hccl" or any("ascend" in d.name.lower() for d in meta.devices)


def _top_wait_op(view: RankView) -> tuple[str | None, float]:
    """The operator most often the one waited on most in a step (``top_wait_op``) over the used
    steps, ties to the larger summed wait; its median wait per step (0 in steps where another is)."""
    table = view.tables.get("device_idle")
    if table is None or table.num_rows == 0:
        return None, 0.0
    steps = columns.int64(table.column("step"))
    used = np.isin(steps, view.steps)
    names = table.column("top_wait_op").to_pylist()
    waits = columns.int64(table.column("top_wait_op_ns"))
    totals: dict[str, tuple[int, int]] = {}
    for name, wait, keep in zip(names, waits.tolist(), used.tolist(), strict=True):  # one per step
        if keep and name:
            count, total = totals.get(name, (0, 0))
            totals[name] = (count + 1, total + wait)
    if not totals:
        return None, 0.0
    op = max(sorted(totals), key=lambda name: totals[name])
    per_step = [
        wait if name == op else 0
        for name, wait, keep in zip(names, waits.tolist(), used.tolist(), strict=True)
        if keep
    ]
    return op, float(np.median(per_step))
