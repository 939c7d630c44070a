"""columns.decoded: a dictionary column decoded by gathering string views must be exactly what
Arrow's own decode gives -- for a real trace's names, for slices, nulls and empty strings."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa

from perfsight import columns
from perfsight.ingest import read_trace


def _same(array: pa.Array) -> None:
    got = columns.decoded(array)
    got.validate(full=True)
    assert got.type == pa.string()
    assert got.equals(array.dictionary_decode())


def test_decoded_names_of_a_real_trace_equal_arrows_decode(df_trace_path: Path) -> None:
    names = read_trace(df_trace_path).slices.column("name")
    assert pa.types.is_dictionary(names.type)
    decoded = columns.decoded(names)
    assert decoded.num_chunks == names.num_chunks
    assert decoded.equals(names.cast(pa.string()))
    rows = np.random.default_rng(0).integers(0, len(names), 5000)
    taken = names.take(pa.array(rows, mask=rows % 7 == 0)).combine_chunks()  # with null rows
    _same(taken)
    _same(taken.slice(123, 3000))


def test_null_rows_decode_to_empty_null_cells_and_short_strings_stay_inline() -> None:
    dictionary = pa.array(["", "ab", "x" * 40, "a longer name, with a comma"])
    indices = pa.array([2, None, 0, 1, 3, 3, None, 2], pa.int32())
    array = pa.DictionaryArray.from_arrays(indices, dictionary)
    for part in (array, array.slice(1), array.slice(3, 4), array.slice(8)):
        _same(part)
    got = columns.decoded(array)
    offsets = np.frombuffer(got.buffers()[1], np.int32)[: len(got) + 1]
    assert (np.diff(offsets)[[1, 6]] == 0).all()  # a null cell holds no bytes (CSV quoting relies on it)


def test_columns_that_are_not_dictionaries_come_back_as_they_are() -> None:
    plain = pa.chunked_array([pa.array(["a", "b"])])
    assert columns.decoded(plain) is plain
    numbers = pa.DictionaryArray.from_arrays(pa.array([1, 0, 1]), pa.array([10, 20]))
    assert columns.decoded(numbers).to_pylist() == [20, 10, 20]


def test_spread_gives_each_row_its_keys_value_and_null_for_no_key() -> None:
    distinct = pa.array(["[64, 128]", "", "[[1, 2], [3]]"])
    codes = np.array([2, 0, -1, 1, 2, 2, -1, 0])
    spread = columns.spread(distinct, codes)
    assert spread.to_pylist() == [
        "[[1, 2], [3]]",
        "[64, 128]",
        None,
        "",
        "[[1, 2], [3]]",
        "[[1, 2], [3]]",
        None,
        "[64, 128]",
    ]
    numbers = columns.spread(pa.array([7, None]), np.array([1, 0, -1]))
    assert numbers.to_pylist() == [None, 7, None]
