"""IteraGPU Lab v1: weight-memory estimate, environment diagnosis and phase-by-phase
GPU measurement of a small synthetic ``Linear -> GELU -> Linear`` network (README.md's quick start shows its use).

``estimate``, ``measure --plan`` and ``report`` need only Python >= 3.10 and its standard library.  ``environment`` and
``measure`` import PyTorch lazily; ``measure`` never falls back to the CPU.  Expected
failures print one line on stderr, with the exit status of README.md's table.

What only some commands need (PyTorch, matplotlib, and json, datetime, platform, stat, warnings, signal and
subprocess from the standard library) is imported in the function that uses it, once, here said for all: the
estimate starts quickly, and nothing but a measurement or a diagnosis loads PyTorch.

The blocks between ``# >>> notebook`` and ``# <<< notebook`` are copied verbatim into
``mesure-memoire.ipynb`` by ``tools/build_notebook.py``: edit them here, then rebuild.  A block
titled ``N. `` opens step N, ``N.2 ``, ``N.3 `` ... right after it continue that step, and the others
are the shared code before the steps (each block at most 200 lines, one concern).
"""

import sys  # first: a Ctrl-C from here on is one line (below), not a traceback; the notebook imports it below


def _interrupted_at_start(kind, error, traceback):
    """sys.excepthook until main() handles Ctrl-C itself: one line and 130 for a Ctrl-C during the imports."""
    if not issubclass(kind, KeyboardInterrupt):
        return sys.__excepthook__(kind, error, traceback)
    import os

    try:
        os.write(2, b"mesure_memoire.py: interrupted (Ctrl-C)\n")
    finally:  # a closed stderr too
        os._exit(130)


if __name__ == "__main__":
    sys.excepthook = _interrupted_at_start

# >>> notebook: Python version
import sys

# Below 3.10, one line says so.  (Python parses a whole file before running it: this one keeps to the
# grammar of 3.8, which a test checks, so that this line is what an older Python prints.)
if sys.version_info < (3, 10):  # noqa: UP036 -- the check is the point
    this_python = ".".join(map(str, sys.version_info[:3]))
    sys.stderr.write(f"mesure_memoire.py: error: Python 3.10 or later is needed; this is Python {this_python}\n")
    raise SystemExit(2)
# <<< notebook

import argparse  # noqa: E402, I001 -- after the version check; the command line only

# >>> notebook: Imports (PyTorch, matplotlib and json only where used: start-up), constants and the error type
import collections
import functools
import math
import os
import re  # argparse imports it anyway
import time
from decimal import ROUND_HALF_UP, Context, Decimal, localcontext

KIT_NAME = "iteragpu-lab-v1"
GIB_BYTES = 2**30  # binary gibibyte
GB_BYTES = 10**9  # decimal gigabyte
MIB_BYTES = 2**20
DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2}
PHASES = ("model_load", "inputs", "cold_forward", "warmup", "warm_forward")
# The weights as torch.nn.Sequential names them (index 1 is the GELU, which has no weights).
WEIGHT_TENSORS = ("0.weight", "0.bias", "2.weight", "2.bias")
NOT_INCLUDED_IN_ESTIMATE = (
    "activations",
    "KV cache",
    "quantization metadata",
    "gradients",
    "optimizer states",
    "libraries",
    "the CUDA/ROCm context",
)
DRIVER_NOTE = (  # the environment's last lines
    "The CUDA/HIP runtime built into PyTorch is not the driver: record the driver separately with the vendor tool.\n"
    "  NVIDIA nvidia-smi --query-gpu=name,driver_version --format=csv\n"
    "  AMD    amd-smi version"
)
# One number grammar for every option, calcul_forfaits.py's too (EPILOG states it).
MAX_DIGITS = 30  # bounds every product the kit computes
MAX_SEED = 2**64 - 1  # the largest seed torch.manual_seed accepts
MAX_DEVICE_DIGITS = 4
MAX_PASSES = 1000  # --warmup and --repeats each: a measurement is a short, bounded trial
PASSES_REASON = "a measurement is a short, bounded trial"
# measure and sweep refuse an older PyTorch (README: "PyTorch 2.4 or later"); the other commands need no gate.
OLDEST_TORCH = (2, 4)
PYTORCH_WARNINGS_FIELD = "pytorch_warnings"  # the field_errors key for warnings PyTorch raised
# Warnings PyTorch raised in this process: by the allow-list, one line each, no repeats.  PyTorch warns on its first
# import only: a second Run All of the notebook re-runs this cell, and must keep them.
PYTORCH_WARNINGS = globals().get("PYTORCH_WARNINGS", [])


class KitError(Exception):
    """An expected failure: one line for the user, and the exit status to use."""

    exit_code = 2


class Refused(KitError):
    """A measurement or sweep refused before its GPU work: the one place that its line ends by saying so."""

    def __init__(self, message):
        super().__init__(f"{message}; nothing measured, nothing written")


class MeasurementFailed(KitError):
    """The GPU work itself failed (out of memory, most often): nothing is written."""

    exit_code = 3


RUN_ON_THE_GPU_BOX = "run this on the GPU box, with a CUDA or ROCm build of PyTorch (measure --plan works here)"
SHOWN_BY_DEBUG = "text withheld; --debug or the notebook's DEBUG shows it"  # PyTorch's text, in a failure's line


# <<< notebook


# >>> notebook: Validation of what users give, exact arithmetic
def one_line(text):
    """``text`` on one line: newlines, tabs and other unprintable characters are escaped."""
    return "".join(char if char.isprintable() else repr(char)[1:-1] for char in str(text))


def quoted(value, limit=80):
    """An option's value for a message (a name: name_as_typed): its repr (quoted, escaped, one line), shortened."""
    text = repr(value)
    return text if len(text) <= limit else f"{text[: limit - 20]}...{text[-12:]} ({len(str(value))} characters)"


LONGEST_NAME = 4200  # whole up to PATH_MAX (4096 bytes) with room for escapes: any name a file can bear


def name_as_typed(name):
    """A name (a file's, a GPU's) for a message or a table: as typed when printable, else its repr (escaped, so the
    line stays one line; quoted, so outer spaces show). Whole, as the user needs it to find or fix the file;
    shortened only beyond LONGEST_NAME, which no file's name reaches."""
    if isinstance(name, str) and name and name.isprintable() and name.strip() == name and len(name) <= LONGEST_NAME:
        return name
    return quoted(name, LONGEST_NAME)


def is_whole_number_text(text):
    """True for "0" or ASCII digits not starting with 0, as the grammar writes a whole number (not str.isdigit's)."""
    return text.isascii() and text.isdigit() and (text == "0" or not text.startswith("0"))


def whole_number(option, value, minimum, maximum=10**MAX_DIGITS - 1, why=None):
    """``value`` as an int from ``minimum`` to ``maximum``; ``why``: the bounds' reason, in the refusal."""
    if isinstance(value, int) and not isinstance(value, bool):
        number = value
    elif isinstance(value, str) and len(value) <= MAX_DIGITS and is_whole_number_text(value):
        number = int(value)
    else:
        number = None
    if number is None or not minimum <= number <= maximum:
        if maximum < 10**MAX_DIGITS - 1:
            wanted = f"a whole number from {minimum} to {maximum} in ASCII digits, no leading zero"
        else:
            wanted = "a positive whole number" if minimum == 1 else f"a whole number >= {minimum}"
            wanted += f" of at most {MAX_DIGITS} ASCII digits, no leading zero"
        raise KitError(f"{option}: expected {wanted}{f' ({why})' if why else ''}, got {quoted(value)}")
    return number


def non_negative_decimal(option, value):
    """Return ``value`` as an exact Decimal >= 0, written as the number grammar says."""
    text = str(value) if isinstance(value, (str, int, float, Decimal)) and not isinstance(value, bool) else ""
    whole, point, fraction = text.partition(".")
    # A second point is not a digit.
    written = is_whole_number_text(whole) and (fraction.isascii() and fraction.isdigit() or not point)
    if not written or len(whole) > MAX_DIGITS or len(fraction) > MAX_DIGITS:
        raise KitError(
            f"{option}: expected a number >= 0 written with ASCII digits, no leading zero, and at most one "
            f"decimal point between digits (at most {MAX_DIGITS} digits on each side), got {quoted(value)}"
        )
    return Decimal(f"{whole}.{fraction or 0}")


def device_index(device):
    """Return N for a device written ``cuda:N``; anything else is refused."""
    number = device.removeprefix("cuda:") if isinstance(device, str) and device.startswith("cuda:") else ""
    if not (is_whole_number_text(number) and len(number) <= MAX_DEVICE_DIGITS):
        raise KitError(f"--device: expected cuda:N (for example cuda:0), got {quoted(device)}")
    return int(number)


def as_notebook_message(error):
    """A refusal as the notebook shows it: the option it starts with (``--reserve-gib``) named as the
    notebook's parameter (``RESERVE_GIB``), which is what its user typed."""
    return re.sub(r"^--([a-z]+(?:-[a-z]+)*)(?=:| \S+:)", lambda found: found[1].replace("-", "_").upper(), str(error))


def exact_context():
    """A decimal context wide enough that no accepted input is rounded (the default 28 digits would)."""
    return localcontext(Context(prec=200))


def decimal_ratio(numerator, denominator):
    """The quotient of two ints as an exact Decimal (a power of 2 or 10 divides exactly)."""
    with exact_context():
        return Decimal(numerator) / Decimal(denominator)


def rounded(number, places):
    """Round a Decimal half-up to ``places`` decimals."""
    with exact_context():
        return number.quantize(Decimal(1).scaleb(-places), rounding=ROUND_HALF_UP)


def in_units(value_bytes, unit_bytes=GIB_BYTES, places=2):
    """Bytes in GiB (or MiB), rounded half-up to ``places`` decimals: the figure alone."""
    return str(rounded(decimal_ratio(value_bytes, unit_bytes), places))


# <<< notebook


# >>> notebook: PyTorch's answers: its failures and its texts, each kept by an allow-list or checked by one table
ALLOCATOR_REFUSED = "PyTorch refused its allocator settings (its message is not kept: it may echo them)"


# How PyTorch words a refusal of its allocator settings (c10's allocator-config parsers), which echoes the
# text it was given; an out-of-memory message, which names PYTORCH_CUDA_ALLOC_CONF, is not one.
_ALLOCATOR_REFUSALS = ("cachingallocator option", "allocator config", "allocator option")


# The texts the kit keeps of PyTorch's messages and warnings, an allow-list: PyTorch's own wording (c10's CUDA
# checks, torch.cuda), and where a part varies, a narrow class that cannot hold a path, a URL or a setting's value
# (no / \\ ~ : =), since any message may quote what an environment variable holds.  Only the match is kept, never
# the rest.  cudaGetErrorString's words ("no CUDA-capable device is detected"), each whole: "https:" or
# "libcuda.so" is none.
_WORD = r"(?:CUDA|[a-z])[a-z-]*(?![^\s,;])"
_WORDS = rf"{_WORD}(?: {_WORD})*"
_STATUS = r"[A-Z][A-Z0-9_]{0,63}"
_GPU_NAME = r"[A-Za-z0-9][A-Za-z0-9 .()+-]{0,99}"
KNOWN_TEXTS = (
    r"(?:CUDA|HIP) out of memory\.(?: Tried to allocate [0-9]{1,9}(?:\.[0-9]{1,2})? [KMGTP]?i?B\.)?",
    rf"(?:CUDA error: )?CUBLAS_STATUS_{_STATUS}",
    rf"cuDNN error: CUDNN_STATUS_{_STATUS}",
    rf"(?:CUDA|HIP|CUDA driver) error: {_WORDS}",
    r"Torch not compiled with CUDA enabled",
    r"PyTorch was compiled without CUDA support",
    r"No CUDA GPUs are available",
    r"Found no NVIDIA driver on your system",
    r"The NVIDIA driver on your system is too old",
    r"invalid device ordinal",
    # Python's, for a file name the kit was given (which its refusal names already): no path in them.
    r"embedded null (?:character|byte)",
    r"'[a-z0-9-]{1,20}' codec can't (?:en|de)code (?:character|byte) '\\(?:x[0-9a-f]{2}|u[0-9a-f]{4}|U[0-9a-f]{8})'"
    r" in position [0-9]{1,9}(?:: [a-z0-9 ()]{1,40})?",
    # The warnings PyTorch 2.4 to 2.15 raises that hold no setting's value (CUDA's initialization, the GPU's
    # capability, NumPy, NVML); c10's check_env ("Ignoring invalid value for boolean flag NAME: VALUE"): the name.
    r"CUDA initialization: (?:The NVIDIA driver on your system is too old|Found no NVIDIA driver on your system"
    rf"|{_WORDS})",
    rf"Found GPU[0-9]{{1,4}} {_GPU_NAME} which is of (?:compute|cuda) capability \(CC\) [0-9]{{1,3}}\.[0-9]{{1,3}}\.",
    rf"{_GPU_NAME} with CUDA capability sm_[0-9]{{1,4}} is not compatible with the current PyTorch installation\.",
    r"PyTorch was compiled with an unknown compute capability [0-9]{1,3}\.[0-9]{1,3}\.",
    r"Failed to initialize NumPy",
    r"Can't initialize NVML",
    r"Can't get nvml device count",
    r"Ignoring invalid value for boolean flag [A-Z][A-Z0-9_]{0,63}(?=:)",
)


def kept_text(message, withheld="text withheld"):
    """The part of ``message``'s first non-empty line that KNOWN_TEXTS matches from its start, else ``withheld``."""
    lines = [line.strip() for line in message.splitlines() if line.strip()]
    for pattern in KNOWN_TEXTS if lines else ():
        found = re.match(pattern, lines[0])
        if found:
            return one_line(found[0])
    return withheld


# The texts PyTorch returns that the kit keeps, each with the form PyTorch 2.4 to 2.15 and their builds give it:
# any other (a path, a sentence, not text) is withheld, null with a line, and the run measured all the same.  Its
# numbers and flags are kept as it gives them: they can hold no path or setting's value.
_VERSION = r"[0-9]{1,9}(?:\.[0-9A-Za-z]{1,20}){0,5}(?:[+-][0-9A-Za-z][0-9A-Za-z.+_-]{0,63})?"  # 2.4.0a0+git1234abc
PYTORCH_TEXTS = {
    "torch": (_VERSION, "a version"),
    "cuda_build": (_VERSION, "a version"),
    "hip_build": (_VERSION, "a version"),
    # No GPU's name holds a path's character; were one there, where the path ends could not be told: withheld whole.
    "name": (r"[^/\\~]{1,100}", "printable text of at most 100 characters without /, \\ or ~"),
    "gcn_arch_name": (r"gfx[0-9a-z]{1,8}(?::[a-z0-9+-]{1,20}){0,4}", "an architecture's name"),  # gfx942:sramecc+
    "preferred_blas_library": (r"[A-Za-z]{1,20}", "a library's name"),
}


class WithheldText(ValueError):
    def __init__(self, name, expected):
        super().__init__(f"PyTorch's {name} is not {expected} (withheld)")


def pytorch_text(name, value):
    """PyTorch's text ``name`` as plain text when it has PYTORCH_TEXTS' form; None where PyTorch gives none."""
    pattern, expected = PYTORCH_TEXTS[name]
    if value is None:
        return None
    if isinstance(value, str) and value.isprintable() and re.fullmatch(pattern, value):
        return str(value)  # torch.__version__ is a str subclass
    raise WithheldText(name, expected)


def describe_error(exc, withheld="text withheld"):
    """An error as "Type: text", its text only what the kit allows (never an OS error's file names), else withheld."""
    CapturedPyTorch.note(exc)
    name = type(exc).__name__
    number = exc.errno if isinstance(exc, OSError) else None
    if isinstance(number, int) and number > 0:
        return f"{name}: [Errno {number}] {one_line(os.strerror(number))}"
    message = str(exc)
    if any(wording in message.lower() for wording in _ALLOCATOR_REFUSALS):
        return ALLOCATOR_REFUSED
    if isinstance(exc, WithheldText):
        return f"{name}: {one_line(message)}"
    kept = kept_text(message, None)
    if kept:
        return f"{name}: {kept}"
    return f"{name} ({withheld})" if message.strip() else name


def pytorch_failure(what, exc):
    """The refusal for ``exc``, raised in PyTorch by ``what`` before the measurement: one line."""
    return Refused(f"{what}: {describe_error(exc, SHOWN_BY_DEBUG)}")


def pytorch_call(what, function, failure=pytorch_failure, field_errors=None):
    """``function()``'s value; what PyTorch raises in it is raised as ``failure(what, error)``, or with no
    ``failure``, the value is None and the error's kept line goes in ``field_errors[what]`` (AttributeError: none)."""
    try:
        return function()
    except KitError:
        raise
    except Exception as exc:
        if failure is not None:
            raise failure(what, exc) from None
        if field_errors is not None and not isinstance(exc, AttributeError):
            field_errors[what] = describe_error(exc)
        return None


def note_pytorch_warnings(field_errors):
    """The warnings PyTorch raised in this process, on one line, in ``field_errors`` (none: nothing)."""
    if PYTORCH_WARNINGS:
        field_errors[PYTORCH_WARNINGS_FIELD] = " | ".join(PYTORCH_WARNINGS)


# <<< notebook


# >>> notebook: What PyTorch says: its warnings and its stderr, captured, kept by the same allow-list
def _to_stderr(text=""):
    """Write ``text`` on sys.stderr and flush it; a closed or missing stderr is not an error."""
    import contextlib

    with contextlib.suppress(AttributeError, OSError, ValueError):
        sys.stderr.write(text)
        sys.stderr.flush()


class CapturedPyTorch:
    """``with CapturedPyTorch(show):`` the warnings raised inside, and descriptor 2 (where PyTorch's C++ side writes:
    paths, settings' values) drained from a pipe, each kept by the allow-list in PYTORCH_WARNINGS, once each;
    ``show`` (--debug): what PyTorch wrote and each failure, whole, on the terminal."""

    current = None  # the capture under way, which describe_error tells of each failure

    def __init__(self, show):
        self.show, self.failures, self.text = show, [], ""

    def __enter__(self):
        import threading
        import warnings

        CapturedPyTorch.current = self
        self._catcher = warnings.catch_warnings(record=True)
        self._caught = self._catcher.__enter__()
        self._saved, self._chunks = None, []
        _to_stderr()  # what the kit wrote before stays the kit's
        try:
            read_end, write_end = os.pipe()
        except OSError:  # no descriptor left: nothing captured
            return self
        self._reader = threading.Thread(target=self._drain, args=(read_end,), daemon=True)
        self._reader.start()
        try:
            self._saved = os.dup(2)
            os.dup2(write_end, 2)
        except OSError:  # descriptor 2 closed: there is nothing to capture
            self._saved = None
        os.close(write_end)
        return self

    def _drain(self, read_end):
        while chunk := os.read(read_end, 2**16):
            self._chunks.append(chunk)
        os.close(read_end)

    def __exit__(self, *exc_info):
        CapturedPyTorch.current = None
        self._catcher.__exit__(*exc_info)
        if self._saved is not None:
            _to_stderr()  # what Python wrote meanwhile went to the pipe too
            os.dup2(self._saved, 2)  # the pipe's last write end closes: the thread reads to its end
            os.close(self._saved)
            self._reader.join(timeout=1)  # a process PyTorch started may hold the pipe open: not waited for
            self.text = b"".join(self._chunks).decode("utf-8", "replace")
        kept = [f"{caught.category.__name__}: {kept_text(str(caught.message))}" for caught in self._caught]
        kept += [f"stderr: {kept_text(line)}" for line in self.text.splitlines() if line.strip()]
        PYTORCH_WARNINGS.extend(line for line in dict.fromkeys(kept) if line not in PYTORCH_WARNINGS)
        if self.show:  # --debug: PyTorch's own text on the terminal, as it wrote it, then each failure's traceback
            import traceback

            parts = [f"--- what PyTorch wrote on stderr ---\n{self.text}"] if self.text else []
            for failure in self.failures:
                parts.append(f"--- {type(failure).__name__} raised in PyTorch ---\n")
                parts.append("".join(traceback.format_exception(type(failure), failure, failure.__traceback__)))
            _to_stderr("".join(parts))
        return False

    @classmethod
    def note(cls, failure):
        """Keep a PyTorch failure for --debug, where a capture that shows is under way."""
        if cls.current is not None and cls.current.show and failure not in cls.current.failures:
            cls.current.failures.append(failure)


# <<< notebook


# >>> notebook: 1. Weight-memory estimate (arithmetic only, no GPU)
def estimate_weights(parameters, bits, reserve_gib):
    """Weight bytes of ``parameters`` values on ``bits`` bits each (rounded up to whole bytes), plus a reserve."""
    parameters = whole_number("--parameters", parameters, 1)
    bits = whole_number("--bits", bits, 1)
    reserve = non_negative_decimal("--reserve-gib", reserve_gib)
    bytes_per_parameter = -(-bits // 8)  # ceil(bits / 8) with integers
    weight_bytes = parameters * bytes_per_parameter
    weight_gib = decimal_ratio(weight_bytes, GIB_BYTES)
    with exact_context():
        total_gib = weight_gib + reserve
    return {
        "parameters": parameters,
        "bits": bits,
        "bytes_per_parameter": bytes_per_parameter,
        "weight_bytes": weight_bytes,
        "weight_gib": weight_gib,
        "weight_gb": decimal_ratio(weight_bytes, GB_BYTES),
        "reserve_gib": reserve,
        "total_gib": total_gib,
        "not_included": list(NOT_INCLUDED_IN_ESTIMATE),
    }


def format_estimate(estimate):
    return "\n".join(
        [
            "Weight-memory estimate (arithmetic only, no GPU)",
            f"  parameters            {estimate['parameters']}",
            f"  storage width         {estimate['bits']} bits -> "
            f"{estimate['bytes_per_parameter']} byte{'s' * (estimate['bytes_per_parameter'] != 1)} per parameter "
            "(rounded up to whole bytes)",
            f"  weight bytes          {estimate['weight_bytes']}",
            f"  weights               {rounded(estimate['weight_gib'], 2)} GiB (2**30 bytes) = "
            f"{rounded(estimate['weight_gb'], 2)} GB (10**9 bytes)",
            f"  reserve (hypothesis)  {rounded(estimate['reserve_gib'], 2)} GiB, "
            "your assumption, not a measured reserve",
            f"  total                 {rounded(estimate['total_gib'], 2)} GiB",
            "Bytes are exact integers; GiB and GB are rounded half-up to 2 decimals.",
            "Not included: " + ", ".join(estimate["not_included"]) + ".",
            "This does not predict whether a real model fits a card.",
        ]
    )


# <<< notebook


# >>> notebook: 2. Environment diagnosis (degrades field by field, never fails whole)
def import_torch():
    """(torch, None), or (None, why): not importable, or not PyTorch (an empty torch/ folder imports).  Called
    inside a CapturedPyTorch, which keeps what PyTorch writes while it loads (its own paths) from the terminal."""
    import contextlib
    import io

    try:
        # What it prints on stdout goes nowhere: stdout carries the kit's output (environment --json's JSON).
        with contextlib.redirect_stdout(io.StringIO()):
            import torch

            pytorch = all(hasattr(torch, name) for name in ("cuda", "backends", "version"))
    except Exception as exc:  # ImportError, or OSError from a missing shared library
        # Its message may quote an environment variable's value (TORCH_LOGS) or a path: not recorded.
        CapturedPyTorch.note(exc)
        return None, f'{type(exc).__name__} at import; --debug (or python -c "import torch") shows PyTorch\'s message'
    if not pytorch:
        return None, "the module named torch is not PyTorch (it lacks torch.cuda, torch.backends or torch.version)"
    return torch, None


def refuse_old_torch(version):
    """Refuse a PyTorch older than OLDEST_TORCH; only the leading digits count ("2.4.0a0+git…" is 2.4)."""
    found = re.match(r"([0-9]{1,9})\.([0-9]{1,9})", version) if isinstance(version, str) else None
    if found and tuple(map(int, found.groups())) < OLDEST_TORCH:
        raise Refused(
            f"PyTorch {'.'.join(map(str, OLDEST_TORCH))} or later is needed to measure; this is PyTorch "
            f"{quoted(version)}"
        )


def collect_environment(device, debug):
    """What this process sees; each failed query is null and a line in ``field_errors``."""
    index = device_index(device)
    with CapturedPyTorch(debug):
        environment = environment_of(device, index)
    note_pytorch_warnings(environment["field_errors"])
    return environment


def environment_of(device, index):
    """collect_environment's, for a device already read (``index``: its N)."""
    environment = _empty_environment(device)
    query = functools.partial(pytorch_call, failure=None, field_errors=environment["field_errors"])
    torch, environment["torch_error"] = import_torch()
    if torch is None:
        environment["gpu_unavailable_reason"] = "PyTorch is not importable"
        return environment
    environment["torch"] = query("torch", lambda: pytorch_text("torch", torch.__version__))
    environment["settings"] = _read_settings(torch, query)
    environment["cuda_build"] = query("cuda_build", lambda: pytorch_text("cuda_build", torch.version.cuda))
    environment["hip_build"] = query("hip_build", lambda: pytorch_text("hip_build", torch.version.hip))
    # None in a build without cuDNN or MIOpen
    environment["cudnn_or_miopen_version"] = query("cudnn_or_miopen_version", lambda: torch.backends.cudnn.version())
    available = query("cuda_available", lambda: bool(torch.cuda.is_available()))
    count = environment["device_count"] = query("device_count", lambda: torch.cuda.device_count())
    if not available:
        if environment["cuda_build"] is None and environment["hip_build"] is None:
            reason = "this PyTorch build has no CUDA or ROCm support"
        else:
            reason = "torch.cuda.is_available() is False (no GPU visible, or driver/runtime problem)"
        environment["gpu_unavailable_reason"] = reason
        return environment
    if count is None or index >= count:
        environment["gpu_unavailable_reason"] = f"{device} is out of range: PyTorch sees {count} device(s)"
        return environment
    properties = query("properties", lambda: torch.cuda.get_device_properties(index))
    if properties is None:
        environment["gpu_unavailable_reason"] = f"the properties of {device} cannot be read"
        return environment
    environment["gpu_available"] = True
    environment["gpu"] = _gpu_fields(torch, query, index, properties, environment["hip_build"])
    backend = environment["gpu"]["allocator_backend"]
    environment["allocator_settings"] = query("allocator_settings", lambda: allocator_settings(torch, backend))
    for name in ("cublas_workspace_size", "cublaslt_workspace_size"):  # PyTorch >= 2.13 has them (2.11, 2.12 not)
        environment["settings"][f"{name}_bytes"] = query(name, lambda name=name: _workspace_size(torch, index, name))
    return environment


def _empty_environment(device):
    """The environment's fields before PyTorch is asked anything: Python and the OS only."""
    import platform

    return {
        "python": {"version": platform.python_version(), "implementation": platform.python_implementation()},
        "os": {"name": platform.system(), "release": platform.release(), "machine": platform.machine()},
        "torch": None,
        "torch_error": None,
        "cuda_build": None,
        "hip_build": None,
        "cudnn_or_miopen_version": None,
        "device": device,
        "device_count": None,
        "gpu_available": False,
        "gpu_unavailable_reason": None,
        "gpu": None,
        "settings": {},
        "allocator_settings": None,
        "field_errors": {},
    }


def _read_settings(torch, query):
    """The settings that change the figures, read from PyTorch's API (never from environment variables)."""
    matmul = torch.backends.cuda.matmul
    precision = "float32_matmul_precision"
    settings = {precision: query(precision, lambda: torch.get_float32_matmul_precision())}
    settings["cuda_matmul_allow_tf32"] = query("cuda_matmul_allow_tf32", lambda: bool(matmul.allow_tf32))
    for flag in ("allow_fp16_reduced_precision_reduction", "allow_bf16_reduced_precision_reduction"):
        settings[f"cuda_matmul_{flag}"] = query(f"cuda_matmul_{flag}", lambda flag=flag: bool(getattr(matmul, flag)))
    settings["preferred_blas_library"] = query("preferred_blas_library", lambda: _blas_library(torch))
    return {**settings, "cublas_workspace_size_bytes": None, "cublaslt_workspace_size_bytes": None}


# <<< notebook


# >>> notebook: 2.2 The GPU's fields and allocator settings PyTorch gives, checked, and the environment's text
# roundup_power2_divisions has one count per power-of-two interval from 1 MiB: each interval's MiB
ALLOCATOR_INTERVAL_KEYS = tuple(str(2**index) for index in range(16))
DEFAULT_ALLOCATOR = {
    "backend": "native",
    "max_split_size_bytes": None,
    "expandable_segments": False,
    "roundup_power2_divisions": {},
}


def _blas_library(torch):
    """The preferred BLAS library's name ("Cublas", "Cublaslt", "Ck", ...): the last part of its enum's text."""
    return pytorch_text("preferred_blas_library", str(torch.backends.cuda.preferred_blas_library()).split(".")[-1])


def allocator_settings(torch, backend):
    """The allocator's settings as PyTorch parsed them, never as text; None where it cannot tell."""
    if backend != "native":  # the cudaMallocAsync backend refuses the snapshot
        return None
    # torch.cuda.memory._snapshot() has them parsed (PyTorch 2.4 on), beside their text, which is not read.
    recorded = torch.cuda.memory._snapshot()["allocator_settings"]
    limit = int(recorded["max_split_size"])  # SIZE_MAX, read as int64, is -1: no limit
    return {
        "backend": backend,
        "max_split_size_bytes": None if limit < 0 else limit,
        "expandable_segments": bool(recorded["expandable_segments"]),
        "roundup_power2_divisions": {
            str(2**index): int(count)
            for index, count in enumerate(recorded["roundup_power2_divisions"].values())
            if int(count) > 1
        },
    }


def allocator_differences(allocator):
    """The allocator settings that differ from PyTorch's defaults, each as "name value"."""
    return [f"{key} {quoted(value)}" for key, value in allocator.items() if value != DEFAULT_ALLOCATOR[key]]


def allocator_settings_text(allocator):
    if allocator is None:
        return "unknown (allocated bytes not checked)"
    return ", ".join(allocator_differences(allocator)) or "PyTorch's defaults"


def _gpu_fields(torch, query, index, properties, hip_build):
    """The chosen GPU as the runtime announces it (no UUID, no serial number)."""
    free_bytes, total_bytes = query("mem_get_info", lambda: torch.cuda.mem_get_info(index)) or (None, None)
    arch = "gcn_arch_name"
    return {
        "name": query("name", lambda: pytorch_text("name", properties.name)),
        "compute_capability": f"{properties.major}.{properties.minor}",
        arch: query(arch, lambda: pytorch_text(arch, properties.gcnArchName)) if hip_build else None,
        "multi_processor_count": properties.multi_processor_count,
        "total_memory_bytes": properties.total_memory,
        "mem_get_info_free_bytes": free_bytes,
        "mem_get_info_total_bytes": total_bytes,
        "allocator_backend": query("allocator_backend", lambda: torch.cuda.memory.get_allocator_backend()),
    }


def _workspace_size(torch, index, name):
    """torch.backends.cuda's ``name`` (an AttributeError where this PyTorch lacks it: null, no line)."""
    function = getattr(torch.backends.cuda, name)
    with torch.cuda.device(index):  # the default workspace size depends on the current device
        return function()


def format_environment(environment):
    def or_missing(value, missing="none"):
        return missing if value is None else str(value)

    python, system, gpu = environment["python"], environment["os"], environment["gpu"]
    lines = [
        "Environment diagnosis (this process only)",
        f"  Python                {python['version']} ({python['implementation']})",
        f"  OS                    {system['name']} {system['release']} {system['machine']}",
        "  PyTorch               " + or_missing(environment["torch"], f"not importable ({environment['torch_error']})"),
        f"  CUDA build            {or_missing(environment['cuda_build'])}",
        f"  HIP build             {or_missing(environment['hip_build'])}",
        f"  cuDNN/MIOpen          {or_missing(environment['cudnn_or_miopen_version'])}",
        f"  device                {environment['device']} "
        f"(PyTorch sees {or_missing(environment['device_count'], 'no')} device(s))",
    ]
    if gpu is None:
        lines.append(f"  GPU usable            no: {environment['gpu_unavailable_reason']}")
    else:
        memory_bytes, arch = gpu["total_memory_bytes"], gpu["gcn_arch_name"]
        lines += [
            "  GPU usable            yes",
            f"  GPU name              {or_missing(gpu['name'], 'unknown')}",
            f"  compute capability    {gpu['compute_capability']}" + (f" ({arch})" if arch else ""),
            f"  memory (runtime)      {memory_bytes} bytes = {in_units(memory_bytes)} GiB",
            f"  mem_get_info          free {or_missing(gpu['mem_get_info_free_bytes'])} "
            f"/ total {or_missing(gpu['mem_get_info_total_bytes'])} bytes",
            f"  allocator backend     {or_missing(gpu['allocator_backend'], 'unknown')}",
            f"  allocator settings    {allocator_settings_text(environment['allocator_settings'])}",
        ]
    lines += [
        f"  setting               {key} = {value}"
        for key, value in environment["settings"].items()
        if value is not None
    ]
    for name, error in sorted(environment["field_errors"].items()):
        label = "PyTorch warned" if name == PYTORCH_WARNINGS_FIELD else "query failed"
        lines.append(f"  {label:<21} {name}: {error}")
    lines.append(DRIVER_NOTE)
    return "\n".join(lines)


# <<< notebook


# >>> notebook: The result's format, declared once: measure writes it, report checks it, the tables show it
# The result's format: report reads this version only (a change of what measure writes changes it).
RESULT_SCHEMA_VERSION = 8
MAX_NAME_CHARACTERS = 256  # a GPU name, a PyTorch or build version: CUDA's device names are shorter


def _count_or_none(value):
    """A whole number the kit could have written (0 <= value < 10**MAX_DIGITS), else None."""
    ok = isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 10**MAX_DIGITS
    return value if ok else None


class NullOr:
    """A part of RESULT_FORMAT that may also be null."""

    def __init__(self, description):
        self.description = description


def _one_cold_some_warm(phases):
    names = [line["phase"] for line in phases]
    return names.count("cold_forward") == 1 and "warm_forward" in names


def _is_time(value):  # NaN compares false
    return value is None or type(value) in (int, float) and 0 <= value < 10**MAX_DIGITS


# The rules a field is checked by: (check, what it must be).
COUNT_FIELD = (lambda value: _count_or_none(value) is not None, f"a whole number >= 0 of at most {MAX_DIGITS} digits")
POSITIVE_FIELD = (lambda value: bool(_count_or_none(value)), f"a whole number > 0 of at most {MAX_DIGITS} digits")
NAME_FIELD = (
    lambda value: value is None or isinstance(value, str) and len(value) <= MAX_NAME_CHARACTERS,
    f"null or text of at most {MAX_NAME_CHARACTERS} characters",
)
LIST_FIELD = (lambda value: isinstance(value, list), "a list")
# A phase line as measure writes it, field by field in order: the rule report checks it by (None: report does
# not read it); its column in the phase table (None: not shown); whether report shows its maximum over the
# phases (under the same column); the torch.cuda counter it reads (at the phase's baseline for a baseline_
# field, else at its end).  The tables show a field by its unit: bytes in MiB, times in ms.
PhaseField = collections.namedtuple(
    "PhaseField", ("rule", "column", "report", "counter"), defaults=(None, None, False, None)
)
PHASE_FIELDS = {
    "phase": PhaseField((lambda value: isinstance(value, str) and value in PHASES, "one of " + ", ".join(PHASES))),
    "nanoseconds": PhaseField(COUNT_FIELD, "ms"),
    "device_ms": PhaseField((_is_time, "null or a time >= 0"), "device ms"),
    "baseline_allocated_bytes": PhaseField(counter="memory_allocated"),
    "baseline_reserved_bytes": PhaseField(counter="memory_reserved"),
    "end_allocated_bytes": PhaseField(column="end alloc MiB", counter="memory_allocated"),
    "end_reserved_bytes": PhaseField(counter="memory_reserved"),
    "peak_allocated_bytes": PhaseField(COUNT_FIELD, "peak alloc MiB", True, "max_memory_allocated"),
    "peak_reserved_bytes": PhaseField(COUNT_FIELD, "peak reserved MiB", True, "max_memory_reserved"),
    "baseline_requested_bytes": PhaseField(),
    "end_requested_bytes": PhaseField(),
    "peak_requested_bytes": PhaseField(),
}
REPORTED_PEAKS = {name: field.column for name, field in PHASE_FIELDS.items() if field.report}


def shown_figure(name, value):
    """A field as the tables show it, by the unit its name ends with: bytes in MiB, times in ms (3 places)."""
    if value is None:
        return "n/a"
    if name.endswith("_bytes"):
        return in_units(value, MIB_BYTES)
    if name == "nanoseconds":
        return str(rounded(decimal_ratio(value, 10**6), 3))
    return f"{value:.3f}"


# What report reads of a result, each field with its rule: an object is a dict of its fields, a list of lines
# [its line's description, the rule of the whole list].  What report does not read is not described.
RESULT_FORMAT = {
    "kit": (lambda value: value == KIT_NAME, repr(KIT_NAME)),
    "schema_version": (
        lambda value: _count_or_none(value) == RESULT_SCHEMA_VERSION,
        f"{RESULT_SCHEMA_VERSION}, this kit's (measure again with this kit)",
    ),
    "environment": {
        "gpu": NullOr({"name": NAME_FIELD}),
        "torch": NAME_FIELD,
        "cuda_build": NAME_FIELD,
        "hip_build": NAME_FIELD,
        "allocator_settings": (
            lambda value: value is None or _as_measure_writes(value),
            "null or the allocator settings measure writes",
        ),
    },
    "configuration": {
        "batch": POSITIVE_FIELD,
        "context": POSITIVE_FIELD,
        "width": POSITIVE_FIELD,
        "dtype": (lambda value: isinstance(value, str) and value in DTYPE_BYTES, "one of " + ", ".join(DTYPE_BYTES)),
        "fresh_process_warning": (lambda value: value is None or isinstance(value, str), "null or text"),
    },
    "synthetic_model": {"parameters": COUNT_FIELD},
    "phases": [
        {name: field.rule for name, field in PHASE_FIELDS.items() if field.rule},
        (_one_cold_some_warm, "one cold_forward line and at least one warm_forward line"),
    ],
    "prediction_check": {"disagreements": LIST_FIELD, "not_checked": LIST_FIELD},
    "output_summary": {"all_finite": (lambda value: isinstance(value, bool), "true or false")},
    "sustained": NullOr(
        {
            "sustained_seconds": POSITIVE_FIELD,
            "steady_ms_per_forward": (lambda value: value is not None and _is_time(value), "a time >= 0"),
            "steady": (lambda value: value is None or isinstance(value, bool), "null, true or false"),
            "ratio_to_warm_median": (_is_time, "null or a ratio >= 0"),
        }
    ),
}
_MISSING = object()  # a field the file does not hold


def _first_wrong(value, description, field=""):
    """The first part of ``value`` that ``description`` refuses, as (field, value, what); None when all hold."""
    nullable = isinstance(description, NullOr)
    if nullable:
        if value is None:
            return None
        description = description.description
    if isinstance(description, dict):
        if not isinstance(value, dict):
            return field, value, "null or an object" if nullable else "an object"
        for key, part in description.items():
            wrong = _first_wrong(value.get(key, _MISSING), part, f"{field}.{key}" if field else key)
            if wrong:
                return wrong
        return None
    if isinstance(description, list):
        line, (check, what) = description
        if not isinstance(value, list):
            return field, value, "a list"
        for index, item in enumerate(value):
            wrong = _first_wrong(item, line, f"{field}[{index}]")
            if wrong:
                return wrong
        return None if check(value) else (field, value, what)
    check, what = description
    return None if value is not _MISSING and check(value) else (field, value, what)


def _median(values):
    """The median of ints or Decimals, exactly (the mean of the two middle values for an even count)."""
    ordered = sorted(values)
    middle = len(ordered) // 2
    if len(ordered) % 2:
        return Decimal(ordered[middle])
    with exact_context():
        return (Decimal(ordered[middle - 1]) + Decimal(ordered[middle])) / 2


def warm_spread(phases):
    """The warm repetitions' wall times in ms, exactly: minimum, median, maximum, and the drift (the last third's
    median over the first third's, less 1; None below three repetitions or after a zero time)."""
    times = [line["nanoseconds"] for line in phases if line["phase"] == "warm_forward"]
    third = len(times) // 3
    first = _median(times[:third]) if third else 0
    with exact_context():
        return {
            "warm_min_ms": Decimal(min(times)) / 10**6,
            "warm_median_ms": _median(times) / 10**6,
            "warm_max_ms": Decimal(max(times)) / 10**6,
            "warm_drift": _median(times[-third:]) / first - 1 if first else None,
        }


def _device_median_ms(warm):
    """The median of the warm lines' ``device_ms``, or None where any is null."""
    values = [phase["device_ms"] for phase in warm]  # RESULT_FORMAT checked each: null or a time
    if any(value is None for value in values):
        return None
    # repr, not float(): an int keeps its digits (a float has 17); abs() writes a crafted -0.0 as 0.
    return _median([abs(Decimal(repr(value))) for value in values])


def _shown(value):
    """A wrong value as a message shows it: an object or a list by its kind only, anything else bounded."""
    if value is _MISSING:
        return "nothing"
    return {dict: "an object", list: "a list"}.get(type(value)) or quoted(value)


# <<< notebook


# >>> notebook: Child processes: SIGINT and SIGTERM held while one starts (sweep's)
def let_signals_through(held):
    """The mask start_child found, back: a signal that landed meanwhile is raised now (None: Windows)."""
    import signal

    if held is not None:
        signal.pthread_sigmask(signal.SIG_SETMASK, held)


def start_child(command, **options):
    """(Popen(command, **options), the mask to let through), SIGINT and SIGTERM held until Popen returns: one
    landing between fork and exec would leave the child without its parent's clean-up."""
    import signal
    import subprocess

    held = None
    if hasattr(signal, "pthread_sigmask"):  # not on Windows
        held = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
    try:
        return subprocess.Popen(command, **options), held
    except BaseException:
        let_signals_through(held)
        raise


# <<< notebook


# >>> notebook: The sustained run and the card's state (measure --sustained-s)
SUSTAINED_MAX_S = 600  # minutes bring a card to its power and thermal steady state; a trial stays bounded
SUSTAINED_REASON = "a sustained run is a bounded trial too"
WINDOW_NS = 10**9  # a window: about a second of forwards at the warm repetitions' pace
# Steady: each of the last half's windows within 2 % of their median; a capped clock swings by more.
STEADY_TOLERANCE = Decimal("0.02")
VENDOR_TOOL = "nvidia-smi"  # found by the OS's search of PATH, the one environment variable the kit lets it read
VENDOR_TIMEOUT_S = 10  # a hung vendor tool is killed: the reading is null, the run goes on
CARD_FIELDS = {
    "sm_clock_mhz": "clocks.sm",
    "max_sm_clock_mhz": "clocks.max.sm",
    "power_draw_w": "power.draw",
    "power_limit_w": "power.limit",
    "temperature_c": "temperature.gpu",
    "clock_event_reasons": "clocks_event_reasons.active",
}
CLOCK_EVENT_REASONS = (
    "gpu_idle",
    "applications_clocks_setting",
    "sw_power_cap",
    "hw_slowdown",
    "sync_boost",
    "sw_thermal_slowdown",
    "hw_thermal_slowdown",
    "hw_power_brake_slowdown",
    "display_clock_setting",
)  # bit 0 upwards, as nvidia-smi --help-query-gpu lists them


def _card_value(name, text):
    """One field of the vendor tool's line: a number (the reasons as their names), None for [N/A] or odd text."""
    if name == "clock_event_reasons":
        bits = int(text, 16) if re.fullmatch(r"0x[0-9A-Fa-f]{1,16}", text) else None
        return None if bits is None else [reason for bit, reason in enumerate(CLOCK_EVENT_REASONS) if bits >> bit & 1]
    if name.endswith("_w"):  # watts, to two decimals; the others whole numbers
        return float(text) if re.fullmatch(r"[0-9]{1,9}(?:\.[0-9]{1,6})?", text) else None
    return int(text) if re.fullmatch(r"[0-9]{1,9}", text) else None


def read_card(tool_path, uuid):
    """The card's state from the vendor tool, as {"reading": {field: value}, "why_null": None}, or a null reading
    and why.  The GPU is matched by its UUID, which is neither kept nor shown."""
    import subprocess

    query = ",".join(("uuid", *CARD_FIELDS.values()))
    command = [tool_path, f"--query-gpu={query}", "--format=csv,noheader,nounits"]
    try:  # run() kills the tool on a timeout or a Ctrl-C
        done = subprocess.run(command, stdin=subprocess.DEVNULL, capture_output=True, timeout=VENDOR_TIMEOUT_S)
    except OSError as error:
        return {"reading": None, "why_null": f"{VENDOR_TOOL} could not start: {describe_error(error)}"}
    except subprocess.TimeoutExpired:
        return {"reading": None, "why_null": f"{VENDOR_TOOL} did not answer within {VENDOR_TIMEOUT_S} s"}
    if done.returncode:
        return {"reading": None, "why_null": f"{VENDOR_TOOL} exited with status {done.returncode}"}
    for line in done.stdout.decode("utf-8", "replace").splitlines():
        texts = [text.strip() for text in line.split(",")]
        if len(texts) == 1 + len(CARD_FIELDS) and texts[0].removeprefix("GPU-") == str(uuid):
            reading = {name: _card_value(name, text) for name, text in zip(CARD_FIELDS, texts[1:], strict=True)}
            return {"reading": reading, "why_null": None}
    return {"reading": None, "why_null": f"no GPU {VENDOR_TOOL} lists is the one PyTorch measured"}


def card_reader(cuda, index):
    """A function that reads the card's state (read_card), or says why it cannot."""
    import shutil

    tool_path = shutil.which(VENDOR_TOOL)
    if tool_path is None:
        return lambda: {"reading": None, "why_null": f"no {VENDOR_TOOL} on PATH"}
    uuid = pytorch_call("uuid", lambda: cuda.get_device_properties(index).uuid, failure=None)
    if uuid is None:
        return lambda: {"reading": None, "why_null": "PyTorch gave no UUID to match the card by"}
    return lambda: read_card(tool_path, uuid)


def sustained_run(cuda, device, forward, records, seconds, read_card_state, clock=time.perf_counter_ns):
    """(the sustained section, the card's state in its last window); (None, None) unless ``seconds``.  No
    synchronization between windows (CUDA events only), so that the queue never drains."""
    import threading

    if not seconds:
        return None, None
    warm = [line for line in records if line["phase"] == "warm_forward"]
    per_window = max(1, int(WINDOW_NS // max(_median([line["nanoseconds"] for line in warm]), 1)))
    stream = cuda.current_stream(device)
    card = {}
    reader = threading.Thread(target=lambda: card.update(read_card_state()), daemon=True)
    events = [cuda.Event(enable_timing=True)]
    events[0].record(stream)
    started_ns = last_ns = clock()
    while reader.ident is None:  # until the last window is launched
        now_ns = clock()
        if 2 * now_ns - last_ns - started_ns >= seconds * 10**9:  # elapsed + one more window's time
            reader.start()
        last_ns = now_ns
        for _ in range(per_window):
            forward()
        events.append(cuda.Event(enable_timing=True))
        events[-1].record(stream)
    cuda.synchronize(device)
    reader.join()
    window_ms = [start.elapsed_time(end) for start, end in zip(events[:-1], events[1:], strict=True)]
    return sustained_section({"sustained_seconds": seconds, "forwards_per_window": per_window}, window_ms, warm), card


def sustained_section(run, window_ms, warm):
    """The windows' time per forward, the steady value (the last half's median), whether steady (each
    within STEADY_TOLERANCE; None under three windows) and its ratio to the warm device median."""
    with exact_context():
        per_forward = [abs(Decimal(repr(ms))) / run["forwards_per_window"] for ms in window_ms]
        half = per_forward[len(per_forward) // 2 :]
        steady_ms = _median(half)
        warm_ms = _device_median_ms(warm)
        return {
            **run,
            "window_ms_per_forward": per_forward,
            "steady_ms_per_forward": steady_ms,
            "steady": None
            if len(half) < 3
            else all(abs(ms - steady_ms) <= STEADY_TOLERANCE * steady_ms for ms in half),
            "ratio_to_warm_median": steady_ms / warm_ms if warm_ms else None,
        }


# <<< notebook


# >>> notebook: 3. Phase-by-phase measurement (GPU only, no CPU fallback)
def measure_config(device, batch, context, width, dtype, warmup, repeats, seed, sustained_seconds=None):
    """Validate a measurement's parameters; returns them as a dict (device None: a plan for no device)."""
    if device is not None:
        device_index(device)
    if dtype not in DTYPE_BYTES:
        raise KitError(f"--dtype: expected one of {', '.join(DTYPE_BYTES)}, got {quoted(dtype)}")
    return {
        "device": device,
        "batch": whole_number("--batch", batch, 1),
        "context": whole_number("--context", context, 1),
        "width": whole_number("--width", width, 1),
        "dtype": dtype,
        "warmup": whole_number("--warmup", warmup, 0, MAX_PASSES, PASSES_REASON),
        "repeats": whole_number("--repeats", repeats, 1, MAX_PASSES, PASSES_REASON),
        "seed": whole_number("--seed", seed, 0, MAX_SEED),
        "sustained_seconds": None
        if sustained_seconds is None
        else whole_number("--sustained-s", sustained_seconds, 1, SUSTAINED_MAX_S, SUSTAINED_REASON),
    }


def synthetic_model(config):
    """Shapes and bytes of the synthetic MLP and its tensors, computed without PyTorch."""
    width, hidden = config["width"], 4 * config["width"]
    element_bytes = DTYPE_BYTES[config["dtype"]]
    shapes = dict(zip(WEIGHT_TENSORS, ([hidden, width], [hidden], [width, hidden], [width]), strict=True))
    tensors = [
        {"name": name, "shape": shape, "bytes": math.prod(shape) * element_bytes} for name, shape in shapes.items()
    ]
    io_shape = [config["batch"], config["context"], width]
    return {
        "architecture": f"Linear({width} -> {hidden}) -> GELU -> Linear({hidden} -> {width})",
        "hidden_width": hidden,
        "execution": "eval mode, torch.inference_mode, no autocast, no gradients, no optimizer",
        "parameters": sum(math.prod(shape) for shape in shapes.values()),
        "parameter_bytes": sum(tensor["bytes"] for tensor in tensors),
        "parameter_tensors": tensors,
        "input_shape": io_shape,
        "input_bytes": math.prod(io_shape) * element_bytes,  # and the output's: it has the input's shape
    }


def _phase_labels(config):
    """(phase, labels) for each phase line a measurement writes, in order (no warmup line when --warmup is 0)."""
    warmup = [("warmup", {"passes": config["warmup"]})] if config["warmup"] else []
    warm = [("warm_forward", {"repetition": repetition}) for repetition in range(1, config["repeats"] + 1)]
    return [("model_load", {}), ("inputs", {}), ("cold_forward", {}), *warmup, *warm]


def build_model(torch, width):
    """The synthetic MLP, built and initialized on the CPU in float32 (PyTorch's default)."""
    return torch.nn.Sequential(torch.nn.Linear(width, 4 * width), torch.nn.GELU(), torch.nn.Linear(4 * width, width))


# What the prediction assumes about PyTorch's CUDA caching allocator under its default settings (kMinBlockSize
# and kSmallSize, in c10/core/AllocatorConfig.h, as read in the headers of PyTorch 2.11, 2.13 and 2.15):
# every block is the request rounded up to 512 bytes; a block above 1 MiB comes from the large pool,
# which hands out a cached or new block whole when less than 1 MiB more would remain, so such a block
# may hold up to 1 MiB more than its rounded request.  Requested bytes need no assumption: PyTorch counts
# each request before it rounds it, under any setting of its native backend.
ALLOCATOR_ROUNDING_BYTES = 512
ALLOCATOR_SMALL_BLOCK_BYTES = 2**20  # the largest block of the small pool, and the large pool's slack
# An allowance for the BLAS workspaces that the first matrix product allocates and keeps: not a
# prediction (each run measures them), but room for the largest PyTorch default found in its source
# (ROCm gfx94x/gfx95x: a 128 MiB hipBLAS workspace plus a 76 MiB hipBLASLt one), rounded up.
BLAS_WORKSPACE_ALLOWANCE_BYTES = 256 * MIB_BYTES
# The fit check keeps this much of the free memory for what the allocator's counters never see:
# the cuBLAS/hipBLAS handles and the kernel code loaded at the first forward, and the allocator's
# segments, which reserve more than they allocate.
FIT_MARGIN_BYTES = GIB_BYTES
# The fit rule: a card of M bytes holds a run when M >= needs_free_bytes + this allowance, which stands for
# the CUDA/ROCm context that already takes part of the card's memory when measure reads the free memory.
CONTEXT_ALLOWANCE_BYTES = GIB_BYTES
PLAN_SCHEMA_VERSION = 1  # the plan's JSON is read by calcul_forfaits.py --for-plan
PREDICTED_COUNTERS = ("end_requested_bytes", "peak_requested_bytes", "end_allocated_bytes", "peak_allocated_bytes")
REQUESTED_COUNTERS = PREDICTED_COUNTERS[:2]


def allocated_block_bytes(requested_bytes):
    """The caching allocator's block for a request: rounded up to a multiple of 512 bytes (512 at least)."""
    return max(1, -(-requested_bytes // ALLOCATOR_ROUNDING_BYTES)) * ALLOCATOR_ROUNDING_BYTES


def _phase_events(name, workspaces=()):
    """The GPU tensors a phase allocates and releases, in order (``workspaces``: those taken per call, by name)."""
    if name == "model_load":
        # Module.to(device, dtype) converts each float32 CPU parameter on the CPU, then copies
        # it into one new GPU tensor of the requested dtype: nothing else is allocated on the GPU.
        return [("alloc", tensor) for tensor in WEIGHT_TENSORS]
    if name == "inputs":
        return [("alloc", "inputs")]  # randn fills a new tensor in place; the generator holds no GPU memory

    # Sequential runs Linear, GELU, Linear: the first Linear's output is still alive while GELU
    # writes its own, and is released when GELU returns; GELU's output is released when the
    # second Linear returns.  In inference mode nothing is kept for a backward pass.  A product that
    # takes a BLAS workspace per call holds it once its output exists.  A warm-up pass after the first
    # releases the previous pass's output before it starts: one pass stands for any count.
    def product(output, workspace):
        held = [("alloc", workspace), ("free", workspace)] if workspace in workspaces else []
        return [("alloc", output), *held]

    return [
        *product("fc1_output", "fc1_workspace"),
        ("alloc", "gelu_output"),
        ("free", "fc1_output"),
        *product("output", "fc2_workspace"),
        ("free", "gelu_output"),
    ]


def _held(names, tensor_bytes):
    """The requested and allocated bytes of the live tensors ``names``, and what their large blocks may add."""
    blocks = [allocated_block_bytes(tensor_bytes[name]) for name in names]
    large = sum(block > ALLOCATOR_SMALL_BLOCK_BYTES for block in blocks)
    return {
        "requested_bytes": sum(tensor_bytes[name] for name in names),
        "allocated_bytes": sum(blocks),
        "allocated_slack_bytes": large * ALLOCATOR_SMALL_BLOCK_BYTES,
    }


def _simulate(events, tensor_bytes):
    """End and peak (the most at any moment) of the requested and allocated bytes and the large blocks' slack."""
    live, peak = [], {}
    for action, tensor in events:
        if action == "free":
            live.remove(tensor)
            continue
        live.append(tensor)  # memory only rises when a tensor is allocated
        for key, value in _held(live, tensor_bytes).items():
            peak[key] = max(peak.get(key, 0), value)
    predicted = {f"end_{key}": value for key, value in _held(live, tensor_bytes).items()}
    predicted.update({f"peak_{key}": value for key, value in peak.items()})
    return predicted


# <<< notebook


# >>> notebook: 3.2 The plan: each phase's predicted memory, and its verdict on a card
def memory_plan(config, model=None):
    """Each phase's predicted allocator counters, from arithmetic alone, under PyTorch's default allocator settings."""
    model = model or synthetic_model(config)
    activation_bytes = config["batch"] * config["context"] * model["hidden_width"] * DTYPE_BYTES[config["dtype"]]
    tensor_bytes = {tensor["name"]: tensor["bytes"] for tensor in model["parameter_tensors"]}
    tensor_bytes.update(inputs=model["input_bytes"], output=model["input_bytes"])
    tensor_bytes.update(fc1_output=activation_bytes, gelu_output=activation_bytes)
    predicted = {name: _simulate(_phase_events(name), tensor_bytes) for name in PHASES}
    phases, level = [], 0  # level: the allocated bytes at the phase's baseline, from a fresh process
    for name, labels in _phase_labels(config):
        workspace_bytes = BLAS_WORKSPACE_ALLOWANCE_BYTES if name == "cold_forward" else 0
        # The level at the phase's peak, from a fresh process: what a card must hold at that moment.
        peak_level = level + workspace_bytes + predicted[name]["peak_allocated_bytes"]
        phases.append({"phase": name, **labels, **predicted[name], "predicted_peak_level_allocated_bytes": peak_level})
        level += workspace_bytes
        # Outputs are released when a phase ends: the next baseline holds weights, inputs, workspace.
        if name in ("model_load", "inputs"):
            level += predicted[name]["end_allocated_bytes"]
    # The first forward's level is the highest: the allowance counts from it on, and each later pass repeats it.
    peak = max(record["predicted_peak_level_allocated_bytes"] for record in phases)
    return {
        "kit": KIT_NAME,
        "plan_schema_version": PLAN_SCHEMA_VERSION,
        "configuration": dict(config),
        "tensor_bytes": tensor_bytes,
        "blas_workspace_allowance_bytes": BLAS_WORKSPACE_ALLOWANCE_BYTES,
        "phases": phases,
        "predicted_peak_allocated_bytes": peak,
        "fit_margin_bytes": FIT_MARGIN_BYTES,
        "needs_free_bytes": peak + FIT_MARGIN_BYTES,
        "context_allowance_bytes": CONTEXT_ALLOWANCE_BYTES,
        "needs_card_memory_bytes": peak + FIT_MARGIN_BYTES + CONTEXT_ALLOWANCE_BYTES,
        "needs_host_memory_bytes": model["parameters"] * DTYPE_BYTES["float32"],  # built on the CPU in float32
        "not_included": [
            "the CUDA/ROCm context",
            "the BLAS handles and kernel code, which the allocator's counters never see",
            "reserved memory above allocated (the allocator's segments)",
        ],
    }


def format_plan(plan):
    rows = [("phase", "end req MiB", "peak req MiB", "end alloc MiB", "peak alloc MiB")]
    for record in plan["phases"]:
        rows.append(
            (_phase_label(record), *(in_units(record[counter], MIB_BYTES, 3) for counter in PREDICTED_COUNTERS))
        )
    config = plan["configuration"]
    lines = [
        f"Plan for measure (arithmetic only, no GPU, nothing written): batch {config['batch']}, "
        f"context {config['context']}, width {config['width']}, {config['dtype']}",
        "Per phase, above the phase's baseline; requested bytes exact, allocated rounded to 512-byte blocks:",
        _table(rows),
        "BLAS workspace allowance on the first forward: "
        f"{in_units(plan['blas_workspace_allowance_bytes'], MIB_BYTES, 3)} MiB "
        "(the largest default of any backend; measure measures the workspace)",
        f"Predicted peak allocated: {plan['predicted_peak_allocated_bytes']} bytes = "
        f"{in_units(plan['predicted_peak_allocated_bytes'])} GiB, in cold_forward",
        f"measure needs {plan['needs_free_bytes']} bytes = {in_units(plan['needs_free_bytes'])} GiB free "
        f"(the peak plus a {in_units(plan['fit_margin_bytes'])} GiB margin); a card needs "
        f"{plan['needs_card_memory_bytes']} bytes = {in_units(plan['needs_card_memory_bytes'])} GiB "
        f"(including a {in_units(plan['context_allowance_bytes'])} GiB allowance for the CUDA/ROCm context).",
        f"Host memory: building the model on the CPU needs {plan['needs_host_memory_bytes']} bytes = "
        f"{in_units(plan['needs_host_memory_bytes'])} GiB of RAM (measure checks it).",
        "Not included: " + ", ".join(plan["not_included"]) + ".",
    ]
    return "\n".join(lines + [format_fit(plan)] if "fits" in plan else lines)  # with --memory-gib, its lines


# --plan --memory-gib: the verdict on a card, and the largest size per dimension that still fits there.
FIT_DIMENSIONS = ("batch", "context", "width")
FIT_NOTE = (
    "Fits: measure and sweep accept the run on an otherwise empty card of this memory whose free memory is "
    "its total less a context of at most the allowance, under PyTorch's default allocator settings; the plan "
    "counts no other process: a measurement on the card is the proof."
)


def holds_run(needs_card_memory_bytes, card_memory_bytes):
    """The fit rule (--plan --memory-gib, and calcul_forfaits.py's copy): a card holds the run when its memory
    covers what the plan says a card needs."""
    return needs_card_memory_bytes <= card_memory_bytes


def largest_that_fits(config, memory_bytes, dimension):
    """The largest value of ``dimension`` whose plan needs at most ``memory_bytes`` (None: not even 1),
    by halving the values the kit accepts: the plan grows with each dimension."""

    def fits(value):
        sized = {**config, dimension: value}
        return holds_run(memory_plan(sized)["needs_card_memory_bytes"], memory_bytes)

    if not fits(1):
        return None
    low, high = 1, 10**MAX_DIGITS  # the first value no option accepts
    while high - low > 1:  # low fits, high does not (or is beyond the accepted values)
        middle = (low + high) // 2
        if fits(middle):
            low = middle
        else:
            high = middle
    return low


def plan_with_fit(config, memory_gib=None):
    """The plan of a measurement; with a card's memory, also whether it fits there and the largest sizes that do."""
    plan = memory_plan(config)
    if memory_gib is None:
        return plan
    try:  # a decimal in the kit's number grammar, more than 0
        gib = non_negative_decimal("--memory-gib", memory_gib)
    except KitError:
        gib = 0
    if not gib:
        raise KitError(
            "--memory-gib: expected a card's memory in GiB, more than 0, written with ASCII digits and at most "
            f"one decimal point between digits (80, 0.5), got {quoted(memory_gib)}"
        )
    with exact_context():
        memory_bytes = int(gib * GIB_BYTES)  # rounded down to whole bytes
    return {
        **plan,
        "memory_gib": gib,
        "memory_bytes": memory_bytes,
        "fits": holds_run(plan["needs_card_memory_bytes"], memory_bytes),
        "largest": {dimension: largest_that_fits(config, memory_bytes, dimension) for dimension in FIT_DIMENSIONS},
        "fit_note": FIT_NOTE,
    }


def format_fit(plan):
    """The lines --plan --memory-gib adds to the plan's text."""
    needs, memory_bytes = plan["needs_card_memory_bytes"], plan["memory_bytes"]
    verdict = "fits" if plan["fits"] else f"does NOT fit ({needs - memory_bytes} bytes short)"
    largest = ", ".join(
        f"{dimension} {'none (even 1 does not fit)' if value is None else value}"
        for dimension, value in plan["largest"].items()
    )
    lines = [
        f"On a card of {plan['memory_gib']:f} GiB ({memory_bytes} bytes): {verdict}, "
        f"needing {needs} bytes ({in_units(needs)} GiB).",
        f"Largest that fits, each dimension alone with the others as given: {largest}.",
    ]
    return "\n".join(lines + [plan["fit_note"]] if plan["fits"] else lines)  # the note explains a fit only


# <<< notebook


# >>> notebook: 3.3 The protocol: each phase on the GPU, counted and timed
def _requested(stats, which):
    # "requested_bytes.*" is in memory_stats in PyTorch 2.11, 2.13 and 2.15 (as read); None where it is not.
    return stats.get(f"requested_bytes.all.{which}")


def run_phase(cuda, device, phase, work, clock=time.perf_counter_ns):
    """One phase; returns (record, output), the output kept referenced until the end readings."""

    def counters(baseline):  # PHASE_FIELDS' allocator counters, in its order
        return {
            name: getattr(cuda, field.counter)(device)
            for name, field in PHASE_FIELDS.items()
            if field.counter and name.startswith("baseline_") == baseline
        }

    cuda.synchronize(device)
    record = {"phase": phase, **counters(baseline=True)}
    baseline_stats = cuda.memory_stats(device)
    cuda.reset_peak_memory_stats(device)
    stream = cuda.current_stream(device)
    events = (cuda.Event(enable_timing=True), cuda.Event(enable_timing=True))
    started_ns = clock()
    events[0].record(stream)
    output = work()
    events[1].record(stream)
    cuda.synchronize(device)
    record["nanoseconds"] = clock() - started_ns
    record["device_ms"] = events[0].elapsed_time(events[1])
    record.update(counters(baseline=False))
    stats = cuda.memory_stats(device)
    record["baseline_requested_bytes"] = _requested(baseline_stats, "current")
    record["end_requested_bytes"] = _requested(stats, "current")
    record["peak_requested_bytes"] = _requested(stats, "peak")
    return {name: record[name] for name in PHASE_FIELDS}, output


class PhaseFailed(Exception):
    def __init__(self, phase, error):
        self.phase, self.error = phase, error


def measure_phases(torch, cuda, device, config, clock=time.perf_counter_ns):
    """Run the phases in order; returns (records, output summary, per-call workspace, timing: the sustained run
    and the card's state)."""
    dtype = getattr(torch, config["dtype"])
    records = []
    read_card_state = card_reader(cuda, device_index(config["device"]))

    def timed_phase(name, work, **labels):
        record, output = pytorch_call(name, lambda: run_phase(cuda, device, name, work, clock), PhaseFailed)
        records.append({**record, **labels})
        return output

    def load_model():
        return build_model(torch, config["width"]).to(device=device, dtype=dtype).eval()

    def make_inputs():
        generator = torch.Generator(device=device).manual_seed(config["seed"])
        shape = (config["batch"], config["context"], config["width"])
        return torch.randn(shape, generator=generator, device=device, dtype=dtype)

    def warmup_passes():
        for _ in range(config["warmup"]):
            output = None  # release the previous pass's output before the next pass
            output = model(inputs)
        return output  # the last output is alive at the end reading

    pytorch_call("seeding failed", lambda: torch.manual_seed(config["seed"]))  # the CPU initialization of the weights
    with torch.inference_mode():
        model = timed_phase("model_load", load_model)
        inputs = timed_phase("inputs", make_inputs)
        # Forward outputs are not kept: each is released when timed_phase() returns, except the
        # last, which is released only after its summary.
        timed_phase("cold_forward", lambda: model(inputs))
        card_before = read_card_state()  # the card's state before the warm-up, outside any timing
        if config["warmup"]:
            timed_phase("warmup", warmup_passes, passes=config["warmup"])
        for repetition in range(1, config["repeats"] + 1):
            output = None  # release the previous repetition's output before the next pass
            output = timed_phase("warm_forward", lambda: model(inputs), repetition=repetition)
        summary = pytorch_call("output_summary", lambda: summarize_output(torch, output), PhaseFailed)
        output = None  # the last output goes before the sustained run and the products run again
        seconds = config["sustained_seconds"]
        sustained, card_last = pytorch_call(
            "sustained",
            lambda: sustained_run(cuda, device, lambda: model(inputs), records, seconds, read_card_state, clock),
            PhaseFailed,
        )
        per_call = pytorch_call(
            "per_call_workspace", lambda: measure_per_call_workspace(cuda, device, model, inputs), PhaseFailed
        )
    card_state = {"before_warmup": card_before, "last_sustained_window": card_last}
    return records, summary, per_call, {"sustained": sustained, "card_state": card_state}


def measure_per_call_workspace(cuda, device, model, inputs):
    """Each matrix product once more, alone: the allocated and requested bytes its call took and gave back, its
    peak above its end.  A forward's BLAS workspaces are kept (per handle and stream: cold_forward's end shows
    them) or taken per call (PyTorch 2.4's cuBLASLt one), by release and backend: the kit assumes neither.
    Requested bytes are None where memory_stats lacks them."""
    taken, product_input = {}, inputs
    for product, layer in (("fc1", model[0]), ("fc2", model[2])):
        cuda.synchronize(device)
        cuda.reset_peak_memory_stats(device)
        output = layer(product_input)
        cuda.synchronize(device)
        allocated_bytes = cuda.max_memory_allocated(device) - cuda.memory_allocated(device)
        stats = cuda.memory_stats(device)
        peak, current = _requested(stats, "peak"), _requested(stats, "current")
        requested_bytes = None if peak is None or current is None else peak - current
        taken[product] = {"allocated_bytes": allocated_bytes, "requested_bytes": requested_bytes}
        if product == "fc1":
            product_input = model[1](output)  # fc2 takes GELU's output
        output = None  # released before the next product, whose peak above its end is read alone
    return taken


def summarize_output(torch, output):
    """All finite, a float64 checksum (null unless all finite) and the element count of an output."""
    finite = bool(torch.isfinite(output).all().item())
    checksum = float(output.to(torch.float64).sum().item()) if finite else None
    return {"all_finite": finite, "checksum_float64": checksum, "elements": int(output.numel())}


# <<< notebook


# >>> notebook: 3.4 The prediction check: the measured counters against the plan
def counters_checked(backend, allocator):
    """(the counters a verdict checks, why the others are not, or None): requested bytes under the native
    backend (counted before rounding); allocated bytes too under the default settings only."""
    if backend is None:
        return (), "PyTorch's allocator backend could not be read"
    if backend != "native":
        return (), f"the {backend} backend keeps no requested-bytes figure and rounds no block as the native one"
    if allocator is None:
        return REQUESTED_COUNTERS, "allocated bytes: PyTorch's allocator settings could not be read"
    differing = allocator_differences(allocator)
    if differing:
        return REQUESTED_COUNTERS, f"allocated bytes: settings other than PyTorch's defaults ({', '.join(differing)})"
    return PREDICTED_COUNTERS, None


def check_against_plan(records, plan, per_call=None, backend="native", allocator=DEFAULT_ALLOCATOR):
    """Each phase's record with the counters checked, its disagreements and verdict: (records, prediction_check,
    workspace).  The forwards are predicted with each product's ``per_call`` workspace held while it runs."""
    counters, reason = counters_checked(backend, allocator)
    sizes = {}
    for product, taken in (per_call or {}).items():
        # The request where PyTorch counts requests; else the block, which the model rounds to itself.
        size = taken["allocated_bytes"] if taken["requested_bytes"] is None else taken["requested_bytes"]
        if size:
            sizes[f"{product}_workspace"] = size
    tensor_bytes = {**plan["tensor_bytes"], **sizes}
    predicted = {name: _simulate(_phase_events(name, sizes), tensor_bytes) for name in PHASES}
    checked = [_checked_record(record, predicted[record["phase"]], counters, reason) for record in records]
    disagreements = [disagreement for record in checked for disagreement in record["disagreements"]]
    not_checked = [_phase_label(record) for record in checked if record["verdict"] == "not checked"]
    prediction_check = {
        "agrees": not disagreements and not not_checked,
        "disagreements": disagreements,
        "not_checked": not_checked,
    }
    # What the first forward leaves beyond its predicted output: the BLAS workspaces it keeps (null: not checked).
    cold = _above_baseline(next(record for record in records if record["phase"] == "cold_forward"), counters)
    kept = cold.get("end_allocated_bytes")
    workspace = {
        "measured_bytes": None if kept is None else kept - predicted["cold_forward"]["end_allocated_bytes"],
        "allowance_bytes": plan["blas_workspace_allowance_bytes"],
        "per_call": per_call,
    }
    return checked, prediction_check, workspace


def _above_baseline(record, counters):
    """The counters of one phase that PyTorch gave, above its baseline (baseline_KIND for end_KIND, peak_KIND)."""
    baselines = {counter: record.get("baseline_" + counter.split("_", 1)[1]) for counter in counters}
    return {counter: record[counter] - baseline for counter, baseline in baselines.items() if baseline is not None}


def _checked_record(record, predicted, counters, reason):
    """``record`` with its counters checked, a disagreement per counter out of range (the closer bound), its verdict."""
    measured = _above_baseline(record, counters)
    if len(measured) < len(counters):
        missing = "this PyTorch's memory_stats has no requested-bytes counters"
        reason = missing if reason is None else f"{reason}; {missing}"
    disagreements = []
    for counter, value in measured.items():
        low, high = _accepted_range(counter, record["phase"], predicted, measured)
        if low <= value and (high is None or value <= high):
            continue
        closest = low if value < low else high
        disagreements.append(
            {
                "phase": record["phase"],
                "repetition": record.get("repetition"),
                "counter": counter,
                "predicted_bytes": closest,
                "measured_bytes": value,
                "difference_bytes": value - closest,
                "relative_to": "the phase's baseline",
            }
        )
    return {
        **record,
        "checked_counters": list(measured),
        "disagreements": disagreements,
        "verdict": "disagrees" if disagreements else "agrees" if measured else "not checked",
        "not_checked_reason": reason,
    }


def _accepted_range(counter, phase, predicted, measured):
    """(low, high): the bounds a measured counter must lie within (high None: no upper bound).  A large block may
    hold up to its slack more.  The first forward keeps its BLAS workspaces: its end only has to hold at least
    the output, and its peak holds what its end holds beyond the output."""
    moment, kind = counter.split("_")[:2]  # e.g. peak_allocated_bytes
    low = high = predicted[counter]
    if kind == "allocated":
        high += predicted[f"{moment}_allocated_slack_bytes"]
    if phase != "cold_forward":
        return low, high
    if moment == "end":
        return low, None
    kept = measured[f"end_{kind}_bytes"] - predicted[f"end_{kind}_bytes"]
    if kind == "allocated":  # the output's block may hold its slack at the end, not at the peak
        low -= predicted["end_allocated_slack_bytes"]
    return low + kept, high + kept


# <<< notebook


# >>> notebook: 3.5 Result files: a new name, written whole or not at all
PARTIAL_FILE = (".partial-", ".tmp")  # a temporary file's name: this prefix, 16 hex digits, this suffix


class _Temporary:
    """A new hidden file in ``folder``, named before it exists so that a signal at any moment of its creation
    leaves nothing: created inside the try whose clean-up calls ``remove()``."""

    def __init__(self, folder):
        prefix, suffix = PARTIAL_FILE
        self.path = os.path.join(folder, f"{prefix}{os.urandom(8).hex()}{suffix}")
        self.ours = True

    def open(self):
        try:
            # Exclusively (never an existing file), with the umask's mode: its descriptor.
            return os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0), 0o666)
        except FileExistsError:
            self.ours = False
            raise

    def remove(self):
        if self.ours:
            try:  # noqa: SIM105 -- contextlib would be imported for this one line
                os.unlink(self.path)
            except FileNotFoundError:  # never created, or removed by someone else: nothing left to clean
                pass


def check_new_output(path):
    """Refuse, before any GPU work, an output that exists or that write_new_file could not create, so that no
    finished measurement is lost: its steps are tried on this very name (a temporary file hard-linked to it,
    then both removed), which proves the folder writable, the name short enough and hard links supported."""
    import errno

    if not isinstance(path, str) or not path.strip():
        raise KitError("--output: a new file name is required")
    folder = os.path.dirname(path) or "."
    if os.path.lexists(path):
        raise KitError(
            f"--output: {name_as_typed(path)} already exists; choose a new name (results are never overwritten)"
        )
    if not os.path.isdir(folder):
        raise KitError(f"--output: the folder of {name_as_typed(path)} does not exist")
    temporary = _Temporary(folder)
    try:
        descriptor = temporary.open()
        try:
            os.link(temporary.path, path)
        finally:
            if os.fstat(descriptor).st_nlink > 1:  # linked under the output's name: removed, even on Ctrl-C
                os.unlink(path)
            os.close(descriptor)
    except (OSError, ValueError) as error:  # ValueError: a NUL character, or a name the OS cannot encode
        if getattr(error, "errno", None) in (errno.EPERM, errno.ENOTSUP):  # link(2): no hard links here
            raise Refused(
                f"--output: cannot create {name_as_typed(path)}: its folder's file system has no hard links "
                f"({error.strerror}), which the never-overwriting write needs"
            ) from None
        raise Refused(f"--output: cannot create {name_as_typed(path)}: {describe_error(error)}") from None
    finally:
        temporary.remove()
    return path


def to_json(data):
    """A result as indented JSON; a Decimal as a number rounded half-up to 6 decimals, with its own digits."""
    import json

    def encode(value, indent):
        if isinstance(value, Decimal) and value.is_finite():
            return format(rounded(value, 6), "f")
        inner = indent + "  "
        if isinstance(value, dict) and value:
            items = [f"{inner}{json.dumps(str(key))}: {encode(item, inner)}" for key, item in value.items()]
            return "{\n" + ",\n".join(items) + "\n" + indent + "}"
        if isinstance(value, (list, tuple)) and value:
            return "[\n" + ",\n".join(inner + encode(item, inner) for item in value) + "\n" + indent + "]"
        return json.dumps(value)  # str, int, float, bool, None, {} or []; anything else: TypeError

    return encode(data, "") + "\n"


def write_new_file(path, text):
    """Write ``text`` to a new ``path`` whole or not at all: a temporary file, then a hard link, which fails
    if the name appeared meanwhile.  KitError when the name is taken, OSError otherwise."""
    temporary = _Temporary(os.path.dirname(path) or ".")
    try:
        with os.fdopen(temporary.open(), "wb") as stream:
            stream.write(text.encode("utf-8"))
            stream.flush()
            os.fsync(stream.fileno())
        try:
            os.link(temporary.path, path)
        except FileExistsError:
            raise KitError(f"--output: {name_as_typed(path)} appeared meanwhile; nothing overwritten") from None
    finally:
        temporary.remove()


# <<< notebook


# >>> notebook: 3.6 The measurement: refusals first, then the run, then its file
def _dtype_problem(torch, index, dtype):
    if dtype == "bfloat16":
        with torch.cuda.device(index):
            if not torch.cuda.is_bf16_supported(including_emulation=False):
                return "bfloat16 is not supported natively by this GPU"
    float16_too_old = torch.version.hip is None and torch.cuda.get_device_capability(index) < (5, 3)
    if dtype == "float16" and float16_too_old:
        return "float16 arithmetic needs compute capability 5.3 or newer"
    return None


def _host_memory_bytes():
    try:  # POSIX only; where unknown, the check is skipped
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):
        return None


def fit_problem(plan, environment):
    """Why the predicted peak cannot fit the GPU's free memory less the margin; None when it fits."""
    gpu = environment["gpu"]
    free, source = gpu["mem_get_info_free_bytes"], "free (mem_get_info)"
    if free is None:  # mem_get_info failed: only the announced total is known
        free, source = gpu["total_memory_bytes"], "announced in total (mem_get_info failed)"
    if plan["needs_free_bytes"] <= free:  # the plan's figure: the predicted peak plus the margin
        return None
    peak = plan["predicted_peak_allocated_bytes"]
    config, tensors = plan["configuration"], plan["tensor_bytes"]
    weight_bytes = sum(tensors[name] for name in WEIGHT_TENSORS)
    if weight_bytes >= peak - weight_bytes:
        advice = "shrink --width (the weights dominate)"
    else:
        larger = "--context" if config["context"] >= config["batch"] else "--batch"
        advice = f"shrink {larger} (the activations dominate)"
    return (
        f"the predicted peak, {peak} bytes ({in_units(peak)} GiB), exceeds the {free} bytes "
        f"({in_units(free)} GiB) {source} less a {in_units(plan['fit_margin_bytes'])} GiB margin: {advice}"
    )


def measure(config, tool):
    """The measurement on the GPU; returns the result (writes nothing), else Refused or MeasurementFailed."""
    model = synthetic_model(config)
    torch, torch_error = import_torch()
    if torch is None:
        raise Refused(f"PyTorch is not importable ({torch_error}): {RUN_ON_THE_GPU_BOX}")
    # The release is judged before any query that could start CUDA.
    refuse_old_torch(pytorch_call("torch", lambda: pytorch_text("torch", torch.__version__), None))
    on = config["device"]  # a set-up step's failure is a refusal (exit 2) naming the step and the device
    index = device_index(on)
    environment = environment_of(on, index)
    plan = memory_plan(config, model)  # one plan: the fit, the check, the file
    _refuse_what_cannot_run(torch, config, index, plan, environment)
    device, before = _set_up(torch, index, on)
    try:
        measured = measure_phases(torch, torch.cuda, device, config)
    except PhaseFailed as failure:
        raise _measurement_failed(torch, config, failure) from None
    configuration = {**config, **before}
    return _result(tool, environment, configuration, model, plan, measured)


def _set_up(torch, index, on):
    """The measured device made current, CUDA initialised; the bytes in use before the phases, as result fields."""
    cuda = torch.cuda
    device = pytorch_call(f"torch.device failed on {on}", lambda: torch.device("cuda", index))
    pytorch_call(f"torch.cuda.set_device failed on {on}", lambda: cuda.set_device(device))
    # reset_peak_memory_stats fails before CUDA is initialized
    pytorch_call(f"torch.cuda.init failed on {on}", cuda.init)
    allocated = pytorch_call(f"torch.cuda.memory_allocated failed on {on}", lambda: cuda.memory_allocated(device))
    reserved = pytorch_call(f"torch.cuda.memory_reserved failed on {on}", lambda: cuda.memory_reserved(device))
    return device, {
        "allocated_bytes_before_measure": allocated,
        "reserved_bytes_before_measure": reserved,
        "fresh_process_warning": None if allocated == 0 and reserved == 0 else FRESH_PROCESS_WARNING,
    }


def _result(tool, environment, configuration, model, plan, measured):
    """The result file's content: the measured phases checked against the plan."""
    from datetime import datetime, timezone

    phases, output_summary, per_call, timing = measured
    phases, prediction_check, workspace = check_against_plan(
        phases, plan, per_call, environment["gpu"]["allocator_backend"], environment["allocator_settings"]
    )
    return {
        "kit": KIT_NAME,
        "schema_version": RESULT_SCHEMA_VERSION,
        "tool": tool,
        "created_utc": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "environment": environment,
        "configuration": configuration,
        "synthetic_model": model,
        "phases": phases,
        "prediction_check": prediction_check,
        "workspace": workspace,
        "output_summary": output_summary,
        **timing,
        "predicted_peak_allocated_bytes": plan["predicted_peak_allocated_bytes"],
        "fit_margin_bytes": plan["fit_margin_bytes"],
    }


FRESH_PROCESS_WARNING = (
    "PyTorch already held GPU memory in this process before the measurement: this is not a fresh process and the "
    "figures are not comparable; restart it"
)


def _refuse_what_cannot_run(torch, config, index, plan, environment):
    """Refuse, before any GPU allocation, what cannot run or is predicted not to fit."""
    if ALLOCATOR_REFUSED in environment["field_errors"].values():
        raise Refused(ALLOCATOR_REFUSED)
    if not environment["gpu_available"]:
        raise Refused(
            f"no usable GPU for {config['device']}: {environment['gpu_unavailable_reason']}; no CPU fallback: "
            f"{RUN_ON_THE_GPU_BOX}"
        )
    problem = pytorch_call(
        f"the dtype probe failed on {config['device']}", lambda: _dtype_problem(torch, index, config["dtype"])
    )
    if problem:
        raise Refused(f"--dtype {config['dtype']}: {problem} ({environment['gpu']['name']})")
    problem = fit_problem(plan, environment)
    if problem:
        raise Refused(problem)
    host_bytes = _host_memory_bytes()
    cpu_build_bytes = plan["needs_host_memory_bytes"]
    if host_bytes is not None and cpu_build_bytes > host_bytes:
        raise Refused(
            f"building the model on the CPU needs {in_units(cpu_build_bytes)} GiB, more than this "
            f"machine's {in_units(host_bytes)} GiB of RAM: shrink --width"
        )


def _measurement_failed(torch, config, failure):
    """The MeasurementFailed (exit 3) for a failed phase: out of memory named as such; nothing written."""
    dimensions = ", ".join(f"{key} {config[key]}" for key in ("batch", "context", "width", "dtype"))
    error = failure.error
    CapturedPyTorch.note(error)  # out of memory too: --debug shows PyTorch's message
    if isinstance(error, torch.cuda.OutOfMemoryError) or "out of memory" in str(error).lower():
        failed = f"out of memory in phase {failure.phase} ({dimensions}) on {config['device']}"
        failed += ": shrink one dimension and retry in a new process"
    else:
        failed = f"phase {failure.phase} failed ({dimensions}): {describe_error(error, SHOWN_BY_DEBUG)}"
    return MeasurementFailed(f"{failed}; nothing written")


def measure_to_file(config, output_path, tool, debug):
    """Refuse an unusable output first, measure, then write; PyTorch's warnings go in field_errors."""
    check_new_output(output_path)
    with CapturedPyTorch(debug):
        result = measure(config, tool)
    if PYTORCH_WARNINGS:
        note_pytorch_warnings(result["environment"]["field_errors"])
    try:
        write_new_file(output_path, to_json(result))
    except OSError as error:
        raise KitError(
            f"--output: cannot write {name_as_typed(output_path)}: {describe_error(error)}; nothing written"
        ) from None
    return result


# <<< notebook


# >>> notebook: 3.7 The phase table
def _phase_label(record):
    label = record["phase"]
    if record.get("repetition") is not None:
        label += f" #{record['repetition']}"
    if record.get("passes") is not None:
        label += f" x{record['passes']}"
    return label


def _table(rows, left=(0,)):
    """``rows`` of text as aligned columns: those in ``left`` to the left, the others to the right."""
    widths = [max(len(row[column]) for row in rows) for column in range(len(rows[0]))]
    return "\n".join(
        "  ".join(
            cell.ljust(widths[column]) if column in left else cell.rjust(widths[column])
            for column, cell in enumerate(row)
        ).rstrip()
        for row in rows
    )


def result_warnings(result):
    """What makes a measurement less trustworthy, one line each."""
    warnings = [result["configuration"]["fresh_process_warning"], _workspace_warning(result["workspace"])]
    return [warning for warning in warnings if warning]


def _workspace_warning(workspace):
    """A line when the BLAS workspaces exceed the plan's allowance (its peak understates the run)."""
    kept_bytes = workspace["measured_bytes"] or 0
    per_call_bytes = max(taken["allocated_bytes"] for taken in workspace["per_call"].values())
    if kept_bytes + per_call_bytes <= workspace["allowance_bytes"]:
        return None
    return (
        f"the BLAS workspaces measured ({kept_bytes} bytes kept, {per_call_bytes} per call) exceed the plan's "
        f"{workspace['allowance_bytes']}-byte allowance: --plan and its fit rule understate this run"
    )


def format_phase_table(result):
    """The measurement as a table; a prediction that disagrees is marked, and each difference listed."""
    columns = {name: field.column for name, field in PHASE_FIELDS.items() if field.column}
    rows = [("phase", *columns.values(), "prediction")]
    for record in result["phases"]:
        verdict = record.get("verdict", "not checked")
        figures = [shown_figure(name, record.get(name)) for name in columns]
        rows.append((_phase_label(record), *figures, "DISAGREES" if verdict == "disagrees" else verdict))
    lines = [_table(rows)]
    for disagreement in result["prediction_check"]["disagreements"]:
        label = _phase_label(disagreement)
        lines.append(
            f"DISAGREES {label}: {disagreement['counter']} above baseline measured {disagreement['measured_bytes']}, "
            f"predicted {disagreement['predicted_bytes']} (difference {disagreement['difference_bytes']:+d} bytes)"
        )
    reasons = dict.fromkeys(record.get("not_checked_reason") for record in result["phases"])  # in order, once each
    lines += [f"Not checked: {reason}" for reason in reasons if reason]
    if not result["output_summary"]["all_finite"]:
        lines.append("Last output: NOT ALL FINITE")
    card_state = result["card_state"]
    lines.append(card_text("before the warm-up", card_state["before_warmup"]))
    if result["sustained"]:
        lines.append(card_text("in the last window", card_state["last_sustained_window"]))
    return "\n".join(lines)


def card_text(when, state):
    """The card's state at ``when``, one line."""
    reading = state["reading"]
    if reading is None:
        return f"Card {when}: not read ({state['why_null']})"
    shown = {name: "n/a" if value is None else value for name, value in reading.items()}
    reasons = "n/a" if reading["clock_event_reasons"] is None else ", ".join(reading["clock_event_reasons"]) or "none"
    return (
        f"Card {when} ({VENDOR_TOOL}): SM clock {shown['sm_clock_mhz']} of {shown['max_sm_clock_mhz']} MHz, power "
        f"{shown['power_draw_w']} of {shown['power_limit_w']} W, {shown['temperature_c']} C, clock events: {reasons}"
    )


# <<< notebook


# >>> notebook: 4. Reading results side by side (report)
MAX_RESULT_BYTES = 32 * MIB_BYTES  # a result of thousands of repetitions stays far below this


def _result_problem(path, why):
    return KitError(f"report: {name_as_typed(path)} is not a kit result: {why}")


def read_result_file(path):
    """The JSON object in ``path``, a regular file of at most MAX_RESULT_BYTES (FIFOs are never read)."""
    import json
    import stat

    # Non-blocking, so that a FIFO cannot hang the open; binary, so that Windows translates nothing.
    try:
        handle = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_BINARY", 0))
    except FileNotFoundError:
        raise KitError(
            f"report: {name_as_typed(path)} does not exist: check its name, or run measure on the GPU box first "
            "(its --output names the file)"
        ) from None
    except (OSError, ValueError) as exc:
        raise KitError(f"report: {name_as_typed(path)} cannot be opened ({type(exc).__name__})") from None
    try:
        if not stat.S_ISREG(os.fstat(handle).st_mode):
            raise _result_problem(path, "not a regular file")
        with open(handle, "rb", closefd=False) as stream:  # read() reads on until the size or the end
            data = stream.read(MAX_RESULT_BYTES + 1)
    except OSError as exc:
        raise KitError(f"report: {name_as_typed(path)} cannot be read ({type(exc).__name__})") from None
    finally:
        os.close(handle)
    if len(data) > MAX_RESULT_BYTES:
        raise _result_problem(path, f"larger than {MAX_RESULT_BYTES // MIB_BYTES} MiB")
    try:
        return json.loads(data.decode("utf-8"))
    except UnicodeDecodeError:
        raise _result_problem(path, "not UTF-8 text") from None
    except json.JSONDecodeError as exc:
        raise _result_problem(path, f"not JSON ({exc.msg}: line {exc.lineno} column {exc.colno})") from None
    except (ValueError, RecursionError) as exc:  # more digits (sys.get_int_max_str_digits) or nesting than it reads
        raise _result_problem(path, f"a number too long or a nesting too deep to read ({type(exc).__name__})") from None


# <<< notebook


# >>> notebook: 4.2 Each result checked against the one format, and its row
def _result_row(path, result):
    """One row of report for one result, its flags apart; or raise KitError naming the file and its first wrong
    field.  Only figures are kept, so that the parsed file can be freed before the next is read."""
    wrong = _first_wrong(result, RESULT_FORMAT)
    if wrong:
        field, value, what = wrong
        raise _result_problem(path, f"{field + ': ' if field else ''}expected {what}, got {_shown(value)}")
    config, environment, phases = result["configuration"], result["environment"], result["phases"]
    warm = [line for line in phases if line["phase"] == "warm_forward"]
    (cold,) = [line for line in phases if line["phase"] == "cold_forward"]
    gpu = environment["gpu"]
    return {
        "file": path,
        "schema_version": result["schema_version"],
        "gpu": None if gpu is None else gpu["name"],
        **{key: environment[key] for key in ("torch", "cuda_build", "hip_build")},
        **{key: config[key] for key in ("dtype", "batch", "context", "width")},
        "parameters": result["synthetic_model"]["parameters"],
        **{name: max(line[name] for line in phases) for name in REPORTED_PEAKS},
        "cold_forward_ms": decimal_ratio(cold["nanoseconds"], 10**6),
        "warm_repetitions": len(warm),
        **warm_spread(phases),
        "warm_median_device_ms": _device_median_ms(warm),
        **_sustained_row(result["sustained"]),
    }


SUSTAINED_ROW = ("sustained_seconds", "sustained_ms_per_forward", "sustained_steady", "sustained_ratio_to_warm_median")


def _sustained_row(sustained):
    """report's figures of a sustained run; None each where the result has none."""
    if sustained is None:
        return dict.fromkeys(SUSTAINED_ROW)
    steady_ms, ratio = (sustained[key] for key in ("steady_ms_per_forward", "ratio_to_warm_median"))
    figures = (
        sustained["sustained_seconds"],
        abs(Decimal(repr(steady_ms))),  # exact from the digits written; a crafted -0.0 as 0
        sustained["steady"],
        None if ratio is None else abs(Decimal(repr(ratio))),
    )
    return dict(zip(SUSTAINED_ROW, figures, strict=True))


# <<< notebook


# >>> notebook: 4.3 The report's rows
def _as_measure_writes(allocator):
    """Whether ``allocator`` has the keys and the value types measure writes (its text is then shown)."""
    if not isinstance(allocator, dict) or set(allocator) != set(DEFAULT_ALLOCATOR):
        return False
    limit, divisions = allocator["max_split_size_bytes"], allocator["roundup_power2_divisions"]
    return (
        allocator["backend"] in ("native", "cudaMallocAsync")
        and (limit is None or _count_or_none(limit) is not None)
        and isinstance(allocator["expandable_segments"], bool)
        and isinstance(divisions, dict)
        and all(
            key in ALLOCATOR_INTERVAL_KEYS and _count_or_none(count) is not None and count > 1
            for key, count in divisions.items()
        )
    )


def _allocator_flag(allocator):
    """The allocator settings a result records that differ from PyTorch's defaults, as one flag."""
    if allocator is None:
        return "allocator settings not recorded: allocated bytes not checked"
    differing = allocator_differences(allocator)
    return "allocator " + ", ".join(differing) + ": allocated bytes not checked" if differing else None


ENVIRONMENT_LABELS = {"gpu": "GPU", "torch": "PyTorch", "cuda_build": "CUDA build", "hip_build": "HIP build"}


def _row_flags(result, row, first):
    """What makes a row less comparable to ``first``'s, or not a true measurement."""
    checks = result["prediction_check"]
    flags = []
    if result["configuration"]["fresh_process_warning"] is not None:
        flags.append("not a fresh process")
    if checks["disagreements"]:
        flags.append("prediction disagreed")
    if checks["not_checked"]:
        flags.append("prediction not checked (each such phase's not_checked_reason says why)")
    if not result["output_summary"]["all_finite"]:
        flags.append("non-finite output")
    flags += _variation_flags(row)
    if row["sustained_steady"] is False:
        flags.append("sustained run not steady")
    allocator_flag = _allocator_flag(result["environment"]["allocator_settings"])
    if allocator_flag:
        flags.append(allocator_flag)
    differing = [label for key, label in ENVIRONMENT_LABELS.items() if row[key] != first[key]]
    if differing:
        flags.append("environment differs from row 1: " + ", ".join(differing))
    return flags


# A row whose warm times move by more than this within the run (drift, or max - min against the median) cannot
# tell two rows apart by that much; 10 % of the time is 10 % of a cost per result, more than most cards' 7-day
# discount (README).
VARIATION_LIMIT = Decimal("0.1")


def _variation_flags(row):
    """A flag each for a drift and a spread of the warm times beyond VARIATION_LIMIT."""
    drift, median = row["warm_drift"], row["warm_median_ms"]
    flags = []
    if drift is not None and abs(drift) > VARIATION_LIMIT:
        flags.append(f"warm times drift {drift:+.1%}")
    with exact_context():
        spread = (row["warm_max_ms"] - row["warm_min_ms"]) / median if median else None
    if spread is not None and spread > VARIATION_LIMIT:
        flags.append(f"warm times spread {spread:.1%} of the median")
    return flags


def report_rows(named_results):
    """One row per (file as given, parsed result), in order; ``named_results`` may be a generator."""
    rows = []
    for path, result in named_results:
        row = _result_row(path, result)
        row["flags"] = _row_flags(result, row, rows[0] if rows else row)
        rows.append(row)
    return rows


def report(paths):
    """Read each result file (bounded, never modified), then compute the report's rows."""
    return {"results": report_rows((path, read_result_file(path)) for path in paths)}


# <<< notebook


# >>> notebook: 4.4 The report's text
SUSTAINED_NOTE = (
    "Sustained runs (measure --sustained-s): forwards back to back, timed by CUDA events per window; steady: the "
    "last half's median time per forward; x warm: against the warm repetitions' device median."
)


def sustained_lines(rows):
    """A table of the sustained runs, for the results that hold one; none otherwise."""
    recorded = [row for row in rows if row["sustained_seconds"] is not None]
    if not recorded:
        return []
    table = [("file", "seconds", "steady ms", "steady", "x warm")]
    for row in recorded:
        ratio = row["sustained_ratio_to_warm_median"]
        table.append(
            (
                name_as_typed(row["file"]),
                str(row["sustained_seconds"]),
                str(rounded(row["sustained_ms_per_forward"], 3)),
                {True: "yes", False: "NO", None: "n/a"}[row["sustained_steady"]],
                "n/a" if ratio is None else str(rounded(ratio, 3)),
            )
        )
    return [SUSTAINED_NOTE, _table(table)]


WARM_FIGURES = ("min", "median", "max")


def _report_cells(row):
    """One row of report's table, as text."""
    return (
        name_as_typed(row["file"]),
        "none" if row["gpu"] is None else name_as_typed(row["gpu"]),
        row["dtype"],
        *(str(row[key]) for key in ("batch", "context", "width", "parameters")),
        *(shown_figure(name, row[name]) for name in REPORTED_PEAKS),
        str(rounded(row["cold_forward_ms"], 3)),
        *(str(rounded(row[f"warm_{word}_ms"], 3)) for word in WARM_FIGURES),
        "n/a" if row["warm_drift"] is None else f"{row['warm_drift']:+.1%}",
        "; ".join(row["flags"]) or "none",
    )


def format_report(data):
    header = (
        *("file", "GPU", "dtype", "batch", "context", "width", "parameters"),
        *REPORTED_PEAKS.values(),
        "cold ms",
        *(f"warm {word} ms" for word in WARM_FIGURES),
        *("drift", "flags"),
    )
    lines = [_table([header, *map(_report_cells, data["results"])], left=(0, 1, 2, len(header) - 1))]
    lines += sustained_lines(data["results"])
    lines += [
        "Peaks: maxima over each run's phases, PyTorch's allocator in that process only.",
        "Times: wall clock; the warm figures are over the warm_forward lines, the drift their last third's median "
        "against their first third's.",
    ]
    return "\n".join(lines)


# <<< notebook


# >>> notebook: 5. A picture of the measurement (matplotlib, only where it is importable)
PHASE_FIGURE_NOTE = (
    "PyTorch's allocator in the measuring process only. The plan: arithmetic from a fresh process, its "
    f"{BLAS_WORKSPACE_ALLOWANCE_BYTES // MIB_BYTES} MiB allowance for the BLAS workspace counted from cold_forward on"
)


def import_pyplot():
    """matplotlib's pyplot; a KitError where it is not importable or too old: the kit never requires it."""
    try:
        import matplotlib
        from matplotlib import pyplot
    except ImportError:
        raise KitError("matplotlib is not importable in this kernel (the tables stay)") from None
    version = str(getattr(matplotlib, "__version__", ""))
    found = re.match(r"([0-9]+)\.([0-9]+)", version)
    if not found or tuple(map(int, found.groups())) < (3, 5):  # subplots(layout=...), set_xticks(ticks, labels)
        raise KitError(f"matplotlib {quoted(version)} cannot draw: 3.5 or later is needed (the tables stay)")
    return pyplot


def phase_bar_data(result):
    """Per phase: (labels, {series: bytes}), the measured peaks beside the plan's level at that phase's peak."""
    plan = memory_plan(result["configuration"])
    labels = [
        _phase_label(record) + (" DISAGREES" if record.get("verdict") == "disagrees" else "")
        for record in result["phases"]
    ]
    return labels, {
        "measured peak allocated": [record["peak_allocated_bytes"] for record in result["phases"]],
        "measured peak reserved": [record["peak_reserved_bytes"] for record in result["phases"]],
        "plan's peak allocated": [record["predicted_peak_level_allocated_bytes"] for record in plan["phases"]],
    }


def draw_phases(result):
    """One measurement's figure: per phase, its measured peaks beside the plan's, in MiB, each bar labelled."""
    labels, series = phase_bar_data(result)
    figure, axes = import_pyplot().subplots(figsize=(10, 4.5), layout="constrained")
    width = 0.8 / len(series)
    for index, (name, values) in enumerate(series.items()):
        offset = (index - (len(series) - 1) / 2) * width
        heights = [float(decimal_ratio(value, MIB_BYTES)) for value in values]
        bars = axes.bar([tick + offset for tick in range(len(values))], heights, width, label=name)
        axes.bar_label(bars, labels=[in_units(value, MIB_BYTES, 2) for value in values], fontsize=7)
    axes.set_xticks(range(len(labels)), labels, rotation=30, ha="right")
    config = result["configuration"]
    axes.set_title(
        f"Peak memory per phase: batch {config['batch']}, context {config['context']}, "
        f"width {config['width']}, {config['dtype']}\n{PHASE_FIGURE_NOTE}",
        fontsize=9,
    )
    axes.set_ylabel("MiB")
    axes.legend(fontsize=8)
    return figure


# <<< notebook


# The command-line contract, shared by the kit's tools (they import these): one line on stderr and
# exit 2 for any misuse, --help exits 0, 1 for an unwritable stdout, 130 for Ctrl-C, 143 for SIGTERM.
# calcul_forfaits.py runs alone, so it holds a copy of the block between the markers, error class renamed;
# tests/test_repository.py checks that the two stay identical.
# >>> command-line contract
HELP_WIDTH = 100  # fixed, so that argparse never reads COLUMNS from the environment


class ArgumentParser(argparse.ArgumentParser):
    """argparse under the contract: no abbreviations, no colour, a fixed width, misuse as one KitError."""

    def __init__(self, **kwargs):
        kwargs.setdefault("allow_abbrev", False)
        kwargs.setdefault("formatter_class", lambda prog: argparse.HelpFormatter(prog, width=HELP_WIDTH))
        if sys.version_info >= (3, 14):
            kwargs.setdefault("color", False)  # argparse would read NO_COLOR and FORCE_COLOR
        super().__init__(**kwargs)

    def error(self, message):
        command = self.prog.partition(" ")[2]  # a subcommand's parser: name the command
        raise KitError(f"{command}: {message}" if command else message)


class Once(argparse.Action):
    """Store an option's value and refuse it given twice (argparse would keep the last); records the order."""

    def __call__(self, parser, namespace, values, option_string=None):
        given = getattr(namespace, "_given_options", ())
        if self.dest in given:
            parser.error(f"argument {option_string}: given twice")
        namespace._given_options = (*given, self.dest)
        setattr(namespace, self.dest, self.const if self.nargs == 0 else values)


class GuardedStdout:
    """sys.stdout while a command runs: a failed write or flush raises GuardedStdout.Failed (argparse would
    swallow an OSError while printing the help), exit 1."""

    class Failed(Exception):
        pass

    def __init__(self, stream):
        self.stream = stream

    def write(self, text):
        return self._call("write", text)

    def flush(self):
        if self.stream is not None:  # descriptor 1 closed: only a write fails (a command may print nothing)
            self._call("flush")

    def __getattr__(self, name):
        return getattr(self.stream, name)

    def _call(self, name, *args):
        try:
            return getattr(self.stream, name)(*args)
        except (AttributeError, OSError, ValueError) as error:  # no stream, a closed one, a character it cannot encode
            raise self.Failed(error) from None

    def failed(self, prog, error):
        """One line, none for a closed pipe (as POSIX tools do); returns 1."""
        if not isinstance(error, BrokenPipeError):
            closed = self.stream is None
            say(prog, "cannot write the output: " + ("standard output is closed" if closed else describe_error(error)))
        to_devnull(self.stream)
        return 1


def say(prog, message, prefix="error: "):
    """One line on stderr, starting with the program's name; a closed stderr is not an error."""
    try:
        sys.stderr.write(f"{prog}: {prefix}{one_line(message)}\n")
        sys.stderr.flush()
    except (AttributeError, OSError, ValueError):
        to_devnull(sys.stderr)


def to_devnull(stream):
    """Point the real stdout's or stderr's descriptor at os.devnull: what the stream still holds then goes
    nowhere at the interpreter's final flush, instead of failing there (and turning the exit status into 120)."""
    if stream is not None and stream in (sys.__stdout__, sys.__stderr__):
        try:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, stream.fileno())
            os.close(devnull)
        except (OSError, ValueError):
            pass


class Terminated(KeyboardInterrupt):
    """SIGTERM (timeout, a scheduler, docker stop), raised where the program stands: it cleans up as on Ctrl-C."""


def _terminated(signal_number, frame):
    raise Terminated


def run_command_line(prog, command, argv, interrupted="interrupted (Ctrl-C)"):
    """Run ``command(argv)`` under the contract; returns the exit status, never raises SystemExit."""
    import signal

    guarded = sys.stdout = GuardedStdout(sys.stdout)
    try:  # SIGINT's too: both are set aside while an interruption is said (below), then put back
        handlers = {signal.SIGINT: signal.getsignal(signal.SIGINT)}
        handlers[signal.SIGTERM] = signal.signal(signal.SIGTERM, _terminated)
    except ValueError:  # not the main thread, which alone handles signals: they stay as they were
        handlers = {}
    try:
        try:
            status = command(argv) or 0
        except SystemExit as exit_:  # argparse after --help; its errors are KitError (ArgumentParser.error)
            status = exit_.code if isinstance(exit_.code, int) else 2
        sys.stdout.flush()
    except KitError as error:
        say(prog, error)
        return error.exit_code
    except GuardedStdout.Failed as failure:
        return guarded.failed(prog, *failure.args)
    except KeyboardInterrupt as stop:  # SIGTERM too (Terminated); its text, if any, on the same line: what is left
        for number in handlers:  # another signal while this one is said: the one line, whole, and this status
            signal.signal(number, signal.SIG_IGN)
        said = "SIGTERM" if isinstance(stop, Terminated) else "Ctrl-C"
        say(prog, interrupted.replace("Ctrl-C", said) + "".join(map(str, stop.args)), prefix="")
        return 143 if said == "SIGTERM" else 130  # 128 + 15 or 2, as a shell reports a process the signal ended
    finally:
        sys.stdout = guarded.stream
        for number, handler in handlers.items():
            signal.signal(number, handler)
    return status


# <<< command-line contract


def _print(text, flush=False):
    """One line on stdout, escaped where stdout cannot encode it: a GPU or file name is data, not an error."""
    encoding = getattr(sys.stdout, "encoding", None) or "utf-8"
    print(text.encode(encoding, "backslashreplace").decode(encoding), flush=flush)


def _emit(args, data, formatter):
    # The JSON and the text come from the same data; JSON is ASCII.
    if args.json:
        sys.stdout.write(to_json(data))
    else:
        _print(formatter(data))


def _command_estimate(args):
    _emit(args, estimate_weights(args.parameters, args.bits, args.reserve_gib), format_estimate)


def _command_environment(args):
    _emit(args, collect_environment(args.device, args.debug), format_environment)


def _command_measure(args):
    # The values arrive as typed: measure_config checks them, with the messages the notebook gets too.
    if args.plan and args.output is not None:
        raise KitError("--plan writes nothing: drop --output")
    if not args.plan and (args.json or args.memory_gib is not None):
        raise KitError("--json and --memory-gib go with --plan; measure writes its JSON to --output")
    if not args.plan and None in (args.device, args.output):
        raise KitError("--device and --output are required (unless --plan, which measures nothing and writes nothing)")
    run_options = (args.batch, args.context, args.width, args.dtype, args.warmup, args.repeats, args.seed)
    config = measure_config(args.device, *run_options, args.sustained_s)
    if args.plan:
        plan = plan_with_fit(config, args.memory_gib)
        _emit(args, plan, format_plan)
        if not plan.get("fits", True):
            sys.stdout.flush()  # the plan first, then the one line on stderr
            raise MeasurementFailed(f"the run does not fit a card of {plan['memory_gib']:f} GiB (exit 3)")
        return
    result = measure_to_file(config, args.output, tool="mesure_memoire.py", debug=args.debug)
    for warning in result_warnings(result):
        say("mesure_memoire.py", warning, prefix="warning: ")
    _print(format_phase_table(result))
    _print(f"Result written to {name_as_typed(args.output)}")


def sweep_folder_files(folder):
    """The results sweep wrote in ``folder``, in the order of the values; any other entry is skipped."""
    try:
        names = os.listdir(folder)
    except OSError as error:
        raise KitError(f"report: {name_as_typed(folder)} cannot be listed ({describe_error(error)})") from None
    sweep_name = rf"mesures-(?:{'|'.join(FIT_DIMENSIONS)})-([1-9][0-9]*)\.json"  # [0-9]: ASCII only, unlike \d
    matches = [re.fullmatch(sweep_name, name) for name in names]
    results = sorted((int(match[1]), match[0]) for match in matches if match)
    if not results:
        raise KitError(
            f"report: {name_as_typed(folder)} holds no result of sweep (mesures-DIMENSION-VALUE.json): "
            "pass result files, or the folder sweep wrote"
        )
    return [os.path.join(folder, name) for _, name in results]


def _command_report(args):
    paths = [path for given in args.files for path in (sweep_folder_files(given) if os.path.isdir(given) else [given])]
    _emit(args, report(paths), format_report)


# sweep: one `measure` per value, each in a fresh child process (this interpreter, this script).  The parent
# never imports PyTorch: a CUDA context of its own would sit on the GPU beside every measurement.
SWEEP_PROBE_TIMEOUT_S = 300  # a child `environment`: importing PyTorch and initialising CUDA
SWEEP_STOP_GRACE_S = 10  # after Ctrl-C or a time-out, the child's time to stop (and remove its file) before a kill


def child_command(arguments):
    """This interpreter with its flags (-I, -E, -s ...: a PyTorch they kept out stays out), this script."""
    import subprocess

    flags = getattr(subprocess, "_args_from_interpreter_flags", list)()
    return [sys.executable, *flags, os.path.abspath(__file__), *arguments]


def sweep_values(text):
    """--values as ints: whole numbers >= 1, separated by commas, strictly increasing."""
    values = [whole_number("--values", item, 1) for item in text.split(",")]
    if any(later <= earlier for earlier, later in zip(values, values[1:], strict=False)):
        raise KitError(f"--values: expected strictly increasing whole numbers separated by commas, got {quoted(text)}")
    return values


def check_new_folder(path):
    """Refuse, before anything runs, a folder that exists or whose parent does not."""
    if not path.strip() or "\0" in path:
        raise KitError(f"--output-dir: expected the name of a new folder, got {name_as_typed(path)}")
    if os.path.lexists(path):
        raise KitError(f"--output-dir: {name_as_typed(path)} already exists; the sweep writes only into a new folder")
    if not os.path.isdir(os.path.dirname(os.path.normpath(path)) or "."):
        raise KitError(f"--output-dir: the folder that would hold {name_as_typed(path)} does not exist")
    return path


def probe_device(device):
    """The chosen GPU as a child `environment --json` sees it (free memory included), or a refusal."""
    import json

    status, out, _ = run_child(["environment", "--device", device, "--json"], SWEEP_PROBE_TIMEOUT_S)
    if status is None:
        raise Refused(f"the child reading {device} did not answer within {SWEEP_PROBE_TIMEOUT_S} s")
    try:
        environment = json.loads(out.decode("utf-8")) if status == 0 else None
    except ValueError:  # not UTF-8, not JSON
        environment = None
    if not isinstance(environment, dict) or not isinstance(environment.get("gpu"), (dict, type(None))):
        raise Refused(f"the child reading {device} failed (exit status {status})")
    if not environment.get("gpu_available") or not environment.get("gpu"):
        raise Refused(f"no usable GPU for {device}: {environment.get('gpu_unavailable_reason')}: {RUN_ON_THE_GPU_BOX}")
    return environment


def run_child(arguments, timeout_s):
    """(exit status or None after ``timeout_s``, stdout, stderr) of a fresh child, stopped on Ctrl-C or SIGTERM."""
    import subprocess

    pipes = {"stdin": subprocess.DEVNULL, "stdout": subprocess.PIPE, "stderr": subprocess.PIPE}
    try:
        process, held = start_child(child_command(arguments), **pipes)
    except OSError as error:  # a process limit (ulimit -u), no memory for one more process
        raise KitError(f"cannot start a child process: {describe_error(error)}") from None
    try:
        let_signals_through(held)  # one that landed while the child started is raised here, the child in hand
        out, err = process.communicate(timeout=timeout_s)
        return process.returncode, out, err
    except subprocess.TimeoutExpired:
        stop_child(process)
        return None, b"", b""
    except BaseException:
        stop_child(process)
        raise


def stop_child(process):
    """Interrupt the child as Ctrl-C does (it removes its partial file); kill it if it lingers or on a further
    signal, which then goes on: nothing it writes can appear after the sweep."""
    import signal
    import subprocess

    again, grace_s = None, SWEEP_STOP_GRACE_S
    if process.poll() is None:
        process.send_signal(signal.SIGINT if os.name == "posix" else signal.SIGTERM)
    while True:
        try:
            process.communicate(timeout=grace_s)
            break
        except subprocess.TimeoutExpired:
            process.kill()
            grace_s = None
        except KeyboardInterrupt as interrupt:  # the user insists: the child is killed, then waited for
            again = again or interrupt
            process.kill()
            grace_s = None
    if again is not None:
        raise again


def remove_leftovers(folder, output):
    """After a child that did not succeed: its result, if any, and any temporary file go (the folder is the
    sweep's own, so it holds exactly the results of the children that exited 0; a stray file stays)."""
    try:
        names = os.listdir(folder)
    except OSError:  # removed or made unreadable meanwhile: remove_sweep_folder says what stays
        return
    for name in names:
        path = os.path.join(folder, name)
        if path == output or (name.startswith(PARTIAL_FILE[0]) and name.endswith(PARTIAL_FILE[1])):
            try:  # noqa: SIM105 -- contextlib would be imported for this one line
                os.unlink(path)
            except OSError:  # gone already, or not removable: named by remove_sweep_folder
                pass


def remove_sweep_folder(folder):
    """Remove the sweep's folder when it holds no result: "" once it is gone, else the words that the sweep's one
    line ends with, naming what someone else left in it (left alone, with the folder)."""
    try:
        os.rmdir(folder)
        return ""
    except FileNotFoundError:
        return ""
    except OSError:
        try:
            strays = ", ".join(name_as_typed(name) for name in sorted(os.listdir(folder)))
        except OSError as error:
            strays = f"files that cannot be listed ({describe_error(error)})"
    return f"; {name_as_typed(folder)} kept: it holds {strays}, which the sweep did not write"


MEASURE_OPTIONS = ("device", "batch", "context", "width", "dtype", "warmup", "repeats", "seed")


def sweep_configs(args):
    """(the dimension varied, [(value, its measure configuration)]), every value checked before anything runs."""
    dimension = args.vary
    if dimension not in FIT_DIMENSIONS:
        raise KitError(f"--vary: expected one of {', '.join(FIT_DIMENSIONS)}, got {quoted(dimension)}")
    if dimension in args._given_options:
        raise KitError(f"--{dimension}: --vary {dimension} takes its values from --values; drop --{dimension}")
    fixed = {key: getattr(args, key) for key in MEASURE_OPTIONS}
    return dimension, [(value, measure_config(**{**fixed, dimension: value})) for value in sweep_values(args.values)]


def measure_in_child(config, folder, output, timeout_s, debug):
    """`measure` for ``config`` in a fresh child: (exit status or None, stderr); nothing of a failed child stays."""
    arguments = ["measure", *(f"--{key}={config[key]}" for key in MEASURE_OPTIONS), f"--output={output}"]
    arguments += ["--debug"] if debug else []
    status = None
    try:
        status, _, err = run_child(arguments, timeout_s)
    finally:  # after Ctrl-C too (the child stopped): nothing of a child that did not succeed stays
        if status != 0:
            remove_leftovers(folder, output)
    err = err.decode("utf-8", "replace")
    if debug:
        _to_stderr(err)
    return status, err


def check_child_end(where, status, err, output, timeout_s):
    """Raise what a child's end stops the sweep with (exit 3: MeasurementFailed) unless it wrote ``output``."""
    if status == 0 and os.path.isfile(output):
        return
    lines = [line for line in err.splitlines() if line.strip()]
    line = one_line(lines[-1]) if lines else "no message"
    if status is None:
        raise KitError(f"{where}: the child did not finish within {timeout_s} s and was stopped; nothing kept for it")
    if status == 0:
        raise KitError(f"{where}: the child exited 0 without writing its result")
    failure = MeasurementFailed if status == 3 else KitError
    raise failure(f"{where}: the child {'refused' if status == 2 else 'failed'} (exit status {status}): {line}")


def measure_each(dimension, configs, environment, folder, timeout_s, debug, written):
    """Measure each value after its fit check, appending (value, file) to ``written``; raises what stops the sweep."""
    for index, (value, config) in enumerate(configs):
        where, output = f"{dimension} {value}", os.path.join(folder, f"mesures-{dimension}-{value}.json")
        problem = fit_problem(memory_plan(config), environment)
        if problem:  # larger values need more: none of them is launched either
            larger = len(configs) - index - 1
            also = f" (nor the {larger} larger value(s))" if larger else ""
            raise KitError(f"{where}: predicted not to fit, not launched{also}: {problem}")
        try:
            status, err = measure_in_child(config, folder, output, timeout_s, debug)
        except KitError as error:  # it could not be started: the sweep stops there, as after a failed child
            raise KitError(f"{where}: {error}") from None
        check_child_end(where, status, err, output, timeout_s)
        written.append((value, output))
        _print(f"{where}: measured, {name_as_typed(output)}", flush=True)


def make_new_folder(folder):
    try:
        os.mkdir(folder)
    except (OSError, ValueError) as error:  # FileExistsError too: it appeared since check_new_folder
        raise KitError(f"--output-dir: cannot create {name_as_typed(folder)}: {describe_error(error)}") from None


def _command_sweep(args):
    dimension, configs = sweep_configs(args)
    timeout_s = whole_number("--timeout-s", args.timeout_s, 1, 7 * 24 * 3600)  # a week
    folder = check_new_folder(args.output_dir)
    environment = probe_device(args.device)
    refuse_old_torch(environment.get("torch"))
    make_new_folder(folder)
    written = []
    try:
        measure_each(dimension, configs, environment, folder, timeout_s, args.debug, written)
    except (KitError, KeyboardInterrupt) as stop:  # Ctrl-C or SIGTERM: the child has ended, its leftovers are gone
        if not written:  # nothing measured: the folder goes, unless another file is in it
            kept = remove_sweep_folder(folder)
            raise type(stop)(f"{stop}{kept}") if kept else stop from None
        if not isinstance(stop, KitError):
            raise
        _print(f"Sweep stopped: {stop}")
    _print(format_report(report([path for _, path in written])))
    _print(f"Largest {dimension} measured: {written[-1][0]}")


# The help: module constants, not __doc__, so that it survives python -OO.
DESCRIPTION = (
    "IteraGPU Lab v1: how much memory do the weights take (estimate), which Python, PyTorch and GPU "
    "(environment), what should each phase take (measure --plan) and what does the GPU really use, phase by "
    "phase (measure), for a small synthetic Linear -> GELU -> Linear network: not an LLM, not a training run, "
    "not a representative benchmark."
)
EPILOG = (
    "mesure_memoire.py COMMAND --help prints a command's options. Numbers: a whole number is 0 or ASCII digits "
    "not starting with 0 (07 and cuda:00 are refused); a decimal is a whole number, optionally followed by . and "
    "digits (0.5, not .5 or 5.); no sign, exponent, separator or space."
)
DEBUG_HELP = (
    "show PyTorch's own messages, their tracebacks and what it wrote on stderr, on the terminal only (never in a "
    "file or JSON); they may show paths and environment values"
)
# {command: (summary, handler, [(option, metavar, default, help)])}: a metavar of None makes a flag;
# REQUIRED, an option without a default.
REQUIRED = "required"
# What one run measures: measure's options, and sweep's for the values it does not vary.
RUN_ARGUMENTS = [
    ("--batch", "N", "1", "batch size (default 1)"),
    ("--context", "N", "16", "positions per input row (default 16)"),
    ("--width", "N", "64", "model width; the hidden layer is 4x (default 64)"),
    ("--dtype", "NAME", "float32", "float32, float16 or bfloat16 (default float32)"),
    ("--warmup", "N", "1", "warm-up passes, 0 to 1000 (default 1)"),
    ("--repeats", "N", "2", "measured warm passes, 1 to 1000 (default 2)"),
    ("--seed", "N", "0", "seed of the weights and inputs (default 0)"),
]
JSON_ARGUMENTS = [("--json", None, False, "print one JSON object instead of text")]
ESTIMATE_ARGUMENTS = [
    ("--parameters", "N", REQUIRED, "number of parameters, a positive integer"),
    ("--bits", "N", REQUIRED, "storage width per parameter in bits (4, 8, 16, 32 ...)"),
    ("--reserve-gib", "GIB", "0", "extra GiB you assume on top of the weights (a hypothesis; default 0)"),
    *JSON_ARGUMENTS,
]
DEBUG_ARGUMENTS = [("--debug", None, False, DEBUG_HELP)]
ENVIRONMENT_ARGUMENTS = [("--device", "cuda:N", REQUIRED, "the GPU to inspect"), *JSON_ARGUMENTS, *DEBUG_ARGUMENTS]
MEMORY_GIB_HELP = (
    "with --plan: a card's memory in GiB as PyTorch reports it (environment shows it on the box; a catalog card's: "
    "calcul_forfaits.py --list); whether the run fits, and the largest batch, context and width that fit"
)
SUSTAINED_HELP = (
    f"after the warm repetitions, forwards back to back for SECONDS (1 to {SUSTAINED_MAX_S}), timed per "
    "window: how the card's power management slows long work (default: none)"
)
MEASURE_ARGUMENTS = [
    ("--device", "cuda:N", None, "the GPU to measure; required unless --plan"),
    ("--output", "FILE", None, "new JSON file for the result (never overwritten); required unless --plan"),
    *RUN_ARGUMENTS,
    ("--sustained-s", "SECONDS", None, SUSTAINED_HELP),
    ("--plan", None, False, "predict the memory per phase: arithmetic only, no GPU, writes nothing"),
    ("--json", None, False, "with --plan: print one JSON object"),
    ("--memory-gib", "GIB", None, MEMORY_GIB_HELP),
    *DEBUG_ARGUMENTS,
]
SWEEP_ARGUMENTS = [
    ("--device", "cuda:N", REQUIRED, "the GPU to measure"),
    ("--vary", "DIMENSION", REQUIRED, "batch, context or width: the dimension that takes the values"),
    ("--values", "V1,V2,...", REQUIRED, "strictly increasing whole numbers, separated by commas"),
    ("--output-dir", "NEW_FOLDER", REQUIRED, "a new folder (created; never an existing one): one file per value"),
    *RUN_ARGUMENTS,
    ("--timeout-s", "SECONDS", "1800", "a child still running after this many seconds is stopped (default 1800)"),
    *DEBUG_ARGUMENTS,
]
COMMAND_OPTIONS = {
    "estimate": ("weight memory from a parameter count, no GPU", _command_estimate, ESTIMATE_ARGUMENTS),
    "environment": ("diagnose Python, PyTorch and the chosen GPU", _command_environment, ENVIRONMENT_ARGUMENTS),
    "measure": ("measure the synthetic MLP phase by phase on a GPU", _command_measure, MEASURE_ARGUMENTS),
    "sweep": ("measure one dimension at several values, each in a fresh process", _command_sweep, SWEEP_ARGUMENTS),
    "report": ("compare result files side by side, one row each; writes nothing", _command_report, JSON_ARGUMENTS),
}
FILES_HELP = "result files in the order to show, or the folder sweep wrote; after --, a name may start with -"


def build_parser():
    """The command line: one subcommand each, every option given at most once (Once)."""
    parser = ArgumentParser(prog="mesure_memoire.py", description=DESCRIPTION, epilog=EPILOG)
    commands = parser.add_subparsers(metavar="COMMAND", required=True)
    for command, (summary, handler, options) in COMMAND_OPTIONS.items():
        subparser = commands.add_parser(command, help=summary, description=summary)
        subparser.set_defaults(func=handler)
        for option, metavar, default, text in options:
            if metavar is None:
                subparser.add_argument(option, action=Once, nargs=0, const=True, default=False, help=text)
            else:
                subparser.add_argument(
                    option,
                    action=Once,
                    metavar=metavar,
                    required=default == REQUIRED,
                    default=default,  # never read where required: argparse refuses the option missing
                    help=text,
                )
        if command == "report":
            subparser.add_argument("files", nargs="+", metavar="FILE", help=FILES_HELP)
    return parser


def _run(argv):
    args = build_parser().parse_args(argv)
    args.func(args)


def main(argv=None) -> int:
    """Run one command; returns the exit status (README's table)."""
    import signal

    if hasattr(signal, "pthread_sigmask"):  # first: a sweep starts its children with these two blocked (start_child)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT, signal.SIGTERM})
    argv = sys.argv[1:] if argv is None else list(argv)
    return run_command_line("mesure_memoire.py", _run, argv, "interrupted (Ctrl-C); no partial file left behind")


if __name__ == "__main__":
    raise SystemExit(main())
