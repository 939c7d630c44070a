"""Analyses: pure, vectorised functions from a :class:`perfsight.model.Trace` to Arrow tables.

One module per analysis; the tables they return are specified in ``docs/ANALYSIS_CONTRACT.md``.
Interval arithmetic lives in :mod:`perfsight.intervals` and nowhere else; what several
analyses derive from the same trace (NumPy columns, kind masks, parents, launch links, step
windows) is computed once and kept in :mod:`perfsight.analysis.index`.  This package must not
read files, touch the environment or keep state between calls, other than that index: derived
data keyed on a trace object, rebuilt when the trace's tables change and dropped with the trace.
"""
