"""The Communication and Communication matrix pages' API: every number is one of the cluster
analysis's files, selected, summed per rank or per block, sorted and paged on the server.

Expected values are read here, independently, from the files the analysis wrote for the real jobs
of `make demo` (tests/_jobs.py): ``communication_matrix.json`` (the matrix and the links) and
``cluster_communication_ops.csv`` (the ops, and each rank's sums).
"""

from __future__ import annotations

import csv
import json
import math
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
from fastapi.testclient import TestClient

from _jobs import DDP_JOB, PP_JOB, demo_base
from _server_helpers import wait_ready
from perfsight.server import create_app, job_matrix

MB = 2**20  # communication_matrix.json's MB (docs/CLUSTER.md, section 6)


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return demo_base(tmp_path_factory, tmp_path_factory.mktemp("demo-comm") / "demo_output")


@pytest.fixture(scope="module")
def client(base: Path, tmp_path_factory: pytest.TempPathFactory) -> TestClient:
    with TestClient(create_app(base, cache_dir=tmp_path_factory.mktemp("cache"))) as client:
        for run in (DDP_JOB, PP_JOB):
            assert wait_ready(client, run)["status"] == "ready"
        yield client


def cluster_output(client: TestClient, run: str) -> Path:
    """The cluster_analysis_output/ the server reads for ``run``."""
    root = client.app.state.registry.opened(run).root
    return root / "cluster_analysis_output"


def matrix_entries(folder: Path) -> list[dict[str, Any]]:
    """Every entry of communication_matrix.json, flattened, in the file's own units."""
    doc = json.loads((folder / "communication_matrix.json").read_text())
    out = []
    for step_key, kinds in doc.items():
        for kind, ops in kinds.items():
            for op_key, links in ops.items():
                op, group = op_key.split("-total@", 1)
                for pair, link in links.items():
                    src, dst = (int(x) for x in pair.split("-"))
                    out.append(
                        {"step": int(step_key[4:]), "kind": kind, "op": op, "group": group, "src": src,
                         "dst": dst, "type": link["Transport Type"], "mb": link["Transit Size(MB)"],
                         "ms": link["Transit Time(ms)"], "gbs": link["Bandwidth(GB/s)"]}
                    )  # fmt: skip
    return out


def expected_blocks(entries: list[dict[str, Any]], metric: str, block: int) -> dict[tuple[int, int], float]:
    """The documented aggregation (src/perfsight/server/job_matrix.py), in the API's units."""
    cells: dict[tuple[int, int], list[dict[str, Any]]] = defaultdict(list)
    for e in entries:
        cells[(e["src"] // block, e["dst"] // block)].append(e)
    if metric == "size":
        return {k: sum(e["mb"] for e in v) * MB for k, v in cells.items()}
    if metric == "time":
        return {k: sum(e["ms"] for e in v) * 1e6 for k, v in cells.items()}
    timed = {k: [e for e in v if e["ms"] > 0] for k, v in cells.items()}  # no transit: no bandwidth
    return {k: sum(e["gbs"] for e in v) / len(v) * 1e9 for k, v in timed.items() if v}


def got_blocks(matrix: dict[str, Any]) -> dict[tuple[int, int], float]:
    cells = matrix["cells"]
    return {(r, c): v for r, c, v in zip(cells["src_block"], cells["dst_block"], cells["value"], strict=True)}


@pytest.mark.parametrize("run", [DDP_JOB, PP_JOB])
@pytest.mark.parametrize("metric", ["bandwidth", "size", "time"])
@pytest.mark.parametrize("cells", [1, 256])
def test_the_matrix_blocks_are_the_files_links_summed_or_averaged(
    client: TestClient, run: str, metric: str, cells: int
) -> None:
    entries = matrix_entries(cluster_output(client, run))
    assert entries, "the demo job wrote no link"
    ranks = max(max(e["src"], e["dst"]) for e in entries) + 1
    steps = sorted({e["step"] for e in entries})
    for step in ["all", str(steps[-1])]:
        got = client.get(
            "/api/job/communication/matrix",
            params={"run": run, "metric": metric, "step": step, "cells": cells},
        ).json()
        # cells=1: the whole job in one block; 256: one rank a cell (the file's own values)
        assert got["block"] == (1 << (ranks - 1).bit_length() if cells == 1 else 1) and got["ranks"] == ranks
        chosen = [e for e in entries if step == "all" or e["step"] == int(step)]
        want = expected_blocks(chosen, metric, got["block"])
        have = got_blocks(got)
        assert have.keys() == want.keys(), (run, metric, step)
        for key, value in want.items():
            assert have[key] == pytest.approx(value, rel=1e-9), (run, metric, step, key)
        assert got["min"] == pytest.approx(min(want.values())) and got["max"] == pytest.approx(
            max(want.values())
        )


def test_the_matrix_filters_by_op_family_and_group_and_zooms_into_a_window(client: TestClient) -> None:
    entries = matrix_entries(cluster_output(client, PP_JOB))
    kinds = {e["kind"] for e in entries}
    for kind in kinds:
        got = client.get(
            "/api/job/communication/matrix", params={"run": PP_JOB, "metric": "size", "op": kind}
        )
        want = expected_blocks([e for e in entries if e["kind"] == kind], "size", 1)
        assert got_blocks(got.json()) == pytest.approx(want)
    # a window of source rank 1 only: the cells of links leaving rank 1, counted from the window
    src = 1
    got = client.get(
        "/api/job/communication/matrix",
        params={"run": PP_JOB, "metric": "time", "src_lo": src, "src_hi": src + 1},
    ).json()
    assert got["rows"] == 1 and got["src_lo"] == src
    want = expected_blocks([e for e in entries if e["src"] == src], "time", 1)
    assert got_blocks(got) == pytest.approx({(0, dst): v for (_, dst), v in want.items()})
    group = entries[0]["group"]
    one = client.get(
        "/api/job/communication/matrix", params={"run": PP_JOB, "group": group, "metric": "size"}
    )
    assert sum(one.json()["cells"]["links"]) == sum(e["group"] == group for e in entries)
    other = client.get("/api/job/communication/matrix", params={"run": PP_JOB, "group": "no-such-group"})
    assert other.json()["cells"]["value"] == [] and other.json()["min"] is None


def ops_rows(folder: Path) -> list[dict[str, str]]:
    with open(folder / "cluster_communication_ops.csv", newline="") as f:
        return list(csv.DictReader(f))


@pytest.mark.parametrize("run", [DDP_JOB, PP_JOB])
def test_each_ranks_communication_and_wait_time_are_its_ops_sums(client: TestClient, run: str) -> None:
    ops = ops_rows(cluster_output(client, run))
    sums: dict[int, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for op in ops:
        for column in ("elapse_ns", "transit_ns", "wait_ns", "synchronization_ns", "idle_ns"):
            sums[int(op["rank"])][column] += float(op[column])
        sums[int(op["rank"])]["ops"] += 1
    got = client.get("/api/job/communication", params={"run": run}).json()
    assert [r["rank"] for r in got["rows"]] == sorted(sums)  # default: rank order
    for row in got["rows"]:
        for column, value in sums[row["rank"]].items():
            assert row[column] == value, (run, row["rank"], column)
    # sorted on the server, both ways
    waits = client.get(
        "/api/job/communication", params={"run": run, "sort": "wait_ns", "order": "desc"}
    ).json()
    assert [r["wait_ns"] for r in waits["rows"]] == sorted(
        (s["wait_ns"] for s in sums.values()), reverse=True
    )
    # one step: that step's ops only
    step = got["choices"]["steps"][-1]
    one = client.get("/api/job/communication", params={"run": run, "step": step}).json()
    in_step = defaultdict(float)
    for op in ops:
        if op["step"] and int(float(op["step"])) == int(step):
            in_step[int(op["rank"])] += float(op["elapse_ns"])
    assert {r["rank"]: r["elapse_ns"] for r in one["rows"]} == {r: in_step.get(r, 0) for r in sums}


def test_a_ranks_links_are_the_file_entries_that_touch_it(client: TestClient) -> None:
    entries = matrix_entries(cluster_output(client, DDP_JOB))
    for rank in {e["src"] for e in entries}:
        got = client.get(
            "/api/job/communication/links", params={"run": DDP_JOB, "rank": rank, "limit": 1000}
        ).json()
        mine = [e for e in entries if rank in (e["src"], e["dst"])]
        assert got["total"] == len(mine)
        assert sorted((r["step"], r["src"], r["dst"]) for r in got["rows"]) == sorted(
            (e["step"], e["src"], e["dst"]) for e in mine
        )
        # the slowest link first (the default), each with the file's bandwidth
        bandwidths = [
            r["bandwidth_bytes_per_s"] for r in got["rows"] if r["bandwidth_bytes_per_s"] is not None
        ]
        assert bandwidths == sorted(bandwidths)
        by_key = {(e["step"], e["src"], e["dst"]): e for e in mine}
        for row in got["rows"]:
            want = by_key[(row["step"], row["src"], row["dst"])]
            bandwidth = pytest.approx(want["gbs"] * 1e9) if want["ms"] > 0 else None
            assert row["bandwidth_bytes_per_s"] == bandwidth
            assert row["transit_ns"] == round(want["ms"] * 1e6) and row["link_type"] == want["type"]


def test_all_links_filter_by_source_destination_and_type_and_page(client: TestClient) -> None:
    entries = matrix_entries(cluster_output(client, PP_JOB))
    url = "/api/job/communication/links"
    everything = client.get(url, params={"run": PP_JOB, "limit": 1000}).json()
    assert everything["total"] == len(entries)
    src = entries[0]["src"]
    from_src = client.get(url, params={"run": PP_JOB, "src": src, "limit": 1000}).json()
    assert from_src["total"] == sum(e["src"] == src for e in entries) and {
        r["src"] for r in from_src["rows"]
    } == {src}
    dst = entries[0]["dst"]
    to_dst = client.get(url, params={"run": PP_JOB, "dst": dst, "link_type": entries[0]["type"]}).json()
    assert to_dst["total"] == sum(e["dst"] == dst and e["type"] == entries[0]["type"] for e in entries)
    none = client.get(url, params={"run": PP_JOB, "link_type": "INTER_HOST"}).json()
    assert none["total"] == sum(e["type"] == "INTER_HOST" for e in entries)
    # pages of 2, by transit time, longest first: together, every link once, in order
    pages, offset = [], 0
    while offset < len(entries):
        page = client.get(
            url, params={"run": PP_JOB, "sort": "transit_ns", "order": "desc", "offset": offset, "limit": 2}
        ).json()
        pages.extend(page["rows"])
        offset += 2
    assert len(pages) == len(entries)
    times = [r["transit_ns"] for r in pages]
    assert times == sorted(times, reverse=True)


def test_the_ops_table_searches_sorts_and_keeps_each_ops_split(client: TestClient) -> None:
    ops = ops_rows(cluster_output(client, PP_JOB))
    url = "/api/job/communication/ops"
    everything = client.get(url, params={"run": PP_JOB, "limit": 1000}).json()
    assert everything["total"] == len(ops)
    for row in everything["rows"]:  # an op's parts add up to its elapse (docs/OUTPUTS.md)
        assert row["transit_ns"] + row["wait_ns"] + row["idle_ns"] == row["elapse_ns"]
        assert row["synchronization_ns"] <= row["wait_ns"]
        if row["bandwidth_bytes_per_s"] is not None:
            assert row["bandwidth_bytes_per_s"] == pytest.approx(row["bytes"] / (row["transit_ns"] / 1e9))
    sends = client.get(url, params={"run": PP_JOB, "q": "send", "limit": 1000}).json()
    assert sends["total"] == sum("send" in op["collective"] for op in ops) > 0
    assert all("send" in r["op"] for r in sends["rows"])
    waits = client.get(url, params={"run": PP_JOB, "sort": "wait_ns", "order": "desc", "limit": 1000}).json()
    assert [r["wait_ns"] for r in waits["rows"]] == sorted((int(o["wait_ns"]) for o in ops), reverse=True)
    rank1 = client.get(url, params={"run": PP_JOB, "rank": 1, "limit": 1000}).json()
    assert rank1["total"] == sum(op["rank"] == "1" for op in ops)


def test_bad_requests_say_what_is_wrong(client: TestClient) -> None:
    missing = client.get("/api/job/communication", params={"run": DDP_JOB, "step": "999"})
    assert missing.status_code == 404 and "999" in missing.json()["detail"]
    assert (
        client.get("/api/job/communication/matrix", params={"run": DDP_JOB, "metric": "speed"}).status_code
        == 422
    )
    assert (
        client.get("/api/job/communication/links", params={"run": DDP_JOB, "sort": "nope"}).status_code == 422
    )


# ------------------------------------------------------------------------------ a job of 1,024 ranks
def write_job_of(folder: Path, ranks: int, seed: int = 7) -> None:
    """A ``cluster_analysis_output/`` of ``ranks`` ranks written by perfsight's own exporter: two
    steps of a ring all-reduce over every rank (one rank's link slowed) and a ring inside each of
    two halves; ops: one all-reduce per rank and step."""
    from perfsight.export.communication_matrix_json import write_communication_matrix

    rng = np.random.default_rng(seed)
    parts = []
    for step in (3, 4):
        for group, members in (
            ("0", range(ranks)),
            ("1", range(ranks // 2)),
            ("2", range(ranks // 2, ranks)),
        ):
            src = np.array(list(members))
            dst = np.roll(src, -1)
            nbytes = np.full(len(src), 2.0 * (len(src) - 1) / len(src) * 64 * 2**20)
            transit = rng.integers(900_000, 1_100_000, len(src)).astype(float)
            if group == "0":
                transit[src == ranks // 3] *= 10  # a slow link
            parts.append(
                pd.DataFrame(
                    {"step": step, "collective": "all_reduce", "group": group, "src": src, "dst": dst,
                     "link_type": np.where(src // 8 == dst // 8, "INTRA_HOST", "INTER_HOST"), "bytes": nbytes,
                     "transit_ns": transit, "ops": 1, "bandwidth_bytes_per_s": nbytes / (transit / 1e9)}
                )
            )  # fmt: skip
    out = folder / "cluster_analysis_output"
    out.mkdir(parents=True)
    write_communication_matrix(out / "communication_matrix.json", pd.concat(parts, ignore_index=True))
    rank = np.repeat(np.arange(ranks), 2)
    times = {
        "elapse_ns": 2_000_000,
        "transit_ns": 1_000_000,
        "wait_ns": 1_000_000,
        "synchronization_ns": 1_000_000,
    }
    pd.DataFrame(
        {"rank": rank, "collective": "all_reduce", "start_ns": 10**9 + rank, "group": "0", "bytes": 2**26,
         "step": np.tile([3, 4], ranks), "is_p2p": False, "instance": np.tile([0, 1], ranks), **times,
         "idle_ns": 0, "basis": "arrivals"}
    ).to_csv(out / "cluster_communication_ops.csv", index=False)  # fmt: skip


def test_a_1024_rank_matrix_is_aggregated_to_screen_resolution(tmp_path: Path) -> None:
    ranks = 1024
    write_job_of(tmp_path / "job", ranks)
    entries = matrix_entries(tmp_path / "job" / "cluster_analysis_output")
    saved = tmp_path / "saved"
    for metric in ("size", "bandwidth"):
        got = job_matrix.matrix(
            "job", tmp_path / "job", saved, metric=metric, step="all", op=None, group=None, cells=256
        )
        # 1,024 ranks on 256 cells a side: blocks of 4 ranks, the ring on the diagonal
        assert got["block"] == 4 and got["rows"] == got["columns"] == 256
        want = expected_blocks(entries, metric, 4)
        have = got_blocks(got)
        assert have.keys() == want.keys()
        assert len(have) < 3 * 256  # sparse: only blocks holding a link travel
        for key, value in want.items():
            assert have[key] == pytest.approx(value, rel=1e-9)
    # the slow link stands out in its block; zooming into that block shows it at one rank a cell
    slow = ranks // 3
    lo = slow - slow % 4
    got = job_matrix.matrix(
        "job", tmp_path / "job", saved, metric="bandwidth", step="all", op=None, group="0", cells=256,
        src_lo=lo, src_hi=lo + 4, dst_lo=lo, dst_hi=lo + 4,
    )  # fmt: skip
    assert got["block"] == 1
    have = got_blocks(got)
    lowest = min(have, key=have.__getitem__)
    assert got["src_lo"] + lowest[0] == slow and got["dst_lo"] + lowest[1] == slow + 1
    assert math.isclose(got["min"], have[lowest])


def test_the_op_time_columns_read_are_those_the_cluster_analysis_writes() -> None:
    from perfsight.cluster.op_time import TIME_COLUMNS
    from perfsight.server import job_comm

    assert job_comm.TIME_COLUMNS == TIME_COLUMNS


def test_a_job_without_links_or_with_an_old_ops_file_is_answered_plainly(tmp_path: Path) -> None:
    from perfsight.cluster.totals import communication_by_rank
    from perfsight.layout import CLUSTER_COMMUNICATION_RANKS_FILE
    from perfsight.server import job_comm
    from perfsight.server.job_pages import NoClusterAnalysis

    out = tmp_path / "job" / "cluster_analysis_output"
    out.mkdir(parents=True)
    (out / "communication_matrix.json").write_text("{}")
    (out / "cluster_communication_ops.csv").write_text(
        "rank,collective,elapse_ns,transit_ns,wait_ns,synchronization_ns,idle_ns\n"
    )
    # an analysis older than the per-rank totals: the page says to analyse again, naming the file
    with pytest.raises(NoClusterAnalysis, match=r"cluster_communication_ranks\.parquet is missing.*analyse"):
        job_comm.ranks("job", tmp_path / "job", tmp_path / "saved", "all", "rank", "asc", 0, 10)
    # no op, no link: empty pages, not errors
    empty = pd.read_csv(out / "cluster_communication_ops.csv")
    communication_by_rank(empty, pd.DataFrame()).to_parquet(out / CLUSTER_COMMUNICATION_RANKS_FILE)
    ranks = job_comm.ranks("job", tmp_path / "job", tmp_path / "saved", "all", "rank", "asc", 0, 10)
    assert ranks["rows"] == [] and ranks["choices"]["steps"] == ["all"]
    matrix = job_matrix.matrix(
        "job", tmp_path / "job", tmp_path / "saved", metric="size", step="all", op=None, group=None, cells=64
    )
    assert matrix["ranks"] == 0 and matrix["cells"]["value"] == [] and matrix["min"] is None
    # an ops file lacking the time columns (another perfsight wrote it) is named, with what is missing
    (out / "cluster_communication_ops.csv").write_text("rank,collective\n0,all_reduce\n")
    with pytest.raises(NoClusterAnalysis, match=r"cluster_communication_ops\.csv has no column elapse_ns"):
        job_comm.ranks("job", tmp_path / "job", tmp_path / "saved2", "all", "rank", "asc", 0, 10)
    with pytest.raises(NoClusterAnalysis, match="no cross-rank analysis"):
        job_comm.ranks("job", tmp_path / "nothing", tmp_path / "saved3", "all", "rank", "asc", 0, 10)
