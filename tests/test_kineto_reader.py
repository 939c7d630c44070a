"""The Kineto reader agrees with the raw JSON on every real trace, and survives bad input."""

from __future__ import annotations

import dataclasses
import gzip
import json
import os
import re
import sys
from decimal import Decimal
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from conftest import KINETO, kineto_file, raw_events
from perfsight.ingest import TraceReadError, _build_native, eventscan, jsonstream, read_trace
from perfsight.ingest.chrome_events import RAW_SCHEMA, read_events
from perfsight.ingest.jsonstream import NotATraceError, StreamReport
from perfsight.model import TABLE_SCHEMAS

ALL_TRACES = sorted(KINETO.glob("**/*.json.gz")) if KINETO.exists() else []


def _names(trace, kind: str | None = None) -> list[str]:
    s = trace.slices
    if kind:
        s = s.filter(pc.equal(s.column("kind"), kind))
    return s.column("name").to_pylist()


@pytest.mark.parametrize("path", ALL_TRACES, ids=lambda p: p.parent.name)
def test_every_real_trace_loads_with_all_complete_events(path: Path) -> None:
    trace = read_trace(path)
    events = raw_events(path)
    assert trace.slices.num_rows == sum(1 for e in events if e.get("ph") == "X")
    memory_events = sum(1 for e in events if e.get("ph") == "i" and e.get("name") == "[memory]")
    assert trace.memory.num_rows == memory_events
    for name, schema in TABLE_SCHEMAS.items():
        assert getattr(trace, name).schema.equals(schema, check_metadata=False), name


@pytest.mark.parametrize("path", ALL_TRACES, ids=lambda p: p.parent.name)
def test_step_count_matches_profiler_step_markers(path: Path) -> None:
    trace = read_trace(path)
    markers = {
        e["name"]
        for e in raw_events(path)
        if e.get("ph") == "X"
        and e.get("cat") == "user_annotation"
        and re.fullmatch(r"ProfilerStep#\d+", str(e.get("name")))
    }
    if markers:
        assert sorted(trace.steps.column("step").to_pylist()) == sorted(int(m.split("#")[1]) for m in markers)
    else:
        assert trace.steps.num_rows == 1 and trace.steps.column("inferred").to_pylist() == [True]
        assert any("no ProfilerStep" in w for w in trace.meta.warnings)


def test_nccl_kernels_are_communication_and_carry_collective_metadata(nccl_trace_path: Path) -> None:
    trace = read_trace(nccl_trace_path)
    events = raw_events(nccl_trace_path)
    raw_nccl = [e for e in events if e.get("cat") == "kernel" and e["name"].lower().startswith("nccl")]
    device_comm = trace.slices.filter(
        pc.and_(pc.equal(trace.slices.column("kind"), "communication"), trace.slices.column("is_device"))
    )
    assert device_comm.num_rows == len(raw_nccl) > 0
    # every record_param_comms with metadata is one host comm row with bytes = nelems * element size
    raw_meta = [e for e in events if e.get("name") == "record_param_comms" and "Collective name" in e["args"]]
    host = trace.comm.filter(pc.invert(trace.comm.column("is_device")))
    assert host.num_rows == len(raw_meta)
    size = {"Float": 4, "Long": 8, "Int": 4, "Half": 2, "BFloat16": 2, "Double": 8, "Byte": 1, "Bool": 1}
    assert host.column("in_bytes").to_pylist() == [
        e["args"]["In msg nelems"] * size[e["args"]["dtype"]] for e in raw_meta
    ]
    raw_names = [e["args"]["Collective name"] for e in raw_meta]
    assert "allreduce" in raw_names
    assert host.column("collective").to_pylist() == [{"allreduce": "all_reduce"}.get(n, n) for n in raw_names]
    assert trace.meta.rank == 0 and trace.meta.world_size == 2 and trace.meta.rank_source == "trace"
    assert trace.meta.devices[0].name.startswith("NVIDIA A100")


def test_kernels_link_to_their_launching_runtime_call(nccl_trace_path: Path) -> None:
    trace = read_trace(nccl_trace_path)
    s = trace.slices
    src = s.take(trace.flows.column("src"))
    dst = s.take(trace.flows.column("dst"))
    assert trace.flows.num_rows > 0
    assert src.column("correlation").to_pylist() == dst.column("correlation").to_pylist()
    assert set(src.column("kind").to_pylist()) == {"runtime"}
    # launched work takes the step of its launch, never an unrelated one
    assert src.column("step").to_pylist() == dst.column("step").to_pylist()


def test_nanosecond_timestamps_are_exact() -> None:
    path = kineto_file("ns_resolution_trace/rank-0.Apr_03_18_51_38.1102.pt.trace.json.gz")
    with gzip.open(path, "rt") as handle:
        text = handle.read()
    first_x = re.search(r'"ph": "X".*?"ts": ([0-9.]+), "dur": ([0-9.]+)', text, re.S)
    assert first_x is not None
    trace = read_trace(path)
    expected_start = int(Decimal(first_x.group(1)) * 1000)
    assert expected_start % 1000 != 0, "fixture should have sub-microsecond digits"
    assert expected_start in set(trace.slices.column("start_ns").to_pylist())


def test_rank_comes_from_file_name_with_a_warning_when_trace_lacks_it(tmp_path: Path) -> None:
    source = kineto_file("distributed_info_unavailable/distributed_info_not_found.json.gz")
    named = tmp_path / "worker_rank-7.json.gz"
    named.write_bytes(source.read_bytes())
    trace = read_trace(named)
    assert trace.rank == 7 and trace.meta.rank_source == "file name"
    assert any("rank 7 taken from the file name" in w for w in trace.meta.warnings)
    assert read_trace(named, rank=3).rank == 3


def _write(path: Path, doc: object) -> Path:
    path.write_text(json.dumps(doc, indent=1))
    return path


def test_legacy_categories_and_lowercase_external_id(tmp_path: Path) -> None:
    events = [
        {
            "ph": "X",
            "cat": "Operator",
            "name": "aten::mm",
            "pid": 1,
            "tid": 1,
            "ts": 10,
            "dur": 50,
            "args": {"external id": 5, "Input Dims": [[4, 8], [8, 2]]},
        },
        {
            "ph": "X",
            "cat": "Runtime",
            "name": "cudaLaunchKernel",
            "pid": 1,
            "tid": 1,
            "ts": 20,
            "dur": 5,
            "args": {"external id": 5, "correlation": 77},
        },
        {
            "ph": "X",
            "cat": "Kernel",
            "name": "gemm_kernel",
            "pid": 0,
            "tid": 7,
            "ts": 30,
            "dur": 40,
            "args": {"external id": 5, "correlation": 77, "device": 0, "stream": 7},
        },
    ]
    trace = read_trace(_write(tmp_path / "legacy.json", {"traceEvents": events}), rank=0)
    assert trace.slices.column("kind").to_pylist() == ["cpu_op", "runtime", "kernel"]
    assert trace.slices.column("external_id").to_pylist() == [5, 5, 5]
    assert trace.slices.column("input_dims").to_pylist()[0] == [[4, 8], [8, 2]]
    assert trace.flows.num_rows == 1


def test_hostile_names_survive_unchanged(tmp_path: Path) -> None:
    hostile = [
        '<script>alert("x")</script>',
        'a"quote\\back\nslash',
        "名前 ünïcode",
        "</td><img src=x onerror=1>",
    ]
    events = [
        {"ph": "X", "cat": "cpu_op", "name": n, "pid": 1, "tid": 1, "ts": i * 10, "dur": 5, "args": {}}
        for i, n in enumerate(hostile)
    ]
    trace = read_trace(_write(tmp_path / "hostile.json", {"traceEvents": events}), rank=0)
    assert _names(trace) == hostile


def _cut_copy(source: Path, target: Path, fraction: float) -> bytes:
    raw = gzip.decompress(source.read_bytes())
    cut = raw[: int(len(raw) * fraction)]
    target.write_bytes(cut)
    return cut


def test_truncated_trace_keeps_every_complete_event_before_the_cut(
    tmp_path: Path, nccl_trace_path: Path
) -> None:
    full = read_trace(nccl_trace_path)
    cut_file = tmp_path / "cut.json"
    _cut_copy(nccl_trace_path, cut_file, 0.6)
    trace = read_trace(cut_file)
    n = trace.slices.num_rows
    assert 0.4 * full.slices.num_rows < n < full.slices.num_rows
    assert trace.slices.column("name").to_pylist() == full.slices.column("name").to_pylist()[:n]
    assert trace.slices.column("start_ns").to_pylist() == full.slices.column("start_ns").to_pylist()[:n]
    assert any(str(cut_file) in w and "truncated" in w for w in trace.meta.warnings)
    assert trace.steps.column("complete").to_pylist()[-1] is False


def test_truncated_gzip_is_read_up_to_the_cut(tmp_path: Path, nccl_trace_path: Path) -> None:
    data = nccl_trace_path.read_bytes()
    cut_file = tmp_path / "cut.json.gz"
    cut_file.write_bytes(data[: len(data) // 2])
    trace = read_trace(cut_file)
    assert trace.slices.num_rows > 1000
    assert any("truncated" in w for w in trace.meta.warnings)


def test_garbage_in_the_middle_keeps_what_came_before(tmp_path: Path, nccl_trace_path: Path) -> None:
    raw = gzip.decompress(nccl_trace_path.read_bytes())
    middle = raw.index(b'"ph": "X"', len(raw) // 2)
    damaged = raw[:middle] + b"@@@ not json @@@" + raw[middle:]
    path = tmp_path / "damaged.json"
    path.write_bytes(damaged)
    trace = read_trace(path)
    full = read_trace(nccl_trace_path)
    n = trace.slices.num_rows
    assert 0 < n < full.slices.num_rows
    assert trace.slices.column("name").to_pylist() == full.slices.column("name").to_pylist()[:n]
    assert any(str(path) in w and "damaged" in w for w in trace.meta.warnings)


@pytest.mark.parametrize(
    "content, reason",
    [
        (b"", "is empty"),
        (b"step,time\n1,2\n", "does not start with a JSON"),
        (b'{"schemaVersion": 1, "other": []}', "traceEvents"),
        (bytes(range(256)) * 4, "does not start with a JSON"),
    ],
)
def test_files_that_are_not_traces_get_a_one_line_error(tmp_path: Path, content: bytes, reason: str) -> None:
    path = tmp_path / "bad.json"
    path.write_bytes(content)
    with pytest.raises(TraceReadError) as info:
        read_trace(path)
    message = str(info.value)
    assert str(path) in message and reason in message and "\n" not in message


def test_a_trace_written_by_this_torch_reads_completely(tmp_path: Path) -> None:
    """torch 2.13 prints one key per line and closes the array as '  }\\n  ],"traceName"...'."""
    torch = pytest.importorskip("torch")
    from torch.profiler import ProfilerActivity, profile

    layer = torch.nn.Linear(16, 8)
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True, profile_memory=True) as prof:
        for _ in range(3):
            layer(torch.randn(4, 16)).sum().backward()
    path = tmp_path / "local.pt.trace.json"
    prof.export_chrome_trace(str(path))
    trace = read_trace(path, rank=0)
    events = raw_events(path)
    assert trace.slices.num_rows == sum(1 for e in events if e.get("ph") == "X") > 0
    assert trace.memory.num_rows == sum(1 for e in events if e.get("name") == "[memory]") > 0
    assert not any("truncated" in w or "damaged" in w for w in trace.meta.warnings)
    assert "aten::addmm" in _names(trace, "cpu_op")


# --- the native scanner and the portable path read the same rows -------------------------------


@pytest.fixture(scope="module")
def native_scanner(tmp_path_factory: pytest.TempPathFactory):
    """The native scanner, built into a temporary folder when the install did not build it."""
    if os.environ.get("PERFSIGHT_NATIVE") == "0":
        pytest.skip("the native scanner is switched off (PERFSIGHT_NATIVE=0)")
    installed = Path(eventscan.__file__).parent
    folder = installed
    if not eventscan.available():
        folder = tmp_path_factory.mktemp("native")
        problem = _build_native.build(target=folder / _build_native.LIBRARY.name)
        if problem or not eventscan.use_library(folder):
            pytest.skip(f"native scanner cannot be built here: {problem}")
    yield folder  # where the library in use was loaded from
    eventscan.use_library(installed)


def _raw(path: Path, native: bool) -> tuple[pa.Table, StreamReport]:
    results, report = read_events(path, native=native)
    tables = [r.table for r in results]
    return pa.concat_tables([RAW_SCHEMA.empty_table(), *tables]).combine_chunks(), report


def _same_rows(path: Path) -> tuple[pa.Table, StreamReport]:
    fast, fast_report = _raw(path, native=True)
    slow, slow_report = _raw(path, native=False)
    assert fast.schema.equals(RAW_SCHEMA) and slow.schema.equals(RAW_SCHEMA)
    for name in RAW_SCHEMA.names:
        assert fast.column(name).to_pylist() == slow.column(name).to_pylist(), name
    assert fast_report.header == slow_report.header
    assert fast_report.truncated == slow_report.truncated
    return fast, fast_report


def test_native_scanner_is_built_when_a_compiler_exists() -> None:
    if os.environ.get("PERFSIGHT_NATIVE") == "0":
        pytest.skip("the native scanner is switched off (PERFSIGHT_NATIVE=0)")
    if _build_native.compiler() is None or sys.platform == "win32":
        pytest.skip("no C compiler: the portable path is the reader")
    assert eventscan.available(), "reinstall (pip install -e .) to build src/perfsight/ingest/_eventscan.c"


@pytest.mark.parametrize("path", ALL_TRACES, ids=lambda p: p.parent.name)
def test_native_and_portable_paths_agree_on_every_real_trace(path: Path, native_scanner: None) -> None:
    table, report = _same_rows(path)
    assert table.num_rows == sum(1 for e in raw_events(path) if e.get("ph") in ("X", "i", "M"))
    assert report.events == len(raw_events(path)) and not report.truncated


def _awkward_events() -> list[object]:
    return [
        {"ph": "M", "name": "process_name", "pid": "Spans", "tid": 0, "args": {"name": "Traces"}},
        {
            "ph": "X",
            "cat": "cpu_op",
            "name": 'q"uote\\back\nline\t\u00e9\U0001f600</td>',
            "pid": 1,
            "tid": "stream 7",
            "ts": 1.2345,
            "dur": 0.0005,
            "args": {"External id": 3, "Ev": {"a": [1, {}]}},
        },
        {
            "ph": "X",
            "cat": "cpu_op",
            "name": "aten::cat",
            "pid": 1,
            "tid": 1,
            "ts": "1.2355",
            "dur": " 2 ",
            "args": {"Input Dims": [[[2, 3], [4]], [5], []], "Input type": ["TensorList", "float", ""]},
        },
        {
            "ph": "X",
            "cat": "kernel",
            "name": "k",
            "pid": 0,
            "tid": 7,
            "ts": 1669783687464181.5,
            "dur": -3,
            "args": {
                "grid": [1, 2, 3],
                "block": [],
                "est. achieved occupancy %": 12.5,
                "est. achieved occupancy ?": 99.5,  # the same first 16 bytes and length, not asked for
                "External id ": 5,  # one byte more than a key asked for
                "device": None,
                "correlation": 9223372036854775807,
                "stream": 1e2,
            },
        },
        {"ph": "X", "name": "no args", "pid": 1, "tid": 1, "ts": 7, "dur": 1, "args": []},
        {"ph": "X", "name": "too big", "pid": 1, "tid": 1, "ts": 7, "args": {"bytes": 2**70}},
        {"ph": "s", "id": 1, "pid": 1, "tid": 1, "ts": 1, "cat": "ac2g", "name": "ac2g"},
        {
            "ph": "i",
            "name": "[memory]",
            "pid": 1,
            "tid": 1,
            "ts": 3,
            "args": {"Addr": 140, "Bytes": -512, "Total Allocated": 0, "Device Type": 1, "Device Id": 0},
        },
        {"ph": "XX", "name": "two-letter phase", "ts": 1},
        {"ph": "X", "name": "escaped key", "pid": 1, "tid": 1, "ts": 7, "args": {"Se\\u0071": 4}},
    ]


def test_awkward_events_read_the_same_on_both_paths(tmp_path: Path, native_scanner: None) -> None:
    path = tmp_path / "awkward.json"
    path.write_text(json.dumps({"traceEvents": _awkward_events(), "traceName": "t"}, indent=2))
    table, report = _same_rows(path)
    rows = table.to_pylist()
    assert [r["name"] for r in rows][:2] == ["process_name", 'q"uote\\back\nline\t\u00e9\U0001f600</td>']
    assert rows[0]["pid_label"] == "Spans" and rows[1]["tid_label"] == "stream 7"
    # decimal microseconds -> exact nanoseconds, half to even past the third decimal
    assert [r["ts_ns"] for r in rows[1:4]] == [1234, 1236, 1669783687464181500]
    assert rows[1]["dur_ns"] == 0 and rows[2]["dur_ns"] == 2000 and rows[3]["dur_ns"] == -3000
    assert rows[2]["args.Input Dims"] == [[2, 3], [5], []]  # a TensorList keeps its first tensor's shape
    assert rows[3]["args.grid"] == [1, 2, 3] and rows[3]["args.est. achieved occupancy %"] == 12.5
    assert rows[3]["args.correlation"] == 2**63 - 1 and rows[5]["args.bytes"] is None
    assert [r["ph"] for r in rows] == ["M", "X", "X", "X", "X", "X", "i", "X"]
    assert report.header == {"traceName": "t"}


@pytest.fixture(scope="module")
def byte_loop_scanner(tmp_path_factory: pytest.TempPathFactory, native_scanner: None) -> Path:
    """A second build of the native scanner, with its SIMD loops replaced by the byte-by-byte ones
    (``ES_NO_SIMD``: what a CPU without SSE2 runs); its folder."""
    if _build_native.compiler() is None or sys.platform == "win32":
        pytest.skip("no C compiler")
    folder = tmp_path_factory.mktemp("byte_loops")
    problem = _build_native.build(target=folder / _build_native.LIBRARY.name, defines=["ES_NO_SIMD"])
    if problem:
        pytest.fail(f"the byte-loop build failed: {problem}")
    return folder


def test_the_simd_and_byte_loop_builds_read_the_same_rows(
    tmp_path: Path, native_scanner: Path, byte_loop_scanner: Path
) -> None:
    """Every real trace, the awkward events and a gzip cut mid-way: the build that scans 16 bytes at
    a time and the one that scans byte by byte give the same rows and the same report."""
    awkward = tmp_path / "awkward.json"
    awkward.write_text(json.dumps({"traceEvents": _awkward_events() * 50}, indent=2))
    cut = tmp_path / "cut.json.gz"
    cut.write_bytes(gzip.compress(awkward.read_bytes()[: awkward.stat().st_size * 2 // 3]))
    for path in [*ALL_TRACES, awkward, cut]:
        simd, simd_report = _raw(path, native=True)
        try:
            assert eventscan.use_library(byte_loop_scanner)
            loops, loops_report = _raw(path, native=True)
        finally:
            eventscan.use_library(native_scanner)
        assert simd.num_rows and simd.equals(loops), path.name
        assert dataclasses.astuple(simd_report) == dataclasses.astuple(loops_report), path.name


@pytest.mark.parametrize("gz", [False, True], ids=["plain", "gzip"])
def test_tiny_blocks_and_every_cut_point_agree(
    tmp_path: Path, native_scanner: None, monkeypatch: pytest.MonkeyPatch, gz: bool
) -> None:
    monkeypatch.setattr(jsonstream, "READ_BLOCK", 5)
    monkeypatch.setattr(jsonstream, "MAX_BLOCK", 7)
    text = json.dumps({"traceEvents": _awkward_events()[:4]}, indent=1).encode()
    for cut in [len(text), *range(40, len(text), 23)]:
        path = tmp_path / ("cut.json.gz" if gz else "cut.json")
        path.write_bytes(gzip.compress(text[:cut]) if gz else text[:cut])
        _, report = _same_rows(path)
        assert report.truncated == (cut < len(text))


def test_batches_that_go_on_across_blocks_read_the_same_as_the_portable_path(
    tmp_path: Path, native_scanner: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The native scanner goes on filling one batch across block boundaries (not across events it
    must decode slowly): many awkward events, some of them slow rows, over blocks of every few
    bytes, read the same rows as the portable path, with a cut at every boundary kind."""
    monkeypatch.setattr(jsonstream, "READ_BLOCK", 97)
    monkeypatch.setattr(jsonstream, "MAX_BLOCK", 131)
    events = [event for _ in range(40) for event in _awkward_events()]
    path = tmp_path / "many.json"
    path.write_text(json.dumps({"traceEvents": events}, indent=1))
    table, report = _same_rows(path)
    assert table.num_rows == sum(1 for e in events if isinstance(e, dict) and e.get("ph") in ("X", "i", "M"))
    assert report.events == len(events) and not report.truncated
    text = path.read_bytes()
    for cut in range(len(text) // 3, len(text), len(text) // 7):
        path.write_bytes(text[:cut])
        _, report = _same_rows(path)
        assert report.truncated


def test_text_the_scanner_does_not_handle_goes_to_the_portable_path(
    tmp_path: Path, native_scanner: None
) -> None:
    events = [{"ph": "X", "name": f"e{i}", "pid": 1, "tid": 1, "ts": i, "dur": 1} for i in range(5)]
    text = json.dumps({"traceEvents": events}, indent=1)
    # nesting deeper than the scanner follows: valid JSON, read from there on by the portable path
    path = tmp_path / "deep.json"
    path.write_text(text.replace('"name": "e1"', '"deep": ' + "[" * 600 + "]" * 600 + ', "name": "e1"', 1))
    table, _ = _same_rows(path)
    assert table.column("name").to_pylist() == [f"e{i}" for i in range(5)]
    # damage: both keep the events before it and say where it is
    bad = tmp_path / "bad.json"
    bad.write_text(text.replace('"name": "e3"', '"name": "e3" @@', 1))
    for native in (True, False):
        results = list(read_events(bad, native=native)[0])
        assert results[-1].problem and results[-1].damage_offset is not None
        names = pa.concat_tables([r.table for r in results]).column("name").to_pylist()
        assert names == ["e0", "e1", "e2"]


def test_randomly_damaged_traces_never_crash_the_native_scanner(
    tmp_path: Path, nccl_trace_path: Path, native_scanner: None
) -> None:
    """A C parser on untrusted input: flipped, deleted and inserted bytes anywhere in a real trace
    must not crash it (a crash would kill this test process), and the events both paths keep
    must be the same.  Where they stop may differ: the native scanner finds event boundaries by
    parsing (a broken separator costs it nothing, where the portable splitter loses the event
    before it) and checks UTF-8 strictly (pyarrow lets some invalid bytes through)."""
    import random

    source = gzip.decompress(nccl_trace_path.read_bytes())[:120_000]
    rng = random.Random(20261122)
    alphabet = b'{}[]",:\\ \n0123456789.-eE\x00\xff\xc3tfnul'
    for case in range(60):
        data = bytearray(source)
        for _ in range(rng.randint(1, 8)):
            at = rng.randrange(len(data))
            action = rng.choice(("flip", "delete", "insert"))
            if action == "flip":
                data[at] = rng.choice(alphabet)
            elif action == "delete":
                del data[at : at + rng.randint(1, 40)]
            else:
                data[at:at] = bytes(rng.choice(alphabet) for _ in range(rng.randint(1, 12)))
        path = tmp_path / f"fuzz{case}.json"
        path.write_bytes(bytes(data))
        try:
            fast, fast_report = _raw(path, native=True)
            slow, slow_report = _raw(path, native=False)
        except NotATraceError:
            continue
        both = min(slow.num_rows, fast.num_rows)
        assert both > 0 or fast.num_rows == slow.num_rows, case
        for name in RAW_SCHEMA.names:
            assert fast.column(name).to_pylist()[:both] == slow.column(name).to_pylist()[:both], (case, name)
        assert fast_report.header == slow_report.header, case


@pytest.mark.parametrize(
    "odd_phases",
    [[], ["XX"], [""], [None], ["", "XX"]],
    ids=["one letter each", "two letters", "empty", "null", "one byte a row on average"],
)
def test_the_cut_into_parts_reads_each_phase_whatever_the_others_are(odd_phases: list[str | None]) -> None:
    """A batch is cut into slices, memory events and metadata by its one-letter phases (read in
    place where every phase is one letter); a phase of another length (from the portable path)
    is neither and leaves the others as they are."""
    from perfsight.ingest.kineto import Parts

    events = [
        {"ph": "X", "name": "aten::mm", "cat": "cpu_op", "pid": 1, "tid": 2, "ts_ns": 10, "dur_ns": 5},
        {"ph": "i", "name": "[memory]", "pid": 1, "tid": 2, "ts_ns": 11, "args.Bytes": 64},
        {"ph": "i", "name": "not memory", "pid": 1, "tid": 2, "ts_ns": 12},
        {"ph": "M", "name": "thread_name", "pid": 1, "tid": 2, "args.name": "main"},
        {"ph": "M", "name": "process_name", "pid": 1, "args.name": "trainer"},
        {"ph": "X", "name": "[memory]", "cat": "cpu_op", "pid": 1, "tid": 2, "ts_ns": 13, "dur_ns": 1},
    ]
    for phase in odd_phases:
        events.insert(2, {"ph": phase, "name": "thread_name", "pid": 1, "tid": 3, "ts_ns": 12})
    parts = Parts()
    parts.add(pa.Table.from_pylist(events, schema=RAW_SCHEMA))
    assert [t.column("name").to_pylist() for t in parts.complete] == [["aten::mm", "[memory]"]]
    assert [t.column("Bytes").to_pylist() for t in parts.memory] == [[64]]
    assert [t.column("label").to_pylist() for t in parts.thread_names] == [["main"]]
    assert [t.column("label").to_pylist() for t in parts.process_labels] == [["trainer"]]
