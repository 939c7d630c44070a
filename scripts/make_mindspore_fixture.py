"""Regenerate tests/fixtures/mindspore_cpu/: a real MindSpore profiler output made on the CPU.

MindSpore is not a perfsight dependency (about 800 MB, needs ``numpy<2``), so the fixture is
committed and this script exists to remake it.  Run it with a Python that has MindSpore, e.g.::

    python3.11 -m venv /tmp/msvenv && /tmp/msvenv/bin/pip install "numpy<2" mindspore==2.10.0
    /tmp/msvenv/bin/python scripts/make_mindspore_fixture.py

It trains a tiny dense network for a few steps under ``mindspore.profiler.profile`` (CPU activity,
a schedule recording three steps), then copies what perfsight reads -- ``trace_view.json`` and the
``FRAMEWORK/cpu_op_*`` / ``cpu_framework_*`` files -- into ``tests/fixtures/mindspore_cpu/
cpu_ascend_ms/`` (the folder name without the host name and time stamp, so tests can find it).
"""

from __future__ import annotations

import shutil
import sys
import tempfile
from pathlib import Path

FIXTURE = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "mindspore_cpu" / "cpu_ascend_ms"
STEPS = 4


def train_under_profiler(out: Path) -> Path:
    """Train for STEPS steps with the profiler on; return the ``*_ascend_ms`` folder it wrote."""
    import mindspore as ms
    import numpy as np
    from mindspore import nn

    ms.set_context(mode=ms.PYNATIVE_MODE)
    ms.set_device("CPU")
    ms.set_seed(0)
    net = nn.SequentialCell(nn.Dense(32, 64), nn.ReLU(), nn.Dense(64, 4))
    loss_fn = nn.MSELoss()
    optimizer = nn.SGD(net.trainable_params(), learning_rate=0.01)

    def forward(x: ms.Tensor, y: ms.Tensor) -> ms.Tensor:
        return loss_fn(net(x), y)

    grad_fn = ms.value_and_grad(forward, None, optimizer.parameters)
    rng = np.random.default_rng(0)
    x = ms.Tensor(rng.random((16, 32), dtype=np.float32))
    y = ms.Tensor(rng.random((16, 4), dtype=np.float32))
    schedule = ms.profiler.schedule(wait=0, warmup=0, active=STEPS - 1, repeat=1, skip_first=1)
    with ms.profiler.profile(
        activities=[ms.profiler.ProfilerActivity.CPU],
        schedule=schedule,
        on_trace_ready=ms.profiler.tensorboard_trace_handler(str(out)),
    ) as prof:
        for _ in range(STEPS):
            _, grads = grad_fn(x, y)
            optimizer(grads)
            prof.step()
    found = sorted(out.glob("*_ascend_ms"))
    if not found:
        raise SystemExit(f"MindSpore wrote no *_ascend_ms folder under {out}")
    return found[-1]


def main() -> int:
    with tempfile.TemporaryDirectory() as tmp:
        made = train_under_profiler(Path(tmp))
        if FIXTURE.exists():
            shutil.rmtree(FIXTURE)
        (FIXTURE / "ASCEND_PROFILER_OUTPUT").mkdir(parents=True)
        shutil.copyfile(
            made / "ASCEND_PROFILER_OUTPUT" / "trace_view.json",
            FIXTURE / "ASCEND_PROFILER_OUTPUT" / "trace_view.json",
        )
        (FIXTURE / "FRAMEWORK").mkdir()
        for path in sorted((made / "FRAMEWORK").glob("cpu_*")):
            shutil.copyfile(path, FIXTURE / "FRAMEWORK" / path.name)
        for path in sorted(made.glob("profiler_*.json")):
            shutil.copyfile(path, FIXTURE / path.name)
    size = sum(p.stat().st_size for p in FIXTURE.rglob("*") if p.is_file())
    print(f"wrote {FIXTURE} ({size / 1024:.1f} KiB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
