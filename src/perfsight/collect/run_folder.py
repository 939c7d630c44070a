"""The run folder: what one profiling window of one rank leaves on disk, written atomically.

Layout (one folder per window and rank)::

    {worker_name}_{timestamp}_perfsight/
        profiler_info_{rank}.json        configuration, rank, world size, local rank, host, devices,
                                         versions, clock offset and uncertainty, window, complete
        profiler_metadata.json           user metadata, process groups (global ranks), parallel layout
        kineto_trace_{rank}.json         the raw Kineto (Chrome) trace, as torch.profiler exports it
        perfsight_{capture}_{rank}.parquet   perfsight's own capture tables (comm, dataloader, ...)
        WINDOW_INCOMPLETE                present while the window is recording or when it was cut
        PROFILER_OUTPUT/                 the analysis (seed-named CSV/JSON, optional SQLite db)
        cache/                           Parquet cache of the analysis (removed by data_simplification)

Why this order of writes: the folder and ``profiler_info`` (``"complete": false``) and the marker
are written when recording *starts*, so a rank killed mid-window leaves a folder that says so;
the trace, the sidecars and the metadata follow at the window's end, each under a temporary name
renamed into place, and ``profiler_info`` is rewritten last as the commit point.

The names of the files are in :mod:`perfsight.layout` (the reader in ``perfsight.ingest.run_folder``
uses them too); this module holds the writes and the facts about the running process.  It must
not import torch at module level.
"""

from __future__ import annotations

import datetime
import errno
import json
import os
import platform
import re
import socket
import sys
from pathlib import Path
from typing import Any

from perfsight.layout import RUN_FOLDER_SUFFIX, trace_file


def folder_name(worker_name: str, when: datetime.datetime) -> str:
    """``{worker_name}_{YYYYmmddHHMMSSffffff}_perfsight`` (UTC, microseconds: windows of one
    worker never collide)."""
    stamp = when.astimezone(datetime.UTC).strftime("%Y%m%d%H%M%S%f")
    return f"{safe_name(worker_name)}_{stamp}{RUN_FOLDER_SUFFIX}"


def safe_name(name: str) -> str:
    """``name`` usable as one path component: no separators, no leading dots, printable ASCII
    (a worker name like ``../x`` must not place the folder outside ``dir_name``)."""
    cleaned = re.sub(r"[^A-Za-z0-9._-]+", "_", str(name)).lstrip(".")
    return cleaned[:100] or "worker"


def default_worker_name() -> str:
    """As torch's handler: ``{host}_{pid}``, unique per process and thus per rank."""
    return f"{socket.gethostname()}_{os.getpid()}"


# ---------------------------------------------------------------------------------------- writes


def _fsync_dir(folder: Path) -> None:
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def write_bytes_atomic(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` so that readers see the old file or the whole new one."""
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        with open(tmp, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def write_json_atomic(path: Path, obj: Any) -> None:
    write_bytes_atomic(path, json.dumps(obj, indent=2, sort_keys=False, default=str).encode() + b"\n")


def write_parquet_atomic(path: Path, table: Any) -> None:
    import pyarrow.parquet as pq

    tmp = path.with_name(f".{path.name}.tmp")
    try:
        pq.write_table(table, tmp, compression="zstd")
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def export_trace_atomic(prof: Any, folder: Path, rank: int) -> Path:
    """Export the Kineto trace of the window that just ended into ``folder``.

    Kineto's C++ writer does not report write errors, so a full disk would leave a cut JSON:
    the file's end is checked, and a cut file on a full disk raises ``ENOSPC`` like a Python
    write would.
    """
    final = folder / trace_file(rank)
    tmp = folder / f".{final.name}.tmp"
    try:
        prof.export_chrome_trace(str(tmp))
        _check_trace_written(tmp)
        os.replace(tmp, final)
    except BaseException:
        for leftover in folder.glob(f"{tmp.name}*"):  # ours, and Kineto's own "<name>.tmp"
            leftover.unlink(missing_ok=True)
        raise
    return final


def _check_trace_written(path: Path) -> None:
    try:
        size = path.stat().st_size
        with open(path, "rb") as handle:
            handle.seek(max(0, size - 64))
            tail = handle.read().rstrip()
    except FileNotFoundError:
        size, tail = 0, b""
    if tail.endswith(b"}"):
        return
    stats = os.statvfs(path.parent)
    free = stats.f_bavail * stats.f_frsize
    if free < 1 << 20:
        raise OSError(errno.ENOSPC, f"No space left on device (trace cut at {size} bytes)", str(path))
    raise OSError(errno.EIO, f"trace export incomplete ({size} bytes, no closing brace)", str(path))


# ------------------------------------------------------------------------------ process facts


def identity() -> dict[str, Any]:
    """Rank, world size, local rank and host of this process.

    From ``torch.distributed`` when a process group is initialised, else the launcher's
    environment (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK`` as torchrun sets them), else a single
    process.
    """
    rank, world, source = 0, 1, "default"
    dist = sys.modules.get("torch.distributed")
    if dist is not None and dist.is_available() and dist.is_initialized():
        rank, world, source = dist.get_rank(), dist.get_world_size(), "torch.distributed"
    elif "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        rank, world, source = _env_int("RANK", 0), _env_int("WORLD_SIZE", 1), "environment"
    local = _env_int("LOCAL_RANK", rank if world == 1 else -1)
    return {
        "rank": rank,
        "world_size": world,
        "local_rank": local if local >= 0 else None,
        "rank_source": source,
        "host": socket.gethostname(),
        "host_cpus": usable_cpus(),
        "pid": os.getpid(),
        **job_identity(),
    }


def usable_cpus() -> int | None:
    """CPU cores this process may run on (its affinity mask, else the machine's count).

    Why recorded: ranks that share a host with fewer cores than ranks wait for a core, and their
    timing then measures the machine, not the program (the advisor's ``oversubscribed_host``)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not on every platform
        return os.cpu_count()


JOB_ID_VARIABLES = ("TORCHELASTIC_RUN_ID", "SLURM_JOB_ID", "LSB_JOBID", "PBS_JOBID")
"""Where launchers and schedulers put the id of the job a process belongs to (first one set wins)."""


def job_identity() -> dict[str, str | None]:
    """What tells this job from another one, recorded so that a rank copied into the wrong job
    folder can be set aside when analysed (docs/CLUSTER.md, "Which ranks make a job").

    ``job_id``: the launcher's or scheduler's id (torchrun writes ``none`` when it has no id: not
    an id).  ``rendezvous``: ``MASTER_ADDR:MASTER_PORT``, the one address every rank of a job met
    at; two launches of the same script get different ports, so it tells them apart even
    without a scheduler.
    """
    job_id = next(
        (os.environ[name] for name in JOB_ID_VARIABLES if os.environ.get(name, "none").lower() != "none"),
        None,
    )
    addr, port = os.environ.get("MASTER_ADDR"), os.environ.get("MASTER_PORT")
    return {"job_id": job_id, "rendezvous": f"{addr}:{port}" if addr and port else None}


def _env_int(name: str, default: int) -> int:
    try:
        return int(os.environ[name])
    except (KeyError, ValueError):
        return default


def versions() -> dict[str, str]:
    import perfsight

    found = {"perfsight": perfsight.__version__, "python": platform.python_version()}
    torch = sys.modules.get("torch")
    if torch is not None:
        found["torch"] = str(torch.__version__)
        if getattr(torch.version, "cuda", None):
            found["cuda"] = str(torch.version.cuda)
        if getattr(torch.version, "hip", None):
            found["hip"] = str(torch.version.hip)
        try:
            if torch.cuda.is_available() and hasattr(torch.cuda, "nccl"):
                found["nccl"] = ".".join(str(v) for v in torch.cuda.nccl.version())
        except Exception:  # noqa: BLE001 - a version probe must not stop the run folder
            pass
    return found


def devices() -> list[dict[str, Any]]:
    """The accelerators this process can see (``DeviceInfo`` fields of the trace model)."""
    torch = sys.modules.get("torch")
    found: list[dict[str, Any]] = []
    if torch is None:
        return found
    try:
        if torch.cuda.is_available():
            for index in range(torch.cuda.device_count()):
                props = torch.cuda.get_device_properties(index)
                found.append(
                    {
                        "index": index,
                        "name": props.name,
                        "memory_bytes": int(props.total_memory),
                        "sm_count": int(getattr(props, "multi_processor_count", 0)) or None,
                        "compute_capability": f"{props.major}.{props.minor}",
                    }
                )
    except Exception:  # noqa: BLE001
        pass
    return found


def process_groups() -> tuple[str | None, list[dict[str, Any]]]:
    """The backend and every process group of this process, each with its global ranks."""
    dist = sys.modules.get("torch.distributed")
    if dist is None or not dist.is_available() or not dist.is_initialized():
        return None, []
    backend = str(dist.get_backend())
    try:
        groups = dist.distributed_c10d._get_all_pg_configs()
    except Exception:  # noqa: BLE001 - a private API; the run folder works without it
        groups = [{"pg_name": "0", "ranks": list(range(dist.get_world_size()))}]
    return backend, [
        {
            "name": str(g.get("pg_name")),
            "description": g.get("pg_desc"),
            "backend": str(g.get("backend_config")) if g.get("backend_config") is not None else None,
            "size": g.get("pg_size", len(g.get("ranks") or [])),
            "ranks": list(g.get("ranks") or []),
        }
        for g in groups
    ]
