"""Hostile input for calcul_forfaits.py: each case gets the right exit status, exactly one stderr line
beginning with the program's name, no traceback, and every file byte-identical before and after.

Table-driven.  In-process through main(argv) where that is enough; a new process only where the
case needs one: a FIFO or /dev/zero (a regression would hang or eat memory, so a timeout guards
it), stdout that cannot be written, Ctrl-C, and ``-S``.
"""

import fcntl
import hashlib
import os
import signal
import subprocess
import sys
import time

import pytest

import calcul_forfaits
from conftest import ROOT, sigint_as_from_a_terminal, tree_digest

SCRIPT = str(ROOT / "calcul_forfaits.py")
CATALOG = (ROOT / "tarifs-forfaits.csv").read_bytes()
HEADER = ",".join(calcul_forfaits.RESULTS_COLUMNS)
LIMIT = calcul_forfaits.MAX_TABLE_BYTES


def every_row(column, value):
    """The shipped catalog with ``column`` set to ``value`` on every row."""
    index = calcul_forfaits.CATALOG_COLUMNS.index(column)
    lines = CATALOG.decode().splitlines()
    rows = [line.split(",") for line in lines[1:]]
    for row in rows:
        row[index] = value
    return "\n".join([lines[0], *(",".join(row) for row in rows)]).encode() + b"\n"


def results_row(measurement_file, sha256="0" * 64):
    cells = ["r1", "rent-1", "2026-10-05T09:00:00Z", "h100-sxm", "7", "1", "cuda:0", "GPU", "1", "2.13.0", "13.0",
             measurement_file, sha256, "10", "9", "exact match", "0.9", "2026-10-01", "1", ""]  # fmt: skip
    return f"{HEADER}\n{','.join(cells)}\n".encode()


FILES = {  # name -> bytes (a regular file), or a callable that makes something else at that path
    "fifo": os.mkfifo,
    "folder": os.mkdir,
    "zero.csv": lambda path: os.symlink("/dev/zero", path),
    "big.csv": CATALOG * (LIMIT // len(CATALOG) + 1),
    "basic-date.csv": every_row("snapshot_date", "20260924"),
    "week-date.csv": every_row("snapshot_date", "2026-W39-4"),
    "wide-digits.csv": every_row("snapshot_date", "２０２６-09-24"),
    "euro.csv": every_row("currency", "EUR"),
    "newline-model.csv": CATALOG.replace(b",NVIDIA H200,", b',"NVIDIA\nH200",'),
    "escape-model.csv": CATALOG.replace(b",NVIDIA H200,", b",NVIDIA \x1b[2JH200,"),
    "rlo-model.csv": CATALOG.replace(b",NVIDIA H200,", ",NVIDIA \u202eH200,".encode()),
    "nul-model.csv": CATALOG.replace(b",NVIDIA H200,", b",NVIDIA \x00H200,"),
    "bom.csv": b"\xef\xbb\xbf" + CATALOG,
    "latin1.csv": CATALOG.replace(b"NVIDIA H200", b"NVIDIA H200 \xe9"),
    "runs-fifo.csv": results_row("fifo"),
    "runs-zero.csv": results_row("zero.csv"),
    "runs-folder.csv": results_row("folder"),
    "runs-big.csv": results_row("m.json") * (LIMIT // 400 + 1),
    "runs-latin1.csv": results_row("m\xe9.json").replace("m\xe9".encode(), b"m\xe9"),
    "runs-escape.csv": results_row("m.json").replace(b"exact match", b"exact\x1b]0;x\x07match"),
}


@pytest.fixture
def hostile(tmp_path):
    for name, content in FILES.items():
        if callable(content):
            content(str(tmp_path / name))
        else:
            (tmp_path / name).write_bytes(content)
    return tmp_path


def kit_digest():
    return {path.name: hashlib.sha256(path.read_bytes()).hexdigest() for path in ROOT.iterdir() if path.is_file()}


def check_one_line(status, err, expected_status, fragment):
    assert status == expected_status, (status, err)
    assert "Traceback" not in err and "Exception ignored" not in err, err
    assert len(err.splitlines()) == 1 and err.endswith("\n"), err
    assert err.startswith("calcul_forfaits.py: "), err
    assert fragment in err, (fragment, err)


# --- in-process cases: (argv, fragment of the one stderr line); all exit 2 -----------------------------

IN_PROCESS = {
    "catalog larger than the bound": (["--catalog", "big.csv", "--list"], f"'big.csv': larger than {LIMIT} bytes"),
    "catalog empty name": (["--catalog", "", "--list"], "--catalog: expected a file name, got ''"),
    "catalog a folder": (["--catalog", "folder", "--list"], "'folder': not a regular file"),
    "catalog name with a newline": (["--catalog", "a\nb.csv", "--list"], "'a\\nb.csv': cannot be read"),
    "catalog name with a NUL": (["--catalog", "a\0b.csv", "--list"], "'a\\x00b.csv': cannot be read"),
    "snapshot 20260924": (["--catalog", "basic-date.csv", "--list"], "line 2: snapshot_date must be a date"),
    "snapshot 2026-W39-4": (["--catalog", "week-date.csv", "--list"], "line 2: snapshot_date"),
    "snapshot in wide digits": (["--catalog", "wide-digits.csv", "--list"], "line 2: snapshot_date"),
    "catalog in EUR": (["--catalog", "euro.csv", "--gpu", "h200", "--days", "7"], "line 2: currency must be USD"),
    "model with a newline": (["--catalog", "newline-model.csv", "--list"], "line 20: malformed CSV"),
    "model with an escape": (["--catalog", "escape-model.csv", "--list"], "model holds a control"),
    "model with a right-to-left override": (["--catalog", "rlo-model.csv", "--list"], "model holds a control"),
    "model with a NUL": (["--catalog", "nul-model.csv", "--list"], "model holds a control"),
    "catalog with a byte-order mark": (["--catalog", "bom.csv", "--list"], "line 1: bad header"),
    "catalog not UTF-8": (["--catalog", "latin1.csv", "--list"], "not UTF-8"),
    "results larger than the bound": (["--results", "runs-big.csv"], f"larger than {LIMIT} bytes"),
    "results a folder": (["--results", "folder"], "'folder': not a regular file"),
    "results empty name": (["--results", ""], "--results: expected a file name"),
    "results name with a newline": (["--results", "r\n.csv"], "'r\\n.csv': cannot be read"),
    "results not UTF-8": (["--results", "runs-latin1.csv"], "not UTF-8"),
    "results with an escape": (["--results", "runs-escape.csv"], "quality_metric holds a control"),
    "measurement a folder": (["--results", "runs-folder.csv"], "measurement_file 'folder': not a regular file"),
    "stray argument with a newline": (["--list", "a\nb"], "unexpected argument 'a\\nb'"),
    "unknown option with a newline": (["--li\nst"], "unknown option '--li\\nst'"),
    "gpu with a newline": (["--gpu", "h200\n", "--days", "7"], "unknown GPU 'h200\\n'"),
    "gpu not UTF-8": (["--gpu", "\udcff", "--days", "7"], "unknown GPU '\\udcff'"),
    "days with a newline": (["--gpu", "h200", "--days", "7\n"], "got '7\\n'"),
    "lots in Arabic-Indic digits": (["--gpu", "h200", "--days", "7", "--lots", "٢"], "got '٢'"),
    "lots with spaces": (["--gpu", "h200", "--days", "7", "--lots", " 2 "], "--lots"),
    "lots with an underscore": (["--gpu", "h200", "--days", "7", "--lots", "1_0"], "--lots"),
    "lots in superscript": (["--gpu", "h200", "--days", "7", "--lots", "²"], "--lots"),
    "accepted results with a newline": (["--gpu", "h200", "--days", "7", "--accepted-results", "1\n2"], "'1\\n2'"),
    "flag given a value with a newline": (["--list", "--json=a\nb"], "--json takes no value, got 'a\\nb'"),
}  # fmt: skip


@pytest.mark.parametrize("case", sorted(IN_PROCESS))
def test_hostile_input_in_process(hostile, capsys, monkeypatch, case):
    argv, fragment = IN_PROCESS[case]
    monkeypatch.chdir(hostile)
    before, kit = tree_digest(hostile), kit_digest()
    status = calcul_forfaits.main(argv)
    captured = capsys.readouterr()
    check_one_line(status, captured.err, 2, fragment)
    assert captured.out == ""
    assert tree_digest(hostile) == before and kit_digest() == kit


# --- cases that need a new process ---------------------------------------------------------------------

BLOCKING = {  # a regression would block (FIFO) or read without end (/dev/zero): a timeout guards them
    "catalog a FIFO": (["--catalog", "fifo", "--list"], "'fifo': not a regular file"),
    "catalog /dev/zero": (["--catalog", "/dev/zero", "--list"], "'/dev/zero': not a regular file"),
    "catalog a link to /dev/zero": (["--catalog", "zero.csv", "--list"], "'zero.csv': not a regular file"),
    "results a FIFO": (["--results", "fifo"], "'fifo': not a regular file"),
    "results /dev/zero": (["--results", "/dev/zero"], "not a regular file"),
    "measurement a FIFO": (["--results", "runs-fifo.csv"], "measurement_file 'fifo': not a regular file"),
    "measurement a link to /dev/zero": (["--results", "runs-zero.csv"], "measurement_file 'zero.csv': not a regular"),
}  # fmt: skip


@pytest.mark.whole_kit
@pytest.mark.parametrize("flags", [(), ("-S",)], ids=["site", "no-site"])
@pytest.mark.parametrize("case", sorted(BLOCKING))
def test_hostile_input_that_could_block(hostile, case, flags):
    argv, fragment = BLOCKING[case]
    before, kit = tree_digest(hostile), kit_digest()
    completed = subprocess.run([sys.executable, *flags, SCRIPT, *argv], capture_output=True, text=True,
                               cwd=hostile, timeout=30)  # fmt: skip
    check_one_line(completed.returncode, completed.stderr, 2, fragment)
    assert completed.stdout == ""
    assert tree_digest(hostile) == before and kit_digest() == kit


def run_with_stdout(stdout, *args, preexec_fn=None, cwd=None):
    return subprocess.run([sys.executable, SCRIPT, *args], stdout=stdout, stderr=subprocess.PIPE, text=True,
                          timeout=30, preexec_fn=preexec_fn, cwd=cwd)  # fmt: skip


@pytest.mark.parametrize("args", [["--list"], ["--gpu", "b200", "--days", "7", "--json"]])
def test_a_closed_pipe_gives_no_traceback_and_a_failure_status(tmp_path, args):
    reader, writer = os.pipe()
    os.close(reader)  # the reader has gone before the first write, as with ``| head -0``
    try:
        completed = run_with_stdout(writer, *args, cwd=tmp_path)
    finally:
        os.close(writer)
    assert completed.returncode == 1
    assert completed.stderr == ""  # like other command-line tools: nothing to say to a reader that left
    assert list(tmp_path.iterdir()) == []


@pytest.mark.whole_kit
@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="this system has no /dev/full")
@pytest.mark.parametrize("flags", [(), ("-S",)], ids=["site", "no-site"])
def test_a_full_stdout_gives_one_line(tmp_path, flags):
    with open("/dev/full", "w") as full:
        completed = subprocess.run([sys.executable, *flags, SCRIPT, "--list"], stdout=full, stderr=subprocess.PIPE,
                                   text=True, timeout=30, cwd=tmp_path)  # fmt: skip
    check_one_line(completed.returncode, completed.stderr, 1, "cannot write the output (No space left on device)")
    assert list(tmp_path.iterdir()) == []


def test_a_closed_stdout_gives_one_line(tmp_path):
    completed = run_with_stdout(None, "--gpu", "b200", "--days", "7", preexec_fn=lambda: os.close(1), cwd=tmp_path)
    check_one_line(completed.returncode, completed.stderr, 1, "stdout is closed; nothing printed")


def test_an_unwritable_stdout_in_process_gives_one_line(capsys, monkeypatch):
    class Full:
        def write(self, text):
            raise OSError(28, "No space left on device")

        def flush(self):
            raise AssertionError("flush after a failed write")

    monkeypatch.setattr(sys, "stdout", Full())
    status = calcul_forfaits.main(["--gpu", "b200", "--days", "7"])
    check_one_line(status, capsys.readouterr().err, 1, "cannot write the output (No space left on device)")
    monkeypatch.setattr(sys, "stdout", None)
    status = calcul_forfaits.main(["--gpu", "b200", "--days", "7"])
    assert (status, capsys.readouterr().err) == (1, "calcul_forfaits.py: error: stdout is closed; nothing printed\n")


def test_an_output_the_terminal_cannot_encode_gives_one_line(tmp_path, capsys, monkeypatch):
    import io

    (tmp_path / "m.json").write_bytes(b"{}")
    row = results_row("m.json", hashlib.sha256(b"{}").hexdigest()).replace(b"rent-1", "rent-é".encode())
    (tmp_path / "runs.csv").write_bytes(row)
    ascii_out = io.TextIOWrapper(io.BytesIO(), encoding="ascii")
    monkeypatch.setattr(sys, "stdout", ascii_out)
    status = calcul_forfaits.main(["--results", str(tmp_path / "runs.csv")])
    check_one_line(status, capsys.readouterr().err, 1, "cannot write the output (UnicodeEncodeError)")
    assert ascii_out.buffer.getvalue() == b""  # nothing half-written


def test_an_interrupt_in_process_gives_one_line_and_status_130(capsys, monkeypatch):
    def interrupted(path=None):
        raise KeyboardInterrupt

    monkeypatch.setattr(calcul_forfaits, "load_catalog", interrupted)
    status = calcul_forfaits.main(["--list"])
    captured = capsys.readouterr()
    assert (status, captured.out, captured.err) == (130, "", "calcul_forfaits.py: interrupted; nothing written\n")


def process_state(pid):
    with open(f"/proc/{pid}/stat") as stream:
        return stream.read().rsplit(")", 1)[1].split()[0]


@pytest.mark.skipif(not os.path.exists(f"/proc/{os.getpid()}/stat"), reason="needs /proc to see the child wait")
def test_ctrl_c_while_blocked_on_output_gives_one_line_and_status_130(tmp_path):
    """The child blocks writing to a pipe that is already full; SIGINT then arrives, as Ctrl-C sends it."""
    reader, writer = os.pipe()
    fcntl.fcntl(writer, fcntl.F_SETFL, os.O_NONBLOCK)
    try:
        while True:
            os.write(writer, b"x" * 4096)
    except BlockingIOError:
        pass
    fcntl.fcntl(writer, fcntl.F_SETFL, 0)
    child = subprocess.Popen([sys.executable, SCRIPT, "--list"], stdout=writer, stderr=subprocess.PIPE, cwd=tmp_path,
                             preexec_fn=sigint_as_from_a_terminal)  # fmt: skip
    os.close(writer)
    try:
        deadline = time.monotonic() + 20
        while process_state(child.pid) != "S" and time.monotonic() < deadline:
            time.sleep(0.02)
        time.sleep(0.1)
        child.send_signal(signal.SIGINT)
        status = child.wait(timeout=20)
        err = child.stderr.read().decode()
    finally:
        child.kill() if child.poll() is None else None
        child.stderr.close()
        os.close(reader)
    check_one_line(status, err, 130, "interrupted; nothing written")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.whole_kit
def test_a_refusal_without_site_packages_is_one_line(tmp_path):
    completed = subprocess.run([sys.executable, "-S", SCRIPT, "--list", "a\nb"], capture_output=True, text=True,
                               cwd=tmp_path, timeout=30)  # fmt: skip
    check_one_line(completed.returncode, completed.stderr, 2, "unexpected argument 'a\\nb'")


def test_argv_that_is_not_utf8_is_shown_escaped(tmp_path):
    completed = subprocess.run([sys.executable, SCRIPT, b"--gpu", b"h\xff", b"--days", b"7"], capture_output=True,
                               cwd=tmp_path, timeout=30)  # fmt: skip
    check_one_line(completed.returncode, completed.stderr.decode("ascii"), 2, "unknown GPU 'h\\udcff'")


def test_a_reader_that_left_in_process_gives_status_1_and_no_message(capsys, monkeypatch):
    class Gone:
        def write(self, text):
            raise BrokenPipeError(32, "Broken pipe")

    monkeypatch.setattr(sys, "stdout", Gone())
    status = calcul_forfaits.main(["--list"])
    assert (status, capsys.readouterr().err) == (1, "")


def test_drop_stdout_sends_what_is_left_to_the_null_device(monkeypatch):
    import types

    reader, writer = os.pipe()
    open_before = sorted(os.listdir("/proc/self/fd")) if os.path.isdir("/proc/self/fd") else None
    monkeypatch.setattr(sys, "stdout", types.SimpleNamespace(fileno=lambda: writer))
    calcul_forfaits.drop_stdout()
    try:
        assert os.write(writer, b"lost") == 4  # the null device takes it
    finally:
        os.close(writer)
    assert os.read(reader, 10) == b""  # the pipe's only writer was replaced: end of file
    os.close(reader)
    if open_before is not None:
        assert len(os.listdir("/proc/self/fd")) == len(open_before) - 2  # no descriptor leaked
