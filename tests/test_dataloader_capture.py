"""perfsight's data-loader capture on real DataLoaders whose dataset is slow on purpose.

The sleeps give lower bounds that hold on any machine, however loaded: a wait for a batch of B
samples read in the training process lasts at least B x the read sleep; a worker's transform time
is at least B x the transform sleep.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

import pyarrow as pa  # noqa: E402
from torch.utils.data import DataLoader, Dataset  # noqa: E402

from _trace_builder import make_trace  # noqa: E402
from perfsight.collect.dataloader_capture import DATALOADER_CAPTURE_SCHEMA, DataLoaderCapture  # noqa: E402
from perfsight.ingest.kineto import read_kineto  # noqa: E402
from perfsight.ingest.sidecar import merge_sidecars  # noqa: E402
from perfsight.model import DATALOADER_SCHEMA  # noqa: E402

READ_S, TRANSFORM_S, COLLATE_S = 0.004, 0.002, 0.003
BATCH = 4
BATCHES = 6


class SlowImages(Dataset):
    """A torchvision-style dataset: ``__getitem__`` reads, then applies ``self.transform``."""

    def __init__(self) -> None:
        self.transform = Scale(2.0)

    def __len__(self) -> int:
        return BATCH * BATCHES

    def __getitem__(self, index: int) -> torch.Tensor:
        time.sleep(READ_S)
        return self.transform(torch.full((3,), float(index)))


class Scale:
    def __init__(self, factor: float) -> None:
        self.factor = factor

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        time.sleep(TRANSFORM_S)
        return x * self.factor


def slow_collate(samples: list[torch.Tensor]) -> torch.Tensor:
    time.sleep(COLLATE_S)
    return torch.stack(samples)


def captured(num_workers: int, step_s: float = 0.0) -> list[dict]:
    capture = DataLoaderCapture()
    capture.install()
    try:
        loader = DataLoader(SlowImages(), batch_size=BATCH, num_workers=num_workers, collate_fn=slow_collate)
        seen = []
        for batch in loader:
            seen.append(batch)
            time.sleep(step_s)
        table = capture.table()
    finally:
        capture.uninstall()
    assert len(seen) == BATCHES and torch.equal(seen[1][0], torch.full((3,), 2.0 * BATCH))  # data unchanged
    assert table.schema.equals(DATALOADER_CAPTURE_SCHEMA, check_metadata=False)
    return table.to_pylist()


def test_waits_in_the_training_process_last_as_long_as_reading_the_batch() -> None:
    rows = captured(num_workers=0)
    waits = [r for r in rows if r["kind"] == "wait"]
    assert [r["batch"] for r in waits] == list(range(BATCHES))
    floor = BATCH * (READ_S + TRANSFORM_S) + COLLATE_S
    assert all(r["end_ns"] - r["start_ns"] >= floor * 1e9 for r in waits)
    assert all(r["ready_batches"] is None for r in waits)  # no queue without workers


def test_worker_timings_separate_read_transform_and_collate() -> None:
    rows = captured(num_workers=2)
    fetches = [r for r in rows if r["kind"] == "fetch"]
    assert len(fetches) == BATCHES
    assert {r["worker"] for r in fetches} == {0, 1}
    assert len({r["pid"] for r in fetches}) == 2  # two worker processes, not the training one
    for r in fetches:
        assert r["samples"] == BATCH
        assert r["transform_ns"] >= BATCH * TRANSFORM_S * 1e9
        assert r["read_ns"] >= BATCH * READ_S * 1e9
        assert r["collate_ns"] >= COLLATE_S * 1e9
        assert r["read_ns"] + r["transform_ns"] + r["collate_ns"] <= r["end_ns"] - r["start_ns"]


def test_ready_batches_show_workers_that_keep_ahead_of_a_slow_training_step() -> None:
    fetch_s = BATCH * (READ_S + TRANSFORM_S) + COLLATE_S
    rows = captured(num_workers=2, step_s=4 * fetch_s)  # training far slower than the workers
    waits = [r for r in rows if r["kind"] == "wait"]
    assert max(r["ready_batches"] for r in waits[1:]) >= 1
    later = [r["end_ns"] - r["start_ns"] for r in waits[2:] if r["ready_batches"]]
    assert later and min(later) < fetch_s * 1e9  # a queued batch is handed out without a full read


def test_waits_land_in_the_profiler_step_that_requested_them(tmp_path: Path) -> None:
    import pyarrow.parquet as pq

    capture = DataLoaderCapture()
    capture.install()
    try:
        loader = DataLoader(SlowImages(), batch_size=BATCH, num_workers=0, collate_fn=slow_collate)
        window = torch.profiler.schedule(wait=0, warmup=1, active=3, repeat=1)
        trace_file = tmp_path / "trace.json"
        with torch.profiler.profile(
            activities=[torch.profiler.ProfilerActivity.CPU],
            schedule=window,
            on_trace_ready=lambda p: p.export_chrome_trace(str(trace_file)),
        ) as prof:
            batches = iter(loader)
            for _ in range(4):
                next(batches).sum()
                prof.step()
        table = capture.table()
    finally:
        capture.uninstall()
    pq.write_table(table, tmp_path / "dataloader.parquet")
    trace = merge_sidecars(
        read_kineto(tmp_path / "trace.json"), {"dataloader": tmp_path / "dataloader.parquet"}
    )
    assert trace.dataloader.schema.equals(DATALOADER_SCHEMA, check_metadata=False)
    waits = [r for r in trace.dataloader.to_pylist() if r["kind"] == "wait"]
    # batch 0 was read during the warm-up step, which the trace does not cover
    assert [(r["batch"], r["step"]) for r in waits] == [(0, -1), (1, 1), (2, 2), (3, 3)]
    floor = BATCH * (READ_S + TRANSFORM_S) + COLLATE_S
    assert all(r["dur_ns"] >= floor * 1e9 for r in waits)


def test_uninstall_restores_torch_and_removes_its_folder() -> None:
    from torch.utils.data import dataloader
    from torch.utils.data._utils import fetch

    before = (dataloader._BaseDataLoaderIter.__next__, fetch._MapDatasetFetcher.fetch, torch.Tensor.to)
    capture = DataLoaderCapture()
    capture.install()
    capture.install()
    folder = capture._folder
    assert folder is not None and folder.is_dir()
    capture.uninstall()
    capture.uninstall()
    assert (
        dataloader._BaseDataLoaderIter.__next__,
        fetch._MapDatasetFetcher.fetch,
        torch.Tensor.to,
    ) == before
    assert "to" not in torch.Tensor.__dict__ and "cuda" not in torch.Tensor.__dict__  # inherited again
    assert not folder.exists()


class Numbers(Dataset):
    def __len__(self) -> int:
        return 200

    def __getitem__(self, index: int) -> torch.Tensor:
        return torch.tensor([index])


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="reads a worker's open files in /proc")
def test_a_persistent_worker_stops_recording_once_profiling_is_over() -> None:
    """Profiling ends while a persistent worker lives on: it must not keep appending to its
    (removed) record file for the rest of training; it closes it within 64 batches."""
    capture = DataLoaderCapture()
    capture.install()
    loader = DataLoader(Numbers(), batch_size=1, num_workers=1, persistent_workers=True)
    first = list(loader)
    assert capture.table().num_rows > 200  # recorded while profiling
    capture.uninstall()
    worker = loader._iterator._workers[0].pid

    def record_files() -> list[str]:
        fd = Path(f"/proc/{worker}/fd")
        return [t for t in (str(p.readlink()) for p in fd.iterdir()) if "perfsight-dataloader" in t]

    assert record_files()  # still open: the worker has not noticed yet
    again = list(loader)
    assert record_files() == []
    assert all(torch.equal(a, b) for a, b in zip(first, again, strict=True))


COPIES = 12


class BigBatches(Dataset):
    """Whole batches of 8M float32 (32 MB, one shared buffer) handed out as they are
    (``batch_size=None``): the loader costs next to nothing, so a loop that converts each batch
    spends its time in the copy (tens of ms against microseconds: a loaded machine that stalls a
    request for a few ms does not turn the verdict)."""

    def __init__(self) -> None:
        self.images = torch.ones(8_000_000)

    def __len__(self) -> int:
        return COPIES

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.images, torch.tensor(index)


def _copy_loop(convert: bool) -> tuple[list[dict], list[float], pa.Table]:
    """A real loop that moves each batch with ``.to()``: to float64 (a real copy on any machine) or
    to the CPU it is already on (no copy: what a CPU-only job's ``.to(device)`` does)."""
    capture = DataLoaderCapture()
    capture.install()
    seen, copy_ns = [], []
    try:
        for images, labels in DataLoader(BigBatches(), batch_size=None, num_workers=0):
            start = time.perf_counter_ns()
            moved = images.to(torch.float64) if convert else images.to("cpu")
            labels = labels.to("cpu")  # no copy: not counted
            copy_ns.append(time.perf_counter_ns() - start)
            assert moved.dtype == (torch.float64 if convert else torch.float32) and float(moved[-1]) == 1.0
            seen.append(int(labels))
        table = capture.stop()
    finally:
        capture.uninstall()
    assert seen == list(range(COPIES))  # the batches and the copies are the user's, unchanged
    return [r for r in table.to_pylist() if r["kind"] == "copy"], copy_ns, table


def test_the_loops_copy_of_each_batch_is_timed_with_its_bytes() -> None:
    copies, outside_ns, _ = _copy_loop(convert=True)
    assert [r["batch"] for r in copies] == list(range(COPIES))
    assert all(r["bytes"] == 32_000_000 and r["stage"] == "cpu" for r in copies)  # the images only
    for row, outside in zip(copies, outside_ns, strict=True):
        assert 0 < row["end_ns"] - row["start_ns"] <= outside  # within the loop's own timing of it


def test_a_to_that_copies_nothing_leaves_the_copy_stage_absent() -> None:
    from perfsight.analysis.data_pipeline import data_stages
    from perfsight.ingest.sidecar import dataloader_table

    copies, _, table = _copy_loop(convert=False)
    assert copies == []
    trace = make_trace([], [])
    trace.dataloader = dataloader_table(trace, table, 0)
    assert "to_device" not in data_stages(trace).column("stage").to_pylist()


def test_a_loop_held_up_by_its_copy_names_the_copy_to_the_device() -> None:
    from perfsight.analysis.data_pipeline import data_pipeline_summary, data_stages
    from perfsight.ingest.sidecar import dataloader_table

    _, _, table = _copy_loop(convert=True)
    trace = make_trace([], [])
    trace.dataloader = dataloader_table(trace, table, 0)
    summary = data_pipeline_summary(trace).to_pylist()[0]
    assert summary["verdict"] == "host to device" and summary["bottleneck_stage"] == "to_device"
    assert "copied its batches to cpu" in summary["reason"]
    stages = data_stages(trace).to_pylist()
    assert stages[-1]["stage"] == "to_device" and stages[-1]["op_type"] == "DeviceCopy"
    assert stages[-1]["batches"] == COPIES and stages[-1]["runs_in"] == "training process"
