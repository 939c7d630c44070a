"""Convolution FLOPs from a real profiled CNN: stride, padding, dilation, groups and transposed
convolutions counted from the scalar arguments PyTorch records (``Concrete Inputs``), equal to
PyTorch's own FLOP counter (``torch.utils.flop_counter``) for the same training step.

Before these were read, a stride-2 convolution counted four times its work and a padded one less
than its work: the MFU of a ResNet-like model was wrong by that much."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.compute as pc
import pytest

import perfsight
from perfsight.model import CONCRETE_INPUT_OPS

torch = pytest.importorskip("torch")
flop_counter = pytest.importorskip("torch.utils.flop_counter")
nn = torch.nn

STEPS = 3


class SmallCnn(nn.Module):
    """A CNN with every convolution geometry the formula must get right."""

    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(
            nn.Conv2d(3, 16, 3, stride=2, padding=1),  # downsampling, padded
            nn.ReLU(),
            nn.Conv2d(16, 16, 3, padding=2, dilation=2),  # dilated (groups: see test_flops.py)
            nn.ReLU(),
            nn.Conv2d(16, 8, 5, padding="same"),  # string padding: counted by the inner op
            nn.ReLU(),
            nn.ConvTranspose2d(8, 4, 3, stride=2, padding=1, output_padding=1),  # upsampling
        )
        self.signal = nn.Conv1d(4, 6, 7, stride=3)  # a 1-D convolution over the image rows

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        image = self.body(x)
        rows = image.flatten(2)
        return self.signal(rows)


def _train_step(model: nn.Module, optimizer: torch.optim.Optimizer, batch: torch.Tensor) -> None:
    model(batch).pow(2).mean().backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def _profiled_training(out: Path) -> tuple[Path, int]:
    """Profile STEPS training steps; return the trace and torch's FLOPs for one step."""
    torch.manual_seed(0)
    model = SmallCnn()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    batch = torch.randn(2, 3, 32, 32)
    with flop_counter.FlopCounterMode(display=False) as counter:
        _train_step(model, optimizer, batch)
    trace = out / "cnn_trace.json"
    schedule = torch.profiler.schedule(wait=0, warmup=1, active=STEPS, repeat=1)
    with torch.profiler.profile(
        record_shapes=True, schedule=schedule, on_trace_ready=lambda p: p.export_chrome_trace(str(trace))
    ) as prof:
        for _ in range(1 + STEPS):
            _train_step(model, optimizer, batch)
            prof.step()
    return trace, counter.get_total_flops()


@pytest.fixture(scope="module")
def profiled_cnn(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, int]:
    return _profiled_training(tmp_path_factory.mktemp("cnn"))


@pytest.mark.parametrize("native", ["1", "0"], ids=["native scanner", "portable reader"])
def test_each_steps_flops_equal_pytorchs_own_count(
    profiled_cnn: tuple[Path, int], native: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    trace, expected = profiled_cnn
    monkeypatch.setenv("PERFSIGHT_NATIVE", native)
    analysis = perfsight.analyse(trace, tmp_path / "out")
    steps = analysis.table("flops_by_step").to_pylist()
    assert len(steps) == STEPS, steps
    assert expected > 1e6
    for step in steps:
        assert step["flops"] == expected, (step, expected)


def test_only_convolutions_keep_their_scalar_arguments(
    profiled_cnn: tuple[Path, int], tmp_path: Path
) -> None:
    """The slice table keeps ``Concrete Inputs`` for the convolutions alone: every other operator
    records them too, and nothing reads them."""
    trace, _ = profiled_cnn
    slices = perfsight.analyse(trace, tmp_path / "out").trace().slices
    names = slices.column("name").to_pylist()
    kept = slices.column("concrete_inputs").to_pylist()
    with_arguments = {n for n, k in zip(names, kept, strict=True) if k is not None}
    assert with_arguments <= CONCRETE_INPUT_OPS
    assert {"aten::conv2d", "aten::convolution", "aten::conv_transpose2d", "aten::convolution_backward"} <= (
        with_arguments
    )
    convolution = slices.filter(pc.equal(slices.column("name").cast("string"), "aten::convolution"))
    assert all(row is not None for row in convolution.column("concrete_inputs").to_pylist())


@pytest.mark.parametrize(
    ("recorded", "counted"),
    [
        ("garbage", "approximated"),  # not a list: as if not recorded
        ([None, 1, {"a": 1}, None, None, None, None], "not counted"),  # nulls and objects
        (["", "", "", "[2, 2]", "[1, 1]", "[1, 1]", "1"] * 1000, "not counted"),  # longer than the schema
        (["", "", "", "[0, 0]", "[1, 1]", "[1, 1]", "1"], "not counted"),  # stride 0
        (["", "", "", "[2, 2]", "[-99, 1]", "[1, 1]", "1"], "not counted"),  # no output left
        (["", "", "", "[2, 2]", "[1, 1]", "[1, 1]", "1"], "exact"),
    ],
)
def test_hostile_scalar_arguments_leave_the_analysis_whole(
    recorded: object, counted: str, tmp_path: Path
) -> None:
    dims = [[2, 3, 32, 32], [16, 3, 3, 3], [16], [], [], [], []]
    events = [
        {"ph": "X", "cat": "cpu_op", "name": "aten::conv2d", "pid": 1, "tid": 1, "ts": 0, "dur": 10,
         "args": {"Input Dims": dims, "Concrete Inputs": recorded}},
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 20, "dur": 10,
         "args": {"Input Dims": [[4, 8], [8, 2]]}},
    ]  # fmt: skip
    path = tmp_path / "rank0.trace.json"
    path.write_text(json.dumps({"traceEvents": events}))
    (step,) = perfsight.analyse(path, tmp_path / "out").table("flops_by_step").to_pylist()
    conv = {
        "approximated": 2 * 2 * 30 * 30 * 16 * 3 * 9,
        "exact": 2 * 2 * 16 * 16 * 16 * 3 * 9,
        "not counted": 0,
    }
    assert step["flops"] == conv[counted] + 2 * 4 * 8 * 2
