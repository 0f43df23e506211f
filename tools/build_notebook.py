"""Generate ``mesure-memoire.ipynb`` from ``mesure_memoire.py`` (not shipped).

Usage::

    python tools/build_notebook.py           # rewrite the notebook
    python tools/build_notebook.py --check   # exit 1 if the committed notebook differs

The script's blocks between ``# >>> notebook: TITLE`` and ``# <<< notebook`` become code cells
verbatim, so the notebook's arithmetic and protocol cannot drift from the script's.  The
parameters and the few cells that call those functions are written here.  Every code cell is
saved without outputs and without an execution count.  Standard library only.
"""

import argparse
import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "mesure_memoire.py"
NOTEBOOK = ROOT / "mesure-memoire.ipynb"
_BLOCK = re.compile(r"^# >>> notebook: (?P<title>.+?)\n(?P<code>.*?)^# <<< notebook$", re.MULTILINE | re.DOTALL)

INTRODUCTION = """\
# IteraGPU Lab v1: memory notebook

This notebook runs a small synthetic `Linear → GELU → Linear` network. It downloads no model and
no data set. This network is not an LLM, not a training run, and not a representative benchmark
of the GPUs offered for rent. It is self-contained: it imports only Python's standard library
and, for the environment and the measurement, PyTorch; it does not import `mesure_memoire.py`,
whose code it carries (the cells below are generated from that script).

Use **Run All**. The steps: (1) estimate the weights' memory, arithmetic only; (2) diagnose the
environment; (3) measure the synthetic network phase by phase on the chosen GPU and write one
new JSON file; then read that file back as a table.

Limits, as in the README:

- The estimate does not include activations, KV cache, quantization metadata, gradients,
  optimizer states, libraries or the CUDA/ROCm context, and does not predict whether a real
  model fits a card. The reserve is your hypothesis, not a measurement.
- Without an importable PyTorch or a usable GPU, the measurement cell says that nothing was
  measured and writes nothing: no false measurement, no CPU fallback.
- The counters cover only PyTorch's allocator in this kernel on the chosen GPU, not the whole
  GPU, the CUDA context, the driver or other processes. `allocated` is part of `reserved`; the
  two peaks are distinct maxima, never subtracted. Times include Python's overhead and the
  synchronizations.
- **Start each measurement from a fresh kernel** (Restart Kernel, then Run All): a second
  measurement in the same kernel is not a fresh process, and the result records a warning.
- The output file must have a new name: an existing file is never overwritten.
- The driver is not the CUDA runtime built into PyTorch: record it with the vendor's tool
  (`nvidia-smi --query-gpu=name,driver_version --format=csv`, or `amd-smi version`)."""

PARAMETERS = """\
# Parameters: edit them, then Run All.
# 1. Estimate (the README's example; the reserve is a hypothesis, not a measured reserve)
PARAMETERS = 7000000000
BITS = 16
RESERVE_GIB = 4
# 2-3. Environment and measurement (the README's small trial)
DEVICE = "cuda:0"
BATCH = 1
CONTEXT = 16
WIDTH = 64
DTYPE = "float32"  # float32, float16 or bfloat16
WARMUP = 1
REPEATS = 2
SEED = 0
OUTPUT = "mesures-notebook.json"  # a new file name, in the notebook's folder"""

RUN_CELLS = [
    (
        "run-estimate",
        "## 1. Estimate the weights",
        """\
try:
    print(format_estimate(estimate_weights(PARAMETERS, BITS, RESERVE_GIB)))
except KitError as error:
    print(f"Estimate refused: {error}")""",
    ),
    (
        "run-environment",
        "## 2. Check the environment\n\nKeep this output with your results.",
        """\
try:
    print(format_environment(collect_environment(DEVICE)))
except KitError as error:
    print(f"Environment refused: {error}")""",
    ),
    (
        "run-measure",
        "## 3. Measure, phase by phase\n\nRefuses an existing output file, and writes nothing when it cannot measure.",
        """\
measurement = None
try:
    config = measure_config(DEVICE, BATCH, CONTEXT, WIDTH, DTYPE, WARMUP, REPEATS, SEED)
    measurement = measure_to_file(config, OUTPUT, tool="mesure-memoire.ipynb")
except KitError as error:
    print(f"Nothing was measured and no file was written: {error}")
else:
    settings = measurement["configuration"]
    if settings["fresh_process_warning"]:
        print(f"Warning: {settings['fresh_process_warning']}")
    elif settings["cuda_initialized_before_measure"]:
        print("Note: CUDA was initialized in this kernel before the measurement (by the environment cell, "
              "for instance); the allocator held no memory, so the counters start from zero.")
    print(f"Result written to {OUTPUT}")""",
    ),
    (
        "run-results",
        "## Results, read back from the JSON file",
        """\
if measurement is None:
    print("Nothing to show: this kernel wrote no measurement.")
else:
    with open(OUTPUT, encoding="utf-8") as stream:
        print(format_phase_table(json.load(stream)))""",
    ),
]


def script_blocks(source):
    """(title, code) of each block the script marks for the notebook."""
    blocks = [(m["title"].strip(), m["code"].strip("\n")) for m in _BLOCK.finditer(source)]
    if not blocks:
        raise SystemExit("build_notebook.py: error: mesure_memoire.py has no '# >>> notebook' block")
    return blocks


def slug(title):
    return re.sub(r"[^a-z0-9]+", "-", title.lower()).strip("-")[:40]


def _lines(text):
    return text.splitlines(keepends=True)


def markdown(cell_id, text):
    return {"cell_type": "markdown", "id": cell_id, "metadata": {}, "source": _lines(text)}


def code(cell_id, text):
    return {"cell_type": "code", "execution_count": None, "id": cell_id, "metadata": {}, "outputs": [],
            "source": _lines(text)}  # fmt: skip


def build(source):
    """The notebook, as a dict, from the script's source text."""
    cells = [markdown("introduction", INTRODUCTION), markdown("parameters-title", "## Parameters")]
    cells.append(code("parameters", PARAMETERS))
    cells.append(markdown("library-title", "## The code, from `mesure_memoire.py`\n\nRun these cells; nothing "
                                           "is measured until step 3."))  # fmt: skip
    for title, block in script_blocks(source):
        cells.append(code("code-" + slug(title.split("(")[0]), f"# {title}\n{block}"))
    for cell_id, text, block in RUN_CELLS:
        cells += [markdown(cell_id + "-title", text), code(cell_id, block)]
    return {
        "cells": cells,
        "metadata": {
            "kernelspec": {"display_name": "Python 3 (ipykernel)", "language": "python", "name": "python3"},
            "language_info": {
                "codemirror_mode": {"name": "ipython", "version": 3},
                "file_extension": ".py",
                "mimetype": "text/x-python",
                "name": "python",
                "nbconvert_exporter": "python",
                "pygments_lexer": "ipython3",
            },
        },
        "nbformat": 4,
        "nbformat_minor": 5,
    }


def serialize(notebook):
    return json.dumps(notebook, indent=1, sort_keys=True, ensure_ascii=False) + "\n"


def saved_output_problems(notebook):
    """Code cells that carry outputs or an execution count (the kit ships none)."""
    return [
        cell.get("id", f"cell {index}")
        for index, cell in enumerate(notebook.get("cells", []))
        if cell.get("cell_type") == "code" and (cell.get("outputs") or cell.get("execution_count") is not None)
    ]


def code_cells_as_script(notebook):
    """The notebook's code cells joined into one script, for a plain python3 without Jupyter."""
    return "\n\n".join("".join(cell["source"]) for cell in notebook["cells"] if cell["cell_type"] == "code") + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="build_notebook.py", description=__doc__.split("\n\n")[0])
    what = parser.add_mutually_exclusive_group()
    what.add_argument("--check", action="store_true", help="exit 1 if the committed notebook is not up to date")
    what.add_argument("--print-code", action="store_true",
                      help="print the committed notebook's code cells as one Python script")  # fmt: skip
    args = parser.parse_args(argv)
    if args.print_code:
        sys.stdout.write(code_cells_as_script(json.loads(NOTEBOOK.read_text(encoding="utf-8"))))
        return 0
    expected = serialize(build(SCRIPT.read_text(encoding="utf-8")))
    if args.check:
        current = NOTEBOOK.read_text(encoding="utf-8") if NOTEBOOK.exists() else ""
        if current != expected:
            print(f"build_notebook.py: {NOTEBOOK.name} is out of date with {SCRIPT.name}: "
                  "run python tools/build_notebook.py", file=sys.stderr)  # fmt: skip
            return 1
        return 0
    NOTEBOOK.write_text(expected, encoding="utf-8", newline="\n")
    print(f"wrote {NOTEBOOK.name}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
