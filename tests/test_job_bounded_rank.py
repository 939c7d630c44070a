"""A job's rank analysed within a memory limit (chunk of steps by chunk, issue 21 target 4) gives
the job every output, and the cross-rank step every per-rank fact, the whole-trace analysis gives.

Inputs: the real two-rank NCCL pair (``two_ranks_ws128``), a generated four-rank job large enough
for several chunks per rank (``benchmarks/gen_cluster_job.py``), and a real two-rank gloo job
profiled with plain ``torch.profiler`` and its Python tracer, whose ``nn.Module`` forwards
exercise the module table and the ops' module context; and real two-stage pipeline jobs
(``examples/train_pp.py``), whose Forward/Backward micro-batch ranges feed the pipeline chart.
"""

from __future__ import annotations

import dataclasses
import pickle
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

import shared_data
from _compare_outputs import TINY, job_is_the_same_within_a_tiny_limit
from _jobs import PP_JOB, run_example, trained_jobs
from perfsight.analysis.modules import module_ranges, module_statistic
from perfsight.analysis.op_context import op_context
from perfsight.analysis.step_ops import step_ops
from perfsight.cluster.discovery import RankInput
from perfsight.cluster.job import analyse_job
from perfsight.cluster.rank import RankDigest, RankTask, comm_rows, compact_table, run_rank, time_span
from perfsight.cluster.rank_chunks import RankExtras, rank_budget
from perfsight.engine.local import SerialExecutor
from perfsight.ingest import read_trace
from perfsight.model_chunks import split_by_steps
from shared_data import KINETO, REPO


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The real NCCL pair, copied (outputs are written next to a job by default)."""
    source = shared_data.require(KINETO / "two_ranks_ws128")
    job = tmp_path_factory.mktemp("pair") / "two_ranks_ws128"
    shutil.copytree(source, job)
    return job


@pytest.fixture(scope="module")
def generated(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Four generated ranks of about 10 MB: several steps and, at a tiny limit, several chunks each."""
    job = tmp_path_factory.mktemp("generated") / "job"
    subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "gen_cluster_job.py"), "--out", str(job)]
        + ["--ranks", "4", "--size-mb", "10", "--layers", "2", "--stragglers", "1:1.3", "--slow-link", ""],
        check=True,
        capture_output=True,
        timeout=300,
    )
    return job


@pytest.fixture(scope="module")
def modules_job(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real two-rank gloo job's plain Kineto traces, with ``nn.Module`` forwards."""
    job = tmp_path_factory.mktemp("plain") / "job"
    done = subprocess.run(
        [sys.executable, str(REPO / "tests" / "_plain_kineto_job.py"), str(job)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return job


@pytest.fixture(scope="module")
def pipeline_job(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The real two-stage pipeline job of `make demo` (its ranks record Forward/Backward
    micro-batch ranges); read-only."""
    return trained_jobs(tmp_path_factory) / PP_JOB


@pytest.fixture(scope="module")
def long_pipeline_job(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real two-stage pipeline job profiled over 12 steps of 8 micro-batches: within the tiny
    limit each rank is cut into several chunks, with micro-batch ranges in more than one."""
    job = tmp_path_factory.mktemp("long_pipeline") / "pp"
    run_example(
        "train_pp.py", job, "--stages", "2", "--overload-stage", "1", "--active", "12", "--micro-batches", "8"
    )
    return job


def test_a_real_nccl_pair_gives_the_same_job_outputs_within_a_tiny_limit(pair: Path, tmp_path: Path) -> None:
    job_is_the_same_within_a_tiny_limit(pair, tmp_path, least_chunks=1)


def test_a_pipeline_job_gives_the_same_outputs_chunk_by_chunk(
    long_pipeline_job: Path, tmp_path: Path
) -> None:
    """The pipeline chart's Forward/Backward blocks come from every chunk of a stage's rank."""
    job_is_the_same_within_a_tiny_limit(long_pipeline_job, tmp_path, least_chunks=2)


def test_the_printed_job_summary_says_which_ranks_were_read_in_chunks(
    generated: Path, tmp_path: Path
) -> None:
    """The cluster summary is the same either way, so the line under it is how a user sees that the
    limit was kept, and for how many ranks."""
    done = subprocess.run(
        [sys.executable, "-c", "from perfsight.cli import main; main()", "analyse", str(generated)]
        + ["--out", str(tmp_path / "out"), "--memory-limit", TINY, "--no-progress"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr
    assert (
        "memory limit 1.00 MiB per rank: 4 of 4 analysed ranks read in chunks of whole steps" in done.stdout
    )


def test_a_job_of_large_ranks_gives_the_same_outputs_chunk_by_chunk(generated: Path, tmp_path: Path) -> None:
    job_is_the_same_within_a_tiny_limit(generated, tmp_path, least_chunks=2)


def test_a_job_with_module_forwards_gives_the_same_outputs_within_a_tiny_limit(
    modules_job: Path, tmp_path: Path
) -> None:
    job_is_the_same_within_a_tiny_limit(modules_job, tmp_path, least_chunks=1)
    table = tmp_path / "out" / "cluster_analysis_output" / "module_statistic.csv"
    assert "Linear" in table.read_text()  # the module table was filled, not merely empty on both sides


def _traces(*jobs: Path) -> list[Path]:
    return [p for job in jobs for p in sorted(job.rglob("*.json*")) if not p.name.startswith(".")]


def test_each_cluster_extra_computed_step_by_step_equals_the_whole_traces(
    pair: Path, generated: Path, modules_job: Path, pipeline_job: Path
) -> None:
    placed = micro_batches = 0
    pipeline_traces = sorted(pipeline_job.rglob("kineto_trace_*.json"))
    for path in _traces(pair, generated, modules_job) + pipeline_traces:
        trace = read_trace(path)
        ops = step_ops(trace)
        ranges = module_ranges(trace)
        extras = RankExtras()
        chunks = 0
        for chunk in split_by_steps(trace, 1):  # one step per chunk
            extras.add(chunk)
            chunks += 1
        assert chunks == trace.steps.num_rows >= 2, path
        got = extras.tables(trace.rank)
        assert got["step_ops"].equals(compact_table("step_ops", ops)), path  # as a digest holds it
        assert got["op_context"].equals(op_context(trace, ops, ranges)), path
        assert got["module_statistic"].equals(module_statistic(trace, ranges)), path
        assert extras.comm().equals(comm_rows(trace)), path
        assert extras.span == time_span(trace), path
        placed += sum(1 for m in got["op_context"].column("module").to_pylist() if m)
        micro_batches += got["step_ops"].column("level").to_pylist().count("micro_batch")
    assert placed  # some ops were placed in a module forward
    assert micro_batches  # and the pipeline stages' Forward/Backward ranges were kept


def _same_digest(bounded: RankDigest, whole: RankDigest) -> None:
    assert bounded.meta == whole.meta
    assert bounded.steps.equals(whole.steps)
    assert bounded.comm.equals(whole.comm)
    assert bounded.span_ns == whole.span_ns
    assert sorted(bounded.tables) == sorted(whole.tables)
    for name, table in whole.tables.items():
        assert bounded.tables[name].equals(table), name


def test_a_rank_analysed_without_outputs_keeps_the_same_digest_within_a_limit(generated: Path) -> None:
    """The path of a job above the per-rank-outputs limit: the analysis spills to a temporary folder."""
    item = RankInput(str(_traces(generated)[0]))
    whole = run_rank(item, RankTask(out_root=None))
    bounded = run_rank(item, RankTask(out_root=None, memory_limit=1))
    assert isinstance(whole, RankDigest) and isinstance(bounded, RankDigest)
    _same_digest(bounded, whole)


def test_a_rank_with_outputs_keeps_the_same_digest_and_summary_within_a_limit(
    modules_job: Path, tmp_path: Path
) -> None:
    item = RankInput(str(_traces(modules_job)[0]))
    whole = run_rank(item, RankTask(out_root=str(tmp_path / "whole")))
    bounded = run_rank(item, RankTask(out_root=str(tmp_path / "bounded"), memory_limit=1))
    assert isinstance(whole, RankDigest) and isinstance(bounded, RankDigest)
    _same_digest(bounded, whole)
    assert bounded.summary is not None and whole.summary is not None
    assert bounded.summary.pop("bounded")["memory_limit_bytes"] == 1
    assert bounded.summary.pop("output_dir").replace("bounded", "whole") == whole.summary.pop("output_dir")
    assert bounded.summary == whole.summary


def test_a_rank_goes_the_bounded_way_when_it_needs_more_than_its_workers_share(pair: Path) -> None:
    trace = _traces(pair)[0]
    assert rank_budget(trace, RankTask(out_root=None)) is None  # a small rank is read whole
    crowded = RankTask(out_root=None, workers=1 << 40)  # so many ranks side by side: a tiny share each
    assert rank_budget(trace, crowded) is not None
    assert rank_budget(trace, RankTask(out_root=None, memory_limit=1)) == 1


def test_a_large_ranks_per_op_tables_travel_to_the_parent_as_files(generated: Path, tmp_path: Path) -> None:
    """Within a limit, a rank's step ops and op context are left in the job's digest folder: the
    digest the worker pickles to the parent carries their paths, not their rows, and the parent
    reads the same rows the whole-trace digest has."""
    item = RankInput(str(_traces(generated)[0]))
    whole = run_rank(item, RankTask(out_root=None))
    folder = tmp_path / "digests"
    bounded = run_rank(item, RankTask(out_root=None, memory_limit=1, digest_dir=str(folder)))
    assert isinstance(whole, RankDigest) and isinstance(bounded, RankDigest)
    assert sorted(bounded.files) == ["op_context", "step_ops"]
    assert {Path(p).parent for p in bounded.files.values()} == {folder}
    sent = pickle.dumps(bounded)
    with_rows = pickle.dumps(dataclasses.replace(bounded, files={}))
    rows = sum(bounded.tables[name].nbytes for name in bounded.files)
    assert len(with_rows) - len(sent) > 0.9 * rows > 0
    _same_digest(pickle.loads(sent), whole)


class _WatchedSerial(SerialExecutor):
    """The serial executor, noting the digest folder the job gave its ranks and what was in it."""

    def __init__(self) -> None:
        self.folders: list[Path] = []
        self.files: list[str] = []

    def map(self, fn, items, *args):  # type: ignore[no-untyped-def]
        results = super().map(fn, items, *args)
        folder = Path(args[0].digest_dir)
        self.folders.append(folder)
        self.files += [p.name for p in folder.iterdir()] if folder.is_dir() else []
        return results


@pytest.mark.parametrize("outputs", [True, False], ids=["with-outputs", "no-outputs"])
def test_the_digest_folder_is_removed_after_the_job_even_when_a_rank_fails(
    generated: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, outputs: bool
) -> None:
    job = tmp_path / "job"
    shutil.copytree(generated, job)
    (job / "rank_broken.json").write_text("this is not a trace")
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))  # where a job without outputs keeps it
    out = tmp_path / "out" if outputs else None
    watched = _WatchedSerial()
    result = analyse_job(job, out, executor=watched, memory_limit=1)
    assert any("rank_broken.json" in line for line in result.job.problems())
    assert len(result.job.ranks) == 4
    (folder,) = watched.folders
    assert folder.parent == (out if outputs else scratch)
    assert sum(name.endswith("-step_ops.arrow") for name in watched.files) == 4  # one per rank, then
    assert not folder.exists()  # and gone now
    assert list(scratch.iterdir()) == []
    if out is not None:
        assert sorted(p.name for p in out.iterdir() if p.name.startswith(".")) == []


def test_the_digest_folder_is_removed_when_the_user_stops_the_job(generated: Path, tmp_path: Path) -> None:
    class Stopped(_WatchedSerial):
        def map(self, fn, items, *args):  # type: ignore[no-untyped-def]
            super().map(fn, items, *args)
            raise KeyboardInterrupt  # Ctrl-C once the ranks are read, before the cross-rank step

    stopped = Stopped()
    with pytest.raises(KeyboardInterrupt):
        analyse_job(generated, tmp_path / "out", executor=stopped, memory_limit=1)
    (folder,) = stopped.folders
    assert sum(name.endswith("-step_ops.arrow") for name in stopped.files) == 4
    assert not folder.exists()
