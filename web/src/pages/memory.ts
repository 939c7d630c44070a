/**
 * Memory: allocated and reserved bytes over time per device, with the peak marked, and the
 * operators that allocate the most.
 */
import { get, type Memory, type Overview } from "../api";
import { card, chartBox, stat } from "../components/card";
import { chart, tooltip } from "../charts";
import type { PageContext } from "../context";
import { h, replace } from "../dom";
import * as fmt from "../format";
import { t } from "../i18n";
import { hasDevice, noDeviceLine } from "./overview";

export async function memoryPage(ctx: PageContext): Promise<void> {
  const [data, overview] = await Promise.all([
    get<Memory>("run/memory", { run: ctx.run, rank: ctx.rank }),
    get<Overview>("run/overview", { run: ctx.run, rank: ctx.rank }),
  ]);
  const m = t.memory;
  const notice = hasDevice(overview) ? null : noDeviceLine(overview.device);
  if (!data.devices.length) {
    replace(ctx.root, h("div", { class: "grid" }, notice, card({ title: m.curve, full: true, testId: "memory-none" }, h("p", { class: "muted" }, m.none))));
    return;
  }
  // reserved memory is a device caching allocator's: a CPU-only run (or a trace without it) has none to show
  const showReserved = (dev: (typeof data.devices)[number]) => notice === null && (dev.peak_reserved_bytes ?? 0) > 0;
  const charts: [HTMLDivElement, (typeof data.devices)[number]][] = [];
  const cards = data.devices.map((dev, i) => {
    const el = chartBox(`chart-memory-${i}`, true);
    charts.push([el, dev]);
    const name = `${m.device}: ${dev.device_type}${dev.device_index >= 0 ? `:${dev.device_index}` : ""}`;
    return card(
      { title: `${m.curve} — ${name}`, full: true, testId: `card-memory-${i}` },
      h(
        "div",
        { class: "stats" },
        stat(`${m.peak} ${m.allocated}`, fmt.bytes(dev.peak_allocated_bytes), `peak-allocated-${i}`),
        showReserved(dev) ? stat(`${m.peak} ${m.reserved}`, fmt.bytes(dev.peak_reserved_bytes), `peak-reserved-${i}`) : null,
        stat(`${m.peak} @`, fmt.duration(dev.peak_ts_ns)),
      ),
      el,
    );
  });
  const c = m.columns;
  const top = card(
    { title: m.topOps, full: true, testId: "card-memory-ops" },
    h(
      "table",
      { class: "data", "data-testid": "memory-op-table" },
      h(
        "thead",
        {},
        h(
          "tr",
          {},
          h("th", {}, c.name),
          h("th", { class: "num" }, c.count),
          h("th", { class: "num" }, c.total),
          h("th", { class: "num" }, c.size),
          h("th", { class: "num" }, c.duration),
        ),
      ),
      h(
        "tbody",
        {},
        data.top_operators.map((op) =>
          h(
            "tr",
            {},
            h("td", { class: op.name ? "" : "muted" }, op.name || m.noOp),
            h("td", { class: "num" }, fmt.count(op.count)),
            h("td", { class: "num" }, fmt.bytes(op.total_bytes)),
            h("td", { class: "num" }, fmt.bytes(op.max_bytes)),
            h("td", { class: "num" }, fmt.ms(op.avg_lifetime_ns)),
          ),
        ),
      ),
    ),
  );
  replace(ctx.root, h("div", { class: "grid" }, notice, cards, top));

  for (const [el, dev] of charts) {
    const ms = dev.curve.ts_ns.map((x) => fmt.nsToMs(x));
    const series = (name: string, values: (number | null)[]) => ({
      name,
      type: "line",
      step: "end",
      showSymbol: false,
      sampling: "lttb",
      data: ms.map((x, i) => [x, values[i]]),
    });
    const peakMark =
      dev.peak_ts_ns !== null && dev.peak_allocated_bytes !== null
        ? {
            markPoint: {
              symbol: "pin",
              symbolSize: 44,
              label: { formatter: m.peak, fontSize: 10 },
              data: [{ name: m.peak, coord: [fmt.nsToMs(dev.peak_ts_ns), dev.peak_allocated_bytes] }],
            },
          }
        : {};
    chart(el, {
      legend: { top: 0 },
      grid: { left: 80, right: 24, top: 40, bottom: 60 },
      dataZoom: [{ type: "inside" }, { type: "slider", height: 18, bottom: 8 }],
      tooltip: tooltip("axis", (params: any[]) => [
        fmt.msValue(params[0]?.value?.[0] ?? 0),
        params.map((p) => [p.seriesName, fmt.bytes(p.value?.[1])]),
      ]),
      xAxis: {
        type: "value",
        name: fmt.MS,
        min: "dataMin",
        max: "dataMax",
        axisLabel: { formatter: (v: number) => fmt.msTick(v) },
      },
      yAxis: { type: "value", axisLabel: { formatter: (v: number) => fmt.bytes(v) } },
      series: [
        { ...series(m.allocated, dev.curve.allocated_bytes), ...peakMark },
        ...(showReserved(dev) ? [series(m.reserved, dev.curve.reserved_bytes)] : []),
      ],
    });
  }
}
