/**
 * ECharts, trimmed to the charts this UI draws (canvas renderer only, so the bundle stays small).
 *
 * ECharts builds tooltips as HTML strings, so every tooltip here comes from `tooltip()` below,
 * which escapes each value: a trace's names reach the page as text, never as markup.
 */
import { BarChart, LineChart, PieChart, CustomChart } from "echarts/charts";
import {
  AriaComponent,
  GridComponent,
  LegendComponent,
  MarkPointComponent,
  MarkLineComponent,
  TooltipComponent,
  DataZoomComponent,
} from "echarts/components";
import * as echarts from "echarts/core";
import { CanvasRenderer } from "echarts/renderers";
import { escapeHtml } from "./dom";
import { SERIES_COLORS } from "./palette";

echarts.use([
  AriaComponent,
  BarChart,
  LineChart,
  PieChart,
  CustomChart,
  GridComponent,
  LegendComponent,
  MarkPointComponent,
  MarkLineComponent,
  TooltipComponent,
  DataZoomComponent,
  CanvasRenderer,
]);

export type EChartsOption = echarts.EChartsCoreOption;

/** Colours of series that carry no stage or category of their own (palette.ts decides every colour). */
export const PALETTE = SERIES_COLORS;

const live = new Set<echarts.ECharts>();
window.addEventListener("resize", () => live.forEach((c) => c.resize()));

/** A chart in `el`; disposed automatically when the element leaves the page. */
export function chart(el: HTMLElement, option: EChartsOption): echarts.ECharts {
  const instance = echarts.init(el, undefined, { renderer: "canvas" });
  // aria: ECharts describes the chart's data in the container's aria-label (screen readers, tests)
  instance.setOption({
    color: PALETTE,
    animation: false,
    textStyle: { fontFamily: "inherit" },
    aria: { enabled: true, data: { maxCount: 25 } },
    ...option,
  });
  live.add(instance);
  el.dataset.seriesColors = JSON.stringify(seriesColors(instance));
  const observer = new MutationObserver(() => {
    if (!el.isConnected) {
      instance.dispose();
      live.delete(instance);
      observer.disconnect();
    }
  });
  observer.observe(document.body, { childList: true, subtree: true });
  return instance;
}

/** [series name, colour] of each named series as drawn: its own colour, else the palette's in turn.
 * Kept on the chart's element (data-series-colors) so a test can check that a stage or category
 * has one colour on every chart. */
function seriesColors(instance: echarts.ECharts): [string, string][] {
  const series = ((instance.getOption() as any).series ?? []) as any[];
  return series
    .map((s, i): [string, string] => [String(s.name ?? ""), String(s.itemStyle?.color ?? s.lineStyle?.color ?? PALETTE[i % PALETTE.length])])
    .filter(([name]) => name !== "");
}

/** Lines of a tooltip as (label, value) pairs, escaped; the only HTML added is <b> and <br>. */
export function tooltipHtml(title: unknown, lines: [unknown, unknown][]): string {
  const head = `<b>${escapeHtml(title)}</b>`;
  return [head, ...lines.map(([k, v]) => `${escapeHtml(k)}: ${escapeHtml(v)}`)].join("<br>");
}

/** A tooltip option whose formatter is given plain values and escapes them. */
export function tooltip(trigger: "item" | "axis", format: (params: any) => [unknown, [unknown, unknown][]]) {
  return {
    trigger,
    confine: true,
    formatter: (params: any) => {
      const [title, lines] = format(params);
      return tooltipHtml(title, lines);
    },
  };
}
