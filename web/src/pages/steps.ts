/**
 * Step trace: the stages of one step (or of the average step) as a Gantt chart, the stage times of
 * every step as curves, and the forward/backward boundary ops the analysis detected -- which the
 * user may replace (the seed's FP_POINT/BP_POINT): ?fp_point=&bp_point= make the server compute the
 * step trace again with those ops, through the same analysis.
 */
import { get, type StepTrace } from "../api";
import { card, chartBox } from "../components/card";
import { chart, tooltip } from "../charts";
import type { PageContext } from "../context";
import { h, replace } from "../dom";
import * as fmt from "../format";
import { t } from "../i18n";
import { OVERLAP_COLORS, STAGE_COLORS } from "../palette";

interface Bar {
  row: number;
  start: number; // ns from the step's start
  end: number;
  label: string;
}

const ROWS = [
  t.steps.stage.step,
  t.steps.stage.iterationInterval,
  t.steps.stage.fpBp,
  t.steps.stage.tail,
  t.steps.stage.communication,
  t.steps.stage.commNotOverlapped,
];
const ROW_COLORS = [
  STAGE_COLORS.step,
  STAGE_COLORS.iterationInterval,
  STAGE_COLORS.fpBp,
  STAGE_COLORS.tail,
  OVERLAP_COLORS.communication,
  OVERLAP_COLORS.communicationNotOverlapped,
];

export async function stepsPage(ctx: PageContext): Promise<void> {
  const points = { fp_point: ctx.params.get("fp_point") || null, bp_point: ctx.params.get("bp_point") || null };
  const all = await get<StepTrace>("run/step-trace", { run: ctx.run, rank: ctx.rank, ...points });
  const chosen = ctx.params.get("step");
  const stepNumber = chosen !== null && chosen !== "avg" && all.steps.some((s) => String(s.step) === chosen) ? Number(chosen) : null;
  const detail = stepNumber === null ? all : await get<StepTrace>("run/step-trace", { run: ctx.run, rank: ctx.rank, step: stepNumber, ...points });

  const picker = h(
    "select",
    { "data-testid": "step-select", "aria-label": t.steps.chooseStep },
    h("option", { value: "avg", selected: stepNumber === null }, t.steps.average),
    all.steps.map((s) => h("option", { value: s.step, selected: s.step === stepNumber }, `${t.steps.chooseStep} ${s.step}`)),
  );
  picker.addEventListener("change", () => {
    window.location.hash = ctx.link("steps", { step: picker.value, ...points });
  });

  const ganttEl = chartBox("chart-gantt");
  const curvesEl = chartBox("chart-step-curves", true);
  replace(
    ctx.root,
    h(
      "div",
      { class: "grid" },
      card({ title: t.steps.gantt, hint: stepNumber === null ? t.steps.averageHint : undefined, full: true, tools: [picker], testId: "card-gantt" }, ganttEl),
      card({ title: t.steps.curves, full: true }, curvesEl),
      card({ title: t.polish.points, hint: t.polish.pointsHint, full: true, testId: "card-fpbp" }, pointPicker(all, ctx), fpbpTable(all, ctx)),
    ),
  );

  const bars = stepNumber === null ? averageBars(all) : stepBars(detail, stepNumber);
  const span = Math.max(1, ...bars.map((b) => b.end));
  chart(ganttEl, {
    grid: { left: 210, right: 24, top: 16, bottom: 40 },
    tooltip: tooltip("item", (p: any) => [
      ROWS[p.value[0]],
      [
        [t.timeline.fields.start, fmt.duration(p.value[1])],
        [t.timeline.fields.duration, fmt.duration(p.value[2] - p.value[1])],
      ],
    ]),
    xAxis: { type: "value", min: 0, max: span, axisLabel: { formatter: (v: number) => fmt.duration(v, 1) } },
    yAxis: { type: "category", data: ROWS, inverse: true },
    series: [
      {
        type: "custom",
        renderItem: (_params: any, api: any) => {
          const row = api.value(0);
          const start = api.coord([api.value(1), row]);
          const end = api.coord([api.value(2), row]);
          const height = api.size([0, 1])[1] * 0.6;
          return {
            type: "rect",
            shape: { x: start[0], y: start[1] - height / 2, width: Math.max(1, end[0] - start[0]), height },
            style: { fill: ROW_COLORS[row] },
          };
        },
        encode: { x: [1, 2], y: 0 },
        data: bars.map((b) => [b.row, b.start, b.end]),
      },
    ],
  });

  const steps = all.steps.map((s) => String(s.step));
  const curve = (
    name: string,
    key: "duration_ns" | "iteration_interval_ns" | "fp_bp_ns" | "tail_ns" | "communication_not_overlapped_ns",
    color: string,
  ) => ({
    name,
    type: "line",
    itemStyle: { color },
    lineStyle: { color },
    symbolSize: 6,
    data: all.steps.map((s) => fmt.nsToMs(s[key])),
  });
  chart(curvesEl, {
    legend: { top: 0 },
    grid: { left: 56, right: 24, top: 36, bottom: 40 },
    tooltip: tooltip("axis", (params: any[]) => [
      `${t.steps.columns.step} ${params[0]?.axisValue ?? ""}`,
      params.map((p) => [p.seriesName, fmt.msValue(p.value)]),
    ]),
    xAxis: { type: "category", data: steps, name: t.steps.columns.step, nameLocation: "middle", nameGap: 26 },
    yAxis: { type: "value", name: fmt.MS },
    series: [
      curve(t.steps.stage.step, "duration_ns", STAGE_COLORS.step),
      curve(t.steps.stage.iterationInterval, "iteration_interval_ns", STAGE_COLORS.iterationInterval),
      curve(t.steps.stage.fpBp, "fp_bp_ns", STAGE_COLORS.fpBp),
      curve(t.steps.stage.tail, "tail_ns", STAGE_COLORS.tail),
      curve(t.steps.stage.commNotOverlapped, "communication_not_overlapped_ns", OVERLAP_COLORS.communicationNotOverlapped),
    ],
  });
}

/** The stages of step `n`, placed from its start; communication rows from the overlap intervals. */
function stepBars(data: StepTrace, n: number): Bar[] {
  const s = data.steps.find((x) => x.step === n);
  if (!s) return [];
  const bars: Bar[] = [{ row: 0, start: 0, end: s.duration_ns, label: "" }];
  const gap = s.iteration_interval_ns ?? 0;
  const fpbp = s.fp_bp_ns ?? 0;
  const tail = s.tail_ns ?? 0;
  bars.push({ row: 1, start: 0, end: gap, label: "" });
  bars.push({ row: 2, start: gap, end: gap + fpbp, label: "" });
  bars.push({ row: 3, start: gap + fpbp, end: gap + fpbp + tail, label: "" });
  for (const iv of data.intervals) {
    const row = iv.lane === "Communication" ? 4 : iv.lane === "Communication(Not Overlapped)" ? 5 : -1;
    if (row < 0) continue;
    bars.push({ row, start: Math.max(0, iv.start_ns - s.start_ns), end: Math.min(s.duration_ns, iv.end_ns - s.start_ns), label: "" });
  }
  return bars;
}

/** The average step: each stage as its mean length, laid end to end (communication as its mean total). */
function averageBars(data: StepTrace): Bar[] {
  const a = data.average;
  if (!a) return [];
  const bars: Bar[] = [
    { row: 0, start: 0, end: a.duration_ns, label: "" },
    { row: 1, start: 0, end: a.iteration_interval_ns, label: "" },
    { row: 2, start: a.iteration_interval_ns, end: a.iteration_interval_ns + a.fp_bp_ns, label: "" },
    {
      row: 3,
      start: a.iteration_interval_ns + a.fp_bp_ns,
      end: a.iteration_interval_ns + a.fp_bp_ns + a.tail_ns,
      label: "",
    },
  ];
  if (a.communication_ns > 0) bars.push({ row: 4, start: a.iteration_interval_ns, end: a.iteration_interval_ns + a.communication_ns, label: "" });
  if (a.communication_not_overlapped_ns > 0)
    bars.push({ row: 5, start: a.iteration_interval_ns, end: a.iteration_interval_ns + a.communication_not_overlapped_ns, label: "" });
  return bars;
}

/** Two op pickers (any name may be typed; the list holds the host ops found in the steps, in the order
 * they start), applied by reloading the page with ?fp_point=&bp_point=. */
function pointPicker(data: StepTrace, ctx: PageContext): HTMLElement {
  const p = t.polish;
  const listId = "step-point-ops";
  const options = h(
    "datalist",
    { id: listId },
    data.point_candidates.map((c) => h("option", { value: c.name }, `${fmt.duration(c.offset_ns)} · ${p.inSteps(c.steps)}`)),
  );
  const input = (value: string | null, detected: string[], testId: string) =>
    h("input", {
      type: "text",
      list: listId,
      value: value ?? "",
      placeholder: `${p.automatic}: ${detected.join(", ") || "–"}`,
      "data-testid": testId,
      spellcheck: false,
    });
  const fp = input(data.fp_point, data.fp_ops, "fp-point");
  const bp = input(data.bp_point, data.bp_ops, "bp-point");
  const form = h(
    "form",
    { class: "fpbp-pick", "data-testid": "point-form" },
    h("label", {}, p.fpPoint, fp),
    h("label", {}, p.bpPoint, bp),
    h("button", { type: "submit", "data-testid": "apply-points" }, p.apply),
    data.fp_point || data.bp_point ? h("a", { href: ctx.link("steps", { step: ctx.params.get("step") }), "data-testid": "reset-points" }, p.resetPoints) : null,
    options,
  );
  form.addEventListener("submit", (e) => {
    e.preventDefault();
    window.location.hash = ctx.link("steps", {
      step: ctx.params.get("step"),
      fp_point: fp.value.trim() || null,
      bp_point: bp.value.trim() || null,
    });
  });
  return h(
    "div",
    {},
    form,
    data.point_warnings.map((w) => h("p", { class: "fpbp-warn", "data-testid": "point-warning" }, w)),
  );
}

function fpbpTable(data: StepTrace, ctx: PageContext): HTMLElement {
  const c = t.steps.columns;
  return h(
    "div",
    {},
    h(
      "p",
      {},
      h("b", {}, `${t.steps.fpOp}: `),
      h("span", { "data-testid": "fp-ops" }, data.fp_ops.join(", ") || "–"),
      h("br"),
      h("b", {}, `${t.steps.bpOp}: `),
      h("span", { "data-testid": "bp-ops" }, data.bp_ops.join(", ") || "–"),
    ),
    h(
      "table",
      { class: "data", "data-testid": "step-table" },
      h(
        "thead",
        {},
        h(
          "tr",
          {},
          [c.step, c.duration, c.gap, c.fpbp, c.tail].map((x) => h("th", { class: "num" }, x)),
          h("th", {}, c.fpOp),
          h("th", {}, c.bpOp),
          h("th", {}, t.steps.timelineSource),
          h("th", {}),
        ),
      ),
      h(
        "tbody",
        {},
        data.steps.map((s) =>
          h(
            "tr",
            {},
            h("td", { class: "num" }, String(s.step)),
            h("td", { class: "num" }, fmt.ms(s.duration_ns)),
            h("td", { class: "num" }, fmt.ms(s.iteration_interval_ns)),
            h("td", { class: "num" }, fmt.ms(s.fp_bp_ns)),
            h("td", { class: "num" }, fmt.ms(s.tail_ns)),
            h("td", {}, s.fp_op ?? "–"),
            h("td", {}, s.bp_op ?? "–"),
            h("td", {}, s.timeline ?? "–"),
            h("td", {}, h("a", { href: ctx.link("timeline", { start_ns: s.start_ns, end_ns: s.end_ns }) }, t.steps.openTimeline)),
          ),
        ),
      ),
    ),
  );
}
