"""The advisor on real traces: its outputs, its texts, its measurement-error gate, its layering."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pandas as pd
import pytest

from perfsight.advisor.finding import CATEGORIES, CULPRIT_KINDS, SEVERITIES, confidence
from perfsight.advisor.job_rules import stage_imbalance
from perfsight.advisor.messages import LANGUAGES, MESSAGES
from perfsight.advisor.rules import RULES
from shared_data import REPO

SRC = REPO / "src" / "perfsight"


def test_every_message_has_a_title_and_a_suggestion_in_english_and_chinese() -> None:
    titles = [k for k in MESSAGES if not k.endswith(".fix")]
    assert titles
    for key in titles:
        for text_key in (key, key + ".fix"):
            assert set(LANGUAGES) <= set(MESSAGES[text_key]), text_key
            assert all(MESSAGES[text_key][lang].strip() for lang in LANGUAGES), text_key


def test_every_rule_names_a_known_category_and_where_its_evidence_is_shown() -> None:
    for rule in RULES.values():
        assert rule.category in CATEGORIES, rule.id
        assert rule.scope in ("rank", "job"), rule.id
        assert rule.sources, rule.id


def test_an_effect_within_its_measurement_error_has_no_confidence() -> None:
    assert confidence(1_000_000, 2_000_000) == 0.0  # smaller than the error: never a finding
    assert confidence(1_000_000, 1_000_000) == 0.0
    assert confidence(4_000_000, 1_000_000) == pytest.approx(0.75)
    assert confidence(0, 0) == 0.0


def _analyse(trace: Path, out: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "perfsight.cli",
            "analyse",
            str(trace),
            "--out",
            str(out),
            "--no-progress",
            *extra,
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_a_real_trace_gets_advisor_json_and_the_summary_leads_with_findings(
    nccl_trace_path: Path, tmp_path: Path
) -> None:
    text = _analyse(nccl_trace_path, tmp_path / "text")
    assert text.returncode == 0, text.stderr
    lines = text.stdout.splitlines()
    assert lines[0].startswith("== rank")
    assert lines[1].startswith(("top findings", "findings:")), lines[:3]  # findings come first

    advisor_files = list((tmp_path / "text").rglob("advisor.json"))
    assert len(advisor_files) == 1
    doc = json.loads(advisor_files[0].read_text(encoding="utf-8"))
    assert doc["scope"] == "rank"
    assert set(doc["rules"]) == {r.id for r in RULES.values() if r.scope == "rank"}
    assert doc["findings"], "a real training trace gets at least the informative delimiting"
    for finding in doc["findings"]:
        assert finding["category"] in CATEGORIES
        assert finding["severity"] in SEVERITIES
        assert finding["culprit"]["kind"] in CULPRIT_KINDS
        assert finding["evidence"] and all(e["source"] for e in finding["evidence"])
        assert 0.0 < finding["confidence"] <= 1.0
        assert finding["effect_ns"] >= finding["error_ns"] or finding["effect_ns"] == 0
        for lang in LANGUAGES:
            assert finding["texts"][lang]["title"] and finding["texts"][lang]["suggestion"]
            assert "{" not in finding["texts"][lang]["title"], "every placeholder is filled"

    as_json = _analyse(nccl_trace_path, tmp_path / "json", "--json")
    assert as_json.returncode == 0, as_json.stderr
    summary = json.loads(as_json.stdout)[0]
    assert [f["rule"] for f in summary["findings"]] == [f["rule"] for f in doc["findings"]]


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
            names.update(f"{node.module}.{a.name}" for a in node.names)
        elif isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
    return names


ALLOWED_IMPORTERS = (
    "summary.py",
    "cluster/summary.py",
    "cluster/job.py",
    "pipeline.py",
    "chunked_analysis.py",  # pipeline.py's chunk-by-chunk twin
    "chunked_timeline.py",  # its carries, among them the rank rules' extracts
    "export/chunked_outputs.py",  # the rank driver's writers fed chunk by chunk (advisor.json)
    "commands/",
    "server/",
)


def test_the_advisor_imports_only_downward_and_only_the_top_layers_import_it() -> None:
    for path in (SRC / "advisor").glob("*.py"):
        upward = {
            n
            for n in _imports(path)
            if n.startswith(("perfsight.server", "perfsight.commands", "perfsight.cli", "perfsight.summary"))
            or n in ("perfsight.cluster.summary", "perfsight.pipeline")
        }
        assert not upward, f"{path.name} imports {upward}"
    for path in SRC.rglob("*.py"):
        relative = path.relative_to(SRC).as_posix()
        if relative.startswith("advisor/") or relative.startswith(ALLOWED_IMPORTERS):
            continue
        assert not any(n.startswith("perfsight.advisor") for n in _imports(path)), relative


def _pipeline_job(compute_ms: dict[int, list[float]], flops: dict[int, float]) -> SimpleNamespace:
    """The tables a two-stage pipeline job gives the job rules: per-step compute per stage and
    per-stage FLOPs, as ``cluster.job`` writes them."""
    rows = [
        {"stage": stage, "step": step, "computing_ns": ms * 1e6, "averaged": True}
        for stage, per_step in compute_ms.items()
        for step, ms in enumerate(per_step)
    ]
    means = {stage: sum(v) / len(v) * 1e6 for stage, v in compute_ms.items()}
    heaviest = max(means, key=means.__getitem__)
    return SimpleNamespace(
        pipeline={
            "stages": len(compute_ms),
            "spread": (max(means.values()) - min(means.values())) / max(means.values()),
            "slowest_stage": heaviest,
            "per_stage": [
                {"stage": s, "compute_ns": means[s], "flops": flops[s], "bubble_ratio": 0.1}
                for s in compute_ms
            ],
        },
        stage_steps=pd.DataFrame(rows),
        stage_of={s: s for s in compute_ms},
    )


def test_an_overloaded_stage_is_named_when_its_flops_agree_even_if_a_busy_window_blurs_its_timing() -> None:
    # stage 1 holds 5x the FLOPs; on a loaded host its compute time is only 15% more, every step
    light, busy, even = [10.0, 11.0, 9.5, 10.5], [11.8, 12.5, 11.0, 12.4], [10.2, 10.9, 9.6, 10.4]
    blurred = _pipeline_job({0: light, 1: busy}, {0: 3e7, 1: 1.5e8})
    findings = stage_imbalance(blurred)
    assert [(f.culprit_kind, f.culprit, f.category) for f in findings] == [("stage", "1", "compute")]
    assert findings[0].confidence >= 0.5
    # the same timing with equal FLOPs is within what a shared machine does: nothing
    assert stage_imbalance(_pipeline_job({0: light, 1: busy}, {0: 3e7, 1: 3e7})) == []
    # and a stage with more FLOPs that is not the slower one is not blamed from FLOPs alone
    assert stage_imbalance(_pipeline_job({0: light, 1: even}, {0: 1.5e8, 1: 3e7})) == []


def test_a_host_running_more_ranks_than_cores_is_named_and_explains_its_slow_cards(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """make demo's 4-rank DDP job, analysed by the CLI: on a machine with fewer usable cores than
    ranks (CI has 2) the host is named, and no host finding of one of its ranks stays above info."""
    import os

    from _jobs import DDP_RANKS, demo_base

    base = demo_base(tmp_path_factory, tmp_path_factory.mktemp("oversubscribed") / "demo_output")
    doc = json.loads((base / "analysis" / "cluster_analysis_output" / "advisor.json").read_text())
    crowded = [f for f in doc["findings"] if f["rule"] == "oversubscribed_host"]
    if len(os.sched_getaffinity(0)) < DDP_RANKS:
        (finding,) = crowded
        assert finding["severity"] == "warning" and finding["culprit"]["kind"] == "host"
        assert finding["ranks"] == list(range(DDP_RANKS))
        others = [f for f in doc["findings"] if f["category"] == "host" and f is not finding]
        assert all(f["severity"] == "info" and f["explained_by"] == "oversubscribed_host" for f in others)
    else:
        assert crowded == []
    # the CLI summary's slow-rank lines say the same as the finding instead of blaming the rank
    from perfsight.cluster.summary import format_text

    summary = json.loads((base / "analysis" / "cluster_analysis_output" / "cluster_summary.json").read_text())
    slow_lines = [line for line in format_text(summary).splitlines() if line.startswith("slow rank ")]
    caveat = "its host runs more ranks than cores"
    assert all((caveat in line) == bool(crowded) for line in slow_lines)


@pytest.mark.parametrize(
    ("trace_file", "platform"),
    [
        ("kineto/df_index_resolver/df_index_resolver.json.gz", "cuda"),
        ("kineto/nccl_parser_config/nccl_data.json.gz", "cuda"),
        ("kineto/ns_resolution_trace/rank-0.Apr_03_18_51_38.1102.pt.trace.json.gz", None),
        ("ascend_pt/level1/rank1_ascend_pt/ASCEND_PROFILER_OUTPUT/trace_view.json", "ascend"),
    ],
    ids=["df_index_resolver", "nccl_data", "ns_resolution", "ascend_level1"],
)
def test_a_device_idle_waiting_for_the_host_is_the_top_finding_only_where_it_is(
    trace_file: str, platform: str | None
) -> None:
    """df_index_resolver and nccl_data idle 41 % and 74 % of the step, mostly before the host issued
    the next kernel (launch-bound: thousands of kernels of a few µs); so does the Ascend level1
    rank, 79 % of its free time in 90 gaps between 715 tasks of 3.6 µs (msprof-analyze reports the
    same free time and no cause); ns_resolution's device runs behind its host (its idle time comes
    after the launch calls), so no host wait is found there."""
    from conftest import read_real
    from perfsight import advisor, pipeline
    from shared_data import DATA

    trace = read_real(DATA / trace_file)
    result = pipeline.analyse_trace(trace, pipeline.Options())
    findings = advisor.rank_findings(result.tables, trace)  # advisor.json's, most important first
    waits = [f for f in findings if f["rule"] == "host_wait"]
    if platform is None:
        assert waits == []
        return
    assert findings[0]["rule"] == "host_wait", [f["rule"] for f in findings]
    (finding,) = waits
    assert finding["category"] == "scheduling" and finding["severity"] in ("warning", "critical")
    assert finding["message_key"] == "scheduling.launch_bound"
    assert finding["title"].startswith("launch-bound: the device waits for the host")
    idle = result.tables["device_idle"].to_pandas()
    share_of_free = idle.host_wait_ns.sum() / idle.free_ns.sum()
    shown = next(e["value"] for e in finding["evidence"] if e["metric"] == "share of the device's free time")
    assert shown == pytest.approx(share_of_free, abs=0.1)  # the median step's, near the whole run's
    # the remedy fits the platform: CUDA graphs, or torch_npu's dispatch pipeline
    assert ("TASK_QUEUE_ENABLE" in finding["suggestion"]) == (platform == "ascend")
    assert ("CUDA graph" in finding["suggestion"]) == (platform == "cuda")
    if platform == "cuda":  # Kineto links kernels to their operators: the one waited on most is named
        assert "aten::" in finding["params"]["op_note"]
