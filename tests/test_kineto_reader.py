"""The Kineto reader agrees with the raw JSON on every real trace, and survives bad input."""

from __future__ import annotations

import gzip
import json
import re
from decimal import Decimal
from pathlib import Path

import pyarrow.compute as pc
import pytest

from conftest import KINETO, kineto_file, raw_events
from perfsight.ingest import TraceReadError, read_trace
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
