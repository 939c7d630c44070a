"""``perfsight.profile(with_modules=True)`` records every nn.Module forward as a range, nested as
the modules are, without the Python tracer; the module analysis reads them back per step."""

from __future__ import annotations

from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

import perfsight  # noqa: E402
from perfsight.analysis.modules import module_ranges, module_statistic  # noqa: E402
from perfsight.ingest import read_trace  # noqa: E402

pytestmark = pytest.mark.timeout(120)


class Block(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inner = torch.nn.Linear(8, 8)
        self.act = torch.nn.ReLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(self.inner(x))


class Fails(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        raise RuntimeError("a forward that raises")


def _profiled(out: Path, with_modules: bool) -> list[torch.Tensor]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(Block(), torch.nn.Linear(8, 2))
    results = []
    with perfsight.profile(
        activities=[perfsight.ProfilerActivity.CPU],
        schedule=perfsight.schedule(wait=0, warmup=1, active=2, repeat=1),
        on_trace_ready=perfsight.tensorboard_trace_handler(str(out)),
        with_modules=with_modules,
    ) as prof:
        for step in range(3):
            with torch.no_grad():
                results.append(model(torch.ones(4, 8)))
            if step == 1:  # a forward that raises leaves its range open: later ranges still nest right
                with pytest.raises(RuntimeError):
                    torch.nn.Sequential(Fails())(torch.ones(1))
            prof.step()
    return results


def test_each_module_forward_is_a_range_named_by_its_path_and_class(tmp_path: Path) -> None:
    outputs = _profiled(tmp_path / "on", with_modules=True)
    (run,) = (tmp_path / "on").glob("*_perfsight")
    trace = read_trace(run / "kineto_trace_0.json")
    ranges = module_ranges(trace)
    ranges = ranges[ranges["step"] >= 0]
    expected = {
        "Sequential": ("", 0),
        "Sequential.0 (Block)": ("Sequential", 1),
        "Sequential.0.inner (Linear)": ("Sequential.0 (Block)", 2),
        "Sequential.0.act (ReLU)": ("Sequential.0 (Block)", 2),
        "Sequential.1 (Linear)": ("Sequential", 1),
    }
    good = ranges[ranges["module"].isin(expected)]
    assert {
        m: (p, d) for m, p, d in zip(good["module"], good["parent"], good["depth"], strict=True)
    } == expected
    table = module_statistic(trace).to_pandas()
    per_step = table[table["module"].isin(expected)].groupby("step")["module"].nunique()
    assert per_step.to_dict() == {1: len(expected), 2: len(expected)}  # both active steps, every module
    assert (table["total_ns"] > 0).all()
    # the hooks change nothing the model computes, and are gone once profiling ends
    plain = _plain_outputs()
    assert all(torch.equal(a, b) for a, b in zip(outputs, plain, strict=True))
    assert not torch.nn.modules.module._global_forward_pre_hooks


def _plain_outputs() -> list[torch.Tensor]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(Block(), torch.nn.Linear(8, 2))
    with torch.no_grad():
        return [model(torch.ones(4, 8)) for _ in range(3)]


def test_without_with_modules_no_module_range_is_recorded(tmp_path: Path) -> None:
    _profiled(tmp_path / "off", with_modules=False)
    (run,) = (tmp_path / "off").glob("*_perfsight")
    assert module_ranges(read_trace(run / "kineto_trace_0.json")).empty
