"""The server's JSON API answered in process: the app of ``perfsight serve``, without a socket.

Why: ``perfsight report`` embeds the answers the web UI would get from the server, so every number
in a report is the one the server shows -- computed by the same routes, parameter defaults and
error handlers -- while no server is started and no port is opened.  It must not know how any
answer is computed: it only sends GET requests to the ASGI app and keeps what comes back.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import orjson

from perfsight.server.registry import Registry
from perfsight.server.runs import Run

Params = Mapping[str, str | int | None]


@dataclasses.dataclass(frozen=True)
class Answer:
    """One API answer as the server sent it: status, and the JSON body's bytes."""

    path: str
    params: dict[str, str]
    status: int
    raw: bytes

    @functools.cached_property
    def data(self) -> Any:
        """The body, parsed (once); None when empty."""
        return orjson.loads(self.raw) if self.raw else None


class ReportInputError(ValueError):
    """RUN names nothing a report can be made of (missing, empty, or several runs): one line for the user."""


def clean(params: Params) -> dict[str, str]:
    """The parameters as the UI sends them (web/src/api.ts ``url``): empty ones left out, the rest text."""
    return {k: str(v) for k, v in params.items() if v is not None and v != ""}


class AppClient:
    """GET requests to the app of :func:`perfsight.server.create_app`, on an event loop of its own."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.registry: Registry = app.state.registry
        self._loop = asyncio.new_event_loop()

    def close(self) -> None:
        self.registry.jobs.stop()  # an analysis child must not outlive the command
        self._loop.close()

    def get(self, path: str, params: Params) -> Answer:
        """The answer of ``GET /api/{path}?{params}``."""
        sent = clean(params)
        status, body = self._loop.run_until_complete(self._call(f"/api/{path}", urlencode(sent)))
        return Answer(path=path, params=sent, status=status, raw=body)

    async def _call(self, path: str, query: str) -> tuple[int, bytes]:
        scope = {
            "type": "http",
            "asgi": {"version": "3.0", "spec_version": "2.3"},
            "http_version": "1.1",
            "method": "GET",
            "scheme": "http",
            "path": path,
            "raw_path": path.encode("utf-8"),
            "root_path": "",
            "query_string": query.encode("ascii"),
            "headers": [(b"host", b"127.0.0.1"), (b"accept", b"application/json")],
            "client": ("127.0.0.1", 0),
            "server": ("127.0.0.1", 0),
        }
        status = 0
        chunks: list[bytes] = []

        async def receive() -> dict[str, Any]:
            return {"type": "http.request", "body": b"", "more_body": False}

        async def send(message: dict[str, Any]) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
            elif message["type"] == "http.response.body":
                chunks.append(message.get("body", b""))

        await self.app(scope, receive, send)
        return status, b"".join(chunks)

    # ------------------------------------------------------------------ the run of the report
    def find_run(self, path: Path) -> Run:
        """The run at ``path`` among those the server lists under its base dir: the run of that path,
        else the job a trace file belongs to, else the only run found."""
        runs = self.registry.runs()
        target = path.resolve()
        for run in runs.values():
            if run.path.resolve() == target:
                return run
        if path.is_file():
            holding = [r for r in runs.values() if target in {p.resolve() for p in r.inputs}]
            if len(holding) == 1:
                return holding[0]
        if len(runs) == 1:
            return next(iter(runs.values()))
        if not runs:
            raise ReportInputError(f"{path}: no trace, run folder, job or analysis found there")
        names = sorted(runs)
        shown = ", ".join(names[:8]) + (f" and {len(names) - 8} more" if len(names) > 8 else "")
        raise ReportInputError(f"{path} holds {len(runs)} runs ({shown}): name one of them")

    def wait_ready(self, run: Run, report: Callable[[str], None], poll_s: float = 0.3) -> Answer:
        """Open ``run`` as the UI does (its status starts the analysis when it is new or stale) and
        wait until it is analysed; returns the ready status answer.  ``report`` is told each new stage."""
        said, previous, queued = "", None, 0
        while True:
            answer = self.get("run/status", {"run": run.id})
            status = answer.data if answer.status == 200 else {}
            state = status.get("status")
            if state == "ready":
                return answer
            if state == "queued" and previous != "queued":
                queued += 1
            if queued > 2:  # analysed, yet not readable: the server would analyse it for ever
                raise ReportInputError(
                    f"{run.path}: analysed twice, but the analysis has nothing the pages can read "
                    f"({status.get('stage') or state})"
                )
            previous = state
            if state == "failed" or answer.status != 200:
                why = status.get("error") or (status.get("detail") if isinstance(status, dict) else None)
                raise ReportInputError(f"{run.path}: the analysis failed: {why or answer.raw[:200]!r}")
            stage = f"{status.get('progress', 0.0) * 100:.0f}% {status.get('stage') or state}"
            if stage != said:
                report(stage)
                said = stage
            time.sleep(poll_s)
