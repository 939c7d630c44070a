/**
 * The parallel-strategy page: the execution graph of one step (pages/strategy-graph.ts), the
 * module table (time per nn.Module per rank, /api/job/strategy/modules) and the tree of parallel
 * groups below them.
 *
 * The tree of parallel groups (seed 000's 并行策略视图, as far as a
 * PyTorch job's trace tells it): the job's pipeline stages, in each its model replicas (a
 * tensor-parallel group, or one rank), in each its ranks, each leaf with its average step time as a
 * bar against the slowest rank's and its data-parallel group.  The modes and groups are the cluster
 * analysis's, with the evidence it named them on (/api/job/strategy); nothing is computed here.
 * Clicking a rank opens its overview.
 */
import { ApiError, get } from "../api";
import type { components } from "../api-types";
import { card } from "../components/card";
import type { PageContext } from "../context";
import { h, replace } from "../dom";
import * as fmt from "../format";
import { t } from "../i18n";
import { href } from "../router";
import { strategyGraph } from "./strategy-graph";

type JobStrategy = components["schemas"]["JobStrategy"];
type StrategyRank = components["schemas"]["StrategyRank"];
type JobStrategyGraph = components["schemas"]["JobStrategyGraph"];
type JobModules = components["schemas"]["JobModules"];

/** What an API error says, for a card that cannot be drawn (the rest of the page still is). */
function failed(error: unknown): HTMLElement {
  const text = error instanceof ApiError || error instanceof Error ? error.message : String(error);
  return h("p", { class: "muted", "data-testid": "strategy-unavailable" }, text);
}

function stepPicker(ctx: PageContext, steps: string[], step: string): HTMLElement {
  const select = h(
    "select",
    { "data-testid": "strategy-step", "aria-label": t.parallel.step },
    steps.map((v) => h("option", { value: v, selected: v === step }, v)),
  );
  select.addEventListener("change", () => {
    window.location.hash = href("job-strategy", { run: ctx.run, step: select.value });
  });
  return h("label", { class: "pv-step" }, `${t.parallel.step} `, select);
}

/** One row per stage and module: its time on each rank and the spread across them. */
function moduleTable(data: JobModules): HTMLElement {
  const s = t.parallel.modules;
  const perRank = data.ranks.length <= 16 ? data.ranks : [];
  return h(
    "div",
    { class: "table-wrap" },
    h(
      "table",
      { class: "sg-modules", "data-testid": "module-table" },
      h(
        "thead",
        {},
        h(
          "tr",
          {},
          h("th", {}, s.stage),
          h("th", {}, s.module),
          h("th", { class: "num" }, s.mean),
          h("th", { class: "num" }, s.min),
          h("th", { class: "num" }, s.max),
          h("th", { class: "num" }, s.spread),
          h("th", { class: "num" }, s.slowest),
          perRank.map((r) => h("th", { class: "num" }, `${t.nav.rank} ${r}`)),
        ),
      ),
      h(
        "tbody",
        {},
        data.modules.map((m) => {
          const times = new Map(m.per_rank.map((p) => [p.rank, p.time_ns]));
          return h(
            "tr",
            { "data-module": m.module, "data-stage": m.stage },
            h("td", {}, String(m.stage)),
            h("td", { style: `padding-left: ${8 + 14 * m.depth}px` }, m.module),
            h("td", { class: "num" }, fmt.duration(m.mean_ns)),
            h("td", { class: "num" }, fmt.duration(m.min_ns)),
            h("td", { class: "num" }, fmt.duration(m.max_ns)),
            h("td", { class: "num" }, fmt.percent(m.spread)),
            h("td", { class: "num" }, String(m.slowest_rank)),
            perRank.map((r) => h("td", { class: "num", "data-rank": r, "data-time-ns": times.get(r) ?? "" }, times.has(r) ? fmt.duration(times.get(r)) : "")),
          );
        }),
      ),
    ),
  );
}

function leaf(ctx: PageContext, r: StrategyRank, longest: number): HTMLElement {
  const s = t.parallel.strategy;
  const share = longest > 0 ? (r.duration_ns ?? 0) / longest : 0;
  return h(
    "li",
    { class: `ps-rank${r.slow ? " slow" : ""}`, "data-rank": r.rank, "data-duration-ns": r.duration_ns ?? "" },
    h("a", { href: href("overview", { run: ctx.run, rank: r.rank }) }, `${t.nav.rank} ${r.rank}`),
    h("span", { class: "ps-bar" }, h("i", { style: `width: ${Math.round(share * 100)}%` })),
    h("span", {}, fmt.duration(r.duration_ns)),
    r.data_group !== null ? h("span", { class: "muted" }, s.dataGroup(r.data_group)) : null,
    r.host ? h("span", { class: "muted" }, r.host) : null,
    r.slow ? h("span", { class: "ps-slow" }, s.slow) : null,
  );
}

export async function jobStrategyPage(ctx: PageContext): Promise<void> {
  const s = t.parallel.strategy;
  const [data, graph, modules] = await Promise.all([
    get<JobStrategy>("job/strategy", { run: ctx.run }),
    get<JobStrategyGraph>("job/strategy/graph", { run: ctx.run, step: ctx.params.get("step") }).catch((e: unknown) => e),
    get<JobModules>("job/strategy/modules", { run: ctx.run }).catch((e: unknown) => e),
  ]);
  const g = t.parallel.graph;
  const isGraph = (v: unknown): v is JobStrategyGraph => !!v && typeof v === "object" && "stages" in v && "edges" in v;
  const isModules = (v: unknown): v is JobModules => !!v && typeof v === "object" && "modules" in v && "ranks" in v;
  const tree = h(
    "ul",
    { class: "ps-tree", "data-testid": "strategy-tree" },
    data.stages.map((st) =>
      h(
        "li",
        { class: "ps-stage", "data-stage": st.stage },
        h("details", { open: true }, h("summary", {}, s.stage(st.stage, fmt.duration(st.duration_ns))), h(
          "ul",
          {},
          st.replicas.flatMap((rep) =>
            rep.tensor_group === null
              ? rep.ranks.map((r) => leaf(ctx, r, data.max_duration_ns))
              : h(
                  "li",
                  { class: "ps-replica", "data-tensor-group": rep.tensor_group },
                  h("details", { open: true }, h("summary", {}, s.tensorGroup(rep.tensor_group, rep.ranks.length)), h("ul", {}, rep.ranks.map((r) => leaf(ctx, r, data.max_duration_ns)))),
                ),
          ),
        )),
      ),
    ),
  );
  const evidence = Object.entries(data.evidence).flatMap(([mode, lines]) => lines.map((line) => h("li", {}, `${mode}: ${line}`)));
  replace(
    ctx.root,
    h(
      "div",
      { class: "grid" },
      card(
        {
          title: isGraph(graph) ? g.title(graph.step) : g.titleNoStep,
          hint: g.hint,
          full: true,
          testId: "card-strategy-graph",
          tools: isGraph(graph) ? [stepPicker(ctx, graph.steps, graph.step)] : [],
        },
        isGraph(graph) ? strategyGraph(graph) : failed(graph),
      ),
      card(
        { title: t.parallel.modules.title, hint: t.parallel.modules.hint, full: true, testId: "card-module-table" },
        isModules(modules) ? (modules.modules.length ? moduleTable(modules) : h("p", { class: "muted" }, t.parallel.modules.none)) : failed(modules),
      ),
      card(
        { title: s.title, hint: s.hint, full: true, testId: "card-strategy" },
        h("p", { "data-testid": "strategy-modes" }, s.modes(data.modes.length ? data.modes.join(", ") : s.none)),
        tree,
        evidence.length ? h("ul", { class: "muted ps-evidence" }, evidence) : null,
        data.problems.length ? h("ul", { class: "ps-problems" }, data.problems.map((p) => h("li", {}, p))) : null,
      ),
    ),
  );
}
