"""Generate ``mesure-memoire.ipynb`` from ``mesure_memoire.py`` (not shipped).

Usage::

    python tools/build_notebook.py                # rewrite the notebook (only if it changed)
    python tools/build_notebook.py --check        # exit 1 if the committed notebook differs
    python tools/build_notebook.py --print-code   # the notebook's code cells as one Python script

The script's blocks between ``# >>> notebook: TITLE`` and ``# <<< notebook`` become code cells
verbatim, so the notebook's arithmetic and protocol cannot drift from the script's.  A numbered
block (``1. ...``) is a step: its title becomes the step's heading, followed by the step's text,
the block's code, then the cell that runs it; a block longer than MAX_CELL_LINES is split into
several cells at top-level definitions.  The parameters cell carries the ``parameters`` tag
(papermill).  Every code cell is saved without outputs and without an execution count.
Refusals print one line and exit 2; an unwritable standard output, one line and 1 (a closed pipe, 1
silently); Ctrl-C exits 130.  Standard library only.
"""

import argparse
import ast
import contextlib
import json
import os
import re
import stat
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "mesure_memoire.py"
NOTEBOOK = ROOT / "mesure-memoire.ipynb"
PROGRAM = "build_notebook.py"
MAX_CELL_LINES = 200  # a cell a reader can take in; longer blocks are split at definitions
MAX_READ_BYTES = 8 * 2**20  # the script and the notebook are well below 1 MiB
_BLOCK = re.compile(r"^# >>> notebook: (?P<title>.+?)\n(?P<code>.*?)^# <<< notebook$", re.MULTILINE | re.DOTALL)
_STEP = re.compile(r"(?P<number>[0-9]+)\. ")

INTRODUCTION = """\
# IteraGPU Lab v1: memory notebook

This notebook runs a small synthetic `Linear → GELU → Linear` network. It downloads no model and
no data set. This network is not an LLM, not a training run, and not a representative benchmark
of the GPUs offered for rent. It is self-contained: it imports only Python's standard library
and, for the environment and the measurement, PyTorch; it does not import `mesure_memoire.py`,
whose code it carries (the code cells below are generated from that script).

Use **Run All**. Each step below is its explanation, then its code, then the cell that runs it:
(1) estimate the weights' memory, arithmetic only; (2) diagnose the environment; (3) measure the
synthetic network phase by phase on the chosen GPU and write one new JSON file; (4) read that file
back with the script's `report`.

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

PARAMETERS_TEXT = """\
## Parameters

Edit them, then Run All. This cell carries the `parameters` tag, so papermill can inject other
values (for example `papermill mesure-memoire.ipynb run.ipynb -p WIDTH 128 -p OUTPUT w128.json`)."""

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

SHARED_TEXT = """\
## Shared code, from `mesure_memoire.py`

Imports and definitions every step uses. Run these cells; nothing is measured until step 3."""

# Step number -> (the step's text under its heading, the id of the cell that runs it, that cell's code).
STEPS = {
    "1": (
        "Bits are rounded up to whole bytes per parameter; GiB are `2**30` bytes, GB `10**9`. The "
        "reserve is your hypothesis, not a measured reserve.",
        "run-estimate",
        """\
try:
    print(format_estimate(estimate_weights(PARAMETERS, BITS, RESERVE_GIB)))
except KitError as error:
    print(f"Estimate refused: {error}")""",
    ),
    "2": (
        "Keep this output with your results. Each query degrades on its own: a failure shows as "
        '"none" or a "query failed" line.',
        "run-environment",
        """\
try:
    print(format_environment(collect_environment(DEVICE)))
except KitError as error:
    print(f"Environment refused: {error}")""",
    ),
    "3": (
        "Refuses an existing output file, and writes nothing when it cannot measure (no GPU, no "
        "PyTorch, out of memory). One measurement per fresh kernel.",
        "run-measure",
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
    print(format_phase_table(measurement))
    print(f"Result written to {OUTPUT}")""",
    ),
    "4": (
        "Reads back the file step 3 wrote, as `python mesure_memoire.py report FILE...` does: the peaks "
        "are maxima over the phases, the warm median is over the `warm_forward` lines, and the "
        "throughput is derived, not measured. To compare several results, run "
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
}


class BuildError(Exception):
    """An expected failure: one line on stderr, exit 2."""


class _StdoutGone(Exception):
    """Standard output is a closed pipe: stop quietly, as POSIX tools do."""


def _one_line(text):
    """Control characters (a newline in a value) shown escaped: a message is always one line."""
    return "".join(char if char.isprintable() else repr(char)[1:-1] for char in str(text))


def script_blocks(source):
    """(title, code) of each block the script marks for the notebook."""
    blocks = [(m["title"].strip(), m["code"].strip("\n")) for m in _BLOCK.finditer(source)]
    if not blocks:
        raise BuildError(f"{SCRIPT.name} has no '# >>> notebook' block")
    return blocks


def split_at_definitions(code, max_lines=MAX_CELL_LINES):
    """Split a block into pieces of at most ``max_lines`` lines, between top-level statements.

    Comment lines just above a statement stay with it.  The pieces are roughly even; a single
    statement longer than ``max_lines`` stays whole.  Joined with newlines, the pieces give the
    block back, less the blank lines at the cuts.
    """
    lines = code.split("\n")
    if len(lines) <= max_lines:
        return [code]
    try:
        body = ast.parse(code).body
    except SyntaxError as error:
        raise BuildError(f"a notebook block of {SCRIPT.name} does not parse (line {error.lineno})") from None
    starts = []
    for node in body:
        start = min([node.lineno] + [decorator.lineno for decorator in getattr(node, "decorator_list", [])]) - 1
        while start > 0 and lines[start - 1].startswith("#"):
            start -= 1
        starts.append(start)
    pieces_wanted = -(-len(lines) // max_lines)
    target = -(-len(lines) // pieces_wanted)
    cuts, piece_start = [0], 0
    for start, end in zip(starts, starts[1:] + [len(lines)], strict=True):
        if start > piece_start and (end - piece_start > max_lines or start - piece_start >= target):
            cuts.append(start)
            piece_start = start
    cuts.append(len(lines))
    return ["\n".join(lines[begin:end]).strip("\n") for begin, end in zip(cuts[:-1], cuts[1:], strict=True)]


def _lines(text):
    return text.splitlines(keepends=True)


def markdown(cell_id, text):
    return {"cell_type": "markdown", "id": cell_id, "metadata": {}, "source": _lines(text)}


def code(cell_id, text, tags=()):
    metadata = {"tags": list(tags)} if tags else {}
    return {"cell_type": "code", "execution_count": None, "id": cell_id, "metadata": metadata, "outputs": [],
            "source": _lines(text)}  # fmt: skip


def build(source):
    """The notebook, as a dict, from the script's source text."""
    shared, steps = [], []
    for title, block in script_blocks(source):
        step = _STEP.match(title)
        if step is None:
            shared.append(block)
        else:
            if step["number"] not in STEPS:
                raise BuildError(f"{SCRIPT.name}: block {title!r} is a step with no run cell in {PROGRAM}")
            steps.append((step["number"], title, block))
    missing = sorted(set(STEPS) - {number for number, _, _ in steps})
    if missing:
        raise BuildError(f"{SCRIPT.name} has no notebook block for step(s) {', '.join(missing)}")
    cells = [markdown("introduction", INTRODUCTION), markdown("parameters-title", PARAMETERS_TEXT)]
    cells.append(code("parameters", PARAMETERS, tags=["parameters"]))
    cells.append(markdown("shared-title", SHARED_TEXT))
    pieces = [piece for block in shared for piece in split_at_definitions(block)]
    cells += [code(f"shared-code-{index}", piece) for index, piece in enumerate(pieces, 1)]
    for number, title, block in steps:
        text, run_id, run_code = STEPS[number]
        cells.append(markdown(f"step-{number}-title", f"## {title}\n\n{text}"))
        pieces = split_at_definitions(block)
        cells += [code(f"step-{number}-code-{index}", piece) for index, piece in enumerate(pieces, 1)]
        cells.append(code(run_id, run_code))
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


def read_bounded(path):
    """The bytes of a regular file of at most MAX_READ_BYTES; a FIFO or device is never read."""
    # Non-blocking, so that a FIFO cannot hang the open; binary, so that Windows translates nothing.
    try:
        handle = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_BINARY", 0))
    except FileNotFoundError:
        raise BuildError(f"{path.name} does not exist") from None
    except OSError as error:
        raise BuildError(f"{path.name} cannot be opened ({type(error).__name__})") from None
    try:
        if not stat.S_ISREG(os.fstat(handle).st_mode):
            raise BuildError(f"{path.name} is not a regular file")
        chunks, size = [], 0
        while size <= MAX_READ_BYTES:
            chunk = os.read(handle, MAX_READ_BYTES + 1 - size)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
    except OSError as error:
        raise BuildError(f"{path.name} cannot be read ({type(error).__name__})") from None
    finally:
        os.close(handle)
    data = b"".join(chunks)
    if len(data) > MAX_READ_BYTES:
        raise BuildError(f"{path.name} is larger than {MAX_READ_BYTES // 2**20} MiB")
    return data


def read_text(path):
    try:
        return read_bounded(path).decode("utf-8")
    except UnicodeDecodeError:
        raise BuildError(f"{path.name} is not UTF-8 text") from None


def read_notebook(path):
    """The notebook at ``path`` as a dict, checked enough to join its code cells."""
    text = read_text(path)
    try:
        notebook = json.loads(text)
    except json.JSONDecodeError as error:
        raise BuildError(f"{path.name} is not JSON (line {error.lineno} column {error.colno})") from None
    except (ValueError, RecursionError) as error:
        raise BuildError(f"{path.name} is not JSON ({type(error).__name__})") from None
    cells = notebook.get("cells") if isinstance(notebook, dict) else None
    if not isinstance(cells, list) or not all(
        isinstance(cell, dict)
        and isinstance(cell.get("source"), list)
        and all(isinstance(line, str) for line in cell["source"])
        for cell in cells
    ):
        raise BuildError(f"{path.name} is not a notebook this tool wrote (its cells or their sources)")
    return notebook


def write_atomically(path, text):
    """Replace ``path`` with ``text`` through a temporary file in its folder: never half-written."""
    data = text.encode("utf-8")
    try:
        mode = stat.S_IMODE(os.stat(path).st_mode)
    except OSError:
        mode = 0o644
    temporary = None
    try:
        handle, temporary = tempfile.mkstemp(prefix=".partial-", suffix=".tmp", dir=path.parent)
        with open(handle, "wb") as stream:
            stream.write(data)
            stream.flush()
            os.fsync(stream.fileno())
        os.chmod(temporary, mode)
        os.replace(temporary, path)
        temporary = None
    except OSError as error:
        raise BuildError(f"cannot write {path.name} ({type(error).__name__}); it is unchanged") from None
    finally:
        if temporary is not None:
            with contextlib.suppress(OSError):
                os.unlink(temporary)


class _StdoutUnwritable(BuildError):
    """Standard output is full or closed: one line, and status 1, as the kit's scripts give."""


def write_stdout(text):
    stream = sys.stdout
    if stream is None:  # started with stdout closed
        raise _StdoutUnwritable("standard output is closed")
    try:
        stream.write(text)
        stream.flush()
    except BrokenPipeError:
        raise _StdoutGone from None
    except (OSError, ValueError) as error:
        raise _StdoutUnwritable(f"cannot write to standard output ({type(error).__name__})") from None


class _Parser(argparse.ArgumentParser):
    """Usage errors become one line (BuildError) instead of usage text and exit 2."""

    def error(self, message):
        raise BuildError(_one_line(message))

    def print_help(self, file=None):
        write_stdout(self.format_help())


def build_parser():
    parser = _Parser(prog=PROGRAM, description=__doc__.split("\n\n")[0], allow_abbrev=False)
    what = parser.add_mutually_exclusive_group()
    what.add_argument("--check", action="store_true", help="exit 1 if the committed notebook is not up to date")
    what.add_argument("--print-code", action="store_true",
                      help="print the committed notebook's code cells as one Python script")  # fmt: skip
    return parser


def run(argv):
    args, extra = build_parser().parse_known_args(argv)
    if extra:
        raise BuildError(f"unrecognized argument(s): {', '.join(map(repr, extra))}")
    if args.print_code:
        write_stdout(code_cells_as_script(read_notebook(NOTEBOOK)))
        return 0
    expected = serialize(build(read_text(SCRIPT)))
    current = read_text(NOTEBOOK) if os.path.lexists(NOTEBOOK) else None
    if args.check:
        if current != expected:
            print(f"{PROGRAM}: {NOTEBOOK.name} is out of date with {SCRIPT.name}: "
                  "run python tools/build_notebook.py", file=sys.stderr)  # fmt: skip
            return 1
        return 0
    if current == expected:
        write_stdout(f"{NOTEBOOK.name} is up to date\n")
        return 0
    write_atomically(NOTEBOOK, expected)
    write_stdout(f"wrote {NOTEBOOK.name}\n")
    return 0


def main(argv=None) -> int:
    try:
        try:
            return run(argv)
        except BuildError as error:
            print(f"{PROGRAM}: error: {_one_line(error)}", file=sys.stderr)
            return 1 if isinstance(error, _StdoutUnwritable) else 2
        except _StdoutGone:
            return 1
    except KeyboardInterrupt:
        print(f"{PROGRAM}: interrupted; nothing was left half-written", file=sys.stderr)
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
