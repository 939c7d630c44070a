"""Serve the built web UI (``src/perfsight/server/static/``), or a plain page saying how to build it.

Why not StaticFiles: the UI is a single-page app, so unknown paths must fall back to
``index.html``, and every path must go through the same containment check as the rest of the
server (:func:`perfsight.server.security.inside`), so a crafted ``..`` or symlink in the static
folder cannot serve a file from elsewhere.
"""

from __future__ import annotations

import mimetypes
from pathlib import Path

from starlette.responses import FileResponse, HTMLResponse, Response

from perfsight.server.security import inside

STATIC_DIR = Path(__file__).resolve().parent / "static"

NOT_BUILT = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>perfsight</title></head>
<body style="font-family: sans-serif; max-width: 40em; margin: 3em auto">
<h1>perfsight</h1>
<p>The web UI is not built in this installation (build it with
<code>npm --prefix web ci &amp;&amp; npm --prefix web run build</code>); the JSON API works:
<a href="/api/runs">/api/runs</a>, described by <a href="/openapi.json">/openapi.json</a>.</p>
</body></html>
"""


def static_response(path: str, folder: Path = STATIC_DIR) -> Response:
    """The file at ``path`` under ``folder``; ``index.html`` for unknown paths; 404 outside it."""
    root = folder.resolve()
    index = root / "index.html"
    if not index.is_file():
        return HTMLResponse(NOT_BUILT, status_code=200 if path in ("", "index.html") else 404)
    target = inside(path, [root]) if path else index
    if target is None:
        return Response("not found", status_code=404, media_type="text/plain")
    if target.is_file():
        media_type = mimetypes.guess_type(target.name)[0] or "application/octet-stream"
        cache = "no-cache" if target == index else "public, max-age=3600"
        return FileResponse(target, media_type=media_type, headers={"Cache-Control": cache})
    if Path(path).suffix:  # a missing asset, not a client-side route
        return Response("not found", status_code=404, media_type="text/plain")
    return FileResponse(index, media_type="text/html", headers={"Cache-Control": "no-cache"})
