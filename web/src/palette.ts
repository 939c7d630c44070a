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
  tail: "#2fa37a",
} as const;

/** Where a step's time goes (overlap breakdown), including a pipeline's bubble. */
export const OVERLAP_COLORS = {
  computing: "#2fa37a",
  communication: "#8a63d2",
  communicationNotOverlapped: "#d9534f",
  overlapped: "#1aa3b8",
  free: "#b4bcc8",
  preparing: "#e0a030",
  bubble: "#c0619e",
  receive: "#7a5c3e",
} as const;

/** The advisor's severities (findings): the same three colours on every badge and marker. */
export const SEVERITY_COLORS = {
  critical: "#c2413c",
  warning: "#d48a12",
  info: "#8c96a8",
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
