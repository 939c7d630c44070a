"""The cluster summary: what ``perfsight analyse JOB_DIR`` prints, as JSON-able values and text.

Slowest ranks, slowest links, communication share, pipeline balance, clock alignment and the
job's missing/duplicate ranks.  Values stay in ns and bytes in the JSON; only the text converts
(through ``perfsight.units``).  The numbers come from ``perfsight.cluster.job.ClusterResult``.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson

from perfsight import advisor
from perfsight.advisor.text import lead_lines
from perfsight.cluster import step_trace
from perfsight.cluster.discovery import rank_ranges
from perfsight.terminal import printable_line
from perfsight.units import bytes_text, ms_text

if TYPE_CHECKING:
    from perfsight.cluster.job import ClusterResult

TOP = 5
MAX_PROBLEM_LINES = 10


def _clean(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if hasattr(value, "item"):
        return _clean(value.item())
    return value


def _records(frame: Any, columns: list[str]) -> list[dict[str, Any]]:
    return [{k: _clean(v) for k, v in row.items()} for row in frame[columns].to_dict("records")]


def cluster_summary(result: ClusterResult) -> dict[str, Any]:
    """Everything a user reads first about a job (see the module docstring)."""
    job = result.job
    avgs = result.rank_averages
    step_ns = float(avgs["duration_ns"].median()) if not avgs.empty else 0.0
    comm_share = (
        float(avgs["communication_not_overlapped_ns"].sum() / avgs["duration_ns"].sum())
        if not avgs.empty and avgs["duration_ns"].sum()
        else 0.0
    )
    slow_table = result.slow_ranks.table.sort_values("lateness_ns", ascending=False)
    links = result.slow_links
    if not links.empty:  # slowest relative to links of the same type and size
        links = (
            links.assign(ratio=links["bandwidth"] / links["median"])
            .sort_values("ratio")
            .drop(columns="ratio")
        )
    unmatched = result.matched.unmatched_by_rank()
    instances = result.matched.instances
    return {
        "location": result.location,
        "ranks": len(job.ranks),
        "world_size": job.world_size,
        "hosts": len({h for h in job.hosts.values() if h}),
        "missing_ranks": job.missing,
        "duplicate_ranks": sorted(job.duplicates),
        "set_aside": [
            {"source": a.source, "rank": a.rank, "reasons": list(a.reasons)} for a in job.set_aside
        ],
        "problems": job.problems() + step_trace.source_notes(result.steps),
        "executor": result.executor,
        "clock_alignment": {
            "method": result.alignment.method,
            "max_residual_ns": max(result.alignment.residual_ns.values(), default=None),
        },
        "communication": {
            "instances": int(len(instances)),
            "complete_instances": int(instances["complete"].sum()) if len(instances) else 0,
            "unmatched_ops_by_rank": unmatched,
            "not_overlapped_share": comm_share,
        },
        "median_step_ns": int(step_ns),
        "slow_ranks": _records(result.slow_ranks.slow, _SLOW_COLUMNS),
        "slowest_ranks": _records(slow_table.head(TOP), _SLOW_COLUMNS),
        "slow_rank_threshold_ns": int(result.slow_ranks.threshold_ns),
        "slow_links": _records(links.loc[links["slow"]] if not links.empty else links, _LINK_COLUMNS),
        "slowest_links": _records(links.head(TOP), _LINK_COLUMNS),
        "pipeline": {k: _clean(v) if not isinstance(v, list) else v for k, v in result.pipeline.items()},
        "stages": {str(k): v for k, v in sorted(_stage_members(result).items())},
        "parallel": result.parallel.to_json(),
        "outputs": str(result.output_root / "cluster_analysis_output") if result.output_root else None,
        "per_rank_outputs": _per_rank_outputs(result),
        "findings": advisor.job_findings(result),
    }


_SLOW_COLUMNS = [
    "rank",
    "lateness_ns",
    "last_votes",
    "instances",
    "compute_ns",
    "magnitude_pct",
    "delay_pct",
    "slow",
]
_LINK_COLUMNS = [
    "src",
    "dst",
    "link_type",
    "size_bucket",
    "bytes",
    "transit_ns",
    "bandwidth",
    "median",
    "slow",
]


def _crowded_ranks(findings: list[dict[str, Any]]) -> set[int]:
    """Ranks on a host the advisor found oversubscribed: their timing measures the machine, so the
    slow-rank lines say so instead of blaming the rank (the finding itself leads the summary)."""
    return {r for f in findings if f.get("rule") == "oversubscribed_host" for r in f.get("ranks") or []}


def _stage_members(result: ClusterResult) -> dict[int, list[int]]:
    members: dict[int, list[int]] = {}
    for rank, stage in sorted(result.stage_of.items()):
        members.setdefault(stage, []).append(rank)
    return members


def write_json(path: Path, summary: dict[str, Any]) -> Path:
    path.write_bytes(orjson.dumps(summary, option=orjson.OPT_INDENT_2 | orjson.OPT_NON_STR_KEYS))
    return path


def format_text(summary: dict[str, Any]) -> str:
    """The cluster summary as the lines ``perfsight analyse`` prints."""
    lines = [
        f"== cluster: {summary['ranks']} of {summary['world_size']} ranks on "
        f"{summary['hosts'] or 'unknown'} host(s) (executor: {summary['executor']})"
    ]
    # the advisor's top findings lead, each with the ranks it was seen on
    lines += lead_lines(summary.get("findings", []), ranks_text=rank_ranges)
    problems = summary["problems"]
    lines += [f"  ! {p}" for p in problems[:MAX_PROBLEM_LINES]]
    if len(problems) > MAX_PROBLEM_LINES:
        lines.append(f"  ! ... and {len(problems) - MAX_PROBLEM_LINES} more problems (see --json)")
    align = summary["clock_alignment"]
    residual = align["max_residual_ns"]
    lines.append(
        f"clocks: {align['method']}"
        + (f", largest residual {ms_text(residual)} ms" if residual is not None else "")
    )
    comm = summary["communication"]
    unmatched = comm["unmatched_ops_by_rank"]
    lines.append(
        f"communication: {comm['complete_instances']} of {comm['instances']} op instances "
        "matched on every rank"
        + (f"; unmatched ops by rank: {unmatched}" if unmatched else "")
        + f"; not overlapped {comm['not_overlapped_share'] * 100:.1f}% of step time"
    )
    lines.append(f"median step: {ms_text(summary['median_step_ns'])} ms")
    lines += _parallel_lines(summary.get("parallel") or {})
    if summary["slow_ranks"]:
        crowded = _crowded_ranks(summary.get("findings", []))
        for row in summary["slow_ranks"][:TOP]:
            lines.append(
                f"slow rank {row['rank']}: arrives {ms_text(row['lateness_ns'])} ms after the median rank "
                f"({_pct(row['delay_pct'])} of a step), last at {row['last_votes']} of {row['instances']} "
                f"collectives; compute {_pct(row['magnitude_pct'], signed=True)} vs the other ranks' median"
                + (
                    " -- its host runs more ranks than cores, so this may be the machine, not the rank"
                    if row["rank"] in crowded
                    else ""
                )
            )
    else:
        lines.append("slow ranks: none (no rank arrives late beyond the threshold)")
    lines.append("slowest ranks (by lateness):")
    for row in summary["slowest_ranks"]:
        lines.append(
            f"  rank {row['rank']:<6} lateness {ms_text(row['lateness_ns']):>10} ms  "
            f"compute {ms_text(row['compute_ns']):>10} ms ({_pct(row['magnitude_pct'], signed=True)})"
        )
    if summary["slowest_links"]:
        lines.append("slowest links (by bandwidth):")
        for row in summary["slowest_links"]:
            flag = "  SLOW" if row["slow"] else ""
            lines.append(
                f"  {row['src']}->{row['dst']} {row['link_type']:<10} {bytes_text(int(row['bytes']))} "
                f"at {row['bandwidth'] / 1e9:.3f} GB/s (bucket median {row['median'] / 1e9:.3f}){flag}"
            )
    pipe = summary["pipeline"]
    if pipe.get("stages", 0) > 1:
        lines.append(
            f"pipeline: {pipe['stages']} stages ("
            + ", ".join(f"stage {s}: ranks {rank_ranges(r)}" for s, r in summary["stages"].items())
            + "), "
            f"compute spread {pipe['spread'] * 100:.1f}%"
            + (
                f" -> IMBALANCED (stage {pipe['slowest_stage']} is the heaviest)"
                if pipe["imbalanced"]
                else ""
            )
        )
        for row in pipe["per_stage"]:
            lines.append(
                f"  stage {row['stage']}: compute {ms_text(row['compute_ns'])} ms, bubble "
                f"{row['bubble_ratio'] * 100:.1f}%, receive {ms_text(row['receive_ns'])} ms"
            )
    if summary["outputs"]:
        lines.append(f"cluster outputs: {summary['outputs']}")
    if summary.get("per_rank_outputs"):
        lines.append(f"per-rank outputs: {summary['per_rank_outputs']}")
    return "\n".join(printable_line(line) for line in lines) + "\n"  # names are data (perfsight.terminal)


def _per_rank_outputs(result: ClusterResult) -> str | None:
    """Where each rank's own outputs are, or why there are none (too many ranks: see
    ``perfsight.cluster.job.PER_RANK_OUTPUTS_LIMIT``)."""
    from perfsight.cluster.job import PER_RANK_OUTPUTS_LIMIT

    if result.output_root is None:
        return None
    if result.per_rank_outputs:
        return str(result.output_root / "rank<N>")
    return (
        f"not written for {len(result.job.ranks)} ranks (more than {PER_RANK_OUTPUTS_LIMIT}); "
        "analyse one rank's input for its outputs, or pass --per-rank-outputs all"
    )


def _parallel_lines(layout: dict[str, Any]) -> list[str]:
    """One line per parallel mode: its groups and the first piece of evidence."""
    lines = []
    for mode in layout.get("modes", []):
        groups = layout["groups"].get(mode) or []
        why = (layout["evidence"].get(mode) or ["?"])[0]
        # a group as rank ranges: a 1024-rank data-parallel group stays short
        shown = " ".join(f"[{rank_ranges(g)}]" for g in groups[:8]) + (" ..." if len(groups) > 8 else "")
        lines.append(f"parallel: {mode} {shown} ({why})")
    lines += [f"  ! {p}" for p in layout.get("problems", [])]
    return lines


def _pct(value: float | None, signed: bool = False) -> str:
    if value is None:
        return "n/a"
    return f"{value:+.1f}%" if signed else f"{value:.1f}%"
