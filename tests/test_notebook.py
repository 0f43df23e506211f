"""mesure-memoire.ipynb: generated from the script, saved without outputs, run in a real kernel."""

import hashlib
import importlib.util
import json
import re
import shutil
import subprocess
import sys

import nbformat
import pytest
from nbclient import NotebookClient

import mesure_memoire
from conftest import ROOT, run_script

REPORT_DATA = ROOT / "tests" / "data" / "report"

NOTEBOOK = ROOT / "mesure-memoire.ipynb"
spec = importlib.util.spec_from_file_location("build_notebook", ROOT / "tools" / "build_notebook.py")
build_notebook = importlib.util.module_from_spec(spec)
spec.loader.exec_module(build_notebook)


def committed():
    return json.loads(NOTEBOOK.read_text(encoding="utf-8"))


def code_sources(notebook):
    return ["".join(cell["source"]) for cell in notebook["cells"] if cell["cell_type"] == "code"]


def test_valid_nbformat_4_5_with_a_python_kernel_and_unique_ids():
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    nbformat.validate(notebook)
    assert (notebook.nbformat, notebook.nbformat_minor) == (4, 5)
    assert notebook.metadata.kernelspec == {"display_name": "Python 3 (ipykernel)", "language": "python",
                                            "name": "python3"}  # fmt: skip
    assert notebook.metadata.language_info["name"] == "python"
    ids = [cell.id for cell in notebook.cells]
    assert len(ids) == len(set(ids))


def test_no_saved_outputs_or_execution_counts():
    notebook = committed()
    assert build_notebook.saved_output_problems(notebook) == []
    for cell in notebook["cells"]:
        if cell["cell_type"] == "code":
            assert cell["outputs"] == [] and cell["execution_count"] is None


def test_saved_outputs_are_detected():
    notebook = committed()
    notebook["cells"][2]["execution_count"] = 1
    notebook["cells"][-1]["outputs"] = [{"output_type": "stream", "name": "stdout", "text": ["x"]}]
    assert build_notebook.saved_output_problems(notebook) == ["parameters", "run-results"]


def test_self_contained_no_companion_import_no_magic_no_exit():
    for source in code_sources(committed()):
        assert not re.search(r"^\s*(import|from)\s+mesure_memoire\b", source, re.MULTILINE)
        assert not re.search(r"^\s*[%!]", source, re.MULTILINE)
        assert "sys.exit" not in source and "SystemExit" not in source
        for line in source.splitlines():
            module = re.match(r"\s*(?:import|from)\s+([a-z_]+)", line)
            if module:
                assert module.group(1) in sys.stdlib_module_names or module.group(1) == "torch", line


@pytest.mark.whole_kit
def test_the_committed_notebook_is_generated_from_the_script(capsys):
    assert build_notebook.main(["--check"]) == 0, capsys.readouterr().err
    script = (ROOT / "mesure_memoire.py").read_text(encoding="utf-8")
    cells = committed()["cells"]
    steps = [(title, block) for title, block in build_notebook.script_blocks(script) if re.match(r"[0-9]+\. ", title)]
    assert len(steps) == 4
    for title, block in steps:
        prefix = f"step-{title.split('.')[0]}-code-"
        pieces = ["".join(cell["source"]) for cell in cells if cell["id"].startswith(prefix)]
        assert nonblank_lines("\n".join(pieces)) == nonblank_lines(block), title


def nonblank_lines(text):
    return [line for line in text.splitlines() if line.strip()]


@pytest.mark.whole_kit
def test_the_shared_cells_are_the_unnumbered_blocks_in_order():
    script = (ROOT / "mesure_memoire.py").read_text(encoding="utf-8")
    shared = [block for title, block in build_notebook.script_blocks(script) if not re.match(r"[0-9]+\. ", title)]
    cells = [("".join(cell["source"])) for cell in committed()["cells"] if cell["id"].startswith("shared-code-")]
    assert nonblank_lines("\n".join(cells)) == nonblank_lines("\n".join(shared))


@pytest.mark.whole_kit
def test_each_step_is_its_markdown_then_its_code_then_the_cell_that_runs_it():
    script = (ROOT / "mesure_memoire.py").read_text(encoding="utf-8")
    titles = [title for title, _ in build_notebook.script_blocks(script) if re.match(r"[0-9]+\. ", title)]
    assert [title.split(".")[0] for title in titles] == ["1", "2", "3", "4"]
    layout = [(cell["cell_type"], cell["id"]) for cell in committed()["cells"]]
    assert layout[:4] == [("markdown", "introduction"), ("markdown", "parameters-title"), ("code", "parameters"),
                          ("markdown", "shared-title")]  # fmt: skip
    position = 4
    while layout[position][1].startswith("shared-code-"):
        assert layout[position][0] == "code"
        position += 1
    assert position > 4
    runs = {"1": "run-estimate", "2": "run-environment", "3": "run-measure", "4": "run-results"}
    for title in titles:
        number = title.split(".")[0]
        cell = committed()["cells"][position]
        assert (cell["cell_type"], cell["id"]) == ("markdown", f"step-{number}-title")
        assert "".join(cell["source"]).startswith(f"## {title}\n\n")
        position += 1
        pieces = 0
        while layout[position][1].startswith(f"step-{number}-code-"):
            assert layout[position][0] == "code"
            position, pieces = position + 1, pieces + 1
        assert pieces >= 1
        assert layout[position] == ("code", runs[number])
        position += 1
    assert position == len(layout)


def test_no_code_cell_is_longer_than_the_limit_and_the_long_blocks_are_split():
    cells = committed()["cells"]
    lengths = {cell["id"]: len("".join(cell["source"]).splitlines()) for cell in cells if cell["cell_type"] == "code"}
    assert build_notebook.MAX_CELL_LINES == 200
    assert max(lengths.values()) <= 200, lengths
    assert "step-3-code-2" in lengths  # the measurement block (over 300 lines) is split
    for cell in cells:
        if cell["id"].startswith(("step-", "shared-code-")) and cell["cell_type"] == "code":
            first = "".join(cell["source"]).splitlines()[0]
            assert re.match(r"(def |class |import |[A-Z_]+ = |@|# )", first), (cell["id"], first)


@pytest.mark.whole_kit
def test_headings_appear_once_and_code_cells_do_not_repeat_them():
    script = (ROOT / "mesure_memoire.py").read_text(encoding="utf-8")
    titles = [title for title, _ in build_notebook.script_blocks(script)]
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
    ] + [f"## {title}" for title in titles if re.match(r"[0-9]+\. ", title)]
    for source in code_sources(committed()):
        for title in titles:
            assert title not in source


def test_the_parameters_cell_alone_carries_the_papermill_tag():
    tagged = [cell["id"] for cell in committed()["cells"] if cell["metadata"].get("tags")]
    assert tagged == ["parameters"]
    assert committed()["cells"][2]["metadata"] == {"tags": ["parameters"]}


@pytest.mark.whole_kit
def test_check_catches_a_script_change(tmp_path, monkeypatch, capsys):
    script = (ROOT / "mesure_memoire.py").read_text(encoding="utf-8")
    changed = script.replace("GIB_BYTES = 2**30", "GIB_BYTES = 10**9")
    assert build_notebook.serialize(build_notebook.build(changed)) != NOTEBOOK.read_text(encoding="utf-8")
    fake = tmp_path / "mesure_memoire.py"
    fake.write_text(changed, encoding="utf-8")
    monkeypatch.setattr(build_notebook, "SCRIPT", fake)
    assert build_notebook.main(["--check"]) == 1
    assert capsys.readouterr().err == (
        "build_notebook.py: mesure-memoire.ipynb is out of date with mesure_memoire.py: "
        "run python tools/build_notebook.py\n"
    )


@pytest.mark.whole_kit
def test_building_writes_only_when_the_notebook_changed(tmp_path, monkeypatch, capsys):
    target = tmp_path / "mesure-memoire.ipynb"
    monkeypatch.setattr(build_notebook, "NOTEBOOK", target)
    assert build_notebook.main([]) == 0
    assert capsys.readouterr().out == "wrote mesure-memoire.ipynb\n"
    assert target.read_bytes() == NOTEBOOK.read_bytes()
    assert oct(target.stat().st_mode & 0o777) == oct(0o644)
    target.chmod(0o664)
    assert build_notebook.main([]) == 0
    assert capsys.readouterr().out == "mesure-memoire.ipynb is up to date\n"
    target.write_text("{}", encoding="utf-8")
    assert build_notebook.main([]) == 0
    assert target.read_bytes() == NOTEBOOK.read_bytes()
    assert oct(target.stat().st_mode & 0o777) == oct(0o664)  # the existing mode is kept
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mesure-memoire.ipynb"]


def _function(lines, name, decorated=False, comment=False):
    head = (["# why this one"] if comment else []) + (["@staticmethod"] if decorated else [])
    return head + [f"def {name}():"] + [f"    x{index} = {index}" for index in range(lines - 1)] + ["    return 0"]


def test_split_at_definitions_cuts_between_top_level_statements_only():
    parts = []
    for index in range(9):
        parts.append("\n".join(_function(48, f"f{index}", decorated=index == 4, comment=index == 6)))
    block = "CONSTANT = 1\n\n\n" + "\n\n\n".join(parts)
    pieces = build_notebook.split_at_definitions(block, max_lines=200)
    assert len(pieces) == 3  # 463 lines: three even pieces rather than 200 + 200 + 63
    assert all(len(piece.splitlines()) <= 200 for piece in pieces)
    assert all(re.match(r"(def |@|# |CONSTANT)", piece) for piece in pieces)
    assert all(not piece.startswith("\n") and not piece.endswith("\n") for piece in pieces)
    assert nonblank_lines("\n".join(pieces)) == nonblank_lines(block)
    for piece in pieces:
        compile(piece, "<piece>", "exec")  # each piece is whole Python on its own


def test_split_keeps_comments_and_decorators_with_their_definition():
    block = "\n\n\n".join(["\n".join(_function(90, "a")), "\n".join(_function(90, "b", decorated=True, comment=True))])
    pieces = build_notebook.split_at_definitions(block, max_lines=100)
    assert [piece.splitlines()[0] for piece in pieces] == ["def a():", "# why this one"]
    assert pieces[1].splitlines()[1] == "@staticmethod"


def test_split_leaves_a_short_block_and_an_overlong_definition_whole():
    short = "\n".join(_function(200, "a"))
    assert build_notebook.split_at_definitions(short, max_lines=200) == [short]
    long = "\n".join(_function(250, "a")) + "\n\n\n" + "\n".join(_function(10, "b"))
    pieces = build_notebook.split_at_definitions(long, max_lines=200)
    assert [len(piece.splitlines()) for piece in pieces] == [251, 11]


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda s: s.replace("notebook: 4. Reading", "notebook: 5. Reading"), "step with no run cell"),
        (lambda s: s.replace("notebook: 2. Environment", "notebook: Environment"), "no notebook block for step(s) 2"),
        (lambda s: s.replace("# >>> notebook", "# >>> not"), "has no '# >>> notebook' block"),
    ],
)
def test_a_script_whose_steps_do_not_match_the_run_cells_is_refused(change, message):
    script = (ROOT / "mesure_memoire.py").read_text(encoding="utf-8")
    with pytest.raises(build_notebook.BuildError, match=re.escape(message)):
        build_notebook.build(change(script))


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
    files = [str(REPORT_DATA / "schema1.json"), str(REPORT_DATA / "schema2.json")]
    assert namespace["report"](files) == mesure_memoire.report(files)
    assert namespace["format_report"](namespace["report"](files)) == mesure_memoire.format_report(
        mesure_memoire.report(files)
    )


def test_the_results_cell_prints_report_for_the_file_it_wrote(tmp_path, monkeypatch, capsys):
    """Steps 3 and 4 as a plain script, with a stand-in for the GPU measurement (no GPU here):
    the stand-in "measure_to_file" writes a crafted schema-2 result under OUTPUT."""
    monkeypatch.chdir(tmp_path)
    crafted = json.loads((REPORT_DATA / "schema2.json").read_text(encoding="utf-8"))
    namespace = {}
    cells = {cell["id"]: "".join(cell["source"]) for cell in committed()["cells"] if cell["cell_type"] == "code"}
    for cell_id, source in cells.items():
        if cell_id.startswith(("shared-code-", "step-")) or cell_id == "parameters":
            exec(compile(source, "<notebook>", "exec"), namespace)

    def stand_in_measure_to_file(config, output, tool):
        assert (config["batch"], config["width"], tool) == (1, 64, "mesure-memoire.ipynb")
        (tmp_path / output).write_text(json.dumps(crafted), encoding="utf-8")
        return crafted

    namespace["measure_to_file"] = stand_in_measure_to_file
    exec(compile(cells["run-measure"], "<notebook>", "exec"), namespace)
    measured = capsys.readouterr().out
    assert measured == mesure_memoire.format_phase_table(crafted) + "\nResult written to mesures-notebook.json\n"
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
    assert measured.startswith("Nothing was measured and no file was written: no usable GPU for cuda:0")
    assert stdout_of(cells["run-results"]) == "Nothing to show: this kernel wrote no measurement.\n"
    assert sorted(p.name for p in folder.iterdir()) == [NOTEBOOK.name]
    assert hashlib.sha256(NOTEBOOK.read_bytes()).hexdigest() == before  # the committed file is untouched
    assert build_notebook.saved_output_problems(committed()) == []


def test_plain_python_runs_the_code_cells_and_refuses_an_existing_output(tmp_path):
    """As on a GPU box without Jupyter: the code cells joined into one script."""
    code = build_notebook.code_cells_as_script(committed())
    (tmp_path / "mesures-notebook.json").write_text("mine")
    completed = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path)
    assert completed.returncode == 0, completed.stderr
    assert "Nothing was measured and no file was written: --output: mesures-notebook.json already exists" in (
        completed.stdout
    )
    assert (tmp_path / "mesures-notebook.json").read_text() == "mine"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mesures-notebook.json"]
