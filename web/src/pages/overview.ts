/**
 * Overview of one rank: step-time breakdown, operator types, data wait, where the time goes
 * (compute / communication overlapped and not / free / preparing) and a timeline summary.  Each
 * card links to its detail page.
 */
import { get, type Findings, type Overview } from "../api";
import { card, chartBox, stat } from "../components/card";
import { findingsCard } from "../components/findings";
import { chart, tooltip } from "../charts";
import type { PageContext } from "../context";
import { h, replace } from "../dom";
import * as fmt from "../format";
import { t } from "../i18n";
import { minddataEn } from "../i18n/minddata";
import { DATA_WAIT_COLOR, OVERLAP_COLORS, STAGE_COLORS } from "../palette";

/** Whether the run recorded any device activity (a device stream): else the device widgets are hidden. */
export function hasDevice(data: Overview): boolean {
  return data.timeline.device_tracks > 0;
}

/** The one line a CPU-only run shows in place of its device widgets. */
export function noDeviceLine(device: string | null = null): HTMLElement {
  // a device the run names but whose files hold no op timeline (a MindInsight step trace alone) is not "CPU only"
  return h("p", { class: "no-device", "data-testid": "no-device", role: "note" }, device ? minddataEn.noDeviceTimeline(device) : t.polish.noDevice);
}

export async function overviewPage(ctx: PageContext): Promise<void> {
  const findings = get<Findings>("run/findings", { run: ctx.run, rank: ctx.rank });
  findings.catch(() => undefined); // shown in its card; never an unhandled rejection
  const data = await get<Overview>("run/overview", { run: ctx.run, rank: ctx.rank });
  const o = t.overview;
  const steps = data.steps;
  const avgStep = steps.length ? steps.reduce((s, x) => s + x.duration_ns, 0) / steps.length : null;
  const device = hasDevice(data);

  const stats = h(
    "div",
    { class: "stats" },
    stat(o.steps, String(steps.length), "stat-steps"),
    stat(o.avgStep, fmt.duration(avgStep), "stat-avg-step"),
    stat(o.span, fmt.duration(data.timeline.duration_ns), "stat-span"),
    stat(o.events, fmt.count(data.timeline.events), "stat-events"),
    stat(o.tracks, device ? `${data.timeline.tracks} (${data.timeline.device_tracks} ${o.deviceTracks})` : String(data.timeline.tracks), "stat-tracks"),
    data.device ? stat(o.devices, data.device) : null,
  );

  const breakdownEl = chartBox("chart-step-breakdown");
  const typesEl = chartBox("chart-operator-types");
  const dataWaitSteps = Object.keys(data.data_wait.per_step);
  const dataWaitEl = data.data_wait.source && dataWaitSteps.length ? chartBox("chart-data-wait") : null;

  const grid = h(
    "div",
    { class: "grid" },
    device ? null : noDeviceLine(data.device),
    findingsCard(findings, ctx.run, ctx.link("findings")),
    card({ title: o.timelineSummary, link: ctx.link("timeline"), full: true, testId: "timeline-summary" }, stats),
    card({ title: o.stepBreakdown, hint: o.stepBreakdownHint, link: ctx.link("steps"), testId: "card-step-breakdown" }, breakdownEl),
    card({ title: o.operatorTypes, hint: o.operatorTypesHint, link: ctx.link("operators"), testId: "card-operator-types" }, typesEl),
    card({ title: o.timeShares, link: ctx.link("timeline"), testId: "card-shares" }, shares(data)),
    dataWaitEl ? card({ title: o.dataWait, link: ctx.link("steps"), testId: "card-data-wait" }, dataWaitEl) : null,
    card({ title: o.byKind, link: ctx.link("timeline"), testId: "card-by-kind" }, kindTable(data)),
    data.warnings.length
      ? card({ title: o.warnings, full: true }, h("ul", { class: "warn-list" }, data.warnings.map((w) => h("li", {}, w))))
      : null,
  );
  replace(ctx.root, grid);

  const labels = steps.map((s) => String(s.step));
  const series = [
    [t.steps.stage.iterationInterval, "iteration_interval_ns", STAGE_COLORS.iterationInterval],
    [t.steps.stage.fpBp, "fp_bp_ns", STAGE_COLORS.fpBp],
    [t.steps.stage.tail, "tail_ns", STAGE_COLORS.tail],
  ] as const;
  chart(breakdownEl, {
    legend: { top: 0 },
    grid: { left: 56, right: 16, top: 36, bottom: 36 },
    tooltip: tooltip("axis", (params: any[]) => [
      `${t.steps.columns.step} ${params[0]?.axisValue ?? ""}`,
      params.map((p) => [p.seriesName, fmt.msValue(p.value)]),
    ]),
    xAxis: { type: "category", data: labels, name: t.steps.columns.step, nameLocation: "middle", nameGap: 24 },
    yAxis: { type: "value", name: fmt.MS },
    series: series.map(([name, key, color]) => ({
      name,
      type: "bar",
      stack: "step",
      itemStyle: { color },
      data: steps.map((s) => fmt.nsToMs(s[key] ?? 0)),
    })),
  });

  chart(typesEl, {
    tooltip: tooltip("item", (p: any) => [
      p.name,
      [
        [t.operators.columns.count, fmt.count(p.data.count)],
        [t.operators.columns.ratio, `${p.percent}%`],
        [data.top_by === "device_total_ns" ? t.operators.byDevice : t.operators.byHost, fmt.duration(p.data.ns)],
      ],
    ]),
    series: [
      {
        type: "pie",
        radius: ["35%", "68%"],
        center: ["50%", "52%"],
        minShowLabelAngle: 6,
        label: { formatter: (p: any) => truncate(p.name, 26) },
        data: data.operator_types.map((op) => ({
          name: op.name,
          value: op.share,
          count: op.count,
          ns: data.top_by === "device_total_ns" ? op.device_total_ns : op.host_self_ns,
        })),
      },
    ],
  });

  if (dataWaitEl) {
    chart(dataWaitEl, {
      grid: { left: 56, right: 16, top: 24, bottom: 36 },
      tooltip: tooltip("axis", (params: any[]) => [
        `${t.steps.columns.step} ${params[0]?.axisValue ?? ""}`,
        params.map((p) => [p.seriesName, fmt.msValue(p.value)]),
      ]),
      xAxis: { type: "category", data: dataWaitSteps, name: t.steps.columns.step, nameLocation: "middle", nameGap: 24 },
      yAxis: { type: "value", name: fmt.MS },
      series: [
        {
          name: o.dataWait,
          type: "bar",
          itemStyle: { color: DATA_WAIT_COLOR },
          data: dataWaitSteps.map((k) => fmt.nsToMs(data.data_wait.per_step[k])),
        },
      ],
    });
  }
}

function shares(data: Overview): HTMLElement {
  const s = data.shares;
  const rows: [string, number, number, string][] = [
    [t.overview.computing, s.computing, s.computing_ns, OVERLAP_COLORS.computing],
    [t.overview.overlapped, s.communication_overlapped, s.communication_overlapped_ns, OVERLAP_COLORS.overlapped],
    [t.overview.commNotOverlapped, s.communication_not_overlapped, s.communication_not_overlapped_ns, OVERLAP_COLORS.communicationNotOverlapped],
    [t.overview.free, s.free, s.free_ns, OVERLAP_COLORS.free],
    [t.overview.preparing, s.preparing, s.preparing_ns, OVERLAP_COLORS.preparing],
  ];
  const shareRow = ([label, ratio, ns, color]: [string, number, number, string], sub = false) => {
    const fill = h("div");
    fill.style.width = fmt.percent(Math.max(0, Math.min(1, ratio)), 3);
    fill.style.background = color;
    return h(
      "div",
      { class: sub ? "share-row sub" : "share-row", title: sub ? `${fmt.duration(ns)}: ${t.overview.freeHostWaitHint}` : fmt.duration(ns) },
      h("span", {}, label),
      h("div", { class: "share-bar" }, fill),
      h("span", { class: "num", "data-share": label }, fmt.percent(ratio)),
    );
  };
  // the part of the free time the device waited for the host (device_idle), under Free
  const waited: [string, number, number, string] = [t.overview.freeHostWait, s.free_host_wait, s.free_host_wait_ns, OVERLAP_COLORS.freeHostWait];
  return h(
    "div",
    { class: "shares" },
    rows.flatMap((row) => (row[0] === t.overview.free && s.free_host_wait > 0 ? [shareRow(row), shareRow(waited, true)] : [shareRow(row)])),
  );
}

function kindTable(data: Overview): HTMLElement {
  const rows = [...data.timeline.by_kind].sort((a, b) => b.total_ns - a.total_ns);
  return h(
    "table",
    { class: "data spaced" },
    h(
      "thead",
      {},
      h("tr", {}, h("th", {}, t.timeline.fields.kind), h("th", { class: "num" }, t.operators.columns.count), h("th", { class: "num" }, t.operators.columns.total)),
    ),
    h(
      "tbody",
      {},
      rows.map((r) =>
        h("tr", {}, h("td", {}, r.kind), h("td", { class: "num" }, fmt.count(r.count)), h("td", { class: "num" }, fmt.ms(r.total_ns))),
      ),
    ),
  );
}

export function truncate(text: string, n: number): string {
  return text.length > n ? `${text.slice(0, n - 1)}…` : text;
}
