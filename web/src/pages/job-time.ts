/**
 * Time overview (seed 000, 时间概览): a two-axis chart of every step -- each rank's step time on the
 * left axis (one line per rank, or the fastest–slowest band and the median when the job has too
 * many ranks for lines to be read), the ranks' mean communication and wait time on the right --
 * with a hover card per step, and the steps as a table below.  It is the entry point of a job's
 * analysis: choosing a step (a click on the chart or a row) puts it in the URL (`step=`), and the
 * other job pages open on it (the cluster step trace shows that step).  Every number comes from
 * /api/job/time-overview.
 */
import { get, type JobTimeOverview, type TimeOverviewStep } from "../api";
import { card, chartBox } from "../components/card";
import { chart, PALETTE, tooltip } from "../charts";
import type { PageContext } from "../context";
import { h, replace } from "../dom";
import * as fmt from "../format";
import { t } from "../i18n";
import { OVERLAP_COLORS, TIME_OVERVIEW_COLORS } from "../palette";
import { href } from "../router";

/** The ranks' lines: the charts' palette less the communication mean's hue and the orange that
 * would pass for the wait mean's. */
const RANK_COLORS = PALETTE.filter((c) => c !== TIME_OVERVIEW_COLORS.communication && c !== OVERLAP_COLORS.preparing);

export async function jobTimePage(ctx: PageContext): Promise<void> {
  const s = t.jobViews.time;
  const data = await get<JobTimeOverview>("job/time-overview", { run: ctx.run });
  const steps = data.steps.map((x) => x.step);
  const asked = ctx.params.get("step");
  const selected = asked !== null && steps.includes(asked) ? asked : null;
  const choose = (step: string | null) => {
    window.location.hash = href("job-time", { run: ctx.run, step });
  };
  const lines = data.series.length > 0;
  const ms = fmt.nsToMs;

  const el = chartBox("chart-job-time", true);
  const rankSeries = data.series.map((r, i) => ({
    name: `${t.nav.rank} ${r.rank}`,
    type: "line",
    yAxisIndex: 0,
    symbolSize: 6,
    lineStyle: { width: 1.5 },
    itemStyle: { color: RANK_COLORS[i % RANK_COLORS.length] },
    data: r.durations_ns.map((v) => ms(v)),
  }));
  const bandSeries = [
    {
      name: "min",
      type: "line",
      stack: "band",
      symbol: "none",
      lineStyle: { opacity: 0 },
      tooltip: { show: false },
      data: data.steps.map((x) => ms(x.min_ns)),
    },
    {
      name: s.band,
      type: "line",
      stack: "band",
      symbol: "none",
      lineStyle: { opacity: 0 },
      areaStyle: { color: TIME_OVERVIEW_COLORS.band },
      itemStyle: { color: TIME_OVERVIEW_COLORS.band },
      data: data.steps.map((x) => ms(x.max_ns - x.min_ns)),
    },
    {
      name: s.median,
      type: "line",
      symbolSize: 5,
      itemStyle: { color: TIME_OVERVIEW_COLORS.median },
      data: data.steps.map((x) => ms(x.median_ns)),
    },
  ];
  const meanSeries = [
    {
      name: s.meanCommunication,
      type: "line",
      yAxisIndex: 1,
      symbol: "diamond",
      symbolSize: 7,
      lineStyle: { type: "dashed", width: 2 },
      itemStyle: { color: TIME_OVERVIEW_COLORS.communication },
      data: data.steps.map((x) => ms(x.mean_communication_ns)),
    },
    ...(data.wait_known
      ? [
          {
            name: s.meanWait,
            type: "line",
            yAxisIndex: 1,
            symbol: "triangle",
            symbolSize: 7,
            lineStyle: { type: "dashed", width: 2 },
            itemStyle: { color: TIME_OVERVIEW_COLORS.wait },
            data: data.steps.map((x) => ms(x.mean_wait_ns)),
          },
        ]
      : []),
  ];
  const series: any[] = [...(lines ? rankSeries : bandSeries), ...meanSeries];
  if (selected !== null) {
    series[0] = {
      ...series[0],
      markLine: {
        symbol: "none",
        silent: true,
        label: { formatter: `${s.step} ${selected}` },
        lineStyle: { color: TIME_OVERVIEW_COLORS.selected, width: 2, type: "solid" },
        data: [{ xAxis: selected }],
      },
    };
  }
  const stepSelect = h(
    "select",
    { "data-testid": "job-time-step", "aria-label": s.selected },
    h("option", { value: "", selected: selected === null }, s.none),
    steps.map((x) => h("option", { value: x, selected: x === selected }, `${s.step} ${x}`)),
  );
  stepSelect.addEventListener("change", () => choose(stepSelect.value || null));
  const open =
    selected !== null
      ? h("a", { href: href("job-steps", { run: ctx.run, step: selected }), "data-testid": "job-time-open-steps" }, s.openSteps(selected))
      : null;

  const c = s.columns;
  const table = h(
    "table",
    { class: "data", "data-testid": "job-time-table" },
    h(
      "thead",
      {},
      h(
        "tr",
        {},
        [c.step, c.ranks, c.min, c.median, c.max, c.slowestRank, c.communication, c.wait].map((label, i) =>
          h("th", { class: i === 0 || i === 5 ? "" : "num" }, label),
        ),
      ),
    ),
    h(
      "tbody",
      {},
      data.steps.map((x) => {
        const tr = h(
          "tr",
          { class: x.step === selected ? "clickable selected" : "clickable", "data-step": x.step },
          h("td", {}, x.step),
          h("td", { class: "num" }, String(x.ranks)),
          h("td", { class: "num" }, fmt.ms(x.min_ns)),
          h("td", { class: "num" }, fmt.ms(x.median_ns)),
          h("td", { class: "num" }, fmt.ms(x.max_ns)),
          h("td", {}, `${t.nav.rank} ${x.slowest_rank}`),
          h("td", { class: "num" }, fmt.ms(x.mean_communication_ns)),
          h("td", { class: "num" }, data.wait_known ? fmt.ms(x.mean_wait_ns) : "–"),
        );
        tr.addEventListener("click", () => choose(x.step));
        return tr;
      }),
    ),
  );

  replace(
    ctx.root,
    h(
      "div",
      { class: "grid" },
      card(
        {
          title: s.title,
          hint: lines ? s.hint : s.hintBand(data.rank_count),
          full: true,
          testId: "card-job-time",
          tools: [h("span", { class: "muted" }, s.selected), stepSelect, open],
        },
        el,
      ),
      card({ title: s.table, hint: s.tableHint, full: true }, h("div", { class: "table-scroll" }, table)),
    ),
  );
  // drawn once the box is in the page: ECharts sizes the chart from it
  const byStep = new Map(data.steps.map((x) => [x.step, x]));
  const instance = chart(el, {
    legend: { top: 0, type: "scroll", data: series.filter((x) => x.name !== "min").map((x) => x.name) },
    grid: { left: 70, right: 80, top: 40, bottom: 40 },
    tooltip: tooltip("axis", (params: any[]) => {
      const step = String(params[0]?.axisValue ?? "");
      const x = byStep.get(step) as TimeOverviewStep;
      const rows: [unknown, unknown][] = [
        [s.fastest, `${t.nav.rank} ${x.fastest_rank} · ${fmt.duration(x.min_ns)}`],
        [s.median, fmt.duration(x.median_ns)],
        [s.slowest, `${t.nav.rank} ${x.slowest_rank} · ${fmt.duration(x.max_ns)}`],
        [s.meanCommunication, fmt.duration(x.mean_communication_ns)],
        [s.meanWait, data.wait_known ? fmt.duration(x.mean_wait_ns) : s.noWait],
      ];
      if (lines && data.series.length <= 8) {
        for (const r of data.series) rows.push([`${t.nav.rank} ${r.rank}`, fmt.duration(r.durations_ns[steps.indexOf(step)])]);
      }
      return [`${s.step} ${step}`, rows];
    }),
    xAxis: { type: "category", name: s.step, data: steps, axisPointer: { type: "shadow" } },
    yAxis: [
      {
        type: "value",
        name: `${s.stepTime} (${fmt.MS})`,
        scale: true, // the spread between ranks is what this axis shows: it starts near the fastest step
        axisLabel: { formatter: (v: number) => fmt.msTick(v) },
      },
      {
        type: "value",
        name: `${s.meanCommunication} / ${s.meanWait} (${fmt.MS})`,
        nameTextStyle: { align: "right" },
        splitLine: { show: false },
        axisLabel: { formatter: (v: number) => fmt.msTick(v) },
      },
    ],
    series,
  });
  // a click anywhere in a step's column selects it (not only on a point)
  instance.getZr().on("click", (e: any) => {
    if (!instance.containPixel("grid", [e.offsetX, e.offsetY])) return;
    // the step whose column centre is nearest the click (convertToPixel of each category index)
    const centres = steps.map((_, i) => instance.convertToPixel({ xAxisIndex: 0 }, i) as unknown as number);
    let nearest = 0;
    centres.forEach((x, i) => {
      if (Math.abs(x - e.offsetX) < Math.abs(centres[nearest] - e.offsetX)) nearest = i;
    });
    if (steps.length) choose(steps[nearest]);
  });
}
