"""Response shapes of the web API (pydantic), so that /openapi.json documents every field.

Why a module of its own: the front end (web/) and the API fuzzing tests code against these shapes;
keeping them in one place makes a change to the contract visible in one diff (and docs/API.md lists
the same fields for humans).

Units follow the trace model: times are integer nanoseconds (``*_ns``), sizes integer bytes
(``*_bytes``).  Every *timestamp* (not a duration) is relative to the run's ``origin_ns`` (the
earliest event of any rank), so that it fits a JavaScript number exactly; ``origin_ns`` itself is
also given as a decimal string (``origin_ns_text``) for display.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

RunStatusName = Literal["new", "stale", "queued", "analysing", "ready", "failed"]
RunKind = Literal["trace", "job", "perfsight_run", "analysed"]


class Info(BaseModel):
    version: str
    base_dir_name: str = Field(description="last component of --summary-base-dir (never the full path)")
    auth: bool = Field(description="true when a token is required")


class RunInfo(BaseModel):
    id: str = Field(description="path of the run relative to the base dir (POSIX); pass it as ?run=")
    name: str
    kind: RunKind
    kind_label: str = Field(description='the kind in a user\'s words: "PyTorch job, 4 ranks", "Ascend job"')
    ranks: list[int]
    hosts: list[str] = Field(description="host names the collector recorded (empty when the data has none)")
    layout: str | None = Field(description='detected parallel layout of an analysed job, e.g. "DP2 × PP2"')
    steps: int | None = Field(description="steps of the lowest rank, known once analysed")
    date: str = Field(description="ISO 8601 UTC modification time of the newest input")
    size_bytes: int
    status: RunStatusName
    error: str | None = None


class RunList(BaseModel):
    runs: list[RunInfo]


class RunStatus(BaseModel):
    id: str
    status: RunStatusName
    progress: float = Field(ge=0.0, le=1.0, description="0..1 while queued/analysing; 1 when ready")
    stage: str = Field(description="what the analysis is doing now, for a progress label")
    error: str | None = None
    ranks: list[int]
    warnings: list[str] = []


class Page(BaseModel):
    total: int = Field(description="rows matching the filters (before paging)")
    offset: int
    limit: int


# ---------------------------------------------------------------------------------------------- overview
class StepBreakdown(BaseModel):
    step: int
    duration_ns: int
    iteration_interval_ns: int | None
    fp_bp_ns: int | None
    tail_ns: int | None
    computing_ns: int | None
    communication_ns: int | None
    overlapped_ns: int | None
    communication_not_overlapped_ns: int | None
    free_ns: int | None
    preparing_ns: int | None
    data_wait_ns: int | None = Field(description="time waiting for the next batch in this step, if known")


class Shares(BaseModel):
    """Fractions (0..1) of the summed step time, and the summed nanoseconds behind them."""

    total_ns: int
    computing: float
    communication_overlapped: float
    communication_not_overlapped: float
    free: float
    preparing: float
    computing_ns: int
    communication_overlapped_ns: int
    communication_not_overlapped_ns: int
    free_ns: int
    preparing_ns: int
    free_host_wait: float = 0.0
    """The part of ``free`` the device spent waiting for the host to issue its next work (the
    ``device_idle`` table's host_wait_ns); 0 without a device or in a cache written before it."""
    free_host_wait_ns: int = 0


class OperatorTypeShare(BaseModel):
    name: str
    count: int
    host_self_ns: int
    device_total_ns: int
    share: float = Field(description="share of the chosen measure (top_by) over all operator types")


class KindTotal(BaseModel):
    kind: str
    count: int
    total_ns: int


class TimelineSummary(BaseModel):
    duration_ns: int
    events: int
    tracks: int
    device_tracks: int
    by_kind: list[KindTotal]


class DataWait(BaseModel):
    source: str | None = Field(description="'dataloader' table, 'data_loading' ranges, or null if unknown")
    per_step: dict[str, int] = Field(description="step number (as text) -> nanoseconds waiting for data")


class MemoryPeak(BaseModel):
    device_type: str
    device_index: int
    peak_allocated_bytes: int | None
    peak_reserved_bytes: int | None
    peak_ts_ns: int | None


class StepFlops(BaseModel):
    step: int
    flops: float | None
    flops_per_s: float | None
    mfu: float | None


class Overview(BaseModel):
    run: str
    rank: int
    ranks: list[int]
    device: str | None
    steps: list[StepBreakdown]
    shares: Shares
    top_by: Literal["device_total_ns", "host_self_ns"]
    operator_types: list[OperatorTypeShare]
    data_wait: DataWait
    timeline: TimelineSummary
    memory_peaks: list[MemoryPeak]
    flops: list[StepFlops]
    warnings: list[str]


# ---------------------------------------------------------------------------------------------- step trace
class StepRow(BaseModel):
    step: int
    start_ns: int
    end_ns: int
    duration_ns: int
    fp_start_ns: int | None
    bp_end_ns: int | None
    iteration_interval_ns: int | None
    fp_bp_ns: int | None
    tail_ns: int | None
    fp_op: str | None
    bp_op: str | None
    timeline: str | None
    computing_ns: int | None
    communication_ns: int | None
    communication_not_overlapped_ns: int | None
    free_ns: int | None


class StepAverage(BaseModel):
    duration_ns: float
    iteration_interval_ns: float
    fp_bp_ns: float
    tail_ns: float
    computing_ns: float
    communication_ns: float
    communication_not_overlapped_ns: float
    free_ns: float


class Interval(BaseModel):
    lane: str
    start_ns: int
    end_ns: int


class PointCandidate(BaseModel):
    name: str
    count: int
    steps: int = Field(description="how many steps hold it")
    offset_ns: int = Field(description="median start from its step's start")


class StepTrace(BaseModel):
    run: str
    rank: int
    steps: list[StepRow]
    average: StepAverage | None
    fp_ops: list[str]
    bp_ops: list[str]
    step: int | None = Field(description="the step asked for with ?step=, whose intervals follow")
    intervals: list[Interval] = Field(
        description="overlap-analysis intervals (Computing, Communication, ...) clipped to ?step="
    )
    fp_point: str | None = Field(description="the forward-start op asked for (null: as analysed)")
    bp_point: str | None = Field(description="the backward-end op asked for (null: as analysed)")
    point_warnings: list[str] = Field(description="named points some steps lack (automatic there)")
    point_candidates: list[PointCandidate] = Field(description="host ops in the steps, by median start")


# ---------------------------------------------------------------------------------------------- operators
class OperatorTypeRow(BaseModel):
    name: str
    count: int
    host_total_ns: int
    host_self_ns: int
    host_avg_ns: float
    host_min_ns: int
    host_max_ns: int
    device_total_ns: int
    host_ratio: float | None
    flops: float | None


class OperatorTypePage(Page):
    rows: list[OperatorTypeRow]


class OperatorRow(BaseModel):
    id: int = Field(description="event id (row of the rank's slices); use with /timeline/event")
    step: int
    name: str
    thread: int
    start_ns: int
    dur_ns: int
    self_ns: int
    device_ns: int
    input_dims: str | None = Field(description="JSON text: one shape per input")
    input_types: str | None = Field(description="JSON text: one dtype per input")
    flops: float | None


class OperatorPage(Page):
    rows: list[OperatorRow]


class KernelTypeRow(BaseModel):
    name: str
    kind: str
    count: int
    total_ns: int
    avg_ns: float
    min_ns: int
    max_ns: int
    ratio: float | None


class KernelTypePage(Page):
    rows: list[KernelTypeRow]


class KernelRow(BaseModel):
    step: int
    name: str
    kind: str
    op: str | None
    stream: int
    start_ns: int
    dur_ns: int
    wait_ns: int | None
    grid: str | None = Field(description="launch grid as text, e.g. [4, 1, 1]")
    block: str | None
    occupancy_pct: float | None
    input_dims: str | None
    input_types: str | None


class KernelPage(Page):
    rows: list[KernelRow]


# ---------------------------------------------------------------------------------------------- memory
class MemoryCurve(BaseModel):
    ts_ns: list[int]
    allocated_bytes: list[int | None]
    reserved_bytes: list[int | None]


class MemoryDevice(MemoryPeak):
    points: int = Field(description="points in the full curve (the curve below may be reduced)")
    curve: MemoryCurve


class MemoryOperator(BaseModel):
    name: str | None = Field(description="innermost operator around the allocation; null if none")
    count: int
    total_bytes: int
    max_bytes: int
    avg_lifetime_ns: float | None


class Memory(BaseModel):
    run: str
    rank: int
    devices: list[MemoryDevice]
    top_operators: list[MemoryOperator]


# ---------------------------------------------------------------------------------------------- timeline
class StepMark(BaseModel):
    rank: int
    step: int
    start_ns: int
    end_ns: int


class TimeSpan(BaseModel):
    start_ns: int
    end_ns: int


class Track(BaseModel):
    rank: int
    track: int
    name: str
    label: str = Field(description='what the UI calls it: "rank 0 · stage 1 · thread 42 (python)"')
    is_device: bool
    device_index: int
    stream: int
    pid: int
    tid: int
    max_depth: int
    events: int


class Tracks(BaseModel):
    run: str
    origin_ns: int = Field(description="absolute start of the run's clock; every timestamp is relative to it")
    origin_ns_text: str
    end_ns: int = Field(description="end of the last event, relative to origin_ns")
    ranks: list[int]
    kinds: list[str] = Field(description="dictionary for the kind codes of /timeline/window")
    tracks: list[Track]
    steps: list[StepMark] = Field(description="every profiled step of every rank (the step_trace table)")
    steps_span: TimeSpan | None = Field(description="first step's start to last step's end; null: no steps")


class Lane(BaseModel):
    """One nesting level of a track, column-wise.  ``count`` > 1 marks a merged block of events
    smaller than a pixel (``id`` is then its first event; ``name`` the name of its first event)."""

    depth: int
    start_ns: list[int]
    dur_ns: list[int]
    name: list[int] = Field(description="index into Window.names")
    kind: list[int] = Field(description="index into Tracks.kinds")
    id: list[int]
    count: list[int]


class TrackWindow(BaseModel):
    rank: int
    track: int
    lanes: list[Lane]


class Window(BaseModel):
    start_ns: int
    end_ns: int
    width_px: int
    ns_per_px: float
    names: list[str]
    events: int = Field(description="entries returned (merged blocks count once)")
    tracks: list[TrackWindow]


class FlowRef(BaseModel):
    kind: str
    direction: Literal["out", "in"]
    id: int
    track: int
    name: str
    start_ns: int


class EventDetail(BaseModel):
    rank: int
    id: int
    name: str
    kind: str
    category: str | None
    track: int
    track_name: str
    pid: int
    tid: int
    start_ns: int
    dur_ns: int
    depth: int
    step: int
    correlation: int
    external_id: int
    input_dims: list[list[int]] | None
    input_types: list[str] | None
    concrete_inputs: list[str] | None = Field(
        description='a convolution\'s scalar arguments as recorded (stride, padding, ...; "" for a tensor)'
    )
    grid: list[int] | None
    block: list[int] | None
    occupancy_pct: float | None
    bytes: int | None
    flows: list[FlowRef]


class SearchHit(BaseModel):
    rank: int
    id: int
    track: int
    depth: int
    name: str
    start_ns: int
    dur_ns: int


class SearchResult(Page):
    query: str
    hits: list[SearchHit]


class Flow(BaseModel):
    rank: int
    kind: str
    src_id: int
    src_track: int
    src_depth: int
    src_ts_ns: int
    dst_id: int
    dst_track: int
    dst_depth: int
    dst_ts_ns: int


class Flows(BaseModel):
    total: int
    truncated: bool
    flows: list[Flow]


class ErrorBody(BaseModel):
    detail: str
    status: RunStatus | None = None


# ---------------------------------------------------------------------------------------------- job pages
JobRankSort = Literal[
    "rank", "stage", "duration_ns", "computing_ns", "communication_not_overlapped_ns", "overlapped_ns",
    "free_ns", "bubble_ns", "iteration_interval_ns", "fp_bp_ns", "tail_ns", "communication_ns",
    "receive_not_overlapped_ns", "host_wait_ns", "after_launch_ns", "lateness_ns",
]  # fmt: skip


class JobRank(BaseModel):
    """One rank of a job, averaged over its steps (or one step), from the cluster step trace (ns)."""

    rank: int
    stage: int = Field(description="pipeline stage (0 without pipeline parallelism)")
    host: str | None
    duration_ns: int
    iteration_interval_ns: int
    fp_bp_ns: int
    tail_ns: int
    computing_ns: int
    computing_not_overlapped_ns: int = Field(description="computing_ns less overlapped_ns: computing alone")
    communication_not_overlapped_ns: int
    overlapped_ns: int = Field(description="communication overlapped by computing (part of computing_ns)")
    communication_ns: int
    free_ns: int
    host_wait_ns: int = Field(
        description="the part of free_ns the device waited for its host to launch work (device_idle)"
    )
    after_launch_ns: int = Field(
        description="the part of free_ns the device sat idle once its work was launched: launch latency "
        "or a dependency (device_idle)"
    )
    stage_ns: int
    bubble_ns: int
    receive_not_overlapped_ns: int
    lateness_ns: int | None = Field(description="how late this rank reaches collectives (slow-rank analysis)")
    slow: bool = Field(description="the slow-rank analysis judged this rank slow")


class StepSpread(BaseModel):
    """How far apart the ranks' average step times are."""

    min_ns: int
    median_ns: int
    max_ns: int
    fastest_rank: int
    slowest_rank: int


class SlowRankEvidence(BaseModel):
    rank: int
    lateness_ns: float | None = Field(
        description="mean time the others wait for this rank at collectives (none without collectives)"
    )
    last_votes: int = Field(description="collectives this rank reached last")
    instances: int
    compute_ns: float | None
    magnitude_pct: float | None
    delay_pct: float | None
    slow: bool


class SlowLinkEvidence(BaseModel):
    src: int
    dst: int
    link_type: str
    size_bucket: int
    bytes: float | None
    transit_ns: float | None
    bandwidth: float | None = Field(description="bytes per second")
    median: float | None = Field(description="median bandwidth of links of the same type and size (B/s)")
    slow: bool


class StageBalance(BaseModel):
    stage: int
    ranks: list[int]
    duration_ns: int
    computing_ns: int
    bubble_ns: int
    flops: float | None = Field(
        description="floating-point operations of the stage's ranks, summed over the steps averaged, if known"
    )


class PipelineBalance(BaseModel):
    """The cluster analysis's verdict on how evenly the pipeline stages are loaded."""

    imbalanced: bool
    spread: float | None = Field(description="(max - min) / max of the stages' computing time")
    slowest_stage: int | None = Field(description="the stage that computes the longest")


class JobOverview(BaseModel):
    run: str
    ranks: list[JobRank] = Field(description="one row per rank, in the requested order (the page asked for)")
    ranks_total: int = Field(description="ranks in the job (``ranks`` is one page of them)")
    hosts_total: int = Field(description="distinct hosts the job's ranks recorded (0: none recorded)")
    step_spread: StepSpread | None
    slow_rank_threshold_ns: int | None
    slowest_ranks: list[SlowRankEvidence] = Field(description="ranks by lateness, the latest first")
    slowest_links: list[SlowLinkEvidence] = Field(description="links by bandwidth against their peers")
    stages: list[StageBalance] = Field(description="pipeline stages, averaged (one stage without pipeline)")
    pipeline: PipelineBalance | None = Field(description="set when the job has more than one stage")
    parallel: dict[str, object] = Field(description="the detected parallel layout and groups")
    layout: str | None = Field(description='the parallel layout in short, e.g. "DP2 × PP2"')
    problems: list[str] = Field(description="missing or duplicate ranks and other problems of the job")


class JobStepTrace(BaseModel):
    run: str
    step: str = Field(description='"average", or the step shown')
    steps: list[str] = Field(description="the steps that can be shown, average first")
    stages: list[int]
    pipeline: bool = Field(description="the job has more than one pipeline stage (shows stage columns)")
    ranks: list[JobRank] = Field(description="the page of ranks asked for, in the requested order")
    ranks_total: int = Field(description="ranks of the step (and stage) shown, over every page")


# ------------------------------------------------------------------------ job heatmaps and time overview
class HeatmapCell(BaseModel):
    """One rank of the memory and FLOPs heatmaps (cluster_resources.csv)."""

    rank: int
    host: str | None = Field(description="the rank's host (null when the trace does not say)")
    stage: int | None = Field(description="pipeline stage (0 without pipeline parallelism)")
    peak_allocated_bytes: int | None = Field(
        description="peak allocated memory of the rank's device (else host)"
    )
    capacity_bytes: int | None = Field(description="the device's memory, when the trace records it")
    peak_share: float | None = Field(description="peak / capacity (0..1), when the capacity is known")
    peak_of_max: float | None = Field(description="peak / the largest peak of the job (0..1)")
    flops: float | None = Field(description="floating-point operations over the steps averaged")
    flops_normalised: float | None = Field(description="flops / the largest rank's flops (0..1)")


class JobHeatmaps(BaseModel):
    run: str
    memory_basis: Literal["capacity", "max_peak", "none"] = Field(
        description='what the memory colour is a share of: "capacity" (every rank\'s device capacity '
        'is known), "max_peak" (the largest peak of the job), or "none" (no memory recorded)'
    )
    max_peak_bytes: int | None
    max_flops: float | None
    flops_known: bool = Field(description="some rank has counted FLOPs")
    hosts: list[str | None] = Field(description="the hosts, in the order of the cells (rows of the heatmap)")
    cells: list[HeatmapCell] = Field(description="one per rank, by host then rank")


class TimeOverviewStep(BaseModel):
    """One step across the job's ranks (cluster step trace and communication ops, ns)."""

    step: str
    ranks: int = Field(description="ranks that recorded this step")
    min_ns: int
    median_ns: int
    max_ns: int
    fastest_rank: int
    slowest_rank: int
    mean_communication_ns: int = Field(description="the ranks' communication time, averaged over ranks")
    mean_wait_ns: int | None = Field(
        description="the ranks' wait for peers at collectives, summed per rank and averaged over ranks"
    )


class TimeOverviewSeries(BaseModel):
    rank: int
    stage: int | None
    durations_ns: list[int | None] = Field(description="step time per step of `steps` (null: not recorded)")


class JobTimeOverview(BaseModel):
    run: str
    rank_count: int
    wait_known: bool = Field(description="the job has communication ops (else mean_wait_ns is null)")
    steps: list[TimeOverviewStep] = Field(description="in step order")
    series: list[TimeOverviewSeries] = Field(
        description="one per rank when the job has at most series_max_ranks ranks, else empty"
    )
    series_max_ranks: int


# ---------------------------------------------------------------------------------------- findings
Severity = Literal["critical", "warning", "info"]


class FindingCulprit(BaseModel):
    kind: Literal["rank", "op", "link", "stage", "module", "host", "job"]
    name: str = Field(description='what to look at: a rank number ("1"), an operator, a link, a stage...')


class FindingText(BaseModel):
    title: str
    suggestion: str


class FindingEvidence(BaseModel):
    metric: str
    value: float | int | str | None
    unit: str = Field(description='"ns", "bytes", "share" (0..1), "count", "flops", "B/s", or "" for text')
    threshold: float | int | None
    source: str = Field(description="the output file or UI page that shows the value")


class Finding(BaseModel):
    rule: str
    category: Literal["data", "compute", "communication", "scheduling", "memory", "host"]
    severity: Severity
    culprit: FindingCulprit
    title: str = Field(description="English title (every language's is under texts)")
    suggestion: str
    texts: dict[str, FindingText] = Field(description='title and suggestion by language ("en", "zh")')
    message_key: str
    params: dict[str, object]
    evidence: list[FindingEvidence]
    effect_ns: int = Field(description="time per step at stake")
    error_ns: int = Field(description="what the measurement cannot resolve (clock alignment, step noise)")
    confidence: float = Field(ge=0.0, le=1.0)
    ranks: list[int] = Field(description="the ranks it was seen on (empty: the job as a whole)")
    explained_by: str | None = Field(description="a stronger finding's rule that accounts for this one")
    uncertain: bool = Field(description="lowered to info: the effect is not clear of the measurement error")


class Findings(BaseModel):
    run: str
    scope: Literal["rank", "job"]
    rank: int | None = Field(description="the rank, for scope rank")
    source: str = Field(
        description='where they were read: "PROFILER_OUTPUT/advisor.json" of the rank, '
        'or "cluster_analysis_output/advisor.json" of the job'
    )
    counts: dict[Severity, int] = Field(description="findings per severity")
    findings: list[Finding] = Field(description="as the advisor ranked them, most important first")


# ---------------------------------------------------------------- run-vs-run comparison (/api/compare)
# Rows of perfsight.compare's tables (docs/COMPARE.md): per-step means over the steps each side
# averages, NEW minus BASE; ``beyond_noise`` is null where a side has one step (spread unknown).
CompareStatus = Literal["added", "removed", "changed", "same"]


class CompareSide(BaseModel):
    input: str = Field(description="run id and rank, as RUN:rankN")
    rank: int
    ranks: int = Field(description="ranks the run holds")
    steps_used: list[int] = Field(
        description="steps averaged (empty: the run has no steps; its whole window)"
    )
    steps_all: list[int]


class CompareNoise(BaseModel):
    sigmas: float = Field(description="standard errors of the difference a change must exceed")
    min_relative: float = Field(description="...and this fraction of the larger mean")


class CompareCounts(BaseModel):
    added: int
    removed: int
    changed: int
    same: int


class CompareMetricRow(BaseModel):
    metric: str
    unit: Literal["ns", "bytes", "flop", "ratio"]
    category: str
    status: CompareStatus
    base: float | None
    new: float | None
    delta: float | None
    delta_pct: float | None
    base_std: float | None = Field(description="step-to-step standard deviation of BASE")
    new_std: float | None
    beyond_noise: bool | None


class CompareRegressionRow(BaseModel):
    category: str = Field(
        description="communication, operator, kernel, or the step-breakdown metric's category"
    )
    item: str
    detail: str
    status: CompareStatus
    base_ns: float | None
    new_ns: float | None
    delta_ns: float | None
    delta_pct: float | None
    beyond_noise: bool | None
    structural: bool = Field(description="calls per step changed, or the row is on one side only")
    real: bool = Field(description="beyond noise or structural: what the summary leads with")
    table: str


class CompareOperatorRow(BaseModel):
    name: str
    input_dims: str
    status: CompareStatus
    basis: Literal["device_ns", "self_ns"]
    base_calls: float
    new_calls: float
    delta_calls: float
    base_time_ns: float
    new_time_ns: float
    delta_time_ns: float
    delta_pct: float | None
    base_mean_ns: float | None
    new_mean_ns: float | None
    delta_mean_ns: float | None
    base_self_ns: float
    new_self_ns: float
    base_device_ns: float
    new_device_ns: float
    base_dur_ns: float
    new_dur_ns: float
    base_time_std_ns: float | None
    new_time_std_ns: float | None
    beyond_noise: bool | None


class CompareKernelRow(BaseModel):
    op: str
    status: CompareStatus
    base_kernels: float
    new_kernels: float
    delta_kernels: float
    base_time_ns: float
    new_time_ns: float
    delta_time_ns: float
    delta_pct: float | None
    base_time_std_ns: float | None
    new_time_std_ns: float | None
    beyond_noise: bool | None
    base_distinct_kernels: int
    new_distinct_kernels: int
    base_kernel_names: str
    new_kernel_names: str
    names_differ: bool


class CompareCommunicationRow(BaseModel):
    family: str
    group: str
    status: CompareStatus
    base_calls: float
    new_calls: float
    delta_calls: float
    base_time_ns: float
    new_time_ns: float
    delta_time_ns: float
    delta_pct: float | None
    base_time_std_ns: float | None
    new_time_std_ns: float | None
    beyond_noise: bool | None
    base_wait_ns: float
    new_wait_ns: float
    base_bytes: float
    new_bytes: float
    base_bandwidth_gb_s: float | None
    new_bandwidth_gb_s: float | None


class CompareTableCounts(BaseModel):
    operators: CompareCounts
    kernels_by_operator: CompareCounts
    communication: CompareCounts


class Comparison(BaseModel):
    base: CompareSide
    new: CompareSide
    noise: CompareNoise
    notes: list[str]
    counts: CompareTableCounts
    step_breakdown: list[CompareMetricRow]
    step_breakdown_rows: int
    regressions: list[CompareRegressionRow]
    regressions_rows: int = Field(description="rows before the limit")
    operators: list[CompareOperatorRow]
    operators_rows: int
    kernels_by_operator: list[CompareKernelRow]
    kernels_by_operator_rows: int
    communication: list[CompareCommunicationRow]
    communication_rows: int


# ------------------------------------------------------------------ job communication (job_comm, job_matrix)
CommRankSort = Literal[
    "rank", "host", "ops", "elapse_ns", "transit_ns", "wait_ns", "synchronization_ns", "idle_ns", "bytes"
]  # fmt: skip
CommLinkSort = Literal[
    "step", "kind", "op", "group", "src", "dst", "link_type", "bytes", "transit_ns", "bandwidth_bytes_per_s"
]  # fmt: skip
CommOpSort = Literal[
    "rank", "op", "group", "step", "instance", "peer", "start_ns", "elapse_ns", "transit_ns", "wait_ns",
    "synchronization_ns", "idle_ns", "bytes", "bandwidth_bytes_per_s", "basis",
]  # fmt: skip
CommMetric = Literal["bandwidth", "size", "time"]


class CommOpFamily(BaseModel):
    name: str = Field(description='an op kind of the matrix file ("all_reduce", "send")')
    kind: Literal["collective", "p2p"]
    links: int = Field(description="entries of communication_matrix.json of this op")


class CommGroup(BaseModel):
    id: str = Field(description="the process group as the analysis names it")
    ranks: int = Field(description="ranks that issued ops in this group")
    ops: list[str] = Field(description="op kinds issued in it")


class CommChoices(BaseModel):
    """What the communication pages' selectors offer."""

    steps: list[str] = Field(description='"all", then every step with communication')
    ops: list[CommOpFamily]
    groups: list[CommGroup]
    link_types: list[str] = Field(description="LOCAL, INTRA_HOST, INTER_HOST, UNKNOWN: those present")


class CommRank(BaseModel):
    """One rank's communication in a step (or all steps): the sums of its ops' times (ns)."""

    rank: int
    host: str | None
    ops: int = Field(description="communication ops the rank issued")
    elapse_ns: int = Field(description="communication time: the ops' summed durations")
    transit_ns: int = Field(
        description="time moving data (after the last rank arrived, or HCCL's transit tasks)"
    )
    wait_ns: int = Field(description="time waiting for the other ranks (elapse = transit + wait + idle)")
    synchronization_ns: int = Field(description="the part of the wait before the first transfer")
    idle_ns: int
    bytes: float = Field(description="bytes the ops carried (as recorded)")


class JobCommunication(Page):
    run: str
    step: str = Field(description='"all" or the step shown')
    choices: CommChoices
    rows: list[CommRank]


class CommLink(BaseModel):
    """One entry of communication_matrix.json, in ns, bytes and bytes per second."""

    step: int
    kind: Literal["collective", "p2p"]
    op: str
    group: str
    src: int
    dst: int
    link_type: str = Field(description="LOCAL, INTRA_HOST, INTER_HOST or UNKNOWN")
    bytes: float = Field(description="bytes over the link (the ring's share of a collective)")
    transit_ns: int
    bandwidth_bytes_per_s: float | None = Field(description="null when the link has no transit time")


class CommLinkPage(Page):
    rows: list[CommLink]


class CommOp(BaseModel):
    """One communication op of one rank (cluster_communication_ops.csv), times in ns."""

    rank: int
    op: str
    group: str | None
    step: int | None
    instance: int | None = Field(description="the matched instance across ranks (null: unmatched)")
    peer: int | None = Field(description="the other rank of a point-to-point op")
    start_ns: int | None = Field(description="aligned start, from the job's first communication op")
    elapse_ns: int
    transit_ns: int
    wait_ns: int
    synchronization_ns: int
    idle_ns: int
    bytes: float | None
    bandwidth_bytes_per_s: float | None = Field(description="bytes / transit time (null without transit)")
    basis: str | None = Field(description="what split the op: tasks, arrivals or elapse (docs/OUTPUTS.md)")


class CommOpPage(Page):
    rows: list[CommOp]


class MatrixCells(BaseModel):
    """The non-empty blocks, as parallel arrays (block ``i`` holds ranks ``lo + i*block ..``)."""

    src_block: list[int]
    dst_block: list[int]
    value: list[float] = Field(description="size: summed bytes; time: summed ns; bandwidth: mean B/s")
    low: list[float] = Field(description="the smallest entry value of the metric in the block")
    high: list[float] = Field(description="the largest entry value of the metric in the block")
    links: list[int] = Field(description="entries of communication_matrix.json in the block")
    link_types: list[str] = Field(description="their link types, comma-separated")


class CommMatrix(BaseModel):
    run: str
    metric: CommMetric
    unit: Literal["B/s", "bytes", "ns"]
    step: str
    op: str = Field(description='the op family shown ("" for all)')
    group: str = Field(description='the group shown ("" for all)')
    ranks: int = Field(description="ranks on each axis (0 .. highest rank)")
    block: int = Field(description="ranks per block on each axis")
    src_lo: int
    src_hi: int = Field(description="source ranks shown: src_lo <= rank < src_hi")
    dst_lo: int
    dst_hi: int
    rows: int = Field(description="blocks on the source axis")
    columns: int = Field(description="blocks on the destination axis")
    min: float | None
    max: float | None
    cells: MatrixCells
    choices: CommChoices


# ------------------------------------------------------------------------------------ data preparation
class DataPrepSummary(BaseModel):
    """The ``data_pipeline_summary`` analysis row (analysis/data_pipeline.py documents each column)."""

    rank: int
    requests: int = Field(description="requests judged (the first of each epoch is left out)")
    num_workers: int
    wait_ns: int
    loop_ns: int
    wait_share: float
    consume_interval_ns: int | None = Field(description="median time per batch outside next()")
    host_queue_capacity: int | None
    host_queue_mean: float | None
    host_queue_usage: float | None
    host_queue_empty: int | None
    host_queue_empty_ratio: float | None
    host_queue_full: int | None
    device_queue_mean: float | None
    device_queue_empty: int | None
    device_queue_empty_ratio: float | None
    verdict: Literal["data processing", "host to device", "none"]
    bottleneck_stage: str | None
    reason: str
    host_queue_samples: int | None = Field(
        None, description="host-queue samples when not one per request (MindData: one per step)"
    )


class DataStage(BaseModel):
    stage: str
    order: int
    op_type: str
    runs_in: str = Field(description='"workers" or "training process"')
    parallelism: int
    batches: int | None = Field(description="null: not measured (MindData read from its files)")
    total_ns: int | None
    per_batch_ns: int | None
    throughput_per_s: float | None
    share: float | None
    bottleneck: bool
    queue_capacity: int | None = Field(None, description="the stage's own output queue (MindData ops)")
    queue_mean: float | None = None
    queue_usage: float | None = None
    queue_empty_ratio: float | None = None
    queue_samples: int | None = None


class DataStageQueue(BaseModel):
    time_ms: list[float | None] = Field(description="sample index x the pipeline's sampling interval")
    size: list[int]
    capacity: list[int | None]


class DataCpuUtilization(BaseModel):
    """A ``data_cpu_utilization`` row (analysis/minddata.py): MindInsight's mean of one CPU metric."""

    scope: Literal["machine", "process", "op"]
    op_id: int | None
    stage: str | None
    metric: str
    samples: int
    mean: float
    max: float


class DataWorker(BaseModel):
    worker: int = Field(description="-1: the training process (num_workers=0)")
    pid: int
    batches: int
    busy_ns: int
    cpu_ns: int | None
    idle_ns: int
    read_ns: int
    transform_ns: int
    collate_ns: int


class DataQueuePoint(BaseModel):
    step: int
    batch: int | None
    start_ns: int = Field(description="when the loop asked, relative to the run's origin")
    wait_ns: int
    host_queue: int | None
    device_queue: int | None
    queue_capacity: int | None


class DataStepWait(BaseModel):
    step: int
    data_wait_ns: int


class DataStageCurve(BaseModel):
    start_ns: list[int] = Field(description="the batch's start, relative to the run's origin")
    dur_ns: list[int]
    worker: list[int]


class DataRankWait(BaseModel):
    rank: int
    wait_ns: int
    wait_share: float
    host_queue_empty_ratio: float | None
    verdict: str
    bottleneck_stage: str | None


class DataPrep(BaseModel):
    run: str
    rank: int
    captured: bool = Field(description="whether the rank has a data-loader capture")
    how_to_enable: str | None = Field(description="how to record one, when it has none")
    summary: DataPrepSummary | None
    stages: list[DataStage] = Field(description="pipeline stages, source first")
    workers: list[DataWorker]
    queue: list[DataQueuePoint] = Field(
        description="requests by time (thinned past 5000, keeping every empty one)"
    )
    queue_requests: int = Field(description="requests recorded, before thinning")
    wait_per_step: list[DataStepWait]
    stage_batches: dict[str, DataStageCurve] = Field(
        description="per stage, its time on each measured batch (thinned past 2000 per stage)"
    )
    ranks: list[DataRankWait] = Field(
        description="every captured rank of a job, to compare (empty: one rank)"
    )
    stage_queues: dict[str, DataStageQueue] = Field(
        description="per stage with its own output queue (MindData ops), its sampled sizes"
    )
    cpu: list[DataCpuUtilization] = Field(
        description="the host's CPU use (MindData's sampler; empty without it)"
    )


# ------------------------------------------------------------- parallel execution views (seed 000)
class PipelineBlock(BaseModel):
    """A Forward/Backward range of one micro-batch on a stage (ns from the step's first op)."""

    rank: int
    stage: int
    phase: Literal["forward", "backward"]
    micro_batch: int
    start_ns: int
    end_ns: int
    compute_ns: int = Field(description="time of the compute ops inside the block (its waits excluded)")


class PipelineP2P(BaseModel):
    rank: int
    stage: int
    name: str
    instance: int = Field(description="matched instance (one id on a send and its receive); -1 unmatched")
    peer: int
    start_ns: int
    end_ns: int


class PipelineArrow(BaseModel):
    """A send and the receive it was matched with, between two stages."""

    instance: int
    src_rank: int
    src_stage: int
    dst_rank: int
    dst_stage: int
    send_start_ns: int
    recv_end_ns: int


class PipelineStage(BaseModel):
    stage: int
    rank: int = Field(description="the stage's rank drawn (its lowest)")
    ranks: list[int]
    blocks: list[PipelineBlock]
    p2p: list[PipelineP2P]
    compute_ns: int = Field(description="sum of the blocks' compute_ns")
    idle_ns: int = Field(description="the step's span less compute_ns: the stage's bubble as drawn")
    idle_share: float | None
    bubble_ns: int | None = Field(description="the cluster step trace's bubble of this stage and step")
    step_ns: int | None = Field(description="the cluster step trace's step time of this stage")


class JobPipeline(BaseModel):
    run: str
    step: str
    steps: list[str]
    span_ns: int = Field(description="first op start to last op end of the step, over all ranks")
    has_blocks: bool = Field(description="some stage recorded Forward/Backward micro-batch ranges")
    pacing_stage: int | None = Field(description="the stage with the most compute in its blocks")
    stages: list[PipelineStage]
    arrows: list[PipelineArrow]


class MareyLine(BaseModel):
    """A series over the window, one value per pixel that has one (pixel -1: the level at its start)."""

    bins: list[int]
    values: list[float]


class MareyDevice(BaseModel):
    rank: int
    stage: int
    ops: int
    compute_ns: int
    communication_ns: int
    end_ns: int
    step_flops: float | None = Field(description="FLOPs of the device's counted operators in the step")
    flops_per_s: float | None = Field(description="step_flops over the device's compute time in the step")
    flops_per_s_of_max: float | None = None
    flops_of_max: float | None = None
    peak_share: float | None = None
    peak_of_max: float | None = None
    capacity_bytes: int | None = None
    flops_line: MareyLine = Field(description="FLOP/s per pixel of the window")
    memory_line: MareyLine = Field(description="highest allocated bytes per pixel of the window")


class MareyOp(BaseModel):
    """One op of a stage matched across its devices, or the sub-pixel ops merged into one run
    (``ops`` > 1).  Per drawn device of its stage (the answer's ``devices`` of that stage, in their
    order), columns of small integers rather than an object or absolute times per device: a page
    of 32 devices x ~1,100 items stays small to send and to decode."""

    stage: int
    key: str = Field(
        description='what matches it: "comm#<instance>", "<name>#<k-th of that name in step>"; '
        'a run: "run:.."'
    )
    name: str | None = Field(
        description="the op's name (a run: its first op's); null where key is \"<name>#<k>\": the name is "
        "the key up to its last #"
    )
    category: Literal["compute", "communication", "mixed"]
    order: int
    ops: int = Field(description="matched ops merged into this item (1: an op drawn on its own)")
    longest_ns: int
    start_ns: int = Field(description="first start on any device of the stage")
    end_ns: int = Field(description="last end on any device of the stage")
    starts: list[int | None] = Field(
        description="per drawn device of the stage: its first start, ns after start_ns (null: it ran none of "
        "the item's ops); empty when its stage is folded"
    )
    durs: list[int | None] = Field(description="per drawn device of the stage: last end less first start, ns")
    counts: list[int | None] | None = Field(
        description="a run's: per drawn device of the stage, how many of its ops are merged here (empty when "
        "folded); null for an op drawn alone (1 where the device ran it)"
    )


class MareyStage(BaseModel):
    stage: int
    devices: int
    folded: bool


class JobMarey(BaseModel):
    run: str
    step: str
    steps: list[str]
    span_ns: int
    px: int
    window_start_ns: int
    window_end_ns: int
    bin_ns: float = Field(description="ns a pixel: ops shorter than this on every device are merged")
    matched_ops: int = Field(description="ops of the step (matched across each stage's devices)")
    window_ops: int = Field(description="those in the window: the sum of the items' ops")
    stages: list[MareyStage]
    device_rows: int = Field(description="devices of the unfolded stages")
    first: int = Field(description="index of the first drawn among them")
    rows: int = Field(description="device rows drawn at most")
    flops_line_max_per_s: float | None = Field(description="the highest op's FLOP/s in the step (any device)")
    memory_line_max_bytes: float | None = Field(description="device capacity, or the highest allocated")
    devices: list[MareyDevice]
    ops: list[MareyOp]


class StrategyRank(BaseModel):
    rank: int
    stage: int | None
    host: str | None
    duration_ns: int | None = Field(description="the rank's average step time (cluster step trace)")
    slow: bool
    data_group: int | None = Field(description="its data-parallel group (index in groups.data)")
    tensor_group: int | None = Field(description="its tensor-parallel group (index in groups.tensor)")


class StrategyReplica(BaseModel):
    tensor_group: int | None = Field(description="the tensor-parallel group of this replica; null: one rank")
    ranks: list[StrategyRank]


class StrategyStage(BaseModel):
    stage: int
    duration_ns: int = Field(description="the longest average step time of its ranks")
    replicas: list[StrategyReplica]


class JobStrategy(BaseModel):
    run: str
    modes: list[str] = Field(description="modes the cluster analysis found (data, tensor, pipeline...)")
    evidence: dict[str, list[str]]
    problems: list[str]
    max_duration_ns: int
    stages: list[StrategyStage]


# --- parallel-strategy graph and module table (server/job_strategy.py) ---


class StrategyNode(BaseModel):
    stage: int
    node: int = Field(description="index in its stage, in execution order")
    order: int = Field(description="the op's smallest position among its ranks' ops of the step")
    key: str = Field(description="name#n: the n-th op of that name in the step on each rank of the stage")
    name: str
    category: str = Field(description="compute, collective, p2p, memory copy or optimizer")
    special: str = Field(description="sharded, redistribution, gradient_aggregation or empty")
    module: str = Field(description="innermost nn.Module forward holding the op; empty outside any")
    modules: list[str] | None = Field(description="every module holding it, outermost first")
    input_dims: list[list[int]] | None = Field(description="input shapes (first rank of the stage)")
    collective: str | None
    group: str | None = Field(description="process group of a communication op")
    group_ranks: list[int] | None
    bytes: int | None
    rank_count: int = Field(description="ranks that ran it")
    ranks: list[int] = Field(description="empty when rank_count is over the graph's per_rank_limit")
    starts_ns: list[int] = Field(
        description="per rank (as ranks): start since the step's first op, common clock"
    )
    durations_ns: list[int] = Field(description="per rank (as ranks)")
    mean_ns: int
    min_ns: int
    max_ns: int
    slowest_rank: int = Field(description="the rank on which it took longest")
    first_start_ns: int = Field(description="its earliest start among its ranks, since the step's first op")


class StrategyGraphStage(BaseModel):
    stage: int
    ranks: list[int]
    nodes: list[StrategyNode]


class StrategyEdge(BaseModel):
    kind: str = Field(description="order (the next op of a stage) or p2p (a send and its receive)")
    src_stage: int
    src_node: int
    dst_stage: int
    dst_node: int
    pairs: list[str] = Field(description="p2p: the rank pairs 'src->dst' that exchanged it")
    bytes: int | None


class JobStrategyGraph(BaseModel):
    run: str
    step: str
    steps: list[str]
    span_ns: int
    categories: list[str]
    specials: dict[str, int] = Field(description="nodes of each special kind in the step")
    modules: list[str]
    stages: list[StrategyGraphStage]
    edges: list[StrategyEdge]


class ModuleRankTime(BaseModel):
    rank: int
    time_ns: int = Field(description="mean over profiled steps of the module's forward time in a step")
    calls_per_step: float


class ModuleRow(BaseModel):
    stage: int
    module: str
    parent: str
    depth: int
    ranks: int
    mean_ns: int
    min_ns: int
    max_ns: int
    slowest_rank: int
    spread: float | None = Field(description="(max - min) / mean over the ranks of the stage")
    per_rank: list[ModuleRankTime]


class JobModules(BaseModel):
    run: str
    ranks: list[int]
    modules: list[ModuleRow]
