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
import stat
import subprocess
import sys

import pytest
import torch

import mesure_memoire
from conftest import (
    BLOCK_NUMPY,
    GIB,
    MEASURE,
    MESSAGES,
    MESURE_SCRIPT,
    MIB,
    MINE,
    NO_PER_CALL,
    ROOT,
    SMALL_TRIAL,
    RecordingCudaStandIn,
    assert_one_line_refusal,
    config,
    error_line,
    message_pattern,
    no_gpu_here,
    run_in_process,
    run_script,
    sigint_as_from_a_terminal,
    stand_in_measurement,
    tree_digest,
)

NO_GPU = error_line(message_pattern("no usable GPU, nothing measured", device="cuda:0"))
STDOUT_FULL = error_line(
    MESSAGES["cannot write the output"].format(error="OSError: [Errno 28] No space left on device")
)

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


@pytest.mark.parametrize(
    ("stand_in", "argv", "said"),
    [
        (
            {"count": 1},
            ["--device", "cuda:1"],
            MESSAGES["no usable GPU, nothing measured"].format(
                device="cuda:1", reason=MESSAGES["device out of range"].format(device="cuda:1", count=1)
            ),
        ),
        (
            {"bf16": False},
            ["--device", "cuda:0", "--dtype", "bfloat16"],
            MESSAGES["dtype not supported"].format(
                dtype="bfloat16", problem=MESSAGES["bfloat16 not native"], gpu="Stand-in GPU"
            ),
        ),
    ],
    ids=["device-out-of-range", "bfloat16-not-native"],
)
def test_stand_in_a_device_that_cannot_run_the_trial_is_refused(stand_in_gpu, tmp_path, capsys, stand_in, argv, said):
    stand_in_gpu(**stand_in)
    assert mesure_memoire.main(["measure", *argv, "--output", str(tmp_path / "o.json")]) == 2
    assert capsys.readouterr().err == error_line(said)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    ("option", "value"), [("--width", "1000000"), ("--batch", "100000000000"), ("--context", "999999999999")]
)
def test_stand_in_absurd_sizes_are_refused_cleanly(stand_in_gpu, tmp_path, capsys, option, value):
    stand_in_gpu(total_memory=80 * 2**30)
    code = mesure_memoire.main(["measure", "--device", "cuda:0", option, value, "--output", str(tmp_path / "o.json")])
    assert code == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1
    assert "shrink" in err
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
    return MESSAGES["set-up step failed"].format(step=step, device="cuda:0", error=SHOWN_BOOM)


def phase_failed(phase, error=SHOWN_BOOM):
    return MESSAGES["phase failed"].format(phase=phase, dimensions=DIMENSIONS, error=error)


@pytest.mark.parametrize(
    ("step", "dtype", "exit_code", "message"),
    [
        ("get_device_capability", "float16", 2, set_up_failed("the dtype probe")),
        ("is_bf16_supported", "bfloat16", 2, set_up_failed("the dtype probe")),
        ("set_device", "float32", 2, set_up_failed("torch.cuda.set_device")),
        ("device", "float32", 2, set_up_failed("torch.device")),
        ("init", "float32", 2, set_up_failed("torch.cuda.init")),
        ("memory_allocated", "float32", 2, set_up_failed("torch.cuda.memory_allocated")),
        ("memory_reserved", "float32", 2, set_up_failed("torch.cuda.memory_reserved")),
        ("manual_seed", "float32", 2, MESSAGES["seeding failed"].format(error=SHOWN_BOOM)),
        (
            "a phase",
            "float32",
            3,
            phase_failed("inputs", MESSAGES["withheld: --debug shows it"].format(type="RuntimeError")),
        ),
        ("events", "float32", 3, phase_failed("model_load")),
        ("the output summary", "float32", 3, phase_failed("output_summary")),
        ("the products once more", "float32", 3, phase_failed("per_call_workspace")),
    ],
)
def test_a_failure_at_each_step_is_one_line_and_writes_nothing(
    stand_in_gpu, monkeypatch, tmp_path, capsys, step, dtype, exit_code, message
):
    recorder = RecordingCudaStandIn(device=torch.device("cpu"))
    if step == "a phase":
        recorder = RecordingCudaStandIn(device=torch.device("cpu"), fail_on_synchronize=(4, RuntimeError("bad")))
    stand_in_measurement(monkeypatch, recorder)
    if step in (
        "get_device_capability",
        "is_bf16_supported",
        "set_device",
        "init",
        "memory_allocated",
        "memory_reserved",
    ):
        monkeypatch.setattr(torch.cuda, step, _boom)
    elif step == "manual_seed":
        monkeypatch.setattr(torch, "manual_seed", _boom)
    elif step == "device":
        monkeypatch.setattr(torch, "device", _boom)
    elif step == "events":
        recorder.Event = _boom
    elif step == "the output summary":
        monkeypatch.setattr(mesure_memoire, "summarize_output", _boom)
    elif step == "the products once more":
        monkeypatch.setattr(mesure_memoire, "measure_per_call_workspace", _boom)
    arguments = ["measure", *SMALL_TRIAL, "--output", str(tmp_path / "o.json")]
    arguments[arguments.index("--dtype") + 1] = dtype
    assert mesure_memoire.main(arguments) == exit_code
    captured = capsys.readouterr()
    assert captured.err == error_line(message)
    assert captured.out == ""
    assert list(tmp_path.iterdir()) == []


def test_the_measure_command_prints_the_table_the_warning_and_the_name(monkeypatch, tmp_path, capsys):
    monkeypatch.chdir(tmp_path)
    result = {
        "configuration": {"fresh_process_warning": "not a fresh\nprocess"},
        "torch_version_warning": None,
        "workspace": {"measured_bytes": 0, "allowance_bytes": 256 * MIB, "per_call": NO_PER_CALL},
        "phases": [
            {
                "phase": "warm_forward",
                "repetition": 1,
                "nanoseconds": 10**6,
                "device_ms": None,
                "end_allocated_bytes": 0,
                "peak_allocated_bytes": 0,
                "peak_reserved_bytes": 0,
                "verdict": "agrees",
            }
        ],
    }

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
    assert captured.out == mesure_memoire.format_phase_table(result) + "\nResult written to 'out\\tname.json'\n"
    result["torch_version_warning"] = "an unreadable version"
    assert mesure_memoire.main(["measure", "--device", "cuda:0", "--output", "both.json"]) == 0
    assert capsys.readouterr().err == (
        "mesure_memoire.py: warning: not a fresh\\nprocess\nmesure_memoire.py: warning: an unreadable version\n"
    )
    result["configuration"]["fresh_process_warning"] = result["torch_version_warning"] = None
    assert mesure_memoire.main(["measure", "--device", "cuda:0", "--output", "plain name.json"]) == 0
    captured = capsys.readouterr()
    assert captured.err == ""
    assert captured.out.endswith("\nResult written to plain name.json\n")


def ascii_only_stdout(monkeypatch):
    """sys.stdout as PYTHONIOENCODING=ascii (or a C locale) makes it; returns what was written to it."""
    written = io.BytesIO()
    monkeypatch.setattr(sys, "stdout", io.TextIOWrapper(written, encoding="ascii"))
    return written


def test_a_name_an_ascii_only_stdout_cannot_encode_is_escaped_not_a_failure(monkeypatch):
    result = {
        "configuration": {"fresh_process_warning": None},
        "torch_version_warning": None,
        "workspace": {"measured_bytes": 0, "allowance_bytes": 256 * MIB, "per_call": NO_PER_CALL},
        "phases": [{"phase": "warm_forward", "nanoseconds": 10**6, "device_ms": None}],
    }
    monkeypatch.setattr(mesure_memoire, "measure_to_file", lambda configuration, output, tool, debug: result)
    written = ascii_only_stdout(monkeypatch)
    # The result is written before its name is printed: the status must not say the command failed.
    assert mesure_memoire.main([*MEASURE, "--output", "r\u00e9sultat.json"]) == 0
    sys.stdout.flush()
    assert written.getvalue().decode("ascii").endswith("Result written to r\\xe9sultat.json\n")


# --- the phase table ---------------------------------------------------------------------------------

PHASE_TABLE_RESULT = {
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
    "workspace": {
        "measured_bytes": 8519680,
        "per_call": {"fc1": {"allocated_bytes": MIB}, "fc2": {"allocated_bytes": 0}},
    },
    "output_summary": {"elements": 1024, "all_finite": True, "checksum_float64": -1.25},
}

# Half-up everywhere: 1.2345 ms -> 1.235, 1.125 MiB -> 1.13 (half-even would write 1.234 and 1.12).
PHASE_TABLE_TEXT = """\
phase               ms  device ms  end alloc MiB  peak alloc MiB  peak reserved MiB   prediction
model_load       1.235        n/a           1.13            3.00               2.00       agrees
warmup x3        1.000      0.250           0.00            1.25            1024.00    DISAGREES
warm_forward #2  0.001     12.346           0.00            0.00               1.00  not checked
DISAGREES warmup: peak_allocated_bytes above baseline measured 1536, predicted 1024 (difference +512 bytes)
DISAGREES warm_forward #2: end_requested_bytes above baseline measured 0, predicted 4 (difference -4 bytes)
BLAS workspace measured: 8519680 bytes allocated by the first forward beyond the prediction
BLAS workspace per call: fc1 1048576 bytes, taken and given back within the product (predicted so)
Last output: 1024 elements, all finite, float64 checksum -1.25
Warm repetitions (wall ms): min 0.001, median 0.001, max 0.001; drift n/a (under 3 repetitions)"""


def test_the_phase_table_exactly():
    assert mesure_memoire.format_phase_table(PHASE_TABLE_RESULT) == PHASE_TABLE_TEXT


def test_the_phase_table_lists_each_product_that_takes_a_workspace_per_call():
    both = {"fc1": {"allocated_bytes": MIB}, "fc2": {"allocated_bytes": 2 * MIB}}
    result = {**PHASE_TABLE_RESULT, "workspace": {**PHASE_TABLE_RESULT["workspace"], "per_call": both}}
    line = "BLAS workspace per call: fc1 1048576 bytes, fc2 2097152 bytes, taken and given back within the product"
    assert f"\n{line} (predicted so)\n" in mesure_memoire.format_phase_table(result)


def test_the_phase_table_names_each_reason_a_phase_was_not_checked_once():
    reasons = ["the first reason", "the second reason", "the first reason"]
    phases = [
        dict(phase, verdict="not checked", not_checked_reason=reason)
        for phase, reason in zip(PHASE_TABLE_RESULT["phases"], reasons, strict=True)
    ]
    lines = mesure_memoire.format_phase_table(dict(PHASE_TABLE_RESULT, phases=phases)).splitlines()
    assert lines[6:8] == ["Not checked: the first reason", "Not checked: the second reason"]
    assert lines[8].startswith("BLAS workspace measured")


def test_the_phase_table_without_workspace_checksum_or_checks():
    result = dict(
        PHASE_TABLE_RESULT,
        prediction_check=None,
        workspace={"measured_bytes": None},
        output_summary={"elements": 4, "all_finite": False, "checksum_float64": None},
    )
    lines = mesure_memoire.format_phase_table(result).splitlines()
    assert lines[:4] == PHASE_TABLE_TEXT.splitlines()[:4]
    assert lines[4:] == ["Last output: 4 elements, NOT ALL FINITE", PHASE_TABLE_TEXT.splitlines()[-1]]
    result = dict(result, workspace=None, output_summary=None)
    assert mesure_memoire.format_phase_table(result).splitlines() == [*lines[:4], lines[-1]]


def test_the_phase_table_shows_zero_passes():
    phases = [dict(PHASE_TABLE_RESULT["phases"][1], passes=0), *PHASE_TABLE_RESULT["phases"][2:]]
    lines = mesure_memoire.format_phase_table(dict(PHASE_TABLE_RESULT, phases=phases)).splitlines()
    assert lines[1].startswith("warmup x0  ")  # zero passes is still a count, not a missing one


def test_in_units_rounds_half_up_in_gib_by_default_or_mib():
    assert mesure_memoire.in_units(2**27) == "0.13"  # 0.125: half-even would say 0.12
    assert mesure_memoire.in_units(3 * 2**28) == "0.75"
    assert mesure_memoire.in_units(0) == "0.00"
    assert mesure_memoire.in_units(2**19, MIB) == "0.50"
    assert mesure_memoire.in_units(2**9, MIB, 3) == "0.000"
    assert mesure_memoire.in_units(2**10 + 2**9, MIB, 3) == "0.001"  # 0.00146...: rounded at the third place


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
    assert guarded.write("abc") == 3
    assert guarded.getvalue() == "abc"
    assert guarded.flush() is None
    with pytest.raises(mesure_memoire.GuardedStdout.Failed) as caught:
        mesure_memoire.GuardedStdout(None).write("x")
    assert isinstance(caught.value.args[0], AttributeError)
    stream.close()
    with pytest.raises(mesure_memoire.GuardedStdout.Failed) as caught:
        guarded.write("x")
    assert isinstance(caught.value.args[0], ValueError)
    assert caught.value.__suppress_context__

    class Full(io.StringIO):
        def flush(self):
            raise OSError(errno.ENOSPC, "No space left on device")

    with pytest.raises(mesure_memoire.GuardedStdout.Failed) as caught:
        mesure_memoire.GuardedStdout(Full()).flush()
    assert caught.value.args[0].errno == errno.ENOSPC


def test_stdout_failed_points_the_real_descriptor_at_devnull(tmp_path, monkeypatch, capsys):
    real_stdout = sys.__stdout__
    with open(tmp_path / "out.txt", "w") as stream:
        sys.__stdout__ = stream  # restored before the file closes: the test runner writes there between tests
        try:
            failure = OSError(errno.ENOSPC, "No space left on device")
            code = mesure_memoire.GuardedStdout(stream).failed("mesure_memoire.py", failure)
        finally:
            sys.__stdout__ = real_stdout
        assert code == 1
        assert os.path.realpath(f"/proc/self/fd/{stream.fileno()}") == os.devnull
    assert capsys.readouterr().err == STDOUT_FULL
    with open(tmp_path / "other.txt", "w") as other:  # not the interpreter's stdout: left alone
        assert mesure_memoire.GuardedStdout(other).failed("mesure_memoire.py", BrokenPipeError(errno.EPIPE, "x")) == 1
        assert os.path.realpath(f"/proc/self/fd/{other.fileno()}") == str(tmp_path / "other.txt")
    assert capsys.readouterr().err == ""
    assert mesure_memoire.GuardedStdout(None).failed("mesure_memoire.py", AttributeError()) == 1
    closed = MESSAGES["cannot write the output"].format(error=MESSAGES["stdout closed"])
    assert capsys.readouterr().err == error_line(closed)


def test_stdout_failed_survives_a_closed_interpreter_stdout(tmp_path, capsys):
    real_stdout = sys.__stdout__
    stream = open(tmp_path / "closed.txt", "w")  # noqa: SIM115 -- closed on purpose below
    stream.close()
    sys.__stdout__ = stream
    try:
        code = mesure_memoire.GuardedStdout(stream).failed("mesure_memoire.py", BrokenPipeError(errno.EPIPE, "x"))
    finally:
        sys.__stdout__ = real_stdout
    assert code == 1
    assert capsys.readouterr().err == ""


def test_main_restores_stdout_and_returns_each_status(capsys, monkeypatch):
    stdout = sys.stdout
    assert mesure_memoire.main(["estimate", "--parameters", "1", "--bits", "1", "--json"]) == 0
    assert sys.stdout is stdout
    assert json.loads(capsys.readouterr().out)["weight_bytes"] == 1

    def fails(args):
        raise mesure_memoire.MeasurementFailed("out of memory")

    monkeypatch.setattr(mesure_memoire, "estimate_weights", lambda *args: fails(args))
    assert mesure_memoire.main(["estimate", "--parameters", "1", "--bits", "1"]) == 3
    assert capsys.readouterr().err == "mesure_memoire.py: error: out of memory\n"
    assert sys.stdout is stdout


def test_ctrl_c_is_one_exact_line_and_status_130(capsys, monkeypatch):
    def interrupted(*args):
        raise KeyboardInterrupt

    monkeypatch.setattr(mesure_memoire, "estimate_weights", interrupted)
    assert mesure_memoire.main(["estimate", "--parameters", "1", "--bits", "1"]) == 130
    captured = capsys.readouterr()
    assert captured.err == MESSAGES["interrupted, no partial file"].format(signal="Ctrl-C")
    assert captured.out == ""


def test_no_gpu_is_a_one_line_refusal_that_writes_nothing(folder, capsys):
    no_gpu_here()
    code, captured = run_in_process(capsys, folder, [*MEASURE, "--output", "o.json"])
    assert code == 2
    assert captured.out == ""
    assert re.fullmatch(NO_GPU, captured.err), captured.err


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
    assert captured.err == error_line(
        MESSAGES["--output cannot create"].format(
            name="sub/o.json", error="PermissionError: [Errno 30] Read-only file system"
        )
    )


@pytest.mark.skipif(hasattr(os, "geteuid") and os.geteuid() == 0, reason="root writes into a 0555 folder anyway")
def test_a_read_only_folder_for_real(folder, capsys):
    (folder / "sub").chmod(stat.S_IRUSR | stat.S_IXUSR)
    try:
        code, captured = run_in_process(capsys, folder, [*MEASURE, "--output", "sub/o.json"])
    finally:
        (folder / "sub").chmod(stat.S_IRWXU)
    assert code == 2
    assert re.fullmatch(error_line(message_pattern("--output cannot create", name="sub/o.json")), captured.err)


def test_no_gpu_is_refused_without_cpu_fallback_in_exactly_one_stderr_line(tmp_path):
    """numpy unimportable for sure, so that PyTorch warns at import: the warning is not printed either."""
    no_gpu_here()
    completed = subprocess.run(
        [sys.executable, "-c", BLOCK_NUMPY, MESURE_SCRIPT, *MEASURE, "--output", "o.json"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=120,
    )
    assert completed.returncode == 2
    assert re.fullmatch(NO_GPU, completed.stderr), completed.stderr
    assert list(tmp_path.iterdir()) == []


HOOKED = """
import os, sys, time
sys.path.insert(0, sys.argv[1])
import mesure_memoire
ready = int(sys.argv[2])
def blocked(*args, **kwargs):
    os.write(ready, b"r")
    time.sleep(60)
mesure_memoire.measure = blocked
raise SystemExit(mesure_memoire.main(sys.argv[3:]))
"""


def test_sigint_while_measuring_exits_130_in_one_line_and_leaves_no_file(tmp_path):
    (tmp_path / "existing.json").write_bytes(MINE)
    before = tree_digest(tmp_path)
    read_end, write_end = os.pipe()
    process = subprocess.Popen(
        [sys.executable, "-c", HOOKED, str(ROOT), str(write_end), *MEASURE, "--output", "o.json"],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        pass_fds=(write_end,),
        preexec_fn=sigint_as_from_a_terminal,
    )
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
    assert err.decode() == MESSAGES["interrupted, no partial file"].format(signal="Ctrl-C")
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
    process = subprocess.Popen(
        [sys.executable, "-c", WRITING, str(ROOT), str(write_end), *MEASURE, "--output", "o.json"],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        pass_fds=(write_end,),
        preexec_fn=sigint_as_from_a_terminal,
    )
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
    assert err.decode() == MESSAGES["interrupted, no partial file"].format(signal=said)
    assert list(tmp_path.iterdir()) == []


def test_a_closed_stderr_is_not_a_crash(folder, monkeypatch, capsys):
    monkeypatch.setattr(sys, "stderr", None)
    assert mesure_memoire.main(["estimate", "--parameters", "x", "--bits", "1"]) == 2
    assert capsys.readouterr().out == ""


class UnwritableStderr:
    """A sys.stderr whose writes fail: a full disk (OSError) or a stream closed under the kit (ValueError)."""

    def __init__(self, error):
        self.error = error

    def write(self, text):
        raise self.error

    def flush(self):
        raise self.error


@pytest.mark.parametrize(
    "stderr",
    [None, UnwritableStderr(OSError(errno.ENOSPC, "No space left")), UnwritableStderr(ValueError("closed file"))],
    ids=["none", "full", "closed"],
)
def test_an_unusable_stderr_does_not_stop_a_command_that_captures_pytorch_s(monkeypatch, capsys, stderr):
    """pythonw gives no sys.stderr; the kit flushes it around PyTorch's capture, and that is no failure."""
    monkeypatch.setattr(sys, "stderr", stderr)
    assert mesure_memoire.main(["environment", "--device", "cuda:0", "--json"]) == 0
    assert "field_errors" in json.loads(capsys.readouterr().out)


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
        "    sweep      measure one dimension at several values, each in a fresh process, then report",
        "    report     compare result files side by side, one row each; reads them, writes nothing",
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
        "measure one dimension at several values, each in a fresh process, then report",
        "  --vary DIMENSION      batch, context or width: the dimension that takes the values",
        "  --values V1,V2,...    strictly increasing whole numbers, separated by commas",
        "  --output-dir NEW_FOLDER",
        "                        a new folder (created; never an existing one)",
        "  --timeout-s SECONDS   a child still running after this many seconds is stopped (default 1800)",
    ],
    "report": [
        "usage: mesure_memoire.py report [-h] [--json] FILE [FILE ...]",
        "  FILE        measure result files, in the order to show, or the folder sweep wrote (its results in the",
        "order of the values); after --, a name may start with -",
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
