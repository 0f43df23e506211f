"""The marker test (issue 41): the environment variables PyTorch reads through its own helpers, each set to a
marker, reach no output, JSON, result file or notebook output, and PyTorch still imports.

Real PyTorch in fresh processes (its C++ side reads these variables once per process).  It needs neither
Jupyter nor ruff: the GPU validation run runs it too, where a CUDA build reads the variables a CPU build never
reads.  The notebook's code runs as plain python, as on a GPU box without Jupyter.
"""

import json
import os
import subprocess
import sys

import pytest
import torch

from conftest import (
    MESSAGES,
    MESURE_SCRIPT,
    ROOT,
    SMALL_TRIAL,
    assert_one_line_refusal,
    code_cells_as_script,
    private_texts,
    refused,
)

MARKER = "zq7hunter2"

# Read by PyTorch 2.4 to 2.15 through c10's check_env / get_env (c10/util/env.cpp) or their Python
# counterparts, whose warnings quote the value they were given ("Ignoring invalid value for boolean flag NAME:
# VALUE"): from the source and `strings` of libc10, libtorch_cpu, libtorch_cuda.  Some are read only by CUDA or
# ROCm builds, or only once cuBLAS, cuDNN or cuSOLVER is used.
MARKED_VARIABLES = (
    "TORCH_BLAS_PREFER_CUBLASLT",
    "TORCH_BLAS_PREFER_HIPBLASLT",
    "TORCH_ALLOW_TF32_CUBLAS_OVERRIDE",
    "TORCH_LINALG_PREFER_CUSOLVER",
    "TORCH_LINALG_PREFER_HIPSOLVER",
    "TORCH_SHOW_CPP_STACKTRACES",
    "TORCH_CUDNN_V8_API_LRU_CACHE_LIMIT",
    "TORCH_CUDNN_V8_API_DISABLED",
    "TORCH_CUDNN_V8_API_DEBUG",
    "TORCH_CUDNN_USE_HEURISTIC_MODE_B",
    "PYTORCH_TUNABLEOP_ENABLED",
    "CUBLAS_WORKSPACE_CONFIG",
    "CUBLASLT_WORKSPACE_SIZE",
    "TORCH_CPP_LOG_LEVEL",
    "PYTORCH_NVML_BASED_CUDA_CHECK",
    "TORCH_USE_CUDA_DSA",
    "TORCH_DISABLE_ADDR2LINE",
    "TORCH_LINEAR_FLATTEN_3D",
    "TORCH_ROCM_FA_PREFER_CK",
    "TORCH_MKLDNN_MATMUL_MIN_DIM",
    "TORCH_MKLDNN_MATMUL_MIN_SIZE",
)
# A marker in these stops PyTorch's import: each gets a run of its own, which must end in a clean diagnosis.
IMPORT_STOPPERS = ("TORCH_LOGS",)


def marked(*names):
    """The environment with each of ``names`` set to a marker, and a variable of the user's own."""
    markers = {name: f"{MARKER}{number}" for number, name in enumerate(names)}
    return {**os.environ, **markers, "ITERAGPU_PRIVATE_SENTINEL": f"{MARKER}-private"}


def run(arguments, cwd, env, debug=False):
    """Run ``arguments`` in ``cwd``: no output and no file written there holds a marker, a name or a path
    that the privacy rule forbids (test_environment.py's privacy test runs the rest of the commands).  With
    ``debug`` (--debug shows PyTorch's own text on the terminal, as asked), the files written alone."""
    completed = subprocess.run(arguments, capture_output=True, text=True, cwd=cwd, env=env, timeout=300)
    texts = [path.read_text(errors="replace") for path in cwd.rglob("*")]
    texts += [] if debug else [completed.stdout + completed.stderr]
    for text in texts:
        for secret in private_texts(MARKER, cwd):
            assert secret not in text
    return completed


@pytest.mark.whole_kit
def test_no_marker_in_environment_s_json_with_debug(tmp_path):
    """--debug's text goes to the terminal only: stdout's JSON and the files hold no marker (the text and stderr
    without --debug: the notebook's run below).  PyTorch's C++ side refuses TORCH_CPP_LOG_LEVEL's marker on
    stderr: kept withheld."""
    arguments = [sys.executable, MESURE_SCRIPT, "environment", "--device", "cuda:0", "--json", "--debug"]
    completed = run(arguments, tmp_path, marked(*MARKED_VARIABLES), debug=True)
    assert completed.returncode == 0, completed.stderr
    for secret in private_texts(MARKER, tmp_path):
        assert secret not in completed.stdout
    data = json.loads(completed.stdout)
    assert data["torch"] == torch.__version__
    assert data["torch_error"] is None
    assert data["gpu_available"] is torch.cuda.is_available()
    assert "stderr: text withheld" in data["field_errors"]["pytorch_warnings"]
    assert list(tmp_path.iterdir()) == []


@pytest.mark.whole_kit
def test_no_marker_in_measure_or_its_result(tmp_path):
    """On a stand-in for a visible GPU (tests/data/markers/measure_on_stand_in.py); on the GPU where there is one.
    --debug changes what reaches the terminal only (tests/test_debug.py): this run is without it."""
    stand_in = str(ROOT / "tests" / "data" / "markers" / "measure_on_stand_in.py")
    arguments = [sys.executable, stand_in, *SMALL_TRIAL, "--output", "marked.json"]
    completed = run(arguments, tmp_path, marked(*MARKED_VARIABLES))
    assert completed.returncode == 0, completed.stderr
    assert "Result written to marked.json" in completed.stdout
    assert json.loads((tmp_path / "marked.json").read_text())["environment"]["torch"] == torch.__version__


@pytest.mark.whole_kit
def test_no_marker_in_the_notebook_s_output(tmp_path):
    notebook = json.loads((ROOT / "mesure-memoire.ipynb").read_text(encoding="utf-8"))
    # From a file beside the run's folder: as one -c argument it would pass Linux's limit on one argument (128 KiB).
    script = tmp_path.parent / f"{tmp_path.name}-notebook.py"
    script.write_text(code_cells_as_script(notebook), encoding="utf-8")
    completed = run([sys.executable, str(script)], tmp_path, marked(*MARKED_VARIABLES))
    assert completed.returncode == 0, completed.stderr
    assert f"  PyTorch               {torch.__version__}\n" in completed.stdout


@pytest.mark.whole_kit
@pytest.mark.parametrize("name", IMPORT_STOPPERS)
def test_a_marker_that_stops_pytorch_s_import_ends_in_a_one_line_refusal(tmp_path, name):
    """PyTorch's C++ side writes its refusal of TORCH_CPP_LOG_LEVEL's marker on stderr first: the refusal stays
    one line, and names the import's failure by its type only."""
    arguments = [sys.executable, MESURE_SCRIPT, "measure", "--device", "cuda:0", "--output", "x.json"]
    completed = run(arguments, tmp_path, marked(name, "TORCH_CPP_LOG_LEVEL"))
    error = MESSAGES["torch import error, scrubbed"].format(type="ValueError")
    said = refused(MESSAGES["PyTorch not importable, run it on the GPU box"].format(error=error))
    assert_one_line_refusal(completed, said)
    assert list(tmp_path.iterdir()) == []
