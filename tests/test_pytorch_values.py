"""PyTorch is input too: each text it returns that the kit keeps is checked where it enters (PYTORCH_TEXTS), each
of its messages is kept by an allow-list, and whatever it raises or prints ends in one line (issue 41).  Its numbers
are kept as it gives them (issue 58: no guard against a value no real PyTorch returns).

The hostile PyTorch here is real PyTorch with some functions replaced (a stand-in for a visible GPU, plus odd
answers), or a fake ``torch`` package: hostile PyTorch behaviour, not a GPU.  The marker test over real
PyTorch's environment variables is tests/test_pytorch_markers.py.
"""

import importlib.util
import json
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
    plain_id,
    plan,
    raising,
    stand_in_measurement,
)

pytestmark = pytest.mark.usefixtures("no_earlier_warnings")

SECRET = "hunter2"


def environment_json(capsys):
    assert mesure_memoire.main(["environment", "--device", "cuda:0", "--json"]) == 0
    captured = capsys.readouterr()
    assert captured.err == ""
    return json.loads(captured.out)


# --- 1. the warnings PyTorch raises: kept by an allow-list ------------------------------------------------

WARNINGS = [
    (
        f"Ignoring invalid value for boolean flag TORCH_BLAS_PREFER_CUBLASLT: {SECRET}valid values are 0 or 1. "
        "(Triggered internally at /pytorch/c10/util/env.cpp:60.)",
        "UserWarning: Ignoring invalid value for boolean flag TORCH_BLAS_PREFER_CUBLASLT",
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
    (f"TORCH_SOMETHING_NEW={SECRET} is deprecated", "UserWarning: text withheld"),
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
    assert mesure_memoire.main(["environment", "--device", "cuda:0"]) == 0  # the same warning again: kept once
    out = capsys.readouterr().out
    assert f"  PyTorch warned        pytorch_warnings: {kept}\n" in out
    assert SECRET not in out


# --- 1. the texts PyTorch returns: versions by a grammar, the GPU's name printable, short, with no path ---


@pytest.mark.parametrize(
    ("where", "value", "kept"),
    [
        ("torch", "2.4.0a0+git1234abc", True),
        ("torch", "2.15.0.dev20261201+cu130", True),
        ("hip_build", "6.3.42131-fa1d09cbd", True),
        ("torch", f"2.13.0+/home/ana/{SECRET}", False),
        ("torch", f"{SECRET} 2.13", False),
        ("cuda_build", f"13.0 {SECRET}", False),
        ("hip_build", f"/opt/{SECRET}/6.3", False),
    ],
    ids=plain_id,
)
def test_a_version_is_kept_as_is_or_null_with_a_field_error(stand_in_gpu, monkeypatch, capsys, where, value, kept):
    if where == "torch":
        monkeypatch.setattr(torch, "__version__", value)
    else:
        monkeypatch.setattr(torch.version, where.partition("_")[0], value)
    data = environment_json(capsys)
    assert data[where] == (value if kept else None)
    if not kept:
        assert data["field_errors"][where] == MESSAGES["withheld text"].format(name=where, expected="a version")
        assert SECRET not in json.dumps(data)


def test_measure_goes_on_with_a_withheld_version_null_and_its_field_error(stand_in_gpu, monkeypatch, tmp_path, capsys):
    """A version text the kit withholds is no refusal: the result holds it null, with its field error."""
    stand_in_gpu()
    stand_in_measurement(monkeypatch, RecordingCudaStandIn(device=torch.device("cpu")))
    monkeypatch.setattr(torch, "__version__", f"2.13.0+/home/ana/{SECRET}")
    output = tmp_path / "r.json"
    assert mesure_memoire.main(["measure", *SMALL_TRIAL, "--output", str(output)]) == 0, capsys.readouterr().err
    environment = json.loads(output.read_text(encoding="utf-8"))["environment"]
    assert environment["torch"] is None
    assert environment["field_errors"]["torch"] == MESSAGES["withheld text"].format(name="torch", expected="a version")
    assert SECRET not in output.read_text(encoding="utf-8")


def test_the_gpu_s_name_is_kept_as_is_and_withheld_when_not_short_printable_text_without_a_path(stand_in_gpu, capsys):
    properties = stand_in_gpu()
    for kept in ("NVIDIA A100-SXM4-80GB (MIG 1g.10gb)", "X", "x" * 100):
        properties.name = kept
        assert environment_json(capsys)["gpu"]["name"] == kept
    expected = "printable text of at most 100 characters without /, \\ or ~"
    for odd in (
        f"NVIDIA H200 (from /home/ana/{SECRET}/x.so)",
        f"GPU C:\\Users\\{SECRET}",
        f"GPU ~{SECRET}",
        "x" * 101,
        "",
        f"GPU\x1b[31m{SECRET}",
    ):
        properties.name = odd
        data = environment_json(capsys)
        assert data["gpu"]["name"] is None, odd
        assert data["field_errors"]["name"] == MESSAGES["withheld text"].format(name="name", expected=expected)


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
    assert mesure_memoire.main(["environment", "--device", "cuda:0"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[3] == f"  PyTorch               not importable ({MESSAGES['torch is not PyTorch']})"
    assert lines[7:9] == [
        "  device                cuda:0 (PyTorch sees no device(s))",
        "  GPU usable            no: PyTorch is not importable",
    ]


# --- 3. a reading PyTorch cannot give: unknown ---------------------------------------------------------------


def test_mem_get_info_raising_anything_leaves_the_free_bytes_unknown_and_the_fit_check_uses_the_total(
    stand_in_gpu, monkeypatch, tmp_path, capsys
):
    """The fit check then compares with the announced total, at the byte: the run fits it; one byte less, refused."""
    stand_in_measurement(monkeypatch, RecordingCudaStandIn(device=torch.device("cpu")))
    needed = plan(1, 16, 64, "float32")["needs_free_bytes"]  # SMALL_TRIAL's
    codes = []
    for total in (needed, needed - 1):
        stand_in_gpu(total_memory=total)
        monkeypatch.setattr(torch.cuda, "mem_get_info", raising(OSError("no such device /dev/nvidia0")))
        codes.append(mesure_memoire.main(["measure", *SMALL_TRIAL, "--output", str(tmp_path / f"{total}.json")]))
    assert codes == [0, 2]
    said = capsys.readouterr().err
    assert f"exceeds the {needed - 1} bytes (1.25 GiB) announced in total (mem_get_info failed) less a" in said
    assert [path.name for path in tmp_path.iterdir()] == [f"{needed}.json"]
    written = (tmp_path / f"{needed}.json").read_text(encoding="utf-8")
    environment = json.loads(written)["environment"]
    gpu = environment["gpu"]
    assert gpu["total_memory_bytes"] == needed
    assert gpu["mem_get_info_free_bytes"] is None and gpu["mem_get_info_total_bytes"] is None
    assert environment["field_errors"] == {"mem_get_info": "OSError (text withheld)"}
    assert "nvidia0" not in written


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


class StderrTorch(PrintingTorch):
    """A fake torch package whose import writes ``text`` on descriptor 2, as PyTorch's C++ side does."""

    def __init__(self, text):
        self.text = text

    def exec_module(self, module):
        import os

        os.write(2, self.text.encode("utf-8", "surrogateescape"))  # "\udcff": the byte 0xff, not UTF-8


ON_STDERR = {
    "known": ("CUDA initialization: Found no NVIDIA driver on your system (at /home/ana/x.so)\n", "stderr: " + KNOWN),
    "unknown": (
        f"\x1b[33m[W1206 torch/csrc/x.cpp:12] {SECRET}=1 at /home/ana/env/lib\x1b[0m\n",
        "stderr: text withheld",
    ),
    "not-utf-8": ("\udcff\udcfe at /home/ana\n", "stderr: text withheld"),
    "a-line-of-spaces": (f"   \n{KNOWN}\n", f"stderr: {KNOWN}"),
}


@pytest.mark.parametrize("case", sorted(ON_STDERR))
def test_what_pytorch_writes_on_stderr_at_import_is_kept_by_the_allow_list(monkeypatch, capfd, case):
    """Bytes that are not UTF-8 are no crash; a line of spaces is no line."""
    text, kept = ON_STDERR[case]
    monkeypatch.delitem(sys.modules, "torch")
    monkeypatch.setattr(sys, "meta_path", [StderrTorch(text), *sys.meta_path])
    assert mesure_memoire.main(["environment", "--device", "cuda:0", "--json"]) == 0
    captured = capfd.readouterr()
    assert captured.err == "", "nothing PyTorch writes reaches the terminal"
    assert json.loads(captured.out)["field_errors"]["pytorch_warnings"] == kept


def test_descriptor_2_is_the_terminal_s_again_after_the_capture(capfd):
    """What is written on descriptor 2 once the command is over (a C library, a later message) reaches the terminal."""
    assert mesure_memoire.main(["environment", "--device", "cuda:0", "--json"]) == 0
    os.write(2, b"after the command\n")
    assert capfd.readouterr().err == "after the command\n"


@pytest.mark.parametrize("call", ["pipe", "dup"])
def test_no_descriptor_left_for_the_capture_is_no_failure_and_no_invented_line(monkeypatch, capsys, call):
    """A process at its descriptor limit (EMFILE: no pipe, or descriptor 2 cannot be saved): PyTorch's stderr is
    not captured, nothing is made up for it."""
    import errno

    def no_descriptor(*_):
        raise OSError(errno.EMFILE, "Too many open files")

    monkeypatch.setattr(os, call, no_descriptor)  # a stand-in for the limit, met where the capture needs one
    assert mesure_memoire.main(["environment", "--device", "cuda:0", "--json"]) == 0
    assert "pytorch_warnings" not in json.loads(capsys.readouterr().out)["field_errors"]
