"""Time ``perfsight compare`` on two analysed runs (the issue's target: two 1 GB traces' cached
analyses compared in <= 5 s), each repeat in a fresh interpreter so that nothing is warm but the
page cache.

Why a fresh process per repeat: a user runs ``perfsight compare`` once; the time that matters is
the command's (imports excluded, reported apart), reading each side's cached analysis tables,
aligning and writing ``compare/``.  Peak RSS is the child's ``ru_maxrss``.

Usage (the inputs are folders ``perfsight analyse`` wrote)::

    python benchmarks/gen_kineto_trace.py --out /tmp/base.json --size-mb 1024 --seed 0
    python benchmarks/gen_kineto_trace.py --out /tmp/new.json --size-mb 1024 --seed 1 --layers 9
    perfsight analyse /tmp/base.json --out /tmp/base_out && perfsight analyse /tmp/new.json --out /tmp/new_out
    python benchmarks/bench_compare.py /tmp/base_out /tmp/new_out [--repeats 5]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Sequence

CHILD = r"""
import json, resource, sys, time
t0 = time.perf_counter()
from perfsight.compare import compare
imported = time.perf_counter() - t0
t1 = time.perf_counter()
c = compare(sys.argv[1], sys.argv[2])
compared = time.perf_counter() - t1
t2 = time.perf_counter()
c.write(sys.argv[3])
written = time.perf_counter() - t2
print(json.dumps({
    "import_s": imported, "compare_s": compared, "write_s": written, "total_s": compared + written,
    "rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    "rows": {name: len(c.table(name)) for name in ("operators", "kernels_by_operator", "communication")},
    "steps": [len(c.base.steps_used), len(c.new.steps_used)],
}))
"""


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("base")
    parser.add_argument("new")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)
    runs = []
    with tempfile.TemporaryDirectory() as out:
        for _ in range(args.repeats):
            done = subprocess.run(
                [sys.executable, "-c", CHILD, args.base, args.new, out],
                capture_output=True,
                text=True,
                check=False,
            )
            if done.returncode:
                print(
                    done.stderr.strip().splitlines()[-1] if done.stderr.strip() else "failed", file=sys.stderr
                )
                return 1
            runs.append(json.loads(done.stdout.strip().splitlines()[-1]))
    for key in ("compare_s", "write_s", "total_s", "import_s", "rss_mb"):
        values = [r[key] for r in runs]
        median = statistics.median(values)
        print(f"{key:<10} median {median:8.3f}  min {min(values):8.3f}  max {max(values):8.3f}")
    print(f"rows {runs[0]['rows']}  steps averaged {runs[0]['steps']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
