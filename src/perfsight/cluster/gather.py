"""Gather the rank outputs of a job from its hosts into one job folder, over SSH with keys.

The seed's collection script logs in with passwords (sshpass); this never does: ``scp``/``rsync``
run with ``BatchMode=yes``, so a host without key (or agent) access fails with a clear error
instead of prompting.  A host named ``.`` or ``local`` is this machine (a plain copy; also what
the tests exercise without SSH).

Aliasing: with an alias map (``{"10.0.0.7": "host-1", "node7": "host-1"}``), each host's folder
is named by its alias, and every occurrence of a mapped name or address as a JSON string in the
copied metadata (``profiler_info_*.json``, ``profiler_metadata.json``, and the header of each trace)
is replaced by its alias.  The map itself is never written into the job folder: it stays with the
user who may need to undo it.  ``auto_aliases`` makes ``host-1..N`` for a host list.
"""

from __future__ import annotations

import dataclasses
import json
import re
import shlex
import shutil
from collections.abc import Iterable, Mapping
from pathlib import Path

LOCAL_HOSTS = {".", "local"}
HEADER_BYTES = 1 << 16  # a trace's host name sits in its header, before the events
SSH_OPTIONS = ("-o", "BatchMode=yes", "-o", "ConnectTimeout=15")


class GatherError(ValueError):
    """A host could not be copied from; the message names it and says why."""


@dataclasses.dataclass(frozen=True)
class CopyPlan:
    host: str
    target: Path
    command: list[str] | None  # None: a local copy


def parse_hosts(spec: str) -> list[str]:
    """``h1,h2`` or ``@file`` (one host per line, ``#`` comments)."""
    if spec.startswith("@"):
        lines = Path(spec[1:]).read_text().splitlines()
        return [line.split("#", 1)[0].strip() for line in lines if line.split("#", 1)[0].strip()]
    return [h.strip() for h in spec.split(",") if h.strip()]


def load_aliases(path: str | Path) -> dict[str, str]:
    """An alias map from JSON (``{"name": "alias"}``) or lines ``name alias``."""
    text = Path(path).read_text()
    try:
        data = json.loads(text)
        return {str(k): str(v) for k, v in data.items()}
    except (ValueError, AttributeError):
        pairs = [line.split() for line in text.splitlines() if line.strip() and not line.startswith("#")]
        return {p[0]: p[1] for p in pairs if len(p) == 2}


def auto_aliases(hosts: Iterable[str]) -> dict[str, str]:
    return {host: f"host-{i}" for i, host in enumerate(hosts, start=1) if host not in LOCAL_HOSTS}


def plan(
    hosts: list[str], remote_dir: str, job_dir: Path, *, user: str | None = None, tool: str = "rsync",
    aliases: Mapping[str, str] | None = None, ssh_options: Iterable[str] = (),
) -> list[CopyPlan]:  # fmt: skip
    """The copy of each host: its target folder under ``job_dir`` and the command (never a password)."""
    aliases = aliases or {}
    plans = []
    for host in hosts:
        name = aliases.get(host, "localhost" if host in LOCAL_HOSTS else host)
        if not re.fullmatch(r"[A-Za-z0-9._-]+", name) or name in {".", ".."}:
            raise GatherError(f"host {host!r}: folder name {name!r} is not a plain name; give it an alias")
        target = job_dir / name
        if host in LOCAL_HOSTS:
            plans.append(CopyPlan(host, target, None))
            continue
        login = f"{user}@{host}" if user else host
        ssh = ["ssh", *SSH_OPTIONS, *ssh_options]
        source = f"{login}:{remote_dir.rstrip('/')}/"
        if tool == "rsync":
            command = ["rsync", "-a", "--partial", "-e", shlex.join(ssh), source, f"{target}/"]
        elif tool == "scp":
            command = [
                "scp",
                "-r",
                "-p",
                *SSH_OPTIONS,
                *ssh_options,
                f"{login}:{remote_dir.rstrip('/')}/.",
                str(target),
            ]
        else:
            raise GatherError(f"unknown copy tool {tool!r}; use rsync or scp")
        plans.append(CopyPlan(host, target, command))
    return plans


def run_plan(copy: CopyPlan, remote_dir: str, timeout: float = 3600) -> None:
    """Copy one host's outputs; raises GatherError naming the host on failure."""
    import subprocess

    copy.target.mkdir(parents=True, exist_ok=True)
    if copy.command is None:
        source = Path(remote_dir)
        if not source.is_dir():
            raise GatherError(f"host {copy.host}: {source} is not a folder")
        shutil.copytree(source, copy.target, dirs_exist_ok=True)
        return
    try:
        result = subprocess.run(copy.command, capture_output=True, text=True, timeout=timeout, check=False)
    except FileNotFoundError:
        raise GatherError(f"host {copy.host}: {copy.command[0]} is not installed here") from None
    except subprocess.TimeoutExpired:
        raise GatherError(f"host {copy.host}: copy did not finish within {timeout:.0f} s") from None
    if result.returncode != 0:
        reason = (result.stderr.strip().splitlines() or ["no message"])[-1]
        raise GatherError(f"host {copy.host}: {copy.command[0]} failed ({reason})")


def apply_aliases(folder: Path, aliases: Mapping[str, str]) -> list[Path]:
    """Replace mapped host names/addresses by their aliases in the copied metadata; returns the
    files changed.  Only whole JSON string values are replaced (``"node7"``, not ``node7x``), also
    with a port (the run folder's ``"rendezvous": "10.0.0.7:29500"`` becomes ``"addr-1:29500"``)."""
    if not aliases:
        return []
    inner = {json.dumps(name)[1:-1]: json.dumps(alias)[1:-1] for name, alias in aliases.items()}
    names = "|".join(re.escape(name) for name in sorted(inner, key=len, reverse=True))
    pattern = re.compile(f'"({names})(:[0-9]+)?"')

    def alias(match: re.Match[str]) -> str:
        return f'"{inner[match.group(1)]}{match.group(2) or ""}"'

    changed = []
    for path in sorted(folder.rglob("*.json")):
        if path.name.startswith("profiler_info") or path.name == "profiler_metadata.json":
            text = path.read_text()
            new = pattern.sub(alias, text)
            if new != text:
                path.write_text(new)
                changed.append(path)
        elif path.stat().st_size > 0:  # a trace: only its header carries the host name
            with path.open("r+b") as handle:
                head = handle.read(HEADER_BYTES).decode("utf-8", "replace")
                new = pattern.sub(alias, head)
                if new != head and len(new.encode()) == len(head.encode()):
                    handle.seek(0)
                    handle.write(new.encode())
                    changed.append(path)
                elif new != head:  # different length: rewrite the file (streamed)
                    _rewrite_head(path, new, len(head.encode("utf-8", "replace")))
                    changed.append(path)
    return changed


def _rewrite_head(path: Path, head: str, old_head_bytes: int) -> None:
    tmp = path.with_name(path.name + ".perfsight-tmp")
    with path.open("rb") as src, tmp.open("wb") as dst:
        src.seek(old_head_bytes)
        dst.write(head.encode())
        shutil.copyfileobj(src, dst, 1 << 22)
    tmp.replace(path)
