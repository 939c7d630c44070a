/** The run list: every run under the base directory, newest first, with its analysis status. */
import { get, type Info, type RunInfo } from "../api";
import { card } from "../components/card";
import { h, replace } from "../dom";
import * as fmt from "../format";
import { t } from "../i18n";
import { go, href } from "../router";

/** The runs ticked for a comparison, in the order ticked (first BASE, then NEW); kept across the
 * list's refreshes while runs are being analysed. */
let picked: string[] = [];

function pickBox(run: RunInfo, button: HTMLButtonElement): HTMLInputElement {
  const box = h("input", { type: "checkbox", "aria-label": `${t.runs.pick}: ${run.name}`, "data-pick": run.id, checked: picked.includes(run.id) });
  box.addEventListener("change", () => {
    picked = box.checked ? [...picked.filter((id) => id !== run.id), run.id].slice(-2) : picked.filter((id) => id !== run.id);
    document.querySelectorAll<HTMLInputElement>("input[data-pick]").forEach((other) => {
      other.checked = picked.includes(other.dataset.pick ?? "");
    });
    button.disabled = picked.length !== 2;
  });
  return box;
}

function statusBadge(status: string): HTMLElement {
  const css = status === "ready" ? "ready" : status === "failed" ? "failed" : status === "analysing" || status === "queued" ? "running" : "";
  return h("span", { class: `badge ${css}` }, t.runs.status[status] ?? status);
}

/** Renders the list; returns true while some run is being analysed (the caller refreshes it). */
export async function runsPage(main: HTMLElement): Promise<boolean> {
  const [info, list] = await Promise.all([get<Info>("info"), get<{ runs: RunInfo[] }>("runs")]);
  const runs = [...list.runs].sort((a, b) => b.date.localeCompare(a.date) || a.name.localeCompare(b.name));
  const cols = t.runs.columns;
  picked = picked.filter((id) => runs.some((run) => run.id === id));
  const compare = h("button", { type: "button", class: "btn", "data-testid": "compare-picked", disabled: picked.length !== 2 }, t.runs.compare);
  compare.addEventListener("click", () => {
    if (picked.length === 2) go("compare", { base: picked[0], new: picked[1] });
  });
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
      h("td", { class: "pick" }, pickBox(run, compare)), // last: the columns before keep their places
    ),
  );
  replace(
    main,
    h("h1", {}, t.runs.title),
    h("p", { class: "muted" }, `${t.runs.baseDir}: `, h("code", {}, info.base_dir_name)),
    card(
      { title: t.runs.title, testId: "run-list", hint: t.runs.compareHint, tools: [compare] },
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
                h("th", { class: "pick" }, t.runs.compareColumn),
              ),
            ),
            h("tbody", {}, body),
          )
        : h("p", { class: "muted" }, t.runs.empty),
    ),
  );
  return runs.some((run) => run.status === "queued" || run.status === "analysing");
}
