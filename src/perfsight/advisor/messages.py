"""The advisor's texts, by message key, in English and Chinese.

A finding carries a key and parameters; the title is ``key`` and the suggestion ``key + ".fix"``.
Parameters are display-ready (milliseconds and percentages rounded by the rule), so a template
only places them.  Keeping texts here, apart from the rules, lets the UI and the CLI show either
language from the same ``advisor.json``.
"""

from __future__ import annotations

from typing import Any

LANGUAGES = ("en", "zh")

MESSAGES: dict[str, dict[str, str]] = {
    "data.loader": {
        "en": "{culprit} waits {gap_ms} ms a step for data ({share_pct}% of the step){queue}",
        "zh": "{culprit}每个迭代等待数据 {gap_ms} ms(占迭代 {share_pct}%){queue}",
    },
    "data.loader.fix": {
        "en": "Speed up the data pipeline: more DataLoader workers (num_workers), pin_memory, "
        "prefetch_factor, or cheaper per-sample transforms; check the data preparation page.",
        "zh": "加快数据处理:增加 DataLoader 的 num_workers、开启 pin_memory、调大 prefetch_factor,"
        "或减少单样本的数据增强开销;请查看数据准备页面。",
    },
    "host.before_step": {
        "en": "{culprit}: {gap_ms} ms a step pass before the first forward op ({share_pct}% of the "
        "step) outside data loading",
        "zh": "{culprit}:每个迭代在第一个前向算子之前有 {gap_ms} ms(占 {share_pct}%)不属于数据加载",
    },
    "host.before_step.fix": {
        "en": "Time the code between fetching a batch and the forward pass (custom transforms, "
        "logging, checkpoints) and move it out of the step.",
        "zh": "对取数据到前向计算之间的自定义逻辑(数据清洗转换、日志、保存检查点)打点计时,并将其移出迭代。",
    },
    "compute.casts": {
        "en": "dtype conversions ({culprit}) take {cast_ms} ms a step ({share_pct}% of computing time, "
        "{count} calls a step)",
        "zh": "类型转换算子({culprit})每个迭代耗时 {cast_ms} ms(占计算时间 {share_pct}%,每迭代 {count} 次)",
    },
    "compute.casts.fix": {
        "en": "Remove redundant .to(dtype)/.float()/.half() round trips: keep tensors in one dtype "
        "or use torch.autocast instead of manual casts.",
        "zh": "去掉冗余的 Cast(.to(dtype)、.float()、.half() 来回转换):保持张量使用同一种数据类型,"
        "或用 torch.autocast 代替手工转换。",
    },
    "scheduling.host_syncs": {
        "en": "{count} host-device synchronisations a step ({culprit}), {sync_ms} ms a step on the host",
        "zh": "每个迭代 {count} 次主机-设备同步({culprit}),主机侧每迭代耗时 {sync_ms} ms",
    },
    "scheduling.host_syncs.fix": {
        "en": "Avoid .item(), .cpu(), .tolist() and printing tensors inside the step: accumulate "
        "on the device and read values once per step (or every N steps).",
        "zh": "避免在迭代内调用 .item()、.cpu()、.tolist() 或打印张量:"
        "在设备侧累加,每个迭代(或每 N 个迭代)只读取一次。",
    },
    "scheduling.launch_bound": {
        "en": "launch-bound: the device waits for the host {wait_ms} ms a step ({share_pct}% of the "
        "step, {of_free_pct}% of its idle time) between {work} short work items (median {work_us} µs, "
        "gaps median {gap_us} µs){op_note}",
        "zh": "启动受限(launch-bound):设备每个迭代等待主机下发 {wait_ms} ms(占迭代 {share_pct}%,"
        "占设备空闲时间 {of_free_pct}%),期间执行 {work} 个短任务(中位 {work_us} µs,间隙中位 "
        "{gap_us} µs){op_note_zh}",
    },
    "scheduling.launch_bound.fix": {
        "en": "Issue fewer, larger kernels, and issue them faster: {remedy}; fuse element-wise ops "
        "(torch.compile, fused or foreach optimizers) or raise the batch size; keep the launching "
        "thread free of other work (data loading in DataLoader workers, no per-step logging).",
        "zh": "减少内核数量、增大单个内核,并加快下发:{remedy_zh};融合逐元素算子(torch.compile、"
        "fused/foreach 优化器)或增大 batch size;让下发线程不做其他工作(数据加载放到 DataLoader "
        "的 worker 中,不要每迭代打印日志)。",
    },
    "scheduling.host_bound": {
        "en": "host-bound: the device waits for the host {wait_ms} ms a step ({share_pct}% of the "
        "step, {of_free_pct}% of its idle time) before its next work is issued; longest wait "
        "{longest_ms} ms{op_note}",
        "zh": "主机受限(host-bound):设备每个迭代等待主机下发下一个任务 {wait_ms} ms(占迭代 "
        "{share_pct}%,占设备空闲时间 {of_free_pct}%);最长一次 {longest_ms} ms{op_note_zh}",
    },
    "scheduling.host_bound.fix": {
        "en": "Look on the timeline at what the host runs while the device waits (the Free lane of "
        "Overlap Analysis): "
        "Python work, data handling, a blocking copy (use pinned memory and non_blocking=True) or "
        "a synchronisation inside the step; move it out of the step or let the device run ahead.",
        "zh": "在时间线上查看设备等待期间(Overlap Analysis 的 Free 泳道)主机在执行什么:"
        "Python 逻辑、数据处理、阻塞的拷贝"
        "(使用锁页内存和 non_blocking=True)或迭代内的同步;将其移出迭代,或让设备提前执行。",
    },
    "memory.churn": {
        "en": "allocator churn: {alloc_mb} MB allocated a step, {churn}x the peak of {peak_mb} MB; "
        "largest allocator {culprit}",
        "zh": "内存频繁申请释放:每个迭代申请 {alloc_mb} MB,是峰值 {peak_mb} MB 的 {churn} 倍;"
        "申请最多的算子为 {culprit}",
    },
    "memory.churn.fix": {
        "en": "Reuse buffers (preallocate, in-place ops, out= arguments) instead of allocating "
        "large temporaries every step.",
        "zh": "复用缓冲区(预分配、原地操作、out= 参数),避免每个迭代申请大的临时张量。",
    },
    "host.oversubscribed": {
        "en": "{ranks} ranks share {cpus} CPU cores on {culprit}: they take turns on the cores, so "
        "their timing there measures the machine, not the program",
        "zh": "{culprit} 上 {ranks} 个 rank 共用 {cpus} 个 CPU 核:它们轮流占用 CPU,"
        "此时的耗时差异反映的是机器而不是程序",
    },
    "host.oversubscribed.fix": {
        "en": "Run at most one rank per CPU core on this host (fewer ranks, or a machine with more "
        "cores) before reading slow ranks or slow cards from this job.",
        "zh": "先让每个 CPU 核最多运行一个 rank(减少 rank 数或换更多核的机器),再判断慢卡/慢 rank。",
    },
    "memory.capacity": {
        "en": "memory near capacity on {culprit}: peak {peak_mb} MB of {capacity_mb} MB ({share_pct}%)",
        "zh": "{culprit} 内存接近上限:峰值 {peak_mb} MB / 容量 {capacity_mb} MB({share_pct}%)",
    },
    "memory.capacity.fix": {
        "en": "Lower the batch size, use activation checkpointing or mixed precision, or free "
        "references to large tensors earlier.",
        "zh": "减小 batch size,使用重计算(activation checkpointing)或混合精度,或尽早释放对大张量的引用。",
    },
    "communication.exposed": {
        "en": "communication not overlapped: {comm_ms} ms a step ({share_pct}% of the step)",
        "zh": "未被计算掩盖的通信:每迭代 {comm_ms} ms(占迭代 {share_pct}%)",
    },
    "communication.exposed.fix": {
        "en": "Informative: see the job's findings for the cause (a slow rank, a slow link, small "
        "buckets); with one collective a step there is no computation left to hide it behind.",
        "zh": "提示信息:原因请看集群分析结论(慢卡、慢链路、桶过小);"
        "每迭代仅一次集合通信时没有可掩盖它的计算。",
    },
    "compute.top_operator": {
        "en": "forward+backward is {share_pct}% of the step; the top operator {culprit} takes "
        "{op_share_pct}% of operator time",
        "zh": "前反向占迭代 {share_pct}%;耗时最多的算子 {culprit} 占算子时间 {op_share_pct}%",
    },
    "compute.top_operator.fix": {
        "en": "Informative: start from the top operators (lower precision where accuracy allows, "
        "fused kernels, larger batches for small kernels).",
        "zh": "提示信息:从耗时排名靠前的算子入手(在不影响精度时使用低精度、融合算子、小算子增大 batch)。",
    },
    "bound": {
        "en": "{culprit} is {bound}-bound: computing {compute_pct}%, free {free_pct}%, "
        "communication not overlapped {comm_pct}%",
        "zh": "{culprit} 为{bound_zh}瓶颈:计算 {compute_pct}%,空闲 {free_pct}%,未掩盖通信 {comm_pct}%",
    },
    "bound.fix": {
        "en": "Informative (seed 003's delimiting): look at the findings of that category first.",
        "zh": "提示信息(按计算/调度/通信定界):优先查看该类别的结论。",
    },
    "rank.slow": {
        "en": "rank {culprit} is the slow card: its {phase} is {excess_ms} ms a step longer than the "
        "other ranks' median ({excess_pct}% of a step){late}",
        "zh": "rank {culprit} 为慢卡:其{phase_zh}每迭代比其他卡的中位数多 {excess_ms} ms"
        "(占迭代 {excess_pct}%){late_zh}",
    },
    "rank.slow.fix": {
        "en": "Open rank {culprit}'s own pages: {phase_fix}",
        "zh": "查看 rank {culprit} 的单卡页面:{phase_fix_zh}",
    },
    "rank.waited_for": {
        "en": "the other ranks wait {wait_ms} ms a step for rank {culprit} at collectives ({share_pct}% "
        "of a step; it arrives last at {late} of {total}), with no phase of its own step standing out",
        "zh": "其他卡在集合通信中每迭代等待 rank {culprit} {wait_ms} ms(占迭代 {share_pct}%;"
        "{total} 次中 {late} 次最后到达),其自身各阶段无明显异常",
    },
    "rank.waited_for.fix": {
        "en": "Look at what rank {culprit} does before those collectives (host work, launches, "
        "synchronisations) on its timeline; if nothing, suspect its host or card.",
        "zh": "在 rank {culprit} 的时间线上查看这些集合通信之前它在做什么(主机侧逻辑、下发、同步);"
        "若都正常,排查其主机或卡。",
    },
    "stage.slow_same_work": {
        "en": "pipeline stage {culprit} computes {compute_ms} ms a step vs {other_ms} ms (spread "
        "{spread_pct}%) for the same FLOPs ({flops} vs {other_flops}): its card or host is slower",
        "zh": "流水线 stage {culprit} 每迭代计算 {compute_ms} ms,其他 stage {other_ms} ms(差异 "
        "{spread_pct}%),但 FLOPs 相同({flops} 对 {other_flops}):该 stage 的卡或主机更慢",
    },
    "stage.slow_same_work.fix": {
        "en": "Check the card and host of stage {culprit}'s ranks (other processes on their cores, "
        "throttling, a degraded device) before moving layers: its work is not larger.",
        "zh": "先检查 stage {culprit} 所在卡与主机(同核的其他进程、降频、设备故障);"
        "其计算量并不更大,不要急于移动层。",
    },
    "stage.imbalance": {
        "en": "pipeline stage {culprit} is overloaded: compute {compute_ms} ms a step vs {other_ms} ms "
        "(spread {spread_pct}%), FLOPs {flops} vs {other_flops}; the other stages wait for it",
        "zh": "流水线 stage {culprit} 计算量过大:每迭代计算 {compute_ms} ms,其他 stage {other_ms} ms"
        "(差异 {spread_pct}%),FLOPs {flops} 对 {other_flops};其他 stage 在等待它",
    },
    "stage.imbalance.fix": {
        "en": "Move layers out of stage {culprit} so every stage's compute (and FLOPs) is close to the mean.",
        "zh": "把 stage {culprit} 的部分层移到其他 stage,使各 stage 的计算量(FLOPs)接近平均值。",
    },
    "communication.small_collectives": {
        "en": "{per_step} small collectives a step (median {median_kb} KB) leave {comm_ms} ms of "
        "communication exposed ({share_pct}% of the step)",
        "zh": "每迭代 {per_step} 次小集合通信(中位数 {median_kb} KB),"
        "未掩盖通信 {comm_ms} ms(占迭代 {share_pct}%)",
    },
    "communication.small_collectives.fix": {
        "en": "Raise DDP's bucket_cap_mb (default 25) so gradients go in a few large all-reduces "
        "that overlap the backward pass.",
        "zh": "调大 DDP 的 bucket_cap_mb(默认 25),让梯度以少量大的 AllReduce 发送并与反向计算重叠"
        "(对应 MindSpore 的 all_reduce_fusion_config)。",
    },
    "communication.exposed_job": {
        "en": "communication not overlapped: {comm_ms} ms a step ({share_pct}% of the step), "
        "{wait_pct}% of it waiting for peers, {transit_pct}% in transit",
        "zh": "未掩盖通信:每迭代 {comm_ms} ms(占迭代 {share_pct}%),其中等待 {wait_pct}%,传输 {transit_pct}%",
    },
    "communication.exposed_job.fix": {
        "en": "Mostly waiting: find the slow rank; mostly transit: check link bandwidth and message "
        "sizes, or overlap communication with computation.",
        "zh": "以等待为主:排查慢卡;以传输为主:检查链路带宽和消息大小,或让通信与计算重叠。",
    },
    "communication.unaligned": {
        "en": "{count} of {total} collectives ({culprit}) move a size that is not a multiple of "
        "{alignment} bytes (e.g. {example} bytes)",
        "zh": "{total} 个集合通信中有 {count} 个({culprit})数据量未按 {alignment} 字节对齐"
        "(如 {example} 字节)",
    },
    "communication.unaligned.fix": {
        "en": "Pad the communicated tensors (or DDP buckets) to a multiple of {alignment} bytes; "
        "unaligned sizes slow the copy engines (SDMA on Ascend).",
        "zh": "将通信张量(或 DDP 桶)补齐到 {alignment} 字节的整数倍;未对齐会降低拷贝引擎(昇腾 SDMA)的性能。",
    },
    "link.slow": {
        "en": "link {culprit} ({link_type}) runs at {bandwidth} GB/s, {drop_pct}% below the median "
        "{median} GB/s of its peers",
        "zh": "链路 {culprit}({link_type})带宽 {bandwidth} GB/s,"
        "比同类链路中位数 {median} GB/s 低 {drop_pct}%",
    },
    "link.slow.fix": {
        "en": "Check that link (cabling, NIC, switch port, rate limits) and the placement of the "
        "ranks on it.",
        "zh": "排查该链路(线缆、网卡、交换机端口、限速)以及该链路上的 rank 部署。",
    },
}

PHASES = {
    "iteration_interval_ns": ("iteration gap", "迭代间隙"),
    "computing_ns": ("computing", "计算时间"),
    "free_ns": ("free (idle host/device) time", "空闲时间"),
}
PHASE_FIXES = {
    "data": ("its data pipeline (data preparation page).", "检查其数据处理(数据准备页面)。"),
    "compute": (
        "its top operators and anything it computes that the other ranks do not.",
        "检查其耗时排名靠前的算子以及只有它执行的计算。",
    ),
    "same_work": (
        "it does the same FLOPs as the others, slower: check its card and host (other processes on "
        "its cores, clock throttling, a degraded device).",
        "它与其他卡的 FLOPs 相同但更慢:检查其卡与主机(同核的其他进程、降频、设备故障)。",
    ),
    "host": (
        "its host-side stalls outside operators (garbage collection, logging, checkpoint I/O, "
        "other processes on its cores).",
        "检查算子之外的主机侧停顿(垃圾回收、日志、检查点读写、同核的其他进程)。",
    ),
}
HOST_WAIT_FIX = (
    "its device waits {host_wait_ms} ms a step longer than the others' for its host to launch work: "
    "the host runs the same program slower (other processes on its cores, CPU frequency or power "
    "settings, threads bound to another NUMA node than the card's) or runs host work the others do not.",
    "其设备每迭代比其他卡多等待主机下发任务 {host_wait_ms} ms:该主机运行同样的程序更慢(同核的其他进程、"
    "CPU 频率或功耗设置、线程绑定到与该卡不同的 NUMA 节点),或执行了其他卡没有的主机侧工作。",
)
"""The fix of a slow card whose free time is mostly its device waiting for its host (placed)."""
AFTER_LAUNCH_FIX = (
    "its device sits idle {after_launch_ms} ms a step longer than the others' after its work was "
    "launched: its host issued the work in time and the card started it later (launch latency, a "
    "wait on another stream's event or on a copy between host and device). Compare its timeline "
    "with another rank's around those gaps, and check the card: its PCIe link's generation and width "
    "(nvidia-smi -q), other processes using the device, its driver.",
    "其设备每迭代比其他卡多空闲 {after_launch_ms} ms,且发生在任务已下发之后:主机按时下发,该卡却更晚开始执行"
    "(下发时延、等待其他流的事件或主机与设备间的拷贝)。对照其他卡的时间线查看这些空闲,并检查该卡:"
    "PCIe 链路的代数与宽度(nvidia-smi -q)、占用该设备的其他进程、驱动。",
)
"""The fix of a slow card whose free time is mostly its device idle after the launch (placed)."""
BOUND_ZH = {"compute": "计算", "scheduling": "调度", "communication": "通信"}


CULPRIT_JOB_ZH = "该作业"
"""``the job`` as a culprit in a Chinese text (rank and stage numbers read the same in both)."""


def render(key: str, params: dict[str, Any], lang: str = "en") -> str:
    """The text of ``key`` in ``lang`` with ``params`` placed; an unknown key is shown as itself."""
    texts = MESSAGES.get(key)
    if texts is None:
        return key
    template = texts.get(lang) or texts["en"]
    if lang == "zh" and params.get("culprit") == "the job":
        params = {**params, "culprit": CULPRIT_JOB_ZH}
    try:
        return template.format(**params)
    except (KeyError, IndexError, ValueError):
        return template
