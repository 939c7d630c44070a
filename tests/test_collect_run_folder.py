"""Run folders: one per window and rank from a real gloo DDP job, read back and re-analysed."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

import perfsight  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
DDP_EXAMPLE = REPO / "examples" / "train_ddp.py"
pytestmark = pytest.mark.timeout(240)


@pytest.fixture(scope="module")
def ddp_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two gloo ranks, DDP, window of 2 active steps (steps 2 and 3) at Level1."""
    out = tmp_path_factory.mktemp("ddp") / "run"
    args = ["--out", str(out), "--world-size", "2", "--skip-first", "0", "--wait", "1", "--warmup", "1"]
    args += ["--active", "2", "--batch-size", "8", "--hidden", "16", "--level", "Level1"]
    result = subprocess.run(
        [sys.executable, str(DDP_EXAMPLE), *args], capture_output=True, text=True, timeout=200, check=False
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return out


def _info(folder: Path) -> dict:
    (path,) = folder.glob("profiler_info_*.json")
    return json.loads(path.read_text())


def test_each_rank_writes_one_complete_run_folder_with_its_identity(ddp_run: Path) -> None:
    folders = sorted(ddp_run.glob("*_perfsight"))
    assert [f.name.split("_")[0] for f in folders] == ["rank0", "rank1"]
    for expected_rank, folder in enumerate(folders):
        info = _info(folder)
        assert (info["rank"], info["world_size"], info["local_rank"]) == (expected_rank, 2, expected_rank)
        assert info["rank_source"] == "torch.distributed"
        assert info["complete"] is True and info["status"] == "complete"
        assert info["window"]["steps"] == [2, 3]
        assert info["config"]["profiler_level"] == "Level1" and info["config"]["profile_memory"] is True
        assert info["versions"]["torch"] == torch.__version__
        assert set(info["clock"]) >= {"offset_ns", "uncertainty_ns", "reference_rank"}
        assert (folder / f"kineto_trace_{expected_rank}.json").is_file()
        assert not (folder / "WINDOW_INCOMPLETE").exists()
        assert not list(folder.glob(".*.tmp*"))  # atomic writes leave no temporaries

        metadata = json.loads((folder / "profiler_metadata.json").read_text())
        assert metadata["backend"] == "gloo"
        assert [0, 1] in [g["ranks"] for g in metadata["process_groups"]]
        assert metadata["user"]["job"] == "train_ddp example"
        assert metadata["parallel_layout"] == {"data_parallel": 2}


def test_the_reader_takes_rank_and_run_facts_from_the_run_folder(ddp_run: Path) -> None:
    analysis = perfsight.load(ddp_run)
    assert sorted(analysis.ranks) == [0, 1]
    for rank in (0, 1):
        meta = analysis.trace(rank).meta
        assert (meta.rank, meta.world_size, meta.local_rank) == (rank, 2, rank)
        assert meta.rank_source == "run folder"
        assert meta.complete is True
        assert meta.extra["user_metadata"]["parallel_layout"] == {"data_parallel": 2}
        assert any(g["ranks"] == [0, 1] for g in meta.process_groups)
        steps = analysis.trace(rank).steps.column("step").to_pylist()
        assert steps == [2, 3]
        comm = analysis.trace(rank).comm
        assert comm.num_rows >= 2  # DDP's gradient all-reduce, once per recorded step at least
        assert set(comm.column("collective").to_pylist()) >= {"all_reduce"}


def test_perfsight_analyse_re_analyses_a_run_folder_in_place(ddp_run: Path) -> None:
    folder = sorted(ddp_run.glob("rank1_*_perfsight"))[0]
    result = subprocess.run(
        [sys.executable, "-m", "perfsight.cli", "analyse", str(folder), "--json", "--export-type", "text,db"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    (summary,) = json.loads(result.stdout)
    assert summary["rank"] == 1
    step_csv = (folder / "PROFILER_OUTPUT" / "step_trace_time.csv").read_text().splitlines()
    assert [line.split(",")[0] for line in step_csv[1:]] == ["2", "3"]
    assert (folder / "PROFILER_OUTPUT" / "perfsight_1.db").is_file()


def _train(prof: perfsight.collect.profile, steps: int = 3) -> None:
    layer = torch.nn.Linear(16, 16)
    with prof:
        for _ in range(steps):
            layer(torch.randn(4, 16)).relu().sum().backward()
            prof.step()


@pytest.mark.parametrize("simplify", [True, False])
def test_the_handler_analyses_each_window_and_simplification_drops_the_cache(
    tmp_path: Path, simplify: bool
) -> None:
    config = perfsight.ExperimentalConfig(
        export_type=[perfsight.ExportType.Text, perfsight.ExportType.Db], data_simplification=simplify
    )
    handler = perfsight.tensorboard_trace_handler(tmp_path, worker_name="w")
    _train(
        perfsight.profile(
            schedule=perfsight.schedule(wait=0, active=2, repeat=1),
            on_trace_ready=handler,
            experimental_config=config,
        )
    )
    (folder,) = handler.folders
    assert folder.parent == tmp_path and folder.name.startswith("w_") and folder.name.endswith("_perfsight")
    assert (folder / "PROFILER_OUTPUT" / "op_statistic.csv").is_file()
    assert (folder / "PROFILER_OUTPUT" / "perfsight_0.db").is_file()
    assert (folder / "cache").exists() is (not simplify)
    assert (folder / "kineto_trace_0.json").is_file()  # re-analysis still possible
    assert perfsight.load(folder).trace().steps.column("step").to_pylist() == [0, 1]


def test_async_analysis_runs_in_separate_processes_one_window_after_another(tmp_path: Path) -> None:
    handler = perfsight.tensorboard_trace_handler(tmp_path, async_mode=True)
    _train(
        perfsight.profile(schedule=perfsight.schedule(wait=0, active=1, repeat=2), on_trace_ready=handler),
        steps=2,
    )
    handler.wait(timeout=150)  # analysis.log exists only when the analysis ran as its own process
    assert len(handler.folders) == 2
    for folder in handler.folders:
        assert "analysis written" in (folder / "analysis.log").read_text()
        assert (folder / "PROFILER_OUTPUT" / "step_trace_time.csv").is_file()
    assert (tmp_path / ".perfsight_analysis.lock").exists()  # the lock that serialises them


def test_every_window_of_a_rank_gets_its_own_analysis_folder(tmp_path: Path) -> None:
    handler = perfsight.tensorboard_trace_handler(tmp_path / "run", analyse_flag=False)
    _train(
        perfsight.profile(schedule=perfsight.schedule(wait=0, active=1, repeat=3), on_trace_ready=handler),
        steps=3,
    )
    assert len(handler.folders) == 3
    analysed = perfsight.analyse(tmp_path / "run", tmp_path / "out")
    outputs = sorted(p.parent.name for p in (tmp_path / "out").glob("*/PROFILER_OUTPUT"))
    assert len(outputs) == 3 and outputs[0] == "rank0"
    assert {name.removeprefix("rank0_") for name in outputs[1:]} <= {f.name for f in handler.folders}
    assert analysed.trace(0).meta.rank_source == "run folder"


def test_a_hostile_worker_name_stays_inside_the_output_folder(tmp_path: Path) -> None:
    handler = perfsight.tensorboard_trace_handler(
        tmp_path / "out", worker_name="../../escape me/..", analyse_flag=False
    )
    _train(perfsight.profile(schedule=perfsight.schedule(wait=0, active=1, repeat=1), on_trace_ready=handler))
    (folder,) = handler.folders
    assert folder.parent == tmp_path / "out"
    assert "escape_me" in folder.name and not folder.name.startswith(".")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def _one_window(out: Path) -> Path:
    handler = perfsight.tensorboard_trace_handler(out, analyse_flag=False)
    _train(perfsight.profile(schedule=perfsight.schedule(wait=0, active=2, repeat=1), on_trace_ready=handler))
    return handler.folders[0]


def test_damaged_run_info_is_a_warning_naming_the_file_and_the_trace_still_reads(tmp_path: Path) -> None:
    folder = _one_window(tmp_path / "cut")
    info_path = folder / "profiler_info_0.json"
    info_path.write_text(info_path.read_text()[:40])  # truncated JSON
    trace = perfsight.load(folder).trace()
    assert trace.steps.column("step").to_pylist() == [0, 1]
    assert trace.meta.rank_source != "run folder"
    assert any(str(info_path) in w and "unreadable run info" in w for w in trace.meta.warnings)

    folder = _one_window(tmp_path / "typed")
    info_path = folder / "profiler_info_0.json"
    info = json.loads(info_path.read_text())
    info.update(world_size="two", clock="soon", devices=[1])
    info["files"]["sidecars"] = {"comm": "../../../etc/passwd"}
    info_path.write_text(json.dumps(info))
    meta = perfsight.load(folder).trace().meta
    assert meta.rank_source == "run folder" and meta.world_size == 1 and meta.clock_offset_ns is None
    (typed,) = [w for w in meta.warnings if "wrong type" in w]
    assert str(info_path) in typed and all(key in typed for key in ("world_size", "clock", "devices"))
    assert any("capture files missing for comm" in w for w in meta.warnings)  # only names inside the folder
