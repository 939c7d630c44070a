"""``perfsight serve``: the web UI and JSON API over every run under ``--summary-base-dir``."""

from __future__ import annotations

import argparse
import contextlib
import socket
import sys
from pathlib import Path


def register(sub: argparse._SubParsersAction) -> None:
    """Add the ``serve`` subcommand to the ``perfsight`` parser."""
    serve = sub.add_parser("serve", help="serve the web UI for the runs under a folder")
    serve.add_argument(
        "--summary-base-dir", required=True, help="folder searched for runs (traces, run folders, analyses)"
    )
    serve.add_argument("--host", default="127.0.0.1", help="address to bind (default: 127.0.0.1)")
    serve.add_argument("--port", type=int, default=8080, help="port (default: 8080)")
    serve.add_argument(
        "--no-auth", action="store_true", help="serve a non-loopback --host without a token (not advised)"
    )
    serve.add_argument(
        "--cache-dir",
        help="where the server keeps the analyses it makes; the served folders are only read "
        "(default: $PERFSIGHT_CACHE_DIR, else $XDG_CACHE_HOME/perfsight, else ~/.cache/perfsight)",
    )
    serve.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    base = Path(args.summary_base_dir)
    if not base.is_dir():
        print(f"perfsight: error: {base}: not a folder", file=sys.stderr)
        return 2
    if not 0 < args.port < 65536:
        print(f"perfsight: error: port {args.port} is not in 1..65535", file=sys.stderr)
        return 2

    import uvicorn

    from perfsight.server import create_app
    from perfsight.server.security import LOOPBACK_NAMES, is_loopback, new_token

    loopback = is_loopback(args.host)
    token = None if loopback or args.no_auth else new_token()
    allowed = frozenset({*LOOPBACK_NAMES, args.host.lower()}) if loopback else None
    app = create_app(base, token, cache_dir=args.cache_dir, allowed_hosts=allowed)
    try:  # bound here, before saying where we serve: a taken port is one error line, not a log
        sock = _bound_socket(args.host, args.port)
    except OSError as error:
        print(
            f"perfsight: error: cannot listen on {args.host}:{args.port} ({error.strerror or error})",
            file=sys.stderr,
        )
        return 2
    shown = "127.0.0.1" if args.host in ("0.0.0.0", "::") else args.host
    shown = f"[{shown}]" if ":" in shown else shown
    url = f"http://{shown}:{args.port}/" + (f"?token={token}" if token else "")
    print(f"perfsight: serving {base.resolve()} at {url}", file=sys.stderr, flush=True)
    if not loopback and args.no_auth:
        print(
            "perfsight: warning: --no-auth on a non-loopback address: anyone who can reach it can read "
            "every run",
            file=sys.stderr,
            flush=True,
        )
    with sock, contextlib.suppress(KeyboardInterrupt):  # Ctrl-C is how one stops it: no traceback
        uvicorn.Server(uvicorn.Config(app, log_level="warning")).run(sockets=[sock])
    return 0


def _bound_socket(host: str, port: int) -> socket.socket:
    """A TCP socket bound to ``host``:``port`` (IPv4 or IPv6, as the host resolves), for uvicorn
    to listen on; raises OSError when the port is taken or the address is not this machine's."""
    family, kind, proto, _, address = socket.getaddrinfo(
        host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
    )[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn does: restart at once
        sock.bind(address)
    except OSError:
        sock.close()
        raise
    sock.set_inheritable(True)
    return sock
