"""FLOPs from recorded shapes, outermost-only counting, the peak table and MFU.

Formulas are checked against numbers worked out by hand and against PyTorch's own
FLOP counter (``torch.utils.flop_counter``, an implementation independent of ours);
real traces are checked against a sum over their innermost GEMM calls.
"""

from __future__ import annotations

import dataclasses

import pyarrow.compute as pc
import pytest

from _trace_builder import make_trace
from conftest import kineto_file, raw_events
from perfsight.analysis.flops import (
    FLOP_FORMULAS,
    PEAK_FLOPS,
    device_name,
    flops_by_step,
    flops_of,
    op_flops,
    peak_flops_per_s,
)
from perfsight.ingest import read_trace
from perfsight.model import CONCRETE_INPUT_OPS, DeviceInfo, Trace

flop_counter = pytest.importorskip("torch.utils.flop_counter")


def test_mm_is_two_m_k_n() -> None:
    assert flops_of("aten::mm", [[64, 128], [128, 32]]) == 2 * 64 * 128 * 32


@pytest.mark.parametrize(
    ("name", "dims", "expected"),
    [
        ("aten::addmm", [[32], [64, 128], [128, 32], [], []], flop_counter.mm_flop([64, 128], [128, 32])),
        ("aten::bmm", [[4, 64, 128], [4, 128, 32]], flop_counter.bmm_flop([4, 64, 128], [4, 128, 32])),
        (
            "aten::baddbmm",
            [[4, 64, 32], [4, 64, 128], [4, 128, 32], [], []],
            flop_counter.bmm_flop([4, 64, 128], [4, 128, 32]),
        ),
        ("aten::matmul", [[4, 64, 128], [128, 32]], 2 * 4 * 64 * 128 * 32),
        ("aten::matmul", [[2, 1, 64, 128], [3, 128, 32]], 2 * 6 * 64 * 128 * 32),  # broadcast batch
        ("aten::matmul", [[128], [128, 32]], 2 * 128 * 32),  # vector @ matrix
        ("aten::linear", [[8, 16, 128], [64, 128], [64]], 2 * 8 * 16 * 128 * 64),
        ("aten::linear", [[8, 128], [64, 128], []], flop_counter.mm_flop([8, 128], [128, 64])),
    ],
)
def test_matrix_products_match_pytorch_counts(name: str, dims: list, expected: int) -> None:
    assert flops_of(name, dims) == expected


def test_convolution_assumes_stride_one_without_padding() -> None:
    """Traces without ``Concrete Inputs`` (PyTorch before 2.1) keep the old approximation."""
    x, w = [2, 3, 32, 32], [16, 3, 3, 3]
    expected = flop_counter.conv_flop_count(x, w, [2, 16, 30, 30])  # 30 = 32 - 3 + 1
    assert expected == 2 * 2 * 30 * 30 * 16 * 3 * 9
    for name in ("aten::conv2d", "aten::convolution", "aten::_convolution"):
        assert flops_of(name, [x, w, [16], [], [], [], []]) == expected
    # grouped (depthwise): the weight's second dim already is Cin / groups
    assert flops_of("aten::conv2d", [[2, 16, 32, 32], [16, 1, 3, 3]]) == 2 * 2 * 30 * 30 * 16 * 1 * 9
    assert flops_of("aten::conv1d", [[2, 3, 100], [8, 3, 5]]) == flop_counter.conv_flop_count(
        [2, 3, 100], [8, 3, 5], [2, 8, 96]
    )


def test_convolution_backward_is_twice_the_forward_at_the_recorded_output_size() -> None:
    grad_out, x, w = [2, 16, 16, 16], [2, 3, 32, 32], [16, 3, 3, 3]  # a stride-2 conv: output from grad
    forward = flop_counter.conv_flop_count(x, w, grad_out)
    assert (
        flops_of("aten::convolution_backward", [grad_out, x, w, [], [], [], [], [], [], [], []])
        == 2 * forward
    )


CONV2D_ARGS = ["", "", "", "[2, 2]", "[1, 1]", "[1, 1]", "1"]  # stride 2, padding 1, dilation 1
BACKWARD_ARGS = ["", "", "", "[16]", "[2, 2]", "[1, 1]", "[1, 1]", "False", "[0, 0]", "1"]


def test_recorded_stride_and_padding_give_pytorchs_output_size() -> None:
    x, w = [2, 3, 32, 32], [16, 3, 3, 3]
    expected = flop_counter.conv_flop_count(x, w, [2, 16, 16, 16])  # (32 + 2 - 2 - 1) // 2 + 1
    assert flops_of("aten::conv2d", [x, w, [16], [], [], [], []], CONV2D_ARGS) == expected
    # a conv2d whose padding was a string records none: no count here, its inner convolution counts
    same = ["", "", "", "[1, 1]", "", "[1, 1]", "1"]
    assert flops_of("aten::conv2d", [x, w, [16], [], [], [], []], same) is None


def test_backward_counts_the_gradients_its_output_mask_asks_for() -> None:
    """A grouped convolution's weight gradient is computed group by group: the forward's
    multiply-adds again.  (``torch.utils.flop_counter`` counts it as if ungrouped, ``groups``
    times too many, so this is worked out by hand.)"""
    grad_out, x, w = [2, 16, 16, 16], [2, 16, 32, 32], [16, 4, 3, 3]  # stride 2, groups 4
    forward = 2 * 2 * (16 * 16) * 16 * 4 * 9
    dims = [grad_out, x, w, [], [], [], [], [], [], [], []]
    grouped = [*BACKWARD_ARGS[:9], "4"]
    assert flops_of("aten::convolution_backward", dims, [*grouped, "[True, True, True]"]) == 2 * forward
    # the first layer: no gradient for its input
    assert flops_of("aten::convolution_backward", dims, [*grouped, "[False, True, True]"]) == forward
    assert flops_of("aten::convolution_backward", dims, [*grouped, "[False, False, True]"]) == 0


def test_transposed_convolution_works_at_every_input_position() -> None:
    x, w = [2, 8, 16, 16], [8, 4, 3, 3]  # ConvTranspose2d(8, 4, 3, stride=2): w is [Cin, Cout, K]
    expected = flop_counter.conv_flop_count(x, w, [2, 4, 32, 32], transposed=True)
    assert expected == 2 * 2 * (16 * 16) * 8 * 4 * 9
    args = ["", "", "", "[2, 2]", "[1, 1]", "[1, 1]", "1", "[1, 1]"]
    assert flops_of("aten::conv_transpose2d", [x, w, [4], [], [], [], [], []], args) == expected


def test_attention_is_four_b_h_sq_sk_d_and_backward_two_and_a_half_times() -> None:
    q = [2, 8, 128, 64]
    forward = 4 * 2 * 8 * 128 * 128 * 64
    assert forward == flop_counter.sdpa_flop_count(q, q, q)
    assert flops_of("aten::scaled_dot_product_attention", [q, q, q, [], []]) == forward
    assert flops_of("aten::_scaled_dot_product_flash_attention", [q, q, q]) == forward
    assert flops_of("aten::_scaled_dot_product_efficient_attention_backward", [q, q, q, q]) == 2.5 * forward
    bshd = [2, 128, 8, 64]  # the flash kernels' own layout
    assert flops_of("aten::_flash_attention_forward", [bshd, bshd, bshd]) == forward
    assert flops_of("aten::_flash_attention_backward", [bshd, bshd, bshd, bshd]) == 2.5 * forward


@pytest.mark.parametrize(
    ("name", "dims"),
    [
        ("aten::mm", [[64, 128], [127, 32]]),  # inner dimensions disagree
        ("aten::mm", []),  # shapes not recorded
        ("aten::conv2d", [[2, 3, 32, 32]]),  # no weight
        ("aten::relu", [[2, 3]]),  # not a recognised op
        ("aten::matmul", [[2048, 1120], [1120, 256], [1120], [2048, 256], [256, 2400]]),  # corrupt record
    ],
)
def test_unusable_shapes_give_no_count(name: str, dims: list) -> None:
    assert flops_of(name, dims) is None


def test_every_recognised_name_from_the_brief_has_a_formula() -> None:
    for name in (
        "aten::mm",
        "aten::addmm",
        "aten::bmm",
        "aten::baddbmm",
        "aten::matmul",
        "aten::linear",
        "aten::conv1d",
        "aten::conv2d",
        "aten::conv3d",
        "aten::convolution",
        "aten::_convolution",
        "aten::convolution_backward",
        "aten::scaled_dot_product_attention",
        "aten::_flash_attention_forward",
    ):
        assert name in FLOP_FORMULAS


def _op(
    name: str, start: int, dur: int, depth: int, dims: list | None, track: int = 0, **extra: object
) -> dict:
    return {
        "kind": "cpu_op",
        "name": name,
        "track": track,
        "tid": track + 1,
        "start_ns": start,
        "dur_ns": dur,
        "depth": depth,
        "input_dims": dims,
        **extra,
    }


LINEAR = [[64, 128], [32, 128], [32]]
ADDMM = [[32], [64, 128], [128, 32], [], []]


def test_only_the_outermost_recognised_op_counts() -> None:
    trace = make_trace(
        [
            _op("aten::linear", 0, 100, 0, LINEAR),  # row 0: counted
            _op("aten::t", 5, 10, 1, [[32, 128]]),
            _op("aten::addmm", 20, 70, 1, ADDMM),  # row 2: inside linear
            _op("aten::addmm", 0, 70, 0, ADDMM, track=1),  # row 3: another thread, counted
            _op("aten::matmul", 200, 50, 0, None),  # row 4: no shapes -> its mm counts instead
            _op("aten::mm", 210, 30, 1, [[64, 128], [128, 32]]),  # row 5
        ],
        steps=[],
    )
    table = op_flops(trace)
    assert table["slice"].to_pylist() == [0, 3, 5]
    gemm = 2 * 64 * 128 * 32
    assert table["flops"].to_pylist() == [gemm, gemm, gemm]
    assert pc.sum(table["flops"]).as_py() == 3 * gemm


def _with_devices(trace: Trace, *names: str) -> Trace:
    devices = [DeviceInfo(index=i, name=n) for i, n in enumerate(names)]
    return dataclasses.replace(trace, meta=dataclasses.replace(trace.meta, devices=devices))


def _step_trace(types: list[str] | None) -> Trace:
    gemm_dims = [[2048, 4096], [4096, 1024]]
    return make_trace(
        [
            _op("aten::mm", 100, 500, 0, gemm_dims, step=1, input_types=types),
            _op("aten::mm", 1_000_100, 500, 0, gemm_dims, step=2, input_types=types),
            _op("aten::mm", 1_000_700, 500, 0, gemm_dims, step=2, input_types=types),
        ],
        steps=[
            {"step": 1, "start_ns": 0, "end_ns": 1_000_000},
            {"step": 2, "start_ns": 1_000_000, "end_ns": 3_000_000},
        ],
    )


def test_mfu_divides_achieved_flops_per_second_by_the_dtype_peak() -> None:
    trace = _with_devices(_step_trace(["c10::BFloat16", "c10::BFloat16"]), "NVIDIA A100-SXM4-80GB")
    table = flops_by_step(trace).to_pylist()
    gemm = 2 * 2048 * 4096 * 1024
    assert [r["flops"] for r in table] == [gemm, 2 * gemm]
    assert [r["step_ns"] for r in table] == [1_000_000, 2_000_000]
    assert table[0]["flops_per_s"] == pytest.approx(gemm / 1e-3)
    assert table[0]["peak_flops_per_s"] == 312e12
    assert table[0]["mfu"] == pytest.approx(gemm / 1e-3 / 312e12)
    assert table[1]["mfu"] == pytest.approx(2 * gemm / 2e-3 / 312e12)


def test_float32_work_uses_the_fp32_peak_unless_tf32_is_asked_for() -> None:
    trace = _with_devices(_step_trace(["float", "float"]), "NVIDIA H100 80GB HBM3")
    assert flops_by_step(trace)["peak_flops_per_s"].to_pylist() == pytest.approx([66.9e12, 66.9e12])
    tf32 = flops_by_step(trace, float32_peak="tf32")["peak_flops_per_s"].to_pylist()
    assert tf32 == pytest.approx([494.7e12, 494.7e12])


def test_cpu_only_trace_has_flops_but_no_mfu() -> None:
    table = flops_by_step(_step_trace(["float", "float"])).to_pylist()
    assert table[0]["flops"] == 2 * 2048 * 4096 * 1024
    assert table[0]["peak_flops_per_s"] is None and table[0]["mfu"] is None


def test_steps_whose_ops_lack_shapes_have_unknown_flops_not_zero() -> None:
    trace = make_trace(
        [_op("aten::mm", 100, 500, 0, None, step=1)], steps=[{"step": 1, "start_ns": 0, "end_ns": 1000}]
    )
    row = flops_by_step(_with_devices(trace, "Tesla V100-SXM2-32GB")).to_pylist()[0]
    assert row["flops"] is None and row["mfu"] is None and row["peak_flops_per_s"] == 15.7e12


@pytest.mark.parametrize(
    ("device", "fp16_bf16_tflops"),
    [
        ("NVIDIA H100 80GB HBM3", 989.4),
        ("NVIDIA H100 PCIe", 756.0),
        ("NVIDIA H100 NVL", 835.5),
        ("NVIDIA H200", 989.5),
        ("NVIDIA A100-SXM4-40GB", 312.0),
        ("NVIDIA A100 80GB PCIe", 312.0),
        ("Tesla V100-SXM2-32GB", 125.0),
        ("Tesla V100-PCIE-16GB", 112.0),
        ("NVIDIA A10", 125.0),
        ("NVIDIA A10G", 70.0),
        ("NVIDIA L4", 121.0),
        ("NVIDIA L40S", 362.05),
        ("Tesla T4", 65.0),
        ("AMD Instinct MI250X", 191.5),
        ("AMD Instinct MI300X", 1307.4),
    ],
)
def test_peak_table_tells_similar_names_apart(device: str, fp16_bf16_tflops: float) -> None:
    assert peak_flops_per_s(device, "fp16_bf16") == pytest.approx(fp16_bf16_tflops * 1e12)


def test_unknown_device_has_no_peak() -> None:
    assert peak_flops_per_s("NVIDIA GeForce GTX 1080", "fp32") is None
    assert peak_flops_per_s(None) is None
    assert all(set(p) == {"fp32", "tf32", "fp16_bf16"} for p in PEAK_FLOPS.values())


# ---------------------------------------------------------------------------------------------
# real traces

_GEMM_ORACLE = {
    "aten::mm": lambda d: flop_counter.mm_flop(d[0], d[1]),
    "aten::addmm": lambda d: flop_counter.addmm_flop(d[0], d[1], d[2]),
    "aten::bmm": lambda d: flop_counter.bmm_flop(d[0], d[1]),
    "aten::baddbmm": lambda d: flop_counter.baddbmm_flop(d[0], d[1], d[2]),
}


def _innermost_gemm_flops(events: list[dict]) -> int:
    """Sum, with PyTorch's formulas, over mm/addmm/bmm calls: the leaves every linear and matmul
    in these traces bottoms out in, so the total must equal our outermost-only count.  (The
    sampled trace has linear/matmul records with other calls' shapes appended; we must skip
    those and count their leaves, which is what this oracle does everywhere.)"""
    return sum(
        _GEMM_ORACLE[e["name"]](e["args"]["Input Dims"])
        for e in events
        if e.get("cat") == "cpu_op" and e.get("ph") == "X" and e["name"] in _GEMM_ORACLE
    )


@pytest.mark.parametrize(
    "relative",
    [
        "distributed_info_unavailable/distributed_info_not_found.json.gz",
        "two_ranks_ws128/sampled_rank-0.json.gz",
    ],
)
def test_outermost_total_equals_the_sum_over_innermost_gemms(relative: str) -> None:
    path = kineto_file(relative)
    trace = read_trace(path)
    total = pc.sum(op_flops(trace)["flops"]).as_py()
    assert total > 1e10
    assert total == _innermost_gemm_flops(raw_events(path))


def test_real_a100_trace_reports_mfu_against_the_a100_fp32_peak() -> None:
    path = kineto_file("distributed_info_unavailable/distributed_info_not_found.json.gz")
    trace = read_trace(path)
    assert device_name(trace.meta, trace.tracks) == "NVIDIA A100-PG509-200"
    (row,) = flops_by_step(trace).to_pylist()
    assert row["peak_flops_per_s"] == 19.5e12
    assert row["mfu"] == pytest.approx(row["flops"] / (row["step_ns"] * 1e-9) / 19.5e12)


def test_generic_amd_name_is_identified_by_compute_units() -> None:
    trace = read_trace(kineto_file("amd_trace/mi250_minitoy_train_ROCm6_2_kineto.json.gz"))
    assert device_name(trace.meta, trace.tracks).startswith(
        "AMD Instinct MI250 (AMD Radeon Graphics, 104 CUs"
    )
    assert flops_by_step(trace)["peak_flops_per_s"].to_pylist()[0] == 45.25e12


def test_the_trace_keeps_scalar_arguments_for_every_convolution_formula() -> None:
    """The reader drops ``Concrete Inputs`` outside ``CONCRETE_INPUT_OPS``: a convolution formula
    whose operator is not in it would silently fall back to the stride-1 approximation."""
    assert {name for name in FLOP_FORMULAS if "conv" in name} == CONCRETE_INPUT_OPS
