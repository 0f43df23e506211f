"""`sweep`: one `measure` per value, each in a fresh child, after the plan's fit check; every path is run
with a stand-in interpreter for the children (tests/data/sweep/stand_in_python.py), since no GPU exists here."""

import errno
import io
import json
import os
import signal
import subprocess
import sys
import time

import pytest

import mesure_memoire
from conftest import (
    GIB,
    MESSAGES,
    MESURE_SCRIPT,
    NOTHING_MEASURED,
    ROOT,
    assert_one_line,
    assert_one_line_refusal,
    config,
    error_line,
    left_running,
    no_gpu_here,
    plain_id,
    plain_ids,
    sigint_as_from_a_terminal,
    signal_main_thread,
    tree_digest,
)

DATA = ROOT / "tests" / "data"
PYTHON = sys.executable  # the real interpreter: the stand_in fixture replaces sys.executable
TEMPLATE = DATA / "report" / "bfloat16.json"
SWEEP = [
    "sweep",
    "--device",
    "cuda:0",
    "--vary",
    "width",
    "--batch",
    "2",
    "--context",
    "128",
    "--warmup",
    "3",
    "--repeats",
    "5",
    "--output-dir",
    "out",
]
FREE_BYTES = 3 * GIB  # widths up to 4096 are predicted to fit, 8192 is not (checked below)
MEASURED_256 = "width 256: measured, out/mesures-width-256.json\n"
OOM = "out of memory in phase cold_forward (batch 2, context 128, width 2048, dtype float32) on cuda:0"
# The plan's figures for width 2048: weights 134258688, inputs 2 MiB, the allowance, 16 MiB; 1495310336 needed free
FAILED = "phase cold_forward failed (batch 2, context 128, width 2048, dtype float32): RuntimeError (text withheld)"


def environment(free=FREE_BYTES, available=True):
    gpu = {"name": "Stand-in GPU", "mem_get_info_free_bytes": free, "total_memory_bytes": 80 * GIB}
    reason = None if available else "torch.cuda.is_available() is False (stand-in)"
    return {
        "torch": "2.13.0",  # what the child's environment reads, a version the kit measures with
        "gpu_available": available,
        "gpu": gpu if available else None,
        "gpu_unavailable_reason": reason,
    }


@pytest.fixture
def stand_in(tmp_path, monkeypatch):
    """The children's interpreter replaced by the stand-in; returns a function that sets its behaviours and
    the log of the children started (their arguments after the interpreter)."""
    home = tmp_path / "stand-in"
    home.mkdir()
    python = home / "python"
    body = DATA / "sweep" / "stand_in_python.py"
    python.write_text(f"#!{PYTHON}\nexec(compile(open({str(body)!r}).read(), {str(body)!r}, 'exec'))\n")
    python.chmod(0o755)
    monkeypatch.setattr(sys, "executable", str(python))
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)

    def behave(values, vary="width", env=None, **more):  # more: "probe", "stray" (stand_in_python.py)
        behaviours = {
            "vary": vary,
            "values": values,
            "template": str(TEMPLATE),
            "environment": env or environment(),
            "messages": {"exit2": "--dtype bfloat16: not supported (stand-in)", "exit3": OOM, "exit3-failed": FAILED},
            **more,
        }
        (home / "behaviours.json").write_text(json.dumps(behaviours))

    def calls():
        log = home / "calls.log"
        return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []

    behave.calls, behave.home, behave.work = calls, home, work
    return behave


def measure_call(width, folder="out"):
    options = [
        "--device=cuda:0",
        "--batch=2",
        "--context=128",
        f"--width={width}",
        "--dtype=float32",
        "--warmup=3",
        "--repeats=5",
        "--seed=0",
        f"--output={folder}/mesures-width-{width}.json",
    ]
    return [MESURE_SCRIPT, "measure", *options]


PROBE = [MESURE_SCRIPT, "environment", "--device", "cuda:0", "--json"]


def sweep_plan(width):
    return mesure_memoire.memory_plan(config(batch=2, context=128, width=width, warmup=3, repeats=5))


def test_an_ascii_only_stdout_gets_the_folder_s_non_ascii_name_escaped(stand_in, monkeypatch):
    stand_in({"256": "write"})
    written = io.BytesIO()
    monkeypatch.setattr(sys, "stdout", io.TextIOWrapper(written, encoding="ascii"))
    arguments = [*SWEEP[: SWEEP.index("--output-dir")], "--output-dir", "sortie-\u00e9", "--values", "256"]
    assert mesure_memoire.main(arguments) == 0
    sys.stdout.flush()
    out = written.getvalue().decode("ascii")
    assert out.startswith("width 256: measured, sortie-\\xe9/mesures-width-256.json\n")
    assert out.endswith("Largest width measured: 256\n")


def test_when_the_first_value_is_predicted_not_to_fit_nothing_runs_and_no_folder_stays(stand_in, capsys):
    stand_in({"8192": "write"})
    assert mesure_memoire.main([*SWEEP, "--values", "8192"]) == 2
    captured = capsys.readouterr()
    problem = mesure_memoire.fit_problem(sweep_plan(8192), environment())
    assert captured.out == ""
    assert "larger" not in assert_one_line(captured.err, "width 8192", "not launched", problem)
    assert stand_in.calls() == [PROBE]
    assert os.listdir(".") == []


@pytest.mark.parametrize(
    ("behaviour", "stray", "said"),
    [
        ("exit3-failed", [], ["width 2048: the child failed (exit status 3)", FAILED]),
        ("remove-folder-then-exit3", [], ["width 2048: the child failed (exit status 3)", OOM]),
        ("exit3", "notes.txt", ["width 2048: the child failed (exit status 3)", OOM, "out kept: it holds notes.txt,"]),
    ],
    ids=["a-failed-phase", "the-folder-removed-meanwhile", "a-stray-file"],
)
def test_an_exit_3_at_the_first_value_exits_3_in_one_line_and_leaves_no_folder(
    stand_in, capsys, behaviour, stray, said
):
    """As measure does: it exits 3 for any failed phase, out of memory included, the child's line said.  Also when
    the folder was removed meanwhile (not a crash); a file someone else left there (a file
    manager's, an editor's) is left alone with its folder, named in the one line."""
    stand_in({"2048": behaviour}, stray=stray)
    assert mesure_memoire.main([*SWEEP, "--values", "2048,4096"]) == 3
    captured = capsys.readouterr()
    assert captured.out == ""
    line = assert_one_line(captured.err, *said)
    assert stray or line.endswith(said[-1])  # no words on a folder no longer there
    assert os.listdir(".") == (["out"] if stray else [])
    if stray:
        assert os.listdir("out") == ["notes.txt"]


@pytest.mark.parametrize(
    ("debug", "err"),
    [(["--debug"], error_line("--dtype bfloat16: not supported (stand-in)")), ([], "")],
    ids=["debug", "no-debug"],
)
def test_debug_is_passed_to_each_measure_child_whose_stderr_then_reaches_the_terminal(stand_in, capsys, debug, err):
    """Without --debug, a child's stderr stays the sweep's."""
    stand_in({"256": "write", "512": "exit2"})
    assert mesure_memoire.main([*SWEEP, "--values", "256,512", *debug]) == 0
    assert stand_in.calls() == [PROBE, [*measure_call(256), *debug], [*measure_call(512), *debug]]
    assert capsys.readouterr().err == err, "the child's own stderr"
    assert os.listdir("out") == ["mesures-width-256.json"]
    assert "--debug" not in (stand_in.work / "out" / "mesures-width-256.json").read_text()


def test_each_value_s_line_is_out_before_the_next_child_starts(stand_in, monkeypatch):
    """A sweep piped to a file or `tee` shows each measured value as it ends, not all at the sweep's end."""
    stand_in({"256": "write", "512": "write"})
    written, seen, real_popen = io.BytesIO(), [], subprocess.Popen
    monkeypatch.setattr(sys, "stdout", io.TextIOWrapper(written, encoding="utf-8"))  # buffered, as a pipe is

    def popen(*args, **kwargs):
        seen.append(written.getvalue().decode())
        return real_popen(*args, **kwargs)

    monkeypatch.setattr(subprocess, "Popen", popen)
    assert mesure_memoire.main([*SWEEP, "--values", "256,512"]) == 0
    assert seen == ["", "", MEASURED_256]  # the probe, width 256, width 512


def test_a_child_that_ignores_the_interrupt_is_killed(stand_in, capsys, monkeypatch):
    monkeypatch.setattr(mesure_memoire, "SWEEP_STOP_GRACE_S", 0.5)
    stand_in({"256": "hang"})
    real_popen = subprocess.Popen

    def ignoring_sigint(*args, **kwargs):  # the stand-in child ignores SIGINT: only a kill stops it
        return real_popen(*args, **kwargs, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))

    monkeypatch.setattr(subprocess, "Popen", ignoring_sigint)
    # --debug too: a stopped child's stderr is not its answer, the refusal stays the one line.
    assert mesure_memoire.main([*SWEEP, "--values", "256", "--timeout-s", "1", "--debug"]) == 2
    assert_one_line(capsys.readouterr().err, "width 256", "within 1 s", "nothing kept")
    assert os.listdir(".") == []


@pytest.mark.whole_kit
def test_without_a_gpu_the_real_probe_refuses_and_no_folder_stays(tmp_path):
    no_gpu_here()
    completed = subprocess.run(
        [sys.executable, MESURE_SCRIPT, *SWEEP, "--values", "256"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=120,
    )
    assert_one_line_refusal(completed, "no usable GPU for cuda:0", "run this on the GPU box", NOTHING_MEASURED)
    assert list(tmp_path.iterdir()) == []


# (the options added to SWEEP, what the one line names)
SWEEP_REFUSALS = [
    (["--values", "256,256"], "--values: expected strictly increasing", "'256,256'"),
    (["--values", "0,1"], "--values", "'0'"),
    (["--values", "256", "--width", "64"], "--width: --vary width takes its values from --values", "drop --width"),
    (["--values", "256", "--timeout-s", "0"], "--timeout-s", "from 1 to 604800"),
    (["--values", "256", "--output-dir", "existing"], "--output-dir: existing already exists", "a new folder"),
    (["--values", "256", "--output-dir", "missing/out"], "--output-dir", "missing/out does not exist"),
    (["--values", "256", "--output-dir", " "], "--output-dir", "got ' '"),
    (["--values", "256", "--output-dir", "a\0b"], "--output-dir", "got 'a\\x00b'"),
    (["--vary", "dtype", "--values", "1"], "--vary: expected one of batch, context, width", "got 'dtype'"),
]


@pytest.mark.parametrize(("extra", "first", "second"), SWEEP_REFUSALS, ids=plain_ids(SWEEP_REFUSALS))
def test_refusals_come_before_any_child_and_create_nothing(tmp_path, monkeypatch, capsys, extra, first, second):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "existing").mkdir()
    (tmp_path / "file.json").write_text("{}")

    def no_child(*args, **kwargs):
        raise AssertionError("a child was started")

    monkeypatch.setattr(subprocess, "Popen", no_child)
    before = tree_digest(tmp_path)
    # An option in extra replaces SWEEP's.
    options = dict(zip(SWEEP[1::2], SWEEP[2::2], strict=True)) | dict(zip(extra[::2], extra[1::2], strict=True))
    assert mesure_memoire.main(["sweep", *(item for option in options.items() for item in option)]) == 2
    assert_one_line(capsys.readouterr().err, "error: " + first, second)
    assert tree_digest(tmp_path) == before
    assert sorted(os.listdir(tmp_path)) == ["existing", "file.json"]


def test_batch_and_context_can_be_varied_too(stand_in, capsys):
    stand_in({"1": "write", "3": "write"}, vary="batch")
    argv = ["sweep", "--device", "cuda:0", "--vary", "batch", "--values", "1,3", "--width", "32", "--output-dir", "b"]
    assert mesure_memoire.main(argv) == 0
    assert [call[3] for call in stand_in.calls()[1:]] == ["--batch=1", "--batch=3"]
    assert capsys.readouterr().out.splitlines()[-1] == "Largest batch measured: 3"
    assert sorted(os.listdir("b")) == ["mesures-batch-1.json", "mesures-batch-3.json"]


def test_the_readme_sweep_stops_at_the_first_exit_3_and_reports_what_it_wrote(stand_in, capsys):
    """The README's command, with the stand-in children: widths up to 1024 "fit" (the crafted results are
    copied), 2048 runs out of memory (exit 3); the table is the README's example."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    section = readme.split("### One dimension at a time, then `report`", 1)[1].split("\n## ", 1)[0]
    command = section.split("```console\n", 1)[1].split("\n```", 1)[0]
    assert command.startswith("python mesure_memoire.py sweep ")
    crafted = DATA / "report" / "readme" / "sweep-width"
    stand_in(
        {**{str(w): {"copy": str(crafted / f"mesures-width-{w}.json")} for w in (256, 512, 1024)}, "2048": "exit3"}
    )
    assert mesure_memoire.main(command.split()[2:]) == 0
    out = capsys.readouterr().out
    assert [call[5] for call in stand_in.calls()[1:]] == ["--width=256", "--width=512", "--width=1024", "--width=2048"]
    progress = "".join(f"width {w}: measured, sweep-width/mesures-width-{w}.json\n" for w in (256, 512, 1024))
    assert out.startswith(progress + "Sweep stopped: width 2048: the child failed (exit status 3): ")
    assert NOTHING_MEASURED not in out  # it measured three widths
    assert sorted(os.listdir("sweep-width")) == sorted(os.listdir(crafted))
    # The section's second command reads the folder again: the same table as the sweep's end.
    report = section.split("```console\n")[2].split("\n```", 1)[0]
    assert report == "python mesure_memoire.py report sweep-width"
    assert mesure_memoire.main(report.split()[2:]) == 0
    table = capsys.readouterr().out
    assert table.startswith("file ")
    assert out.endswith("\n" + table + "Largest width measured: 1024\n")


def test_the_children_read_no_input_and_their_output_stays_theirs(stand_in, capfd):
    """The sweep's own standard input is a pipe here: no child may read it, or print on the sweep's output."""
    stand_in({"256": "write"})
    read_end, write_end = os.pipe()
    saved = os.dup(0)
    os.dup2(read_end, 0)
    try:
        assert mesure_memoire.main([*SWEEP, "--values", "256"]) == 0
    finally:
        os.dup2(saved, 0)
        for descriptor in (saved, read_end, write_end):
            os.close(descriptor)
    assert (stand_in.home / "stdin.log").read_text() == "true\ntrue\n"  # the probe, then the measurement
    assert "a stand-in's table" not in capfd.readouterr().out


@pytest.mark.parametrize(
    ("behaviour", "said"),
    [
        ("exit1", ["width 256: the child failed (exit status 1)", "no message"]),
        ("exit0", ["width 256: the child exited 0 without writing its result"]),
        ("exit2", ["width 256: the child refused (exit status 2)", "--dtype bfloat16: not supported (stand-in)"]),
        ("exit2-bytes", ["width 256: the child refused", "not UTF-8: \ufffd\ufffd"]),
    ],
    ids=["exit-1-without-a-word", "exit-0-without-a-result", "a-refusal", "a-message-that-is-not-UTF-8"],
)
def test_how_a_child_ended_is_said_in_one_line_and_stops_the_sweep(stand_in, capsys, behaviour, said):
    stand_in({"256": behaviour, "512": "write"})
    assert mesure_memoire.main([*SWEEP, "--values", "256,512"]) == 2
    assert_one_line(capsys.readouterr().err, *said)
    assert stand_in.calls() == [PROBE, measure_call(256)]
    assert os.listdir(".") == []


NO_GPU = "torch.cuda.is_available() is False (stand-in)"


@pytest.mark.parametrize(
    ("probe", "env", "said"),
    [
        ({"exit": 1}, None, ["reading cuda:0 failed (exit status 1)", NOTHING_MEASURED]),
        ({"stdout": "not JSON"}, None, ["reading cuda:0 failed (exit status 0)"]),
        ({"stdout": '{"gpu": 1}'}, None, ["reading cuda:0 failed (exit status 0)"]),
        ({}, {**environment(), "gpu": None}, ["no usable GPU for cuda:0: None", NOTHING_MEASURED]),
        ({}, environment(available=False), [f"no usable GPU for cuda:0: {NO_GPU}: run this on the GPU box"]),
        ({}, {**environment(), "torch": "2.3.1+cu121"}, ["PyTorch 2.4 or later", "PyTorch '2.3.1+cu121'"]),
    ],
    ids=["exit-1-with-an-environment", "not-JSON", "gpu-not-an-object", "available-but-no-gpu", "no-GPU", "torch-2.3"],
)
def test_a_probe_that_fails_stops_the_sweep_before_any_measurement(stand_in, capsys, probe, env, said):
    stand_in({"256": "write"}, env=env, probe=probe)
    assert mesure_memoire.main([*SWEEP, "--values", "256"]) == 2
    assert_one_line(capsys.readouterr().err, *said)
    assert stand_in.calls() == [PROBE]
    assert os.listdir(".") == []


def test_a_probe_that_hangs_is_stopped_and_said(stand_in, capsys, monkeypatch):
    monkeypatch.setattr(mesure_memoire, "SWEEP_PROBE_TIMEOUT_S", 1)
    stand_in({"256": "write"}, probe={"hang": True})
    assert mesure_memoire.main([*SWEEP, "--values", "256"]) == 2
    assert_one_line(capsys.readouterr().err, "reading cuda:0 did not answer within 1 s", NOTHING_MEASURED)
    assert os.listdir(".") == []


@pytest.mark.parametrize(
    ("error", "said"),
    [
        (PermissionError(13, "Permission denied"), ["--output-dir: cannot create out: PermissionError: [Errno 13]"]),
    ],
    ids=["cannot-be-created"],
)
def test_a_folder_that_cannot_be_made_when_the_first_child_starts_is_one_line(
    stand_in, capsys, monkeypatch, error, said
):
    stand_in({"256": "write"})

    def refusing_mkdir(path, *args):
        raise error

    monkeypatch.setattr(os, "mkdir", refusing_mkdir)
    assert mesure_memoire.main([*SWEEP, "--values", "256"]) == 2
    assert_one_line(capsys.readouterr().err, *said)
    assert stand_in.calls() == [PROBE]


def test_sweep_launches_the_largest_width_the_plan_gives_for_that_card_and_not_one_more(stand_in, capsys):
    """One fit rule: on a card of the plan's memory whose free memory is that less the context allowance
    (the stand-in child environment), sweep launches --plan --memory-gib's largest width, not the next, nor any
    larger."""
    run = ["--batch", "2", "--context", "128", "--warmup", "3", "--repeats", "5"]
    assert mesure_memoire.main(["measure", *run, "--width", "1024", "--plan", "--memory-gib", "3.5", "--json"]) == 0
    fit = json.loads(capsys.readouterr().out)
    largest, total = fit["largest"]["width"], fit["memory_bytes"]
    env = environment(free=total - fit["context_allowance_bytes"])
    env["gpu"]["total_memory_bytes"] = total
    stand_in({str(width): "write" for width in (largest, largest + 1, largest + 2)}, env=env)
    assert mesure_memoire.main([*SWEEP, "--values", f"{largest},{largest + 1},{largest + 2}"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert stand_in.calls() == [PROBE, measure_call(largest)]
    problem = mesure_memoire.fit_problem(sweep_plan(largest + 1), env)
    assert out[1].startswith(f"Sweep stopped: width {largest + 1}: ")
    for fact in ("not launched", "1 larger value", problem):
        assert fact in out[1], fact
    assert out[-1] == f"Largest width measured: {largest}"
    assert os.listdir("out") == [f"mesures-width-{largest}.json"]


# --- a stray file, a folder removed, signals sent twice, the interpreter's flags (issue 42) -----------------------


def signal_once_the_child_hangs(monkeypatch, stand_in, width, sent):
    """The user's Ctrl-C (or a SIGTERM) to this process, sent once the child measuring ``width`` hangs; returns the
    timeouts each communicate was given."""
    real_communicate, pending, timeouts = subprocess.Popen.communicate, [sent], []

    def communicate(process, input=None, timeout=None):
        timeouts.append(timeout)
        if pending and f"--width={width}" in process.args:
            deadline = time.monotonic() + 30
            while not (stand_in.home / "hanging.pid").exists() and time.monotonic() < deadline:
                time.sleep(0.02)
            os.kill(os.getpid(), pending.pop())
        return real_communicate(process, input, timeout)

    monkeypatch.setattr(subprocess.Popen, "communicate", communicate)
    return timeouts


def sweep_as_from_a_terminal(argv):
    """main(argv) with Ctrl-C raising KeyboardInterrupt here, as from a terminal: a suite started in the background
    (with &) has SIGINT ignored, which its children would inherit, and the stand-in would then set no handler to
    log the interrupt with."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        return mesure_memoire.main(argv)
    finally:
        signal.signal(signal.SIGINT, previous)


# (the children's behaviours, the strays they leave, the signal, stdout, what stays in the folder: None, no folder)
SIGNALLED = [
    ({"256": "write", "512": "hang"}, [], signal.SIGINT, MEASURED_256, ["mesures-width-256.json"]),
    ({"256": "write-then-hang"}, [], signal.SIGINT, "", None),
    ({"256": "hang"}, ["notes.txt", "notes.tmp"], signal.SIGINT, "", ["notes.tmp", "notes.txt"]),
    ({"256": "hang"}, ["notes.txt"], signal.SIGTERM, "", ["notes.txt"]),
]
SIGNALLED_IDS = ["Ctrl-C-after-a-result", "Ctrl-C-result-written", "Ctrl-C-strays", "SIGTERM"]


@pytest.mark.parametrize(("behaviours", "strays", "sent", "out", "left"), SIGNALLED, ids=SIGNALLED_IDS)
def test_a_signal_stops_the_child_and_the_sweep_keeping_only_the_results_measured(
    stand_in, capsys, monkeypatch, behaviours, strays, sent, out, left
):
    """Ctrl-C or SIGTERM (a scheduler, docker stop) while a child measures: the child is interrupted and given its
    grace, its partial file (even a result it wrote) goes, the results measured before stay, a stray file (even
    one named *.tmp) is left alone and named; 130 or 143."""
    stand_in(behaviours, stray=strays)
    hanging = next(value for value, behaviour in behaviours.items() if "hang" in behaviour)
    timeouts = signal_once_the_child_hangs(monkeypatch, stand_in, hanging, sent)
    status, said = (130, "Ctrl-C") if sent == signal.SIGINT else (143, "SIGTERM")
    assert sweep_as_from_a_terminal([*SWEEP, "--values", ",".join(behaviours)]) == status
    captured = capsys.readouterr()
    assert captured.out == out
    line = assert_one_line(captured.err, f"interrupted ({said})", "no partial file left behind")
    if strays:
        assert f"; out kept: it holds {', '.join(left)}, which the sweep did not write" in line
    else:
        assert "kept" not in line
    assert (sorted(os.listdir("out")) if os.path.isdir("out") else None) == left
    assert timeouts[-1] == mesure_memoire.SWEEP_STOP_GRACE_S
    with pytest.raises(ProcessLookupError):
        os.kill(int((stand_in.home / "hanging.pid").read_text()), 0)


def test_ctrl_c_while_a_timed_out_child_is_being_stopped_ends_the_sweep_there(stand_in, capsys, monkeypatch):
    """Ctrl-C while the sweep waits for the child it interrupted after its time-out: the child is killed and
    the sweep ends as interrupted (130), not as stopped by the time-out alone."""
    monkeypatch.setattr(mesure_memoire, "SWEEP_STOP_GRACE_S", 5)
    stand_in({"256": "hang", "512": "write"})
    real_send_signal, real_communicate, interrupted = subprocess.Popen.send_signal, subprocess.Popen.communicate, []

    def send_signal(process, number):
        real_send_signal(process, number)
        if number == signal.SIGINT:  # not the kill that follows
            interrupted.append(process)

    def communicate(process, input=None, timeout=None):
        if process in interrupted:  # the sweep now waits for the interrupted child: the user presses Ctrl-C
            interrupted.remove(process)
            os.kill(os.getpid(), signal.SIGINT)
        return real_communicate(process, input, timeout)

    monkeypatch.setattr(subprocess.Popen, "send_signal", send_signal)
    monkeypatch.setattr(subprocess.Popen, "communicate", communicate)
    assert sweep_as_from_a_terminal([*SWEEP, "--values", "256,512", "--timeout-s", "1"]) == 130
    captured = capsys.readouterr()
    assert "timed out" not in assert_one_line(captured.err, "interrupted (Ctrl-C)")
    assert captured.out == ""
    assert os.listdir(".") == []
    with pytest.raises(ProcessLookupError):
        os.kill(int((stand_in.home / "hanging.pid").read_text()), 0)


def unlistable(monkeypatch, name):
    """os.listdir refusing the folder ``name`` (made unreadable meanwhile: chmod a-r, as another user)."""
    real_listdir = os.listdir

    def listdir(path="."):
        if os.path.basename(os.path.normpath(path)) == name:
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES))
        return real_listdir(path)

    monkeypatch.setattr(os, "listdir", listdir)


def test_a_failed_child_s_folder_that_cannot_be_listed_is_kept_and_said_in_one_line(stand_in, capsys, monkeypatch):
    """After a child that did not succeed the sweep clears what it left: a folder made unreadable meanwhile (by
    another user) is kept and said so, in the same line as the child's end, not a traceback."""
    stand_in({"256": "exit0", "512": "write"}, stray="notes.txt")
    unlistable(monkeypatch, "out")
    assert mesure_memoire.main([*SWEEP, "--values", "256,512"]) == 2
    strays = "files that cannot be listed (PermissionError: [Errno 13] Permission denied)"
    assert_one_line(capsys.readouterr().err, "width 256: the child exited 0 without", f"; out kept: it holds {strays}")
    assert [entry.name for entry in os.scandir("out")] == ["notes.txt"]


def test_a_timed_out_child_s_partial_file_that_cannot_be_removed_is_named_in_one_line(stand_in, capsys, monkeypatch):
    """The folder made read-only meanwhile: the partial file stays, named in the one line, not a traceback."""
    monkeypatch.setattr(mesure_memoire, "SWEEP_STOP_GRACE_S", 5)
    stand_in({"256": "hang"})
    real_unlink = os.unlink

    def unlink(path, *args, **kwargs):
        if os.path.dirname(os.path.normpath(path)) == "out":
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES))
        return real_unlink(path, *args, **kwargs)

    monkeypatch.setattr(os, "unlink", unlink)
    assert sweep_as_from_a_terminal([*SWEEP, "--values", "256", "--timeout-s", "1"]) == 2
    (left,) = os.listdir("out")
    assert left.startswith(".partial-"), left
    assert_one_line(capsys.readouterr().err, "width 256: the child did not finish", f"; out kept: it holds {left},")


# The sweep's parent, run for real with the stand-in children; with "summary", its summary (the report's
# lines) is written slowly, its name first logged in the stand-in's moments.log.
PARENT = """
import os, runpy, sys, time
sys.executable, moments, slow = sys.argv[1], sys.argv[2], sys.argv[3] == "summary"
sys.argv = sys.argv[4:]
class SlowSummary:
    def __init__(self, stream):
        self.stream = stream
    def write(self, text):
        if slow and "Largest" in text:
            with open(moments, "a") as log:
                log.write("summary\\n")
            time.sleep(5)
        return self.stream.write(text)
    def __getattr__(self, name):
        return getattr(self.stream, name)
sys.stdout = SlowSummary(sys.stdout)
runpy.run_path(sys.argv[0], run_name="__main__")
"""
SLOW_SECONDS = 0.8  # the child's chosen step: long enough for both signals to land inside it
SIGNALS_APART_S = 0.4  # beyond the 0.25 s that Popen.communicate gives a child after a KeyboardInterrupt
# Each moment once, the two signals in turn: the parent handles both alike (Terminated is a KeyboardInterrupt).
# The child's import is not one: for the parent it is the phase's moment, and measure's own tests hold it.
MOMENTS = [("phase", signal.SIGTERM), ("write", signal.SIGINT), ("summary", signal.SIGTERM)]


@pytest.mark.parametrize(("moment", "sent"), MOMENTS, ids=[f"{m}-{s.name}" for m, s in MOMENTS])
def test_a_signal_sent_twice_leaves_no_child_running_and_no_file_written_afterwards(stand_in, moment, sent):
    """Two signals to the sweep's parent while its child is in a call that does not return at once (a long kernel
    or a driver call, during the import, a phase or the result's write), or while the parent writes its summary:
    the parent waits for its child, ends it, then exits with the signal's status; nothing appears afterwards."""
    value = {"summary": "write"}.get(moment, {"slow": SLOW_SECONDS, "at": moment})
    stand_in({"256": value})
    moments = stand_in.home / "moments.log"
    parent = [PYTHON, "-c", PARENT, str(stand_in.home / "python"), str(moments), moment, MESURE_SCRIPT]
    process = subprocess.Popen(
        [*parent, *SWEEP, "--values", "256"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=sigint_as_from_a_terminal,
    )
    deadline = time.monotonic() + 30
    while moment not in (moments.read_text().split() if moments.exists() else []) and time.monotonic() < deadline:
        time.sleep(0.02)
    process.send_signal(sent)
    time.sleep(SIGNALS_APART_S)
    process.send_signal(sent)
    out, err = process.communicate(timeout=30)
    left = sorted(os.listdir("out")) if os.path.isdir("out") else None
    status, said = (130, "Ctrl-C") if sent == signal.SIGINT else (143, "SIGTERM")
    assert process.returncode == status, err
    assert err == MESSAGES["interrupted, no partial file"].format(signal=said)
    if moment != "summary":
        with pytest.raises(ProcessLookupError):  # ended and reaped by the parent, not left to finish alone
            os.kill(int((stand_in.home / "child.pid").read_text()), 0)
        assert left is None, left  # no result, no partial file: no folder
    else:
        assert out.startswith("width 256: measured, out/mesures-width-256.json\n")
        assert left == ["mesures-width-256.json"]
    time.sleep(SLOW_SECONDS - SIGNALS_APART_S + 0.2)  # past the child's step: a child left running would write now
    assert (sorted(os.listdir("out")) if os.path.isdir("out") else None) == left


# --- a signal while a child starts; a child started with the signals held (issue 55) -------------------------


def signal_while_starting(monkeypatch, stand_in, command, sent):
    """``sent`` to this process by the child running ``command`` (environment: the probe; measure), between its
    fork and its exec, while Popen has not returned; the child's process id in ``started.pid``."""
    real_popen = subprocess.Popen

    def popen(args, **kwargs):
        if command in args:

            def between_fork_and_exec():
                (stand_in.home / "started.pid").write_text(str(os.getpid()))
                signal_main_thread(os.getppid(), sent)

            kwargs["preexec_fn"] = between_fork_and_exec
        return real_popen(args, **kwargs)

    monkeypatch.setattr(subprocess, "Popen", popen)


STARTS = [("environment", signal.SIGINT), ("measure", signal.SIGTERM)]  # the parent handles both signals alike


@pytest.mark.parametrize(("command", "sent"), STARTS, ids=[f"{c}-{s.name}" for c, s in STARTS])
def test_a_signal_while_a_child_starts_ends_the_child_before_the_sweep(stand_in, capsys, monkeypatch, command, sent):
    """A Ctrl-C or SIGTERM that lands while the sweep starts its probe or a measurement: the child, already
    forked, is stopped and reaped before the sweep exits (not left running alone)."""
    probe = {"hang": True} if command == "environment" else {}
    stand_in({"256": "hang"}, probe=probe)  # each child hangs: one left running would still be there afterwards
    signal_while_starting(monkeypatch, stand_in, command, sent)
    status = sweep_as_from_a_terminal([*SWEEP, "--values", "256"])
    assert not left_running(int((stand_in.home / "started.pid").read_text()))
    said = "Ctrl-C" if sent == signal.SIGINT else "SIGTERM"
    assert status == (130 if sent == signal.SIGINT else 143)
    assert capsys.readouterr().err == MESSAGES["interrupted, no partial file"].format(signal=said)
    assert os.listdir(".") == []


def test_a_child_started_with_the_signals_blocked_still_hears_ctrl_c(stand_in):
    """The sweep starts each child with SIGINT and SIGTERM blocked (so that none lands before the child is in its
    hands), and a blocked signal stays blocked across exec: the kit's main lets them through first, or the sweep's
    Ctrl-C to its child would wait unheard while the child goes on and writes its result."""
    stand_in({"256": {"slow": 0.3, "at": "phase"}})  # the kit's own main, with a stand-in PyTorch

    def started_as_the_sweep_starts_it():
        sigint_as_from_a_terminal()
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})

    child = subprocess.Popen(
        [str(stand_in.home / "python"), *measure_call(256, folder=".")],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=started_as_the_sweep_starts_it,
    )
    moments = stand_in.home / "moments.log"
    deadline = time.monotonic() + 30
    while "phase" not in (moments.read_text().split() if moments.exists() else []) and time.monotonic() < deadline:
        time.sleep(0.02)
    child.send_signal(signal.SIGINT)  # what stop_child sends
    out, err = child.communicate(timeout=30)
    assert child.returncode == 130, err
    assert err == MESSAGES["interrupted, no partial file"].format(signal="Ctrl-C")
    assert os.listdir(".") == []


# --- no child can be started: a process limit (issue 55) ----------------------------------------------------


@pytest.mark.parametrize(("refused", "where"), [(1, ""), (2, "width 256: ")], ids=["the-probe", "a-measurement"])
def test_a_child_that_cannot_be_started_is_one_line_and_leaves_no_folder(stand_in, capsys, monkeypatch, refused, where):
    """The OS refuses to fork the probe, or the first measurement (a process limit, ulimit -u: EAGAIN): one line
    naming the OS error, exit 2, no folder, and SIGINT and SIGTERM no longer held."""
    stand_in({"256": "write"})
    real_popen, started = subprocess.Popen, []

    def popen(*args, **kwargs):
        started.append(args)
        if len(started) == refused:
            raise BlockingIOError(errno.EAGAIN, os.strerror(errno.EAGAIN))
        return real_popen(*args, **kwargs)

    monkeypatch.setattr(subprocess, "Popen", popen)
    assert mesure_memoire.main([*SWEEP, "--values", "256"]) == 2
    said = f"{where}cannot start a child process: BlockingIOError: [Errno {errno.EAGAIN}] {os.strerror(errno.EAGAIN)}"
    assert capsys.readouterr() == ("", error_line(said))
    assert os.listdir(".") == []
    assert not {signal.SIGINT, signal.SIGTERM} & signal.pthread_sigmask(signal.SIG_BLOCK, [])


def test_the_children_get_the_parent_s_interpreter_flags_and_the_parent_imports_no_pytorch(stand_in):
    """python3 -I mesure_memoire.py sweep ...: each child runs with -I too, not with what -I excluded; the sweep's
    own process imports neither PyTorch nor NumPy."""
    stand_in({"256": "write"})
    wrapper = (
        "import runpy, sys; sys.executable = sys.argv[1]; sys.argv = sys.argv[2:]\n"
        "try:\n    runpy.run_path(sys.argv[0], run_name='__main__')\n"
        "finally:\n    print(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'numpy')), "
        "file=sys.stderr)"
    )
    completed = subprocess.run(
        [PYTHON, "-I", "-c", wrapper, str(stand_in.home / "python"), MESURE_SCRIPT, *SWEEP, "--values", "256"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert (completed.returncode, completed.stderr) == (0, "[]\n")
    logged = [json.loads(line) for line in (stand_in.home / "flags.log").read_text().splitlines()]
    assert logged == [["-I"], ["-I"]]  # the probe, then the measurement


def test_the_children_get_the_warning_options_of_the_sweep_s_own_interpreter(stand_in, monkeypatch):
    """In-process: python -W ... mesure_memoire.py sweep gives each child the same -W options."""
    stand_in({"256": "write"})
    monkeypatch.setattr(sys, "warnoptions", ["ignore::DeprecationWarning"])
    assert mesure_memoire.main([*SWEEP, "--values", "256"]) == 0
    logged = [json.loads(line) for line in (stand_in.home / "flags.log").read_text().splitlines()]
    assert len(logged) == 2 and all("-Wignore::DeprecationWarning" in flags for flags in logged), logged


# --- report FOLDER: the folder sweep wrote ---------------------------------------------------------------

CRAFTED_SWEEP = DATA / "report" / "readme" / "sweep-width"


def sweep_folder(tmp_path, monkeypatch, *others):
    """A folder as sweep leaves it (widths 256, 512, 1024: crafted results), with ``others`` beside them."""
    monkeypatch.chdir(tmp_path)
    folder = tmp_path / "sweep-width"
    folder.mkdir()
    for width in (1024, 256, 512):  # created out of order: the order read is the values'
        (folder / f"mesures-width-{width}.json").write_bytes(
            (CRAFTED_SWEEP / f"mesures-width-{width}.json").read_bytes()
        )
    for name in others:
        (folder / name).write_text("not a result\n")
    return folder


SWEPT = [f"sweep-width/mesures-width-{width}.json" for width in (256, 512, 1024)]


# Files that are not the sweep's results: a copy kept aside under another name, a partial file, a note.
OTHERS = ["notes.txt", ".partial-x1.tmp", "mesures-width-0256.json", "mesures-depth-8.json"]
OTHERS += ["mesures-width-2048.orig", "archive-width-4096.json"]


@pytest.mark.parametrize(("given", "others"), [("sweep-width", OTHERS), ("sweep-width/", [])], ids=["others", "slash"])
def test_report_reads_the_folder_sweep_wrote_in_the_order_of_the_values(tmp_path, monkeypatch, capsys, given, others):
    """The same table as the files named one by one; any other file of the folder skipped."""
    sweep_folder(tmp_path, monkeypatch, *others)
    assert mesure_memoire.main(["report", given, "--json"]) == 0
    captured = capsys.readouterr()
    assert [row["file"] for row in json.loads(captured.out)["results"]] == SWEPT, "by width, not by file name"
    assert captured.err == ""
    assert mesure_memoire.main(["report", given]) == 0
    from_folder = capsys.readouterr().out
    assert mesure_memoire.main(["report", *SWEPT]) == 0
    assert from_folder == capsys.readouterr().out


@pytest.mark.parametrize(
    ("case", "said"),
    [
        ("no result of sweep", ["sweep-width holds no result of sweep", "pass result files, or the folder sweep"]),
        ("unlistable", ["sweep-width cannot be listed (PermissionError: [Errno 13] Permission denied)"]),
    ],
    ids=plain_id,
)
def test_a_folder_report_cannot_take_is_refused_in_one_line(tmp_path, monkeypatch, capsys, case, said):
    folder = sweep_folder(tmp_path, monkeypatch, "notes.txt")
    if case == "no result of sweep":
        for width in (256, 512, 1024):
            (folder / f"mesures-width-{width}.json").unlink()
    else:
        unlistable(monkeypatch, "sweep-width")
    assert mesure_memoire.main(["report", "sweep-width"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert_one_line(captured.err, "error: report: ", *said)
