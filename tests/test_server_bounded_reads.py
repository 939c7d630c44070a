"""The server's bounded reads answer as the whole tables do, on a real trace (df_index_resolver).

The operators and kernels pages sort only their keys and then read the page's rows by row number
(``queries.page``), and search by the distinct names (``queries.fuzzy_in_file``); the timeline's
flows, search and event details scan the index in pieces (``TimelineArrays.chunks``).  Each answer
is checked here against an oracle that reads the whole table or the whole index at once, in plain
Python and NumPy: the analysis is the server's input, the oracle decides nothing with the server's
code.  Pieces are made small (``CHUNK_ROWS``) so every scan crosses many piece boundaries.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import duckdb
import numpy as np
import pyarrow.parquet as pq
import pytest
from fastapi.testclient import TestClient

from _server_helpers import copy_into
from conftest import kineto_file
from perfsight.api import analyse
from perfsight.server import create_app, queries
from perfsight.store import timeline_index

TRACE = "df_index_resolver/df_index_resolver.json.gz"
RUN = "run/trace.json.gz"
SEPARATORS = "_:.-/ "


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """(client, the rank's folder) of a server over df_index_resolver analysed by ``analyse --out``."""
    base = tmp_path_factory.mktemp("bounded") / "base"
    trace = copy_into(base, kineto_file(TRACE), RUN)
    analyse(trace, out=base / "analysis")
    (rank_dir,) = (base / "analysis").glob("rank*")
    with TestClient(create_app(base, cache_dir=base.parent / "cache")) as client:
        assert client.get("/api/run/status", params={"run": RUN}).json()["status"] == "ready"
        yield client, rank_dir


@pytest.fixture()
def small_pieces(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(timeline_index, "CHUNK_ROWS", 997)  # a prime: pieces end anywhere


def _get(client: TestClient, path: str, **params: Any) -> Any:
    response = client.get(path, params={"run": RUN, **params})
    assert response.status_code == 200, response.text
    return response.json()


def _normalised(text: str) -> str:
    return "".join(ch for ch in text.lower() if ch not in SEPARATORS)


def _ordered(rows: list[dict[str, Any]], sort: str, order: str, tiebreak: str) -> list[dict[str, Any]]:
    """``rows`` sorted as the API promises: by ``sort`` (nulls last either way), then ``tiebreak``."""
    rows = sorted(rows, key=lambda r: r[tiebreak])
    valued = sorted((r for r in rows if r[sort] is not None), key=lambda r: r[sort], reverse=order == "desc")
    return valued + [r for r in rows if r[sort] is None]


def _operator_rows(rank_dir: Path, origin_ns: int) -> list[dict[str, Any]]:
    """Every row of ``operator_instances`` as the operators page shows it (docs/API.md)."""
    table = pq.read_table(rank_dir / "cache" / "analysis" / "operator_instances.parquet")
    out = []
    for row in table.to_pylist():
        out.append(
            {
                "id": row["slice"],
                "step": row["step"],
                "name": row["name"],
                "thread": row["thread"],
                "start_ns": row["start_ns"] - origin_ns,
                "dur_ns": row["dur_ns"],
                "self_ns": row["self_ns"] or 0,
                "device_ns": row["device_ns"] or 0,
                "input_dims": row["input_dims"],
                "input_types": row["input_types"],
                "flops": row["flops"],
            }
        )
    return out


def test_operator_pages_sorted_searched_and_deep_equal_the_whole_table(served: Any) -> None:
    client, rank_dir = served
    origin = _get(client, "/api/run/timeline/tracks")["origin_ns"]
    every = _operator_rows(rank_dir, origin)
    assert len(every) > 10_000  # a real table: deep pages are past DuckDB's top-N
    names = sorted({r["name"] for r in every})
    some_type = max(names, key=lambda n: sum(r["name"] == n for r in every))
    cases = []
    for sort in ("dur_ns", "start_ns", "name", "self_ns", "device_ns", "id", "step", "flops"):
        for order in ("asc", "desc"):
            for offset in (0, 25, len(every) // 2, len(every) - 7, len(every) + 5):
                cases.append({"sort": sort, "order": order, "offset": offset, "limit": 25})
    cases += [
        {"sort": "dur_ns", "order": "desc", "offset": 0, "limit": 1000, "q": "mm"},
        {"sort": "name", "order": "asc", "offset": 40, "limit": 50, "q": "CONV backward"},
        {"sort": "start_ns", "order": "asc", "offset": 0, "limit": 100, "q": "to copy"},
        {"sort": "dur_ns", "order": "desc", "offset": 0, "limit": 10, "q": "no such operator"},
        {"sort": "self_ns", "order": "desc", "offset": 30, "limit": 60, "name": some_type},
        {
            "sort": "start_ns",
            "order": "asc",
            "offset": 0,
            "limit": 100,
            "step": every[len(every) // 2]["step"],
        },
    ]
    for case in cases:
        wanted = every
        for word in (_normalised(w) for w in case.get("q", "").split()):
            wanted = [r for r in wanted if word in _normalised(r["name"])]
        if "name" in case:
            wanted = [r for r in wanted if r["name"] == case["name"]]
        if "step" in case:
            wanted = [r for r in wanted if r["step"] == case["step"]]
        wanted = _ordered(wanted, case["sort"], case["order"], "id")
        page = _get(client, "/api/run/operators", **case)
        assert page["total"] == len(wanted), case
        assert page["rows"] == wanted[case["offset"] : case["offset"] + case["limit"]], case


def test_kernel_search_by_name_or_launching_op_equals_the_whole_table(served: Any) -> None:
    client, rank_dir = served
    table = pq.read_table(rank_dir / "cache" / "analysis" / "kernel_details.parquet")
    rows = table.select(["name", "op", "start_ns"]).to_pylist()
    for q in ("allreduce", "sgemm mm", "elementwise add", "nccl backward"):
        words = [_normalised(w) for w in q.split()]
        hits = [
            r
            for r in rows
            if all(w in _normalised(r["name"]) or w in _normalised(r["op"] or "") for w in words)
        ]
        page = _get(client, "/api/run/kernels", q=q, sort="start_ns", order="asc", limit=1000)
        assert page["total"] == len(hits), q
        assert [(r["name"], r["op"]) for r in page["rows"]] == [
            (r["name"], r["op"]) for r in sorted(hits, key=lambda r: r["start_ns"])[:1000]
        ], q
    assert _get(client, "/api/run/kernels", q="allreduce")["total"] > 0  # the search found something


def _index(rank_dir: Path) -> dict[str, np.ndarray]:
    folder = rank_dir / "cache" / timeline_index.FOLDER
    return {p.stem: np.load(p) for p in folder.glob("*.npy")}


def test_window_flows_equal_those_of_the_whole_index(served: Any, small_pieces: None) -> None:
    client, rank_dir = served
    ix = _index(rank_dir)
    tracks = _get(client, "/api/run/timeline/tracks")
    origin, end = tracks["origin_ns"], tracks["end_ns"]
    src_start, dst_start = ix["start"][ix["flow_src"]], ix["start"][ix["flow_dst"]]
    rng = np.random.default_rng(0)
    for span in (end, end // 10, end // 1000, end // 100_000):
        for lo in rng.integers(0, end - span + 1, 3).tolist():
            ws, we = origin + lo, origin + lo + span
            inside = ((src_start >= ws) & (src_start <= we)) | ((dst_start >= ws) & (dst_start <= we))
            chosen = np.flatnonzero(inside)
            for limit in (2000, 5):
                body = _get(client, "/api/run/timeline/flows", start_ns=lo, end_ns=lo + span, limit=limit)
                assert body["total"] == len(chosen)
                assert body["truncated"] == (len(chosen) > limit)
                got = [(f["src_id"], f["dst_id"], f["src_ts_ns"], f["dst_ts_ns"]) for f in body["flows"]]
                assert got == [
                    (int(ix["row"][ix["flow_src"][i]]), int(ix["row"][ix["flow_dst"][i]]),
                     int(src_start[i]) - origin, int(dst_start[i]) - origin)
                    for i in chosen[:limit]
                ]  # fmt: skip
    assert len(ix["flow_src"]) > 10 * timeline_index.CHUNK_ROWS  # many pieces were scanned


def test_timeline_search_equals_a_scan_of_every_event(served: Any, small_pieces: None) -> None:
    client, rank_dir = served
    ix = _index(rank_dir)
    names = json.loads((rank_dir / "cache" / timeline_index.FOLDER / timeline_index.NAMES).read_text("utf-8"))
    origin = _get(client, "/api/run/timeline/tracks")["origin_ns"]

    def matches(query: str) -> tuple[np.ndarray, np.ndarray]:
        """Every matching position, and the same by start, then position (the hits' order)."""
        codes = [i for i, n in enumerate(names) if query.lower() in n.lower()]
        positions = np.flatnonzero(np.isin(ix["name"], codes))
        return positions, positions[np.lexsort((positions, ix["start"][positions]))]

    _, by_start = matches("a")
    starts = ix["start"][by_start]
    tie = 2_000 + int(np.flatnonzero(starts[2_001:] == starts[2_000:-1])[0]) + 1  # a tie across the cut
    cases = (
        ("nccl", 0, 100),
        ("AllReduce", 7, 20),
        ("a", 500, 1000),
        ("aten::", 0, 1),
        ("a", tie - 3, 3),
    )
    for query, offset, limit in cases:
        positions, by_start = matches(query)
        wanted = by_start[offset : offset + limit]
        body = _get(client, "/api/run/timeline/search", q=query, offset=offset, limit=limit)
        assert body["total"] == len(positions), query
        assert [(h["id"], h["start_ns"]) for h in body["hits"]] == [
            (int(ix["row"][p]), int(ix["start"][p]) - origin) for p in wanted
        ], query


def test_event_details_are_the_slice_row_and_its_flows(served: Any, small_pieces: None) -> None:
    client, rank_dir = served
    ix = _index(rank_dir)
    slices = pq.read_table(rank_dir / "cache" / "slices.parquet").to_pylist()
    origin = _get(client, "/api/run/timeline/tracks")["origin_ns"]
    linked = ix["row"][ix["flow_src"][:: max(1, len(ix["flow_src"]) // 10)]]
    for event_id in [0, len(slices) - 1, len(slices) // 3, *linked.tolist()]:
        row = slices[event_id]
        body = _get(client, "/api/run/timeline/event", id=event_id)
        for key in ("name", "kind", "category", "track", "dur_ns", "depth", "step", "correlation"):
            assert body[key] == row[key], key
        for key in ("input_dims", "input_types", "grid", "block", "occupancy_pct", "bytes"):
            assert body[key] == row[key], key
        assert body["start_ns"] == row["start_ns"] - origin
        pos = ix["pos"][event_id]
        out = ix["row"][ix["flow_dst"][ix["flow_src"] == pos]][:100].tolist()
        into = ix["row"][ix["flow_src"][ix["flow_dst"] == pos]][:100].tolist()
        assert [f["id"] for f in body["flows"] if f["direction"] == "out"] == out
        assert [f["id"] for f in body["flows"] if f["direction"] == "in"] == into
        if event_id in linked:
            assert out  # an event with a flow shows it


def _reduced(allocated: np.ndarray, points: int) -> np.ndarray:
    """Rows of one device's curve kept for drawing, from the whole curve (docs/API.md's rule): all
    rows up to ``points``; else of each of ``points // 3`` buckets (cut at a linspace of the rows)
    its first row, its first row of most and of least allocated bytes, and the last row."""
    n = len(allocated)
    if n <= points:
        return np.arange(n)
    edges = np.linspace(0, n, max(1, points // 3) + 1).astype(np.int64)
    keep = {n - 1}
    for a, b in zip(edges[:-1], edges[1:], strict=True):
        if b > a:
            part = allocated[a:b]
            keep |= {int(a), int(a + np.argmax(np.where(np.isnan(part), -np.inf, part)))}
            keep.add(int(a + np.argmin(np.where(np.isnan(part), np.inf, part))))
    return np.array(sorted(keep))


def test_memory_curves_keep_each_buckets_first_peak_and_trough_of_the_whole_curve(served: Any) -> None:
    client, rank_dir = served
    origin = _get(client, "/api/run/timeline/tracks")["origin_ns"]
    curve = pq.read_table(rank_dir / "cache" / "analysis" / "memory_curve.parquet").to_pylist()
    devices = sorted({(str(r["device_type"]), r["device_index"]) for r in curve})
    assert len(curve) > 20_000  # a real curve, reduced at every size asked below
    for points in (10, 11, 2000, 7919, 20_000):
        body = _get(client, "/api/run/memory", points=points)
        assert [(d["device_type"], d["device_index"]) for d in body["devices"]] == devices
        for device in body["devices"]:
            rows = [
                r
                for r in curve
                if (str(r["device_type"]), r["device_index"])
                == (device["device_type"], device["device_index"])
            ]
            allocated = np.array(
                [np.nan if r["allocated_bytes"] is None else r["allocated_bytes"] for r in rows]
            )
            kept = _reduced(allocated, points)
            assert device["points"] == len(rows)
            assert device["curve"]["ts_ns"] == [rows[i]["ts_ns"] - origin for i in kept]
            assert device["curve"]["allocated_bytes"] == [rows[i]["allocated_bytes"] for i in kept]
            assert device["curve"]["reserved_bytes"] == [rows[i]["reserved_bytes"] for i in kept]
            assert max(device["curve"]["allocated_bytes"]) == max(
                r["allocated_bytes"] for r in rows
            )  # the peak


def test_a_page_past_the_query_memory_is_refused_and_the_analysis_kept(
    served: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A query DuckDB cannot fit in its limit (here 1 MB and no spilling) answers 503 naming the
    cause; the analysis is not taken for damaged (the next page is served from it as before)."""
    client, _ = served
    tiny = duckdb.connect(config={"threads": 1, "memory_limit": "1MB", "temp_directory": ""})
    monkeypatch.setattr(queries, "_pages_db", tiny)
    deep = {"sort": "name", "order": "asc", "offset": 30_000, "limit": 25}
    response = client.get("/api/run/operators", params={"run": RUN, **deep})
    assert response.status_code == 503
    assert "more memory than the server may use" in response.json()["detail"]
    monkeypatch.undo()
    tiny.close()
    assert client.get("/api/run/status", params={"run": RUN}).json()["status"] == "ready"
    assert len(_get(client, "/api/run/operators", **deep)["rows"]) == 25
