"""The standard-library paths under every CPython the README promises (3.10 to 3.13), with ``-S``
(no site-packages, so no PyTorch): each output must equal the one of the interpreter running the
tests, itself under ``-S``.  An interpreter that cannot be found is a visible skip, with the places
searched, never a silent pass.

Interpreters are found through pyenv (``pyenv root``, then ``~/.pyenv``) and the PATH's
``python3.X``; each candidate is run to confirm that it is CPython of that version.
"""

import functools
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import ROOT, run_script

VERSIONS = ("3.10", "3.11", "3.12", "3.13")
CURRENT = "{}.{}".format(*sys.version_info[:2])
SHIPPED = ("README.md", "LICENSE.txt", "MANIFEST.json", "mesure_memoire.py", "mesure-memoire.ipynb",
           "calcul_forfaits.py", "tarifs-forfaits.csv", "protocole-qualite.md", "resultats-bruts.csv")  # fmt: skip

pytestmark = pytest.mark.whole_kit  # the mutation pass deselects these (see pyproject.toml)


@functools.cache
def pyenv_roots():
    roots = []
    pyenv = shutil.which("pyenv")
    if pyenv is not None:
        completed = subprocess.run([pyenv, "root"], capture_output=True, text=True, timeout=30)
        if completed.returncode == 0 and completed.stdout.strip():
            roots.append(Path(completed.stdout.strip()))
    home = Path.home() / ".pyenv"
    if home not in roots:
        roots.append(home)
    return tuple(roots)


def candidates(version):
    """Possible interpreters for ``version``, newest patch release first."""
    found = []
    pattern = re.compile(re.escape(version) + r"\.(\d+)")
    for root in pyenv_roots():
        folders = [path for path in (root / "versions").glob(f"{version}.*") if pattern.fullmatch(path.name)]
        for folder in sorted(folders, key=lambda path: int(pattern.fullmatch(path.name)[1]), reverse=True):
            found.append(folder / "bin" / f"python{version}")
    on_path = shutil.which(f"python{version}")
    if on_path is not None:
        found.append(Path(on_path))
    return found


@functools.cache
def interpreter(version):
    """The first candidate that really is CPython ``version`` (a pyenv shim may name a missing one)."""
    probe = "import platform, sys; print(platform.python_implementation(), '%d.%d' % sys.version_info[:2])"
    for candidate in candidates(version):
        try:
            completed = subprocess.run([str(candidate), "-S", "-c", probe], capture_output=True, text=True, timeout=60)
        except OSError:
            continue
        if completed.returncode == 0 and completed.stdout.split() == ["CPython", version]:
            return str(candidate)
    return None


@pytest.fixture(params=VERSIONS)
def python(request):
    """(version, path) of a CPython of each promised version; a missing one skips, saying where it looked."""
    version = request.param
    path = interpreter(version)
    if path is None:
        places = ", ".join(str(root / "versions") for root in pyenv_roots())
        pytest.skip(f"CPython {version} not found (looked in {places} and for python{version} on PATH)")
    return version, path


def _same(completed, version):
    return completed.returncode, completed.stdout, completed.stderr


def _environment_text(completed, version):
    """The text diagnosis, its Python line checked then set aside (it must differ between versions)."""
    lines = completed.stdout.splitlines()
    python_lines = [line for line in lines if line.split()[:1] == ["Python"]]
    assert len(python_lines) == 1 and python_lines[0].split()[1].startswith(version + "."), completed.stdout
    torch_lines = [line for line in lines if line.split()[:1] == ["PyTorch"]]
    assert len(torch_lines) == 1 and "not importable" in torch_lines[0], completed.stdout
    others = [line for line in lines if line not in python_lines]
    return completed.returncode, others, completed.stderr


def _environment_json(completed, version):
    data = json.loads(completed.stdout)
    assert data["python"]["version"].startswith(version + "."), data["python"]
    assert data["torch"] is None and data["gpu_available"] is False, data
    del data["python"]["version"]
    return completed.returncode, data, completed.stderr


ESTIMATE = ["estimate", "--parameters", "7000000000", "--bits", "16", "--reserve-gib", "4"]
PLAN = ["measure", "--device", "cuda:0", "--batch", "2", "--context", "128", "--width", "1024", "--dtype", "bfloat16",
        "--warmup", "3", "--repeats", "5", "--plan"]  # fmt: skip
RESULTS = str(ROOT / "tests" / "data" / "results" / "resultats-exemple.csv")
REPORTED = [str(ROOT / "tests" / "data" / "report" / name) for name in ("schema1.json", "schema2.json")]
# name: (script, arguments, what must be equal)
CASES = {
    "estimate": ("mesure_memoire.py", ESTIMATE, _same),
    "estimate --json": ("mesure_memoire.py", [*ESTIMATE, "--json"], _same),
    "estimate refusal": ("mesure_memoire.py", ["estimate", "--parameters", "12x", "--bits", "16"], _same),
    "environment": ("mesure_memoire.py", ["environment", "--device", "cuda:0"], _environment_text),
    "environment --json": ("mesure_memoire.py", ["environment", "--device", "cuda:0", "--json"], _environment_json),
    "plan --json": ("mesure_memoire.py", [*PLAN, "--json"], _same),
    "plan": ("mesure_memoire.py", PLAN, _same),
    "report --json": ("mesure_memoire.py", ["report", *REPORTED, "--json"], _same),
    "results --json": ("calcul_forfaits.py", ["--results", RESULTS, "--json"], _same),
    "package": ("calcul_forfaits.py", ["--gpu", "b200", "--days", "7"], _same),
    "package --json": ("calcul_forfaits.py", ["--gpu", "b200", "--days", "7", "--json"], _same),
    "catalog list": ("calcul_forfaits.py", ["--list"], _same),
    "archive check": ("tools/build_zip.py", ["--check"], _same),
}


@functools.cache
def reference(case):
    script, arguments, _ = CASES[case]
    return run_script(script, *arguments, python_flags=("-S",))


@pytest.mark.parametrize("case", sorted(CASES))
def test_each_python_gives_the_same_output_as_this_one(python, case):
    version, path = python
    script, arguments, comparable = CASES[case]
    expected = reference(case)
    completed = run_script(script, *arguments, python=path, python_flags=("-S",))
    assert "Traceback" not in completed.stderr, completed.stderr
    assert comparable(completed, version) == comparable(expected, CURRENT)


def test_the_reference_outputs_are_real_results():
    """What the other interpreters are compared with is itself right, so equal outputs mean something."""
    assert reference("estimate").returncode == 0 and "17.04 GiB" in reference("estimate").stdout
    assert reference("estimate refusal").returncode == 2
    for case in ("plan --json", "report --json", "results --json"):
        assert reference(case).returncode == 0 and json.loads(reference(case).stdout), case
    assert reference("package").returncode == 0 and "182400 cents" in reference("package").stdout
    assert reference("catalog list").stdout.count("\n") > 45
    assert reference("archive check").returncode == 0 and reference("archive check").stderr == ""


def test_each_python_builds_the_same_archive_bytes(python, tmp_path):
    version, path = python
    source = tmp_path / "source"
    source.mkdir()
    for name in SHIPPED:
        shutil.copy(ROOT / name, source / name)
    built = {}
    for label, executable in (("here", sys.executable), (version, path)):
        output = tmp_path / f"{label}.zip"
        completed = run_script("tools/build_zip.py", "--source", source, "--output", output, python=executable,
                               python_flags=("-S",))  # fmt: skip
        assert completed.returncode == 0, completed.stderr
        built[label] = output.read_bytes()
    assert built["here"] == built[version]
