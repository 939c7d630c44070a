/**
 * The Marey view (seed 000, 各设备算子执行时间线分析): for the selected step, one timeline per device,
 * grouped by pipeline stage; compute ops green, communication orange, merged runs of both grey.
 * The same op on the devices of a stage (matched by the cluster analysis: a collective by group
 * and sequence number, any other op by its name and rank among that name's ops in the step) is
 * joined from one device's row to the next into a filled band, so an op long on every device is a
 * wide band and a device slow on one op bulges it (the seed's fig. 6a and 6b).  Left of each
 * timeline, three colour blocks: the device's FLOPs over the heaviest device's, its FLOP/s (FLOPs
 * over its compute time in the step) over the fastest's, and its peak memory (over capacity, or
 * over the largest peak).  Over each timeline, its FLOP/s (purple) and allocated memory (blue).
 *
 * Every item is read from /api/job/marey (server/job_parallel.py) at this chart's width in pixels:
 * ops narrower than a pixel come merged into runs, never dropped.  A brushed window is asked for
 * again, so its ops are drawn at full resolution; a double-click asks for the whole step.  An
 * item's intervals come as columns aligned with its stage's drawn devices (offsets from the item's
 * start and durations, ns: a 32-device page at 1,024 ranks is ~1,100 items), decoded here.  The
 * timelines are drawn on a canvas (a 32-device page holds tens of thousands of intervals); labels,
 * blocks and stage headers are SVG.  Click a stage to fold or unfold it, hover an op for its name
 * and its start/end on each device, click a device to open its rank's timeline.
 */
import { get } from "../api";
import type { components } from "../api-types";
import { card } from "../components/card";
import type { PageContext } from "../context";
import { escapeHtml, h, replace } from "../dom";
import * as fmt from "../format";
import { OP_CATEGORY_COLORS } from "../palette";
import { t } from "../i18n";
import { href } from "../router";
import { stepPicker } from "./job-pipeline";

type JobMarey = components["schemas"]["JobMarey"];
type MareyOp = components["schemas"]["MareyOp"];
type MareyLine = components["schemas"]["MareyLine"];

const LABEL = 206;
const RIGHT = 10;
const LINE = 10;
const GAP = 34;
const STAGE_GAP = 18;
const HEADER = 16;
const TOP = 22;
const FLOPS_COLOR = "#7b3fe4";
const MEMORY_COLOR = "#1f6fd1";

interface Layout {
  y: Map<number, number>;
  /** Per stage: where its header is, and its folded row (when folded). */
  stages: Map<number, { header: number; row: number | null; devices: number }>;
  /** Per unfolded stage: its drawn devices' ranks, in the order of an item's ``starts``/``durs``/``counts``. */
  members: Map<number, number[]>;
  height: number;
}

/** One drawn device's interval of an item: its rank, its index in the item's columns, start and end (ns from the step's first op), its ops. */
interface Interval {
  rank: number;
  k: number;
  start: number;
  end: number;
  count: number;
}

/** An item's intervals on the drawn devices that ran it (the answer's columns decoded). */
function intervals(op: MareyOp, members: number[]): Interval[] {
  const out: Interval[] = [];
  for (let k = 0; k < op.starts.length && k < members.length; k++) {
    const s = op.starts[k];
    if (s === null || s === undefined) continue;
    const start = op.start_ns + s;
    out.push({ rank: members[k], k, start, end: start + (op.durs[k] ?? 0), count: op.counts ? (op.counts[k] ?? 0) : 1 });
  }
  return out;
}

/** Stage headers in order; a folded stage is one row, an unfolded one its drawn devices. */
function layout(data: JobMarey): Layout {
  const y = new Map<number, number>();
  const stages = new Map<number, { header: number; row: number | null; devices: number }>();
  const members = new Map<number, number[]>();
  let at = TOP;
  for (const st of data.stages) {
    if (stages.size) at += STAGE_GAP;
    const group = { header: at, row: null as number | null, devices: st.devices };
    stages.set(st.stage, group);
    at += HEADER;
    if (st.folded) {
      group.row = at;
      at += LINE + GAP;
      continue;
    }
    const ranks: number[] = [];
    for (const d of data.devices) {
      if (d.stage !== st.stage) continue;
      y.set(d.rank, at);
      ranks.push(d.rank);
      at += LINE + GAP;
    }
    members.set(st.stage, ranks);
  }
  return { y, stages, members, height: at + 14 };
}

function share(v: number | null | undefined): string {
  const s = Math.min(1, Math.max(0, v ?? 0));
  return `rgb(${Math.round(235 - 150 * s)},${Math.round(240 - 120 * s)},${Math.round(250 - 60 * s)})`;
}

/** The SVG layer: block headings, stage headers, device labels and blocks, time ticks, brush. */
function labels(data: JobMarey, lay: Layout, width: number): string {
  const s = t.parallel.marey;
  const blocks: [number, string][] = [
    [110, s.flopsShort],
    [149, s.rateShort],
    [188, s.memoryShort],
  ];
  const parts = blocks.map(([x, label]) => `<text x="${x}" y="12" class="pv-sub" text-anchor="middle">${escapeHtml(label)}</text>`);
  for (const [stage, group] of lay.stages) {
    const label = group.row !== null ? s.folded(stage, group.devices) : s.unfolded(stage);
    parts.push(`<text x="4" y="${group.header + 11}" class="pv-sub mv-stage" data-stage="${stage}" data-folded="${group.row !== null}">${escapeHtml(label)}</text>`);
    if (group.row !== null) parts.push(`<g class="mv-stage-row" data-stage="${stage}"><rect x="0" y="${group.row - 2}" width="1" height="1" fill="none"/></g>`);
  }
  for (const d of data.devices) {
    const y = lay.y.get(d.rank);
    if (y === undefined) continue;
    const memory = d.peak_share ?? d.peak_of_max;
    const cell = (x: number, v: number | null | undefined, title: string) =>
      `<rect x="${x - 16}" y="${y - 2}" width="32" height="${LINE + 4}" fill="${share(v)}" stroke="#cfd6e0"><title>${escapeHtml(`${title}: ${fmt.percent(v)}`)}</title></rect>`;
    parts.push(
      `<g class="mv-device" data-rank="${d.rank}" data-stage="${d.stage}">`,
      `<text x="4" y="${y + LINE}" class="pv-label">${escapeHtml(s.device(d.rank, d.stage))}</text>`,
      cell(110, d.flops_of_max, s.flops),
      cell(149, d.flops_per_s_of_max, s.flopsRate),
      cell(188, memory, s.memory),
      "</g>",
    );
  }
  const [a, b] = [data.window_start_ns, data.window_end_ns];
  const plot = width - LABEL - RIGHT;
  const ticks = [0, 0.25, 0.5, 0.75, 1]
    .map((f) => `<text x="${LABEL + plot * f}" y="${lay.height - 2}" class="pv-sub" text-anchor="${f === 1 ? "end" : f === 0 ? "start" : "middle"}">${escapeHtml(`${fmt.ms(a + f * (b - a), 3)} ${fmt.MS}`)}</text>`)
    .join("");
  return `<svg width="${width}" height="${lay.height + 12}" data-testid="marey-chart">${parts.join("")}${ticks}<rect class="mv-brush" x="0" y="0" width="0" height="${lay.height}" visibility="hidden"/></svg>`;
}

/** One device's series as a step line in the gap under its row (values over ``top``, clamped). */
function drawLine(g: CanvasRenderingContext2D, line: MareyLine, top: number | null | undefined, y: number, color: string, hold: boolean, plot: number, px: number): void {
  if (!line.bins.length || !top) return;
  const base = y + LINE + GAP - 6;
  const height = GAP - 10;
  const at = (v: number) => base - height * Math.min(1, Math.max(0, v / top));
  const step = plot / px;
  g.strokeStyle = color;
  g.lineWidth = 1.2;
  g.beginPath();
  let last: number | null = null;
  let lastBin = -2;
  line.bins.forEach((bin, k) => {
    const x0 = LABEL + Math.max(0, bin) * step;
    const v = line.values[k];
    if (last === null) g.moveTo(x0, at(v));
    else if (hold || bin === lastBin + 1) g.lineTo(x0, at(last)), g.lineTo(x0, at(v));
    else g.lineTo(LABEL + (lastBin + 1) * step, at(last)), g.lineTo(LABEL + (lastBin + 1) * step, at(0)), g.lineTo(x0, at(0)), g.lineTo(x0, at(v));
    g.lineTo(LABEL + (bin + 1) * step, at(v));
    last = v;
    lastBin = bin;
  });
  if (hold && last !== null) g.lineTo(LABEL + plot, at(last));
  g.stroke();
}

/** The canvas layer: each item's interval per device and the bands joining consecutive devices. */
function paint(canvas: HTMLCanvasElement, data: JobMarey, lay: Layout, width: number, lines: boolean): void {
  const ratio = window.devicePixelRatio || 1;
  canvas.width = Math.round(width * ratio);
  canvas.height = Math.round(lay.height * ratio);
  canvas.style.width = `${width}px`;
  canvas.style.height = `${lay.height}px`;
  const g = canvas.getContext("2d");
  if (!g) return;
  g.scale(ratio, ratio);
  const [a, b] = [data.window_start_ns, data.window_end_ns];
  const plot = width - LABEL - RIGHT;
  const x = (ns: number) => LABEL + (plot * (Math.min(Math.max(ns, a), b) - a)) / Math.max(1, b - a);
  g.strokeStyle = "#d5dbe3";
  g.lineWidth = 1;
  const rows = [...lay.y.values(), ...[...lay.stages.values()].flatMap((s) => (s.row === null ? [] : [s.row]))];
  for (const y of rows) {
    g.beginPath();
    g.moveTo(LABEL, y + LINE / 2);
    g.lineTo(width - RIGHT, y + LINE / 2);
    g.stroke();
  }
  for (const op of data.ops) {
    const color = OP_CATEGORY_COLORS[op.category] ?? OP_CATEGORY_COLORS.mixed;
    const folded = lay.stages.get(op.stage)?.row ?? null;
    g.fillStyle = color;
    if (folded !== null) {
      g.fillRect(x(op.start_ns), folded, Math.max(0.8, x(op.end_ns) - x(op.start_ns)), LINE);
      continue;
    }
    // the item's columns, one entry per drawn device of its stage (null: that device ran none of
    // it); each interval is joined by a band to the previous device's that ran it
    const members = lay.members.get(op.stage) ?? [];
    let prev: { y: number; x0: number; x1: number } | null = null;
    for (let k = 0; k < op.starts.length && k < members.length; k++) {
      const s = op.starts[k];
      const y = lay.y.get(members[k]);
      if (s === null || s === undefined || y === undefined) continue;
      const x0 = x(op.start_ns + s);
      const x1 = x(op.start_ns + s + (op.durs[k] ?? 0));
      g.globalAlpha = 1;
      g.fillRect(x0, y, Math.max(0.8, x1 - x0), LINE);
      if (prev) {
        g.globalAlpha = 0.35;
        g.beginPath();
        g.moveTo(prev.x0, prev.y + LINE);
        g.lineTo(prev.x1, prev.y + LINE);
        g.lineTo(x1, y);
        g.lineTo(x0, y);
        g.closePath();
        g.fill();
      }
      prev = { y, x0, x1 };
    }
    g.globalAlpha = 1;
  }
  if (!lines) return;
  for (const d of data.devices) {
    const y = lay.y.get(d.rank);
    if (y === undefined) continue;
    drawLine(g, d.flops_line, data.flops_line_max_per_s, y, FLOPS_COLOR, false, plot, data.px);
    drawLine(g, d.memory_line, data.memory_line_max_bytes, y, MEMORY_COLOR, true, plot, data.px);
  }
}

/** The item under the pointer: on a device row (or the band below it, which starts there), or a folded stage's row. */
function itemAt(data: JobMarey, lay: Layout, width: number, px: number, py: number): { op: MareyOp; rank: number | null } | null {
  const [a, b] = [data.window_start_ns, data.window_end_ns];
  const ns = a + ((px - LABEL) / (width - LABEL - RIGHT)) * (b - a);
  const slack = (b - a) / (width - LABEL - RIGHT); // one pixel
  // the item under the pointer -- the last drawn, on top, where intervals overlap (a collective
  // beside the host's compute) -- else the nearest within a pixel (a sub-pixel item is hard to hit)
  let best: { op: MareyOp; rank: number | null } | null = null;
  let bestGap = slack;
  const consider = (op: MareyOp, rank: number | null, s: number, e: number): void => {
    const gap = ns < s ? s - ns : ns > e ? ns - e : 0;
    if (gap <= bestGap) [best, bestGap] = [{ op, rank }, gap];
  };
  for (const [stage, group] of lay.stages) {
    if (group.row === null || py < group.row || py > group.row + LINE) continue;
    for (const op of data.ops) if (op.stage === stage) consider(op, null, op.start_ns, op.end_ns);
    return best;
  }
  for (const [rank, y] of lay.y) {
    if (py < y || py > y + LINE) continue;
    for (const op of data.ops) {
      const members = lay.members.get(op.stage);
      const k = members ? members.indexOf(rank) : -1;
      const s = k >= 0 ? op.starts[k] : null;
      if (s !== null && s !== undefined) consider(op, rank, op.start_ns + s, op.start_ns + s + (op.durs[k] ?? 0));
    }
    return best;
  }
  return best;
}

/** An item's op name: sent only where its key does not hold it (a key "<name>#<k>" does). */
function opName(op: MareyOp): string {
  return op.name ?? op.key.slice(0, op.key.lastIndexOf("#"));
}

function hoverCard(op: MareyOp, ran: Interval[]): Node[] {
  const s = t.parallel.marey;
  const head = op.ops > 1 ? [h("div", { class: "muted" }, s.merged(op.ops, op.category))] : [];
  return [
    ...head,
    h("b", {}, opName(op)),
    h("div", { class: "muted" }, op.category),
    ...ran.slice(0, 16).map((v) =>
      h(
        "div",
        { "data-rank": v.rank },
        `${op.ops > 1 ? s.opsOn(v.rank, v.count) : s.opOn(v.rank)}: ${fmt.ms(v.start, 3)} – ${fmt.ms(v.end, 3)} ${fmt.MS} (${fmt.duration(v.end - v.start)})`,
      ),
    ),
    ...(ran.length ? [] : [h("div", {}, `${fmt.ms(op.start_ns, 3)} – ${fmt.ms(op.end_ns, 3)} ${fmt.MS}`)]),
  ];
}

export async function jobMareyPage(ctx: PageContext): Promise<void> {
  const s = t.parallel.marey;
  const step = ctx.params.get("step");
  const box = h("div", { class: "pv-chart mv-box", "data-testid": "marey-box" });
  const canvas = h("canvas", { class: "mv-canvas", "data-testid": "marey-canvas" });
  const hover = h("div", { class: "mv-card", hidden: true, role: "tooltip", "data-testid": "marey-card" });
  const shown = h("p", { class: "muted", "data-testid": "marey-shown" });
  const pager = h("div", { class: "mv-pager", "data-testid": "marey-pager" });
  const toggle = h("input", { type: "checkbox", checked: true, "data-testid": "marey-lines" });
  const legend = h(
    "div",
    { class: "mv-legend muted" },
    h("label", {}, toggle, ` ${s.lines} `),
    h("span", { class: "mv-key", style: `background:${FLOPS_COLOR}` }),
    " FLOP/s ",
    h("span", { class: "mv-key", style: `background:${MEMORY_COLOR}` }),
    ` ${s.memory}`,
  );
  const width = () => Math.max(600, Math.floor(ctx.root.clientWidth || 1400) - 40);
  let data: JobMarey | null = null;
  let lay: Layout | null = null;
  let drawnWidth = width();
  let unfold: number[] | null = null; // null: the server's default
  let first = 0;
  let window_: [number, number] | null = null; // null: the whole step
  let asked = 0;

  const render = () => {
    if (!data) return;
    lay = layout(data);
    box.innerHTML = labels(data, lay, drawnWidth); // names pass through escapeHtml
    box.prepend(canvas);
    paint(canvas, data, lay, drawnWidth, toggle.checked);
    box.dataset.viewStart = String(data.window_start_ns);
    box.dataset.viewEnd = String(data.window_end_ns);
    box.dataset.binNs = String(data.bin_ns);
    box.dataset.px = String(data.px);
    box.dataset.items = String(data.ops.length);
    box.dataset.ops = String(data.ops.reduce((n, o) => n + o.ops, 0));
    shown.textContent = s.shown(data.ops.length, data.window_ops, data.matched_ops, fmt.duration(data.bin_ns));
    const folded = data.stages.every((st) => st.folded);
    const parts: (Node | string)[] = [];
    if (folded && data.stages.length) parts.push(s.allFolded);
    if (data.device_rows > data.rows) {
      const prev = h("button", { type: "button", disabled: data.first === 0, "data-testid": "marey-prev" }, s.previous);
      const next = h("button", { type: "button", disabled: data.first + data.rows >= data.device_rows, "data-testid": "marey-next" }, s.next);
      prev.addEventListener("click", () => void ask({ first: Math.max(0, data!.first - data!.rows) }));
      next.addEventListener("click", () => void ask({ first: data!.first + data!.rows }));
      parts.push(prev, ` ${s.rows(data.first + 1, Math.min(data.device_rows, data.first + data.rows), data.device_rows)} `, next);
    }
    replace(pager, parts);
  };

  /** Ask the server for the chart at this width, window, fold and device page; draw the answer. */
  const ask = async (change: { window?: [number, number] | null; unfold?: number[]; first?: number } = {}) => {
    if ("window" in change) window_ = change.window ?? null;
    if (change.unfold) unfold = change.unfold;
    if (change.first !== undefined) first = change.first;
    drawnWidth = width();
    const mine = ++asked;
    box.dataset.loading = "true";
    const got = await get<JobMarey>("job/marey", {
      run: ctx.run,
      step,
      px: Math.max(50, drawnWidth - LABEL - RIGHT),
      start_ns: window_ ? Math.floor(window_[0]) : null,
      end_ns: window_ ? Math.ceil(window_[1]) : null,
      unfold: unfold === null ? null : unfold.length ? unfold.join(",") : "none",
      first,
    });
    if (mine !== asked) return; // a later request superseded this one
    data = got;
    if (unfold === null) unfold = got.stages.filter((st) => !st.folded).map((st) => st.stage);
    delete box.dataset.loading;
    render();
  };

  /** Where the chart is on screen: the SVG and the canvas under it share its origin. */
  const frame = (): DOMRect => (box.querySelector("svg") as SVGSVGElement).getBoundingClientRect();
  const plotX = (clientX: number): number => clientX - frame().left;
  const toNs = (clientX: number): number => {
    const d = data as JobMarey;
    const px = plotX(clientX);
    return d.window_start_ns + ((px - LABEL) / (drawnWidth - LABEL - RIGHT)) * (d.window_end_ns - d.window_start_ns);
  };
  let brushFrom: number | null = null;
  let brushPx = 0;
  box.addEventListener("mousedown", (e) => {
    if (!data || plotX(e.clientX) < LABEL) return;
    brushFrom = toNs(e.clientX);
    brushPx = e.clientX;
    e.preventDefault();
  });
  box.addEventListener("mousemove", (e) => {
    if (!data || !lay) return;
    const svg = box.querySelector("svg") as SVGSVGElement;
    if (brushFrom !== null) {
      const brush = svg.querySelector(".mv-brush") as SVGRectElement;
      const x1 = plotX(Math.min(brushPx, e.clientX));
      const x2 = plotX(Math.max(brushPx, e.clientX));
      brush.setAttribute("x", String(x1));
      brush.setAttribute("width", String(x2 - x1));
      brush.setAttribute("visibility", "visible");
      return;
    }
    const r = frame();
    const found = plotX(e.clientX) >= LABEL ? itemAt(data, lay, drawnWidth, e.clientX - r.left, e.clientY - r.top) : null;
    if (!found) {
      hover.hidden = true;
      delete box.dataset.hoverKey;
      return;
    }
    const ran = intervals(found.op, lay.members.get(found.op.stage) ?? []);
    replace(hover, hoverCard(found.op, ran));
    box.dataset.hoverKey = found.op.key;
    hover.hidden = false;
    hover.style.left = `${Math.min(e.clientX + 12, window.innerWidth - 370)}px`;
    hover.style.top = `${Math.min(e.clientY + 12, window.innerHeight - 60 - 18 * Math.min(16, ran.length))}px`;
  });
  box.addEventListener("mouseup", (e) => {
    if (brushFrom === null || !data) return;
    const to = toNs(e.clientX);
    const [lo, hi] = [Math.min(brushFrom, to), Math.max(brushFrom, to)];
    brushFrom = null;
    if (Math.abs(e.clientX - brushPx) > 4 && hi - lo >= 1) {
      // the window again at full resolution: its sub-pixel runs come apart into their ops
      void ask({ window: [Math.max(0, lo), Math.min(data.span_ns, hi)] });
      return;
    }
    box.querySelector(".mv-brush")?.setAttribute("visibility", "hidden");
  });
  box.addEventListener("click", (e) => {
    if (!data) return;
    const target = e.target as Element;
    const header = target.closest?.(".mv-stage") as SVGElement | null;
    if (header) {
      // the stage tree: fold the stage's devices into one row, or draw them one by one
      const stage = Number(header.dataset.stage);
      const open = new Set(unfold ?? []);
      if (!open.delete(stage)) open.add(stage);
      void ask({ unfold: [...open].sort((p, q) => p - q), first: 0 });
      return;
    }
    // a device's label or colour blocks (left of the timelines) open its rank
    const device = target.closest?.(".mv-device") as SVGGElement | null;
    if (device) window.location.hash = href("timeline", { run: ctx.run, rank: device.dataset.rank });
  });
  box.addEventListener("mouseleave", () => {
    hover.hidden = true;
  });
  box.addEventListener("dblclick", () => {
    if (window_ !== null) void ask({ window: null });
  });
  toggle.addEventListener("change", () => render());

  drawnWidth = width();
  await ask();
  const d = data as unknown as JobMarey;
  replace(
    ctx.root,
    h(
      "div",
      { class: "grid" },
      card(
        { title: s.title(d.step), hint: s.hint, full: true, testId: "card-marey", tools: [stepPicker("job-marey", ctx.run, d.steps, d.step)] },
        shown,
        legend,
        pager,
        box,
        hover,
      ),
    ),
  );
}
