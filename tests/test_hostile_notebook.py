"""tools/build_notebook.py against hostile input: one stderr line, the right exit status, no traceback,
every file as it was.

In-process through main(argv) on a copy of the script and the notebook in a temporary folder (the
module's SCRIPT and NOTEBOOK pointed there); a real process only where the interpreter matters: a
full or closed standard output, a closed pipe.
"""

import errno
import importlib.util
import json
import os
import shutil
import subprocess
import sys

import pytest

from conftest import ROOT, UnwritableStdout, tree_digest

spec = importlib.util.spec_from_file_location("build_notebook_hostile", ROOT / "tools" / "build_notebook.py")
build_notebook = importlib.util.module_from_spec(spec)
spec.loader.exec_module(build_notebook)

PROGRAM = "build_notebook.py: "


@pytest.fixture
def copy(tmp_path, monkeypatch):
    """A kit folder of its own: tools/build_notebook.py, mesure_memoire.py and the notebook."""
    (tmp_path / "tools").mkdir()
    for name in ("tools/build_notebook.py", "mesure_memoire.py", "mesure-memoire.ipynb"):
        shutil.copy(ROOT / name, tmp_path / name)
    monkeypatch.setattr(build_notebook, "SCRIPT", tmp_path / "mesure_memoire.py")
    monkeypatch.setattr(build_notebook, "NOTEBOOK", tmp_path / "mesure-memoire.ipynb")
    monkeypatch.chdir(tmp_path)
    return tmp_path


def assert_refused(capsys, status, argv, *fragments, stdout=""):
    assert build_notebook.main(argv) == status
    captured = capsys.readouterr()
    lines = captured.err.splitlines()
    assert len(lines) == 1 and lines[0].startswith(PROGRAM), captured.err
    assert "Traceback" not in captured.err
    assert captured.out == stdout
    for fragment in fragments:
        assert fragment in lines[0], (fragment, lines[0])
    return lines[0]


# --- arguments ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("argv", "fragment"),
    [
        (["--bogus"], "unrecognized argument(s): '--bogus'"),
        (["x\ny"], "unrecognized argument(s): 'x\\ny'"),
        (["--che"], "unrecognized argument(s): '--che'"),  # no abbreviations: one spelling per option
        (["--check", "--print-code"], "argument --print-code: not allowed with argument --check"),
        (["--check=1"], "argument --check: ignored explicit argument '1'"),
        (["--print-code=\x1b[2J"], "ignored explicit argument '\\x1b[2J'"),
    ],
)
def test_argument_errors_are_one_line(copy, capsys, argv, fragment):
    before = tree_digest(copy)
    line = assert_refused(capsys, 2, argv, fragment)
    assert line.startswith("build_notebook.py: error: ") and "usage" not in line
    assert tree_digest(copy) == before


# --- a corrupt or hostile notebook --------------------------------------------------------------------


def _text(content):
    def make(path):
        path.unlink()
        path.write_bytes(content if isinstance(content, bytes) else content.encode("utf-8"))

    return make


def _folder(path):
    path.unlink()
    path.mkdir()


def _fifo(path):
    path.unlink()
    os.mkfifo(path)


def _huge(path):
    with open(path, "r+b") as stream:
        stream.truncate(build_notebook.MAX_READ_BYTES + 1)


NOTEBOOKS = {
    "not JSON": (_text("not a notebook"), "mesure-memoire.ipynb is not JSON (line 1 column 1)"),
    "truncated": (lambda p: _text(p.read_bytes()[:500])(p), "mesure-memoire.ipynb is not JSON"),
    "not UTF-8": (_text(b'{"cells": "\xff"}'), "mesure-memoire.ipynb is not UTF-8 text"),
    "a JSON list": (_text("[]"), "is not a notebook this tool wrote"),
    "cells not a list": (_text('{"cells": {}}'), "is not a notebook this tool wrote"),
    "a source not a list": (_text('{"cells": [{"cell_type": "code", "source": 5}]}'), "is not a notebook"),
    "a source line not text": (_text('{"cells": [{"cell_type": "code", "source": [1]}]}'), "is not a notebook"),
    "nested too deep": (_text("[" * 200000), "mesure-memoire.ipynb is not JSON"),
    "a folder": (_folder, "mesure-memoire.ipynb is not a regular file"),
    "a FIFO": (_fifo, "mesure-memoire.ipynb is not a regular file"),
    "huge": (_huge, "mesure-memoire.ipynb is larger than 8 MiB"),
    "missing": (lambda p: p.unlink(), "mesure-memoire.ipynb does not exist"),
}


@pytest.mark.parametrize("case", NOTEBOOKS)
def test_print_code_refuses_a_corrupt_notebook_in_one_line(copy, capsys, case):
    make, fragment = NOTEBOOKS[case]
    make(copy / "mesure-memoire.ipynb")
    before = tree_digest(copy)
    assert_refused(capsys, 2, ["--print-code"], fragment)
    assert tree_digest(copy) == before


@pytest.mark.whole_kit
@pytest.mark.parametrize("case", ["not UTF-8", "a folder", "a FIFO", "huge"])
def test_check_refuses_a_notebook_it_cannot_read(copy, capsys, case):
    make, fragment = NOTEBOOKS[case]
    make(copy / "mesure-memoire.ipynb")
    before = tree_digest(copy)
    assert_refused(capsys, 2, ["--check"], fragment)
    assert tree_digest(copy) == before


@pytest.mark.whole_kit
@pytest.mark.parametrize("case", ["a folder", "a FIFO", "huge"])
def test_building_over_an_unreadable_notebook_is_refused_and_changes_nothing(copy, capsys, case):
    make, fragment = NOTEBOOKS[case]
    make(copy / "mesure-memoire.ipynb")
    before = tree_digest(copy)
    assert_refused(capsys, 2, [], fragment)
    assert tree_digest(copy) == before


@pytest.mark.whole_kit
@pytest.mark.parametrize("argv", [["--check"], []])
def test_a_stale_or_missing_notebook_is_reported_or_rebuilt(copy, capsys, argv):
    (copy / "mesure-memoire.ipynb").unlink()
    if argv:
        assert_refused(capsys, 1, argv, "mesure-memoire.ipynb is out of date with mesure_memoire.py")
    else:
        assert build_notebook.main(argv) == 0
        assert (copy / "mesure-memoire.ipynb").read_bytes() == (ROOT / "mesure-memoire.ipynb").read_bytes()


# --- a corrupt script ---------------------------------------------------------------------------------


SCRIPTS = {
    "not UTF-8": (b"\xff\xfe", "mesure_memoire.py is not UTF-8 text"),
    "no block": (b"print('hello')\n", "mesure_memoire.py has no '# >>> notebook' block"),
    "a step without run cell": (
        lambda s: s.replace(b"notebook: 4. Reading", b"notebook: 7. Reading"),
        "is a step with no run cell in build_notebook.py",
    ),
    "a long block that does not parse": (
        lambda s: s.replace(b"def measure_config(", b"def measure_config(("),
        "a notebook block of mesure_memoire.py does not parse (line 1)",
    ),
}


@pytest.mark.whole_kit
@pytest.mark.parametrize("argv", [[], ["--check"]])
@pytest.mark.parametrize("case", SCRIPTS)
def test_a_corrupt_script_is_refused_in_one_line(copy, capsys, case, argv):
    change, fragment = SCRIPTS[case]
    script = copy / "mesure_memoire.py"
    script.write_bytes(change(script.read_bytes()) if callable(change) else change)
    before = tree_digest(copy)
    assert_refused(capsys, 2, argv, fragment)
    assert tree_digest(copy) == before


# --- writing the notebook -----------------------------------------------------------------------------


@pytest.mark.whole_kit
def test_an_unwritable_folder_leaves_the_notebook_as_it_was(copy, capsys, monkeypatch):
    (copy / "mesure-memoire.ipynb").write_text("{}", encoding="utf-8")
    before = tree_digest(copy)

    def refuse(*args, **kwargs):  # root ignores a read-only folder's mode: refuse the temporary file instead
        raise PermissionError(errno.EACCES, "Permission denied", str(copy))

    monkeypatch.setattr(build_notebook.tempfile, "mkstemp", refuse)
    line = assert_refused(capsys, 2, [], "cannot write mesure-memoire.ipynb (PermissionError); it is unchanged")
    assert str(copy) not in line
    assert tree_digest(copy) == before


@pytest.mark.whole_kit
@pytest.mark.parametrize("where", ["replace", "fsync"])
def test_ctrl_c_while_writing_exits_130_and_leaves_no_partial_file(copy, capsys, monkeypatch, where):
    (copy / "mesure-memoire.ipynb").write_text("{}", encoding="utf-8")
    before = tree_digest(copy)

    def interrupt(*args):
        raise KeyboardInterrupt

    monkeypatch.setattr(build_notebook.os, where, interrupt)
    assert_refused(capsys, 130, [], "interrupted")
    assert tree_digest(copy) == before


def test_ctrl_c_while_reading_exits_130(copy, capsys, monkeypatch):
    def interrupt(*args):
        raise KeyboardInterrupt

    monkeypatch.setattr(build_notebook, "code_cells_as_script", interrupt)
    assert_refused(capsys, 130, ["--print-code"], "build_notebook.py: interrupted")


# --- standard output ----------------------------------------------------------------------------------


@pytest.mark.whole_kit
@pytest.mark.parametrize("argv", [["--print-code"], [], ["--help"]])
def test_a_full_stdout_is_one_line(copy, capsys, monkeypatch, argv):
    monkeypatch.setattr(sys, "stdout", UnwritableStdout(OSError(errno.ENOSPC, "No space left on device")))
    assert build_notebook.main(argv) == 1
    err = capsys.readouterr().err
    assert err == "build_notebook.py: error: cannot write to standard output (OSError)\n"


def test_a_closed_stdout_is_one_line(copy, capsys, monkeypatch):
    monkeypatch.setattr(sys, "stdout", None)
    assert build_notebook.main(["--print-code"]) == 1
    assert capsys.readouterr().err == "build_notebook.py: error: standard output is closed\n"


def test_a_closed_pipe_stops_quietly(copy, capsys, monkeypatch):
    monkeypatch.setattr(sys, "stdout", UnwritableStdout(BrokenPipeError(errno.EPIPE, "Broken pipe")))
    assert build_notebook.main(["--print-code"]) == 1
    assert capsys.readouterr().err == ""


def _tool(copy, *args, **kwargs):
    return subprocess.run(
        [sys.executable, str(copy / "tools" / "build_notebook.py"), *args],
        capture_output=True, text=True, cwd=copy, timeout=60, **kwargs,
    )  # fmt: skip


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="no /dev/full here")
def test_print_code_into_dev_full_in_a_real_process(copy):
    before = tree_digest(copy)
    with open("/dev/full", "w") as full:
        completed = subprocess.run(
            [sys.executable, str(copy / "tools" / "build_notebook.py"), "--print-code"],
            stdout=full, stderr=subprocess.PIPE, text=True, cwd=copy, timeout=60,
        )  # fmt: skip
    assert completed.returncode == 1
    assert completed.stderr == "build_notebook.py: error: cannot write to standard output (OSError)\n"
    assert tree_digest(copy) == before


def test_print_code_with_stdout_closed_in_a_real_process(copy):
    completed = subprocess.run(
        ["sh", "-c", f'"{sys.executable}" tools/build_notebook.py --print-code >&-'],
        capture_output=True, text=True, cwd=copy, timeout=60,
    )  # fmt: skip
    assert completed.returncode == 1
    assert completed.stderr == "build_notebook.py: error: standard output is closed\n"


def test_print_code_into_a_closed_pipe_in_a_real_process(copy):
    process = subprocess.Popen(
        [sys.executable, str(copy / "tools" / "build_notebook.py"), "--print-code"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=copy,
    )  # fmt: skip
    process.stdout.close()  # the reader goes away before the tool writes
    _, err = process.communicate(timeout=60)
    assert process.returncode == 1
    assert err == b""


def test_the_tool_runs_whole_in_a_real_process(copy):
    completed = _tool(copy, "--print-code")
    assert completed.returncode == 0 and completed.stderr == ""
    notebook = json.loads((copy / "mesure-memoire.ipynb").read_text(encoding="utf-8"))
    assert completed.stdout == build_notebook.code_cells_as_script(notebook)
    completed = _tool(copy, "--nope")
    assert (completed.returncode, completed.stdout) == (2, "")
    assert completed.stderr == "build_notebook.py: error: unrecognized argument(s): '--nope'\n"
