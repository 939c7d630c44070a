"""``perfsight compare`` on the shared real traces: the two ranks of the Kineto ``two_ranks_ws128``
pair, the Ascend job profiled at level0 and at level1, and inputs a user gets wrong.

What a user checks: the numbers on each side are the rank's own analysis (the comparison aligns
and subtracts, it computes nothing of its own), a run compared with itself shows nothing, swapping
the sides negates every difference, communication groups named differently by two profiler
levels still align, and a bad input is one line naming it.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from perfsight.compare import CompareInputError, compare, top_regressions
from shared_data import ASCEND, KINETO, require

WS128 = KINETO / "two_ranks_ws128"


def _cli(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "perfsight.cli", *args],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=cwd,
        check=False,
    )


@pytest.fixture(scope="module")
def ws128() -> Path:
    return require(WS128)


@pytest.fixture(scope="module")
def ws128_pair(ws128: Path):
    """rank 0 against rank 1, each analysed in memory from the raw traces."""
    return compare(f"{ws128}:rank0", f"{ws128}:rank1")


@pytest.fixture(scope="module")
def ascend_analysed(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The Ascend job at level0 and level1, analysed by the CLI (compare reads their caches)."""
    out = {}
    for level in ("level0", "level1"):
        folder = tmp_path_factory.mktemp("ascend") / level
        result = _cli("analyse", str(require(ASCEND / level)), "--out", str(folder), "--no-progress")
        assert result.returncode == 0, result.stderr[-2000:]
        out[level] = folder
    return out


def test_each_side_is_its_ranks_own_step_trace_averaged_over_the_steps_it_names(ws128, ws128_pair) -> None:
    from perfsight import load

    for side, rank in (("base", 0), ("new", 1)):
        own = load(WS128 / f"sampled_rank-{rank}.json.gz").df("step_trace")
        used = getattr(ws128_pair, side).steps_used
        assert used and set(used) <= set(own["step"])
        expected = own[own["step"].isin(used)]
        row = ws128_pair.step_metric("step_ns")
        assert row[side] == pytest.approx(expected["duration_ns"].mean())
        gap = ws128_pair.step_metric("iteration_interval_ns")
        assert gap[side] == pytest.approx(expected["iteration_interval_ns"].mean())


def test_operator_totals_per_name_equal_the_ranks_operator_statistics(ws128_pair) -> None:
    from perfsight import load

    base = ws128_pair.base
    assert base.steps_used == base.steps_all  # two steps: both averaged, so totals are whole-run totals
    stats = load(WS128 / "sampled_rank-0.json.gz").df("operator_stats").set_index("name")
    ops = ws128_pair.operators
    per_name = ops.groupby("name")[["base_calls", "base_self_ns"]].sum() * base.step_count
    per_name = per_name[per_name["base_calls"] > 0].join(stats[["count", "host_self_ns"]], how="outer")
    assert not per_name.isna().any().any(), "an operator on one side of the diff and not in the stats"
    np.testing.assert_allclose(per_name["base_calls"], per_name["count"])
    np.testing.assert_allclose(per_name["base_self_ns"], per_name["host_self_ns"], rtol=1e-9, atol=1)


def test_a_run_compared_with_itself_shows_no_difference(ws128) -> None:
    same = compare(f"{ws128}:rank1", f"{ws128}:rank1")
    for name in ("operators", "kernels_by_operator", "communication"):
        table = same.table(name)
        assert len(table) and set(table["status"]) == {"same"}, name
    assert (same.step_breakdown["delta"].fillna(0) == 0).all()
    assert not same.step_breakdown["beyond_noise"].fillna(False).any()
    assert top_regressions(same).empty


def test_swapping_the_sides_negates_every_difference(ws128, ws128_pair) -> None:
    swapped = compare(f"{ws128}:rank1", f"{ws128}:rank0")
    forward = ws128_pair.operators.set_index(["name", "input_dims"])["delta_time_ns"]
    backward = swapped.operators.set_index(["name", "input_dims"])["delta_time_ns"]
    pd.testing.assert_series_equal(forward.sort_index(), -backward.sort_index(), check_names=False)
    added = set(ws128_pair.operators.loc[ws128_pair.operators["status"] == "added", "name"])
    removed = set(swapped.operators.loc[swapped.operators["status"] == "removed", "name"])
    assert added == removed and added


def test_kernels_are_grouped_by_the_operator_that_launched_them(ws128_pair) -> None:
    kernels = ws128_pair.kernels_by_operator
    assert len(kernels)
    assert kernels["op"].is_unique
    nccl = kernels[kernels["op"].str.startswith("nccl:")]
    assert len(nccl), "the NCCL collectives launch kernels: they must appear under their operator"
    assert (kernels["base_distinct_kernels"] >= 0).all()


def test_regressions_are_largest_first_and_only_real_ones_lead(ws128_pair) -> None:
    ranked = ws128_pair.regressions
    assert ranked["delta_ns"].is_monotonic_decreasing
    top = top_regressions(ws128_pair)
    assert len(top) and top["real"].all() and (top["delta_ns"] > 0).all()


def test_ascend_level0_and_level1_overlap_breakdowns_agree(ascend_analysed) -> None:
    c = compare(str(ascend_analysed["level0"]), str(ascend_analysed["level1"]))
    for metric in ("computing_ns", "overlapped_ns", "free_ns"):
        row = c.step_metric(metric)
        assert row["base"] > 0 and abs(row["delta"]) <= 0.02 * row["base"], (metric, row)
        assert row["beyond_noise"] is None  # one step per run: the spread is unknown, and said so
    # level0 names the all-reduce group "Group 0", level1 by its hash: one aligned row, not two
    comm = c.communication
    assert list(comm["family"]) == ["all_reduce"]
    assert comm["status"].iloc[0] not in ("added", "removed")
    assert comm["base_calls"].iloc[0] == comm["new_calls"].iloc[0]


def test_cli_writes_the_tables_and_the_json_and_leads_with_regressions(ascend_analysed, tmp_path) -> None:
    level0, level1 = ascend_analysed["level0"], ascend_analysed["level1"]
    result = _cli("compare", f"{level0}:rank0", f"{level0}:rank1", "--out", str(tmp_path))
    assert result.returncode == 0, result.stderr
    text = result.stdout
    lead = next(i for i, line in enumerate(text.splitlines()) if "regression" in line)
    assert text.splitlines()[lead].startswith(
        ("Biggest regressions beyond noise", "No regression beyond noise")
    )
    assert text.index("Step time:") < text.index("regression") < text.index("Step breakdown")
    folder = tmp_path / "compare"
    for name in ("step_breakdown", "regressions", "operators", "kernels_by_operator", "communication"):
        frame = pd.read_csv(folder / f"{name}.csv")
        assert "status" in frame.columns or name == "step_breakdown" or "real" in frame.columns
    doc = json.loads((folder / "compare.json").read_text())
    assert doc["base"]["rank"] == 0 and doc["new"]["rank"] == 1
    assert doc["base"]["steps_used"] == doc["base"]["steps_all"]

    as_json = _cli("compare", str(level0), str(level1), "--json", "--out", str(tmp_path / "j"))
    assert as_json.returncode == 0, as_json.stderr
    printed = json.loads(as_json.stdout)
    assert [r["metric"] for r in printed["step_breakdown"]][0] == "step_ns"
    assert printed["operators_rows"] == len(printed["operators"])


def test_bad_inputs_are_one_line_naming_the_input(ws128, tmp_path) -> None:
    missing = tmp_path / "nowhere"
    result = _cli("compare", str(missing), f"{ws128}:rank0", "--out", str(tmp_path))
    assert result.returncode == 2
    assert "BASE" in result.stderr and str(missing) in result.stderr and "Traceback" not in result.stderr

    result = _cli("compare", f"{ws128}:rank0", f"{ws128}:rank7", "--out", str(tmp_path))
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "NEW" in result.stderr and "no rank 7" in result.stderr and "0, 1" in result.stderr

    not_a_trace = tmp_path / "notes.json"
    not_a_trace.write_text("{ this is not json")
    with pytest.raises(CompareInputError, match="notes.json"):
        compare(str(not_a_trace), f"{ws128}:rank0")


def test_different_step_counts_compare_per_step_means_and_say_which_steps(ws128) -> None:
    five = require(KINETO / "ns_resolution_trace")
    c = compare(f"{ws128}:rank0", str(five))
    assert len(c.base.steps_used) == 2 and len(c.new.steps_all) == 5
    assert len(c.new.steps_used) == 4  # the first of five complete steps is the warm-up
    assert any("left out" in note for note in c.notes)
    doc = c.to_dict(limit=5)
    assert doc["new"]["steps_used"] == c.new.steps_used and len(doc["operators"]) <= 5


def test_an_analysed_folder_and_its_raw_traces_compare_the_same(ws128, ws128_pair, tmp_path) -> None:
    """The cache path reads a subset of columns as dictionaries; the raw path analyses in memory:
    a user must get the same tables from either."""
    out = tmp_path / "analysed"
    result = _cli("analyse", str(ws128), "--out", str(out), "--no-progress")
    assert result.returncode == 0, result.stderr[-2000:]
    cached = compare(f"{out}:rank0", f"{out}:rank1")
    for name in ("step_breakdown", "operators", "kernels_by_operator", "communication", "regressions"):
        pd.testing.assert_frame_equal(
            cached.table(name).reset_index(drop=True),
            ws128_pair.table(name).reset_index(drop=True),
            check_dtype=False,
        )


def test_ascend_kernels_without_a_host_launch_are_grouped_by_their_op_type(ascend_analysed) -> None:
    c = compare(f"{ascend_analysed['level1']}:rank0", f"{ascend_analysed['level1']}:rank1")
    kernels = c.kernels_by_operator
    assert len(kernels) > 1
    assert "(no operator)" not in set(kernels["op"]), "Ascend kernels record their op type: use it"
    conv = kernels[kernels["op"].str.contains("Conv2D")]
    assert len(conv) and (conv["status"] != "added").all() and (conv["status"] != "removed").all()
