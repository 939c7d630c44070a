"""The seed's judgement of a DataLoader (seed 001, "MindData"), in PyTorch terms: is data
preparation the bottleneck, and is it the workers' processing or the hand-over to the device?

* the host queue is mostly empty (mean use below half its capacity; always, without workers) and
  the loop waits a noticeable share of its time: the workers are the bottleneck, and the stage
  named is the one with the lowest throughput (parallel workers / its time per batch);
* the host queue holds batches but the device-side queue is empty at most requests: the
  ``pin_memory`` step (the transfer to the device side) is the bottleneck;
* the host queue holds batches (the workers keep up) but the loop spends a noticeable share of its
  time copying each batch to the device (``.to(device)`` right after the loader yields: no batch
  waits on the device, the device-side queue is empty by construction): the copy, ``to_device``,
  is the bottleneck;
* otherwise the loader keeps up and no stage is named.

The first request of each epoch is left out (it waits for the workers to start and the queues to
fill).  Input: the capture's rows (``Trace.dataloader``); the stage tables are
``analysis.data_pipeline``'s, which asks :func:`bottleneck_stage` which stage to mark.  Units: ns.
Pure functions; this module must not read files.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from perfsight import columns
from perfsight.units import ms_text, ns_to_s

WAIT_SHARE_BOUND = 0.10
"""The loop waits for data at least this share of its time: data preparation matters."""

EMPTY_RATIO_BOUND = 0.5
"""The device-side queue empty at at least this share of requests is "empty most of the time"."""

QUEUE_USAGE_BOUND = 0.5
"""The host queue holds on average less than this share of its capacity: the workers do not keep
it filled.  (Its empty count alone misleads: two workers in lockstep deliver batches in pairs, so
every second request finds the queue empty even when they are far too slow.)"""

PIN = "pin_memory"
"""The stage that pins batches for the device (``analysis.data_pipeline`` names it so too)."""

TO_DEVICE = "to_device"
"""The loop's copy of each batch to the device (the capture's ``copy`` rows); absent when the
loop copied nothing (a CPU-only loop's ``.to("cpu")`` is no copy)."""


def rows_of_kind(rows: pa.Table, kind: str) -> pa.Table:
    """The capture's rows of one ``kind`` (wait, fetch, stage, pin, copy)."""
    return rows.filter(pc.equal(rows.column("kind"), kind))


def _queue_facts(waits: pa.Table) -> dict:
    """Counts and means of the two queues over the requests (numpy on whole columns)."""
    host = columns.numpy(waits.column("host_queue"), -1).astype(np.int64)
    device = columns.numpy(waits.column("device_queue"), -1).astype(np.int64)
    capacity = columns.numpy(waits.column("queue_capacity"), 0).astype(np.int64)
    known_host, known_device = host >= 0, device >= 0
    cap = int(capacity.max()) if len(capacity) else 0
    facts: dict = {"capacity": cap, "host_mean": None, "host_usage": None, "host_empty": None}
    facts.update(host_empty_ratio=None, host_full=None, device_mean=None, device_empty=None)
    facts["device_empty_ratio"] = None
    if known_host.any():
        h = host[known_host]
        facts["host_mean"] = float(h.mean())
        facts["host_empty"] = int((h == 0).sum())
        facts["host_empty_ratio"] = float((h == 0).mean())
        facts["host_usage"] = float(h.mean() / cap) if cap else None
        facts["host_full"] = int((h >= cap).sum()) if cap else 0
    if known_device.any():
        d = device[known_device]
        facts["device_mean"] = float(d.mean())
        facts["device_empty"] = int((d == 0).sum())
        facts["device_empty_ratio"] = float((d == 0).mean())
    return facts


def _loop_facts(waits: pa.Table) -> tuple[int, int, int | None]:
    """(total wait, loop time, median time per batch outside next()) of the requests, in ns."""
    order = waits.sort_by("start_ns")
    start = columns.int64(order.column("start_ns"))
    dur = columns.int64(order.column("dur_ns"))
    end = start + dur
    loop = int(end.max() - start.min()) if len(start) else 0
    gaps = start[1:] - end[:-1]
    gaps = gaps[gaps >= 0]
    return int(dur.sum()), loop, (int(np.median(gaps)) if len(gaps) else None)


def judged_requests(rows: pa.Table) -> pa.Table:
    """The requests the judgement rests on: all but the first batch of each epoch, which waits for
    the workers to start and the pipeline to fill (the warm-up the step trace also sets apart),
    unless nothing else was recorded."""
    waits = rows_of_kind(rows, "wait")
    later = waits.filter(pc.fill_null(pc.greater(waits.column("batch"), 0), True))
    return later if later.num_rows else waits


def _copy_facts(rows: pa.Table, loop: int) -> dict:
    """The loop's copies to the device over the judged batches: total ns, share of the loop, bytes/s."""
    copies = rows_of_kind(rows, "copy")
    copies = copies.filter(pc.fill_null(pc.greater(copies.column("batch"), 0), True))
    if copies.num_rows == 0:
        return {"copy": None, "copy_share": None, "copy_rate": None, "copy_device": None, "copied_batches": 0}
    ns = int(pc.sum(copies.column("dur_ns")).as_py() or 0)
    nbytes = int(pc.sum(copies.column("bytes")).as_py() or 0) if "bytes" in copies.column_names else 0
    devices = (
        pc.unique(pc.drop_null(copies.column("stage"))).to_pylist() if "stage" in copies.column_names else []
    )
    return {
        "copy": ns,
        "copy_share": ns / loop if loop > 0 else 0.0,
        "copy_rate": nbytes / ns_to_s(ns) if ns > 0 and nbytes > 0 else None,
        "copy_device": ", ".join(sorted(devices)) or None,
        "copied_batches": copies.num_rows,
    }


def judgement(rows: pa.Table) -> dict | None:
    """The seed's verdict from the requests (see the module docstring); None without capture.

    ``h2d_stage`` names the hand-over stage a "host to device" verdict rests on."""
    waits = judged_requests(rows)
    if waits.num_rows == 0:
        return None
    facts = _queue_facts(waits)
    wait, loop, interval = _loop_facts(waits)
    facts.update(wait=wait, loop=loop, interval=interval, share=wait / loop if loop > 0 else 0.0)
    facts.update(_copy_facts(rows, loop))
    usage, device_empty = facts["host_usage"], facts["device_empty_ratio"]
    queue_starved = usage is None or usage < QUEUE_USAGE_BOUND  # None: no workers, no queue
    waits_matter = facts["share"] >= WAIT_SHARE_BOUND
    copy_matters = facts["copy_share"] is not None and facts["copy_share"] >= WAIT_SHARE_BOUND
    facts["h2d_stage"] = None
    if waits_matter and queue_starved:
        facts["verdict"] = "data processing"
    elif waits_matter and device_empty is not None and device_empty >= EMPTY_RATIO_BOUND:
        facts["verdict"], facts["h2d_stage"] = "host to device", PIN
    elif copy_matters and not (waits_matter and queue_starved):
        facts["verdict"], facts["h2d_stage"] = "host to device", TO_DEVICE
    else:
        facts["verdict"] = "none"  # batches were queued: the waits are the hand-over itself
    return facts


def bottleneck_stage(facts: dict | None, names: list[str], throughput: np.ndarray) -> str | None:
    """The stage to name, of ``names`` (pipeline order) with their throughputs (batches/s)."""
    if facts is None or facts["verdict"] == "none":
        return None
    if facts["verdict"] == "host to device":
        return facts["h2d_stage"] if facts["h2d_stage"] in names else None
    candidates = [i for i, n in enumerate(names) if n not in (PIN, TO_DEVICE) and not np.isnan(throughput[i])]
    if not candidates:
        return None
    return names[min(candidates, key=lambda i: throughput[i])]


def _rate_text(bytes_per_s: float) -> str:
    """A copy rate in GB/s, or MB/s below 1 GB/s (small batches: 0.00 GB/s would say nothing)."""
    return f"{bytes_per_s / 1e9:.2f} GB/s" if bytes_per_s >= 1e9 else f"{bytes_per_s / 1e6:.1f} MB/s"


def reason(facts: dict, stage: dict | None, workers: int) -> str:
    """The judgement in one sentence, with the numbers it rests on (ms, %, batches/s)."""
    share = f"the loop waited for data {facts['share']:.0%} of its time"
    copy = ""
    if facts["copy_share"] is not None:
        rate = f" at {_rate_text(facts['copy_rate'])}" if facts["copy_rate"] else ""
        copy = (
            f" and copied its batches to {facts['copy_device']} {facts['copy_share']:.0%} of its time"
            f" ({ms_text(facts['copy'] // max(facts['copied_batches'], 1))} ms per batch{rate})"
        )
    share += copy
    if facts["verdict"] == "none":
        return f"{share}; the loader keeps up"
    queue = ""
    if facts["host_usage"] is not None and workers > 0:
        queue = (
            f"; the host queue held {facts['host_usage']:.0%} of its {facts['capacity']} batches on average "
            f"and was empty at {facts['host_empty_ratio']:.0%} of requests"
        )
    elif workers == 0:
        queue = "; with num_workers=0 every batch is prepared while the loop waits"
    if facts["verdict"] == "host to device" and facts["h2d_stage"] == TO_DEVICE:
        return (
            f"{share}{queue}: the batches were ready, the copy to the device holds the loop up "
            "(pin_memory=True with .to(device, non_blocking=True), or a device prefetcher, overlaps it "
            "with compute)"
        )
    if facts["verdict"] == "host to device":
        return (
            f"{share}{queue}, while the device-side queue was empty at {facts['device_empty_ratio']:.0%}: "
            "pinning / copying batches to the device is slower than the workers produce them"
        )
    if stage is None:
        return f"{share}{queue}"
    rate = "" if stage["throughput_per_s"] is None else f", {stage['throughput_per_s']:.1f} batches/s"
    consume = ""
    if facts["interval"]:
        consume = f" while training uses {1 / ns_to_s(np.float64(facts['interval'])):.1f} batches/s"
    return (
        f"{share}{queue}; the slowest stage is {stage['stage']} "
        f"({ms_text(stage['per_batch_ns'])} ms per batch on {stage['parallelism']} "
        f"{'worker' if stage['parallelism'] == 1 else 'workers'}{rate}{consume})"
    )
