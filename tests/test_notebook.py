"""mesure-memoire.ipynb and tools/build_notebook.py: generated from the script (each block one collapsed cell,
verbatim), opening on its parameters and run cells, saved without outputs, run in a real kernel; the tool's
refusals (one line, nothing written).  In-process through main(argv); the kernel is a real ipykernel."""

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys

import nbformat
import pytest

import build_notebook
import mesure_memoire
from conftest import MESSAGES, NOTHING_MEASURED, ROOT, code_cells_as_script, tree_digest

REPORT_DATA = ROOT / "tests" / "data" / "report"
NOTEBOOK = ROOT / "mesure-memoire.ipynb"
SCRIPT = (ROOT / "mesure_memoire.py").read_text(encoding="utf-8")
STEP = re.compile(r"[0-9]+\. ")
PART = re.compile(r"[0-9]+\.(?P<part>[0-9]+) ")
RUNS = {"1": "run-estimate", "2": "run-environment", "3": "run-measure", "4": "run-results", "5": "run-figure"}


def committed():
    return json.loads(NOTEBOOK.read_text(encoding="utf-8"))


def code_sources(notebook):
    return ["".join(cell["source"]) for cell in notebook["cells"] if cell["cell_type"] == "code"]


def test_valid_nbformat_4_5_with_a_python_kernel_unique_ids_and_no_saved_output():
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    nbformat.validate(notebook)
    assert (notebook.nbformat, notebook.nbformat_minor) == (4, 5)
    assert notebook.metadata.kernelspec == {
        "display_name": "Python 3 (ipykernel)",
        "language": "python",
        "name": "python3",
    }
    assert notebook.metadata.language_info["name"] == "python"
    ids = [cell.id for cell in notebook.cells]
    assert len(ids) == len(set(ids))
    for cell in committed()["cells"]:
        if cell["cell_type"] == "code":
            assert cell["outputs"] == [], cell["id"]
            assert cell["execution_count"] is None, cell["id"]


def test_self_contained_no_companion_import_no_magic_no_exit():
    version_check, *sources = code_sources(committed())  # the one exit: below Python 3.10 (tested apart)
    assert "SystemExit(2)" in version_check
    for source in sources:
        assert not re.search(r"^\s*(import|from)\s+mesure_memoire\b", source, re.MULTILINE)
        assert not re.search(r"^\s*[%!]", source, re.MULTILINE)
        assert "sys.exit" not in source
        assert not re.search(r"raise\s+SystemExit", source)  # caught where PyTorch raises it, never raised
        for line in source.splitlines():
            module = re.match(r"\s*(?:import|from)\s+([a-z_]+)", line)
            if module:
                assert module.group(1) in {*sys.stdlib_module_names, "torch", "matplotlib"}, line


def step_blocks():
    """{step number: [(title, code)] of its blocks, its own then its parts N.2, N.3, ...}, in the script's order."""
    steps = {}
    for title, code in build_notebook.script_blocks(SCRIPT):
        if STEP.match(title) or PART.match(title):
            steps.setdefault(re.match("[0-9]+", title).group(), []).append((title, code))
    return steps


@pytest.mark.whole_kit
def test_each_block_is_one_collapsed_cell_verbatim_under_its_heading_before_its_step_s_run_cell():
    """The proof that the notebook's code is the script's: the cells, in order, are the blocks, exactly; each step is
    its heading and its collapsed code, each part under its own smaller heading, then the step's run cell; headings
    appear once, and code cells do not repeat them."""
    (version_title, version_check), *blocks = build_notebook.script_blocks(SCRIPT)
    shared = [code for title, code in blocks if not (STEP.match(title) or PART.match(title))]
    steps = step_blocks()
    assert version_title == "Python version"
    assert len(shared) >= 2
    assert sorted(steps) == sorted(RUNS)
    assert any(len(blocks) > 1 for blocks in steps.values())  # the parts are exercised
    shared_ids = [f"shared-code-{index}" for index in range(1, len(shared) + 1)]
    code = dict(zip(shared_ids, shared, strict=True))
    layout = [("markdown", "introduction"), ("code", "python-version"), ("markdown", "parameters-title")]
    layout += [("code", "parameters"), ("markdown", "shared-title"), *(("code", cell_id) for cell_id in shared_ids)]
    headings = ["# IteraGPU Lab v1: memory notebook", "## Parameters", "## Shared code, from `mesure_memoire.py`"]
    for number in RUNS:
        for index, (title, block) in enumerate(steps[number]):
            name = f"step-{number}-{PART.match(title)['part']}" if index else f"step-{number}"
            layout += [("markdown", f"{name}-title"), ("code", f"{name}-code")]
            code[f"{name}-code"] = block
            headings.append(f"### {title}" if index else f"## {title}")
        layout.append(("code", RUNS[number]))
    cells = committed()["cells"]
    sources = {cell["id"]: "".join(cell["source"]) for cell in cells}
    assert [(cell["cell_type"], cell["id"]) for cell in cells] == layout
    assert {cell_id: sources[cell_id] for cell_id in code} == code
    assert sources["python-version"] == version_check.replace("mesure_memoire.py", "mesure-memoire.ipynb")
    hidden = [cell["id"] for cell in cells if cell["metadata"].get("jupyter") == {"source_hidden": True}]
    assert hidden == list(code)
    markdown = [sources[cell["id"]] for cell in cells if cell["cell_type"] == "markdown"]
    assert [line for text in markdown for line in text.splitlines() if line.startswith("#")] == headings
    for source in code_sources(committed()):
        for title, _ in blocks:
            assert title not in source


def test_the_notebook_opens_on_at_most_80_lines_of_code_each_cell_within_200():
    """Only the parameters (the one cell papermill's tag marks) and the run cells are open; every definition is
    collapsed (source_hidden); each block holds one concern, small enough to read as one cell."""
    code = [cell for cell in committed()["cells"] if cell["cell_type"] == "code"]
    shown = [cell for cell in code if not cell["metadata"].get("jupyter", {}).get("source_hidden")]
    visible = {cell["id"]: len("".join(cell["source"]).splitlines()) for cell in shown}
    assert sorted(visible) == sorted(["python-version", "parameters", *RUNS.values()])
    assert sum(visible.values()) <= 80, visible
    for cell in code:
        assert len("".join(cell["source"]).splitlines()) <= 200, cell["id"]
    assert [cell["id"] for cell in committed()["cells"] if cell["metadata"].get("tags")] == ["parameters"]
    assert committed()["cells"][3]["metadata"] == {"tags": ["parameters"]}


# --- tools/build_notebook.py: rebuild only when needed, --check, refusals --------------------------------


@pytest.fixture
def copy(tmp_path, monkeypatch):
    """The script and the notebook in a folder of their own, the tool pointed at them."""
    for name in ("mesure_memoire.py", "mesure-memoire.ipynb"):
        shutil.copy(ROOT / name, tmp_path / name)
    monkeypatch.setattr(build_notebook, "SCRIPT", tmp_path / "mesure_memoire.py")
    monkeypatch.setattr(build_notebook, "NOTEBOOK", tmp_path / "mesure-memoire.ipynb")
    return tmp_path


@pytest.mark.whole_kit
def test_building_writes_only_when_the_notebook_changed_and_keeps_its_mode(copy, capsys):
    target = copy / "mesure-memoire.ipynb"
    target.unlink()
    assert build_notebook.main([]) == 0
    assert capsys.readouterr() == ("wrote mesure-memoire.ipynb\n", "")
    assert target.read_bytes() == NOTEBOOK.read_bytes()
    target.chmod(0o664)
    assert build_notebook.main([]) == 0
    assert capsys.readouterr() == ("mesure-memoire.ipynb is up to date\n", "")
    target.write_text("{}", encoding="utf-8")
    assert build_notebook.main([]) == 0
    assert target.read_bytes() == NOTEBOOK.read_bytes()
    assert oct(target.stat().st_mode & 0o777) == oct(0o664)
    assert sorted(path.name for path in copy.iterdir()) == ["mesure-memoire.ipynb", "mesure_memoire.py"]


@pytest.mark.whole_kit
def test_a_notebook_that_is_a_link_is_refused_and_its_target_kept(copy, capsys):
    (copy / "theirs.json").write_bytes(b"mine\n")
    (copy / "mesure-memoire.ipynb").unlink()
    (copy / "mesure-memoire.ipynb").symlink_to(copy / "theirs.json")
    before = tree_digest(copy)
    assert build_notebook.main([]) == 2
    assert capsys.readouterr() == (
        "",
        "build_notebook.py: error: mesure-memoire.ipynb is a link: this tool writes over nothing but its own outputs\n",
    )
    assert tree_digest(copy) == before


def _jupyter_saved(path):
    """What JupyterLab 4.6 does on opening and autosaving: it records the kernel's Python version."""
    notebook = json.loads(path.read_text(encoding="utf-8"))
    notebook["metadata"]["language_info"]["version"] = "3.12.3"
    path.write_text(json.dumps(notebook, indent=1, sort_keys=True, ensure_ascii=False) + "\n", encoding="utf-8")


OUT_OF_DATE = "build_notebook.py: mesure-memoire.ipynb is out of date with mesure_memoire.py: run python tools/{}"
# case: spoil(folder); --check says the notebook is out of date (exit 1), a build rewrites it
STALE = {
    "the script changed": lambda f: (f / "mesure_memoire.py").write_bytes(
        (f / "mesure_memoire.py").read_bytes().replace(b"\n# <<< notebook", b"\nEDITED = 1\n# <<< notebook", 1)
    ),
    "saved by JupyterLab": lambda f: _jupyter_saved(f / "mesure-memoire.ipynb"),
    "missing": lambda f: (f / "mesure-memoire.ipynb").unlink(),
}


@pytest.mark.whole_kit
@pytest.mark.parametrize("case", STALE)
def test_check_says_out_of_date_and_a_build_rewrites_it(case, copy, capsys):
    STALE[case](copy)
    before = tree_digest(copy)
    assert build_notebook.main(["--check"]) == 1
    assert capsys.readouterr() == ("", OUT_OF_DATE.format("build_notebook.py\n"))
    assert tree_digest(copy) == before
    assert build_notebook.main([]) == 0
    assert build_notebook.main(["--check"]) == 0
    assert (copy / "mesure-memoire.ipynb").read_bytes() == build_notebook.notebook_bytes(
        (copy / "mesure_memoire.py").read_bytes()
    )


def _script(change):
    def spoil(folder):
        path = folder / "mesure_memoire.py"
        path.write_bytes(change(path.read_bytes()) if callable(change) else change)

    return spoil


# case: (spoil(folder), the line after "build_notebook.py: error: "), read before a build or --check
REFUSALS = {
    "the script has no block": (_script(b"print('hello')\n"), "mesure_memoire.py has no '# >>> notebook' block"),
    "a step without run cell": (
        _script(lambda old: old.replace(b"# >>> notebook: 4. ", b"# >>> notebook: 7. ")),
        "mesure_memoire.py's numbered notebook blocks are steps 1, 2, 3, 5, 7; build_notebook.py has run cells for "
        "steps 1, 2, 3, 4, 5",
    ),
    "a part out of place": (
        _script(lambda old: old.replace(b"# >>> notebook: 3.3 ", b"# >>> notebook: 3.4 ")),
        "mesure_memoire.py's notebook block '3.4 The protocol: each phase on the GPU, counted and timed' is not the "
        "next part of the step above it (block N., then N.2, N.3, ...)",
    ),
}


@pytest.mark.whole_kit
@pytest.mark.parametrize("case", REFUSALS)
def test_a_refusal_is_one_line_and_changes_nothing(case, copy, capsys):
    spoil, expected = REFUSALS[case]
    spoil(copy)
    before = tree_digest(copy)
    assert build_notebook.main(["--check"]) == 2
    assert capsys.readouterr() == ("", f"build_notebook.py: error: {expected}\n")
    assert tree_digest(copy) == before


@pytest.mark.whole_kit
def test_a_notebook_that_cannot_be_written_is_one_line(copy, capsys, monkeypatch):
    """A stand-in for a file system that refuses the new notebook in place (read-only; root ignores the mode):
    the rename fails; the old notebook stays, no temporary file."""

    def refusing(source, target):
        raise PermissionError(13, "Permission denied")

    (copy / "mesure-memoire.ipynb").write_text("{}", encoding="utf-8")
    monkeypatch.setattr(os, "replace", refusing)
    assert build_notebook.main([]) == 2
    expected = "build_notebook.py: error: cannot write mesure-memoire.ipynb (Permission denied)\n"
    assert capsys.readouterr() == ("", expected)
    assert (copy / "mesure-memoire.ipynb").read_text(encoding="utf-8") == "{}"
    assert sorted(path.name for path in copy.iterdir()) == ["mesure-memoire.ipynb", "mesure_memoire.py"]


def notebook_namespace():
    """The parameters and the definitions, executed as Run All does before the run cells."""
    namespace, cells = {}, {}
    for cell in committed()["cells"]:
        if cell["cell_type"] == "code":
            cells[cell["id"]] = "".join(cell["source"])
            if cell["id"].startswith(("shared-code-", "step-")) or cell["id"] == "parameters":
                exec(compile(cells[cell["id"]], "<notebook>", "exec"), namespace)
    return namespace, cells


def test_the_results_cell_prints_report_for_the_file_it_wrote(tmp_path, monkeypatch, capsys):
    """Steps 3 and 4 as a plain script, with a stand-in for the GPU measurement (no GPU here):
    the stand-in "measure_to_file" writes a crafted result under OUTPUT."""
    monkeypatch.chdir(tmp_path)
    crafted = json.loads((REPORT_DATA / "bfloat16.json").read_text(encoding="utf-8"))
    namespace, cells = notebook_namespace()

    def stand_in_measure_to_file(config, output, tool, debug):
        assert (config["batch"], config["width"], tool, debug) == (1, 64, "mesure-memoire.ipynb", False)
        (tmp_path / output).write_text(json.dumps(crafted), encoding="utf-8")
        return {**crafted, "configuration": {**crafted["configuration"], "fresh_process_warning": "not fresh"}}

    namespace["measure_to_file"] = stand_in_measure_to_file
    exec(compile(cells["run-measure"], "<notebook>", "exec"), namespace)
    measured = capsys.readouterr().out
    table = mesure_memoire.format_phase_table(crafted)
    assert measured == f"Warning: not fresh\n{table}\nResult written to mesures-notebook.json\n"
    exec(compile(cells["run-results"], "<notebook>", "exec"), namespace)
    shown = capsys.readouterr().out
    assert shown == mesure_memoire.format_report(mesure_memoire.report(["mesures-notebook.json"])) + "\n"
    assert shown.splitlines()[1].startswith("mesures-notebook.json  Crafted GPU  bfloat16")
    (tmp_path / "mesures-notebook.json").write_text("[]", encoding="utf-8")
    exec(compile(cells["run-results"], "<notebook>", "exec"), namespace)
    assert capsys.readouterr().out.startswith("The result cannot be read back: report: mesures-notebook.json is")


def stdout_of(cell):
    return "".join(output.get("text", "") for output in cell.outputs if output.output_type == "stream")


def test_run_all_completes_without_error_and_without_a_gpu_measures_nothing_and_writes_nothing(executed_notebook):
    folder, cells, before = executed_notebook
    for cell in cells.values():
        if cell.cell_type == "code":
            assert all(output.output_type != "error" for output in cell.outputs), cell.id
            assert "Traceback" not in stdout_of(cell)
    assert "GPU usable            no" in stdout_of(cells["run-environment"])
    measured = stdout_of(cells["run-measure"])
    assert measured.startswith("Measurement refused: no usable GPU for cuda:0")
    assert measured.count(NOTHING_MEASURED) == 1, measured
    assert stdout_of(cells["run-results"]) == "Nothing to show: this kernel wrote no measurement.\n"
    assert stdout_of(cells["run-figure"]) == MESSAGES["figure: nothing to draw"]
    assert sorted(p.name for p in folder.iterdir()) == [NOTEBOOK.name]
    assert hashlib.sha256(NOTEBOOK.read_bytes()).hexdigest() == before  # the committed file is untouched


def test_the_estimate_cell_prints_what_the_command_line_prints(executed_notebook, capsys):
    _, cells, _ = executed_notebook
    assert mesure_memoire.main(["estimate", "--parameters", "7000000000", "--bits", "16", "--reserve-gib", "4"]) == 0
    printed = capsys.readouterr().out
    assert stdout_of(cells["run-estimate"]) == printed
    assert "13.04 GiB" in printed


REFUSED_PARAMETERS = [
    ("run-estimate", {"PARAMETERS": 0}, "Estimate refused: PARAMETERS: expected a positive whole number"),
    ("run-estimate", {"RESERVE_GIB": "-1"}, "Estimate refused: RESERVE_GIB: expected a number >= 0"),
    ("run-environment", {"DEVICE": "gpu0"}, "Environment refused: DEVICE: expected cuda:N"),
    ("run-measure", {"WIDTH": 0}, "Measurement refused: WIDTH: expected a positive whole number"),
    ("run-measure", {"REPEATS": 1001}, "Measurement refused: REPEATS: expected a whole number from 1 to 1000"),
    ("run-measure", {"DTYPE": "float64"}, "Measurement refused: DTYPE: expected one of float32"),
    ("run-measure", {"OUTPUT": ""}, "Measurement refused: OUTPUT: a new file name is required"),
    ("run-measure", {"MEMORY_GIB": 0}, "Measurement refused: MEMORY_GIB: expected a card's memory in GiB, more than 0"),
    ("run-measure", {"MEMORY_GIB": "80 GiB"}, "Measurement refused: MEMORY_GIB: expected a card's memory in GiB,"),
]


@pytest.mark.parametrize(
    ("cell", "parameters", "line"), REFUSED_PARAMETERS, ids=[case[2][:40] for case in REFUSED_PARAMETERS]
)
def test_a_refusal_in_the_notebook_names_the_parameter_the_user_set(cell, parameters, line, capsys):
    namespace, cells = notebook_namespace()
    namespace.update(parameters)
    exec(compile(cells[cell], "<notebook>", "exec"), namespace)
    out = capsys.readouterr().out
    assert out.startswith(line), out
    assert "--" not in out, out


@pytest.mark.parametrize(
    ("memory_gib", "verdict"), [("80", ": fits, needing"), (0.001, ": does NOT fit ("), ("", None), (None, None)]
)
def test_with_memory_gib_the_measure_cell_first_gives_the_plans_verdict_on_that_card(memory_gib, verdict, capsys):
    namespace, cells = notebook_namespace()
    namespace["MEMORY_GIB"] = memory_gib

    def stand_in_measure_to_file(config, output, tool, debug):  # no GPU here: the measurement itself is not the point
        raise namespace["KitError"]("stand-in: not measured")

    namespace["measure_to_file"] = stand_in_measure_to_file
    exec(compile(cells["run-measure"], "<notebook>", "exec"), namespace)
    out = capsys.readouterr().out
    if verdict is None:  # empty or None: no card named, no verdict
        assert out == "Measurement refused: stand-in: not measured\n"
        return
    config = mesure_memoire.measure_config("cuda:0", 1, 16, 64, "float32", 1, 2, 0)  # the parameters' defaults
    fit = mesure_memoire.format_fit(mesure_memoire.plan_with_fit(config, memory_gib))
    assert out == fit + "\nMeasurement refused: stand-in: not measured\n"
    assert fit.startswith("On a card of ")
    assert verdict in fit


def test_debug_is_a_parameter_off_by_default_that_the_environment_and_measure_cells_pass_on(capsys):
    namespace, cells = notebook_namespace()
    assert namespace["DEBUG"] is False
    namespace["DEBUG"] = True
    asked = []

    def stand_in(*args, debug, **keywords):  # no GPU here: which option the cell passes is the point
        asked.append(debug)
        raise namespace["KitError"]("stand-in: not run")

    namespace["collect_environment"] = namespace["measure_to_file"] = stand_in
    for cell in ("run-environment", "run-measure"):
        exec(compile(cells[cell], "<notebook>", "exec"), namespace)
    assert asked == [True, True]
    capsys.readouterr()


def test_as_notebook_message_renames_the_leading_option_only():
    assert mesure_memoire.as_notebook_message(mesure_memoire.KitError("--reserve-gib: expected x, not --y")) == (
        "RESERVE_GIB: expected x, not --y"
    )
    assert mesure_memoire.as_notebook_message("--dtype bfloat16: not supported") == "DTYPE bfloat16: not supported"
    assert mesure_memoire.as_notebook_message("no usable GPU for cuda:0") == "no usable GPU for cuda:0"
    assert mesure_memoire.as_notebook_message("--plan writes nothing") == "--plan writes nothing"


def test_every_parameter_is_annotated_with_its_type_for_papermill():
    """papermill --help-notebook reads a type from an annotation; without one it shows "Unknown type"."""
    import ast

    cell = next(cell for cell in committed()["cells"] if cell["id"] == "parameters")
    statements = ast.parse("".join(cell["source"])).body
    assert len(statements) == 14
    for statement in statements:
        assert isinstance(statement, ast.AnnAssign), ast.unparse(statement)
        value = ast.literal_eval(statement.value)
        assert statement.annotation.id == ("float" if statement.target.id == "RESERVE_GIB" else type(value).__name__)
    assert "(papermill's: --cwd)" in "".join(cell["source"])


def test_plain_python_runs_the_code_cells_twice_in_one_process_alike(tmp_path):
    """As on a GPU box without Jupyter: the code cells joined into one script, run twice in one namespace as a
    second Run All does.  PyTorch warns on its first import only (here: without NumPy); re-running the
    definitions must not forget it.  An output file that already exists is refused both times, untouched."""
    code = code_cells_as_script(committed())
    (tmp_path / "mesures-notebook.json").write_text("mine")
    twice = (
        "import contextlib, io, json, sys\nsys.modules['numpy'] = None\nruns = []\nfor _ in range(2):\n"
        "    out = io.StringIO()\n    with contextlib.redirect_stdout(out):\n        exec(CODE, namespace)\n"
        "    runs.append(out.getvalue())\n"
        "print(json.dumps(runs))\n"
    )
    # From a file: the code as one -c argument would pass Linux's limit on one argument (128 KiB).
    script = tmp_path.parent / f"{tmp_path.name}-twice.py"
    script.write_text(f"CODE = {code!r}\nnamespace = {{}}\n" + twice, encoding="utf-8")
    completed = subprocess.run(
        [sys.executable, str(script)],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=120,
    )
    assert completed.returncode == 0, completed.stderr
    first, second = json.loads(completed.stdout)
    assert first == second
    assert "PyTorch warned" in first
    assert "Measurement refused: OUTPUT: mesures-notebook.json already exists" in first
    assert (tmp_path / "mesures-notebook.json").read_text() == "mine"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mesures-notebook.json"]
