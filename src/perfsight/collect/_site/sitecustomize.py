"""Start-up hook that ``perfsight run`` puts on ``PYTHONPATH`` (not a module to import yourself).

Python imports ``sitecustomize`` once at start-up, in every process -- torchrun's launcher and
each worker -- which is how an unmodified script gets profiled.  This file must stay tiny and
import nothing heavy.  Because it shadows any other ``sitecustomize`` (a distribution's, a
virtual environment's, a cluster's), it first removes its own folder from ``sys.path`` and
imports the next one, so that one still runs exactly as it would without perfsight.
"""

import os
import sys


def _chain_next_sitecustomize() -> None:
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    ours = sys.modules.pop("sitecustomize", None)
    try:
        import sitecustomize  # noqa: F401 - the next one on sys.path, if there is one
    except ImportError as exc:
        if exc.name != "sitecustomize":
            sys.stderr.write(f"Error in sitecustomize (chained by perfsight): {exc}\n")
        if ours is not None:
            sys.modules["sitecustomize"] = ours
    except Exception as exc:  # noqa: BLE001 - as site.py does: report, and go on
        sys.stderr.write(f"Error in sitecustomize (chained by perfsight): {type(exc).__name__}: {exc}\n")


def _perfsight_autostart() -> None:
    if not os.environ.get("PERFSIGHT_PROFILER_OPTIONS", "").strip():
        return
    try:
        from perfsight.collect import autostart
    except Exception as exc:  # noqa: BLE001 - another interpreter without perfsight, say
        sys.stderr.write(f"perfsight: cannot load perfsight in {sys.executable} ({exc}); not profiling\n")
        return
    autostart.install()


_chain_next_sitecustomize()
_perfsight_autostart()
