"""One rank of a real gloo job for tests/test_clock_sync.py.

``python tests/_clock_job.py RANK WORLD PORT OUT_DIR ABSENT_RANK`` -- every rank but ABSENT_RANK
estimates its clock offset (1 s timeout) and writes ``clock_{rank}.json`` with the result and how
long the call took; ABSENT_RANK joins the process group but never takes part (it sleeps, then
exits), as a hung or crashed rank would.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import torch.distributed as dist

from perfsight.collect.clock_sync import estimate_clock_offset

TIMEOUT_S = 1.0


def run(rank: int, world: int, port: int, out: Path, absent: int) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    if rank == absent:
        time.sleep(4 * TIMEOUT_S)
        return
    started = time.monotonic()
    clock = estimate_clock_offset(rounds=6, timeout_s=TIMEOUT_S)
    elapsed = time.monotonic() - started
    (out / f"clock_{rank}.json").write_text(json.dumps({**clock.to_dict(), "elapsed_s": elapsed}))


if __name__ == "__main__":
    run(int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), Path(sys.argv[4]), int(sys.argv[5]))
