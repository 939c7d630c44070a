/**
 * The parallel-strategy view as a tree of parallel groups (seed 000's 并行策略视图, as far as a
 * PyTorch job's trace tells it): the job's pipeline stages, in each its model replicas (a
 * tensor-parallel group, or one rank), in each its ranks, each leaf with its average step time as a
 * bar against the slowest rank's and its data-parallel group.  The modes and groups are the cluster
 * analysis's, with the evidence it named them on (/api/job/strategy); nothing is computed here.
 * Clicking a rank opens its overview.
 */
import { get } from "../api";
import type { components } from "../api-types";
import { card } from "../components/card";
import type { PageContext } from "../context";
import { h, replace } from "../dom";
import * as fmt from "../format";
import { t } from "../i18n";
import { href } from "../router";

type JobStrategy = components["schemas"]["JobStrategy"];
type StrategyRank = components["schemas"]["StrategyRank"];

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
  const data = await get<JobStrategy>("job/strategy", { run: ctx.run });
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
        { title: s.title, hint: s.hint, full: true, testId: "card-strategy" },
        h("p", { "data-testid": "strategy-modes" }, s.modes(data.modes.length ? data.modes.join(", ") : s.none)),
        tree,
        evidence.length ? h("ul", { class: "muted ps-evidence" }, evidence) : null,
        data.problems.length ? h("ul", { class: "ps-problems" }, data.problems.map((p) => h("li", {}, p))) : null,
      ),
    ),
  );
}
