/** What every page of one run receives. */
import type { PageName } from "./router";

export interface PageContext {
  run: string;
  rank: number;
  ranks: number[];
  params: URLSearchParams;
  root: HTMLElement;
  /** A link to another page of this run (same rank), with extra parameters. */
  link: (page: PageName, extra?: Record<string, string | number | null | undefined>) => string;
}
