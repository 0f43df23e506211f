"""--debug (the notebook's DEBUG): PyTorch's own message, its traceback and what PyTorch wrote on stderr, shown on
the terminal only, never in a result file or a JSON output; without it, a refusal that withholds PyTorch's text
names the option (issue 57 item 2).  sweep's passing of it to its children is in test_sweep.py; the marker test
over real PyTorch, with and without it, in test_pytorch_markers.py.

No GPU can be had here: a stand-in for a visible GPU (conftest's ``stand_in_gpu``, ``RecordingCudaStandIn``), whose
PyTorch is made to raise and write a secret on descriptor 2, as PyTorch's C++ side does.
"""

import json
import os

import pytest
import torch

import mesure_memoire
from conftest import MESSAGES, SMALL_TRIAL, RecordingCudaStandIn, error_line, stand_in_measurement

pytestmark = pytest.mark.usefixtures("no_earlier_warnings")

SECRET = "hunter2 at /home/ana/env"


@pytest.fixture
def telling_pytorch(stand_in_gpu, monkeypatch):
    """A stand-in GPU whose cuDNN query writes on stderr (descriptor 2) and raises, both with a secret."""
    stand_in_gpu()

    def version():
        os.write(2, f"[W] {SECRET} on stderr\n".encode())
        raise RuntimeError(f"{SECRET} in a message")

    monkeypatch.setattr(torch.backends.cudnn, "version", version)


def measured(tmp_path, monkeypatch, capfd, *extra):
    stand_in_measurement(monkeypatch, RecordingCudaStandIn(device=torch.device("cpu")))
    output = tmp_path / "o.json"
    assert mesure_memoire.main(["measure", *SMALL_TRIAL, "--output", str(output), *extra]) == 0
    return capfd.readouterr(), output.read_text()


def test_without_debug_nothing_of_pytorch_s_text_is_shown_or_kept(telling_pytorch, tmp_path, monkeypatch, capfd):
    captured, result = measured(tmp_path, monkeypatch, capfd)
    assert SECRET not in captured.out + captured.err + result
    assert (
        json.loads(result)["environment"]["field_errors"]["cudnn_or_miopen_version"] == "RuntimeError (text withheld)"
    )


def test_debug_shows_pytorch_s_message_traceback_and_stderr_on_the_terminal_only(
    telling_pytorch, tmp_path, monkeypatch, capfd
):
    captured, result = measured(tmp_path, monkeypatch, capfd, "--debug")
    assert f"{SECRET} in a message" in captured.err
    assert "Traceback (most recent call last)" in captured.err
    assert f"[W] {SECRET} on stderr" in captured.err
    assert SECRET not in captured.out, "the phase table"
    assert SECRET not in result, "the result file"
    assert (
        json.loads(result)["environment"]["field_errors"]["cudnn_or_miopen_version"] == "RuntimeError (text withheld)"
    )


def phase_failure(tmp_path, monkeypatch, capfd, error, *extra):
    failing = RecordingCudaStandIn(device=torch.device("cpu"), fail_on_synchronize=(4, error))
    stand_in_measurement(monkeypatch, failing)
    code = mesure_memoire.main(["measure", *SMALL_TRIAL, "--output", str(tmp_path / "o.json"), *extra])
    assert code == 3
    assert list(tmp_path.iterdir()) == []
    return capfd.readouterr()


def test_a_refusal_that_withholds_pytorch_s_text_names_debug(stand_in_gpu, tmp_path, monkeypatch, capfd):
    stand_in_gpu()
    captured = phase_failure(tmp_path, monkeypatch, capfd, RuntimeError(SECRET))
    error = MESSAGES["withheld: --debug shows it"].format(type="RuntimeError")
    dimensions = "batch 1, context 16, width 64, dtype float32"
    assert captured.err == error_line(
        MESSAGES["phase failed"].format(phase="inputs", dimensions=dimensions, error=error)
    )


@pytest.mark.parametrize("command", ["environment", "measure", "sweep"])
def test_help_names_debug_and_warns_what_it_may_show(command, capsys):
    assert mesure_memoire.main([command, "--help"]) == 0
    shown = " ".join(capsys.readouterr().out.split())
    assert "--debug" in shown
    assert "may show paths and environment values" in shown


def test_with_debug_an_out_of_memory_failure_shows_pytorch_s_message_too(stand_in_gpu, tmp_path, monkeypatch, capfd):
    stand_in_gpu()
    error = RuntimeError(f"CUDA out of memory. Tried to allocate 2.00 GiB at {SECRET}")
    captured = phase_failure(tmp_path, monkeypatch, capfd, error, "--debug")
    assert f"RuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB at {SECRET}" in captured.err.splitlines()
    *shown, last = captured.err.splitlines()  # the traceback first, then the kit's one line
    assert "Traceback (most recent call last):" in shown
    assert last.startswith("mesure_memoire.py: error: out of memory in phase inputs")
    assert captured.out == ""


def test_debug_shows_no_stderr_heading_when_pytorch_wrote_nothing(stand_in_gpu, capfd):
    stand_in_gpu()
    assert mesure_memoire.main(["environment", "--device", "cuda:0", "--json", "--debug"]) == 0
    assert "what PyTorch wrote on stderr" not in capfd.readouterr().err


def test_environment_with_debug_shows_pytorch_s_text_on_the_terminal_only(telling_pytorch, capfd):
    assert mesure_memoire.main(["environment", "--device", "cuda:0", "--json", "--debug"]) == 0
    captured = capfd.readouterr()
    assert f"{SECRET} in a message" in captured.err
    assert f"[W] {SECRET} on stderr" in captured.err
    assert SECRET not in captured.out
