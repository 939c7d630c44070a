"""The analysis API chooses Arrow's C++ allocator before pyarrow loads, and nothing else.

Each case runs in a fresh interpreter: the choice can only be made by the first import of pyarrow.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

PROBE = """
import json, os, sys
{before}
import perfsight.api
import pyarrow as pa
from perfsight import arrow_pool
print(json.dumps({{"backend": pa.default_memory_pool().backend_name,
                  "env": os.environ.get("ARROW_DEFAULT_MEMORY_POOL"),
                  "chose": arrow_pool.CHOSE_POOL}}))
"""


def _probe(before: str = "", env: dict[str, str] | None = None) -> dict:
    environment = {k: v for k, v in os.environ.items() if k != "ARROW_DEFAULT_MEMORY_POOL"}
    environment.update(env or {})
    done = subprocess.run(
        [sys.executable, "-c", PROBE.format(before=before)],
        capture_output=True,
        text=True,
        env=environment,
        check=True,
    )
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_importing_the_api_first_makes_arrow_use_the_system_allocator_and_leaves_no_variable():
    seen = _probe()
    assert seen == {"backend": "system", "env": None, "chose": True}


def test_an_allocator_the_user_chose_wins():
    seen = _probe(env={"ARROW_DEFAULT_MEMORY_POOL": "mimalloc"})
    assert seen["chose"] is False
    assert seen["backend"] == "mimalloc"
    assert seen["env"] == "mimalloc"


def test_pyarrow_imported_before_perfsight_is_left_as_it_is():
    seen = _probe(before="import pyarrow")
    alone = subprocess.run(
        [sys.executable, "-c", "import pyarrow as pa; print(pa.default_memory_pool().backend_name)"],
        capture_output=True,
        text=True,
        env={k: v for k, v in os.environ.items() if k != "ARROW_DEFAULT_MEMORY_POOL"},
        check=True,
    )
    assert seen["chose"] is False
    assert seen["backend"] == alone.stdout.strip()  # what pyarrow picks by itself
