"""``perfsight.schedule`` follows seed 003's rules, and drives a real profiler to exactly those steps."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest

import perfsight
from perfsight.collect.schedule import Phase


def recorded(sched: perfsight.collect.Schedule, steps: int) -> list[int]:
    return [s for s in range(steps) if sched.phase(s) in (Phase.RECORD, Phase.RECORD_AND_SAVE)]


def test_seed_example_records_steps_four_and_five() -> None:
    # seed 003: skip_first=2, wait=1, warmup=1, active=2 -> "从第4步开始采集 ... 采集第4、5步"
    sched = perfsight.schedule(wait=1, warmup=1, active=2, repeat=1, skip_first=2)
    assert recorded(sched, 15) == [4, 5]
    assert sched.phase(3) is Phase.WARMUP
    assert sched.phase(5) is Phase.RECORD_AND_SAVE
    assert sched.total_steps == 6


@pytest.mark.parametrize("name", ["wait", "active", "warmup", "repeat", "skip_first"])
def test_a_negative_parameter_is_an_error_naming_it(name: str) -> None:
    values = {"wait": 1, "active": 1, "warmup": 0, "repeat": 1, "skip_first": 0, name: -1}
    with pytest.raises(ValueError, match=rf"\b{name}\b"):
        perfsight.schedule(**values)


def test_active_zero_warns_and_records_one_step() -> None:
    with pytest.warns(UserWarning, match="active"):
        sched = perfsight.schedule(wait=0, warmup=0, active=0, repeat=2)
    assert sched.active == 1
    assert recorded(sched, 10) == [0, 1]


def test_repeat_zero_cycles_until_the_end() -> None:
    sched = perfsight.schedule(wait=1, warmup=0, active=1, repeat=0)
    assert recorded(sched, 9) == [1, 3, 5, 7]
    assert sched.total_steps is None
    assert sched.shortfall(3) is None


def test_shortfall_names_the_schedule_length_and_the_run_length() -> None:
    sched = perfsight.schedule(wait=1, warmup=1, active=3, repeat=2, skip_first=1)
    assert sched.shortfall(11) is None
    message = sched.shortfall(7)
    assert message is not None and "11 steps" in message and "ran 7" in message


def test_torch_profiler_accepts_a_perfsight_schedule(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    seen: list[int] = []

    def handler(prof: torch.profiler.profile) -> None:
        path = tmp_path / f"window{len(seen)}.json"
        prof.export_chrome_trace(str(path))
        events = json.loads(path.read_text())["traceEvents"]
        names = {e["name"] for e in events if e.get("name", "").startswith("ProfilerStep#")}
        seen.extend(sorted(int(n.split("#")[1]) for n in names))

    sched = perfsight.schedule(wait=1, warmup=1, active=2, repeat=1, skip_first=2)
    with torch.profiler.profile(schedule=sched, on_trace_ready=handler) as prof:
        for _ in range(9):
            torch.ones(4).sum()
            prof.step()
    assert seen == [4, 5]


def _windows(out: Path) -> list[dict]:
    infos = [json.loads(p.read_text()) for p in sorted(out.glob("*_perfsight/profiler_info_0.json"))]
    return sorted(infos, key=lambda info: info["window"]["first_step"])


def _train(out: Path, steps: int, sched: perfsight.collect.Schedule) -> None:
    torch = pytest.importorskip("torch")
    layer = torch.nn.Linear(8, 8)
    with perfsight.profile(
        schedule=sched, on_trace_ready=perfsight.tensorboard_trace_handler(out, analyse_flag=False)
    ) as prof:
        for _ in range(steps):
            layer(torch.randn(4, 8)).sum().backward()
            prof.step()


def test_repeat_zero_marks_the_last_cut_window_incomplete(tmp_path: Path) -> None:
    # cycle of 3 (wait 1, active 2); 8 steps: windows at 1-2, 4-5 and 7 (cut: step 8 never ran)
    _train(tmp_path, steps=8, sched=perfsight.schedule(wait=1, active=2, repeat=0))
    windows = _windows(tmp_path)
    assert [w["window"]["steps"] for w in windows] == [[1, 2], [4, 5], [7]]
    assert [w["complete"] for w in windows] == [True, True, False]
    assert "1 of the window's 2 active steps" in windows[-1]["incomplete_reason"]
    (marker,) = tmp_path.glob("*_perfsight/WINDOW_INCOMPLETE")
    assert json.loads((marker.parent / "profiler_info_0.json").read_text())["window"]["steps"] == [7]
    # the trace also holds step 8, running when training stopped: read back as not complete
    trace = perfsight.load(marker.parent).trace()
    assert trace.meta.complete is False
    assert dict(zip(*trace.steps.select(["step", "complete"]).to_pydict().values(), strict=True)) == {
        7: True,
        8: False,
    }


def test_a_schedule_longer_than_the_run_warns_and_flags_the_partial_window(tmp_path: Path) -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _train(tmp_path, steps=4, sched=perfsight.schedule(wait=1, warmup=1, active=4, repeat=1))
    assert any("schedule spans 6 steps" in str(w.message) for w in caught)
    (window,) = _windows(tmp_path)
    assert window["complete"] is False
    assert window["window"]["steps"] == [2, 3]
