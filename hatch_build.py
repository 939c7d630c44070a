"""Build hook: compile perfsight's native event scanner when a wheel (or editable install) is built.

The scanner is an optional accelerator loaded with ctypes (no Python headers, no ABI tag
beyond the platform).  When no C compiler is present the build goes on without it and the
trace reader uses its portable path; a warning says so.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

from hatchling.builders.hooks.plugin.interface import BuildHookInterface


class NativeScannerHook(BuildHookInterface):
    PLUGIN_NAME = "custom"

    def initialize(self, version: str, build_data: dict[str, Any]) -> None:
        if self.target_name != "wheel":
            return
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
