"""`mesure_memoire.py measure`: the phase protocol (its order is a promise), the result's schema and figures,
the PyTorch release gate, the dtype probe, the device and dtype of every tensor.

No GPU can be had here.  The tests name their stand-ins: ``stand_in_gpu`` (conftest) for the device queries,
and ``RecordingCudaStandIn`` for the allocator counters, while the model, the inputs and the forward passes
are the real PyTorch ones, run on the CPU.
"""

import json
import os
import re
import time
import weakref
from datetime import datetime, timezone

import pytest
import torch

import mesure_memoire
from conftest import (
    DEFAULT_SNAPSHOT_SETTINGS,
    GIB,
    MEASURE,
    MESSAGES,
    MIB,
    NO_PER_CALL,
    SMALL_TRIAL,
    RecordingCudaStandIn,
    config,
    current_device,
    error_line,
    hand_made_records,
    host_memory,
    kit_error_of,
    plain_id,
    plain_ids,
    raising,
    refused,
    run_in_process,
    stand_in_measurement,
)

# PyTorch warnings recorded by earlier tests would show in field_errors: each test starts from none.
pytestmark = pytest.mark.usefixtures("no_earlier_warnings")
# measure_phases' time beyond the phases: no sustained run asked, no vendor tool on PATH.
NO_TIMING = {
    "sustained": None,
    "card_state": {
        "before_warmup": {"reading": None, "why_null": "no nvidia-smi on PATH"},
        "last_sustained_window": None,
    },
}


# --- the protocol ------------------------------------------------------------------------------------


def recording_clock(recorder, *ticks):
    """A clock returning ``ticks`` in turn, each reading logged among the stand-in's calls."""
    readings = iter(ticks)

    def clock():
        recorder.calls.append(("clock", None))
        return next(readings)

    return clock


def test_run_phase_follows_the_protocol_order():
    recorder = RecordingCudaStandIn()
    clock = recording_clock(recorder, 100, 350)

    def work():
        recorder.calls.append(("work", None))
        return "output"

    record, output = mesure_memoire.run_phase(recorder, "dev", "inputs", work, clock)
    assert [name for name, _ in recorder.calls] == [
        "synchronize",
        "memory_allocated",
        "memory_reserved",
        "memory_stats",
        "reset_peak_memory_stats",
        "current_stream",
        "Event",
        "Event",
        "clock",
        "event.record",
        "work",
        "event.record",
        "synchronize",
        "clock",
        "elapsed_time",
        "memory_allocated",
        "memory_reserved",
        "max_memory_allocated",
        "max_memory_reserved",
        "memory_stats",
    ]
    assert {device for _, device in recorder.devices} == {"dev"}  # every call names the measured device
    assert output == "output"
    assert record == {
        "phase": "inputs",
        "nanoseconds": 250,
        "device_ms": 0.25,
        "baseline_allocated_bytes": 1000,
        "baseline_reserved_bytes": 2000,
        "end_allocated_bytes": 1000,
        "end_reserved_bytes": 2000,
        "peak_allocated_bytes": 1500,
        "peak_reserved_bytes": 2500,
        "baseline_requested_bytes": 900,
        "end_requested_bytes": 900,
        "peak_requested_bytes": 1400,
    }


@pytest.fixture
def forward_outputs():
    """Weak references to every output of the synthetic model's forward (a global forward hook)."""
    outputs = []
    live_before_each_pass = []

    def hook(module, args, output):
        if isinstance(module, torch.nn.Sequential):
            live_before_each_pass.append(sum(ref() is not None for ref in outputs))
            outputs.append(weakref.ref(output))

    handle = torch.nn.modules.module.register_module_forward_hook(hook)
    yield outputs, live_before_each_pass
    handle.remove()


@pytest.mark.parametrize(("warmup", "repeats"), [(3, 2), (0, 1)])
def test_stand_in_counters_real_cpu_model_phases_and_output_lifetimes(forward_outputs, warmup, repeats):
    outputs, live_before_each_pass = forward_outputs
    recorder = RecordingCudaStandIn(
        observe=lambda: sum(ref() is not None for ref in outputs), device=torch.device("cpu")
    )
    records, _, _, _ = mesure_memoire.measure_phases(
        torch, recorder, torch.device("cpu"), config(warmup=warmup, repeats=repeats)
    )

    # The phases' names and labels: test_measure_phases_puts_the_model_and_inputs_on_the_measured_device.
    # Every pass runs with no earlier output alive: outputs are released before the next pass.
    assert len(live_before_each_pass) == 1 + warmup + repeats
    assert set(live_before_each_pass) == {0}
    # The recorder sees 17 calls per phase (the clock and the work are not cuda calls): call 0 is
    # the start synchronize, call 12 the end memory_allocated reading.
    calls_per_phase = 17
    phase_calls = calls_per_phase * len(records)
    # Then the per-call workspace: each of the two products alone, once the last output is released.
    product = ["synchronize", "reset_peak_memory_stats", "synchronize", "max_memory_allocated"]
    product += ["memory_allocated", "memory_stats"]
    assert recorder.calls[phase_calls:] == [(name, 0) for name in product * 2]
    for index, record in enumerate(records):
        calls = recorder.calls[index * calls_per_phase : (index + 1) * calls_per_phase]
        assert calls[0] == ("synchronize", 0)  # no forward output alive when a phase starts
        assert calls[12][0] == "memory_allocated"
        if record["phase"] not in ("model_load", "inputs"):
            assert calls[12][1] == 1  # the pass's output is alive at the end reading


def test_stand_in_result_written_atomically_and_read_back(stand_in_gpu, monkeypatch, tmp_path, capsys):
    stand_in_measurement(monkeypatch, RecordingCudaStandIn(device=torch.device("cpu")))
    output = tmp_path / "mesures-petit-essai.json"
    assert mesure_memoire.main(["measure", *SMALL_TRIAL, "--output", str(output)]) == 0
    out = capsys.readouterr().out
    result = json.loads(output.read_text(encoding="utf-8"))
    # Its fields and configuration: test_measure_names_the_device_in_every_call_and_returns_the_whole_result.
    assert result["tool"] == "mesure_memoire.py"
    assert result["environment"]["gpu"]["name"] == "Stand-in GPU"
    assert [p["phase"] for p in result["phases"]] == [*mesure_memoire.PHASES, "warm_forward"]
    # The stand-in's fixed counters cannot match a prediction: every phase disagrees, visibly.
    assert {record["verdict"] for record in result["phases"]} == {"disagrees"}
    disagreements = result["prediction_check"]["disagreements"]
    assert disagreements == [d for record in result["phases"] for d in record["disagreements"]]
    assert result["workspace"]["measured_bytes"] == 0 - 4096  # end minus baseline, less the predicted output
    assert "STANDIN-UUID" not in output.read_text()
    assert [p.name for p in tmp_path.iterdir()] == [output.name]  # no temporary file left
    lines = out.splitlines()  # the table's layout is pinned by test_the_phase_table_exactly
    assert [line.split()[0] for line in lines[1:7]] == [p["phase"] for p in result["phases"]]
    assert all(line.rstrip().endswith("DISAGREES") for line in lines[1:7])
    assert len([line for line in lines if line.startswith("DISAGREES ")]) == len(disagreements)
    assert (
        "DISAGREES inputs: end_requested_bytes above baseline measured 0, predicted 4096 (difference -4096 bytes)"
        in lines
    )
    assert lines[-1] == f"Result written to {output}"


# --- the dtype probe and the host memory --------------------------------------------------------------


def measures(monkeypatch, settings):
    """measure()'s result for ``settings``, its phases agreeing with the plan (no refusal came first)."""
    monkeypatch.setattr(
        mesure_memoire, "measure_phases", lambda *args: (hand_made_records(settings)[0], {}, NO_PER_CALL, NO_TIMING)
    )
    return mesure_memoire.measure(settings, tool="t")


@pytest.mark.parametrize(
    ("dtype", "capability", "hip", "bf16", "expected"),
    [
        ("bfloat16", (9, 0), None, False, MESSAGES["bfloat16 not native"]),
        ("bfloat16", (9, 0), None, True, None),
        ("float16", (5, 2), None, True, MESSAGES["float16 needs 5.3"]),
        ("float16", (5, 3), None, True, None),
        ("float16", (5, 2), "7.0", True, None),  # ROCm: every supported GPU has float16
        ("float32", (3, 0), None, False, None),
    ],
)
def test_the_dtype_probe_asks_the_chosen_device(stand_in_gpu, monkeypatch, dtype, capability, hip, bf16, expected):
    stand_in_gpu(count=3)
    SetUpCalls(monkeypatch)
    current = current_device(monkeypatch)

    # Device 2, the chosen one, answers as the case says; the others have everything, and so has emulation.
    def is_bf16_supported(including_emulation=True):
        return including_emulation or current[-1] != 2 or bf16

    monkeypatch.setattr(torch.cuda, "is_bf16_supported", is_bf16_supported)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda index: capability if index == 2 else (9, 0))
    monkeypatch.setattr(torch.version, "hip", hip)
    settings = config(device="cuda:2", dtype=dtype)
    if expected is None:
        assert measures(monkeypatch, settings)["configuration"]["dtype"] == dtype
    else:
        said = MESSAGES["dtype not supported"].format(dtype=dtype, problem=expected, gpu="Stand-in GPU")
        assert str(measure_refusal(settings)) == refused(said)


# --- measure(): every refusal's words, the devices it names, the result it returns ---------------------


class SetUpCalls:
    """Stand-ins for the torch.cuda set-up calls of measure(): each takes a device argument or none, as
    PyTorch's do, and answers fixed values."""

    def __init__(self, monkeypatch, allocated=0, reserved=0):
        for name, answer in [("init", lambda: None)]:
            monkeypatch.setattr(torch.cuda, name, self.answering(name, answer, with_device=False))
        for name, answer in [
            ("set_device", lambda: None),
            ("memory_allocated", lambda: allocated),
            ("memory_reserved", lambda: reserved),
        ]:
            monkeypatch.setattr(torch.cuda, name, self.answering(name, answer, with_device=True))

    @staticmethod
    def answering(name, answer, with_device):
        def call(*args):
            assert len(args) == with_device, (name, args)
            return answer()

        return call


@pytest.fixture
def five_hours_east_of_utc(monkeypatch):
    """A local time zone other than UTC (the machines here run in UTC)."""
    monkeypatch.setenv("TZ", "Etc/GMT-5")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


def test_measure_names_the_device_in_every_call_and_returns_the_whole_result(
    stand_in_gpu, monkeypatch, five_hours_east_of_utc
):
    stand_in_gpu(count=3)
    before = datetime.now(timezone.utc).replace(microsecond=0)
    settings = config(device="cuda:2", batch=2, context=3, width=8, warmup=2, repeats=1)
    device = torch.device("cuda", 2)
    # A stand-in CUDA whose counters read 0 only where a fresh process's would: on the chosen device, once
    # set_device has made it current and init has made its context.  Anything else reads 1 byte.
    current, contexts = [], []
    monkeypatch.setattr(torch.cuda, "set_device", current.append)
    monkeypatch.setattr(torch.cuda, "init", lambda: contexts.append(current[-1] if current else None))
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda on: int(contexts != [on] or on != device))
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda on: int(contexts != [on] or on != device))

    def measure_phases(torch_module, cuda, on, configuration):
        assert (torch_module, cuda, on, configuration) == (torch, torch.cuda, device, settings)  # else: no result
        return (
            hand_made_records(settings)[0],
            {"all_finite": True, "checksum_float64": 0.5, "elements": 48},
            NO_PER_CALL,
            NO_TIMING,
        )

    monkeypatch.setattr(mesure_memoire, "measure_phases", measure_phases)
    result = mesure_memoire.measure(settings, tool="a tool")
    assert re.fullmatch(r"20[0-9]{2}-[01][0-9]-[0-3][0-9]T[0-2][0-9]:[0-5][0-9]:[0-6][0-9]Z", result["created_utc"])
    created = datetime.strptime(result["created_utc"], "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=timezone.utc)
    assert before <= created <= datetime.now(timezone.utc)  # UTC, not the local time five hours ahead
    plan = mesure_memoire.memory_plan(settings)
    assert result["environment"]["device"] == "cuda:2"
    assert result["environment"]["gpu_available"] is True
    assert {key: result[key] for key in result if key not in ("created_utc", "environment", "phases")} == {
        "kit": "iteragpu-lab-v1",
        "schema_version": 8,
        "tool": "a tool",
        **NO_TIMING,
        "configuration": {
            **settings,
            "allocated_bytes_before_measure": 0,
            "reserved_bytes_before_measure": 0,
            "fresh_process_warning": None,
        },
        "synthetic_model": mesure_memoire.synthetic_model(settings),
        "prediction_check": {"agrees": True, "disagreements": [], "not_checked": []},
        "workspace": {"measured_bytes": 0, "allowance_bytes": 256 * MIB, "per_call": NO_PER_CALL},
        "output_summary": {"all_finite": True, "checksum_float64": 0.5, "elements": 48},
        "predicted_peak_allocated_bytes": plan["predicted_peak_allocated_bytes"],
        "fit_margin_bytes": GIB,
    }
    assert [record["verdict"] for record in result["phases"]] == ["agrees"] * 5


@pytest.mark.parametrize(("allocated", "reserved"), [(512, 0), (0, 2**21)])
def test_measure_warns_when_the_process_already_held_gpu_memory(stand_in_gpu, monkeypatch, allocated, reserved):
    stand_in_gpu()
    SetUpCalls(monkeypatch, allocated=allocated, reserved=reserved)
    settings = config()
    monkeypatch.setattr(
        mesure_memoire, "measure_phases", lambda *args: (hand_made_records(settings)[0], {}, NO_PER_CALL, NO_TIMING)
    )
    configuration = mesure_memoire.measure(settings, tool="t")["configuration"]
    assert (configuration["allocated_bytes_before_measure"], configuration["reserved_bytes_before_measure"]) == (
        allocated,
        reserved,
    )
    assert configuration["fresh_process_warning"] == MESSAGES["not a fresh process"]


@pytest.mark.parametrize(
    ("backend", "divisions", "verdict", "counters"),
    [
        ("native", 0, "agrees", list(mesure_memoire.PREDICTED_COUNTERS)),
        ("native", 4, "agrees", ["end_requested_bytes", "peak_requested_bytes"]),
        ("cudaMallocAsync", 0, "not checked", []),
    ],
    ids=["defaults", "roundup_power2_divisions_4", "cudaMallocAsync"],
)
def test_measure_checks_the_counters_the_settings_pytorch_parsed_allow(
    stand_in_gpu, monkeypatch, backend, divisions, verdict, counters
):
    stand_in_gpu()
    SetUpCalls(monkeypatch)
    monkeypatch.setattr(torch.cuda.memory, "get_allocator_backend", lambda: backend)
    intervals = (str(2**index) for index in range(16))
    parsed = {**DEFAULT_SNAPSHOT_SETTINGS, "roundup_power2_divisions": dict.fromkeys(intervals, divisions)}
    monkeypatch.setattr(torch.cuda.memory, "_snapshot", lambda: {"allocator_settings": parsed})  # a stand-in
    settings = config(batch=5, context=77, width=3000)
    records = hand_made_records(settings)[0]
    records[1]["end_allocated_bytes"] += 2 * MIB  # the inputs' block beyond its slack: disagrees if checked
    monkeypatch.setattr(mesure_memoire, "measure_phases", lambda *args: (records, {}, NO_PER_CALL, NO_TIMING))
    result = mesure_memoire.measure(settings, tool="t")
    inputs = result["phases"][1]
    expected = "disagrees" if backend == "native" and not divisions else verdict
    assert (inputs["verdict"], inputs["checked_counters"]) == (expected, counters)
    assert {phase["verdict"] for phase in result["phases"][2:]} == {verdict}
    plan = mesure_memoire.memory_plan(settings)  # one plan, the defaults': the peak the file states
    assert result["predicted_peak_allocated_bytes"] == plan["predicted_peak_allocated_bytes"]


# --- the PyTorch release: 2.4 or later, read from the version's leading digits --------------------------


@pytest.mark.parametrize(
    "version",
    [
        "2.4.1",
        "2.4.0a0+git1234567",  # a vendor build (NVIDIA's containers read like this)
        "2.10.0",  # two digits: 2.10 is newer than 2.4, as numbers
        "3.0",
        None,  # the version query failed, or the version was withheld: field_errors says which
    ],
    ids=plain_id,
)
def test_a_pytorch_release_is_read_from_its_leading_digits(version):
    assert mesure_memoire.refuse_old_torch(version) is None


@pytest.mark.parametrize("version", ["2.3.0a0+81ea7a4", "1.13.1+cu117"])
def test_a_pytorch_below_2_4_is_refused_naming_both_versions(version):
    said = MESSAGES["PyTorch too old"].format(version=repr(version))
    assert kit_error_of(mesure_memoire.refuse_old_torch, version) == refused(said)


def test_measure_refuses_an_old_pytorch_before_any_gpu_work(stand_in_gpu, monkeypatch, folder, capsys):
    stand_in_gpu()
    SetUpCalls(monkeypatch)
    monkeypatch.setattr(torch, "__version__", "2.3.1")
    # Before any query that could start CUDA on the device (collect_environment's are the first).
    monkeypatch.setattr(mesure_memoire, "collect_environment", lambda device: pytest.fail("the GPU was queried"))
    code, captured = run_in_process(capsys, folder, [*MEASURE, "--output", "o.json"])
    assert code == 2
    assert captured.err == error_line(refused(MESSAGES["PyTorch too old"].format(version="'2.3.1'")))


def workspace(kept_bytes, fc1_bytes, fc2_bytes):
    taken = {"fc1": {"allocated_bytes": fc1_bytes}, "fc2": {"allocated_bytes": fc2_bytes}}
    return {"measured_bytes": kept_bytes, "allowance_bytes": 256 * MIB, "per_call": taken}


def test_workspaces_beyond_the_plan_s_allowance_are_a_warning():
    result = {"configuration": {"fresh_process_warning": None}}
    assert mesure_memoire.result_warnings({**result, "workspace": workspace(255 * MIB, MIB, 0)}) == []
    assert mesure_memoire.result_warnings({**result, "workspace": workspace(0, 0, 256 * MIB + 1)}) == [
        MESSAGES["BLAS workspaces beyond the allowance"].format(kept=0, per_call=268435457, allowance=268435456)
    ]
    assert mesure_memoire.result_warnings({**result, "workspace": workspace(256 * MIB, 0, 0)}) == []
    assert mesure_memoire.result_warnings({**result, "workspace": workspace(256 * MIB, 0, 1)}) == [
        MESSAGES["BLAS workspaces beyond the allowance"].format(kept=268435456, per_call=1, allowance=268435456)
    ]
    # The kept workspace is not measured where cold_forward is not modelled: only the per-call one counts.
    assert mesure_memoire.result_warnings({**result, "workspace": workspace(None, 256 * MIB, 0)}) == []


def measure_refusal(settings):
    with pytest.raises(mesure_memoire.KitError) as refusal:
        mesure_memoire.measure(settings, tool="t")
    return refusal.value


def test_measure_refuses_a_model_too_large_for_the_host_memory_with_both_figures(stand_in_gpu, monkeypatch):
    SetUpCalls(monkeypatch)
    stand_in_gpu()
    host_memory(monkeypatch, 4096, GIB // 4096)
    # 8 * 8192**2 + 5 * 8192 parameters, built in float32 first: 2147647488 bytes.
    said = MESSAGES["host RAM too small"].format(needed="2.00", available="1.00")
    assert str(measure_refusal(config(width=8192))) == refused(said)
    host_memory(monkeypatch, 256, 517)  # 8 * 64 * 64 * 4 + 5 * 64 * 4 = 132352 bytes: 517 pages, exactly enough
    assert measures(monkeypatch, config())["tool"] == "t"
    for error in (ValueError, OSError, AttributeError):  # unknown: not checked
        monkeypatch.setattr(os, "sysconf", raising(error("SC_PHYS_PAGES")))
        assert measures(monkeypatch, config(width=8192))["tool"] == "t", error


class StandInOutOfMemory(Exception):
    """A stand-in for PyTorch's out-of-memory error class, whose message does not say "out of memory"."""


@pytest.mark.parametrize(
    "error",
    [RuntimeError("HIP: Out Of Memory"), StandInOutOfMemory("allocation refused")],
    ids=["ROCm's text", "the class"],
)
def test_out_of_memory_is_named_as_such_exit_3(stand_in_gpu, monkeypatch, error):
    stand_in_gpu()
    SetUpCalls(monkeypatch)
    monkeypatch.setattr(torch.cuda, "OutOfMemoryError", StandInOutOfMemory)
    monkeypatch.setattr(mesure_memoire, "measure_phases", raising(mesure_memoire.PhaseFailed("warmup", error)))
    with pytest.raises(mesure_memoire.MeasurementFailed) as failure:
        mesure_memoire.measure(config(), tool="t")
    assert str(failure.value) == MESSAGES["phase out of memory"].format(
        phase="warmup", dimensions="batch 1, context 16, width 64, dtype float32", device="cuda:0"
    )
    assert failure.value.exit_code == 3
    assert failure.value.__cause__ is None
    assert failure.value.__suppress_context__


# --- small pure parts ----------------------------------------------------------------------------------


class StandInWithStats(RecordingCudaStandIn):
    """RecordingCudaStandIn whose memory_stats returns ``stats``, as a PyTorch might."""

    def __init__(self, stats, device="dev"):
        super().__init__(device=device)
        self.stats = stats

    def memory_stats(self, device):
        super().memory_stats(device)
        return self.stats


REQUESTED_PARTLY = [
    ("none of them", {}),  # a PyTorch whose memory_stats lacks them
    ("the peak alone", {"requested_bytes.all.peak": 1400}),
    ("the current alone", {"requested_bytes.all.current": 900}),
]


@pytest.mark.parametrize(("case", "stats"), REQUESTED_PARTLY, ids=plain_ids(REQUESTED_PARTLY))
def test_the_products_run_once_more_say_null_requested_bytes_unless_both_counters_are_whole(case, stats):
    cpu = torch.device("cpu")
    _, _, per_call, _ = mesure_memoire.measure_phases(torch, StandInWithStats(stats, device=cpu), cpu, config())
    # the stand-in's peak allocated (1500) less its allocated (1000); requested bytes unknown, not a failure
    assert per_call == {product: {"allocated_bytes": 500, "requested_bytes": None} for product in ("fc1", "fc2")}


def test_summarize_output_of_a_real_tensor():
    summary = mesure_memoire.summarize_output(torch, torch.tensor([[0.5, 0.25], [1.0, -2.0]], dtype=torch.float16))
    assert summary == {"all_finite": True, "checksum_float64": -0.25, "elements": 4}
    assert type(summary["elements"]) is int
    assert type(summary["checksum_float64"]) is float
    not_finite = {"all_finite": False, "checksum_float64": None, "elements": 2}
    assert mesure_memoire.summarize_output(torch, torch.tensor([float("inf"), float("nan")])) == not_finite


# --- measure_phases: the device and dtype of every tensor it creates ------------------------------------


class DeviceRecordingTorch:
    """The real torch module, except that Generator and randn record the device they are given and then
    run on the CPU: a stand-in, because no GPU can be had here, so that a device argument left out
    (which on the CPU would still work) fails the test."""

    def __init__(self, seen):
        self.seen = seen

    def __getattr__(self, name):
        return getattr(torch, name)

    def Generator(self, device=None):  # noqa: N802 -- torch's name
        self.seen.append(("Generator", device))
        return torch.Generator(device="cpu")

    def randn(self, shape, generator=None, device=None, dtype=None):
        self.seen.append(("randn", shape, device, dtype, generator is not None))
        return torch.randn(shape, generator=generator, device="cpu", dtype=dtype)


def test_measure_phases_puts_the_model_and_inputs_on_the_measured_device(monkeypatch):
    from conftest import RecordingCudaStandIn

    seen = []
    real_build_model = mesure_memoire.build_model

    def build_model(torch_module, width):
        model = real_build_model(torch, width)
        real_to = model.to

        def to(*args, **kwargs):
            seen.append(("to", args, kwargs))
            return real_to(device="cpu", dtype=kwargs.get("dtype"))

        model.to = to
        return model

    monkeypatch.setattr(mesure_memoire, "build_model", build_model)
    settings = config(batch=2, context=3, width=4, dtype="bfloat16", warmup=2, repeats=3, seed=5)
    recorder = RecordingCudaStandIn(device="cuda:7 stand-in")
    ticks = iter(range(0, 10**6, 7))  # each phase reads the clock twice: 7 ns apart
    records, summary, _, _ = mesure_memoire.measure_phases(
        DeviceRecordingTorch(seen), recorder, "cuda:7 stand-in", settings, clock=lambda: next(ticks)
    )
    assert [r["nanoseconds"] for r in records] == [7] * 7
    assert seen == [
        ("to", (), {"device": "cuda:7 stand-in", "dtype": torch.bfloat16}),
        ("Generator", "cuda:7 stand-in"),
        ("randn", (2, 3, 4), "cuda:7 stand-in", torch.bfloat16, True),
    ]
    assert {device for _, device in recorder.devices} == {"cuda:7 stand-in"}
    assert [(r["phase"], r.get("passes"), r.get("repetition")) for r in records] == [
        ("model_load", None, None),
        ("inputs", None, None),
        ("cold_forward", None, None),
        ("warmup", 2, None),
        ("warm_forward", None, 1),
        ("warm_forward", None, 2),
        ("warm_forward", None, 3),
    ]
    # The seeds: the weights from torch.manual_seed, the inputs from their own generator.
    torch.manual_seed(5)
    model = real_build_model(torch, 4).to(dtype=torch.bfloat16).eval()
    inputs = torch.randn((2, 3, 4), generator=torch.Generator().manual_seed(5), dtype=torch.bfloat16)
    with torch.inference_mode():
        expected = model(inputs)
    assert summary == mesure_memoire.summarize_output(torch, expected)
    assert summary["elements"] == 24


class Raising:
    """Any attribute read (or str()) raises: a stand-in for a PyTorch query that fails."""

    def __getattr__(self, name):
        raise RuntimeError(f"{name} broke")

    def __str__(self):
        raise RuntimeError("version broke")


def test_each_failing_query_before_the_gpu_is_named_and_left_null(stand_in_gpu, monkeypatch):
    stand_in_gpu()
    monkeypatch.setattr(torch, "__version__", Raising())
    monkeypatch.setattr(torch.backends.cuda, "matmul", Raising())
    monkeypatch.setattr(torch.backends, "cudnn", Raising())
    monkeypatch.setattr(torch, "version", Raising())

    def broken():
        raise RuntimeError("count broke")

    monkeypatch.setattr(torch.cuda, "is_available", broken)
    monkeypatch.setattr(torch.cuda, "device_count", broken)
    environment = mesure_memoire.collect_environment("cuda:0", False)
    assert environment["field_errors"] == {
        "torch": MESSAGES["withheld text"].format(name="torch", expected="a version"),  # not text
        "cuda_matmul_allow_tf32": "RuntimeError (text withheld)",
        "cuda_matmul_allow_fp16_reduced_precision_reduction": "RuntimeError (text withheld)",
        "cuda_matmul_allow_bf16_reduced_precision_reduction": "RuntimeError (text withheld)",
        "cuda_build": "RuntimeError (text withheld)",
        "hip_build": "RuntimeError (text withheld)",
        "cudnn_or_miopen_version": "RuntimeError (text withheld)",
        "cuda_available": "RuntimeError (text withheld)",
        "device_count": "RuntimeError (text withheld)",
    }
    assert environment["torch"] is environment["cuda_build"] is environment["hip_build"] is None
    assert environment["device_count"] is None
    assert environment["gpu_available"] is False
    assert environment["gpu_unavailable_reason"] == MESSAGES["no CUDA or ROCm build"]
    for key in (
        "cuda_matmul_allow_tf32",
        "cuda_matmul_allow_fp16_reduced_precision_reduction",
        "cuda_matmul_allow_bf16_reduced_precision_reduction",
    ):
        assert environment["settings"][key] is None
