"""Names of what perfsight leaves on disk: the run folder the collector writes and the ingest
reads, and the cache folder the store writes and trace discovery must skip.

Why a leaf module: the writer and the reader of each folder sit in different layers (``collect``
and ``ingest``; ``store`` and ``ingest``), and neither may import the other.  Both name the files
from here, so a renamed file cannot leave one side behind.  The layout of a run folder is
described in :mod:`perfsight.collect.run_folder`, which writes it.

This module holds names only: it must not read, write or test paths.
"""

from __future__ import annotations

RUN_FOLDER_SUFFIX = "_perfsight"
METADATA_FILE = "profiler_metadata.json"
INCOMPLETE_MARKER = "WINDOW_INCOMPLETE"
OUTPUT_DIR = "PROFILER_OUTPUT"
CACHE_DIR = "cache"
FORMAT = "perfsight-run/1"

CACHE_META_FILE = "meta.json"
CACHE_SOURCE_FILE = "source.json"
CACHE_MARKERS = (CACHE_META_FILE, CACHE_SOURCE_FILE, "slices.parquet")
"""Files of which any one marks a folder as a perfsight cache, even a damaged one (meta.json lost):
trace discovery must not take its JSON files for traces, and loading it must say what is missing."""


def info_file(rank: int) -> str:
    return f"profiler_info_{rank}.json"


TRACE_PREFIX = "kineto_trace_"
"""Start of a rank's trace file name (a cut export leaves ``.kineto_trace_<rank>.json.tmp*``)."""


def trace_file(rank: int) -> str:
    return f"{TRACE_PREFIX}{rank}.json"


def sidecar_file(name: str, rank: int) -> str:
    return f"perfsight_{name}_{rank}.parquet"


CLUSTER_STEP_SPREAD_FILE = "cluster_step_spread.parquet"
"""Per step across a job's ranks: spread of step times, mean communication and wait
(``perfsight.cluster.totals.step_spread``), in ``cluster_analysis_output/``; read by the server."""
CLUSTER_COMMUNICATION_RANKS_FILE = "cluster_communication_ranks.parquet"
"""Per rank and step (and ``all``), its communication ops summed
(``perfsight.cluster.totals.communication_by_rank``), in ``cluster_analysis_output/``; read by the server."""
