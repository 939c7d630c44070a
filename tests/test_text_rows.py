"""The writers' row text (export/text.py): the native gather and Arrow's take give the same bytes."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from perfsight.export import text
from perfsight.ingest import eventscan


def _rows() -> text.TextRows:
    rows = text.TextRows(4)
    rows.add('{"name":')
    rows.add_choice(np.array([0, 1, 0, -1]), ['"a"', '"b\\u00e9"'])
    rows.add(',"v":')
    rows.add_values(pa.array(["1", None, "3.5", "x" * 300]))  # a null adds nothing
    rows.add("}\n")
    return rows


EXPECTED = (
    b'{"name":"a","v":1}\n{"name":"b\\u00e9","v":}\n{"name":"a","v":3.5}\n{"name":,"v":' + b"x" * 300 + b"}\n"
)


def test_rows_are_laid_out_in_order_with_nulls_left_out() -> None:
    assert bytes(_rows().to_bytes()) == EXPECTED


@pytest.mark.skipif(not eventscan.available(), reason="native library not built")
def test_native_gather_matches_arrow_take(monkeypatch: pytest.MonkeyPatch) -> None:
    native = bytes(_rows().to_bytes())
    monkeypatch.setattr(eventscan, "gather", lambda strings, order: None)
    assert bytes(_rows().to_bytes()) == native == EXPECTED


@pytest.mark.skipif(not eventscan.available(), reason="native library not built")
def test_gather_of_a_sliced_array_starts_at_its_offset() -> None:
    strings = pa.array(["zero", "one", "two", "three"]).slice(1)
    assert bytes(eventscan.gather(strings, np.array([2, 0, 1, 0]))) == b"threeonetwoone"
