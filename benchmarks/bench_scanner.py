"""Time the native event scanner alone: this tree's ``_eventscan.c`` against another revision's.

Why this exists: a change to the scanner moves the whole analysis by a few per cent, below what
``bench_before_after.py`` can show on a shared machine whose speed wanders by a third within an
hour; the scanner alone, over the same decompressed bytes in one process, alternating between
the two builds, shows it.  Each round runs ``Scanner.run`` over the whole event array of each
trace (the rows converted into the scanner's buffers, not copied out) with one build, then the
other; the table gives each build's least and median time and the ratio of the medians.

The other revision's source is compiled here, stamped with this tree's source hash so that the
loader takes it: that is sound only while the two agree on the library's interface (the ctypes
structures of ``eventscan.py``), which this script does not check.  Nothing is installed.

Usage::

    python benchmarks/bench_scanner.py --before REV [--trace T ...] [--rounds 8]
"""

from __future__ import annotations

import argparse
import gzip
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from perfsight.ingest import _build_native, eventscan  # noqa: E402
from perfsight.ingest.chrome_events import FIELDS, KEPT_PHASES  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_vs_hta import DEFAULT_TRACES, machine_description  # noqa: E402


def _build(source: Path, folder: Path) -> Path:
    """``source`` compiled into ``folder`` as the loader expects it (this tree's hash); the folder."""
    folder.mkdir(parents=True)
    command = _build_native.compiler()
    if command is None:
        raise SystemExit("no C compiler")
    stamp = _build_native.source_hash(_build_native.SOURCE)
    target = folder / _build_native.LIBRARY.name
    subprocess.run(
        [*command, *_build_native.FLAGS, f'-DES_SOURCE_HASH="{stamp}"', "-o", str(target), str(source)],
        check=True,
    )
    return folder


def _events(trace: Path) -> tuple[eventscan.Window, int]:
    """The decompressed trace in a scanner window, and where its event array starts."""
    data = gzip.decompress(trace.read_bytes()) if trace.suffix == ".gz" else trace.read_bytes()
    start = data.index(b"[", data.index(b'"traceEvents"')) + 1
    return eventscan.Window(data), start


def _scan_once(window: eventscan.Window, start: int) -> float:
    scanner = eventscan.Scanner(FIELDS, KEPT_PHASES)
    began, pos = time.perf_counter(), start
    while True:
        scan = scanner.run(window, pos)
        scanner.make_room()
        pos = scan.pos
        if scan.status != eventscan.FULL:
            return time.perf_counter() - began


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--before", required=True, help="git revision whose _eventscan.c to compare with")
    parser.add_argument("--trace", type=Path, action="append", help="trace (repeatable; default: two)")
    parser.add_argument("--rounds", type=int, default=8)
    args = parser.parse_args(argv)
    traces = [path.resolve() for path in (args.trace or DEFAULT_TRACES)]
    with tempfile.TemporaryDirectory(prefix="bench-scanner-") as tmp:
        old_source = Path(tmp) / "before.c"
        old_source.write_bytes(
            subprocess.run(
                ["git", "-C", str(ROOT), "show", f"{args.before}:src/perfsight/ingest/_eventscan.c"],
                check=True,
                capture_output=True,
            ).stdout
        )
        builds = {
            "before": _build(old_source, Path(tmp) / "before"),
            "after": _build(_build_native.SOURCE, Path(tmp) / "after"),
        }
        inputs = {trace: _events(trace) for trace in traces}
        times: dict[tuple[str, Path], list[float]] = {}
        for _ in range(args.rounds):
            for side, folder in builds.items():
                if not eventscan.use_library(folder):
                    raise SystemExit(f"the {side} build did not load")
                for trace, (window, start) in inputs.items():
                    times.setdefault((side, trace), []).append(_scan_once(window, start))
        eventscan.use_library(Path(eventscan.__file__).parent)
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"Command: `python benchmarks/bench_scanner.py --before {args.before} --rounds {args.rounds}`")
    print(f"Machine: {machine_description()}")
    print("\n| trace | JSON MB | before: least / median s | after: least / median s | after / before |")
    print("|---|---:|---:|---:|---:|")
    for trace, (window, _) in inputs.items():
        before, after = times[("before", trace)], times[("after", trace)]
        b, a = statistics.median(before), statistics.median(after)
        print(
            f"| `{trace.name}` | {window.length / 1e6:.1f} | {min(before):.3f} / {b:.3f}"
            f" | {min(after):.3f} / {a:.3f} | {a / b:.2f} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
