"""Write ``web/src/api-types.ts``: the web UI's API types, generated from the server's OpenAPI.

Why generated: the response shapes are declared once, in ``perfsight.server.models`` (served as
``/openapi.json``); the UI's TypeScript types are derived from them by ``openapi-typescript`` (a
devDependency in web/package.json, installed by ``npm install``), so a field renamed on the server
breaks the UI's type check instead of drifting silently.

    python scripts/gen_api_types.py           # rewrite web/src/api-types.ts
    python scripts/gen_api_types.py --check   # exit 1 when the committed file is out of date

The schema is taken from the app itself (``create_app(...).openapi()``), on an empty base folder,
so nothing is served or analysed.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
WEB = REPO / "web"
TARGET = WEB / "src" / "api-types.ts"
GENERATOR = WEB / "node_modules" / ".bin" / "openapi-typescript"


def openapi_schema() -> dict:
    """The OpenAPI document ``perfsight serve`` publishes at ``/openapi.json``."""
    from perfsight.server import create_app

    with tempfile.TemporaryDirectory() as empty:
        return create_app(empty, cache_dir=Path(empty) / ".cache").openapi()


def generated() -> str:
    """The TypeScript ``openapi-typescript`` writes for the app's schema."""
    if not GENERATOR.exists():
        raise SystemExit(f"{GENERATOR} is missing: run `npm install` in web/ (make web does)")
    with tempfile.TemporaryDirectory() as folder:
        schema, out = Path(folder) / "openapi.json", Path(folder) / "api-types.ts"
        schema.write_text(json.dumps(openapi_schema(), indent=1), encoding="utf-8")
        subprocess.run(
            [str(GENERATOR), str(schema), "-o", str(out)], check=True, capture_output=True, cwd=WEB
        )
        return out.read_text(encoding="utf-8")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="fail if web/src/api-types.ts is out of date")
    args = parser.parse_args()
    text = generated()
    if args.check:
        current = TARGET.read_text(encoding="utf-8") if TARGET.exists() else ""
        if current != text:
            print(
                f"{TARGET.relative_to(REPO)} is out of date: run python scripts/gen_api_types.py",
                file=sys.stderr,
            )
            return 1
        return 0
    TARGET.write_text(text, encoding="utf-8")
    print(f"wrote {TARGET.relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
