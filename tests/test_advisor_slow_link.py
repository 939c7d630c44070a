"""Slow links: the bandwidth outlier among links of one type and size (``cluster.slow.slow_links``).

What a user checks: in a four-rank ring whose link 1 -> 2 is rate-limited (examples/scenarios/
slow_link.py, root only; its measured bandwidths are in docs/DIAGNOSIS.md), that link and only
that one is slow -- also when the slow link drags a small bucket's median and MAD down with it --
while links that differ by the noise of a shared machine are not.
"""

from __future__ import annotations

import pandas as pd

from perfsight.cluster.slow import slow_links

MIB8 = 8 * 2**20


def ring(gb_per_s: list[float]) -> pd.DataFrame:
    """One 8 MiB transfer on each link ``i -> i+1`` of a ring, at the given bandwidths."""
    n = len(gb_per_s)
    return pd.DataFrame(
        {
            "src": list(range(n)),
            "dst": [(i + 1) % n for i in range(n)],
            "link_type": "INTRA_HOST",
            "bytes": [float(MIB8)] * n,
            "transit_ns": [MIB8 / g for g in gb_per_s],  # bytes / (GB/s) = ns
        }
    )


def flagged(table: pd.DataFrame) -> list[str]:
    return [f"{s}->{d}" for s, d in table.loc[table["slow"], ["src", "dst"]].itertuples(index=False)]


def test_the_rate_limited_link_of_a_four_rank_ring_is_slow() -> None:
    # bandwidths of a loaded run: the slow link drags the median and the MAD of four links
    assert flagged(slow_links(ring([0.238, 0.042, 0.413, 0.513]))) == ["1->2"]
    assert flagged(slow_links(ring([2.74, 0.028, 2.29, 1.94]))) == ["1->2"]


def test_links_within_a_shared_machines_noise_are_not_slow() -> None:
    assert flagged(slow_links(ring([0.238, 0.35, 0.413, 0.513]))) == []


def test_two_links_of_a_kind_are_too_few_to_call_one_slow() -> None:
    assert flagged(slow_links(ring([2.0, 0.02]))) == []


def test_a_slow_link_among_many_is_found_by_its_distance_from_the_median() -> None:
    rates = [1.0, 1.05, 0.95, 1.02, 0.98, 1.01, 0.2, 0.99]
    assert flagged(slow_links(ring(rates))) == ["6->7"]
