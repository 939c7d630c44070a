"""Arrow's process-wide C++ allocator, chosen before pyarrow is first imported.

Why this exists: Arrow picks the allocator its C++ code uses by default (mimalloc in the wheels)
once, when pyarrow is imported, from ``ARROW_DEFAULT_MEMORY_POOL``.  ``perfsight.heap`` later
points pyarrow's *Python* default at the system allocator, but the C++ code that allocates for
itself (the Parquet writer's buffers, kernels' scratch space) keeps the pool chosen at import, and
mimalloc keeps what those free for reuse.  Measured on df_index_resolver's full analysis: peak RSS
178 -> 157 MB, 20 MB of it held by mimalloc after the cache's first Parquet write; nccl_data
46 -> 33 MB above the imports; same CPU (docs/BENCHMARKS.md).

Importing this module (the analysis API does, before pyarrow) sets the variable for the length
of pyarrow's import only, so the process's later child processes and the user's own settings are
untouched: a value the user set wins, and where pyarrow was imported already nothing changes
(the Python-level default set by ``perfsight.heap`` still applies).  The collector never imports
it: a training process keeps whatever allocator it had.  Standard library only until pyarrow.
"""

from __future__ import annotations

import os
import sys

ENV = "ARROW_DEFAULT_MEMORY_POOL"
POOL = "system"


def import_arrow_with_returning_pool() -> bool:
    """Import pyarrow with ``POOL`` as its C++ default allocator, if it is not imported yet and the
    user chose none; return whether this call chose it."""
    if "pyarrow" in sys.modules or os.environ.get(ENV):
        return False
    os.environ[ENV] = POOL
    try:
        import pyarrow  # noqa: F401 - the import reads the variable
    finally:
        del os.environ[ENV]
    return True


CHOSE_POOL = import_arrow_with_returning_pool()
"""Whether importing this module chose Arrow's allocator (False: pyarrow came first, or the user
set ``ARROW_DEFAULT_MEMORY_POOL``)."""
