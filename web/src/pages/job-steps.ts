/**
 * Cluster step trace (seed 002): every rank's step -- the average step by default, or one step --
 * as a table sorted on the server by any column, with a stage filter and the columns of the job's
 * parallel modes (data: gap / forward+backward / tail / communication; pipeline: stage, stage
 * time, bubble, receive), and the stages of each rank's step as stacked bars beside it.
 * Clicking a rank opens its single-device pages.
 */
import { get, type JobRank, type JobStepTrace } from "../api";
import { card, chartBox } from "../components/card";
import { serverTable, type Column, type Row } from "../components/table";
import { chart, tooltip } from "../charts";
import type { PageContext } from "../context";
import { h, replace } from "../dom";
import * as fmt from "../format";
import { t } from "../i18n";
import { OVERLAP_COLORS, STAGE_COLORS } from "../palette";
import { href } from "../router";
import { RANK_PAGE, rankLink, splitsFreeTime } from "./job";

const ms = (v: unknown) => fmt.ms(v as number | null);

export async function jobStepsPage(ctx: PageContext): Promise<void> {
  const j = t.job;
  const step = ctx.params.get("step") ?? "average";
  const stageParam = ctx.params.get("stage");
  const stage = stageParam !== null && stageParam !== "" ? Number(stageParam) : null;
  const first = await get<JobStepTrace>("job/step-trace", { run: ctx.run, step, stage, limit: RANK_PAGE });
  let initial: JobStepTrace | null = first; // the table's first page, in its default order
  const go = (extra: Record<string, string | number | null>) => {
    window.location.hash = href("job-steps", { run: ctx.run, step, stage, ...extra });
  };

  const stepSelect = h(
    "select",
    { "data-testid": "job-step-select", "aria-label": j.chooseStep },
    first.steps.map((s) => h("option", { value: s, selected: s === first.step }, s === "average" ? j.average : `${j.chooseStep} ${s}`)),
  );
  stepSelect.addEventListener("change", () => go({ step: stepSelect.value }));
  const stageSelect = h(
    "select",
    { "data-testid": "job-stage-select", "aria-label": j.columns.stage },
    h("option", { value: "", selected: stage === null }, j.allStages),
    first.stages.map((s) => h("option", { value: s, selected: s === stage }, `${j.columns.stage} ${s}`)),
  );
  stageSelect.addEventListener("change", () => go({ stage: stageSelect.value || null }));
  stageSelect.hidden = !first.pipeline;

  const c = j.columns;
  const num = (key: keyof JobRank, label: string): Column => ({ key, label, sortable: true, numeric: true, format: ms });
  const columns: Column[] = [
    { key: "rank", label: c.rank, sortable: true, numeric: true },
    ...(first.pipeline ? [{ key: "stage", label: c.stage, sortable: true, numeric: true }] : []),
    { key: "host", label: c.host },
    num("duration_ns", c.duration),
    num("iteration_interval_ns", c.gap),
    num("fp_bp_ns", c.fpbp),
    num("tail_ns", c.tail),
    num("communication_ns", c.communication),
    num("communication_not_overlapped_ns", c.commNotOverlapped),
    ...(first.pipeline ? [num("bubble_ns", c.bubble), num("receive_not_overlapped_ns", c.receive)] : []),
    num("computing_ns", c.computing),
    num("free_ns", c.free),
    ...(splitsFreeTime(first.ranks) ? [num("host_wait_ns", c.hostWait), num("after_launch_ns", c.afterLaunch)] : []),
  ];

  const barsEl = chartBox("chart-job-steps", true);
  const series: [string, keyof JobRank, string][] = [
    [t.steps.stage.iterationInterval, "iteration_interval_ns", STAGE_COLORS.iterationInterval],
    [t.steps.stage.fpBp, "fp_bp_ns", STAGE_COLORS.fpBp],
    [t.steps.stage.tail, "tail_ns", STAGE_COLORS.tail],
  ];
  if (first.pipeline) series.push([j.sortKeys.bubble_ns, "bubble_ns", OVERLAP_COLORS.bubble]);
  const drawBars = (rows: JobRank[]) => {
    barsEl.style.height = `${Math.min(900, Math.max(240, 60 + rows.length * 26))}px`;
    chart(barsEl, {
      legend: { top: 0 },
      grid: { left: 70, right: 16, top: 34, bottom: 30 },
      tooltip: tooltip("axis", (params: any[]) => [params[0]?.axisValue ?? "", params.map((p) => [p.seriesName, fmt.msValue(p.value)])]),
      yAxis: { type: "category", inverse: true, data: rows.map((r) => `${t.nav.rank} ${r.rank}`) },
      xAxis: { type: "value", name: fmt.MS },
      series: series.map(([name, key, color], i) => ({
        name,
        type: "bar",
        // gap, forward+backward and tail make up the step; a pipeline's bubble is drawn apart
        stack: i < 3 ? "step" : undefined,
        itemStyle: { color },
        data: rows.map((r) => fmt.nsToMs(r[key] as number)),
      })),
    });
  };

  const table = serverTable({
    columns,
    sort: "rank",
    desc: false,
    pageSize: RANK_PAGE,
    testId: "job-step-table",
    onRowClick: (row: Row) => {
      window.location.hash = rankLink(ctx.run, row.rank as number);
    },
    fetch: async (q) => {
      const reuse = initial !== null && q.offset === 0 && q.sort === "rank" && !q.desc;
      const data =
        reuse && initial
          ? initial
          : await get<JobStepTrace>("job/step-trace", {
              run: ctx.run,
              step: first.step,
              stage,
              sort: q.sort,
              order: q.desc ? "desc" : "asc",
              offset: q.offset,
              limit: q.limit,
            });
      initial = null;
      drawBars(data.ranks);
      return { rows: data.ranks as unknown as Row[], total: data.ranks_total };
    },
  });

  replace(
    ctx.root,
    h(
      "div",
      { class: "grid" },
      card({ title: j.stepTrace, hint: j.stepTraceHint, full: true, testId: "card-job-steps", tools: [stepSelect, stageSelect] }, table.el),
      card({ title: j.chart, full: true }, barsEl),
    ),
  );
  await table.reload();
}
