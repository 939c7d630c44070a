/**
 * The typed client of perfsight's JSON API (src/perfsight/server/, documented in docs/API.md).
 * The response types are generated from the server's OpenAPI into ./api-types.ts
 * (`python scripts/gen_api_types.py`; tests/test_api_types.py fails when it is out of date), so
 * they cannot drift from src/perfsight/server/models.py.  Times are integer ns relative to the
 * run's origin; sizes are bytes.  Nothing here formats or renders (see ./format.ts).
 */

import type { components } from "./api-types";

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
  const response = await fetch(url(path, params), { signal, headers: { Accept: "application/json" } });
  const body = await response.json().catch(() => null);
  if (!response.ok) {
    const detail = body && typeof body === "object" && "detail" in body ? String((body as any).detail) : response.statusText;
    throw new ApiError(detail, response.status, body);
  }
  return body as T;
}
