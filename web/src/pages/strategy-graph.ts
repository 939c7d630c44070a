/**
 * The execution graph of the parallel-strategy page (seed 000 fig. 3, as far as a PyTorch trace
 * tells it): one lane per pipeline stage, its ops left to right in execution order, coloured by
 * category, the seed's special ops marked (sharded, redistribution, gradient aggregation), grey
 * execution-order edges within a lane and orange send -> receive edges between lanes.  A module
 * selector highlights the ops of one nn.Module; a minimap shows the whole graph and the part in
 * view; drag pans, the wheel zooms, a double-click resets; a click on a node lists its attributes.
 *
 * Every value comes from /api/job/strategy/graph (server/job_strategy.py over the cluster
 * analysis's cluster_strategy_graph.parquet); the page only places it.  A node's x keeps execution
 * order and follows its start time where the ops are sparse, so a send and its receive sit near
 * each other.  All text goes into text nodes (svgText / h): a name from a trace never becomes markup.
 */
import { get } from "../api";
import type { components } from "../api-types";
import { h, replace } from "../dom";
import * as fmt from "../format";
import { OP_CATEGORY_COLORS } from "../palette";
import { t } from "../i18n";

type Graph = components["schemas"]["JobStrategyGraph"];
type GraphNode = components["schemas"]["StrategyNode"];

const NS = "http://www.w3.org/2000/svg";
const NODE_W = 34;
const NODE_H = 26;
const GAP = 10;
const LANE = 120;
const LABEL = 96;
const VIEW_H_MIN = 150;
const SPECIAL_BADGE: Record<string, string> = { sharded: "S", redistribution: "R", gradient_aggregation: "G" };

function svg<K extends keyof SVGElementTagNameMap>(tag: K, attrs: Record<string, string | number> = {}, ...kids: (Node | string)[]): SVGElementTagNameMap[K] {
  const el = document.createElementNS(NS, tag);
  for (const [k, v] of Object.entries(attrs)) el.setAttribute(k, String(v));
  for (const kid of kids) el.appendChild(typeof kid === "string" ? document.createTextNode(kid) : kid);
  return el;
}

/** The op's name without the namespaces that every op of its kind shares. */
function shortName(name: string): string {
  return name.replace(/^autograd::engine::evaluate_function: /, "∇ ").replace(/^(aten|c10d|_c10d_functional)::/, "").replace(/^torch::autograd::/, "");
}

interface Placed {
  node: GraphNode;
  stage: number;
  x: number;
  y: number;
  el: SVGGElement;
}

/** x of each node of one lane: execution order kept, start time followed where there is room. */
function placeLane(nodes: GraphNode[], scale: number): number[] {
  const xs: number[] = [];
  let last = LABEL - NODE_W - GAP;
  for (const n of nodes) {
    const start = n.first_start_ns;
    last = Math.max(last + NODE_W + GAP, LABEL + start * scale);
    xs.push(last);
  }
  return xs;
}

function attributes(n: GraphNode, stage: number): HTMLElement {
  const s = t.parallel.graph;
  const rows: [string, string][] = [
    [s.attr.name, n.name],
    [s.attr.stage, String(stage)],
    [s.attr.category, n.category],
    [s.attr.special, n.special ? s.special[n.special as keyof typeof s.special] ?? n.special : "–"],
    [s.attr.module, n.modules && n.modules.length ? n.modules.join(" › ") : "–"],
    [s.attr.shapes, n.input_dims && n.input_dims.length ? fmt.shapes(n.input_dims) : "–"],
    [s.attr.group, n.group ? `${n.group} [${(n.group_ranks ?? []).join(", ")}]` : "–"],
    [s.attr.bytes, n.bytes !== null && n.bytes !== undefined ? fmt.bytes(n.bytes) : "–"],
    [s.attr.mean, `${fmt.duration(n.mean_ns)} (${fmt.duration(n.min_ns)} – ${fmt.duration(n.max_ns)})`],
    [s.attr.slowest, `${n.slowest_rank} (${n.rank_count} ${s.ranks})`],
  ];
  return h(
    "div",
    { "data-testid": "strategy-node-attrs", "data-key": n.key },
    h("h3", {}, shortName(n.name)),
    h("dl", { class: "sg-attrs" }, rows.flatMap(([k, v]) => [h("dt", {}, k), h("dd", {}, v)])),
    h(
      "table",
      { class: "sg-ranks" },
      h("thead", {}, h("tr", {}, h("th", {}, s.attr.rank), h("th", {}, s.attr.start), h("th", {}, s.attr.duration))),
      h(
        "tbody",
        {},
        n.ranks.map((r, i) => h("tr", { "data-rank": r }, h("td", {}, String(r)), h("td", {}, fmt.duration(n.starts_ns[i])), h("td", {}, fmt.duration(n.durations_ns[i])))),
      ),
    ),
  );
}

/** The graph card's body: toolbar (module selector, legend), the zoomable graph, minimap, panel. */
export function strategyGraph(data: Graph): HTMLElement {
  const s = t.parallel.graph;
  const longest = Math.max(1, ...data.stages.map((st) => st.nodes.length));
  const scale = ((longest * (NODE_W + GAP)) / Math.max(1, data.span_ns)) * 0.8;
  const placed: Placed[] = [];
  const byStageNode = new Map<string, Placed>();
  const content = svg("g", { class: "sg-content" });
  const edgeLayer = svg("g", { class: "sg-edges" });
  const nodeLayer = svg("g", { class: "sg-nodes" });
  content.append(edgeLayer, nodeLayer);
  let width = 0;
  data.stages.forEach((st, lane) => {
    const y = lane * LANE + 30;
    const xs = placeLane(st.nodes, scale);
    width = Math.max(width, (xs[xs.length - 1] ?? LABEL) + NODE_W + GAP);
    nodeLayer.append(
      svg("text", { x: 4, y: y + 12, class: "sg-lane-label" }, `${s.stage} ${st.stage}`),
      svg("text", { x: 4, y: y + 28, class: "sg-lane-sub" }, `${s.ranks} ${st.ranks.join(", ")}`),
    );
    st.nodes.forEach((n, i) => {
      const x = xs[i];
      const special = n.special ?? "";
      const g = svg("g", {
        class: `sg-node${special ? ` special ${special}` : ""}`,
        "data-testid": "strategy-node",
        "data-stage": st.stage,
        "data-node": n.node,
        "data-category": n.category,
        "data-special": special,
        "data-name": n.name,
        transform: `translate(${x},${y})`,
        tabindex: 0,
      });
      g.append(
        svg("rect", { width: NODE_W, height: NODE_H, rx: 4, fill: OP_CATEGORY_COLORS[n.category] ?? "#999" }),
        svg("text", { x: NODE_W / 2, y: NODE_H + 12, class: "sg-node-label" }, shortName(n.name).slice(0, 8)),
        svg("title", {}, `${n.name}\n${n.category}${special ? ` · ${special}` : ""}\n${fmt.duration(n.mean_ns)}`),
      );
      if (special) g.append(svg("text", { x: NODE_W / 2, y: NODE_H / 2 + 4, class: "sg-badge" }, SPECIAL_BADGE[special] ?? "*"));
      const p = { node: n, stage: st.stage, x, y, el: g };
      placed.push(p);
      byStageNode.set(`${st.stage}:${n.node}`, p);
      nodeLayer.append(g);
    });
  });
  const height = Math.max(VIEW_H_MIN, data.stages.length * LANE + 30);
  for (const e of data.edges) {
    const a = byStageNode.get(`${e.src_stage}:${e.src_node}`);
    const b = byStageNode.get(`${e.dst_stage}:${e.dst_node}`);
    if (!a || !b) continue;
    if (e.kind === "order") {
      edgeLayer.append(svg("line", { x1: a.x + NODE_W, y1: a.y + NODE_H / 2, x2: b.x, y2: b.y + NODE_H / 2, class: "sg-order" }));
    } else {
      const down = b.y > a.y;
      const y1 = down ? a.y + NODE_H : a.y;
      const y2 = down ? b.y : b.y + NODE_H;
      const mid = (y1 + y2) / 2;
      const path = svg("path", {
        d: `M${a.x + NODE_W / 2},${y1} C${a.x + NODE_W / 2},${mid} ${b.x + NODE_W / 2},${mid} ${b.x + NODE_W / 2},${y2}`,
        class: "sg-p2p",
        "marker-end": "url(#sg-arrow)",
        "data-testid": "strategy-p2p-edge",
        "data-src": `${e.src_stage}:${e.src_node}`,
        "data-dst": `${e.dst_stage}:${e.dst_node}`,
      });
      path.append(svg("title", {}, `${e.pairs.join(", ")}${e.bytes ? ` · ${fmt.bytes(e.bytes)}` : ""}`));
      edgeLayer.append(path);
    }
  }
  const defs = svg("defs", {}, svg("marker", { id: "sg-arrow", viewBox: "0 0 10 10", refX: 9, refY: 5, markerWidth: 6, markerHeight: 6, orient: "auto-start-reverse" }, svg("path", { d: "M0,0 L10,5 L0,10 z", fill: "#e8590c" })));
  const main = svg("svg", { class: "sg-main", "data-testid": "strategy-graph", width: "100%", height, "data-scale": 1, "data-tx": 0, "data-ty": 0 }, defs, content);

  // minimap: every node as a sliver, and the part in view as a frame
  const MINI_W = 300;
  const miniScale = MINI_W / Math.max(1, width);
  const miniH = Math.max(30, height * miniScale);
  const frame = svg("rect", { class: "sg-mini-frame", x: 0, y: 0, width: MINI_W, height: miniH });
  const mini = svg(
    "svg",
    { class: "sg-minimap", "data-testid": "strategy-minimap", width: MINI_W, height: miniH, viewBox: `0 0 ${MINI_W} ${miniH}` },
    ...placed.map((p) => svg("rect", { x: p.x * miniScale, y: p.y * miniScale, width: Math.max(1, NODE_W * miniScale), height: Math.max(1, NODE_H * miniScale), fill: OP_CATEGORY_COLORS[p.node.category] ?? "#999" })),
    frame,
  );

  // pan and zoom: one transform on the content group
  let k = 1;
  let tx = 0;
  let ty = 0;
  const apply = () => {
    content.setAttribute("transform", `translate(${tx},${ty}) scale(${k})`);
    main.setAttribute("data-scale", k.toFixed(3));
    main.setAttribute("data-tx", tx.toFixed(1));
    main.setAttribute("data-ty", ty.toFixed(1));
    const viewW = main.clientWidth || 1200;
    frame.setAttribute("x", String((-tx / k) * miniScale));
    frame.setAttribute("y", String((-ty / k) * miniScale));
    frame.setAttribute("width", String((viewW / k) * miniScale));
    frame.setAttribute("height", String((height / k) * miniScale));
  };
  main.addEventListener("wheel", (ev) => {
    ev.preventDefault();
    const box = main.getBoundingClientRect();
    const mx = ev.clientX - box.left;
    const my = ev.clientY - box.top;
    const factor = ev.deltaY < 0 ? 1.2 : 1 / 1.2;
    const next = Math.min(8, Math.max(0.05, k * factor));
    tx = mx - ((mx - tx) * next) / k;
    ty = my - ((my - ty) * next) / k;
    k = next;
    apply();
  }, { passive: false });
  let drag: { x: number; y: number; tx: number; ty: number } | null = null;
  main.addEventListener("mousedown", (ev) => {
    drag = { x: ev.clientX, y: ev.clientY, tx, ty };
    main.classList.add("dragging");
  });
  window.addEventListener("mousemove", (ev) => {
    if (!drag) return;
    tx = drag.tx + ev.clientX - drag.x;
    ty = drag.ty + ev.clientY - drag.y;
    apply();
  });
  window.addEventListener("mouseup", () => {
    drag = null;
    main.classList.remove("dragging");
  });
  main.addEventListener("dblclick", () => {
    k = 1;
    tx = 0;
    ty = 0;
    apply();
  });
  mini.addEventListener("click", (ev) => {
    const box = mini.getBoundingClientRect();
    const cx = (ev.clientX - box.left) / miniScale;
    const cy = (ev.clientY - box.top) / miniScale;
    tx = -(cx * k - (main.clientWidth || 1200) / 2);
    ty = -(cy * k - height / 2);
    apply();
  });

  // the attributes panel
  const panel = h("aside", { class: "sg-panel", "data-testid": "strategy-panel" }, h("p", { class: "muted" }, s.clickNode));
  for (const p of placed) {
    p.el.addEventListener("click", async () => {
      for (const q of placed) q.el.classList.toggle("selected", q === p);
      let n = p.node;
      if (!n.ranks.length && n.rank_count > 0) {
        // the graph leaves a many-rank node's per-rank lists out: ask for this one node
        n = await get<GraphNode>("job/strategy/node", { run: data.run, step: data.step, stage: p.stage, node: n.node });
      }
      replace(panel, attributes(n, p.stage));
    });
  }

  // module selector
  const select = h(
    "select",
    { "data-testid": "strategy-module", "aria-label": s.module },
    h("option", { value: "" }, s.allModules),
    data.modules.map((m) => h("option", { value: m }, m)),
  );
  const highlighted = h("span", { class: "muted", "data-testid": "strategy-module-count" });
  select.addEventListener("change", () => {
    const m = select.value;
    let n = 0;
    for (const p of placed) {
      const inside = !!m && (p.node.modules ?? []).includes(m);
      if (inside) n += 1;
      p.el.classList.toggle("highlight", inside);
      p.el.classList.toggle("dim", !!m && !inside);
    }
    highlighted.textContent = m ? s.highlighted(n) : "";
  });

  const legend = h(
    "div",
    { class: "sg-legend", "data-testid": "strategy-legend" },
    data.categories.map((c) => h("span", { class: "sg-key", "data-category": c }, h("i", { style: `background: ${OP_CATEGORY_COLORS[c] ?? "#999"}` }), c)),
    Object.entries(SPECIAL_BADGE).map(([k2, badge]) =>
      h("span", { class: `sg-key special ${k2}`, "data-special": k2 }, h("b", {}, badge), `${s.special[k2 as keyof typeof s.special]} (${data.specials[k2] ?? 0})`),
    ),
  );
  const wrap = h("div", { class: "sg-wrap" }, h("div", { class: "sg-view" }, main), panel);
  requestAnimationFrame(apply);
  return h(
    "div",
    { class: "sg" },
    h("div", { class: "sg-tools" }, h("label", {}, `${s.module} `, select), highlighted, legend),
    h("div", { class: "sg-mini-row" }, h("span", { class: "muted" }, s.minimap), mini, h("span", { class: "muted" }, s.navHint)),
    wrap,
  );
}
