/**
 * Turns the server's column-wise timeline answers into the viewer's slices and flows.  Every
 * window is fetched at the canvas's pixel width, so what arrives is already at screen resolution
 * (the server merges sub-pixel events); nothing here loops over more than one screenful.
 */
import { get, type FlowData, type Tracks, type WindowData } from "../api";
import type { Flow, Slice, Track, Window } from "./types";

export const trackKey = (rank: number, track: number): string => `${rank}:${track}`;

/** The server's tracks as the viewer's, named by their label (rank, stage, thread or stream). */
export function toTracks(data: Tracks): Track[] {
  return data.tracks.map((tr) => ({
    key: trackKey(tr.rank, tr.track),
    rank: tr.rank,
    name: tr.label,
    isDevice: tr.is_device,
    rows: tr.max_depth + 1,
  }));
}

export async function fetchWindow(
  run: string,
  kinds: string[],
  startNs: number,
  endNs: number,
  widthPx: number,
  withFlows: boolean,
  signal: AbortSignal,
  ranks: string | null = null,
): Promise<Window> {
  const start = Math.max(0, Math.floor(startNs));
  const end = Math.max(start + 1, Math.ceil(endNs));
  const width = Math.max(1, Math.min(10000, Math.round(widthPx)));
  const [win, flows] = await Promise.all([
    get<WindowData>("run/timeline/window", { run, start_ns: start, end_ns: end, width_px: width, ranks }, signal),
    withFlows ? get<FlowData>("run/timeline/flows", { run, start_ns: start, end_ns: end, limit: 2000, ranks }, signal) : null,
  ]);
  const slices: Slice[] = [];
  for (const tw of win.tracks) {
    const key = trackKey(tw.rank, tw.track);
    for (const lane of tw.lanes) {
      for (let i = 0; i < lane.start_ns.length; i++) {
        slices.push({
          id: lane.id[i],
          rank: tw.rank,
          trackKey: key,
          start: lane.start_ns[i],
          dur: lane.dur_ns[i],
          depth: lane.depth,
          name: win.names[lane.name[i]] ?? "",
          kind: kinds[lane.kind[i]] ?? "",
          count: lane.count[i],
        });
      }
    }
  }
  const arrows: Flow[] = (flows?.flows ?? []).map((f) => ({
    rank: f.rank,
    fromId: f.src_id,
    toId: f.dst_id,
    fromTrack: trackKey(f.rank, f.src_track),
    fromTime: f.src_ts_ns,
    fromDepth: f.src_depth,
    toTrack: trackKey(f.rank, f.dst_track),
    toTime: f.dst_ts_ns,
    toDepth: f.dst_depth,
  }));
  return { startNs: start, endNs: end, slices, flows: arrows };
}
