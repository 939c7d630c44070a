/**
 * The typed client of perfsight's JSON API (src/perfsight/server/, documented in docs/API.md).
 * The response types are generated from the server's OpenAPI into ./api-types.ts
 * (`python scripts/gen_api_types.py`; tests/test_api_types.py fails when it is out of date), so
 * they cannot drift from src/perfsight/server/models.py.  Times are integer ns relative to the
 * run's origin; sizes are bytes.  Nothing here formats or renders (see ./format.ts).
 */

import type { components } from "./api-types";
import { t } from "./i18n";

type Schemas = components["schemas"];

export type Info = Schemas["Info"];
export type RunInfo = Schemas["RunInfo"];
export type RunList = Schemas["RunList"];
export type RunStatus = Schemas["RunStatus"];
export type RunStatusName = RunStatus["status"];
export type StepBreakdown = Schemas["StepBreakdown"];
export type Shares = Schemas["Shares"];
export type OperatorTypeShare = Schemas["OperatorTypeShare"];
export type Overview = Schemas["Overview"];
export type StepRow = Schemas["StepRow"];
export type StepTrace = Schemas["StepTrace"];
export type OperatorTypeRow = Schemas["OperatorTypeRow"];
export type OperatorRow = Schemas["OperatorRow"];
export type KernelTypeRow = Schemas["KernelTypeRow"];
export type KernelRow = Schemas["KernelRow"];
export type MemoryDevice = Schemas["MemoryDevice"];
export type Memory = Schemas["Memory"];
export type TrackInfo = Schemas["Track"];
export type Tracks = Schemas["Tracks"];
export type Lane = Schemas["Lane"];
export type WindowData = Schemas["Window"];
export type FlowRef = Schemas["FlowRef"];
export type EventDetail = Schemas["EventDetail"];
export type SearchHit = Schemas["SearchHit"];
export type SearchResult = Schemas["SearchResult"];
export type FlowData = Schemas["Flows"];
export type JobRank = Schemas["JobRank"];
export type JobOverview = Schemas["JobOverview"];
export type JobStepTrace = Schemas["JobStepTrace"];
export type HeatmapCell = Schemas["HeatmapCell"];
export type JobHeatmaps = Schemas["JobHeatmaps"];
export type TimeOverviewStep = Schemas["TimeOverviewStep"];
export type JobTimeOverview = Schemas["JobTimeOverview"];
export type CommChoices = Schemas["CommChoices"];
export type CommRank = Schemas["CommRank"];
export type JobCommunication = Schemas["JobCommunication"];
export type CommLink = Schemas["CommLink"];
export type CommLinkPage = Schemas["CommLinkPage"];
export type CommOp = Schemas["CommOp"];
export type CommOpPage = Schemas["CommOpPage"];
export type CommMatrix = Schemas["CommMatrix"];
export type Findings = Schemas["Findings"];
export type DataPrep = Schemas["DataPrep"];
export type Finding = Schemas["Finding"];
export type FindingEvidence = Schemas["FindingEvidence"];
export type Severity = Finding["severity"];

/** A page of a table endpoint (operator-types, operators, kernel-types, kernels). */
export interface PageOf<T> {
  total: number;
  offset: number;
  limit: number;
  rows: T[];
}

export class ApiError extends Error {
  constructor(
    message: string,
    readonly status: number,
    readonly body: unknown,
  ) {
    super(message);
  }
}

type Params = Record<string, string | number | boolean | null | undefined>;

function url(path: string, params: Params = {}): string {
  const search = new URLSearchParams();
  for (const [k, v] of Object.entries(params)) {
    if (v !== undefined && v !== null && v !== "") search.set(k, String(v));
  }
  const qs = search.toString();
  return `api/${path}${qs ? `?${qs}` : ""}`;
}

export async function get<T>(path: string, params: Params = {}, signal?: AbortSignal): Promise<T> {
  if (report) return fromReport<T>(path, params);
  const response = await fetch(url(path, params), { signal, headers: { Accept: "application/json" } });
  const body = await response.json().catch(() => null);
  if (!response.ok) {
    const detail = body && typeof body === "object" && "detail" in body ? String((body as any).detail) : response.statusText;
    throw new ApiError(detail, response.status, body);
  }
  return body as T;
}

// ------------------------------------------------------------------------------------------------
// Static mode: a report written by `perfsight report` (docs/REPORT.md) holds the server's answers
// to the requests its pages make, in a <script type="application/json" id="perfsight-report">
// element; get() answers from it and never touches the network.  A request the report does not
// hold fails with NotInReport, which the page shows where the data would be.

/** One embedded answer: its body, or (to keep reports small) another answer's body with one list
 * reordered -- `order[i]` is the index in `like`'s `field` of the i-th element. */
export interface ReportAnswer {
  path: string;
  params: Record<string, string>;
  status: number;
  body?: unknown;
  like?: number;
  field?: string;
  order?: number[];
}

/** The document embedded in a report (src/perfsight/server/report_bundle.py `Report.document`). */
export interface ReportData {
  format: number;
  /** A run's pages (`perfsight report`), or one comparison (`perfsight compare --html`). */
  kind: "run" | "compare";
  run: string;
  title: string;
  generated: string;
  perfsight: string;
  /** The pages the report carries, in the order of the tabs. */
  pages: string[];
  /** Where it opens, when not on its first page of its run (a comparison: #/compare?base=..&new=..). */
  start?: { page: string; params: Record<string, string> };
  /** The ranks whose pages it carries, and every rank of the run. */
  ranks: number[];
  all_ranks: number[];
  /** What was left out to keep the file small: a kind of view and how many of them. */
  omitted: { what: string; count: number }[];
  answers: ReportAnswer[];
}

/** The request as a key: the parameters the UI sends (empty ones dropped), sorted by name. */
function requestKey(path: string, params: Params | Record<string, string>): string {
  const kept = Object.entries(params)
    .filter(([, v]) => v !== undefined && v !== null && v !== "")
    .map(([k, v]) => [k, String(v)])
    .sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0));
  return JSON.stringify([path, kept]);
}

function readReport(): { data: ReportData; index: Map<string, number> } | null {
  const element = typeof document !== "undefined" ? document.getElementById("perfsight-report") : null;
  if (!element?.textContent) return null;
  const data = JSON.parse(element.textContent) as ReportData;
  const index = new Map<string, number>();
  data.answers.forEach((a, i) => index.set(requestKey(a.path, a.params), i));
  return { data, index };
}

const embedded = readReport();
/** The report this page is, or null when it is served by `perfsight serve`. */
export const report: ReportData | null = embedded?.data ?? null;

/** A request whose answer the report does not hold (a view it left out to stay small). */
export class NotInReport extends ApiError {
  constructor(path: string) {
    super(t.report.notIncluded, 404, { detail: t.report.notIncluded, path });
  }
}

function body(i: number): unknown {
  const answer = embedded!.data.answers[i];
  if (answer.like === undefined) return answer.body;
  const base = body(answer.like) as Record<string, unknown[]>;
  if (answer.field === undefined || answer.order === undefined) return base;
  const list = base[answer.field];
  return { ...base, [answer.field]: answer.order.map((j) => list[j]) };
}

async function fromReport<T>(path: string, params: Params): Promise<T> {
  const i = embedded!.index.get(requestKey(path, params));
  if (i === undefined) throw new NotInReport(path);
  const answer = embedded!.data.answers[i];
  const data = body(i);
  if (answer.status >= 400) {
    const detail = data && typeof data === "object" && "detail" in data ? String((data as any).detail) : `HTTP ${answer.status}`;
    throw new ApiError(detail, answer.status, data);
  }
  return data as T;
}
