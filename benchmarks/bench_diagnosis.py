"""The diagnosis benchmark: run every scenario, analyse it, and compare the advisor's top finding
with the injected bottleneck.

Why: the advisor's acceptance is that its top finding names the right category and culprit in every
scenario of examples/scenarios/ and that the clean baseline gets nothing above "info".  This prints
one row per scenario (expected -> top finding) as a Markdown table, the one docs/DIAGNOSIS.md keeps.

    nice -n 10 python benchmarks/bench_diagnosis.py                 # every scenario
    python benchmarks/bench_diagnosis.py --only baseline straggler  # a subset
    python benchmarks/bench_diagnosis.py --reuse runs/scenarios     # analyse jobs already run

Scenarios that need root (the slow link: network namespaces and ``tc``) are skipped with a message
when the benchmark is not run as root.  Exit status 1 when a scenario's top finding is wrong.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "examples" / "scenarios"))
import scenarios  # noqa: E402


def top_finding(findings: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The first finding above "info" (the advisor sorts them most important first), else None."""
    return next((f for f in findings if f["severity"] != "info"), None)


def verdict(scenario: scenarios.Scenario, top: dict[str, Any] | None) -> bool:
    """Right category and culprit kind (and culprit name when the scenario names one); for the
    baseline, nothing above info."""
    if not scenario.category:
        return top is None
    if top is None:
        return False
    culprit = top["culprit"]
    return (
        top["category"] == scenario.category
        and culprit["kind"] == scenario.culprit_kind
        and (not scenario.culprit or str(culprit["name"]) == scenario.culprit)
    )


def diagnose(job: Path) -> list[dict[str, Any]]:
    """Analyse a scenario's job folder as ``perfsight analyse`` does and return its findings."""
    from perfsight.cluster.cli import run_job
    from perfsight.pipeline import Options

    return run_job(str(job), str(job / "perfsight_output"), Options(), "serial")["cluster"]["findings"]


def run_one(name: str, root: Path, reuse: bool) -> dict[str, Any]:
    scenario = scenarios.SCENARIOS[name]
    job = root / name
    started = time.perf_counter()
    if not (reuse and job.is_dir()):
        scenarios.run(name, job)
    ran = time.perf_counter() - started
    started = time.perf_counter()
    findings = diagnose(job)
    analysed = time.perf_counter() - started
    top = top_finding(findings)
    return {
        "scenario": scenario,
        "top": top,
        "ok": verdict(scenario, top),
        "run_s": ran,
        "analyse_s": analysed,
    }


def _expected(s: scenarios.Scenario) -> str:
    return f"{s.category} / {s.culprit_kind} {s.culprit}".strip() if s.category else "nothing above info"


def _found(top: dict[str, Any] | None) -> str:
    if top is None:
        return "nothing above info"
    c = top["culprit"]
    return (
        f"{top['category']} / {c['kind']} {c['name']} ({top['severity']}, confidence {top['confidence']:.2f})"
    )


def table(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| scenario | expected (category / culprit) | top finding | right | run (s) | analyse (s) |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['scenario'].name} | {_expected(r['scenario'])} | {_found(r['top'])} | "
            f"{'yes' if r['ok'] else 'NO'} | {r['run_s']:.1f} | {r['analyse_s']:.1f} |"
        )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="+", choices=list(scenarios.SCENARIOS), help="run these scenarios")
    parser.add_argument("--reuse", type=Path, help="folder of scenario jobs (run the missing ones there)")
    args = parser.parse_args(argv)
    names = args.only or list(scenarios.SCENARIOS)
    if os.geteuid() != 0:
        for name in [n for n in names if scenarios.SCENARIOS[n].needs_root]:
            print(f"{name}: skipped (needs root for network namespaces and tc)", flush=True)
        names = [n for n in names if not scenarios.SCENARIOS[n].needs_root]
    with tempfile.TemporaryDirectory(prefix="perfsight-scenarios-") as tmp:
        root = args.reuse or Path(tmp)
        rows = [run_one(name, root, reuse=args.reuse is not None) for name in names]
        for r in rows:
            print(
                f"{r['scenario'].name}: {r['top']['title'] if r['top'] else 'nothing above info'}", flush=True
            )
    print(f"\nmachine: {platform.machine()}, {platform.python_version()}, cores: {_cores()}\n")
    print(table(rows))
    right = sum(r["ok"] for r in rows)
    print(f"\n{right} of {len(rows)} scenarios diagnosed right")
    return 0 if right == len(rows) else 1


def _cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 0


if __name__ == "__main__":
    sys.exit(main())
