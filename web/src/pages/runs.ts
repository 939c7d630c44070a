/** The run list: every run under the base directory, newest first, with its analysis status. */
import { get, type Info, type RunInfo } from "../api";
import { card } from "../components/card";
import { h, replace } from "../dom";
import * as fmt from "../format";
import { t } from "../i18n";
import { href } from "../router";

function statusBadge(status: string): HTMLElement {
  const css = status === "ready" ? "ready" : status === "failed" ? "failed" : status === "analysing" || status === "queued" ? "running" : "";
  return h("span", { class: `badge ${css}` }, t.runs.status[status] ?? status);
}

/** Renders the list; returns true while some run is being analysed (the caller refreshes it). */
export async function runsPage(main: HTMLElement): Promise<boolean> {
  const [info, list] = await Promise.all([get<Info>("info"), get<{ runs: RunInfo[] }>("runs")]);
  const runs = [...list.runs].sort((a, b) => b.date.localeCompare(a.date) || a.name.localeCompare(b.name));
  const cols = t.runs.columns;
  const body = runs.map((run) =>
    h(
      "tr",
      { "data-run": run.id },
      // a job of several ranks opens on its job overview, a single-device run on its overview
      h("td", {}, h("a", { href: href(run.ranks.length > 1 ? "job" : "overview", { run: run.id }), class: "run-link" }, run.name)),
      h("td", {}, run.kind_label),
      h("td", { class: "num" }, run.ranks.length ? String(run.ranks.length) : "–"),
      h("td", { class: "num", title: run.hosts.join(", ") }, run.hosts.length ? String(run.hosts.length) : "–"),
      h("td", {}, run.layout ?? "–"),
      h("td", { class: "num" }, run.steps === null ? "–" : String(run.steps)),
      h("td", {}, fmt.date(run.date)),
      h("td", { title: run.error ?? "" }, statusBadge(run.status)),
    ),
  );
  replace(
    main,
    h("h1", {}, t.runs.title),
    h("p", { class: "muted" }, `${t.runs.baseDir}: `, h("code", {}, info.base_dir_name)),
    card(
      { title: t.runs.title, testId: "run-list" },
      runs.length
        ? h(
            "table",
            { class: "data" },
            h(
              "thead",
              {},
              h(
                "tr",
                {},
                h("th", {}, cols.name),
                h("th", {}, cols.kind),
                h("th", { class: "num" }, cols.ranks),
                h("th", { class: "num" }, cols.hosts),
                h("th", {}, cols.layout),
                h("th", { class: "num" }, cols.steps),
                h("th", {}, cols.date),
                h("th", {}, cols.status),
              ),
            ),
            h("tbody", {}, body),
          )
        : h("p", { class: "muted" }, t.runs.empty),
    ),
  );
  return runs.some((run) => run.status === "queued" || run.status === "analysing");
}
