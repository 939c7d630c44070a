/**
 * Job overview: the whole job at a glance (seed 002's cluster overview).  Per rank, where the
 * average step goes -- computing, communication not overlapped, overlapped, free (and a pipeline's
 * bubble) -- as stacked bars and a sortable table; the step-time spread; the slow ranks and links
 * with their evidence; the pipeline stages and the parallel groups.  Every number comes from
 * /api/job/overview (the cluster analysis); clicking a rank opens its single-device pages.
 */
import { get, type Findings, type JobOverview, type JobRank } from "../api";
import { card, chartBox, stat } from "../components/card";
import { findingsCard } from "../components/findings";
import { serverTable, type Column, type Row } from "../components/table";
import { chart, tooltip } from "../charts";
import type { PageContext } from "../context";
import { h, replace } from "../dom";
import * as fmt from "../format";
import { t } from "../i18n";
import { OVERLAP_COLORS } from "../palette";
import { href } from "../router";

type Part = [label: string, key: keyof JobRank, color: string];

/** The parts of a rank's step after its iteration gap (the step trace's "stage" time), in stacking
 * order: computing alone, computing overlapped by communication, communication alone, free -- each
 * instant counted once, so a bar is the rank's stage time.  The gap is not stacked: the cluster
 * step trace does not always make gap + stage equal the step (seen on a DDP job's last step) (a pipeline's bubble is
 * part of its communication not overlapped, so it is a column, not a part). */
function parts(): Part[] {
  const c = t.overview;
  const list: Part[] = [
    [t.job.computingAlone, "computing_not_overlapped_ns", OVERLAP_COLORS.computing],
    [c.overlapped, "overlapped_ns", OVERLAP_COLORS.overlapped],
    [c.commNotOverlapped, "communication_not_overlapped_ns", OVERLAP_COLORS.communicationNotOverlapped],
    [c.free, "free_ns", OVERLAP_COLORS.free],
  ];
  return list;
}

/** Whether the columns splitting free time say anything: some rank's device waited for its host to
 * launch work, or sat idle after the launch (a job whose ranks launch no device work -- CPU-only, or
 * a vendor's summary file alone -- would show columns of zeros). */
export function splitsFreeTime(rows: JobRank[]): boolean {
  return rows.some((r) => r.host_wait_ns > 0 || r.after_launch_ns > 0);
}

export function rankLink(run: string, rank: number): string {
  return href("overview", { run, rank });
}

const ms = (v: unknown) => fmt.ms(v as number | null);

/** Ranks per page of the job tables (and bars beside them): the server pages and sorts, so a
 * thousand-rank job draws as fast as a small one. */
export const RANK_PAGE = 64;

export async function jobPage(ctx: PageContext): Promise<void> {
  const findings = get<Findings>("job/findings", { run: ctx.run });
  findings.catch(() => undefined); // shown in its card; never an unhandled rejection
  const job = await get<JobOverview>("job/overview", { run: ctx.run, limit: RANK_PAGE });
  let initial: JobOverview | null = job; // the table's job page, in its default order
  const pipeline = job.stages.length > 1;
  const j = t.job;
  const spread = job.step_spread;
  const stats = h(
    "div",
    { class: "stats" },
    stat(j.ranks, String(job.ranks_total), "stat-ranks"),
    stat(j.hosts, String(job.hosts_total || "–"), "stat-hosts"),
    stat(j.medianStep, spread ? fmt.duration(spread.median_ns) : "–", "stat-median-step"),
    stat(j.spread, spread ? j.spreadValue(fmt.duration(spread.min_ns), fmt.duration(spread.max_ns)) : "–", "stat-spread"),
    stat(j.longestStep, spread ? `${t.nav.rank} ${spread.slowest_rank}` : "–", "stat-longest-step"),
    stat(j.slowRanks, job.slowest_ranks.filter((r) => r.slow).map((r) => `${t.nav.rank} ${r.rank}`).join(", ") || j.none, "stat-slow-ranks"),
    stat(j.layout, job.layout ?? "–", "stat-layout"),
  );

  const barsEl = chartBox("chart-rank-time", true);
  const list = parts();
  const legend = h(
    "div",
    { class: "stack-legend" },
    list.map(([label, , color]) => {
      const swatch = h("i");
      swatch.style.background = color;
      return h("span", {}, swatch, label);
    }),
  );
  const drawBars = (rows: JobRank[]) => {
    const height = Math.max(220, 40 + rows.length * 26);
    barsEl.style.height = `${Math.min(height, 900)}px`;
    chart(barsEl, {
      legend: { show: false },
      grid: { left: 70, right: 24, top: 10, bottom: 36 },
      tooltip: tooltip("axis", (params: any[]) => [
        params[0]?.axisValue ?? "",
        params.map((p) => [p.seriesName, fmt.msValue(p.value)]),
      ]),
      yAxis: { type: "category", inverse: true, data: rows.map((r) => `${t.nav.rank} ${r.rank}`) },
      xAxis: { type: "value", name: fmt.MS },
      series: list.map(([name, key, color]) => ({
        name,
        type: "bar",
        stack: "rank",
        itemStyle: { color },
        data: rows.map((r) => fmt.nsToMs(r[key] as number)),
      })),
    }).on("click", (params: any) => {
      const row = rows[params.dataIndex];
      if (row) window.location.hash = rankLink(ctx.run, row.rank);
    });
  };

  const columns: Column[] = [
    { key: "rank", label: j.columns.rank, sortable: true, numeric: true },
    ...(pipeline ? [{ key: "stage", label: j.columns.stage, sortable: true, numeric: true }] : []),
    { key: "host", label: j.columns.host },
    { key: "duration_ns", label: j.columns.duration, sortable: true, numeric: true, format: ms },
    { key: "computing_ns", label: j.columns.computing, sortable: true, numeric: true, format: ms },
    { key: "communication_not_overlapped_ns", label: j.columns.commNotOverlapped, sortable: true, numeric: true, format: ms },
    { key: "overlapped_ns", label: j.columns.overlapped, sortable: true, numeric: true, format: ms },
    { key: "free_ns", label: j.columns.free, sortable: true, numeric: true, format: ms },
    ...(splitsFreeTime(job.ranks)
      ? [
          { key: "host_wait_ns", label: j.columns.hostWait, sortable: true, numeric: true, format: ms },
          { key: "after_launch_ns", label: j.columns.afterLaunch, sortable: true, numeric: true, format: ms },
        ]
      : []),
    ...(pipeline ? [{ key: "bubble_ns", label: j.columns.bubble, sortable: true, numeric: true, format: ms }] : []),
    { key: "lateness_ns", label: j.columns.lateness, sortable: true, numeric: true, format: ms },
    { key: "slow", label: j.columns.verdict, format: (v) => (v ? j.slow : j.ok) },
  ];
  const table = serverTable({
    columns,
    sort: "duration_ns",
    desc: true,
    pageSize: RANK_PAGE,
    testId: "job-ranks",
    onRowClick: (row: Row) => {
      window.location.hash = rankLink(ctx.run, row.rank as number);
    },
    fetch: async (q) => {
      const reuse = initial !== null && q.offset === 0 && q.sort === "duration_ns" && q.desc;
      const latest =
        reuse && initial
          ? initial
          : await get<JobOverview>("job/overview", {
              run: ctx.run,
              sort: q.sort,
              order: q.desc ? "desc" : "asc",
              offset: q.offset,
              limit: q.limit,
            });
      initial = null;
      drawBars(latest.ranks);
      return { rows: latest.ranks as unknown as Row[], total: latest.ranks_total };
    },
  });

  replace(
    ctx.root,
    findingsCard(findings, ctx.run, href("job-findings", { run: ctx.run })),
    stats,
    h(
      "div",
      { class: "grid" },
      card({ title: j.timePerRank, hint: j.timePerRankHint, full: true, testId: "card-rank-time", tools: [legend] }, barsEl, table.el),
      pipeline ? card({ title: j.stages, hint: job.pipeline?.imbalanced ? j.imbalanced(fmt.percent(job.pipeline.spread ?? 0)) : j.stagesHint, full: true, testId: "card-stages" }, stagesTable(job)) : null,
      card(
        { full: true, title: j.slowRanks, hint: job.slow_rank_threshold_ns !== null ? j.slowRanksHint(fmt.duration(job.slow_rank_threshold_ns)) : undefined, testId: "card-slow-ranks" },
        slowRanksTable(job, ctx.run),
      ),
      card({ title: j.slowLinks, hint: j.slowLinksHint, full: true, testId: "card-slow-links" }, slowLinksTable(job)),
      card({ title: j.groups, full: true, testId: "card-groups" }, groupsTable(job)),
      job.problems.length ? card({ title: j.problems, full: true }, h("ul", {}, job.problems.map((p) => h("li", {}, p)))) : null,
    ),
  );
  await table.reload();
}

function simpleTable(testId: string, head: string[], rows: HTMLElement[]): HTMLElement {
  return h(
    "table",
    { class: "data", "data-testid": testId },
    h("thead", {}, h("tr", {}, head.map((x) => h("th", {}, x)))),
    h("tbody", {}, rows.length ? rows : [h("tr", {}, h("td", { colspan: head.length, class: "muted" }, t.noData))]),
  );
}

function stagesTable(data: JobOverview): HTMLElement {
  const c = t.job.columns;
  // the stage the cluster analysis found computing the longest (its pipeline-balance verdict)
  const slowest = data.pipeline?.slowest_stage ?? null;
  const busiest = data.stages.find((s) => s.stage === slowest);
  return simpleTable(
    "stages-table",
    [c.stage, t.job.ranks, c.duration, c.computing, c.bubble, c.flops],
    data.stages.map((s) =>
      h(
        "tr",
        { "data-stage": s.stage, class: s === busiest ? "flagged" : "" },
        h("td", {}, String(s.stage), s === busiest ? h("span", { class: "badge busiest", "data-testid": "busiest-stage" }, ` ${t.job.busiest}`) : null),
        h("td", {}, fmt.list(s.ranks)),
        h("td", { class: "num" }, fmt.ms(s.duration_ns)),
        h("td", { class: "num", "data-col": "computing" }, fmt.ms(s.computing_ns)),
        h("td", { class: "num" }, fmt.ms(s.bubble_ns)),
        h("td", { class: "num", "data-col": "flops", "data-value": s.flops ?? "" }, fmt.flops(s.flops)),
      ),
    ),
  );
}

function slowRanksTable(data: JobOverview, run: string): HTMLElement {
  const c = t.job.columns;
  return simpleTable(
    "slow-ranks-table",
    [c.rank, c.lateness, c.lastVotes, c.instances, c.computing, c.verdict],
    data.slowest_ranks.map((r) =>
      h(
        "tr",
        { "data-rank": r.rank, class: r.slow ? "flagged" : "" },
        h("td", {}, h("a", { href: rankLink(run, r.rank) }, `${t.nav.rank} ${r.rank}`)),
        h("td", { class: "num" }, fmt.ms(r.lateness_ns)),
        h("td", { class: "num" }, String(r.last_votes)),
        h("td", { class: "num" }, String(r.instances)),
        h("td", { class: "num" }, fmt.ms(r.compute_ns)),
        h("td", {}, r.slow ? h("span", { class: "badge slow" }, t.job.slow) : t.job.ok),
      ),
    ),
  );
}

function slowLinksTable(data: JobOverview): HTMLElement {
  const c = t.job.columns;
  const bandwidth = (v: number | null) => (v === null ? "–" : `${fmt.bytes(v)}/s`);
  return simpleTable(
    "slow-links-table",
    [c.src, c.dst, c.linkType, c.bytes, c.transit, c.bandwidth, c.median, c.verdict],
    data.slowest_links.map((l) =>
      h(
        "tr",
        { class: l.slow ? "flagged" : "" },
        h("td", {}, String(l.src)),
        h("td", {}, String(l.dst)),
        h("td", {}, l.link_type),
        h("td", { class: "num" }, fmt.bytes(l.bytes)),
        h("td", { class: "num" }, fmt.ms(l.transit_ns)),
        h("td", { class: "num" }, bandwidth(l.bandwidth)),
        h("td", { class: "num" }, bandwidth(l.median)),
        h("td", {}, l.slow ? h("span", { class: "badge slow" }, t.job.slow) : t.job.ok),
      ),
    ),
  );
}

function groupsTable(data: JobOverview): HTMLElement {
  const c = t.job.columns;
  const parallel = data.parallel as { modes?: string[]; groups?: Record<string, number[][]>; evidence?: Record<string, string[]> };
  const modes = parallel.modes ?? [];
  if (!modes.length) return h("p", { class: "muted" }, t.job.noGroups);
  return simpleTable(
    "groups-table",
    [c.mode, c.members, c.evidence],
    modes.map((mode) =>
      h(
        "tr",
        { "data-mode": mode },
        h("td", {}, mode),
        h("td", {}, (parallel.groups?.[mode] ?? []).map((g) => `[${g.join(", ")}]`).join(" ")),
        h("td", {}, (parallel.evidence?.[mode] ?? []).join("; ")),
      ),
    ),
  );
}
