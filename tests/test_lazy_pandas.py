"""A single-rank analysis keeps pandas and Acero (70 MB of resident memory) out of the process,
and pandas works as usual afterwards (``perfsight.ingest.lazy_pandas``, ``analysis.grouping``)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path


def test_a_full_analysis_never_loads_acero_or_pandas(df_trace_path: Path, tmp_path: Path) -> None:
    code = (
        "import sys, perfsight\n"
        f"perfsight.analyse({str(df_trace_path)!r}, out={str(tmp_path)!r})\n"
        "print(sorted(m for m in ('pandas', 'pyarrow.acero', 'pyarrow.dataset') if m in sys.modules))\n"
        "import pandas, pyarrow as pa\n"  # pandas still works afterwards, and pyarrow knows it
        "print(pa.array(pandas.Series(pandas.Categorical(['a', 'b', 'a']))).type)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=True
    )
    loaded, categorical = done.stdout.strip().splitlines()[-2:]
    assert loaded == "[]"
    assert categorical.startswith("dictionary<")
