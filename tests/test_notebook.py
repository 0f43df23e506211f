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


def test_the_committed_notebook_is_generated_from_the_script():
    completed = subprocess.run([sys.executable, str(ROOT / "tools" / "build_notebook.py"), "--check"],
                               capture_output=True, text=True)  # fmt: skip
    assert completed.returncode == 0, completed.stderr
    script = (ROOT / "mesure_memoire.py").read_text(encoding="utf-8")
    for title, block in build_notebook.script_blocks(script):
        assert any(source == f"# {title}\n{block}" for source in code_sources(committed())), title


def test_check_catches_a_script_change(tmp_path, monkeypatch):
    script = (ROOT / "mesure_memoire.py").read_text(encoding="utf-8")
    changed = script.replace("GIB_BYTES = 2**30", "GIB_BYTES = 10**9")
    assert build_notebook.serialize(build_notebook.build(changed)) != NOTEBOOK.read_text(encoding="utf-8")
    fake = tmp_path / "mesure_memoire.py"
    fake.write_text(changed, encoding="utf-8")
    monkeypatch.setattr(build_notebook, "SCRIPT", fake)
    assert build_notebook.main(["--check"]) == 1


def test_the_notebook_functions_compute_what_the_script_computes():
    namespace = {}
    for source in code_sources(committed()):
        if source.startswith("# "):  # the cells copied from the script
            exec(compile(source, "<notebook>", "exec"), namespace)
    for parameters, bits, reserve in [(7000000000, 16, 4), (1, 1, 0), (123456789, 12, "0.5"), (10**15, 4, 80)]:
        assert namespace["estimate_weights"](parameters, bits, reserve) == mesure_memoire.estimate_weights(
            parameters, bits, reserve
        )
    for width, dtype in [(64, "float32"), (1024, "bfloat16"), (3, "float16")]:
        config = namespace["measure_config"]("cuda:0", 2, 128, width, dtype, 0, 1, 5)
        assert config == mesure_memoire.measure_config("cuda:0", 2, 128, width, dtype, 0, 1, 5)
        assert namespace["synthetic_model"](config) == mesure_memoire.synthetic_model(config)
    assert namespace["PHASES"] == mesure_memoire.PHASES


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
