/** What the timeline draws, in the viewer's own terms (times in ns relative to the trace start). */

export interface Track {
  key: string;
  rank: number;
  name: string;
  isDevice: boolean;
  /** Rows needed for nested slices (max depth + 1). */
  rows: number;
}

export interface Slice {
  /** Event id within its rank (the first event of a merged block). */
  id: number;
  rank: number;
  trackKey: string;
  start: number;
  dur: number;
  depth: number;
  name: string;
  kind: string;
  /** More than 1 when the server merged several sub-pixel events into this one. */
  count: number;
}

export interface Flow {
  rank: number;
  fromId: number;
  toId: number;
  fromTrack: string;
  fromTime: number;
  fromDepth: number;
  toTrack: string;
  toTime: number;
  toDepth: number;
}

export interface Window {
  startNs: number;
  endNs: number;
  slices: Slice[];
  flows: Flow[];
}

/** A profiled step of one rank, drawn as boundaries over that rank's tracks. */
export interface StepMark {
  rank: number;
  step: number;
  start: number;
  end: number;
  /** Also draw the step's end (the last step of its rank). */
  last: boolean;
  /** The ruler's label ("step 4"); empty for the marks of the other ranks shown. */
  label: string;
}
