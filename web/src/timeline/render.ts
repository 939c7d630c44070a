/**
 * Draws one frame of the timeline on a canvas: ruler, track labels, slices and flow arrows.
 * Names are painted with fillText (pixels, not markup).  Keeps the drawn boxes so a click can be
 * mapped back to the slice under it.
 */
import { duration } from "../format";
import { OVERLAP_COLORS, STAGE_COLORS, STEP_MARK_COLOR, TIMELINE_DEVICE_COLORS, TIMELINE_HOST_COLORS } from "../palette";
import type { Flow, Slice, StepMark, Track } from "./types";
import { tickStep, type Viewport } from "./viewport";

export const RULER_H = 26;
export const GUTTER_W = 250;
export const ROW_H = 18;
export const TRACK_GAP = 8;


export interface TrackLayout {
  track: Track;
  top: number; // y of the track's first row, in content coordinates (before scroll)
  height: number;
}

export function layoutTracks(tracks: Track[]): { layouts: TrackLayout[]; height: number } {
  let y = 0;
  const layouts = tracks.map((track) => {
    const height = Math.max(1, track.rows) * ROW_H;
    const layout = { track, top: y, height };
    y += height + TRACK_GAP;
    return layout;
  });
  return { layouts, height: y };
}

function hash(text: string): number {
  let h = 2166136261;
  for (let i = 0; i < text.length; i++) h = Math.imul(h ^ text.charCodeAt(i), 16777619);
  return h >>> 0;
}

export function colorOf(slice: Slice, isDevice: boolean): string {
  const palette = isDevice ? TIMELINE_DEVICE_COLORS : TIMELINE_HOST_COLORS;
  if (slice.kind === "communication") return OVERLAP_COLORS.communication;
  if (slice.kind === "step") return STAGE_COLORS.step;
  return palette[hash(slice.name) % palette.length];
}

interface Box {
  x: number;
  y: number;
  w: number;
  slice: Slice;
}

export class Renderer {
  private boxes: Box[] = [];
  private layoutByKey = new Map<string, TrackLayout>();

  constructor(private readonly canvas: HTMLCanvasElement) {}

  draw(
    view: Viewport,
    layouts: TrackLayout[],
    slices: Slice[],
    flows: Flow[],
    selected: Slice | null,
    highlight: { trackKey: string; start: number; dur: number } | null,
    marks: StepMark[] = [],
  ): void {
    const dpr = window.devicePixelRatio || 1;
    const cssW = this.canvas.clientWidth;
    const cssH = this.canvas.clientHeight;
    if (this.canvas.width !== Math.round(cssW * dpr) || this.canvas.height !== Math.round(cssH * dpr)) {
      this.canvas.width = Math.round(cssW * dpr);
      this.canvas.height = Math.round(cssH * dpr);
    }
    const ctx = this.canvas.getContext("2d");
    if (!ctx) return;
    ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
    ctx.clearRect(0, 0, cssW, cssH);
    ctx.font = "11px system-ui, sans-serif";
    ctx.textBaseline = "middle";
    this.boxes = [];
    this.layoutByKey = new Map(layouts.map((l) => [l.track.key, l]));

    const plotW = cssW - GUTTER_W;
    const yOf = (l: TrackLayout) => RULER_H + l.top - view.scrollY;

    // track backgrounds
    for (const [i, l] of layouts.entries()) {
      const y = yOf(l);
      if (y + l.height < RULER_H || y > cssH) continue;
      ctx.fillStyle = i % 2 ? "#f7f8fa" : "#ffffff";
      ctx.fillRect(GUTTER_W, y, plotW, l.height);
    }

    // slices (clip to the plot area)
    ctx.save();
    ctx.beginPath();
    ctx.rect(GUTTER_W, RULER_H, plotW, cssH - RULER_H);
    ctx.clip();
    for (const slice of slices) {
      const l = this.layoutByKey.get(slice.trackKey);
      if (!l) continue;
      const y = yOf(l) + slice.depth * ROW_H;
      if (y + ROW_H < RULER_H || y > cssH) continue;
      const x0 = GUTTER_W + view.x(slice.start);
      const x1 = GUTTER_W + view.x(slice.start + slice.dur);
      if (x1 < GUTTER_W || x0 > cssW) continue;
      const x = Math.max(x0, GUTTER_W - 1);
      const w = Math.max(1, Math.min(x1, cssW + 1) - x);
      ctx.fillStyle = colorOf(slice, l.track.isDevice);
      ctx.globalAlpha = slice.count > 1 ? 0.6 : 1;
      ctx.fillRect(x, y + 1, w, ROW_H - 2);
      ctx.globalAlpha = 1;
      this.boxes.push({ x, y, w, slice });
      if (w > 30) {
        ctx.fillStyle = "#ffffff";
        const label = slice.count > 1 ? `${slice.name} (×${slice.count})` : slice.name;
        ctx.fillText(fit(ctx, label.replace(/\s+/g, " "), w - 6), x + 3, y + ROW_H / 2);
      }
    }
    if (highlight) {
      const l = this.layoutByKey.get(highlight.trackKey);
      if (l) {
        const x0 = GUTTER_W + view.x(highlight.start);
        const w = Math.max(3, view.x(highlight.start + highlight.dur) - view.x(highlight.start));
        ctx.strokeStyle = "#ff7a00";
        ctx.lineWidth = 2;
        ctx.strokeRect(x0 - 1, yOf(l) - 1, w + 2, l.height + 2);
      }
    }
    if (selected) {
      const box = this.boxes.find((b) => b.slice === selected);
      if (box) {
        ctx.strokeStyle = "#111";
        ctx.lineWidth = 2;
        ctx.strokeRect(box.x, box.y + 1, box.w, ROW_H - 2);
      }
    }
    this.drawFlows(ctx, view, flows, yOf);
    this.drawStepLines(ctx, view, layouts, marks, yOf, cssH);
    ctx.restore();

    this.drawRuler(ctx, view, cssW);
    this.drawStepLabels(ctx, view, marks, cssW);
    this.drawGutter(ctx, layouts, yOf, cssH);
  }

  private drawFlows(
    ctx: CanvasRenderingContext2D,
    view: Viewport,
    flows: Flow[],
    yOf: (l: TrackLayout) => number,
  ): void {
    ctx.strokeStyle = "rgba(40, 40, 40, 0.55)";
    ctx.fillStyle = "rgba(40, 40, 40, 0.7)";
    ctx.lineWidth = 1;
    for (const f of flows) {
      const a = this.layoutByKey.get(f.fromTrack);
      const b = this.layoutByKey.get(f.toTrack);
      if (!a || !b) continue;
      const x0 = GUTTER_W + view.x(f.fromTime);
      const y0 = yOf(a) + f.fromDepth * ROW_H + ROW_H / 2;
      const x1 = GUTTER_W + view.x(f.toTime);
      const y1 = yOf(b) + f.toDepth * ROW_H + ROW_H / 2;
      ctx.beginPath();
      ctx.moveTo(x0, y0);
      ctx.bezierCurveTo(x0 + 20, y0, x1 - 20, y1, x1, y1);
      ctx.stroke();
      const angle = Math.atan2(y1 - y0, Math.max(x1 - x0, 1));
      ctx.beginPath();
      ctx.moveTo(x1, y1);
      ctx.lineTo(x1 - 6 * Math.cos(angle - 0.4), y1 - 6 * Math.sin(angle - 0.4));
      ctx.lineTo(x1 - 6 * Math.cos(angle + 0.4), y1 - 6 * Math.sin(angle + 0.4));
      ctx.closePath();
      ctx.fill();
    }
  }

  /** A dashed line at each step's start (and the last step's end) over the tracks of its rank. */
  private drawStepLines(
    ctx: CanvasRenderingContext2D,
    view: Viewport,
    layouts: TrackLayout[],
    marks: StepMark[],
    yOf: (l: TrackLayout) => number,
    cssH: number,
  ): void {
    if (!marks.length) return;
    const extent = new Map<number, [number, number]>();
    for (const l of layouts) {
      const [top, bottom] = extent.get(l.track.rank) ?? [Infinity, -Infinity];
      extent.set(l.track.rank, [Math.min(top, yOf(l)), Math.max(bottom, yOf(l) + l.height)]);
    }
    ctx.save();
    ctx.strokeStyle = STEP_MARK_COLOR;
    ctx.lineWidth = 1;
    ctx.setLineDash([4, 3]);
    for (const m of marks) {
      const [top, bottom] = extent.get(m.rank) ?? [RULER_H, cssH];
      for (const t of m.last ? [m.start, m.end] : [m.start]) {
        const x = Math.round(GUTTER_W + view.x(t)) + 0.5;
        if (x < GUTTER_W || x > GUTTER_W + view.widthPx) continue;
        ctx.beginPath();
        ctx.moveTo(x, Math.max(RULER_H, top));
        ctx.lineTo(x, Math.min(cssH, bottom));
        ctx.stroke();
      }
    }
    ctx.restore();
  }

  /** "step N" in the ruler at each step's start, for the marks given a label (one rank's). */
  private drawStepLabels(ctx: CanvasRenderingContext2D, view: Viewport, marks: StepMark[], cssW: number): void {
    ctx.save();
    ctx.beginPath();
    ctx.rect(GUTTER_W, 0, cssW - GUTTER_W, RULER_H);
    ctx.clip();
    ctx.font = "bold 10px system-ui, sans-serif";
    for (const m of marks) {
      if (!m.label) continue;
      const x0 = GUTTER_W + view.x(m.start);
      const x1 = GUTTER_W + view.x(m.end);
      if (x1 < GUTTER_W || x0 > cssW) continue;
      const x = Math.max(x0, GUTTER_W);
      const w = Math.min(ctx.measureText(m.label).width + 8, Math.max(0, x1 - x - 2));
      if (w < 20) continue;
      ctx.fillStyle = STEP_MARK_COLOR;
      ctx.fillRect(x, RULER_H - 12, w, 11);
      ctx.fillStyle = "#ffffff";
      ctx.fillText(fit(ctx, m.label, w - 6), x + 3, RULER_H - 6.5);
    }
    ctx.restore();
  }

  private drawRuler(ctx: CanvasRenderingContext2D, view: Viewport, cssW: number): void {
    ctx.fillStyle = "#eef1f5";
    ctx.fillRect(0, 0, cssW, RULER_H);
    ctx.strokeStyle = "#c9cfd8";
    ctx.beginPath();
    ctx.moveTo(0, RULER_H - 0.5);
    ctx.lineTo(cssW, RULER_H - 0.5);
    ctx.stroke();
    const step = tickStep(view.spanNs, view.widthPx);
    const first = Math.ceil(view.startNs / step) * step;
    ctx.fillStyle = "#4a5567";
    for (let tick = first; tick <= view.endNs; tick += step) {
      const x = GUTTER_W + view.x(tick);
      ctx.fillRect(x, RULER_H - 7, 1, 7);
      ctx.fillText(duration(tick, step < 1e3 ? 3 : 2), x + 3, RULER_H / 2 - 5);
    }
  }

  private drawGutter(
    ctx: CanvasRenderingContext2D,
    layouts: TrackLayout[],
    yOf: (l: TrackLayout) => number,
    cssH: number,
  ): void {
    ctx.fillStyle = "#f1f3f6";
    ctx.fillRect(0, RULER_H, GUTTER_W, cssH - RULER_H);
    ctx.save();
    ctx.beginPath();
    ctx.rect(0, RULER_H, GUTTER_W, cssH - RULER_H);
    ctx.clip();
    for (const l of layouts) {
      const y = yOf(l);
      if (y + l.height < RULER_H || y > cssH) continue;
      ctx.fillStyle = l.track.isDevice ? "#24437a" : "#333a45";
      ctx.fillText(fit(ctx, `${l.track.name}`.replace(/\s+/g, " "), GUTTER_W - 12), 6, y + ROW_H / 2);
      ctx.fillStyle = "#dde2ea";
      ctx.fillRect(0, y + l.height + TRACK_GAP / 2, GUTTER_W, 1);
    }
    ctx.restore();
    ctx.fillStyle = "#c9cfd8";
    ctx.fillRect(GUTTER_W - 1, 0, 1, cssH);
  }

  /** The track whose label is at canvas point (x, y) in the gutter, if any. */
  trackAt(x: number, y: number, layouts: TrackLayout[], scrollY: number): Track | null {
    if (x > GUTTER_W || y < RULER_H) return null;
    const content = y - RULER_H + scrollY;
    const l = layouts.find((t) => content >= t.top && content < t.top + t.height + TRACK_GAP);
    return l ? l.track : null;
  }

  /** The slice drawn at canvas point (x, y), if any. */
  hit(x: number, y: number): Slice | null {
    for (let i = this.boxes.length - 1; i >= 0; i--) {
      const b = this.boxes[i];
      if (x >= b.x - 1 && x <= b.x + b.w + 1 && y >= b.y && y <= b.y + ROW_H) return b.slice;
    }
    return null;
  }
}

function fit(ctx: CanvasRenderingContext2D, text: string, width: number): string {
  if (ctx.measureText(text).width <= width) return text;
  let lo = 0;
  let hi = text.length;
  while (lo < hi) {
    const mid = (lo + hi + 1) >> 1;
    if (ctx.measureText(text.slice(0, mid) + "…").width <= width) lo = mid;
    else hi = mid - 1;
  }
  return lo > 0 ? text.slice(0, lo) + "…" : "";
}
