/**
 * The visible window of the timeline: a time range (ns, relative to the trace's start) mapped to
 * canvas pixels, plus a vertical scroll offset.  Pure arithmetic, so zoom and pan behave the same
 * for the mouse and the keyboard.
 */

export const MIN_SPAN_NS = 1_000; // 1 µs across the whole canvas is as far as zooming goes

export class Viewport {
  constructor(
    public startNs: number,
    public endNs: number,
    public widthPx: number,
    public readonly boundsStart: number,
    public readonly boundsEnd: number,
    public scrollY = 0,
  ) {}

  get spanNs(): number {
    return this.endNs - this.startNs;
  }

  x(ns: number): number {
    return ((ns - this.startNs) / this.spanNs) * this.widthPx;
  }

  ns(x: number): number {
    return this.startNs + (x / this.widthPx) * this.spanNs;
  }

  /** Zoom by `factor` (< 1 zooms in) keeping the time under pixel `anchorX` where it is. */
  zoom(factor: number, anchorX = this.widthPx / 2): void {
    const anchor = this.ns(anchorX);
    const fullSpan = this.boundsEnd - this.boundsStart;
    const span = Math.min(Math.max(this.spanNs * factor, MIN_SPAN_NS), Math.max(fullSpan, MIN_SPAN_NS));
    const ratio = anchorX / this.widthPx;
    this.set(anchor - span * ratio, anchor - span * ratio + span);
  }

  /** Pan by a number of pixels (positive moves the view later in time). */
  pan(dx: number): void {
    const dt = (dx / this.widthPx) * this.spanNs;
    this.set(this.startNs + dt, this.endNs + dt);
  }

  /** Show [start, end], clamped to the trace. */
  set(start: number, end: number): void {
    const span = Math.max(end - start, MIN_SPAN_NS);
    let s = start;
    if (s + span > this.boundsEnd) s = this.boundsEnd - span;
    if (s < this.boundsStart) s = this.boundsStart;
    this.startNs = s;
    this.endNs = s + span;
  }

  reset(): void {
    this.set(this.boundsStart, this.boundsEnd);
    this.scrollY = 0;
  }
}

/** Tick spacing for a ruler: 1, 2 or 5 × 10^k ns, about `targetPx` apart. */
export function tickStep(spanNs: number, widthPx: number, targetPx = 110): number {
  const raw = (spanNs / Math.max(widthPx, 1)) * targetPx;
  const pow = 10 ** Math.floor(Math.log10(Math.max(raw, 1)));
  for (const m of [1, 2, 5, 10]) if (m * pow >= raw) return m * pow;
  return 10 * pow;
}
