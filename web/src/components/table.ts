/**
 * A table whose sorting, searching and paging happen on the server: the browser only ever holds
 * one page of rows, so a trace with millions of operators renders as fast as a small one.
 */
import { h, replace } from "../dom";
import { t } from "../i18n";

export type Row = Record<string, unknown>;

export interface Column {
  key: string;
  label: string;
  /** Text for one cell; never HTML. */
  format?: (value: unknown, row: Row) => string;
  sortable?: boolean;
  numeric?: boolean;
}

export interface PageQuery {
  sort?: string;
  desc: boolean;
  offset: number;
  limit: number;
  q: string;
}

export interface Page {
  rows: Row[];
  total: number;
}

export interface TableOptions {
  columns: Column[];
  fetch: (query: PageQuery) => Promise<Page>;
  pageSize?: number;
  sort?: string;
  desc?: boolean;
  searchPlaceholder?: string;
  onRowClick?: (row: Row) => void;
  testId?: string;
}

export interface ServerTable {
  el: HTMLElement;
  reload: () => Promise<void>;
  setSearch: (q: string) => void;
  /** Back to the first page and fetch again (after a filter outside the table changed). */
  firstPage: () => Promise<void>;
}

export function serverTable(options: TableOptions): ServerTable {
  const query: PageQuery = {
    sort: options.sort,
    desc: options.desc ?? true,
    offset: 0,
    limit: options.pageSize ?? 25,
    q: "",
  };
  const head = h("thead");
  const body = h("tbody");
  const info = h("span", { class: "pager-info" });
  const prev = h("button", { type: "button", class: "btn" }, t.table.prev);
  const next = h("button", { type: "button", class: "btn" }, t.table.next);
  const search =
    options.searchPlaceholder !== undefined
      ? h("input", { type: "search", class: "search", placeholder: options.searchPlaceholder })
      : null;
  const table = h("table", { class: "data" }, head, body);
  const el = h(
    "div",
    { class: "table-wrap", "data-testid": options.testId },
    search ? h("div", { class: "table-tools" }, search) : null,
    h("div", { class: "table-scroll" }, table),
    h("div", { class: "pager" }, prev, info, next),
  );
  let total = 0;
  let generation = 0;

  function renderHead(): void {
    const cells = options.columns.map((col) => {
      const arrow = query.sort === col.key ? (query.desc ? " ▼" : " ▲") : "";
      const th = h("th", { class: col.numeric ? "num" : "" }, col.label + arrow);
      if (col.sortable) {
        th.classList.add("sortable");
        th.setAttribute("data-sort-key", col.key);
        th.addEventListener("click", () => {
          if (query.sort === col.key) query.desc = !query.desc;
          else {
            query.sort = col.key;
            query.desc = Boolean(col.numeric);
          }
          query.offset = 0;
          void reload();
        });
      }
      return th;
    });
    replace(head, h("tr", {}, cells));
  }

  async function reload(): Promise<void> {
    const mine = ++generation;
    renderHead();
    el.setAttribute("aria-busy", "true");
    let page: Page;
    try {
      page = await options.fetch({ ...query });
    } catch (err) {
      if (mine !== generation) return;
      replace(body, h("tr", {}, h("td", { colspan: options.columns.length, class: "error" }, String(err))));
      el.removeAttribute("aria-busy");
      return;
    }
    if (mine !== generation) return;
    total = page.total;
    const rows = page.rows.map((row) => {
      const tr = h(
        "tr",
        {},
        options.columns.map((col) => {
          const value = row[col.key];
          const text = col.format ? col.format(value, row) : value === null || value === undefined ? "" : String(value);
          return h("td", { class: col.numeric ? "num" : "" }, text);
        }),
      );
      if (options.onRowClick) {
        tr.classList.add("clickable");
        tr.addEventListener("click", () => options.onRowClick?.(row));
      }
      return tr;
    });
    if (!rows.length) rows.push(h("tr", {}, h("td", { colspan: options.columns.length, class: "muted" }, t.noData)));
    replace(body, rows);
    const pages = Math.max(1, Math.ceil(total / query.limit));
    const current = Math.floor(query.offset / query.limit) + 1;
    info.textContent = `${t.table.page} ${current} ${t.table.of} ${pages} · ${total.toLocaleString("en-US")} ${t.table.rows}`;
    prev.disabled = query.offset <= 0;
    next.disabled = query.offset + query.limit >= total;
    el.setAttribute("data-total", String(total));
    el.removeAttribute("aria-busy");
  }

  prev.addEventListener("click", () => {
    query.offset = Math.max(0, query.offset - query.limit);
    void reload();
  });
  next.addEventListener("click", () => {
    if (query.offset + query.limit < total) query.offset += query.limit;
    void reload();
  });
  let timer: number | undefined;
  search?.addEventListener("input", () => {
    window.clearTimeout(timer);
    timer = window.setTimeout(() => {
      query.q = search.value.trim();
      query.offset = 0;
      void reload();
    }, 250);
  });

  return {
    el,
    reload,
    firstPage() {
      query.offset = 0;
      return reload();
    },
    setSearch(q: string) {
      if (search) search.value = q;
      query.q = q;
      query.offset = 0;
      void reload();
    },
  };
}
