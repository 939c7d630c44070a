/**
 * The typed client of perfsight's JSON API (src/perfsight/server/, documented in docs/API.md).
 * Shapes mirror src/perfsight/server/models.py.  Times are integer ns relative to the run's
 * origin; sizes are bytes.  Nothing here formats or renders.
 */

export type RunStatusName = "new" | "stale" | "queued" | "analysing" | "ready" | "failed";

export interface Info {
  version: string;
  base_dir_name: string;
  auth: boolean;
}

export interface RunInfo {
  id: string;
  name: string;
  kind: string;
  ranks: number[];
  steps: number | null;
  date: string;
  size_bytes: number;
  status: RunStatusName;
  error: string | null;
}

export interface RunStatus {
  id: string;
  status: RunStatusName;
  progress: number;
  stage: string;
  error: string | null;
  ranks: number[];
  warnings: string[];
}

export interface PageOf<T> {
  total: number;
  offset: number;
  limit: number;
  rows: T[];
}

export interface StepBreakdown {
  step: number;
  duration_ns: number;
  iteration_interval_ns: number | null;
  fp_bp_ns: number | null;
  tail_ns: number | null;
  computing_ns: number | null;
  communication_ns: number | null;
  overlapped_ns: number | null;
  communication_not_overlapped_ns: number | null;
  free_ns: number | null;
  preparing_ns: number | null;
  data_wait_ns: number | null;
}

export interface Shares {
  total_ns: number;
  computing: number;
  communication_overlapped: number;
  communication_not_overlapped: number;
  free: number;
  preparing: number;
  computing_ns: number;
  communication_overlapped_ns: number;
  communication_not_overlapped_ns: number;
  free_ns: number;
  preparing_ns: number;
}

export interface OperatorTypeShare {
  name: string;
  count: number;
  host_self_ns: number;
  device_total_ns: number;
  share: number;
}

export interface Overview {
  run: string;
  rank: number;
  ranks: number[];
  device: string | null;
  steps: StepBreakdown[];
  shares: Shares;
  top_by: "device_total_ns" | "host_self_ns";
  operator_types: OperatorTypeShare[];
  data_wait: { source: string | null; per_step: Record<string, number> };
  timeline: {
    duration_ns: number;
    events: number;
    tracks: number;
    device_tracks: number;
    by_kind: { kind: string; count: number; total_ns: number }[];
  };
  memory_peaks: {
    device_type: string;
    device_index: number;
    peak_allocated_bytes: number | null;
    peak_reserved_bytes: number | null;
    peak_ts_ns: number | null;
  }[];
  flops: { step: number; flops: number | null; flops_per_s: number | null; mfu: number | null }[];
  warnings: string[];
}

export interface StepRow {
  step: number;
  start_ns: number;
  end_ns: number;
  duration_ns: number;
  fp_start_ns: number | null;
  bp_end_ns: number | null;
  iteration_interval_ns: number | null;
  fp_bp_ns: number | null;
  tail_ns: number | null;
  fp_op: string | null;
  bp_op: string | null;
  timeline: string | null;
  computing_ns: number | null;
  communication_ns: number | null;
  communication_not_overlapped_ns: number | null;
  free_ns: number | null;
}

export interface StepTrace {
  run: string;
  rank: number;
  steps: StepRow[];
  average: {
    duration_ns: number;
    iteration_interval_ns: number;
    fp_bp_ns: number;
    tail_ns: number;
    computing_ns: number;
    communication_ns: number;
    communication_not_overlapped_ns: number;
    free_ns: number;
  } | null;
  fp_ops: string[];
  bp_ops: string[];
  step: number | null;
  intervals: { lane: string; start_ns: number; end_ns: number }[];
}

export interface MemoryDevice {
  device_type: string;
  device_index: number;
  peak_allocated_bytes: number | null;
  peak_reserved_bytes: number | null;
  peak_ts_ns: number | null;
  points: number;
  curve: { ts_ns: number[]; allocated_bytes: (number | null)[]; reserved_bytes: (number | null)[] };
}

export interface Memory {
  run: string;
  rank: number;
  devices: MemoryDevice[];
  top_operators: { name: string; count: number; total_bytes: number; max_bytes: number; avg_lifetime_ns: number | null }[];
}

export interface TrackInfo {
  rank: number;
  track: number;
  name: string;
  is_device: boolean;
  device_index: number;
  stream: number;
  pid: number;
  tid: number;
  max_depth: number;
  events: number;
}

export interface Tracks {
  run: string;
  origin_ns: number;
  origin_ns_text: string;
  end_ns: number;
  ranks: number[];
  kinds: string[];
  tracks: TrackInfo[];
}

export interface Lane {
  depth: number;
  start_ns: number[];
  dur_ns: number[];
  name: number[];
  kind: number[];
  id: number[];
  count: number[];
}

export interface WindowData {
  start_ns: number;
  end_ns: number;
  width_px: number;
  ns_per_px: number;
  names: string[];
  events: number;
  tracks: { rank: number; track: number; lanes: Lane[] }[];
}

export interface FlowRef {
  kind: string;
  direction: "out" | "in";
  id: number;
  track: number;
  name: string;
  start_ns: number;
}

export interface EventDetail {
  rank: number;
  id: number;
  name: string;
  kind: string;
  category: string | null;
  track: number;
  track_name: string;
  pid: number;
  tid: number;
  start_ns: number;
  dur_ns: number;
  depth: number;
  step: number;
  correlation: number;
  external_id: number;
  input_dims: number[][] | null;
  input_types: string[] | null;
  grid: number[] | null;
  block: number[] | null;
  occupancy_pct: number | null;
  bytes: number | null;
  flows: FlowRef[];
}

export interface SearchHit {
  rank: number;
  id: number;
  track: number;
  depth: number;
  name: string;
  start_ns: number;
  dur_ns: number;
}

export interface SearchResult {
  total: number;
  offset: number;
  limit: number;
  query: string;
  hits: SearchHit[];
}

export interface FlowData {
  total: number;
  truncated: boolean;
  flows: {
    rank: number;
    kind: string;
    src_id: number;
    src_track: number;
    src_depth: number;
    src_ts_ns: number;
    dst_id: number;
    dst_track: number;
    dst_depth: number;
    dst_ts_ns: number;
  }[];
}

export class ApiError extends Error {
  constructor(
    message: string,
    readonly status: number,
    readonly body: unknown,
  ) {
    super(message);
  }
}

type Params = Record<string, string | number | boolean | null | undefined>;

function url(path: string, params: Params = {}): string {
  const search = new URLSearchParams();
  for (const [k, v] of Object.entries(params)) {
    if (v !== undefined && v !== null && v !== "") search.set(k, String(v));
  }
  const qs = search.toString();
  return `api/${path}${qs ? `?${qs}` : ""}`;
}

export async function get<T>(path: string, params: Params = {}, signal?: AbortSignal): Promise<T> {
  const response = await fetch(url(path, params), { signal, headers: { Accept: "application/json" } });
  const body = await response.json().catch(() => null);
  if (!response.ok) {
    const detail = body && typeof body === "object" && "detail" in body ? String((body as any).detail) : response.statusText;
    throw new ApiError(detail, response.status, body);
  }
  return body as T;
}
