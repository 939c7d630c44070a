/**
 * The findings pages: every finding the advisor made for a job (its cross-rank rules and each
 * rank's own) or for one rank, most important first, from /api/job/findings or /api/run/findings
 * (which serve advisor.json as the analysis wrote it).  Each shows its severity, category, culprit
 * (a rank links to that rank's pages), title, suggestion and an expandable evidence table; the
 * EN/中文 switch picks the language of the texts the advisor wrote.
 */
import { get, type Findings } from "../api";
import { card } from "../components/card";
import { findingList, language, languageSwitch } from "../components/findings";
import type { PageContext } from "../context";
import { h, replace } from "../dom";
import { t } from "../i18n";

async function render(ctx: PageContext, data: Findings, hint: string): Promise<void> {
  const f = t.findings;
  const list = h("div", {});
  const draw = (lang: string) => replace(list, findingList(data, ctx.run, data.findings, lang));
  draw(language());
  replace(
    ctx.root,
    h(
      "div",
      { class: "grid" },
      card(
        { title: f.title, hint, full: true, testId: "findings-page", tools: [languageSwitch(draw)] },
        h(
          "div",
          { class: "muted findings-counts", "data-testid": "findings-counts" },
          f.counts(data.counts.critical ?? 0, data.counts.warning ?? 0, data.counts.info ?? 0),
          " · ",
          h("code", {}, data.source),
        ),
        data.findings.length ? list : h("p", { class: "muted" }, t.noData),
      ),
    ),
  );
}

/** The job's findings (the "Findings" tab of a job). */
export async function jobFindingsPage(ctx: PageContext): Promise<void> {
  const data = await get<Findings>("job/findings", { run: ctx.run });
  await render(ctx, data, t.findings.pageHintJob);
}

/** One rank's findings (the "Findings" tab of a rank). */
export async function findingsPage(ctx: PageContext): Promise<void> {
  const data = await get<Findings>("run/findings", { run: ctx.run, rank: ctx.rank });
  await render(ctx, data, t.findings.pageHintRank(data.rank ?? ctx.rank));
}
