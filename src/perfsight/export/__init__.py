"""Outputs: the files a run leaves for people and other tools, written from the model and analyses.

* ``mindspore_csv`` — ``kernel_details.csv``, ``op_statistic.csv``, ``step_trace_time.csv``,
  ``memory_record.csv``, ``operator_memory.csv`` with MindSpore/Ascend headers and units;
* ``trace_view`` — ``trace_view.json``, a Chrome trace-event timeline for Perfetto and
  chrome://tracing, with the "Overlap Analysis" lanes;
* ``sqlite_db`` — ``perfsight_{rank}.db``, every table queryable from any SQLite client;
* ``units`` and ``text`` — the only places where ns/bytes become µs/MB/KB and where columns
  become text.

Every column and unit is documented in ``docs/OUTPUTS.md``.  Export presents results; it must not
compute analyses (callers pass the tables from ``perfsight.analysis``), must not loop over rows in
Python, and must not write anywhere but the folder or path it is given.
"""
