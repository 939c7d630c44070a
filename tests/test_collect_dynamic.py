"""DynamicProfilerMonitor + ``perfsight trigger``: windows asked for while the job runs, exactly.

The multi-rank test is a real 2-process gloo DDP job under torchrun; ``perfsight trigger`` runs
in another process while the job waits at a known step (so the test does not depend on timing).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
import warnings
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from perfsight.collect.dynamic import DynamicConfigWarning, DynamicProfilerMonitor  # noqa: E402
from perfsight.collect.dynamic_config import CONFIG_NAME  # noqa: E402

REPO = Path(__file__).resolve().parents[1]


def profiled_steps(run_folder: Path) -> list[int]:
    """Step numbers of the ``ProfilerStep#N`` ranges in the folder's raw Kineto trace."""
    (trace,) = run_folder.glob("kineto_trace_*.json")
    events = json.loads(trace.read_text())["traceEvents"]
    names = {e.get("name", "") for e in events}
    return sorted(int(n.split("#")[1]) for n in names if n.startswith("ProfilerStep#"))


def window_folders(output: Path) -> dict[str, list[Path]]:
    """``rank{r}_start{a}_stop{b}`` -> the run folders inside it."""
    return {d.name: sorted(d.glob("*_perfsight")) for d in sorted(output.iterdir()) if d.is_dir()}


def perfsight_cli(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "perfsight.cli", *args], capture_output=True, text=True, timeout=timeout
    )


class TinyTraining:
    """A real (small) training step on the CPU."""

    def __init__(self) -> None:
        torch.manual_seed(0)
        self.model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
        self.opt = torch.optim.SGD(self.model.parameters(), lr=0.01)

    def step(self) -> None:
        self.model(torch.randn(8, 16)).pow(2).mean().backward()
        self.opt.step()
        self.opt.zero_grad()


def write_config(cfg_dir: Path, **keys: object) -> None:
    """Replace the config as an editor that saves in place would (no rename)."""
    path = cfg_dir / CONFIG_NAME
    doc = json.loads(path.read_text()) if path.exists() else {}
    doc.update(keys)
    path.write_text(json.dumps(doc))
    # a same-size rewrite within one mtime tick would look unchanged: make the change visible
    st = path.stat()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))


def test_a_missing_config_is_created_with_defaults_and_collects_nothing(tmp_path: Path) -> None:
    cfg, out = tmp_path / "cfg", tmp_path / "out"
    monitor = DynamicProfilerMonitor(cfg, out)
    doc = json.loads((cfg / CONFIG_NAME).read_text())
    assert doc["start_step"] == -1 and doc["stop_step"] == -1
    assert doc["profiler_level"] == "Level0" and doc["export_type"] == ["text"]
    assert {"activities", "profile_memory", "with_stack", "analyse_mode", "data_simplification"} <= doc.keys()
    training = TinyTraining()
    for _ in range(3):
        training.step()
        monitor.step()
    monitor.close()
    assert not out.exists() or not any(out.iterdir())


def test_edits_between_steps_give_exactly_the_requested_windows(tmp_path: Path) -> None:
    cfg, out = tmp_path / "cfg", tmp_path / "out"
    cfg.mkdir()
    write_config(cfg, start_step=1, stop_step=2)
    monitor = DynamicProfilerMonitor(cfg, out)
    training = TinyTraining()
    for step in range(1, 10):
        training.step()
        monitor.step()
        if step == 4:
            write_config(cfg, start_step=6, stop_step=8, profile_memory=True)
    monitor.close()
    windows = window_folders(out)
    assert list(windows) == ["rank0_start1_stop2", "rank0_start6_stop8"]
    assert [profiled_steps(f) for (f,) in windows.values()] == [[1, 2], [6, 7, 8]]
    (late,) = windows["rank0_start6_stop8"]
    info = json.loads((late / "profiler_info_0.json").read_text())
    assert info["complete"] is True and info["config"]["profile_memory"] is True
    assert [p.name for p in monitor.folders] == [f.name for (f,) in windows.values()]


def test_an_invalid_edit_warns_naming_the_key_and_training_goes_on(tmp_path: Path) -> None:
    cfg, out = tmp_path / "cfg", tmp_path / "out"
    monitor = DynamicProfilerMonitor(cfg, out)
    training = TinyTraining()
    caught: list[str] = []
    edits = {
        1: {"start_step": 4, "stop_step": 5, "profiler_level": "Level7"},
        2: {"start_step": 4, "stop_step": 5, "profiler_level": "Level0", "with_stack": "yes"},
        3: {"start_step": 6, "stop_step": 5, "with_stack": False},
        4: {"start_step": 7, "stop_step": 7, "stop_stpe": 9},
    }
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        for step in range(1, 9):
            training.step()
            monitor.step()
            if step in edits:
                write_config(cfg, **edits[step])
        (cfg / CONFIG_NAME).write_text('{"start_step": 9, ')  # cut off mid-write
        training.step()
        monitor.step()
        caught = [str(w.message) for w in seen if issubclass(w.category, DynamicConfigWarning)]
    monitor.close()
    assert any("'profiler_level'" in m and "Level7" in m for m in caught)
    assert any("'with_stack'" in m for m in caught)
    assert any("'stop_step'" in m and "before start_step 6" in m for m in caught)
    assert any("'stop_stpe'" in m and "ignored" in m for m in caught)
    assert any("not valid JSON" in m and CONFIG_NAME in m for m in caught)
    assert monitor.enabled and monitor.step_num == 9
    # only the valid request (step 7, with its unknown key ignored) was collected
    windows = window_folders(out)
    assert list(windows) == ["rank0_start7_stop7"]
    assert profiled_steps(windows["rank0_start7_stop7"][0]) == [7]


def test_a_start_step_that_already_ran_is_refused_with_a_warning(tmp_path: Path) -> None:
    cfg, out = tmp_path / "cfg", tmp_path / "out"
    monitor = DynamicProfilerMonitor(cfg, out)
    training = TinyTraining()
    for _ in range(3):
        training.step()
        monitor.step()
    write_config(cfg, start_step=2, stop_step=5)
    training.step()
    with pytest.warns(
        DynamicConfigWarning, match=r"'start_step': step 2 has already run \(step 5 runs next\)"
    ):
        monitor.step()
    monitor.close()
    assert not out.exists()


def test_training_shorter_than_the_window_leaves_it_marked_incomplete(tmp_path: Path) -> None:
    cfg, out = tmp_path / "cfg", tmp_path / "out"
    cfg.mkdir()
    write_config(cfg, start_step=2, stop_step=10)
    monitor = DynamicProfilerMonitor(cfg, out)
    training = TinyTraining()
    for _ in range(4):
        training.step()
        monitor.step()
    with pytest.warns(UserWarning, match=r"steps 2..10 were requested but training ended after step 4"):
        monitor.close()  # what the exit hook does when training ends inside the window
    ((folder,),) = window_folders(out).values()
    info = json.loads((folder / "profiler_info_0.json").read_text())
    assert info["complete"] is False and "3 of the window's 9" in info["incomplete_reason"]
    assert info["window"]["steps"] == [2, 3, 4]
    # the trace also holds the start of step 5, cut by the end of training
    assert profiled_steps(folder)[:3] == [2, 3, 4]


def test_trigger_validates_and_keeps_the_other_keys(tmp_path: Path) -> None:
    cfg = tmp_path / "cfg"
    cfg.mkdir()
    (cfg / CONFIG_NAME).write_text(json.dumps({"start_step": -1, "stop_step": -1, "profile_memory": True}))
    done = perfsight_cli("trigger", str(cfg), "--start", "12", "--stop", "14", "--level", "Level1")
    assert done.returncode == 0, done.stderr
    doc = json.loads((cfg / CONFIG_NAME).read_text())
    assert (doc["start_step"], doc["stop_step"], doc["profiler_level"], doc["profile_memory"]) == (
        12,
        14,
        "Level1",
        True,
    )
    bad_range = perfsight_cli("trigger", str(cfg), "--start", "5", "--stop", "3")
    bad_level = perfsight_cli("trigger", str(cfg), "--start", "5", "--level", "Level9")
    no_dir = perfsight_cli("trigger", str(tmp_path / "nope"), "--start", "5")
    assert (
        bad_range.returncode == 2
        and "'stop_step'" in bad_range.stderr
        and "Traceback" not in bad_range.stderr
    )
    assert bad_level.returncode == 2 and "'profiler_level'" in bad_level.stderr
    assert no_dir.returncode == 2 and "no such folder" in no_dir.stderr
    assert json.loads((cfg / CONFIG_NAME).read_text()) == doc  # refused edits change nothing


JOB = textwrap.dedent(
    """
    import os, sys, time
    from pathlib import Path
    import torch, torch.distributed as dist
    from perfsight.collect.dynamic import DynamicProfilerMonitor

    cfg, out, sync = sys.argv[1], sys.argv[2], Path(sys.argv[3])
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(16, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    monitor = DynamicProfilerMonitor(cfg, out)
    for step in range(1, 13):
        model(torch.randn(8, 16)).sum().backward()
        opt.step()
        opt.zero_grad()
        monitor.step()
        if step == 5:  # wait here until the test has run `perfsight trigger`
            (sync / f"at5_rank{dist.get_rank()}").touch()
            deadline = time.monotonic() + 120
            while not (sync / "go").exists() and time.monotonic() < deadline:
                time.sleep(0.05)
    dist.barrier()  # all ranks done before gloo is torn down: torch 2.13 may abort at exit otherwise
    dist.destroy_process_group()
    print(f"trained {monitor.step_num}", flush=True)  # one write: both ranks share the pipe
    # torch 2.13's gloo aborts now and then in its exit-time destructors ("terminate called without
    # an active exception", after "trained 12": once in a full run on 2 busy cores; see
    # test_collect_autostart.py); every window is written by now, so leave without them
    os._exit(0)
    """
)


def test_trigger_from_another_process_gives_every_rank_exactly_the_requested_windows(tmp_path: Path) -> None:
    cfg, out, sync = tmp_path / "cfg", tmp_path / "out", tmp_path / "sync"
    cfg.mkdir()
    sync.mkdir()
    script = tmp_path / "job.py"
    script.write_text(JOB)
    first = perfsight_cli("trigger", str(cfg), "--start", "2", "--stop", "3")
    assert first.returncode == 0, first.stderr
    job = subprocess.Popen(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
        + [str(script), str(cfg), str(out), str(sync)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    try:
        deadline = time.monotonic() + 150
        while not all((sync / f"at5_rank{r}").exists() for r in (0, 1)):
            assert job.poll() is None, job.stdout.read()
            assert time.monotonic() < deadline, "the job never reached step 5"
            time.sleep(0.1)
        second = perfsight_cli("trigger", str(cfg), "--start", "8", "--stop", "10")
        assert second.returncode == 0, second.stderr
        (sync / "go").touch()
        output, _ = job.communicate(timeout=150)
    finally:
        if job.poll() is None:
            job.kill()
    assert job.returncode == 0, output
    assert output.count("trained 12") == 2
    windows = window_folders(out)
    assert sorted(windows) == [
        "rank0_start2_stop3",
        "rank0_start8_stop10",
        "rank1_start2_stop3",
        "rank1_start8_stop10",
    ]
    for name, folders in windows.items():
        assert len(folders) == 1, name
        rank = int(name[4])
        expected = [2, 3] if "start2" in name else [8, 9, 10]
        assert profiled_steps(folders[0]) == expected, name
        info = json.loads((folders[0] / f"profiler_info_{rank}.json").read_text())
        assert info["rank"] == rank and info["world_size"] == 2 and info["complete"] is True
        # aligned once by the monitor, recorded in every window of every rank
        clock = info["clock"]
        assert isinstance(clock["offset_ns"], int) and isinstance(clock["uncertainty_ns"], int)


class FifoWatchdog:
    """Unblocks a reader stuck on a FIFO after ``after`` seconds and remembers it had to.

    Opening a FIFO for writing without blocking fails (ENXIO) while nobody is reading it, so a
    successful open proves a reader was waiting: the test then fails instead of hanging.
    """

    def __init__(self, fifo: Path, after: float) -> None:
        import threading

        self.fifo, self.after, self.rescued = fifo, after, False
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        if self.stop.wait(self.after):
            return
        while not self.stop.is_set():
            try:
                fd = os.open(self.fifo, os.O_WRONLY | os.O_NONBLOCK)
            except OSError:
                self.stop.wait(0.05)
                continue
            self.rescued = True
            os.write(fd, b"{}")
            os.close(fd)
            return

    def close(self) -> None:
        self.stop.set()
        self.thread.join(5)


@pytest.mark.timeout(120)
def test_a_fifo_at_the_config_path_never_blocks_training_and_a_later_file_is_read(tmp_path: Path) -> None:
    cfg, out = tmp_path / "cfg", tmp_path / "out"
    cfg.mkdir()
    fifo = cfg / CONFIG_NAME
    os.mkfifo(fifo)
    watchdog = FifoWatchdog(fifo, after=30)
    training = TinyTraining()
    started = time.monotonic()
    try:
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            monitor = DynamicProfilerMonitor(cfg, out)
            for step in range(1, 9):
                training.step()
                monitor.step()
                if step == 3:  # the FIFO is replaced by a real request: it is read and honoured
                    fifo.unlink()
                    write_config(cfg, start_step=6, stop_step=7)
            monitor.close()
    finally:
        watchdog.close()
    assert not watchdog.rescued, "the monitor blocked on the FIFO until the watchdog wrote to it"
    assert time.monotonic() - started < 30
    caught = [str(w.message) for w in seen if issubclass(w.category, DynamicConfigWarning)]
    assert len([m for m in caught if "a FIFO" in m]) == 1, caught  # one warning, not one per step
    assert any(str(fifo) in m and "previous configuration stays in force" in m for m in caught)
    assert monitor.enabled and monitor.step_num == 8
    windows = window_folders(out)
    assert list(windows) == ["rank0_start6_stop7"]
    assert profiled_steps(windows["rank0_start6_stop7"][0]) == [6, 7]


def test_a_config_nested_too_deeply_keeps_the_previous_request_in_force(tmp_path: Path) -> None:
    cfg, out = tmp_path / "cfg", tmp_path / "out"
    cfg.mkdir()
    write_config(cfg, start_step=4, stop_step=5)
    monitor = DynamicProfilerMonitor(cfg, out)
    training = TinyTraining()
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        for step in range(1, 8):
            training.step()
            monitor.step()
            if step == 1:
                (cfg / CONFIG_NAME).write_text("[" * 200_000)
        caught = [str(w.message) for w in seen if issubclass(w.category, DynamicConfigWarning)]
    monitor.close()
    assert any("nested too deeply" in m and CONFIG_NAME in m for m in caught), caught
    assert not [w for w in seen if "profiling turned off" in str(w.message)]
    assert monitor.enabled and monitor.step_num == 7
    windows = window_folders(out)
    assert list(windows) == ["rank0_start4_stop5"]  # the request made before the bad edit
    assert profiled_steps(windows["rank0_start4_stop5"][0]) == [4, 5]


def test_an_oversized_config_is_refused_without_being_read_whole(tmp_path: Path) -> None:
    cfg, out = tmp_path / "cfg", tmp_path / "out"
    cfg.mkdir()
    (cfg / CONFIG_NAME).write_text('{"start_step": 2, "stop_step": 3, "pad": "' + "x" * (2 << 20) + '"}')
    training = TinyTraining()
    with pytest.warns(DynamicConfigWarning, match=r"larger than the 1048576"):
        monitor = DynamicProfilerMonitor(cfg, out)
    for _ in range(4):
        training.step()
        monitor.step()
    monitor.close()
    assert monitor.enabled and not out.exists()
