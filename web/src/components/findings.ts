/**
 * The advisor's findings as the UI shows them: a severity badge, the culprit (a rank links to that
 * rank's pages), the title and suggestion in the chosen language (the texts come with the finding,
 * from advisor.json: the UI translates nothing), and the evidence table.  Shared by the "Findings"
 * card of the overviews and by the findings pages, so a finding looks the same everywhere.
 * Every name is a text node (see ../dom.ts).
 */
import type { Finding, FindingEvidence, Findings, Severity } from "../api";
import { h, replace, type Child } from "../dom";
import * as fmt from "../format";
import { t } from "../i18n";
import { SEVERITY_COLORS } from "../palette";
import { href } from "../router";
import { segmented } from "./card";

/** The languages the advisor writes its texts in, with the label of the switch. */
export const LANGUAGES: [string, string][] = [
  ["en", "EN"],
  ["zh", "中文"],
];
const LANGUAGE_KEY = "perfsight.findings.language";

/** The language chosen for the findings' texts (kept across pages and visits). */
export function language(): string {
  let chosen: string | null = null;
  try {
    chosen = window.localStorage.getItem(LANGUAGE_KEY);
  } catch {
    chosen = null; // storage disabled: English
  }
  return LANGUAGES.some(([key]) => key === chosen) ? (chosen as string) : "en";
}

/** The EN/中文 switch; calls `onChange` after remembering the choice. */
export function languageSwitch(onChange: (lang: string) => void): HTMLElement {
  const el = segmented(LANGUAGES, language(), (lang) => {
    try {
      window.localStorage.setItem(LANGUAGE_KEY, lang);
    } catch {
      // storage disabled: the switch still applies to this page
    }
    onChange(lang);
  });
  el.setAttribute("data-testid", "findings-language");
  el.setAttribute("aria-label", t.findings.language);
  return el;
}

/** A finding's title and suggestion in `lang`, English when the finding has no such text. */
export function texts(finding: Finding, lang: string): { title: string; suggestion: string } {
  return finding.texts[lang] ?? { title: finding.title, suggestion: finding.suggestion };
}

export function severityBadge(severity: Severity): HTMLElement {
  const badge = h("span", { class: "badge severity", "data-severity": severity }, t.findings.severity[severity] ?? severity);
  badge.style.background = SEVERITY_COLORS[severity];
  return badge;
}

/** The culprit as a link where the UI has a page for it (a rank; a stage's cluster step trace). */
export function culprit(finding: Finding, run: string): HTMLElement {
  const { kind, name } = finding.culprit;
  const label = kind === "job" ? t.findings.culpritKind.job : `${t.findings.culpritKind[kind] ?? kind} ${name}`;
  const number = /^\d+$/.test(name) ? Number(name) : null;
  let target: string | null = null;
  if (kind === "rank" && number !== null) target = href("overview", { run, rank: number });
  if (kind === "stage" && number !== null) target = href("job-steps", { run, stage: number });
  const attrs = { class: "culprit", "data-testid": "finding-culprit", "data-kind": kind, "data-name": name };
  return target ? h("a", { ...attrs, href: target }, label) : h("span", attrs, label);
}

/** The ranks a finding was seen on, each a link to that rank (a job's findings only). */
function seenOn(finding: Finding, run: string): Child {
  if (!finding.ranks.length || (finding.culprit.kind === "rank" && finding.ranks.length === 1)) return null;
  const links: Child[] = [];
  finding.ranks.forEach((rank, i) => {
    if (i) links.push(", ");
    links.push(h("a", { href: href("overview", { run, rank }), "data-testid": "finding-rank" }, String(rank)));
  });
  return h("span", { class: "muted" }, `${t.findings.seenOn} ${t.nav.rank.toLowerCase()} `, ...links);
}

/** A metric value (or threshold) in its unit. */
export function valueText(value: FindingEvidence["value"] | FindingEvidence["threshold"], unit: string): string {
  if (value === null || value === undefined) return "–";
  if (typeof value === "string") return unit ? `${value} ${unit}` : value;
  switch (unit) {
    case "ns":
      return fmt.duration(value);
    case "bytes":
      return fmt.bytes(value);
    case "share":
      return fmt.percent(value);
    case "count":
      return fmt.count(value);
    case "flops":
      return fmt.flops(value);
    case "B/s":
      return `${fmt.bytes(value)}/s`;
    default:
      return unit ? `${value} ${unit}` : String(value);
  }
}

export function evidenceTable(evidence: FindingEvidence[]): HTMLElement {
  const c = t.findings.columns;
  return h(
    "table",
    { class: "data evidence", "data-testid": "finding-evidence" },
    h("thead", {}, h("tr", {}, [c.metric, c.value, c.threshold, c.source].map((x) => h("th", {}, x)))),
    h(
      "tbody",
      {},
      evidence.map((e) =>
        h(
          "tr",
          {},
          h("td", {}, e.metric),
          h("td", { class: "num", "data-unit": e.unit }, valueText(e.value, e.unit)),
          h("td", { class: "num" }, valueText(e.threshold, e.unit)),
          h("td", {}, h("code", {}, e.source)),
        ),
      ),
    ),
  );
}

/** One finding in full: badge, category, culprit, title, suggestion, how sure, evidence. */
export function findingItem(finding: Finding, run: string, lang: string, index: number): HTMLElement {
  const f = t.findings;
  const text = texts(finding, lang);
  const meta: Child[] = [
    h("span", { class: "category", "data-testid": "finding-category" }, finding.category),
    " · ",
    culprit(finding, run),
  ];
  const sure: string[] = [`${f.confidence} ${fmt.percent(finding.confidence, 0)}`];
  if (finding.effect_ns > 0) sure.push(`${fmt.duration(finding.effect_ns)} ${f.effect}`);
  if (finding.uncertain) sure.push(f.uncertain);
  if (finding.explained_by) sure.push(f.explainedBy(finding.explained_by));
  const item = h(
    "li",
    { class: `finding sev-${finding.severity}`, "data-testid": "finding", "data-rule": finding.rule, "data-index": index },
    h("div", { class: "finding-head" }, severityBadge(finding.severity), ...meta, seenOn(finding, run)),
    h("div", { class: "finding-title", "data-testid": "finding-title" }, text.title),
    h("div", { class: "finding-suggestion", "data-testid": "finding-suggestion" }, text.suggestion),
    h("div", { class: "finding-sure muted" }, sure.join(" · ")),
    finding.evidence.length
      ? h("details", { class: "finding-evidence" }, h("summary", {}, f.evidence(finding.evidence.length)), evidenceTable(finding.evidence))
      : null,
  );
  item.style.borderLeftColor = SEVERITY_COLORS[finding.severity];
  return item;
}

/** The list of `findings`, re-rendered in place when the language changes. */
export function findingList(data: Findings, run: string, findings: Finding[], lang: string): HTMLElement {
  return h(
    "ol",
    { class: "findings", "data-testid": "findings-list" },
    findings.map((finding) => findingItem(finding, run, lang, data.findings.indexOf(finding))),
  );
}

/** One finding in short, for the overview card: badge, category, culprit, the ranks it was seen on
 * (a job's: its title gives the worst rank's numbers), title, suggestion. */
export function findingLine(finding: Finding, run: string, lang: string, scope: Findings["scope"]): HTMLElement {
  const item = h(
    "li",
    { class: `finding short sev-${finding.severity}`, "data-testid": "finding", "data-rule": finding.rule },
    h("div", { class: "finding-head" }, severityBadge(finding.severity), finding.category, " · ", culprit(finding, run), scope === "job" ? seenOn(finding, run) : null),
    h("div", { class: "finding-title", "data-testid": "finding-title" }, texts(finding, lang).title),
    h("div", { class: "finding-suggestion muted", "data-testid": "finding-suggestion" }, texts(finding, lang).suggestion),
  );
  item.style.borderLeftColor = SEVERITY_COLORS[finding.severity];
  return item;
}

/** How many findings above info the overview card lists before pointing to the findings page. */
const CARD_TOP = 3;

/**
 * The "Findings" card that opens an overview: the top findings above info, or "no findings above
 * info" with the count of informative ones.  It fills itself in when `load` answers, so the rest
 * of the overview does not wait for it; a run analysed without the advisor shows why, in the card.
 */
export function findingsCard(load: Promise<Findings>, run: string, pageLink: string): HTMLElement {
  const f = t.findings;
  const body = h("div", { class: "findings-card-body", "aria-busy": "true" }, h("span", { class: "muted" }, t.loading));
  let data: Findings | null = null;
  const draw = (lang: string) => {
    if (!data) return;
    body.removeAttribute("aria-busy");
    const scope = data.scope;
    const above = data.findings.filter((x) => x.severity !== "info");
    const shown = above.slice(0, CARD_TOP);
    replace(
      body,
      h(
        "div",
        { class: "muted findings-counts", "data-testid": "findings-counts" },
        f.counts(data.counts.critical ?? 0, data.counts.warning ?? 0, data.counts.info ?? 0),
      ),
      shown.length
        ? h("ol", { class: "findings", "data-testid": "findings-top" }, shown.map((x) => findingLine(x, run, lang, scope)))
        : h("p", { class: "muted", "data-testid": "findings-none" }, f.noneAboveInfo(data.counts.info ?? 0)),
      above.length > shown.length ? h("p", { class: "muted" }, f.moreAboveInfo(above.length - shown.length)) : null,
    );
  };
  const switcher = languageSwitch(draw);
  const el = h(
    "section",
    { class: "card full", "data-testid": "card-findings" },
    h(
      "div",
      { class: "card-head" },
      h("h2", {}, f.title),
      h("span", { class: "hint" }, f.cardHint),
      h("span", { class: "spacer" }),
      switcher,
      h("a", { href: pageLink, class: "details-link", "data-testid": "findings-details" }, t.overview.details),
    ),
    body,
  );
  load.then(
    (answer) => {
      data = answer;
      draw(language());
    },
    (err: unknown) => {
      body.removeAttribute("aria-busy");
      switcher.hidden = true;
      body.replaceChildren(
        h("p", { class: "muted", "data-testid": "findings-unavailable" }, `${f.unavailable}: ${err instanceof Error ? err.message : String(err)}`),
      );
    },
  );
  return el;
}
