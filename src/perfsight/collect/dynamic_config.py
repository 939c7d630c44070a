"""``profiler_config.json``: the file a running job's ``DynamicProfilerMonitor`` watches.

Why a module without torch: ``perfsight trigger`` (another shell, maybe another machine) reads,
validates and rewrites the same file the monitor reads, with the same rules.  Writes are atomic
(temporary file + rename), so a monitor polling the file never reads half of it, and the rename
gives the file a new inode, which the monitor's change check (:func:`signature`) sees even when
size and modification time happen to be equal.

Keys (seed 003, "方式二"): ``start_step`` / ``stop_step`` (steps count from 1; ``-1``: collect
nothing) and the collection switches of :mod:`perfsight.collect.options`.  The seed's Ascend-only
keys are accepted and ignored; any other key gets a warning (a typo must not pass silently).
"""

from __future__ import annotations

import dataclasses
import json
import os
import stat
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from perfsight.collect.options import CollectOptions, OptionError, int_value, parse_options, unknown_keys

CONFIG_NAME = "profiler_config.json"
WINDOW_KEYS = frozenset({"start_step", "stop_step"})
MAX_CONFIG_BYTES = 1 << 20
"""A config is a few hundred bytes; anything above 1 MiB is not one (and is not read whole)."""


class ConfigFileError(ValueError):
    """The config file cannot be read as a JSON object; the message names the file."""


@dataclasses.dataclass(frozen=True)
class DynamicConfig:
    """One state of ``profiler_config.json``: which steps to collect, and how."""

    start_step: int = -1
    stop_step: int = -1
    options: CollectOptions = dataclasses.field(default_factory=CollectOptions)

    @property
    def active(self) -> bool:
        """False for the default ``-1`` (no collection requested)."""
        return self.start_step >= 1

    def to_json(self) -> dict[str, Any]:
        return {"start_step": self.start_step, "stop_step": self.stop_step, **self.options.to_json()}


def config_file(cfg_path: str | os.PathLike[str]) -> Path:
    """The config file for ``cfg_path``: a folder (seed) holding ``profiler_config.json``, or the
    ``.json`` file itself."""
    path = Path(cfg_path)
    return path if path.suffix == ".json" else path / CONFIG_NAME


def parse_config(doc: Any, source: str) -> tuple[DynamicConfig, list[str]]:
    """A validated config and the warnings about it (unknown keys); raises :class:`OptionError`."""
    if not isinstance(doc, Mapping):
        raise ConfigFileError(f"{source}: must hold a JSON object, found {type(doc).__name__}")
    start = int_value(doc, "start_step", source, default=-1, minimum=-1)
    stop = int_value(doc, "stop_step", source, default=-1, minimum=-1)
    if start == 0 or stop == 0:
        key = "start_step" if start == 0 else "stop_step"
        raise OptionError(
            source, key, "steps count from 1 (the first training step is 1); -1 collects nothing"
        )
    if start >= 1 and stop == -1:
        raise OptionError(
            source, "stop_step", f"is -1 but start_step is {start}: give the last step to collect"
        )
    if start >= 1 and stop < start:
        raise OptionError(source, "stop_step", f"{stop} is before start_step {start}")
    options = parse_options(doc, source)
    notes = [
        f"{source}: key {key!r} is not a perfsight option and was ignored"
        for key in unknown_keys(doc, WINDOW_KEYS)
    ]
    return DynamicConfig(start, stop, options), notes


def read_config(path: Path) -> tuple[DynamicConfig, list[str]]:
    """Parse the file; raises :class:`ConfigFileError` or :class:`OptionError` naming it."""
    text = _read_small_regular_file(path)
    try:
        doc = json.loads(text)
    except ValueError as exc:
        raise ConfigFileError(f"{path}: not valid JSON ({exc})") from None
    except RecursionError:  # "[[[[…" nested deeper than Python's stack: bad input, not our failure
        raise ConfigFileError(f"{path}: not valid JSON (nested too deeply to read)") from None
    return parse_config(doc, str(path))


def _read_small_regular_file(path: Path) -> str:
    """The file's text, read without ever blocking the training loop.

    Why not ``read_text``: the monitor reads from the training thread, and opening a FIFO (or a
    device) there waits for a writer forever.  The file is opened non-blocking, must be a regular
    file (checked on the open descriptor, so a swap after the check cannot fool it), and at most
    :data:`MAX_CONFIG_BYTES` are read.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOCTTY", 0))
    except OSError as exc:
        raise ConfigFileError(f"{path}: cannot be read ({exc})") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise ConfigFileError(f"{path}: not a regular file ({_file_kind(st.st_mode)}); not read")
        if st.st_size > MAX_CONFIG_BYTES:
            raise ConfigFileError(
                f"{path}: {st.st_size} bytes, larger than the {MAX_CONFIG_BYTES} a config may have; not read"
            )
        with os.fdopen(fd, "rb", closefd=False) as handle:
            data = handle.read(MAX_CONFIG_BYTES + 1)
    except OSError as exc:
        raise ConfigFileError(f"{path}: cannot be read ({exc})") from None
    finally:
        os.close(fd)
    if len(data) > MAX_CONFIG_BYTES:  # grew after the fstat
        raise ConfigFileError(f"{path}: larger than the {MAX_CONFIG_BYTES} bytes a config may have; not read")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigFileError(f"{path}: cannot be read ({exc})") from None


def _file_kind(mode: int) -> str:
    kinds = {
        stat.S_ISFIFO: "a FIFO",
        stat.S_ISDIR: "a folder",
        stat.S_ISCHR: "a character device",
        stat.S_ISBLK: "a block device",
        stat.S_ISSOCK: "a socket",
    }
    return next((name for test, name in kinds.items() if test(mode)), "not a regular file")


def signature(path: Path) -> tuple[int, int, int, int] | None:
    """What changes when the file is rewritten (one ``stat``): ``None`` while it does not exist."""
    try:
        st = path.stat()
    except OSError:
        return None
    return (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def write_config_atomic(path: Path, doc: Mapping[str, Any]) -> None:
    """Replace the file in one rename: readers see the old or the new file, never a mix."""
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(handle, "w", encoding="utf-8") as out:
            json.dump(doc, out, indent=2)
            out.write("\n")
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def create_default(path: Path) -> bool:
    """Write the default config unless a file is already there (several ranks may race here:
    ``link`` fails if another one, or ``perfsight trigger``, wrote it first).  True if created."""
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(handle, "w", encoding="utf-8") as out:
            json.dump(DynamicConfig().to_json(), out, indent=2)
            out.write("\n")
        os.link(tmp, path)
        return True
    except FileExistsError:
        return False
    finally:
        Path(tmp).unlink(missing_ok=True)
