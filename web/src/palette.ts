/**
 * One colour per step-trace stage and per overlap category, for every chart and legend of the UI:
 * iteration gap, forward+backward and tail (and computing, communication, free, bubble...) look
 * the same on every page, so a user who learnt them on one chart reads them on the next.
 * Nothing else decides these colours.
 */

/** The stages of a step (step trace). */
export const STAGE_COLORS = {
  step: "#8c96a8",
  iterationInterval: "#e0a030",
  fpBp: "#3b6fd4",
  tail: "#6b8e23", // olive, not computing's green: the tail is mostly optimizer and exposed communication
} as const;

/** Where a step's time goes (overlap breakdown), including a pipeline's bubble. */
export const OVERLAP_COLORS = {
  computing: "#2fa37a",
  communication: "#8a63d2",
  communicationNotOverlapped: "#d9534f",
  overlapped: "#1aa3b8",
  free: "#b4bcc8",
  freeHostWait: "#7d8796",
  preparing: "#e0a030",
  bubble: "#c0619e",
  receive: "#7a5c3e",
} as const;

/** Series with no stage or category of their own (operator types, memory curves), in order. */
export const SERIES_COLORS = ["#5470c6", "#91cc75", "#fac858", "#ee6666", "#73c0de", "#3ba272", "#fc8452", "#9a60b4", "#ea7ccc"];

/** Time spent waiting for data: part of the iteration gap, so drawn in its colour. */
export const DATA_WAIT_COLOR = STAGE_COLORS.iterationInterval;

/** Timeline slices coloured by name (host threads, device streams); kinds with a meaning use the colours above. */
export const TIMELINE_HOST_COLORS = ["#5b8def", "#4fb38a", "#e6a23c", "#9b7be0", "#3fb1c9", "#d46fa8", "#8fa14a", "#d98b52"];
export const TIMELINE_DEVICE_COLORS = ["#2f5fc4", "#238a60", "#c27c10", "#7650c0", "#1f8ea5", "#b04b86"];

/** Step boundaries drawn over the timeline: the step-trace colour of a whole step. */
export const STEP_MARK_COLOR = STAGE_COLORS.step;

/** The advisor's severities (findings): the same three colours on every badge and marker. */
export const SEVERITY_COLORS = {
  critical: "#c2413c",
  warning: "#d48a12",
  info: "#8c96a8",
} as const;

/** The job heatmaps' colour ramps (share 0 -> 1, light to dark) and the time overview's series:
 * memory and FLOPs each keep one hue, so the two heatmaps are never read as one scale. */
export const HEATMAP_RAMPS = {
  memory: ["#eef3fc", "#1f4fa8"],
  flops: ["#f6effc", "#5b2e9e"],
  missing: "#e4e7ec",
} as const;
export const TIME_OVERVIEW_COLORS = {
  band: "#c9d5ea",
  median: "#3b6fd4",
  communication: OVERLAP_COLORS.communication,
  wait: "#d48a12",
  selected: "#c2413c",
} as const;
/** Where a communication op's time goes (job Communication page): elapse = transit + wait + idle. */
export const COMM_COLORS = {
  transit: "#8a63d2",
  wait: "#e0a030",
  idle: "#b4bcc8",
} as const;

/** The communication matrix's colour ramp, low to high (viridis: perceptually ordered, every step
 * distinct from the light grey of an empty cell, and readable by colour-blind users). */
export const HEAT_RAMP = ["#440154", "#414487", "#2a788e", "#22a884", "#7ad151", "#fde725"] as const;
/** An empty cell of the matrix (no link). */
export const HEAT_EMPTY = "#eef1f5";

/** Op categories of the parallel-execution views (seed 000: compute green, communication orange),
 * the same on the Marey view, the pipeline chart and the parallel-strategy graph. */
export const OP_CATEGORY_COLORS: Record<string, string> = {
  compute: "#2e9e5b",
  communication: "#f08c00",
  collective: "#f08c00",
  p2p: "#e8590c",
  "memory copy": "#4c8bd9",
  optimizer: "#8e5cc4",
  mixed: "#8a94a6",
};

/** A pipeline stage's micro-batch blocks (pipeline chart): forward light, backward dark. */
export const PIPELINE_PHASE_COLORS = { forward: "#7fb3e6", backward: "#2f6fb0", idle: "#eef1f5" } as const;
