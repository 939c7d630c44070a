/**
 * The application shell: header, tabs and the route → page dispatch.  Opening a run first polls
 * its analysis status (which starts the background analysis) and shows the progress; pages are
 * only rendered once the run is ready.
 */
import "./style.css";
import { ApiError, get, NotInReport, report, type RunStatus } from "./api";
import { errorBox } from "./components/card";
import type { PageContext } from "./context";
import { h, replace } from "./dom";
import * as fmt from "./format";
import { t } from "./i18n";
import { jobPage } from "./pages/job";
import { comparePage, jobComparePage } from "./pages/compare";
import { findingsPage, jobFindingsPage } from "./pages/findings";
import { jobStepsPage } from "./pages/job-steps";
import { jobHeatmapsPage } from "./pages/job-heatmaps";
import { jobTimePage } from "./pages/job-time";
import { jobMareyPage } from "./pages/job-marey";
import { jobPipelinePage } from "./pages/job-pipeline";
import { jobStrategyPage } from "./pages/job-strategy";
import { jobCommPage } from "./pages/job-comm";
import { jobMatrixPage } from "./pages/job-matrix";
import { memoryPage } from "./pages/memory";
import { dataPage } from "./pages/data";
import { operatorsPage } from "./pages/operators";
import { overviewPage } from "./pages/overview";
import { runsPage } from "./pages/runs";
import { stepsPage } from "./pages/steps";
import { timelinePage } from "./pages/timeline";
import { href, JOB_PAGES, parse, RUN_PAGES, type PageName } from "./router";

const PAGES: Record<Exclude<PageName, "runs" | "compare">, (ctx: PageContext) => Promise<void>> = {
  job: jobPage,
  "job-compare": jobComparePage,
  "job-steps": jobStepsPage,
  "job-findings": jobFindingsPage,
  "job-time": jobTimePage,
  "job-heatmaps": jobHeatmapsPage,
  "job-strategy": jobStrategyPage,
  "job-pipeline": jobPipelinePage,
  "job-marey": jobMareyPage,
  "job-comm": jobCommPage,
  "job-matrix": jobMatrixPage,
  overview: overviewPage,
  findings: findingsPage,
  steps: stepsPage,
  operators: operatorsPage,
  memory: memoryPage,
  data: dataPage,
  timeline: timelinePage,
};

const app = document.getElementById("app") as HTMLElement;
let generation = 0;
/** Re-renders after a 409 (the run went stale while open): bounded, so a server fault cannot loop. */
let staleRetries = 0;
const MAX_STALE_RETRIES = 2;

function header(crumb: string | null, extra: Node | null = null): HTMLElement {
  return h(
    "header",
    { class: "top" },
    h("a", { class: "brand", href: href("runs") }, t.appName),
    report ? h("span", { class: "badge report-badge", "data-testid": "report-badge" }, t.report.badge) : null,
    crumb !== null ? h("span", { class: "crumb", "data-testid": "run-name" }, report ? report.title : crumb) : null,
    h("span", { class: "spacer" }),
    extra,
  );
}

async function waitUntilReady(run: string, main: HTMLElement, mine: number): Promise<RunStatus | null> {
  const bar = h("div");
  const label = h("div", { class: "muted", "data-testid": "analysis-stage" });
  let shown = false;
  for (;;) {
    const status = await get<RunStatus>("run/status", { run });
    if (mine !== generation) return null;
    if (status.status === "ready") return status;
    if (status.status === "failed") {
      replace(main, errorBox(`${t.runs.analysisFailed}: ${status.error ?? ""}`));
      return null;
    }
    if (!shown) {
      replace(
        main,
        h(
          "section",
          { class: "card", "data-testid": "analysis-progress" },
          h("h2", {}, t.runs.analysing),
          h("div", { class: "progress" }, bar),
          label,
        ),
      );
      shown = true;
    }
    bar.style.width = fmt.percent(status.progress, 0);
    label.textContent = `${fmt.percent(status.progress, 0)} · ${status.stage}`;
    await new Promise((resolve) => setTimeout(resolve, 400));
  }
}

/** What a report carries and leaves out, under its pages (static mode only). */
function reportNote(): HTMLElement | null {
  if (!report) return null;
  const omitted = report.omitted.map((o) => h("li", {}, `${o.what} (${o.count})`));
  return h(
    "footer",
    { class: "report-note", "data-testid": "report-note" },
    h("p", {}, `${t.report.made(report.perfsight, report.generated)} ${report.all_ranks.length > 1 ? t.report.ranks(report.ranks.length, report.all_ranks.length) : ""} ${t.report.needsServer}`),
    omitted.length ? h("p", {}, t.report.leftOut) : null,
    omitted.length ? h("ul", { "data-testid": "report-omitted" }, omitted) : null,
  );
}

async function render(): Promise<void> {
  const mine = ++generation;
  const route = parse();
  const main = h("main");
  if (report) {
    document.body.classList.add("report");
    if (route.page === "runs") {
      // a report is one run (or one comparison): it opens on its first page (there is no run list)
      const start = report.start ?? { page: report.pages[0], params: { run: report.run } };
      window.location.replace(href(start.page as PageName, start.params));
      return;
    }
  }
  if (route.page === "runs") {
    replace(app, header(null), main);
    try {
      if (await runsPage(main)) {
        setTimeout(() => {
          if (mine === generation) void render();
        }, 2000);
      }
    } catch (err) {
      replace(main, errorBox(err));
    }
    return;
  }
  if (route.page === "compare") {
    replace(app, header(t.compare.title), main);
    await comparePage(main, route.params);
    return;
  }
  const run = route.params.get("run") as string;
  const tabs = h("nav", { class: "tabs" });
  const rankSelect = h("select", { "aria-label": t.nav.rank, "data-testid": "rank-select" });
  replace(app, header(run, rankSelect), tabs, main, ...(report ? [reportNote() as HTMLElement] : []));
  rankSelect.hidden = true;
  try {
    const status = await waitUntilReady(run, main, mine);
    if (!status || mine !== generation) return;
    // a report's rank pages are those of the ranks it carries; its job pages still show every rank
    const ranks = report ? report.ranks : status.ranks.length ? status.ranks : [0];
    const jobRun = (report ? report.all_ranks : ranks).length > 1;
    const asked = Number(route.params.get("rank"));
    const rank = route.params.has("rank") && ranks.includes(asked) ? asked : ranks[0];
    const link = (page: PageName, extra: Record<string, string | number | null | undefined> = {}) =>
      href(page, { run, rank, ...extra });
    const jobPage = JOB_PAGES.includes(route.page);
    // a job of several ranks opens on its job pages; its rank pages follow, for the chosen rank
    const pages = (jobRun ? [...JOB_PAGES, ...RUN_PAGES] : RUN_PAGES).filter((p) => !report || report.pages.includes(p));
    const tab = (page: PageName) =>
      h(
        "a",
        {
          // a step chosen on a job page (the time overview) carries to the other job pages
          href: JOB_PAGES.includes(page) ? href(page, { run, step: route.params.get("step") }) : link(page),
          class: page === route.page ? "active" : "",
          "data-page": page,
        },
        t.nav[page as keyof typeof t.nav] as string,
      );
    // a job's tabs in two rows, each named: the job's pages, then the chosen rank's
    const group = (name: string, label: string, list: PageName[]) =>
      h("div", { class: "tab-group", "data-group": name }, h("span", { class: "tab-label" }, label), list.map(tab));
    const jobTabs = pages.filter((p) => JOB_PAGES.includes(p));
    const rankTabs = pages.filter((p) => !JOB_PAGES.includes(p));
    replace(
      tabs,
      jobRun && jobTabs.length
        ? [group("job", t.nav.jobGroup, jobTabs), group("rank", `${t.nav.rank} ${rank}`, rankTabs)]
        : rankTabs.map(tab),
    );
    replace(rankSelect, ranks.map((r) => h("option", { value: r, selected: r === rank }, `${t.nav.rank} ${r}`)));
    rankSelect.hidden = ranks.length < 2 || jobPage;
    rankSelect.onchange = () => {
      window.location.hash = href(route.page, { ...Object.fromEntries(route.params), rank: rankSelect.value });
    };
    main.className = route.page === "timeline" ? "wide" : "";
    replace(main);
    if (report && !jobPage && route.params.has("rank") && !ranks.includes(asked)) {
      replace(main, h("div", { class: "card note", "data-testid": "not-in-report" }, t.report.rankNotIncluded(asked)));
      return;
    }
    if (report && !report.pages.includes(route.page)) {
      const name = t.nav[route.page as keyof typeof t.nav] as string;
      replace(main, h("div", { class: "card note", "data-testid": "not-in-report" }, t.report.pageNotIncluded(name)));
      return;
    }
    const page = PAGES[route.page as Exclude<PageName, "runs" | "compare">];
    await page({ run, rank, ranks, params: route.params, root: main, link });
    staleRetries = 0;
  } catch (err) {
    if (mine !== generation) return;
    if (err instanceof ApiError && err.status === 409 && staleRetries < MAX_STALE_RETRIES) {
      staleRetries += 1;
      setTimeout(() => void render(), 1000); // polls the status again, which re-analyses the run
      return;
    }
    // a view a report left out is a note where it would be, not an error
    replace(main, err instanceof NotInReport ? h("div", { class: "card note", "data-testid": "not-in-report" }, err.message) : errorBox(err));
  }
}

window.addEventListener("hashchange", () => void render());
void render();
