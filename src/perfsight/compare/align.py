"""Align two runs' per-step rows on a key, subtract them, and judge each difference against noise.

Why one module: every table of a comparison (step breakdown, operators, kernels, communication)
is the same operation on different keys -- per-step sums of each side become a per-step mean and
a step-to-step variance, the two sides are joined on the key (rows on one side only are *added*
or *removed*), and a difference counts as real only when it is larger than the runs' own spread.

The noise rule (docs/COMPARE.md): with ``n`` steps on each side, the standard error of the
difference of two means is ``sqrt(var_base / n_base + var_new / n_new)``; a difference is
*beyond noise* when it exceeds :data:`NOISE_SIGMAS` standard errors and :data:`MIN_RELATIVE`
of the larger mean (a 1 ns change of a step-stable counter is not a finding).  With fewer than two
steps on a side the spread is unknown, and so is the verdict (``None``), never a guess.

This module must not know what a column means: callers name the keys and the value columns.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

NOISE_SIGMAS = 2.0
"""Standard errors a difference must exceed to be reported as beyond step-to-step noise."""
MIN_RELATIVE = 0.01
"""...and this fraction of the larger of the two means."""

STATUSES = ("added", "removed", "changed", "same")


def per_step_stats(per_step: pd.DataFrame, keys: list[str], values: list[str], steps: int) -> pd.DataFrame:
    """Per key: mean over ``steps`` steps and variance between steps of each value column.

    ``per_step`` holds one row per key and step (the step's sum); a step without a row for a key
    counts as 0 for it (an op that ran in two of three steps averages 2/3 of a call).
    Columns out: the keys, then ``{v}_mean``, ``{v}_var`` (NaN below two steps), ``{v}_total``.
    """
    if per_step.empty:
        stats = [f"{v}_{s}" for v in values for s in ("mean", "var", "total")]
        return pd.DataFrame({c: pd.Series(dtype=object if c in keys else "float64") for c in keys + stats})
    frame = per_step[keys + values].copy()
    for v in values:
        frame[f"{v}__sq"] = frame[v].astype("float64") ** 2
    grouped = frame.groupby(keys, dropna=False, sort=False)
    sums = grouped[values].sum()
    squares = grouped[[f"{v}__sq" for v in values]].sum()
    out = pd.DataFrame(index=sums.index)
    for v in values:
        total = sums[v].astype("float64")
        out[f"{v}_mean"] = total / steps
        if steps > 1:
            spread = (squares[f"{v}__sq"] - total**2 / steps).clip(lower=0) / (steps - 1)
        else:
            spread = pd.Series(np.nan, index=sums.index)
        out[f"{v}_var"] = spread
        out[f"{v}_total"] = total
    return out.reset_index()


def beyond_noise(
    delta: np.ndarray, var_base: np.ndarray, n_base: int, var_new: np.ndarray, n_new: int, scale: np.ndarray
) -> pd.Series:
    """True / False / None (unknown: a side with fewer than two steps) per difference."""
    error = np.sqrt(np.asarray(var_base, float) / n_base + np.asarray(var_new, float) / n_new)
    delta = np.abs(np.asarray(delta, float))
    threshold = np.maximum(NOISE_SIGMAS * error, MIN_RELATIVE * np.asarray(scale, float))
    verdict = pd.Series(delta > threshold, dtype="boolean")
    verdict[np.isnan(error)] = pd.NA
    return verdict


def align(
    base: pd.DataFrame,
    new: pd.DataFrame,
    keys: list[str],
    values: list[str],
    judged: str,
    steps: tuple[int, int],
    count: str | None = None,
) -> pd.DataFrame:
    """Join two :func:`per_step_stats` frames on ``keys`` and subtract them.

    Columns out: the keys, ``status``, per value ``base_{v}``, ``new_{v}`` (per-step means; 0 on
    the side without the row), ``delta_{v}``; for ``judged`` also ``base_{v}_std``, ``new_{v}_std``
    (step-to-step standard deviation), ``delta_pct`` and ``beyond_noise``; and ``base_{v}_total``,
    ``new_{v}_total`` (over the steps used).  ``count``: a value whose change alone makes a row
    *changed* (a different number of calls per step is never noise).
    """
    merged = base.merge(new, on=keys, how="outer", suffixes=("__b", "__n"), indicator=True)
    out = merged[keys].copy()
    for v in values:
        for side, suffix in (("base", "__b"), ("new", "__n")):
            out[f"{side}_{v}"] = merged[f"{v}_mean{suffix}"].fillna(0.0)
            out[f"{side}_{v}_total"] = merged[f"{v}_total{suffix}"].fillna(0.0)
        out[f"delta_{v}"] = out[f"new_{v}"] - out[f"base_{v}"]
    n_base, n_new = steps
    var_b = merged[f"{judged}_var__b"].fillna(0.0) if n_base > 1 else merged[f"{judged}_var__b"] * np.nan
    var_n = merged[f"{judged}_var__n"].fillna(0.0) if n_new > 1 else merged[f"{judged}_var__n"] * np.nan
    out[f"base_{judged}_std"] = np.sqrt(var_b)
    out[f"new_{judged}_std"] = np.sqrt(var_n)
    base_mean, new_mean = out[f"base_{judged}"], out[f"new_{judged}"]
    with np.errstate(divide="ignore", invalid="ignore"):
        out["delta_pct"] = np.where(base_mean != 0, 100.0 * out[f"delta_{judged}"] / base_mean, np.nan)
    out["beyond_noise"] = beyond_noise(
        out[f"delta_{judged}"].to_numpy(),
        var_b.to_numpy(),
        n_base,
        var_n.to_numpy(),
        n_new,
        np.maximum(base_mean.abs(), new_mean.abs()).to_numpy(),
    ).to_numpy()
    status = np.where(
        merged["_merge"] == "left_only",
        "removed",
        np.where(merged["_merge"] == "right_only", "added", "same"),
    )
    changed = out["beyond_noise"].fillna(False).to_numpy(bool).copy()
    if count is not None:
        changed |= out[f"delta_{count}"].abs().to_numpy() > 1e-9
    status = np.where((status == "same") & changed, "changed", status)
    out.insert(len(keys), "status", status)
    return out
