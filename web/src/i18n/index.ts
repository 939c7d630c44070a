/** The active language's strings.  Only English exists today; a translation plugs in here. */
import { en, type Strings } from "./en";

export const t: Strings = en;
