"""Build hook: compile perfsight's native event scanner when a wheel (or editable install) is built.

The scanner is an optional accelerator loaded with ctypes (no Python headers, no ABI tag
beyond the platform).  When no C compiler is present the build goes on without it and the
trace reader uses its portable path; a warning says so.

It also builds the web UI (web/, TypeScript) with npm into src/perfsight/server/static/ and
ships it in the wheel.  That folder is generated, never committed; without npm the wheel is
built without a UI (a warning says so) and `perfsight serve` shows how to build it.
"""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
from pathlib import Path
from typing import Any

from hatchling.builders.hooks.plugin.interface import BuildHookInterface


class NativeScannerHook(BuildHookInterface):
    PLUGIN_NAME = "custom"

    def initialize(self, version: str, build_data: dict[str, Any]) -> None:
        if self.target_name != "wheel":
            return
        self._build_web(version, build_data)
        path = Path(self.root) / "src" / "perfsight" / "ingest" / "_build_native.py"
        spec = importlib.util.spec_from_file_location("_perfsight_build_native", path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        problem = module.build()
        if problem:
            self.app.display_warning(
                f"perfsight: native event scanner not built ({problem}); traces are read by the portable path"
            )
            return
        build_data["pure_python"] = False
        build_data["infer_tag"] = True
        if version != "editable":  # an editable install finds the library in src/ already
            library: Path = module.LIBRARY
            build_data["force_include"][str(library)] = f"perfsight/ingest/{library.name}"

    def _build_web(self, version: str, build_data: dict[str, Any]) -> None:
        """Run the web build when npm is available; ship whatever built UI exists."""
        if version == "editable":  # `make web` builds the UI in place for an editable install
            return
        root = Path(self.root)
        web = root / "web"
        static = root / "src" / "perfsight" / "server" / "static"
        npm = shutil.which("npm")
        if npm is None:
            self.app.display_warning(
                "perfsight: npm not found; the wheel ships the web UI only if already built"
            )
        elif (web / "package.json").is_file():
            for args in ([npm, "install", "--no-audit", "--no-fund"], [npm, "run", "build"]):  # see Makefile
                result = subprocess.run(args, cwd=web, capture_output=True, text=True)
                if result.returncode != 0:
                    tail = (result.stderr or result.stdout).strip().splitlines()[-5:]
                    self.app.display_warning(f"perfsight: web UI build failed ({' '.join(args[1:])}): {tail}")
                    break
        if (static / "index.html").is_file():
            build_data["force_include"][str(static)] = "perfsight/server/static"
        else:
            self.app.display_warning(
                "perfsight: the wheel has no web UI (`perfsight serve` says how to build it)"
            )
