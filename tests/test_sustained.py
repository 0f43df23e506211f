"""measure --sustained-s and the card's state (issue 56): forwards back to back timed per window, the steady
value and whether it is steady, and the vendor tool's readings beside them.

No GPU can be had here: the CUDA events are the stand-in's (RecordingCudaStandIn, replaying a scripted series of
window times), the forwards are the real model's on the CPU, and ``nvidia-smi`` is a stand-in script put on PATH
(canned lines as the real tool prints them with --format=csv,noheader,nounits).  They prove the kit's
arithmetic, its order of calls and what it writes, nothing about a real card.  The run that fills every section
of a result is also the one the crafted results under tests/data/report are checked against.
"""

import json
import sys
import types
from decimal import Decimal

import pytest
import torch

import mesure_memoire
from conftest import ROOT, SMALL_TRIAL, RecordingCudaStandIn, assert_one_line, stand_in_measurement

pytestmark = pytest.mark.usefixtures("no_earlier_warnings")

CPU = torch.device("cpu")
UUID = "GPU-5d4f3c2e-1a2b-3c4d-5e6f-708192a3b4c5"
OTHER_UUID = "GPU-00000000-1111-2222-3333-444444444444"


class ScriptedEvents(RecordingCudaStandIn):
    """The stand-in for torch.cuda whose events replay ``windows`` (ms) once the phases' events are read, and
    whose device has ``uuid`` (PyTorch's form: no "GPU-" prefix)."""

    def __init__(self, windows, phase_events, uuid=UUID):
        super().__init__(device=CPU, device_ms=0.25)
        self.windows, self.phase_events, self.uuid = list(windows), phase_events, uuid

    def _record(self, name, value=None):
        if name == "elapsed_time":
            self.phase_events -= 1
            value = self.windows.pop(0) if self.phase_events < 0 else value
        return super()._record(name, value)

    def get_device_properties(self, index):
        return types.SimpleNamespace(uuid=self.uuid.removeprefix("GPU-"))


def ticking_clock(step_ns=10**8):
    """A clock that moves ``step_ns`` at each reading: each phase 0.1 s, each window 0.1 s of host time."""
    readings = iter(range(0, 10**15, step_ns))
    return lambda: next(readings)


def sustained(windows, step_ns=10**8):
    """measure_phases with --sustained-s 1 on the CPU model (warm-up 1, 2 repetitions), the events replaying
    ``windows``, the clock moving ``step_ns`` at each reading."""
    settings = mesure_memoire.measure_config("cuda:0", 1, 4, 8, "float32", 1, 2, 0, 1)
    recorder = ScriptedEvents(windows, phase_events=6)
    _, _, _, timing = mesure_memoire.measure_phases(torch, recorder, CPU, settings, clock=ticking_clock(step_ns))
    return timing


# A 0.1 s warm median and 0.1 s per window of host time: 10 forwards a window, 9 windows for 1 s (the ninth is
# launched when the time elapsed and one more window reach the second asked).
STEADY = [1.0, 1.0, 1.01, 0.99, 1.0, 1.0, 1.01, 0.99, 1.0]
DRIFTING = [1.0, 1.05, 1.1, 1.15, 1.2, 1.25, 1.3, 1.35, 1.4]  # the clock falls as the card heats
CAPPED = [1.0, 1.2, 1.0, 1.25, 1.0, 1.2, 1.0, 1.25, 1.0]  # the power cap's clock swings


@pytest.mark.parametrize(
    ("windows", "steady", "steady_ms"),
    [(STEADY, True, "0.1"), (DRIFTING, False, "0.13"), (CAPPED, False, "0.1")],
    ids=["steady", "drifting", "capped"],
)
def test_the_windows_the_steady_value_and_whether_steady(windows, steady, steady_ms):
    timing = sustained(windows)
    section = timing["sustained"]
    assert (section["sustained_seconds"], section["forwards_per_window"]) == (1, 10)
    assert section["window_ms_per_forward"] == [Decimal(repr(ms)) / 10 for ms in windows]
    assert section["steady_ms_per_forward"] == Decimal(steady_ms)  # the last half's (5 windows) median
    assert section["steady"] is steady
    assert section["ratio_to_warm_median"] == Decimal(steady_ms) / Decimal("0.25")  # the warm device median


def test_the_queue_never_drains_and_the_card_is_read_while_the_last_window_is_in_flight(monkeypatch):
    def read_card():
        recorder.calls.append(("card read", None))
        return {"reading": None, "why_null": "stand-in"}

    monkeypatch.setattr(mesure_memoire, "card_reader", lambda cuda, index: read_card)
    settings = mesure_memoire.measure_config("cuda:0", 1, 4, 8, "float32", 1, 2, 0, 1)
    recorder = ScriptedEvents(STEADY, phase_events=6)
    mesure_memoire.measure_phases(torch, recorder, CPU, settings, clock=ticking_clock())
    names = [name for name, _ in recorder.calls]
    records = [index for index, name in enumerate(names) if name == "event.record"]
    first, last = records[-10], records[-1]  # the sustained run's 10 events: its start and 9 windows
    assert "synchronize" not in names[first:last]
    reads = [index for index, name in enumerate(names) if name == "card read"]
    assert len(reads) == 2  # before the warm-up, and in the last window
    assert names[reads[0] + 1 : reads[0] + 3] == ["synchronize", "memory_allocated"]  # the warmup phase begins
    # From the thread, once the window before the last has been launched, and read before the windows' times.
    assert records[-2] < reads[1] < names.index("elapsed_time", last)


def measure_result(monkeypatch, folder, capsys, *arguments, recorder=None):
    stand_in_measurement(monkeypatch, recorder or ScriptedEvents(STEADY, phase_events=6))
    code = mesure_memoire.main(["measure", *SMALL_TRIAL, *arguments, "--output", "r.json"])
    captured = capsys.readouterr()
    written = (folder / "r.json").read_text(encoding="utf-8") if (folder / "r.json").exists() else None
    return code, captured, written


def test_the_sustained_section_is_written_and_shown(stand_in_gpu, monkeypatch, folder, capsys):
    monkeypatch.setattr(mesure_memoire, "WINDOW_NS", 10**8)  # windows of 0.1 s: about ten in the second
    recorder = ScriptedEvents([1.0] * 10**4, phase_events=6)
    code, captured, written = ticking_measure_result(monkeypatch, folder, capsys, recorder, 10**7)
    assert code == 0, captured.err
    result = json.loads(written)
    assert result["configuration"]["sustained_seconds"] == 1
    section = result["sustained"]
    assert section["sustained_seconds"] == 1 and section["steady"] is True
    assert len(section["window_ms_per_forward"]) >= 3
    assert result["card_state"]["last_sustained_window"] == {"reading": None, "why_null": "no nvidia-smi on PATH"}
    assert "Card in the last window: not read (no nvidia-smi on PATH)" in captured.out
    assert mesure_memoire.main(["report", "r.json"]) == 0
    assert "Sustained runs (measure --sustained-s)" in capsys.readouterr().out


class RaisingInTheSustainedRun(ScriptedEvents):
    """The stand-in's events, raising ``error`` at the sustained run's first event (the phases' all read)."""

    def __init__(self, *args, error, **kwargs):
        super().__init__(*args, **kwargs)
        self.error = error

    def _record(self, name, value=None):
        if name == "event.record" and self.phase_events < 0:
            raise self.error
        if name == "Event" and self.phase_events == 0:
            self.phase_events = -1
        return super()._record(name, value)


def test_ctrl_c_during_the_sustained_run_writes_nothing_and_exits_130(stand_in_gpu, monkeypatch, folder, capsys):
    monkeypatch.setattr(mesure_memoire, "WINDOW_NS", 10**6)
    recorder = RaisingInTheSustainedRun(STEADY, phase_events=6, error=KeyboardInterrupt())
    code, captured, written = measure_result(monkeypatch, folder, capsys, "--sustained-s", "5", recorder=recorder)
    assert (code, written) == (130, None)
    assert_one_line(captured.err, "interrupted")
    assert sorted(path.name for path in folder.iterdir()) == ["existing.json", "fifo", "sub"]


@pytest.mark.parametrize("value", ["0", "601"])
def test_a_sustained_duration_out_of_bounds_is_refused_before_any_work(folder, capsys, value):
    assert mesure_memoire.main(["measure", *SMALL_TRIAL, "--sustained-s", value, "--output", "r.json"]) == 2
    line = assert_one_line(capsys.readouterr().err, "--sustained-s: expected a whole number from 1 to 600")
    assert "a sustained run is a bounded trial too" in line
    assert not (folder / "r.json").exists()


# --- the card's state: a stand-in nvidia-smi on PATH ----------------------------------------------------------

FIELDS = "1980, 1980, 121.53, 700.00, 38, 0x0000000000000001"
# The query as the real tool takes it: the stand-in answers only that (the real one exits 2 on an unknown field
# or format), and writes a byte that is not UTF-8 on a line of its own before its answer.
EXACT_QUERY = (
    "query = '--query-gpu=uuid,clocks.sm,clocks.max.sm,power.draw,power.limit,temperature.gpu,"
    "clocks_event_reasons.active'\n"
    "if sys.argv[1:] != [query, '--format=csv,noheader,nounits']: sys.exit(2)\n"
    "sys.stdout.buffer.write(b'\\xff\\xfe not UTF-8\\n')\n"
)


def vendor_tool(tmp_path, monkeypatch, body):
    """A stand-in nvidia-smi (Python, ``body`` its code after the imports and the query's check) alone on PATH."""
    folder = tmp_path / "bin"
    folder.mkdir()
    tool = folder / "nvidia-smi"
    tool.write_text(f"#!{sys.executable}\nimport sys, time\n{EXACT_QUERY}{body}\n", encoding="utf-8")
    tool.chmod(0o755)
    monkeypatch.setenv("PATH", str(folder))


def printing(*lines):
    return f"print({chr(10).join(lines)!r})"


def read(uuid=UUID):
    return mesure_memoire.card_reader(ScriptedEvents([], 0, uuid), 0)()


def reading(*values):
    return dict(zip(mesure_memoire.CARD_FIELDS, values, strict=True))


CANNED = {
    "canned": (printing(f"{UUID}, {FIELDS}"), reading(1980, 1980, 121.53, 700.0, 38, ["gpu_idle"])),
    "not_available": (
        printing(f"{UUID}, [N/A], 1980, [N/A], [Not Supported], 38, 0x0000000000000000"),
        reading(None, 1980, None, None, 38, []),
    ),
    "two_gpus_the_second_measured": (
        printing(f"{OTHER_UUID}, 345, 1980, 75.00, 700.00, 30, 0x1", f"{UUID}, 1755, 1980, 699.12, 700.00, 61, 0x4"),
        reading(1755, 1980, 699.12, 700.0, 61, ["sw_power_cap"]),
    ),
    "upper_case_hex_two_reasons": (
        printing(f"{UUID}, 1755, 1980, 699.12, 700.00, 61, 0x000000000000000C"),
        reading(1755, 1980, 699.12, 700.0, 61, ["sw_power_cap", "hw_slowdown"]),
    ),
    "odd_text": (
        printing(f"{UUID}, fast, 1980, nan, 700.00, 38.5, 0xZZ"),
        reading(None, 1980, None, 700.0, None, None),
    ),
}


@pytest.mark.parametrize("case", list(CANNED))
def test_the_card_s_line_is_matched_by_uuid_and_read_field_by_field(tmp_path, monkeypatch, case):
    body, expected = CANNED[case]
    vendor_tool(tmp_path, monkeypatch, body)
    assert read() == {"reading": expected, "why_null": None}


@pytest.mark.parametrize(
    ("body", "timeout_s", "why"),
    [
        (printing(f"{OTHER_UUID}, {FIELDS}"), 10, "no GPU nvidia-smi lists is the one PyTorch measured"),
        (
            "print('Field \"clocks_event_reasons.active\" is not a valid field to query.'); sys.exit(2)",
            10,
            "nvidia-smi exited with status 2",
        ),
        ("time.sleep(30)", 0.01, "nvidia-smi did not answer within 0.01 s"),  # killed at once: no real second
        (printing(f"{UUID}, 1980, 1980"), 10, "no GPU nvidia-smi lists is the one PyTorch measured"),  # too few fields
    ],
    ids=["another_gpu", "unknown_field", "hang", "short_line"],
)
def test_no_match_an_unknown_field_or_a_hang_is_null_and_why(tmp_path, monkeypatch, body, timeout_s, why):
    monkeypatch.setattr(mesure_memoire, "VENDOR_TIMEOUT_S", timeout_s)
    vendor_tool(tmp_path, monkeypatch, body)
    assert read() == {"reading": None, "why_null": why}


def test_the_readings_are_recorded_and_shown_without_the_uuid(stand_in_gpu, tmp_path, monkeypatch, folder, capsys):
    no_reason = "1980, 1980, 121.53, 700.00, 38, 0x0000000000000000"
    vendor_tool(tmp_path, monkeypatch, printing(f"{OTHER_UUID}, {no_reason}", f"{UUID}, {no_reason}"))
    code, captured, written = measure_result(monkeypatch, folder, capsys)
    assert code == 0, captured.err
    result = json.loads(written)
    assert result["card_state"]["before_warmup"]["reading"] == reading(1980, 1980, 121.53, 700.0, 38, [])
    assert result["card_state"]["last_sustained_window"] is None  # no sustained run asked
    line = "Card before the warm-up (nvidia-smi): SM clock 1980 of 1980 MHz, power 121.53 of 700.0 W, 38 C"
    assert line + ", clock events: none\n" in captured.out
    for text in (written, captured.out, captured.err):
        for uuid in (UUID, OTHER_UUID):
            assert uuid.lower().removeprefix("gpu-") not in text.lower()


def test_a_pytorch_that_gives_no_uuid_leaves_the_reading_null(tmp_path, monkeypatch):
    vendor_tool(tmp_path, monkeypatch, printing(f"{UUID}, {FIELDS}"))
    no_properties = RecordingCudaStandIn(device=CPU)  # its torch.cuda has no get_device_properties
    assert mesure_memoire.card_reader(no_properties, 0)() == {
        "reading": None,
        "why_null": "PyTorch gave no UUID to match the card by",
    }


def test_a_tool_that_cannot_start_is_null_and_why(tmp_path, monkeypatch):
    folder = tmp_path / "bin"
    folder.mkdir()
    tool = folder / "nvidia-smi"
    tool.write_text("#!/nonexistent/interpreter\n", encoding="utf-8")  # found on PATH, exec fails
    tool.chmod(0o755)
    monkeypatch.setenv("PATH", str(folder))
    state = read()
    assert set(state) == {"reading", "why_null"} and state["reading"] is None
    assert state["why_null"].startswith("nvidia-smi could not start: ")
    assert "No such file or directory" in state["why_null"]


def test_a_window_exactly_two_percent_off_is_steady_and_a_last_half_of_three_is_judged():
    # 5 forwards a window, 5 windows: a last half of 3, one of them exactly 2 % above the others.
    section = sustained([1.0, 1.0, 1.0, 1.0, 1.02], step_ns=166_666_667)["sustained"]
    assert (section["forwards_per_window"], len(section["window_ms_per_forward"])) == (5, 5)
    assert section["steady"] is True


def test_a_forward_longer_than_a_window_runs_alone_in_each_window():
    section = sustained([1.0] * 3, step_ns=2 * 10**9)["sustained"]
    assert section["forwards_per_window"] == 1


def test_a_pytorch_failure_in_the_sustained_run_is_named_exit_3_and_nothing_written(
    stand_in_gpu, monkeypatch, folder, capsys
):
    monkeypatch.setattr(mesure_memoire, "WINDOW_NS", 10**6)
    error = RuntimeError("CUDA error: an illegal memory access was encountered")
    recorder = RaisingInTheSustainedRun(STEADY, phase_events=6, error=error)
    code, captured, written = measure_result(monkeypatch, folder, capsys, "--sustained-s", "5", recorder=recorder)
    assert (code, written) == (3, None)
    assert_one_line(captured.err, "phase sustained failed", "RuntimeError")


def ticking_measure_result(monkeypatch, folder, capsys, recorder, step_ns):
    """measure_result for --sustained-s 1 with the clock of ``ticking_clock(step_ns)``: no second of real time."""
    measure_phases = mesure_memoire.measure_phases  # measure_result routes measure through this one

    def ticking(torch_module, cuda, device, config):
        return measure_phases(torch_module, recorder, CPU, config, clock=ticking_clock(step_ns))

    monkeypatch.setattr(mesure_memoire, "measure_phases", ticking)
    return measure_result(monkeypatch, folder, capsys, "--sustained-s", "1", recorder=recorder)


def test_zero_device_times_and_too_few_windows_are_shown_n_a(stand_in_gpu, monkeypatch, folder, capsys):
    recorder = ScriptedEvents([0.0] * 3, phase_events=6)  # 3 windows of 4 forwards in the second asked
    recorder.device_ms = 0.0  # a timer's resolution can read 0 ms
    code, captured, written = ticking_measure_result(monkeypatch, folder, capsys, recorder, 25 * 10**7)
    assert code == 0, captured.err
    section = json.loads(written)["sustained"]
    assert (section["steady"], section["ratio_to_warm_median"]) == (None, None)
    assert mesure_memoire.main(["report", "r.json"]) == 0
    out = capsys.readouterr().out
    main_row, sustained_row = (line.split() for line in out.splitlines() if line.startswith("r.json"))
    assert sustained_row[-2:] == ["n/a", "n/a"]  # steady, x warm
    assert "n/a" in main_row  # the warm drift


class ForwardTimedEvents(RecordingCudaStandIn):
    """The stand-in's events timing the work between them: 0.25 ms for each forward of the model run there."""

    def __init__(self):
        super().__init__(device=CPU)
        self.forwards = 0
        self.Event = lambda enable_timing=False: ForwardTimedEvent(self)


class ForwardTimedEvent:
    def __init__(self, recorder):
        self.recorder, self.forwards = recorder, None

    def record(self, stream):
        self.recorder._check("event.record", stream.device)
        self.forwards = self.recorder.forwards

    def elapsed_time(self, end):
        return (end.forwards - self.forwards) * 0.25


def test_the_sustained_run_times_the_model_s_forwards(stand_in_gpu, monkeypatch, folder, capsys):
    recorder = ForwardTimedEvents()

    def count(module, args, output):  # the model's forwards, each timed at 0.25 ms by the events around it
        recorder.forwards += isinstance(module, torch.nn.Sequential)

    handle = torch.nn.modules.module.register_module_forward_hook(count)
    try:
        code, captured, written = ticking_measure_result(monkeypatch, folder, capsys, recorder, 10**8)
    finally:
        handle.remove()
    assert code == 0, captured.err
    section = json.loads(written)["sustained"]
    assert section["steady_ms_per_forward"] == 0.25  # as each warm forward: a window's time is its forwards'
    assert section["ratio_to_warm_median"] == 1


def test_the_ratio_is_to_the_warm_repetitions_alone():
    class SlowFirstPhases(ScriptedEvents):  # loading, inputs, cold forward and warm-up at 5 device ms each
        def _record(self, name, value=None):
            if name == "elapsed_time" and self.phase_ms:
                value = self.phase_ms.pop(0)
            return super()._record(name, value)

    settings = mesure_memoire.measure_config("cuda:0", 1, 4, 8, "float32", 1, 2, 0, 1)
    recorder = SlowFirstPhases(STEADY, phase_events=6)
    recorder.phase_ms = [5.0, 5.0, 5.0, 5.0, 0.25, 0.25]
    _, _, _, timing = mesure_memoire.measure_phases(torch, recorder, CPU, settings, clock=ticking_clock())
    assert timing["sustained"]["ratio_to_warm_median"] == Decimal("0.1") / Decimal("0.25")


# --- the crafted results (tests/data/report): the fields measure writes ------------------------------------------


def key_paths(value, path=""):
    """Each field's path in ``value`` (".phases[].verdict": a list's items together, whatever their number); a null
    or an empty list ends in "*" (it may hold any fields)."""
    if isinstance(value, dict):
        paths = set()
        for key, item in value.items():
            paths |= {f"{path}.{key}"} | key_paths(item, f"{path}.{key}")
        return paths
    if isinstance(value, list) and value:
        return set().union(*(key_paths(item, f"{path}[]") for item in value))
    return {path + "*"} if value is None or value == [] else set()


def uncovered(paths, other):
    """The fields of ``paths`` that ``other`` neither holds nor leaves open (a null or an empty list above them)."""
    open_stems = [path[:-1] for path in other if path.endswith("*")]
    return {
        path
        for path in paths
        if not path.endswith("*")
        and path not in other
        and not any(path.startswith((stem + ".", stem + "[]")) for stem in open_stems)
    }


def test_the_crafted_results_hold_exactly_the_fields_measure_writes(
    stand_in_gpu, tmp_path, monkeypatch, folder, capsys
):
    """Report, sweep, figure and notebook tests read crafted results: each must hold the fields a result of this
    kit holds, no more, no fewer (a format change that leaves one behind fails here).  Compared with a result
    measure writes with every section filled: a sustained run, the card read before and during it."""
    vendor_tool(tmp_path, monkeypatch, printing(f"{UUID}, {FIELDS}"))
    monkeypatch.setattr(mesure_memoire, "WINDOW_NS", 10**8)
    recorder = ScriptedEvents([1.0] * 10**4, phase_events=6)
    code, captured, written = ticking_measure_result(monkeypatch, folder, capsys, recorder, 10**7)
    assert code == 0, captured.err
    result = json.loads(written)
    assert result["sustained"] and all(state["reading"] for state in result["card_state"].values())
    measured = key_paths(result)
    report_data = ROOT / "tests" / "data" / "report"
    crafted = sorted(report_data.rglob("*.json"))
    wrong = []
    for path in crafted:
        fields = key_paths(json.loads(path.read_text(encoding="utf-8")))
        differences = uncovered(fields, measured) | uncovered(measured, fields)
        if differences:
            wrong.append(f"{path.relative_to(report_data)}: {' '.join(sorted(differences))}")
    assert crafted and not wrong, "\n".join(wrong)
