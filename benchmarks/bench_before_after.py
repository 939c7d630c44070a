"""Measure one change: perfsight at a git revision ("before") and this work tree ("after"), side by side.

Why this exists: the machine is shared and noisy, so a change's effect on speed or memory shows only
when both versions run in the same loop, alternating, each in a fresh process -- and it is the
ratio that is reported.  Each run is ``bench_vs_hta.py``'s perfsight child (imports excluded, the
full analysis with every output written; wall time, CPU time of all threads, peak RSS), with
``PYTHONPATH`` pointing at one version's ``src/``.  The "before" version is checked out into a
temporary git worktree and its native event scanner built there; both are removed afterwards.

Usage::

    python benchmarks/bench_before_after.py --before HEAD~1 [--trace T ...] [--repeats 8]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_vs_hta import DEFAULT_TRACES, Runs, machine_description, measure_once  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
SIDES = ("before", "after")


def _checkout(revision: str, folder: Path) -> Path:
    """``revision``'s tree in ``folder`` (a detached worktree) with its scanner built; its src/."""
    subprocess.run(
        ["git", "-C", str(ROOT), "worktree", "add", "--detach", "--force", str(folder), revision],
        check=True,
        capture_output=True,
    )
    src = folder / "src"
    built = subprocess.run(
        [sys.executable, "-c", "from perfsight.ingest._build_native import build; print(build() or 'built')"],
        env={**os.environ, "PYTHONPATH": str(src)},
        capture_output=True,
        text=True,
        check=False,
    )
    if built.stdout.strip() != "built":
        raise SystemExit(f"the native scanner of {revision} did not build: {built.stdout}{built.stderr}")
    return src


def _row(trace: Path, runs: dict[str, Runs]) -> str:
    before, after = runs["before"], runs["after"]
    if not (before.ok and after.ok):
        errors = "; ".join(before.errors + after.errors)
        return f"| `{trace.name}` | failed: {errors} | | | | |"
    cells = [f"| `{trace.name}`"]
    for median in (Runs.median_wall_s, Runs.median_cpu_s):
        b, a = median(before), median(after)
        cells.append(f"{b:.3f} → {a:.3f} ({a / b - 1:+.0%})")
    b, a = before.median_rss_mb(), after.median_rss_mb()
    cells.append(f"{b:.0f} → {a:.0f} ({a - b:+.0f} MB)")
    cells.append(f"{min(after.peak_rss_mb):.0f}–{max(after.peak_rss_mb):.0f}")
    b, a = before.median_above_imports_mb(), after.median_above_imports_mb()
    cells.append(f"{b:.0f} → {a:.0f} ({a - b:+.0f} MB)")
    return " | ".join(cells) + " |"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--before", required=True, help="git revision to compare this work tree with")
    parser.add_argument(
        "--trace", type=Path, action="append", help="trace (repeatable; default: bench_vs_hta's two)"
    )
    parser.add_argument("--repeats", type=int, default=8)
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds allowed per run")
    args = parser.parse_args(argv)
    traces = [path.resolve() for path in (args.trace or DEFAULT_TRACES)]
    load = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="bench-before-") as tmp:
        tree = Path(tmp) / "tree"
        try:
            sources = {"before": _checkout(args.before, tree), "after": ROOT / "src"}
            rows = []
            for trace in traces:
                runs = {side: Runs() for side in SIDES}
                for repeat in range(args.repeats):
                    for side in SIDES if repeat % 2 == 0 else SIDES[::-1]:  # neither always goes first
                        progress = f"[{trace.name}] {side} run {repeat + 1}/{args.repeats}"
                        print(progress, file=sys.stderr, flush=True)
                        env = {**os.environ, "PYTHONPATH": str(sources[side])}
                        measure_once("perfsight", trace, Path(tmp), args.timeout, runs[side], env=env)
                rows.append(_row(trace, runs))
        finally:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(tree)], check=False)
    print(f"Command: `{' '.join([Path(sys.executable).name, *sys.argv])}`")
    end_load = os.getloadavg()[0]
    print(f"Machine: {machine_description()}; load average {load:.1f} → {end_load:.1f} (start → end)")
    print(
        f"Median of {args.repeats} alternating fresh-process runs per side; "
        f"before = {args.before}, after = this work tree.\n"
    )
    print("| trace | wall s | CPU s | peak RSS MB | after: RSS range | peak above imports MB |")
    print("|---|---|---|---|---|---|")
    print("\n".join(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
