/**
 * Memory and FLOPs heatmaps (seed 002, 集群内存使用情况 and 集群FLOPs热力图): one cell per rank, a
 * row per host, so a user sees which servers and which cards a job used and which of them carry
 * more memory or more work.  Memory is a rank's peak against its device's capacity, or, where the
 * trace does not record the capacity, against the largest peak of the job (and the card says so);
 * FLOPs are a rank's count against the heaviest rank's.  Every share is read from
 * /api/job/heatmaps (the cluster analysis's cluster_resources.csv); nothing here computes one.
 *
 * Why plain cells, not a chart: a grid of small links stays crisp and clickable at 1,024 ranks,
 * each cell is a real link (keyboard, middle-click), and one delegated listener drives the hover
 * card, so a thousand cells cost a thousand elements and no more.  Clicking a memory cell opens
 * that rank's memory page, a FLOPs cell its operators page, as the seed describes.
 */
import { get, type HeatmapCell, type JobHeatmaps } from "../api";
import { card } from "../components/card";
import type { PageContext } from "../context";
import { h, replace } from "../dom";
import * as fmt from "../format";
import { t } from "../i18n";
import { HEATMAP_RAMPS } from "../palette";
import { href, type PageName } from "../router";

/** Above this many ranks, cells shrink to plain squares (their numbers are in the hover card): at
 * 128 labelled cells a heatmap no longer fits a screen. */
const LABELLED_MAX = 64;
/** A dense row: the host's name, then 14 px cells 2 px apart (style.css). */
const DENSE_LABEL_PX = 120;
const DENSE_CELL_PX = 16;

type Ramp = readonly [string, string];

function mix(ramp: Ramp, share: number): string {
  const [a, b] = ramp.map((c) => [1, 3, 5].map((i) => parseInt(c.slice(i, i + 2), 16)));
  const s = Math.min(1, Math.max(0, share));
  return `rgb(${a.map((x, i) => Math.round(x + (b[i] - x) * s)).join(",")})`;
}

interface Metric {
  key: "memory" | "flops";
  share: (c: HeatmapCell) => number | null;
  label: (c: HeatmapCell) => string;
  ramp: Ramp;
  page: PageName;
}

function legend(metric: Metric, scale: string): HTMLElement {
  const [from, to] = metric.ramp;
  return h(
    "div",
    { class: "hm-legend" },
    h("span", {}, "0%"),
    h("i", { style: `background: linear-gradient(90deg, ${from}, ${to})` }),
    h("span", {}, "100%"),
    h("span", { class: "muted" }, scale),
  );
}

function hoverCard(c: HeatmapCell, pipeline: boolean): Node[] {
  const k = t.jobViews.heatmaps.card;
  const line = (label: string, value: string) => h("div", {}, h("span", { class: "muted" }, `${label}: `), value);
  return [
    h("b", {}, `${k.rank} ${c.rank}`),
    line(k.host, c.host ?? t.jobViews.heatmaps.unknownHost),
    pipeline ? line(k.stage, String(c.stage ?? "–")) : null,
    line(k.peak, fmt.bytes(c.peak_allocated_bytes)),
    c.capacity_bytes !== null ? line(k.capacity, fmt.bytes(c.capacity_bytes)) : null,
    c.peak_share !== null ? line(k.share, fmt.percent(c.peak_share)) : line(k.peakOfMax, fmt.percent(c.peak_of_max)),
    line(k.flops, fmt.flops(c.flops)),
    c.flops_normalised !== null ? line(k.flopsShare, fmt.percent(c.flops_normalised)) : null,
  ].filter((x): x is HTMLElement => x !== null);
}

/** Rows of cells, one row per host, with one hover card for the whole grid. */
function grid(ctx: PageContext, data: JobHeatmaps, metric: Metric): HTMLElement {
  const labelled = data.cells.length <= LABELLED_MAX;
  const pipeline = new Set(data.cells.map((c) => c.stage)).size > 1;
  const byRank = new Map(data.cells.map((c) => [c.rank, c]));
  const rows = data.hosts.map((host) => {
    const cells = data.cells.filter((c) => c.host === host);
    return h(
      "div",
      { class: "hm-row", "data-host": host ?? "" },
      h(
        "div",
        { class: "hm-host" },
        h("div", { class: "hm-host-name", title: host ?? "" }, host ?? t.jobViews.heatmaps.unknownHost),
        labelled ? h("div", { class: "muted" }, t.jobViews.heatmaps.hostRanks(cells.length)) : null,
      ),
      h(
        "div",
        { class: labelled ? "hm-cells" : "hm-cells dense" },
        cells.map((c) => {
          const share = metric.share(c);
          const cell = h(
            "a",
            {
              class: share === null ? "hm-cell missing" : "hm-cell",
              href: href(metric.page, { run: ctx.run, rank: c.rank }),
              "data-rank": c.rank,
              "data-share": share ?? "",
              "aria-label": `${t.nav.rank} ${c.rank}: ${metric.label(c)}`,
              style: `background: ${share === null ? HEATMAP_RAMPS.missing : mix(metric.ramp, share)}; color: ${share !== null && share > 0.55 ? "#fff" : "#1f2733"}`,
            },
            labelled ? h("span", { class: "hm-rank" }, pipeline ? `${c.rank} · S${c.stage}` : String(c.rank)) : null,
            labelled ? h("span", { class: "hm-value" }, share === null ? "–" : fmt.percent(share, 0)) : null,
          );
          return cell;
        }),
      ),
    );
  });
  const hover = h("div", { class: "hm-card", hidden: true, role: "tooltip" });
  const box = h("div", { class: labelled ? "hm-grid" : "hm-grid dense", "data-testid": `heatmap-${metric.key}` }, rows, hover);
  if (!labelled) {
    // many ranks: hosts side by side, as many columns as the widest host's cells allow, so that a
    // thousand ranks fit on one screen
    const widest = Math.max(1, ...data.hosts.map((host) => data.cells.filter((c) => c.host === host).length));
    box.style.gridTemplateColumns = `repeat(auto-fill, minmax(${Math.min(DENSE_LABEL_PX + widest * DENSE_CELL_PX, 1200)}px, 1fr))`;
  }
  box.addEventListener("mouseover", (e) => {
    const cell = (e.target as Element).closest?.(".hm-cell") as HTMLElement | null;
    const c = cell ? byRank.get(Number(cell.dataset.rank)) : undefined;
    if (!cell || !c) return;
    replace(hover, hoverCard(c, pipeline));
    hover.hidden = false;
    // fixed to the viewport, so the grid's scrolling never clips it
    const at = cell.getBoundingClientRect();
    const right = at.right + 8 + 230 < window.innerWidth;
    hover.style.left = `${right ? at.right + 8 : Math.max(0, at.left - 238)}px`;
    hover.style.top = `${Math.max(0, Math.min(at.top, window.innerHeight - 200))}px`;
  });
  box.addEventListener("mouseleave", () => {
    hover.hidden = true;
  });
  return box;
}

function extremes(cells: HeatmapCell[], value: (c: HeatmapCell) => number | null): [HeatmapCell, HeatmapCell] | null {
  const known = cells.filter((c) => value(c) !== null);
  if (!known.length) return null;
  const sorted = [...known].sort((a, b) => (value(b) as number) - (value(a) as number) || a.rank - b.rank);
  return [sorted[0], sorted[sorted.length - 1]];
}

export async function jobHeatmapsPage(ctx: PageContext): Promise<void> {
  const s = t.jobViews.heatmaps;
  const data = await get<JobHeatmaps>("job/heatmaps", { run: ctx.run });
  const capacity = data.memory_basis === "capacity";
  const memory: Metric = {
    key: "memory",
    share: (c) => (capacity ? c.peak_share : c.peak_of_max),
    label: (c) => fmt.bytes(c.peak_allocated_bytes),
    ramp: HEATMAP_RAMPS.memory,
    page: "memory",
  };
  const flops: Metric = {
    key: "flops",
    share: (c) => (data.flops_known ? c.flops_normalised : null),
    label: (c) => fmt.flops(c.flops),
    ramp: HEATMAP_RAMPS.flops,
    page: "operators",
  };

  const pipeline = new Set(data.cells.map((c) => c.stage)).size > 1;
  const peaks = extremes(data.cells, (c) => c.peak_allocated_bytes);
  const memoryBody =
    data.memory_basis === "none"
      ? h("p", { class: "muted", "data-testid": "heatmap-memory-empty" }, s.noMemory)
      : h(
          "div",
          {},
          h(
            "div",
            { class: "hm-summary", "data-testid": "heatmap-memory-summary" },
            peaks ? s.largestPeak(peaks[0].rank, fmt.bytes(peaks[0].peak_allocated_bytes)) : null,
          ),
          grid(ctx, data, memory),
          legend(memory, capacity ? s.scaleCapacity : s.scaleMaxPeak),
        );

  const work = extremes(data.cells, (c) => c.flops);
  const flopsBody = !data.flops_known
    ? h("p", { class: "muted", "data-testid": "heatmap-flops-empty" }, s.noFlops)
    : h(
        "div",
        {},
        h(
          "div",
          { class: "hm-summary", "data-testid": "heatmap-flops-summary" },
          work
            ? `${s.heaviest(work[0].rank, fmt.flops(work[0].flops), pipeline ? work[0].stage : null)}; ${s.lightest(
                work[1].rank,
                fmt.flops(work[1].flops),
                fmt.percent(work[1].flops_normalised),
              )}`
            : null,
        ),
        grid(ctx, data, flops),
        legend(flops, s.scaleFlops),
      );

  replace(
    ctx.root,
    h(
      "div",
      { class: "grid" },
      card(
        { title: s.memory, hint: data.memory_basis === "none" ? undefined : capacity ? s.memoryHintCapacity : s.memoryHintMaxPeak, full: true, testId: "card-heatmap-memory" },
        memoryBody,
      ),
      card({ title: s.flops, hint: s.flopsHint, full: true, testId: "card-heatmap-flops" }, flopsBody),
    ),
  );
}
