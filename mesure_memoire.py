"""IteraGPU Lab v1: weight-memory estimate, environment diagnosis and phase-by-phase
GPU measurement of a small synthetic ``Linear -> GELU -> Linear`` network.

Usage::

    python mesure_memoire.py estimate --parameters 7000000000 --bits 16 --reserve-gib 4
    python mesure_memoire.py environment --device cuda:0
    python mesure_memoire.py measure --device cuda:0 --batch 1 --context 16 --width 64 \\
        --dtype float32 --warmup 1 --repeats 2 --output mesures-petit-essai.json

``estimate`` needs only Python >= 3.10 and its standard library.  ``environment`` and
``measure`` import PyTorch lazily; ``measure`` never falls back to the CPU.  Expected
failures print one line on stderr and exit 2 (3 when the GPU runs out of memory).

The blocks between ``# >>> notebook`` and ``# <<< notebook`` are copied verbatim into
``mesure-memoire.ipynb`` by ``tools/build_notebook.py``: edit them here, then rebuild.
"""

import argparse  # noqa: I001 -- the command line only; the notebook block below is kept apart
import sys

# >>> notebook: Imports (standard library only; PyTorch is imported lazily)
import json
import math
import os
import re
import time
from decimal import ROUND_HALF_UP, Context, Decimal, localcontext
# <<< notebook

# >>> notebook: Constants, validation and the error type
KIT_NAME = "iteragpu-lab-v1"
RESULT_SCHEMA_VERSION = 1
GIB_BYTES = 2**30  # binary gibibyte
GB_BYTES = 10**9  # decimal gigabyte
MIB_BYTES = 2**20
DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2}
PHASES = ("model_load", "inputs", "cold_forward", "warmup", "warm_forward")
PHASE_MEMORY_FIELDS = (
    "baseline_allocated_bytes",
    "baseline_reserved_bytes",
    "end_allocated_bytes",
    "end_reserved_bytes",
    "peak_allocated_bytes",
    "peak_reserved_bytes",
)
NOT_INCLUDED_IN_ESTIMATE = (
    "activations",
    "KV cache",
    "quantization metadata",
    "gradients",
    "optimizer states",
    "libraries",
    "the CUDA/ROCm context",
)
DRIVER_NOTE = (
    "The CUDA/HIP runtime built into PyTorch is not the driver: record the driver separately with the vendor tool."
)
DRIVER_COMMANDS = {
    "nvidia": "nvidia-smi --query-gpu=name,driver_version --format=csv",
    "amd": "amd-smi version",
}
# One number grammar for every option: ASCII digits, at most one decimal point; no sign,
# underscore, exponent, space or other script's digits (so no negative zero either).
_DIGITS = re.compile(r"[0-9]+")
_DECIMAL = re.compile(r"(?P<whole>[0-9]*)(?:\.(?P<fraction>[0-9]*))?")
MAX_DIGITS = 30  # bounds every product the kit computes
MAX_SEED = 2**64 - 1  # the largest seed torch.manual_seed accepts
_DEVICE = re.compile(r"cuda:([0-9]{1,4})")
PYTORCH_WARNINGS_FIELD = "pytorch_warnings"  # the field_errors key for warnings PyTorch raised
PYTORCH_WARNINGS = []  # warnings PyTorch raised in this process: redacted, one line each, no repeats


class KitError(Exception):
    """An expected failure: one line for the user, and the exit status to use."""

    exit_code = 2


class MeasurementFailed(KitError):
    """The GPU work itself failed (out of memory, most often): nothing is written."""

    exit_code = 3


def one_line(text):
    """``text`` on one line: newlines, tabs and other unprintable characters are escaped."""
    return "".join(char if char.isprintable() else repr(char)[1:-1] for char in str(text))


def shown(value, limit=80):
    """A user's value for a message: its repr (quoted, escaped, one line), shortened when long."""
    text = repr(value)
    return text if len(text) <= limit else f"{text[: limit - 20]}...{text[-12:]} ({len(str(value))} characters)"


def shown_name(path):
    """A file name the user gave, as typed when printable, else as its repr; shortened when long."""
    if isinstance(path, str) and path.isprintable() and path.strip() == path and len(path) <= 80:
        return path
    return shown(path)


def whole_number(option, value, minimum, maximum=10**MAX_DIGITS - 1):
    """Return ``value`` as an int from ``minimum`` to ``maximum``; accepts an int or a string of ASCII digits."""
    if isinstance(value, int) and not isinstance(value, bool):
        number = value
    elif isinstance(value, str) and len(value) <= MAX_DIGITS and _DIGITS.fullmatch(value):
        number = int(value)
    else:
        number = None
    if number is None or not minimum <= number <= maximum:
        if maximum < 10**MAX_DIGITS - 1:
            wanted = f"a whole number from {minimum} to {maximum} in ASCII digits"
        else:
            wanted = "a positive whole number" if minimum == 1 else f"a whole number >= {minimum}"
            wanted += f" of at most {MAX_DIGITS} ASCII digits"
        raise KitError(f"{option}: expected {wanted}, got {shown(value)}")
    return number


def non_negative_decimal(option, value):
    """Return ``value`` as an exact Decimal >= 0: ASCII digits with at most one decimal point, at most
    MAX_DIGITS digits on each side (a string, an int, or a float whose repr is written so)."""
    text = str(value) if isinstance(value, (str, int, float, Decimal)) and not isinstance(value, bool) else ""
    match = _DECIMAL.fullmatch(text)
    whole, fraction = (match["whole"], match["fraction"] or "") if match else ("", "")
    if not (whole or fraction) or len(whole) > MAX_DIGITS or len(fraction) > MAX_DIGITS:
        raise KitError(
            f"{option}: expected a number >= 0 written with ASCII digits and at most one decimal point "
            f"(at most {MAX_DIGITS} digits on each side), got {shown(value)}"
        )
    return Decimal(f"{whole or 0}.{fraction or 0}")


def device_index(device):
    """Return N for a device written ``cuda:N``; anything else is refused."""
    match = _DEVICE.fullmatch(device) if isinstance(device, str) else None
    if match is None:
        raise KitError(f"--device: expected cuda:N (for example cuda:0), got {shown(device)}")
    return int(match.group(1))


# A path inside quotes (how Python's OSError and most libraries show one): the whole quoted text.
_QUOTED_PATH = (  # patterns compiled on first use (re caches them): start-up time
    r"""(['"])(?:[A-Za-z]:|~)?[\\/](?:\\.|(?!\1)[^\n])*\1"""
)
# A bare path from a root (a slash, a drive, "~", a UNC name): folder names may hold spaces (not a
# sentence's ". " or ": "), the last name may not.  Or a relative path of two separators or more,
# without spaces ("torch/csrc/x.cpp"); a single "CUDA/ROCm" is not a path.
_BARE_PATH = (
    r"""(?:(?:(?<![\w.~-])(?:[A-Za-z]:|~)|(?<![\w.:~\\/-]))[\\/]+(?=[^\s\\/])"""
    r"""(?:(?:[^\s\\/'"():;,.]|[.:;,](?=[^\s\\/])|[ \t]+(?=[^\s\\/]))*[\\/]+)*"""
    r"""|(?<![\w.-])[\w.-]+[\\/]+(?:[^\s\\/'"():;,]+[\\/]+)+)"""
    r"""[^\s\\/'"():;,]*"""
)


def redact(text):
    """The first non-empty line of an error message, on one line, with file-system paths removed."""
    text = re.sub(_QUOTED_PATH, lambda match: f"{match[1]}<path>{match[1]}", str(text))
    text = re.sub(_BARE_PATH, "<path>", text)
    lines = [line for line in text.splitlines() if line.strip()]
    return one_line(lines[0].strip()) if lines else ""


def describe_error(exc):
    return f"{type(exc).__name__}: {redact(exc)}".rstrip(": ")


class CapturedWarnings:
    """``with CapturedWarnings(field_errors):`` records the warnings raised inside (by PyTorch,
    mostly) instead of letting them print raw on stderr with library paths: each is kept once,
    redacted, in PYTORCH_WARNINGS, and all of them in ``field_errors`` when one is given."""

    def __init__(self, field_errors=None):
        self.field_errors = field_errors

    def __enter__(self):
        import warnings  # here only: the estimate never needs it

        self._catcher = warnings.catch_warnings(record=True)
        self._caught = self._catcher.__enter__()
        return self

    def __exit__(self, *exc_info):
        self._catcher.__exit__(*exc_info)
        for caught in self._caught:
            line = f"{caught.category.__name__}: {redact(caught.message)}"
            if line not in PYTORCH_WARNINGS:
                PYTORCH_WARNINGS.append(line)
        if PYTORCH_WARNINGS and self.field_errors is not None:
            self.field_errors[PYTORCH_WARNINGS_FIELD] = " | ".join(PYTORCH_WARNINGS)
        return False


def exact_context():
    """A decimal context wide enough that no accepted input is ever rounded before display.

    (The default 28 digits would round, or fail to quantize, the largest accepted figures.)
    """
    return localcontext(Context(prec=200))


def decimal_ratio(numerator, denominator):
    """The quotient of two ints as an exact Decimal (a power of 2 or 10 divides exactly)."""
    with exact_context():
        return Decimal(numerator) / Decimal(denominator)


def rounded(number, places):
    """Round a Decimal half-up to ``places`` decimals."""
    with exact_context():
        return number.quantize(Decimal(1).scaleb(-places), rounding=ROUND_HALF_UP)


# <<< notebook


# >>> notebook: 1. Weight-memory estimate (arithmetic only, no GPU)
def estimate_weights(parameters, bits, reserve_gib=0):
    """Weight bytes of ``parameters`` values stored on ``bits`` bits each, plus a reserve.

    Bits are rounded up to whole bytes per parameter.  GiB and GB figures are exact
    Decimals; the outputs round them half-up (2 decimals in text, 6 in JSON).
    """
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
        "reserve_is": "a hypothesis chosen by the user, not a measured reserve",
        "total_gib": total_gib,
        "not_included": list(NOT_INCLUDED_IN_ESTIMATE),
    }


def format_estimate(estimate):
    def gib(value):
        return f"{rounded(value, 2)} GiB"

    return "\n".join(
        [
            "Weight-memory estimate (arithmetic only, no GPU)",
            f"  parameters            {estimate['parameters']}",
            f"  storage width         {estimate['bits']} bits -> "
            f"{estimate['bytes_per_parameter']} bytes per parameter (rounded up to whole bytes)",
            f"  weight bytes          {estimate['weight_bytes']}",
            f"  weights               {gib(estimate['weight_gib'])} (2**30 bytes) = "
            f"{rounded(estimate['weight_gb'], 2)} GB (10**9 bytes)",
            f"  reserve (hypothesis)  {gib(estimate['reserve_gib'])}, your assumption, not a measured reserve",
            f"  total                 {gib(estimate['total_gib'])}",
            "Bytes are exact integers; GiB and GB are rounded half-up to 2 decimals.",
            "Not included: " + ", ".join(estimate["not_included"]) + ".",
            "This does not predict whether a real model fits a card.",
        ]
    )


# <<< notebook


# >>> notebook: 2. Environment diagnosis (degrades field by field, never fails whole)
def import_torch():
    """Return (torch, None), or (None, why) when PyTorch cannot be imported."""
    try:
        # PyTorch may warn while it loads (without NumPy, for one), with its own paths: the
        # warnings are kept in PYTORCH_WARNINGS (collect_environment reports them), not printed.
        with CapturedWarnings():
            import torch
    except Exception as exc:  # ImportError, or OSError from a missing shared library
        return None, describe_error(exc)
    return torch, None


def collect_environment(device):
    """What this process sees: Python, OS, PyTorch and the chosen GPU.

    Reads no environment variable and records no hostname, user name, path, GPU UUID
    or serial number.  Each query that fails leaves null and a line in ``field_errors``.
    """
    import platform  # here only: the estimate's start-up does not pay for it

    index = device_index(device)
    field_errors = {}

    def query(name, function):
        try:
            with CapturedWarnings(field_errors):
                return function()
        except Exception as exc:
            field_errors[name] = describe_error(exc)
            return None

    environment = {
        "python": {
            "version": platform.python_version(),
            "implementation": platform.python_implementation(),
        },
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
        "field_errors": field_errors,
        "driver_note": DRIVER_NOTE,
        "driver_commands": dict(DRIVER_COMMANDS),
    }
    torch, environment["torch_error"] = import_torch()
    if torch is None:
        environment["gpu_unavailable_reason"] = "PyTorch is not importable"
        return environment
    environment["torch"] = query("torch", lambda: str(torch.__version__))
    environment["cuda_build"] = query("cuda_build", lambda: torch.version.cuda)
    environment["hip_build"] = query("hip_build", lambda: getattr(torch.version, "hip", None))
    environment["cudnn_or_miopen_version"] = query("cudnn_or_miopen_version", lambda: torch.backends.cudnn.version())
    available = query("cuda_available", lambda: bool(torch.cuda.is_available()))
    count = environment["device_count"] = query("device_count", lambda: int(torch.cuda.device_count()))
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
    free_and_total = query("mem_get_info", lambda: torch.cuda.mem_get_info(index)) or (None, None)
    total_bytes = int(properties.total_memory)
    environment["gpu_available"] = True
    environment["gpu"] = {
        "name": str(properties.name),
        "compute_capability": f"{properties.major}.{properties.minor}",
        "gcn_arch_name": getattr(properties, "gcnArchName", None) if environment["hip_build"] else None,
        "multi_processor_count": getattr(properties, "multi_processor_count", None),
        "total_memory_bytes": total_bytes,
        "total_memory_gib": decimal_ratio(total_bytes, GIB_BYTES),
        "mem_get_info_free_bytes": free_and_total[0],
        "mem_get_info_total_bytes": free_and_total[1],
        "allocator_backend": query("allocator_backend", lambda: torch.cuda.memory.get_allocator_backend()),
    }
    return environment


def format_environment(environment):
    def shown(value, missing="none"):
        return missing if value is None else str(value)

    lines = [
        "Environment diagnosis (this process only)",
        f"  Python                {environment['python']['version']} ({environment['python']['implementation']})",
        f"  OS                    {environment['os']['name']} {environment['os']['release']} "
        f"{environment['os']['machine']}",
        "  PyTorch               " + shown(environment["torch"], f"not importable ({environment['torch_error']})"),
        f"  CUDA build            {shown(environment['cuda_build'])}",
        f"  HIP build             {shown(environment['hip_build'])}",
        f"  cuDNN/MIOpen          {shown(environment['cudnn_or_miopen_version'])}",
        f"  device                {environment['device']} "
        f"(PyTorch sees {shown(environment['device_count'], 'no')} device(s))",
    ]
    gpu = environment["gpu"]
    if gpu is None:
        lines.append(f"  GPU usable            no: {environment['gpu_unavailable_reason']}")
    else:
        free, total = gpu["mem_get_info_free_bytes"], gpu["mem_get_info_total_bytes"]
        lines += [
            "  GPU usable            yes",
            f"  GPU name              {gpu['name']}",
            f"  compute capability    {gpu['compute_capability']}"
            + (f" ({gpu['gcn_arch_name']})" if gpu["gcn_arch_name"] else ""),
            f"  memory (runtime)      {gpu['total_memory_bytes']} bytes = {rounded(gpu['total_memory_gib'], 2)} GiB",
            f"  mem_get_info          free {shown(free)} / total {shown(total)} bytes",
            f"  allocator backend     {shown(gpu['allocator_backend'], 'unknown')}",
        ]
    for name, error in sorted(environment["field_errors"].items()):
        lines.append(f"  query failed          {name}: {error}")
    lines.append(environment["driver_note"])
    for vendor, command in environment["driver_commands"].items():
        lines.append(f"  {vendor.upper():<6} {command}")
    return "\n".join(lines)


# <<< notebook


# >>> notebook: 3. Phase-by-phase measurement (GPU only, no CPU fallback)
def measure_config(device, batch, context, width, dtype, warmup, repeats, seed):
    """Validate a measurement's parameters; returns them as a dict."""
    device_index(device)
    if dtype not in DTYPE_BYTES:
        raise KitError(f"--dtype: expected one of {', '.join(DTYPE_BYTES)}, got {shown(dtype)}")
    return {
        "device": device,
        "batch": whole_number("--batch", batch, 1),
        "context": whole_number("--context", context, 1),
        "width": whole_number("--width", width, 1),
        "dtype": dtype,
        "warmup": whole_number("--warmup", warmup, 0),
        "repeats": whole_number("--repeats", repeats, 1),
        "seed": whole_number("--seed", seed, 0, MAX_SEED),
    }


def synthetic_model(config):
    """Shapes and bytes of the synthetic MLP and its tensors, computed without PyTorch."""
    width, hidden = config["width"], 4 * config["width"]
    element_bytes = DTYPE_BYTES[config["dtype"]]
    # Names as torch.nn.Sequential gives them (index 1 is the GELU, which has no weights).
    shapes = {"0.weight": [hidden, width], "0.bias": [hidden], "2.weight": [width, hidden], "2.bias": [width]}
    tensors = [
        {"name": name, "shape": shape, "bytes": math.prod(shape) * element_bytes} for name, shape in shapes.items()
    ]
    io_shape = [config["batch"], config["context"], width]
    return {
        "architecture": f"Linear({width} -> {hidden}) -> GELU -> Linear({hidden} -> {width})",
        "width": width,
        "hidden_width": hidden,
        "bias": True,
        "dtype": config["dtype"],
        "execution": "eval mode, torch.inference_mode, no autocast, no gradients, no optimizer",
        "parameters": sum(math.prod(shape) for shape in shapes.values()),
        "parameter_bytes": sum(tensor["bytes"] for tensor in tensors),
        "parameter_tensors": tensors,
        "input_shape": io_shape,
        "input_bytes": math.prod(io_shape) * element_bytes,
        "output_shape": io_shape,
        "output_bytes": math.prod(io_shape) * element_bytes,
    }


def phase_names(config):
    """The phase lines a measurement writes, in order (no warmup line when --warmup is 0)."""
    model_load, inputs, cold_forward, warmup, warm_forward = PHASES
    return [model_load, inputs, cold_forward] + [warmup] * bool(config["warmup"]) + [warm_forward] * config["repeats"]


def build_model(torch, width):
    """The synthetic MLP, built and initialized on the CPU in float32 (PyTorch's default)."""
    return torch.nn.Sequential(torch.nn.Linear(width, 4 * width), torch.nn.GELU(), torch.nn.Linear(4 * width, width))


def run_phase(cuda, device, phase, work, clock=time.perf_counter_ns):
    """One phase of the protocol; returns (record, work's output).

    The output is still referenced while the end readings are taken; the caller drops
    it before the next pass.  The allocator cache is never emptied.
    """
    cuda.synchronize(device)
    baseline_allocated = cuda.memory_allocated(device)
    baseline_reserved = cuda.memory_reserved(device)
    cuda.reset_peak_memory_stats(device)
    started_ns = clock()
    output = work()
    cuda.synchronize(device)
    elapsed_ns = clock() - started_ns
    record = {
        "phase": phase,
        "nanoseconds": elapsed_ns,
        "seconds": elapsed_ns / 1e9,
        "baseline_allocated_bytes": baseline_allocated,
        "baseline_reserved_bytes": baseline_reserved,
        "end_allocated_bytes": cuda.memory_allocated(device),
        "end_reserved_bytes": cuda.memory_reserved(device),
        "peak_allocated_bytes": cuda.max_memory_allocated(device),
        "peak_reserved_bytes": cuda.max_memory_reserved(device),
    }
    return record, output


class PhaseFailed(Exception):
    def __init__(self, phase, error):
        super().__init__(phase, error)
        self.phase, self.error = phase, error


def measure_phases(torch, cuda, device, config, clock=time.perf_counter_ns):
    """Run the phases of the spec's table in order; returns their records.

    ``cuda`` is ``torch.cuda`` for a real measurement (tests pass a recording stand-in).
    """
    dtype = getattr(torch, config["dtype"])
    records = []

    def phase(name, work, **labels):
        try:
            record, output = run_phase(cuda, device, name, work, clock)
        except Exception as exc:
            raise PhaseFailed(name, exc) from exc
        records.append({**record, **labels})
        return output

    def load_model():
        return build_model(torch, config["width"]).to(device=device, dtype=dtype).eval()

    def make_inputs():
        generator = torch.Generator(device=device)
        generator.manual_seed(config["seed"])
        shape = (config["batch"], config["context"], config["width"])
        return torch.randn(shape, generator=generator, device=device, dtype=dtype)

    def warmup_passes():
        output = None
        for _ in range(config["warmup"]):
            output = None  # release the previous pass's output before the next pass
            output = model(inputs)
        return output  # the last output is alive at the end reading

    torch.manual_seed(config["seed"])  # the CPU initialization of the weights
    with torch.inference_mode():
        model = phase("model_load", load_model)
        inputs = phase("inputs", make_inputs)
        # Forward outputs are not kept: each is released when phase() returns.
        phase("cold_forward", lambda: model(inputs))
        if config["warmup"]:
            phase("warmup", warmup_passes, passes=config["warmup"])
        for repetition in range(1, config["repeats"] + 1):
            phase("warm_forward", lambda: model(inputs), repetition=repetition)
    return records


def _name_limits(folder):
    """The longest file name and path this folder's file system takes (POSIX; 255 and 4096 elsewhere)."""
    try:
        return os.pathconf(folder, "PC_NAME_MAX"), os.pathconf(folder, "PC_PATH_MAX")
    except (AttributeError, ValueError, OSError):
        return 255, 4096


def _create_temporary(folder):
    """Create a new hidden file in ``folder``, exclusively, with the umask's mode; returns (path, descriptor)."""
    for _ in range(100):
        temporary = os.path.join(folder, f".partial-{os.urandom(8).hex()}.tmp")
        try:
            return temporary, os.open(
                temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0), 0o666
            )
        except FileExistsError:
            continue
    raise FileExistsError(f"no free temporary name in {folder}")


def check_new_output(path):
    """Refuse, before any GPU work, an output that exists or cannot be created.

    Beyond the name and its folder, it proves that a file can be created there (a temporary
    file is created, then removed at once), so a finished measurement is not lost to an
    unwritable folder.
    """
    if not isinstance(path, str) or not path.strip():
        raise KitError("--output: a new file name is required")
    name, folder = os.path.basename(path), os.path.dirname(path) or "."
    try:
        if "\0" in path:
            raise ValueError("embedded null character")
        if not name or name in (".", ".."):
            raise KitError(f"--output: {shown_name(path)} names a folder, not a new file")
        if os.path.lexists(path):
            raise KitError(
                f"--output: {shown_name(path)} already exists; choose a new name (results are never overwritten)"
            )
        if not os.path.isdir(folder):
            raise KitError(f"--output: the folder of {shown_name(path)} does not exist")
        name_max, path_max = _name_limits(folder)
        if len(os.fsencode(name)) > name_max or len(os.fsencode(path)) >= path_max:
            raise KitError(f"--output: {shown_name(path)} is too long for this file system (names: {name_max} bytes)")
        temporary, descriptor = _create_temporary(folder)
        try:
            os.close(descriptor)
        finally:
            os.unlink(temporary)
    except (OSError, ValueError) as error:  # ValueError: a NUL character, or a name the OS cannot encode
        raise KitError(
            f"--output: cannot create {shown_name(path)}: {describe_error(error)}; nothing measured"
        ) from None
    return path


def _write_exclusively(path, data):
    """Create ``path`` (never an existing file) and write ``data``; on any failure, remove it again."""
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0), 0o666)
    try:
        with os.fdopen(descriptor, "wb") as stream:
            stream.write(data)
            stream.flush()
            os.fsync(stream.fileno())
    except BaseException:  # Ctrl-C included: a partial result never stays under its name
        os.unlink(path)
        raise


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


def _gib(value_bytes):
    return f"{rounded(decimal_ratio(value_bytes, GIB_BYTES), 2)} GiB"


def measure(config, tool):
    """Measure the synthetic MLP on the chosen GPU; returns the result (writes nothing).

    Refuses (KitError, exit 2) without PyTorch, without a usable GPU, with an unsupported
    dtype or sizes that cannot fit; raises MeasurementFailed (exit 3) when a phase fails.
    """
    from datetime import datetime, timezone  # here only: the estimate's start-up does not pay for it

    model_summary = synthetic_model(config)
    torch, torch_error = import_torch()
    if torch is None:
        raise KitError(f"PyTorch is not importable ({torch_error}): nothing measured, no file written")
    cuda = torch.cuda
    cuda_initialized_before = bool(cuda.is_initialized())
    environment = collect_environment(config["device"])
    if not environment["gpu_available"]:
        raise KitError(
            f"no usable GPU for {config['device']}: {environment['gpu_unavailable_reason']}; "
            "nothing measured, no CPU fallback, no file written"
        )
    index = device_index(config["device"])
    problem = _dtype_problem(torch, index, config["dtype"])
    if problem:
        raise KitError(f"--dtype {config['dtype']}: {problem} ({environment['gpu']['name']})")
    needed_bytes = sum(model_summary[key] for key in ("parameter_bytes", "input_bytes", "output_bytes"))
    if needed_bytes > environment["gpu"]["total_memory_bytes"]:
        raise KitError(
            f"weights, inputs and one output need {_gib(needed_bytes)}, more than the "
            f"{_gib(environment['gpu']['total_memory_bytes'])} the GPU announces: shrink a dimension"
        )
    host_bytes = _host_memory_bytes()
    cpu_build_bytes = model_summary["parameters"] * 4  # built in float32 on the CPU first
    if host_bytes is not None and cpu_build_bytes > host_bytes:
        raise KitError(
            f"building the model on the CPU needs {_gib(cpu_build_bytes)}, more than this "
            f"machine's {_gib(host_bytes)} of RAM: shrink --width"
        )
    device = torch.device("cuda", index)
    cuda.set_device(device)
    cuda.init()  # reset_peak_memory_stats fails before CUDA is initialized
    allocated_before = cuda.memory_allocated(device)
    reserved_before = cuda.memory_reserved(device)
    try:
        phases = measure_phases(torch, cuda, device, config)
    except PhaseFailed as failure:
        sizes = ", ".join(f"{key} {config[key]}" for key in ("batch", "context", "width", "dtype"))
        error = failure.error
        if isinstance(error, cuda.OutOfMemoryError) or "out of memory" in str(error).lower():
            raise MeasurementFailed(
                f"out of memory in phase {failure.phase} ({sizes}) on {config['device']}: "
                "nothing written; shrink one dimension and retry in a new process"
            ) from None
        raise MeasurementFailed(
            f"phase {failure.phase} failed ({sizes}): {describe_error(error)}; nothing written"
        ) from None
    fresh = allocated_before == 0 and reserved_before == 0
    return {
        "kit": KIT_NAME,
        "schema_version": RESULT_SCHEMA_VERSION,
        "tool": tool,
        "created_utc": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "environment": environment,
        "configuration": {
            **config,
            "cuda_initialized_before_measure": cuda_initialized_before,
            "allocated_bytes_before_measure": allocated_before,
            "reserved_bytes_before_measure": reserved_before,
            "fresh_process_warning": None
            if fresh
            else "PyTorch already held GPU memory in this process before the measurement: "
            "this is not a fresh process and the figures are not comparable; restart it",
        },
        "synthetic_model": model_summary,
        "phases": phases,
    }


def to_json(data):
    """Serialize a result as indented JSON.  An exact Decimal becomes a number rounded half-up to
    exactly 6 decimals and written with its own digits (through a float, 10**21 would print as
    1e+21); everything else is what json.dumps writes."""

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
    """Write ``text`` to ``path`` atomically, never replacing an existing file.

    The data goes to a temporary file in the same folder first, then is hard-linked
    under its name (which fails if the name appeared meanwhile): a crash leaves either
    no result or a whole one.  Where the file system has no hard links (EPERM and the
    like), the file is created exclusively instead and removed again if writing fails.
    The file gets the mode the user's umask gives.  Raises KitError when the name is
    taken, OSError when the data cannot be written.
    """
    data = text.encode("utf-8")
    temporary, descriptor = _create_temporary(os.path.dirname(path) or ".")
    try:
        with os.fdopen(descriptor, "wb") as stream:
            stream.write(data)
            stream.flush()
            os.fsync(stream.fileno())
        try:
            os.link(temporary, path)
        except FileExistsError:
            raise KitError(f"--output: {shown_name(path)} appeared meanwhile; nothing overwritten") from None
        except OSError:  # no hard links here: an exclusive create still never overwrites
            try:
                _write_exclusively(path, data)
            except FileExistsError:
                raise KitError(f"--output: {shown_name(path)} appeared meanwhile; nothing overwritten") from None
    finally:
        try:  # noqa: SIM105 -- contextlib would be imported for this one line
            os.unlink(temporary)
        except FileNotFoundError:  # removed by someone else: nothing left to clean
            pass


def measure_to_file(config, output, tool):
    """The whole measurement: refuse an unusable output first, measure, then write atomically.

    Warnings PyTorch raises meanwhile are not printed: they are recorded in the result's
    ``environment.field_errors``.
    """
    check_new_output(output)
    with CapturedWarnings():
        result = measure(config, tool)
    environment = result.get("environment")
    if PYTORCH_WARNINGS and isinstance(environment, dict) and isinstance(environment.get("field_errors"), dict):
        environment["field_errors"][PYTORCH_WARNINGS_FIELD] = " | ".join(PYTORCH_WARNINGS)
    try:
        write_new_file(output, to_json(result))
    except OSError as error:
        raise KitError(
            f"--output: cannot write {shown_name(output)}: {describe_error(error)}; nothing written"
        ) from None
    return result


def format_phase_table(result):
    def mib(value_bytes):
        return f"{rounded(decimal_ratio(value_bytes, MIB_BYTES), 2)}"

    header = ("phase", "ms", "end alloc MiB", "peak alloc MiB", "peak reserved MiB")
    rows = [header]
    for record in result["phases"]:
        label = record["phase"]
        if "repetition" in record:
            label += f" #{record['repetition']}"
        if "passes" in record:
            label += f" x{record['passes']}"
        rows.append(
            (
                label,
                f"{rounded(decimal_ratio(record['nanoseconds'], 10**6), 3)}",
                mib(record["end_allocated_bytes"]),
                mib(record["peak_allocated_bytes"]),
                mib(record["peak_reserved_bytes"]),
            )
        )
    widths = [max(len(row[column]) for row in rows) for column in range(len(header))]
    return "\n".join(
        "  ".join(
            cell.ljust(widths[0]) if column == 0 else cell.rjust(widths[column]) for column, cell in enumerate(row)
        )
        for row in rows
    )


# <<< notebook


class _Parser(argparse.ArgumentParser):
    """Usage errors become one line (KitError) instead of usage text and exit."""

    def error(self, message):
        raise KitError(one_line(message))

    def parse_args(self, args=None, namespace=None):
        namespace, extras = self.parse_known_args(args, namespace)
        if extras:  # shown with repr, unlike argparse's own message: a value may hold a newline
            raise KitError("unrecognized arguments: " + " ".join(shown(extra) for extra in extras))
        return namespace


class _StdoutFailed(Exception):
    """Standard output could not be written: a closed pipe, a full disk, a closed descriptor."""


class _GuardedStdout:
    """sys.stdout while a command runs: a failed write raises _StdoutFailed, so that main tells
    it apart from the command's own errors (print() and argparse's help write here too)."""

    def __init__(self, stream):
        self.stream = stream

    def _call(self, name, *args):
        if self.stream is None:  # Python found descriptor 1 closed at start-up
            raise _StdoutFailed(None)
        try:
            return getattr(self.stream, name)(*args)
        except (OSError, ValueError) as error:  # ValueError: the stream was closed
            raise _StdoutFailed(error) from None

    def write(self, text):
        return self._call("write", text)

    def flush(self):
        return self._call("flush")

    def __getattr__(self, name):
        return getattr(self.stream, name)


def _say(message, prefix="error: "):
    """One line on stderr, starting with the script's name; a closed stderr is not an error."""
    try:
        sys.stderr.write(f"mesure_memoire.py: {prefix}{one_line(message)}\n")
        sys.stderr.flush()
    except (AttributeError, OSError, ValueError):
        pass


def _stdout_failed(failure, stream):
    """Report an unwritable stdout: nothing for a closed pipe (as POSIX tools do), else one line.

    The interpreter flushes stdout again at exit; pointing the real descriptor at os.devnull
    keeps that flush from printing a second error.
    """
    error = failure.args[0] if failure.args else None
    if not isinstance(error, BrokenPipeError):
        _say("cannot write the output: " + (describe_error(error) if error else "standard output is closed"))
    if stream is not None and stream is sys.__stdout__:
        try:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, stream.fileno())
            os.close(devnull)
        except (OSError, ValueError):
            pass
    return 1


def _emit(args, data, formatter):
    # The JSON and the text come from the same data.
    sys.stdout.write(to_json(data) if args.json else formatter(data) + "\n")


def _command_estimate(args):
    _emit(args, estimate_weights(args.parameters, args.bits, args.reserve_gib), format_estimate)


def _command_environment(args):
    _emit(args, collect_environment(args.device), format_environment)


def _command_measure(args):
    config = measure_config(
        args.device, args.batch, args.context, args.width, args.dtype, args.warmup, args.repeats, args.seed
    )
    result = measure_to_file(config, args.output, tool="mesure_memoire.py")
    warning = result["configuration"]["fresh_process_warning"]
    if warning:
        print(f"warning: {warning}", file=sys.stderr)
    print(format_phase_table(result))
    print(f"Result written to {args.output}")


def build_parser():
    parser = _Parser(prog="mesure_memoire.py", description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    estimate = commands.add_parser("estimate", help="weight memory from a parameter count, no GPU")
    estimate.add_argument("--parameters", required=True, help="number of parameters, a positive integer")
    estimate.add_argument("--bits", required=True, help="storage width per parameter in bits (4, 8, 16, 32 ...)")
    estimate.add_argument(
        "--reserve-gib", default="0", help="extra GiB you assume on top of the weights (a hypothesis; default 0)"
    )
    estimate.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    estimate.set_defaults(func=_command_estimate)

    environment = commands.add_parser("environment", help="diagnose Python, PyTorch and the chosen GPU")
    environment.add_argument("--device", required=True, help="the GPU to inspect, written cuda:N")
    environment.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    environment.set_defaults(func=_command_environment)

    measure_parser = commands.add_parser("measure", help="measure the synthetic MLP phase by phase on a GPU")
    measure_parser.add_argument("--device", required=True, help="the GPU to measure, written cuda:N")
    measure_parser.add_argument("--output", required=True, help="new JSON file for the result (never overwritten)")
    measure_parser.add_argument("--batch", default="1", help="batch size (default 1)")
    measure_parser.add_argument("--context", default="16", help="positions per input row (default 16)")
    measure_parser.add_argument("--width", default="64", help="model width; the hidden layer is 4x (default 64)")
    measure_parser.add_argument("--dtype", default="float32", help="float32, float16 or bfloat16 (default float32)")
    measure_parser.add_argument("--warmup", default="1", help="warm-up passes, 0 or more (default 1)")
    measure_parser.add_argument("--repeats", default="2", help="measured warm passes, 1 or more (default 2)")
    measure_parser.add_argument("--seed", default="0", help="seed of the weights and inputs (default 0)")
    measure_parser.set_defaults(func=_command_measure)
    return parser


def main(argv=None) -> int:
    """Run one command; returns the exit status (0, 1: stdout unwritable, 2: refused, 3: measurement failed,
    130: interrupted).  --help raises SystemExit, as argparse does."""
    stdout, sys.stdout = sys.stdout, _GuardedStdout(sys.stdout)
    try:
        try:
            args = build_parser().parse_args(argv)
            args.func(args)
        except SystemExit:  # --help: what argparse printed must reach stdout too
            sys.stdout.flush()
            raise
        sys.stdout.flush()
    except KitError as error:
        _say(error)
        return error.exit_code
    except _StdoutFailed as failure:
        return _stdout_failed(failure, stdout)
    except KeyboardInterrupt:
        _say("interrupted (Ctrl-C); no partial file left behind", prefix="")
        return 130
    finally:
        sys.stdout = stdout
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
