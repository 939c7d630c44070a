/** Strings of the data-preparation page for a MindData pipeline read from MindSpore's files
 * (analysis/minddata.py): each op's output queue and the host's CPU use. */
export const minddataEn = {
  opQueue: (stage: string) => `Output queue of ${stage}`,
  opQueueShort: "Output queue",
  queueUsage: "Queue usage",
  queueMean: "Mean size",
  queueSize: "Size",
  queueCapacity: "Capacity",
  queueEmpty: "Samples found empty",
  queueSamples: "Samples",
  notMeasured: "time not recorded",
  hostSamples: "Host queue empty in samples",
  noDeviceTimeline: (device: string) =>
    `This run names its device (${device}) but its files record no activity on it (no op timeline, e.g. a step trace only): device time, device memory and device widgets are unknown and hidden.`,
  cpuTitle: "CPU utilization",
  cpuHint: "The host's CPU use sampled by MindData: the machine, the training process and each pipeline op (mean and maximum of the samples MindInsight averages; % unless a count)",
  cpuColumns: { scope: "Scope", stage: "Op", metric: "Metric", mean: "Mean", max: "Max", samples: "Samples" },
  cpuScopes: { machine: "machine", process: "process", op: "op" } as Record<string, string>,
};
