"""tools/build_zip.py against hostile input: one line on stderr, the right exit status, no traceback,
every file as it was.  Each build runs in a copy of the shipped files in tmp_path: the real tree is
never touched.  In-process through main(argv); a subprocess only for signals and a broken stdout."""

import errno
import io
import json
import os
import shutil
import signal
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from conftest import ROOT, SHIPPED_ROOT, UnwritableStdout, load_build_zip, sigint_as_from_a_terminal, tree_digest

build_zip = load_build_zip()

ARCHIVE = "iteragpu-lab-v1.zip"


@pytest.fixture
def source(tmp_path, monkeypatch):
    """A copy of the shipped files, inside tmp_path, with no SOURCE_DATE_EPOCH from outside."""
    monkeypatch.delenv("SOURCE_DATE_EPOCH", raising=False)
    folder = tmp_path / "repo"
    folder.mkdir()
    for name in build_zip.MEMBERS:
        shutil.copy(SHIPPED_ROOT / name, folder / name)
    return folder


def make_stale(source):
    """A change the manifest does not know yet: a build that succeeded would rewrite MANIFEST.json."""
    with (source / "README.md").open("a", encoding="utf-8") as stream:
        stream.write("One more line.\n")


def read_only_folder(tmp_path):
    """A folder where no file can be created: mode 0555, or sysfs where root ignores the mode."""
    folder = tmp_path / "read-only"
    folder.mkdir()
    folder.chmod(0o555)
    if os.access(folder, os.W_OK):
        folder = Path("/sys")
    return folder


def _write(path, data):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)


def _own_archive_at(source, path):
    """A real archive of the kit, built from the copy, moved to ``path``."""
    assert build_zip.main(["--source", str(source), "--output", str(path.parent / "built.zip")]) == 0
    (path.parent / "built.zip").rename(path)


def _edit_manifest(source, **changes):
    manifest = json.loads((source / "MANIFEST.json").read_text(encoding="utf-8"))
    manifest.update(changes)
    (source / "MANIFEST.json").write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")


def _add_manifest_entry(source, entry):
    manifest = json.loads((source / "MANIFEST.json").read_text(encoding="utf-8"))
    _edit_manifest(source, members=[*manifest["members"], entry])


# fmt: off
STALE = "MANIFEST.json is stale for {}: run python tools/build_zip.py"
EPOCH = "error: SOURCE_DATE_EPOCH must be whole seconds in ASCII digits, got {}"
# name: (prepare(source, tmp_path) -> argv, environment, exit status, the stderr line after "build_zip.py: ",
# where {s} is the source folder, {t} tmp_path and {o} the --output given)
CASES = {
    "output is a member": (lambda s, t: ["--output", str(s / "README.md")], {}, 2,
                           "error: --output '{s}/README.md' already exists: this tool never writes over a file"),
    "output is the manifest": (
        lambda s, t: ["--output", str(s / "MANIFEST.json")], {}, 2,
        "error: --output '{s}/MANIFEST.json' already exists: this tool never writes over a file",
    ),
    "output is an unrelated file": (
        lambda s, t: (_write(t / "notes.txt", b"mine\n"), ["--output", str(t / "notes.txt")])[1],
        {}, 2, "error: --output '{t}/notes.txt' already exists: this tool never writes over a file",
    ),
    "output is an older archive elsewhere": (
        lambda s, t: (_own_archive_at(s, t / "old.zip"), ["--output", str(t / "old.zip")])[1],
        {}, 2, "error: --output '{t}/old.zip' already exists: this tool never writes over a file",
    ),
    "output is a dangling link": (
        lambda s, t: ((t / "link.zip").symlink_to(t / "nowhere"), ["--output", str(t / "link.zip")])[1],
        {}, 2, "error: --output '{t}/link.zip' already exists: this tool never writes over a file",
    ),
    "default place is a link to an archive": (
        lambda s, t: (_own_archive_at(s, t / "own.zip"), (s / "dist").mkdir(),
                      (s / "dist" / ARCHIVE).symlink_to(t / "own.zip"), [])[3],
        {}, 2, "error: '{s}/dist/iteragpu-lab-v1.zip' exists and is not this tool's archive: move it away",
    ),
    "default place holds an unrelated file": (
        lambda s, t: (_write(s / "dist" / ARCHIVE, b"not a zip"), [])[1],
        {}, 2, "error: '{s}/dist/iteragpu-lab-v1.zip' exists and is not this tool's archive: move it away",
    ),
    "default place is a folder": (
        lambda s, t: ((s / "dist" / ARCHIVE).mkdir(parents=True), [])[1], {}, 2,
        "error: --output '{s}/dist/iteragpu-lab-v1.zip' is a folder: name the archive file",
    ),
    "dist is a file": (lambda s, t: (_write(s / "dist", b"x"), [])[1], {}, 2,
                       "error: the folder of '{s}/dist/iteragpu-lab-v1.zip' is not a folder"),
    "a partial archive exists": (
        lambda s, t: (_write(t / "kit.zip.partial", b"someone's"), ["--output", str(t / "kit.zip")])[1],
        {}, 2, "error: '{t}/kit.zip.partial' already exists (an interrupted build?): remove it, then retry",
    ),
    "a partial manifest exists": (
        lambda s, t: (make_stale(s), _write(s / "MANIFEST.json.partial", b"x"), ["--output", str(t / "k.zip")])[2],
        {}, 2, "error: '{s}/MANIFEST.json.partial' already exists (an interrupted build?): remove it, then retry",
    ),
    "output names a folder": (lambda s, t: ["--output", str(t)], {}, 2,
                              "error: --output '{t}' is a folder: name the archive file"),
    "output folder missing": (lambda s, t: ["--output", str(t / "absent" / "k.zip")], {}, 2,
                              "error: --output: the folder of '{t}/absent/k.zip' does not exist"),
    "output folder read-only": (
        lambda s, t: (make_stale(s), ["--output", str(read_only_folder(t) / "kit.zip")])[1],
        {}, 2, "error: cannot write beside '{o}' (Permission denied)",
    ),
    "newline in output": (lambda s, t: ["--output", str(t / "no\nfolder" / "k.zip")], {}, 2,
                          "error: --output: the folder of '{t}/no\\nfolder/k.zip' does not exist"),
    "notebook not JSON": (
        lambda s, t: (_write(s / "mesure-memoire.ipynb", b"{not json"), [])[1], {}, 2,
        "error: mesure-memoire.ipynb is not a JSON notebook (Expecting property name enclosed in double quotes: line 1 "
        "column 2 (char 1))",
    ),
    "notebook not UTF-8": (
        lambda s, t: (_write(s / "mesure-memoire.ipynb", b'{"cells": "\xff"}'), [])[1], {}, 2,
        "error: mesure-memoire.ipynb is not a JSON notebook ('utf-8' codec can't decode byte 0xff in position 11: "
        "invalid start byte)",
    ),
    "notebook a JSON list": (
        lambda s, t: (_write(s / "mesure-memoire.ipynb", b"[]"), [])[1], {}, 2,
        "error: mesure-memoire.ipynb is not a notebook: expected a JSON object with a list of cells",
    ),
    "notebook cells not a list": (
        lambda s, t: (_write(s / "mesure-memoire.ipynb", b'{"cells": "abc"}'), [])[1], {}, 2,
        "error: mesure-memoire.ipynb is not a notebook: expected a JSON object with a list of cells",
    ),
    "template not UTF-8": (
        lambda s, t: (_write(s / "resultats-bruts.csv", b"run_id,\xe9\n"), [])[1],
        {}, 2, "error: resultats-bruts.csv is not UTF-8 (byte 7)",
    ),
    "member is a FIFO": (lambda s, t: ((s / "README.md").unlink(), os.mkfifo(s / "README.md"), [])[2],
                         {}, 2, "error: README.md is not a regular file"),
    "member is a folder": (lambda s, t: ((s / "LICENSE.txt").unlink(), (s / "LICENSE.txt").mkdir(), [])[2],
                           {}, 2, "error: LICENSE.txt is not a regular file"),
    "member too large": (
        lambda s, t: (_write(s / "README.md", b"x" * (2**20 + 1)), [])[1],
        {}, 2, "error: README.md is larger than 1048576 bytes",
    ),
    "manifest is a folder": (
        lambda s, t: ((s / "MANIFEST.json").unlink(), (s / "MANIFEST.json").mkdir(), [])[2],
        {}, 2, "error: MANIFEST.json is not a regular file",
    ),
    "check: manifest not JSON": (
        lambda s, t: (_write(s / "MANIFEST.json", b"{oops"), ["--check"])[1], {}, 1, STALE.format("MANIFEST.json"),
    ),
    "check: manifest a JSON list": (
        lambda s, t: (_write(s / "MANIFEST.json", b"[]"), ["--check"])[1], {}, 1, STALE.format("MANIFEST.json"),
    ),
    "check: manifest members not objects": (
        lambda s, t: (_write(s / "MANIFEST.json", b'{"members": [1]}'), ["--check"])[1], {}, 1,
        STALE.format("MANIFEST.json"),
    ),
    "check: manifest not UTF-8": (
        lambda s, t: (_write(s / "MANIFEST.json", b"\xff"), ["--check"])[1], {}, 1, STALE.format("MANIFEST.json"),
    ),
    "check: manifest lists an extra member": (
        lambda s, t: (_add_manifest_entry(s, {"path": "extra.txt"}), ["--check"])[1], {}, 1, STALE.format("extra.txt"),
    ),
    "check: manifest note changed": (
        lambda s, t: (_edit_manifest(s, note="other"), ["--check"])[1], {}, 1, STALE.format("MANIFEST.json"),
    ),
    "member is a symlink loop": (
        lambda s, t: ((s / "README.md").unlink(), (s / "README.md").symlink_to(s / "README.md"), [])[2],
        {}, 2, "error: README.md: cannot be read (Too many levels of symbolic links)",
    ),
    "check with output": (lambda s, t: ["--check", "--output", str(t / "k.zip")], {}, 2,
                          "error: --output does not apply to --check, which writes nothing"),
    "check: manifest is a folder": (
        lambda s, t: ((s / "MANIFEST.json").unlink(), (s / "MANIFEST.json").mkdir(), ["--check"])[2],
        {}, 2, "error: MANIFEST.json is not a regular file",
    ),
    "check: two members changed": (
        lambda s, t: (make_stale(s), _write(s / "LICENSE.txt", b"MIT\n"), ["--check"])[2],
        {}, 1, STALE.format("LICENSE.txt, README.md"),
    ),
    "unknown option": (lambda s, t: ["--bogus"], {}, 2, "error: unrecognized arguments: --bogus"),
    "newline in a stray argument": (lambda s, t: ["a\nb"], {}, 2, "error: unrecognized arguments: a\\nb"),
    "option without value": (lambda s, t: ["--output"], {}, 2, "error: argument --output: expected one argument"),
    "epoch in Arabic-Indic digits": (lambda s, t: [], {"SOURCE_DATE_EPOCH": "١٢٣"}, 2, EPOCH.format("'١٢٣'")),
    "epoch with spaces": (lambda s, t: [], {"SOURCE_DATE_EPOCH": " 12 "}, 2, EPOCH.format("' 12 '")),
    "epoch with underscores": (lambda s, t: [], {"SOURCE_DATE_EPOCH": "1_000"}, 2, EPOCH.format("'1_000'")),
    "epoch negative": (lambda s, t: [], {"SOURCE_DATE_EPOCH": "-1"}, 2, EPOCH.format("'-1'")),
    "epoch empty": (lambda s, t: [], {"SOURCE_DATE_EPOCH": ""}, 2, EPOCH.format("''")),
    "epoch with a newline": (lambda s, t: [], {"SOURCE_DATE_EPOCH": "1\n2"}, 2, EPOCH.format("'1\\n2'")),
}
# fmt: on


@pytest.mark.parametrize("case", sorted(CASES))
def test_hostile_input_is_one_line_and_changes_nothing(case, source, tmp_path, monkeypatch, capsys):
    prepare, environment, status, expected = CASES[case]
    argv = ["--source", str(source), *prepare(source, tmp_path)]
    capsys.readouterr()  # what preparing printed
    for key, value in environment.items():
        monkeypatch.setenv(key, value)
    before = tree_digest(tmp_path)
    assert build_zip.main(argv) == status
    captured = capsys.readouterr()
    output = argv[argv.index("--output") + 1] if "--output" in argv[:-1] else None
    assert captured.err == "build_zip.py: " + expected.format(s=source, t=tmp_path, o=output) + "\n"
    assert captured.out == ""
    assert tree_digest(tmp_path) == before


def test_the_default_archive_is_rebuilt_in_place(source, capsys):
    assert build_zip.main(["--source", str(source)]) == 0
    first = (source / "dist" / ARCHIVE).read_bytes()
    assert build_zip.main(["--source", str(source)]) == 0
    assert build_zip.main(["--source", str(source), "--output", str(source / "dist" / ARCHIVE)]) == 0
    assert (source / "dist" / ARCHIVE).read_bytes() == first
    assert sorted(path.name for path in (source / "dist").iterdir()) == [ARCHIVE]
    assert capsys.readouterr().out.splitlines() == [f"wrote {ARCHIVE}: 9 members under iteragpu-lab-v1/, dated "
                                                    "2026-09-24 00:00:00"] * 3  # fmt: skip


def test_a_build_that_fails_leaves_the_stale_manifest_and_no_dist_folder(source, tmp_path, capsys):
    make_stale(source)
    _write(source / "resultats-bruts.csv", b"run_id\nr1\n")
    before = tree_digest(tmp_path)
    assert build_zip.main(["--source", str(source)]) == 2
    assert tree_digest(tmp_path) == before and not (source / "dist").exists()
    assert "header only" in capsys.readouterr().err


def test_a_successful_build_rewrites_a_stale_manifest(source, tmp_path):
    make_stale(source)
    assert build_zip.stale_members(source) == ["README.md"]
    assert build_zip.main(["--source", str(source), "--output", str(tmp_path / "kit.zip")]) == 0
    assert build_zip.stale_members(source) == []
    with zipfile.ZipFile(tmp_path / "kit.zip") as archive:
        assert archive.read("iteragpu-lab-v1/MANIFEST.json") == (source / "MANIFEST.json").read_bytes()
    assert sorted(path.name for path in tmp_path.iterdir()) == ["kit.zip", "repo"]


def test_without_hard_links_the_archive_is_still_created_new(source, tmp_path, monkeypatch, capsys):
    """os.link stands in for a file system without hard links (EPERM): an exclusive create takes over."""

    def no_hard_links(*args, **kwargs):
        raise PermissionError(errno.EPERM, "Operation not permitted")

    monkeypatch.setattr(build_zip.os, "link", no_hard_links)
    assert build_zip.main(["--source", str(source), "--output", str(tmp_path / "kit.zip")]) == 0
    assert build_zip.main(["--source", str(source), "--output", str(tmp_path / "other.zip")]) == 0
    assert (tmp_path / "kit.zip").read_bytes() == (tmp_path / "other.zip").read_bytes()
    assert sorted(path.name for path in tmp_path.iterdir()) == ["kit.zip", "other.zip", "repo"]
    assert build_zip.main(["--source", str(source), "--output", str(tmp_path / "kit.zip")]) == 2
    assert "already exists" in capsys.readouterr().err


def test_a_manifest_that_cannot_be_renamed_takes_the_new_archive_back(source, tmp_path, monkeypatch, capsys):
    """os.replace stands in for a file system refusing the manifest's rename, after the archive's link."""
    make_stale(source)
    before = tree_digest(tmp_path)
    replace = os.replace

    def refusing(origin, target):
        if Path(target).name == "MANIFEST.json":
            raise PermissionError(errno.EACCES, "Permission denied")
        replace(origin, target)

    monkeypatch.setattr(build_zip.os, "replace", refusing)
    assert build_zip.main(["--source", str(source), "--output", str(tmp_path / "kit.zip")]) == 2
    expected = "build_zip.py: error: cannot replace MANIFEST.json (Permission denied); no archive written\n"
    assert capsys.readouterr().err == expected
    assert tree_digest(tmp_path) == before


def test_read_regular_takes_up_to_its_limit_and_no_more(tmp_path):
    (tmp_path / "four").write_bytes(b"1234")
    assert build_zip.read_regular(tmp_path / "four", "four", limit=4) == b"1234"
    with pytest.raises(build_zip.BuildError, match="^four is larger than 3 bytes$"):
        build_zip.read_regular(tmp_path / "four", "four", limit=3)
    with pytest.raises(FileNotFoundError):
        build_zip.read_regular(tmp_path / "absent", "absent")


def _interrupt(error):
    def raising(*args, **kwargs):
        raise error

    return raising


@pytest.mark.parametrize(
    ("where", "error", "status", "message"),
    [
        ("create_temporary", KeyboardInterrupt, 130, "interrupted by SIGINT: nothing written"),
        ("create_temporary", "SIGTERM", 143, "interrupted by SIGTERM: nothing written"),
        ("archive_bytes", KeyboardInterrupt, 130, "interrupted by SIGINT: nothing written"),
        ("read_members", "SIGTERM", 143, "interrupted by SIGTERM: nothing written"),
    ],
)
def test_an_interruption_before_the_renames_changes_nothing(source, tmp_path, monkeypatch, capsys, where, error,
                                                             status, message):  # fmt: skip
    make_stale(source)
    before = tree_digest(tmp_path)
    error = build_zip.Interrupted(signal.SIGTERM) if error == "SIGTERM" else error()  # made here, not at collection
    monkeypatch.setattr(build_zip, where, _interrupt(error))
    assert build_zip.main(["--source", str(source)]) == status
    captured = capsys.readouterr()
    assert captured.err == f"build_zip.py: {message}\n" and captured.out == ""
    assert tree_digest(tmp_path) == before


def test_an_interruption_after_the_renames_says_the_files_are_whole(source, tmp_path, monkeypatch, capsys):
    make_stale(source)
    write_release = build_zip.write_release

    def then_interrupted(*args):
        write_release(*args)
        raise KeyboardInterrupt

    monkeypatch.setattr(build_zip, "write_release", then_interrupted)
    assert build_zip.main(["--source", str(source), "--output", str(tmp_path / "kit.zip")]) == 130
    expected = "build_zip.py: interrupted by SIGINT: the archive and MANIFEST.json were written whole\n"
    assert capsys.readouterr().err == expected
    assert build_zip.stale_members(source) == [] and zipfile.is_zipfile(tmp_path / "kit.zip")


@pytest.mark.parametrize("handler", [signal.SIG_DFL, signal.SIG_IGN], ids=["default", "ignored"])
def test_main_leaves_the_sigterm_handler_as_it_found_it(source, capsys, handler):
    """An ignored SIGTERM (nohup, a parent's choice) stays ignored; a replaced one is restored."""
    seen = []
    check_members = build_zip.check_members

    def recording(contents):
        seen.append(signal.getsignal(signal.SIGTERM))
        return check_members(contents)

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        build_zip.check_members = recording
        assert build_zip.main(["--source", str(source), "--check"]) == 0
        assert signal.getsignal(signal.SIGTERM) is handler
    finally:
        build_zip.check_members = check_members
        signal.signal(signal.SIGTERM, previous)
    assert seen == [signal.SIG_IGN if handler is signal.SIG_IGN else build_zip._raise_interrupted]
    assert capsys.readouterr() == ("", "")


def test_a_failure_after_creating_dist_removes_it_again(source, tmp_path, capsys):
    make_stale(source)
    _write(source / "MANIFEST.json.partial", b"someone's")
    before = tree_digest(tmp_path)
    assert build_zip.main(["--source", str(source)]) == 2
    assert "MANIFEST.json.partial' already exists" in capsys.readouterr().err
    assert tree_digest(tmp_path) == before and not (source / "dist").exists()


def test_one_line_escapes_control_characters_only():
    assert build_zip.one_line("a\\b\nc\x1bé") == "a\\b\\nc\\x1bé"


@pytest.mark.parametrize(
    ("stdout", "expected_err"),
    [
        (UnwritableStdout(OSError(errno.ENOSPC, "No space left on device")),
         "build_zip.py: error: cannot write to stdout (No space left on device): done\n"),
        (UnwritableStdout(BrokenPipeError(errno.EPIPE, "Broken pipe")), ""),
        (None, "build_zip.py: error: stdout is closed: done\n"),
    ],
    ids=["full", "broken pipe", "closed"],
)  # fmt: skip
def test_an_unwritable_stdout_is_exit_1_and_at_most_one_line(monkeypatch, capsys, stdout, expected_err):
    monkeypatch.setattr(sys, "stdout", stdout)
    assert build_zip._report("done") == 1
    assert capsys.readouterr().err == expected_err


def test_help_names_the_program_and_every_option(capsys):
    with pytest.raises(SystemExit) as exit_:
        build_zip.main(["--help"])
    assert exit_.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: build_zip.py [-h] [--output OUTPUT] [--check] [--source SOURCE]\n")
    assert "Build the release: MANIFEST.json, then a byte-reproducible" in out and "Usage::" not in out
    options = [action for action in build_zip.build_parser()._actions if action.option_strings != ["-h", "--help"]]
    assert [action.dest for action in options] == ["output", "check", "source"]
    assert {action.dest: action.help for action in options} == {
        "output": "a new archive file to write (default: dist/iteragpu-lab-v1.zip)",
        "check": "only check that MANIFEST.json matches the files",
        "source": "the folder holding the members (default: here)",
    }
    assert build_zip.build_parser().parse_args([]).source == ROOT


def test_source_date_epoch_accepts_ascii_digits_and_clamps_huge_values():
    assert build_zip.member_timestamp(None) == (2026, 9, 24, 0, 0, 0)
    assert build_zip.member_timestamp("1700000000") == (2023, 11, 14, 22, 13, 20)
    assert build_zip.member_timestamp("0") == (1980, 1, 1, 0, 0, 0)
    assert build_zip.member_timestamp("9" * 5000) == (2107, 12, 31, 23, 59, 58)
    assert build_zip.member_timestamp("4354819199") == (2107, 12, 31, 23, 59, 58)
    assert build_zip.member_timestamp("315532801") == (1980, 1, 1, 0, 0, 1)
    # Leading zeros are not a far future: zero-padded seconds are the same seconds.
    assert build_zip.member_timestamp("0000000000001") == (1980, 1, 1, 0, 0, 0)
    assert build_zip.member_timestamp("0" * 5000 + "1700000000") == (2023, 11, 14, 22, 13, 20)
    assert build_zip.member_timestamp("0" * 5000) == (1980, 1, 1, 0, 0, 0)


# Subprocesses: a signal, and a stdout that cannot be written, need a real process.
PAUSE_AFTER_FIRST_TEMPORARY = """\
import sys, time
sys.path.insert(0, {tools!r})
import build_zip
create_temporary = build_zip.create_temporary
def pausing(*args):
    temporary = create_temporary(*args)
    print("partial written", flush=True)
    time.sleep(60)
    return temporary
build_zip.create_temporary = pausing
raise SystemExit(build_zip.main(sys.argv[1:]))
"""


@pytest.mark.whole_kit
@pytest.mark.parametrize("signal_number", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_a_signal_during_the_build_leaves_every_file_as_it_was(source, tmp_path, signal_number):
    make_stale(source)
    before = tree_digest(tmp_path)
    code = PAUSE_AFTER_FIRST_TEMPORARY.format(tools=str(ROOT / "tools"))
    process = subprocess.Popen([sys.executable, "-c", code, "--source", str(source), "--output",
                                str(tmp_path / "kit.zip")], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True, preexec_fn=sigint_as_from_a_terminal)  # fmt: skip
    try:
        assert process.stdout.readline() == "partial written\n"
        assert (tmp_path / "kit.zip.partial").exists()
        process.send_signal(signal_number)
        out, err = process.communicate(timeout=20)  # the pause is 60 s: only acting at once ends it in time
    finally:
        process.kill()
        process.wait()
    assert process.returncode == 128 + signal_number
    assert err == f"build_zip.py: interrupted by {signal.Signals(signal_number).name}: nothing written\n"
    assert tree_digest(tmp_path) == before


def _build_with_stdout(tmp_path, source, stdout, preexec_fn=None):
    return subprocess.run([sys.executable, str(ROOT / "tools" / "build_zip.py"), "--source", str(source),
                           "--output", str(tmp_path / "kit.zip")], stdout=stdout, stderr=subprocess.PIPE,
                          text=True, timeout=60, preexec_fn=preexec_fn)  # fmt: skip


@pytest.mark.whole_kit
@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="this system has no /dev/full")
def test_a_full_stdout_is_one_line_and_exit_1(source, tmp_path):
    with open("/dev/full", "w") as full:
        completed = _build_with_stdout(tmp_path, source, full)
    assert completed.returncode == 1
    assert completed.stderr.startswith("build_zip.py: error: cannot write to stdout (No space left on device)")
    assert len(completed.stderr.splitlines()) == 1
    assert zipfile.is_zipfile(tmp_path / "kit.zip")  # the build itself was complete


@pytest.mark.whole_kit
def test_a_closed_pipe_is_silent_and_exit_1(source, tmp_path):
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        completed = _build_with_stdout(tmp_path, source, write_end)
    finally:
        os.close(write_end)
    assert completed.returncode == 1 and completed.stderr == ""


@pytest.mark.whole_kit
def test_a_closed_stdout_is_one_line_and_exit_1(source, tmp_path):
    completed = _build_with_stdout(tmp_path, source, None, preexec_fn=lambda: os.close(1))
    assert completed.returncode == 1
    assert completed.stderr.startswith("build_zip.py: error: stdout is closed: wrote kit.zip")
    assert len(completed.stderr.splitlines()) == 1


# Single functions, in-process: the branches a whole build rarely reaches (a failing disk, a race).


def _os_error(strerror):
    """An OSError with this strerror, or with none at all (some errors carry only a type)."""
    return OSError(errno.EIO, strerror) if strerror else OSError()


@pytest.mark.parametrize(
    ("strerror", "shown_reason"), [("Input/output error", "Input/output error"), (None, "OSError")]
)
def test_read_regular_names_a_failing_open_or_read_in_one_line(tmp_path, monkeypatch, strerror, shown_reason):
    (tmp_path / "member").write_bytes(b"data")
    real_fdopen = os.fdopen

    class FailingRead(io.RawIOBase):
        def __init__(self, descriptor):
            self.stream = real_fdopen(descriptor, "rb")

        def read(self, size=-1):
            raise _os_error(strerror)

        def close(self):
            self.stream.close()

    monkeypatch.setattr(build_zip.os, "fdopen", lambda descriptor, mode: FailingRead(descriptor))
    with pytest.raises(build_zip.BuildError) as raised:
        build_zip.read_regular(tmp_path / "member", "member")
    assert str(raised.value) == f"member: cannot be read ({shown_reason})"
    monkeypatch.undo()

    def failing_open(*args):
        raise _os_error(strerror)

    monkeypatch.setattr(build_zip.os, "open", failing_open)
    with pytest.raises(build_zip.BuildError) as raised:
        build_zip.read_regular(tmp_path / "member", "member")
    assert str(raised.value) == f"member: cannot be read ({shown_reason})"


def test_read_regular_asks_for_one_byte_more_than_its_limit_and_no_more(tmp_path, monkeypatch):
    """The bound is on the read itself: a huge member is never read whole into memory."""
    (tmp_path / "member").write_bytes(b"x" * 10)
    sizes = []
    real_fdopen = os.fdopen

    def recording_fdopen(descriptor, mode):
        stream = real_fdopen(descriptor, mode)
        read = stream.read

        class Recording:
            def __enter__(self):
                return self

            def __exit__(self, *exc):
                stream.close()

            def read(self, size=-1):
                sizes.append(size)
                return read(size)

        return Recording()

    monkeypatch.setattr(build_zip.os, "fdopen", recording_fdopen)
    with pytest.raises(build_zip.BuildError, match="^member is larger than 4 bytes$"):
        build_zip.read_regular(tmp_path / "member", "member", limit=4)
    assert sizes == [5]


def test_read_regular_closes_what_it_refuses(tmp_path):
    (tmp_path / "folder").mkdir()
    before = sorted(os.listdir("/proc/self/fd")) if os.path.isdir("/proc/self/fd") else None
    with pytest.raises(build_zip.BuildError, match="^folder is not a regular file$"):
        build_zip.read_regular(tmp_path / "folder", "folder")
    if before is not None:
        assert sorted(os.listdir("/proc/self/fd")) == before


def test_check_members_finds_its_helpers_from_any_working_folder(source, monkeypatch):
    """build_notebook and calcul_forfaits are found through the tool's own folders, put first, once."""
    folders = [str(ROOT), str(ROOT / "tools")]
    monkeypatch.setattr(sys, "path", [entry for entry in sys.path if entry not in folders])
    for name in ("build_notebook", "calcul_forfaits"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    contents = build_zip.read_members(source)
    build_zip.check_members(contents)
    assert sys.path[:2] == folders
    length = len(sys.path)
    build_zip.check_members(contents)
    assert len(sys.path) == length and sys.path[:2] == folders


def test_every_notebook_cell_with_outputs_is_named(source, capsys):
    notebook = json.loads((source / "mesure-memoire.ipynb").read_text(encoding="utf-8"))
    notebook["cells"][2]["execution_count"] = 1
    notebook["cells"][4]["outputs"] = [{"output_type": "stream", "name": "stdout", "text": "x\n"}]
    (source / "mesure-memoire.ipynb").write_text(json.dumps(notebook), encoding="utf-8")
    assert build_zip.main(["--source", str(source), "--check"]) == 2
    expected = "mesure-memoire.ipynb has saved outputs or execution counts in: parameters, shared-code-1"
    assert capsys.readouterr().err == f"build_zip.py: error: {expected}\n"


def test_stale_members_judges_the_contents_it_is_given(source):
    contents = build_zip.read_members(source)
    assert build_zip.stale_members(source, contents) == []
    assert build_zip.stale_members(source, {**contents, "LICENSE.txt": b"other\n"}) == ["LICENSE.txt"]
    (source / "MANIFEST.json").unlink()
    assert build_zip.stale_members(source) == ["MANIFEST.json"]


def test_an_archive_of_the_size_limit_is_still_the_tools_own(source, tmp_path, monkeypatch):
    _own_archive_at(source, tmp_path / "own.zip")
    size = (tmp_path / "own.zip").stat().st_size
    monkeypatch.setattr(build_zip, "ARCHIVE_LIMIT_BYTES", size)
    assert build_zip.is_own_archive(tmp_path / "own.zip")
    monkeypatch.setattr(build_zip, "ARCHIVE_LIMIT_BYTES", size - 1)
    assert not build_zip.is_own_archive(tmp_path / "own.zip")


class _FailingWrite:
    """Stands in for a file whose write fails (a full disk)."""

    def __init__(self, error):
        self.error = error

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def write(self, data):
        raise self.error


@pytest.mark.parametrize(("strerror", "shown_reason"), [("No space left on device", "No space left on device"),
                                                        (None, "OSError")])  # fmt: skip
def test_create_temporary_names_a_failing_create_or_write(tmp_path, monkeypatch, strerror, shown_reason):
    final = tmp_path / "kit.zip"
    real_open = open

    def failing_write(path, mode):
        real_open(path, mode).close()  # the file exists, as after a real create
        return _FailingWrite(_os_error(strerror))

    monkeypatch.setattr(build_zip, "open", failing_write, raising=False)
    created = []
    with pytest.raises(build_zip.BuildError) as raised:
        build_zip.create_temporary(final, b"data", created)
    assert str(raised.value) == f"cannot write '{tmp_path}/kit.zip.partial' ({shown_reason})"
    assert created == [tmp_path / "kit.zip.partial"]

    def failing_create(path, mode):
        raise _os_error(strerror)

    monkeypatch.setattr(build_zip, "open", failing_create, raising=False)
    created = []
    with pytest.raises(build_zip.BuildError) as raised:
        build_zip.create_temporary(tmp_path / "other.zip", b"data", created)
    assert str(raised.value) == f"cannot write beside '{tmp_path}/other.zip' ({shown_reason})"
    assert created == []


def test_link_new_never_replaces_a_file_that_appeared_meanwhile(tmp_path, monkeypatch):
    (tmp_path / "kit.zip.partial").write_bytes(b"new")
    (tmp_path / "kit.zip").write_bytes(b"someone's")
    with pytest.raises(build_zip.BuildError) as raised:
        build_zip.link_new(tmp_path / "kit.zip.partial", tmp_path / "kit.zip")
    assert str(raised.value) == f"--output '{tmp_path}/kit.zip' already exists: this tool never writes over a file"
    assert (tmp_path / "kit.zip").read_bytes() == b"someone's"


def test_without_hard_links_a_failing_copy_leaves_no_archive(tmp_path, monkeypatch):
    (tmp_path / "kit.zip.partial").write_bytes(b"new")

    def no_hard_links(*args):
        raise PermissionError(errno.EPERM, "Operation not permitted")

    real_open = open

    def failing_copy(path, mode):
        if mode == "xb":
            real_open(path, mode).close()
            return _FailingWrite(OSError(errno.ENOSPC, "No space left on device"))
        return real_open(path, mode)

    monkeypatch.setattr(build_zip.os, "link", no_hard_links)
    monkeypatch.setattr(build_zip, "open", failing_copy, raising=False)
    with pytest.raises(OSError, match="No space left on device"):
        build_zip.link_new(tmp_path / "kit.zip.partial", tmp_path / "kit.zip")
    assert sorted(path.name for path in tmp_path.iterdir()) == ["kit.zip.partial"]


def test_signals_wait_while_the_files_are_renamed():
    blocked = signal.pthread_sigmask(signal.SIG_BLOCK, [])
    with build_zip.signals_held():
        assert signal.pthread_sigmask(signal.SIG_BLOCK, []) == blocked | {signal.SIGINT, signal.SIGTERM}
    assert signal.pthread_sigmask(signal.SIG_BLOCK, []) == blocked


def test_a_failure_leaves_an_existing_empty_output_folder_in_place(source, tmp_path, capsys):
    make_stale(source)
    _write(source / "MANIFEST.json.partial", b"someone's")
    (tmp_path / "empty").mkdir()
    assert build_zip.main(["--source", str(source), "--output", str(tmp_path / "empty" / "kit.zip")]) == 2
    assert capsys.readouterr().err == (f"build_zip.py: error: '{source}/MANIFEST.json.partial' already exists "
                                       "(an interrupted build?): remove it, then retry\n")  # fmt: skip
    assert (tmp_path / "empty").is_dir() and not any((tmp_path / "empty").iterdir())


def test_a_successful_build_keeps_the_folder_it_created(source, monkeypatch):
    removed = []
    monkeypatch.setattr(Path, "rmdir", lambda self: removed.append(self))
    assert build_zip.main(["--source", str(source)]) == 0
    assert removed == [] and (source / "dist" / ARCHIVE).is_file()


def test_a_folder_that_cannot_be_created_is_one_line(source, tmp_path, monkeypatch, capsys):
    def refusing(self, *args, **kwargs):
        raise PermissionError(errno.EACCES, "Permission denied")

    monkeypatch.setattr(Path, "mkdir", refusing)
    before = tree_digest(tmp_path)
    assert build_zip.main(["--source", str(source)]) == 2
    assert capsys.readouterr().err == f"build_zip.py: error: cannot create '{source}/dist' (Permission denied)\n"
    assert tree_digest(tmp_path) == before


def test_cleanup_failures_do_not_hide_the_outcome(source, tmp_path, monkeypatch, capsys):
    """A temporary file or a new folder that cannot be removed must not turn a result into a traceback."""

    def refusing(self, *args, **kwargs):
        raise PermissionError(errno.EACCES, "Permission denied")

    monkeypatch.setattr(Path, "unlink", refusing)
    assert build_zip.main(["--source", str(source), "--output", str(tmp_path / "kit.zip")]) == 0
    assert zipfile.is_zipfile(tmp_path / "kit.zip") and (tmp_path / "kit.zip.partial").exists()
    monkeypatch.setattr(Path, "rmdir", refusing)
    make_stale(source)
    _write(source / "MANIFEST.json.partial", b"someone's")
    assert build_zip.main(["--source", str(source)]) == 2
    assert capsys.readouterr().err.endswith("MANIFEST.json.partial' already exists (an interrupted build?): "
                                            "remove it, then retry\n")  # fmt: skip
    assert (source / "dist").is_dir()


def test_write_release_never_replaces_an_output_that_appeared_after_the_checks(source, tmp_path):
    contents = build_zip.read_members(source)
    manifest = build_zip.manifest_text(contents)
    (tmp_path / "kit.zip").write_bytes(b"someone's")
    with pytest.raises(build_zip.BuildError, match="already exists: this tool never writes over a file$"):
        build_zip.write_release(source, tmp_path / "kit.zip", False, manifest, b"archive", {})
    assert (tmp_path / "kit.zip").read_bytes() == b"someone's"
    assert sorted(path.name for path in tmp_path.iterdir()) == ["kit.zip", "repo"]


@pytest.mark.parametrize(("strerror", "shown_reason"), [("Permission denied", "Permission denied"), (None, "OSError")])
def test_a_manifest_that_cannot_be_renamed_after_replacing_the_archive_says_so(source, monkeypatch, capsys, strerror,
                                                                              shown_reason):  # fmt: skip
    assert build_zip.main(["--source", str(source)]) == 0
    make_stale(source)
    replace = os.replace

    def refusing(origin, target):
        if Path(target).name == "MANIFEST.json":
            raise PermissionError(errno.EACCES, strerror) if strerror else OSError()
        replace(origin, target)

    monkeypatch.setattr(build_zip.os, "replace", refusing)
    capsys.readouterr()
    assert build_zip.main(["--source", str(source)]) == 2
    expected = f"cannot replace MANIFEST.json ({shown_reason}); the archive was replaced"
    assert capsys.readouterr().err == f"build_zip.py: error: {expected}\n"
    assert build_zip.stale_members(source) == ["README.md"]
    assert sorted(path.name for path in (source / "dist").iterdir()) == [ARCHIVE]


@pytest.mark.parametrize(("strerror", "shown_reason"), [("Permission denied", "Permission denied"), (None, "OSError")])
def test_an_archive_that_cannot_be_renamed_is_one_line_and_changes_nothing(source, tmp_path, monkeypatch, capsys,
                                                                          strerror, shown_reason):  # fmt: skip
    assert build_zip.main(["--source", str(source)]) == 0
    make_stale(source)
    capsys.readouterr()
    before = tree_digest(tmp_path)

    def refusing(origin, target):
        raise PermissionError(errno.EACCES, strerror) if strerror else OSError()

    monkeypatch.setattr(build_zip.os, "replace", refusing)
    assert build_zip.main(["--source", str(source)]) == 2
    expected = f"cannot write '{source}/dist/{ARCHIVE}' ({shown_reason})"
    assert capsys.readouterr().err == f"build_zip.py: error: {expected}\n"
    assert tree_digest(tmp_path) == before


def test_interrupted_carries_its_signal():
    assert build_zip.Interrupted(signal.SIGTERM).args == (signal.SIGTERM,)
    with pytest.raises(build_zip.Interrupted) as raised:
        build_zip._raise_interrupted(signal.SIGTERM, None)
    assert raised.value.signal_number == signal.SIGTERM and raised.value.args == (signal.SIGTERM,)


class _Recording:
    """Stands in for stdout: records writes and flushes, in order."""

    def __init__(self):
        self.events = []

    def write(self, text):
        self.events.append(("write", text))

    def flush(self):
        self.events.append(("flush",))


def test_the_report_line_is_flushed_at_once(monkeypatch):
    recording = _Recording()
    monkeypatch.setattr(sys, "stdout", recording)
    assert build_zip._report("done") == 0
    assert recording.events[-1] == ("flush",) and "".join(e[1] for e in recording.events if e[0] == "write") == "done\n"


class _FullWithDescriptor(_Recording):
    """Stands in for a stdout on a full disk that has a real file descriptor."""

    def __init__(self, descriptor):
        super().__init__()
        self.descriptor = descriptor

    def write(self, text):
        raise OSError(errno.ENOSPC, "No space left on device")

    def fileno(self):
        if isinstance(self.descriptor, BaseException):
            raise self.descriptor
        return self.descriptor


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="needs /proc to see where a descriptor points")
def test_a_full_stdout_is_pointed_at_devnull_so_the_final_flush_cannot_fail(tmp_path, monkeypatch, capsys):
    with open(tmp_path / "out", "wb") as stream:
        monkeypatch.setattr(sys, "stdout", _FullWithDescriptor(stream.fileno()))
        assert build_zip._report("done") == 1
        assert os.readlink(f"/proc/self/fd/{stream.fileno()}") == os.devnull
    monkeypatch.setattr(sys, "stdout", _FullWithDescriptor(OSError(errno.EBADF, "Bad file descriptor")))
    assert build_zip._report("done") == 1
    expected = "build_zip.py: error: cannot write to stdout (No space left on device): done\n"
    assert capsys.readouterr().err == expected * 2


def test_check_reads_each_member_once(source, monkeypatch):
    """--check judges the very bytes it validated: the members are read once, not again for the manifest."""
    reads = []
    read_members = build_zip.read_members
    monkeypatch.setattr(build_zip, "read_members", lambda folder: reads.append(folder) or read_members(folder))
    assert build_zip.main(["--source", str(source), "--check"]) == 0
    assert reads == [source]
