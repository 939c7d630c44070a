/** Building blocks shared by the pages: a titled card, a stat tile, a segmented toggle. */
import { h, type Child } from "../dom";
import { t } from "../i18n";

export function card(
  options: { title: string; hint?: string; link?: string; full?: boolean; testId?: string; tools?: Child[] },
  ...body: Child[]
): HTMLElement {
  return h(
    "section",
    { class: options.full ? "card full" : "card", "data-testid": options.testId },
    h(
      "div",
      { class: "card-head" },
      h("h2", {}, options.title),
      options.hint ? h("span", { class: "hint" }, options.hint) : null,
      h("span", { class: "spacer" }),
      ...(options.tools ?? []),
      options.link ? h("a", { href: options.link, class: "details-link" }, t.overview.details) : null,
    ),
    ...body,
  );
}

export function stat(label: string, value: string, testId?: string): HTMLElement {
  return h(
    "div",
    { class: "stat" },
    h("div", { class: "label" }, label),
    h("div", { class: "value", "data-testid": testId }, value),
  );
}

/** A chart container; the chart is drawn into it by the caller. */
export function chartBox(testId?: string, tall = false): HTMLDivElement {
  return h("div", { class: tall ? "chart tall" : "chart", "data-testid": testId });
}

/** A row of mutually exclusive buttons; calls `onChange` with the chosen value. */
export function segmented<T extends string>(
  choices: [T, string][],
  value: T,
  onChange: (value: T) => void,
): HTMLElement {
  const buttons = choices.map(([key, label]) => {
    const b = h("button", { type: "button", class: key === value ? "on" : "", "data-value": key }, label);
    b.addEventListener("click", () => {
      buttons.forEach((x) => x.classList.toggle("on", x === b));
      onChange(key);
    });
    return b;
  });
  return h("div", { class: "seg" }, buttons);
}

export function errorBox(err: unknown): HTMLElement {
  return h("div", { class: "card error", role: "alert" }, `${t.error}: ${err instanceof Error ? err.message : String(err)}`);
}
