/**
 * Run-vs-run comparison (`#/compare?base=RUN&new=RUN[&base_rank=N&new_rank=N]`) and a job's card
 * comparison tab (`#/job-compare?run=RUN&a=N&b=N`): both show `/api/compare`, the comparison
 * `perfsight compare` prints, so the page and the CLI can never disagree.  The real regressions lead;
 * then the two step breakdowns side by side; then the diff tables (operators by name and shapes,
 * kernels by operator, communication), sortable and searchable.  Nothing here judges a difference:
 * the noise verdicts and the ranking come with the data.
 */
import { get, report, type RunStatus } from "../api";
import type { components } from "../api-types";
import { card, errorBox } from "../components/card";
import { serverTable, type Column, type Page, type PageQuery, type Row } from "../components/table";
import type { PageContext } from "../context";
import { h, replace } from "../dom";
import * as fmt from "../format";
import { t } from "../i18n";
import { OVERLAP_COLORS, STAGE_COLORS } from "../palette";

type Comparison = components["schemas"]["Comparison"];
type MetricRow = components["schemas"]["CompareMetricRow"];
type RegressionRow = components["schemas"]["CompareRegressionRow"];

const REGRESSIONS_SHOWN = 10;

/** The two stacks drawn side by side: each a partition of the step (so the bars are comparable). */
const STACKS: { title: () => string; parts: [string, string][] }[] = [
  {
    title: () => t.compare.phases,
    parts: [
      ["iteration_interval_ns", STAGE_COLORS.iterationInterval],
      ["fp_bp_ns", STAGE_COLORS.fpBp],
      ["tail_ns", STAGE_COLORS.tail],
    ],
  },
  {
    title: () => t.compare.overlap,
    parts: [
      ["computing_ns", OVERLAP_COLORS.computing],
      ["communication_not_overlapped_ns", OVERLAP_COLORS.communicationNotOverlapped],
      ["free_ns", OVERLAP_COLORS.free],
      ["preparing_ns", OVERLAP_COLORS.preparing],
    ],
  },
];

function metricLabel(metric: string): string {
  return t.compare.metrics[metric] ?? metric;
}

function value(v: number | null | undefined, unit: string): string {
  if (v === null || v === undefined) return "–";
  if (unit === "ns") return fmt.duration(v);
  if (unit === "bytes") return fmt.bytes(v);
  if (unit === "flop") return fmt.flops(v);
  if (unit === "ratio") return fmt.percent(v);
  return String(v);
}

function signed(v: number | null | undefined, unit: string): string {
  const text = value(v, unit);
  return v !== null && v !== undefined && v > 0 ? `+${text}` : text;
}

function pct(v: unknown): string {
  return typeof v === "number" && Number.isFinite(v) ? `${v > 0 ? "+" : ""}${v.toFixed(1)}%` : "";
}

export function verdict(beyond: boolean | null | undefined): string {
  if (beyond === null || beyond === undefined) return t.compare.noiseUnknown;
  return beyond ? t.compare.beyondNoise : t.compare.withinNoise;
}

function verdictBadge(beyond: boolean | null | undefined): HTMLElement {
  const css = beyond === true ? "beyond" : beyond === false ? "within" : "unknown";
  return h("span", { class: `badge noise ${css}` }, verdict(beyond));
}

function sideText(side: Comparison["base"]): string {
  const steps = side.steps_used.length
    ? `${side.steps_used.length} ${t.compare.of} ${side.steps_all.length} ${t.compare.steps} (${side.steps_used.join(", ")})`
    : t.compare.noSteps;
  return `${side.input} · ${steps}`;
}

function headline(doc: Comparison): HTMLElement {
  const step = doc.step_breakdown.find((r) => r.metric === "step_ns");
  return h(
    "div",
    { class: "compare-head", "data-testid": "compare-head" },
    h("div", {}, h("b", {}, "BASE "), h("span", { "data-testid": "compare-base" }, sideText(doc.base))),
    h("div", {}, h("b", {}, "NEW "), h("span", { "data-testid": "compare-new" }, sideText(doc.new))),
    step
      ? h(
          "div",
          { class: "compare-step", "data-testid": "compare-step" },
          `${t.compare.stepTime}: ${value(step.base, "ns")} → ${value(step.new, "ns")} (${signed(step.delta, "ns")} ${pct(step.delta_pct)}) `,
          verdictBadge(step.beyond_noise),
        )
      : null,
  );
}

function regressionText(row: RegressionRow): string {
  const item = row.table === "step_breakdown" ? metricLabel(row.item) : row.item;
  const detail = row.detail && row.table !== "step_breakdown" ? ` ${row.table === "operators" ? fmt.shapes(row.detail) : row.detail}` : "";
  return `${t.compare.categories[row.category] ?? row.category}: ${item}${detail}`;
}

function regressionsCard(doc: Comparison): HTMLElement {
  const real = doc.regressions.filter((r) => r.real && (r.delta_ns ?? 0) > 0).slice(0, REGRESSIONS_SHOWN);
  const body = real.length
    ? h(
        "ol",
        { class: "regressions", "data-testid": "compare-regressions" },
        real.map((row) =>
          h(
            "li",
            { "data-category": row.category, "data-table": row.table },
            h("span", { class: "regression-item" }, regressionText(row)),
            " ",
            h("b", {}, `${signed(row.delta_ns, "ns")} ${pct(row.delta_pct)}`),
            " ",
            row.beyond_noise ? verdictBadge(true) : h("span", { class: "badge noise structural" }, t.compare.countChanged),
          ),
        ),
      )
    : h("p", { class: "muted", "data-testid": "compare-regressions" }, t.compare.noRegression);
  return card({ title: t.compare.regressions, hint: t.compare.regressionsHint, full: true, testId: "card-regressions" }, body);
}

function stackBar(doc: Comparison, side: "base" | "new", parts: [string, string][]): HTMLElement {
  const rows = new Map(doc.step_breakdown.map((r) => [r.metric, r]));
  const total = Math.max(
    1,
    ...(["base", "new"] as const).map((s) => parts.reduce((sum, [m]) => sum + (rows.get(m)?.[s] ?? 0), 0)),
  );
  return h(
    "div",
    { class: "stack-row" },
    h("span", { class: "stack-label" }, side.toUpperCase()),
    h(
      "div",
      { class: "stack-bar", "data-testid": `stack-${side}` },
      parts.map(([metric, color]) => {
        const v = rows.get(metric)?.[side] ?? 0;
        const seg = h("div", {
          class: "stack-seg",
          "data-metric": metric,
          title: `${metricLabel(metric)}: ${value(v, "ns")}`,
        });
        seg.style.width = `${(100 * v) / total}%`;
        seg.style.background = color;
        return seg;
      }),
    ),
  );
}

function breakdownCard(doc: Comparison): HTMLElement {
  const stacks = STACKS.map((stack) =>
    h(
      "div",
      { class: "stack-block" },
      h("div", { class: "stack-title" }, stack.title()),
      stackBar(doc, "base", stack.parts),
      stackBar(doc, "new", stack.parts),
      h(
        "div",
        { class: "stack-legend" },
        stack.parts.map(([metric, color]) => {
          const swatch = h("i");
          swatch.style.background = color;
          return h("span", {}, swatch, metricLabel(metric));
        }),
      ),
    ),
  );
  const table = h(
    "table",
    { class: "data", "data-testid": "compare-breakdown" },
    h(
      "thead",
      {},
      h(
        "tr",
        {},
        h("th", {}, t.compare.metric),
        h("th", { class: "num" }, "BASE"),
        h("th", { class: "num" }, "NEW"),
        h("th", { class: "num" }, t.compare.delta),
        h("th", { class: "num" }, "%"),
        h("th", { class: "num" }, t.compare.spread),
        h("th", {}, t.compare.verdict),
      ),
    ),
    h(
      "tbody",
      {},
      doc.step_breakdown.map((row: MetricRow) =>
        h(
          "tr",
          { "data-metric": row.metric, class: row.beyond_noise ? "flagged" : "" },
          h("td", {}, metricLabel(row.metric)),
          h("td", { class: "num" }, value(row.base, row.unit)),
          h("td", { class: "num" }, value(row.new, row.unit)),
          h("td", { class: "num" }, signed(row.delta, row.unit)),
          h("td", { class: "num" }, pct(row.delta_pct)),
          h("td", { class: "num" }, row.base_std === null && row.new_std === null ? "–" : `±${value(row.base_std, row.unit)} / ±${value(row.new_std, row.unit)}`),
          h("td", {}, row.unit === "bytes" ? "" : verdictBadge(row.beyond_noise)),
        ),
      ),
    ),
  );
  return card(
    { title: t.compare.breakdown, hint: t.compare.breakdownHint, full: true, testId: "card-compare-breakdown" },
    h("div", { class: "stacks" }, stacks),
    table,
  );
}

/** Sorting, searching and paging over rows already in the page (the API sent every row). */
function localPages(rows: Row[], searchKeys: string[]): (q: PageQuery) => Promise<Page> {
  return async (query) => {
    const needle = query.q.toLowerCase();
    let chosen = needle ? rows.filter((row) => searchKeys.some((k) => String(row[k] ?? "").toLowerCase().includes(needle))) : rows;
    if (query.sort) {
      const key = query.sort;
      const sign = query.desc ? -1 : 1;
      chosen = [...chosen].sort((a, b) => {
        const x = a[key];
        const y = b[key];
        if (typeof x === "number" && typeof y === "number") return sign * (x - y);
        if (x === null || x === undefined) return 1;
        if (y === null || y === undefined) return -1;
        return sign * String(x).localeCompare(String(y));
      });
    }
    return { rows: chosen.slice(query.offset, query.offset + query.limit), total: chosen.length };
  };
}

const ns = (v: unknown) => fmt.duration(v as number | null);
const signedNs = (v: unknown) => signed(v as number | null, "ns");
const calls = (v: unknown) => (typeof v === "number" ? (Number.isInteger(v) ? String(v) : v.toFixed(2)) : "–");
const noise = (v: unknown) => verdict(v as boolean | null);
const status = (v: unknown) => t.compare.status[String(v)] ?? String(v);

function diffTable(kind: "operators" | "kernels_by_operator" | "communication", doc: Comparison): HTMLElement {
  const c = t.compare.columns;
  const columns: Record<typeof kind, Column[]> = {
    operators: [
      { key: "name", label: c.name, sortable: true },
      { key: "input_dims", label: c.shapes, format: (v) => fmt.shapes(v) },
      { key: "status", label: c.status, sortable: true, format: status },
      { key: "base_calls", label: c.baseCalls, sortable: true, numeric: true, format: calls },
      { key: "new_calls", label: c.newCalls, sortable: true, numeric: true, format: calls },
      { key: "base_time_ns", label: c.baseTime, sortable: true, numeric: true, format: ns },
      { key: "new_time_ns", label: c.newTime, sortable: true, numeric: true, format: ns },
      { key: "delta_time_ns", label: c.delta, sortable: true, numeric: true, format: signedNs },
      { key: "delta_pct", label: "%", sortable: true, numeric: true, format: pct },
      { key: "delta_mean_ns", label: c.deltaMean, sortable: true, numeric: true, format: signedNs },
      { key: "beyond_noise", label: c.noise, format: noise },
    ],
    kernels_by_operator: [
      { key: "op", label: c.operator, sortable: true },
      { key: "status", label: c.status, sortable: true, format: status },
      { key: "base_kernels", label: c.baseKernels, sortable: true, numeric: true, format: calls },
      { key: "new_kernels", label: c.newKernels, sortable: true, numeric: true, format: calls },
      { key: "base_time_ns", label: c.baseTime, sortable: true, numeric: true, format: ns },
      { key: "new_time_ns", label: c.newTime, sortable: true, numeric: true, format: ns },
      { key: "delta_time_ns", label: c.delta, sortable: true, numeric: true, format: signedNs },
      { key: "delta_pct", label: "%", sortable: true, numeric: true, format: pct },
      { key: "beyond_noise", label: c.noise, format: noise },
      { key: "new_kernel_names", label: c.kernels, format: (v, row) => (row.names_differ ? `${row.base_kernel_names} → ${v}` : String(v ?? "")) },
    ],
    communication: [
      { key: "family", label: c.family, sortable: true },
      { key: "group", label: c.group, sortable: true },
      { key: "status", label: c.status, sortable: true, format: status },
      { key: "base_calls", label: c.baseCalls, sortable: true, numeric: true, format: calls },
      { key: "new_calls", label: c.newCalls, sortable: true, numeric: true, format: calls },
      { key: "base_time_ns", label: c.baseTime, sortable: true, numeric: true, format: ns },
      { key: "new_time_ns", label: c.newTime, sortable: true, numeric: true, format: ns },
      { key: "delta_time_ns", label: c.delta, sortable: true, numeric: true, format: signedNs },
      { key: "beyond_noise", label: c.noise, format: noise },
      { key: "base_bandwidth_gb_s", label: c.baseBandwidth, sortable: true, numeric: true, format: (v) => (typeof v === "number" ? v.toFixed(3) : "–") },
      { key: "new_bandwidth_gb_s", label: c.newBandwidth, sortable: true, numeric: true, format: (v) => (typeof v === "number" ? v.toFixed(3) : "–") },
    ],
  };
  const search = { operators: ["name", "input_dims", "status"], kernels_by_operator: ["op", "new_kernel_names", "base_kernel_names", "status"], communication: ["family", "group", "status"] };
  const rows = doc[kind] as unknown as Row[];
  const table = serverTable({
    columns: columns[kind],
    fetch: localPages(rows, search[kind]),
    sort: "delta_time_ns",
    desc: true,
    searchPlaceholder: t.compare.search,
    testId: `compare-table-${kind}`,
  });
  void table.reload();
  const counts = doc.counts[kind];
  const shown = doc[`${kind}_rows` as "operators_rows"];
  const hint = `${counts.added} ${t.compare.status.added} · ${counts.removed} ${t.compare.status.removed} · ${counts.changed} ${t.compare.status.changed} · ${counts.same} ${t.compare.status.same}${rows.length < shown ? ` · ${t.compare.firstRows} ${rows.length}` : ""}`;
  return card({ title: t.compare.tables[kind], hint, full: true, testId: `card-compare-${kind}` }, table.el);
}

/** The whole comparison into `root` (used by both pages). */
export function renderComparison(root: HTMLElement, doc: Comparison): void {
  replace(
    root,
    headline(doc),
    doc.notes.length ? h("ul", { class: "compare-notes muted", "data-testid": "compare-notes" }, doc.notes.map((n) => h("li", {}, n))) : null,
    h(
      "div",
      { class: "grid" },
      regressionsCard(doc),
      breakdownCard(doc),
      diffTable("operators", doc),
      diffTable("kernels_by_operator", doc),
      diffTable("communication", doc),
    ),
  );
}

async function ready(run: string, root: HTMLElement): Promise<void> {
  for (;;) {
    const s = await get<RunStatus>("run/status", { run }); // opening a run starts its analysis
    if (s.status === "ready") return;
    if (s.status === "failed") throw new Error(`${run}: ${t.runs.analysisFailed}: ${s.error ?? ""}`);
    replace(root, h("p", { class: "muted", "data-testid": "analysis-progress" }, `${t.runs.analysing} ${run} ${fmt.percent(s.progress, 0)}`));
    await new Promise((resolve) => setTimeout(resolve, 400));
  }
}

/** `#/compare?base=..&new=..`: two runs of the run list. */
export async function comparePage(main: HTMLElement, params: URLSearchParams): Promise<void> {
  const base = params.get("base") ?? "";
  const next = params.get("new") ?? "";
  replace(main, h("h1", {}, t.compare.title));
  const body = h("div");
  main.append(body);
  try {
    if (!report) {
      // the server analyses the two runs first; a compare report holds the comparison itself
      await ready(base, body);
      await ready(next, body);
    }
    const doc = await get<Comparison>("compare", {
      base,
      new: next,
      base_rank: params.get("base_rank"),
      new_rank: params.get("new_rank"),
    });
    renderComparison(body, doc);
  } catch (err) {
    replace(body, errorBox(err));
  }
}

/** A job's card comparison: two of its ranks, chosen with two selectors. */
export async function jobComparePage(ctx: PageContext): Promise<void> {
  const pick = (name: string, fallback: number): number => {
    const asked = Number(ctx.params.get(name));
    return ctx.params.has(name) && ctx.ranks.includes(asked) ? asked : fallback;
  };
  const a = pick("a", ctx.ranks[0]);
  const b = pick("b", ctx.ranks[Math.min(1, ctx.ranks.length - 1)]);
  const select = (label: string, chosen: number, testId: string) =>
    h(
      "label",
      { class: "job-tools" },
      label,
      h("select", { "data-testid": testId }, ctx.ranks.map((r) => h("option", { value: r, selected: r === chosen }, `${t.nav.rank} ${r}`))),
    );
  const left = select("BASE", a, "compare-rank-a");
  const right = select("NEW", b, "compare-rank-b");
  const body = h("div");
  const go = () => {
    const params = new URLSearchParams({
      run: ctx.run,
      a: (left.querySelector("select") as HTMLSelectElement).value,
      b: (right.querySelector("select") as HTMLSelectElement).value,
    });
    window.location.hash = `#/job-compare?${params.toString()}`;
  };
  left.addEventListener("change", go);
  right.addEventListener("change", go);
  replace(ctx.root, h("h1", {}, t.compare.cardTitle), h("div", { class: "compare-picks" }, left, right), body);
  const doc = await get<Comparison>("compare", { base: ctx.run, new: ctx.run, base_rank: a, new_rank: b });
  renderComparison(body, doc);
}
