/**
 * Data preparation (the seeds' MindData page) for one rank, with its two tabs: the iteration gap
 * (host and device-side queue sizes at each request of the training loop, empty counts, wait per
 * step) and data processing (the loader's pipeline as stages and queues, then the loop's copy of
 * each batch to the device when it copied anything, the bottleneck marked,
 * click a stage or queue for its numbers and curve; the per-worker table).  Every number comes
 * from the `data_pipeline` analysis via /api/run/data-prep; this page only draws it.
 */
import { get, type DataPrep } from "../api";
import { card, chartBox, segmented, stat } from "../components/card";
import { chart, tooltip } from "../charts";
import type { PageContext } from "../context";
import { h, replace } from "../dom";
import * as fmt from "../format";
import { t } from "../i18n";
import { minddataEn as md } from "../i18n/minddata";

type Tab = "gap" | "processing";
type Stage = DataPrep["stages"][number];
type Queue = "host" | "device";

export async function dataPage(ctx: PageContext): Promise<void> {
  const data = await get<DataPrep>("run/data-prep", { run: ctx.run, rank: ctx.rank });
  const d = t.data;
  if (!data.captured || !data.summary) {
    replace(
      ctx.root,
      card({ title: d.title, full: true, testId: "data-none" }, h("p", {}, d.none), h("pre", { class: "data-howto" }, data.how_to_enable ?? "")),
    );
    return;
  }
  const tab: Tab = ctx.params.get("tab") === "processing" ? "processing" : "gap";
  const body = h("div", { class: "grid" });
  const tabs = segmented<Tab>(
    [
      ["gap", d.tabGap],
      ["processing", d.tabProcessing],
    ],
    tab,
    (value) => {
      window.location.hash = ctx.link("data", { tab: value });
    },
  );
  replace(ctx.root, h("div", { class: "grid data-head" }, verdictCard(data, tabs)), body);
  if (tab === "gap") gapTab(body, data);
  else processingTab(body, data);
  if (data.ranks.length > 1) ranksCard(body, data, ctx);
}

/** On a job: every rank's wait for data, the open rank marked; a click opens that rank. */
function ranksCard(body: HTMLElement, data: DataPrep, ctx: PageContext): void {
  const d = t.data;
  const el = chartBox("chart-data-ranks");
  body.append(card({ title: d.ranksTitle, hint: d.ranksHint, full: true, testId: "card-data-ranks" }, el));
  const rows = data.ranks;
  const instance = chart(el, {
    grid: { left: 80, right: 24, top: 16, bottom: 40 },
    tooltip: tooltip("item", (p: any) => {
      const r = rows[p.dataIndex];
      return [`${t.nav.rank} ${r.rank}`, [[d.waitShare, fmt.percent(r.wait_share)], [d.waitTotal, fmt.duration(r.wait_ns)], [d.slowest, r.bottleneck_stage ?? "–"]]];
    }),
    xAxis: { type: "category", data: rows.map((r) => `${t.nav.rank} ${r.rank}`) },
    yAxis: { type: "value", name: d.waitShare, axisLabel: { formatter: (v: number) => fmt.percent(v, 0) } },
    series: [
      {
        type: "bar",
        data: rows.map((r) => ({ value: r.wait_share, itemStyle: r.rank === data.rank ? { color: "#d64545" } : {} })),
      },
    ],
  });
  instance.on("click", (p: any) => {
    window.location.hash = ctx.link("data", { rank: rows[p.dataIndex].rank, tab: ctx.params.get("tab") });
  });
}

function verdictCard(data: DataPrep, tabs: HTMLElement): HTMLElement {
  const d = t.data;
  const s = data.summary!;
  const verdict = s.verdict === "none" ? d.verdictNone : s.verdict === "host to device" ? d.verdictTransfer : d.verdictPipeline;
  return card(
    { title: d.title, full: true, testId: "data-verdict", tools: [tabs] },
    h(
      "p",
      { class: `data-verdict ${s.verdict === "none" ? "ok" : "bad"}` },
      h("b", { "data-testid": "data-verdict-text" }, verdict),
      s.bottleneck_stage ? h("span", {}, ` — ${d.slowest}: `, h("code", { "data-testid": "data-bottleneck" }, s.bottleneck_stage)) : null,
    ),
    h("p", { class: "muted", "data-testid": "data-reason" }, s.reason),
    h(
      "div",
      { class: "stats" },
      stat(d.waitShare, fmt.percent(s.wait_share), "data-wait-share"),
      stat(d.waitTotal, fmt.duration(s.wait_ns)),
      stat(d.workers, String(s.num_workers), "data-workers"),
      stat(
        s.host_queue_samples === null || s.host_queue_samples === undefined ? d.hostEmpty : md.hostSamples,
        `${fmt.count(s.host_queue_empty)} / ${fmt.count(s.host_queue_samples ?? s.requests)}`,
        "data-host-empty",
      ),
      stat(d.hostUsage, fmt.percent(s.host_queue_usage)),
      stat(d.deviceEmpty, s.device_queue_empty === null ? "–" : `${fmt.count(s.device_queue_empty)} / ${fmt.count(s.requests)}`),
    ),
  );
}

function queueChart(el: HTMLElement, data: DataPrep, which: Queue[]): void {
  const d = t.data;
  const x = data.queue.map((p) => fmt.nsToMs(p.start_ns));
  const series: any[] = [];
  for (const q of which) {
    const values = data.queue.map((p) => (q === "host" ? p.host_queue : p.device_queue));
    if (values.every((v) => v === null)) continue;
    const name = q === "host" ? d.hostQueue : d.deviceQueue;
    series.push({ name, type: "line", step: "end", showSymbol: false, data: x.map((v, i) => [v, values[i]]) });
    const empty = x.map((v, i) => (values[i] === 0 ? [v, 0] : null)).filter((p) => p !== null);
    // a line without its line: ECharts' scatter is not in this UI's trimmed bundle
    series.push({
      name: `${name} — ${d.empty}`,
      type: "line",
      symbol: "circle",
      symbolSize: 7,
      lineStyle: { width: 0 },
      itemStyle: { color: "#d64545" },
      data: empty,
    });
  }
  const capacity = data.summary?.host_queue_capacity ?? 0;
  if (capacity > 0) {
    series.push({ name: d.capacity, type: "line", showSymbol: false, lineStyle: { type: "dashed", width: 1 }, data: x.map((v) => [v, capacity]) });
  }
  series.push({
    name: d.wait,
    type: "bar",
    yAxisIndex: 1,
    barMaxWidth: 6,
    itemStyle: { opacity: 0.45 },
    data: x.map((v, i) => [v, fmt.nsToMs(data.queue[i].wait_ns)]),
  });
  chart(el, {
    legend: { top: 0 },
    grid: { left: 56, right: 64, top: 40, bottom: 60 },
    dataZoom: [{ type: "inside" }, { type: "slider", height: 18, bottom: 8 }],
    tooltip: tooltip("axis", (params: any[]) => [
      fmt.msValue(params[0]?.value?.[0] ?? 0),
      params.map((p) => [p.seriesName, p.seriesName === d.wait ? fmt.msValue(p.value?.[1]) : p.value?.[1]]),
    ]),
    xAxis: { type: "value", name: fmt.MS, min: "dataMin", max: "dataMax", axisLabel: { formatter: (v: number) => fmt.msTick(v) } },
    yAxis: [
      { type: "value", name: d.batches, minInterval: 1 },
      { type: "value", name: `${d.wait} (${fmt.MS})`, splitLine: { show: false } },
    ],
    series,
  });
}

function gapTab(body: HTMLElement, data: DataPrep): void {
  const d = t.data;
  const s = data.summary!;
  const queues = chartBox("chart-data-queues", true);
  const waits = chartBox("chart-data-wait-steps");
  replace(
    body,
    card(
      { title: d.queuesTitle, hint: d.queuesHint, full: true, testId: "card-data-queues" },
      h(
        "div",
        { class: "stats" },
        stat(`${d.hostQueue} — ${d.empty}`, fmt.count(s.host_queue_empty), "data-host-empty-count"),
        stat(`${d.hostQueue} — ${d.full}`, fmt.count(s.host_queue_full)),
        stat(`${d.hostQueue} — ${d.mean}`, s.host_queue_mean === null ? "–" : s.host_queue_mean.toFixed(2)),
        stat(`${d.deviceQueue} — ${d.empty}`, fmt.count(s.device_queue_empty)),
        stat(d.requests, `${fmt.count(s.requests)} / ${fmt.count(data.queue_requests)}`),
      ),
      queues,
    ),
    card({ title: d.waitPerStep, full: true, testId: "card-data-wait-steps" }, waits),
  );
  queueChart(queues, data, ["host", "device"]);
  chart(waits, {
    grid: { left: 64, right: 24, top: 24, bottom: 40 },
    tooltip: tooltip("axis", (params: any[]) => [`${d.step} ${params[0]?.name}`, [[d.wait, fmt.msValue(params[0]?.value)]]]),
    xAxis: { type: "category", name: d.step, data: data.wait_per_step.map((w) => String(w.step)) },
    yAxis: { type: "value", name: fmt.MS },
    series: [{ name: d.wait, type: "bar", data: data.wait_per_step.map((w) => fmt.nsToMs(w.data_wait_ns)) }],
  });
}

function stageBox(stage: Stage, onPick: () => void): HTMLElement {
  const d = t.data;
  const box = h(
    "button",
    {
      type: "button",
      class: `data-stage${stage.bottleneck ? " bottleneck" : ""}`,
      "data-testid": `data-stage-${stage.order}`,
      "data-stage": stage.stage,
      title: stage.bottleneck ? d.bottleneck : "",
    },
    h("div", { class: "data-stage-type" }, `${stage.op_type} · ${stage.runs_in === "workers" ? `${stage.parallelism} ${d.workersShort}` : d.mainProcess}`),
    h("div", { class: "data-stage-name" }, stage.stage),
    h("div", { class: "data-stage-time" }, stage.per_batch_ns === null ? md.notMeasured : `${fmt.duration(stage.per_batch_ns)} / ${d.batch}`),
    h("div", { class: "data-stage-share" }, h("span", { style: `width:${Math.round((stage.share ?? 0) * 100)}%` })),
    stage.bottleneck ? h("div", { class: "data-stage-flag" }, d.bottleneck) : null,
  );
  box.addEventListener("click", onPick);
  return box;
}

function queueBox(name: string, usage: number | null, empty: number | null, testId: string, onPick: () => void): HTMLElement {
  const level = usage === null ? "" : usage < 0.2 ? " low" : usage < 0.5 ? " mid" : " high";
  const box = h(
    "button",
    { type: "button", class: `data-queue${level}`, "data-testid": testId },
    h("div", { class: "data-queue-name" }, name),
    h("div", {}, `${t.data.usage} ${fmt.percent(usage, 0)}`),
    h("div", { class: "muted" }, `${t.data.empty} ${fmt.count(empty)}`),
  );
  box.addEventListener("click", onPick);
  return box;
}

/** A stage's time on each measured batch, one series of points per worker. */
function stageChart(el: HTMLElement, curve: DataPrep["stage_batches"][string]): void {
  const d = t.data;
  const workers = [...new Set(curve.worker)].sort((a, b) => a - b);
  chart(el, {
    legend: { top: 0 },
    grid: { left: 64, right: 24, top: 36, bottom: 40 },
    tooltip: tooltip("item", (p: any) => [p.seriesName, [[d.perBatch, fmt.msValue(p.value?.[1])]]]),
    xAxis: { type: "value", name: fmt.MS, min: "dataMin", max: "dataMax", axisLabel: { formatter: (v: number) => fmt.msTick(v) } },
    yAxis: { type: "value", name: `${d.perBatch} (${fmt.MS})` },
    series: workers.map((w) => ({
      name: w < 0 ? d.mainProcess : `${d.columns.worker} ${w}`,
      type: "line",
      symbol: "circle",
      symbolSize: 5,
      lineStyle: { width: 0 }, // points: the batches are independent
      data: curve.start_ns.map((x, i) => (curve.worker[i] === w ? [fmt.nsToMs(x), fmt.nsToMs(curve.dur_ns[i])] : null)).filter((p) => p !== null),
    })),
  });
}

function processingTab(body: HTMLElement, data: DataPrep): void {
  const d = t.data;
  const s = data.summary!;
  const detail = h("div", { class: "data-detail", "data-testid": "data-detail" });
  const pickStage = (stage: Stage) => {
    replace(
      detail,
      h("h3", {}, stage.stage),
      h(
        "div",
        { class: "stats" },
        stat(d.perBatch, fmt.duration(stage.per_batch_ns), "data-detail-per-batch"),
        stat(d.total, fmt.duration(stage.total_ns)),
        stat(d.batchesDone, fmt.count(stage.batches)),
        stat(d.throughput, stage.throughput_per_s === null ? "–" : `${stage.throughput_per_s.toFixed(1)} ${d.perSecond}`),
        stat(d.share, fmt.percent(stage.share)),
      ),
      stageQueueStats(stage),
    );
    const queueCurve = data.stage_queues[stage.stage];
    if (queueCurve) {
      const el = chartBox("chart-data-stage-queue");
      detail.append(h("h4", {}, md.opQueue(stage.stage)), el);
      stageQueueChart(el, queueCurve);
    }
    const curve = data.stage_batches[stage.stage];
    if (curve) {
      const el = chartBox(`chart-data-stage`);
      detail.append(el);
      stageChart(el, curve);
    }
  };
  const pickQueue = (which: Queue) => {
    const el = chartBox(`chart-data-queue-${which}`);
    replace(detail, h("h3", {}, which === "host" ? d.hostQueue : d.deviceQueue), el);
    queueChart(el, data, [which]);
  };
  const stages = data.stages;
  const handOver = ["pin_memory", "to_device"];
  const inWorkers = stages.filter((x) => !handOver.includes(x.stage));
  const pin = stages.find((x) => x.stage === "pin_memory");
  const copy = stages.find((x) => x.stage === "to_device");
  const arrow = () => h("span", { class: "data-arrow" }, "→");
  const graph = h("div", { class: "data-graph", "data-testid": "data-graph" });
  const parts: Node[] = [];
  inWorkers.forEach((stage, i) => {
    if (i) parts.push(arrow());
    parts.push(stageBox(stage, () => pickStage(stage)));
    if (stage.queue_capacity !== null && stage.queue_capacity !== undefined) {
      // a MindData op's own output queue, between it and the next op
      const empty = stage.queue_empty_ratio === null || stage.queue_empty_ratio === undefined ? null : Math.round(stage.queue_empty_ratio * (stage.queue_samples ?? 0));
      parts.push(arrow(), queueBox(md.opQueueShort, stage.queue_usage ?? null, empty, `data-queue-op-${stage.order}`, () => pickStage(stage)));
    }
  });
  parts.push(arrow(), queueBox(d.hostQueue, s.host_queue_usage, s.host_queue_empty, "data-queue-host", () => pickQueue("host")));
  if (pin) parts.push(arrow(), stageBox(pin, () => pickStage(pin)));
  if (pin || (s.device_queue_mean !== null && s.host_queue_samples !== null && s.host_queue_samples !== undefined)) {
    parts.push(arrow(), queueBox(d.deviceQueue, null, s.device_queue_empty, "data-queue-device", () => pickQueue("device")));
  }
  // the loop's copy of each batch to the device: a stage when it copied; for a PyTorch loader (it
  // has a collate stage) whose loop copied nothing, a note that says so rather than a 0-ms stage
  if (copy) parts.push(arrow(), stageBox(copy, () => pickStage(copy)));
  else if (stages.some((x) => x.stage === "collate")) {
    parts.push(arrow(), h("div", { class: "data-sink data-copy-none", "data-testid": "data-copy-none", title: d.copyNoneHint }, d.copyNone));
  }
  parts.push(arrow(), h("div", { class: "data-sink" }, d.training));
  replace(graph, parts);
  const c = d.columns;
  const workers = h(
    "table",
    { class: "data", "data-testid": "data-worker-table" },
    h(
      "thead",
      {},
      h(
        "tr",
        {},
        [c.worker, c.pid, c.batches, c.busy, c.cpu, c.idle, c.read, c.transform, c.collate].map((name, i) =>
          h("th", { class: i > 1 ? "num" : "" }, name),
        ),
      ),
    ),
    h(
      "tbody",
      {},
      data.workers.map((w) =>
        h(
          "tr",
          {},
          h("td", {}, w.worker < 0 ? d.mainProcess : String(w.worker)),
          h("td", {}, String(w.pid)),
          h("td", { class: "num" }, fmt.count(w.batches)),
          h("td", { class: "num" }, fmt.ms(w.busy_ns)),
          h("td", { class: "num" }, fmt.ms(w.cpu_ns)),
          h("td", { class: "num" }, fmt.ms(w.idle_ns)),
          h("td", { class: "num" }, fmt.ms(w.read_ns)),
          h("td", { class: "num" }, fmt.ms(w.transform_ns)),
          h("td", { class: "num" }, fmt.ms(w.collate_ns)),
        ),
      ),
    ),
  );
  replace(
    body,
    card({ title: d.pipeline, hint: d.pipelineHint, full: true, testId: "card-data-pipeline" }, graph, detail),
    data.workers.length ? card({ title: d.workersTitle, hint: d.workersHint, full: true, testId: "card-data-workers" }, workers) : null,
    data.cpu.length ? cpuCard(data) : null,
  );
  const slowest = stages.find((x) => x.bottleneck) ?? [...stages].sort((a, b) => (b.per_batch_ns ?? 0) - (a.per_batch_ns ?? 0))[0];
  if (slowest) pickStage(slowest);
}

/** The output-queue numbers of a stage that has its own queue (a MindData op); nothing otherwise. */
function stageQueueStats(stage: Stage): HTMLElement | null {
  if (stage.queue_capacity === null || stage.queue_capacity === undefined) return null;
  return h(
    "div",
    { class: "stats", "data-testid": "data-detail-queue" },
    stat(md.queueUsage, fmt.percent(stage.queue_usage ?? null, 2), "data-detail-queue-usage"),
    stat(md.queueMean, stage.queue_mean === null || stage.queue_mean === undefined ? "–" : stage.queue_mean.toFixed(2)),
    stat(md.queueCapacity, fmt.count(stage.queue_capacity)),
    stat(md.queueEmpty, fmt.percent(stage.queue_empty_ratio ?? null)),
    stat(md.queueSamples, fmt.count(stage.queue_samples ?? null)),
  );
}

/** The host's CPU use (MindData's sampler): one row per scope and metric. */
function cpuCard(data: DataPrep): HTMLElement {
  const c = md.cpuColumns;
  const table = h(
    "table",
    { class: "data", "data-testid": "data-cpu-table" },
    h("thead", {}, h("tr", {}, [c.scope, c.stage, c.metric, c.mean, c.max, c.samples].map((name, i) => h("th", { class: i > 2 ? "num" : "" }, name)))),
    h(
      "tbody",
      {},
      data.cpu.map((r) =>
        h(
          "tr",
          {},
          h("td", {}, md.cpuScopes[r.scope] ?? r.scope),
          h("td", {}, r.stage ?? (r.op_id === null ? "" : String(r.op_id))),
          h("td", {}, r.metric),
          h("td", { class: "num" }, r.mean.toFixed(1)),
          h("td", { class: "num" }, r.max.toFixed(1)),
          h("td", { class: "num" }, fmt.count(r.samples)),
        ),
      ),
    ),
  );
  return card({ title: md.cpuTitle, hint: md.cpuHint, full: true, testId: "card-data-cpu" }, table);
}

/** A MindData op's output-queue size at each sample, with its capacity (MindInsight's queue curve). */
function stageQueueChart(el: HTMLElement, curve: DataPrep["stage_queues"][string]): void {
  const x = curve.time_ms.map((v, i) => v ?? i);
  chart(el, {
    legend: { top: 0 },
    grid: { left: 56, right: 24, top: 36, bottom: 40 },
    tooltip: tooltip("axis", (params: any[]) => [`${params[0]?.value?.[0] ?? ""} ${fmt.MS}`, params.map((p) => [p.seriesName, p.value?.[1]])]),
    xAxis: { type: "value", name: fmt.MS, min: "dataMin", max: "dataMax" },
    yAxis: { type: "value", name: t.data.batches, minInterval: 1 },
    series: [
      { name: md.queueSize, type: "line", step: "end", symbol: "circle", symbolSize: 6, data: x.map((v, i) => [v, curve.size[i]]) },
      { name: t.data.capacity, type: "line", showSymbol: false, lineStyle: { type: "dashed", width: 1 }, data: x.map((v, i) => [v, curve.capacity[i]]) },
    ],
  });
}
