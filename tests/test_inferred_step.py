"""A trace without step markers is one inferred step numbered 0, in every output that names the
step (docs/OUTPUTS.md says so): a user joining step_trace_time.csv to kernel_details.csv by step
finds the same number in both."""

from __future__ import annotations

import csv
from pathlib import Path

import perfsight
from conftest import kineto_file


def test_a_trace_without_step_markers_is_step_0_everywhere_and_the_warning_says_so(tmp_path: Path) -> None:
    trace = kineto_file("critical_path/alexnet/benchmark_result_2869224_1695835535_trace.json.gz")
    result = perfsight.analyse(trace, tmp_path)
    rank = result.ranks[0]
    assert rank.trace.steps.column("inferred").to_pylist() == [True]
    assert any("no ProfilerStep markers" in w and "step 0" in w for w in rank.trace.meta.warnings)
    out = rank.output_dir
    assert out is not None
    with (out / "step_trace_time.csv").open(newline="") as handle:
        assert [row["Step"] for row in csv.DictReader(handle)] == ["0"]
    with (out / "kernel_details.csv").open(newline="") as handle:
        assert {row["Step Id"] for row in csv.DictReader(handle)} == {"0"}
    assert result.table("flops_by_step").column("step").to_pylist() == [0]
