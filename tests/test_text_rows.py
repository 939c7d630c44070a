"""The writers' row text (export/text.py): the native layout and the portable one give the same bytes."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from perfsight.export import text
from perfsight.ingest import eventscan

needs_native = pytest.mark.skipif(not eventscan.available(), reason="native library not built")


@pytest.fixture
def portable() -> Iterator[None]:
    """The portable layout: the native library forgotten for the test, loaded again after it."""
    eventscan.use_library(None)
    yield
    eventscan.use_library(Path(eventscan.__file__).parent)


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


def _numbers_and_members() -> text.TextRows:
    """Times, ids and an object whose members are each missing on some row."""
    rows = text.TextRows(5)
    rows.add("[")
    rows.add_micros(np.array([0, -5, 1_234_567, -2_000_000_001, 2**62]))
    rows.add(",")
    rows.add_micros(np.array([7, 7, 0, 7, 1_000]), few=True)
    rows.add(",")
    rows.add_ints(np.array([1, -1, 0, 2**63 - 1, -(2**63)]))
    rows.add(",")
    rows.open_object()
    rows.add_int_member("id", np.array([3, 0, 3, 9, 0]), np.array([True, False, True, True, False]), few=True)
    rows.add_member("s", (np.array([0, -1, 1, 1, -1]), ['"x"', "[1,2]"]))
    rows.add_member("t", pa.array([None, "1.5", None, "2", None]))
    rows.add_int_member("n", np.array([-4, 5, 6, 0, 8]), np.array([False, True, True, False, False]))
    rows.close_object()
    rows.add("]\n")
    return rows


NUMBERS_EXPECTED = (
    b'[0.000,0.007,1,{"id":3,"s":"x"}]\n'
    b'[-0.005,0.007,-1,{"t":1.5,"n":5}]\n'
    b'[1234.567,0.000,0,{"id":3,"s":[1,2],"n":6}]\n'
    b'[-2000000.001,0.007,9223372036854775807,{"id":9,"s":[1,2],"t":2}]\n'
    b"[4611686018427387.904,1.000,-9223372036854775808,{}]\n"
)


def test_rows_are_laid_out_in_order_with_nulls_left_out() -> None:
    assert bytes(_rows().to_bytes()) == EXPECTED


def test_numbers_and_object_members_are_written_exactly() -> None:
    assert bytes(_numbers_and_members().to_bytes()) == NUMBERS_EXPECTED


def test_the_portable_layout_writes_the_same_bytes(portable: None) -> None:
    assert not eventscan.available()
    assert bytes(_rows().to_bytes()) == EXPECTED
    assert bytes(_numbers_and_members().to_bytes()) == NUMBERS_EXPECTED


@needs_native
def test_chunks_of_any_size_join_to_the_whole_text() -> None:
    whole = bytes(_numbers_and_members().to_bytes())
    for size in (1, 2, 3, 5, 8):
        assert b"".join(bytes(c) for c in _numbers_and_members().chunks(size)) == whole


@needs_native
def test_gather_of_a_sliced_array_starts_at_its_offset() -> None:
    strings = pa.array(["zero", "one", "two", "three"]).slice(1)
    assert bytes(eventscan.gather(strings, np.array([2, 0, 1, 0]))) == b"threeonetwoone"


@needs_native
def test_a_sliced_string_column_is_read_from_its_offset() -> None:
    rows = text.TextRows(3)
    rows.add_values(pa.array(["zero", None, "two", "three", None, "five"]).slice(2, 3))
    rows.add(";")
    assert bytes(rows.to_bytes()) == b"two;three;;"


def test_a_large_string_column_is_written_like_a_string_column() -> None:
    # 64-bit offsets (what Arrow gives a column past 2 GB, or a reader that asks for it) must not
    # be read as 32-bit ones by the native layout
    for strings in (pa.array(["a", None, "ccc"]), pa.array(["a", None, "ccc"], pa.large_string())):
        rows = text.TextRows(3)
        rows.add_values(strings)
        rows.add(";")
        assert bytes(rows.to_bytes()) == b"a;;ccc;"


def test_integers_of_every_length_are_their_decimal_text() -> None:
    edges = [0, 7, 2**63 - 1, -(2**63)] + [
        s * (10**k + d) for k in range(19) for d in (-1, 0) for s in (1, -1)
    ]
    values = np.array(edges, np.int64)
    rows = text.TextRows(len(values))
    rows.add_ints(values)
    rows.add(";")
    assert bytes(rows.to_bytes()).decode() == "".join(f"{v};" for v in values.tolist())
