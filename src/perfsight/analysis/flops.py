"""Floating-point work of operators, achieved FLOPS per step and MFU.

Kineto never writes ``with_flops`` numbers to its JSON, so FLOPs are computed here
from each recognised operator's input shapes (``Trace.slices.input_dims``).
Formulas are evaluated once per unique (operator name, input shapes) pair, then
broadcast back to rows with Arrow, so the cost does not grow with the number of
calls.  Totals count only the *outermost* recognised operator of a nesting chain
on a thread (``aten::linear`` -> ``aten::addmm`` is counted once, as the linear).

Formulas (multiply-add = 2 FLOPs; shapes as PyTorch records them):

* ``mm``/``addmm`` ``[m,k] x [k,n]``: ``2mkn``; ``bmm``/``baddbmm``: ``2bmkn``;
  ``matmul``: ``2 * prod(broadcast batch) * m * k * n`` (1-D operands count as 1 row/column).
* ``linear`` ``x [..., in]``, ``w [out, in]``: ``2 * prod(x[:-1]) * in * out``.
* convolutions ``x [N, Cin, *S]``, ``w [Cout, Cin/groups, *K]``:
  ``2 * N * prod(out spatial) * Cout * (Cin/groups) * prod(K)``, the output size from the
  stride, padding and dilation the trace records as the call's ``Concrete Inputs``
  (``floor((S + 2P - D(K - 1) - 1) / stride) + 1``, as PyTorch computes it).  A transposed
  convolution (``w [Cin, Cout/groups, *K]``) does that work at every *input* position:
  ``2 * N * prod(S) * Cin * (Cout/groups) * prod(K)``, as ``torch.utils.flop_counter`` counts
  it.  ``convolution_backward`` reads the output size from ``grad_output`` and counts the
  forward once for each gradient its ``output_mask`` asks (input, weight; twice when the mask
  is not recorded).  A trace without ``Concrete Inputs`` (PyTorch before 2.1, or recorded
  without shapes) gets the old approximation: stride 1, no padding, dilation 1
  (``S - K + 1``; ``S`` where that is < 1), transposed counted as ordinary.  A ``conv2d``
  whose padding was a string (``"same"``) records no padding: it gets no count, and the
  ``aten::convolution`` inside it, which records the padding in numbers, counts instead.
* scaled dot-product attention ``q [B, H, Sq, D]``, ``k [B, H, Sk, D]``, ``v [..., Dv]``:
  ``2*B*H*Sq*Sk*D + 2*B*H*Sq*Sk*Dv`` (= ``4*B*H*Sq*Sk*D``), causal masks ignored;
  ``_flash_attention_*``/``_efficient_attention_*`` use the ``[B, S, H, D]`` layout;
  backward variants count 2.5x the forward.

A record whose shapes do not fit the formula (inner dimensions that disagree, fewer
inputs than needed, or more inputs than the operator's schema has: some Kineto
versions append other calls' shapes) gets no count, so its inner ops count instead.

MFU = achieved FLOPs/s in a step / the device's dense peak for the step's dominant
dtype class (``fp16_bf16`` when the recognised ops doing most FLOPs take Half or
BFloat16 inputs, else ``fp32``).  Peaks: :data:`PEAK_FLOPS`, documented in
``docs/FLOPS.md``.

This module must not read files, and must not guess a device: no device in
``trace.meta.devices`` (a CPU-only trace) or an unknown one gives a null peak and MFU.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import re
from collections.abc import Callable, Sequence
from typing import TypeVar

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.compute as pc

from perfsight import columns
from perfsight.analysis.hierarchy import outermost
from perfsight.analysis.index import index_of
from perfsight.jsontext import json_text
from perfsight.model import NO_ID, RunMetadata, Trace
from perfsight.units import ns_to_s

T = TypeVar("T")

Shapes = Sequence[Sequence[int]]

# ---------------------------------------------------------------------------------------------
# Peak throughput, dense (no 2:4 sparsity), FLOP/s.  Patterns are regular expressions searched
# case-insensitively in the device name; the first match wins, so specific variants come first.
# Classes: "fp32" (non-tensor FP32; on AMD the FP32 matrix peak, which rocBLAS SGEMM uses),
# "tf32" (TF32 tensor cores; GPUs without TF32 repeat their FP32 peak), "fp16_bf16" (FP16/BF16
# tensor cores, FP32 accumulate; GPUs without BF16 give their FP16 peak).
# Sources (vendor datasheets halve the "with sparsity" figures to get dense):
#   H100 SXM5 / PCIe: NVIDIA H100 Tensor Core GPU Architecture whitepaper (2022), Table 3.
#   H100 NVL, H200 SXM / NVL: NVIDIA H100 and H200 datasheets (nvidia.com/en-us/data-center/h100, /h200).
#   A100 (SXM4 and PCIe, 40/80 GB): NVIDIA A100 datasheet (nvidia-a100-datasheet-us-nvidia-1758950-r4).
#   V100 SXM2 / PCIe / V100S: NVIDIA V100 datasheet (tesla-v100-datasheet-letter-fnl-web, Jan 2020).
#   A10: NVIDIA A10 datasheet.  A10G (AWS-only, no NVIDIA datasheet): Baseten, "NVIDIA A10 vs A10G
#   for ML model inference" (baseten.co/blog/nvidia-a10-vs-a10g-for-ml-model-inference).
#   L4: NVIDIA L4 datasheet.  L40S: NVIDIA L40S datasheet.  T4: NVIDIA T4 datasheet.
#   MI250X / MI250: AMD Instinct MI250X / MI250 product pages (amd.com/en/products/accelerators).
#   MI300X: AMD Instinct MI300X data sheet.
# ---------------------------------------------------------------------------------------------
_T = 1e12
PEAK_FLOPS: dict[str, dict[str, float]] = {
    r"H100.*PCIe": {"fp32": 51.2 * _T, "tf32": 378.0 * _T, "fp16_bf16": 756.0 * _T},
    r"H100.*NVL": {"fp32": 60.0 * _T, "tf32": 417.5 * _T, "fp16_bf16": 835.5 * _T},
    r"H100": {"fp32": 66.9 * _T, "tf32": 494.7 * _T, "fp16_bf16": 989.4 * _T},  # SXM5
    r"H200.*NVL": {"fp32": 60.0 * _T, "tf32": 417.5 * _T, "fp16_bf16": 835.5 * _T},
    r"H200": {"fp32": 67.0 * _T, "tf32": 494.5 * _T, "fp16_bf16": 989.5 * _T},  # SXM
    r"A100": {"fp32": 19.5 * _T, "tf32": 156.0 * _T, "fp16_bf16": 312.0 * _T},  # SXM4 = PCIe
    r"A10G": {"fp32": 35.0 * _T, "tf32": 35.0 * _T, "fp16_bf16": 70.0 * _T},
    r"\bA10\b": {"fp32": 31.2 * _T, "tf32": 62.5 * _T, "fp16_bf16": 125.0 * _T},
    r"L40S": {"fp32": 91.6 * _T, "tf32": 183.0 * _T, "fp16_bf16": 362.05 * _T},
    r"\bL4\b": {"fp32": 30.3 * _T, "tf32": 60.0 * _T, "fp16_bf16": 121.0 * _T},
    r"V100S": {"fp32": 16.4 * _T, "tf32": 16.4 * _T, "fp16_bf16": 130.0 * _T},
    r"V100.*PCI": {"fp32": 14.0 * _T, "tf32": 14.0 * _T, "fp16_bf16": 112.0 * _T},
    r"V100": {"fp32": 15.7 * _T, "tf32": 15.7 * _T, "fp16_bf16": 125.0 * _T},  # SXM2
    r"\bT4\b": {"fp32": 8.1 * _T, "tf32": 8.1 * _T, "fp16_bf16": 65.0 * _T},
    r"MI300X": {"fp32": 163.4 * _T, "tf32": 653.7 * _T, "fp16_bf16": 1307.4 * _T},
    # MI250(X): one OAM card is two GCDs and PyTorch sees each GCD as a device: half the card's peak.
    r"MI250X": {"fp32": 47.85 * _T, "tf32": 47.85 * _T, "fp16_bf16": 191.5 * _T},
    r"MI250": {"fp32": 45.25 * _T, "tf32": 45.25 * _T, "fp16_bf16": 181.05 * _T},
}
"""Dense peak FLOP/s per dtype class, by device-name pattern (first match wins)."""

_AMD_BY_COMPUTE_UNITS = {104: "AMD Instinct MI250", 110: "AMD Instinct MI250X", 304: "AMD Instinct MI300X"}
"""ROCm builds may name every Instinct part "AMD Radeon Graphics"; its compute-unit count
(``numSms`` in Kineto's deviceProperties) tells the data-centre parts apart."""

DTYPE_CLASSES = ("fp32", "tf32", "fp16_bf16")

_HALF_TYPES = frozenset({"c10::Half", "c10::BFloat16", "Half", "BFloat16", "half", "bfloat16", "float16"})


def peak_flops_per_s(device_name: str | None, dtype_class: str = "fp32") -> float | None:
    """Dense peak FLOP/s of ``device_name`` for ``dtype_class``; None if the device is unknown."""
    if not device_name:
        return None
    for pattern, peaks in PEAK_FLOPS.items():
        if re.search(pattern, device_name, flags=re.IGNORECASE):
            return peaks.get(dtype_class)
    return None


# --------------------------------------------------------------------------- formulas


def _prod(values: Sequence[int]) -> int:
    return math.prod(int(v) for v in values)


def _shape(dims: Shapes, i: int) -> list[int] | None:
    if i >= len(dims) or not isinstance(dims[i], list | tuple) or not dims[i]:
        return None
    return [int(v) for v in dims[i]]


def _mm(a: list[int] | None, b: list[int] | None) -> float | None:
    if a is None or b is None or len(a) != 2 or len(b) != 2 or a[1] != b[0]:
        return None
    return 2.0 * a[0] * a[1] * b[1]


def _bmm(a: list[int] | None, b: list[int] | None) -> float | None:
    if a is None or b is None or len(a) != 3 or len(b) != 3 or a[2] != b[1]:
        return None
    return 2.0 * a[0] * a[1] * a[2] * b[2]


def _matmul(a: list[int] | None, b: list[int] | None) -> float | None:
    if a is None or b is None:
        return None
    m, k = (1, a[0]) if len(a) == 1 else (a[-2], a[-1])
    k2, n = (b[0], 1) if len(b) == 1 else (b[-2], b[-1])
    if k != k2:
        return None
    batch_a, batch_b = a[:-2], b[:-2]
    width = max(len(batch_a), len(batch_b))
    batch_a = [1] * (width - len(batch_a)) + batch_a
    batch_b = [1] * (width - len(batch_b)) + batch_b
    batch = _prod(max(x, y) for x, y in zip(batch_a, batch_b, strict=True))
    return 2.0 * batch * m * k * n


def _linear(dims: Shapes) -> float | None:
    x, w = _shape(dims, 0), _shape(dims, 1)
    if x is None or w is None or w[-1] != x[-1] or len(w) > 2:
        return None
    out = w[0] if len(w) == 2 else 1
    return 2.0 * _prod(x[:-1]) * x[-1] * out


def _batch_and_spatial(x: list[int] | None, n_spatial: int) -> tuple[int, list[int]] | None:
    """A convolution input's batch size and spatial sizes (an unbatched input has batch 1)."""
    if x is None:
        return None
    if len(x) == n_spatial + 2:
        return x[0], x[2:]
    if len(x) == n_spatial + 1:
        return 1, x[1:]
    return None


def _conv_work(batch: int, positions: Sequence[int], w: list[int]) -> float:
    """Multiply-adds of a weight ``[C, C'/groups, *K]`` applied at ``positions`` per sample."""
    return 2.0 * batch * _prod(positions) * w[0] * w[1] * _prod(w[2:])


@dataclasses.dataclass(frozen=True)
class _ConvGeometry:
    """A convolution's recorded stride, padding and dilation (one value per spatial dimension,
    or one for all), and whether it is transposed."""

    stride: list[int]
    padding: list[int]
    dilation: list[int]
    transposed: bool

    def output_size(self, spatial: list[int], kernel: list[int]) -> list[int] | None:
        n = len(spatial)
        stride, padding, dilation = (_per_dim(v, n) for v in (self.stride, self.padding, self.dilation))
        if stride is None or padding is None or dilation is None or min(stride) < 1:
            return None
        out = [
            (s + 2 * p - d * (k - 1) - 1) // st + 1
            for s, k, st, p, d in zip(spatial, kernel, stride, padding, dilation, strict=True)
        ]
        return out if min(out) >= 1 else None


def _per_dim(values: list[int], n: int) -> list[int] | None:
    if len(values) == n:
        return values
    return values * n if len(values) == 1 else None


def _conv_forward(x: list[int] | None, w: list[int] | None, geometry: _ConvGeometry | None) -> float | None:
    """A convolution's FLOPs; without ``geometry``, stride 1, no padding, dilation 1."""
    if w is None or len(w) < 3:
        return None
    shape = _batch_and_spatial(x, len(w) - 2)
    if shape is None:
        return None
    batch, spatial = shape
    kernel = w[2:]
    if geometry is None:
        positions = [s - k + 1 if s - k + 1 >= 1 else s for s, k in zip(spatial, kernel, strict=True)]
    elif geometry.transposed:  # each input position is scattered over the kernel
        positions = spatial
    else:
        positions = geometry.output_size(spatial, kernel)
        if positions is None:
            return None
    return _conv_work(batch, positions, w)


def _conv_backward(dims: Shapes, geometry: _ConvGeometry | None, mask: object) -> float | None:
    """Gradients of a convolution: the forward's work once per gradient asked (input, weight),
    the forward's positions read from ``grad_output`` (or from the input, when transposed)."""
    grad_out, x, w = _shape(dims, 0), _shape(dims, 1), _shape(dims, 2)
    if grad_out is None or w is None or len(w) < 3:
        return None
    shape = _batch_and_spatial(x, len(w) - 2)
    if shape is None:
        return None
    batch, spatial = shape
    positions = spatial if geometry is not None and geometry.transposed else grad_out[-(len(w) - 2) :]
    gradients = sum(bool(m) for m in mask[:2]) if isinstance(mask, list) and len(mask) == 3 else 2
    return gradients * _conv_work(batch, positions, w)


def _scalar(text: object) -> int | bool | list[int | bool] | None:
    """One ``Concrete Inputs`` value: ``"[2, 2]"``, ``"1"``, ``"False"``, ``"[True, False]"``;
    None for a tensor's ``""`` or anything else (a string argument such as ``"same"``, a null)."""
    if not isinstance(text, str):
        return None
    text = text.strip()
    if text in ("True", "False"):
        return text == "True"
    if text.startswith("[") and text.endswith("]"):
        items = [_scalar(item) for item in text[1:-1].split(",")] if text[1:-1].strip() else []
        if any(item is None or isinstance(item, list) for item in items):
            return None
        return items  # type: ignore[return-value]
    try:
        return int(text)
    except ValueError:
        return None


def _ints(value: object) -> list[int] | None:
    if isinstance(value, list) and value and all(type(v) is int for v in value):
        return value
    return None


_CONV_ARGUMENTS: dict[str, tuple[int, int, int, int | bool]] = {
    # name: positions of stride, padding and dilation, and of transposed (or whether it is)
    "aten::conv1d": (3, 4, 5, False),
    "aten::conv2d": (3, 4, 5, False),
    "aten::conv3d": (3, 4, 5, False),
    "aten::conv_transpose1d": (3, 4, 7, True),
    "aten::conv_transpose2d": (3, 4, 7, True),
    "aten::conv_transpose3d": (3, 4, 7, True),
    "aten::convolution": (3, 4, 5, 6),
    "aten::_convolution": (3, 4, 5, 6),
    "aten::convolution_backward": (4, 5, 6, 7),
}
"""Where each convolution's ATen schema puts the arguments its output size depends on."""

_BACKWARD_OUTPUT_MASK = 10
"""``convolution_backward``'s ``output_mask``: which of input, weight and bias gradients it computes."""


def _geometry(name: str, scalars: Sequence[str]) -> _ConvGeometry | None:
    stride_at, padding_at, dilation_at, transposed_at = _CONV_ARGUMENTS[name]
    values = [_scalar(s) for s in scalars]
    read = [stride_at, padding_at, dilation_at, *([] if isinstance(transposed_at, bool) else [transposed_at])]
    if max(read) >= len(values):
        return None
    stride, padding, dilation = (_ints(values[i]) for i in (stride_at, padding_at, dilation_at))
    transposed = transposed_at if isinstance(transposed_at, bool) else values[transposed_at]
    if stride is None or padding is None or dilation is None or not isinstance(transposed, bool):
        return None
    return _ConvGeometry(stride, padding, dilation, transposed)


def _convolution(name: str, dims: Shapes, scalars: Sequence[str] | None) -> float | None:
    """A convolution call's FLOPs: exact from its ``Concrete Inputs``; the stride-1 approximation
    when the trace has none; None when they are there but unusable (the inner ops count)."""
    geometry = None if scalars is None else _geometry(name, scalars)
    if scalars is not None and geometry is None:
        return None
    if name == "aten::convolution_backward":
        recorded = scalars is not None and len(scalars) > _BACKWARD_OUTPUT_MASK
        return _conv_backward(dims, geometry, _scalar(scalars[_BACKWARD_OUTPUT_MASK]) if recorded else None)
    return _conv_forward(_shape(dims, 0), _shape(dims, 1), geometry)


def _attention(q: list[int] | None, k: list[int] | None, v: list[int] | None, layout: str) -> float | None:
    if q is None or k is None or v is None or len(q) < 3 or len(k) < 3:
        return None
    if layout == "bhsd":
        heads, s_q, d, s_k = _prod(q[:-2]), q[-2], q[-1], k[-2]
    else:  # "bshd": [B, S, H, D]; a 3-D [total, H, D] is variable-length packing and not countable
        if len(q) != 4 or len(k) != 4:
            return None
        heads, s_q, d, s_k = q[0] * q[2], q[1], q[3], k[1]
    return 2.0 * heads * s_q * s_k * d + 2.0 * heads * s_q * s_k * v[-1]


def _sdpa(layout: str, backward: bool) -> Callable[[Shapes], float | None]:
    first = 1 if backward else 0  # backward ops take grad_out first

    def formula(dims: Shapes) -> float | None:
        fwd = _attention(_shape(dims, first), _shape(dims, first + 1), _shape(dims, first + 2), layout)
        return None if fwd is None else (2.5 * fwd if backward else fwd)

    return formula


_SHAPE_FORMULAS: dict[str, Callable[[Shapes], float | None]] = {
    "aten::mm": lambda d: _mm(_shape(d, 0), _shape(d, 1)),
    "aten::addmm": lambda d: _mm(_shape(d, 1), _shape(d, 2)),
    "aten::bmm": lambda d: _bmm(_shape(d, 0), _shape(d, 1)),
    "aten::baddbmm": lambda d: _bmm(_shape(d, 1), _shape(d, 2)),
    "aten::matmul": lambda d: _matmul(_shape(d, 0), _shape(d, 1)),
    "aten::linear": _linear,
    "aten::scaled_dot_product_attention": _sdpa("bhsd", False),
    "aten::_scaled_dot_product_attention_math": _sdpa("bhsd", False),
    "aten::_scaled_dot_product_flash_attention": _sdpa("bhsd", False),
    "aten::_scaled_dot_product_flash_attention_for_cpu": _sdpa("bhsd", False),
    "aten::_scaled_dot_product_efficient_attention": _sdpa("bhsd", False),
    "aten::_scaled_dot_product_cudnn_attention": _sdpa("bhsd", False),
    "aten::_scaled_dot_product_fused_attention_overrideable": _sdpa("bhsd", False),
    "aten::_flash_attention_forward": _sdpa("bshd", False),
    "aten::_efficient_attention_forward": _sdpa("bshd", False),
    "aten::_scaled_dot_product_flash_attention_backward": _sdpa("bhsd", True),
    "aten::_scaled_dot_product_flash_attention_for_cpu_backward": _sdpa("bhsd", True),
    "aten::_scaled_dot_product_efficient_attention_backward": _sdpa("bhsd", True),
    "aten::_scaled_dot_product_cudnn_attention_backward": _sdpa("bhsd", True),
    "aten::_scaled_dot_product_fused_attention_overrideable_backward": _sdpa("bhsd", True),
    "aten::_flash_attention_backward": _sdpa("bshd", True),
    "aten::_efficient_attention_backward": _sdpa("bshd", True),
}
"""The operators whose FLOPs follow from their recorded input shapes alone."""

Formula = Callable[[Shapes, Sequence[str] | None], float | None]


def _shapes_only(formula: Callable[[Shapes], float | None]) -> Formula:
    return lambda dims, _scalars: formula(dims)


FLOP_FORMULAS: dict[str, Formula] = {
    **{name: _shapes_only(formula) for name, formula in _SHAPE_FORMULAS.items()},
    **{name: functools.partial(_convolution, name) for name in _CONV_ARGUMENTS},
}
"""Recognised operators and their FLOPs formula over the recorded input shapes and, for the
convolutions, the recorded scalar arguments."""


_MAX_INPUTS = {
    "aten::mm": 2,
    "aten::addmm": 5,
    "aten::bmm": 2,
    "aten::baddbmm": 5,
    "aten::matmul": 2,
    "aten::linear": 3,
    "aten::conv1d": 7,
    "aten::conv2d": 7,
    "aten::conv3d": 7,
    "aten::convolution": 9,
    "aten::_convolution": 13,
    "aten::convolution_backward": 11,
    "aten::conv_transpose1d": 8,
    "aten::conv_transpose2d": 8,
    "aten::conv_transpose3d": 8,
}
"""Arguments in each operator's ATen schema.  Some Kineto versions record more shapes than
the operator takes (other calls' shapes appended); such a record is not trusted."""


def flops_of(name: str, dims: Shapes | None, scalars: Sequence[str] | None = None) -> float | None:
    """FLOPs of one call of ``name`` with input shapes ``dims`` and, for a convolution, the
    recorded scalar arguments ``scalars`` (Kineto's ``Concrete Inputs``); None if unrecognised or
    malformed."""
    formula = FLOP_FORMULAS.get(name)
    most = _MAX_INPUTS.get(name, len(dims or ()))
    if formula is None or dims is None or len(dims) > most or (scalars is not None and len(scalars) > most):
        return None
    try:
        value = formula(dims, scalars)
    except (TypeError, ValueError, IndexError):
        return None
    return value if value is not None and value >= 0 else None


# --------------------------------------------------------------------------- per row


def _per_unique(keys: pa.Array, fn: Callable[[str], T]) -> tuple[list[T], np.ndarray]:
    """``fn`` of every distinct string of ``keys`` (called once each), and each row's position in
    that list (``-1`` for a null key)."""
    encoded = pc.dictionary_encode(keys)
    values = [fn(k) for k in encoded.dictionary.to_pylist()]
    return values, columns.int64(encoded.indices, -1)


_SEP = "\x1f"


def _call_flops(key: str) -> float:
    name, _, rest = key.partition(_SEP)
    dims, _, scalars = rest.partition(_SEP)
    try:
        value = flops_of(name, orjson.loads(dims), orjson.loads(scalars))
    except orjson.JSONDecodeError:
        return np.nan
    return np.nan if value is None else value


def recognised_mask(trace: Trace) -> np.ndarray:
    """Host operator rows whose name has a FLOPs formula (shapes may still be missing)."""
    ix = index_of(trace)
    known = pa.array(list(FLOP_FORMULAS), pa.string())
    return ix.name_mask(lambda names: pc.is_in(names, value_set=known), "flop formula") & ix.host_op


def row_flops(trace: Trace) -> np.ndarray:
    """FLOPs of every row's own work (NaN where unknown or not a recognised host operator).

    Each op carries its own count here, so nested recognised ops (``linear`` and its
    ``addmm``) both have one; sum :func:`op_flops` for totals.  Computed once per trace.
    """
    return index_of(trace).derived("row_flops", lambda: _row_flops(trace))


def _row_flops(trace: Trace) -> np.ndarray:
    slices = trace.slices
    out = np.full(slices.num_rows, np.nan)
    rows = np.flatnonzero(recognised_mask(trace))
    if not len(rows):
        return out
    sub = slices.select(["name", "input_dims", "concrete_inputs"]).take(pa.array(rows))
    dims = json_text(sub.column("input_dims"))
    scalars = pc.fill_null(json_text(sub.column("concrete_inputs")), "null")  # only convolutions have them
    name_text = columns.decoded(columns.combined(sub.column("name")))
    keys = pc.binary_join_element_wise(name_text, dims, scalars, _SEP)
    values, at = _per_unique(keys, _call_flops)
    out[rows] = np.append(np.asarray(values, dtype=np.float64), np.nan)[at]
    return out


def _is_half(types_text: str) -> bool:
    try:
        types = orjson.loads(types_text)
    except orjson.JSONDecodeError:
        return False
    return any(t in _HALF_TYPES for t in types if isinstance(t, str))


def half_precision(trace: Trace, rows: np.ndarray) -> np.ndarray:
    """For each of ``rows``: does it have a Half/BFloat16 input (the ``fp16_bf16`` dtype class)?"""
    if not len(rows):
        return np.zeros(0, dtype=bool)
    text = json_text(trace.slices.column("input_types").take(pa.array(rows)))
    values, at = _per_unique(text, _is_half)
    return np.append(np.asarray(values, dtype=bool), False)[at]


def _flops_rows(trace: Trace) -> tuple[np.ndarray, np.ndarray]:
    """(rows, flops) of the outermost recognised operators with a known count."""
    own = row_flops(trace)
    known = ~np.isnan(own)
    rows = np.flatnonzero(outermost(index_of(trace), known))
    return rows, own[rows]


OP_FLOPS_SCHEMA = pa.schema([("rank", pa.int32()), ("slice", pa.int64()), ("flops", pa.float64())])


def op_flops(trace: Trace) -> pa.Table:
    """FLOPs of each outermost recognised operator call: rank, slice (row index), flops.

    An operator counts when it is recognised, its shapes give a count, and no other
    such operator on the same thread encloses it, so the column sums without double
    counting.
    """
    rows, flops = _flops_rows(trace)
    rank = trace.slices.column("rank").take(pa.array(rows)) if len(rows) else pa.array([], pa.int32())
    columns = {"rank": rank, "slice": pa.array(rows, pa.int64()), "flops": flops}
    return pa.table(columns, schema=OP_FLOPS_SCHEMA)


# --------------------------------------------------------------------------- per step


def device_name(meta: RunMetadata, tracks: pa.Table) -> str | None:
    """Name of the accelerator this trace's device streams ran on (None if the trace has none)."""
    if not meta.devices:
        return None
    by_index = {d.index: d for d in meta.devices}
    device = meta.devices[0]
    if tracks.num_rows:
        on_device = tracks.filter(tracks.column("is_device"))
        indices = [i for i in on_device.column("device_index").to_pylist() if i in by_index]
        if indices:
            device = by_index[max(set(indices), key=indices.count)]
    name = device.name
    known = any(re.search(p, name or "", flags=re.IGNORECASE) for p in PEAK_FLOPS)
    if not known and (name or "").upper().startswith("AMD") and device.sm_count in _AMD_BY_COMPUTE_UNITS:
        return f"{_AMD_BY_COMPUTE_UNITS[device.sm_count]} ({name}, {device.sm_count} CUs)"
    return name


FLOPS_BY_STEP_SCHEMA = pa.schema(
    [
        ("rank", pa.int32()),
        ("step", pa.int32()),
        ("flops", pa.float64()),
        ("step_ns", pa.int64()),
        ("flops_per_s", pa.float64()),
        ("peak_flops_per_s", pa.float64()),
        ("mfu", pa.float64()),
    ]
)


def flops_by_step(trace: Trace, float32_peak: str = "fp32") -> pa.Table:
    """Achieved FLOPs and MFU per step: rank, step, flops, step_ns, flops_per_s, peak_flops_per_s, mfu.

    ``step_ns`` is the host step window (``steps.end_ns - start_ns``); FLOPs are those of
    the outermost recognised ops whose ``step`` is that step.  A trace without steps
    gets one row, step ``NO_ID``, spanning all its slices.  ``float32_peak`` picks the
    peak used for FP32 work: ``"fp32"`` (default, PyTorch's default for matmul) or
    ``"tf32"`` (when ``torch.backends.cuda.matmul.allow_tf32`` is on).
    """
    if float32_peak not in ("fp32", "tf32"):
        raise ValueError(f"float32_peak must be 'fp32' or 'tf32', not {float32_peak!r}")
    slices = trace.slices
    steps = trace.steps
    ix = index_of(trace)
    if steps.num_rows:
        step_ids = columns.int64(steps.column("step"))
        step_ns = columns.int64(steps.column("end_ns")) - columns.int64(steps.column("start_ns"))
        ranks = columns.numpy(steps.column("rank")).astype(np.int32)
    elif slices.num_rows:
        step_ids = np.array([NO_ID], np.int64)
        step_ns = np.array([int(ix.end.max() - ix.start.min())], np.int64)
        ranks = np.array([trace.rank], np.int32)
    else:
        return FLOPS_BY_STEP_SCHEMA.empty_table()

    rows, flops = _flops_rows(trace)
    row_step = ix.step[rows]
    half = half_precision(trace, rows)
    order = np.argsort(step_ids, kind="stable")
    slot = np.searchsorted(step_ids[order], row_step)
    slot_c = np.minimum(slot, len(step_ids) - 1)
    hit = step_ids[order][slot_c] == row_step
    target = order[slot_c[hit]]
    total = np.zeros(len(step_ids))
    half_total = np.zeros(len(step_ids))
    np.add.at(total, target, flops[hit])
    np.add.at(half_total, target, np.where(half[hit], flops[hit], 0.0))
    # a step whose recognised ops all lack shapes has unknown FLOPs, not zero
    counted = np.zeros(len(step_ids), np.int64)
    np.add.at(counted, target, 1)
    rec_step = ix.step[recognised_mask(trace)]
    rec_slot = np.minimum(np.searchsorted(step_ids[order], rec_step), len(step_ids) - 1)
    rec_hit = step_ids[order][rec_slot] == rec_step
    seen = np.zeros(len(step_ids), np.int64)
    np.add.at(seen, order[rec_slot[rec_hit]], 1)
    unknown = (counted == 0) & (seen > 0)
    total = np.where(unknown, np.nan, total)

    name = device_name(trace.meta, trace.tracks)
    peak_half = peak_flops_per_s(name, "fp16_bf16")
    peak_float = peak_flops_per_s(name, float32_peak)
    dominant_half = half_total * 2 > np.nan_to_num(total)  # the class doing most of the step's FLOPs
    nan = np.nan
    peak_arr = np.where(
        dominant_half,
        nan if peak_half is None else peak_half,
        nan if peak_float is None else peak_float,
    ).astype(np.float64)
    seconds = ns_to_s(step_ns)
    with np.errstate(divide="ignore", invalid="ignore"):
        per_s = np.where(step_ns > 0, total / seconds, np.nan)
        mfu = per_s / peak_arr
    return pa.table(
        {
            "rank": pa.array(ranks, pa.int32()),
            "step": pa.array(step_ids, pa.int32()),
            "flops": pa.array(total, pa.float64(), from_pandas=True),
            "step_ns": step_ns,
            "flops_per_s": pa.array(per_s, pa.float64(), from_pandas=True),
            "peak_flops_per_s": pa.array(peak_arr, pa.float64(), from_pandas=True),
            "mfu": pa.array(mfu, pa.float64(), from_pandas=True),
        },
        schema=FLOPS_BY_STEP_SCHEMA,
    )
