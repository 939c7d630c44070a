/**
 * The Marey view (seed 000, 各设备算子执行时间线分析): for the selected step, one timeline per device,
 * grouped by pipeline stage; compute ops green, communication orange.  The same op on the devices
 * of a stage (matched by the cluster analysis: a collective by group and sequence number, any
 * other op by its name and rank among that name's ops in the step) is joined from one device's
 * row to the next into a filled band, so an op long on every device is a wide band and a device
 * slow on one op bulges it (the seed's fig. 6a and 6b).  Left of each timeline, the device's FLOPs
 * over the heaviest device's and its peak memory (over capacity, or over the largest peak).
 *
 * Every interval is read from /api/job/marey (server/job_parallel.py, which keeps the longest ops
 * per stage and says how many it left out); the page only places them.  Drag to zoom, double-click
 * to reset, hover an op for its name and start/end on every device, click a device to open its
 * rank's timeline.
 */
import { get } from "../api";
import type { components } from "../api-types";
import { card } from "../components/card";
import type { PageContext } from "../context";
import { escapeHtml, h, replace } from "../dom";
import * as fmt from "../format";
import { t } from "../i18n";
import { href } from "../router";
import { stepPicker } from "./job-pipeline";

type JobMarey = components["schemas"]["JobMarey"];
type MareyOp = components["schemas"]["MareyOp"];

const WIDTH = 1400;
const LABEL = 166;
const LINE = 10;
const GAP = 34;
const STAGE_GAP = 18;
const COLORS = { compute: "#2e9e5b", communication: "#f08c00" };

interface Layout {
  y: Map<number, number>;
  /** Per stage: where its header is, and its folded row (when folded). */
  stages: Map<number, { header: number; row: number | null; devices: number }>;
  height: number;
}

const HEADER = 16;

/** Device rows grouped by stage under a header; a folded stage is one row instead of its devices. */
function layout(data: JobMarey, folded: Set<number>): Layout {
  const y = new Map<number, number>();
  const stages = new Map<number, { header: number; row: number | null; devices: number }>();
  let at = 22; // below the colour blocks' heading
  for (const d of data.devices) {
    let group = stages.get(d.stage);
    if (!group) {
      if (stages.size) at += STAGE_GAP;
      group = { header: at, row: null, devices: 0 };
      stages.set(d.stage, group);
      at += HEADER;
      if (folded.has(d.stage)) {
        group.row = at;
        at += LINE + GAP;
      }
    }
    group.devices += 1;
    if (group.row !== null) continue;
    y.set(d.rank, at);
    at += LINE + GAP;
  }
  return { y, stages, height: at + 10 };
}

/** The union of intervals: overlapping ones merged (the folded stage row shows when any device ran the op). */
function union(starts: number[], ends: number[]): [number, number][] {
  const spans = starts.map((s, i) => [s, ends[i]] as [number, number]).sort((p, q) => p[0] - q[0]);
  const out: [number, number][] = [];
  for (const [s, e] of spans) {
    const last = out[out.length - 1];
    if (last && s <= last[1]) last[1] = Math.max(last[1], e);
    else out.push([s, e]);
  }
  return out;
}

function share(v: number | null | undefined): string {
  const s = Math.min(1, Math.max(0, v ?? 0));
  return `rgb(${Math.round(235 - 150 * s)},${Math.round(240 - 120 * s)},${Math.round(250 - 60 * s)})`;
}

function draw(data: JobMarey, lay: Layout, view: [number, number]): string {
  const [a, b] = view;
  const span = Math.max(1, b - a);
  const x = (ns: number) => LABEL + ((WIDTH - LABEL - 10) * (Math.min(Math.max(ns, a), b) - a)) / span;
  const parts: string[] = [
    `<text x="111" y="12" class="pv-sub" text-anchor="middle">${escapeHtml(t.parallel.marey.flopsShort)}</text>`,
    `<text x="145" y="12" class="pv-sub" text-anchor="middle">${escapeHtml(t.parallel.marey.memoryShort)}</text>`,
  ];
  for (const [stage, group] of lay.stages) {
    const label = group.row !== null ? t.parallel.marey.folded(stage, group.devices) : t.parallel.marey.unfolded(stage);
    parts.push(`<text x="4" y="${group.header + 11}" class="pv-sub mv-stage" data-stage="${stage}" data-folded="${group.row !== null}">${escapeHtml(label)}</text>`);
    if (group.row !== null) {
      parts.push(
        `<g class="mv-stage-row" data-stage="${stage}"><line x1="${LABEL}" x2="${WIDTH - 10}" y1="${group.row + LINE / 2}" y2="${group.row + LINE / 2}" stroke="#d5dbe3"/></g>`,
      );
    }
  }
  for (const d of data.devices) {
    if (!lay.y.has(d.rank)) continue;
    const y = lay.y.get(d.rank) as number;
    const memory = d.peak_share ?? d.peak_of_max;
    parts.push(
      `<g class="mv-device" data-rank="${d.rank}" data-stage="${d.stage}">`,
      `<text x="4" y="${y + LINE}" class="pv-label">${escapeHtml(t.parallel.marey.device(d.rank, d.stage))}</text>`,
      `<rect x="98" y="${y - 2}" width="28" height="${LINE + 4}" fill="${share(d.flops_of_max)}" stroke="#cfd6e0"><title>${escapeHtml(`${t.parallel.marey.flops}: ${fmt.percent(d.flops_of_max)}`)}</title></rect>`,
      `<rect x="132" y="${y - 2}" width="28" height="${LINE + 4}" fill="${share(memory)}" stroke="#cfd6e0"><title>${escapeHtml(`${t.parallel.marey.memory}: ${fmt.percent(memory)}`)}</title></rect>`,
      `<line x1="${LABEL}" x2="${WIDTH - 10}" y1="${y + LINE / 2}" y2="${y + LINE / 2}" stroke="#d5dbe3"/>`,
      "</g>",
    );
  }
  data.ops.forEach((op, i) => {
    if (Math.max(...op.ends_ns) < a || Math.min(...op.starts_ns) > b) return;
    const color = COLORS[op.category];
    const shapes: string[] = [];
    const row = lay.stages.get(op.stage)?.row ?? null;
    if (row !== null) {
      for (const [s, e] of union(op.starts_ns, op.ends_ns)) {
        shapes.push(`<rect x="${x(s)}" y="${row}" width="${Math.max(0.8, x(e) - x(s))}" height="${LINE}" fill="${color}"/>`);
      }
      parts.push(`<g class="mv-op" data-i="${i}" data-key="${escapeHtml(op.key)}" data-category="${op.category}">${shapes.join("")}</g>`);
      return;
    }
    const rows = op.ranks.map((r, k) => ({ y: lay.y.get(r) as number, s: op.starts_ns[k], e: op.ends_ns[k] }));
    for (let k = 0; k < rows.length; k++) {
      const r = rows[k];
      shapes.push(`<rect x="${x(r.s)}" y="${r.y}" width="${Math.max(0.8, x(r.e) - x(r.s))}" height="${LINE}" fill="${color}"/>`);
      if (k + 1 < rows.length) {
        const n = rows[k + 1];
        shapes.push(
          `<polygon points="${x(r.s)},${r.y + LINE} ${x(r.e)},${r.y + LINE} ${x(n.e)},${n.y} ${x(n.s)},${n.y}" fill="${color}" fill-opacity="0.35"/>`,
        );
      }
    }
    parts.push(`<g class="mv-op" data-i="${i}" data-key="${escapeHtml(op.key)}" data-category="${op.category}">${shapes.join("")}</g>`);
  });
  const ticks = [0, 0.25, 0.5, 0.75, 1]
    .map((f) => `<text x="${LABEL + (WIDTH - LABEL - 10) * f}" y="${lay.height - 2}" class="pv-sub" text-anchor="${f === 1 ? "end" : f === 0 ? "start" : "middle"}">${escapeHtml(`${fmt.ms(a + f * span, 2)} ${fmt.MS}`)}</text>`)
    .join("");
  return `<svg viewBox="0 0 ${WIDTH} ${lay.height + 12}" width="100%" data-testid="marey-chart">${parts.join("")}${ticks}<rect class="mv-brush" x="0" y="0" width="0" height="${lay.height}" visibility="hidden"/></svg>`;
}

function hoverCard(op: MareyOp): Node[] {
  return [
    h("b", {}, op.name),
    h("div", { class: "muted" }, op.category),
    ...op.ranks.map((r, k) =>
      h("div", { "data-rank": r }, `${t.parallel.marey.opOn(r)}: ${fmt.ms(op.starts_ns[k], 3)} – ${fmt.ms(op.ends_ns[k], 3)} ${fmt.MS} (${fmt.duration(op.ends_ns[k] - op.starts_ns[k])})`),
    ),
  ];
}

export async function jobMareyPage(ctx: PageContext): Promise<void> {
  const s = t.parallel.marey;
  const data = await get<JobMarey>("job/marey", { run: ctx.run, step: ctx.params.get("step") });
  const folded = new Set<number>();
  let lay = layout(data, folded);
  const full: [number, number] = [0, Math.max(1, data.span_ns)];
  let view: [number, number] = full;
  const box = h("div", { class: "pv-chart", "data-testid": "marey-box" });
  const hover = h("div", { class: "mv-card", hidden: true, role: "tooltip", "data-testid": "marey-card" });
  const render = () => {
    box.innerHTML = draw(data, lay, view); // names pass through escapeHtml
    box.dataset.viewStart = String(Math.round(view[0]));
    box.dataset.viewEnd = String(Math.round(view[1]));
  };
  const toNs = (clientX: number): number => {
    const svg = box.querySelector("svg") as SVGSVGElement;
    const r = svg.getBoundingClientRect();
    const px = ((clientX - r.left) / r.width) * WIDTH;
    return view[0] + ((px - LABEL) / (WIDTH - LABEL - 10)) * (view[1] - view[0]);
  };
  let brushFrom: number | null = null;
  let brushPx = 0;
  box.addEventListener("mousedown", (e) => {
    const svg = box.querySelector("svg") as SVGSVGElement;
    const r = svg.getBoundingClientRect();
    if (((e.clientX - r.left) / r.width) * WIDTH < LABEL) return;
    brushFrom = toNs(e.clientX);
    brushPx = e.clientX;
    e.preventDefault();
  });
  box.addEventListener("mousemove", (e) => {
    const svg = box.querySelector("svg") as SVGSVGElement;
    if (brushFrom !== null) {
      const r = svg.getBoundingClientRect();
      const brush = svg.querySelector(".mv-brush") as SVGRectElement;
      const x1 = ((Math.min(brushPx, e.clientX) - r.left) / r.width) * WIDTH;
      const x2 = ((Math.max(brushPx, e.clientX) - r.left) / r.width) * WIDTH;
      brush.setAttribute("x", String(x1));
      brush.setAttribute("width", String(x2 - x1));
      brush.setAttribute("visibility", "visible");
      return;
    }
    const g = (e.target as Element).closest?.(".mv-op") as SVGGElement | null;
    const op = g ? data.ops[Number(g.dataset.i)] : undefined;
    if (!op) {
      hover.hidden = true;
      return;
    }
    replace(hover, hoverCard(op));
    hover.hidden = false;
    hover.style.left = `${Math.min(e.clientX + 12, window.innerWidth - 370)}px`;
    hover.style.top = `${Math.min(e.clientY + 12, window.innerHeight - 40 - 18 * op.ranks.length)}px`;
  });
  box.addEventListener("mouseup", (e) => {
    if (brushFrom === null) return;
    const to = toNs(e.clientX);
    const [lo, hi] = [Math.min(brushFrom, to), Math.max(brushFrom, to)];
    brushFrom = null;
    if (Math.abs(e.clientX - brushPx) > 4 && hi > lo) {
      view = [Math.max(full[0], lo), Math.min(full[1], hi)];
      render();
      return;
    }
    // a click, not a drag: leave the drawing in place (a double-click needs the same target twice)
    box.querySelector(".mv-brush")?.setAttribute("visibility", "hidden");
  });
  box.addEventListener("click", (e) => {
    const target = e.target as Element;
    const header = target.closest?.(".mv-stage") as SVGElement | null;
    if (header) {
      // the stage tree: fold the stage's devices into one row (the union of each op), or unfold
      const stage = Number(header.dataset.stage);
      if (!folded.delete(stage)) folded.add(stage);
      lay = layout(data, folded);
      render();
      return;
    }
    // a device's label or colour blocks (left of the timelines) open its rank
    const device = target.closest?.(".mv-device") as SVGGElement | null;
    if (device && target.tagName !== "line") window.location.hash = href("timeline", { run: ctx.run, rank: device.dataset.rank });
  });
  box.addEventListener("mouseleave", () => {
    hover.hidden = true;
  });
  box.addEventListener("dblclick", () => {
    view = full;
    render();
  });
  render();
  replace(
    ctx.root,
    h(
      "div",
      { class: "grid" },
      card(
        { title: s.title(data.step), hint: s.hint, full: true, testId: "card-marey", tools: [stepPicker("job-marey", ctx.run, data.steps, data.step)] },
        h("p", { class: "muted", "data-testid": "marey-shown" }, s.shown(data.shown_ops, data.matched_ops, data.limit, fmt.duration(data.min_ns))),
        box,
        hover,
      ),
    ),
  );
}
