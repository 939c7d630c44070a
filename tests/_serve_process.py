"""``perfsight serve`` started as a user starts it: a real process on a free loopback port."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path
from typing import Any


def free_port() -> int:
    """A loopback port nobody listens on (the OS picks it)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start_serve(base: Path, *extra: str, **popen: Any) -> tuple[subprocess.Popen[str], int]:
    """``python -m perfsight.cli serve --summary-base-dir base --port P *extra``; returns the
    process (the caller stops it) and its port.  ``popen`` goes to :class:`subprocess.Popen`."""
    port = free_port()
    command = [
        sys.executable,
        "-m",
        "perfsight.cli",
        "serve",
        "--summary-base-dir",
        str(base),
        "--port",
        str(port),
    ]
    return subprocess.Popen([*command, *extra], text=True, **popen), port
