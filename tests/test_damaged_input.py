"""Issue 15, items 1-8: each damage built the way the issue describes it, on a real trace.

What a user checks: the analysis finishes (no traceback), every intact event is kept, and one
warning names the file and the damage.  The reader tests run on the native scanner and on the
portable path (tests/_damage.py switches them as the other reader tests do).
"""

from __future__ import annotations

import gzip
import json
import re
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from _damage import Original, inflated_prefix, reader_path, slice_keys
from conftest import kineto_file, raw_events
from perfsight.api import analyse
from perfsight.cluster.job import analyse_job
from perfsight.ingest import TraceReadError, eventscan, read_trace

NCCL = "nccl_parser_config/nccl_data.json.gz"


@pytest.fixture(params=["native", "portable"])
def reader(request: pytest.FixtureRequest):
    """Run the test on each path of the reader."""
    native = request.param == "native"
    if native and not eventscan.available():
        pytest.skip("the native scanner is not built here")
    with reader_path(native):
        yield request.param


@pytest.fixture(scope="module")
def nccl_text() -> bytes:
    return gzip.decompress(kineto_file(NCCL).read_bytes())


@pytest.fixture(scope="module")
def nccl_slices() -> Counter:
    """The X events of the intact trace, by (name, start ns, duration ns), from the JSON oracle."""
    return Original.of(gzip.decompress(kineto_file(NCCL).read_bytes())).all_slices


def _x_event_field(text: bytes, field: bytes, near: float = 0.5) -> int:
    """Offset just after ``"field": "`` of an X event about ``near`` of the way into ``text``."""
    event = text.index(b'"ph": "X"', int(len(text) * near))
    return text.index(b'"' + field + b'": "', event) + len(field) + 5


def _one_warning(trace, path: Path, *words: str) -> str:
    lines = [w for w in trace.meta.warnings if str(path) in w and all(word in w for word in words)]
    assert len(lines) == 1, trace.meta.warnings
    return lines[0]


# --- 1. invalid UTF-8 ---------------------------------------------------------------------------


@pytest.mark.parametrize("field", [b"name", b"cat"])
def test_an_invalid_utf8_byte_is_replaced_and_the_analysis_finishes(
    tmp_path: Path, reader: str, nccl_text: bytes, nccl_slices: Counter, field: bytes
) -> None:
    at = _x_event_field(nccl_text, field)
    path = tmp_path / "bad_utf8.json"
    path.write_bytes(nccl_text[:at] + b"\xff" + nccl_text[at:])
    result = analyse(path, tmp_path / "out")  # the whole analysis and every writer
    trace = result.trace()
    assert trace.slices.num_rows == sum(nccl_slices.values())
    column = "name" if field == b"name" else "category"
    assert sum("\ufffd" in v for v in trace.slices.column(column).to_pylist()) >= 1
    _one_warning(trace, path, "1 invalid UTF-8", "U+FFFD")
    with open(result.ranks[trace.rank].output_dir / "trace_view.json", encoding="utf-8") as handle:
        doc = json.load(handle)
    events = doc["traceEvents"] if isinstance(doc, dict) else doc
    assert any("\ufffd" in str(e.get("name")) + str(e.get("cat")) for e in events)


# --- 2. times of 1e300 --------------------------------------------------------------------------


def test_ts_or_dur_of_1e300_is_a_counted_warning_not_a_traceback(
    tmp_path: Path, reader: str, nccl_text: bytes, nccl_slices: Counter
) -> None:
    first = nccl_text.index(b'"ph": "X"', len(nccl_text) // 3)
    second = nccl_text.index(b'"ph": "X"', 2 * len(nccl_text) // 3)
    text = re.sub(rb'"ts": [0-9.]+', b'"ts": 1e300', nccl_text[first:], count=1)
    text = nccl_text[:first] + text
    tail = re.sub(rb'"dur": [0-9.]+', b'"dur": 1e300', text[second:], count=1)
    path = tmp_path / "huge.json"
    path.write_bytes(text[:second] + tail)
    trace = read_trace(path)
    assert trace.slices.num_rows == sum(nccl_slices.values()) - 1  # the event with no usable ts
    _one_warning(trace, path, "1 events dropped", '"ts"')
    _one_warning(trace, path, "1 complete events", '"dur"', "duration 0")


# --- 3. a rank past int32 -----------------------------------------------------------------------


def test_a_rank_of_10_to_the_12_is_ignored_with_a_warning(
    tmp_path: Path, reader: str, nccl_text: bytes
) -> None:
    path = tmp_path / "worker_rank-1.json"
    path.write_bytes(nccl_text.replace(b'"rank": 0', b'"rank": 1000000000000', 1))
    trace = read_trace(path)
    assert trace.rank == 1 and trace.meta.rank_source == "file name"
    _one_warning(trace, path, "distributedInfo.rank 1000000000000 is not a rank")


def test_a_job_with_a_rank_past_int32_still_analyses_every_rank(tmp_path: Path) -> None:
    sources = [kineto_file(f"two_ranks_ws128/sampled_rank-{r}.json.gz") for r in (0, 1)]
    job = tmp_path / "job"
    job.mkdir()
    (job / "sampled_rank-0.json.gz").write_bytes(sources[0].read_bytes())
    text = gzip.decompress(sources[1].read_bytes())
    assert b'"rank": 1,' in text
    (job / "sampled_rank-1.json.gz").write_bytes(
        gzip.compress(text.replace(b'"rank": 1,', b'"rank": 1000000000000,', 1))
    )
    result = analyse_job(job, executor="serial")
    assert result.ranks == [0, 1]
    assert result.job.ranks[1].meta.rank_source == "file name"


# --- 4. damage near the end of a gzip -----------------------------------------------------------


def test_a_flipped_crc_byte_keeps_every_event_and_says_crc(
    tmp_path: Path, reader: str, nccl_slices: Counter
) -> None:
    data = bytearray(kineto_file(NCCL).read_bytes())
    data[-6] ^= 0x40  # inside the CRC-32 of the trailer: every event is intact
    path = tmp_path / "crc.json.gz"
    path.write_bytes(bytes(data))
    trace = read_trace(path)
    assert slice_keys(trace) == nccl_slices  # 26,933 of 26,933 (23,978 before the fix)
    line = _one_warning(trace, path, "CRC-32")
    assert "truncated" not in line


def test_a_corrupt_block_near_the_end_keeps_every_byte_inflated_before_it(
    tmp_path: Path, reader: str, nccl_text: bytes, nccl_slices: Counter
) -> None:
    data = bytearray(gzip.compress(nccl_text, 6, mtime=0))
    at = len(data) - 3000
    data[at] ^= 0xFF
    path = tmp_path / "corrupt.json.gz"
    path.write_bytes(bytes(data))
    before = Original.of(nccl_text).slices_before(inflated_prefix(bytes(data), at))
    trace = read_trace(path)
    assert sum(before.values()) > 0.9 * sum(nccl_slices.values())
    assert not before - slice_keys(trace)
    _one_warning(trace, path, "gzip member 1")


def test_a_cut_gzip_says_truncated(tmp_path: Path, reader: str, nccl_text: bytes) -> None:
    data = gzip.compress(nccl_text, 6, mtime=0)
    cut = len(data) - 5000
    path = tmp_path / "cut.json.gz"
    path.write_bytes(data[:cut])
    trace = read_trace(path)
    assert not Original.of(nccl_text).slices_before(inflated_prefix(data, cut)) - slice_keys(trace)
    _one_warning(trace, path, "ends inside gzip member 1 (truncated)")


# --- 5. several gzip members --------------------------------------------------------------------


def test_cat_of_two_gzip_files_is_read_to_the_end(
    tmp_path: Path, reader: str, nccl_text: bytes, nccl_slices: Counter
) -> None:
    middle = len(nccl_text) // 2
    path = tmp_path / "members.json.gz"
    path.write_bytes(gzip.compress(nccl_text[:middle]) + gzip.compress(nccl_text[middle:]))  # cat a.gz b.gz
    trace = read_trace(path)
    assert slice_keys(trace) == nccl_slices
    assert not [w for w in trace.meta.warnings if "truncated" in w or "gzip" in w]


def test_zero_padding_after_the_last_member_is_silent_and_other_bytes_are_named(
    tmp_path: Path, nccl_text: bytes, nccl_slices: Counter
) -> None:
    padded = tmp_path / "padded.json.gz"
    padded.write_bytes(gzip.compress(nccl_text) + bytes(512))  # as tape and block writers leave
    trace = read_trace(padded)
    assert slice_keys(trace) == nccl_slices and not trace.meta.warnings
    trailing = tmp_path / "trailing.json.gz"
    trailing.write_bytes(gzip.compress(nccl_text) + b"not gzip at all")
    trace = read_trace(trailing)
    assert slice_keys(trace) == nccl_slices
    _one_warning(trace, trailing, "after gzip member 1 are not gzip data")


def test_a_damaged_gzip_header_is_a_one_line_error(tmp_path: Path, nccl_text: bytes) -> None:
    data = bytearray(gzip.compress(nccl_text))
    data[2] = 7  # compression method 7 does not exist
    path = tmp_path / "header.json.gz"
    path.write_bytes(bytes(data))
    with pytest.raises(TraceReadError) as info:
        read_trace(path)
    assert str(path) in str(info.value) and "compression method" in str(info.value)


# --- 6. bad values are counted, not replaced silently -------------------------------------------


def test_a_ts_of_abc_on_every_event_drops_them_with_a_warning_naming_ts(
    tmp_path: Path, reader: str, nccl_text: bytes
) -> None:
    path = tmp_path / "ts_abc.json"
    path.write_bytes(re.sub(rb'"ts": [0-9.]+', b'"ts": "abc"', nccl_text))
    trace = read_trace(path)
    assert trace.slices.num_rows == 0 and trace.memory.num_rows == 0  # none placed at time 0
    dropped = sum(
        1 for e in raw_events(kineto_file(NCCL)) if e.get("ph") == "X" or e.get("name") == "[memory]"
    )
    _one_warning(trace, path, f"{dropped} events dropped", '"ts"')


@pytest.mark.parametrize("bad", [b"-\\1", b'"\\1x"'], ids=["negative", "string"])
def test_a_negative_or_string_dur_is_kept_as_zero_with_a_warning_naming_dur(
    tmp_path: Path, reader: str, nccl_text: bytes, nccl_slices: Counter, bad: bytes
) -> None:
    path = tmp_path / "dur.json"
    path.write_bytes(re.sub(rb'"dur": ([0-9.]+)', b'"dur": ' + bad, nccl_text))
    trace = read_trace(path)
    assert trace.slices.num_rows == sum(nccl_slices.values())
    assert set(trace.slices.column("dur_ns").to_pylist()) == {0}
    _one_warning(trace, path, f"{sum(nccl_slices.values())} complete events", '"dur"')


# --- 7. a lone surrogate ------------------------------------------------------------------------


def test_a_lone_surrogate_in_a_name_keeps_every_event(
    tmp_path: Path, reader: str, nccl_text: bytes, nccl_slices: Counter
) -> None:
    at = _x_event_field(nccl_text, b"name")
    path = tmp_path / "surrogate.json"
    path.write_bytes(nccl_text[:at] + b"\\ud800" + nccl_text[at:])
    trace = read_trace(path)
    assert trace.slices.num_rows == sum(nccl_slices.values())  # 781 were dropped before the fix
    assert sum(v.startswith("\ufffd") for v in trace.slices.column("name").to_pylist()) == 1
    _one_warning(trace, path, "1 invalid UTF-8 sequences or lone surrogates")


def test_invalid_utf8_and_lone_surrogates_are_counted_together(
    tmp_path: Path, reader: str, nccl_text: bytes, nccl_slices: Counter
) -> None:
    """The bytes are repaired on the decompressing thread, the escapes on the scanning one: each
    thread keeps its own count (``StreamReport``), the warning gives their sum."""
    at = _x_event_field(nccl_text, b"name")
    later = _x_event_field(nccl_text[len(nccl_text) // 2 :], b"name") + len(nccl_text) // 2
    path = tmp_path / "both.json"
    path.write_bytes(nccl_text[:at] + b"\xff\xfe" + nccl_text[at:later] + b"\\udc00" + nccl_text[later:])
    trace = read_trace(path)
    assert trace.slices.num_rows == sum(nccl_slices.values())
    _one_warning(trace, path, "3 invalid UTF-8 sequences or lone surrogates")


# --- 8. Ctrl-C leaves complete outputs or none --------------------------------------------------


def _interrupt_while_writing(args: list[str], out: Path) -> int:
    """Run ``perfsight analyse`` and press Ctrl-C once it has started writing under ``out``."""
    process = subprocess.Popen(
        [sys.executable, "-m", "perfsight.cli", "analyse", "--no-progress", *args, "--out", str(out)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and process.poll() is None:
        if any(out.glob("**/.perfsight-partial-*")):
            process.send_signal(signal.SIGINT)
            break
        time.sleep(0.005)
    _, stderr = process.communicate(timeout=300)
    assert "Traceback" not in stderr, stderr
    return process.returncode


def _files(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_ctrl_c_while_writing_leaves_no_output_folder(tmp_path: Path) -> None:
    trace = kineto_file("df_index_resolver/df_index_resolver.json.gz")  # seconds of analysis
    out = tmp_path / "out"
    code = _interrupt_while_writing([str(trace)], out)
    assert code == 130
    assert not out.exists() or not any(out.rglob("*")), sorted(out.rglob("*"))


def test_ctrl_c_while_waiting_for_the_writer_thread_waits_until_it_has_written(tmp_path: Path) -> None:
    """The analysis's second writer thread is waited for even when Ctrl-C lands during the wait;
    only then may the staging folder be deleted (else the writer re-creates it: a hidden folder
    with ``cache/dataloader.parquet`` was left once in CI)."""
    import os
    import threading

    from perfsight.export.staging import background_writer

    written = tmp_path / "written"

    def slow_write() -> None:
        time.sleep(0.8)
        written.write_text("done")

    ctrl_c = threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGINT))  # lands inside the wait
    with pytest.raises(KeyboardInterrupt), background_writer("test-writer") as pool:
        pool.submit(slow_write)
        ctrl_c.start()
    assert written.read_text() == "done"


def test_ctrl_c_during_a_reanalysis_leaves_the_earlier_outputs_as_they_were(tmp_path: Path) -> None:
    trace = kineto_file(NCCL)
    out = tmp_path / "out"
    done = subprocess.run(
        [sys.executable, "-m", "perfsight.cli", "analyse", "--no-progress", str(trace), "--out", str(out)],
        capture_output=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    before = _files(out)
    assert any(name.endswith("PROFILER_OUTPUT/trace_view.json") for name in before)
    code = _interrupt_while_writing([str(trace), "--export-type", "text,db"], out)
    after = _files(out)
    if code == 130:  # interrupted: the earlier outputs, whole
        assert after == before
    else:  # finished before the signal landed: the new outputs, whole (a db beside the text)
        assert code == 0 and any(name.endswith(".db") for name in after)
    assert not [p for p in out.rglob("*") if p.name.startswith(".perfsight-partial-")]


def test_ctrl_c_during_a_job_leaves_each_folder_complete_or_absent(tmp_path: Path) -> None:
    job = tmp_path / "job"
    job.mkdir()
    for rank in (0, 1):
        source = kineto_file(f"two_ranks_ws128/sampled_rank-{rank}.json.gz")
        (job / source.name).write_bytes(source.read_bytes())
    reference = tmp_path / "reference"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "perfsight.cli",
            "analyse",
            "--no-progress",
            str(job),
            "--out",
            str(reference),
        ],
        capture_output=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    out = tmp_path / "out"
    assert _interrupt_while_writing([str(job), "--executor", "serial"], out) in (0, 130)
    for folder in ("rank0/PROFILER_OUTPUT", "rank0/cache", "rank1/PROFILER_OUTPUT", "rank1/cache"):
        if (out / folder).exists():  # complete: the same files as an uninterrupted analysis
            assert sorted(_files(out / folder)) == sorted(_files(reference / folder)), folder
    if (out / "cluster_analysis_output").exists():
        assert sorted(_files(out / "cluster_analysis_output")) == sorted(
            _files(reference / "cluster_analysis_output")
        )
    assert not [p for p in out.rglob("*") if p.name.startswith((".perfsight-partial-", ".perfsight-claims"))]


def test_text_that_is_not_utf8_in_a_table_is_written_as_u_fffd_not_a_traceback() -> None:
    """The writers' JSON encoder (jsontext.json_strings) on strings no reader repaired: a table
    from elsewhere (a cache written before the fix) must not fail the whole export."""
    import pyarrow as pa

    from perfsight.jsontext import json_strings

    names = pa.array([b"ok", b"bad \xff byte", None]).cast(pa.string(), safe=False)
    assert json_strings(names).to_pylist() == ['"ok"', '"bad \ufffd byte"', None]
