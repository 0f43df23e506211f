"""Generate mesure-memoire.ipynb from mesure_memoire.py (a maintainer's tool, not shipped)."""

import json
import os
import re
import stat
import sys
from pathlib import Path

PROG = "build_notebook.py"
ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # the kit's command-line pieces, when run as python tools/build_notebook.py
if not (ROOT / "mesure_memoire.py").is_file():  # the kit's command line, which would say it, is in it
    sys.stderr.write(f"{PROG}: error: mesure_memoire.py is missing from the kit's folder (the tool imports it)\n")
    raise SystemExit(2)
from mesure_memoire import ArgumentParser, KitError, Once, run_command_line, say  # noqa: E402

SCRIPT = ROOT / "mesure_memoire.py"
NOTEBOOK = ROOT / "mesure-memoire.ipynb"
DESCRIPTION = "Generate mesure-memoire.ipynb from mesure_memoire.py's '# >>> notebook: TITLE' blocks, verbatim."
CHECK_HELP = "write nothing; exit 1 if the notebook is not what this tool generates"
_BLOCK = re.compile(r"^# >>> notebook: (?P<title>.+?)\n(?P<code>.*?)^# <<< notebook$", re.MULTILINE | re.DOTALL)
_STEP = re.compile(r"(?P<number>[0-9]+)\. ")  # "3. TITLE": the block that opens step 3
_PART = re.compile(r"(?P<number>[0-9]+)\.(?P<part>[0-9]+) ")  # "3.2 TITLE": its next block, under its own heading

INTRODUCTION = """\
# IteraGPU Lab v1: memory notebook

A small synthetic `Linear → GELU → Linear` network, measured phase by phase on one GPU. It downloads no model
and no data set; it is not an LLM, not a training run, and not a representative benchmark of the GPUs offered
for rent. Its code cells, generated from `mesure_memoire.py` (not imported), use Python's standard library and
PyTorch; matplotlib, only to draw, where it is importable. The definitions are collapsed.

Edit the parameters, then **Restart Kernel and Run All**: a second measurement in the same kernel is not a fresh
process, and its result records a warning. The steps, as in the README's quick start: (1) how much memory do the
weights take? (`estimate`, arithmetic only); (2) which Python, PyTorch and GPU? (`environment`); (3) what does the
GPU really use, phase by phase? (`measure`, into one new JSON file, never over an existing one; with `MEMORY_GIB`,
the plan's verdict on that card first); (4) the result in one row (`report`); (5) its figure.

Limits, as in the README: the estimate leaves out activations, KV cache, quantization metadata, gradients, optimizer
states, libraries and the CUDA/ROCm context, and does not say whether a real model fits a card; the reserve is your
hypothesis. Without PyTorch or a usable GPU nothing is measured and nothing is written (no CPU fallback). The counters
cover PyTorch's allocator in this kernel on the chosen GPU only, not the CUDA context, the driver or other processes;
`allocated` is part of `reserved`, the two peaks are distinct maxima, never subtracted. Times include Python's
overhead and the synchronizations. The CUDA or HIP runtime built into PyTorch, which step 2 shows, is not the driver:
record the driver with the vendor's tool, `nvidia-smi --query-gpu=name,driver_version --format=csv` or
`amd-smi version`."""

PARAMETERS_TEXT = """\
## Parameters

Tagged `parameters`, for papermill: `papermill mesure-memoire.ipynb run.ipynb -p WIDTH 128 -p OUTPUT w128.json`."""

PARAMETERS = """\
# Parameters: edit them, then Run All.  The types are for papermill --help-notebook.
# 1. Estimate (the README's example; the reserve is a hypothesis, not a measured reserve)
PARAMETERS: int = 7000000000  # number of parameters
BITS: int = 16  # storage width per parameter in bits
RESERVE_GIB: float = 4  # GiB you assume on top of the weights
# 2-3. Environment and measurement (the README's small trial)
DEVICE: str = "cuda:0"  # the GPU, cuda:N
BATCH: int = 1  # batch size
CONTEXT: int = 16  # positions per input row
WIDTH: int = 64  # model width; the hidden layer is 4x
DTYPE: str = "float32"  # float32, float16 or bfloat16
WARMUP: int = 1  # warm-up passes, 0 to 1000
REPEATS: int = 2  # measured warm passes, 1 to 1000
SEED: int = 0  # seed of the weights and inputs
OUTPUT: str = "mesures-notebook.json"  # a new file, in the kernel's working folder (papermill's: --cwd)
MEMORY_GIB: str = ""  # a card's memory in GiB, "80" say: step 3 first says if the run fits (empty: no check)
# True: PyTorch's own messages, tracebacks and stderr below steps 2-3 (paths, environment values; a saved notebook
# keeps its outputs); never in a file
DEBUG: bool = False"""

SHARED_TEXT = """\
## Shared code, from `mesure_memoire.py`

Imports and definitions every step uses (collapsed). Nothing is measured until step 3."""

STEPS = {  # step number: (the text under the step's heading, the id of its run cell, that cell's code)
    "1": (
        "Bits are rounded up to whole bytes per parameter; GiB are `2**30` bytes, GB `10**9`.",
        "run-estimate",
        """\
try:
    print(format_estimate(estimate_weights(PARAMETERS, BITS, RESERVE_GIB)))
except KitError as error:
    print(f"Estimate refused: {as_notebook_message(error)}")""",
    ),
    "2": (
        'Keep this output with your results. Each query degrades alone ("none", or a "query failed" line).',
        "run-environment",
        """\
try:
    print(format_environment(collect_environment(DEVICE, debug=DEBUG)))
except KitError as error:
    print(f"Environment refused: {as_notebook_message(error)}")""",
    ),
    "3": (
        "With `MEMORY_GIB`, first the plan's verdict on that card. Refuses an existing output file; writes "
        "nothing when it cannot measure (no GPU or PyTorch, out of memory). One per new kernel.",
        "run-measure",
        """\
measurement = None
try:
    config = measure_config(DEVICE, BATCH, CONTEXT, WIDTH, DTYPE, WARMUP, REPEATS, SEED)
    if MEMORY_GIB not in ("", None):
        print(format_fit(plan_with_fit(config, MEMORY_GIB)))
    measurement = measure_to_file(config, OUTPUT, tool="mesure-memoire.ipynb", debug=DEBUG)
except KitError as error:
    print(f"Measurement refused: {as_notebook_message(error)}")
else:
    for warning in result_warnings(measurement):
        print(f"Warning: {warning}")
    print(format_phase_table(measurement))
    print(f"Result written to {name_as_typed(OUTPUT)}")""",
    ),
    "4": (
        "Reads back the file step 3 wrote, as `mesure_memoire.py report` does: peaks are maxima over the phases, "
        "the warm median is over the `warm_forward` lines. Several results: "
        '`print(format_report(report(["a.json", "b.json"])))` in a new cell.',
        "run-results",
        """\
if measurement is None:
    print("Nothing to show: this kernel wrote no measurement.")
else:
    try:
        print(format_report(report([OUTPUT])))
    except KitError as error:
        print(f"The result cannot be read back: {error}")""",
    ),
    "5": (
        "Where matplotlib is importable: the measured peaks per phase beside the plan's.",
        "run-figure",
        """\
if measurement is None:
    print("Nothing to draw: this kernel wrote no measurement.")
else:
    try:
        figure = draw_phases(measurement)
    except KitError as error:
        print(f"No figure: {error}")""",
    ),
}
HIDDEN = {"source_hidden": True}  # JupyterLab and VS Code open such a cell collapsed
METADATA = {
    "kernelspec": {"display_name": "Python 3 (ipykernel)", "language": "python", "name": "python3"},
    "language_info": {
        "codemirror_mode": {"name": "ipython", "version": 3},
        "file_extension": ".py",
        "mimetype": "text/x-python",
        "name": "python",
        "nbconvert_exporter": "python",
        "pygments_lexer": "ipython3",
    },
}


def script_blocks(source):
    """(title, code) of each block the script marks for the notebook, in order."""
    blocks = [(found["title"].strip(), found["code"].strip("\n")) for found in _BLOCK.finditer(source)]
    if not blocks:
        raise KitError(f"{SCRIPT.name} has no '# >>> notebook' block")
    return blocks


def cell(kind, cell_id, text, **metadata):
    extra = {"execution_count": None, "outputs": []} if kind == "code" else {}
    return {"cell_type": kind, "id": cell_id, "metadata": metadata, "source": text.splitlines(keepends=True), **extra}


def grouped(blocks):
    """The shared code, each step's blocks (its own, then its parts N.2, N.3, ... right after it), misplaced parts."""
    shared = []
    steps = {}
    misplaced = []
    current = None  # the step whose next part may follow
    for title, code in blocks:
        step = _STEP.match(title)
        part = _PART.match(title)
        if step:
            current = step["number"]
            steps[current] = [(title, code)]
        elif part and part["number"] == current and part["part"] == str(len(steps[current]) + 1):
            steps[current].append((title, code))
        elif part:
            misplaced.append(title)
        else:
            shared.append(code)
            current = None
    return shared, steps, misplaced


def step_cells(number, text, blocks):
    """A step's heading and text, then each of its blocks collapsed, each part under its own heading."""
    (title, code), *parts = blocks
    cells = [
        cell("markdown", f"step-{number}-title", f"## {title}\n\n{text}"),
        cell("code", f"step-{number}-code", code, jupyter=HIDDEN),
    ]
    for part_title, part_code in parts:
        part = _PART.match(part_title)["part"]
        cells.append(cell("markdown", f"step-{number}-{part}-title", f"### {part_title}"))
        cells.append(cell("code", f"step-{number}-{part}-code", part_code, jupyter=HIDDEN))
    return cells


def build(source):
    """The notebook, as a dict, from the script's source text: the definitions collapsed, the rest open."""
    (_, version_check), *blocks = script_blocks(source)  # the first, the Python version check, opens the notebook
    version_check = version_check.replace(SCRIPT.name, NOTEBOOK.name)  # naming the notebook, not the script
    shared, steps, misplaced = grouped(blocks)
    if sorted(steps) != sorted(STEPS):
        raise KitError(
            f"{SCRIPT.name}'s numbered notebook blocks are steps {', '.join(sorted(steps)) or 'none'}; "
            f"{PROG} has run cells for steps {', '.join(STEPS)}"
        )
    if misplaced:
        raise KitError(
            f"{SCRIPT.name}'s notebook block '{misplaced[0]}' is not the next part of the step above it "
            "(block N., then N.2, N.3, ...)"
        )
    cells = [
        cell("markdown", "introduction", INTRODUCTION),
        cell("code", "python-version", version_check),
        cell("markdown", "parameters-title", PARAMETERS_TEXT),
        cell("code", "parameters", PARAMETERS, tags=["parameters"]),
        cell("markdown", "shared-title", SHARED_TEXT),
    ]
    cells += [cell("code", f"shared-code-{index}", code, jupyter=HIDDEN) for index, code in enumerate(shared, 1)]
    for number, (text, run_id, run) in STEPS.items():
        cells += step_cells(number, text, steps[number])
        cells.append(cell("code", run_id, run))
    return {"cells": cells, "metadata": METADATA, "nbformat": 4, "nbformat_minor": 5}


def notebook_bytes(script_bytes):
    """The notebook file, byte for byte, that the script's bytes give (build_zip.py compares with it)."""
    source = script_bytes.decode("utf-8")
    return (json.dumps(build(source), indent=1, sort_keys=True, ensure_ascii=False) + "\n").encode("utf-8")


def write_whole(path, data, replace):
    """Write ``data`` to a new temporary name beside ``path``, then put it in place: renamed over ``path`` when
    ``replace`` (a hard link's other names keep their file; an existing file's mode is kept), else linked to it,
    which fails if ``path`` exists.  A full disk or a signal at any moment leaves ``path`` as it was and no
    temporary file; raises OSError (FileExistsError: ``path`` exists and ``replace`` is false)."""
    temporary = path.with_name(f".{path.name}.{os.urandom(8).hex()}.tmp")
    try:
        with open(temporary, "xb") as stream:
            stream.write(data)
            stream.flush()
            os.fsync(stream.fileno())
        if replace and os.path.lexists(path):
            os.chmod(temporary, stat.S_IMODE(os.stat(path).st_mode))
        if replace:
            os.replace(temporary, path)
        else:
            os.link(temporary, path)
    finally:
        temporary.unlink(missing_ok=True)


def command(argv):
    parser = ArgumentParser(prog=PROG, description=DESCRIPTION)
    parser.add_argument("--check", action=Once, nargs=0, const=True, default=False, help=CHECK_HELP)
    args = parser.parse_args(argv)
    expected = notebook_bytes(SCRIPT.read_bytes())
    up_to_date = NOTEBOOK.exists() and NOTEBOOK.read_bytes() == expected
    if args.check and not up_to_date:
        say(PROG, f"{NOTEBOOK.name} is out of date with {SCRIPT.name}: run python tools/build_notebook.py", "")
        return 1
    if not (args.check or up_to_date):
        if NOTEBOOK.is_symlink():  # writing through it would change someone else's file
            raise KitError(f"{NOTEBOOK.name} is a link: this tool writes over nothing but its own outputs")
        try:
            write_whole(NOTEBOOK, expected, replace=True)
        except OSError as error:
            raise KitError(f"cannot write {NOTEBOOK.name} ({error.strerror or type(error).__name__})") from None
    if not args.check:
        print(f"{NOTEBOOK.name} is up to date" if up_to_date else f"wrote {NOTEBOOK.name}")
    return 0


def main(argv=None) -> int:
    return run_command_line(PROG, command, sys.argv[1:] if argv is None else argv)


if __name__ == "__main__":
    raise SystemExit(main())
