"""The columnar store: each run's parsed trace and analysis tables as Parquet, read without re-parsing.

``cache`` saves and loads one rank's :class:`perfsight.model.Trace` and its analysis outputs and
tells whether a saved copy still matches its input files.  The web UI and the cluster analyses
read these folders (directly or with DuckDB over the Parquet files).  This package must not parse
raw traces or compute analyses.
"""

from perfsight.store.cache import (
    CacheError,
    is_fresh,
    load_tables,
    load_trace,
    save_tables,
    save_trace,
)

__all__ = ["CacheError", "is_fresh", "load_tables", "load_trace", "save_tables", "save_trace"]
