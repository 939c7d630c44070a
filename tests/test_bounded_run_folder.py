"""A perfsight run folder -- what ``perfsight.profile`` writes -- analysed within a tiny memory
limit gives every output of the whole-trace analysis, its capture tables merged chunk by chunk as
into the whole trace (issue 21: ``perfsight analyse RUN_FOLDER --memory-limit``).

The run folders come from a real two-rank gloo job profiled at Level2 (tests/_run_folder_job.py):
its comm capture holds flight-recorder rows (DDP), Python rows matched by thread, and gloo's
batched recv nested in the send's range (a capture row that claims a slice of its own); its
data-loader capture holds the wait, fetch and stage rows, not in time order.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from _compare_outputs import TINY, analyse, job_is_the_same_within_a_tiny_limit, run_analyse, same_outputs
from perfsight.ingest import read_trace, run_folder
from perfsight.ingest.kineto import read_kineto
from perfsight.ingest.sidecar_chunks import merge_sidecars_in_chunks
from perfsight.model import Trace
from perfsight.model_chunks import split_by_steps
from perfsight.store import cache

JOB = Path(__file__).resolve().parent / "_run_folder_job.py"
ACTIVE_STEPS = 4
UNRECORDED_THREAD = 987_654_321


@pytest.fixture(scope="module")
def job(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The job folder: one run folder per rank (``rank{r}_{time}_perfsight``); read-only."""
    out = tmp_path_factory.mktemp("run-folder-job")
    done = subprocess.run(
        ["timeout", "-k", "10", "300", sys.executable, str(JOB), str(out), "--active", str(ACTIVE_STEPS)],
        capture_output=True,
        text=True,
        timeout=330,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return out


def _run_folder(job: Path, rank: int) -> Path:
    (folder,) = job.glob(f"rank{rank}_*_perfsight")
    return folder


def _with_unrecorded_thread(folder: Path, copy: Path) -> Path:
    """A copy of run folder ``folder`` whose comm capture says its Python calls ran on a thread the
    trace did not record: those capture rows match no slice and become rows of their own, placed
    by time (the flight-recorder rows still match by collective)."""
    shutil.copytree(folder, copy)
    (capture,) = copy.glob("perfsight_comm_*.parquet")
    table = pq.read_table(capture)
    index = table.schema.get_field_index("tid")
    unrecorded = pa.array([UNRECORDED_THREAD] * table.num_rows, table.schema.field(index).type)
    pq.write_table(table.set_column(index, table.schema.field(index), unrecorded), capture)
    return copy


def _analyse_bounded(path: Path, out: Path) -> dict:
    """``perfsight analyse PATH --memory-limit 1M``: the summary and the chunks it says it cut."""
    done = run_analyse(path, out, "--memory-limit", TINY)
    assert done.returncode == 0, done.stderr
    assert "read whole" not in done.stderr  # the limit is kept, not ignored
    (summary,) = json.loads(done.stdout)
    summary.pop("output_dir")
    return {"chunks": summary.pop("bounded")["chunks"], "summary": summary}


def _cached_trace(out: Path) -> Trace:
    """The trace the analysis cached (what ``perfsight serve`` and ``perfsight.load`` read)."""
    (folder,) = {p.parent for p in out.glob("**/cache/meta.json")}
    return cache.load_trace(folder)


@pytest.mark.parametrize("given", ["run folder", "trace file", "capture of an unrecorded thread"])
def test_a_run_folder_gives_every_output_of_the_whole_analysis_within_a_tiny_limit(
    job: Path, tmp_path: Path, given: str
) -> None:
    folder = _run_folder(job, 0 if given == "run folder" else 1)
    path = folder if given == "run folder" else next(folder.glob("kineto_trace_*.json"))
    if given == "capture of an unrecorded thread":
        path = _with_unrecorded_thread(_run_folder(job, 0), tmp_path / "run")
    whole = analyse(path, tmp_path / "whole")
    done = _analyse_bounded(path, tmp_path / "bounded")
    assert done["chunks"] == ACTIVE_STEPS  # a step per chunk: every step boundary is a chunk's
    assert done["summary"] == whole  # steps, shares, top operators, findings, warnings
    same_outputs(tmp_path / "whole", tmp_path / "bounded")
    # what only the run folder knows reached the outputs: the capture's groups, sequence numbers
    # and wait times on the comm rows, the data-loader rows (checked equal above)
    cache = _cached_trace(tmp_path / "bounded")
    assert cache.meta.rank_source == "run folder" and cache.meta.world_size == 2
    sources = set(cache.comm.column("source").to_pylist())
    matched = "capture" if given == "capture of an unrecorded thread" else "trace+capture"
    assert {matched, "trace+flight_recorder"} <= sources
    assert cache.dataloader.num_rows > 0


@pytest.mark.parametrize("capture", ["as recorded", "of an unrecorded thread"])
def test_the_captures_merged_chunk_by_chunk_equal_their_merge_into_the_whole_trace(
    job: Path, tmp_path: Path, capture: str
) -> None:
    folder = _run_folder(job, 0)
    if capture == "of an unrecorded thread":
        folder = _with_unrecorded_thread(folder, tmp_path / "run")
    path = next(folder.glob("kineto_trace_*.json"))
    whole = read_trace(path)  # the Kineto trace with the run folder's facts and captures merged
    info = run_folder.info_for(path)
    assert info is not None
    kineto = read_kineto(path, rank=info.rank)
    steps, files = run_folder.apply_facts(kineto.meta, kineto.steps, info)
    kineto = dataclasses.replace(kineto, steps=steps)
    assert sorted(files) == ["comm", "dataloader"]

    merged = merge_sidecars_in_chunks(lambda: split_by_steps(kineto, 1), steps, kineto.meta, files)
    got, expected = list(merged()), list(split_by_steps(whole, 1))

    assert len(got) == len(expected) == whole.steps.num_rows  # one step per chunk
    for mine, reference in zip(got, expected, strict=True):
        assert mine.trace.comm.equals(reference.trace.comm), mine.number
        assert mine.trace.dataloader.equals(reference.trace.dataloader), mine.number
        for name in ("comm", "dataloader"):
            np.testing.assert_array_equal(mine.table_rows[name], reference.table_rows[name])
    assert kineto.meta.warnings == whole.meta.warnings
    # the merge had rows to place across chunks: capture rows of their own (appended after the
    # trace's rows: gloo's nested recv on its slice; without a slice, by time) and data-loader rows
    # out of time order
    own = whole.comm.slice(read_kineto(path, rank=info.rank).comm.num_rows)
    without_slice = pc.sum(pc.less(own.column("slice"), 0)).as_py() or 0
    if capture == "as recorded":
        assert own.num_rows > 0
    else:
        steps_of_own = set(own.filter(pc.less(own.column("slice"), 0)).column("step").to_pylist())
        assert without_slice > 0 and len(steps_of_own) == ACTIVE_STEPS  # in every chunk
    loader_start = whole.dataloader.column("start_ns").to_numpy()
    assert (np.diff(loader_start) < 0).any()
    assert sum(c.trace.dataloader.num_rows for c in got) == whole.dataloader.num_rows


def test_a_damaged_capture_file_gives_the_whole_analysis_warning_within_a_limit(
    job: Path, tmp_path: Path
) -> None:
    folder = tmp_path / "run"
    shutil.copytree(_run_folder(job, 0), folder)
    (capture,) = folder.glob("perfsight_comm_*.parquet")
    capture.write_bytes(capture.read_bytes()[: capture.stat().st_size // 2])  # cut mid-way

    whole = analyse(folder, tmp_path / "whole")
    done = _analyse_bounded(folder, tmp_path / "bounded")
    assert done["summary"] == whole
    assert any(str(capture) in line and "unreadable comm capture" in line for line in whole["warnings"])
    same_outputs(tmp_path / "whole", tmp_path / "bounded")
    cache = _cached_trace(tmp_path / "bounded")
    assert not pc.any(pc.equal(cache.comm.column("source"), "trace+capture")).as_py()
    assert cache.dataloader.num_rows > 0  # the data-loader capture, intact, is still merged


def test_a_job_of_run_folders_gives_the_same_job_outputs_within_a_tiny_limit(
    job: Path, tmp_path: Path
) -> None:
    """The job as the collector left it (one run folder per rank): each rank read in chunks with its
    captures, and the cross-rank step given the same per-rank facts (issue 21, target 4)."""
    copy = tmp_path / "job"
    shutil.copytree(job, copy)  # outputs go next to the job by default; the fixture's stays read-only
    job_is_the_same_within_a_tiny_limit(copy, tmp_path, least_chunks=2)
