"""Hostile input for every subcommand of mesure_memoire.py: one line, the right exit status, nothing changed.

Each case asserts the exit status, exactly one stderr line beginning with ``mesure_memoire.py``
(none for a closed pipe), no traceback, and every file of the working folder byte-identical
before and after (``tree_digest``).  Most cases run in-process through ``main(argv)``; a
subprocess is used only for what needs one: the interpreter's exit status, real stderr lines
(PyTorch's import warnings), signals, a closed or full stdout, ``-S``.

No GPU can be had here: where a finished measurement is needed, ``stand_in_measure`` replaces
``measure()`` with the real CPU model and ``RecordingCudaStandIn`` counters, and says so.
"""

import errno
import json
import os
import re
import signal
import stat
import subprocess
import sys
from decimal import Decimal

import pytest
import torch

import mesure_memoire
from conftest import ROOT, RecordingCudaStandIn, UnwritableStdout, sigint_as_from_a_terminal, tree_digest

SCRIPT = str(ROOT / "mesure_memoire.py")
MINE = b'{"mine": true}\n'
LONG_NAME = "a" * 300 + ".json"


@pytest.fixture
def folder(tmp_path, monkeypatch):
    """The working folder: an existing result, a FIFO, a subfolder; the cwd of in-process cases."""
    (tmp_path / "existing.json").write_bytes(MINE)
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "kept.txt").write_text("kept\n")
    os.mkfifo(tmp_path / "fifo")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(mesure_memoire, "PYTORCH_WARNINGS", [], raising=False)
    return tmp_path


def assert_one_line(err, *fragments):
    lines = err.splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("mesure_memoire.py: "), lines[0]
    assert "Traceback" not in err
    for fragment in fragments:
        assert fragment in lines[0], (fragment, lines[0])
    return lines[0]


def run_in_process(capsys, folder, argv):
    before = tree_digest(folder)
    code = mesure_memoire.main(argv)
    captured = capsys.readouterr()
    assert tree_digest(folder) == before
    return code, captured


MEASURE = ["measure", "--device", "cuda:0"]
REFUSALS = [
    # estimate: newlines, escapes, stray values, and one number grammar (ASCII digits, one point)
    (["estimate", "--parameters", "1\n2", "--bits", "16"], "--parameters", "'1\\n2'"),
    (["estimate", "--parameters", "10", "--bits", "16\n"], "--bits", "'16\\n'"),
    (["estimate", "--parameters", "\x1b[31m1", "--bits", "16"], "--parameters", "'\\x1b[31m1'"),
    (["estimate", "--parameters", "٤", "--bits", "16"], "--parameters", "'٤'"),
    (["estimate", "--parameters", "１", "--bits", "16"], "--parameters", "'１'"),
    (["estimate", "--parameters", "+4", "--bits", "16"], "--parameters", "'+4'"),
    (["estimate", "--parameters", "9" * 100_000, "--bits", "16"], "--parameters", "(100000 characters)"),
    (["estimate", "--parameters", "1", "--bits", "16", "x\ny"], "unexpected argument 'x\\ny' for estimate", ""),
    (["estimate", "--parameters", "1", "--bits", "16", "--reserve-gib", "1_000"], "--reserve-gib", "'1_000'"),
    (["estimate", "--parameters", "1", "--bits", "16", "--reserve-gib", "٤"], "--reserve-gib", "'٤'"),
    (["estimate", "--parameters", "1", "--bits", "16", "--reserve-gib", " +4 "], "--reserve-gib", "' +4 '"),
    (["estimate", "--parameters", "1", "--bits", "16", "--reserve-gib", "+4"], "--reserve-gib", "'+4'"),
    (["estimate", "--parameters", "1", "--bits", "16", "--reserve-gib", "-0"], "--reserve-gib", "'-0'"),
    (["estimate", "--parameters", "1", "--bits", "16", "--reserve-gib", "-0.0"], "--reserve-gib", "'-0.0'"),
    (["estimate", "--parameters", "1", "--bits", "16", "--reserve-gib", "4e0"], "--reserve-gib", "'4e0'"),
    (["estimate", "--parameters", "1", "--bits", "16", "--reserve-gib", "1.2.3"], "--reserve-gib", "'1.2.3'"),
    (["estimate", "--parameters", "1", "--bits", "16", "--reserve-gib", "."], "--reserve-gib", "'.'"),
    (["estimate", "--parameters", "1", "--bits", "16", "--reserve-gib", ""], "--reserve-gib", "''"),
    (["estimate", "--parameters", "1", "--bits", "16", "--reserve-gib", "4\n"], "--reserve-gib", "'4\\n'"),
    (["estimate", "--parameters", "1", "--bits", "16", "--reserve-gib", "Infinity"], "--reserve-gib", ""),
    (["estimate", "--parameters", "1", "--bits", "16", "--reserve-gib", "1" * 31], "--reserve-gib", "30 digits"),
    (["estimate", "--parameters", "1", "--bits", "16", "--reserve-gib", "0." + "1" * 31], "--reserve-gib", ""),
    (["estimate", "--par=1\n", "--bits", "3"], "unknown option '--par=1\\n'", "for estimate (see estimate --help)"),
    (["estimate", "--json=yes\n", "--parameters", "1", "--bits", "3"], "--json", "yes\\n"),
    (["estimate"], "estimate needs --parameters, --bits", "(see estimate --help)"),
    ([], "a command is required", "estimate, environment, measure, report"),
    (["bad\ncmd"], "unknown command 'bad\\ncmd'", ""),
    # environment
    (["environment", "--device", "cuda:0\n"], "--device", "'cuda:0\\n'"),
    (["environment", "--device", "cuda:٠"], "--device", "'cuda:٠'"),
    (["environment", "--device", "cuda:0", "extra\n"], "unexpected argument 'extra\\n'", ""),
    # measure: options, refused before any GPU work
    ([*MEASURE, "--output", "o.json", "--seed", str(2**64)], "--seed", "18446744073709551615"),
    ([*MEASURE, "--output", "o.json", "--seed", "-1"], "--seed", "'-1'"),
    ([*MEASURE, "--output", "o.json", "--seed", "1e3"], "--seed", "'1e3'"),
    ([*MEASURE, "--output", "o.json", "--batch", "1\n"], "--batch", "'1\\n'"),
    ([*MEASURE, "--output", "o.json", "--width", "٦٤"], "--width", "'٦٤'"),
    ([*MEASURE, "--output", "o.json", "--dtype", "float32\n"], "--dtype", "'float32\\n'"),
    (["measure", "--device", "cuda:0\nx", "--output", "o.json"], "--device", "'cuda:0\\nx'"),
    # measure: outputs that exist or cannot be created, refused before any GPU work
    ([*MEASURE, "--output", "existing.json"], "existing.json already exists", "never overwritten"),
    ([*MEASURE, "--output", "fifo"], "fifo already exists", ""),
    ([*MEASURE, "--output", "/dev/full"], "/dev/full already exists", ""),
    ([*MEASURE, "--output", "sub"], "sub already exists", ""),
    ([*MEASURE, "--output", "sub/"], "names a folder", ""),
    ([*MEASURE, "--output", "."], "names a folder", ""),
    ([*MEASURE, "--output", ""], "a new file name is required", ""),
    ([*MEASURE, "--output", "nowhere/o.json"], "does not exist", ""),
    ([*MEASURE, "--output", "no\nwhere/o.json"], "'no\\nwhere/o.json' does not exist", ""),
    ([*MEASURE, "--output", "fifo/o.json"], "does not exist", ""),
    ([*MEASURE, "--output", LONG_NAME], "too long", "(305 characters)"),
    ([*MEASURE, "--output", "sub/" + LONG_NAME], "too long", ""),
    ([*MEASURE, "--output", "/proc/x.json"], "cannot create /proc/x.json", "nothing measured"),
    ([*MEASURE, "--output", "o\x00.json"], "cannot create", "'o\\x00.json'"),
]


# Plain ASCII ids, unique by their number: the mutation pass selects tests by id, and ids holding quotes,
# brackets or escapes were not found again when it ran a second session in the same process.
REFUSAL_IDS = [f"{number:02d}-" + re.sub(r"[^A-Za-z0-9.-]+", "_", " ".join(case[0]))[:50] for number, case in
               enumerate(REFUSALS)]  # fmt: skip


@pytest.mark.parametrize(("argv", "first", "second"), REFUSALS, ids=REFUSAL_IDS)
def test_hostile_values_are_refused_in_one_line_and_change_nothing(folder, capsys, monkeypatch, argv, first, second):
    def no_gpu_work(config, tool):
        raise AssertionError("measure() ran: the refusal came too late")

    monkeypatch.setattr(mesure_memoire, "measure", no_gpu_work)
    code, captured = run_in_process(capsys, folder, argv)
    assert code == 2
    assert captured.out == ""
    assert_one_line(captured.err, "mesure_memoire.py: error: ", first, second)


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
        phases, output_summary = mesure_memoire.measure_phases(torch, RecordingCudaStandIn(device=cpu), cpu, config)
        return {
            "kit": mesure_memoire.KIT_NAME,
            "tool": tool,
            "environment": {"field_errors": {}, "gpu": {"total_memory_gib": Decimal(80)}},
            "configuration": {**config, "fresh_process_warning": None},
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
        monkeypatch.setattr(os, "link", lambda source, destination: (_ for _ in ()).throw(OSError(errno.EPERM, "")))
    previous = os.umask(umask)
    try:
        mesure_memoire.write_new_file("r.json", "{}\n")
    finally:
        os.umask(previous)
    assert stat.S_IMODE(os.stat(folder / "r.json").st_mode) == 0o666 & ~umask


def test_a_failed_fallback_write_leaves_nothing_under_the_name(folder, monkeypatch):
    monkeypatch.setattr(os, "link", lambda source, destination: (_ for _ in ()).throw(OSError(errno.ENOTSUP, "")))
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
        monkeypatch.setattr(os, "link", lambda source, destination: (_ for _ in ()).throw(OSError(errno.EPERM, "")))
        calls = []
        monkeypatch.setattr(os, "fsync", lambda fd: calls.append(fd) or (interrupt() if len(calls) == 2 else None))
    code, captured = run_in_process(capsys, folder, [*MEASURE, "--output", "o.json"])
    assert code == 130 and captured.out == ""
    assert_one_line(captured.err, "interrupted")


@pytest.mark.parametrize(
    "argv",
    [["estimate", "--parameters", "7", "--bits", "4"], ["environment", "--device", "cuda:0"]],
)
def test_ctrl_c_in_estimate_and_environment_exits_130(folder, capsys, monkeypatch, argv):
    def interrupt(*args):
        raise KeyboardInterrupt

    monkeypatch.setattr(mesure_memoire, "estimate_weights", interrupt)
    monkeypatch.setattr(mesure_memoire, "collect_environment", interrupt)
    code, captured = run_in_process(capsys, folder, argv)
    assert code == 130 and captured.out == ""
    assert_one_line(captured.err, "interrupted")


# --- a standard output that cannot be written (in-process) ----------------------------------------


@pytest.mark.parametrize(
    "argv",
    [
        ["estimate", "--parameters", "7", "--bits", "4"],
        ["estimate", "--parameters", "7", "--bits", "4", "--json"],
        ["environment", "--device", "cuda:0"],
        ["--help"],
        ["measure", "--help"],
    ],
)
@pytest.mark.parametrize(
    ("stdout", "message"),
    [
        (UnwritableStdout(OSError(errno.ENOSPC, "No space left on device")), "No space left on device"),
        (UnwritableStdout(ValueError("I/O operation on closed file.")), "closed file"),
        (None, "standard output is closed"),
        (UnwritableStdout(BrokenPipeError(errno.EPIPE, "Broken pipe")), None),
    ],
)
def test_an_unwritable_stdout_is_one_line_or_none_and_exit_1(folder, capsys, monkeypatch, argv, stdout, message):
    monkeypatch.setattr(sys, "stdout", stdout)
    before = tree_digest(folder)
    assert mesure_memoire.main(argv) == 1
    assert sys.stdout is stdout  # restored
    err = capsys.readouterr().err
    if message is None:
        assert err == ""  # a closed pipe: silence, as POSIX tools
    else:
        assert_one_line(err, "cannot write the output", message)
    assert tree_digest(folder) == before


# --- subprocesses: the interpreter's exit status, real stderr, signals, -S ---------------------------


def run(*args, cwd, python_flags=(), **kwargs):
    return subprocess.run(
        [sys.executable, *python_flags, SCRIPT, *args], capture_output=True, text=True, cwd=cwd, timeout=120, **kwargs
    )


BLOCK_NUMPY = (
    "import runpy, sys; sys.modules['numpy'] = None; sys.argv = sys.argv[1:]; "
    "runpy.run_path(sys.argv[0], run_name='__main__')"
)


@pytest.mark.parametrize("without_numpy", ["this interpreter", "numpy blocked"])
def test_pytorch_import_warnings_never_reach_stderr(tmp_path, without_numpy):
    args = ["environment", "--device", "cuda:0", "--json"]
    if without_numpy == "numpy blocked":  # numpy unimportable for sure: PyTorch then warns at import
        completed = subprocess.run([sys.executable, "-c", BLOCK_NUMPY, SCRIPT, *args], capture_output=True,
                                   text=True, cwd=tmp_path, timeout=120)  # fmt: skip
    else:
        completed = run(*args, cwd=tmp_path)
    assert completed.returncode == 0 and completed.stderr == ""
    data = json.loads(completed.stdout)
    warnings = data["field_errors"].get("pytorch_warnings", "")
    if without_numpy == "numpy blocked":
        assert warnings.startswith("UserWarning: Failed to initialize NumPy")
    assert "site-packages" not in warnings and str(ROOT) not in warnings and "/__w/" not in warnings
    assert list(tmp_path.iterdir()) == []


def test_measure_without_a_gpu_prints_exactly_one_stderr_line(tmp_path):
    completed = subprocess.run([sys.executable, "-c", BLOCK_NUMPY, SCRIPT, *MEASURE, "--output", "o.json"],
                               capture_output=True, text=True, cwd=tmp_path, timeout=120)  # fmt: skip
    assert completed.returncode == 2
    assert_one_line(completed.stderr, "no usable GPU for cuda:0")
    assert list(tmp_path.iterdir()) == []


ESTIMATE = ["estimate", "--parameters", "7", "--bits", "4"]


@pytest.mark.parametrize(
    ("args", "stdout"),
    [
        (ESTIMATE, "full"), ([*ESTIMATE, "--json"], "full"), (["--help"], "full"),
        (["environment", "--device", "cuda:0"], "full"),  # PyTorch imported: the slow one, once
        (ESTIMATE, "closed"), (["--help"], "closed"), (ESTIMATE, "broken pipe"), (["--help"], "broken pipe"),
    ],
)  # fmt: skip
def test_full_closed_and_broken_stdout_through_the_interpreter(args, stdout):
    command = [sys.executable, SCRIPT, *args]
    if stdout == "full":
        with open("/dev/full", "w") as full:
            completed = subprocess.run(command, stdout=full, stderr=subprocess.PIPE, text=True, timeout=120)
        assert completed.returncode == 1
        assert_one_line(completed.stderr, "cannot write the output", "No space left on device")
    elif stdout == "closed":
        completed = subprocess.run(command, stderr=subprocess.PIPE, text=True, timeout=120,
                                   preexec_fn=lambda: os.close(1))  # fmt: skip
        assert completed.returncode == 1
        assert_one_line(completed.stderr, "standard output is closed")
    else:
        read_end, write_end = os.pipe()
        os.close(read_end)  # a pipe whose reader is gone before the script starts
        try:
            completed = subprocess.run(command, stdout=write_end, stderr=subprocess.PIPE, text=True, timeout=120)
        finally:
            os.close(write_end)
        assert completed.returncode == 1
        assert completed.stderr == ""  # silent, as POSIX tools are on a closed pipe


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
        ("estimate_weights", ["estimate", "--parameters", "7", "--bits", "4"]),
        ("collect_environment", ["environment", "--device", "cuda:0"]),
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


@pytest.mark.whole_kit
def test_without_site_packages_measure_refuses_in_one_line(tmp_path):
    completed = run(*MEASURE, "--output", "o.json", cwd=tmp_path, python_flags=("-S",))
    assert completed.returncode == 2
    assert_one_line(completed.stderr, "PyTorch is not importable")
    assert list(tmp_path.iterdir()) == []


def test_a_refusal_through_the_interpreter_is_one_line_with_repr(tmp_path):
    completed = run("estimate", "--parameters", "1\n2", "--bits", "16", cwd=tmp_path)
    assert completed.returncode == 2 and completed.stdout == ""
    assert_one_line(completed.stderr, "'1\\n2'")


# --- the helpers behind the one-line promise --------------------------------------------------------


def test_shown_quotes_escapes_and_shortens_user_values():
    assert mesure_memoire.shown("a\nb") == "'a\\nb'"
    long_value = "x" * 200 + "END"
    text = mesure_memoire.shown(long_value)
    assert text == "'" + "x" * 59 + "..." + "x" * 8 + "END' (203 characters)"
    assert mesure_memoire.shown("y" * 78) == "'" + "y" * 78 + "'"  # 80 characters with the quotes: kept whole
    assert mesure_memoire.shown_name("mesures.json") == "mesures.json"
    assert mesure_memoire.shown_name("a b.json") == "a b.json"
    for odd in (" lead.json", "trail.json ", "tab\t.json", "z" * 81, "\u202egnp.json"):
        assert mesure_memoire.shown_name(odd).startswith("'"), odd
    assert mesure_memoire.one_line("a\nb\r\tc\x1b\u2028é") == "a\\nb\\r\\tc\\x1b\\u2028é"


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
