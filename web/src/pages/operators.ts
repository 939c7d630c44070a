/**
 * Operators: the top 20 operator types (pie or bar, by device or host self time), a server-side
 * table of every type with drill-down to its instances (shapes, dtypes, FLOPs, host and device
 * time), and the GPU kernel tables when the trace has kernels.
 */
import { get, type Overview, type PageOf } from "../api";
import { card, chartBox, segmented } from "../components/card";
import { serverTable, type Column, type PageQuery, type Row } from "../components/table";
import { chart, tooltip } from "../charts";
import type { PageContext } from "../context";
import { h, replace } from "../dom";
import * as fmt from "../format";
import { t } from "../i18n";
import { hasDevice, noDeviceLine, truncate } from "./overview";

type Measure = "device_total_ns" | "host_self_ns";

const msCol = (key: string, label: string): Column => ({ key, label, numeric: true, sortable: true, format: (v) => fmt.ms(v as number) });

function pager(ctx: PageContext, path: string, extra: Record<string, string | number | null> = {}) {
  return async (q: PageQuery) => {
    const page = await get<PageOf<Row>>(path, {
      run: ctx.run,
      rank: ctx.rank,
      offset: q.offset,
      limit: q.limit,
      sort: q.sort,
      order: q.desc ? "desc" : "asc",
      q: q.q,
      ...extra,
    });
    return { rows: page.rows, total: page.total };
  };
}

export async function operatorsPage(ctx: PageContext): Promise<void> {
  const c = t.operators.columns;
  const opsT = t.operators;
  const drill = ctx.params.get("type");

  // the ranking (what operators are ranked by, and their order) is the server's operator_ranking table
  const overview = await get<Overview>("run/overview", { run: ctx.run, rank: ctx.rank });
  const kernelTypes = await get<PageOf<Row>>("run/kernel-types", { run: ctx.run, rank: ctx.rank, limit: 20, sort: "total_ns", order: "desc" });
  if (kernelTypes.total > 0 && overview.operator_types.every((op) => op.host_self_ns === 0)) {
    deviceOpsPage(ctx, kernelTypes.rows); // device ops only (a MindSpore graph run): no host operator to rank
    return;
  }
  let measure: Measure = overview.top_by;
  const device = hasDevice(overview);
  const deviceOnly = (col: Column): Column[] => (device ? [col] : []); // a CPU-only run has no device time
  let shape: "pie" | "bar" = "pie";

  const topEl = chartBox("chart-top-types", true);
  const typeTable = serverTable({
    testId: "operator-type-table",
    columns: [
      { key: "name", label: c.name, sortable: true },
      { key: "count", label: c.count, numeric: true, sortable: true, format: (v) => fmt.count(v as number) },
      msCol("host_total_ns", c.hostTotal),
      msCol("host_self_ns", c.hostSelf),
      msCol("host_avg_ns", c.hostAvg),
      ...deviceOnly(msCol("device_total_ns", c.deviceTotal)),
      { key: "host_ratio", label: c.ratio, numeric: true, sortable: true, format: (v) => fmt.percent(v as number) },
      { key: "flops", label: c.flops, numeric: true, sortable: true, format: (v) => fmt.flops(v as number) },
    ],
    sort: measure,
    fetch: pager(ctx, "run/operator-types"),
    searchPlaceholder: opsT.search,
    onRowClick: (row) => {
      window.location.hash = ctx.link("operators", { type: String(row.name) });
    },
  });

  const instanceTitle = drill ? `${opsT.instances} ` : opsT.allInstances;
  const instanceTable = serverTable({
    testId: "operator-instance-table",
    columns: [
      { key: "name", label: c.name, sortable: true },
      { key: "step", label: c.step, numeric: true, sortable: true },
      { key: "start_ns", label: c.start, numeric: true, sortable: true, format: (v) => fmt.ms(v as number) },
      msCol("dur_ns", c.hostTime),
      msCol("self_ns", c.selfTime),
      ...deviceOnly(msCol("device_ns", c.deviceTime)),
      { key: "input_dims", label: c.shapes, format: (v) => fmt.shapes(v) },
      { key: "input_types", label: c.dtypes, format: (v) => fmt.list(v) },
      { key: "flops", label: c.flops, numeric: true, sortable: true, format: (v) => fmt.flops(v as number) },
      { key: "thread", label: c.thread, numeric: true },
    ],
    sort: "dur_ns",
    fetch: pager(ctx, "run/operators", { name: drill }),
    searchPlaceholder: drill ? undefined : opsT.search,
    onRowClick: (row) => {
      window.location.hash = ctx.link("timeline", { event: String(row.id) });
    },
  });

  const toggles = [
    !device ? null : segmented<Measure>(
      [
        ["device_total_ns", opsT.byDevice],
        ["host_self_ns", opsT.byHost],
      ],
      measure,
      (m) => {
        measure = m;
        void drawTop();
      },
    ),
    segmented<"pie" | "bar">(
      [
        ["pie", opsT.asPie],
        ["bar", opsT.asBar],
      ],
      shape,
      (s) => {
        shape = s;
        void drawTop();
      },
    ),
  ];

  const instancesCard = card(
    {
      title: instanceTitle,
      full: true,
      testId: "card-instances",
      tools: drill ? [h("a", { href: ctx.link("operators"), "data-testid": "clear-type" }, opsT.clearType)] : [],
    },
    instanceTable.el,
  );
  if (drill) instancesCard.querySelector("h2")?.append(h("code", { "data-testid": "drill-type" }, drill));

  const grid = h(
    "div",
    { class: "grid" },
    device ? null : noDeviceLine(overview.device),
    card({ title: opsT.topTypes, tools: toggles, full: true, testId: "card-top-types" }, topEl),
    drill ? instancesCard : card({ title: opsT.typeTable, full: true }, typeTable.el),
    drill ? card({ title: opsT.typeTable, full: true }, typeTable.el) : instancesCard,
  );
  replace(ctx.root, grid);

  let topChart: ReturnType<typeof chart> | null = null;
  async function drawTop(): Promise<void> {
    const ranked: Row[] =
      measure === overview.top_by
        ? (overview.operator_types as unknown as Row[])
        : (await get<PageOf<Row>>("run/operator-types", { run: ctx.run, rank: ctx.rank, limit: 20, sort: measure, order: "desc" })).rows;
    const rows = ranked.filter((r) => Number(r[measure]) > 0);
    const label = measure === "device_total_ns" ? opsT.byDevice : opsT.byHost;
    const onClick = (p: any) => {
      if (p?.name) window.location.hash = ctx.link("operators", { type: p.name });
    };
    topChart?.dispose();
    topChart =
      shape === "pie"
        ? chart(topEl, {
            tooltip: tooltip("item", (p: any) => [p.name, [[label, fmt.duration(p.value)], [c.ratio, `${p.percent}%`]]]),
            series: [
              {
                type: "pie",
                radius: ["30%", "66%"],
                minShowLabelAngle: 5,
                label: { formatter: (p: any) => truncate(p.name, 30) },
                data: rows.map((r) => ({ name: String(r.name), value: Number(r[measure]) })),
              },
            ],
          })
        : chart(topEl, {
            grid: { left: 260, right: 40, top: 10, bottom: 30 },
            tooltip: tooltip("item", (p: any) => [p.name, [[label, fmt.duration(p.value)]]]),
            xAxis: { type: "value", axisLabel: { formatter: (v: number) => fmt.duration(v, 1) } },
            yAxis: { type: "category", inverse: true, data: rows.map((r) => String(r.name)), axisLabel: { formatter: (v: string) => truncate(v, 40) } },
            series: [{ type: "bar", data: rows.map((r) => Number(r[measure])) }],
          });
    topChart.on("click", onClick);
  }

  if (kernelTypes.total > 0) grid.append(kernelCards(ctx));
  await Promise.all([drawTop(), typeTable.reload(), instanceTable.reload()]);
}

/** A run whose trace has device ops but no host operator (a MindSpore graph run): the top device
 * op types by device time, then the kernel tables (types, then every launch with scope and shapes). */
function deviceOpsPage(ctx: PageContext, top: Row[]): void {
  const opsT = t.operators;
  const topEl = chartBox("chart-top-types", true);
  replace(
    ctx.root,
    h(
      "div",
      { class: "grid" },
      card({ title: opsT.topTypes, full: true, testId: "card-top-types" }, topEl),
      kernelCards(ctx),
    ),
  );
  const rows = top.filter((r) => Number(r.total_ns) > 0);
  const instance = chart(topEl, {
    tooltip: tooltip("item", (p: any) => [p.name, [[opsT.byDevice, fmt.duration(p.value)], [t.operators.columns.ratio, `${p.percent}%`]]]),
    series: [
      {
        type: "pie",
        radius: ["30%", "66%"],
        minShowLabelAngle: 5,
        label: { formatter: (p: any) => truncate(p.name, 30) },
        data: rows.map((r) => ({ name: String(r.name), value: Number(r.total_ns) })),
      },
    ],
  });
  instance.on("click", (p: any) => {
    if (p?.name) window.location.hash = ctx.link("operators", { kernel: p.name });
  });
}

function kernelCards(ctx: PageContext): DocumentFragment {
  const c = t.operators.columns;
  const kernel = ctx.params.get("kernel");
  const types = serverTable({
    testId: "kernel-type-table",
    columns: [
      { key: "name", label: c.name, sortable: true },
      { key: "kind", label: c.kind, sortable: true },
      { key: "count", label: c.count, numeric: true, sortable: true, format: (v) => fmt.count(v as number) },
      msCol("total_ns", c.total),
      msCol("avg_ns", c.avg),
      msCol("min_ns", c.min),
      msCol("max_ns", c.max),
      { key: "ratio", label: c.ratio, numeric: true, sortable: true, format: (v) => fmt.percent(v as number) },
    ],
    sort: "total_ns",
    fetch: pager(ctx, "run/kernel-types"),
    searchPlaceholder: t.operators.search,
    onRowClick: (row) => {
      window.location.hash = ctx.link("operators", { kernel: String(row.name) });
    },
  });
  const instances = serverTable({
    testId: "kernel-table",
    columns: [
      { key: "name", label: c.name, sortable: true },
      { key: "op", label: c.launchedBy, sortable: true },
      { key: "step", label: c.step, numeric: true, sortable: true },
      { key: "stream", label: c.stream, numeric: true, sortable: true },
      { key: "start_ns", label: c.start, numeric: true, sortable: true, format: (v) => fmt.ms(v as number) },
      msCol("dur_ns", c.deviceTime),
      { key: "wait_ns", label: c.wait, numeric: true, sortable: true, format: (v) => fmt.ms(v as number) },
      { key: "grid", label: c.grid, format: (v) => fmt.list(v) },
      { key: "block", label: c.block, format: (v) => fmt.list(v) },
      { key: "input_dims", label: c.shapes, format: (v) => fmt.shapes(v) },
    ],
    sort: "dur_ns",
    fetch: pager(ctx, "run/kernels", { name: kernel }),
    searchPlaceholder: kernel ? undefined : t.operators.search,
  });
  void types.reload();
  void instances.reload();
  const frag = document.createDocumentFragment();
  frag.append(
    card({ title: t.operators.kernels, full: true, testId: "card-kernels" }, types.el),
    card({ title: kernel ? `${t.operators.instances} ${kernel}` : t.operators.kernelInstances, full: true }, instances.el),
  );
  return frag;
}
