/**
 * Display formatting at the edge: the API sends nanoseconds and bytes (the trace model's units),
 * and only this module turns them into text a person reads.
 */

const NS_UNITS: [number, string][] = [
  [1e9, "s"],
  [1e6, "ms"],
  [1e3, "µs"],
  [1, "ns"],
];

/** A duration in nanoseconds as "12.345 ms" (unit chosen from the magnitude). */
export function duration(ns: number | null | undefined, digits = 3): string {
  if (ns === null || ns === undefined || !Number.isFinite(ns)) return "–";
  const abs = Math.abs(ns);
  for (const [scale, unit] of NS_UNITS) {
    if (abs >= scale || scale === 1) return `${(ns / scale).toFixed(scale === 1 ? 0 : digits)} ${unit}`;
  }
  return `${ns} ns`;
}

/** Milliseconds with fixed digits, for tables and chart axes that share one unit. */
export function ms(ns: number | null | undefined, digits = 3): string {
  if (ns === null || ns === undefined || !Number.isFinite(ns)) return "–";
  return (ns / 1e6).toFixed(digits);
}

/** The unit of chart axes that show times: values for them come from {@link nsToMs}. */
export const MS = "ms";

/** Nanoseconds as a number of milliseconds, for a chart whose axis is in {@link MS} (null stays null). */
export function nsToMs(ns: number | null | undefined): number | null {
  return ns === null || ns === undefined || !Number.isFinite(ns) ? null : ns / 1e6;
}

/** A chart value already in milliseconds (from {@link nsToMs}) as "12.345 ms". */
export function msValue(valueMs: unknown, digits = 3): string {
  if (valueMs === null || valueMs === undefined || valueMs === "") return "–";
  const value = Number(valueMs);
  return Number.isFinite(value) ? `${value.toFixed(digits)} ${MS}` : "–";
}

/** An axis tick in milliseconds, without trailing zeros ("0.25", "12"). */
export function msTick(valueMs: number, digits = 3): string {
  return String(Number(valueMs.toFixed(digits)));
}

const BYTE_UNITS = ["B", "KiB", "MiB", "GiB", "TiB"];

export function bytes(n: number | null | undefined): string {
  if (n === null || n === undefined || !Number.isFinite(n)) return "–";
  let value = n;
  let unit = 0;
  while (Math.abs(value) >= 1024 && unit < BYTE_UNITS.length - 1) {
    value /= 1024;
    unit += 1;
  }
  return unit === 0 ? `${value} B` : `${value.toFixed(2)} ${BYTE_UNITS[unit]}`;
}

export function percent(ratio: number | null | undefined, digits = 1): string {
  if (ratio === null || ratio === undefined || !Number.isFinite(ratio)) return "–";
  return `${(ratio * 100).toFixed(digits)}%`;
}

export function count(n: number | null | undefined): string {
  if (n === null || n === undefined || !Number.isFinite(n)) return "–";
  return n.toLocaleString("en-US");
}

const FLOP_UNITS = ["", "K", "M", "G", "T", "P", "E"];

export function flops(n: number | null | undefined): string {
  if (n === null || n === undefined || !Number.isFinite(n)) return "–";
  let value = n;
  let unit = 0;
  while (Math.abs(value) >= 1000 && unit < FLOP_UNITS.length - 1) {
    value /= 1000;
    unit += 1;
  }
  return `${value.toFixed(unit === 0 ? 0 : 2)} ${FLOP_UNITS[unit]}FLOP`;
}

/** A date from Unix seconds or an ISO string, in the viewer's locale-neutral form. */
export function date(value: string | number | null | undefined): string {
  if (value === null || value === undefined || value === "") return "–";
  const d = typeof value === "number" ? new Date(value * 1000) : new Date(value);
  if (Number.isNaN(d.getTime())) return String(value);
  const pad = (x: number) => String(x).padStart(2, "0");
  return `${d.getFullYear()}-${pad(d.getMonth() + 1)}-${pad(d.getDate())} ${pad(d.getHours())}:${pad(d.getMinutes())}`;
}

/** A list of shapes such as [[2,3],[7]] as "2×3, 7". */
export function shapes(value: unknown): string {
  const parsed = typeof value === "string" ? safeJson(value) : value;
  if (!Array.isArray(parsed)) return value === null || value === undefined ? "" : String(value);
  return parsed
    .map((dims) => (Array.isArray(dims) ? (dims.length ? dims.join("×") : "–") : String(dims)))
    .join(", ");
}

export function list(value: unknown): string {
  const parsed = typeof value === "string" ? safeJson(value) : value;
  if (!Array.isArray(parsed)) return value === null || value === undefined ? "" : String(value);
  return parsed.map((x) => String(x ?? "")).join(", ");
}

function safeJson(text: string): unknown {
  try {
    return JSON.parse(text);
  } catch {
    return text;
  }
}
