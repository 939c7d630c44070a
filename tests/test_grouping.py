"""``analysis.grouping.aggregate`` gives what Arrow's ``group_by`` gives (Arrow is the oracle here),
without loading Acero."""

from __future__ import annotations

import pyarrow as pa
import pytest

from perfsight.analysis.grouping import aggregate

AGGREGATIONS = [
    ("dur_ns", "count"),
    ("dur_ns", "sum"),
    ("dur_ns", "min"),
    ("dur_ns", "max"),
    ("dur_ns", "mean"),
    ("flops", "sum"),
    ("small", "sum"),
]


def _table() -> pa.Table:
    return pa.table(
        {
            "rank": pa.array([0, 0, 1, 0, 1, 0, None], pa.int32()),
            "name": pa.array(["mm", "add", "mm", "mm", None, "add", "mm"]).dictionary_encode(),
            "dur_ns": pa.array([5, 7, 2, None, 9, 1, 4], pa.int64()),
            "flops": pa.array([1.5, None, 2.25, 0.5, None, None, 3.0], pa.float64()),
            "small": pa.array([2**30, 2**30, 1, 2**30, 1, 2, 3], pa.int32()),  # sums past int32
        }
    )


def _rows(table: pa.Table) -> list[tuple]:
    names = table.column_names
    return sorted((tuple(r[c] for c in names) for r in table.to_pylist()), key=lambda r: tuple(map(str, r)))


def test_every_function_matches_arrows_group_by_including_null_keys_and_null_values() -> None:
    table = _table()
    mine = aggregate(table, ["rank", "name"], AGGREGATIONS)
    arrow = table.group_by(["rank", "name"], use_threads=False).aggregate(AGGREGATIONS)
    assert mine.column_names == arrow.column_names
    assert [f.type for f in mine.schema] == [f.type for f in arrow.schema]
    assert _rows(mine) == _rows(arrow)


def test_a_group_without_values_gets_null_aggregates_and_a_zero_count() -> None:
    mine = aggregate(_table(), ["rank", "name"], AGGREGATIONS).to_pylist()
    only_null = next(r for r in mine if r["rank"] == 0 and r["name"] == "mm")
    assert only_null["dur_ns_count"] == 1 and only_null["dur_ns_sum"] == 5  # the null duration is skipped
    no_flops = next(r for r in mine if r["rank"] == 0 and r["name"] == "add")
    assert no_flops["flops_sum"] is None


def test_an_empty_table_and_an_unsupported_function() -> None:
    empty = _table().slice(0, 0)
    assert aggregate(empty, ["rank"], [("dur_ns", "sum")]).num_rows == 0
    with pytest.raises(ValueError, match="unsupported"):
        aggregate(_table(), ["rank"], [("dur_ns", "median")])


@pytest.mark.parametrize("groups", [3, 70_000])  # 16-bit group codes and wider ones
def test_columns_with_and_without_nulls_share_one_grouping_and_match_arrow(groups: int) -> None:
    import numpy as np

    rng = np.random.default_rng(groups)
    n = 200_000
    key = rng.integers(0, groups, n)
    table = pa.table(
        {
            "rank": pa.array(np.zeros(n, np.int32)),  # one value: cannot split a group
            "key": pa.array(key.astype(str)),
            "dur_ns": pa.array(rng.integers(0, 1000, n)),
            "flops": pa.array(rng.random(n), mask=rng.random(n) < 0.3),
            "small": pa.array(rng.integers(-5, 5, n).astype(np.int32), mask=rng.random(n) < 0.1),
        }
    )
    mine = aggregate(table, ["rank", "key"], AGGREGATIONS)
    arrow = table.group_by(["rank", "key"], use_threads=False).aggregate(AGGREGATIONS)
    order = [("key", "ascending")]
    assert mine.sort_by(order).drop(["flops_sum"]).equals(arrow.sort_by(order).drop(["flops_sum"]))
    flops = mine.sort_by(order).column("flops_sum").to_numpy(zero_copy_only=False)
    arrow_flops = arrow.sort_by(order).column("flops_sum").to_numpy(zero_copy_only=False)
    assert np.allclose(flops, arrow_flops, equal_nan=True)  # float sums: same values, other order
    first_seen = pa.array(key.astype(str)).unique()
    assert mine.column("key").equals(pa.chunked_array([first_seen]))  # groups in order of first appearance
