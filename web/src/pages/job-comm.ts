/**
 * The job's Communication page (seed 002's cluster communication, seed 003's communication
 * duration), in three tabs:
 * - per rank: each rank's communication time split into transit, wait and idle (stacked bars and a
 *   table sorted on the server); clicking a rank opens its links (peer, time, size, bandwidth,
 *   link type) in a dialog;
 * - all links: every link of every step, filtered by source, destination, link type, op family and
 *   group, sorted and paged on the server;
 * - per op: every communication op of every rank (elapse, transit, wait, synchronization, idle,
 *   size, bandwidth), sorted and searched on the server.
 * Every number comes from /api/job/communication* (the cluster analysis's files); this page only
 * formats it.
 */
import { get, type CommChoices, type CommLinkPage, type CommOpPage, type CommRank, type JobCommunication } from "../api";
import { card, chartBox, segmented } from "../components/card";
import { serverTable, type Column, type PageQuery, type Row, type ServerTable } from "../components/table";
import { chart, tooltip } from "../charts";
import type { PageContext } from "../context";
import { h, replace } from "../dom";
import * as fmt from "../format";
import { t } from "../i18n";
import { COMM_COLORS } from "../palette";
import { href } from "../router";
import { rankLink } from "./job";

type Tab = "ranks" | "links" | "ops";
const TABS: Tab[] = ["ranks", "links", "ops"];
/** Above this many ranks the bar chart gets a zoom slider (its bars are then a few pixels wide). */
const CHART_ZOOM_RANKS = 48;

const ms = (v: unknown) => fmt.ms(v as number | null);
const size = (v: unknown) => (v === null || v === undefined ? "–" : fmt.bytes(Math.round(v as number)));
export const bandwidth = (v: unknown) => (v === null || v === undefined ? "–" : `${fmt.bytes(Math.round(v as number))}/s`);
const order = (q: PageQuery) => (q.desc ? "desc" : "asc");

export async function jobCommPage(ctx: PageContext): Promise<void> {
  const c = t.comm;
  const step = await knownStep(ctx.run, ctx.params.get("step"));
  const asked = ctx.params.get("tab") as Tab | null;
  const tab: Tab = asked && TABS.includes(asked) ? asked : "ranks";
  const first = await get<JobCommunication>("job/communication", { run: ctx.run, step });
  const go = (extra: Record<string, string | null>) => {
    window.location.hash = href("job-comm", { run: ctx.run, step, tab, ...extra });
  };

  const stepSelect = stepChooser(first.choices, step, (value) => go({ step: value }));
  const tabs = segmented(
    TABS.map((x) => [x, c.tabs[x]] as [Tab, string]),
    tab,
    (value) => go({ tab: value }),
  );
  tabs.setAttribute("data-testid", "comm-tabs");
  const bar = h("div", { class: "job-tools comm-bar" }, tabs, h("span", { class: "spacer" }), h("label", { class: "muted" }, c.step), stepSelect);

  const body =
    tab === "ranks" ? await ranksTab(ctx, first, step) : tab === "links" ? linksTab(ctx, first.choices, step) : opsTab(ctx, first.choices, step);
  replace(ctx.root, bar, h("div", { class: "grid" }, body.el));
  body.attached?.(); // a chart needs its box laid out before it is drawn
  await body.table.reload();
}

/** The step to show: the one asked for (a step chosen on another job page travels in the URL)
 * when the job has communication in it, else all steps ("average" on the step trace, a step
 * without communication). */
export async function knownStep(run: string, asked: string | null): Promise<string> {
  if (asked === null || asked === "" || asked === "all") return "all";
  const all = await get<JobCommunication>("job/communication", { run, limit: 1 });
  return all.choices.steps.includes(asked) ? asked : "all";
}

/** The step selector: "all steps", then each step with communication. */
export function stepChooser(choices: CommChoices, step: string, onChange: (step: string) => void): HTMLSelectElement {
  const c = t.comm;
  const select = h(
    "select",
    { "data-testid": "comm-step-select", "aria-label": c.step },
    choices.steps.map((s) => h("option", { value: s, selected: s === step }, s === "all" ? c.allSteps : `${c.step} ${s}`)),
  );
  select.addEventListener("change", () => onChange(select.value));
  return select;
}

/** An op-family selector: all, collectives, point-to-point, then each op kind. */
export function opChooser(choices: CommChoices, value: string, testId: string): HTMLSelectElement {
  const c = t.comm;
  const kinds = new Set(choices.ops.map((o) => o.kind));
  return h(
    "select",
    { "data-testid": testId, "aria-label": c.columns.op },
    h("option", { value: "", selected: value === "" }, c.allOps),
    kinds.has("collective") && kinds.has("p2p") ? h("option", { value: "collective", selected: value === "collective" }, c.collective) : null,
    kinds.has("collective") && kinds.has("p2p") ? h("option", { value: "p2p", selected: value === "p2p" }, c.p2p) : null,
    choices.ops.map((o) => h("option", { value: o.name, selected: value === o.name }, o.name)),
  );
}

/** A group selector: all groups, then each group with its size. */
export function groupChooser(choices: CommChoices, value: string, testId: string): HTMLSelectElement {
  const c = t.comm;
  return h(
    "select",
    { "data-testid": testId, "aria-label": c.columns.group },
    h("option", { value: "", selected: value === "" }, c.allGroups),
    choices.groups.map((g) => h("option", { value: g.id, selected: value === g.id }, c.group(g.id, g.ranks))),
  );
}

function rankInput(testId: string, label: string): HTMLInputElement {
  return h("input", { type: "number", min: 0, step: 1, class: "rank-input", placeholder: t.comm.anyRank, "aria-label": label, "data-testid": testId });
}

const numberOrNull = (input: HTMLInputElement) => (input.value.trim() === "" ? null : Number(input.value));

// ------------------------------------------------------------------------------------ per rank
interface TabBody {
  el: HTMLElement;
  table: ServerTable;
  attached?: () => void;
}

async function ranksTab(ctx: PageContext, first: JobCommunication, step: string): Promise<TabBody> {
  const c = t.comm;
  const col = c.columns;
  const chartEl = chartBox("chart-comm-ranks", true);
  const parts: [string, keyof CommRank, string][] = [
    [c.transit, "transit_ns", COMM_COLORS.transit],
    [c.wait, "wait_ns", COMM_COLORS.wait],
    [c.idle, "idle_ns", COMM_COLORS.idle],
  ];
  const rows = first.rows; // every rank, in rank order
  const zoom = rows.length > CHART_ZOOM_RANKS;
  const draw = () => chart(chartEl, {
    legend: { top: 0 },
    grid: { left: 64, right: 20, top: 34, bottom: zoom ? 64 : 36 },
    tooltip: tooltip("axis", (params: any[]) => [
      params[0]?.axisValue ?? "",
      [...params.map((p) => [p.seriesName, fmt.msValue(p.value)] as [string, string]), [col.elapse, fmt.msValue(fmt.nsToMs(rows[params[0]?.dataIndex]?.elapse_ns))]],
    ]),
    xAxis: { type: "category", data: rows.map((r) => `${t.nav.rank} ${r.rank}`) },
    yAxis: { type: "value", name: fmt.MS },
    // every rank at first (an outlier shows even at 1,024 ranks), a slider to look closer
    dataZoom: zoom ? [{ type: "slider", start: 0, end: 100 }, { type: "inside" }] : undefined,
    series: parts.map(([name, key, color]) => ({
      name,
      type: "bar",
      stack: "comm",
      barMaxWidth: 90,
      itemStyle: { color },
      data: rows.map((r) => fmt.nsToMs(r[key] as number)),
    })),
  }).on("click", (params: any) => {
    const row = rows[params.dataIndex];
    if (row) rankDialog(ctx.run, step, row.rank);
  });

  const num = (key: keyof CommRank, label: string, format = ms): Column => ({ key, label, sortable: true, numeric: true, format });
  const table = serverTable({
    columns: [
      { key: "rank", label: col.rank, sortable: true, numeric: true },
      { key: "host", label: col.host, sortable: true },
      num("ops", col.ops, (v) => fmt.count(v as number)),
      num("elapse_ns", col.elapse),
      num("transit_ns", col.transit),
      num("wait_ns", col.wait),
      num("synchronization_ns", col.synchronization),
      num("idle_ns", col.idle),
      num("bytes", col.bytes, size),
    ],
    sort: "elapse_ns",
    desc: true,
    pageSize: 50,
    testId: "comm-ranks",
    onRowClick: (row: Row) => rankDialog(ctx.run, step, row.rank as number),
    fetch: async (q) => {
      const page = await get<JobCommunication>("job/communication", {
        run: ctx.run, step, sort: q.sort, order: order(q), offset: q.offset, limit: q.limit,
      }); // prettier-ignore
      return { rows: page.rows as unknown as Row[], total: page.total };
    },
  });
  const legend = h("span", { class: "muted" }, c.perRankHint);
  return { el: card({ title: c.perRank, full: true, testId: "card-comm-ranks", tools: [legend] }, chartEl, table.el), table, attached: draw };
}

/** The link dialog of one rank (seed 002's 逻辑卡链路信息): links from or to it, sorted on the server. */
export function rankDialog(run: string, step: string, rank: number): void {
  const c = t.comm;
  const col = c.columns;
  document.querySelectorAll("dialog.comm-dialog").forEach((d) => d.remove());
  const table = serverTable({
    columns: [
      { key: "src", label: col.direction, format: (_v, row) => (row.src === rank ? c.sends : c.receives) },
      { key: "peer", label: col.peer, numeric: true, format: (_v, row) => String(row.src === rank ? row.dst : row.src) },
      { key: "step", label: col.step, sortable: true, numeric: true },
      { key: "op", label: col.op, sortable: true },
      { key: "group", label: col.group, sortable: true },
      { key: "link_type", label: col.linkType, sortable: true },
      { key: "transit_ns", label: col.time, sortable: true, numeric: true, format: ms },
      { key: "bytes", label: col.bytes, sortable: true, numeric: true, format: size },
      { key: "bandwidth_bytes_per_s", label: col.bandwidth, sortable: true, numeric: true, format: bandwidth },
    ],
    sort: "bandwidth_bytes_per_s",
    desc: false,
    pageSize: 20,
    testId: "rank-links",
    fetch: async (q) => {
      const page = await get<CommLinkPage>("job/communication/links", {
        run, step, rank, sort: q.sort, order: order(q), offset: q.offset, limit: q.limit,
      }); // prettier-ignore
      return { rows: page.rows as unknown as Row[], total: page.total };
    },
  });
  const close = h("button", { type: "button", class: "btn", "data-testid": "dialog-close" }, c.close);
  const dialog = h(
    "dialog",
    { class: "comm-dialog", "data-testid": "rank-links-dialog", "data-rank": rank, "aria-label": c.rankLinks(rank) },
    h(
      "div",
      { class: "card-head" },
      h("h2", {}, c.rankLinks(rank)),
      h("span", { class: "hint" }, c.rankLinksHint),
      h("span", { class: "spacer" }),
      h("a", { href: rankLink(run, rank), "data-testid": "dialog-open-rank" }, c.openRank(rank)),
      close,
    ),
    table.el,
  );
  close.addEventListener("click", () => dialog.close());
  dialog.addEventListener("click", (e) => {
    if (e.target === dialog) dialog.close(); // a click on the backdrop
  });
  dialog.addEventListener("close", () => dialog.remove());
  window.addEventListener("hashchange", () => dialog.close(), { once: true });
  document.body.append(dialog);
  dialog.showModal();
  void table.reload();
}

// ------------------------------------------------------------------------------------ all links
function linksTab(ctx: PageContext, choices: CommChoices, step: string): TabBody {
  const c = t.comm;
  const col = c.columns;
  const src = rankInput("links-src", col.src);
  const dst = rankInput("links-dst", col.dst);
  const type = h(
    "select",
    { "data-testid": "links-type", "aria-label": col.linkType },
    h("option", { value: "" }, c.allTypes),
    choices.link_types.map((x) => h("option", { value: x }, x)),
  );
  const op = opChooser(choices, "", "links-op");
  const group = groupChooser(choices, "", "links-group");
  const table = serverTable({
    columns: [
      { key: "step", label: col.step, sortable: true, numeric: true },
      { key: "op", label: col.op, sortable: true },
      { key: "group", label: col.group, sortable: true },
      { key: "src", label: col.src, sortable: true, numeric: true },
      { key: "dst", label: col.dst, sortable: true, numeric: true },
      { key: "link_type", label: col.linkType, sortable: true },
      { key: "transit_ns", label: col.time, sortable: true, numeric: true, format: ms },
      { key: "bytes", label: col.bytes, sortable: true, numeric: true, format: size },
      { key: "bandwidth_bytes_per_s", label: col.bandwidth, sortable: true, numeric: true, format: bandwidth },
    ],
    sort: "bandwidth_bytes_per_s",
    desc: false,
    pageSize: 50,
    testId: "comm-links",
    onRowClick: (row: Row) => rankDialog(ctx.run, step, row.src as number),
    fetch: async (q) => {
      const page = await get<CommLinkPage>("job/communication/links", {
        run: ctx.run,
        step,
        src: numberOrNull(src),
        dst: numberOrNull(dst),
        link_type: type.value,
        op: op.value,
        group: group.value,
        sort: q.sort,
        order: order(q),
        offset: q.offset,
        limit: q.limit,
      });
      return { rows: page.rows as unknown as Row[], total: page.total };
    },
  });
  for (const control of [src, dst, type, op, group]) control.addEventListener("change", () => void table.firstPage());
  const filters = h(
    "div",
    { class: "comm-filters" },
    h("label", {}, col.src, src),
    h("label", {}, col.dst, dst),
    type,
    op,
    group,
  );
  return { el: card({ title: c.allLinks, hint: c.allLinksHint, full: true, testId: "card-comm-links" }, filters, table.el), table };
}

// ------------------------------------------------------------------------------------ per op
function opsTab(ctx: PageContext, choices: CommChoices, step: string): TabBody {
  const c = t.comm;
  const col = c.columns;
  const rank = rankInput("ops-rank", col.rank);
  const op = opChooser(choices, "", "ops-op");
  const group = groupChooser(choices, "", "ops-group");
  const num = (key: string, label: string, format = ms): Column => ({ key, label, sortable: true, numeric: true, format });
  const table = serverTable({
    columns: [
      { key: "rank", label: col.rank, sortable: true, numeric: true },
      { key: "op", label: col.op, sortable: true },
      { key: "group", label: col.group, sortable: true },
      { key: "step", label: col.step, sortable: true, numeric: true },
      { key: "peer", label: col.peer, sortable: true, numeric: true },
      num("start_ns", col.start),
      num("elapse_ns", col.elapse),
      num("transit_ns", col.transit),
      num("wait_ns", col.wait),
      num("synchronization_ns", col.synchronization),
      num("idle_ns", col.idle),
      num("bytes", col.bytes, size),
      num("bandwidth_bytes_per_s", col.bandwidth, bandwidth),
      { key: "basis", label: col.basis, sortable: true },
    ],
    sort: "elapse_ns",
    desc: true,
    pageSize: 50,
    testId: "comm-ops",
    searchPlaceholder: c.searchOps,
    onRowClick: (row: Row) => rankDialog(ctx.run, step, row.rank as number),
    fetch: async (q) => {
      const page = await get<CommOpPage>("job/communication/ops", {
        run: ctx.run,
        step,
        rank: numberOrNull(rank),
        op: op.value,
        group: group.value,
        q: q.q,
        sort: q.sort,
        order: order(q),
        offset: q.offset,
        limit: q.limit,
      });
      return { rows: page.rows as unknown as Row[], total: page.total };
    },
  });
  for (const control of [rank, op, group]) control.addEventListener("change", () => void table.firstPage());
  const filters = h("div", { class: "comm-filters" }, h("label", {}, col.rank, rank), op, group);
  return { el: card({ title: c.perOp, hint: c.perOpHint, full: true, testId: "card-comm-ops" }, filters, table.el), table };
}
