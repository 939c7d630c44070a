"""The web UI's API types (web/src/api-types.ts) are the ones the server's OpenAPI generates today.

Why: the UI type-checks against that file (web/src/api.ts re-exports it), so a response model
changed in ``perfsight.server.models`` without regenerating it would let the UI read fields the
server no longer sends.  The generator is the project's own script, run as a developer runs it.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SCRIPT = REPO / "scripts" / "gen_api_types.py"


def test_the_committed_api_types_match_the_servers_openapi() -> None:
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--check"], capture_output=True, text=True, timeout=300, cwd=REPO
    )
    assert done.returncode == 0, done.stderr or done.stdout


def test_the_ui_client_takes_its_types_from_the_generated_file() -> None:
    api = (REPO / "web" / "src" / "api.ts").read_text(encoding="utf-8")
    assert 'from "./api-types"' in api
    assert "interface StepRow" not in api and "interface Overview" not in api  # no hand-kept copies
