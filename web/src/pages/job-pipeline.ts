/**
 * The pipeline chart (seed 000's pipeline-parallel execution, msprof-analyze's pp_chart): for the
 * selected step, one row per stage with the Forward / Backward range of every micro-batch as
 * blocks in time, as observed (GPipe, 1F1B, interleaved: whatever the ranks ran), the
 * point-to-point ops in orange and an arrow from each send to the receive it was matched with.
 * The gaps between blocks are the stage's bubble; the stage with the most compute paces the pipe.
 *
 * Every number is read from /api/job/pipeline (server/job_parallel.py over the cluster analysis's
 * cluster_step_ops.parquet); the page only places it.  The step travels in the URL (`step`), as on
 * the time overview, so a step picked there opens here.
 */
import { get } from "../api";
import type { components } from "../api-types";
import { card } from "../components/card";
import type { PageContext } from "../context";
import { escapeHtml, h, replace } from "../dom";
import * as fmt from "../format";
import { OP_CATEGORY_COLORS, PIPELINE_PHASE_COLORS } from "../palette";
import { t } from "../i18n";
import { href } from "../router";

type JobPipeline = components["schemas"]["JobPipeline"];

const WIDTH = 1400;
const LABEL = 110;
const ROW = 56;
const COLORS = { ...PIPELINE_PHASE_COLORS, p2p: OP_CATEGORY_COLORS.p2p };

/** A step picker that keeps the step in the URL (shared with the Marey view). */
export function stepPicker(page: "job-pipeline" | "job-marey", run: string, steps: string[], step: string): HTMLElement {
  const select = h(
    "select",
    { "data-testid": "parallel-step", "aria-label": t.parallel.step },
    steps.map((s) => h("option", { value: s, selected: s === step }, s)),
  );
  select.addEventListener("change", () => {
    window.location.hash = href(page, { run, step: select.value });
  });
  return h("label", { class: "pv-step" }, `${t.parallel.step} `, select);
}

function chart(data: JobPipeline): string {
  const s = t.parallel.pipeline;
  const span = Math.max(1, data.span_ns);
  const x = (ns: number) => LABEL + ((WIDTH - LABEL - 10) * ns) / span;
  const row = new Map(data.stages.map((st, i) => [st.stage, i]));
  const parts: string[] = [];
  data.stages.forEach((st, i) => {
    const y = i * ROW + 6;
    parts.push(
      `<g data-testid="pp-stage-${st.stage}" data-stage="${st.stage}" data-rank="${st.rank}">`,
      `<text x="4" y="${y + 26}" class="pv-label">${escapeHtml(`${s.stage} ${st.stage}`)}</text>`,
      `<text x="4" y="${y + 42}" class="pv-sub">rank ${st.rank}</text>`,
      `<rect x="${LABEL}" y="${y}" width="${WIDTH - LABEL - 10}" height="${ROW - 14}" fill="${COLORS.idle}"/>`,
    );
    for (const b of st.blocks) {
      const w = Math.max(1, x(b.end_ns) - x(b.start_ns));
      const tip = `${s.block(b.phase, b.micro_batch)}: ${fmt.duration(b.end_ns - b.start_ns)} (${s.compute.toLowerCase()} ${fmt.duration(b.compute_ns)})`;
      parts.push(
        `<g class="pp-block" data-phase="${b.phase}" data-mb="${b.micro_batch}" data-compute-ns="${b.compute_ns}" data-start-ns="${b.start_ns}" data-end-ns="${b.end_ns}">`,
        `<rect x="${x(b.start_ns)}" y="${y}" width="${w}" height="${ROW - 22}" fill="${COLORS[b.phase]}" stroke="#fff"><title>${escapeHtml(tip)}</title></rect>`,
        w > 18 ? `<text x="${x(b.start_ns) + 3}" y="${y + 21}" class="pv-block-label">${b.phase === "forward" ? "F" : "B"}${b.micro_batch}</text>` : "",
        "</g>",
      );
    }
    for (const p of st.p2p) {
      const w = Math.max(1, x(p.end_ns) - x(p.start_ns));
      parts.push(
        `<rect class="pp-p2p" x="${x(p.start_ns)}" y="${y + ROW - 22}" width="${w}" height="8" fill="${COLORS.p2p}"><title>${escapeHtml(`${p.name} (rank ${p.peer}): ${fmt.duration(p.end_ns - p.start_ns)}`)}</title></rect>`,
      );
    }
    parts.push("</g>");
  });
  for (const a of data.arrows) {
    const from = row.get(a.src_stage);
    const to = row.get(a.dst_stage);
    if (from === undefined || to === undefined) continue;
    const y1 = from * ROW + 6 + (to > from ? ROW - 14 : 0);
    const y2 = to * ROW + 6 + (to > from ? 0 : ROW - 14);
    parts.push(`<line class="pp-arrow" x1="${x(a.send_start_ns)}" y1="${y1}" x2="${x(a.recv_end_ns)}" y2="${y2}" stroke="#c0392b" marker-end="url(#pp-head)"/>`);
  }
  const height = data.stages.length * ROW + 24;
  const ticks = [0, 0.25, 0.5, 0.75, 1]
    .map((f) => `<text x="${x(f * span)}" y="${height - 4}" class="pv-sub" text-anchor="${f === 1 ? "end" : f === 0 ? "start" : "middle"}">${escapeHtml(`${fmt.ms(f * span, 1)} ${fmt.MS}`)}</text>`)
    .join("");
  return `<svg viewBox="0 0 ${WIDTH} ${height}" width="100%" data-testid="pp-chart" role="img"><defs><marker id="pp-head" viewBox="0 0 10 10" refX="9" refY="5" markerWidth="6" markerHeight="6" orient="auto"><path d="M0,0 L10,5 L0,10 z" fill="#c0392b"/></marker></defs>${parts.join("")}${ticks}</svg>`;
}

export async function jobPipelinePage(ctx: PageContext): Promise<void> {
  const s = t.parallel.pipeline;
  const data = await get<JobPipeline>("job/pipeline", { run: ctx.run, step: ctx.params.get("step") });
  const busy = data.stages.filter((st) => st.blocks.length);
  const idlest = [...busy].sort((a, b) => b.idle_ns - a.idle_ns)[0];
  const pacing = data.stages.find((st) => st.stage === data.pacing_stage);
  const summary = h(
    "div",
    { class: "pv-summary", "data-testid": "pp-summary" },
    data.has_blocks ? null : h("p", { class: "muted" }, s.noBlocks),
    pacing ? h("div", { "data-testid": "pp-pacing", "data-stage": pacing.stage }, s.paces(pacing.stage, fmt.duration(pacing.compute_ns))) : null,
    idlest ? h("div", { "data-testid": "pp-idlest", "data-stage": idlest.stage }, s.idlest(idlest.stage, fmt.duration(idlest.idle_ns), fmt.percent(idlest.idle_share))) : null,
  );
  const svgBox = h("div", { class: "pv-chart" });
  svgBox.innerHTML = chart(data); // every name in it passed through escapeHtml
  svgBox.addEventListener("click", (e) => {
    const g = (e.target as Element).closest?.("[data-rank]") as SVGElement | null;
    if (g) window.location.hash = href("timeline", { run: ctx.run, rank: g.dataset.rank });
  });
  const table = h(
    "table",
    { class: "data", "data-testid": "pp-table" },
    h("thead", {}, h("tr", {}, [s.stage, s.ranks, s.compute, s.idle, s.idleShare, s.bubble].map((c) => h("th", {}, c)))),
    h(
      "tbody",
      {},
      data.stages.map((st) =>
        h(
          "tr",
          { "data-stage": st.stage },
          h("td", {}, String(st.stage)),
          h("td", {}, st.ranks.map((r) => h("a", { href: href("overview", { run: ctx.run, rank: r }) }, `${r} `))),
          h("td", {}, fmt.duration(st.compute_ns)),
          h("td", {}, fmt.duration(st.idle_ns)),
          h("td", {}, fmt.percent(st.idle_share)),
          h("td", {}, fmt.duration(st.bubble_ns)),
        ),
      ),
    ),
  );
  replace(
    ctx.root,
    h(
      "div",
      { class: "grid" },
      card(
        { title: s.title(data.step), hint: s.hint, full: true, testId: "card-pipeline", tools: [stepPicker("job-pipeline", ctx.run, data.steps, data.step)] },
        summary,
        svgBox,
        table,
      ),
    ),
  );
}
