"""`mesure_memoire.py measure` on the command line: its refusals (for real, then past the device checks on a
stand-in GPU), one line for a failure at any step, the phase table it prints, its options and help, its
standard streams, Ctrl-C and signals.

No GPU can be had here.  Refusals run for real against the CPU build of PyTorch; where the GPU path must be
exercised, the tests name their stand-ins (``stand_in_gpu`` and ``RecordingCudaStandIn``, in conftest).
The hostile values every command refuses are one table in test_command_line.py.
"""

import errno
import io
import json
import os
import re
import signal
import subprocess
import sys
from decimal import Decimal

import pytest
import torch

import mesure_memoire
from conftest import (
    GIB,
    MEASURE,
    MESSAGES,
    MIB,
    NO_PER_CALL,
    ROOT,
    SMALL_TRIAL,
    RecordingCudaStandIn,
    UnwritableStdout,
    assert_one_line_refusal,
    config,
    error_line,
    message_pattern,
    no_gpu_here,
    refused,
    run_in_process,
    run_script,
    sigint_as_from_a_terminal,
    stand_in_measurement,
    tree_digest,
)

NO_GPU = error_line(refused(message_pattern("no usable GPU, run it on the GPU box", device="cuda:0")))

# PyTorch warnings recorded by earlier tests would show in field_errors: each test starts from none.
pytestmark = pytest.mark.usefixtures("no_earlier_warnings")


# --- refusals, for real (CPU build of PyTorch, or none) -------------------------------------------


@pytest.mark.whole_kit
def test_no_torch_is_refused(tmp_path):
    completed = run_script(
        "mesure_memoire.py", "measure", *SMALL_TRIAL, "--output", "out.json", cwd=tmp_path, python_flags=("-S",)
    )
    assert_one_line_refusal(completed, MESSAGES["PyTorch not importable"], MESSAGES["run it on the GPU box"])
    assert list(tmp_path.iterdir()) == []


# --- refusals and failures past the device checks (stand-in GPU) ----------------------------------


def test_stand_in_a_device_out_of_range_is_refused(stand_in_gpu, tmp_path, capsys):
    stand_in_gpu(count=1)
    assert mesure_memoire.main(["measure", "--device", "cuda:1", "--output", str(tmp_path / "o.json")]) == 2
    reason = MESSAGES["device out of range"].format(device="cuda:1", count=1)
    said = MESSAGES["no usable GPU, run it on the GPU box"].format(device="cuda:1", reason=reason)
    assert capsys.readouterr().err == error_line(refused(said))
    assert list(tmp_path.iterdir()) == []


def test_stand_in_out_of_memory_exits_3_naming_phase_and_configuration(stand_in_gpu, monkeypatch, tmp_path, capsys):
    error = torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
    stand_in_measurement(
        monkeypatch, RecordingCudaStandIn(fail_on_synchronize=(8, error), device=torch.device("cpu"))
    )  # warmup's end
    output = tmp_path / "o.json"
    assert mesure_memoire.main(["measure", *SMALL_TRIAL, "--output", str(output)]) == 3
    said = MESSAGES["phase out of memory"].format(
        phase="warmup", dimensions="batch 1, context 16, width 64, dtype float32", device="cuda:0"
    )
    assert capsys.readouterr().err == error_line(said)
    assert list(tmp_path.iterdir()) == []


# --- no traceback after validation: a failure injected at each step -----------------------------


def _boom(*args, **kwargs):
    raise RuntimeError("CUDA error: unspecified launch failure in /opt/secret/libcuda.so")


SHOWN_BOOM = "RuntimeError: CUDA error: unspecified launch failure in"  # _boom's error: its known part, no path
DIMENSIONS = "batch 1, context 16, width 64, dtype float32"


def set_up_failed(step):
    return refused(MESSAGES["set-up step failed"].format(step=step, device="cuda:0", error=SHOWN_BOOM))


def phase_failed(phase, error=SHOWN_BOOM):
    return MESSAGES["phase failed"].format(phase=phase, dimensions=DIMENSIONS, error=error)


WITHHELD = MESSAGES["withheld: --debug shows it"].format(type="RuntimeError")


@pytest.mark.parametrize(
    ("owner", "name", "dtype", "exit_code", "message"),
    [
        ("torch.cuda", "get_device_capability", "float16", 2, set_up_failed("the dtype probe")),
        ("torch.cuda", "is_bf16_supported", "bfloat16", 2, set_up_failed("the dtype probe")),
        ("torch.cuda", "set_device", "float32", 2, set_up_failed("torch.cuda.set_device")),
        ("torch", "device", "float32", 2, set_up_failed("torch.device")),
        ("torch.cuda", "init", "float32", 2, set_up_failed("torch.cuda.init")),
        ("torch.cuda", "memory_allocated", "float32", 2, set_up_failed("torch.cuda.memory_allocated")),
        ("torch.cuda", "memory_reserved", "float32", 2, set_up_failed("torch.cuda.memory_reserved")),
        ("torch", "manual_seed", "float32", 2, refused(MESSAGES["seeding failed"].format(error=SHOWN_BOOM))),
        ("stand-in", "synchronize", "float32", 3, phase_failed("inputs", WITHHELD)),  # an error not allow-listed
        ("stand-in", "Event", "float32", 3, phase_failed("model_load")),
        ("kit", "summarize_output", "float32", 3, phase_failed("output_summary")),
        ("kit", "measure_per_call_workspace", "float32", 3, phase_failed("per_call_workspace")),
    ],
)
def test_a_failure_at_each_step_is_one_line_and_writes_nothing(
    stand_in_gpu, monkeypatch, tmp_path, capsys, owner, name, dtype, exit_code, message
):
    recorder = RecordingCudaStandIn(device=torch.device("cpu"))
    stand_in_measurement(monkeypatch, recorder)
    if name == "synchronize":  # the inputs phase's first synchronize
        recorder.fail_on_synchronize = (4, RuntimeError("bad"))
    else:
        owners = {"torch.cuda": torch.cuda, "torch": torch, "stand-in": recorder, "kit": mesure_memoire}
        monkeypatch.setattr(owners[owner], name, _boom)
    arguments = ["measure", *SMALL_TRIAL, "--output", str(tmp_path / "o.json")]
    arguments[arguments.index("--dtype") + 1] = dtype
    assert mesure_memoire.main(arguments) == exit_code
    captured = capsys.readouterr()
    assert captured.err == error_line(message)
    assert captured.out == ""
    assert list(tmp_path.iterdir()) == []


def test_a_set_up_failure_that_withholds_pytorch_s_text_names_debug(stand_in_gpu, monkeypatch, tmp_path, capsys):
    """What to do next: PyTorch's text, not allow-listed, is withheld, and --debug shows it."""

    def failing():
        raise RuntimeError("bad")

    stand_in_measurement(monkeypatch, RecordingCudaStandIn(device=torch.device("cpu")))
    monkeypatch.setattr(torch.cuda, "init", failing)
    assert mesure_memoire.main(["measure", *SMALL_TRIAL, "--output", str(tmp_path / "o.json")]) == 2
    message = MESSAGES["set-up step failed"].format(step="torch.cuda.init", device="cuda:0", error=WITHHELD)
    assert capsys.readouterr().err == error_line(refused(message))
    assert list(tmp_path.iterdir()) == []


# --- the phase table ---------------------------------------------------------------------------------

PHASE_TABLE_RESULT = {
    "configuration": {"fresh_process_warning": None},
    "workspace": {"measured_bytes": 0, "allowance_bytes": 256 * MIB, "per_call": NO_PER_CALL},
    "phases": [
        {
            "phase": "model_load",
            "nanoseconds": 1234500,
            "device_ms": None,
            "end_allocated_bytes": 9 * 2**17,
            "peak_allocated_bytes": 3 * MIB,
            "peak_reserved_bytes": 2 * MIB,
            "verdict": "agrees",
        },
        {
            "phase": "warmup",
            "passes": 3,
            "nanoseconds": 10**6,
            "device_ms": 0.25,
            "end_allocated_bytes": 0,
            "peak_allocated_bytes": 5 * 2**18,
            "peak_reserved_bytes": GIB,
            "verdict": "disagrees",
        },
        {
            "phase": "warm_forward",
            "repetition": 2,
            "nanoseconds": 999,
            "device_ms": 12.3456,
            "end_allocated_bytes": 512,
            "peak_allocated_bytes": 512,
            "peak_reserved_bytes": MIB,
        },
    ],
    "prediction_check": {
        "disagreements": [
            {
                "phase": "warmup",
                "repetition": None,
                "counter": "peak_allocated_bytes",
                "measured_bytes": 1536,
                "predicted_bytes": 1024,
                "difference_bytes": 512,
            },
            {
                "phase": "warm_forward",
                "repetition": 2,
                "counter": "end_requested_bytes",
                "measured_bytes": 0,
                "predicted_bytes": 4,
                "difference_bytes": -4,
            },
        ]
    },
    "output_summary": {"elements": 1024, "all_finite": True, "checksum_float64": -1.25},
    "sustained": {
        "sustained_seconds": 60,
        "forwards_per_window": 10,
        "window_ms_per_forward": [Decimal("0.1"), Decimal("0.12"), Decimal("0.13")],
        "steady_ms_per_forward": Decimal("0.12"),
        "steady": False,
        "ratio_to_warm_median": Decimal("1.0404"),
    },
    "card_state": {
        "before_warmup": {
            "reading": dict.fromkeys(mesure_memoire.CARD_FIELDS) | {"max_sm_clock_mhz": 1980},
            "why_null": None,
        },
        "last_sustained_window": {
            "reading": {
                "sm_clock_mhz": 1755,
                "max_sm_clock_mhz": 1980,
                "power_draw_w": 699.12,
                "power_limit_w": 700.0,
                "temperature_c": 61,
                "clock_event_reasons": ["sw_power_cap", "hw_slowdown"],
            },
            "why_null": None,
        },
    },
}

# Half-up everywhere: 1.2345 ms -> 1.235, 1.125 MiB -> 1.13 (half-even would write 1.234 and 1.12).
PHASE_TABLE_TEXT = """\
phase               ms  device ms  end alloc MiB  peak alloc MiB  peak reserved MiB   prediction
model_load       1.235        n/a           1.13            3.00               2.00       agrees
warmup x3        1.000      0.250           0.00            1.25            1024.00    DISAGREES
warm_forward #2  0.001     12.346           0.00            0.00               1.00  not checked
DISAGREES warmup: peak_allocated_bytes above baseline measured 1536, predicted 1024 (difference +512 bytes)
DISAGREES warm_forward #2: end_requested_bytes above baseline measured 0, predicted 4 (difference -4 bytes)
Card before the warm-up (nvidia-smi): SM clock n/a of 1980 MHz, power n/a of n/a W, n/a C, clock events: n/a
Card in the last window (nvidia-smi): SM clock 1755 of 1980 MHz, power 699.12 of 700.0 W, 61 C, \
clock events: sw_power_cap, hw_slowdown"""


def test_the_phase_table_exactly():
    assert mesure_memoire.format_phase_table(PHASE_TABLE_RESULT) == PHASE_TABLE_TEXT


def test_the_phase_table_names_each_reason_a_phase_was_not_checked_once():
    reasons = ["the first reason", "the second reason", "the first reason"]
    phases = [
        dict(phase, verdict="not checked", not_checked_reason=reason)
        for phase, reason in zip(PHASE_TABLE_RESULT["phases"], reasons, strict=True)
    ]
    lines = mesure_memoire.format_phase_table(dict(PHASE_TABLE_RESULT, phases=phases)).splitlines()
    assert lines[6:9] == [
        "Not checked: the first reason",
        "Not checked: the second reason",
        PHASE_TABLE_TEXT.splitlines()[6],
    ]


def test_the_phase_table_says_an_output_not_all_finite_and_zero_passes():
    phases = [dict(PHASE_TABLE_RESULT["phases"][1], passes=0), *PHASE_TABLE_RESULT["phases"][2:]]
    summary = {"elements": 4, "all_finite": False, "checksum_float64": None}
    result = dict(PHASE_TABLE_RESULT, phases=phases, output_summary=summary, sustained=None)
    lines = mesure_memoire.format_phase_table(result).splitlines()
    assert lines[1].startswith("warmup x0  ")  # zero passes is still a count, not a missing one
    assert lines[5:] == ["Last output: NOT ALL FINITE", PHASE_TABLE_TEXT.splitlines()[6]]


def test_the_measure_command_prints_the_table_the_warning_and_the_name(monkeypatch, tmp_path, capsys):
    monkeypatch.chdir(tmp_path)
    result = dict(PHASE_TABLE_RESULT, configuration={"fresh_process_warning": "not a fresh\nprocess"})

    def measure(configuration, tool):  # a stand-in: no GPU here; the result says what it was asked
        warning = result["configuration"]["fresh_process_warning"]
        return {**result, "configuration": {**configuration, "fresh_process_warning": warning}, "tool": tool}

    monkeypatch.setattr(mesure_memoire, "measure", measure)
    arguments = ["measure", "--device", "cuda:2", "--batch", "4", "--output", "out\tname.json"]
    assert mesure_memoire.main(arguments) == 0
    captured = capsys.readouterr()
    written = json.loads((tmp_path / "out\tname.json").read_text(encoding="utf-8"))
    asked = {**config(device="cuda:2", batch=4), "fresh_process_warning": "not a fresh\nprocess"}
    assert (written["configuration"], written["tool"]) == (asked, "mesure_memoire.py")
    assert captured.err == "mesure_memoire.py: warning: not a fresh\\nprocess\n"
    assert captured.out == PHASE_TABLE_TEXT + "\nResult written to 'out\\tname.json'\n"
    result["configuration"]["fresh_process_warning"] = None
    assert mesure_memoire.main(["measure", "--device", "cuda:0", "--output", "plain name.json"]) == 0
    captured = capsys.readouterr()
    assert captured.err == ""
    assert captured.out.endswith("\nResult written to plain name.json\n")


def test_a_name_an_ascii_only_stdout_cannot_encode_is_escaped_not_a_failure(monkeypatch):
    monkeypatch.setattr(mesure_memoire, "measure_to_file", lambda *args, **kwargs: PHASE_TABLE_RESULT)
    written = io.BytesIO()  # sys.stdout as PYTHONIOENCODING=ascii (or a C locale) makes it
    monkeypatch.setattr(sys, "stdout", io.TextIOWrapper(written, encoding="ascii"))
    # The result is written before its name is printed: the status must not say the command failed.
    assert mesure_memoire.main([*MEASURE, "--output", "r\u00e9sultat.json"]) == 0
    sys.stdout.flush()
    assert written.getvalue().decode("ascii").endswith("Result written to r\\xe9sultat.json\n")


# --- streams, Ctrl-C, the real no-GPU path -------------------------------------------------------


def test_a_stream_left_alone_and_a_closed_interpreter_stdout_survive_a_failed_stdout(tmp_path, capsys):
    """A failed stdout points the real descriptor at os.devnull (test_command_line.py): never another stream's,
    and a closed one is no second failure."""
    real_stdout = sys.__stdout__
    with open(tmp_path / "other.txt", "w") as other:  # not the interpreter's stdout: left alone
        assert mesure_memoire.GuardedStdout(other).failed("mesure_memoire.py", BrokenPipeError(errno.EPIPE, "x")) == 1
        assert os.path.realpath(f"/proc/self/fd/{other.fileno()}") == str(tmp_path / "other.txt")
    sys.__stdout__ = other  # closed now
    try:
        assert mesure_memoire.GuardedStdout(other).failed("mesure_memoire.py", BrokenPipeError(errno.EPIPE, "x")) == 1
    finally:
        sys.__stdout__ = real_stdout
    assert capsys.readouterr().err == ""


def test_main_restores_stdout(capsys):
    stdout = sys.stdout
    assert mesure_memoire.main(["estimate", "--parameters", "x", "--bits", "1"]) == 2
    assert sys.stdout is stdout


def test_no_gpu_is_a_one_line_refusal_that_writes_nothing(folder, capsys):
    no_gpu_here()
    code, captured = run_in_process(capsys, folder, [*MEASURE, "--output", "o.json"])
    assert code == 2
    assert captured.out == ""
    assert re.fullmatch(NO_GPU, captured.err), captured.err


# measure() stood in for (no GPU here): it blocks, or the write blocks once its partial file exists.
BLOCKED = """
import os, sys, time
sys.path.insert(0, sys.argv[1])
import mesure_memoire
ready = int(sys.argv[2])
def blocked(*args):
    os.write(ready, b"r")
    time.sleep(60)
if sys.argv[3] == "measuring":
    mesure_memoire.measure = blocked
else:
    mesure_memoire.measure = lambda config, tool: {}
    os.fsync = blocked
raise SystemExit(mesure_memoire.main(sys.argv[4:]))
"""


@pytest.mark.parametrize(
    ("where", "sent", "status", "said"),
    [
        ("measuring", signal.SIGINT, 130, "Ctrl-C"),
        ("writing", signal.SIGINT, 130, "Ctrl-C"),
        ("writing", signal.SIGTERM, 143, "SIGTERM"),
    ],
)
def test_a_signal_while_measuring_or_writing_is_one_line_and_leaves_no_file(folder, where, sent, status, said):
    """SIGTERM (timeout, a scheduler, docker stop) is handled as Ctrl-C: the partial file goes, 128 + 15."""
    before = tree_digest(folder)
    read_end, write_end = os.pipe()
    process = subprocess.Popen(
        [sys.executable, "-c", BLOCKED, str(ROOT), str(write_end), where, *MEASURE, "--output", "o.json"],
        cwd=folder,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        pass_fds=(write_end,),
        preexec_fn=sigint_as_from_a_terminal,
    )
    os.close(write_end)
    try:
        assert os.read(read_end, 1) == b"r"  # the child is inside the command, or writing its partial file
        partial = [path.name for path in folder.iterdir() if path.name.startswith(".partial-")]
        assert len(partial) == (where == "writing")
        process.send_signal(sent)
        out, err = process.communicate(timeout=60)
    finally:
        os.close(read_end)
        process.kill()
    assert (process.returncode, out) == (status, b"")
    assert err.decode() == MESSAGES["interrupted, no partial file"].format(signal=said)
    assert tree_digest(folder) == before


@pytest.mark.parametrize(
    "stderr",
    [None, UnwritableStdout(OSError(errno.ENOSPC, "No space left")), UnwritableStdout(ValueError("closed file"))],
    ids=["none", "full", "closed"],
)
def test_an_unusable_stderr_is_no_crash(monkeypatch, capsys, stderr):
    """pythonw gives no sys.stderr: a refusal that cannot be said keeps its status, and the flushes around
    PyTorch's capture of stderr are no failure."""
    monkeypatch.setattr(sys, "stderr", stderr)
    assert mesure_memoire.main(["estimate", "--parameters", "x", "--bits", "1"]) == 2
    assert mesure_memoire.main(["environment", "--device", "cuda:0", "--json"]) == 0
    assert "field_errors" in json.loads(capsys.readouterr().out)


def test_a_refusal_is_flushed_as_it_is_said(monkeypatch):
    """A notebook's stderr is not line-buffered: the line must not wait behind the output that follows."""
    flushed = []

    class Recording(io.StringIO):
        def flush(self):
            flushed.append(self.getvalue())

    monkeypatch.setattr(sys, "stderr", Recording())
    assert mesure_memoire.main(["estimate", "--parameters", "x", "--bits", "1"]) == 2
    assert flushed == [sys.stderr.getvalue()]


def test_a_stdout_without_an_encoding_gets_the_text(monkeypatch):
    """io.StringIO (contextlib.redirect_stdout in a notebook) has no encoding: the text is written all the same."""
    stream = io.StringIO()
    monkeypatch.setattr(sys, "stdout", stream)
    assert mesure_memoire.main(["estimate", "--parameters", "7000000000", "--bits", "16", "--reserve-gib", "4"]) == 0
    assert "7000000000" in stream.getvalue()


def test_no_stdout_at_all_is_one_line_and_exit_1(monkeypatch, capsys):
    """pythonw gives no sys.stdout: the text has nowhere to go, and the one line says so."""
    monkeypatch.setattr(sys, "stdout", None)
    assert mesure_memoire.main(["estimate", "--parameters", "7000000000", "--bits", "16", "--reserve-gib", "4"]) == 1
    closed = MESSAGES["cannot write the output"].format(error=MESSAGES["stdout closed"])
    assert capsys.readouterr().err == error_line(closed)


def test_the_options_and_their_defaults_reach_the_configuration(capsys):
    """What --plan --json shows as its configuration: the defaults, then every option given."""
    assert mesure_memoire.main(["measure", "--device", "cuda:0", "--plan", "--json"]) == 0
    defaults = json.loads(capsys.readouterr().out)["configuration"]
    expected = {"device": "cuda:0", "batch": 1, "context": 16, "width": 64, "dtype": "float32"}
    assert defaults == {**expected, "warmup": 1, "repeats": 2, "seed": 0, "sustained_seconds": None}
    arguments = ["--device", "cuda:9999", "--batch", "3", "--context", "4", "--width", "5", "--dtype", "float16"]
    arguments += ["--warmup", "1000", "--repeats", "1000", "--seed", str(2**64 - 1), "--sustained-s", "600"]
    assert mesure_memoire.main(["measure", *arguments, "--plan", "--json"]) == 0  # each at its upper bound
    given = json.loads(capsys.readouterr().out)["configuration"]
    expected = {"device": "cuda:9999", "batch": 3, "context": 4, "width": 5, "dtype": "float16"}
    assert given == {**expected, "warmup": 1000, "repeats": 1000, "seed": 2**64 - 1, "sustained_seconds": 600}


# Each command's help: its summary and every option's line, as the README documents them.
HELP_LINES = {
    "": [
        "usage: mesure_memoire.py [-h] COMMAND ...",
        "IteraGPU Lab v1: how much memory do the weights take (estimate), which Python, PyTorch and GPU",
        "    estimate   weight memory from a parameter count, no GPU",
        "               diagnose Python, PyTorch and the chosen GPU",
        "    measure    measure the synthetic MLP phase by phase on a GPU",
        "    sweep      measure one dimension at several values, each in a fresh process",
        "    report     compare result files side by side, one row each; writes nothing",
        "mesure_memoire.py COMMAND --help prints a command's options.",
        "Numbers: a whole number is 0 or ASCII digits not starting with 0 (07 and cuda:00 are refused)",
    ],
    "estimate": [
        "usage: mesure_memoire.py estimate [-h] --parameters N --bits N [--reserve-gib GIB] [--json]",
        "  --parameters N     number of parameters, a positive integer",
        "  --bits N           storage width per parameter in bits (4, 8, 16, 32 ...)",
        "  --reserve-gib GIB  extra GiB you assume on top of the weights (a hypothesis; default 0)",
        "  --json             print one JSON object instead of text",
    ],
    "environment": [
        "usage: mesure_memoire.py environment [-h] --device cuda:N [--json]",
        "diagnose Python, PyTorch and the chosen GPU",
        "  --device cuda:N  the GPU to inspect",
    ],
    "measure": [
        "  --device cuda:N   the GPU to measure",
        "  --output FILE     new JSON file for the result (never overwritten); required unless --plan",
        "  --batch N         batch size (default 1)",
        "  --context N       positions per input row (default 16)",
        "  --width N         model width; the hidden layer is 4x (default 64)",
        "  --dtype NAME      float32, float16 or bfloat16 (default float32)",
        "  --warmup N        warm-up passes, 0 to 1000 (default 1)",
        "  --repeats N       measured warm passes, 1 to 1000 (default 2)",
        "  --seed N          seed of the weights and inputs (default 0)",
        "  --sustained-s SECONDS",
        "  --plan            predict the memory per phase: arithmetic only, no GPU, writes nothing",
        "  --json            with --plan: print one JSON object",
        "  --memory-gib GIB  with --plan: a card's memory in GiB as PyTorch reports it (environment shows it",
    ],
    "sweep": [
        "usage: mesure_memoire.py sweep [-h] --device cuda:N --vary DIMENSION --values V1,V2,... --output-dir",
        "measure one dimension at several values, each in a fresh process",
        "  --vary DIMENSION      batch, context or width: the dimension that takes the values",
        "  --values V1,V2,...    strictly increasing whole numbers, separated by commas",
        "  --output-dir NEW_FOLDER",
        "                        a new folder (created; never an existing one)",
        "  --timeout-s SECONDS   a child still running after this many seconds is stopped (default 1800)",
    ],
    "report": [
        "usage: mesure_memoire.py report [-h] [--json] FILE [FILE ...]",
        "  FILE        result files in the order to show, or the folder sweep wrote; after --, a name may start with -",
        "  --json      print one JSON object instead of text",
    ],
}


@pytest.mark.parametrize("command", HELP_LINES)
def test_each_help_lists_its_options_and_defaults(command, capsys):
    assert mesure_memoire.main([command, "--help"] if command else ["--help"]) == 0
    # Spacing and line breaks compared loosely: argparse's layout differs between Python versions (3.13
    # indents the commands and wraps the usage elsewhere); the words and their order are what is pinned.
    shown = " ".join(capsys.readouterr().out.split())
    for line in HELP_LINES[command]:
        assert " ".join(line.split()) in shown, line
