"""HTA's ``TraceDiff`` on two trace folders, timed: the peer that ``perfsight compare`` is measured
against (docs/BENCHMARKS.md, "Run-vs-run comparison").  Runs in HTA's own virtual environment,
never in perfsight's (``python -m venv /tmp/hta-venv && /tmp/hta-venv/bin/pip install
holistictraceanalysis==0.5.0``)::

    /tmp/hta-venv/bin/python benchmarks/hta_trace_diff.py BASE_DIR NEW_DIR BASE_RANK NEW_RANK OUT.csv

Prints one JSON line (import, parse and compare seconds, rows, peak RSS) and writes HTA's diff
table (index: op or kernel name) to OUT.csv, every iteration of each trace compared.
"""

import json
import resource
import sys
import time

started = time.perf_counter()
from hta.trace_diff import LabeledTrace, TraceDiff  # noqa: E402

imported = time.perf_counter() - started
started = time.perf_counter()
control = LabeledTrace(label="base", trace_dir=sys.argv[1])
test = LabeledTrace(label="new", trace_dir=sys.argv[2])
parsed = time.perf_counter() - started
started = time.perf_counter()
diff = TraceDiff.compare_traces(
    control,
    test,
    control_rank=int(sys.argv[3]),
    test_rank=int(sys.argv[4]),
    control_iteration=control.iterations(),
    test_iteration=test.iterations(),
)
compared = time.perf_counter() - started
print(
    json.dumps(
        {
            "import_s": imported,
            "parse_s": parsed,
            "compare_s": compared,
            "rows": len(diff),
            "rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        }
    )
)
diff.to_csv(sys.argv[5])
