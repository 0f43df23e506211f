"""tools/build_zip.py: a byte-reproducible nine-member archive, its manifest, its refusals."""

import hashlib
import json
import shlex
import shutil
import subprocess
import sys
import time
import zipfile
import zlib

import pytest

from conftest import ROOT, SHIPPED_ROOT, load_build_zip, run_script

build_zip = load_build_zip()

SHIPPED = sorted(
    ["README.md", "LICENSE.txt", "MANIFEST.json", "mesure_memoire.py", "mesure-memoire.ipynb", "calcul_forfaits.py",
     "tarifs-forfaits.csv", "protocole-qualite.md", "resultats-bruts.csv"]
)  # fmt: skip
README = (ROOT / "README.md").read_text(encoding="utf-8")


def readme_command(prefix):
    """The README's one-line command that starts with ``prefix``."""
    line = next(line for line in README.splitlines() if line.startswith(prefix))
    return line


@pytest.fixture
def source(tmp_path):
    """A copy of the shipped files, to build from or to corrupt."""
    folder = tmp_path / "source"
    folder.mkdir()
    for name in SHIPPED:
        shutil.copy(SHIPPED_ROOT / name, folder / name)
    return folder


def build(source, output):
    """Build in-process through main(argv), returning the exit status."""
    return build_zip.main(["--source", str(source), "--output", str(output)])


def test_two_builds_and_another_time_zone_give_identical_bytes(source, tmp_path, monkeypatch):
    first, second, elsewhere = tmp_path / "a.zip", tmp_path / "b.zip", tmp_path / "c.zip"
    monkeypatch.delenv("SOURCE_DATE_EPOCH", raising=False)
    assert build(source, first) == 0
    assert build(source, second) == 0
    monkeypatch.setenv("TZ", "Pacific/Kiritimati")  # UTC+14: a local date would be another day
    time.tzset()
    try:
        assert build(source, elsewhere) == 0
    finally:
        monkeypatch.undo()
        time.tzset()
    assert first.read_bytes() == second.read_bytes() == elsewhere.read_bytes()


def test_nine_members_under_one_folder_dated_and_0644(source, tmp_path):
    output = tmp_path / "kit.zip"
    assert build(source, output) == 0
    with zipfile.ZipFile(output) as archive:
        infos = archive.infolist()
        for info in infos:
            data = archive.read(info)
            assert data == (source / info.filename.split("/", 1)[1]).read_bytes()
            assert info.compress_type == zipfile.ZIP_DEFLATED
            deflate = zlib.compressobj(9, zlib.DEFLATED, -15)  # raw deflate at level 9, as the tool asks
            assert info.compress_size == len(deflate.compress(data) + deflate.flush())
    assert [info.filename for info in infos] == [f"iteragpu-lab-v1/{name}" for name in SHIPPED]
    for info in infos:
        assert not info.is_dir()
        assert info.date_time == (2026, 9, 24, 0, 0, 0)
        assert info.external_attr >> 16 == 0o100644 and info.create_system == 3


def test_source_date_epoch_is_used_and_clamped(source, tmp_path, monkeypatch):
    for epoch, expected in (
        ("1700000000", (2023, 11, 14, 22, 13, 20)),
        ("0", (1980, 1, 1, 0, 0, 0)),
        ("9999999999", (2107, 12, 31, 23, 59, 58)),
    ):
        output = tmp_path / f"{epoch}.zip"
        monkeypatch.setenv("SOURCE_DATE_EPOCH", epoch)
        assert build(source, output) == 0
        with zipfile.ZipFile(output) as archive:
            assert {info.date_time for info in archive.infolist()} == {expected}


def test_the_manifest_lists_every_member_and_itself_without_hash():
    manifest = json.loads((SHIPPED_ROOT / "MANIFEST.json").read_text(encoding="utf-8"))
    assert manifest["name"] == "iteragpu-lab-v1"
    assert [entry["path"] for entry in manifest["members"]] == SHIPPED
    for entry in manifest["members"]:
        if entry["path"] == "MANIFEST.json":
            assert entry["bytes"] is None and entry["sha256"] is None
        else:
            data = (SHIPPED_ROOT / entry["path"]).read_bytes()
            assert entry["bytes"] == len(data) and entry["sha256"] == hashlib.sha256(data).hexdigest()
    text = (SHIPPED_ROOT / "MANIFEST.json").read_text(encoding="utf-8")
    assert text.endswith("}\n") and text.startswith('{\n  "name": "iteragpu-lab-v1",\n')
    assert build_zip.manifest_text(build_zip.read_members(SHIPPED_ROOT)) == text


def extract(source, tmp_path):
    output = tmp_path / "kit.zip"
    assert build(source, output) == 0
    target = tmp_path / "new-folder"
    if shutil.which("unzip"):
        subprocess.run(["unzip", "-q", str(output), "-d", str(target)], check=True)
    else:
        with zipfile.ZipFile(output) as archive:
            archive.extractall(target)
    return target / "iteragpu-lab-v1"


def verify(folder):
    command = shlex.split(readme_command('python -c "import hashlib'))
    return subprocess.run([sys.executable, *command[1:]], capture_output=True, text=True, cwd=folder)


@pytest.mark.whole_kit
def test_an_extracted_archive_verifies_against_its_manifest(source, tmp_path):
    folder = extract(source, tmp_path)
    assert sorted(p.name for p in folder.iterdir()) == SHIPPED
    completed = verify(folder)
    assert completed.returncode == 0, completed.stderr
    assert completed.stdout == "OK: every member matches MANIFEST.json\n"
    if shutil.which("sha256sum"):
        alternative = subprocess.run(readme_command("python -c \"import json;[print"), shell=True, cwd=folder,
                                     capture_output=True, text=True)  # fmt: skip
        assert alternative.returncode == 0 and alternative.stdout.count(": OK") == 8


@pytest.mark.whole_kit
def test_the_extracted_kit_works_as_a_new_user_would_use_it(source, tmp_path):
    folder = extract(source, tmp_path)
    package = subprocess.run([sys.executable, "calcul_forfaits.py", "--gpu", "b200", "--days", "7", "--lots", "2"],
                             capture_output=True, text=True, cwd=folder)  # fmt: skip
    assert package.returncode == 0 and "364800 cents" in package.stdout
    arguments = ["estimate", "--parameters", "7000000000", "--bits", "16", "--reserve-gib", "4"]
    estimate = subprocess.run([sys.executable, "-S", "mesure_memoire.py", *arguments],
                              capture_output=True, text=True, cwd=folder)  # fmt: skip
    assert estimate.returncode == 0 and "17.04 GiB" in estimate.stdout


@pytest.mark.whole_kit
@pytest.mark.parametrize("member", [name for name in SHIPPED if name != "MANIFEST.json"])
def test_flipping_one_byte_of_any_member_fails_the_verification(source, tmp_path, member):
    folder = extract(source, tmp_path)
    data = bytearray((folder / member).read_bytes())
    data[len(data) // 2] ^= 0x01
    (folder / member).write_bytes(bytes(data))
    completed = verify(folder)
    assert completed.returncode == 1
    assert completed.stdout == f"FAILED: {member}\n"


@pytest.mark.whole_kit
def test_a_missing_member_fails_the_verification(source, tmp_path):
    folder = extract(source, tmp_path)
    (folder / "LICENSE.txt").unlink()
    assert verify(folder).stdout == "FAILED: LICENSE.txt\n"


def _corrupt_notebook(folder):
    notebook = json.loads((folder / "mesure-memoire.ipynb").read_text(encoding="utf-8"))
    notebook["cells"][2]["execution_count"] = 3
    (folder / "mesure-memoire.ipynb").write_text(json.dumps(notebook), encoding="utf-8")


ERROR = "build_zip.py: error: "
# kind: (corrupt(folder), the start of the one stderr line)
REFUSALS = {
    "missing member": (lambda f: (f / "protocole-qualite.md").unlink(), "missing member(s): protocole-qualite.md\n"),
    "missing members": (
        lambda f: ((f / "README.md").unlink(), (f / "LICENSE.txt").unlink()),
        "missing member(s): LICENSE.txt, README.md\n",
    ),
    "notebook outputs": (
        _corrupt_notebook,
        "mesure-memoire.ipynb has saved outputs or execution counts in: parameters\n",
    ),
    "filled template": (
        lambda f: (f / "resultats-bruts.csv").open("a").write("r1,2026-10-01\n"),
        "resultats-bruts.csv must hold its header only, found 2 lines\n",
    ),
    "empty template": (
        lambda f: (f / "resultats-bruts.csv").write_bytes(b""),
        "resultats-bruts.csv must hold its header only, found 0 lines\n",
    ),
    "bad catalog": (
        lambda f: (f / "tarifs-forfaits.csv").write_text("gpu\n"),
        "tarifs-forfaits.csv fails validation: tarifs-forfaits.csv: line 1: bad header",
    ),
}


@pytest.mark.parametrize("kind", sorted(REFUSALS))
def test_each_refusal_leaves_no_archive_and_the_manifest_unchanged(source, tmp_path, kind, capsys):
    corrupt, reason = REFUSALS[kind]
    corrupt(source)
    manifest_before = (source / "MANIFEST.json").read_bytes()
    output = tmp_path / "kit.zip"
    assert build(source, output) == 2
    captured = capsys.readouterr()
    assert len(captured.err.splitlines()) == 1 and captured.err.startswith(ERROR + reason) and captured.out == ""
    assert sorted(path.name for path in tmp_path.iterdir()) == ["source"]
    assert (source / "MANIFEST.json").read_bytes() == manifest_before


@pytest.mark.whole_kit
def test_check_passes_on_the_repository():
    assert run_script("tools/build_zip.py", "--check").returncode == 0


def test_check_passes_on_the_kit_and_catches_a_stale_manifest(source, capsys):
    assert build_zip.main(["--check", "--source", str(source)]) == 0
    assert capsys.readouterr() == ("", "")
    (source / "README.md").write_text(README + "\nOne more line.\n", encoding="utf-8")
    assert build_zip.main(["--check", "--source", str(source)]) == 1
    expected = "build_zip.py: MANIFEST.json is stale for README.md: run python tools/build_zip.py\n"
    assert capsys.readouterr() == ("", expected)
    assert build_zip.stale_members(source) == ["README.md"]
    (source / "LICENSE.txt").unlink()
    assert build_zip.main(["--check", "--source", str(source)]) == 2
    assert capsys.readouterr() == ("", "build_zip.py: error: missing member(s): LICENSE.txt\n")
