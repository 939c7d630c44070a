"""Write a large, realistic synthetic Kineto (torch.profiler) trace, streaming, for benchmarks.

Why this exists: the real traces we can ship are a few megabytes, but perfsight must stay fast and
small in memory on gigabyte traces.  This script simulates one rank of a data-parallel transformer
training job on a GPU and writes what Kineto would write for it, step after step, until the file
reaches ``--size-mb``:

* ``ProfilerStep#N`` user annotations (mirrored on the compute stream as ``gpu_user_annotation``),
  a data-loader annotation, forward ops on the main thread and backward ops on the autograd thread
  (``cpu_op`` with ``External id``, ``Sequence number``, ``Input Dims`` and ``Input type``);
* ``cuda_runtime`` launches with ``correlation`` ids and ``ac2g`` flow arrows to ``kernel`` /
  ``gpu_memcpy`` events on streams 7 (compute) and 20 (NCCL), with grid/block/occupancy;
* DDP gradient all-reduce buckets: ``record_param_comms`` + ``nccl:all_reduce`` on the host and
  ``ncclDevKernel_AllReduce_*`` kernels carrying the collective's metadata;
* ``[memory]`` instant events (``Bytes``, ``Total Allocated``, ``Total Reserved``, ``Addr``,
  ``Device Type``, ``Device Id``) whose allocations and frees pair up by address;
* an optimizer step of ``_foreach_*`` multi-tensor kernels and a ``.item()`` that waits for the GPU
  (``cudaStreamSynchronize``), so steps are GPU-bound as in real jobs.

Output is deterministic for a given ``--seed`` and arguments.  Two text layouts are offered:
``classic`` (several keys per line, as in most published GPU traces, e.g. HTA's test data) and
``torch213`` (one key per line, as torch 2.13 writes; its flow-end line is our best guess since we
have no GPU trace from that version).  It never loads the trace back into memory: memory use is
one step's worth of text.

Usage::

    python benchmarks/gen_kineto_trace.py --out /tmp/big.pt.trace.json --size-mb 1024 --seed 0
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

MIB = 1024 * 1024
MAIN_STREAM = 7
NCCL_STREAM = 20
BF16 = '"c10::BFloat16"'


# --------------------------------------------------------------------------------------------------
# Text layouts: how one event is spelled.  Everything else is independent of the layout.
# --------------------------------------------------------------------------------------------------
class ClassicLayout:
    """Several keys per line, as Kineto wrote GPU traces through 2024."""

    name = "classic"

    @staticmethod
    def complete(
        cat: str, name: str, pid: int | str, tid: int | str, ts: float, dur: float, args: str
    ) -> str:
        return (
            f'  {{\n    "ph": "X", "cat": "{cat}", "name": "{name}", "pid": {pid}, "tid": {tid},\n'
            f'    "ts": {ts:.3f}, "dur": {dur:.3f},\n    "args": {{\n      {args}\n    }}\n  }}'
        )

    @staticmethod
    def memory(pid: int, tid: int, ts: float, ev: int, addr: int, nbytes: int, alloc: int, res: int) -> str:
        return (
            '  {\n    "ph": "i", "cat": "cpu_instant_event", "s": "t", "name": "[memory]",\n'
            f'    "pid": {pid}, "tid": {tid},\n    "ts": {ts:.3f},\n    "args": {{\n'
            f'      "Ev Idx": {ev}, "Device Type": 1, "Device Id": 0, "Addr": {addr}, "Bytes": {nbytes}, '
            f'"Total Allocated": {alloc}, "Total Reserved": {res}\n    }}\n  }}'
        )

    @staticmethod
    def flow(phase: str, flow_id: int, pid: int, tid: int, ts: float) -> str:
        tail = ', "bp": "e"' if phase == "f" else ""
        return (
            f'  {{\n    "ph": "{phase}", "id": {flow_id}, "pid": {pid}, "tid": {tid}, "ts": {ts:.3f},\n'
            f'    "cat": "ac2g", "name": "ac2g"{tail}\n  }}'
        )

    @staticmethod
    def metadata(name: str, pid: int | str, tid: int | str, ts: float, args: str) -> str:
        return (
            f'  {{\n    "name": "{name}", "ph": "M", "ts": {ts:.3f}, "pid": {pid}, "tid": {tid},\n'
            f'    "args": {{\n      {args}\n    }}\n  }}'
        )


class Torch213Layout:
    """One key per line, as torch 2.13's Kineto writes (see examples/train_mlp.py's output)."""

    name = "torch213"

    @staticmethod
    def complete(
        cat: str, name: str, pid: int | str, tid: int | str, ts: float, dur: float, args: str
    ) -> str:
        return (
            f'  {{\n    "ph": "X",\n    "cat": "{cat}",\n    "name": "{name}",\n    "pid": {pid},\n'
            f'    "tid": {tid},\n    "ts": {ts:.3f},\n    "dur": {dur:.3f}\n    ,\n'
            f'    "args": {{\n      {args}\n    }}\n  }}'
        )

    @staticmethod
    def memory(pid: int, tid: int, ts: float, ev: int, addr: int, nbytes: int, alloc: int, res: int) -> str:
        return (
            '  {\n    "ph": "i",\n    \n    "cat": "cpu_instant_event",\n    "s": "t",\n'
            f'    "name": "[memory]",\n    "pid": {pid},\n    "tid": {tid},\n    "ts": {ts:.3f}\n    ,\n'
            f'    "args": {{\n      "Total Reserved": {res}, "Total Allocated": {alloc}, "Bytes": {nbytes}, '
            f'"Device Id": 0, "Device Type": 1, "Addr": {addr}, "finished": false, "Ev Idx": {ev}\n'
            "    }\n  }"
        )

    @staticmethod
    def flow(phase: str, flow_id: int, pid: int, tid: int, ts: float) -> str:
        tail = ',\n    "bp": "e"\n' if phase == "f" else "\n    \n"
        return (
            f'  {{\n    "ph": "{phase}",\n    "id": {flow_id},\n    "pid": {pid},\n    "tid": {tid},\n'
            f'    "ts": {ts:.3f},\n    "cat": "ac2g",\n    "name": "ac2g"{tail}  }}'
        )

    @staticmethod
    def metadata(name: str, pid: int | str, tid: int | str, ts: float, args: str) -> str:
        return (
            f'  {{\n    "ph": "M",\n    "name": "{name}",\n    "ts": {ts:.3f},\n    "pid": {pid},\n'
            f'    "tid": {tid},\n    "args": {{\n      {args}\n    }}\n  }}'
        )


LAYOUTS = {layout.name: layout for layout in (ClassicLayout, Torch213Layout)}
Layout = type[ClassicLayout] | type[Torch213Layout]


# --------------------------------------------------------------------------------------------------
# The simulated model: what each operator looks like on the host and on the device.
# --------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Kernel:
    name: str
    grid: str
    block: str
    regs: int
    smem: int
    occupancy: int


def _elementwise(functor: str) -> Kernel:
    return Kernel(
        f"void at::native::vectorized_elementwise_kernel<4, {functor}, at::detail::Array<char*, 3> >"
        f"(int, {functor}, at::detail::Array<char*, 3>)",
        "65536, 1, 1",
        "128, 1, 1",
        28,
        0,
        100,
    )


# Kernel names as CUDA/cuBLAS/NCCL report them (long C++ signatures), split only for line length.
GEMM = Kernel(
    "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x256x64_warpgroupsize2x1x1_"
    "execute_segment_k_off_kernel__5x_cublas",
    "16, 32, 1", "384, 1, 1", regs=168, smem=213248, occupancy=12,
)  # fmt: skip
GEMM_BWD = Kernel(
    "sm90_xmma_gemm_bf16bf16_bf16f32_f32_nn_n_tilesize128x256x64_warpgroupsize2x1x1_"
    "execute_segment_k_off_kernel__5x_cublas",
    "16, 32, 1", "384, 1, 1", regs=168, smem=213248, occupancy=12,
)  # fmt: skip
LAYER_NORM = Kernel(
    "void at::native::(anonymous namespace)::vectorized_layer_norm_kernel<c10::BFloat16, float>"
    "(int, float, c10::BFloat16 const*, c10::BFloat16 const*, c10::BFloat16 const*, float*, float*, "
    "c10::BFloat16*)",
    "4096, 1, 1", "128, 1, 1", regs=40, smem=0, occupancy=88,
)  # fmt: skip
LAYER_NORM_BWD = Kernel(
    "void at::native::(anonymous namespace)::layer_norm_grad_input_kernel_vectorized<c10::BFloat16, float>"
    "(c10::BFloat16 const*, c10::BFloat16 const*, float const*, float const*, c10::BFloat16 const*, "
    "c10::BFloat16*, int)",
    "4096, 1, 1", "256, 1, 1", regs=48, smem=1024, occupancy=75,
)  # fmt: skip
FLASH_FWD = Kernel(
    "void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<128, 128, 64, 4, false, false, "
    "cutlass::bfloat16_t, Flash_kernel_traits<128, 128, 64, 4, cutlass::bfloat16_t> >, false, true, false, "
    "false, true, true, false, false>(pytorch_flash::Flash_fwd_params)",
    "8, 32, 4", "128, 1, 1", regs=255, smem=49152, occupancy=6,
)  # fmt: skip
FLASH_BWD = Kernel(
    "void pytorch_flash::flash_bwd_dq_dk_dv_loop_seqk_parallel_kernel<Flash_bwd_kernel_traits<128, 64, 128, "
    "8, 2, 4, 2, false, false, cutlass::bfloat16_t, Flash_kernel_traits<128, 64, 128, 8, "
    "cutlass::bfloat16_t> >, true, false, false, false, false, true, false, false>"
    "(pytorch_flash::Flash_bwd_params)",
    "16, 4, 32", "256, 1, 1", regs=255, smem=98304, occupancy=6,
)  # fmt: skip
ADD = _elementwise("at::native::CUDAFunctor_add<c10::BFloat16>")
GELU = _elementwise(
    "at::native::GeluCUDAKernelImpl(at::TensorIteratorBase&, at::native::GeluType)::{lambda()#2}::"
    "operator()() const::{lambda()#4}::operator()() const::{lambda(c10::BFloat16)#1}"
)
GELU_BWD = _elementwise(
    "at::native::GeluBackwardCUDAKernelImpl(at::TensorIteratorBase&, at::native::GeluType)::{lambda()#2}::"
    "operator()() const::{lambda()#4}::operator()() const::{lambda(c10::BFloat16, c10::BFloat16)#1}"
)
_ADAM = (
    "at::native::(anonymous namespace)::TensorListMetadata<4>, at::native::(anonymous namespace)::"
    "FusedAdamMathFunctor<float, 4, (at::native::ADAM_MODE)1, false>, float*, double, double, double, "
    "double, double, bool, float*, float*"
)
FOREACH = Kernel(
    f"void at::native::(anonymous namespace)::multi_tensor_apply_kernel<{_ADAM}>({_ADAM})",
    "320, 1, 1", "512, 1, 1", regs=96, smem=0, occupancy=50,
)  # fmt: skip
NCCL_ALLREDUCE = Kernel(
    "ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevComm*, unsigned long, ncclWork*)",
    "32, 1, 1", "640, 1, 1", regs=96, smem=87568, occupancy=2,
)  # fmt: skip


@dataclass(frozen=True)
class Shape:
    batch: int = 4
    seq: int = 1024
    hidden: int = 2048

    @property
    def tokens(self) -> int:
        return self.batch * self.seq


def _dims(*dims: Sequence[int]) -> str:
    return "[" + ", ".join("[" + ", ".join(str(d) for d in dim) + "]" for dim in dims) + "]"


class TraceSimulator:
    """Simulates the host threads and device streams of one rank and renders their events."""

    GEMM_TFLOPS = 600.0  # achieved bf16 throughput, in TFLOP/s, so FLOPs / this is microseconds * 1e6
    HBM_GBPS = 2500.0
    NCCL_GBPS = 150.0

    def __init__(self, layout: Layout, seed: int, layers: int, shape: Shape, rank: int, world: int) -> None:
        self.layout = layout
        self.rng = random.Random(seed)
        self.layers = layers
        self.shape = shape
        self.rank = rank
        self.world = world
        self.pid = 100_000 + self.rng.randrange(800_000)
        self.main_tid = self.pid
        self.bwd_tid = self.pid + 1 + self.rng.randrange(9_000)
        self.device = rank % 8
        self.start_ts = 4_000_000_000.0 + self.rng.randrange(1_000_000_000)
        self.cpu = {self.main_tid: self.start_ts + 1_000.0, self.bwd_tid: self.start_ts + 1_000.0}
        self.stream_free = {MAIN_STREAM: self.start_ts, NCCL_STREAM: self.start_ts}
        self.external_id = 0
        self.correlation = 100_000
        self.ev_idx = 0
        self.sequence = 0
        self.collective_seq: int | None = None  # recorded as the collectives' "Seq" when set
        self.allocated = 1 << 30  # weights and optimizer state, resident before profiling began
        self.reserved = 2 << 30
        self.next_addr = 0x7F00_0000_0000
        self.saved: list[tuple[int, int]] = []  # activations (addr, bytes) kept for backward
        self.buffer: list[str] = []

    # -- primitive events ---------------------------------------------------------------------------
    def _jitter(self, mean: float, spread: float = 0.1) -> float:
        return mean * (1.0 + spread * (2.0 * self.rng.random() - 1.0))

    def _open(self, tid: int, cat: str, name: str, static_args: str, seq: bool = False) -> list:
        self.cpu[tid] += self._jitter(2.0, 0.5)
        self.external_id += 1
        self.ev_idx += 1
        args = f'"External id": {self.external_id},"Record function id": 0'
        if seq:
            self.sequence += 1
            args += f', "Sequence number": {self.sequence}, "Fwd thread id": 0'
        if static_args:
            args += ", " + static_args
        args += f', "Ev Idx": {self.ev_idx}'
        self.buffer.append("")
        return [len(self.buffer) - 1, tid, cat, name, self.cpu[tid], args, self.external_id]

    def _close(self, frame: list) -> None:
        slot, tid, cat, name, start, args, _ = frame
        self.cpu[tid] += self._jitter(3.0, 0.5)
        self.buffer[slot] = self.layout.complete(cat, name, self.pid, tid, start, self.cpu[tid] - start, args)

    def _memory(self, tid: int, nbytes: int, addr: int | None = None) -> int:
        if addr is None:
            addr = self.next_addr
            self.next_addr += (nbytes + 511) // 512 * 512
        self.allocated += nbytes
        self.reserved = max(self.reserved, (self.allocated + (20 << 20)) // (2 << 20) * (2 << 20))
        self.ev_idx += 1
        self.buffer.append(
            self.layout.memory(
                self.pid, tid, self.cpu[tid], self.ev_idx, addr, nbytes, self.allocated, self.reserved
            )
        )
        return addr

    def _launch(
        self,
        tid: int,
        kernel: Kernel,
        gpu_us: float,
        stream: int = MAIN_STREAM,
        extra: str = "",
        not_before: float = 0.0,
    ) -> tuple[float, float]:
        """A cudaLaunchKernel on ``tid`` and its kernel on ``stream``; returns the kernel's span."""
        self.correlation += 1
        corr, ext = self.correlation, self.external_id
        ts = self.cpu[tid] + self._jitter(1.5, 0.5)
        runtime_us = self._jitter(5.0, 0.4)
        name, cbid = ("cudaLaunchKernelExC", 430) if stream == NCCL_STREAM else ("cudaLaunchKernel", 211)
        out = self.buffer
        out.append(
            self.layout.complete(
                "cuda_runtime",
                name,
                self.pid,
                tid,
                ts,
                runtime_us,
                f'"External id": {ext},      "cbid": {cbid}, "correlation": {corr}',
            )
        )
        out.append(self.layout.flow("s", corr, self.pid, tid, ts))
        # Back-to-back kernels on one stream are still ~1 us apart on real GPUs.
        start = max(
            ts + self._jitter(6.0, 0.5), self.stream_free[stream] + self._jitter(1.2, 0.5), not_before
        )
        dur = max(1.0, self._jitter(gpu_us, 0.05))
        out.append(
            self.layout.complete(
                "kernel",
                kernel.name,
                self.device,
                stream,
                start,
                dur,
                f'"External id": {ext},      "queued": 0, "device": {self.device}, "context": 1,'
                f'      "stream": {stream}, "correlation": {corr},'
                f'      "registers per thread": {kernel.regs},      "shared memory": {kernel.smem},'
                '      "blocks per SM": 1.000000,      "warps per SM": 4.000000,'
                f'      "grid": [{kernel.grid}],      "block": [{kernel.block}],'
                f'      "est. achieved occupancy %": {kernel.occupancy}{extra}',
            )
        )
        out.append(self.layout.flow("f", corr, self.device, stream, start))
        self.stream_free[stream] = start + dur
        self.cpu[tid] = ts + runtime_us
        return start, start + dur

    def _memcpy(self, tid: int, kind: str, nbytes: int) -> float:
        """A cudaMemcpyAsync and its copy on the compute stream; returns when the copy ends."""
        self.correlation += 1
        corr, ext = self.correlation, self.external_id
        ts = self.cpu[tid] + 1.0
        runtime_us = self._jitter(12.0, 0.3)
        self.buffer.append(
            self.layout.complete(
                "cuda_runtime",
                "cudaMemcpyAsync",
                self.pid,
                tid,
                ts,
                runtime_us,
                f'"External id": {ext},      "cbid": 41, "correlation": {corr}',
            )
        )
        self.buffer.append(self.layout.flow("s", corr, self.pid, tid, ts))
        start = max(ts + 4.0, self.stream_free[MAIN_STREAM] + 1.0)
        dur = max(1.5, nbytes / (25.0 * 1e3))  # 25 GB/s over PCIe
        label = "Memcpy HtoD (Pinned -> Device)" if kind == "HtoD" else "Memcpy DtoH (Device -> Pinned)"
        self.buffer.append(
            self.layout.complete(
                "gpu_memcpy",
                label,
                self.device,
                MAIN_STREAM,
                start,
                dur,
                f'"External id": {ext},      "device": {self.device}, "context": 1,'
                f'      "stream": {MAIN_STREAM}, "correlation": {corr},      "bytes": {nbytes},'
                f' "memory bandwidth (GB/s)": {nbytes / (dur * 1e3):.6f}',
            )
        )
        self.buffer.append(self.layout.flow("f", corr, self.device, MAIN_STREAM, start))
        self.stream_free[MAIN_STREAM] = start + dur
        self.cpu[tid] = ts + runtime_us
        return start + dur

    # -- operators -----------------------------------------------------------------------------------
    def _linear(self, tid: int, d_in: int, d_out: int) -> None:
        t = self.shape.tokens
        op = self._open(
            tid,
            "cpu_op",
            "aten::linear",
            f'"Input type": [{BF16}, {BF16}, {BF16}], '
            f'"Input Dims": {_dims([t, d_in], [d_out, d_in], [d_out])}',
            seq=True,
        )
        self._close(
            self._open(tid, "cpu_op", "aten::t", f'"Input type": [{BF16}], "Input Dims": [[{d_out}, {d_in}]]')
        )
        mm = self._open(
            tid,
            "cpu_op",
            "aten::addmm",
            f'"Input type": [{BF16}, {BF16}, {BF16}, "Scalar", "Scalar"], '
            f'"Input Dims": {_dims([d_out], [t, d_in], [d_in, d_out], [], [])}',
        )
        nbytes = t * d_out * 2
        self.saved.append((self._memory(tid, nbytes), nbytes))
        self._launch(tid, GEMM, 2.0 * t * d_in * d_out / (self.GEMM_TFLOPS * 1e6))
        self._close(mm)
        self._close(op)

    def _simple(self, tid: int, name: str, inner: str, kernel: Kernel, dims: str, gpu_us: float) -> None:
        op = self._open(tid, "cpu_op", name, f'"Input type": [{BF16}], "Input Dims": {dims}', seq=True)
        inner_op = (
            self._open(tid, "cpu_op", inner, f'"Input type": [{BF16}], "Input Dims": {dims}')
            if inner
            else None
        )
        nbytes = self.shape.tokens * self.shape.hidden * 2
        self.saved.append((self._memory(tid, nbytes), nbytes))
        self._launch(tid, kernel, gpu_us)
        if inner_op:
            self._close(inner_op)
        self._close(op)

    def _backward(self, tid: int, grad_fn: str, ops: Sequence[tuple[str, Kernel, float]]) -> None:
        outer = self._open(tid, "cpu_op", f"autograd::engine::evaluate_function: {grad_fn}", "", seq=True)
        node = self._open(tid, "cpu_op", grad_fn, "")
        for name, kernel, gpu_us in ops:
            op = self._open(tid, "cpu_op", name, "")
            grad_bytes = self.shape.tokens * self.shape.hidden * 2
            addr = self._memory(tid, grad_bytes)
            self._launch(tid, kernel, gpu_us)
            self._memory(tid, -grad_bytes, addr)
            self._close(op)
        if self.saved:
            addr, nbytes = self.saved.pop()
            self._memory(tid, -nbytes, addr)
        self._close(node)
        self._close(outer)

    def _allreduce(self, tid: int, numel: int) -> None:
        coll = (
            f'"Collective name": "allreduce", "In msg nelems": {numel}, "Out msg nelems": {numel}, '
            f'"Group size": {self.world}, "dtype": "BFloat16", '
            '"In split size": "[]", "Out split size": "[]", '
            f'"Process Group Name": "0", "Process Group Description": "default_pg", '
            f'"Process Group Ranks": "[{", ".join(str(r) for r in range(self.world))}]"'
        )
        if self.collective_seq is not None:  # recent PyTorch numbers each group's collectives
            coll += f', "Seq": {self.collective_seq}'
        self._close(self._open(tid, "cpu_op", "record_param_comms", coll))
        ann = self._open(tid, "user_annotation", "nccl:all_reduce", "")
        # The bucket is reduced once its gradients exist; a slow peer occasionally makes everyone wait.
        wait = self._jitter(300.0, 0.9) if self.rng.random() < 0.05 else 0.0
        bus_us = 2.0 * (self.world - 1) / self.world * numel * 2 / (self.NCCL_GBPS * 1e3)
        self._launch(
            tid,
            NCCL_ALLREDUCE,
            20.0 + bus_us + wait,
            NCCL_STREAM,
            ", " + coll,
            not_before=self.stream_free[MAIN_STREAM],
        )
        self._close(ann)

    # -- one training step ---------------------------------------------------------------------------
    def step(self, number: int) -> list[str]:
        """Render step ``number``; returns its events (the buffer is reset)."""
        self.buffer = []
        main, bwd = self.main_tid, self.bwd_tid
        s = self.shape
        h = s.hidden
        act = _dims([s.batch, s.seq, h])
        elem_us = s.tokens * h * 2 * 3 / (self.HBM_GBPS * 1e3)
        gpu_step_start = max(self.stream_free[MAIN_STREAM], self.cpu[main])

        step = self._open(main, "user_annotation", f"ProfilerStep#{number}", "")
        loader = self._open(
            main, "user_annotation", "enumerate(DataLoader)#_MultiProcessingDataLoaderIter.__next__", ""
        )
        # Mostly the batch is ready; sometimes the input pipeline stalls the step.
        self.cpu[main] += (
            self._jitter(25_000.0, 0.5) if self.rng.random() < 0.08 else self._jitter(150.0, 0.5)
        )
        self._close(loader)
        to = self._open(
            main, "cpu_op", "aten::to", f'"Input type": ["long"], "Input Dims": [[{s.batch}, {s.seq}]]'
        )
        self._memcpy(main, "HtoD", s.tokens * 8)
        self._close(to)
        zero = self._open(main, "user_annotation", "Optimizer.zero_grad#AdamW.zero_grad", "")
        self._close(zero)

        for _ in range(self.layers):
            self._simple(main, "aten::layer_norm", "aten::native_layer_norm", LAYER_NORM, act, elem_us)
            self._linear(main, h, 3 * h)
            self._simple(
                main,
                "aten::scaled_dot_product_attention",
                "aten::_scaled_dot_product_flash_attention",
                FLASH_FWD,
                act,
                4.0 * s.batch * s.seq * s.seq * h / (self.GEMM_TFLOPS * 0.6 * 1e6),
            )
            self._linear(main, h, h)
            self._simple(main, "aten::add", "", ADD, act, elem_us)
            self._simple(main, "aten::layer_norm", "aten::native_layer_norm", LAYER_NORM, act, elem_us)
            self._linear(main, h, 4 * h)
            self._simple(main, "aten::gelu", "", GELU, act, elem_us * 4)
            self._linear(main, 4 * h, h)
            self._simple(main, "aten::add", "", ADD, act, elem_us)

        # loss.backward(): the autograd thread starts once the forward has been queued.
        self.cpu[bwd] = self.cpu[main] + self._jitter(40.0)
        gemm = 2.0 * s.tokens * h * h / (self.GEMM_TFLOPS * 1e6)
        for layer in range(self.layers):
            for grad_fn, width in (("AddmmBackward0", 4), ("GeluBackward0", 0), ("AddmmBackward0", 4)):
                if width:
                    self._backward(bwd, grad_fn, [("aten::mm", GEMM_BWD, gemm * width)] * 2)
                else:
                    self._backward(bwd, grad_fn, [("aten::gelu_backward", GELU_BWD, elem_us * 8)])
            self._backward(
                bwd,
                "NativeLayerNormBackward0",
                [("aten::native_layer_norm_backward", LAYER_NORM_BWD, elem_us * 2)],
            )  # noqa: E501
            self._backward(bwd, "AddmmBackward0", [("aten::mm", GEMM_BWD, gemm)] * 2)
            self._backward(
                bwd,
                "ScaledDotProductFlashAttentionBackward0",
                [
                    (
                        "aten::_scaled_dot_product_flash_attention_backward",
                        FLASH_BWD,
                        10.0 * s.batch * s.seq * s.seq * h / (self.GEMM_TFLOPS * 0.5 * 1e6),
                    )
                ],
            )
            self._backward(bwd, "AddmmBackward0", [("aten::mm", GEMM_BWD, gemm * 3)] * 2)
            self._backward(
                bwd,
                "NativeLayerNormBackward0",
                [("aten::native_layer_norm_backward", LAYER_NORM_BWD, elem_us * 2)],
            )  # noqa: E501
            if layer % 2 == 1 or layer == self.layers - 1:
                self._allreduce(bwd, 2 * 12 * h * h)  # a 25 MB-ish DDP bucket: two layers of weights
        for addr, nbytes in reversed(self.saved):
            self._memory(bwd, -nbytes, addr)
        self.saved.clear()
        self.next_addr = 0x7F00_0000_0000

        # The main thread waits for backward, then steps the optimizer once all-reduce is done.
        self.cpu[main] = max(self.cpu[main], self.cpu[bwd]) + self._jitter(30.0)
        opt = self._open(main, "user_annotation", "Optimizer.step#AdamW.step", "")
        fused = self._open(
            main, "cpu_op", "aten::_fused_adamw_", '"Input type": ["TensorList", "TensorList"]'
        )
        comm_done = self.stream_free[NCCL_STREAM]
        for _ in range(max(1, self.layers // 2)):
            self._launch(main, FOREACH, self._jitter(180.0), not_before=comm_done)
        self._close(fused)
        self._close(opt)
        item = self._open(main, "cpu_op", "aten::item", '"Input type": ["float"], "Input Dims": [[]]')
        dense = self._open(
            main, "cpu_op", "aten::_local_scalar_dense", '"Input type": ["float"], "Input Dims": [[]]'
        )
        copy_end = self._memcpy(main, "DtoH", 4)
        sync = self.cpu[main] + 1.0
        sync_dur = max(2.0, copy_end - sync + 3.0)
        self.buffer.append(
            self.layout.complete(
                "cuda_runtime",
                "cudaStreamSynchronize",
                self.pid,
                main,
                sync,
                sync_dur,
                f'"External id": {self.external_id},      "cbid": 131, "correlation": {self.correlation + 1}',
            )
        )
        self.correlation += 1
        self.cpu[main] = sync + sync_dur
        self._close(dense)
        self._close(item)
        self._close(step)
        self.buffer.append(
            self.layout.complete(
                "gpu_user_annotation",
                f"ProfilerStep#{number}",
                self.device,
                MAIN_STREAM,
                gpu_step_start,
                self.stream_free[MAIN_STREAM] - gpu_step_start,
                f'"External id": {step[6]}',
            )
        )
        self.cpu[bwd] = self.cpu[main]
        return self.buffer

    # -- file framing ----------------------------------------------------------------------------------
    def header(self) -> str:
        devices = ",\n".join(
            f'    {{\n      "id": {i}, "name": "NVIDIA H100 80GB HBM3", "totalGlobalMem": 85045870592,\n'
            '      "computeMajor": 9, "computeMinor": 0,\n'
            '      "maxThreadsPerBlock": 1024, "maxThreadsPerMultiprocessor": 2048,\n'
            '      "regsPerBlock": 65536, "warpSize": 32,\n'
            '      "sharedMemPerBlock": 49152, "numSms": 132\n    }'
            for i in range(8)
        )
        ranks = ", ".join(str(r) for r in range(self.world))
        return (
            '{\n  "schemaVersion": 1,\n  "deviceProperties": [\n' + devices + "\n  ],\n"
            f'  "distributedInfo": {{"backend": "nccl", "rank": {self.rank}, "world_size": {self.world}, '
            f'"pg_count": 1, "pg_config": [{{"pg_name": "0", "pg_desc": "default_pg", "backend_config": '
            f'"cuda:nccl", "pg_size": {self.world}, "ranks": [{ranks}]}}], "nccl_version": "2.21.5"}},\n'
            '  "record_shapes": 1,\n  "profile_memory": 1,\n  "traceEvents": [\n'
        )

    def trailer(self, trace_name: str) -> tuple[list[str], str]:
        """Kineto's closing metadata events, and the text that closes the JSON document."""
        ts, end = self.start_ts, max(self.cpu[self.main_tid], *self.stream_free.values())
        meta = self.layout.metadata
        events = [
            meta("process_name", self.pid, 0, ts, '"name": "python3.11"'),
            meta("process_labels", self.pid, 0, ts, '"labels": "CPU"'),
            meta("process_name", self.device, 0, ts, '"name": "python3.11"'),
            meta("process_labels", self.device, 0, ts, f'"labels": "GPU {self.device}"'),
            meta(
                "thread_name", self.pid, self.main_tid, ts, f'"name": "thread {self.main_tid} (python3.11)"'
            ),
            meta("thread_name", self.pid, self.bwd_tid, ts, f'"name": "thread {self.bwd_tid} (python3.11)"'),
            meta("thread_name", self.device, MAIN_STREAM, ts, f'"name": "stream {MAIN_STREAM} "'),
            meta("thread_name", self.device, NCCL_STREAM, ts, f'"name": "stream {NCCL_STREAM} "'),
            # Kineto's own span: pid and tid are strings here, hence the pre-quoted values.
            self.layout.complete(
                "Trace",
                "PyTorch Profiler (0)",
                '"Spans"',
                '"PyTorch Profiler"',
                ts,
                end - ts,
                '"Op count": 0',
            ),
        ]
        closing = (
            f'  ],\n  "traceName": "{trace_name}",\n  "displayTimeUnit": "ms",\n'
            '  "baseTimeNanoseconds": 1700000000000000000\n}\n'
        )
        return events, closing


def generate(
    out: Path,
    size_mb: float,
    seed: int = 0,
    layout: str = "classic",
    layers: int = 8,
    rank: int = 0,
    world: int = 8,
) -> tuple[int, int]:
    """Write the trace; returns (bytes written, steps)."""
    sim = TraceSimulator(LAYOUTS[layout], seed, layers, Shape(), rank, world)
    target = int(size_mb * MIB)
    written = 0
    steps = 0
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("w", encoding="ascii", newline="\n") as handle:
        written += _write(handle, sim.header())
        first = True
        while steps == 0 or written < target:
            events = sim.step(steps + 1)
            text = ",\n".join(events)
            written += _write(handle, text if first else ",\n" + text)
            first = False
            steps += 1
        events, closing = sim.trailer(out.name)
        written += _write(handle, ",\n" + ",\n".join(events) + "\n" + closing)
    return written, steps


def _write(handle: TextIO, text: str) -> int:
    handle.write(text)
    return len(text)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="Write a large synthetic Kineto trace (see module docstring)."
    )
    parser.add_argument("--out", type=Path, required=True, help="output .json path (uncompressed)")
    parser.add_argument(
        "--size-mb", type=float, default=1024.0, help="stop after the step that passes this size"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--layout", choices=sorted(LAYOUTS), default="classic")
    parser.add_argument("--layers", type=int, default=8, help="transformer layers simulated per step")
    parser.add_argument("--rank", type=int, default=0)
    parser.add_argument("--world-size", type=int, default=8)
    args = parser.parse_args(argv)
    started = time.perf_counter()
    written, steps = generate(
        args.out, args.size_mb, args.seed, args.layout, args.layers, args.rank, args.world_size
    )
    print(
        f"wrote {args.out} ({written / MIB:.1f} MiB, {steps} steps, layout {args.layout}) "
        f"in {time.perf_counter() - started:.1f} s"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
