"""The command-line contract, one table for every program of the repository.

Each program (both shipped scripts and the three tools) parses with argparse and keeps one contract:
``main(argv)`` returns the status and never raises SystemExit; any misuse is one stderr line
``<prog>: error: …`` and exit 2; ``--help`` exits 0, under ``python -OO`` too, at a width no
environment variable changes; an unwritable standard output is one line and exit 1 (a closed pipe:
silent); Ctrl-C is one line and exit 130.  In-process through ``main(argv)``; a new process only for
what needs the interpreter: ``-OO``, a full disk, a closed pipe, a closed descriptor.
"""

import ast
import importlib.util
import io
import json
import os
import signal
import subprocess
import sys
import time

import pytest

import calcul_forfaits
import mesure_memoire
from conftest import (
    MEASURE,
    MESSAGES,
    NOTHING_MEASURED,
    ROOT,
    SMALL_TRIAL,
    assert_one_line,
    code_cells_as_script,
    error_line,
    plain_ids,
    run_in_process,
    run_script,
    signal_main_thread,
)


def _tool(name):
    spec = importlib.util.spec_from_file_location(f"tools.{name}", ROOT / "tools" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# name -> (path from the root, the module, a valid invocation up to one single-valued option, that
# option, a value for it).  The invocation is never run: each case below breaks it first.
PROGRAMS = {
    "mesure_memoire.py": ("mesure_memoire.py", mesure_memoire, ["estimate", "--parameters", "7"], "--bits", "16"),
    "calcul_forfaits.py": ("calcul_forfaits.py", calcul_forfaits, ["--gpu", "b200"], "--days", "7"),
    "build_zip.py": ("tools/build_zip.py", _tool("build_zip"), ["--check"], "--output", "never.zip"),
    "build_notebook.py": ("tools/build_notebook.py", _tool("build_notebook"), [], "--check", None),
    "gpu_validation.py": (
        "tools/gpu_validation.py",
        _tool("gpu_validation"),
        ["--output-dir", "never"],
        "--device",
        "cuda:0",
    ),
}
# Every help a user can ask for: each program's, and each of mesure_memoire.py's commands.
HELPS = [(name, []) for name in PROGRAMS] + [
    ("mesure_memoire.py", [command]) for command in ("estimate", "environment", "measure", "report")
]


def _option(name, value):
    """The option with its value, or alone for a flag (value None)."""
    return [name] if value is None else [name, value]


def _misuses(name):
    """(label, argv, what the line must say) for what every program must refuse in one line, exit 2."""
    _, _, valid, option, value = PROGRAMS[name]
    given = _option(option, value)
    return [
        ("typo", [*valid, option + "x", *given[1:]], option),  # unknown as typed, or a required option missing
        ("abbreviation", [*valid, option[:-1], *given[1:]], option[:-1]),
        ("given twice", [*valid, *given, *given], f"{option}: given twice"),
        ("unknown, with a newline", [*valid, *given, "--no\nsuch"], "--no\\nsuch"),  # escaped: one line
    ]


MISUSES = [(name, *misuse) for name in PROGRAMS for misuse in _misuses(name)]


def _main(name):
    return PROGRAMS[name][1].main


@pytest.mark.parametrize(("name", "label", "argv", "said"), MISUSES, ids=[f"{m[0]}-{m[1]}" for m in MISUSES])
def test_a_misuse_is_one_line_and_exit_2_writing_nothing(name, label, argv, said, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert _main(name)(argv) == 2
    captured = capsys.readouterr()
    assert "usage:" not in assert_one_line(captured.err, said, prog=f"{name}: error")
    assert captured.out == ""
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize(("name", "command"), HELPS, ids=[" ".join([n, *c]) for n, c in HELPS])
def test_help_goes_to_stdout_exits_0_at_a_width_no_environment_variable_changes(name, command, capsys, monkeypatch):
    monkeypatch.delenv("COLUMNS", raising=False)
    assert _main(name)([*command, "--help"]) == 0
    wide, err = capsys.readouterr()
    assert wide.startswith(f"usage: {' '.join([name, *command])}")
    assert err == ""
    monkeypatch.setenv("COLUMNS", "20")
    assert _main(name)([*command, "--help"]) == 0
    assert capsys.readouterr().out == wide
    assert max(map(len, wide.splitlines())) <= 100


SIGNALS_TWICE = [(first, second) for first in ("SIGINT", "SIGTERM") for second in ("SIGINT", "SIGTERM")]


@pytest.mark.parametrize(("first", "second"), SIGNALS_TWICE, ids=[f"{f}-then-{s}" for f, s in SIGNALS_TWICE])
@pytest.mark.parametrize("name", PROGRAMS)
def test_a_second_signal_while_the_first_is_said_keeps_one_line_and_the_first_status(
    name, first, second, capsys, monkeypatch
):
    """Ctrl-C or SIGTERM (real signals), then another while the first one's line is being written: that line,
    whole, alone, the first one's status (not a second line from the exit-time hook, nor 130 for a SIGTERM), and
    the handlers put back."""

    def interrupted(*args, **kwargs):
        signal_main_thread(os.getpid(), getattr(signal, first))  # real signals: the program's handlers raise
        time.sleep(30)  # never slept in full

    class SecondSignalOnWrite:
        def __init__(self, stream):
            self.stream, self.sent = stream, False

        def write(self, text):
            if not self.sent:
                self.sent = True
                signal_main_thread(os.getpid(), getattr(signal, second))
            return self.stream.write(text)

        def __getattr__(self, name):
            return getattr(self.stream, name)

    outside = signal.signal(signal.SIGINT, signal.default_int_handler)  # SIG_IGN where started in the background
    before = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    try:
        monkeypatch.setattr("argparse.ArgumentParser.parse_known_args", interrupted)
        monkeypatch.setattr(sys, "stderr", SecondSignalOnWrite(sys.stderr))
        try:
            status = _main(name)(["--help"])
        except KeyboardInterrupt as escaped:  # out of main, to the exit-time hook: a second line there
            status = f"{type(escaped).__name__} raised"
        assert (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) == before
    finally:
        signal.signal(signal.SIGINT, outside)
    said = "Ctrl-C" if first == "SIGINT" else "SIGTERM"
    assert status == (130 if first == "SIGINT" else 143)
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith(f"{name}: interrupted ({said})"), lines
    assert "Traceback" not in lines[0]


@pytest.mark.parametrize("name", PROGRAMS)
def test_main_runs_in_a_thread_that_cannot_handle_signals(name, capsys):
    """Only the main thread may set a signal handler: from another, SIGTERM is left as it was."""
    import threading

    statuses = []
    thread = threading.Thread(target=lambda: statuses.append(_main(name)(["--help"])))
    thread.start()
    thread.join()
    assert statuses == [0]
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize("module", [mesure_memoire, calcul_forfaits])  # the kit's and the calculator's copy
def test_the_shared_contract_s_own_ctrl_c_line_and_a_status_that_is_not_a_number(capsys, module):
    """run_command_line as the tools use it: its default Ctrl-C line; a SystemExit without a number is 2."""

    def interrupted(argv):
        raise KeyboardInterrupt

    def exits(argv):
        raise SystemExit("not a number")

    assert module.run_command_line("tool.py", interrupted, []) == 130
    assert capsys.readouterr().err == "tool.py: interrupted (Ctrl-C)\n"
    assert module.run_command_line("tool.py", exits, []) == 2
    assert module.run_command_line("tool.py", lambda argv: 7, []) == 7


def test_main_reads_the_command_line_when_given_no_argv(capsys, monkeypatch):
    """`python mesure_memoire.py ...` calls main(): its arguments are those typed after the script's name."""
    monkeypatch.setattr("sys.argv", ["mesure_memoire.py", "estimate", "--parameters", "7", "--bits", "8"])
    assert mesure_memoire.main() == 0
    assert "  parameters            7\n" in capsys.readouterr().out


def test_abbreviations_are_off_and_so_is_colour_where_argparse_has_it(monkeypatch):
    """Python 3.14's argparse reads NO_COLOR and FORCE_COLOR unless color=False; no 3.14 here, so the
    version is stood in for and argparse's constructor recorded."""
    import argparse

    seen = {}
    monkeypatch.setattr(argparse.ArgumentParser, "__init__", lambda self, **kwargs: seen.update(kwargs))
    for version, colour in [((3, 13, 9), "not given"), ((3, 14, 0), False), ((3, 15, 1), False)]:
        seen.clear()
        monkeypatch.setattr(sys, "version_info", version)
        mesure_memoire.ArgumentParser(prog="x")
        assert seen.get("color", "not given") == colour, version
        assert seen["allow_abbrev"] is False, version
    monkeypatch.setattr(sys, "version_info", (3, 14, 0))
    mesure_memoire.ArgumentParser(prog="x", color=True)  # a caller's choice stands
    assert seen["color"] is True


@pytest.mark.whole_kit
@pytest.mark.parametrize("name", PROGRAMS)
def test_help_works_under_python_OO(name):
    completed = run_script(PROGRAMS[name][0], "--help", python_flags=["-OO"])
    assert completed.returncode == 0, completed.stderr
    assert completed.stdout.startswith(f"usage: {name}")
    assert completed.stderr == ""


def _run_with_stdout(name, stdout, preexec_fn=None):
    return subprocess.run(
        [sys.executable, str(ROOT / PROGRAMS[name][0]), "--help"],
        stdout=stdout,
        stderr=subprocess.PIPE,
        text=True,
        timeout=120,
        preexec_fn=preexec_fn,
    )


@pytest.mark.whole_kit
@pytest.mark.parametrize("name", PROGRAMS)
def test_a_closed_pipe_is_silent_and_exit_1(name):
    read_end, write_end = os.pipe()
    os.close(read_end)  # nobody reads: the first write fails with EPIPE
    try:
        completed = _run_with_stdout(name, write_end)
    finally:
        os.close(write_end)
    assert completed.returncode == 1
    assert completed.stderr == ""


@pytest.mark.whole_kit
@pytest.mark.parametrize("name", PROGRAMS)
def test_a_closed_stdout_descriptor_is_one_line_and_exit_1(name):
    completed = _run_with_stdout(name, None, preexec_fn=lambda: os.close(1))
    assert completed.returncode == 1
    said = MESSAGES["cannot write the output"].format(error=MESSAGES["stdout closed"])
    assert completed.stderr == error_line(said, prog=name)


# --- below Python 3.10: one line, exit 2, from both scripts and the notebook's first code cell ----------
# The nox session "old_pythons" runs them under real 3.8 and 3.9; here an older version is stood in for by
# setting sys.version_info before the file runs, and the grammar is checked with ast's feature_version.
OLD_PYTHON_FILES = {
    "mesure_memoire.py": lambda: (ROOT / "mesure_memoire.py").read_text(encoding="utf-8"),
    "calcul_forfaits.py": lambda: (ROOT / "calcul_forfaits.py").read_text(encoding="utf-8"),
    "mesure-memoire.ipynb": lambda: code_cells_as_script(
        json.loads((ROOT / "mesure-memoire.ipynb").read_text(encoding="utf-8"))
    ),
}


@pytest.mark.parametrize("name", OLD_PYTHON_FILES)
def test_each_file_keeps_to_the_grammar_of_python_3_8(name):
    ast.parse(OLD_PYTHON_FILES[name](), feature_version=(3, 8))  # a SyntaxError would fail the test


@pytest.mark.parametrize("name", OLD_PYTHON_FILES)
@pytest.mark.parametrize("version", [(3, 8, 18), (3, 9, 18)])
def test_below_python_3_10_one_line_says_so_and_exits_2(name, version, tmp_path):
    code = (
        "import sys; source = sys.stdin.read(); sys.argv = [sys.argv[1], '--help']; "
        f"sys.version_info = {(*version, 'final', 0)!r}; "
        "exec(compile(source, sys.argv[0], 'exec'), {'__name__': '__main__'})"
    )
    completed = subprocess.run(
        [sys.executable, "-c", code, name],
        input=OLD_PYTHON_FILES[name](),
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    found = ".".join(map(str, version))
    assert completed.returncode == 2
    assert completed.stderr == f"{name}: error: Python 3.10 or later is needed; this is Python {found}\n"
    assert completed.stdout == ""
    assert os.listdir(tmp_path) == []


def _buffered_env():
    """The environment of a child whose stderr is buffered, as a user's is (PYTHONUNBUFFERED would hide
    the interpreter's final flush)."""
    return {key: value for key, value in os.environ.items() if key != "PYTHONUNBUFFERED"}


@pytest.mark.whole_kit
@pytest.mark.parametrize("name", PROGRAMS)
@pytest.mark.parametrize(("how", "status"), [("a misuse", 2), ("stdout full too", 1)])
def test_a_full_stderr_keeps_the_exit_status(name, how, status):
    path, _, valid, _, _ = PROGRAMS[name]
    argv = [*valid, "--no-such-option"] if how == "a misuse" else ["--help"]
    with open("/dev/full", "w") as full:
        completed = subprocess.run(
            [sys.executable, str(ROOT / path), *argv],
            stdout=full if status == 1 else None,
            stderr=full,
            env=_buffered_env(),
            timeout=120,
        )
    assert completed.returncode == status


@pytest.mark.whole_kit
@pytest.mark.parametrize("name", ["mesure_memoire.py", "calcul_forfaits.py"])
@pytest.mark.parametrize(
    ("raised", "full_stderr", "status", "said"),
    [
        ("KeyboardInterrupt", False, 130, "interrupted (Ctrl-C)\n"),
        ("KeyboardInterrupt", True, 130, None),  # a stderr that cannot be written: the status stays
        ("RuntimeError('stand-in')", False, 1, "Traceback"),  # anything else: Python's own report
    ],
)
def test_ctrl_c_during_the_script_s_imports_is_one_line_and_130(name, raised, full_stderr, status, said, tmp_path):
    """Deterministic: a stand-in argparse on PYTHONPATH raises at import, as a Ctrl-C pressed then would."""
    (tmp_path / "argparse.py").write_text(f"raise {raised}\n")
    env = {**_buffered_env(), "PYTHONPATH": str(tmp_path)}
    with open("/dev/full", "w") as full:
        completed = subprocess.run(
            [sys.executable, str(ROOT / name), "--help"],
            stdout=subprocess.PIPE,
            stderr=full if full_stderr else subprocess.PIPE,
            env=env,
            text=True,
            timeout=120,
        )
    assert (completed.returncode, completed.stdout) == (status, "")
    if said == "Traceback":
        assert said in completed.stderr
        assert completed.stderr.endswith("RuntimeError: stand-in\n")
    elif said is not None:
        assert completed.stderr == f"{name}: {said}"


def test_the_calculator_s_copy_names_a_subcommand():
    """The calculator's own options are never required and it has no subcommands, so its copy of the
    contract's ArgumentParser is called here directly, as the kit's parser is for `measure`."""
    parser = calcul_forfaits.ArgumentParser(prog="tool.py sub")
    parser.add_argument("--size", required=True, action=calcul_forfaits.Once)
    with pytest.raises(calcul_forfaits.PricingError) as refusal:
        parser.parse_args(["--sizex", "1"])
    assert str(refusal.value) == "sub: the following arguments are required: --size"


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="this system has no /dev/full")
@pytest.mark.parametrize(
    ("module", "argv"),
    [
        (mesure_memoire, ["estimate", "--parameters", "1", "--bits", "8"]),
        (calcul_forfaits, ["--gpu", "b200", "--days", "7"]),
    ],
    ids=["mesure_memoire.py", "calcul_forfaits.py"],
)
def test_output_held_in_the_buffer_is_flushed_and_a_full_disk_reported(module, argv, monkeypatch, capsys):
    """The output fits the stream's buffer, so only the flush meets the full disk: it is reported as one line,
    exit 1, and the real descriptor is pointed at os.devnull, so that the interpreter's last flush at exit
    cannot print a second error."""
    real_stdout = sys.__stdout__
    with open("/dev/full", "w") as full:
        monkeypatch.setattr(sys, "stdout", full)
        sys.__stdout__ = full  # restored before the file closes: the test runner writes there between tests
        try:
            code = module.main(argv)
        finally:
            sys.__stdout__ = real_stdout
        assert code == 1
        assert os.path.realpath(f"/proc/self/fd/{full.fileno()}") == os.devnull
    said = MESSAGES["cannot write the output"].format(error="OSError: [Errno 28] No space left on device")
    assert capsys.readouterr().err == error_line(said, prog=module.__name__ + ".py")


@pytest.mark.parametrize("module", [mesure_memoire, calcul_forfaits])  # the kit's and the calculator's copy
def test_the_guarded_stdout_answers_for_the_stream_it_guards(module, monkeypatch):
    """A command under the contract still sees its stdout's encoding (text is escaped to fit it)."""
    monkeypatch.setattr(sys, "stdout", io.TextIOWrapper(io.BytesIO(), encoding="latin-1"))
    seen = []
    assert module.run_command_line("tool.py", lambda argv: seen.append(sys.stdout.encoding), []) == 0
    assert seen == ["latin-1"]


# --- hostile values: one line naming the option, exit 2, before any work, nothing changed -------------
# The one table of what mesure_memoire.py refuses on its command line: each case is run in-process through
# main(argv) in a folder holding an existing result, a FIFO and a subfolder, which must stay as they were.

ESTIMATE_REFUSALS = [
    # newlines, escapes, stray values, and one number grammar (ASCII digits, one point)
    (["estimate", "--parameters", "1\n2", "--bits", "16"], "--parameters", "'1\\n2'"),
    (["estimate", "--parameters", "\x1b[31m1", "--bits", "16"], "--parameters", "'\\x1b[31m1'"),
    (["estimate", "--parameters", "9" * 100_000, "--bits", "16"], "--parameters", "(100000 characters)"),
    (["estimate", "--parameters", "1", "--bits", "-2"], "--bits: expected a positive whole number", "'-2'"),
    (["estimate", "--parameters", "1", "--bits", "16", "x\ny"], "error: unrecognized arguments: x\\ny", ""),
    (["estimate", "--parameters", "1", "--bits", "16", "--reserve-gib", "1" * 31], "--reserve-gib", "30 digits"),
    (
        ["estimate", "--par=1\n", "--bits", "3"],
        "error: estimate: the following arguments are required: --parameters",
        "",
    ),
    (["estimate", "--json=yes\n", "--parameters", "1", "--bits", "3"], "argument --json: ignored explicit", "yes\\n"),
    (["estimate"], "error: estimate: the following arguments are required: --parameters, --bits", ""),
    ([], "error: the following arguments are required: COMMAND", ""),
    (["bad\ncmd"], "error: argument COMMAND: invalid choice: 'bad\\ncmd'", "'estimate', 'environment', 'measure'"),
]

ENVIRONMENT_REFUSALS = [
    (["environment", "--device", "cuda:0\n"], "--device", "'cuda:0\\n'"),
    (["environment"], "error: environment: the following arguments are required: --device", ""),
]

LONG_NAME = "a" * 300 + ".json"

MEASURE_REFUSALS = [
    # options
    ([*MEASURE, "--output", "o.json", "--seed", str(2**64)], "error: --seed: ", "18446744073709551615"),
    ([*MEASURE, "--output", "o.json", "--batch", "1\n"], "--batch", "'1\\n'"),
    ([*MEASURE, "--output", "o.json", "--dtype", "float32\n"], "--dtype", "'float32\\n'"),
    (["measure", "--device", "cuda:0\nx", "--output", "o.json"], "--device", "'cuda:0\\nx'"),
    (["measure", "--output", "o.json"], "error: " + MESSAGES["--device and --output required unless --plan"], ""),
    (["measure", "--device", "--plan"], "error: measure: argument --device: expected one argument", ""),
    # outputs that exist or cannot be created
    ([*MEASURE, "--output", "existing.json"], "existing.json already exists", "never overwritten"),
    ([*MEASURE, "--output", "fifo"], "fifo already exists", ""),
    ([*MEASURE, "--output", "/dev/full"], "/dev/full already exists", ""),
    ([*MEASURE, "--output", "sub"], "sub already exists", ""),
    ([*MEASURE, "--output", ""], "a new file name is required", ""),
    ([*MEASURE, "--output", "no\nwhere/o.json"], "'no\\nwhere/o.json' does not exist", ""),
    ([*MEASURE, "--output", LONG_NAME], f"cannot create {LONG_NAME}: ", "too long"),  # whole, as typed
    ([*MEASURE, "--output", "/proc/x.json"], "cannot create /proc/x.json", NOTHING_MEASURED),
    ([*MEASURE, "--output", "o\x00.json"], "cannot create", "'o\\x00.json'"),
]

# Each measure option's out-of-range or malformed value, in an otherwise valid run: the line starts with the option.
BAD_OPTION_VALUES = [
    ("--batch", "0"),
    ("--context", "0"),
    ("--width", "0"),
    ("--warmup", "-1"),
    ("--repeats", "0"),
    ("--seed", "-1"),
    ("--dtype", "float64"),
    ("--device", "cpu"),
]


def _with(option, value):
    """The small trial's argv with ``option`` set to ``value``."""
    argv = ["measure", *SMALL_TRIAL, "--output", "out.json"]
    if option in argv:
        argv[argv.index(option) + 1] = value
    else:
        argv += [option, value]
    return argv


MEASURE_OPTION_REFUSALS = [(_with(option, value), f"error: {option}: ", "") for option, value in BAD_OPTION_VALUES]
HOSTILE_VALUES = ESTIMATE_REFUSALS + ENVIRONMENT_REFUSALS + MEASURE_REFUSALS + MEASURE_OPTION_REFUSALS
# Each part numbered as it was in its feature file, so that the mutation pass finds each case by its id.
HOSTILE_IDS = (
    plain_ids(ESTIMATE_REFUSALS)
    + plain_ids(ENVIRONMENT_REFUSALS)
    + plain_ids(MEASURE_REFUSALS)
    + [f"option-{option}-{plain_ids([([value],)])[0][3:]}" for option, value in BAD_OPTION_VALUES]
)


@pytest.mark.parametrize(("argv", "first", "second"), HOSTILE_VALUES, ids=HOSTILE_IDS)
def test_hostile_values_are_refused_in_one_line_and_change_nothing(folder, capsys, monkeypatch, argv, first, second):
    """``main(argv)`` refuses in one line, exit 2, before measure() could run: nothing printed, no file changed."""

    def no_gpu_work(config, tool):
        raise AssertionError("measure() ran: the refusal came too late")

    monkeypatch.setattr(mesure_memoire, "measure", no_gpu_work)
    code, captured = run_in_process(capsys, folder, argv)
    assert (code, captured.out) == (2, "")
    assert_one_line(captured.err, "mesure_memoire.py: error: ", first, second)
