"""The release, built by tools/build_zip.py: a byte-reproducible nine-member archive, its manifest, the
verification a user runs, and the build's refusals (one line, nothing written, nobody's file replaced).

Each build runs on a copy of the shipped files in tmp_path, in-process through main(argv); a new process
only where the interpreter matters (a standard output that cannot encode a name, the extracted kit)."""

import errno
import hashlib
import json
import os
import shlex
import shutil
import subprocess
import sys
import time
import zipfile
import zlib

import pytest

import build_zip
from conftest import MESSAGES, ROOT, SHIPPED_ROOT, plain_id, tree_digest

SHIPPED = sorted(
    [
        "README.md",
        "LICENSE.txt",
        "MANIFEST.json",
        "mesure_memoire.py",
        "mesure-memoire.ipynb",
        "calcul_forfaits.py",
        "tarifs-forfaits.csv",
        "protocole-qualite.md",
        "resultats-bruts.csv",
    ]
)
ARCHIVE = "iteragpu-lab-v1.zip"
WROTE = "9 members under iteragpu-lab-v1/, dated 2026-09-24 00:00:00"
README = (ROOT / "README.md").read_text(encoding="utf-8")


@pytest.fixture
def source(tmp_path):
    """A copy of the shipped files, to build from or to spoil."""
    folder = tmp_path / "repo"
    folder.mkdir()
    for name in SHIPPED:
        shutil.copy(SHIPPED_ROOT / name, folder / name)
    return folder


def build(source, *argv):
    return build_zip.main(["--source", str(source), *argv])


def make_stale(source):
    """A change the manifest does not know yet: a successful build rewrites MANIFEST.json."""
    with (source / "README.md").open("a", encoding="utf-8") as stream:
        stream.write("One more line.\n")


def test_builds_give_the_same_bytes_whatever_the_clock_the_time_zone_or_the_files_dates(source, tmp_path, monkeypatch):
    assert build(source, "--output", str(tmp_path / "a.zip")) == 0
    for member in source.iterdir():
        os.utime(member, (1, 1))  # file dates and modes are not the archive's
        member.chmod(0o600)
    monkeypatch.setenv("TZ", "Pacific/Kiritimati")  # UTC+14: a local date would be another day
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "1700000000")  # not read: the release date is fixed
    time.tzset()
    try:
        assert build(source, "--output", str(tmp_path / "b.zip")) == 0
    finally:
        monkeypatch.undo()
        time.tzset()
    assert (tmp_path / "a.zip").read_bytes() == (tmp_path / "b.zip").read_bytes()


def test_nine_sorted_members_under_one_folder_dated_0644_and_deflated(source, tmp_path):
    assert build(source, "--output", str(tmp_path / "kit.zip")) == 0
    with zipfile.ZipFile(tmp_path / "kit.zip") as archive:
        infos = archive.infolist()
        assert [info.filename for info in infos] == [f"iteragpu-lab-v1/{name}" for name in SHIPPED]
        for info in infos:
            data = archive.read(info)
            assert data == (source / info.filename.split("/", 1)[1]).read_bytes()
            assert info.compress_type == zipfile.ZIP_DEFLATED
            deflate = zlib.compressobj(9, zlib.DEFLATED, -15)  # raw deflate at level 9, as the tool asks
            assert info.compress_size == len(deflate.compress(data) + deflate.flush())
            assert info.date_time == (2026, 9, 24, 0, 0, 0)
            assert not info.is_dir()
            assert info.external_attr >> 16 == 0o100644
            assert info.create_system == 3


def test_the_manifest_lists_every_member_and_itself_without_hash():
    text = (SHIPPED_ROOT / "MANIFEST.json").read_text(encoding="utf-8")
    manifest = json.loads(text)
    assert (manifest["name"], manifest["folder"]) == ("iteragpu-lab-v1", "iteragpu-lab-v1/")
    assert [entry["path"] for entry in manifest["members"]] == SHIPPED
    for entry in manifest["members"]:
        if entry["path"] == "MANIFEST.json":
            assert entry == {"path": "MANIFEST.json", "bytes": None, "sha256": None}
        else:
            data = (SHIPPED_ROOT / entry["path"]).read_bytes()
            assert entry == {"path": entry["path"], "bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}


def test_the_default_archive_is_rebuilt_in_place_and_its_path_printed(source, capsys):
    assert build(source) == 0
    first = (source / "dist" / ARCHIVE).read_bytes()
    assert build(source) == 0
    assert build(source, "--output", str(source / "dist" / ARCHIVE)) == 0
    assert (source / "dist" / ARCHIVE).read_bytes() == first
    assert sorted(path.name for path in (source / "dist").iterdir()) == [ARCHIVE]
    assert capsys.readouterr() == (f"wrote dist/{ARCHIVE}: {WROTE}\n" * 3, "")


def test_a_build_rewrites_a_stale_manifest_and_says_so(source, tmp_path, capsys):
    make_stale(source)
    assert build(source, "--check") == 1
    assert build(source, "--output", str(tmp_path / "kit.zip")) == 0
    assert capsys.readouterr().out == f"wrote {tmp_path / 'kit.zip'}: {WROTE}; MANIFEST.json updated\n"
    assert build(source, "--check") == 0
    with zipfile.ZipFile(tmp_path / "kit.zip") as archive:
        assert archive.read("iteragpu-lab-v1/MANIFEST.json") == (source / "MANIFEST.json").read_bytes()
    assert sorted(path.name for path in tmp_path.iterdir()) == ["kit.zip", "repo"]


def test_an_output_inside_the_repository_is_printed_relative_to_it(source, monkeypatch, capsys):
    (source / "out").mkdir()
    monkeypatch.chdir(source / "out")
    assert build(source, "--output", "k.zip") == 0
    assert capsys.readouterr().out == f"wrote out/k.zip: {WROTE}\n"


@pytest.mark.parametrize("default", [False, True], ids=["--output", "default"])
def test_a_failing_write_is_one_line_and_leaves_no_half_archive(source, tmp_path, monkeypatch, capsys, default):
    """A stand-in for a full disk (the data's flush to the disk fails): nothing is left, the manifest is untouched,
    the archive already at the default place stays whole."""

    def full_disk(descriptor):
        raise OSError(errno.ENOSPC, "No space left on device")

    output = source / "dist" / ARCHIVE if default else tmp_path / "kit.zip"
    if default:
        assert build(source) == 0
    make_stale(source)
    capsys.readouterr()
    before = tree_digest(tmp_path)
    monkeypatch.setattr(os, "fsync", full_disk)
    assert build(source, *([] if default else ["--output", str(output)])) == 2
    assert capsys.readouterr() == ("", f"build_zip.py: error: cannot write {output} (No space left on device)\n")
    assert tree_digest(tmp_path) == before


# --- refusals: one line, exit 2, every file as it was ---------------------------------------------------


def _write(path, data):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)


def _replace(name, make):
    """Spoil a member by putting ``make(path)`` (a FIFO, a folder, a link...) in its place."""

    def spoil(source, tmp_path):
        (source / name).unlink()
        make(source / name)
        return []

    return spoil


def _link_to_theirs(path):
    """``path`` made a link to a file of someone else's, outside the source folder, stale as a manifest."""
    _write(path.parent.parent / "theirs.json", b"mine\n")
    path.symlink_to(path.parent.parent / "theirs.json")


def _member(name, data):
    """Spoil a member by writing ``data``, or ``data(old bytes)``, in its place."""

    def spoil(source, tmp_path):
        _write(source / name, data((source / name).read_bytes()) if callable(data) else data)
        return []

    return spoil


def _jupyter_saved(source, tmp_path):
    """The generated notebook as opening it in JupyterLab 4.6 and letting it autosave leaves it: the kernel's Python
    version recorded, saved as the generator saves (so that only that differs)."""
    notebook = json.loads((source / "mesure-memoire.ipynb").read_text(encoding="utf-8"))
    notebook["metadata"]["language_info"]["version"] = "3.12.3"
    text = json.dumps(notebook, indent=1, sort_keys=True, ensure_ascii=False) + "\n"
    (source / "mesure-memoire.ipynb").write_text(text, encoding="utf-8")
    return []


def _output(make=None, name="out.zip"):
    """--output naming tmp_path/name, after ``make(source, path)`` put something there."""

    def spoil(source, tmp_path):
        if make is not None:
            make(source, tmp_path / name)
        return ["--output", str(tmp_path / name)]

    return spoil


def _default_place(make):
    def spoil(source, tmp_path):
        make(source, tmp_path, source / "dist" / ARCHIVE)
        return []

    return spoil


def _link_to_own_archive(source, tmp_path, place):
    assert build(source, "--output", str(tmp_path / "own.zip")) == 0
    place.parent.mkdir()
    place.symlink_to(tmp_path / "own.zip")


NOT_GENERATED = (
    "mesure-memoire.ipynb is not what tools/build_notebook.py generates from mesure_memoire.py (saved "
    "from Jupyter, or edited?): run python tools/build_notebook.py"
)
EXISTS = "{} already exists: this tool writes over nothing but its own outputs"
NOT_OWN = "{s}/dist/iteragpu-lab-v1.zip exists and is not this tool's archive: move it away"
# case: (spoil(source, tmp_path) -> the arguments after --source, the line after "build_zip.py: error: ",
# where {s} is the source folder and {t} tmp_path; "..." ends a line whose rest is another program's wording)
REFUSALS = {
    "a missing member": (
        _replace("protocole-qualite.md", lambda path: None),
        "missing member(s): protocole-qualite.md",
    ),
    "the manifest links to someone's file": (
        _replace("MANIFEST.json", _link_to_theirs),
        "MANIFEST.json is a link: this tool writes over nothing but its own...",
    ),
    # The notebook: anything but the generated bytes, however it came.
    "the notebook saved by JupyterLab 4.6": (_jupyter_saved, NOT_GENERATED),
    "the template holds a row": (
        _member("resultats-bruts.csv", lambda old: old + b"r1,2026-10-01\n"),
        "resultats-bruts.csv must hold its header only, found 2 lines",
    ),
    "the catalog fails validation": (
        _member("tarifs-forfaits.csv", b"gpu\n"),
        "tarifs-forfaits.csv fails validation: tarifs-forfaits.csv: line 1: bad header...",
    ),
    # The output: nobody's file is replaced; the default archive only when it is this tool's.
    "--output names someone's file": (_output(lambda s, path: _write(path, b"mine\n")), EXISTS.format("{t}/out.zip")),
    "--output names a dangling link": (
        _output(lambda s, path: path.symlink_to(path.parent / "nowhere")),
        EXISTS.format("{t}/out.zip"),
    ),
    "--output in a missing folder": (
        _output(name="absent/k.zip"),
        "cannot write {t}/absent/k.zip (No such file or directory)",
    ),
    "--output with --check": (
        lambda s, t: ["--check", "--output", str(t / "k.zip")],
        "--output does not apply to --check, which writes nothing",
    ),
    "the default place holds someone's file": (
        _default_place(lambda s, t, place: _write(place, b"not a zip")),
        NOT_OWN,
    ),
    "the default place links to an archive": (_default_place(_link_to_own_archive), NOT_OWN),
    "dist is a file": (
        _default_place(lambda s, t, place: _write(place.parent, b"x")),
        "cannot create {s}/dist (File exists)",
    ),
    # --check refuses what must never ship as the build does (exit 2, not 1: a rebuild would not fix it).
    "--check on a notebook saved by JupyterLab 4.6": (
        lambda s, t: [*_jupyter_saved(s, t), "--check"],
        NOT_GENERATED,
    ),
}


@pytest.mark.parametrize("case", REFUSALS, ids=plain_id)
def test_a_refusal_is_one_line_and_changes_nothing(case, source, tmp_path, capsys):
    spoil, expected = REFUSALS[case]
    argv = spoil(source, tmp_path)
    capsys.readouterr()
    before = tree_digest(tmp_path)
    assert build(source, *argv) == 2
    captured = capsys.readouterr()
    line = "build_zip.py: error: " + expected.format(s=source, t=tmp_path).removesuffix("...")
    assert captured.out == "", captured
    assert len(captured.err.splitlines()) == 1, captured
    assert captured.err.startswith(line) if expected.endswith("...") else captured.err == line + "\n"
    assert tree_digest(tmp_path) == before


# --- --check: exit 1 names what is stale; a manifest it cannot read is stale as a whole ----------------


def _manifest(change):
    def spoil(source):
        manifest = json.loads((source / "MANIFEST.json").read_text(encoding="utf-8"))
        change(manifest)
        (source / "MANIFEST.json").write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")

    return spoil


STALE = {
    "up to date": (lambda s: None, None),
    "a member changed": (make_stale, "README.md"),
    "two members changed": (lambda s: (make_stale(s), _write(s / "LICENSE.txt", b"MIT\n")), "LICENSE.txt, README.md"),
    "missing": (lambda s: (s / "MANIFEST.json").unlink(), "MANIFEST.json"),
    "not JSON": (lambda s: _write(s / "MANIFEST.json", b"{oops"), "MANIFEST.json"),
    "an extra member": (_manifest(lambda m: m["members"].append({"path": "extra.txt"})), "extra.txt"),
    "the note changed": (_manifest(lambda m: m.update(note="other")), "MANIFEST.json"),
    "the same entries, other spacing": (
        lambda s: _write(s / "MANIFEST.json", json.dumps(json.loads((s / "MANIFEST.json").read_bytes())).encode()),
        "MANIFEST.json",
    ),
}


@pytest.mark.parametrize("case", STALE)
def test_check_names_what_is_stale_and_writes_nothing(case, source, tmp_path, capsys):
    spoil, stale = STALE[case]
    spoil(source)
    before = tree_digest(tmp_path)
    assert build(source, "--check") == (0 if stale is None else 1)
    line = "" if stale is None else f"build_zip.py: MANIFEST.json is stale for {stale}: run python tools/build_zip.py\n"
    assert capsys.readouterr() == ("", line)
    assert tree_digest(tmp_path) == before


# --- the archive as a user gets it: extracted, verified with the README's commands, run ----------------


def extract(source, tmp_path):
    assert build(source, "--output", str(tmp_path / "kit.zip")) == 0
    target = tmp_path / "new-folder"
    if shutil.which("unzip"):
        subprocess.run(["unzip", "-q", str(tmp_path / "kit.zip"), "-d", str(target)], check=True)
    else:
        with zipfile.ZipFile(tmp_path / "kit.zip") as archive:
            archive.extractall(target)
    return target / "iteragpu-lab-v1"


def readme_block(language):
    """The README's one block of that language (the verification's two forms)."""
    blocks = README.split(f"```{language}\n")
    assert len(blocks) == 2, f"one {language} block expected"
    return blocks[1].split("```", 1)[0]


POSIX_HEAD, POSIX_TAIL = "python - <<'EOF'\n", "EOF\n"
POWERSHELL_HEAD, POWERSHELL_TAIL = "@'\n", "'@ | python -\n"


def verification_code():
    """The Python both forms run: the POSIX shell's here-document, PowerShell's here-string, the same lines."""
    posix, powershell = readme_block("sh"), readme_block("powershell")
    assert posix.startswith(POSIX_HEAD) and posix.endswith(POSIX_TAIL)
    assert powershell.startswith(POWERSHELL_HEAD) and powershell.endswith(POWERSHELL_TAIL)
    code = posix[len(POSIX_HEAD) : -len(POSIX_TAIL)]
    assert powershell[len(POWERSHELL_HEAD) : -len(POWERSHELL_TAIL)] == code, "the two forms run the same lines"
    return code


def verify(folder):
    """The POSIX form as a shell runs it, with this interpreter for `python`; PowerShell's, where it exists."""
    posix = readme_block("sh").replace("python - <<", f"{shlex.quote(sys.executable)} - <<", 1)
    completed = subprocess.run(["sh", "-c", posix], capture_output=True, text=True, cwd=folder, timeout=60)
    same = subprocess.run([sys.executable, "-"], input=verification_code(), capture_output=True, text=True, cwd=folder)
    assert (same.returncode, same.stdout, same.stderr) == (completed.returncode, completed.stdout, completed.stderr)
    if shutil.which("pwsh"):
        script = readme_block("powershell").replace("| python -", f"| & '{sys.executable}' -")
        windows = subprocess.run(["pwsh", "-NoProfile", "-Command", script], capture_output=True, text=True, cwd=folder)
        assert (windows.returncode, windows.stdout) == (completed.returncode, completed.stdout)
    return completed


@pytest.mark.whole_kit
def test_an_extracted_archive_verifies_and_any_changed_or_missing_member_fails(source, tmp_path):
    folder = extract(source, tmp_path)
    assert sorted(path.name for path in folder.iterdir()) == SHIPPED
    completed = verify(folder)
    assert (completed.returncode, completed.stdout, completed.stderr) == (0, "OK\n", ""), completed
    for member in SHIPPED:
        if member != "MANIFEST.json":
            data = (folder / member).read_bytes()
            flipped = bytearray(data)
            flipped[len(data) // 2] ^= 0x01
            (folder / member).write_bytes(bytes(flipped))
            changed = verify(folder)
            assert (changed.returncode, changed.stdout) == (1, f"FAILED: {member}\n")
            (folder / member).write_bytes(data)
    (folder / "LICENSE.txt").unlink()
    assert verify(folder).stdout == "FAILED: LICENSE.txt\n"


# DEVELOPERS.md: the shipped README is a renter's read; CONTRIBUTING.md a maintainer's guide (issue 58).
WORD_BUDGETS = {"README.md": 2200, "CONTRIBUTING.md": 3000}


@pytest.mark.parametrize("guide", WORD_BUDGETS)
def test_each_guide_stays_within_its_word_budget(guide):
    words = len((ROOT / guide).read_text(encoding="utf-8").split())  # as `wc -w` counts: runs of non-blanks
    assert words <= WORD_BUDGETS[guide], f"{guide} has {words} words, over its budget of {WORD_BUDGETS[guide]}"


def test_the_readme_says_what_a_renter_types_and_reads_first():
    """Where only python3 exists, what to type; what the table's two times include; ROCm's shared device name
    proves nothing about an AMD installation (the seed's meaning, once said backwards)."""
    prose = " ".join(README.split())
    assert "Where only `python3` exists, type `python3` for `python`" in prose
    assert "`device ms`, two CUDA" in prose and "`ms` is the host's clock" in prose
    assert "which does not prove that a given AMD installation works" in prose
    assert "proves no AMD installation works" not in prose


def test_the_verification_is_short():
    code = verification_code()
    assert len(code.splitlines()) <= 8
    assert max(len(line) for line in code.splitlines()) <= 130


def readme_commands():
    """Every command of the README's console blocks, in order."""
    blocks = [block.split("```", 1)[0] for block in README.split("```console\n")[1:]]
    return [line for block in blocks for line in block.splitlines() if line and not line.startswith("#")]


GPU_OR_MEASURED = ("--device", " report ")  # need a GPU, or the files a measurement on one wrote
FILLED_BY_THE_RENTER = "--results"  # reads the renter's filled copy of the template, which no command writes


@pytest.mark.whole_kit
def test_every_readme_command_runs_in_the_extracted_folder(source, tmp_path):
    """In the README's order, from the extracted folder alone: those that need no GPU run; those that need one
    read only files the README's earlier commands write; --results reads a filled copy, never the blank template."""
    folder = extract(source, tmp_path)
    written = set(SHIPPED)
    for command in readme_commands():
        assert command.startswith("python "), command
        if FILLED_BY_THE_RENTER in command.split():
            filled = command.split()[command.split().index(FILLED_BY_THE_RENTER) + 1]
            assert filled not in SHIPPED, f"{command}: --results reads the renter's filled copy, not a shipped file"
            continue
        if any(mark in command for mark in GPU_OR_MEASURED):
            for name in command.split()[command.split().index("report") + 1 :] if " report " in command else []:
                assert name in written, f"{command}: {name} is written by no earlier command"
            for option in ("--output", "--output-dir"):
                if option in command.split():
                    written.add(command.split()[command.split().index(option) + 1])
            continue
        shell = command.replace("python ", f"{shlex.quote(sys.executable)} ", 1)
        completed = subprocess.run(["sh", "-c", shell], capture_output=True, text=True, cwd=folder, timeout=60)
        assert completed.returncode == 0, (command, completed.stderr)
        if ">" in command:
            written.add(command.rsplit("> ", 1)[1])
    assert written >= {"mesures-petit-essai.json", "sweep-width", "plan.json"}


def test_the_verification_in_a_folder_without_manifest_is_one_line(tmp_path):
    completed = verify(tmp_path)
    assert (completed.returncode, completed.stdout, completed.stderr) == (1, "", "FAILED: no MANIFEST.json here\n")


# --- a full disk, a hard link, the kit missing (issue 42) -------------------------------------------------------


def kit_copy(tmp_path):
    """A copy of the repository's shipped files and its tools, for a tool run in a process of its own."""
    kit = tmp_path / "kit"
    (kit / "tools").mkdir(parents=True)
    for name in SHIPPED:
        shutil.copy(SHIPPED_ROOT / name, kit / name)
    for name in ("build_zip.py", "build_notebook.py"):
        shutil.copy(ROOT / "tools" / name, kit / "tools" / name)
    return kit


def test_an_archive_and_a_manifest_hard_linked_to_other_files_leave_those_files_alone(source, tmp_path):
    assert build(source) == 0
    theirs_zip, theirs_manifest = tmp_path / "theirs.zip", tmp_path / "theirs.json"
    os.link(source / "dist" / ARCHIVE, theirs_zip)  # the same file under two names
    os.link(source / "MANIFEST.json", theirs_manifest)
    kept = theirs_zip.read_bytes(), theirs_manifest.read_bytes()
    make_stale(source)
    assert build(source) == 0
    assert (theirs_zip.read_bytes(), theirs_manifest.read_bytes()) == kept
    assert (source / "MANIFEST.json").read_bytes() != kept[1]
    assert (source / "dist" / ARCHIVE).read_bytes() != kept[0]
    assert sorted(os.listdir(source / "dist")) == [ARCHIVE]


@pytest.mark.whole_kit
@pytest.mark.parametrize("tool", ["build_zip.py", "build_notebook.py"])
def test_without_the_kit_a_tool_refuses_in_one_line(tmp_path, tool):
    kit = kit_copy(tmp_path)
    (kit / "mesure_memoire.py").unlink()
    before = tree_digest(kit)
    completed = subprocess.run(
        [sys.executable, str(kit / "tools" / tool)], capture_output=True, text=True, cwd=kit, timeout=60
    )
    assert (completed.returncode, completed.stdout) == (2, "")
    assert completed.stderr == MESSAGES["tool: the kit missing"].format(prog=tool)
    assert tree_digest(kit) == before
