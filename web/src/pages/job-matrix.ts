/**
 * The job's Communication matrix (seed 003's 通信矩阵): a source rank x destination rank heatmap
 * of bandwidth, size or time, per step, op family and group, drawn on a canvas.
 *
 * The page tells the server how many cells a side it can draw (about one per 3 pixels); the server
 * groups consecutive ranks into blocks so that the job fits (a 1,024-rank job shows 4 ranks a block
 * on this page) and returns only the blocks holding a link (src/job_matrix.py says what a block's
 * value is).  Pointing at a cell shows its ranks and value; clicking a block of several ranks zooms
 * into it, clicking a single rank's cell opens that source rank's pages.
 */
import { get, type CommMatrix } from "../api";
import { card, segmented } from "../components/card";
import type { PageContext } from "../context";
import { h, replace } from "../dom";
import * as fmt from "../format";
import { t } from "../i18n";
import { HEAT_EMPTY, HEAT_RAMP } from "../palette";
import { href } from "../router";
import { bandwidth, groupChooser, knownStep, opChooser, stepChooser } from "./job-comm";
import { rankLink } from "./job";

type Metric = "bandwidth" | "size" | "time";
const METRICS: Metric[] = ["bandwidth", "size", "time"];
/** Smallest cell the page asks for, in CSS pixels: below it a cell cannot be pointed at. */
const MIN_CELL_PX = 3;
const LEFT = 64;
const TOP = 44;
/** The side panel's width and the gap before it (style.css, .matrix-body). */
const SIDE_PX = 324;
/** Cells at least this wide show their value as text. */
const TEXT_CELL_PX = 64;

export function formatValue(metric: string, value: number | null | undefined): string {
  if (value === null || value === undefined) return "–";
  if (metric === "bandwidth") return bandwidth(value);
  if (metric === "size") return fmt.bytes(Math.round(value));
  return fmt.duration(value);
}

/** The ramp's colour at `x` in [0, 1], as [r, g, b]. */
function ramp(x: number): number[] {
  const stops = HEAT_RAMP.map((c) => [1, 3, 5].map((i) => parseInt(c.slice(i, i + 2), 16)));
  const pos = Math.min(1, Math.max(0, x)) * (stops.length - 1);
  const i = Math.min(stops.length - 2, Math.floor(pos));
  const f = pos - i;
  return stops[i].map((v, k) => Math.round(v + (stops[i + 1][k] - v) * f));
}

const css = (rgb: number[]) => `rgb(${rgb.join(",")})`;
/** Text colour readable on `rgb` (dark on light cells, white on dark ones). */
const ink = (rgb: number[]) => (0.299 * rgb[0] + 0.587 * rgb[1] + 0.114 * rgb[2] > 140 ? "#1d2533" : "#ffffff");

function rankRange(lo: number, block: number, index: number, hi: number): [number, number] {
  const start = lo + index * block;
  return [start, Math.min(hi, start + block) - 1];
}

/** Values from which the colour ramp starts and ends.  With many cells, the median ± 4 scaled
 * median absolute deviations (the spread measure of the slow-link analysis), within the smallest
 * and largest value: a few outliers (a link of near-zero transit time has a huge bandwidth) would
 * otherwise paint every other cell the same colour.  Cells beyond take the end colours, and the
 * legend says so.  With few cells, or no spread, the smallest and largest value. */
function colourDomain(values: number[]): [number, number] {
  if (!values.length) return [0, 0];
  const sorted = [...values].sort((a, b) => a - b);
  const [min, max] = [sorted[0], sorted[sorted.length - 1]];
  if (sorted.length < CLIP_CELLS) return [min, max];
  const median = (xs: number[]) => (xs[Math.floor((xs.length - 1) / 2)] + xs[Math.ceil((xs.length - 1) / 2)]) / 2;
  const mid = median(sorted);
  const mad = 1.4826 * median(sorted.map((v) => Math.abs(v - mid)).sort((a, b) => a - b));
  if (!(mad > 0)) return [min, max];
  return [Math.max(min, mid - 4 * mad), Math.min(max, mid + 4 * mad)];
}
/** From this many cells on, the colour ramp is robust to outliers (see colourDomain). */
const CLIP_CELLS = 50;

const rangeText = (range: [number, number]) => (range[0] === range[1] ? String(range[0]) : `${range[0]}–${range[1]}`);

export async function jobMatrixPage(ctx: PageContext): Promise<void> {
  const c = t.comm;
  const p = ctx.params;
  const metricParam = p.get("metric") as Metric | null;
  const metric: Metric = metricParam && METRICS.includes(metricParam) ? metricParam : "bandwidth";
  const state: Record<string, string | null> = {
    metric,
    step: await knownStep(ctx.run, p.get("step")),
    op: p.get("op") ?? "",
    group: p.get("group") ?? "",
    src_lo: p.get("src_lo"),
    src_hi: p.get("src_hi"),
    dst_lo: p.get("dst_lo"),
    dst_hi: p.get("dst_hi"),
  };
  const go = (extra: Record<string, string | number | null>) => {
    window.location.hash = href("job-matrix", { run: ctx.run, ...state, ...extra });
  };

  // lay the page out first: the canvas's size decides how many cells to ask for
  const wrap = h("div", { class: "matrix-wrap" });
  const canvas = h("canvas", { "data-testid": "matrix-canvas" });
  const hoverBox = h("div", { class: "matrix-tip", "data-testid": "matrix-tip" });
  hoverBox.hidden = true;
  wrap.append(canvas, hoverBox);
  const side = h("div", { class: "matrix-side" });
  const tools = h("div", { class: "job-tools" });
  const body = h("div", { class: "matrix-body" }, wrap, side);
  replace(ctx.root, h("div", { class: "grid" }, card({ title: c.matrix, hint: c.matrixHint, full: true, testId: "card-matrix", tools: [tools] }, body)));
  // the card's width less the side panel (300 px) and the gap; the window's height less the page's head
  const available = Math.min((body.clientWidth || 1100) - SIDE_PX, Math.max(360, window.innerHeight - 250), 1000);
  const plot = available - LEFT - 8;
  const cells = Math.max(1, Math.floor(plot / MIN_CELL_PX));

  const data = await get<CommMatrix>("job/communication/matrix", {
    run: ctx.run, metric, step: state.step, op: state.op, group: state.group, cells,
    src_lo: state.src_lo, src_hi: state.src_hi, dst_lo: state.dst_lo, dst_hi: state.dst_hi,
  }); // prettier-ignore

  const metricSeg = segmented(METRICS.map((m) => [m, c.metric[m]] as [Metric, string]), metric, (m) => go({ metric: m }));
  metricSeg.setAttribute("data-testid", "matrix-metric");
  const op = opChooser(data.choices, data.op, "matrix-op");
  op.addEventListener("change", () => go({ op: op.value || null }));
  const group = groupChooser(data.choices, data.group, "matrix-group");
  group.addEventListener("change", () => go({ group: group.value || null }));
  const zoomed = data.src_lo > 0 || data.dst_lo > 0 || data.src_hi < data.ranks || data.dst_hi < data.ranks;
  const reset = h("button", { type: "button", class: "btn", "data-testid": "matrix-reset" }, c.resetZoom);
  reset.addEventListener("click", () => go({ src_lo: null, src_hi: null, dst_lo: null, dst_hi: null }));
  replace(tools, metricSeg, stepChooser(data.choices, data.step, (s) => go({ step: s })), op, group, zoomed ? reset : null);

  const rowsN = Math.max(1, data.rows);
  const colsN = Math.max(1, data.columns);
  const cellPx = plot / Math.max(rowsN, colsN);
  const width = LEFT + colsN * cellPx + 8;
  const height = TOP + rowsN * cellPx + 8;
  const dpr = window.devicePixelRatio || 1;
  canvas.width = Math.round(width * dpr);
  canvas.height = Math.round(height * dpr);
  canvas.style.width = `${width}px`;
  canvas.style.height = `${height}px`;
  const shown = { metric: data.metric, op: data.op, group: data.group, links: data.cells.links.reduce((a, b) => a + b, 0) };
  // what is drawn, for tests and tools: the layout (CSS px), the choices, the links counted
  Object.entries({ ...shown, left: LEFT, top: TOP, cell: cellPx, rows: rowsN, columns: colsN, block: data.block, "src-lo": data.src_lo, "dst-lo": data.dst_lo }).forEach(([k, v]) =>
    canvas.setAttribute(`data-${k}`, String(v)),
  );

  const cellsData = data.cells;
  const index = new Map<number, number>();
  cellsData.src_block.forEach((row, i) => index.set(row * colsN + cellsData.dst_block[i], i));
  const [lo, hi] = colourDomain(cellsData.value);
  const span = hi - lo;
  const colour = (v: number) => ramp(span > 0 ? (v - lo) / span : 1);
  const labelled = cellPx >= TEXT_CELL_PX;
  const g = canvas.getContext("2d") as CanvasRenderingContext2D;

  const draw = (hover: [number, number] | null) => {
    g.setTransform(dpr, 0, 0, dpr, 0, 0);
    g.clearRect(0, 0, width, height);
    g.fillStyle = HEAT_EMPTY;
    g.fillRect(LEFT, TOP, colsN * cellPx, rowsN * cellPx);
    const gap = cellPx >= 8 ? 1 : 0;
    g.font = "12px system-ui, sans-serif";
    g.textAlign = "center";
    g.textBaseline = "middle";
    cellsData.value.forEach((v, i) => {
      const rgb = colour(v);
      const x = LEFT + cellsData.dst_block[i] * cellPx;
      const y = TOP + cellsData.src_block[i] * cellPx;
      g.fillStyle = css(rgb);
      g.fillRect(x, y, cellPx - gap, cellPx - gap);
      if (labelled) {
        g.fillStyle = ink(rgb);
        g.fillText(formatValue(metric, v), x + cellPx / 2, y + cellPx / 2, cellPx - 6);
      }
    });
    // axis titles: destination across the top, source down the left
    g.fillStyle = "#1d2533";
    g.font = "600 12px system-ui, sans-serif";
    g.textAlign = "left";
    g.textBaseline = "top";
    g.fillText(`${c.columnsAxis} →`, LEFT, 2);
    g.save();
    g.translate(4, TOP);
    g.rotate(Math.PI / 2);
    g.fillText(`${c.rows} →`, 0, -14);
    g.restore();
    // rank labels, far enough apart to read
    g.fillStyle = "#5b6472";
    g.font = "11px system-ui, sans-serif";
    let every = 1; // a power of two of blocks, so labels fall on round rank numbers
    while (every * cellPx < 34) every *= 2;
    g.textAlign = "right";
    g.textBaseline = "middle";
    for (let i = 0; i < rowsN; i += every) g.fillText(String(data.src_lo + i * data.block), LEFT - 6, TOP + (i + 0.5) * cellPx);
    g.textAlign = "center";
    g.textBaseline = "bottom";
    for (let j = 0; j < colsN; j += every) g.fillText(String(data.dst_lo + j * data.block), LEFT + (j + 0.5) * cellPx, TOP - 4);
    if (hover) {
      g.strokeStyle = "#1d2533";
      g.lineWidth = 2;
      g.strokeRect(LEFT + hover[1] * cellPx, TOP + hover[0] * cellPx, cellPx, cellPx);
    }
  };
  draw(null);

  const at = (event: MouseEvent): [number, number] | null => {
    const rect = canvas.getBoundingClientRect();
    const col = Math.floor((event.clientX - rect.left - LEFT) / cellPx);
    const row = Math.floor((event.clientY - rect.top - TOP) / cellPx);
    return row >= 0 && row < rowsN && col >= 0 && col < colsN ? [row, col] : null;
  };
  const hoverPanel = h("dl", { class: "kv", "data-testid": "matrix-hover" }, h("dt", {}, c.hover));
  const describe = (cell: [number, number]) => {
    const src = rankRange(data.src_lo, data.block, cell[0], data.src_hi);
    const dst = rankRange(data.dst_lo, data.block, cell[1], data.dst_hi);
    const i = index.get(cell[0] * colsN + cell[1]);
    const lines: [string, string][] = [
      [c.columns.src, rangeText(src)],
      [c.columns.dst, rangeText(dst)],
      [c.metric[metric], i === undefined ? c.empty : formatValue(metric, cellsData.value[i])],
    ];
    if (i !== undefined) {
      lines.push([c.links, fmt.count(cellsData.links[i])]);
      if (cellsData.links[i] > 1) lines.push([c.range, `${formatValue(metric, cellsData.low[i])} – ${formatValue(metric, cellsData.high[i])}`]);
      lines.push([c.linkTypes, cellsData.link_types[i]]);
    }
    return { src, dst, lines, found: i !== undefined };
  };
  canvas.addEventListener("mousemove", (event) => {
    const cell = at(event);
    draw(cell);
    if (!cell) {
      hoverBox.hidden = true;
      return;
    }
    const { src, dst, lines, found } = describe(cell);
    replace(hoverPanel, lines.flatMap(([k, v]) => [h("dt", {}, k), h("dd", {}, v)]));
    hoverPanel.setAttribute("data-src", rangeText(src));
    hoverPanel.setAttribute("data-dst", rangeText(dst));
    replace(hoverBox, h("b", {}, `${rangeText(src)} → ${rangeText(dst)}`), h("br"), found ? lines[2][1] : c.empty);
    hoverBox.hidden = false;
    const rect = wrap.getBoundingClientRect();
    hoverBox.style.left = `${Math.min(event.clientX - rect.left + 14, rect.width - 200)}px`;
    hoverBox.style.top = `${event.clientY - rect.top + 14}px`;
  });
  canvas.addEventListener("mouseleave", () => {
    hoverBox.hidden = true;
    draw(null);
  });
  canvas.addEventListener("click", (event) => {
    const cell = at(event);
    if (!cell) return;
    const src = rankRange(data.src_lo, data.block, cell[0], data.src_hi);
    const dst = rankRange(data.dst_lo, data.block, cell[1], data.dst_hi);
    if (data.block === 1) window.location.hash = rankLink(ctx.run, src[0]);
    else go({ src_lo: src[0], src_hi: src[1] + 1, dst_lo: dst[0], dst_hi: dst[1] + 1 });
  });

  const gradient = h("div", { class: "matrix-ramp" });
  gradient.style.background = `linear-gradient(to right, ${HEAT_RAMP.join(", ")})`;
  replace(
    side,
    h("div", { class: "matrix-legend", "data-testid": "matrix-legend" },
      h("div", { class: "muted" }, c.metric[metric]),
      gradient,
      h("div", { class: "matrix-ramp-labels" },
        h("span", {}, `${lo > (data.min ?? lo) ? "≤ " : ""}${formatValue(metric, lo)}`),
        h("span", {}, `${hi < (data.max ?? hi) ? "≥ " : ""}${formatValue(metric, hi)}`)),
      lo > (data.min ?? lo) || hi < (data.max ?? hi) ? h("div", { class: "muted small" }, c.clipped(formatValue(metric, data.min), formatValue(metric, data.max))) : null,
    ), // prettier-ignore
    h("p", { class: "muted", "data-testid": "matrix-block" }, data.block > 1 ? c.blockOf(data.block) : c.oneRank, ` · ${c.axisRanks(data.ranks)}`),
    cellsData.value.length ? null : h("p", { class: "muted", "data-testid": "matrix-empty" }, c.empty),
    hoverPanel,
    h("p", { class: "muted small" }, c.aggregation),
  );
}
