/**
 * The in-app timeline: every rank's threads and streams as tracks on one canvas.  Each visible
 * window is fetched from the server at the canvas's pixel width (level of detail on the server),
 * so the trace's size never reaches the browser.  Zoom/pan with the wheel, dragging or W/A/S/D;
 * click for details; search runs over the whole trace on the server.
 *
 * It opens on the profiled steps (a profiler-wide event may last many times longer), marks each
 * step's boundaries, and shows the ranks chosen (the rank selector's by default; ?ranks=0,2).
 */
import { get, type EventDetail, type SearchResult, type Tracks } from "../api";
import { card } from "../components/card";
import type { PageContext } from "../context";
import { h, replace } from "../dom";
import * as fmt from "../format";
import { t } from "../i18n";
import { fetchWindow, toTracks, trackKey } from "../timeline/data";
import { GUTTER_W, layoutTracks, Renderer, ROW_H, RULER_H, type TrackLayout } from "../timeline/render";
import type { Flow, Slice, StepMark, Track } from "../timeline/types";
import { Viewport } from "../timeline/viewport";

const ZOOM_STEP = 0.8;
const PAN_STEP = 0.15; // of the canvas width per key press
const FETCH_DELAY_MS = 60;
/** Above this many arrows in view, only the selected event's arrows are drawn (else: a black wall). */
const MAX_FLOWS_DRAWN = 150;

/** The ranks shown first: ?ranks= when it holds the rank selector's rank, else that rank alone. */
function initialRanks(ctx: PageContext, all: number[]): number[] {
  if (all.length < 2) return all;
  const asked = (ctx.params.get("ranks") ?? "")
    .split(",")
    .filter((x) => /^\d+$/.test(x))
    .map(Number)
    .filter((r) => all.includes(r));
  return asked.includes(ctx.rank) ? asked : [ctx.rank];
}

/** The step marks of the ranks shown; the lowest rank's carry the ruler's labels. */
function stepMarks(info: Tracks, shown: number[]): StepMark[] {
  const first = Math.min(...shown);
  const lastStep = new Map<number, number>();
  for (const s of info.steps) lastStep.set(s.rank, Math.max(lastStep.get(s.rank) ?? -Infinity, s.step));
  return info.steps
    .filter((s) => shown.includes(s.rank))
    .map((s) => ({
      rank: s.rank,
      step: s.step,
      start: s.start_ns,
      end: s.end_ns,
      last: lastStep.get(s.rank) === s.step,
      label: s.rank === first ? t.polish.stepMark(s.step) : "",
    }));
}

export async function timelinePage(ctx: PageContext): Promise<void> {
  const tl = t.timeline;
  const p = t.polish;
  const info = await get<Tracks>("run/timeline/tracks", { run: ctx.run });
  const allTracks: Track[] = toTracks(info);
  const trackByKey = new Map<string, Track>(allTracks.map((tr) => [tr.key, tr]));
  const endNs = Math.max(info.end_ns, 1);
  let shown = initialRanks(ctx, info.ranks);
  let layouts: TrackLayout[] = [];
  let contentHeight = 0;
  let layoutByKey = new Map<string, TrackLayout>();
  let marks: StepMark[] = [];
  /** ?ranks= for the server: null when every rank is shown. */
  const ranksArg = () => (shown.length < info.ranks.length ? shown.join(",") : null);
  const trackList = h("ul", { class: "sr-only", "data-testid": "track-list", "aria-label": p.trackList });
  const markList = h("ul", { class: "sr-only", "data-testid": "step-marks", "aria-label": p.stepList });

  function applyRanks(): void {
    ({ layouts, height: contentHeight } = layoutTracks(allTracks.filter((tr) => shown.includes(tr.rank))));
    layoutByKey = new Map<string, TrackLayout>(layouts.map((l) => [l.track.key, l]));
    marks = stepMarks(info, shown);
    replace(trackList, layouts.map((l) => h("li", { "data-rank": l.track.rank }, l.track.name)));
    replace(
      markList,
      marks.map((m) => h("li", { "data-rank": m.rank, "data-step": m.step, "data-start-ns": m.start, "data-end-ns": m.end }, `${m.rank}: ${p.stepMark(m.step)}`)),
    );
  }
  applyRanks();

  /** The profiled steps of the ranks shown, or the whole trace when they have none. */
  function stepsSpan(): [number, number] {
    if (!marks.length) return [0, endNs];
    return [Math.min(...marks.map((m) => m.start)), Math.max(...marks.map((m) => m.end))];
  }

  const canvas = h("canvas", { tabindex: 0, "data-testid": "timeline-canvas", "aria-label": tl.title });
  const range = h("span", { class: "muted", "data-testid": "visible-range" });
  const loading = h("span", { class: "loading-dot" });
  const searchInput = h("input", { type: "search", placeholder: tl.search, "data-testid": "timeline-search" });
  const searchForm = h("form", { class: "tl-search" }, searchInput, " ", h("button", { type: "submit" }, tl.searchButton));
  const flowBox = h("input", { type: "checkbox", checked: true, "data-testid": "flows-toggle" });
  const resetBtn = h("button", { type: "button", "data-testid": "steps-view", title: p.stepsView }, tl.reset);
  const wholeBtn = h("button", { type: "button", "data-testid": "whole-trace" }, p.wholeTrace);
  const rankFilter = info.ranks.length > 1 ? rankChooser() : null;
  const download = h(
    "a",
    { class: "btn", href: `api/run/trace-view?${new URLSearchParams({ run: ctx.run, rank: String(ctx.rank) })}`, download: "trace_view.json", "data-testid": "download-trace" },
    tl.download,
  );
  const details = h("div", { "data-testid": "event-details" }, h("p", { class: "muted" }, tl.clickHint));
  const resultsInfo = h("div", { class: "muted", "data-testid": "search-info" });
  const results = h("ul", { class: "tl-results", "data-testid": "search-results" });

  replace(
    ctx.root,
    h(
      "div",
      { class: "tl" },
      h(
        "div",
        { class: "tl-bar" },
        searchForm,
        rankFilter,
        resetBtn,
        wholeBtn,
        h("label", {}, flowBox, ` ${tl.flows}`),
        download,
        h("span", { class: "spacer" }),
        h("span", { class: "muted" }, tl.help),
      ),
      h("div", { class: "tl-bar" }, h("span", {}, `${tl.visible}: `), range, loading),
      h(
        "div",
        { class: "tl-body" },
        h("div", { class: "tl-canvas-wrap" }, canvas, trackList, markList),
        h(
          "div",
          { class: "tl-side" },
          card({ title: tl.details }, details),
          card({ title: tl.searchResults }, resultsInfo, results),
        ),
      ),
    ),
  );

  const renderer = new Renderer(canvas);
  const plotWidth = () => Math.max(1, canvas.clientWidth - GUTTER_W);
  const view = new Viewport(0, endNs, plotWidth(), 0, endNs);
  view.set(...stepsSpan());
  let slices: Slice[] = [];
  let flows: Flow[] = [];
  let loaded = { start: 0, end: 0, nsPerPx: Infinity };
  let selected: Slice | null = null;
  let highlight: { trackKey: string; start: number; dur: number } | null = null;
  let selectedId: { rank: number; id: number } | null = null;
  let controller: AbortController | null = null;
  let fetchTimer: number | undefined;
  let frame = 0;

  const maxScroll = () => Math.max(0, contentHeight - (canvas.clientHeight - RULER_H) + ROW_H);

  function draw(): void {
    frame = 0;
    view.widthPx = plotWidth();
    view.scrollY = Math.min(Math.max(0, view.scrollY), maxScroll());
    if (selectedId) {
      selected = slices.find((s) => s.id === selectedId?.id && s.rank === selectedId.rank && s.count === 1) ?? null;
    }
    renderer.draw(view, layouts, slices, visibleFlows(), selected, highlight, marks);
    range.textContent = `${fmt.duration(view.startNs)} – ${fmt.duration(view.endNs)} (${fmt.duration(view.spanNs)})`;
    canvas.dataset.startNs = String(Math.round(view.startNs));
    canvas.dataset.endNs = String(Math.round(view.endNs));
    canvas.dataset.scrollY = String(Math.round(view.scrollY));
    canvas.dataset.ranks = shown.join(",");
  }

  function rankChooser(): HTMLElement {
    const boxes = info.ranks.map((r) => h("input", { type: "checkbox", value: r, checked: shown.includes(r), "data-rank": r }));
    const all = h("input", { type: "checkbox", checked: shown.length === info.ranks.length, "data-rank": "all" });
    const summary = h("summary", { "data-testid": "rank-filter-summary" }, p.ranksShown(shownText()));
    const update = (next: number[]) => {
      if (!next.length) return; // at least one rank stays shown
      shown = next;
      boxes.forEach((b) => (b.checked = shown.includes(Number(b.value))));
      all.checked = shown.length === info.ranks.length;
      summary.textContent = p.ranksShown(shownText());
      const params = new URLSearchParams(ctx.params);
      params.set("ranks", shown.join(","));
      if (!shown.includes(ctx.rank)) params.set("rank", String(shown[0]));
      history.replaceState(null, "", `#/timeline?${params}`);
      applyRanks();
      view.scrollY = 0;
      highlight = null;
      selectedId = null;
      loaded = { start: 0, end: 0, nsPerPx: Infinity };
      changed();
    };
    boxes.forEach((b) =>
      b.addEventListener("change", () => update(info.ranks.filter((r) => boxes[info.ranks.indexOf(r)].checked))),
    );
    all.addEventListener("change", () => update(all.checked ? [...info.ranks] : [ctx.rank]));
    return h(
      "details",
      { class: "tl-ranks", "data-testid": "rank-filter" },
      summary,
      h(
        "div",
        { class: "tl-ranks-list" },
        h("label", {}, all, ` ${p.allRanks}`),
        info.ranks.map((r, i) => h("label", {}, boxes[i], ` ${t.nav.rank} ${r}`)),
      ),
    );
  }

  function shownText(): string {
    return shown.length === info.ranks.length ? p.allRanks : shown.join(", ");
  }

  function visibleFlows(): Flow[] {
    if (!flowBox.checked) return [];
    const inView = flows.filter((f) => Math.max(f.fromTime, f.toTime) >= view.startNs && Math.min(f.fromTime, f.toTime) <= view.endNs);
    if (inView.length <= MAX_FLOWS_DRAWN) return inView;
    const sel = selectedId;
    return sel ? flows.filter((f) => f.rank === sel.rank && (f.fromId === sel.id || f.toId === sel.id)) : [];
  }

  function changed(): void {
    if (!frame) frame = requestAnimationFrame(draw);
    const nsPerPx = view.spanNs / view.widthPx;
    const covered = view.startNs >= loaded.start && view.endNs <= loaded.end;
    // any zoom refetches: the server merges what is below one pixel at exactly this resolution
    const sameDetail = Math.abs(nsPerPx / loaded.nsPerPx - 1) < 0.02;
    if (covered && sameDetail) return;
    canvas.dataset.loaded = "false";
    window.clearTimeout(fetchTimer);
    fetchTimer = window.setTimeout(load, FETCH_DELAY_MS);
  }

  async function load(): Promise<void> {
    controller?.abort();
    controller = new AbortController();
    // fetch half a screen either side, at the same ns per pixel, so small pans need no request
    const span = view.spanNs;
    const start = Math.max(0, view.startNs - span / 2);
    const end = Math.min(endNs, view.endNs + span / 2);
    const width = ((end - start) / span) * view.widthPx;
    loading.textContent = t.loading;
    try {
      const win = await fetchWindow(ctx.run, info.kinds, start, end, width, flowBox.checked, controller.signal, ranksArg());
      slices = win.slices;
      flows = win.flows;
      loaded = { start: win.startNs, end: win.endNs, nsPerPx: (win.endNs - win.startNs) / width };
      canvas.dataset.events = String(slices.length);
      canvas.dataset.loaded = "true";
      loading.textContent = "";
      draw();
    } catch (err) {
      if ((err as Error).name === "AbortError") return;
      loading.textContent = `${t.error}: ${(err as Error).message}`;
    }
  }

  async function showDetails(rank: number, id: number, merged = 1): Promise<void> {
    selectedId = { rank, id };
    draw();
    const ev = await get<EventDetail>("run/timeline/event", { run: ctx.run, rank, id });
    const f = tl.fields;
    const rows: [string, string][] = [
      [f.name, ev.name],
      [f.kind, ev.kind],
      [f.category, ev.category ?? "–"],
      [f.track, trackByKey.get(trackKey(ev.rank, ev.track))?.name ?? `${ev.track_name} (${f.rank} ${ev.rank})`],
      [f.start, fmt.duration(ev.start_ns)],
      [f.duration, fmt.duration(ev.dur_ns)],
      [f.step, String(ev.step)],
    ];
    if (ev.input_dims) rows.push([f.shapes, fmt.shapes(ev.input_dims)]);
    if (ev.input_types) rows.push([f.dtypes, fmt.list(ev.input_types)]);
    if (ev.concrete_inputs) rows.push([f.scalars, ev.concrete_inputs.map((v) => (v === "" ? f.tensor : v)).join(", ")]);
    if (ev.grid) rows.push([f.grid, fmt.list(ev.grid)]);
    if (ev.block) rows.push([f.block, fmt.list(ev.block)]);
    if (ev.bytes !== null) rows.push([f.bytes, fmt.bytes(ev.bytes)]);
    if (merged > 1) rows.push([f.count, String(merged)]);
    replace(
      details,
      h("dl", { class: "kv" }, rows.flatMap(([k, v]) => [h("dt", {}, k), h("dd", {}, v)])),
      ev.flows.length
        ? h(
            "ul",
            { class: "tl-results" },
            ev.flows.map((fl) => {
              const li = h("li", { title: fl.name }, `${fl.direction === "out" ? "→" : "←"} ${fl.kind}: ${fl.name}`);
              li.addEventListener("click", () => void jump(ev.rank, fl.id, fl.track, fl.start_ns, 0));
              return li;
            }),
          )
        : null,
    );
  }

  /** Centre the view on an event, scroll its track into sight, and show its details. */
  async function jump(rank: number, id: number, track: number, start: number, dur: number): Promise<void> {
    const pad = Math.max(dur * 1.5, 20_000);
    view.set(start - pad, start + dur + pad);
    const layout = layoutByKey.get(trackKey(rank, track));
    if (layout) {
      view.scrollY = Math.max(0, layout.top - (canvas.clientHeight - RULER_H) / 3);
      highlight = { trackKey: layout.track.key, start, dur };
    }
    changed();
    await showDetails(rank, id);
  }

  async function search(): Promise<void> {
    const q = searchInput.value.trim();
    if (!q) return;
    resultsInfo.textContent = t.loading;
    const res = await get<SearchResult>("run/timeline/search", { run: ctx.run, q, limit: 100, ranks: ranksArg() });
    resultsInfo.textContent = res.total ? `${fmt.count(res.total)} ${tl.results}` : tl.noResults;
    replace(
      results,
      res.hits.map((hit) => {
        const where = info.ranks.length > 1 ? `[${hit.rank}] ` : "";
        const li = h("li", { title: hit.name }, `${where}${fmt.duration(hit.start_ns)} · ${hit.name}`);
        li.addEventListener("click", () => void jump(hit.rank, hit.id, hit.track, hit.start_ns, hit.dur_ns));
        return li;
      }),
    );
    if (res.hits.length) {
      const first = res.hits[0];
      await jump(first.rank, first.id, first.track, first.start_ns, first.dur_ns);
    }
  }

  // ---- interaction
  canvas.addEventListener(
    "wheel",
    (e) => {
      e.preventDefault();
      if (e.shiftKey) {
        view.scrollY += e.deltaY;
      } else if (Math.abs(e.deltaX) > Math.abs(e.deltaY)) {
        view.pan(e.deltaX);
      } else {
        const x = e.offsetX - GUTTER_W;
        view.zoom(Math.exp(e.deltaY * 0.0015), Math.min(Math.max(x, 0), view.widthPx));
      }
      changed();
    },
    { passive: false },
  );

  let drag: { x: number; y: number; moved: boolean } | null = null;
  canvas.addEventListener("pointerdown", (e) => {
    canvas.focus();
    canvas.setPointerCapture(e.pointerId);
    drag = { x: e.clientX, y: e.clientY, moved: false };
  });
  canvas.addEventListener("pointermove", (e) => {
    if (!drag) return;
    const dx = e.clientX - drag.x;
    const dy = e.clientY - drag.y;
    if (!drag.moved && Math.abs(dx) + Math.abs(dy) < 4) return;
    drag.moved = true;
    canvas.classList.add("dragging");
    view.pan(-dx);
    view.scrollY -= dy;
    drag.x = e.clientX;
    drag.y = e.clientY;
    changed();
  });
  canvas.addEventListener("pointerup", (e) => {
    const wasClick = drag && !drag.moved;
    drag = null;
    canvas.classList.remove("dragging");
    if (!wasClick) return;
    const rect = canvas.getBoundingClientRect();
    const hit = renderer.hit(e.clientX - rect.left, e.clientY - rect.top);
    if (hit) {
      highlight = null;
      void showDetails(hit.rank, hit.id, hit.count);
    }
  });

  function onKey(e: KeyboardEvent): void {
    if (!canvas.isConnected) {
      window.removeEventListener("keydown", onKey);
      return;
    }
    const target = e.target as HTMLElement | null;
    if (target && (target.tagName === "INPUT" || target.tagName === "SELECT" || target.tagName === "TEXTAREA")) return;
    if (e.ctrlKey || e.metaKey || e.altKey) return;
    const key = e.key.toLowerCase();
    if (key === "w") view.zoom(ZOOM_STEP);
    else if (key === "s") view.zoom(1 / ZOOM_STEP);
    else if (key === "a") view.pan(-PAN_STEP * view.widthPx);
    else if (key === "d") view.pan(PAN_STEP * view.widthPx);
    else return;
    e.preventDefault();
    changed();
  }
  window.addEventListener("keydown", onKey);

  searchForm.addEventListener("submit", (e) => {
    e.preventDefault();
    void search().catch((err) => (resultsInfo.textContent = `${t.error}: ${(err as Error).message}`));
  });
  resetBtn.addEventListener("click", () => {
    view.set(...stepsSpan());
    view.scrollY = 0;
    highlight = null;
    changed();
  });
  wholeBtn.addEventListener("click", () => {
    view.reset();
    highlight = null;
    changed();
  });
  canvas.addEventListener("mousemove", (e) => {
    const track = renderer.trackAt(e.offsetX, e.offsetY, layouts, view.scrollY);
    canvas.title = track ? track.name : "";
  });
  flowBox.addEventListener("change", () => {
    loaded = { start: 0, end: 0, nsPerPx: Infinity };
    changed();
  });
  new ResizeObserver(() => {
    view.widthPx = plotWidth();
    changed();
  }).observe(canvas);

  view.widthPx = plotWidth();
  draw();
  const eventParam = ctx.params.get("event");
  if (eventParam !== null && /^\d+$/.test(eventParam)) {
    const ev = await get<EventDetail>("run/timeline/event", { run: ctx.run, rank: ctx.rank, id: eventParam });
    await jump(ev.rank, ev.id, ev.track, ev.start_ns, ev.dur_ns);
  } else {
    // ?start_ns=&end_ns= open a chosen window (links from other pages, screenshots)
    const from = Number(ctx.params.get("start_ns"));
    const to = Number(ctx.params.get("end_ns"));
    if (ctx.params.has("start_ns") && ctx.params.has("end_ns") && to > from) {
      view.set(from, to);
      draw();
    }
    await load();
  }
}
