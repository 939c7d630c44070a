"""``perfsight.profile`` is a drop-in for ``torch.profiler.profile`` and adds levels, ranges, metadata."""

from __future__ import annotations

import json
import subprocess
import sys
import warnings
from pathlib import Path

import pyarrow.compute as pc
import pytest

torch = pytest.importorskip("torch")

import perfsight  # noqa: E402
from perfsight.ingest import read_trace  # noqa: E402

pytestmark = pytest.mark.timeout(120)


def _training(profiler_module, out: Path) -> object:
    """The same user code, parameterised only by the profiler module it imports."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with profiler_module.profile(
        activities=[profiler_module.ProfilerActivity.CPU],
        schedule=profiler_module.schedule(wait=1, warmup=1, active=2, repeat=1),
        on_trace_ready=profiler_module.tensorboard_trace_handler(str(out)),
        record_shapes=True,
        profile_memory=True,
    ) as prof:
        for _ in range(6):
            loss = model(torch.randn(16, 32)).square().mean()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            prof.step()
    return prof


def test_the_same_code_with_torch_and_perfsight_gives_equivalent_loadable_traces(tmp_path: Path) -> None:
    torch_prof = _training(torch.profiler, tmp_path / "torch")
    ours = _training(perfsight, tmp_path / "perfsight")

    (torch_file,) = (tmp_path / "torch").glob("*.pt.trace.json")
    (run,) = (tmp_path / "perfsight").glob("*_perfsight")
    theirs, mine = read_trace(torch_file), read_trace(run / "kineto_trace_0.json")
    assert theirs.steps.column("step").to_pylist() == mine.steps.column("step").to_pylist() == [2, 3]
    for trace in (theirs, mine):
        names = set(trace.slices.column("name").to_pylist())
        assert {"aten::addmm", "aten::mm", "Optimizer.step#SGD.step"} <= names
        assert trace.memory.num_rows > 0
    # torch's own result API still works on perfsight's profiler
    assert {e.key for e in ours.key_averages()} >= {"aten::addmm"}
    assert {e.key for e in torch_prof.key_averages()} >= {"aten::addmm"}
    assert perfsight.load(tmp_path / "perfsight").trace().steps.num_rows == 2


def test_user_ranges_and_metadata_reach_the_trace_and_the_analyses(tmp_path: Path) -> None:
    handler = perfsight.tensorboard_trace_handler(tmp_path, analyse_flag=False)
    with perfsight.profile(
        schedule=perfsight.schedule(wait=0, active=3, repeat=1), on_trace_ready=handler
    ) as p:
        p.add_metadata("model", "tiny")
        p.add_metadata_json("hyper", '{"lr": 0.1, "batch": 4}')
        for _ in range(3):
            with perfsight.range("load_batch"):
                batch = torch.randn(4, 8)
            torch.nn.functional.relu(batch).sum()
            p.step()

    (folder,) = handler.folders
    metadata = json.loads((folder / "profiler_metadata.json").read_text())
    assert metadata["user"] == {"model": "tiny", "hyper": {"lr": 0.1, "batch": 4}}
    raw = json.loads((folder / "kineto_trace_0.json").read_text())
    assert raw["model"] == "tiny" and raw["hyper"] == {"lr": 0.1, "batch": 4}

    analysis = perfsight.load(folder)
    slices = analysis.slices
    ranges = slices[slices["name"] == "load_batch"]
    assert list(ranges["kind"].astype(str)) == ["annotation"] * 3
    assert sorted(ranges["step"]) == [0, 1, 2]
    assert analysis.trace().meta.extra["user_metadata"]["model"] == "tiny"


def test_range_also_works_as_a_decorator() -> None:
    @perfsight.range("decorated")
    def work(x: torch.Tensor) -> torch.Tensor:
        return x * 2

    with torch.profiler.profile() as prof:
        work(torch.ones(3))
    assert "decorated" in {e.name for e in prof.events()}
    with pytest.raises(ValueError, match="name"):
        perfsight.range("")


@pytest.mark.parametrize(
    ("level", "memory", "shapes"),
    [("Level0", False, False), ("Level1", True, False), ("Level2", True, True)],
)
def test_levels_turn_on_what_docs_collection_md_says(
    tmp_path: Path, level: str, memory: bool, shapes: bool
) -> None:
    handler = perfsight.tensorboard_trace_handler(tmp_path, analyse_flag=False)
    config = perfsight.ExperimentalConfig(profiler_level=perfsight.ProfilerLevel[level])
    layer = torch.nn.Linear(8, 8)
    with perfsight.profile(
        schedule=perfsight.schedule(wait=0, active=2, repeat=1),
        on_trace_ready=handler,
        experimental_config=config,
    ) as prof:
        for _ in range(2):
            layer(torch.randn(4, 8)).sum().backward()
            prof.step()
    (folder,) = handler.folders
    trace = read_trace(folder / "kineto_trace_0.json")
    assert (trace.memory.num_rows > 0) is memory
    addmm = trace.slices.filter(pc.equal(trace.slices.column("name").cast("string"), "aten::addmm"))
    assert addmm.num_rows == 2
    assert any(dims for dims in addmm.column("input_dims").to_pylist()) is shapes
    info = json.loads((folder / "profiler_info_0.json").read_text())
    assert info["config"]["profiler_level"] == level


def test_level_switches_add_to_explicit_ones_never_remove_them(tmp_path: Path) -> None:
    prof = perfsight.profile(record_shapes=True, experimental_config=perfsight.ExperimentalConfig())
    assert prof.record_shapes and not prof.profile_memory and prof.level is perfsight.ProfilerLevel.Level0
    kineto_options = torch.profiler._ExperimentalConfig(verbose=True)
    passthrough = perfsight.profile(experimental_config=kineto_options)  # torch's own config, unchanged
    assert passthrough.experimental_config is kineto_options
    assert passthrough.level is perfsight.ProfilerLevel.Level0


def test_bad_config_values_name_the_option() -> None:
    with pytest.raises(ValueError, match="profiler_level"):
        perfsight.ExperimentalConfig(profiler_level=7)
    with pytest.raises(ValueError, match="export_type"):
        perfsight.ExperimentalConfig(export_type=["csv"])
    with pytest.raises(ValueError, match="activities"):
        perfsight.profile(activities=["TPU-ish"])
    assert perfsight.ExperimentalConfig(profiler_level=1).profiler_level is perfsight.ProfilerLevel.Level1


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only fallback")
def test_gpu_activity_on_a_cpu_only_machine_warns_and_traces_the_cpu() -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        prof = perfsight.profile(activities=[perfsight.ProfilerActivity.CPU, perfsight.ProfilerActivity.GPU])
    assert any("no accelerator" in str(w.message) for w in caught)
    assert prof.activities == {torch.profiler.ProfilerActivity.CPU}


def test_import_perfsight_does_not_import_torch() -> None:
    code = (
        "import sys, perfsight; perfsight.schedule(wait=0, active=1); perfsight.ExperimentalConfig(); "
        "print('torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.strip() == "False"


def test_the_handler_also_writes_run_folders_for_torch_profiler(tmp_path: Path) -> None:
    handler = perfsight.tensorboard_trace_handler(tmp_path)
    with torch.profiler.profile(
        schedule=torch.profiler.schedule(wait=0, warmup=1, active=2, repeat=1), on_trace_ready=handler
    ) as prof:
        for _ in range(4):
            torch.randn(8, 8).mm(torch.randn(8, 8))
            prof.step()
    (folder,) = handler.folders
    info = json.loads((folder / "profiler_info_0.json").read_text())
    assert info["status"] == "complete" and info["rank"] == 0
    assert (folder / "PROFILER_OUTPUT" / "op_statistic.csv").is_file()
    assert read_trace(folder / "kineto_trace_0.json").steps.column("step").to_pylist() == [1, 2]
