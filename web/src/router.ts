/**
 * Hash routes, so the server only ever serves index.html and every view has a shareable URL:
 * `#/` is the run list, `#/<page>?run=<id>&rank=<n>&...` a page of one run.
 */

export type PageName =
  | "runs"
  | "job"
  | "job-steps"
  | "job-findings"
  | "job-compare"
  | "compare"
  | "job-time"
  | "job-heatmaps"
  | "job-comm"
  | "job-matrix"
  | "job-strategy"
  | "job-pipeline"
  | "job-marey"
  | "overview"
  | "findings"
  | "steps"
  | "operators"
  | "memory"
  | "data"
  | "timeline";

/** The pages of one rank (a single-device run, or one rank of a job). */
export const RUN_PAGES: PageName[] = ["overview", "findings", "steps", "operators", "memory", "data", "timeline"];
/** The pages of a job as a whole (runs of several ranks): a job opens on the first. */
export const JOB_PAGES: PageName[] = [
  "job", "job-steps", "job-time", "job-comm", "job-matrix", "job-heatmaps", "job-strategy", "job-pipeline",
  "job-marey",
  "job-findings", "job-compare",
];

export interface Route {
  page: PageName;
  params: URLSearchParams;
}

export function parse(hash: string = window.location.hash): Route {
  const text = hash.replace(/^#\/?/, "");
  const [path, query = ""] = text.split("?", 2);
  const params = new URLSearchParams(query);
  const known = [...JOB_PAGES, ...RUN_PAGES] as string[];
  if (path === "compare" && params.get("base") && params.get("new")) return { page: "compare", params }; // two runs, no `run`
  const page = known.includes(path) && params.get("run") ? (path as PageName) : "runs";
  return { page, params };
}

export function href(page: PageName, params: Record<string, string | number | null | undefined> = {}): string {
  if (page === "runs") return "#/";
  const search = new URLSearchParams();
  for (const [k, v] of Object.entries(params)) if (v !== null && v !== undefined && v !== "") search.set(k, String(v));
  return `#/${page}?${search.toString()}`;
}

export function go(page: PageName, params: Record<string, string | number | null | undefined> = {}): void {
  window.location.hash = href(page, params);
}
