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
from nbclient import NotebookClient

import build_notebook
import mesure_memoire
from conftest import MESSAGES, ROOT, code_cells_as_script, on_a_full_disk, run_script, tree_digest

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


def test_valid_nbformat_4_5_with_a_python_kernel_and_unique_ids():
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


def test_no_saved_outputs_or_execution_counts():
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


def step_cell_ids(number, blocks):
    """The ids of a step's collapsed code cells: step-N-code, then step-N-P-code for each part P."""
    return [f"step-{number}-code"] + [f"step-{number}-{PART.match(title)['part']}-code" for title, _ in blocks[1:]]


@pytest.mark.whole_kit
def test_each_block_of_the_script_is_one_collapsed_cell_verbatim():
    """The proof that the notebook's code is the script's: the cells, in order, are the blocks, exactly."""
    (version_title, version_check), *blocks = build_notebook.script_blocks(SCRIPT)
    shared = [code for title, code in blocks if not (STEP.match(title) or PART.match(title))]
    steps = step_blocks()
    cells = {cell["id"]: cell for cell in committed()["cells"]}
    assert version_title == "Python version"
    assert "".join(cells["python-version"]["source"]) == version_check.replace(
        "mesure_memoire.py", "mesure-memoire.ipynb"
    )
    definitions = [cell for cell in committed()["cells"] if cell["metadata"].get("jupyter") == {"source_hidden": True}]
    step_ids = [cell_id for number in RUNS for cell_id in step_cell_ids(number, steps[number])]
    assert [cell["id"] for cell in definitions] == [f"shared-code-{index}" for index in range(1, len(shared) + 1)] + (
        step_ids
    )
    assert ["".join(cells[f"shared-code-{index}"]["source"]) for index in range(1, len(shared) + 1)] == shared
    for number in RUNS:
        codes = ["".join(cells[cell_id]["source"]) for cell_id in step_cell_ids(number, steps[number])]
        assert codes == [code for _, code in steps[number]]
    assert len(shared) >= 2
    assert sorted(steps) == sorted(RUNS)
    assert any(len(blocks) > 1 for blocks in steps.values())  # the parts are exercised


def test_every_code_cell_is_at_most_200_lines():
    """Each block holds one concern, small enough to read as one cell."""
    for cell in committed()["cells"]:
        if cell["cell_type"] == "code":
            assert len("".join(cell["source"]).splitlines()) <= 200, cell["id"]


@pytest.mark.whole_kit
def test_each_step_is_its_heading_then_its_collapsed_code_then_its_run_cell():
    """Each part of a step follows under its own smaller heading, before the step's run cell."""
    layout = [(cell["cell_type"], cell["id"]) for cell in committed()["cells"]]
    shared = [("code", cell_id) for kind, cell_id in layout if cell_id.startswith("shared-code-")]
    expected = [
        ("markdown", "introduction"),
        ("code", "python-version"),
        ("markdown", "parameters-title"),
        ("code", "parameters"),
        ("markdown", "shared-title"),
        *shared,
    ]
    steps = step_blocks()
    for number in RUNS:
        expected += [("markdown", f"step-{number}-title"), ("code", f"step-{number}-code")]
        for title, _ in steps[number][1:]:
            part = PART.match(title)["part"]
            expected += [("markdown", f"step-{number}-{part}-title"), ("code", f"step-{number}-{part}-code")]
        expected.append(("code", RUNS[number]))
    assert layout == expected
    headings = {cell["id"]: "".join(cell["source"]) for cell in committed()["cells"] if cell["cell_type"] == "markdown"}
    for number in RUNS:
        (title, _), *parts = steps[number]
        assert headings[f"step-{number}-title"].startswith(f"## {title}\n\n")
        for part_title, _ in parts:
            assert headings[f"step-{number}-{PART.match(part_title)['part']}-title"] == f"### {part_title}"


def test_the_notebook_opens_on_at_most_80_lines_of_code():
    """Only the parameters and the run cells are open; every definition is collapsed (source_hidden)."""
    code = [cell for cell in committed()["cells"] if cell["cell_type"] == "code"]
    shown = [cell for cell in code if not cell["metadata"].get("jupyter", {}).get("source_hidden")]
    visible = {cell["id"]: len("".join(cell["source"]).splitlines()) for cell in shown}
    assert sorted(visible) == sorted(["python-version", "parameters", *RUNS.values()])
    assert sum(visible.values()) <= 80, visible


@pytest.mark.whole_kit
def test_headings_appear_once_and_code_cells_do_not_repeat_them():
    titles = [title for title, _ in build_notebook.script_blocks(SCRIPT)]
    headings = [
        line
        for cell in committed()["cells"]
        if cell["cell_type"] == "markdown"
        for line in "".join(cell["source"]).splitlines()
        if line.startswith("#")
    ]
    assert headings == [
        "# IteraGPU Lab v1: memory notebook",
        "## Parameters",
        "## Shared code, from `mesure_memoire.py`",
    ] + [
        f"## {title}" if STEP.match(title) else f"### {title}"
        for title in titles
        if STEP.match(title) or PART.match(title)
    ]
    for source in code_sources(committed()):
        for title in titles:
            assert title not in source


def test_the_parameters_cell_alone_carries_the_papermill_tag():
    tagged = [cell["id"] for cell in committed()["cells"] if cell["metadata"].get("tags")]
    assert tagged == ["parameters"]
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


@pytest.mark.whole_kit
def test_a_notebook_hard_linked_to_another_file_is_replaced_and_that_file_kept(copy, capsys):
    target = copy / "mesure-memoire.ipynb"
    target.write_text("{}", encoding="utf-8")  # stale
    os.link(target, copy / "theirs.json")  # the same file under two names
    assert build_notebook.main([]) == 0
    assert capsys.readouterr() == ("wrote mesure-memoire.ipynb\n", "")
    assert (copy / "theirs.json").read_text(encoding="utf-8") == "{}"
    assert target.read_bytes() == NOTEBOOK.read_bytes()


@pytest.mark.whole_kit
def test_on_a_full_disk_the_notebook_stays_as_it_was(tmp_path):
    """A limit on the size of the tool's files (EFBIG past it, as on a full disk): one line, the old notebook whole."""
    (tmp_path / "tools").mkdir()
    shutil.copy(ROOT / "tools" / "build_notebook.py", tmp_path / "tools")
    shutil.copy(ROOT / "mesure_memoire.py", tmp_path)
    (tmp_path / "mesure-memoire.ipynb").write_text("{}", encoding="utf-8")  # stale
    completed = subprocess.run(
        [sys.executable, str(tmp_path / "tools" / "build_notebook.py")],
        capture_output=True,
        text=True,
        timeout=60,
        preexec_fn=on_a_full_disk(65536),
    )
    assert completed.returncode == 2, completed.stderr
    assert completed.stderr.startswith("build_notebook.py: error: cannot write mesure-memoire.ipynb (")
    assert completed.stderr.count("\n") == 1
    assert (tmp_path / "mesure-memoire.ipynb").read_text(encoding="utf-8") == "{}"
    assert sorted(os.listdir(tmp_path)) == ["mesure-memoire.ipynb", "mesure_memoire.py", "tools"]


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
    "nested 100,000 deep": lambda f: (f / "mesure-memoire.ipynb").write_bytes(b"[" * 100000),
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


def _folder_for(name):
    def spoil(folder):
        (folder / name).unlink()
        (folder / name).mkdir()

    return spoil


# case: (spoil(folder), the line after "build_notebook.py: error: "), the same for a build and for --check
REFUSALS = {
    "the script is not UTF-8": (_script(b"\xff\xfe"), "mesure_memoire.py is not UTF-8 text"),
    "the script has no block": (_script(b"print('hello')\n"), "mesure_memoire.py has no '# >>> notebook' block"),
    "a step without run cell": (
        _script(lambda old: old.replace(b"# >>> notebook: 4. ", b"# >>> notebook: 7. ")),
        "mesure_memoire.py's numbered notebook blocks are steps 1, 2, 3, 5, 7; build_notebook.py has run cells for "
        "steps 1, 2, 3, 4, 5",
    ),
    "a step without block": (
        _script(lambda old: old.replace(b"# >>> notebook: 2. ", b"# >>> notebook: ")),
        "mesure_memoire.py's numbered notebook blocks are steps 1, 3, 4, 5; build_notebook.py has run cells for "
        "steps 1, 2, 3, 4, 5",
    ),
    "a part out of place": (
        _script(lambda old: old.replace(b"# >>> notebook: 3.3 ", b"# >>> notebook: 3.4 ")),
        "mesure_memoire.py's notebook block '3.4 The protocol: each phase on the GPU, counted and timed' is not the "
        "next part of the step above it (block N., then N.2, N.3, ...)",
    ),
    "the script is missing": (
        lambda f: (f / "mesure_memoire.py").unlink(),
        "cannot read mesure_memoire.py (No such file or directory)",
    ),
    "the notebook is a folder": (
        _folder_for("mesure-memoire.ipynb"),
        "cannot read mesure-memoire.ipynb (Is a directory)",
    ),
}


@pytest.mark.whole_kit
@pytest.mark.parametrize("argv", [[], ["--check"]])
@pytest.mark.parametrize("case", REFUSALS)
def test_a_refusal_is_one_line_and_changes_nothing(case, argv, copy, capsys):
    spoil, expected = REFUSALS[case]
    spoil(copy)
    before = tree_digest(copy)
    assert build_notebook.main(argv) == 2
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


def test_the_notebook_functions_compute_what_the_script_computes():
    namespace = {}
    for cell in committed()["cells"]:
        if cell["id"].startswith(("shared-code-", "step-")) and cell["cell_type"] == "code":
            exec(compile("".join(cell["source"]), "<notebook>", "exec"), namespace)
    for parameters, bits, reserve in [(7000000000, 16, 4), (1, 1, 0), (123456789, 12, "0.5"), (10**15, 4, 80)]:
        assert namespace["estimate_weights"](parameters, bits, reserve) == mesure_memoire.estimate_weights(
            parameters, bits, reserve
        )
    for width, dtype in [(64, "float32"), (1024, "bfloat16"), (3, "float16")]:
        config = namespace["measure_config"]("cuda:0", 2, 128, width, dtype, 0, 1, 5)
        assert config == mesure_memoire.measure_config("cuda:0", 2, 128, width, dtype, 0, 1, 5)
        assert namespace["synthetic_model"](config) == mesure_memoire.synthetic_model(config)
    assert namespace["PHASES"] == mesure_memoire.PHASES
    files = [str(REPORT_DATA / "float32.json"), str(REPORT_DATA / "bfloat16.json")]
    assert namespace["report"](files) == mesure_memoire.report(files)
    assert namespace["format_report"](namespace["report"](files)) == mesure_memoire.format_report(
        mesure_memoire.report(files)
    )


def test_the_results_cell_prints_report_for_the_file_it_wrote(tmp_path, monkeypatch, capsys):
    """Steps 3 and 4 as a plain script, with a stand-in for the GPU measurement (no GPU here):
    the stand-in "measure_to_file" writes a crafted result under OUTPUT."""
    monkeypatch.chdir(tmp_path)
    crafted = json.loads((REPORT_DATA / "bfloat16.json").read_text(encoding="utf-8"))
    namespace = {}
    cells = {cell["id"]: "".join(cell["source"]) for cell in committed()["cells"] if cell["cell_type"] == "code"}
    for cell_id, source in cells.items():
        if cell_id.startswith(("shared-code-", "step-")) or cell_id == "parameters":
            exec(compile(source, "<notebook>", "exec"), namespace)

    def stand_in_measure_to_file(config, output, tool, debug):
        assert (config["batch"], config["width"], tool, debug) == (1, 64, "mesure-memoire.ipynb", False)
        (tmp_path / output).write_text(json.dumps(crafted), encoding="utf-8")
        return {**crafted, "torch_version_warning": "an unreadable version"}

    namespace["measure_to_file"] = stand_in_measure_to_file
    exec(compile(cells["run-measure"], "<notebook>", "exec"), namespace)
    measured = capsys.readouterr().out
    table = mesure_memoire.format_phase_table(crafted)
    assert measured == f"Warning: an unreadable version\n{table}\nResult written to mesures-notebook.json\n"
    exec(compile(cells["run-results"], "<notebook>", "exec"), namespace)
    shown = capsys.readouterr().out
    assert shown == mesure_memoire.format_report(mesure_memoire.report(["mesures-notebook.json"])) + "\n"
    assert shown.splitlines()[1].startswith("mesures-notebook.json  Crafted GPU  bfloat16")
    (tmp_path / "mesures-notebook.json").write_text("[]", encoding="utf-8")
    exec(compile(cells["run-results"], "<notebook>", "exec"), namespace)
    assert capsys.readouterr().out.startswith("The result cannot be read back: report: 'mesures-notebook.json' is")


def stdout_of(cell):
    return "".join(output.get("text", "") for output in cell.outputs if output.output_type == "stream")


@pytest.fixture(scope="module")
def executed(tmp_path_factory):
    """A copy of the notebook, run top to bottom in a real ipykernel (CPU PyTorch, no GPU)."""
    folder = tmp_path_factory.mktemp("kernel")
    before = hashlib.sha256(NOTEBOOK.read_bytes()).hexdigest()
    shutil.copy(NOTEBOOK, folder / NOTEBOOK.name)
    notebook = nbformat.read(folder / NOTEBOOK.name, as_version=4)
    NotebookClient(
        notebook, kernel_name="python3", timeout=120, resources={"metadata": {"path": str(folder)}}
    ).execute()
    by_id = {cell.id: cell for cell in notebook.cells}
    return folder, by_id, before


def test_run_all_completes_without_error_output(executed):
    _, cells, _ = executed
    for cell in cells.values():
        if cell.cell_type == "code":
            assert all(output.output_type != "error" for output in cell.outputs), cell.id
            assert "Traceback" not in stdout_of(cell)


def test_the_estimate_cell_prints_what_the_command_line_prints(executed):
    _, cells, _ = executed
    cli = run_script(
        "mesure_memoire.py", "estimate", "--parameters", "7000000000", "--bits", "16", "--reserve-gib", "4"
    )
    assert stdout_of(cells["run-estimate"]) == cli.stdout
    assert "13.04 GiB" in cli.stdout


def test_without_a_gpu_nothing_is_measured_and_nothing_written(executed):
    folder, cells, before = executed
    assert "GPU usable            no" in stdout_of(cells["run-environment"])
    measured = stdout_of(cells["run-measure"])
    assert measured.startswith("Measurement refused: no usable GPU for cuda:0")
    assert measured.count("nothing measured") == 1, measured
    assert measured.count("no file written") == 1, measured
    assert stdout_of(cells["run-results"]) == "Nothing to show: this kernel wrote no measurement.\n"
    assert stdout_of(cells["run-figure"]) == MESSAGES["figure: nothing to draw"]
    assert sorted(p.name for p in folder.iterdir()) == [NOTEBOOK.name]
    assert hashlib.sha256(NOTEBOOK.read_bytes()).hexdigest() == before  # the committed file is untouched


def notebook_namespace():
    """The parameters and the definitions, executed as Run All does before the run cells."""
    namespace, cells = {}, {}
    for cell in committed()["cells"]:
        if cell["cell_type"] == "code":
            cells[cell["id"]] = "".join(cell["source"])
            if cell["id"].startswith(("shared-code-", "step-")) or cell["id"] == "parameters":
                exec(compile(cells[cell["id"]], "<notebook>", "exec"), namespace)
    return namespace, cells


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
