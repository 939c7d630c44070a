"""Run-vs-run comparison: two runs (or two ranks of one job) aligned table by table.

``compare(BASE, NEW)`` reads each side's single-rank analysis tables (from the cache of an
analysed folder, or analysed in memory), aligns them on their keys (metric, operator name and
input shapes, launching operator, communication family and group) and subtracts per-step means;
every difference carries a verdict against step-to-step noise.  See docs/COMPARE.md.

This package sits at the cluster layer: it reads what the single-rank layers computed and must not
recompute a step phase, an operator time or a communication split.
"""

from perfsight.compare.inputs import CompareInputError, Side, load_side
from perfsight.compare.result import Comparison, compare, compare_sides, top_improvements, top_regressions

__all__ = [
    "CompareInputError",
    "Comparison",
    "Side",
    "compare",
    "compare_sides",
    "load_side",
    "top_improvements",
    "top_regressions",
]
