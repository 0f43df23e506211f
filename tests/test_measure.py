"""`mesure_memoire.py measure`: refusals, the protocol's order, the result's schema, the atomic write.

No GPU can be had here.  Refusals run for real against the CPU build of PyTorch.  Where the
GPU path must be exercised, the tests name their stand-ins: ``stand_in_gpu`` (conftest) for
the device queries, and ``RecordingCudaStandIn`` for the allocator counters, while the model,
the inputs and the forward passes are the real PyTorch ones, run on the CPU.
"""

import errno
import io
import json
import os
import re
import signal
import stat
import subprocess
import sys
import time
import warnings
import weakref
from datetime import datetime, timezone
from decimal import Decimal

import pytest
import torch

import mesure_memoire
from conftest import (
    BLOCK_NUMPY,
    GIB,
    MEASURE,
    MESURE_SCRIPT,
    MIB,
    MINE,
    ROOT,
    RecordingCudaStandIn,
    assert_one_line,
    assert_one_line_refusal,
    config,
    kit_error_of,
    raising,
    run_in_process,
    run_script,
    sigint_as_from_a_terminal,
    tree_digest,
)

SMALL_TRIAL = ["--device", "cuda:0", "--batch", "1", "--context", "16", "--width", "64", "--dtype", "float32",
               "--warmup", "1", "--repeats", "2"]  # fmt: skip

# What measure_phases measures after the phases on a GPU whose BLAS workspaces are kept: no per-call workspace.
NO_PER_CALL = {"allocated_bytes": 0, "requested_bytes": 0}

# PyTorch warnings recorded by earlier tests would show in field_errors: each test starts from none.
pytestmark = pytest.mark.usefixtures("no_earlier_warnings")


# --- refusals, for real (CPU build of PyTorch, or none) -------------------------------------------


def test_no_gpu_is_refused_without_cpu_fallback(tmp_path):
    completed = run_script("mesure_memoire.py", "measure", *SMALL_TRIAL, "--output", "out.json", cwd=tmp_path)
    assert_one_line_refusal(completed, "no usable GPU for cuda:0", "no CPU fallback")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.whole_kit
def test_no_torch_is_refused(tmp_path):
    completed = run_script(
        "mesure_memoire.py", "measure", *SMALL_TRIAL, "--output", "out.json", cwd=tmp_path, python_flags=("-S",)
    )
    assert_one_line_refusal(completed, "PyTorch is not importable")
    assert list(tmp_path.iterdir()) == []


def test_an_existing_output_is_refused_first_and_stays_byte_identical(tmp_path):
    existing = tmp_path / "mesures.json"
    existing.write_bytes(b'{"mine": true}\n')
    completed = run_script("mesure_memoire.py", "measure", *SMALL_TRIAL, "--output", "mesures.json", cwd=tmp_path)
    assert_one_line_refusal(completed, "already exists", "never overwritten")
    assert existing.read_bytes() == b'{"mine": true}\n'
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mesures.json"]


def test_a_missing_output_folder_is_refused(tmp_path):
    completed = run_script("mesure_memoire.py", "measure", *SMALL_TRIAL, "--output", "nowhere/out.json", cwd=tmp_path)
    assert_one_line_refusal(completed, "does not exist")
    assert list(tmp_path.iterdir()) == []


def test_missing_required_options_are_refused(tmp_path):
    assert_one_line_refusal(run_script("mesure_memoire.py", "measure", "--device", "cuda:0", cwd=tmp_path), "--output")
    assert_one_line_refusal(run_script("mesure_memoire.py", "measure", "--output", "x.json", cwd=tmp_path), "--device")
    assert list(tmp_path.iterdir()) == []


# --- refusals and failures past the device checks (stand-in GPU) ----------------------------------


def test_stand_in_device_index_out_of_range_is_refused(stand_in_gpu, tmp_path, capsys):
    stand_in_gpu(count=1)
    code = mesure_memoire.main(["measure", "--device", "cuda:1", "--output", str(tmp_path / "o.json")])
    assert code == 2
    assert "cuda:1 is out of range" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


def test_stand_in_unsupported_bfloat16_is_refused(stand_in_gpu, tmp_path, capsys):
    stand_in_gpu(bf16=False)
    code = mesure_memoire.main(
        ["measure", "--device", "cuda:0", "--dtype", "bfloat16", "--output", str(tmp_path / "o.json")]
    )
    assert code == 2
    assert "--dtype bfloat16: bfloat16 is not supported" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    ("option", "value"), [("--width", "1000000"), ("--batch", "100000000000"), ("--context", "999999999999")]
)
def test_stand_in_absurd_sizes_are_refused_cleanly(stand_in_gpu, tmp_path, capsys, option, value):
    stand_in_gpu(total_memory=80 * 2**30)
    code = mesure_memoire.main(["measure", "--device", "cuda:0", option, value, "--output", str(tmp_path / "o.json")])
    assert code == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and "shrink" in err
    assert list(tmp_path.iterdir()) == []


def _stand_in_measurement(monkeypatch, recorder):
    """Route measure() through the real CPU model with a recording stand-in for the counters."""
    real_measure_phases = mesure_memoire.measure_phases
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: False)
    monkeypatch.setattr(torch.cuda, "set_device", lambda device: None)
    monkeypatch.setattr(torch.cuda, "init", lambda: None)
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda device: 0)
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda device: 0)
    assert recorder.device == torch.device("cpu")  # the real model runs on the CPU

    def on_the_cpu(torch_module, cuda, device, config):
        assert device == torch.device("cuda", mesure_memoire.device_index(config["device"]))
        return real_measure_phases(torch_module, recorder, torch.device("cpu"), config)

    monkeypatch.setattr(mesure_memoire, "measure_phases", on_the_cpu)


def test_stand_in_out_of_memory_exits_3_naming_phase_and_configuration(stand_in_gpu, monkeypatch, tmp_path, capsys):
    error = torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
    _stand_in_measurement(
        monkeypatch, RecordingCudaStandIn(fail_on_synchronize=(8, error), device=torch.device("cpu"))
    )  # warmup's end
    output = tmp_path / "o.json"
    assert mesure_memoire.main(["measure", *SMALL_TRIAL, "--output", str(output)]) == 3
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1
    assert "out of memory in phase warmup" in err[0] and "batch 1, context 16, width 64, dtype float32" in err[0]
    assert "shrink one dimension" in err[0]
    assert list(tmp_path.iterdir()) == []


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
        "synchronize", "memory_allocated", "memory_reserved", "memory_stats", "reset_peak_memory_stats",
        "current_stream", "Event", "Event", "clock", "event.record", "work", "event.record", "synchronize", "clock",
        "elapsed_time", "memory_allocated", "memory_reserved", "max_memory_allocated", "max_memory_reserved",
        "memory_stats",
    ]  # fmt: skip
    assert {device for _, device in recorder.devices} == {"dev"}  # every call names the measured device
    assert output == "output"
    assert record == {
        "phase": "inputs", "nanoseconds": 250, "seconds": 250e-9, "device_ms": 0.25,
        "baseline_allocated_bytes": 1000, "baseline_reserved_bytes": 2000, "end_allocated_bytes": 1000,
        "end_reserved_bytes": 2000, "peak_allocated_bytes": 1500, "peak_reserved_bytes": 2500,
        "baseline_requested_bytes": 900, "end_requested_bytes": 900, "peak_requested_bytes": 1400,
        "baseline_device_used_bytes": None, "end_device_used_bytes": None,  # this stand-in has no mem_get_info
    }  # fmt: skip


def test_run_phase_without_requested_counters_or_events_says_null():
    recorder = RecordingCudaStandIn(requested=False, events=False)
    record, _ = mesure_memoire.run_phase(recorder, "dev", "inputs", lambda: None)
    assert record["device_ms"] is None
    assert record["baseline_requested_bytes"] is record["end_requested_bytes"] is record["peak_requested_bytes"] is None
    assert "Event" not in [name for name, _ in recorder.calls]


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


@pytest.mark.parametrize(("warmup", "repeats"), [(1, 2), (3, 2), (0, 1)])
def test_stand_in_counters_real_cpu_model_phases_and_output_lifetimes(forward_outputs, warmup, repeats):
    outputs, live_before_each_pass = forward_outputs
    recorder = RecordingCudaStandIn(
        observe=lambda: sum(ref() is not None for ref in outputs), device=torch.device("cpu")
    )
    records, summary, _ = mesure_memoire.measure_phases(
        torch, recorder, torch.device("cpu"), config(warmup=warmup, repeats=repeats)
    )

    expected = ["model_load", "inputs", "cold_forward"] + (["warmup"] if warmup else []) + ["warm_forward"] * repeats
    assert (
        [r["phase"] for r in records] == expected == mesure_memoire.phase_names(config(warmup=warmup, repeats=repeats))
    )
    assert len(records) == (6 if (warmup, repeats) == (1, 2) else 3 + bool(warmup) + repeats)
    assert [r["repetition"] for r in records if r["phase"] == "warm_forward"] == list(range(1, repeats + 1))
    assert [r.get("passes") for r in records if r["phase"] == "warmup"] == ([warmup] if warmup else [])
    for record in records:
        assert set(mesure_memoire.PHASE_MEMORY_FIELDS) <= set(record)
        assert record["seconds"] > 0 and record["nanoseconds"] > 0
        assert record["device_ms"] == 0.25 and record["end_requested_bytes"] == 900

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
    # The summary is of the last output, after the phases: the real CPU output, seeded.
    assert summary["elements"] == 1 * 16 * 64 and summary["all_finite"] is True
    torch.manual_seed(0)
    model = mesure_memoire.build_model(torch, 64).eval()
    generator = torch.Generator().manual_seed(0)
    with torch.inference_mode():
        last = model(torch.randn((1, 16, 64), generator=generator))
    assert summary["checksum_float64"] == float(last.double().sum())


def test_synthetic_model_matches_the_real_pytorch_model():
    for dtype in mesure_memoire.DTYPE_BYTES:
        summary = mesure_memoire.synthetic_model(config(width=48, batch=3, context=5, dtype=dtype))
        model = mesure_memoire.build_model(torch, 48).to(dtype=getattr(torch, dtype))  # the model measure runs
        assert [type(layer).__name__ for layer in model] == ["Linear", "GELU", "Linear"]
        real = {name: (list(p.shape), p.numel() * p.element_size()) for name, p in model.named_parameters()}
        assert {t["name"]: (t["shape"], t["bytes"]) for t in summary["parameter_tensors"]} == real
        assert summary["parameters"] == sum(p.numel() for p in model.parameters()) == 8 * 48 * 48 + 5 * 48
        assert summary["parameter_bytes"] == sum(b for _, b in real.values())
        element = torch.empty((), dtype=getattr(torch, dtype)).element_size()
        assert summary["input_bytes"] == summary["output_bytes"] == 3 * 5 * 48 * element
        assert summary["hidden_width"] == 192


def test_stand_in_result_schema_written_atomically_and_read_back(stand_in_gpu, monkeypatch, tmp_path, capsys):
    _stand_in_measurement(monkeypatch, RecordingCudaStandIn(device=torch.device("cpu")))
    output = tmp_path / "mesures-petit-essai.json"
    assert mesure_memoire.main(["measure", *SMALL_TRIAL, "--output", str(output)]) == 0
    out = capsys.readouterr().out
    result = json.loads(output.read_text(encoding="utf-8"))
    assert set(result) == {"kit", "schema_version", "tool", "created_utc", "environment", "configuration",
                           "synthetic_model", "phases", "prediction_check", "workspace", "output_summary",
                           "predicted_peak_allocated_bytes", "fit_margin_bytes", "matmul_arithmetic",
                           "torch_version_warning"}  # fmt: skip
    assert result["schema_version"] == 4 and result["tool"] == "mesure_memoire.py"
    assert result["torch_version_warning"] is None  # this PyTorch's version reads as MAJOR.MINOR
    assert result["created_utc"].endswith("Z")
    assert result["environment"]["gpu"]["name"] == "Stand-in GPU"
    assert result["environment"]["settings"]["cublas_workspace_size_bytes"] == 8 * 2**20 + 128 * 2**10
    assert result["environment"]["settings"]["allocator_backend"] == "native"
    assert result["configuration"] == {
        "device": "cuda:0", "batch": 1, "context": 16, "width": 64, "dtype": "float32", "warmup": 1,
        "repeats": 2, "seed": 0, "cuda_initialized_before_measure": False, "allocated_bytes_before_measure": 0,
        "reserved_bytes_before_measure": 0, "device_used_bytes_before_measure": 2**30, "fresh_process_warning": None,
    }  # fmt: skip
    assert result["synthetic_model"]["parameters"] == 8 * 64 * 64 + 5 * 64
    assert [p["phase"] for p in result["phases"]] == [
        "model_load", "inputs", "cold_forward", "warmup", "warm_forward", "warm_forward"
    ]  # fmt: skip
    plan = mesure_memoire.predict_memory(config())
    for record, predicted in zip(result["phases"], plan["phases"], strict=True):
        assert record["device_ms"] == 0.25
        assert (record["baseline_requested_bytes"], record["end_requested_bytes"], record["peak_requested_bytes"]) == (
            900,
            900,
            1400,
        )
        assert {k: record["predicted"][k] for k in mesure_memoire.PREDICTED_COUNTERS} == {
            k: predicted[k] for k in mesure_memoire.PREDICTED_COUNTERS
        }
        # The stand-in's fixed counters cannot match a prediction: every phase disagrees, visibly.
        assert record["verdict"] == "disagrees" and record["disagreements"]
    disagreements = result["prediction_check"]["disagreements"]
    assert result["prediction_check"]["agrees"] is False
    assert disagreements == [d for record in result["phases"] for d in record["disagreements"]]
    inputs_end = next(d for d in disagreements if d["phase"] == "inputs" and d["counter"] == "end_requested_bytes")
    assert inputs_end == {"phase": "inputs", "repetition": None, "counter": "end_requested_bytes",
                          "predicted_bytes": 4096, "measured_bytes": 0, "difference_bytes": -4096,
                          "relative_to": "the phase's baseline"}  # fmt: skip
    assert result["workspace"]["measured_bytes"] == 0 - 4096  # end minus baseline, less the predicted output
    assert result["output_summary"]["elements"] == 16 * 64 and result["output_summary"]["all_finite"] is True
    assert result["predicted_peak_allocated_bytes"] == plan["predicted_peak_allocated_bytes"]
    assert "STANDIN-UUID" not in output.read_text()
    assert [p.name for p in tmp_path.iterdir()] == [output.name]  # no temporary file left
    lines = out.splitlines()
    assert lines[0].split() == ["phase", "ms", "device", "ms", "end", "alloc", "MiB", "peak", "alloc", "MiB", "peak",
                                "reserved", "MiB", "prediction"]  # fmt: skip
    assert (
        lines[1].startswith("model_load")
        and lines[4].startswith("warmup x1")
        and lines[6].startswith("warm_forward #2")
    )
    assert all(line.rstrip().endswith("DISAGREES") for line in lines[1:7])
    marked = [line for line in lines if line.startswith("DISAGREES ")]
    assert len(marked) == len(disagreements)
    assert (
        "DISAGREES inputs: end_requested_bytes above baseline measured 0, predicted 4096 (difference -4096 bytes)"
        in (lines)
    )
    assert lines[-1] == f"Result written to {output}"


# --- the atomic, never-overwriting write -----------------------------------------------------------


def test_a_crash_before_the_result_is_linked_leaves_no_file(tmp_path, monkeypatch):
    target = tmp_path / "r.json"

    def crash(source, destination):
        raise KeyboardInterrupt  # the process is interrupted after the data, before the name

    monkeypatch.setattr(os, "link", crash)
    with pytest.raises(KeyboardInterrupt):
        mesure_memoire.write_new_file(str(target), '{"whole": true}\n')
    assert list(tmp_path.iterdir()) == []


def test_a_crash_while_writing_leaves_no_file(tmp_path, monkeypatch):
    def crash(descriptor):
        raise OSError("disk full")

    monkeypatch.setattr(os, "fsync", crash)
    with pytest.raises(OSError):
        mesure_memoire.write_new_file(str(tmp_path / "r.json"), "x" * 100_000)
    assert list(tmp_path.iterdir()) == []


def test_a_file_that_appears_meanwhile_is_not_overwritten(tmp_path, monkeypatch):
    target = tmp_path / "r.json"
    real_link = os.link

    def someone_else_writes_first(source, destination):
        target.write_text("theirs")
        real_link(source, destination)

    monkeypatch.setattr(os, "link", someone_else_writes_first)
    with pytest.raises(mesure_memoire.KitError, match="appeared"):
        mesure_memoire.write_new_file(str(target), "ours")
    assert target.read_text() == "theirs"
    assert [p.name for p in tmp_path.iterdir()] == ["r.json"]


def test_the_written_file_is_whole_and_exact(tmp_path):
    target = tmp_path / "r.json"
    mesure_memoire.write_new_file(str(target), '{"a": 1}\n')
    assert target.read_bytes() == b'{"a": 1}\n'


# --- no traceback after validation: a failure injected at each step -----------------------------


def _boom(*args, **kwargs):
    raise RuntimeError("CUDA error: unspecified launch failure in /opt/secret/libcuda.so")


@pytest.mark.parametrize(
    ("step", "dtype", "exit_code", "fragment"),
    [
        ("is_initialized", "float32", 2, "torch.cuda.is_initialized failed on cuda:0"),
        ("get_device_capability", "float16", 2, "the dtype probe failed on cuda:0"),
        ("is_bf16_supported", "bfloat16", 2, "the dtype probe failed on cuda:0"),
        ("set_device", "float32", 2, "torch.cuda.set_device failed on cuda:0"),
        ("init", "float32", 2, "torch.cuda.init failed on cuda:0"),
        ("memory_allocated", "float32", 2, "torch.cuda.memory_allocated failed on cuda:0"),
        ("memory_reserved", "float32", 2, "torch.cuda.memory_reserved failed on cuda:0"),
        ("manual_seed", "float32", 2, "seeding failed"),
        ("a phase", "float32", 3, "phase inputs failed (batch 1, context 16, width 64, dtype float32)"),
        ("events", "float32", 3, "phase model_load failed"),
        ("the output summary", "float32", 3, "phase output_summary failed"),
    ],
)
def test_a_failure_at_each_step_is_one_line_and_writes_nothing(
    stand_in_gpu, monkeypatch, tmp_path, capsys, step, dtype, exit_code, fragment
):
    recorder = RecordingCudaStandIn(device=torch.device("cpu"))
    if step == "a phase":
        recorder = RecordingCudaStandIn(device=torch.device("cpu"), fail_on_synchronize=(4, RuntimeError("bad")))
    _stand_in_measurement(monkeypatch, recorder)
    if step in ("is_initialized", "get_device_capability", "is_bf16_supported", "set_device", "init",
                "memory_allocated", "memory_reserved"):  # fmt: skip
        monkeypatch.setattr(torch.cuda, step, _boom)
    elif step == "manual_seed":
        monkeypatch.setattr(torch, "manual_seed", _boom)
    elif step == "events":
        recorder.Event = _boom
    elif step == "the output summary":
        monkeypatch.setattr(mesure_memoire, "summarize_output", _boom)
    arguments = ["measure", *SMALL_TRIAL, "--output", str(tmp_path / "o.json")]
    arguments[arguments.index("--dtype") + 1] = dtype
    assert mesure_memoire.main(arguments) == exit_code
    captured = capsys.readouterr()
    lines = captured.err.splitlines()
    assert len(lines) == 1 and fragment in lines[0], captured.err
    assert "Traceback" not in captured.err and "/opt/secret" not in captured.err and captured.out == ""
    assert list(tmp_path.iterdir()) == []


def test_a_nan_output_shows_in_the_summary():
    summary = mesure_memoire.summarize_output(torch, torch.tensor([[1.0, float("nan")], [2.0, 3.0]]))
    assert summary == {"all_finite": False, "checksum_float64": None, "elements": 4}
    summary = mesure_memoire.summarize_output(torch, torch.tensor([0.1, 0.2, 0.3], dtype=torch.bfloat16))
    assert summary["all_finite"] is True and summary["elements"] == 3
    assert summary["checksum_float64"] == sum(float(v) for v in torch.tensor([0.1, 0.2, 0.3], dtype=torch.bfloat16))


def test_the_measure_command_prints_the_table_the_warning_and_the_name(monkeypatch, capsys):
    calls = []
    result = {
        "configuration": {"fresh_process_warning": "not a fresh\nprocess"},
        "torch_version_warning": None,
        "phases": [{"phase": "inputs", "nanoseconds": 10**6, "device_ms": None, "end_allocated_bytes": 0,
                    "peak_allocated_bytes": 0, "peak_reserved_bytes": 0, "verdict": "agrees"}],
    }  # fmt: skip

    def measure_to_file(configuration, output, tool):
        calls.append((configuration, output, tool))
        return result

    monkeypatch.setattr(mesure_memoire, "measure_to_file", measure_to_file)
    arguments = ["measure", "--device", "cuda:2", "--batch", "4", "--output", "out\tname.json"]
    assert mesure_memoire.main(arguments) == 0
    captured = capsys.readouterr()
    assert calls == [(config(device="cuda:2", batch=4), "out\tname.json", "mesure_memoire.py")]
    assert captured.err == "mesure_memoire.py: warning: not a fresh\\nprocess\n"
    assert captured.out == mesure_memoire.format_phase_table(result) + "\nResult written to 'out\\tname.json'\n"
    result["torch_version_warning"] = "an unreadable version"
    assert mesure_memoire.main(["measure", "--device", "cuda:0", "--output", "both.json"]) == 0
    assert capsys.readouterr().err == (
        "mesure_memoire.py: warning: not a fresh\\nprocess\nmesure_memoire.py: warning: an unreadable version\n"
    )
    result["configuration"]["fresh_process_warning"] = result["torch_version_warning"] = None
    assert mesure_memoire.main(["measure", "--device", "cuda:0", "--output", "plain name.json"]) == 0
    captured = capsys.readouterr()
    assert captured.err == "" and captured.out.endswith("\nResult written to plain name.json\n")


# --- the phase table ---------------------------------------------------------------------------------

PHASE_TABLE_RESULT = {
    "phases": [
        {"phase": "model_load", "nanoseconds": 1234500, "device_ms": None, "end_allocated_bytes": 9 * 2**17,
         "peak_allocated_bytes": 3 * MIB, "peak_reserved_bytes": 2 * MIB, "verdict": "agrees"},
        {"phase": "warmup", "passes": 3, "nanoseconds": 10**6, "device_ms": 0.25, "end_allocated_bytes": 0,
         "peak_allocated_bytes": 5 * 2**18, "peak_reserved_bytes": GIB, "verdict": "disagrees"},
        {"phase": "warm_forward", "repetition": 2, "nanoseconds": 999, "device_ms": 12.3456,
         "end_allocated_bytes": 512, "peak_allocated_bytes": 512, "peak_reserved_bytes": MIB},
    ],
    "prediction_check": {"disagreements": [
        {"phase": "warmup", "repetition": None, "counter": "peak_allocated_bytes", "measured_bytes": 1536,
         "predicted_bytes": 1024, "difference_bytes": 512},
        {"phase": "warm_forward", "repetition": 2, "counter": "end_requested_bytes", "measured_bytes": 0,
         "predicted_bytes": 4, "difference_bytes": -4},
    ]},
    "workspace": {"measured_bytes": 8519680, "per_call_allocated_bytes": MIB},
    "output_summary": {"elements": 1024, "all_finite": True, "checksum_float64": -1.25},
}  # fmt: skip

# Half-up everywhere: 1.2345 ms -> 1.235, 1.125 MiB -> 1.13 (half-even would write 1.234 and 1.12).
PHASE_TABLE_TEXT = """\
phase               ms  device ms  end alloc MiB  peak alloc MiB  peak reserved MiB   prediction
model_load       1.235        n/a           1.13            3.00               2.00       agrees
warmup x3        1.000      0.250           0.00            1.25            1024.00    DISAGREES
warm_forward #2  0.001     12.346           0.00            0.00               1.00  not checked
DISAGREES warmup: peak_allocated_bytes above baseline measured 1536, predicted 1024 (difference +512 bytes)
DISAGREES warm_forward #2: end_requested_bytes above baseline measured 0, predicted 4 (difference -4 bytes)
BLAS workspace measured: 8519680 bytes allocated by the first forward beyond the prediction
BLAS workspace per call: 1048576 bytes taken and given back by one matrix product, allowed at each forward's peak
Last output: 1024 elements, all finite, float64 checksum -1.25"""


def test_the_phase_table_exactly():
    assert mesure_memoire.format_phase_table(PHASE_TABLE_RESULT) == PHASE_TABLE_TEXT


def test_the_phase_table_names_each_reason_a_phase_was_not_checked_once():
    reasons = ["the first reason", "the second reason", "the first reason"]
    phases = [
        dict(phase, verdict="not checked", verdict_reason=reason)
        for phase, reason in zip(PHASE_TABLE_RESULT["phases"], reasons, strict=True)
    ]
    lines = mesure_memoire.format_phase_table(dict(PHASE_TABLE_RESULT, phases=phases)).splitlines()
    assert lines[6:8] == ["Not checked: the first reason", "Not checked: the second reason"]
    assert lines[8].startswith("BLAS workspace measured")


def test_the_phase_table_without_workspace_checksum_or_checks():
    result = dict(PHASE_TABLE_RESULT, prediction_check=None, workspace={"measured_bytes": None},
                  output_summary={"elements": 4, "all_finite": False, "checksum_float64": None})  # fmt: skip
    lines = mesure_memoire.format_phase_table(result).splitlines()
    assert lines[:4] == PHASE_TABLE_TEXT.splitlines()[:4]
    assert lines[4:] == ["Last output: 4 elements, NOT ALL FINITE"]
    result = dict(result, workspace=None, output_summary=None)
    assert mesure_memoire.format_phase_table(result).splitlines() == lines[:4]


def test_a_phase_label_shows_a_repetition_and_passes_only_when_set():
    label = mesure_memoire._phase_label
    assert label({"phase": "warm_forward", "repetition": 2}) == "warm_forward #2"
    assert label({"phase": "warmup", "passes": 3, "repetition": None}) == "warmup x3"
    assert label({"phase": "warmup", "passes": 0}) == "warmup x0"
    assert label({"phase": "inputs", "repetition": None, "passes": None}) == "inputs"


def test_the_table_aligns_the_first_column_left_and_the_others_right():
    assert mesure_memoire._table([("a", "bb", "c"), ("ccc", "d", "")]) == "a    bb  c\nccc   d"


def test_in_units_rounds_half_up_in_gib_by_default_or_mib():
    assert mesure_memoire.in_units(2**27) == "0.13"  # 0.125: half-even would say 0.12
    assert mesure_memoire.in_units(3 * 2**28) == "0.75"
    assert mesure_memoire.in_units(0) == "0.00"
    assert mesure_memoire.in_units(2**19, MIB) == "0.50" and mesure_memoire.in_units(2**9, MIB, 3) == "0.000"
    assert mesure_memoire.in_units(2**10 + 2**9, MIB, 3) == "0.001"  # 0.00146...: rounded at the third place


# --- the dtype probe and the host memory --------------------------------------------------------------


@pytest.mark.parametrize(
    ("dtype", "capability", "hip", "bf16", "expected"),
    [
        ("bfloat16", (9, 0), None, False, "bfloat16 is not supported natively by this GPU"),
        ("bfloat16", (9, 0), None, True, None),
        ("float16", (5, 2), None, True, "float16 arithmetic needs compute capability 5.3 or newer"),
        ("float16", (5, 3), None, True, None),
        ("float16", (5, 2), "7.0", True, None),  # ROCm: every supported GPU has float16
        ("float32", (3, 0), None, False, None),
    ],
)
def test_the_dtype_probe(monkeypatch, dtype, capability, hip, bf16, expected):
    seen = []

    class Device:
        def __init__(self, index):
            seen.append(("device", index))

        def __enter__(self):
            return self

        def __exit__(self, *exc_info):
            return False

    def is_bf16_supported(including_emulation=True):
        seen.append(("is_bf16_supported", including_emulation))
        return bf16

    def get_device_capability(index):
        seen.append(("get_device_capability", index))
        return capability

    monkeypatch.setattr(torch.cuda, "device", Device)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", is_bf16_supported)
    monkeypatch.setattr(torch.cuda, "get_device_capability", get_device_capability)
    monkeypatch.setattr(torch.version, "hip", hip)
    assert mesure_memoire._dtype_problem(torch, 2, dtype) == expected
    if dtype == "bfloat16":
        assert seen[:2] == [("device", 2), ("is_bf16_supported", False)]  # emulation does not count
    assert ("get_device_capability", 2) in seen or hip is not None or (dtype == "bfloat16" and not bf16)


def test_the_host_memory_is_pages_times_page_size(monkeypatch):
    asked = []

    def sysconf(name):
        asked.append(name)
        return {"SC_PAGE_SIZE": 4096, "SC_PHYS_PAGES": 1000}[name]

    monkeypatch.setattr(mesure_memoire.os, "sysconf", sysconf)
    assert mesure_memoire._host_memory_bytes() == 4096000
    assert sorted(asked) == ["SC_PAGE_SIZE", "SC_PHYS_PAGES"]
    for error in (ValueError, OSError, AttributeError):

        def unknown(name, error=error):
            raise error(name)

        monkeypatch.setattr(mesure_memoire.os, "sysconf", unknown)
        assert mesure_memoire._host_memory_bytes() is None


# --- measure(): every refusal's words, the devices it names, the result it returns ---------------------


class SetUpCalls:
    """Stand-ins for the torch.cuda set-up calls of measure(), recording the device each names."""

    def __init__(self, monkeypatch, allocated=0, reserved=0):
        self.calls = []
        for name, answer in [("is_initialized", lambda: True), ("init", lambda: None)]:
            monkeypatch.setattr(torch.cuda, name, self.recording(name, answer, with_device=False))
        for name, answer in [("set_device", lambda: None), ("memory_allocated", lambda: allocated),
                             ("memory_reserved", lambda: reserved)]:  # fmt: skip
            monkeypatch.setattr(torch.cuda, name, self.recording(name, answer, with_device=True))

    def recording(self, name, answer, with_device):
        def call(*args):
            self.calls.append((name, *args))
            assert len(args) == with_device, (name, args)
            return answer()

        return call


def agreeing_records(settings):
    """Records whose counters equal the prediction (as a real GPU without a BLAS workspace would)."""
    records, level = [], 0
    for predicted in mesure_memoire.predict_memory(settings)["phases"]:
        record = {"phase": predicted["phase"], "nanoseconds": 1000, "seconds": 1e-6, "device_ms": 0.001}
        record.update({key: predicted[key] for key in ("passes", "repetition") if key in predicted})
        record["baseline_allocated_bytes"] = record["baseline_requested_bytes"] = level
        record["baseline_reserved_bytes"] = record["end_reserved_bytes"] = record["peak_reserved_bytes"] = 2**21
        for counter in mesure_memoire.PREDICTED_COUNTERS:
            record[counter] = level + predicted[counter]
        if predicted["phase"] in ("model_load", "inputs"):
            level += predicted["end_allocated_bytes"]
        records.append(record)
    return records


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
    set_up = SetUpCalls(monkeypatch)
    settings = config(device="cuda:2", batch=2, context=3, width=8, warmup=2, repeats=1)
    seen = []
    # Put back after the test; a flag every supported PyTorch has.
    monkeypatch.setattr(torch.backends.cuda.matmul, "allow_fp16_reduced_precision_reduction", False)

    def measure_phases(torch_module, cuda, device, configuration):
        seen.append((torch_module, cuda, device, configuration))
        torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction = True  # changed while the forwards run
        return agreeing_records(settings), {"all_finite": True, "checksum_float64": 0.5, "elements": 48}, NO_PER_CALL

    monkeypatch.setattr(mesure_memoire, "measure_phases", measure_phases)
    result = mesure_memoire.measure(settings, tool="a tool")
    device = torch.device("cuda", 2)
    assert seen == [(torch, torch.cuda, device, settings)]
    assert set_up.calls == [("is_initialized",), ("set_device", device), ("init",), ("memory_allocated", device),
                            ("memory_reserved", device)]  # fmt: skip
    assert re.fullmatch(r"20[0-9]{2}-[01][0-9]-[0-3][0-9]T[0-2][0-9]:[0-5][0-9]:[0-6][0-9]Z", result["created_utc"])
    created = datetime.strptime(result["created_utc"], "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=timezone.utc)
    assert before <= created <= datetime.now(timezone.utc)  # UTC, not the local time five hours ahead
    plan = mesure_memoire.predict_memory(settings)
    assert result["environment"]["device"] == "cuda:2" and result["environment"]["gpu_available"] is True
    assert {key: result[key] for key in result if key not in ("created_utc", "environment", "phases")} == {
        "kit": "iteragpu-lab-v1", "schema_version": 4, "tool": "a tool", "torch_version_warning": None,
        "matmul_arithmetic": mesure_memoire.matmul_arithmetic(torch),
        "configuration": {**settings, "cuda_initialized_before_measure": True, "allocated_bytes_before_measure": 0,
                          "reserved_bytes_before_measure": 0, "device_used_bytes_before_measure": GIB,
                          "fresh_process_warning": None},
        "synthetic_model": mesure_memoire.synthetic_model(settings),
        "prediction_check": {"agrees": True, "disagreements": [], "not_checked": []},
        "workspace": {"measured_bytes": 0, "requested_bytes": 0,
                      "how": "cold_forward's end level above its baseline, less its predicted output: what the "
                      "first forward leaves allocated beyond the prediction (the BLAS workspaces, mostly)",
                      "allowance_bytes": 256 * MIB, "per_call_allocated_bytes": 0, "per_call_requested_bytes": 0,
                      "per_call_how": "each matrix product of the forward run once more after the phases, alone: "
                      "its peak above its end, what one call takes and gives back (a BLAS workspace allocated per "
                      "call); a forward's peaks may exceed their prediction by up to this"},
        "output_summary": {"all_finite": True, "checksum_float64": 0.5, "elements": 48},
        "predicted_peak_allocated_bytes": plan["predicted_peak_allocated_bytes"], "fit_margin_bytes": GIB,
    }  # fmt: skip
    assert [record["verdict"] for record in result["phases"]] == ["agrees"] * 5
    # The result's flags are read once the forwards ran, the environment's before.
    assert result["matmul_arithmetic"]["allow_fp16_reduced_precision_reduction"] is True
    assert result["environment"]["matmul_arithmetic"]["allow_fp16_reduced_precision_reduction"] is False


@pytest.mark.parametrize(("allocated", "reserved"), [(512, 0), (0, 2**21), (1, 1)])
def test_measure_warns_when_the_process_already_held_gpu_memory(stand_in_gpu, monkeypatch, allocated, reserved):
    stand_in_gpu()
    SetUpCalls(monkeypatch, allocated=allocated, reserved=reserved)
    settings = config()
    monkeypatch.setattr(mesure_memoire, "measure_phases", lambda *args: (agreeing_records(settings), {}, NO_PER_CALL))
    configuration = mesure_memoire.measure(settings, tool="t")["configuration"]
    assert (configuration["allocated_bytes_before_measure"], configuration["reserved_bytes_before_measure"]) == (
        allocated, reserved
    )  # fmt: skip
    assert configuration["fresh_process_warning"] == (
        "PyTorch already held GPU memory in this process before the measurement: this is not a fresh process and "
        "the figures are not comparable; restart it"
    )


@pytest.mark.parametrize(
    ("backend", "text", "verdict"),
    [
        ("native", "roundup_power2_divisions:4", "disagrees"),
        ("cudaMallocAsync", "backend:cudaMallocAsync", "not checked"),
    ],
)
def test_measure_checks_its_prediction_under_the_settings_pytorch_parsed(
    stand_in_gpu, monkeypatch, backend, text, verdict
):
    stand_in_gpu()
    SetUpCalls(monkeypatch)
    monkeypatch.setattr(torch.cuda.memory, "get_allocator_backend", lambda: backend)
    # A stand-in for PyTorch 2.13's text, with no snapshot (as on a CPU build; a CUDA build's is asked first).
    monkeypatch.delattr(torch.cuda.memory, "_snapshot", raising=False)
    monkeypatch.setattr(torch._C, "_accelerator_getAllocatorSettings", lambda: text, raising=False)
    settings = config(batch=5, context=77, width=3000)  # no tensor a power of two: 4 divisions round each up
    records = agreeing_records(settings)  # the default rounding's figures: too small for every phase under 4
    monkeypatch.setattr(mesure_memoire, "measure_phases", lambda *args: (records, {}, NO_PER_CALL))
    result = mesure_memoire.measure(settings, tool="t")
    assert result["environment"]["allocator_settings"]["backend"] == backend
    # One plan, under the settings recorded: the peak the file states is the one the phases were checked by.
    modelled = mesure_memoire.predict_memory(settings, result["environment"]["allocator_settings"])
    assert result["predicted_peak_allocated_bytes"] == modelled["predicted_peak_allocated_bytes"]
    assert {phase["verdict"] for phase in result["phases"]} == {verdict}


# --- the PyTorch release: 2.4 or later, read from the version's leading digits --------------------------

UNREADABLE = "is not MAJOR.MINOR...: measured as if it were 2.4 or later"


@pytest.mark.parametrize(
    ("version", "warning"),
    [
        ("2.4.1", None),
        ("2.4.0a0+git1234567", None),  # a vendor build (NVIDIA's containers read like this)
        ("2.8.0+rocm6.3", None),
        ("2.10.0", None),  # two digits: 2.10 is newer than 2.4, as numbers
        ("3.0", None),
        ("nightly", f"PyTorch's version 'nightly' {UNREADABLE}"),
        ("2", f"PyTorch's version '2' {UNREADABLE}"),
        ("v2.4.1", f"PyTorch's version 'v2.4.1' {UNREADABLE}"),
        (None, f"PyTorch's version None {UNREADABLE}"),  # the version query failed
    ],
)
def test_a_pytorch_release_is_read_from_its_leading_digits(version, warning):
    assert mesure_memoire.torch_release_warning(version) == warning


@pytest.mark.parametrize("version", ["2.3.1", "2.3.0a0+81ea7a4", "1.13.1+cu117", "0.4.1"])
def test_a_pytorch_below_2_4_is_refused_naming_both_versions(version):
    assert kit_error_of(mesure_memoire.torch_release_warning, version) == (
        f"PyTorch 2.4 or later is needed to measure; this is PyTorch {version!r}: nothing measured"
    )


def test_measure_refuses_an_old_pytorch_before_any_gpu_work(stand_in_gpu, monkeypatch, folder, capsys):
    stand_in_gpu()
    SetUpCalls(monkeypatch)
    monkeypatch.setattr(torch, "__version__", "2.3.1")
    monkeypatch.setattr(mesure_memoire, "measure_phases", lambda *args: pytest.fail("the phases ran"))
    code, captured = run_in_process(capsys, folder, [*MEASURE, "--output", "o.json"])
    assert code == 2
    assert_one_line(captured.err, "PyTorch 2.4 or later is needed to measure; this is PyTorch '2.3.1'")


def test_an_unreadable_pytorch_version_is_measured_with_a_warning_in_the_result(stand_in_gpu, monkeypatch):
    stand_in_gpu()
    SetUpCalls(monkeypatch)
    monkeypatch.setattr(torch, "__version__", "custom-build")
    monkeypatch.setattr(mesure_memoire, "measure_phases", lambda *args: (agreeing_records(config()), {}, NO_PER_CALL))
    result = mesure_memoire.measure(config(), tool="t")
    assert result["torch_version_warning"] == f"PyTorch's version 'custom-build' {UNREADABLE}"
    assert mesure_memoire.result_warnings(result) == [result["torch_version_warning"]]


def measure_refusal(settings):
    with pytest.raises(mesure_memoire.KitError) as refusal:
        mesure_memoire.measure(settings, tool="t")
    return refusal.value


def test_measure_refusals_word_for_word(stand_in_gpu, monkeypatch):
    monkeypatch.setattr(mesure_memoire, "import_torch", lambda: (None, "ImportError: gone"))
    refusal = measure_refusal(config())
    assert str(refusal) == "PyTorch is not importable (ImportError: gone): nothing measured, no file written"
    assert refusal.exit_code == 2
    monkeypatch.undo()
    stand_in_gpu(count=1)
    SetUpCalls(monkeypatch)
    assert str(measure_refusal(config(device="cuda:1"))) == (
        "no usable GPU for cuda:1: cuda:1 is out of range: PyTorch sees 1 device(s); "
        "nothing measured, no CPU fallback, no file written"
    )
    stand_in_gpu(bf16=False)
    assert str(measure_refusal(config(dtype="bfloat16"))) == (
        "--dtype bfloat16: bfloat16 is not supported natively by this GPU (Stand-in GPU)"
    )
    stand_in_gpu(total_memory=GIB)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda index: (GIB, GIB))
    plan = mesure_memoire.predict_memory(config())
    assert str(measure_refusal(config())) == mesure_memoire.fit_problem(plan, {"gpu": {"mem_get_info_free_bytes": GIB}})
    stand_in_gpu()
    monkeypatch.setattr(mesure_memoire, "_host_memory_bytes", lambda: 8 * 64 * 64 * 4 + 5 * 64 * 4 - 1)
    assert str(measure_refusal(config())) == (
        "building the model on the CPU needs 0.00 GiB, more than this machine's 0.00 GiB of RAM: shrink --width"
    )
    monkeypatch.setattr(mesure_memoire, "_host_memory_bytes", lambda: 8 * 64 * 64 * 4 + 5 * 64 * 4)
    monkeypatch.setattr(mesure_memoire, "measure_phases", lambda *args: (agreeing_records(config()), {}, NO_PER_CALL))
    assert mesure_memoire.measure(config(), tool="t")["tool"] == "t"  # exactly enough RAM
    monkeypatch.setattr(mesure_memoire, "_host_memory_bytes", lambda: None)  # unknown: not checked
    assert mesure_memoire.measure(config(), tool="t")["tool"] == "t"


def test_a_set_up_failure_is_a_refusal_naming_the_step_and_device(stand_in_gpu, monkeypatch):
    stand_in_gpu(count=2)
    SetUpCalls(monkeypatch)

    def fails(*args):
        raise RuntimeError("CUDA error: busy")

    monkeypatch.setattr(torch.cuda, "init", fails)
    refusal = measure_refusal(config(device="cuda:1"))
    assert (
        str(refusal)
        == "torch.cuda.init failed on cuda:1: RuntimeError: CUDA error: busy; nothing measured, no file written"
    )
    assert refusal.exit_code == 2 and refusal.__cause__ is None and refusal.__suppress_context__


@pytest.mark.parametrize(
    ("error", "message"),
    [
        (torch.OutOfMemoryError("CUDA out of memory. Tried"),
         "out of memory in phase warmup (batch 1, context 16, width 64, dtype float32) on cuda:0: nothing written; "
         "shrink one dimension and retry in a new process"),
        (RuntimeError("HIP: Out Of Memory"),
         "out of memory in phase warmup (batch 1, context 16, width 64, dtype float32) on cuda:0: nothing written; "
         "shrink one dimension and retry in a new process"),
        (RuntimeError("launch failure at /opt/x/y.so"),
         "phase warmup failed (batch 1, context 16, width 64, dtype float32): RuntimeError: launch failure at "
         "<path>; nothing written"),
    ],
)  # fmt: skip
def test_a_failed_phase_exits_3_with_its_words(stand_in_gpu, monkeypatch, error, message):
    stand_in_gpu()
    SetUpCalls(monkeypatch)

    def measure_phases(*args):
        raise mesure_memoire.PhaseFailed("warmup", error)

    monkeypatch.setattr(mesure_memoire, "measure_phases", measure_phases)
    with pytest.raises(mesure_memoire.MeasurementFailed) as failure:
        mesure_memoire.measure(config(), tool="t")
    assert str(failure.value) == message and failure.value.exit_code == 3
    assert failure.value.__cause__ is None and failure.value.__suppress_context__


def test_phase_failed_keeps_the_phase_and_the_error():
    error = RuntimeError("x")
    failed = mesure_memoire.PhaseFailed("inputs", error)
    assert (failed.phase, failed.error, failed.args) == ("inputs", error, ("inputs", error))


# --- small pure parts ----------------------------------------------------------------------------------


def test_requested_reads_only_whole_counters():
    requested = mesure_memoire._requested
    stats = {"requested_bytes.all.current": 5, "requested_bytes.all.peak": 9, "requested_bytes.all.freed": 1.5}
    assert (requested(stats, "current"), requested(stats, "peak"), requested(stats, "freed")) == (5, 9, None)
    assert requested({}, "current") is None and requested(None, "current") is None
    assert requested(["requested_bytes.all.current"], "current") is None


def test_summarize_output_of_a_real_tensor():
    summary = mesure_memoire.summarize_output(torch, torch.tensor([[0.5, 0.25], [1.0, -2.0]], dtype=torch.float16))
    assert summary == {"all_finite": True, "checksum_float64": -0.25, "elements": 4}
    assert type(summary["elements"]) is int and type(summary["checksum_float64"]) is float
    assert mesure_memoire.summarize_output(torch, torch.tensor([float("inf")]))["all_finite"] is False


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
    records, summary, _ = mesure_memoire.measure_phases(
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
        ("model_load", None, None), ("inputs", None, None), ("cold_forward", None, None), ("warmup", 2, None),
        ("warm_forward", None, 1), ("warm_forward", None, 2), ("warm_forward", None, 3),
    ]  # fmt: skip
    # The seeds: the weights from torch.manual_seed, the inputs from their own generator.
    torch.manual_seed(5)
    model = real_build_model(torch, 4).to(dtype=torch.bfloat16).eval()
    inputs = torch.randn((2, 3, 4), generator=torch.Generator().manual_seed(5), dtype=torch.bfloat16)
    with torch.inference_mode():
        expected = model(inputs)
    assert summary == mesure_memoire.summarize_output(torch, expected) and summary["elements"] == 24


def test_a_failing_seed_is_a_refusal_and_a_failing_phase_names_itself(monkeypatch):
    from conftest import RecordingCudaStandIn

    class NoSeed(DeviceRecordingTorch):
        def manual_seed(self, seed):
            raise RuntimeError("seed refused")

    with pytest.raises(mesure_memoire.KitError) as refusal:
        mesure_memoire.measure_phases(NoSeed([]), RecordingCudaStandIn(), "dev", config())
    assert str(refusal.value) == "seeding failed: RuntimeError: seed refused; nothing measured, no file written"
    assert refusal.value.__cause__ is None and refusal.value.__suppress_context__
    error = RuntimeError("bad")
    recorder = RecordingCudaStandIn(device=torch.device("cpu"), fail_on_synchronize=(6, error))  # cold_forward
    with pytest.raises(mesure_memoire.PhaseFailed) as failure:
        mesure_memoire.measure_phases(torch, recorder, torch.device("cpu"), config())
    assert (failure.value.phase, failure.value.error) == ("cold_forward", error)
    assert failure.value.__cause__ is error
    summary_error = ValueError("no summary")
    monkeypatch.setattr(mesure_memoire, "summarize_output", raising(summary_error))
    with pytest.raises(mesure_memoire.PhaseFailed) as failure:
        mesure_memoire.measure_phases(torch, RecordingCudaStandIn(device=torch.device("cpu")), torch.device("cpu"),
                                      config())  # fmt: skip
    assert (failure.value.phase, failure.value.error) == ("output_summary", summary_error)


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
    environment = mesure_memoire.collect_environment("cuda:0")
    assert environment["field_errors"] == {
        "torch": "RuntimeError: version broke",
        "cuda_matmul_allow_tf32": "RuntimeError: allow_tf32 broke",
        "cudnn_allow_tf32": "RuntimeError: allow_tf32 broke",
        "cuda_matmul_allow_fp16_reduced_precision_reduction": (
            "RuntimeError: allow_fp16_reduced_precision_reduction broke"
        ),
        "cuda_matmul_allow_bf16_reduced_precision_reduction": (
            "RuntimeError: allow_bf16_reduced_precision_reduction broke"
        ),
        "cuda_build": "RuntimeError: cuda broke",
        "hip_build": "RuntimeError: hip broke",
        "cudnn_or_miopen_version": "RuntimeError: version broke",
        "cuda_available": "RuntimeError: count broke",
        "device_count": "RuntimeError: count broke",
    }
    assert environment["torch"] is environment["cuda_build"] is environment["hip_build"] is None
    assert environment["device_count"] is None and environment["gpu_available"] is False
    assert environment["gpu_unavailable_reason"] == "this PyTorch build has no CUDA or ROCm support"
    for key in ("cuda_matmul_allow_tf32", "cudnn_allow_tf32", "cuda_matmul_allow_fp16_reduced_precision_reduction",
                "cuda_matmul_allow_bf16_reduced_precision_reduction"):  # fmt: skip
        assert environment["settings"][key] is None


class StandInOutOfMemory(Exception):
    """A stand-in for PyTorch's out-of-memory error class, whose message does not say "out of memory"."""


@pytest.mark.parametrize("where", ["torch.cuda", "torch", "neither"])
def test_the_out_of_memory_class_is_looked_up_where_pytorch_keeps_it(stand_in_gpu, monkeypatch, where):
    stand_in_gpu()
    SetUpCalls(monkeypatch)
    error = StandInOutOfMemory("allocation refused") if where != "neither" else MemoryError("allocation refused")
    if where == "torch.cuda":
        monkeypatch.setattr(torch.cuda, "OutOfMemoryError", StandInOutOfMemory, raising=False)
    else:
        monkeypatch.delattr(torch.cuda, "OutOfMemoryError", raising=False)
    if where == "torch":
        monkeypatch.setattr(torch, "OutOfMemoryError", StandInOutOfMemory)
    elif where == "neither":
        monkeypatch.delattr(torch, "OutOfMemoryError")

    def measure_phases(*args):
        raise mesure_memoire.PhaseFailed("inputs", error)

    monkeypatch.setattr(mesure_memoire, "measure_phases", measure_phases)
    with pytest.raises(mesure_memoire.MeasurementFailed) as failure:
        mesure_memoire.measure(config(), tool="t")
    assert str(failure.value).startswith("out of memory in phase inputs (batch 1, context 16, width 64, dtype float32)")


def test_a_model_too_large_for_the_host_memory_is_refused_with_both_figures(stand_in_gpu, monkeypatch):
    stand_in_gpu()
    SetUpCalls(monkeypatch)
    monkeypatch.setattr(mesure_memoire, "_host_memory_bytes", lambda: GIB)
    # 8 * 8192**2 + 5 * 8192 parameters, built in float32 first: 2147647488 bytes.
    assert str(measure_refusal(config(width=8192))) == (
        "building the model on the CPU needs 2.00 GiB, more than this machine's 1.00 GiB of RAM: shrink --width"
    )


def test_device_index_reads_the_number_after_cuda():
    assert (
        mesure_memoire.device_index("cuda:0") == 0
        and mesure_memoire.device_index("cuda:12") == 12
        and mesure_memoire.device_index("cuda:9999") == 9999
    )
    for device in ("cuda:10000", "cuda:", "cpu", 0, None, "CUDA:0"):
        assert (
            kit_error_of(mesure_memoire.device_index, device)
            == f"--device: expected cuda:N (for example cuda:0), got {device!r}"
        )


def test_measure_config_validates_each_option_by_its_name():
    seed = str(mesure_memoire.MAX_SEED)
    assert mesure_memoire.measure_config("cuda:3", "2", "3", "4", "bfloat16", "0", "1", seed) == {
        "device": "cuda:3", "batch": 2, "context": 3, "width": 4, "dtype": "bfloat16", "warmup": 0, "repeats": 1,
        "seed": 2**64 - 1,
    }  # fmt: skip
    assert mesure_memoire.measure_config("cuda:0", 1, 1, 1, "float16", 0, 1, 0)["seed"] == 0
    good = ["cuda:0", 1, 1, 1, "float32", 0, 1, 0]
    positive = "a positive whole number of at most 30 ASCII digits, no leading zero, got 0"
    for index, option in ((1, "--batch"), (2, "--context"), (3, "--width")):
        args = list(good)
        args[index] = 0
        assert kit_error_of(mesure_memoire.measure_config, *args) == f"{option}: expected {positive}"
    bounded = "in ASCII digits, no leading zero (a measurement is a short, bounded trial), got"
    for index, option, low, bad in ((5, "--warmup", 0, -1), (6, "--repeats", 1, 0), (5, "--warmup", 0, 1001)):
        args = list(good)
        args[index] = bad
        assert kit_error_of(mesure_memoire.measure_config, *args) == (
            f"{option}: expected a whole number from {low} to 1000 {bounded} {bad}"
        )
    args[5], args[6] = 1000, 1000
    assert mesure_memoire.measure_config(*args)["warmup"] == 1000 == mesure_memoire.measure_config(*args)["repeats"]
    args = list(good)
    args[7] = -1
    assert kit_error_of(mesure_memoire.measure_config, *args) == (
        "--seed: expected a whole number from 0 to 18446744073709551615 in ASCII digits, no leading zero, got -1"
    )
    args = list(good)
    args[4] = "float64"
    assert (
        kit_error_of(mesure_memoire.measure_config, *args)
        == "--dtype: expected one of float32, float16, bfloat16, got 'float64'"
    )
    args = list(good)
    args[0] = "cuda"
    assert kit_error_of(mesure_memoire.measure_config, *args).startswith("--device: expected cuda:N")


# --- files: names, limits, temporary files, exclusive writes ---------------------------------------------------


def test_name_limits_ask_the_file_system_and_fall_back(tmp_path, monkeypatch):
    asked = []

    def pathconf(folder, name):
        asked.append((folder, name))
        return {"PC_NAME_MAX": 11, "PC_PATH_MAX": 22}[name]

    monkeypatch.setattr(os, "pathconf", pathconf)
    assert mesure_memoire._name_limits("here") == (11, 22)
    assert asked == [("here", "PC_NAME_MAX"), ("here", "PC_PATH_MAX")]
    for error in (AttributeError("no pathconf"), ValueError("unknown name"), OSError(errno.EINVAL, "no")):
        monkeypatch.setattr(os, "pathconf", raising(error))
        assert mesure_memoire._name_limits("here") == (255, 4096)


def test_check_new_output_bounds_the_name_and_the_path(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(os, "pathconf", lambda folder, name: {"PC_NAME_MAX": 10, "PC_PATH_MAX": 16}[name])
    assert mesure_memoire.check_new_output("n" * 10) == "n" * 10
    too_long = "--output: nnnnnnnnnnn is too long for this file system (names: 10 bytes)"
    assert kit_error_of(mesure_memoire.check_new_output, "n" * 11) == too_long
    os.mkdir("d")
    assert mesure_memoire.check_new_output("d/" + "p" * 9) == "d/" + "p" * 9  # 11 bytes of path
    assert mesure_memoire.check_new_output("./d/" + "p" * 10) == "./d/" + "p" * 10  # 14 bytes
    os.mkdir("dd")
    assert mesure_memoire.check_new_output("dd/" + "q" * 10) == "dd/" + "q" * 10  # 13 bytes
    os.makedirs("ddd/eee")
    assert kit_error_of(mesure_memoire.check_new_output, "ddd/eee/" + "r" * 10) == (  # 18 bytes of path
        "--output: ddd/eee/rrrrrrrrrr is too long for this file system (names: 10 bytes)"
    )
    assert sorted(os.listdir(tmp_path)) == ["d", "dd", "ddd"]  # the probe files are gone


def test_check_new_output_messages_are_whole(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "old.json").write_text("{}")
    (tmp_path / "f").write_text("")
    assert kit_error_of(mesure_memoire.check_new_output, "old.json") == (
        "--output: old.json already exists; choose a new name (results are never overwritten)"
    )
    assert kit_error_of(mesure_memoire.check_new_output, "a/..") == "--output: a/.. names a folder, not a new file"
    assert kit_error_of(mesure_memoire.check_new_output, "..") == "--output: .. names a folder, not a new file"
    assert (
        kit_error_of(mesure_memoire.check_new_output, "f/x.json") == "--output: the folder of f/x.json does not exist"
    )
    assert kit_error_of(mesure_memoire.check_new_output, "x\0.json") == (
        "--output: cannot create 'x\\x00.json': ValueError: embedded null character; nothing measured"
    )
    for empty in ("", "  ", None, b"x.json"):
        assert kit_error_of(mesure_memoire.check_new_output, empty) == "--output: a new file name is required"
    assert mesure_memoire.check_new_output("new.json") == "new.json" and sorted(os.listdir()) == ["f", "old.json"]


def test_check_new_output_probes_the_folder_and_removes_the_probe(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    os.mkdir("sub")
    assert mesure_memoire.check_new_output("sub/r.json") == "sub/r.json"
    assert mesure_memoire.check_new_output("r.json") == "r.json"
    assert os.listdir("sub") == [], "the probe is removed"
    assert sorted(os.listdir(".")) == ["sub"], "the probe is removed"

    def no_room(folder):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(mesure_memoire, "_create_temporary", no_room)
    assert kit_error_of(mesure_memoire.check_new_output, "r.json") == (
        "--output: cannot create r.json: OSError: [Errno 28] No space left on device; nothing measured"
    )


def test_write_exclusively_never_overwrites_and_removes_a_partial_file(tmp_path, monkeypatch):
    target = str(tmp_path / "r.json")
    mesure_memoire._write_exclusively(target, b"first")
    with pytest.raises(FileExistsError):
        mesure_memoire._write_exclusively(target, b"second")
    assert (tmp_path / "r.json").read_bytes() == b"first"

    def fsync_fails(descriptor):
        raise OSError(errno.EIO, "I/O error")

    monkeypatch.setattr(os, "fsync", fsync_fails)
    with pytest.raises(OSError, match="I/O error"):
        mesure_memoire._write_exclusively(str(tmp_path / "s.json"), b"data")
    assert sorted(os.listdir(tmp_path)) == ["r.json"]


def test_write_new_file_writes_utf8_and_refuses_a_name_taken_meanwhile(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    mesure_memoire.write_new_file("é.json", "é\n")
    assert (tmp_path / "é.json").read_bytes() == "é\n".encode()

    def taken(source, destination):
        raise FileExistsError(errno.EEXIST, "File exists")

    monkeypatch.setattr(os, "link", taken)
    assert (
        kit_error_of(mesure_memoire.write_new_file, "x.json", "{}")
        == "--output: x.json appeared meanwhile; nothing overwritten"
    )
    (tmp_path / "y.json").write_bytes(b"theirs")
    monkeypatch.setattr(os, "link", raising(OSError(errno.EPERM, "no")))
    assert (
        kit_error_of(mesure_memoire.write_new_file, "y.json", "{}")
        == "--output: y.json appeared meanwhile; nothing overwritten"
    )
    assert (tmp_path / "y.json").read_bytes() == b"theirs"
    mesure_memoire.write_new_file("z.json", "zz")  # no hard links: the exclusive create
    assert (tmp_path / "z.json").read_bytes() == b"zz"
    assert sorted(os.listdir(tmp_path)) == ["y.json", "z.json", "é.json"]  # no temporary left


def test_the_temporary_file_is_made_beside_the_result(tmp_path, monkeypatch):
    """In the result's own folder: the final link (or rename) stays on one file system."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "sub").mkdir()
    folders = []
    real_create_temporary = mesure_memoire._create_temporary

    def create_temporary(folder):
        folders.append(folder)
        return real_create_temporary(folder)

    monkeypatch.setattr(mesure_memoire, "_create_temporary", create_temporary)
    mesure_memoire.write_new_file("sub/r.json", "{}")
    mesure_memoire.write_new_file("r.json", "{}")
    assert folders == ["sub", "."]
    assert sorted(os.listdir(tmp_path)) == ["r.json", "sub"] and os.listdir(tmp_path / "sub") == ["r.json"]


def test_write_new_file_tolerates_a_temporary_removed_by_someone_else(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    real_link = os.link

    def link_then_remove(source, destination):
        real_link(source, destination)
        os.unlink(source)

    monkeypatch.setattr(os, "link", link_then_remove)
    mesure_memoire.write_new_file("r.json", "{}\n")
    assert os.listdir(tmp_path) == ["r.json"]

    def other_unlink_error(path):
        raise PermissionError(errno.EACCES, "Permission denied")

    monkeypatch.setattr(os, "unlink", other_unlink_error)
    with pytest.raises(PermissionError):
        mesure_memoire.write_new_file("s.json", "{}\n")


def test_measure_to_file_records_warnings_and_writes_the_json(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(mesure_memoire, "PYTORCH_WARNINGS", [])

    def measured(config, tool):
        warnings.simplefilter("always")
        warnings.warn("from /x/y/z.py", UserWarning, stacklevel=1)
        return {"tool": tool, "environment": {"field_errors": {}}, "v": Decimal("0.5"), "c": config}

    monkeypatch.setattr(mesure_memoire, "measure", measured)
    result = mesure_memoire.measure_to_file({"k": 1}, "r.json", tool="t")
    assert result["environment"]["field_errors"] == {"pytorch_warnings": "UserWarning: from <path>"}
    assert (tmp_path / "r.json").read_text(encoding="utf-8") == mesure_memoire.to_json(result)
    assert json.loads((tmp_path / "r.json").read_text())["tool"] == "t"
    for environment in (None, {"field_errors": None}):
        monkeypatch.setattr(
            mesure_memoire, "measure", lambda config, tool, environment=environment: {"environment": environment}
        )
        name = f"n{len(os.listdir(tmp_path))}.json"
        assert mesure_memoire.measure_to_file({}, name, tool="t") == {"environment": environment}
    monkeypatch.setattr(
        mesure_memoire, "measure", lambda config, tool: pytest.fail("measured before checking the output")
    )
    assert kit_error_of(mesure_memoire.measure_to_file, {}, "r.json", "t").startswith("--output: r.json already exists")

    def full(path, text):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(mesure_memoire, "measure", lambda config, tool: {})
    monkeypatch.setattr(mesure_memoire, "write_new_file", full)
    assert kit_error_of(mesure_memoire.measure_to_file, {}, "new.json", "t") == (
        "--output: cannot write new.json: OSError: [Errno 28] No space left on device; nothing written"
    )


def test_main_without_arguments_reads_the_command_line(monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", ["mesure_memoire.py", "estimate", "--parameters", "8", "--bits", "8", "--json"])
    assert mesure_memoire.main() == 0
    assert json.loads(capsys.readouterr().out)["weight_bytes"] == 8


def test_say_writes_one_prefixed_line_and_survives_a_broken_stderr(capsys, monkeypatch):
    mesure_memoire.say("mesure_memoire.py", "a\nb")
    mesure_memoire.say("mesure_memoire.py", "c", prefix="warning: ")
    mesure_memoire.say("mesure_memoire.py", "d", prefix="")
    assert (
        capsys.readouterr().err
        == "mesure_memoire.py: error: a\\nb\nmesure_memoire.py: warning: c\nmesure_memoire.py: d\n"
    )

    class Broken:
        def __init__(self, error):
            self.error = error

        def write(self, text):
            raise self.error

    for error in (OSError(errno.EIO, "x"), ValueError("closed")):
        monkeypatch.setattr(sys, "stderr", Broken(error))
        mesure_memoire.say("mesure_memoire.py", "lost")  # nothing raised


def test_say_flushes_stderr(monkeypatch):
    flushed = []

    class Recording(io.StringIO):
        def flush(self):
            flushed.append(self.getvalue())

    monkeypatch.setattr(sys, "stderr", Recording())
    mesure_memoire.say("mesure_memoire.py", "x")
    assert flushed == ["mesure_memoire.py: error: x\n"]


def test_guarded_stdout_passes_through_and_tells_failures_apart():
    stream = io.StringIO()
    guarded = mesure_memoire.GuardedStdout(stream)
    assert guarded.write("abc") == 3 and guarded.getvalue() == "abc" and guarded.flush() is None
    with pytest.raises(mesure_memoire.StdoutFailed) as caught:
        mesure_memoire.GuardedStdout(None).write("x")
    assert caught.value.args == (None,)
    stream.close()
    with pytest.raises(mesure_memoire.StdoutFailed) as caught:
        guarded.write("x")
    assert isinstance(caught.value.args[0], ValueError) and caught.value.__suppress_context__

    class Full(io.StringIO):
        def flush(self):
            raise OSError(errno.ENOSPC, "No space left on device")

    with pytest.raises(mesure_memoire.StdoutFailed) as caught:
        mesure_memoire.GuardedStdout(Full()).flush()
    assert caught.value.args[0].errno == errno.ENOSPC


def test_stdout_failed_points_the_real_descriptor_at_devnull(tmp_path, monkeypatch, capsys):
    real_stdout = sys.__stdout__
    with open(tmp_path / "out.txt", "w") as stream:
        sys.__stdout__ = stream  # restored before the file closes: the test runner writes there between tests
        try:
            failure = mesure_memoire.StdoutFailed(OSError(errno.ENOSPC, "No space left on device"))
            code = mesure_memoire.stdout_failed("mesure_memoire.py", failure, stream)
        finally:
            sys.__stdout__ = real_stdout
        assert code == 1 and os.path.realpath(f"/proc/self/fd/{stream.fileno()}") == os.devnull
    assert capsys.readouterr().err == (
        "mesure_memoire.py: error: cannot write the output: OSError: [Errno 28] No space left on device\n"
    )
    with open(tmp_path / "other.txt", "w") as other:  # not the interpreter's stdout: left alone
        assert (
            mesure_memoire.stdout_failed(
                "mesure_memoire.py", mesure_memoire.StdoutFailed(BrokenPipeError(errno.EPIPE, "x")), other
            )
            == 1
        )
        assert os.path.realpath(f"/proc/self/fd/{other.fileno()}") == str(tmp_path / "other.txt")
    assert capsys.readouterr().err == ""
    assert mesure_memoire.stdout_failed("mesure_memoire.py", mesure_memoire.StdoutFailed(), None) == 1
    assert capsys.readouterr().err == "mesure_memoire.py: error: cannot write the output: standard output is closed\n"


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="this system has no /dev/full")
def test_main_points_the_interpreters_own_stdout_at_devnull_when_it_fails(monkeypatch, capsys):
    """So that the interpreter's last flush at exit cannot print a second error."""
    real_stdout = sys.__stdout__
    with open("/dev/full", "w") as full:
        monkeypatch.setattr(sys, "stdout", full)
        sys.__stdout__ = full  # restored before the file closes: the test runner writes there between tests
        try:
            code = mesure_memoire.main(["estimate", "--parameters", "1", "--bits", "8"])
        finally:
            sys.__stdout__ = real_stdout
        assert code == 1 and os.path.realpath(f"/proc/self/fd/{full.fileno()}") == os.devnull
    assert capsys.readouterr().err == (
        "mesure_memoire.py: error: cannot write the output: OSError: [Errno 28] No space left on device\n"
    )


def test_main_restores_stdout_and_returns_each_status(capsys, monkeypatch):
    stdout = sys.stdout
    assert mesure_memoire.main(["estimate", "--parameters", "1", "--bits", "1", "--json"]) == 0
    assert sys.stdout is stdout and json.loads(capsys.readouterr().out)["weight_bytes"] == 1

    def fails(args):
        raise mesure_memoire.MeasurementFailed("out of memory")

    monkeypatch.setattr(mesure_memoire, "estimate_weights", lambda *args: fails(args))
    assert mesure_memoire.main(["estimate", "--parameters", "1", "--bits", "1"]) == 3
    assert capsys.readouterr().err == "mesure_memoire.py: error: out of memory\n"
    assert sys.stdout is stdout


def test_a_stdout_that_fails_only_on_flush_is_one_line_and_exit_1(capsys, monkeypatch):
    written = []

    class FullOnFlush:
        def write(self, text):
            written.append(text)
            return len(text)

        def flush(self):
            raise OSError(errno.ENOSPC, "No space left on device")

    for argv in (["estimate", "--parameters", "1", "--bits", "1"], ["--help"]):
        monkeypatch.setattr(sys, "stdout", FullOnFlush())
        written.clear()
        assert mesure_memoire.main(argv) == 1
        assert written and capsys.readouterr().err == (
            "mesure_memoire.py: error: cannot write the output: OSError: [Errno 28] No space left on device\n"
        )


def test_ctrl_c_is_one_exact_line_and_status_130(capsys, monkeypatch):
    def interrupted(*args):
        raise KeyboardInterrupt

    monkeypatch.setattr(mesure_memoire, "estimate_weights", interrupted)
    assert mesure_memoire.main(["estimate", "--parameters", "1", "--bits", "1"]) == 130
    captured = capsys.readouterr()
    assert captured.err == "mesure_memoire.py: interrupted (Ctrl-C); no partial file left behind\n"
    assert captured.out == ""


def test_stdout_failed_survives_a_closed_interpreter_stdout(tmp_path, capsys):
    real_stdout = sys.__stdout__
    stream = open(tmp_path / "closed.txt", "w")  # noqa: SIM115 -- closed on purpose below
    stream.close()
    sys.__stdout__ = stream
    try:
        code = mesure_memoire.stdout_failed(
            "mesure_memoire.py", mesure_memoire.StdoutFailed(BrokenPipeError(errno.EPIPE, "x")), stream
        )
    finally:
        sys.__stdout__ = real_stdout
    assert code == 1 and capsys.readouterr().err == ""


def test_measure_to_file_adds_no_warning_field_when_none_was_raised(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(mesure_memoire, "PYTORCH_WARNINGS", [])
    monkeypatch.setattr(mesure_memoire, "measure", lambda config, tool: {"environment": {"field_errors": {}}})
    assert mesure_memoire.measure_to_file({}, "r.json", tool="t") == {"environment": {"field_errors": {}}}


def test_no_gpu_is_a_one_line_refusal_that_writes_nothing(folder, capsys):
    code, captured = run_in_process(capsys, folder, [*MEASURE, "--output", "o.json"])
    assert code == 2 and captured.out == ""
    assert_one_line(captured.err, "no usable GPU for cuda:0", "no file written")


def test_an_unwritable_folder_is_refused_before_any_gpu_work(folder, capsys, monkeypatch):
    real_open = os.open

    def read_only(path, flags, *args, **kwargs):
        if os.path.dirname(os.fspath(path)) == "sub" and flags & os.O_CREAT:
            raise PermissionError(errno.EROFS, "Read-only file system")
        return real_open(path, flags, *args, **kwargs)

    monkeypatch.setattr(os, "open", read_only)
    monkeypatch.setattr(mesure_memoire, "measure", lambda config, tool: pytest.fail("measured first"))
    code, captured = run_in_process(capsys, folder, [*MEASURE, "--output", "sub/o.json"])
    assert code == 2
    assert_one_line(captured.err, "--output: cannot create sub/o.json", "Read-only file system")


@pytest.mark.skipif(hasattr(os, "geteuid") and os.geteuid() == 0, reason="root writes into a 0555 folder anyway")
def test_a_read_only_folder_for_real(folder, capsys):
    (folder / "sub").chmod(stat.S_IRUSR | stat.S_IXUSR)
    try:
        code, captured = run_in_process(capsys, folder, [*MEASURE, "--output", "sub/o.json"])
    finally:
        (folder / "sub").chmod(stat.S_IRWXU)
    assert code == 2
    assert_one_line(captured.err, "--output: cannot create sub/o.json")


# --- a finished measurement (stand-in GPU) and its file --------------------------------------------


@pytest.fixture
def stand_in_measure(monkeypatch):
    """Replaces measure(), because no GPU can be had here: the real CPU model runs its phases with
    RecordingCudaStandIn counters; the result has measure()'s keys.  Proves nothing about GPUs."""
    calls = []

    def fake_measure(config, tool):
        calls.append(config)
        cpu = torch.device("cpu")
        phases, output_summary, _ = mesure_memoire.measure_phases(torch, RecordingCudaStandIn(device=cpu), cpu, config)
        return {
            "kit": mesure_memoire.KIT_NAME,
            "tool": tool,
            "environment": {"field_errors": {}, "gpu": {"total_memory_gib": Decimal(80)}},
            "configuration": {**config, "fresh_process_warning": None},
            "torch_version_warning": None,
            "synthetic_model": mesure_memoire.synthetic_model(config),
            "phases": phases,
            "output_summary": output_summary,
        }

    monkeypatch.setattr(mesure_memoire, "measure", fake_measure)
    return calls


def test_link_refused_with_eperm_falls_back_to_an_exclusive_create(folder, capsys, monkeypatch, stand_in_measure):
    def no_hard_links(source, destination):
        raise PermissionError(errno.EPERM, "Operation not permitted")

    monkeypatch.setattr(os, "link", no_hard_links)
    assert mesure_memoire.main([*MEASURE, "--output", "o.json", "--seed", str(2**64 - 1)]) == 0
    captured = capsys.readouterr()
    assert captured.err == "" and captured.out.endswith("Result written to o.json\n")
    result = json.loads((folder / "o.json").read_text(encoding="utf-8"))
    assert result["configuration"]["seed"] == 2**64 - 1 and len(result["phases"]) == 6
    assert sorted(os.listdir(folder)) == ["existing.json", "fifo", "o.json", "sub"]  # no temporary left


def test_the_written_name_and_the_warning_stay_one_line_each(folder, capsys, monkeypatch, stand_in_measure):
    real_measure = mesure_memoire.measure

    def not_fresh(config, tool):
        result = real_measure(config, tool)
        result["configuration"]["fresh_process_warning"] = "held memory\nbefore"
        return result

    monkeypatch.setattr(mesure_memoire, "measure", not_fresh)
    assert mesure_memoire.main([*MEASURE, "--output", "a\nb.json"]) == 0
    captured = capsys.readouterr()
    assert captured.err == "mesure_memoire.py: warning: held memory\\nbefore\n"
    assert captured.out.endswith("\nResult written to 'a\\nb.json'\n")
    assert (folder / "a\nb.json").is_file()


@pytest.mark.parametrize("umask", [0o022, 0o002, 0o077])
@pytest.mark.parametrize("hard_links", [True, False])
def test_the_result_file_respects_the_umask(folder, monkeypatch, umask, hard_links):
    if not hard_links:
        monkeypatch.setattr(os, "link", raising(OSError(errno.EPERM, "")))
    previous = os.umask(umask)
    try:
        mesure_memoire.write_new_file("r.json", "{}\n")
    finally:
        os.umask(previous)
    assert stat.S_IMODE(os.stat(folder / "r.json").st_mode) == 0o666 & ~umask


def test_a_failed_fallback_write_leaves_nothing_under_the_name(folder, monkeypatch):
    monkeypatch.setattr(os, "link", raising(OSError(errno.ENOTSUP, "")))
    real_fsync, calls = os.fsync, []

    def second_fsync_fails(descriptor):
        calls.append(descriptor)
        if len(calls) == 2:
            raise OSError(errno.ENOSPC, "No space left on device")
        real_fsync(descriptor)

    monkeypatch.setattr(os, "fsync", second_fsync_fails)
    before = tree_digest(folder)
    with pytest.raises(OSError, match="No space"):
        mesure_memoire.write_new_file("r.json", "{}\n")
    assert tree_digest(folder) == before


def test_a_full_disk_after_the_measurement_is_one_line(folder, capsys, monkeypatch, stand_in_measure):
    def disk_full(descriptor):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "fsync", disk_full)
    code, captured = run_in_process(capsys, folder, [*MEASURE, "--output", "o.json"])
    assert code == 2 and captured.out == ""
    assert_one_line(captured.err, "--output: cannot write o.json", "No space left on device", "nothing written")


@pytest.mark.parametrize("where", ["measure", "fsync", "link", "fallback"])
def test_ctrl_c_anywhere_in_measure_exits_130_and_leaves_no_file(folder, capsys, monkeypatch, stand_in_measure, where):
    def interrupt(*args):
        raise KeyboardInterrupt

    if where == "measure":
        monkeypatch.setattr(mesure_memoire, "measure", interrupt)
    elif where == "fsync":
        monkeypatch.setattr(os, "fsync", interrupt)
    elif where == "link":
        monkeypatch.setattr(os, "link", interrupt)
    else:  # no hard links, then Ctrl-C while the exclusive copy is written
        monkeypatch.setattr(os, "link", raising(OSError(errno.EPERM, "")))
        calls = []
        monkeypatch.setattr(os, "fsync", lambda fd: calls.append(fd) or (interrupt() if len(calls) == 2 else None))
    code, captured = run_in_process(capsys, folder, [*MEASURE, "--output", "o.json"])
    assert code == 130 and captured.out == ""
    assert_one_line(captured.err, "interrupted")


def test_measure_without_a_gpu_prints_exactly_one_stderr_line(tmp_path):
    completed = subprocess.run([sys.executable, "-c", BLOCK_NUMPY, MESURE_SCRIPT, *MEASURE, "--output", "o.json"],
                               capture_output=True, text=True, cwd=tmp_path, timeout=120)  # fmt: skip
    assert completed.returncode == 2
    assert_one_line(completed.stderr, "no usable GPU for cuda:0")
    assert list(tmp_path.iterdir()) == []


HOOKED = """
import os, sys, time
sys.path.insert(0, sys.argv[1])
import mesure_memoire
ready = int(sys.argv[2])
def blocked(*args, **kwargs):
    os.write(ready, b"r")
    time.sleep(60)
mesure_memoire.{function} = blocked
raise SystemExit(mesure_memoire.main(sys.argv[3:]))
"""


@pytest.mark.parametrize(
    ("function", "args"),
    [
        ("measure", [*MEASURE, "--output", "o.json"]),
    ],
)
def test_sigint_exits_130_in_one_line_and_leaves_no_file(tmp_path, function, args):
    (tmp_path / "existing.json").write_bytes(MINE)
    before = tree_digest(tmp_path)
    read_end, write_end = os.pipe()
    process = subprocess.Popen(
        [sys.executable, "-c", HOOKED.format(function=function), str(ROOT), str(write_end), *args],
        cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, pass_fds=(write_end,),
        preexec_fn=sigint_as_from_a_terminal,
    )  # fmt: skip
    os.close(write_end)
    try:
        assert os.read(read_end, 1) == b"r"  # the child is inside the command
        process.send_signal(signal.SIGINT)
        out, err = process.communicate(timeout=60)
    finally:
        os.close(read_end)
        process.kill()
    assert process.returncode == 130
    assert out == b""
    assert_one_line(err.decode(), "interrupted")
    assert tree_digest(tmp_path) == before


# measure() stood in for (no GPU here); the write blocks once its partial file exists.
WRITING = """
import os, sys, time
sys.path.insert(0, sys.argv[1])
import mesure_memoire
ready = int(sys.argv[2])
mesure_memoire.measure = lambda config, tool: {}
def blocked(descriptor):
    os.write(ready, b"r")
    time.sleep(60)
os.fsync = blocked
raise SystemExit(mesure_memoire.main(sys.argv[3:]))
"""


@pytest.mark.parametrize(("sent", "status", "said"), [(signal.SIGINT, 130, "Ctrl-C"), (signal.SIGTERM, 143, "SIGTERM")])
def test_a_signal_while_writing_removes_the_partial_file(tmp_path, sent, status, said):
    """SIGTERM (timeout, a scheduler, docker stop) is handled as Ctrl-C: the partial file goes, 128 + 15."""
    read_end, write_end = os.pipe()
    process = subprocess.Popen([sys.executable, "-c", WRITING, str(ROOT), str(write_end), *MEASURE, "--output",
                                "o.json"], cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               pass_fds=(write_end,), preexec_fn=sigint_as_from_a_terminal)  # fmt: skip
    os.close(write_end)
    try:
        assert os.read(read_end, 1) == b"r"  # the partial file is there, being written
        assert [path.name.startswith(".partial-") for path in tmp_path.iterdir()] == [True]
        process.send_signal(sent)
        out, err = process.communicate(timeout=60)
    finally:
        os.close(read_end)
        process.kill()
    assert (process.returncode, out) == (status, b"")
    assert err.decode() == f"mesure_memoire.py: interrupted ({said}); no partial file left behind\n"
    assert list(tmp_path.iterdir()) == []


@pytest.mark.whole_kit
def test_without_site_packages_measure_refuses_in_one_line(tmp_path):
    completed = run_script("mesure_memoire.py", *MEASURE, "--output", "o.json", cwd=tmp_path, python_flags=("-S",))
    assert completed.returncode == 2
    assert_one_line(completed.stderr, "PyTorch is not importable")
    assert list(tmp_path.iterdir()) == []


def test_a_closed_stderr_is_not_a_crash(folder, monkeypatch, capsys):
    monkeypatch.setattr(sys, "stderr", None)
    assert mesure_memoire.main(["estimate", "--parameters", "x", "--bits", "1"]) == 2
    assert capsys.readouterr().out == ""


def test_temporary_names_never_collide_and_limits_have_a_fallback(folder, monkeypatch):
    taken = folder / f".partial-{bytes(8).hex()}.tmp"
    taken.write_bytes(b"someone else's")
    draws = iter([bytes(8), bytes(8), b"\x01" * 8])
    monkeypatch.setattr(os, "urandom", lambda size: next(draws))
    mesure_memoire.write_new_file("r.json", "{}\n")
    assert (folder / "r.json").read_bytes() == b"{}\n"
    assert taken.read_bytes() == b"someone else's"
    assert [path.name for path in folder.glob(".partial-*")] == [taken.name]  # ours removed, theirs kept
    monkeypatch.setattr(os, "urandom", lambda size: bytes(8))
    with pytest.raises(FileExistsError):
        mesure_memoire.write_new_file("s.json", "{}\n")
    assert not (folder / "s.json").exists()
    taken.unlink()

    def no_pathconf(*args):
        raise OSError(errno.EINVAL, "Invalid argument")

    monkeypatch.setattr(os, "pathconf", no_pathconf)
    assert mesure_memoire._name_limits(".") == (255, 4096)
    with pytest.raises(mesure_memoire.KitError, match="too long"):
        mesure_memoire.check_new_output("n" * 256)
    assert mesure_memoire.check_new_output("n" * 255) == "n" * 255


def test_the_options_and_their_defaults_reach_measure_config(monkeypatch, capsys):
    seen = []
    monkeypatch.setattr(mesure_memoire, "measure_config", lambda *args: seen.append(args) or {})
    monkeypatch.setattr(mesure_memoire, "predict_memory", lambda config: {"plan": 1})
    assert mesure_memoire.main(["measure", "--device", "cuda:0", "--plan", "--json"]) == 0
    arguments = ["--device", "cuda:2", "--batch", "3", "--context", "4", "--width", "5", "--dtype", "float16",
                 "--warmup", "6", "--repeats", "7", "--seed", "8", "--plan", "--json"]  # fmt: skip
    assert mesure_memoire.main(["measure", *arguments]) == 0
    assert seen == [("cuda:0", "1", "16", "64", "float32", "1", "2", "0"),
                    ("cuda:2", "3", "4", "5", "float16", "6", "7", "8")]  # fmt: skip
    assert capsys.readouterr().out == '{\n  "plan": 1\n}\n' * 2


# Each command's help: its summary and every option's line, as the README documents them.
HELP_LINES = {
    "": ["usage: mesure_memoire.py [-h] COMMAND ...", "IteraGPU Lab v1: weight-memory estimate, environment",
         "    estimate   weight memory from a parameter count, no GPU",
         "               diagnose Python, PyTorch and the chosen GPU",
         "    measure    measure the synthetic MLP phase by phase on a GPU",
         "    sweep      measure one dimension at several values, each in a fresh process, then report",
         "    report     compare result files side by side, one row each; reads them, writes nothing",
         "mesure_memoire.py COMMAND --help prints a command's options."],
    "estimate": ["usage: mesure_memoire.py estimate [-h] --parameters N --bits N [--reserve-gib GIB] [--json]",
                 "  --parameters N     number of parameters, a positive integer",
                 "  --bits N           storage width per parameter in bits (4, 8, 16, 32 ...)",
                 "  --reserve-gib GIB  extra GiB you assume on top of the weights (a hypothesis; default 0)",
                 "  --json             print one JSON object instead of text"],
    "environment": ["usage: mesure_memoire.py environment [-h] --device cuda:N [--json]",
                    "diagnose Python, PyTorch and the chosen GPU", "  --device cuda:N  the GPU to inspect"],
    "measure": ["  --device cuda:N   the GPU to measure",
                "  --output FILE     new JSON file for the result (never overwritten); required unless --plan",
                "  --batch N         batch size (default 1)",
                "  --context N       positions per input row (default 16)",
                "  --width N         model width; the hidden layer is 4x (default 64)",
                "  --dtype NAME      float32, float16 or bfloat16 (default float32)",
                "  --warmup N        warm-up passes, 0 to 1000 (default 1)",
                "  --repeats N       measured warm passes, 1 to 1000 (default 2)",
                "  --seed N          seed of the weights and inputs (default 0)",
                "  --plan            predict the memory per phase: arithmetic only, no GPU, writes nothing",
                "  --json            with --plan: print one JSON object",
                "  --memory-gib GIB  with --plan: a card's memory in GiB; whether the run fits, and the largest"],
    "sweep": ["usage: mesure_memoire.py sweep [-h] --device cuda:N --vary DIMENSION --values V1,V2,... --output-dir",
              "measure one dimension at several values, each in a fresh process, then report",
              "  --vary DIMENSION      batch, context or width: the dimension that takes the values",
              "  --values V1,V2,...    strictly increasing whole numbers, separated by commas",
              "  --output-dir NEW_FOLDER", "                        a new folder (created; never an existing one)",
              "  --timeout-s SECONDS   a child still running after this many seconds is stopped (default 1800)"],
    "report": ["usage: mesure_memoire.py report [-h] [--json] FILE [FILE ...]",
               "  FILE        measure result files, in the order to show (after --, a name may start with -)",
               "  --json      print one JSON object instead of text"],
}  # fmt: skip


@pytest.mark.parametrize("command", HELP_LINES)
def test_each_help_lists_its_options_and_defaults(command, capsys):
    assert mesure_memoire.main([command, "--help"] if command else ["--help"]) == 0
    # Spacing and line breaks compared loosely: argparse's layout differs between Python versions (3.13
    # indents the commands and wraps the usage elsewhere); the words and their order are what is pinned.
    shown = " ".join(capsys.readouterr().out.split())
    for line in HELP_LINES[command]:
        assert " ".join(line.split()) in shown, line


# --- device-wide memory: mem_get_info outside the timed region (part "fit") --------------------------------


class DeviceWideCudaStandIn(RecordingCudaStandIn):
    """RecordingCudaStandIn with mem_get_info, because no GPU can be had here: each reading is recorded,
    names the measured device, and the free memory drops by 1 MiB per reading (so baseline and end differ)."""

    total_bytes = 80 * GIB

    def __init__(self, *args, fail=None, **kwargs):
        super().__init__(*args, **kwargs)
        self.readings, self.fail = 0, fail

    def mem_get_info(self, device):
        self._check("mem_get_info", device)
        if self.fail is not None:
            raise self.fail
        self.readings += 1
        return self._record("mem_get_info", (self.total_bytes - 2 * GIB - self.readings * MIB, self.total_bytes))


def test_the_device_wide_readings_are_taken_outside_the_timed_region_on_the_measured_device():
    recorder = DeviceWideCudaStandIn()
    clock = recording_clock(recorder, 100, 350)

    record, _ = mesure_memoire.run_phase(
        recorder, "dev", "inputs", lambda: recorder.calls.append(("work", None)), clock
    )
    names = [name for name, _ in recorder.calls]
    assert names[:2] == ["synchronize", "mem_get_info"]  # after the device is idle, before any other reading
    first_clock, last_clock = names.index("clock"), len(names) - 1 - names[::-1].index("clock")
    assert [i for i, name in enumerate(names) if name == "mem_get_info"] == [1, last_clock + 1]
    assert names[first_clock : last_clock + 1].count("mem_get_info") == 0  # none inside the timing
    assert ("mem_get_info", "dev") in recorder.devices and {device for _, device in recorder.devices} == {"dev"}
    assert (record["baseline_device_used_bytes"], record["end_device_used_bytes"]) == (2 * GIB + MIB, 2 * GIB + 2 * MIB)
    assert record["nanoseconds"] == 250


def test_a_device_wide_reading_on_another_device_fails_and_a_runtime_error_leaves_null():
    with pytest.raises(AssertionError, match="mem_get_info"):
        mesure_memoire.device_used_bytes(DeviceWideCudaStandIn(device="dev"), "other")
    failing = DeviceWideCudaStandIn(fail=RuntimeError("CUDA error: not supported"))
    record, _ = mesure_memoire.run_phase(failing, "dev", "inputs", lambda: None)
    assert record["baseline_device_used_bytes"] is record["end_device_used_bytes"] is None
    assert record["end_allocated_bytes"] == 1000  # the phase itself is measured as usual
    assert mesure_memoire.device_used_bytes(RecordingCudaStandIn(), "dev") is None  # no such API


def test_the_result_records_the_device_wide_memory_once_cuda_is_initialised(stand_in_gpu, monkeypatch):
    stand_in_gpu(count=3)
    set_up = SetUpCalls(monkeypatch)
    settings = config(device="cuda:2")

    def mem_get_info(index):
        set_up.calls.append(("mem_get_info", index))
        return (70 * GIB, 80 * GIB) if index == 2 else (0, 80 * GIB)

    monkeypatch.setattr(torch.cuda, "mem_get_info", mem_get_info)
    monkeypatch.setattr(mesure_memoire, "measure_phases", lambda *args: (agreeing_records(settings), {
        "all_finite": True, "checksum_float64": 0.5, "elements": 1024}, NO_PER_CALL))  # fmt: skip
    result = mesure_memoire.measure(settings, tool="a tool")
    assert result["schema_version"] == 4
    assert result["configuration"]["device_used_bytes_before_measure"] == 10 * GIB
    names = [call[0] for call in set_up.calls]
    assert names.index("init") < len(names) - 1 - names[::-1].index("mem_get_info")  # read after init
    assert set_up.calls[-1] == ("mem_get_info", 2)  # the chosen device, by index, after the other set-up calls
