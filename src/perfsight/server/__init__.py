"""``perfsight serve``: a read-only web server for the runs under a base directory.

``create_app(base_dir, token=None)`` builds the FastAPI app; the endpoints are listed in
docs/API.md and served as OpenAPI at ``/openapi.json``.  The app is imported lazily, so the
analysis worker (``perfsight.server.worker``) does not pay for FastAPI.
"""

from __future__ import annotations

from typing import Any

__all__ = ["create_app"]


def __getattr__(name: str) -> Any:
    if name == "create_app":
        from perfsight.server.app import create_app

        return create_app
    raise AttributeError(f"module 'perfsight.server' has no attribute {name!r}")
