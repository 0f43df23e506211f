"""`mesure_memoire.py measure`: refusals, the protocol's order, the result's schema, the atomic write.

No GPU can be had here.  Refusals run for real against the CPU build of PyTorch.  Where the
GPU path must be exercised, the tests name their stand-ins: ``stand_in_gpu`` (conftest) for
the device queries, and ``RecordingCudaStandIn`` for the allocator counters, while the model,
the inputs and the forward passes are the real PyTorch ones, run on the CPU.
"""

import json
import os
import weakref

import pytest
import torch

import mesure_memoire
from conftest import RecordingCudaStandIn, assert_one_line_refusal, run_script

SMALL_TRIAL = ["--device", "cuda:0", "--batch", "1", "--context", "16", "--width", "64", "--dtype", "float32",
               "--warmup", "1", "--repeats", "2"]  # fmt: skip


def config(**overrides):
    values = dict(device="cuda:0", batch=1, context=16, width=64, dtype="float32", warmup=1, repeats=2, seed=0)
    values.update(overrides)
    return mesure_memoire.measure_config(**values)


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


@pytest.mark.parametrize(
    ("option", "value"),
    [
        ("--batch", "0"), ("--batch", "-1"), ("--batch", "1.5"), ("--batch", "two"),
        ("--context", "0"), ("--context", "nan"), ("--width", "0"), ("--width", "inf"),
        ("--warmup", "-1"), ("--warmup", "0.5"), ("--repeats", "0"), ("--repeats", "-2"),
        ("--seed", "-1"), ("--dtype", "float64"), ("--dtype", "int8"), ("--device", "cpu"), ("--device", "cuda"),
    ],
)  # fmt: skip
def test_bad_options_are_refused_and_write_nothing(tmp_path, option, value):
    args = ["measure", *SMALL_TRIAL, "--output", "out.json"]
    if option in args:
        args[args.index(option) + 1] = value
    else:
        args += [option, value]
    completed = run_script("mesure_memoire.py", *args, cwd=tmp_path)
    assert_one_line_refusal(completed, option)
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


def test_run_phase_follows_the_protocol_order():
    recorder = RecordingCudaStandIn()
    ticks = iter([100, 350])

    def clock():
        recorder.calls.append(("clock", None))
        return next(ticks)

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
    }  # fmt: skip


def test_run_phase_without_requested_counters_or_events_says_null():
    recorder = RecordingCudaStandIn(requested=False, events=False)
    record, _ = mesure_memoire.run_phase(recorder, "dev", "inputs", lambda: None)
    assert record["device_ms"] is None
    assert record["baseline_requested_bytes"] is record["end_requested_bytes"] is record["peak_requested_bytes"] is None
    assert "Event" not in [name for name, _ in recorder.calls]


@pytest.mark.parametrize("wrong", [None, "other", torch.device("cuda", 1)])
def test_a_call_naming_another_device_fails_the_stand_in(wrong):
    """The stand-in checks every device argument, so a synchronize(None) in the protocol fails a test."""
    recorder = RecordingCudaStandIn(device=torch.device("cuda", 0))
    with pytest.raises(AssertionError, match="on a measurement of"):
        mesure_memoire.run_phase(recorder, wrong, "inputs", lambda: None)
    real_run_phase_synchronizes_the_given_device = mesure_memoire.run_phase(
        recorder, torch.device("cuda", 0), "inputs", lambda: None
    )
    assert real_run_phase_synchronizes_the_given_device[0]["phase"] == "inputs"


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
    records, summary = mesure_memoire.measure_phases(
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
    assert len(recorder.calls) == calls_per_phase * len(records)
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
                           "predicted_peak_allocated_bytes", "fit_margin_bytes"}  # fmt: skip
    assert result["schema_version"] == 2 and result["tool"] == "mesure_memoire.py"
    assert result["created_utc"].endswith("Z")
    assert result["environment"]["gpu"]["name"] == "Stand-in GPU"
    assert result["environment"]["settings"]["cublas_workspace_size_bytes"] == 8 * 2**20 + 128 * 2**10
    assert result["environment"]["settings"]["allocator_backend"] == "native"
    assert result["configuration"] == {
        "device": "cuda:0", "batch": 1, "context": 16, "width": 64, "dtype": "float32", "warmup": 1,
        "repeats": 2, "seed": 0, "cuda_initialized_before_measure": False, "allocated_bytes_before_measure": 0,
        "reserved_bytes_before_measure": 0, "fresh_process_warning": None,
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
