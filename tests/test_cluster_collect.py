"""``perfsight collect``: what can be checked without SSH -- the commands built, local copies, aliasing."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from perfsight.cluster import gather


def _collect(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "perfsight.cli", "collect", *args], capture_output=True, text=True, timeout=60
    )


def test_ssh_copies_use_keys_only_and_never_prompt_for_a_password(tmp_path: Path) -> None:
    result = _collect(
        "--hosts", "10.0.0.7,node8", "--remote-dir", "/data/prof", "--job-dir", str(tmp_path / "job"),
        "--user", "ml", "--ssh-option", "-p 2222", "--dry-run",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert len(lines) == 2
    assert lines[0].startswith("rsync -a --partial -e 'ssh -o BatchMode=yes")
    assert "-p 2222" in lines[0] and f"ml@10.0.0.7:/data/prof/ {tmp_path / 'job' / '10.0.0.7'}/" in lines[0]
    assert "sshpass" not in result.stdout and "password" not in result.stdout.lower()
    scp = gather.plan(["node8"], "/data/prof", tmp_path, tool="scp")[0].command
    assert scp is not None and scp[:2] == ["scp", "-r"] and "BatchMode=yes" in scp


def test_a_local_host_is_copied_and_its_names_are_replaced_by_aliases(tmp_path: Path) -> None:
    remote = tmp_path / "remote"
    (remote / "rank0_x_perfsight").mkdir(parents=True)
    info = {"rank": 0, "host": "gpu-node-7.corp", "addresses": ["10.0.0.7"], "note": "gpu-node-7.corp-backup"}
    info["rendezvous"] = "10.0.0.7:29500"  # as run folders record MASTER_ADDR:MASTER_PORT
    (remote / "rank0_x_perfsight" / "profiler_info_0.json").write_text(json.dumps(info))
    trace = '{"distributedInfo": {"rank": 0}, "host_name": "gpu-node-7.corp", "traceEvents": []}'
    (remote / "rank0_x_perfsight" / "rank0.pt.trace.json").write_text(trace)
    alias_file = tmp_path / "aliases.json"
    alias_file.write_text(json.dumps({"gpu-node-7.corp": "host-1", "10.0.0.7": "addr-1"}))
    job = tmp_path / "job"
    result = _collect(
        "--hosts", ".", "--remote-dir", str(remote), "--job-dir", str(job), "--alias-file", str(alias_file)
    )
    assert result.returncode == 0, result.stderr
    copied = job / "localhost" / "rank0_x_perfsight"
    info_after = json.loads((copied / "profiler_info_0.json").read_text())
    assert info_after["host"] == "host-1" and info_after["addresses"] == ["addr-1"]
    assert info_after["note"] == "gpu-node-7.corp-backup"  # only whole names are replaced
    assert info_after["rendezvous"] == "addr-1:29500"
    assert json.loads((copied / "rank0.pt.trace.json").read_text())["host_name"] == "host-1"
    assert "gpu-node-7" not in (copied / "rank0.pt.trace.json").read_text()
    assert not any("aliases" in p.name for p in job.rglob("*"))  # the map stays with the user


def test_anonymise_writes_the_map_outside_the_job_and_refuses_inside(tmp_path: Path) -> None:
    job = tmp_path / "job"
    inside = _collect(
        "--hosts", "a,b", "--remote-dir", "/x", "--job-dir", str(job), "--anonymise",
        "--alias-file", str(job / "map.json"), "--dry-run",
    )  # fmt: skip
    assert inside.returncode == 2 and "must not be inside the job folder" in inside.stderr
    outside = _collect(
        "--hosts", "a,b", "--remote-dir", "/x", "--job-dir", str(job), "--anonymise",
        "--alias-file", str(tmp_path / "map.json"), "--dry-run",
    )  # fmt: skip
    assert outside.returncode == 0, outside.stderr
    assert json.loads((tmp_path / "map.json").read_text()) == {"a": "host-1", "b": "host-2"}
    assert f"{job / 'host-1'}/" in outside.stdout and "a:/x/" in outside.stdout
