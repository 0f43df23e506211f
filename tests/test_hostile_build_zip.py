"""tools/build_zip.py against hostile input: one line on stderr, the right exit status, no traceback,
every file as it was.  Each build runs in a copy of the shipped files in tmp_path: the real tree is
never touched.  In-process through main(argv); a subprocess only for signals and a broken stdout."""

import errno
import json
import os
import shutil
import signal
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from conftest import ROOT, SHIPPED_ROOT, load_build_zip, tree_digest

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
# name: (prepare(source, tmp_path) -> argv, environment, exit status, fragment of the stderr line)
CASES = {
    "output is a member": (lambda s, t: ["--output", str(s / "README.md")], {}, 2,
                           "--output '{s}/README.md' already exists: this tool never writes over a file"),
    "output is the manifest": (lambda s, t: ["--output", str(s / "MANIFEST.json")], {}, 2,
                               "--output '{s}/MANIFEST.json' already exists"),
    "output is an unrelated file": (
        lambda s, t: (_write(t / "notes.txt", b"mine\n"), ["--output", str(t / "notes.txt")])[1],
        {}, 2, "--output '{t}/notes.txt' already exists: this tool never writes over a file",
    ),
    "output is an older archive elsewhere": (
        lambda s, t: (_own_archive_at(s, t / "old.zip"), ["--output", str(t / "old.zip")])[1],
        {}, 2, "--output '{t}/old.zip' already exists",
    ),
    "output is a dangling link": (
        lambda s, t: ((t / "link.zip").symlink_to(t / "nowhere"), ["--output", str(t / "link.zip")])[1],
        {}, 2, "--output '{t}/link.zip' already exists",
    ),
    "default place is a link to an archive": (
        lambda s, t: (_own_archive_at(s, t / "own.zip"), (s / "dist").mkdir(),
                      (s / "dist" / ARCHIVE).symlink_to(t / "own.zip"), [])[3],
        {}, 2, "'{s}/dist/iteragpu-lab-v1.zip' exists and is not this tool's archive: move it away",
    ),
    "default place holds an unrelated file": (
        lambda s, t: (_write(s / "dist" / ARCHIVE, b"not a zip"), [])[1],
        {}, 2, "'{s}/dist/iteragpu-lab-v1.zip' exists and is not this tool's archive",
    ),
    "default place is a folder": (
        lambda s, t: ((s / "dist" / ARCHIVE).mkdir(parents=True), [])[1], {}, 2, "is a folder",
    ),
    "dist is a file": (lambda s, t: (_write(s / "dist", b"x"), [])[1], {}, 2,
                       "the folder of '{s}/dist/iteragpu-lab-v1.zip' is not a folder"),
    "a partial archive exists": (
        lambda s, t: (_write(t / "kit.zip.partial", b"someone's"), ["--output", str(t / "kit.zip")])[1],
        {}, 2, "'{t}/kit.zip.partial' already exists (an interrupted build?): remove it, then retry",
    ),
    "a partial manifest exists": (
        lambda s, t: (make_stale(s), _write(s / "MANIFEST.json.partial", b"x"), ["--output", str(t / "k.zip")])[2],
        {}, 2, "'{s}/MANIFEST.json.partial' already exists",
    ),
    "output names a folder": (lambda s, t: ["--output", str(t)], {}, 2,
                              "--output '{t}' is a folder: name the archive file"),
    "output folder missing": (lambda s, t: ["--output", str(t / "absent" / "k.zip")], {}, 2,
                              "--output: the folder of '{t}/absent/k.zip' does not exist"),
    "output folder read-only": (
        lambda s, t: (make_stale(s), ["--output", str(read_only_folder(t) / "kit.zip")])[1],
        {}, 2, ("cannot write beside '", "/kit.zip' (Permission denied)"),
    ),
    "newline in output": (lambda s, t: ["--output", str(t / "no\nfolder" / "k.zip")], {}, 2, "no\\nfolder"),
    "notebook not JSON": (
        lambda s, t: (_write(s / "mesure-memoire.ipynb", b"{not json"), [])[1], {}, 2,
        "mesure-memoire.ipynb is not a JSON notebook (Expecting property name",
    ),
    "notebook not UTF-8": (
        lambda s, t: (_write(s / "mesure-memoire.ipynb", b'{"cells": "\xff"}'), [])[1], {}, 2, "not a JSON notebook",
    ),
    "notebook a JSON list": (
        lambda s, t: (_write(s / "mesure-memoire.ipynb", b"[]"), [])[1], {}, 2,
        "mesure-memoire.ipynb is not a notebook: expected a JSON object with a list of cells",
    ),
    "notebook cells not a list": (
        lambda s, t: (_write(s / "mesure-memoire.ipynb", b'{"cells": "abc"}'), [])[1], {}, 2, "not a notebook",
    ),
    "template not UTF-8": (
        lambda s, t: (_write(s / "resultats-bruts.csv", b"run_id,\xe9\n"), [])[1],
        {}, 2, "resultats-bruts.csv is not UTF-8 (byte 7)",
    ),
    "member is a FIFO": (lambda s, t: ((s / "README.md").unlink(), os.mkfifo(s / "README.md"), [])[2],
                         {}, 2, "README.md is not a regular file"),
    "member is a folder": (lambda s, t: ((s / "LICENSE.txt").unlink(), (s / "LICENSE.txt").mkdir(), [])[2],
                           {}, 2, "LICENSE.txt is not a regular file"),
    "member too large": (
        lambda s, t: (_write(s / "README.md", b"x" * (2**20 + 1)), [])[1],
        {}, 2, "README.md is larger than 1048576 bytes",
    ),
    "manifest is a folder": (
        lambda s, t: ((s / "MANIFEST.json").unlink(), (s / "MANIFEST.json").mkdir(), [])[2],
        {}, 2, "MANIFEST.json is not a regular file",
    ),
    "check: manifest not JSON": (
        lambda s, t: (_write(s / "MANIFEST.json", b"{oops"), ["--check"])[1], {}, 1, "stale for MANIFEST.json",
    ),
    "check: manifest a JSON list": (
        lambda s, t: (_write(s / "MANIFEST.json", b"[]"), ["--check"])[1], {}, 1, "stale for MANIFEST.json",
    ),
    "check: manifest members not objects": (
        lambda s, t: (_write(s / "MANIFEST.json", b'{"members": [1]}'), ["--check"])[1], {}, 1, "stale for",
    ),
    "check: manifest not UTF-8": (
        lambda s, t: (_write(s / "MANIFEST.json", b"\xff"), ["--check"])[1], {}, 1, "stale for MANIFEST.json",
    ),
    "check: manifest lists an extra member": (
        lambda s, t: (_add_manifest_entry(s, {"path": "extra.txt"}), ["--check"])[1], {}, 1, "stale for extra.txt",
    ),
    "check: manifest note changed": (
        lambda s, t: (_edit_manifest(s, note="other"), ["--check"])[1], {}, 1, "stale for MANIFEST.json:",
    ),
    "member is a symlink loop": (
        lambda s, t: ((s / "README.md").unlink(), (s / "README.md").symlink_to(s / "README.md"), [])[2],
        {}, 2, "README.md: cannot be read (Too many levels of symbolic links)",
    ),
    "check with output": (lambda s, t: ["--check", "--output", str(t / "k.zip")], {}, 2,
                          "build_zip.py: error: --output does not apply to --check, which writes nothing"),
    "check: manifest is a folder": (
        lambda s, t: ((s / "MANIFEST.json").unlink(), (s / "MANIFEST.json").mkdir(), ["--check"])[2],
        {}, 2, "build_zip.py: error: MANIFEST.json is not a regular file",
    ),
    "check: two members changed": (
        lambda s, t: (make_stale(s), _write(s / "LICENSE.txt", b"MIT\n"), ["--check"])[2],
        {}, 1, "build_zip.py: MANIFEST.json is stale for LICENSE.txt, README.md: run python tools/build_zip.py",
    ),
    "unknown option": (lambda s, t: ["--bogus"], {}, 2, "unrecognized arguments: --bogus"),
    "newline in a stray argument": (lambda s, t: ["a\nb"], {}, 2, "a\\nb"),
    "option without value": (lambda s, t: ["--output"], {}, 2, "expected one argument"),
    "epoch in Arabic-Indic digits": (lambda s, t: [], {"SOURCE_DATE_EPOCH": "١٢٣"}, 2, "ASCII digits"),
    "epoch with spaces": (lambda s, t: [], {"SOURCE_DATE_EPOCH": " 12 "}, 2, "ASCII digits"),
    "epoch with underscores": (lambda s, t: [], {"SOURCE_DATE_EPOCH": "1_000"}, 2, "ASCII digits"),
    "epoch negative": (lambda s, t: [], {"SOURCE_DATE_EPOCH": "-1"}, 2, "ASCII digits"),
    "epoch empty": (lambda s, t: [], {"SOURCE_DATE_EPOCH": ""}, 2, "ASCII digits"),
    "epoch with a newline": (lambda s, t: [], {"SOURCE_DATE_EPOCH": "1\n2"}, 2, "'1\\n2'"),
}
# fmt: on


@pytest.mark.parametrize("case", sorted(CASES))
def test_hostile_input_is_one_line_and_changes_nothing(case, source, tmp_path, monkeypatch, capsys):
    prepare, environment, status, fragment = CASES[case]
    argv = ["--source", str(source), *prepare(source, tmp_path)]
    capsys.readouterr()  # what preparing printed
    for key, value in environment.items():
        monkeypatch.setenv(key, value)
    before = tree_digest(tmp_path)
    assert build_zip.main(argv) == status
    captured = capsys.readouterr()
    lines = captured.err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("build_zip.py: "), captured.err
    for part in (fragment,) if isinstance(fragment, str) else fragment:
        assert part.format(s=source, t=tmp_path) in lines[0]
    assert "Traceback" not in captured.err and captured.out == ""
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


class _Unwritable:
    """Stands in for a stdout whose writes fail (a full disk, a closed pipe); it has no file descriptor."""

    def __init__(self, error):
        self.error = error

    def write(self, text):
        raise self.error

    def flush(self):
        raise self.error

    def fileno(self):
        raise ValueError("no file descriptor")


@pytest.mark.parametrize(
    ("stdout", "expected_err"),
    [
        (_Unwritable(OSError(errno.ENOSPC, "No space left on device")),
         "build_zip.py: error: cannot write to stdout (No space left on device): done\n"),
        (_Unwritable(BrokenPipeError(errno.EPIPE, "Broken pipe")), ""),
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
    assert all(action.help for action in options)
    assert build_zip.build_parser().parse_args([]).source == ROOT


def test_source_date_epoch_accepts_ascii_digits_and_clamps_huge_values():
    assert build_zip.member_timestamp(None) == (2026, 9, 24, 0, 0, 0)
    assert build_zip.member_timestamp("1700000000") == (2023, 11, 14, 22, 13, 20)
    assert build_zip.member_timestamp("0") == (1980, 1, 1, 0, 0, 0)
    assert build_zip.member_timestamp("9" * 5000) == (2107, 12, 31, 23, 59, 58)


# Subprocesses: a signal, and a stdout that cannot be written, need a real process.
PAUSE_AFTER_FIRST_TEMPORARY = """\
import signal, sys, time
sys.path.insert(0, {tools!r})
import build_zip
signal.signal(signal.SIGINT, signal.default_int_handler)  # even when started with SIGINT ignored
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
                               text=True)  # fmt: skip
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
