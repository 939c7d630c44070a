"""The advisor's rules as data: what each looks at, its thresholds, and where a user sees the numbers.

Each rule is one row: an id, the category it diagnoses, the scope it runs on (one rank's analysis
tables or the job's cluster result), its thresholds, and the output files / UI pages that show its
evidence.  The functions in the ``rank_rules`` and ``job_rules`` packages read their thresholds from
here, so a threshold is changed in one place and ``advisor.json`` lists what every rule was held
against.

The method is the tuning guide's (seed 004): find which step-trace phase dominates (iteration gap
-> data or host work before the step; forward+backward -> operators, casts, host syncs; tail ->
exposed gradient communication), then across ranks the slow card (a phase that stands out on one
rank), slow link, pipeline stage imbalance (compute and FLOPs per stage) and exposed communication;
and seed 003's delimiting (compute-, scheduling- or communication-bound from the shares of
computing, free time and uncovered communication).
"""

from __future__ import annotations

import dataclasses
from typing import Any


@dataclasses.dataclass(frozen=True)
class Rule:
    """One diagnosis rule (see the module docstring)."""

    id: str
    category: str
    scope: str  # "rank" or "job"
    thresholds: dict[str, float]
    sources: tuple[str, ...]
    doc: str

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


STEP_TRACE_CSV = "PROFILER_OUTPUT/step_trace_time.csv"
OP_STATISTIC_CSV = "PROFILER_OUTPUT/op_statistic.csv"
OPERATOR_MEMORY_CSV = "PROFILER_OUTPUT/operator_memory.csv"
DEVICE_IDLE_TABLE = "cache/analysis/device_idle.parquet"
CLUSTER_STEP_TRACE_CSV = "cluster_analysis_output/cluster_step_trace_time.csv"
CLUSTER_OPS_CSV = "cluster_analysis_output/cluster_communication_ops.csv"
CLUSTER_RESOURCES_CSV = "cluster_analysis_output/cluster_resources.csv"
SLOW_RANK_CSV = "cluster_analysis_output/slow_rank.csv"
SLOW_LINK_CSV = "cluster_analysis_output/slow_link.csv"
CLOCK_ALIGNMENT_CSV = "cluster_analysis_output/clock_alignment.csv"

RULES: dict[str, Rule] = {
    r.id: r
    for r in (
        Rule(
            "data_wait",
            "data",
            "rank",
            {
                "min_share": 0.10,
                "min_gap_ns": 1_000_000,
                "loader_cover": 0.5,
                "warning": 0.10,
                "critical": 0.30,
            },
            (STEP_TRACE_CSV, "step trace page", "data preparation page"),
            "Iteration gap (step start to the first forward op) above min_share of the step and the "
            "seed's 1 ms: data loading when DataLoader ranges cover loader_cover of it, else host work.",
        ),
        Rule(
            "dtype_casts",
            "compute",
            "rank",
            {"min_share": 0.05, "warning": 0.05, "critical": 0.25},
            (OP_STATISTIC_CSV, "operator page"),
            "Dtype conversions (aten::_to_copy) take more than min_share of the computing time.",
        ),
        Rule(
            "host_syncs",
            "scheduling",
            "rank",
            {"min_per_step": 32, "warning_per_step": 32, "critical_share": 0.25},
            (OP_STATISTIC_CSV, "operator page", "timeline"),
            "Host-device synchronisations (.item(), .cpu(), cudaStreamSynchronize) at least "
            "min_per_step times a step: each one stops the host until the device is idle.",
        ),
        Rule(
            "host_wait",
            "scheduling",
            "rank",
            {
                "min_share": 0.10,
                "warning": 0.10,
                "critical": 0.25,
                "short_work_ns": 50_000,
                "stall_share": 0.5,
            },
            (STEP_TRACE_CSV, DEVICE_IDLE_TABLE, "timeline"),
            "From the forward start on, the device idles waiting for the host to issue its next work "
            "(free time before the launch call of the work that ends it) for at least min_share of "
            "the step: launch-bound when the median device work item is shorter than short_work_ns "
            "and no single wait reaches stall_share of it (many small kernels issued one at a "
            "time), else host-bound (host work between launches).",
        ),
        Rule(
            "memory_churn",
            "memory",
            "rank",
            {"min_churn": 8.0, "min_bytes_per_step": 256 * 2**20, "warning": 0.05, "critical": 0.25},
            (OPERATOR_MEMORY_CSV, "memory page"),
            "Bytes allocated per step above min_churn times the peak and min_bytes_per_step: the "
            "allocator is churning large blocks (near a cap it also fragments and retries).",
        ),
        Rule(
            "memory_capacity",
            "memory",
            "rank",
            {"min_peak_share": 0.90},
            ("PROFILER_OUTPUT/memory_record.csv", "memory page"),
            "Peak reserved memory above min_peak_share of the device's capacity.",
        ),
        Rule(
            "exposed_communication",
            "communication",
            "rank",
            {"min_share": 0.10},
            (STEP_TRACE_CSV, "overlap analysis"),
            "Communication not overlapped by computation above min_share of the step (informative: "
            "the job rule names the cause).",
        ),
        Rule(
            "top_operator",
            "compute",
            "rank",
            {"min_share": 0.5},
            (OP_STATISTIC_CSV, "operator page"),
            "Forward+backward dominates the step: where its time goes (informative).",
        ),
        Rule(
            "bound",
            "compute",
            "rank",
            {},
            (STEP_TRACE_CSV, "overview"),
            "Seed 003's delimiting: the largest of computing, free (scheduling) and uncovered "
            "communication shares (informative).",
        ),
        Rule(
            "slow_rank",
            "compute",
            "job",
            {"min_share": 0.05, "warning": 0.05, "critical": 0.25, "same_flops": 0.05, "host_wait_part": 0.5},
            (CLUSTER_STEP_TRACE_CSV, SLOW_RANK_CSV, CLOCK_ALIGNMENT_CSV, "cluster step trace page"),
            "A rank whose iteration gap, computing or free time per step exceeds the median of the "
            "other ranks of its stage by min_share of the median step and by the step-to-step noise; "
            "the category follows the phase (data / compute / host); computing time over the same "
            "FLOPs (within same_flops) is the card or host (host, one severity lower: the machine, "
            "not the program).  Free time whose excess is at least host_wait_part waiting for the "
            "host to launch work (device_idle's host wait) is the rank's host launching slower; at least "
            "host_wait_part idle after the launch (device_idle's after_launch) is its card starting "
            "launched work later.  "
            "Lateness at collectives is shown only when it exceeds the clock-alignment residual.",
        ),
        Rule(
            "waited_for",
            "scheduling",
            "job",
            {"min_share": 0.05, "warning": 0.05, "critical": 0.25, "min_ranks": 3},
            (CLUSTER_OPS_CSV, CLOCK_ALIGNMENT_CSV, "communication page"),
            "A rank the others wait for at collectives: the wait the matched ops attribute to it as "
            "their last arrival, per step, above min_share of the median step and beyond the clock "
            "residual plus the step-to-step noise (made only when no slow-rank finding names it; info "
            "in a job of fewer than min_ranks ranks, where one rank is always last).",
        ),
        Rule(
            "stage_imbalance",
            "compute",
            "job",
            {"spread": 0.2, "critical_spread": 0.5, "same_flops": 0.05},
            (CLUSTER_STEP_TRACE_CSV, CLUSTER_RESOURCES_CSV, "cluster step trace page"),
            "Pipeline stages' compute spread (max - min) / max at least spread: the heaviest stage "
            "is the one the others wait for (their bubble and receive time grow).  A stage that has "
            "both the most compute time and the most FLOPs by at least spread is reported even "
            "when one window's timing spread is less (FLOPs are counted, not timed).  When its FLOPs "
            "equal the others' (within same_flops) it is that stage's card or host, not the partition "
            "(category host, one severity lower).",
        ),
        Rule(
            "small_collectives",
            "communication",
            "job",
            {
                "min_share": 0.10,
                "min_per_step": 8,
                "max_median_bytes": 2**20,
                "warning": 0.10,
                "critical": 0.30,
            },
            (CLUSTER_OPS_CSV, CLUSTER_STEP_TRACE_CSV, "communication page"),
            "Exposed communication above min_share of the step made of at least min_per_step "
            "collectives a step of at most max_median_bytes each: DDP buckets too small to overlap.",
        ),
        Rule(
            "exposed_communication_job",
            "communication",
            "job",
            {"min_share": 0.10, "wait_dominant": 0.5},
            (CLUSTER_STEP_TRACE_CSV, CLUSTER_OPS_CSV, "cluster step trace page"),
            "Communication not overlapped (receives excluded in a pipeline) above min_share of the "
            "step, with its wait vs transit split (informative unless no other finding explains it).",
        ),
        Rule(
            "slow_link",
            "communication",
            "job",
            {},
            (SLOW_LINK_CSV, "communication matrix page"),
            "A link whose bandwidth is an outlier among links of its type and size (slow_link.csv).",
        ),
        Rule(
            "unaligned_collectives",
            "communication",
            "job",
            {"alignment": 512},
            (CLUSTER_OPS_CSV, "communication page"),
            "Collectives whose size is not a multiple of alignment bytes (msprof-analyze's byte "
            "alignment check; informative, the cost is not measured).",
        ),
        Rule(
            "memory_capacity_job",
            "memory",
            "job",
            {"min_peak_share": 0.90},
            (CLUSTER_RESOURCES_CSV, "cluster resources page"),
            "A rank whose peak allocated memory is above min_peak_share of its device's capacity.",
        ),
        Rule(
            "oversubscribed_host",
            "host",
            "job",
            {"ranks_per_core": 1.0},
            ("profiler_info_{rank}.json of each rank's run folder (host, host_cpus)", "job overview"),
            "A host running more ranks than ranks_per_core times the CPU cores each rank may use "
            "(its affinity, recorded by the collector): the ranks take turns on the cores, so "
            "findings of category host on that host's ranks are explained by it.",
        ),
        Rule(
            "bound_job",
            "compute",
            "job",
            {},
            (CLUSTER_STEP_TRACE_CSV, "cluster overview"),
            "Seed 003's delimiting over the ranks (informative).",
        ),
    )
}


def threshold(rule: str, name: str) -> float:
    """One threshold of one rule (a KeyError names a typo at once)."""
    return RULES[rule].thresholds[name]
