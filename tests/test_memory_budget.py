"""Turning a memory limit into a chunk size (``perfsight analyse --memory-limit``)."""

from __future__ import annotations

import pytest

from perfsight.memory_budget import BASE_BYTES, MIN_SLICES, BudgetError, parse_size, slices_per_chunk


@pytest.mark.parametrize(
    ("text", "size"),
    [("2G", 2 << 30), ("2GiB", 2 << 30), ("1536m", 1536 << 20), ("1.5GB", 3 << 29), ("4096", 4096)],
)
def test_sizes_read_as_users_write_them(text: str, size: int) -> None:
    assert parse_size(text) == size


@pytest.mark.parametrize("text", ["", "2x", "-1G", "0", "G"])
def test_a_size_that_is_not_one_is_refused_with_what_was_given(text: str) -> None:
    with pytest.raises(BudgetError, match=repr(text).replace("\\", "\\\\")):
        parse_size(text)


def test_a_larger_budget_gives_larger_chunks_and_a_tiny_one_the_smallest() -> None:
    assert slices_per_chunk(4 << 30) > slices_per_chunk(2 << 30) > MIN_SLICES
    assert slices_per_chunk(BASE_BYTES // 2) == MIN_SLICES
