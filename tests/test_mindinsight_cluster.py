"""MindSpore's ``ascend_cluster_analyse_{data|model|pipeline}-parallel_<stages>_<ranks>_<rank>.csv``
(../shared/data/mindinsight run_2/3/4), compared with what MindInsight 2.3.1 showed on its cluster
step-trace page for the same folders, and with the file itself.

The MindInsight numbers were read once from its API (a copy of ../shared/data/mindinsight with
{"context_mode": "graph"} as profiler/profiler_info_1.json), served by
  pip install mindinsight==2.3.1 gunicorn   (in a venv outside the repo)
  mindinsight start --summary-base-dir COPY --port 8092
  curl -X POST -d '{"device_id":"1","filter_condition":{"step_id":S}}' \\
    'http://127.0.0.1:8092/v1/mindinsight/profile/cluster-step-trace-summary?train_id=./run_N/normal_run'
for N in 2, 3, 4 and S in 0 (MindInsight's average) and 1 (step 1)."""

from __future__ import annotations

import csv
import json
import shutil
from pathlib import Path

import pytest

from perfsight.cli import main
from perfsight.cluster.job import analyse_job, write_cluster_outputs
from perfsight.ingest import read_trace
from shared_data import MINDINSIGHT, require
from test_mindinsight_real import _tree_hash

# "parallel-mode", "stage_num", and per step_id the one rank's (rank_id 1) list: data parallel
# "step_trace_info" = [iteration interval, fp+bp, tail, step] ms (from the step trace, not the file);
# model parallel "step_bottleneck_info" = [iteration interval, computation, communication alone] ms;
# pipeline parallel: those and [stage, receive alone, collective communication alone] ms.
MINDINSIGHT_CLUSTER = {
    "run_2": ("data-parallel", 1, {0: [12.4321, 0.0, 0.0, 0.0], 1: [0.0, 23.6681, 0.041, 23.7091]}),
    "run_3": ("model-parallel", 1, {0: [0.0, 651.9051, 1293.1231], 1: [0.0, 651.9051, 1293.1231]}),
    "run_4": (
        "pipeline-parallel",
        1,
        {
            0: [0.0, 651.9051, 1293.1231, 1577.1234, 368.7766, 227.1234],
            1: [0.0, 651.9051, 1293.1231, 1577.1234, 368.7766, 227.1234],
        },
    ),
}
HALF_DIGIT = 5e-5 + 1e-9  # half of MindInsight's last shown digit (ms), with room for float noise
BOTTLENECK_COLUMNS = [  # MindInsight's step_bottleneck_info order -> cluster_step_trace_time.csv column
    "Iteration Interval(us)",
    "Computing(us)",
    "Communication(Not Overlapped)(us)",
    "Stage(us)",
    "Receive(Not Overlapped)(us)",
    "Communication(Not Overlapped and Exclude Receive)(us)",
]


def _cluster_rows(tmp_path: Path, run: str) -> tuple[Path, list[dict[str, str]]]:
    """The run copied to tmp, analysed as a job (one rank of two here), its cluster step trace rows;
    the job's summary names the ranks whose breakdown is the file's (model and pipeline parallel)."""
    copy = Path(shutil.copytree(require(MINDINSIGHT / run), tmp_path / run))
    result = analyse_job(copy, tmp_path / "out", executor="serial")
    folder = write_cluster_outputs(result, tmp_path / "out")
    problems = json.loads((folder / "cluster_summary.json").read_text())["problems"]
    from_file = [p for p in problems if "read from MindSpore's ascend_cluster_analyse file" in p]
    assert from_file == (["ranks 1: " + from_file[0].split(": ", 1)[1]] if run != "run_2" else [])
    with (folder / "cluster_step_trace_time.csv").open(newline="") as handle:
        return copy, list(csv.DictReader(handle))


@pytest.mark.parametrize("run", ["run_3", "run_4"])
def test_model_and_pipeline_parallel_breakdown_is_mindinsights(tmp_path: Path, run: str) -> None:
    mode, stages, by_step = MINDINSIGHT_CLUSTER[run]
    copy, rows = _cluster_rows(tmp_path, run)
    rank = {r["Step"]: r for r in rows if r["Type"] == "rank" and r["Index"] == "1"}
    assert set(rank) == {"1", "average"}  # MindInsight: total_step_num "1"
    for step, ours in (("1", rank["1"]), ("average", rank["average"])):
        expected = by_step[1 if step == "1" else 0]
        shown = [round(float(ours[c]) / 1000, 4) for c in BOTTLENECK_COLUMNS[: len(expected)]]
        assert shown == expected, step
    if mode == "pipeline-parallel":  # the file does not split waiting from transfer: no bubble
        assert float(rank["1"]["Bubble(us)"]) == 0.0
    assert {int(r["Stage"]) for r in rows} == {stages - 1}  # one stage (perfsight counts from 0)
    trace = read_trace(next((copy / "normal_run/profiler").glob("step_trace_raw_*.csv")))
    assert trace.meta.extra["mindinsight"]["parallel"]["mode"] + "-parallel" == mode
    [note] = [w for w in trace.meta.warnings if "MindSpore's cluster analysis" in w]
    assert note.startswith(str(next((copy / "normal_run/profiler").glob("ascend_cluster_analyse_*"))))
    assert f"computation {by_step[0][1]:.4f} ms, communication alone {by_step[0][2]:.4f} ms" in note


def test_data_parallel_file_repeats_the_step_trace_mindinsight_shows(tmp_path: Path) -> None:
    mode, _, by_step = MINDINSIGHT_CLUSTER["run_2"]
    copy, rows = _cluster_rows(tmp_path, "run_2")
    [ours] = [r for r in rows if r["Type"] == "rank" and r["Step"] == "1"]
    # perfsight's own step (its FP/BP points differ from MindInsight's, see test_mindinsight_real)
    # (ms to 4 decimals as MindInsight rounds them: the CSV's µs are 23709.05, a tie MindInsight rounds up)
    assert float(ours["Step Time(us)"]) / 1000 == pytest.approx(by_step[1][3], abs=HALF_DIGIT)
    assert float(ours["Iteration Interval(us)"]) / 1000 == pytest.approx(by_step[1][0], abs=HALF_DIGIT)
    trace = read_trace(copy / "normal_run/profiler/step_trace_raw_1_detail_time.csv")
    [row] = trace.vendor.tables["mindinsight_cluster_analyse"].to_pylist()
    assert row["mode"] + "-parallel" == mode
    assert [round(row[k] / 1e6, 4) for k in ("iteration_interval_ns", "fp_bp_ns", "tail_ns")] == by_step[1][
        :3
    ]
    assert row["computing_ns"] is None  # a data-parallel file has no breakdown: perfsight's own stays


def test_the_input_tree_stays_byte_for_byte_unchanged(tmp_path: Path) -> None:
    copy = Path(shutil.copytree(require(MINDINSIGHT / "run_4"), tmp_path / "run_4"))
    before = _tree_hash(copy)
    write_cluster_outputs(analyse_job(copy, tmp_path / "job", executor="serial"), tmp_path / "job")
    assert main(["analyse", str(copy), "--out", str(tmp_path / "out"), "--no-progress"]) == 0
    assert _tree_hash(copy) == before


def test_a_damaged_cluster_file_is_named_and_the_rest_loads(tmp_path: Path) -> None:
    profiler = Path(shutil.copytree(require(MINDINSIGHT / "run_4/normal_run/profiler"), tmp_path / "p"))
    damaged = profiler / "ascend_cluster_analyse_pipeline-parallel_1_2_1.csv"
    header, values = damaged.read_text().splitlines()
    damaged.write_text(header + "\n" + values.replace("1577.1234", "n/a") + "\n")
    trace = read_trace(profiler / "step_trace_raw_1_detail_time.csv")
    assert f"{damaged}: 1 cell(s) of stage_time not a number; left empty" in trace.meta.warnings
    [row] = trace.vendor.tables["mindinsight_cluster_analyse"].to_pylist()
    assert (row["stage_ns"], row["computing_ns"]) == (None, 651_905_100)
    assert trace.steps.num_rows == 1
    (profiler / damaged.name).write_text("something,else\n1,2\n")
    trace = read_trace(profiler / "step_trace_raw_1_detail_time.csv")
    assert any(w.startswith(f"{damaged}: none of the columns MindInsight reads") for w in trace.meta.warnings)
    assert "mindinsight_cluster_analyse" not in trace.vendor.tables and trace.steps.num_rows == 1


def test_the_served_rank_states_mindspores_breakdown_and_the_folder_stays_unchanged(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One rank of a two-rank job is not a job for the server (no job pages): its overview's warnings
    carry MindSpore's numbers, labelled, as MindInsight showed them."""
    from _ui import Server

    base = tmp_path / "base"
    shutil.copytree(require(MINDINSIGHT / "run_4"), base / "run_4")
    before = _tree_hash(base)
    monkeypatch.setenv("PERFSIGHT_CACHE_DIR", str(tmp_path / "server_cache"))
    server = Server(base)
    try:
        run = "run_4/normal_run/profiler"
        server.wait_ready(run)
        warnings = server.get("run/overview", run=run)["warnings"]
    finally:
        server.stop()
    [note] = [w for w in warnings if "MindSpore's cluster analysis (pipeline parallel" in w]
    _, _, by_step = MINDINSIGHT_CLUSTER["run_4"]
    _, computation, alone, stage, receive, collective = by_step[0]
    assert (
        f"computation {computation:.4f} ms, communication alone {alone:.4f} ms, stage {stage:.4f} ms, "
        f"receive alone {receive:.4f} ms, collective communication alone {collective:.4f} ms"
    ) in note
    assert _tree_hash(base) == before


def test_a_row_past_the_steps_is_mindinsights_average_not_a_step(tmp_path: Path) -> None:
    """MindInsight: row k is step k, the last row its average ("step 0"); with one row more than the
    step trace's steps, that row is no step of the cluster step trace."""
    copy = Path(shutil.copytree(require(MINDINSIGHT / "run_3"), tmp_path / "run_3"))
    file = copy / "normal_run/profiler/ascend_cluster_analyse_model-parallel_1_2_1.csv"
    file.write_text(file.read_text() + "600.5,1200.25\n")
    trace = read_trace(copy / "normal_run/profiler/step_trace_raw_1_detail_time.csv")
    rows = trace.vendor.tables["mindinsight_cluster_analyse"].to_pylist()
    assert [(r["step"], r["computing_ns"]) for r in rows] == [(1, 651_905_100), (0, 600_500_000)]
    [note] = [w for w in trace.meta.warnings if "MindSpore's cluster analysis" in w]
    assert "computation 600.5000 ms, communication alone 1200.2500 ms" in note
    result = analyse_job(copy, None, executor="serial")
    assert result.steps[["step", "computing_ns"]].values.tolist() == [[1, 651_905_100]]
