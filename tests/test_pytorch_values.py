"""PyTorch is input too: each value it returns is checked where it enters, each of its texts is kept by an
allow-list, and whatever it raises or prints ends in one line (issue 41).

The hostile PyTorch here is real PyTorch with some functions replaced (a stand-in for a visible GPU, plus odd
answers), or a fake ``torch`` package: hostile PyTorch behaviour, not a GPU.  The marker test over real
PyTorch's environment variables is tests/test_pytorch_markers.py.
"""

import importlib.util
import json
import math
import os
import sys
import types
import warnings

import pytest
import torch

import mesure_memoire
from conftest import (
    MESSAGES,
    SMALL_TRIAL,
    RecordingCudaStandIn,
    assert_one_line,
    assert_one_line_refusal,
    no_gpu_here,
    plain_id,
    raising,
    run_script,
    stand_in_measurement,
    tree_digest,
)

pytestmark = pytest.mark.usefixtures("no_earlier_warnings")

SECRET = "hunter2"


def environment_json(capsys):
    assert mesure_memoire.main(["environment", "--device", "cuda:0", "--json"]) == 0
    captured = capsys.readouterr()
    assert captured.err == ""
    return json.loads(captured.out)


def measure_refused(tmp_path, capsys, exit_code, *fragments):
    """``measure`` on the stand-in refuses in one line with ``exit_code``, writing nothing."""
    before = tree_digest(tmp_path)
    code = mesure_memoire.main(["measure", *SMALL_TRIAL, "--output", str(tmp_path / "o.json")])
    captured = capsys.readouterr()
    assert code == exit_code, captured.err
    assert captured.out == ""
    assert tree_digest(tmp_path) == before
    return assert_one_line(captured.err, *fragments)


# --- 1. the warnings PyTorch raises: kept by an allow-list ------------------------------------------------

WARNINGS = [
    (
        f"Ignoring invalid value for boolean flag TORCH_BLAS_PREFER_CUBLASLT: {SECRET}valid values are 0 or 1. "
        "(Triggered internally at /pytorch/c10/util/env.cpp:60.)",
        "UserWarning: Ignoring invalid value for boolean flag TORCH_BLAS_PREFER_CUBLASLT (value withheld)",
    ),
    (
        "CUDA initialization: The NVIDIA driver on your system is too old (at /home/ana/env/lib/x.so)",
        "UserWarning: CUDA initialization: The NVIDIA driver on your system is too old",
    ),
    (
        "Found GPU0 Tesla K80 which is of compute capability (CC) 3.7.\nThe following list shows the CCs",
        "UserWarning: Found GPU0 Tesla K80 which is of compute capability (CC) 3.7.",
    ),
    (
        "\nTesla K80 with CUDA capability sm_37 is not compatible with the current PyTorch installation.\nThe ...",
        "UserWarning: Tesla K80 with CUDA capability sm_37 is not compatible with the current PyTorch installation.",
    ),
    (f"Found GPU0 /home/{SECRET}/x which is of compute capability (CC) 3.7.", "UserWarning: text withheld"),
    (f"CUDA initialization: {SECRET}=1", "UserWarning: text withheld"),
    (f"TORCH_SOMETHING_NEW={SECRET} is deprecated", "UserWarning: text withheld"),
    (f"{SECRET} is not a valid value", "UserWarning: text withheld"),
]


@pytest.mark.parametrize(("message", "kept"), WARNINGS, ids=plain_id)
def test_a_warning_is_kept_only_when_it_is_a_known_message_without_a_setting_s_value(
    stand_in_gpu, monkeypatch, capsys, message, kept
):
    def warns():
        warnings.warn(message, UserWarning, stacklevel=1)
        return True

    monkeypatch.setattr(torch.cuda, "is_available", warns)
    data = environment_json(capsys)
    assert data["field_errors"] == {"pytorch_warnings": kept}
    assert mesure_memoire.main(["environment", "--device", "cuda:0"]) == 0
    assert SECRET not in capsys.readouterr().out


# --- 1. the texts PyTorch returns: versions by a grammar, the GPU's name printable, short, with no path ---


@pytest.mark.parametrize(
    ("where", "value"),
    [
        ("torch", f"2.13.0+/home/ana/{SECRET}"),
        ("torch", f"{SECRET} 2.13"),
        ("cuda_build", f"13.0 {SECRET}"),
        ("hip_build", f"/opt/{SECRET}/6.3"),
    ],
    ids=plain_id,
)
def test_a_version_that_is_not_one_is_null_with_a_field_error(stand_in_gpu, monkeypatch, capsys, where, value):
    if where == "torch":
        monkeypatch.setattr(torch, "__version__", value)
    else:
        monkeypatch.setattr(torch.version, where.partition("_")[0], value)
    data = environment_json(capsys)
    assert data[where] is None
    assert data["field_errors"][where] == MESSAGES["withheld text"].format(name=where, expected="a version")
    assert SECRET not in json.dumps(data)


@pytest.mark.parametrize(
    "version", ["2.13.0+cpu", "2.4.0a0+git1234abc", "2.8.0+rocm6.3", "2.15.0.dev20261201+cu130"], ids=plain_id
)
def test_real_versions_are_kept(stand_in_gpu, monkeypatch, capsys, version):
    monkeypatch.setattr(torch, "__version__", version)
    monkeypatch.setattr(torch.version, "hip", "6.3.42131-fa1d09cbd")
    data = environment_json(capsys)
    assert (data["torch"], data["hip_build"], data["cuda_build"]) == (version, "6.3.42131-fa1d09cbd", "13.0")


def test_the_gpu_s_name_is_kept_as_is_and_withheld_when_not_short_printable_text_without_a_path(stand_in_gpu, capsys):
    properties = stand_in_gpu()
    for kept in ("NVIDIA A100-SXM4-80GB (MIG 1g.10gb)", "X", "x" * 100):
        properties.name = kept
        assert environment_json(capsys)["gpu"]["name"] == kept
    expected = "printable text of at most 100 characters without /, \\ or ~"
    for odd, key in (
        (f"NVIDIA H200 (from /home/ana/{SECRET}/x.so)", "withheld text"),
        (f"GPU C:\\Users\\{SECRET}", "withheld text"),
        (f"GPU ~{SECRET}", "withheld text"),
        ("x" * 101, "withheld text"),
        ("", "withheld text"),
        (f"GPU\x1b[31m{SECRET}", "withheld text"),
        (b"GPU", "unexpected value"),
    ):
        properties.name = odd
        data = environment_json(capsys)
        assert data["gpu"]["name"] is None, odd
        assert data["field_errors"]["name"] == MESSAGES[key].format(name="name", expected=expected)


# --- 2. a "torch" that is not PyTorch -----------------------------------------------------------------------


@pytest.fixture
def namespace_torch(monkeypatch):
    """A fake torch: what an empty torch/ folder on the path imports as (a namespace package)."""
    fake = types.ModuleType("torch")
    fake.__path__ = []
    monkeypatch.setitem(sys.modules, "torch", fake)


def test_a_torch_that_is_not_pytorch_is_diagnosed_in_environment(namespace_torch, capsys):
    data = environment_json(capsys)
    assert data["torch"] is None
    assert data["torch_error"] == MESSAGES["torch is not PyTorch"]
    assert data["gpu_unavailable_reason"] == MESSAGES["PyTorch not importable"]


def test_a_torch_that_is_not_pytorch_is_refused_by_measure(namespace_torch, tmp_path, capsys):
    measure_refused(tmp_path, capsys, 2, MESSAGES["torch is not PyTorch"], "no file written")


# --- 3. values of the wrong type or range -------------------------------------------------------------------

COUNT = "a whole number >= 0"
ODD_ENVIRONMENT = [
    ("total_memory", "80 GiB", "total_memory", "a whole number > 0"),
    ("total_memory", math.nan, "total_memory", "a whole number > 0"),
    ("total_memory", 0, "total_memory", "a whole number > 0"),
    ("total_memory", 10**mesure_memoire.MAX_DIGITS, "total_memory", "a whole number > 0"),
    ("mem_get_info", 5, "mem_get_info", "a pair of whole numbers, free <= total"),
    ("mem_get_info", ("1", "2"), "mem_get_info", "a pair of whole numbers, free <= total"),
    ("mem_get_info", (3, 2), "mem_get_info", "a pair of whole numbers, free <= total"),
    ("mem_get_info", (1, 10**mesure_memoire.MAX_DIGITS), "mem_get_info", "a pair of whole numbers, free <= total"),
    ("cudnn", math.nan, "cudnn_or_miopen_version", COUNT),
    ("cudnn", b"90100", "cudnn_or_miopen_version", COUNT),
    ("major", "9", "compute_capability", "two whole numbers below 100"),
    ("major", 100, "compute_capability", "two whole numbers below 100"),
    ("device_count", 1.5, "device_count", COUNT),
]


def _make_odd(monkeypatch, stand_in_gpu, what, value):
    properties = stand_in_gpu()
    if what in ("total_memory", "major"):
        setattr(properties, what, value)
    elif what == "mem_get_info":
        monkeypatch.setattr(torch.cuda, "mem_get_info", lambda index: value)
    elif what == "device_count":
        monkeypatch.setattr(torch.cuda, "device_count", lambda: value)
    else:
        monkeypatch.setattr(torch.backends.cudnn, "version", lambda: value)


@pytest.mark.parametrize(("what", "value", "field", "expected"), ODD_ENVIRONMENT, ids=plain_id)
def test_an_odd_value_is_null_with_a_field_error(stand_in_gpu, monkeypatch, capsys, what, value, field, expected):
    _make_odd(monkeypatch, stand_in_gpu, what, value)
    data = environment_json(capsys)
    assert data["field_errors"][field] == MESSAGES["unexpected value"].format(name=field, expected=expected)
    holder = data["gpu"] if field in ("total_memory", "compute_capability") else data
    if field == "mem_get_info":
        assert (data["gpu"]["mem_get_info_free_bytes"], data["gpu"]["mem_get_info_total_bytes"]) == (None, None)
    elif field != "device_count":  # no device count: no GPU to describe
        assert holder[field if field != "total_memory" else "total_memory_bytes"] is None
    assert mesure_memoire.main(["environment", "--device", "cuda:0"]) == 0
    assert "query failed" in capsys.readouterr().out


@pytest.mark.parametrize(("what", "value", "field", "expected"), ODD_ENVIRONMENT, ids=plain_id)
def test_an_odd_value_read_before_the_phases_makes_measure_refuse(
    stand_in_gpu, monkeypatch, tmp_path, capsys, what, value, field, expected
):
    stand_in_measurement(monkeypatch, RecordingCudaStandIn(device=torch.device("cpu")))
    _make_odd(monkeypatch, stand_in_gpu, what, value)
    measure_refused(tmp_path, capsys, 2, MESSAGES["unexpected value"].format(name=field, expected=expected))


def test_values_at_the_edges_of_their_range_are_kept(stand_in_gpu, monkeypatch, capsys):
    properties = stand_in_gpu()
    properties.total_memory = 1  # the smallest total > 0
    largest = 10**mesure_memoire.MAX_DIGITS - 1
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda index: (0, largest))  # a full GPU, the largest total
    data = environment_json(capsys)
    assert data["field_errors"] == {}
    gpu = data["gpu"]
    assert (gpu["total_memory_bytes"], gpu["mem_get_info_free_bytes"], gpu["mem_get_info_total_bytes"]) == (
        1,
        0,
        largest,
    )


@pytest.mark.parametrize("device_ms", [0, 0.0, 1000.5, 10**mesure_memoire.MAX_DIGITS - 1], ids=plain_id)
def test_a_device_time_from_0_to_below_10_to_the_30_ms_is_kept(device_ms):
    record, _ = mesure_memoire.run_phase(RecordingCudaStandIn(device_ms=device_ms), "dev", "inputs", lambda: None)
    assert record["device_ms"] == float(device_ms)


def test_mem_get_info_raising_anything_leaves_it_unknown(stand_in_gpu, monkeypatch, tmp_path, capsys):
    stand_in_measurement(monkeypatch, RecordingCudaStandIn(device=torch.device("cpu")))
    monkeypatch.setattr(torch.cuda, "mem_get_info", raising(OSError("no such device /dev/nvidia0")))
    data = environment_json(capsys)
    assert data["gpu"]["mem_get_info_free_bytes"] is None
    assert data["field_errors"]["mem_get_info"] == "OSError (text withheld)"
    assert mesure_memoire.main(["measure", *SMALL_TRIAL, "--output", str(tmp_path / "o.json")]) == 0
    result = json.loads((tmp_path / "o.json").read_text())
    assert result["configuration"]["device_used_bytes_before_measure"] is None


class OddCounters(RecordingCudaStandIn):
    """The recording stand-in for torch.cuda (no GPU here) whose peak allocated counter is ``peak``."""

    def __init__(self, peak):
        super().__init__(device=torch.device("cpu"))
        self.peak = peak

    def levels(self):
        return {**super().levels(), "peak_allocated": self.peak}


@pytest.mark.parametrize("peak", [1.5, -1, True, "1500"], ids=plain_id)
def test_an_odd_counter_during_the_phases_exits_3_and_writes_nothing(stand_in_gpu, monkeypatch, tmp_path, capsys, peak):
    stand_in_measurement(monkeypatch, OddCounters(peak))
    said = MESSAGES["unexpected value"].format(name="max_memory_allocated", expected=COUNT)
    measure_refused(tmp_path, capsys, 3, "phase model_load failed", said)


DIMENSIONS = "batch 1, context 16, width 64, dtype float32"


def set_up_failed(step, name, expected):
    """The refusal of a set-up step whose reading PyTorch gave of the wrong type or range."""
    error = MESSAGES["unexpected value"].format(name=name, expected=expected)
    return MESSAGES["set-up step failed"].format(step=step, device="cuda:0", error=error)


@pytest.mark.parametrize("counter", ["memory_allocated", "memory_reserved"])
def test_an_odd_counter_before_the_phases_exits_2_naming_the_step(stand_in_gpu, monkeypatch, tmp_path, capsys, counter):
    stand_in_measurement(monkeypatch, RecordingCudaStandIn(device=torch.device("cpu")))
    monkeypatch.setattr(torch.cuda, counter, lambda device: -4096)
    measure_refused(tmp_path, capsys, 2, set_up_failed(f"torch.cuda.{counter}", counter, COUNT))


def test_an_odd_mem_get_info_once_cuda_is_initialised_exits_2_naming_the_step(
    stand_in_gpu, monkeypatch, tmp_path, capsys
):
    stand_in_measurement(monkeypatch, RecordingCudaStandIn(device=torch.device("cpu")))

    def init():  # the reading before CUDA starts was whole; the one after it is not
        monkeypatch.setattr(torch.cuda, "mem_get_info", lambda index: (3, 2))

    monkeypatch.setattr(torch.cuda, "init", init)
    expected = "a pair of whole numbers, free <= total"
    measure_refused(tmp_path, capsys, 2, set_up_failed("torch.cuda.mem_get_info", "mem_get_info", expected))


@pytest.mark.parametrize("device_ms", [True, -0.5, math.nan, 10**mesure_memoire.MAX_DIGITS, "0.25"], ids=plain_id)
def test_an_odd_device_time_during_the_phases_exits_3_naming_it(stand_in_gpu, monkeypatch, tmp_path, capsys, device_ms):
    stand_in_measurement(monkeypatch, RecordingCudaStandIn(device=torch.device("cpu"), device_ms=device_ms))
    said = MESSAGES["unexpected value"].format(name="elapsed_time", expected="a time >= 0 in milliseconds")
    measure_refused(
        tmp_path, capsys, 3, MESSAGES["phase failed"].format(phase="model_load", dimensions=DIMENSIONS, error=said)
    )


class TurningOdd(RecordingCudaStandIn):
    """The recording stand-in for torch.cuda (no GPU here) whose counters in ``odd`` replace its own once set."""

    def __init__(self):
        super().__init__(device=torch.device("cpu"))
        self.odd = {}

    def levels(self):
        return {**super().levels(), **self.odd}


@pytest.mark.parametrize(
    ("level", "name"), [("peak_allocated", "max_memory_allocated"), ("allocated", "memory_allocated")]
)
def test_an_odd_counter_while_the_products_run_once_more_exits_3_naming_it(
    stand_in_gpu, monkeypatch, tmp_path, capsys, level, name
):
    recorder = TurningOdd()
    stand_in_measurement(monkeypatch, recorder)
    real_summary = mesure_memoire.summarize_output

    def summary_then_odd(torch_module, output):  # the phases ran with whole counters; what follows reads odd ones
        summary = real_summary(torch_module, output)
        recorder.odd = {level: -1}
        return summary

    monkeypatch.setattr(mesure_memoire, "summarize_output", summary_then_odd)
    said = MESSAGES["unexpected value"].format(name=name, expected=COUNT)
    failed = MESSAGES["phase failed"].format(phase="per_call_workspace", dimensions=DIMENSIONS, error=said)
    measure_refused(tmp_path, capsys, 3, failed)


# --- 4. what PyTorch raises: an unreadable message, SystemExit, GeneratorExit --------------------------------


class Unprintable(RuntimeError):
    def __str__(self):
        raise ValueError("no message")


RAISED = [Unprintable(), SystemExit(), SystemExit(0), GeneratorExit()]


@pytest.mark.parametrize("error", RAISED, ids=lambda error: type(error).__name__ + str(len(error.args)))
def test_what_pytorch_raises_in_a_query_is_a_field_error(stand_in_gpu, monkeypatch, capsys, error):
    monkeypatch.setattr(torch.cuda, "get_device_properties", raising(error))
    data = environment_json(capsys)
    assert data["gpu"] is None
    assert data["field_errors"]["properties"].startswith(type(error).__name__)


def test_an_error_whose_message_cannot_be_read_is_named_by_its_type_alone(stand_in_gpu, monkeypatch, capsys):
    monkeypatch.setattr(torch.cuda, "get_device_properties", raising(Unprintable()))
    assert environment_json(capsys)["field_errors"]["properties"] == "Unprintable"


@pytest.mark.parametrize("error", RAISED, ids=lambda error: type(error).__name__ + str(len(error.args)))
def test_what_pytorch_raises_in_a_phase_exits_3_in_one_line(stand_in_gpu, monkeypatch, tmp_path, capsys, error):
    stand_in_measurement(monkeypatch, RecordingCudaStandIn(device=torch.device("cpu"), fail_on_synchronize=(4, error)))
    measure_refused(tmp_path, capsys, 3, "phase inputs failed", type(error).__name__)


# --- 5. PyTorch printing on stdout while it loads --------------------------------------------------------------


class PrintingTorch:
    """A fake torch package whose import prints on stdout (and holds nothing else)."""

    def find_spec(self, name, path=None, target=None):
        return importlib.util.spec_from_loader(name, self) if name == "torch" else None

    def create_module(self, spec):
        return None

    def exec_module(self, module):
        print(f"hello from a fake torch, {SECRET}")
        sys.stdout.write(f"and written, {SECRET}\n")


def test_pytorch_s_stdout_at_import_stays_out_of_the_json(monkeypatch, capsys):
    monkeypatch.delitem(sys.modules, "torch")
    monkeypatch.setattr(sys, "meta_path", [PrintingTorch(), *sys.meta_path])
    assert mesure_memoire.main(["environment", "--device", "cuda:0", "--json"]) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out)["torch_error"] == MESSAGES["torch is not PyTorch"]
    assert SECRET not in captured.out + captured.err


# --- 6. PyTorch writing on the process's stderr (its C++ side writes on descriptor 2, past sys.stderr) ------

KNOWN = "CUDA initialization: Found no NVIDIA driver on your system"
ON_STDERR = [
    ("CUDA initialization: Found no NVIDIA driver on your system (at /home/ana/x.so)\n", "stderr: " + KNOWN),
    (f"\x1b[33m[W1206 torch/csrc/x.cpp:12] {SECRET}=1 at /home/ana/env/lib\x1b[0m\n", "stderr: text withheld"),
]


class StderrTorch(PrintingTorch):
    """A fake torch package whose import writes ``text`` on descriptor 2, as PyTorch's C++ side does."""

    def __init__(self, text):
        self.text = text

    def exec_module(self, module):
        import os

        os.write(2, self.text.encode())


@pytest.mark.parametrize(("text", "kept"), ON_STDERR, ids=plain_id)
def test_what_pytorch_writes_on_stderr_at_import_is_kept_by_the_allow_list(monkeypatch, capfd, text, kept):
    monkeypatch.delitem(sys.modules, "torch")
    monkeypatch.setattr(sys, "meta_path", [StderrTorch(text), *sys.meta_path])
    assert mesure_memoire.main(["environment", "--device", "cuda:0", "--json"]) == 0
    captured = capfd.readouterr()
    assert captured.err == "", "nothing PyTorch writes reaches the terminal"
    assert json.loads(captured.out)["field_errors"]["pytorch_warnings"] == kept


@pytest.mark.whole_kit
def test_pytorch_s_own_stderr_line_does_not_make_a_refusal_two_lines(tmp_path):
    """Real PyTorch (CPU build): its C++ side refuses TORCH_CPP_LOG_LEVEL's value on stderr as it loads."""
    no_gpu_here()
    env = {**os.environ, "TORCH_CPP_LOG_LEVEL": "bogus"}
    completed = run_script(
        "mesure_memoire.py", "measure", "--device", "cuda:0", "--output", "x.json", cwd=tmp_path, env=env
    )
    assert_one_line_refusal(completed, "no usable GPU for cuda:0")
    assert list(tmp_path.iterdir()) == []
    completed = run_script("mesure_memoire.py", "environment", "--device", "cuda:0", "--json", cwd=tmp_path, env=env)
    assert (completed.returncode, completed.stderr) == (0, "")
    assert "stderr: text withheld" in json.loads(completed.stdout)["field_errors"]["pytorch_warnings"]
