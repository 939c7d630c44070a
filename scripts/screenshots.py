"""Take the README's screenshots (docs/img/overview.png, docs/img/timeline.png) from a real run.

Why a script: the pictures in the README must show what the UI really draws for a real trace, and
must be easy to refresh when the UI changes.  It copies the given traces into a temporary base
folder, starts ``perfsight serve`` on it, waits for the analysis, and drives Debian's Chromium
(``/usr/bin/chromium``) with Playwright -- started exactly as the browser tests start them
(``tests/_ui.py``, so the dev extra is needed).  It needs the web UI built (``make web``).

Usage::

    .venv/bin/python scripts/screenshots.py                      # the shared A100 DDP trace
    .venv/bin/python scripts/screenshots.py --trace demo_output/run --out /tmp/img
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))  # the browser tests' harness: one way to start serve and Chromium

from _ui import Server, browser_session  # noqa: E402

DEFAULT_TRACE = REPO.parent / "shared" / "data" / "kineto" / "nccl_parser_config" / "nccl_data.json.gz"
VIEWPORT = {"width": 1440, "height": 900}


def shoot(server: Server, run: str, out: Path) -> None:
    steps = server.get("run/step-trace", run=run)["steps"]
    middle = steps[len(steps) // 2] if steps else None
    with browser_session() as browser:
        page = browser.new_page(viewport=VIEWPORT, device_scale_factor=1)
        page.goto(server.page_url("overview", run))
        page.wait_for_selector('[data-testid="chart-operator-types"] canvas')
        page.wait_for_timeout(500)
        page.screenshot(path=str(out / "overview.png"))

        window = {"start_ns": middle["start_ns"], "end_ns": middle["end_ns"]} if middle else {}
        page.goto(server.page_url("timeline", run, **window))
        page.wait_for_selector('[data-testid="timeline-canvas"][data-loaded="true"]')
        page.wait_for_timeout(500)
        page.screenshot(path=str(out / "timeline.png"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trace", type=Path, default=DEFAULT_TRACE, help="a trace file or run folder")
    parser.add_argument("--out", type=Path, default=REPO / "docs" / "img", help="where the PNGs go")
    args = parser.parse_args(argv)
    if not args.trace.exists():
        parser.error(f"{args.trace}: no such file or folder")
    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="perfsight-shots-") as tmp:
        base = Path(tmp) / "runs"
        base.mkdir()
        target = base / args.trace.name
        if args.trace.is_dir():
            shutil.copytree(args.trace, target)
        else:
            shutil.copyfile(args.trace, target)
        server = Server(base)
        try:
            run = server.get("runs")["runs"][0]["id"]
            server.wait_ready(run, timeout_s=600)
            shoot(server, run, args.out)
        finally:
            server.stop()
    print(f"wrote {args.out / 'overview.png'} and {args.out / 'timeline.png'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
