"""What keeps `perfsight serve` safe to run on a machine with other users.

Why each rule exists:

* **Loopback by default, token otherwise.**  A profiler trace shows model code, shapes and host
  names; a server on a public interface must not hand that to anyone who finds the port.  As
  Jupyter does, a non-loopback ``--host`` needs a random token that is printed once; the browser
  gets it from ``?token=`` and keeps it in an HttpOnly cookie, and a page opened with ``?token=`` is
  redirected to the same address without it, so the token leaves the address bar and the history.
  ``--no-auth`` is an explicit opt-out.
* **Nothing outside the base directory.**  Every path that reaches the file system goes through
  :func:`inside`, which resolves symlinks and ``..`` and refuses anything that lands outside the
  allowed roots (the base dir, and the server's own cache dir for analyses of read-only data).
* **Read-only.**  Only GET/HEAD are accepted, so a page on another site cannot make the server do
  anything by posting to it.
* **No markup from traces.**  Names from traces are only ever returned inside JSON; the
  Content-Security-Policy forbids inline scripts, so even a bug in the UI's escaping cannot run a
  script hidden in an op name.
"""

from __future__ import annotations

import hmac
import ipaddress
import secrets
from collections.abc import Iterable, Mapping
from pathlib import Path
from urllib.parse import quote, urlencode

from starlette.datastructures import MutableHeaders
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

TOKEN_COOKIE = "perfsight_token"
READ_METHODS = frozenset({"GET", "HEAD"})

CONTENT_SECURITY_POLICY = (
    "default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; "
    "img-src 'self' data: blob:; font-src 'self' data:; connect-src 'self'; worker-src 'self' blob:; "
    "object-src 'none'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)
SECURITY_HEADERS = {
    "Content-Security-Policy": CONTENT_SECURITY_POLICY,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "X-Frame-Options": "DENY",
    "Cross-Origin-Opener-Policy": "same-origin",
}

LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "::1", "[::1]"})


def is_loopback(host: str) -> bool:
    """True for an address (or ``localhost``) that only this machine can reach."""
    if host in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def new_token() -> str:
    """A random token as Jupyter makes them: 48 hex digits, printed once at start."""
    return secrets.token_hex(24)


def inside(path: str | Path, roots: Iterable[Path]) -> Path | None:
    """``path`` with symlinks and ``..`` resolved, if it lies within one of ``roots``; else None.

    A relative ``path`` is taken relative to the first root.  Roots must be resolved already.
    """
    roots = list(roots)
    if "\x00" in str(path):  # no file name holds a NUL; resolve() would raise ValueError on it
        return None
    candidate = Path(path)
    if not candidate.is_absolute():
        if not roots:
            return None
        candidate = roots[0] / candidate
    try:
        resolved = candidate.resolve(strict=False)
    except (OSError, RuntimeError, ValueError):  # symlink loops
        return None
    for root in roots:
        if resolved == root or resolved.is_relative_to(root):
            return resolved
    return None


def without_roots(text: str, labels: Mapping[Path, str]) -> str:
    """``text`` (an error or a warning) with each absolute root path replaced by its label.

    Why: readers and writers name the files they complain about by absolute path, which is right
    in a terminal; a web client is told the base folder's name only (``/api/info``), never where
    on the server's disk it lies.
    """
    for root in sorted(labels, key=lambda r: len(str(r)), reverse=True):  # a nested root first
        text = text.replace(str(root), labels[root])
    return text


def relative_id(path: Path, base: Path) -> str:
    """The run id of ``path``: its POSIX path relative to ``base`` (``.`` for the base itself)."""
    rel = path.relative_to(base).as_posix()
    return rel or "."


def safe_relative(text: str) -> bool:
    """True for a relative id without ``..``, NUL or a leading slash (checked before any lookup)."""
    if not text or "\x00" in text or "\\" in text or text.startswith("/"):
        return False
    return all(part not in ("..",) for part in text.split("/"))


def _without_token(request: Request) -> Response:
    """A redirect from a UI page opened with ``?token=`` to the same page without it (the cookie set
    with this response carries the token from now on), so the token is not left in the address bar,
    the history or a bookmark.  API calls with ``?token=`` (scripts) are answered, not redirected."""
    kept = [(k, v) for k, v in request.query_params.multi_items() if k != "token"]
    # one leading slash: "//host" or "/\\host" would send the browser to another site
    path = "/" + quote(request.url.path.lstrip("/\\"), safe="/")
    location = path + (f"?{urlencode(kept)}" if kept else "")
    return Response(status_code=303, headers={"Location": location, "Cache-Control": "no-store"})


class SecurityMiddleware:
    """Refuse writes and unauthenticated requests, add the security headers to every response.

    A plain ASGI middleware rather than Starlette's ``BaseHTTPMiddleware``: that one runs each
    request in a task group and re-streams its body, about 2 ms of CPU per request -- as much as a
    whole timeline window query."""

    def __init__(self, app: ASGIApp, token: str | None, allowed_hosts: frozenset[str] | None) -> None:
        self.app = app
        self.token = token
        self.allowed_hosts = allowed_hosts

    def _authorised(self, request: Request) -> tuple[bool, bool]:
        """(authorised, came with ?token= so a cookie should be set)."""
        if self.token is None:
            return True, False
        offered = request.query_params.get("token")
        if offered is not None and hmac.compare_digest(offered.encode(), self.token.encode()):
            return True, True
        header = request.headers.get("authorization", "")
        if header.lower().startswith("token ") and hmac.compare_digest(
            header[6:].strip().encode(), self.token.encode()
        ):
            return True, False
        cookie = request.cookies.get(TOKEN_COOKIE)
        if cookie is not None and hmac.compare_digest(cookie.encode(), self.token.encode()):
            return True, False
        return False, False

    def _refusal(self, request: Request, authorised: bool) -> Response | None:
        """The error response for a request that must not reach the app, else None."""
        host = (request.headers.get("host") or "").rsplit(":", 1)[0].lower()
        if request.method not in READ_METHODS:
            response = JSONResponse({"detail": "read-only server: only GET is allowed"}, status_code=405)
            response.headers["Allow"] = "GET, HEAD"
            return response
        if self.allowed_hosts is not None and host not in self.allowed_hosts:
            # a loopback server answering for another host name is a DNS-rebinding attempt
            return JSONResponse({"detail": f"host {host!r} is not served here"}, status_code=403)
        if not authorised:
            return JSONResponse(
                {"detail": "a token is required: open the URL with ?token= that perfsight serve printed"},
                status_code=401,
            )
        return None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request = Request(scope)
        authorised, set_cookie = self._authorised(request)
        cookie_header = None
        if set_cookie and self.token is not None:
            carrier = Response()
            carrier.set_cookie(TOKEN_COOKIE, self.token, httponly=True, samesite="strict")
            cookie_header = carrier.headers["set-cookie"]

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = MutableHeaders(scope=message)
                for name, value in SECURITY_HEADERS.items():
                    headers.setdefault(name, value)
                if cookie_header is not None:
                    headers.append("set-cookie", cookie_header)
            await send(message)

        refusal = self._refusal(request, authorised)
        if refusal is None and set_cookie and not request.url.path.startswith("/api/"):
            refusal = _without_token(request)
        if refusal is not None:
            await refusal(scope, receive, send_with_headers)
        else:
            await self.app(scope, receive, send_with_headers)
