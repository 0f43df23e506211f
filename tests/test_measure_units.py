"""Exact figures, messages and device arguments of the measurement and prediction functions, in-process.

No GPU can be had here.  Where torch.cuda must answer, the tests name their stand-ins: the
``stand_in_gpu`` fixture (conftest) for the device queries, wrapped here so that every query
records the device index it is given, and hand-made records for the measured counters.
"""

import re
import time
import types
from datetime import datetime, timezone
from decimal import Decimal

import pytest
import torch

import mesure_memoire

MIB = 2**20
GIB = 2**30


@pytest.fixture(autouse=True)
def no_earlier_warnings(monkeypatch):
    """Warnings PyTorch raised in earlier tests would be reported in field_errors: start from none."""
    monkeypatch.setattr(mesure_memoire, "PYTORCH_WARNINGS", [])


def config(**overrides):
    values = dict(device="cuda:0", batch=1, context=16, width=64, dtype="float32", warmup=1, repeats=2, seed=0)
    values.update(overrides)
    return mesure_memoire.measure_config(**values)


# --- the plan's text ---------------------------------------------------------------------------------

PLAN_TEXT = """\
Plan for measure (arithmetic only, no GPU, nothing written): batch 1, context 16, width 64, float32
Per phase, above the phase's baseline; requested bytes exact, allocated rounded to 512-byte blocks:
phase            end req MiB  peak req MiB  end alloc MiB  peak alloc MiB
model_load             0.126         0.126          0.126           0.126
inputs                 0.004         0.004          0.004           0.004
cold_forward           0.004         0.031          0.004           0.031
warmup x3              0.004         0.031          0.004           0.031
warm_forward #1        0.004         0.031          0.004           0.031
warm_forward #2        0.004         0.031          0.004           0.031
BLAS workspace allowance on the first forward: 256.000 MiB (an allowance: measure measures the workspace)
Predicted peak allocated: 268604928 bytes = 0.25 GiB, in cold_forward
measure needs 1342346752 bytes = 1.25 GiB free (the peak plus a 1.00 GiB margin).
Not included: the CUDA/ROCm context, the BLAS handles and kernel code, which the allocator's counters never see, \
reserved memory above allocated (the allocator's segments)."""


def test_the_plan_text_exactly():
    assert mesure_memoire.format_plan(mesure_memoire.predict_memory(config(warmup=3))) == PLAN_TEXT


def test_the_plan_command_passes_each_option_to_its_place(capsys):
    arguments = ["measure", "--device", "cuda:3", "--batch", "2", "--context", "3", "--width", "5", "--dtype",
                 "bfloat16", "--warmup", "7", "--repeats", "11", "--seed", "13", "--plan", "--json"]  # fmt: skip
    assert mesure_memoire.main(arguments) == 0
    import json

    data = json.loads(capsys.readouterr().out)
    assert data["configuration"] == {"device": "cuda:3", "batch": 2, "context": 3, "width": 5, "dtype": "bfloat16",
                                     "warmup": 7, "repeats": 11, "seed": 13}  # fmt: skip


def test_the_plan_refusals_exactly(capsys):
    base = ["measure", "--device", "cuda:0"]
    assert mesure_memoire.main([*base, "--plan", "--output", "x.json"]) == 2
    assert capsys.readouterr().err == "mesure_memoire.py: error: --plan writes nothing: drop --output\n"
    assert mesure_memoire.main([*base, "--json", "--output", "x.json"]) == 2
    assert capsys.readouterr().err == (
        "mesure_memoire.py: error: --json goes with --plan; measure writes its JSON to --output\n"
    )
    assert mesure_memoire.main(base) == 2
    assert capsys.readouterr().err == (
        "mesure_memoire.py: error: --output: a new file name is required (or --plan, which measures nothing and "
        "writes nothing)\n"
    )


def test_the_measure_command_prints_the_table_the_warning_and_the_name(monkeypatch, capsys):
    calls = []
    result = {
        "configuration": {"fresh_process_warning": "not a fresh\nprocess"},
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
    result["configuration"]["fresh_process_warning"] = None
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
    "workspace": {"measured_bytes": 8519680},
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
Last output: 1024 elements, all finite, float64 checksum -1.25"""


def test_the_phase_table_exactly():
    assert mesure_memoire.format_phase_table(PHASE_TABLE_RESULT) == PHASE_TABLE_TEXT


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


# --- the fit check -----------------------------------------------------------------------------------


def fit_environment(free, total=80 * GIB):
    return {"gpu": {"mem_get_info_free_bytes": free, "total_memory_bytes": total}}


def test_the_fit_message_exactly():
    plan = mesure_memoire.predict_memory(config(batch=8, context=1024, width=4096, dtype="bfloat16"))
    peak = plan["predicted_peak_allocated_bytes"]
    assert mesure_memoire.fit_problem(plan, fit_environment(peak + GIB)) is None  # exactly enough
    assert mesure_memoire.fit_problem(plan, fit_environment(peak + GIB - 1)) == (
        f"the predicted peak, {peak} bytes (1.06 GiB), exceeds the {peak + GIB - 1} bytes (2.06 GiB) "
        "free (mem_get_info) less a 1.00 GiB margin: shrink --context (the activations dominate)"
    )
    assert mesure_memoire.fit_problem(plan, fit_environment(None, total=peak + GIB)) is None
    assert mesure_memoire.fit_problem(plan, fit_environment(None, total=GIB + 2**27)) == (
        f"the predicted peak, {peak} bytes (1.06 GiB), exceeds the {GIB + 2**27} bytes (1.13 GiB) "
        "announced in total (mem_get_info failed) less a 1.00 GiB margin: shrink --context (the activations dominate)"
    )


def fit_plan(weights, peak, batch=1, context=1):
    tensors = {"0.weight": weights - 3, "0.bias": 1, "2.weight": 1, "2.bias": 1}
    return {"predicted_peak_allocated_bytes": peak, "fit_margin_bytes": GIB, "tensor_bytes": tensors,
            "configuration": {"batch": batch, "context": context}}  # fmt: skip


@pytest.mark.parametrize(
    ("weights", "peak", "batch", "context", "advice"),
    [
        (1000, 2000, 1, 1, "shrink --width (the weights dominate)"),  # exactly half the peak: weights
        (999, 2000, 1, 1, "shrink --context (the activations dominate)"),
        (999, 2000, 5, 5, "shrink --context (the activations dominate)"),  # a tie: --context
        (999, 2000, 6, 5, "shrink --batch (the activations dominate)"),
    ],
)
def test_the_advice_names_what_dominates(weights, peak, batch, context, advice):
    message = mesure_memoire.fit_problem(fit_plan(weights, peak, batch, context), fit_environment(GIB))
    assert message.endswith(": " + advice)


def test_gib_rounds_half_up_to_two_decimals():
    assert mesure_memoire._gib(2**27) == "0.13 GiB"  # 0.125: half-even would say 0.12
    assert mesure_memoire._gib(3 * 2**28) == "0.75 GiB"
    assert mesure_memoire._gib(0) == "0.00 GiB"


# --- the device probes (stand-ins record the device index of every query) -----------------------------


@pytest.fixture
def recorded_indices(stand_in_gpu, monkeypatch):
    """stand_in_gpu with two devices, whose per-device queries record the index they are given."""
    properties = stand_in_gpu(count=2)
    seen = []

    def recording(name, answer):
        def query(index, *args, **kwargs):
            seen.append((name, index))
            return answer(*args, **kwargs)

        return query

    import contextlib

    monkeypatch.setattr(torch.cuda, "get_device_properties", recording("get_device_properties", lambda: properties))
    monkeypatch.setattr(torch.cuda, "get_device_capability", recording("get_device_capability", lambda: (9, 0)))
    monkeypatch.setattr(torch.cuda, "mem_get_info", recording("mem_get_info", lambda: (79 * GIB, 80 * GIB)))
    monkeypatch.setattr(torch.cuda, "device", recording("device", contextlib.nullcontext))
    return types.SimpleNamespace(seen=seen, properties=properties)


def test_the_collector_keeps_each_field_and_asks_the_chosen_device(recorded_indices, monkeypatch):
    matmul = torch.backends.cuda.matmul
    monkeypatch.setattr(matmul, "allow_tf32", True)
    monkeypatch.setattr(matmul, "allow_fp16_reduced_precision_reduction", False)
    monkeypatch.setattr(matmul, "allow_bf16_reduced_precision_reduction", True)
    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", False)
    monkeypatch.setattr(torch, "get_float32_matmul_precision", lambda: "high")
    monkeypatch.setattr(torch.backends.cuda, "preferred_blas_library", lambda: "torch._C._BlasBackend.Cublaslt")
    monkeypatch.setattr(torch.backends.cudnn, "version", lambda: 91002)
    monkeypatch.setattr(torch.cuda.memory, "get_allocator_backend", lambda: "cudaMallocAsync")
    recorded_indices.properties.gcnArchName = "gfx90a"  # kept only from a ROCm build
    environment = mesure_memoire.collect_environment("cuda:1")
    assert set(environment["python"]) == {"version", "implementation"}
    assert set(environment["os"]) == {"name", "release", "machine"}
    del environment["python"], environment["os"]
    assert environment == {
        "torch": torch.__version__, "torch_error": None, "cuda_build": "13.0", "hip_build": None,
        "cudnn_or_miopen_version": 91002, "device": "cuda:1", "device_count": 2, "gpu_available": True,
        "gpu_unavailable_reason": None,
        "gpu": {"name": "Stand-in GPU", "compute_capability": "9.0", "gcn_arch_name": None,
                "multi_processor_count": 132, "total_memory_bytes": 80 * GIB, "total_memory_gib": Decimal(80),
                "mem_get_info_free_bytes": 79 * GIB, "mem_get_info_total_bytes": 80 * GIB,
                "allocator_backend": "cudaMallocAsync"},
        "settings": {"float32_matmul_precision": "high", "cuda_matmul_allow_tf32": True, "cudnn_allow_tf32": False,
                     "cuda_matmul_allow_fp16_reduced_precision_reduction": False,
                     "cuda_matmul_allow_bf16_reduced_precision_reduction": True,
                     "preferred_blas_library": "Cublaslt", "allocator_backend": "cudaMallocAsync",
                     "cublas_workspace_size_bytes": 8 * MIB + 128 * 2**10, "cublaslt_workspace_size_bytes": MIB},
        "field_errors": {}, "driver_note": mesure_memoire.DRIVER_NOTE,
        "driver_commands": mesure_memoire.DRIVER_COMMANDS,
    }  # fmt: skip
    # Every per-device query names device 1; the workspace sizes are read with device 1 current.
    assert recorded_indices.seen == [("get_device_properties", 1), ("mem_get_info", 1), ("device", 1), ("device", 1)]
    assert environment["driver_commands"] is not mesure_memoire.DRIVER_COMMANDS


def test_attributes_an_older_pytorch_lacks_are_null_not_errors(recorded_indices, monkeypatch):
    del recorded_indices.properties.multi_processor_count
    monkeypatch.delattr(torch.version, "hip")
    environment = mesure_memoire.collect_environment("cuda:0")
    assert environment["hip_build"] is None and environment["gpu"]["multi_processor_count"] is None
    assert environment["field_errors"] == {}
    monkeypatch.setattr(torch.version, "hip", "7.0.1", raising=False)  # a ROCm build without gcnArchName
    environment = mesure_memoire.collect_environment("cuda:0")
    assert environment["gpu"]["gcn_arch_name"] is None and environment["field_errors"] == {}


def test_the_collector_on_a_rocm_build_keeps_the_architecture(recorded_indices, monkeypatch):
    recorded_indices.properties.gcnArchName = "gfx942:sramecc+:xnack-"
    recorded_indices.properties.major, recorded_indices.properties.minor = 9, 4
    monkeypatch.setattr(torch.version, "hip", "7.0.1")
    monkeypatch.setattr(torch.version, "cuda", None)
    monkeypatch.delattr(torch.backends.cuda, "cublaslt_workspace_size")
    environment = mesure_memoire.collect_environment("cuda:0")
    assert environment["hip_build"] == "7.0.1" and environment["cuda_build"] is None
    assert environment["gpu"]["gcn_arch_name"] == "gfx942:sramecc+:xnack-"
    assert environment["gpu"]["compute_capability"] == "9.4"
    assert environment["settings"]["cublas_workspace_size_bytes"] == 8 * MIB + 128 * 2**10
    assert environment["settings"]["cublaslt_workspace_size_bytes"] is None  # no such query: left null
    assert environment["field_errors"] == {}
    assert recorded_indices.seen == [("get_device_properties", 0), ("mem_get_info", 0), ("device", 0)]


@pytest.mark.parametrize(
    ("count", "device", "reason"),
    [
        (2, "cuda:2", "cuda:2 is out of range: PyTorch sees 2 device(s)"),
        (None, "cuda:0", "cuda:0 is out of range: PyTorch sees None device(s)"),
    ],
)
def test_the_collector_names_a_device_out_of_range(stand_in_gpu, monkeypatch, count, device, reason):
    stand_in_gpu(count=2)
    if count is None:
        monkeypatch.setattr(torch.cuda, "device_count", lambda: 1 / 0)
    environment = mesure_memoire.collect_environment(device)
    assert environment["gpu_available"] is False and environment["gpu"] is None
    assert environment["gpu_unavailable_reason"] == reason
    assert environment["device_count"] == count


def test_the_collector_when_the_gpu_is_not_visible_or_unreadable(stand_in_gpu, monkeypatch):
    stand_in_gpu()
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    environment = mesure_memoire.collect_environment("cuda:0")
    assert environment["gpu_unavailable_reason"] == (
        "torch.cuda.is_available() is False (no GPU visible, or driver/runtime problem)"
    )
    monkeypatch.setattr(torch.version, "cuda", None)
    assert mesure_memoire.collect_environment("cuda:0")["gpu_unavailable_reason"] == (
        "this PyTorch build has no CUDA or ROCm support"
    )
    monkeypatch.setattr(torch.version, "hip", "7.0")
    assert mesure_memoire.collect_environment("cuda:0")["gpu_unavailable_reason"].startswith("torch.cuda.is_avail")
    stand_in_gpu()

    def unreadable(index):
        raise RuntimeError("no properties")

    monkeypatch.setattr(torch.cuda, "get_device_properties", unreadable)
    environment = mesure_memoire.collect_environment("cuda:0")
    assert environment["gpu_unavailable_reason"] == "the properties of cuda:0 cannot be read"
    assert environment["gpu_available"] is False and environment["gpu"] is None
    assert environment["field_errors"] == {"properties": "RuntimeError: no properties"}


def test_each_failing_query_leaves_null_and_names_itself(stand_in_gpu, monkeypatch):
    stand_in_gpu()

    def broken(*args, **kwargs):
        raise RuntimeError("broken")

    for owner, name in [(torch, "get_float32_matmul_precision"), (torch.backends.cuda, "preferred_blas_library"),
                        (torch.backends.cudnn, "version"), (torch.cuda.memory, "get_allocator_backend"),
                        (torch.backends.cuda, "cublas_workspace_size"),
                        (torch.backends.cuda, "cublaslt_workspace_size")]:  # fmt: skip
        monkeypatch.setattr(owner, name, broken)
    environment = mesure_memoire.collect_environment("cuda:0")
    assert environment["field_errors"] == dict.fromkeys(
        ["float32_matmul_precision", "preferred_blas_library", "cudnn_or_miopen_version", "allocator_backend",
         "cublas_workspace_size", "cublaslt_workspace_size"], "RuntimeError: broken"
    )  # fmt: skip
    settings = environment["settings"]
    assert [
        settings[key]
        for key in (
            "float32_matmul_precision",
            "preferred_blas_library",
            "allocator_backend",
            "cublas_workspace_size_bytes",
            "cublaslt_workspace_size_bytes",
        )
    ] == [None] * 5
    assert environment["gpu"]["allocator_backend"] is None and environment["gpu_available"] is True


def test_the_collector_without_pytorch(monkeypatch):
    monkeypatch.setattr(mesure_memoire, "import_torch", lambda: (None, "ModuleNotFoundError: No module named 'torch'"))
    environment = mesure_memoire.collect_environment("cuda:0")
    assert environment["torch"] is None and environment["gpu"] is None and environment["gpu_available"] is False
    assert environment["torch_error"] == "ModuleNotFoundError: No module named 'torch'"
    assert environment["gpu_unavailable_reason"] == "PyTorch is not importable"
    assert environment["settings"] == dict.fromkeys(mesure_memoire.SETTINGS)
    assert environment["device_count"] is None and environment["field_errors"] == {}


def test_on_device_makes_the_index_current_and_returns_an_int(monkeypatch):
    current = []

    class Device:
        def __init__(self, index):
            self.index = index

        def __enter__(self):
            current.append(self.index)

        def __exit__(self, *exc_info):
            current.append(None)

    monkeypatch.setattr(torch.cuda, "device", Device)
    assert mesure_memoire._on_device(torch, 3, lambda: (current[-1], "7")[1]) == 7
    assert current == [3, None]


# --- the environment's text --------------------------------------------------------------------------


def test_the_environment_text_exactly_with_a_gpu():
    environment = {
        "python": {"version": "3.12.1", "implementation": "CPython"},
        "os": {"name": "Linux", "release": "6.1", "machine": "x86_64"},
        "torch": "2.13.0", "torch_error": None, "cuda_build": None, "hip_build": "7.0", "cudnn_or_miopen_version": 3,
        "device": "cuda:1", "device_count": 2, "gpu_available": True, "gpu_unavailable_reason": None,
        "gpu": {"name": "MI300X", "compute_capability": "9.4", "gcn_arch_name": "gfx942", "multi_processor_count": 304,
                "total_memory_bytes": 2**27, "total_memory_gib": Decimal("0.125"), "mem_get_info_free_bytes": None,
                "mem_get_info_total_bytes": 5, "allocator_backend": None},
        "settings": {"cudnn_allow_tf32": False, "preferred_blas_library": None, "allocator_backend": "native"},
        "field_errors": {"pytorch_warnings": "UserWarning: w", "mem_get_info": "RuntimeError: x",
                         "zz": "RuntimeError: y"},
        "driver_note": "Note.", "driver_commands": {"amd": "amd-smi version", "nvidia": "nvidia-smi"},
    }  # fmt: skip
    assert mesure_memoire.format_environment(environment) == "\n".join(
        [
            "Environment diagnosis (this process only)",
            "  Python                3.12.1 (CPython)",
            "  OS                    Linux 6.1 x86_64",
            "  PyTorch               2.13.0",
            "  CUDA build            none",
            "  HIP build             7.0",
            "  cuDNN/MIOpen          3",
            "  device                cuda:1 (PyTorch sees 2 device(s))",
            "  GPU usable            yes",
            "  GPU name              MI300X",
            "  compute capability    9.4 (gfx942)",
            "  memory (runtime)      134217728 bytes = 0.13 GiB",
            "  mem_get_info          free none / total 5 bytes",
            "  allocator backend     unknown",
            "  setting               cudnn_allow_tf32 = False",
            "  setting               allocator_backend = native",
            "  query failed          mem_get_info: RuntimeError: x",
            "  PyTorch warned        pytorch_warnings: UserWarning: w",
            "  query failed          zz: RuntimeError: y",
            "Note.",
            "  AMD    amd-smi version",
            "  NVIDIA nvidia-smi",
        ]
    )


def test_the_environment_text_exactly_without_a_gpu():
    environment = {
        "python": {"version": "3.10.0", "implementation": "PyPy"},
        "os": {"name": "Darwin", "release": "23", "machine": "arm64"},
        "torch": None, "torch_error": "ImportError: no torch", "cuda_build": "12.8", "hip_build": None,
        "cudnn_or_miopen_version": None, "device": "cuda:0", "device_count": None, "gpu_available": False,
        "gpu_unavailable_reason": "PyTorch is not importable", "gpu": None, "settings": None, "field_errors": {},
        "driver_note": "N", "driver_commands": {},
    }  # fmt: skip
    assert mesure_memoire.format_environment(environment).splitlines() == [
        "Environment diagnosis (this process only)",
        "  Python                3.10.0 (PyPy)",
        "  OS                    Darwin 23 arm64",
        "  PyTorch               not importable (ImportError: no torch)",
        "  CUDA build            12.8",
        "  HIP build             none",
        "  cuDNN/MIOpen          none",
        "  device                cuda:0 (PyTorch sees no device(s))",
        "  GPU usable            no: PyTorch is not importable",
        "N",
    ]
    environment["gpu"] = {"name": "G", "compute_capability": "8.0", "gcn_arch_name": "", "total_memory_bytes": 0,
                          "total_memory_gib": Decimal(0), "mem_get_info_free_bytes": 0,
                          "mem_get_info_total_bytes": None, "allocator_backend": "native"}  # fmt: skip
    lines = mesure_memoire.format_environment(environment).splitlines()
    assert lines[9:14] == ["  GPU name              G", "  compute capability    8.0",
                           "  memory (runtime)      0 bytes = 0.00 GiB",
                           "  mem_get_info          free 0 / total none bytes",
                           "  allocator backend     native"]  # fmt: skip


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

    def measure_phases(torch_module, cuda, device, configuration):
        seen.append((torch_module, cuda, device, configuration))
        return agreeing_records(settings), {"all_finite": True, "checksum_float64": 0.5, "elements": 48}

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
        "kit": "iteragpu-lab-v1", "schema_version": 2, "tool": "a tool",
        "configuration": {**settings, "cuda_initialized_before_measure": True, "allocated_bytes_before_measure": 0,
                          "reserved_bytes_before_measure": 0, "fresh_process_warning": None},
        "synthetic_model": mesure_memoire.synthetic_model(settings),
        "prediction_check": {"agrees": True, "disagreements": [], "not_checked": []},
        "workspace": {"measured_bytes": 0, "requested_bytes": 0,
                      "how": "cold_forward's end level above its baseline, less its predicted output: what the "
                      "first forward leaves allocated beyond the prediction (the BLAS workspaces, mostly)",
                      "allowance_bytes": 256 * MIB},
        "output_summary": {"all_finite": True, "checksum_float64": 0.5, "elements": 48},
        "predicted_peak_allocated_bytes": plan["predicted_peak_allocated_bytes"], "fit_margin_bytes": GIB,
    }  # fmt: skip
    assert [record["verdict"] for record in result["phases"]] == ["agrees"] * 5


@pytest.mark.parametrize(("allocated", "reserved"), [(512, 0), (0, 2**21), (1, 1)])
def test_measure_warns_when_the_process_already_held_gpu_memory(stand_in_gpu, monkeypatch, allocated, reserved):
    stand_in_gpu()
    SetUpCalls(monkeypatch, allocated=allocated, reserved=reserved)
    settings = config()
    monkeypatch.setattr(mesure_memoire, "measure_phases", lambda *args: (agreeing_records(settings), {}))
    configuration = mesure_memoire.measure(settings, tool="t")["configuration"]
    assert (configuration["allocated_bytes_before_measure"], configuration["reserved_bytes_before_measure"]) == (
        allocated, reserved
    )  # fmt: skip
    assert configuration["fresh_process_warning"] == (
        "PyTorch already held GPU memory in this process before the measurement: this is not a fresh process and "
        "the figures are not comparable; restart it"
    )


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
    monkeypatch.setattr(mesure_memoire, "measure_phases", lambda *args: (agreeing_records(config()), {}))
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


def test_phase_labels_count_repetitions_from_one():
    assert mesure_memoire._phase_labels(config(warmup=4, repeats=3)) == [
        ("model_load", {}), ("inputs", {}), ("cold_forward", {}), ("warmup", {"passes": 4}),
        ("warm_forward", {"repetition": 1}), ("warm_forward", {"repetition": 2}), ("warm_forward", {"repetition": 3}),
    ]  # fmt: skip
    assert mesure_memoire.phase_names(config(warmup=0, repeats=1)) == ["model_load", "inputs", "cold_forward",
                                                                     "warm_forward"]  # fmt: skip


def test_the_synthetic_model_description_exactly():
    model = mesure_memoire.synthetic_model(config(batch=2, context=3, width=5, dtype="float16"))
    assert model == {
        "architecture": "Linear(5 -> 20) -> GELU -> Linear(20 -> 5)", "width": 5, "hidden_width": 20, "bias": True,
        "dtype": "float16", "execution": "eval mode, torch.inference_mode, no autocast, no gradients, no optimizer",
        "parameters": 225, "parameter_bytes": 450,
        "parameter_tensors": [{"name": "0.weight", "shape": [20, 5], "bytes": 200},
                              {"name": "0.bias", "shape": [20], "bytes": 40},
                              {"name": "2.weight", "shape": [5, 20], "bytes": 200},
                              {"name": "2.bias", "shape": [5], "bytes": 10}],
        "input_shape": [2, 3, 5], "input_bytes": 60, "output_shape": [2, 3, 5], "output_bytes": 60,
    }  # fmt: skip


def test_the_plan_document_exactly():
    plan = mesure_memoire.predict_memory(config(batch=1, context=2, width=3, warmup=0, repeats=1))
    phases = plan.pop("phases")
    assert plan == {
        "kit": "iteragpu-lab-v1",
        "what": "a prediction from arithmetic alone (no PyTorch, no GPU) of what each phase of measure should do to "
        "PyTorch's CUDA caching allocator",
        "configuration": config(batch=1, context=2, width=3, warmup=0, repeats=1),
        "tensor_bytes": {"0.weight": 144, "0.bias": 48, "2.weight": 144, "2.bias": 12, "inputs": 24, "output": 24,
                         "fc1_output": 96, "gelu_output": 96},
        "allocator_rounding_bytes": 512, "large_block_slack_bytes": MIB, "blas_workspace_allowance_bytes": 256 * MIB,
        "predicted_peak_allocated_bytes": 2048 + 512 + 256 * MIB + 1024, "predicted_peak_phase": "cold_forward",
        "fit_margin_bytes": GIB, "needs_free_bytes": 2048 + 512 + 256 * MIB + 1024 + GIB,
        "not_included": ["the CUDA/ROCm context",
                         "the BLAS handles and kernel code, which the allocator's counters never see",
                         "reserved memory above allocated (the allocator's segments)"],
    }  # fmt: skip
    base = {"relative_to": "the phase's baseline", "end_allocated_slack_bytes": 0, "peak_allocated_slack_bytes": 0}
    assert phases[0] == {"phase": "model_load", **base, "end_requested_bytes": 348, "peak_requested_bytes": 348,
                         "end_allocated_bytes": 2048, "peak_allocated_bytes": 2048,
                         "alive_at_end": ["0.weight", "0.bias", "2.weight", "2.bias"],
                         "alive_at_peak": ["0.weight", "0.bias", "2.weight", "2.bias"],
                         "predicted_baseline_allocated_bytes": 0}  # fmt: skip
    assert phases[1]["predicted_baseline_allocated_bytes"] == 2048 and phases[1]["alive_at_end"] == ["inputs"]
    assert phases[2] == {"phase": "cold_forward", **base, "end_requested_bytes": 24, "peak_requested_bytes": 192,
                         "end_allocated_bytes": 512, "peak_allocated_bytes": 1024, "alive_at_end": ["output"],
                         "alive_at_peak": ["fc1_output", "gelu_output"], "predicted_baseline_allocated_bytes": 2560,
                         "blas_workspace": "allocated by the first matrix product and kept: measured by the run, not "
                         "predicted here (the allowance counts it in the predicted peak)"}  # fmt: skip
    # After the first forward the workspace allowance stays in the baseline; the output does not.
    assert phases[3]["predicted_baseline_allocated_bytes"] == 2560 + 256 * MIB and "blas_workspace" not in phases[3]
    assert phases[3]["repetition"] == 1


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
    records, summary = mesure_memoire.measure_phases(
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
    monkeypatch.setattr(mesure_memoire, "summarize_output", lambda torch_module, output: (_ for _ in ()).throw(
        summary_error))  # fmt: skip
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
