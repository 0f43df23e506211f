"""The repository's own consistency, run by ``python -m pytest`` like every other check: lint,
formatting, the generated notebook, the manifest, and the line endings of the shipped files."""

import re
import shutil
import subprocess
import sys
import tokenize

import pytest

import build_notebook
import build_zip
from conftest import ROOT

pytestmark = pytest.mark.whole_kit  # the mutation pass deselects these (see pyproject.toml)


def _ruff(*args):
    # ruff is in requirements-dev.txt: a missing ruff fails here rather than being skipped.
    return subprocess.run([sys.executable, "-m", "ruff", *args], capture_output=True, text=True, cwd=ROOT, timeout=120)


def test_ruff_finds_no_lint_error():
    completed = _ruff("check", "--no-cache", ".")
    assert completed.returncode == 0, completed.stdout + completed.stderr


def test_ruff_format_would_change_nothing():
    completed = _ruff("format", "--no-cache", "--check", ".")
    assert completed.returncode == 0, completed.stdout + completed.stderr


def _formatter_opt_outs(path):
    with path.open("rb") as source:
        comments = [token.string for token in tokenize.tokenize(source.readline) if token.type == tokenize.COMMENT]
    return [comment for comment in comments if re.search(r"\bfmt: *(skip|off)\b", comment)]


def test_no_python_file_opts_out_of_ruff_format():
    """`ruff format --check` passes lines marked `# fmt: skip` or `# fmt: off`: the house style allows none."""
    files = [
        *ROOT.glob("*.py"),
        *(path for folder in ("tools", "tests", "benchmarks") for path in (ROOT / folder).rglob("*.py")),
    ]
    marked = [str(path.relative_to(ROOT)) for path in files if _formatter_opt_outs(path)]
    assert not marked, f"these files tell ruff format to leave lines as they are: {marked}"


def test_the_notebook_is_generated_from_the_current_script(capsys):
    assert build_notebook.main(["--check"]) == 0, capsys.readouterr().err


def test_the_manifest_matches_the_shipped_files(capsys):
    assert build_zip.main(["--check"]) == 0, capsys.readouterr().err


def test_git_checks_out_every_shipped_text_file_with_lf():
    """.gitattributes pins LF, so a clone with core.autocrlf=true (Windows' default) keeps the manifest true."""
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout: line endings are git's business only there")
    members = list(build_zip.MEMBERS)
    completed = subprocess.run(
        ["git", "check-attr", "text", "eol", "--", *members], capture_output=True, text=True, cwd=ROOT, timeout=60
    )
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


# calcul_forfaits.py runs alone, so it holds a copy of mesure_memoire.py's command-line contract: the
# block between these markers, with these names substituted (kit's name -> the calculator's), and nothing else.
CONTRACT_MARKERS = ("# >>> command-line contract\n", "# <<< command-line contract\n")
CONTRACT_RENAMED = {"KitError": "PricingError"}
# Helpers the block calls, defined outside it in both scripts: one_line is the same text in both;
# describe_error differs on purpose (the kit's keeps only allowed text; an error writing stdout names no file).
CONTRACT_HELPERS_ALIKE = ("one_line",)


def _contract_block(script):
    text = (ROOT / script).read_text(encoding="utf-8")
    begin, end = CONTRACT_MARKERS
    assert text.count(begin) == 1, f"{script}: each contract marker exactly once"
    assert text.count(end) == 1, f"{script}: each contract marker exactly once"
    return text[text.index(begin) : text.index(end)]


def _kit_contract_renamed():
    block = _contract_block("mesure_memoire.py")
    for kit_name, calculator_name in CONTRACT_RENAMED.items():
        assert kit_name in block, (kit_name, calculator_name)
        assert calculator_name not in block, (kit_name, calculator_name)
        block = block.replace(kit_name, calculator_name)
    return block


def _definition(script, name):
    import ast

    text = (ROOT / script).read_text(encoding="utf-8")
    (node,) = [node for node in ast.parse(text).body if getattr(node, "name", None) == name]
    return ast.get_source_segment(text, node)


def test_the_calculator_holds_the_kits_command_line_contract_unchanged():
    import difflib

    kit = _kit_contract_renamed().splitlines(keepends=True)
    calculator = _contract_block("calcul_forfaits.py").splitlines(keepends=True)
    difference = "".join(difflib.unified_diff(kit, calculator, "mesure_memoire.py, renamed", "calcul_forfaits.py"))
    assert not difference, difference
    for name in CONTRACT_HELPERS_ALIKE:
        assert _definition("mesure_memoire.py", name) == _definition("calcul_forfaits.py", name)


def test_contributing_s_map_names_every_tracked_file_or_its_folder():
    """Every file git tracks is named in CONTRIBUTING.md (in backquotes), or its own folder is."""
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout: the tracked files are git's list")
    completed = subprocess.run(["git", "ls-files"], capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert completed.returncode == 0, completed.stderr
    contributing = (ROOT / "CONTRIBUTING.md").read_text(encoding="utf-8")
    missing = []
    for path in completed.stdout.splitlines():
        folder = path.rpartition("/")[0]
        if f"`{path}`" not in contributing and f"`{folder}/`" not in contributing:
            missing.append(path)
    assert not missing, f"CONTRIBUTING.md's map names neither these files nor their folders: {missing}"


def test_contributing_s_gpu_run_is_for_any_gpu_box():
    """Any maintainer with a GPU box runs it into a folder they name: no lent machine, no device tool's output
    variable, no guide outside the repository."""
    contributing = (ROOT / "CONTRIBUTING.md").read_text(encoding="utf-8")
    section = contributing.split("## The GPU validation run", 1)[1].split("\n## ", 1)[0]
    assert "--output-dir OUT" in section and "a folder you name" in section
    for particular in ("DEVELOPERS.md", '"$OUT"', "lent", "device `run`"):
        assert particular not in section, particular
