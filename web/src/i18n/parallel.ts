/** Strings of the parallel-execution pages (seed 000): the pipeline chart and the Marey view. */
export const parallelEn = {
  nav: { "job-pipeline": "Pipeline chart", "job-marey": "Marey view" },
  step: "Step",
  pipeline: {
    title: (step: string) => `Pipeline of step ${step}`,
    hint: "One row per pipeline stage (its lowest rank): the Forward (light) and Backward (dark) range of every micro-batch, point-to-point sends and receives in orange, arrows from a send to the receive it was matched with. Gaps are the stage's bubble.",
    paces: (stage: number, compute: string) => `Stage ${stage} paces the pipeline: ${compute} of compute in its micro-batches.`,
    idlest: (stage: number, idle: string, share: string) => `Stage ${stage} idles ${idle} (${share} of the step).`,
    noBlocks: "No stage recorded Forward/Backward micro-batch ranges (torch.distributed.pipelining records them); the chart shows the point-to-point ops only.",
    stage: "Stage",
    ranks: "Ranks",
    compute: "Compute in blocks",
    idle: "Idle (drawn)",
    idleShare: "Idle share",
    bubble: "Bubble (step trace)",
    block: (phase: string, mb: number) => `${phase} of micro-batch ${mb}`,
  },
  marey: {
    title: (step: string) => `Marey view of step ${step}`,
    hint: "One timeline per device, grouped by stage: compute green, communication orange. The same op on the devices of a stage is joined into one band: a band wide everywhere is a long op, a band that bulges on one device is a slow device. Drag to zoom, double-click to reset, hover for an op's times, click a device to open its rank.",
    shown: (shown: number, total: number, limit: number, minMs: string) =>
      `${shown} of ${total} ops shown (the longest ${limit} per stage, at least ${minMs} long).`,
    flops: "FLOPs / max",
    flopsShort: "FLOPs",
    memoryShort: "Mem",
    memory: "Peak memory",
    device: (rank: number, stage: number) => `rank ${rank} · S${stage}`,
    opOn: (rank: number) => `rank ${rank}`,
  },
};
