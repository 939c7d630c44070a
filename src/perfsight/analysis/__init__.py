"""Analyses: pure, vectorised functions from a :class:`perfsight.model.Trace` to Arrow tables.

One module per analysis; the tables they return are specified in ``docs/ANALYSIS_CONTRACT.md``.
Interval arithmetic lives in :mod:`perfsight.analysis.intervals` and nowhere else.  This package
must not read files, touch the environment or keep state between calls.
"""
