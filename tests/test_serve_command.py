"""`perfsight serve` as a user starts and stops it: a taken port is one error line, Ctrl-C a clean stop."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
from pathlib import Path

from _ui import Server


def test_a_port_in_use_is_a_one_line_error_before_anything_claims_to_serve(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = subprocess.run(
            [sys.executable, "-m", "perfsight.cli", "serve", "--summary-base-dir", str(tmp_path)]
            + ["--port", str(port)],
            capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
    assert result.returncode == 2
    expected = f"perfsight: error: cannot listen on 127.0.0.1:{port} (Address already in use)"
    assert result.stderr.strip() == expected


def test_ctrl_c_stops_the_server_cleanly(tmp_path: Path) -> None:
    (tmp_path / "base").mkdir()
    server = Server(tmp_path / "base")  # returns once the server answers
    try:
        assert server.get("info")["base_dir_name"] == "base"
        server.process.send_signal(signal.SIGINT)
        assert server.process.wait(timeout=30) == 0
    finally:
        server.stop()
    assert "Traceback" not in server.log.read_text(errors="replace")
