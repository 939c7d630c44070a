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
class Track(BaseModel):
    rank: int
    track: int
    name: str
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
    "receive_not_overlapped_ns", "lateness_ns",
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
    ranks: list[JobRank] = Field(description="one row per rank, in the requested order")
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
    ranks: list[JobRank]


# ---------------------------------------------------------------------------------------- findings
Severity = Literal["critical", "warning", "info"]


class FindingCulprit(BaseModel):
    kind: Literal["rank", "op", "link", "stage", "module", "job"]
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


class DataStage(BaseModel):
    stage: str
    order: int
    op_type: str
    runs_in: str = Field(description='"workers" or "training process"')
    parallelism: int
    batches: int
    total_ns: int
    per_batch_ns: int
    throughput_per_s: float | None
    share: float
    bottleneck: bool


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
