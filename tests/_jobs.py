"""A base dir like `make demo`'s, built from real multi-process jobs, for the job-page tests.

Why a helper of its own: the run-list regression test (tests/test_server_job_list.py) and the
browser tests of the job pages (tests/test_ui_job_pages.py) need the same two real jobs -- a gloo
DDP job (examples/train_ddp.py) and a 2-stage pipeline job with an overloaded stage
(examples/train_pp.py --overload-stage 1) -- and training them takes tens of seconds, so they are
made once per test session (under a lock, for xdist workers) and copied into each test's base dir.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from shared_data import REPO

EXAMPLES = REPO / "examples"
JOB_TIMEOUT = 300
DDP_JOB = "run"  # the names `make demo` gives its jobs under demo_output/
PP_JOB = "pp"
STRAGGLER_JOB = "straggler"
DDP_RANKS = 4  # as `make demo` trains it (issue 16: the 4-rank gloo DDP job)
OVERLOADED_STAGE = 1
SLOW_RANK = 1  # examples/train_ddp_straggler.py's rank given 40 extra matrix products per step


def run_example(script: str, out: Path, *args: str) -> None:
    result = subprocess.run(
        [
            "timeout",
            "-k",
            "10",
            str(JOB_TIMEOUT),
            sys.executable,
            str(EXAMPLES / script),
            "--out",
            str(out),
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=JOB_TIMEOUT + 30,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]


def trained_jobs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder with the DDP job under ``run/`` and the pipeline job under ``pp/``, trained once per
    session; treat it as read-only (copy it with :func:`demo_base`)."""
    from filelock import FileLock

    root = tmp_path_factory.getbasetemp()
    shared = root.parent if os.environ.get("PYTEST_XDIST_WORKER") else root
    folder = shared / "demo-jobs"
    with FileLock(str(shared / "demo-jobs.lock")):
        if not (folder / "done").is_file():
            shutil.rmtree(folder, ignore_errors=True)
            run_example("train_ddp.py", folder / DDP_JOB, "--world-size", str(DDP_RANKS))
            run_example(
                "train_pp.py",
                folder / PP_JOB,
                "--stages",
                "2",
                "--overload-stage",
                str(OVERLOADED_STAGE),
                "--batch-size",
                "256",
            )
            run_example(
                "train_ddp_straggler.py", folder / STRAGGLER_JOB, "--world-size", "2",
                "--slow-rank", str(SLOW_RANK), "--slow-factor", "40", "--active", "5",
            )  # fmt: skip
            (folder / "done").write_text("ok")
    return folder


TP_JOB = "tp"  # examples/train_tp.py: 2 ranks, one tensor-parallel group (mesh_tp)
DP_PP_JOB = "dp_pp"  # examples/train_dp_pp.py: 4 ranks, 2 pipelines x 2 stages, "dp" groups {0, 2}, {1, 3}


def parallel_jobs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tensor-parallel and the data x pipeline job (``tp/``, ``dp_pp/``), trained once per
    session for the tests that need them (apart from :func:`trained_jobs`, which every job-page
    test waits for); treat it as read-only and copy what you use."""
    from filelock import FileLock

    root = tmp_path_factory.getbasetemp()
    shared = root.parent if os.environ.get("PYTEST_XDIST_WORKER") else root
    folder = shared / "parallel-jobs"
    with FileLock(str(shared / "parallel-jobs.lock")):
        if not (folder / "done").is_file():
            shutil.rmtree(folder, ignore_errors=True)
            run_example("train_tp.py", folder / TP_JOB, "--active", "2")
            run_example("train_dp_pp.py", folder / DP_PP_JOB, "--active", "2")
            (folder / "done").write_text("ok")
    return folder


def demo_base(tmp_path_factory: pytest.TempPathFactory, base: Path, straggler: bool = False) -> Path:
    """``base`` filled like `make demo`'s output: the two jobs, and the DDP job analysed by the CLI
    into ``analysis/`` (the pipeline job is left for the server to analyse); with ``straggler``,
    also a DDP job one rank of which is made slow."""
    jobs = trained_jobs(tmp_path_factory)
    base.mkdir(parents=True)
    for name in (DDP_JOB, PP_JOB, *([STRAGGLER_JOB] if straggler else [])):
        shutil.copytree(jobs / name, base / name, symlinks=True)
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "perfsight.cli",
            "analyse",
            str(base / DDP_JOB),
            "--out",
            str(base / "analysis"),
        ],
        capture_output=True,
        text=True,
        timeout=JOB_TIMEOUT,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return base
