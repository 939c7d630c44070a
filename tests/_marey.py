"""Reading the Marey view's answer as a user of the API would: an item's per-device columns
(``starts``/``durs``/``counts``, aligned with its stage's drawn devices) decoded into intervals."""

from __future__ import annotations

from typing import Any


def name(op: dict[str, Any]) -> str:
    """The item's op name: sent as ``name``, or null where its key is ``<name>#<k>``."""
    if op["name"] is None:
        head, _, k = op["key"].rpartition("#")
        assert head and k.isdigit(), op["key"]
        return head
    return op["name"]


def intervals(data: dict[str, Any], op: dict[str, Any]) -> list[tuple[int, int, int, int]]:
    """(rank, start ns, end ns from the step's first op, ops merged) per drawn device that ran ``op``."""
    ranks = [d["rank"] for d in data["devices"] if d["stage"] == op["stage"]]
    folded = next(st["folded"] for st in data["stages"] if st["stage"] == op["stage"])
    assert len(op["starts"]) == len(op["durs"]) == (0 if folded else len(ranks))
    assert (op["counts"] is None) == (op["ops"] == 1)
    out = []
    for k, (rank, s, d) in enumerate(zip(ranks, op["starts"], op["durs"], strict=False)):
        if s is None:
            assert d is None and (op["counts"] is None or op["counts"][k] is None)
            continue
        start = op["start_ns"] + s
        out.append((rank, start, start + d, 1 if op["counts"] is None else op["counts"][k]))
    return out
