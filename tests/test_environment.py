"""`mesure_memoire.py environment`: a diagnosis that degrades field by field and stays private."""

import getpass
import json
import os
import socket

import pytest
import torch

import mesure_memoire
from conftest import ROOT, assert_one_line_refusal, run_script


@pytest.mark.whole_kit
def test_without_torch_it_reports_why_and_exits_0():
    completed = run_script("mesure_memoire.py", "environment", "--device", "cuda:0", "--json", python_flags=("-S",))
    assert completed.returncode == 0, completed.stderr
    data = json.loads(completed.stdout)
    assert data["torch"] is None
    assert "torch" in data["torch_error"]
    assert data["gpu_available"] is False and data["gpu"] is None
    assert data["gpu_unavailable_reason"] == "PyTorch is not importable"


def test_with_the_cpu_build_it_reports_no_gpu():
    completed = run_script("mesure_memoire.py", "environment", "--device", "cuda:0", "--json")
    assert completed.returncode == 0, completed.stderr
    data = json.loads(completed.stdout)
    assert data["torch"] == torch.__version__
    assert data["torch_error"] is None
    assert data["cuda_build"] is None and data["hip_build"] is None
    assert data["device"] == "cuda:0" and data["device_count"] == 0
    assert data["gpu_available"] is False
    assert "no CUDA or ROCm support" in data["gpu_unavailable_reason"]
    assert data["python"]["version"].count(".") == 2


def test_text_output_names_the_driver_commands():
    completed = run_script("mesure_memoire.py", "environment", "--device", "cuda:0")
    assert completed.returncode == 0, completed.stderr
    assert "not the driver" in completed.stdout
    assert "nvidia-smi --query-gpu=name,driver_version --format=csv" in completed.stdout
    assert "amd-smi version" in completed.stdout
    assert "GPU usable            no: this PyTorch build has no CUDA or ROCm support" in completed.stdout


@pytest.mark.parametrize("device", ["cuda", "cuda:", "cuda:-1", "cpu", "CUDA:0", "cuda:0 ", "cuda:x", "0", "gpu:0"])
def test_a_malformed_device_is_a_usage_error(device):
    completed = run_script("mesure_memoire.py", "environment", "--device", device)
    assert_one_line_refusal(completed, "--device", "cuda:N")


def test_missing_device_is_a_usage_error():
    assert_one_line_refusal(run_script("mesure_memoire.py", "environment"), "--device")


@pytest.mark.whole_kit
def test_privacy_no_environment_variable_hostname_user_or_path_in_any_output(tmp_path):
    sentinel = "SENTINEL-7f3a9c-PRIVATE"
    env = dict(os.environ, ITERAGPU_PRIVATE_SENTINEL=sentinel, CUDA_VISIBLE_DEVICES=sentinel)
    outputs = []
    for args in (
        ("environment", "--device", "cuda:0"),
        ("environment", "--device", "cuda:0", "--json"),
        ("estimate", "--parameters", "7", "--bits", "4"),
        ("measure", "--device", "cuda:0", "--output", "out.json"),
    ):
        for flags in ((), ("-S",)):
            completed = run_script("mesure_memoire.py", *args, python_flags=flags, env=env, cwd=tmp_path)
            outputs.append(completed.stdout + completed.stderr)
    forbidden = [sentinel, socket.gethostname(), getpass.getuser(), str(ROOT), str(tmp_path), os.path.expanduser("~")]
    for text in outputs:
        for secret in forbidden:
            assert secret not in text
    assert not (tmp_path / "out.json").exists()


def test_the_scripts_never_read_environment_variables():
    for script in ("mesure_memoire.py", "calcul_forfaits.py"):
        source = (ROOT / script).read_text(encoding="utf-8")
        for reader in ("os.environ", "getenv", "gethostname", "getuser", ".uuid", "platform.node", "expanduser"):
            assert reader not in source, (script, reader)


# The tests below use the stand_in_gpu fixture (conftest.py), because no GPU can be had
# here: they check how the collector degrades and what it keeps, not real GPU values.


def test_stand_in_gpu_fields_are_kept_and_identifiers_are_not(stand_in_gpu, capsys):
    assert mesure_memoire.main(["environment", "--device", "cuda:0", "--json"]) == 0
    text = capsys.readouterr().out
    data = json.loads(text)
    assert data["gpu_available"] is True
    gpu = data["gpu"]
    assert gpu["name"] == "Stand-in GPU" and gpu["compute_capability"] == "9.0"
    assert gpu["total_memory_bytes"] == 80 * 2**30 and gpu["total_memory_gib"] == 80.0
    assert gpu["mem_get_info_free_bytes"] == 79 * 2**30
    assert gpu["allocator_backend"] == "native"
    assert gpu["gcn_arch_name"] is None
    assert "STANDIN-UUID" not in text and "STANDIN-SERIAL" not in text
    assert mesure_memoire.main(["environment", "--device", "cuda:0"]) == 0
    human = capsys.readouterr().out
    assert "80.00 GiB" in human and "STANDIN" not in human


def test_stand_in_device_index_out_of_range(stand_in_gpu):
    stand_in_gpu(count=2)
    environment = mesure_memoire.collect_environment("cuda:2")
    assert environment["gpu_available"] is False
    reason = environment["gpu_unavailable_reason"]
    assert "out of range" in reason and "2 device(s)" in reason


def test_stand_in_a_query_that_raises_degrades_only_its_field(stand_in_gpu, monkeypatch):

    def broken(*args):
        raise RuntimeError("query exploded in /home/someone/secret/lib.so")

    monkeypatch.setattr(torch.cuda, "mem_get_info", broken)
    monkeypatch.setattr(torch.backends.cudnn, "version", broken)
    environment = mesure_memoire.collect_environment("cuda:0")
    assert environment["gpu_available"] is True
    assert environment["gpu"]["mem_get_info_free_bytes"] is None
    assert environment["cudnn_or_miopen_version"] is None
    assert set(environment["field_errors"]) == {"mem_get_info", "cudnn_or_miopen_version"}
    assert "/home/someone" not in json.dumps(environment["field_errors"])
    assert "<path>" in environment["field_errors"]["mem_get_info"]


def test_redact_removes_paths():
    assert mesure_memoire.redact("libcudart.so.13: cannot open /usr/lib/x86_64/libcudart.so.13") == (
        "libcudart.so.13: cannot open <path>"
    )
    assert "Users" not in mesure_memoire.redact(r"failed at C:\Users\ana\torch\lib\c10.dll")


@pytest.mark.parametrize("command", [[], ["estimate"], ["environment"], ["measure"]])
def test_help_of_each_command(command, capsys):
    assert mesure_memoire.main([*command, "--help"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: mesure_memoire.py")
    expected = {"estimate": "--reserve-gib", "environment": "--device", "measure": "--repeats"}
    assert expected.get(command[0] if command else None, "estimate") in out


@pytest.mark.parametrize(
    ("message", "expected"),
    [
        ("[Errno 13] Permission denied: '/home/Ana Maria/my results/out.json'",
         "[Errno 13] Permission denied: '<path>'"),
        ("/home/Ana Maria/venv 2/lib/site-packages/torch/lib/libtorch_cuda.so: undefined symbol: cudaX",
         "<path>: undefined symbol: cudaX"),
        (r'Error loading "C:\Program Files\Python311\Lib\site-packages\torch\lib\c10.dll" or one of its dependencies.',
         'Error loading "<path>" or one of its dependencies.'),
        (r"failed at C:\Users\Ana Maria\torch\lib\c10.dll: bad", "failed at <path>: bad"),
        ("NumPy (Triggered internally at /__w/pytorch/pytorch/torch/csrc/utils/tensor_numpy.cpp:84.)",
         "NumPy (Triggered internally at <path>:84.)"),
        ("see ~/secret stuff/x.log", "see <path>"),
        ('File "/home/ana/my project/x.py", line 3', 'File "<path>", line 3'),
        ("No such file: \"/home/o'brien/x\"", 'No such file: "<path>"'),
        ("No such file: '/home/o\\'br\"ien/x'", "No such file: '<path>'"),
        (r"path \\server\share\ana\x.dll missing", "path <path> missing"),
        ("cannot open /usr/lib/a.so and also /opt/b.so", "cannot open <path> and also <path>"),
        ("cannot open /opt/x. Check that CUDA/ROCm is installed",
         "cannot open <path> Check that CUDA/ROCm is installed"),
        ("float16/bfloat16 and CUDA/HIP stay", "float16/bfloat16 and CUDA/HIP stay"),
        ("relative torch/csrc/utils/x.cpp:84", "relative <path>:84"),
        ("\n\nCUDA error: out of memory\nCUDA kernel errors might be reported later", "CUDA error: out of memory"),
        ("bad\x1b[31m\ttab", "bad\\x1b[31m\\ttab"),
        ("", ""),
    ],
)  # fmt: skip
def test_redact_removes_whole_paths_even_with_spaces(message, expected):
    assert mesure_memoire.redact(message) == expected


def test_a_warning_from_a_pytorch_query_is_recorded_redacted_not_printed(stand_in_gpu, monkeypatch, capsys):
    import warnings

    monkeypatch.setattr(mesure_memoire, "PYTORCH_WARNINGS", [])

    def warns():
        warnings.warn("CUDA initialization: driver too old (at /home/ana/my env/lib/x.so)", UserWarning, stacklevel=1)
        return True

    monkeypatch.setattr(torch.cuda, "is_available", warns)
    assert mesure_memoire.main(["environment", "--device", "cuda:0", "--json"]) == 0
    captured = capsys.readouterr()
    assert captured.err == ""
    recorded = json.loads(captured.out)["field_errors"]
    assert recorded == {"pytorch_warnings": "UserWarning: CUDA initialization: driver too old (at <path>)"}
    assert mesure_memoire.main(["environment", "--device", "cuda:0"]) == 0
    assert "  PyTorch warned        pytorch_warnings: UserWarning: CUDA initialization" in capsys.readouterr().out


def test_a_warning_while_importing_pytorch_is_kept_not_printed(monkeypatch, capsys):
    import sys
    import warnings

    class Loader:  # a stand-in "torch" module whose import warns, as PyTorch does without NumPy
        def find_spec(self, name, path=None, target=None):
            import importlib.util

            return importlib.util.spec_from_loader(name, self) if name == "torch" else None

        def create_module(self, spec):
            return None

        def exec_module(self, module):
            warnings.warn(
                "Failed to initialize NumPy (at /opt/conda/lib/site-packages/torch/x.py)", UserWarning, stacklevel=1
            )

    monkeypatch.setattr(mesure_memoire, "PYTORCH_WARNINGS", [])
    monkeypatch.delitem(sys.modules, "torch")
    monkeypatch.setattr(sys, "meta_path", [Loader(), *sys.meta_path])
    module, error = mesure_memoire.import_torch()
    assert module is sys.modules["torch"] and error is None
    assert capsys.readouterr().err == ""
    assert mesure_memoire.PYTORCH_WARNINGS == ["UserWarning: Failed to initialize NumPy (at <path>)"]
