"""The repository's own consistency, run by ``python -m pytest`` like every other check: lint,
formatting, the generated notebook, the manifest, and the line endings of the shipped files."""

import importlib.util
import shutil
import subprocess
import sys

import pytest

from conftest import ROOT

pytestmark = pytest.mark.whole_kit  # the mutation pass deselects these (see pyproject.toml)


def _tool(name):
    spec = importlib.util.spec_from_file_location(name, ROOT / "tools" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


build_notebook = _tool("build_notebook")
build_zip = _tool("build_zip")


def _ruff(*args):
    # ruff is in requirements-dev.txt: a missing ruff fails here rather than being skipped.
    return subprocess.run([sys.executable, "-m", "ruff", *args], capture_output=True, text=True, cwd=ROOT,
                          timeout=120)  # fmt: skip


def test_ruff_finds_no_lint_error():
    completed = _ruff("check", "--no-cache", ".")
    assert completed.returncode == 0, completed.stdout + completed.stderr


def test_ruff_format_would_change_nothing():
    completed = _ruff("format", "--no-cache", "--check", ".")
    assert completed.returncode == 0, completed.stdout + completed.stderr


def test_the_notebook_is_generated_from_the_current_script(capsys):
    assert build_notebook.main(["--check"]) == 0, capsys.readouterr().err


def test_the_manifest_matches_the_shipped_files(capsys):
    assert build_zip.main(["--check"]) == 0, capsys.readouterr().err


def test_git_checks_out_every_shipped_text_file_with_lf():
    """.gitattributes pins LF, so a clone with core.autocrlf=true (Windows' default) keeps the manifest true."""
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout: line endings are git's business only there")
    members = list(build_zip.MEMBERS)
    completed = subprocess.run(["git", "check-attr", "text", "eol", "--", *members], capture_output=True, text=True,
                               cwd=ROOT, timeout=60)  # fmt: skip
    assert completed.returncode == 0, completed.stderr
    attributes = {}
    for line in completed.stdout.splitlines():
        path, attribute, value = line.split(": ")
        attributes[path, attribute] = value
    for name in members:
        assert attributes[name, "eol"] == "lf", name
        assert attributes[name, "text"] in {"set", "auto"}, name
    for name in members:
        assert b"\r" not in (ROOT / name).read_bytes(), name
