"""A finished comparison: its tables, the ranked regressions, and the files and JSON it becomes.

Why apart from the tables: the ranking decides what a user reads first, and the CLI summary, the
JSON, the CSVs and the server all show that one ranking -- none of them re-sorts or re-judges.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pandas as pd

from perfsight.compare import tables
from perfsight.compare.align import MIN_RELATIVE, NOISE_SIGMAS
from perfsight.compare.inputs import Side, load_side
from perfsight.model import COMMUNICATION_HOST_OP_NAME

TABLES = ("step_breakdown", "regressions", "operators", "kernels_by_operator", "communication")
"""The tables of a comparison, in the order they are written and shown (one CSV each)."""
OUTPUT_DIR = "compare"
JSON_FILE = "compare.json"

RANKED_METRICS = (
    "iteration_interval_ns",
    "fp_bp_ns",
    "tail_ns",
    "computing_ns",
    "communication_not_overlapped_ns",
    "free_ns",
    "communication_ns",
    "data_wait_ns",
)
"""Step-breakdown rows that enter the ranked regressions (time per step; the step total is the
headline, not a cause)."""


@dataclasses.dataclass
class Comparison:
    """BASE against NEW: every table is NEW minus BASE, per step."""

    base: Side
    new: Side
    step_breakdown: pd.DataFrame
    operators: pd.DataFrame
    kernels_by_operator: pd.DataFrame
    communication: pd.DataFrame
    regressions: pd.DataFrame

    @property
    def notes(self) -> list[str]:
        return self.base.notes + self.new.notes

    def table(self, name: str) -> pd.DataFrame:
        if name not in TABLES:
            raise KeyError(f"no comparison table {name!r}; have {', '.join(TABLES)}")
        return getattr(self, name)

    def step_metric(self, metric: str) -> dict[str, Any] | None:
        rows = self.step_breakdown[self.step_breakdown["metric"] == metric]
        return records(rows)[0] if len(rows) else None

    def to_dict(self, limit: int | None = None) -> dict[str, Any]:
        """The document of ``compare.json`` (and ``--json``); ``limit``: rows per table (None: all)."""
        doc: dict[str, Any] = {
            "base": _side_dict(self.base),
            "new": _side_dict(self.new),
            "noise": {"sigmas": NOISE_SIGMAS, "min_relative": MIN_RELATIVE},
            "notes": self.notes,
            "counts": {
                name: _status_counts(self.table(name))
                for name in ("operators", "kernels_by_operator", "communication")
            },
        }
        for name in TABLES:
            frame = self.table(name)
            doc[name] = records(frame if limit is None else frame.head(limit))
            doc[f"{name}_rows"] = len(frame)
        return doc

    def write(self, out: str | Path) -> Path:
        """``{out}/compare/``: one CSV per table and ``compare.json``; returns that folder."""
        folder = Path(out) / OUTPUT_DIR
        folder.mkdir(parents=True, exist_ok=True)
        for name in TABLES:
            self.table(name).to_csv(folder / f"{name}.csv", index=False)
        (folder / JSON_FILE).write_bytes(orjson.dumps(self.to_dict(), option=orjson.OPT_INDENT_2))
        return folder


def compare_sides(base: Side, new: Side) -> Comparison:
    """Every table of BASE against NEW (pure: reads the sides' tables, writes nothing)."""
    steps = tables.step_breakdown(base, new)
    ops = tables.operators(base, new)
    kernels = tables.kernels_by_operator(base, new)
    comm = tables.communication(base, new)
    return Comparison(
        base=base,
        new=new,
        step_breakdown=steps,
        operators=ops,
        kernels_by_operator=kernels,
        communication=comm,
        regressions=rank_regressions(steps, ops, kernels, comm),
    )


def compare(base: str, new: str) -> Comparison:
    """``perfsight compare BASE NEW`` as a function: BASE and NEW are paths (``PATH:rankN`` for a rank)."""
    return compare_sides(load_side(base, "BASE"), load_side(new, "NEW"))


def _operator_category(names: pd.Series) -> pd.Series:
    """``communication`` for the host operators that run a collective or p2p op (their time is the
    communication as the host sees it: ``c10d::allreduce_`` grows when buckets shrink), else
    ``operator``."""
    is_comm = names.astype(str).str.contains(COMMUNICATION_HOST_OP_NAME, regex=True)
    return pd.Series(np.where(is_comm, "communication", "operator"), index=names.index)


def rank_regressions(
    steps: pd.DataFrame, ops: pd.DataFrame, kernels: pd.DataFrame, comm: pd.DataFrame
) -> pd.DataFrame:
    """Every per-step time difference of every table, largest increase first, with whether it is
    *real*: beyond noise, or structural (calls per step changed, or the row is only on one side --
    a count is never noise).  Columns: category, item, detail, status, base_ns, new_ns, delta_ns,
    delta_pct, beyond_noise, structural, real, table."""
    parts = []
    ranked = steps[steps["metric"].isin(RANKED_METRICS)]
    parts.append(
        pd.DataFrame(
            {
                "category": ranked["category"],
                "item": ranked["metric"],
                "detail": "",
                "status": ranked["status"],
                "base_ns": ranked["base"],
                "new_ns": ranked["new"],
                "beyond_noise": ranked["beyond_noise"],
                "structural": False,
                "table": "step_breakdown",
            }
        )
    )
    for frame, category, item, detail, calls, name in (
        (comm, "communication", comm["family"], _group_detail(comm["group"]), "calls", "communication"),
        (ops, _operator_category(ops["name"]), ops["name"], ops["input_dims"], "calls", "operators"),
        (kernels, "kernel", kernels["op"], kernels["new_kernel_names"], "kernels", "kernels_by_operator"),
    ):
        structural = (frame["status"].isin(["added", "removed"])) | (frame[f"delta_{calls}"].abs() > 1e-9)
        parts.append(
            pd.DataFrame(
                {
                    "category": category,
                    "item": item,
                    "detail": detail,
                    "status": frame["status"],
                    "base_ns": frame["base_time_ns"],
                    "new_ns": frame["new_time_ns"],
                    "beyond_noise": frame["beyond_noise"],
                    "structural": structural,
                    "table": name,
                }
            )
        )
    out = (
        pd.concat([p for p in parts if len(p)], ignore_index=True) if any(len(p) for p in parts) else parts[0]
    )
    out["delta_ns"] = out["new_ns"] - out["base_ns"]
    out["delta_pct"] = (100.0 * out["delta_ns"] / out["base_ns"]).where(out["base_ns"] != 0)
    out["beyond_noise"] = out["beyond_noise"].astype("boolean")
    out["structural"] = out["structural"].astype(bool)
    out["real"] = out["beyond_noise"].fillna(False).astype(bool) | out["structural"]
    out = out.sort_values("delta_ns", ascending=False, kind="stable").reset_index(drop=True)
    return out[
        [
            "category",
            "item",
            "detail",
            "status",
            "base_ns",
            "new_ns",
            "delta_ns",
            "delta_pct",
            "beyond_noise",
            "structural",
            "real",
            "table",
        ]
    ]


def _group_detail(groups: pd.Series) -> pd.Series:
    text = groups.astype(str)
    return ("group " + text).where(text != "", "")


def top_regressions(comparison: Comparison, limit: int = 10) -> pd.DataFrame:
    """The regressions a user should look at first: real, larger in NEW, largest first."""
    r = comparison.regressions
    return r[r["real"] & (r["delta_ns"] > 0)].head(limit)


def top_improvements(comparison: Comparison, limit: int = 5) -> pd.DataFrame:
    r = comparison.regressions
    return r[r["real"] & (r["delta_ns"] < 0)].sort_values("delta_ns", kind="stable").head(limit)


def _side_dict(side: Side) -> dict[str, Any]:
    return {
        "input": side.spec,
        "rank": side.rank,
        "ranks": len(side.ranks),
        "steps_used": side.steps_used,
        "steps_all": side.steps_all,
    }


def _status_counts(frame: pd.DataFrame) -> dict[str, int]:
    counts = frame["status"].value_counts()
    return {status: int(counts.get(status, 0)) for status in ("added", "removed", "changed", "same")}


def _clean(value: Any) -> Any:
    if value is pd.NA or value is None:
        return None
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if hasattr(value, "item"):
        return _clean(value.item())
    return value


def records(frame: pd.DataFrame) -> list[dict[str, Any]]:
    """Rows as JSON-ready dicts (NaN and NA as null)."""
    names = list(frame.columns)
    return [
        {name: _clean(value) for name, value in zip(names, row, strict=True)}
        for row in frame.itertuples(index=False, name=None)
    ]
