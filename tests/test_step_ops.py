"""analysis/step_ops.py on real traces: the outermost ops of each step, in order, as a user would
pick them out of the raw trace by hand (the standard library's JSON reader is the oracle)."""

from __future__ import annotations

from collections import defaultdict

import pytest

from _jobs import PP_JOB, trained_jobs
from conftest import kineto_file, raw_events, read_real
from perfsight.analysis.step_ops import step_ops

MICRO_BATCHES = 4  # examples/train_pp.py's default


def _oracle_outermost_host_ops(events: list[dict]) -> dict[int, list[str]]:
    """Per ProfilerStep#N: the names, by start, of the cpu_op events of the step's thread that lie
    inside no other cpu_op of that thread; host collectives (``c10d::``, ``record_param_comms``,
    docs/TRACE_MODEL.md's communication ops) are left to the cluster's matching."""
    steps = [e for e in events if e.get("ph") == "X" and str(e.get("name", "")).startswith("ProfilerStep#")]
    tid = steps[0]["tid"]
    ops = sorted(
        (
            e
            for e in events
            if e.get("ph") == "X"
            and e.get("cat") == "cpu_op"
            and e.get("tid") == tid
            and not str(e["name"]).startswith(("c10d::", "record_param_comms", "nccl:", "gloo:"))
        ),  # fmt: skip
        key=lambda e: (float(e["ts"]), -float(e["dur"])),
    )
    outermost, reach = [], float("-inf")
    for e in ops:  # a test oracle: a plain loop over the events
        start, end = float(e["ts"]), float(e["ts"]) + float(e["dur"])
        if start >= reach:
            outermost.append(e)
        reach = max(reach, end)
    by_step: dict[int, list[str]] = defaultdict(list)
    for s in steps:
        lo, hi, n = float(s["ts"]), float(s["ts"]) + float(s["dur"]), int(s["name"].split("#")[1])
        by_step[n] = [e["name"] for e in outermost if lo <= float(e["ts"]) < hi]
    return dict(by_step)


@pytest.mark.parametrize("rank", [0, 1])
def test_a_cpu_job_gives_the_outermost_ops_of_the_step_thread_and_its_micro_batches(
    tmp_path_factory: pytest.TempPathFactory, rank: int
) -> None:
    (path,) = (trained_jobs(tmp_path_factory) / PP_JOB).glob(f"rank{rank}_*/kineto_trace_{rank}.json")
    table = step_ops(read_real(path)).to_pandas()
    ops = table[table["level"] == "op"].sort_values(["step", "order"])
    expected = {n: names for n, names in _oracle_outermost_host_ops(raw_events(path)).items() if names}
    got = {int(n): list(g["name"]) for n, g in ops.groupby("step")}
    assert got == expected
    assert (ops.groupby("step")["order"].apply(lambda o: list(o) == list(range(len(o))))).all()
    assert set(ops["category"]) == {"compute"}  # communication comes from the cluster's matching
    # torch.distributed.pipelining's Forward N / Backward N ranges: every micro-batch, once a step
    blocks = table[table["level"] == "micro_batch"]
    for _, step in blocks.groupby("step"):
        assert sorted(zip(step["phase"], step["micro_batch"], strict=True)) == sorted(
            (p, m) for p in ("backward", "forward") for m in range(MICRO_BATCHES)
        )
    assert blocks["step"].nunique() == len(expected)


def test_a_gpu_trace_gives_its_device_work_and_no_collective() -> None:
    trace = read_real(kineto_file("nccl_parser_config/nccl_data.json.gz"))
    table = step_ops(trace).to_pandas()
    table = table[table["level"] == "op"]  # not the FLOPs and memory series
    assert not table.empty
    slices = trace.slices.to_pandas()
    rows = slices.loc[table["slice"]]
    assert rows["is_device"].all()
    assert set(rows["kind"].astype(str)) <= {"kernel", "memcpy", "memset"}
    assert not table["name"].str.contains("nccl", case=False).any()
    assert (table["end_ns"] >= table["start_ns"]).all()


def test_the_flops_and_memory_series_are_each_steps_counted_flops_and_allocator_totals(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    from perfsight.analysis.flops import flops_by_step

    (path,) = (trained_jobs(tmp_path_factory) / PP_JOB).glob("rank0_*/kineto_trace_0.json")
    trace = read_real(path)
    table = step_ops(trace).to_pandas()
    flops = table[table["level"] == "flops"]
    assert not flops.empty and (flops["value"] > 0).all()
    # per step, the series' FLOPs add up to the step's FLOPs as the FLOPs analysis counts them
    per_step = flops_by_step(trace).to_pandas().set_index("step")["flops"]
    got = flops.groupby("step")["value"].sum()
    assert set(got.index) <= set(per_step.index)
    for step, value in got.items():
        assert value == pytest.approx(per_step.loc[step])
    # memory: the allocator's totals of the step's events, each inside its step, in the trace's order
    memory = table[table["level"] == "memory"]
    assert not memory.empty and (memory["start_ns"] == memory["end_ns"]).all()
    steps = trace.steps.to_pandas().set_index("step")
    inside = memory.apply(
        lambda r: steps.loc[r["step"], "start_ns"] <= r["start_ns"] < steps.loc[r["step"], "end_ns"], axis=1
    )
    assert inside.all()
    allocated = set(trace.memory.column("allocated_bytes").to_pylist())
    assert set(memory["value"].astype("int64")) <= allocated
