"""No code change: ``perfsight run`` / ``PERFSIGHT_PROFILER_OPTIONS`` profile an unmodified script.

The scripts below never import perfsight; step boundaries come from their optimizer.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from perfsight.collect.autostart import ENV_VAR, parse_env
from perfsight.collect.options import OptionError
from perfsight.commands.run import site_dir

pytest.importorskip("torch")

TRAIN = textwrap.dedent(
    """
    import torch
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for step in range(6):
        model(torch.randn(8, 16)).pow(2).mean().backward()
        opt.step()
        opt.zero_grad()
    print("trained", flush=True)
    """
)

TRAIN_DDP = textwrap.dedent(
    """
    import os
    import torch, torch.distributed as dist
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(16, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for step in range(5):
        model(torch.randn(8, 16)).sum().backward()
        opt.step()
        opt.zero_grad()
    dist.barrier()  # all ranks done before gloo is torn down: torch 2.13 may abort at exit otherwise
    dist.destroy_process_group()
    print(f"trained rank {os.environ['RANK']}", flush=True)  # one write: both ranks share the pipe
    # torch 2.13's gloo still aborts now and then in its exit-time destructors ("terminate called
    # without an active exception"), with or without perfsight: 1 of 12 plain torchrun runs of this
    # script on a loaded 2-core machine.  Leave without them; every file is written by now.
    os._exit(0)
    """
)


def profiled_steps(run_folder: Path) -> list[int]:
    """Step numbers of the ``ProfilerStep#N`` ranges in the folder's raw Kineto trace."""
    (trace,) = run_folder.glob("kineto_trace_*.json")
    names = {e.get("name", "") for e in json.loads(trace.read_text())["traceEvents"]}
    return sorted(int(n.split("#")[1]) for n in names if n.startswith("ProfilerStep#"))


def perfsight(*args: str, cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "perfsight.cli", *args],
        capture_output=True,
        text=True,
        timeout=240,
        cwd=cwd,
        env={**os.environ, "OMP_NUM_THREADS": "1", **(env or {})},
    )


def test_unmodified_script_under_torchrun_gives_one_run_folder_per_rank(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text(TRAIN_DDP)
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
    done = perfsight(
        "run", "--output-path", "traces", "--start-step", "2", "--stop-step", "3", "--",
        *torchrun, "train.py", cwd=tmp_path,
    )  # fmt: skip
    report = f"stdout:\n{done.stdout}\nstderr:\n{done.stderr}"
    assert done.returncode == 0, report
    assert "trained rank 0" in done.stdout and "trained rank 1" in done.stdout, report
    folders = sorted((tmp_path / "traces").iterdir())
    assert len(folders) == 2 and all(f.name.endswith("_perfsight") for f in folders), (folders, report)
    ranks = []
    for folder in folders:
        (info_file,) = folder.glob("profiler_info_*.json")
        info = json.loads(info_file.read_text())
        ranks.append(info["rank"])
        assert info["world_size"] == 2 and info["complete"] is True
        clock = info["clock"]
        assert isinstance(clock["offset_ns"], int) and isinstance(clock["uncertainty_ns"], int)
        assert info["window"]["steps"] == [2, 3]
        assert profiled_steps(folder) == [2, 3]
    assert sorted(ranks) == [0, 1]


def test_options_from_the_variable_and_flags_reach_the_profiler_and_their_sitecustomize_runs(
    tmp_path: Path,
) -> None:
    theirs = tmp_path / "their_site"
    theirs.mkdir()
    (theirs / "sitecustomize.py").write_text("import os\nos.environ['THEIR_SITE_RAN'] = 'yes'\n")
    (tmp_path / "train.py").write_text(
        TRAIN + "import os\nprint('their site:', os.environ.get('THEIR_SITE_RAN'))\n"
    )
    options = {"start": True, "start_step": 3, "stop_step": 4, "profile_memory": True}
    done = perfsight(
        "run", "--output-path", "out", "--level", "Level1", "--", sys.executable, "train.py",
        cwd=tmp_path, env={ENV_VAR: json.dumps(options), "PYTHONPATH": str(theirs)},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "trained" in done.stdout and "their site: yes" in done.stdout
    (folder,) = (tmp_path / "out").iterdir()
    info = json.loads(next(folder.glob("profiler_info_*.json")).read_text())
    assert info["config"]["profiler_level"] == "Level1" and info["config"]["profile_memory"] is True
    assert profiled_steps(folder) == [3, 4]


def test_invalid_options_in_the_variable_name_the_key_and_training_completes(tmp_path: Path) -> None:
    """Without ``perfsight run``'s check (the variable set by hand, e.g. in a cluster script)."""
    (tmp_path / "train.py").write_text(TRAIN)
    value = '{"start": true, "profiler_level": "Level9", "output_path": "out"}'
    env = {**os.environ, ENV_VAR: value, "PYTHONPATH": site_dir()}
    done = subprocess.run(
        [sys.executable, "train.py"], capture_output=True, text=True, cwd=tmp_path, env=env, timeout=240
    )  # as perfsight() above: importing torch alone took 75 s at load average 15 on 2 cores
    assert done.returncode == 0 and "trained" in done.stdout, done.stderr
    assert f"{ENV_VAR}: key 'profiler_level': 'Level9' is not one of Level0" in done.stderr
    assert "Traceback" not in done.stderr
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    ("value", "named"),
    [
        ('{"start": true, "stop_stpe": 4}', "key 'stop_stpe': is not a perfsight option"),
        ('{"start": true, "start_step": 1}', "key 'start_step': must be >= 2"),
        ('{"start": true, "start_step": 4, "stop_step": 3}', "key 'stop_step': 3 is before start_step 4"),
        ('{"start": true, "activities": ["CPU", "TPU"]}', "key 'activities'"),
        ('{"start": true, "export_type": 5}', "key 'export_type': code 5"),
        ('{"start": true, "analyse_mode": "later"}', "key 'analyse_mode'"),
        ('{"start": true, "output_path": ""}', "key 'output_path'"),
        ('{"start": "yes"}', "key 'start'"),
        ('{"start": true', "not valid JSON"),
        ("[true]", "must be a JSON object"),
    ],
)
def test_each_invalid_option_is_reported_by_its_key(value: str, named: str) -> None:
    with pytest.raises(OptionError, match=re.escape(named)) as caught:
        parse_env(value)
    assert str(caught.value).startswith(ENV_VAR)


def test_perfsight_run_refuses_bad_options_before_starting_the_command(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    command = ["--", sys.executable, "-c", f"open({str(marker)!r}, 'w')"]
    bad_start = perfsight("run", "--start-step", "1", *command, cwd=tmp_path)
    bad_level = perfsight("run", "--level", "Level5", *command, cwd=tmp_path)
    bad_env = perfsight("run", *command, cwd=tmp_path, env={ENV_VAR: '{"start": true, "with_stack": 1}'})
    for done, key in (
        (bad_start, "'start_step'"),
        (bad_level, "'profiler_level'"),
        (bad_env, "'with_stack'"),
    ):
        assert done.returncode == 2 and key in done.stderr and "Traceback" not in done.stderr
    assert not marker.exists()
    missing = perfsight("run", "--", "no-such-command-perfsight", cwd=tmp_path)
    assert missing.returncode == 127 and "command not found" in missing.stderr


def test_perfsight_run_becomes_the_command_exit_code_and_signals_included(tmp_path: Path) -> None:
    exits = perfsight("run", "--", sys.executable, "-c", "import sys; sys.exit(7)", cwd=tmp_path)
    assert exits.returncode == 7
    sleeper = subprocess.Popen(
        [sys.executable, "-m", "perfsight.cli", "run", "--", sys.executable, "-c",
         "import os, time; print(os.getpid(), flush=True); time.sleep(120)"],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, cwd=tmp_path,
    )  # fmt: skip
    try:
        assert int(sleeper.stdout.readline()) == sleeper.pid  # exec'd: same process
        sleeper.send_signal(signal.SIGTERM)
        assert sleeper.wait(timeout=30) == -signal.SIGTERM
    finally:
        if sleeper.poll() is None:
            sleeper.kill()


def test_perfsight_run_leaves_the_training_its_blas_threads(tmp_path: Path) -> None:
    # the analysis commands keep OpenBLAS to one thread (perfsight.cli); the user's training must
    # not inherit that
    script = "import os; print(os.environ.get('OPENBLAS_NUM_THREADS', 'unset'))"
    env = {k: v for k, v in os.environ.items() if k != "OPENBLAS_NUM_THREADS"}
    done = subprocess.run(
        [sys.executable, "-m", "perfsight.cli", "run", "--", sys.executable, "-c", script],
        capture_output=True, text=True, timeout=120, cwd=tmp_path, env=env,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "unset"


def test_print_env_gives_shell_lines_for_job_scripts(tmp_path: Path) -> None:
    done = perfsight("run", "--print-env", "--start-step", "5", "--stop-step", "6", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    lines = dict(
        shlex.split(line.removeprefix("export "))[0].split("=", 1) for line in done.stdout.splitlines()
    )
    assert lines["PYTHONPATH"].split(os.pathsep)[0] == site_dir()
    options = json.loads(lines[ENV_VAR])
    assert (options["start"], options["start_step"], options["stop_step"]) == (True, 5, 6)
    assert options["output_path"] == str(tmp_path / "perfsight_data")


def test_parse_env_defaults_and_switch_off() -> None:
    settings = parse_env('{"start": true}')
    assert settings is not None
    assert (settings.start_step, settings.stop_step, str(settings.output_path)) == (2, 6, "perfsight_data")
    assert settings.options.profiler_level.value == "Level0" and settings.options.activities is None
    assert parse_env('{"start": false, "start_step": 3}') is None
    seed_codes = parse_env(
        '{"start": true, "profiler_level": 2, "activities": 1, "export_type": 2, "aic_metrics": 1}'
    )
    assert seed_codes is not None
    assert seed_codes.options.profiler_level.value == "Level2"
    assert [a.value for a in seed_codes.options.activities] == ["CPU"]
    assert [e.value for e in seed_codes.options.export_type] == ["text", "db"]


def test_only_the_first_optimizer_counts_steps_so_two_optimizer_loops_keep_their_numbering(
    tmp_path: Path,
) -> None:
    import importlib

    import torch

    from perfsight.collect.autostart import HOOKED_MODULE, OptimizerStepProfiler

    settings = parse_env(
        json.dumps({"start": True, "start_step": 2, "stop_step": 3, "output_path": str(tmp_path)})
    )
    assert settings is not None
    profiler = OptimizerStepProfiler(settings)
    profiler.attach(importlib.import_module(HOOKED_MODULE))
    try:
        generator, critic = torch.nn.Linear(8, 8), torch.nn.Linear(8, 1)
        opt_g = torch.optim.SGD(generator.parameters(), lr=0.01)
        opt_c = torch.optim.SGD(critic.parameters(), lr=0.01)
        for _ in range(5):  # a GAN-style step: two optimizers, one training step
            critic(generator(torch.randn(4, 8))).mean().backward()
            opt_c.step()
            opt_g.step()
            opt_c.zero_grad()
            opt_g.zero_grad()
    finally:
        profiler.close()
    assert profiler.completed == 3  # the hook removed itself once step 3 was written
    (folder,) = tmp_path.iterdir()
    assert profiled_steps(folder) == [2, 3]
