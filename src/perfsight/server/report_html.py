"""One HTML file that holds the built web UI and a report's answers: opens from disk, needs no network.

Why the built UI and not a template of our own: the report shows the server's pages with the
server's charts and formatting, so the two cannot drift (``web/src/api.ts`` answers from the
embedded document when the page holds one).  This module only assembles: it inlines the script
and style of ``src/perfsight/server/static`` and the document (:mod:`report_bundle`), each escaped
for the element it sits in, and a Content-Security-Policy that lets the page run its own script
(by hash) and nothing else -- no request can leave it, and a name that slipped past the UI's
escaping could not run a script, as with the server's policy.
"""

from __future__ import annotations

import base64
import hashlib
import html
import re
from pathlib import Path

from perfsight.server.static import STATIC_DIR

DOCUMENT_ID = "perfsight-report"
"""The id of the ``<script type="application/json">`` element holding the document (web/src/api.ts)."""
_SCRIPT = re.compile(r'<script type="module"[^>]*\ssrc="\./([^"]+\.js)"[^>]*></script>')
_STYLE = re.compile(r'<link rel="stylesheet"[^>]*\shref="\./([^"]+\.css)"[^>]*>')


class UiNotBuilt(RuntimeError):
    """The built web UI is missing or not in the one-script shape a report can inline."""


def _asset(folder: Path, pattern: re.Pattern[str], index: str, what: str) -> str:
    found = pattern.findall(index)
    if len(found) != 1:
        raise UiNotBuilt(f"{folder / 'index.html'}: expected one {what}, found {len(found)}")
    return (folder / found[0]).read_text(encoding="utf-8")


def ui_assets(folder: Path = STATIC_DIR) -> tuple[str, str]:
    """(script, style) of the built UI in ``folder``."""
    index_file = folder / "index.html"
    if not index_file.is_file():
        raise UiNotBuilt(
            f"the web UI is not built in this installation ({index_file} missing): build it with "
            "`npm --prefix web ci && npm --prefix web run build`"
        )
    index = index_file.read_text(encoding="utf-8")
    scripts = list((folder / "assets").glob("*.js"))
    if len(scripts) != 1:  # a second chunk would be loaded from disk by the first: not self-contained
        raise UiNotBuilt(f"{folder / 'assets'}: expected the UI as one script, found {len(scripts)}")
    return _asset(folder, _SCRIPT, index, "module script"), _asset(folder, _STYLE, index, "stylesheet")


def script_text(code: str) -> str:
    """``code`` safe as the content of a ``<script>`` element: ``</script`` and ``<!--`` (which end
    or change how the element is parsed) have their ``<`` written ``\\x3C``, which every place
    they can occur in JavaScript (strings, template literals, regular expressions, comments) reads
    as the same character or ignores."""
    return re.sub(r"<(?=/script|!--)", r"\\x3C", code, flags=re.IGNORECASE)


def style_text(css: str) -> str:
    """``css`` safe as the content of a ``<style>`` element (``</style`` written with a CSS escape)."""
    return re.sub(r"<(?=/style)", r"\\3C ", css, flags=re.IGNORECASE)


def _favicon(folder: Path) -> str:
    icon = folder / "favicon.svg"
    if not icon.is_file():
        return ""
    data = base64.b64encode(icon.read_bytes()).decode("ascii")
    return f'<link rel="icon" type="image/svg+xml" href="data:image/svg+xml;base64,{data}">'


def page(document: bytes, title: str, folder: Path = STATIC_DIR) -> bytes:
    """The report's HTML: the UI's style and script inlined, ``document`` (JSON, every ``<``
    already escaped by :func:`perfsight.server.report_bundle.escaped`) in a data element."""
    if b"<" in document:
        raise ValueError("the report document must have every '<' escaped")
    code, css = ui_assets(folder)
    code = script_text(code)
    digest = base64.b64encode(hashlib.sha256(code.encode("utf-8")).digest()).decode("ascii")
    policy = (
        f"default-src 'none'; script-src 'sha256-{digest}'; style-src 'unsafe-inline'; "
        "img-src data: blob:; font-src data:; connect-src 'none'; worker-src 'none'; "
        "object-src 'none'; base-uri 'none'; form-action 'none'"
    )
    head = (
        '<!doctype html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
        f'<meta http-equiv="Content-Security-Policy" content="{policy}">\n'
        '<meta name="viewport" content="width=device-width, initial-scale=1">\n'
        '<meta name="referrer" content="no-referrer">\n'
        f"<title>{html.escape(title)}</title>\n{_favicon(folder)}\n"
        f"<style>{style_text(css)}</style>\n"
        f'<script type="application/json" id="{DOCUMENT_ID}">'
    )
    tail = (
        f'</script>\n<script type="module">{code}</script>\n</head>\n'
        '<body><div id="app"></div></body>\n</html>\n'
    )
    return head.encode("utf-8") + document + tail.encode("utf-8")


def overhead(folder: Path = STATIC_DIR) -> int:
    """Bytes of a report that are not its document (the UI's script and style, the page around them)."""
    return len(page(b"{}", "", folder)) - 2
