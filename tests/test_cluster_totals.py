"""The job's totals its pages show (``perfsight.cluster.totals``): the rules a user relies on when
reading the time overview and the Communication page.  The numbers of real jobs are checked
against the job's own CSV files through the API (tests/test_server_job_views.py,
tests/test_server_job_comm.py); these tests pin the rules that real jobs rarely exercise: ties,
ranks without ops, ops outside every step, halves."""

from __future__ import annotations

import numpy as np
import pandas as pd

from perfsight.cluster.op_time import TIME_COLUMNS
from perfsight.cluster.totals import ALL_STEPS, communication_by_rank, step_spread


def _steps(rows: list[tuple[int, int, int, int]]) -> pd.DataFrame:
    """(rank, step, duration_ns, communication_ns) rows as the cluster step trace has them."""
    return pd.DataFrame(rows, columns=["rank", "step", "duration_ns", "communication_ns"])


def _ops(rows: list[dict]) -> pd.DataFrame:
    """Matched ops: each row's missing time columns are 0, ``step`` may be NaN (outside any step)."""
    frame = pd.DataFrame(rows)
    for column in TIME_COLUMNS:
        if column not in frame:
            frame[column] = 0
    return frame


def test_each_steps_spread_names_its_fastest_and_slowest_rank_and_breaks_ties_by_rank() -> None:
    steps = _steps(
        [(0, 1, 100, 10), (1, 1, 300, 30), (2, 1, 300, 20), (3, 1, 100, 0),  # ties at both ends
         (0, 2, 7, 1), (1, 2, 8, 2)]  # two ranks: the median is halfway, 7.5 -> 8
    )  # fmt: skip
    got = step_spread(steps, _ops([{"rank": 0, "step": 1, "wait_ns": 40}])).set_index("step")
    assert list(got.index) == [1, 2]
    one = got.loc[1]
    assert (one["ranks"], one["min_ns"], one["median_ns"], one["max_ns"]) == (4, 100, 200, 300)
    assert (one["fastest_rank"], one["slowest_rank"]) == (0, 2)  # lower rank fastest, higher slowest
    assert one["mean_communication_ns"] == 15  # (10 + 30 + 20 + 0) / 4
    assert one["mean_wait_ns"] == 10  # rank 0 waited 40, the three others had no op: 0
    assert got.loc[2, "median_ns"] == 8 and got.loc[2, "mean_wait_ns"] == 0


def test_a_ranks_wait_in_a_step_is_all_its_ops_waits_there_and_nothing_of_other_steps() -> None:
    steps = _steps([(0, 3, 50, 5), (1, 3, 60, 6)])
    ops = _ops(
        [
            {"rank": 0, "step": 3, "wait_ns": 10},
            {"rank": 0, "step": 3, "wait_ns": 20},
            {"rank": 1, "step": 4, "wait_ns": 1000},  # a step the step trace does not have
            {"rank": 1, "step": np.nan, "wait_ns": 1000},  # outside every step
        ]
    )
    got = step_spread(steps, ops)
    assert got["mean_wait_ns"].tolist() == [15]  # (10 + 20 + 0) / 2


def test_every_rank_is_listed_in_every_step_with_zeros_when_it_issued_no_op() -> None:
    resources = pd.DataFrame({"rank": [0, 1, 2], "host": ["a", "a", None]})
    ops = _ops(
        [
            {"rank": 0, "step": 1, "elapse_ns": 5, "wait_ns": 2, "bytes": 100.0},
            {"rank": 0, "step": 1, "elapse_ns": 7, "wait_ns": 3, "bytes": 50.0},
            {"rank": 1, "step": 2, "elapse_ns": 9, "wait_ns": 4, "bytes": np.nan},
            {"rank": 0, "step": np.nan, "elapse_ns": 1, "wait_ns": 1, "bytes": 8.0},  # in no step
        ]
    )
    got = communication_by_rank(ops, resources)
    assert sorted(set(got["step"])) == ["1", "2", ALL_STEPS]
    assert len(got) == 3 * 3  # every rank in every step, and in all
    row = got.set_index(["step", "rank"])
    assert row.loc[("1", 0), ["ops", "elapse_ns", "wait_ns", "bytes"]].tolist() == [2, 12, 5, 150.0]
    assert row.loc[("1", 2), ["ops", "elapse_ns", "wait_ns", "bytes"]].tolist() == [0, 0, 0, 0.0]
    assert row.loc[("2", 1), "bytes"] == 0.0  # no recorded size: nothing summed, not NaN
    # all steps: every op of the rank, the one outside any step included
    assert row.loc[(ALL_STEPS, 0), ["ops", "elapse_ns", "wait_ns", "bytes"]].tolist() == [3, 13, 6, 158.0]
    assert row.loc[(ALL_STEPS, 1), "host"] == "a" and row.loc[(ALL_STEPS, 2), "host"] is None


def test_a_job_without_steps_or_ops_has_empty_totals_not_errors() -> None:
    empty_steps = _steps([])
    no_ops = _ops([]).assign(rank=pd.Series(dtype="int64"), step=pd.Series(dtype="float64"))
    assert step_spread(empty_steps, no_ops).empty
    got = communication_by_rank(no_ops, pd.DataFrame({"rank": [0, 1], "host": ["h", "h"]}))
    assert got["step"].tolist() == [ALL_STEPS, ALL_STEPS] and got["ops"].tolist() == [0, 0]
