"""Unit conversion at the export edge: the only place nanoseconds and bytes become µs, MB and KB.

The trace model and every analysis keep integer nanoseconds and bytes.  Files a MindSpore user
reads (``*.csv``, ``trace_view.json``) show microseconds with three decimals, megabytes and
kilobytes.  Each target unit has exactly one helper here, so a number in an output file can be
traced back to one conversion.

Microseconds are exact: an integer nanosecond count ``n`` becomes the decimal ``n / 1000`` with
three places (an Arrow ``decimal128(38, 3)`` whose unscaled value *is* ``n``), never a float, so an
absolute timestamp such as ``1736408883704643.212`` survives CSV writing digit for digit.  A float
input (an average) is rounded to whole nanoseconds first.  Percentages also get exactly three
decimals.  MB and KB are binary (2**20 and 2**10 bytes, as Ascend writes them) and float64, which
is exact for any byte count below 2**53 -- except in ``communication.json``, whose MB are
*decimal* (10**6 bytes: HCCL reports a 2,064,384-byte packet as ``2.064384``), hence the separate
:func:`bytes_to_decimal_mb`.  Milliseconds (float64) serve that file and the printed summaries.
Seconds (float64) exist for rates an analysis reports per second (FLOP/s); they are converted here
too, so every unit factor has one home.

This module must not read tables, choose columns or write files.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from perfsight import columns
from perfsight.columns import ArrayOrChunked, combined

US_TYPE = pa.decimal128(38, 3)
"""Arrow type of an exact microsecond value with three decimals."""

NS_PER_US = 1_000
NS_PER_MS = 1_000_000
NS_PER_S = 1_000_000_000
BYTES_PER_MB = 2**20
BYTES_PER_KB = 2**10
BYTES_PER_DECIMAL_MB = 1_000_000
"""HCCL's MB (``communication.json`` only): decimal, unlike the binary MB of Ascend's CSV columns."""


def _thousandths(unscaled: ArrayOrChunked) -> pa.Array:
    """Integers counting thousandths -> exact ``decimal128(38, 3)`` (unscaled value = the integer)."""
    as_int = combined(unscaled).cast(pa.int64())
    values = columns.int64(as_int, 0)
    words = np.empty((len(values), 2), dtype=np.int64)  # little-endian int128: low word, sign word
    words[:, 0] = values
    words[:, 1] = values >> 63
    validity = pc.is_valid(as_int).buffers()[1] if as_int.null_count else None  # fresh, offset-0 bitmap
    return pa.Array.from_buffers(
        US_TYPE, len(values), [validity, pa.py_buffer(words.tobytes())], null_count=as_int.null_count
    )


def _rounded_thousandths(values: ArrayOrChunked, scale: float) -> pa.Array:
    """``values * scale`` rounded half-to-even to an integer count of thousandths."""
    scaled = pc.multiply(combined(values).cast(pa.float64()), scale)
    finite = pc.if_else(pc.is_finite(scaled), scaled, pa.scalar(None, pa.float64()))
    return _thousandths(pc.round(finite, 0, round_mode="half_to_even").cast(pa.int64()))


def ns_to_us(ns: ArrayOrChunked) -> pa.Array:
    """Nanoseconds -> microseconds with exactly three decimals (``decimal128(38, 3)``).

    Integer input is exact; floating input (an average) is first rounded half-to-even to whole
    nanoseconds.  Nulls (and NaN) stay null.
    """
    arr = combined(ns)
    if pa.types.is_floating(arr.type):
        return _rounded_thousandths(arr, 1.0)
    if not pa.types.is_integer(arr.type) and not pa.types.is_null(arr.type):
        raise TypeError(f"ns_to_us expects integer or float nanoseconds, got {arr.type}")
    return _thousandths(arr)


US_SIGNS = ("", "-")
US_FRACTIONS = tuple(f".{i:03d}" for i in range(NS_PER_US))
"""The texts :func:`us_pieces` codes index: a sign, and ``".000"`` to ``".999"``."""


def us_pieces(ns: ArrayOrChunked | np.ndarray) -> tuple[np.ndarray, pa.Array, np.ndarray]:
    """Integer nanoseconds -> the three pieces of their exact microsecond text with three decimals:
    (sign code into :data:`US_SIGNS`, whole microseconds as text, code into :data:`US_FRACTIONS`).

    Writers that build text piece by piece use them directly; :func:`us_text` joins them.  Joined,
    they equal ``ns_to_us(ns).cast(pa.string())`` (``"-0.005"``, ``"12.000"``); a null value gives
    a null whole part.
    """
    if isinstance(ns, np.ndarray):
        values, mask = ns.astype(np.int64, copy=False), None
    else:
        arr = combined(ns).cast(pa.int64())
        values = columns.int64(arr, 0)
        mask = ~columns.numpy(arr.is_valid()) if arr.null_count else None
    whole, fraction = np.divmod(np.abs(values), NS_PER_US)
    return (values < 0).view(np.int8), pa.array(whole, pa.int64(), mask=mask).cast(pa.string()), fraction


def us_text(ns: ArrayOrChunked | np.ndarray) -> pa.Array:
    """Integer nanoseconds -> exact microsecond text with three decimals (``"1234.567"``).

    Used where a number is written as text; nulls stay null.
    """
    sign, whole, fraction = us_pieces(ns)
    return pc.binary_join_element_wise(
        pa.array(US_SIGNS).take(pa.array(sign)), whole, pa.array(US_FRACTIONS).take(pa.array(fraction)), ""
    )


def ns_to_s(ns: np.ndarray) -> np.ndarray:
    """Nanoseconds -> seconds as float64 (for rates such as FLOP/s, computed by analyses)."""
    return np.asarray(ns) * 1e-9


def is_whole_us(ns: np.ndarray) -> bool:
    """Whether every nanosecond value is a whole number of microseconds."""
    return bool((np.asarray(ns) % NS_PER_US == 0).all())


def bytes_to_mb(nbytes: ArrayOrChunked) -> pa.Array:
    """Bytes -> binary megabytes (MiB, what Ascend's ``(MB)`` columns hold) as float64."""
    return pc.divide(combined(nbytes).cast(pa.float64()), float(BYTES_PER_MB))


def ns_to_ms(ns: float) -> float:
    """One duration in nanoseconds -> milliseconds as a float (``communication.json``'s ``(ms)``)."""
    return ns / NS_PER_MS


def bytes_to_decimal_mb(nbytes: float) -> float:
    """One size in bytes -> decimal megabytes (10**6 bytes), as HCCL's ``communication.json`` counts."""
    return nbytes / BYTES_PER_DECIMAL_MB


def bytes_to_kb(nbytes: ArrayOrChunked) -> pa.Array:
    """Bytes -> binary kilobytes (KiB, what Ascend's ``Size(KB)`` holds) as float64."""
    return pc.divide(combined(nbytes).cast(pa.float64()), float(BYTES_PER_KB))


def round3(values: ArrayOrChunked) -> pa.Array:
    """A value already in its output unit (a percentage) -> exactly three decimals."""
    return _rounded_thousandths(values, 1000.0)


def ratio_to_pct(ratio: ArrayOrChunked) -> pa.Array:
    """A 0..1 share -> percent with exactly three decimals, as Ascend's ``Ratio(%)``."""
    return _rounded_thousandths(ratio, 100_000.0)


_BINARY_SIZES = (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10))
_FLOP_SIZES = (("PFLOP", 1e15), ("TFLOP", 1e12), ("GFLOP", 1e9), ("MFLOP", 1e6))


def ms_text(ns: float | None) -> str:
    """One duration for a printed summary: milliseconds with three decimals ('-' if unknown)."""
    return "-" if ns is None else f"{ns_to_ms(ns):,.3f}"


def bytes_text(value: int | None) -> str:
    """One size for a printed summary, in the largest binary unit that keeps it >= 1."""
    if value is None:
        return "-"
    for unit, size in _BINARY_SIZES:
        if abs(value) >= size:
            return f"{value / size:,.2f} {unit}"
    return f"{value} B"


def flop_text(value: float) -> str:
    """A FLOP count for a printed summary, in the largest decimal unit that keeps it >= 1."""
    for unit, size in _FLOP_SIZES:
        if value >= size:
            return f"{value / size:,.3f} {unit}"
    return f"{value:,.0f} FLOP"
