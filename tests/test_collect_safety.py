"""Never hurt the training job: a failing handler, a full disk, a killed rank."""

from __future__ import annotations

import errno
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

import perfsight  # noqa: E402
from perfsight.collect.safety import ProfilingDisabledWarning  # noqa: E402

JOB = Path(__file__).with_name("_collect_job.py")
pytestmark = pytest.mark.timeout(300)  # two torch processes per test; 2 cores shared under load


def _train(prof: perfsight.collect.profile, steps: int) -> int:
    """A real training loop; returns the steps it completed."""
    model = torch.nn.Linear(16, 4)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    done = 0
    with prof:
        for _ in range(steps):
            loss = model(torch.randn(8, 16)).square().mean()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            prof.step()
            done += 1
    return done


def test_a_handler_that_raises_turns_profiling_off_and_training_finishes() -> None:
    calls = []

    def broken_handler(prof: object) -> None:
        calls.append(1)
        raise RuntimeError("handler bug")

    prof = perfsight.profile(
        schedule=perfsight.schedule(wait=0, active=1, repeat=0), on_trace_ready=broken_handler
    )
    with pytest.warns(ProfilingDisabledWarning, match="handler bug"):
        assert _train(prof, steps=6) == 6
    assert calls == [1]  # called once, then profiling was off for the remaining windows
    assert not prof.enabled
    assert "on_trace_ready" in (prof.guard.reason or "")


def test_enospc_from_the_os_turns_profiling_off_with_a_disk_full_warning(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # fsync(2) is where a full disk (or quota) reports ENOSPC for buffered writes
    def full(fd: int) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "fsync", full)
    prof = perfsight.profile(
        schedule=perfsight.schedule(wait=1, active=1, repeat=0),
        on_trace_ready=perfsight.tensorboard_trace_handler(tmp_path, analyse_flag=False),
    )
    with pytest.warns(ProfilingDisabledWarning, match="disk full"):
        assert _train(prof, steps=5) == 5
    assert not prof.enabled
    assert not list(tmp_path.rglob("kineto_trace_*.json"))  # nothing half-written left as a trace
    assert not list(tmp_path.rglob(".*.tmp"))


def _user_namespaces() -> bool:
    if shutil.which("unshare") is None:
        return False
    probe = subprocess.run(
        ["unshare", "-Urm", "sh", "-c", "mount -t tmpfs -o size=16k tmpfs /mnt"],
        capture_output=True,
        timeout=30,
        check=False,
    )
    return probe.returncode == 0


@pytest.mark.skipif(not _user_namespaces(), reason="needs unprivileged user+mount namespaces for a tmpfs")
def test_a_real_full_filesystem_stops_profiling_and_training_finishes(tmp_path: Path) -> None:
    out = tmp_path / "small"
    out.mkdir()
    # a 48 KiB tmpfs: the run folder's JSON fits, the first Kineto trace does not
    script = (
        f"mount -t tmpfs -o size=48k tmpfs {out} && "
        f"{sys.executable} {JOB} --out {out} --steps 8 --active 2; rc=$?; ls -la {out}/*; exit $rc"
    )
    result = subprocess.run(
        ["unshare", "-Urm", "sh", "-c", script], capture_output=True, text=True, timeout=150, check=False
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert "trained 8 steps; profiling off" in result.stdout
    assert "disk full" in result.stderr
    assert "kineto_trace_0.json" not in result.stdout  # no cut trace under the final name


def test_a_rank_killed_mid_window_leaves_earlier_windows_intact_and_the_cut_one_marked(
    tmp_path: Path,
) -> None:
    out = tmp_path / "run"
    # windows of 2 active steps: steps 0-1 written, killed at step 3 inside the window of steps 2-3
    result = subprocess.run(
        [sys.executable, str(JOB), "--out", str(out), "--steps", "6", "--kill-at", "3"],
        capture_output=True,
        text=True,
        timeout=150,
        check=False,
    )
    assert result.returncode == -9
    folders = sorted(out.glob("*_perfsight"))
    assert len(folders) == 2
    infos = {f: json.loads((f / "profiler_info_0.json").read_text()) for f in folders}
    done = [f for f, info in infos.items() if info["complete"]]
    cut = [f for f, info in infos.items() if not info["complete"]]
    assert len(done) == 1 and len(cut) == 1
    assert infos[done[0]]["window"]["steps"] == [0, 1]
    assert infos[cut[0]]["status"] == "recording"
    assert (cut[0] / "WINDOW_INCOMPLETE").exists()
    assert not (cut[0] / "kineto_trace_0.json").exists()

    analysed = perfsight.load(out)  # the intact window reads; the cut one is named
    trace = analysed.trace(0)
    assert sorted(trace.steps.column("step").to_pylist()) == [0, 1]
    assert any(str(cut[0]) in w and "no trace written" in w for w in trace.meta.warnings)

    cli = subprocess.run(
        [sys.executable, "-m", "perfsight.cli", "analyse", str(cut[0]), "--no-progress"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert cli.returncode == 2
    assert str(cut[0]) in cli.stderr and "no trace written" in cli.stderr


@pytest.mark.skipif(not _user_namespaces(), reason="needs unprivileged user+mount namespaces for a tmpfs")
def test_a_disk_already_full_leaves_an_empty_marker_that_analyse_names(tmp_path: Path) -> None:
    disk, kept = tmp_path / "full", tmp_path / "kept"
    disk.mkdir()
    # a 16 KiB tmpfs filled by a ballast file: nothing of the window's fits, not even its marker's text
    script = (
        f"mount -t tmpfs -o size=16k tmpfs {disk} && (head -c 1000000 /dev/zero > {disk}/ballast; true) && "
        f"{sys.executable} {JOB} --out {disk}/run --steps 8 --active 2 --wrap; rc=$?; "
        f"cp -r {disk}/run {kept}; exit $rc"
    )
    result = subprocess.run(
        ["unshare", "-Urm", "sh", "-c", script], capture_output=True, text=True, timeout=150, check=False
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert "trained 8 steps; profiling off" in result.stdout and "disk full" in result.stderr
    (folder,) = kept.glob("*_perfsight")
    assert [p.name for p in folder.iterdir()] == ["WINDOW_INCOMPLETE"]
    assert (folder / "WINDOW_INCOMPLETE").stat().st_size == 0  # what the full disk let through

    cli = subprocess.run(
        [sys.executable, "-m", "perfsight.cli", "analyse", str(kept), "--no-progress"],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert cli.returncode == 2 and "Traceback" not in cli.stderr
    assert f"{folder}: window incomplete, no trace written" in cli.stderr
    assert "WINDOW_INCOMPLETE marker is empty" in cli.stderr


def test_a_window_killed_while_a_wrapped_handler_exports_it_is_named_beside_the_good_one(
    tmp_path: Path,
) -> None:
    out = tmp_path / "run"
    # the user's own on_trace_ready calls perfsight's handler; many small ops make each export last
    job = subprocess.Popen(
        [sys.executable, str(JOB), "--out", str(out), "--steps", "6", "--active", "3", "--wrap"]
        + ["--extra-ops", "10000"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    deadline = time.monotonic() + 240
    try:
        while job.poll() is None and time.monotonic() < deadline:
            written = list(out.glob("*_perfsight/kineto_trace_0.json"))
            if written and list(out.glob("*_perfsight/.kineto_trace_0.json.tmp*")):
                job.kill()  # SIGKILL while Kineto writes the second window
                break
            time.sleep(0.001)
        job.wait(30)
    finally:
        if job.poll() is None:
            job.kill()
    assert job.returncode == -9, "the second window's export was not caught in progress"
    folders = sorted(out.glob("*_perfsight"))
    assert len(folders) == 2
    good, cut = folders
    assert (good / "kineto_trace_0.json").is_file() and not (cut / "kineto_trace_0.json").exists()
    assert list(cut.glob(".kineto_trace_0.json.tmp*"))

    cli = subprocess.run(
        [sys.executable, "-m", "perfsight.cli", "analyse", str(out), "--no-progress"],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert cli.returncode == 0, cli.stderr[-2000:]
    named = [line for line in cli.stdout.splitlines() if str(cut) in line]
    assert len(named) == 1 and "no trace written" in named[0] and ".kineto_trace_0.json.tmp" in named[0]
    assert "the trace export was cut" in named[0]
    analysed = perfsight.load(out)
    assert sorted(analysed.trace(0).steps.column("step").to_pylist()) == [0, 1, 2]
