"""Shared helpers: the repository root, and running a kit script as a new user would."""

import contextlib
import ctypes
import getpass
import hashlib
import os
import signal
import socket
import subprocess
import sys
import types
from fractions import Fraction
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
# Under the mutation pass (mutmut), the mutant is chosen per process; its name in the environment
# would make every script run in a child process look for mutmut's configuration and fail.
# Children then run the unmutated functions, as they would anyway (their module is __main__).
os.environ.pop("MUTANT_UNDER_TEST", None)
# Under the mutation pass, ROOT is mutmut's copy of the kit (mutants/), whose scripts are rewritten
# (bigger than a member may be, importing mutmut, unlike MANIFEST.json); the files as shipped are in the
# folder above it.  Tests that build or check the release from the kit's own files read them there.
SHIPPED_ROOT = ROOT.parent if ROOT.name == "mutants" and (ROOT.parent / "MANIFEST.json").is_file() else ROOT
import torch  # noqa: E402

# One thread per test process: the suite's two workers share two cores, and PyTorch's pools in each would
# fight over them (about 15 CPU-seconds of the suite).  Under the mutation pass, mutmut forks one child per
# mutant from the process that ran the whole suite first; a child's first parallel CPU kernel would then
# wait for worker threads the fork did not copy: one thread, no pool to lose.
torch.set_num_threads(1)
if SHIPPED_ROOT != ROOT and torch.get_num_interop_threads() != 1:  # settable once per process
    torch.set_num_interop_threads(1)


def sigint_as_from_a_terminal():
    """``preexec_fn`` for a child that is sent a real SIGINT.  A shell starts its background jobs
    with SIGINT ignored and Python keeps an ignored SIGINT, so a suite run with ``&`` (or by a
    tool started so) would see the child ignore it; a user's Ctrl-C reaches a foreground one."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


_LIBC = ctypes.CDLL(None, use_errno=True)  # resolved here: a child between fork and exec only calls it


def signal_main_thread(pid, number):
    """Send signal ``number`` to the main thread of process ``pid`` (tgkill), where a single-threaded program (the
    sweep, the GPU validator) takes it: kill() would let a test process's other thread (PyTorch's) take it
    instead, and its handler run while the main thread holds the signal blocked."""
    if _LIBC.tgkill(pid, pid, number) != 0:
        raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()))


def left_running(pid):
    """Whether this process's child ``pid`` was left unreaped by the program under test, which
    must reap each child it starts before it returns (one left is killed here)."""
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:  # reaped: it had ended before the program returned
        return False
    os.kill(pid, signal.SIGKILL)  # still this process's child: its number cannot have been reused
    os.waitpid(pid, 0)
    return True


def private_texts(sentinel, folder):
    """What no output of the kit may hold: a sentinel set in the environment, the host's and the user's
    names, and the paths of the kit, of ``folder`` (its working folder), of the home folder and of Python."""
    home = os.path.expanduser("~")
    return [
        sentinel,
        socket.gethostname(),
        getpass.getuser(),
        str(ROOT),
        str(folder),
        home,
        sys.prefix,
        "site-packages",
    ]


def run_script(script, *args, python_flags=(), cwd=None, env=None, python=sys.executable):
    """Run ``python [flags] ROOT/script args`` in a new process; returns the CompletedProcess."""
    return subprocess.run(
        [python, *python_flags, str(ROOT / script), *map(str, args)],
        capture_output=True,
        text=True,
        cwd=cwd,
        env=env,
        timeout=120,
    )


def assert_one_line_refusal(completed, *fragments, exit_code=2):
    """A refusal: the exit status, one line on stderr naming the reason, no traceback, no stdout."""
    assert completed.returncode == exit_code, completed
    lines = completed.stderr.splitlines()
    assert len(lines) == 1, completed.stderr
    assert "Traceback" not in completed.stderr
    assert completed.stdout == ""
    for fragment in fragments:
        assert fragment in lines[0], (fragment, lines[0])


def code_cells_as_script(notebook):
    """The notebook's code cells joined into one script, as on a GPU box with a plain python3 and no Jupyter."""
    return "\n\n".join("".join(cell["source"]) for cell in notebook["cells"] if cell["cell_type"] == "code") + "\n"


def current_device(monkeypatch):
    """A stand-in for torch.cuda.device (no GPU here): returns the list whose last item is CUDA's current
    device, 0 until a device context says otherwise."""
    current = [0]

    @contextlib.contextmanager
    def device(index):
        current.append(index)
        yield
        current.pop()

    monkeypatch.setattr(torch.cuda, "device", device)
    return current


def no_gpu_here():
    """Skip a test of the real no-GPU path where a GPU is visible: there the kit would measure for real."""
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is visible here: the no-GPU path cannot run for real")


def tree_digest(root):
    """Every file under ``root`` (relative path -> SHA-256 and mode): equal before and after a refusal."""
    digest = {}
    for folder, _, names in os.walk(root):
        for name in names:
            path = os.path.join(folder, name)
            if os.path.islink(path) or not os.path.isfile(path):
                digest[os.path.relpath(path, root)] = "not a regular file"
                continue
            with open(path, "rb") as stream:
                digest[os.path.relpath(path, root)] = (hashlib.sha256(stream.read()).hexdigest(), os.stat(path).st_mode)
    return digest


class UnwritableStdout:
    """A stand-in for a standard output whose writes fail (a full disk, a closed pipe, a closed
    file: the error given); it has no file descriptor, so nothing real is touched."""

    def __init__(self, error):
        self.error = error

    def write(self, text):
        raise self.error

    def flush(self):
        raise self.error

    def fileno(self):
        raise ValueError("no file descriptor")


@pytest.fixture
def stand_in_gpu(monkeypatch):
    """A stand-in for a visible CUDA GPU, because no GPU can be had here.

    It patches the few torch.cuda queries the kit makes, so that the collector and the
    refusals can be exercised; it allocates nothing and proves nothing about real GPUs.
    Call the returned function to change the device count or the announced memory.
    """
    import torch

    def install(count=1, total_memory=80 * 2**30, bf16=True):
        def on_a_device(answer):
            # Each per-device query must name a visible device by its index (None is refused too).
            def query(index, *args, **kwargs):
                if not (isinstance(index, int) and 0 <= index < count):
                    raise WrongDevice(f"a query named device {index!r}; {count} visible")
                return answer(*args, **kwargs)

            return query

        properties = types.SimpleNamespace(
            name="Stand-in GPU",
            major=9,
            minor=0,
            total_memory=total_memory,
            multi_processor_count=132,
            uuid="GPU-STANDIN-UUID-0000",
            serial="STANDIN-SERIAL-1234",
            pci_bus_id=7,
        )
        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
        monkeypatch.setattr(torch.cuda, "device_count", lambda: count)
        monkeypatch.setattr(torch.cuda, "get_device_properties", on_a_device(lambda: properties))
        monkeypatch.setattr(torch.cuda, "get_device_capability", on_a_device(lambda: (9, 0)))
        monkeypatch.setattr(torch.cuda, "mem_get_info", on_a_device(lambda: (total_memory - 2**30, total_memory)))
        monkeypatch.setattr(torch.cuda.memory, "get_allocator_backend", lambda: "native")
        monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda including_emulation=True: bf16)
        monkeypatch.setattr(torch.cuda, "device", on_a_device(contextlib.nullcontext))
        monkeypatch.setattr(torch.version, "cuda", "13.0")
        # The BLAS workspace queries (PyTorch 2.13 and later; 2.11 and 2.12 lack them): these stand-in sizes
        # are PyTorch's NVIDIA defaults.  Set whether or not this PyTorch has them.
        monkeypatch.setattr(
            torch.backends.cuda, "cublas_workspace_size", lambda size=None: 8 * 2**20 + 128 * 2**10, raising=False
        )
        monkeypatch.setattr(torch.backends.cuda, "cublaslt_workspace_size", lambda size=None: 2**20, raising=False)
        # The allocator settings PyTorch parsed, as its memory snapshot holds them: its defaults.
        monkeypatch.setattr(torch.cuda.memory, "_snapshot", lambda: {"allocator_settings": DEFAULT_SNAPSHOT_SETTINGS})
        return properties

    install()
    return install


# torch.cuda.memory._snapshot()'s allocator_settings under PyTorch's defaults, as PyTorch 2.4 to 2.15 build it
# (the raw configuration text beside the parsed values; SIZE_MAX handed over as the int64 -1).
DEFAULT_SNAPSHOT_SETTINGS = {
    "PYTORCH_CUDA_ALLOC_CONF": "",
    "max_split_size": -1,
    "garbage_collection_threshold": 0.0,
    "expandable_segments": False,
    "roundup_power2_divisions": dict.fromkeys((str(2**index) for index in range(16)), 0),
}


class WrongDevice(AssertionError):
    """A torch.cuda call named another device than the measured one (None included)."""


class RecordingCudaStandIn:
    """A stand-in for torch.cuda, because no GPU can be had here: it records the order of
    the protocol's calls and the device each names, and returns fixed counters.  For
    ordering tests only; it proves nothing about real GPU figures.

    Every call must name ``device`` (the measured device): another one, or None, raises
    WrongDevice, which fails the phase and so the test.  ``observe`` (optional) is called
    at each call and its value recorded with it; ``fail_on_synchronize`` raises the given
    exception at that (1-based) synchronize call.  ``requested=False`` stands in for a
    PyTorch whose memory_stats lacks the requested-bytes counters.  Subclasses change the
    counters by overriding ``levels``.
    """

    def __init__(self, observe=None, fail_on_synchronize=None, device="dev", requested=True, device_ms=0.25):
        self.calls = []
        self.devices = []
        self.device = device
        self.observe = observe or (lambda: None)
        self.fail_on_synchronize = fail_on_synchronize or (0, None)
        self.synchronize_count = 0
        self.requested = requested
        self.device_ms = device_ms
        self.Event = lambda enable_timing=False: _StandInEvent(self, enable_timing)

    def levels(self):
        """The counters: current and peak allocated, reserved and requested bytes."""
        return {
            "allocated": 1000,
            "reserved": 2000,
            "peak_allocated": 1500,
            "peak_reserved": 2500,
            "requested": 900,
            "peak_requested": 1400,
        }

    def reset_peaks(self):
        """What reset_peak_memory_stats does to the counters (nothing, for fixed ones)."""

    def _check(self, name, device):
        self.devices.append((name, device))
        if device is None or device != self.device:
            raise WrongDevice(f"{name}({device!r}) on a measurement of {self.device!r}")

    def _record(self, name, value=None):
        self.calls.append((name, self.observe()))
        return value

    def synchronize(self, device):
        self._check("synchronize", device)
        self.synchronize_count += 1
        number, error = self.fail_on_synchronize
        if number == self.synchronize_count:
            raise error
        self._record("synchronize")

    def memory_allocated(self, device):
        self._check("memory_allocated", device)
        return self._record("memory_allocated", self.levels()["allocated"])

    def memory_reserved(self, device):
        self._check("memory_reserved", device)
        return self._record("memory_reserved", self.levels()["reserved"])

    def memory_stats(self, device):
        self._check("memory_stats", device)
        levels = self.levels()
        stats = {"allocated_bytes.all.current": levels["allocated"]}
        if self.requested:
            stats.update(
                {
                    "requested_bytes.all.current": levels["requested"],
                    "requested_bytes.all.peak": levels["peak_requested"],
                }
            )
        return self._record("memory_stats", stats)

    def reset_peak_memory_stats(self, device):
        self._check("reset_peak_memory_stats", device)
        self.reset_peaks()
        self._record("reset_peak_memory_stats")

    def max_memory_allocated(self, device):
        self._check("max_memory_allocated", device)
        return self._record("max_memory_allocated", self.levels()["peak_allocated"])

    def max_memory_reserved(self, device):
        self._check("max_memory_reserved", device)
        return self._record("max_memory_reserved", self.levels()["peak_reserved"])

    def current_stream(self, device):
        self._check("current_stream", device)
        self._record("current_stream")
        return types.SimpleNamespace(device=device)


class _StandInEvent:
    """A stand-in for torch.cuda.Event: records where it is recorded; its elapsed time is fixed."""

    def __init__(self, recorder, enable_timing):
        self.recorder, self.enable_timing, self.recorded = recorder, enable_timing, None
        recorder._record("Event")

    def record(self, stream):
        self.recorder._check("event.record", stream.device)
        self.recorded = len(self.recorder.calls)  # when: the start must be recorded before the end
        self.recorder._record("event.record")

    def elapsed_time(self, end):
        assert self.enable_timing, "elapsed_time needs events created with enable_timing"
        assert end.enable_timing, "elapsed_time needs events created with enable_timing"
        assert self.recorded is not None, "elapsed_time of an event never recorded"
        assert end.recorded is not None, "elapsed_time of an event never recorded"
        assert self.recorded < end.recorded, "elapsed_time from an event to itself or to an earlier one"
        return self.recorder._record("elapsed_time", self.recorder.device_ms)


# --- part "mesure": helpers shared by the feature files of mesure_memoire.py ------------------------
import mesure_memoire  # noqa: E402 -- importable once ROOT is on sys.path

MESURE_SCRIPT = str(ROOT / "mesure_memoire.py")

MIB = 2**20
GIB = 2**30


@pytest.fixture
def no_earlier_warnings(monkeypatch):
    """Warnings PyTorch raised in earlier tests would be reported in field_errors: start from none."""
    monkeypatch.setattr(mesure_memoire, "PYTORCH_WARNINGS", [])


def config(**overrides):
    values = dict(device="cuda:0", batch=1, context=16, width=64, dtype="float32", warmup=1, repeats=2, seed=0)
    values.update(overrides)
    return mesure_memoire.measure_config(**values)


def kit_error_of(function, *args):
    """The KitError message ``function(*args)`` raises."""
    with pytest.raises(mesure_memoire.KitError) as caught:
        function(*args)
    return str(caught.value)


@pytest.fixture
def folder(tmp_path, monkeypatch):
    """The working folder: an existing result, a FIFO, a subfolder; the cwd of in-process cases."""
    (tmp_path / "existing.json").write_bytes(b'{"mine": true}\n')
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "kept.txt").write_text("kept\n")
    os.mkfifo(tmp_path / "fifo")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(mesure_memoire, "PYTORCH_WARNINGS", [], raising=False)
    return tmp_path


def assert_one_line(err, *fragments, prog="mesure_memoire.py"):
    """An in-process refusal's stderr: one line, starting with the program's name, naming each fragment,
    no traceback; returns the line (``assert_one_line_refusal`` is its counterpart for a subprocess)."""
    lines = err.splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith(f"{prog}: "), lines[0]
    assert "Traceback" not in err
    for fragment in fragments:
        assert fragment in lines[0], (fragment, lines[0])
    return lines[0]


def run_in_process(capsys, folder, argv):
    before = tree_digest(folder)
    code = mesure_memoire.main(argv)
    captured = capsys.readouterr()
    assert tree_digest(folder) == before
    return code, captured


MEASURE = ["measure", "--device", "cuda:0"]
# A small run's options after "measure"; MEASURE_TRIAL with the command.
SMALL_TRIAL = [
    "--device",
    "cuda:0",
    "--batch",
    "1",
    "--context",
    "16",
    "--width",
    "64",
    "--dtype",
    "float32",
    "--warmup",
    "1",
    "--repeats",
    "2",
]
MEASURE_TRIAL = ["measure", *SMALL_TRIAL]


def plan(batch, context, width, dtype, warmup=1, repeats=2):
    """The prediction (memory_plan) for a run of these sizes on cuda:0, seed 0."""
    return mesure_memoire.memory_plan(
        mesure_memoire.measure_config("cuda:0", batch, context, width, dtype, warmup, repeats, 0)
    )


def stand_in_measurement(monkeypatch, recorder):
    """Route measure() through the real CPU model with a recording stand-in for the counters."""
    import torch

    real_measure_phases = mesure_memoire.measure_phases
    monkeypatch.setattr(torch.cuda, "set_device", lambda device: None)
    monkeypatch.setattr(torch.cuda, "init", lambda: None)
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda device: 0)
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda device: 0)
    assert recorder.device == torch.device("cpu")  # the real model runs on the CPU

    def on_the_cpu(torch_module, cuda, device, config):
        assert device == torch.device("cuda", mesure_memoire.device_index(config["device"]))
        return real_measure_phases(torch_module, recorder, torch.device("cpu"), config)

    monkeypatch.setattr(mesure_memoire, "measure_phases", on_the_cpu)


def host_memory(monkeypatch, page_bytes, pages):
    """The host's RAM as os.sysconf tells it: pages of a page size (other names asked of the real one)."""
    real, answers = os.sysconf, {"SC_PAGE_SIZE": page_bytes, "SC_PHYS_PAGES": pages}
    monkeypatch.setattr(os, "sysconf", lambda name: answers[name] if name in answers else real(name))


def raising(error):
    """A stand-in for a function that raises ``error`` whatever it is called with."""

    def raise_it(*args, **kwargs):
        raise error

    return raise_it


def plain_id(value):
    """A parameter's id in ASCII letters, digits, dots and dashes, for a text, bytes or a list (see plain_ids);
    None, pytest's own id, for anything else."""
    import re

    if not isinstance(value, (str, bytes, list, tuple)):
        return None
    text = value.decode("latin-1") if isinstance(value, bytes) else value
    text = text if isinstance(text, str) else " ".join(map(str, text))
    return re.sub(r"[^A-Za-z0-9.-]+", "_", text)[:40] or "empty"


def plain_ids(cases):
    """Plain ASCII ids, unique by their number: the mutation pass selects tests by id, and ids holding
    quotes, brackets or escapes were not found again when it ran a second session in the same process."""
    return [f"{number:02d}-" + plain_id(case[0]) for number, case in enumerate(cases)]


# --- part "tools": the maintainer's tools importable by name (test_notebook.py, test_release.py) ---
sys.path.insert(1, str(ROOT / "tools"))


# --- part "calculator": helpers of test_calculator.py and test_results.py ---------------------------------


def call_calculator(capsys, *args):
    """calcul_forfaits.main(args) in this process: (exit status, stdout, stderr)."""
    import calcul_forfaits

    status = calcul_forfaits.main([str(arg) for arg in args])
    captured = capsys.readouterr()
    return status, captured.out, captured.err


def calculator_refusal(capsys, *args):
    """A refusal of calcul_forfaits.main(args): exit 2, nothing on stdout, one stderr line naming the
    program; returns that line."""
    status, out, err = call_calculator(capsys, *args)
    assert (status, out) == (2, ""), (status, out, err)
    assert_one_line(err, prog="calcul_forfaits.py: error")
    assert err.endswith("\n"), err
    return err


def half_up_cost(fraction):
    """An independent rounding of a positive cost in USD, with fractions: half-up to four significant digits or
    to the cent, whichever is finer ("0.0002392" for 452.00 USD / 1,890,000; "18.53"; "3648.00")."""
    places = 2
    while fraction * 10**places < 1000:  # fewer than four significant digits before the point
        places += 1
    units = (fraction * 10**places + Fraction(1, 2)).__floor__()
    if places > 2 and units == 10**4:  # 9.9995 rounds up to 10.00, four significant digits still
        units, places = units // 10, places - 1
    digits = str(units).rjust(places + 1, "0")
    return f"{digits[:-places]}.{digits[-places:]}"


# What measure_phases measures after the phases on a GPU whose BLAS workspaces are kept: no per-call workspace.
NO_PER_CALL = {product: {"allocated_bytes": 0, "requested_bytes": 0} for product in ("fc1", "fc2")}
# --- the user-visible messages that several tests compare whole: each one's words in this one table ---------
# (a change of wording is one edit here, with the code and the README).
MESSAGES = {
    "no CUDA or ROCm build": "this PyTorch build has no CUDA or ROCm support",
    "no GPU visible": "torch.cuda.is_available() is False (no GPU visible, or driver/runtime problem)",
    "cannot write the output": "cannot write the output: {error}",
    "stdout closed": "standard output is closed",
    "matplotlib not importable": "matplotlib is not importable in this kernel (the tables stay)",
    "matplotlib too old": "matplotlib {version} cannot draw: 3.5 or later is needed (the tables stay)",
    "no figure": "No figure: {why}",
    "figure: nothing to draw": "Nothing to draw: this kernel wrote no measurement.\n",
    "interrupted, no partial file": "mesure_memoire.py: interrupted ({signal}); no partial file left behind\n",
    "--output empty": "--output: a new file name is required",
    "device out of range": "{device} is out of range: PyTorch sees {count} device(s)",
    "--output cannot create": "--output: cannot create {name}: {error}",
    "--output no hard links": (
        "--output: cannot create {name}: its folder's file system has no hard links ({error}), which the "
        "never-overwriting write needs"
    ),
    "--output appeared meanwhile": "--output: {name} appeared meanwhile; nothing overwritten",
    "--output cannot write": "--output: cannot write {name}: {error}; nothing written",
    "not a fresh process": (
        "PyTorch already held GPU memory in this process before the measurement: this is not a fresh process and "
        "the figures are not comparable; restart it"
    ),
    "PyTorch too old": "PyTorch 2.4 or later is needed to measure; this is PyTorch {version}",
    "BLAS workspaces beyond the allowance": (
        "the BLAS workspaces measured ({kept} bytes kept, {per_call} per call) exceed the plan's {allowance}-byte "
        "allowance: --plan and its fit rule understate this run"
    ),
    # A refusal for a missing GPU or PyTorch says where to run the command and what works here (issue 57).
    "run it on the GPU box": (
        "run this on the GPU box, with a CUDA or ROCm build of PyTorch (measure --plan works here)"
    ),
    "PyTorch not importable, run it on the GPU box": (
        "PyTorch is not importable ({error}): run this on the GPU box, with a CUDA or ROCm build of PyTorch "
        "(measure --plan works here)"
    ),
    "no usable GPU, run it on the GPU box": (
        "no usable GPU for {device}: {reason}; no CPU fallback: run this on the GPU box, with a CUDA or ROCm build "
        "of PyTorch (measure --plan works here)"
    ),
    "dtype not supported": "--dtype {dtype}: {problem} ({gpu})",
    "bfloat16 not native": "bfloat16 is not supported natively by this GPU",
    "float16 needs 5.3": "float16 arithmetic needs compute capability 5.3 or newer",
    "host RAM too small": (
        "building the model on the CPU needs {needed} GiB, more than this machine's {available} GiB of RAM: "
        "shrink --width"
    ),
    "set-up step failed": "{step} failed on {device}: {error}",
    "phase out of memory": (
        "out of memory in phase {phase} ({dimensions}) on {device}: shrink one dimension and retry in a new "
        "process; nothing written"
    ),
    "phase failed": "phase {phase} failed ({dimensions}): {error}; nothing written",
    "seeding failed": "seeding failed: {error}",
    "--device not cuda:N": "--device: expected cuda:N (for example cuda:0), got {device}",
    "--device and --output required unless --plan": (
        "--device and --output are required (unless --plan, which measures nothing and writes nothing)"
    ),
    "tool: the kit missing": "{prog}: error: mesure_memoire.py is missing from the kit's folder (the tool imports it)"
    "\n",
    "validator interrupted": (
        "gpu_validation.py: interrupted ({signal}): the running child killed; "
        "the verdict and archive of the checks decided written\n"
    ),
    "torch import error, scrubbed": (
        '{type} at import; --debug (or python -c "import torch") shows PyTorch\'s message'
    ),
    # PyTorch's text withheld from a refusal: the refusal names the option that shows it (issue 57).
    "withheld: --debug shows it": "{type} (text withheld; --debug or the notebook's DEBUG shows it)",
    "PyTorch not importable": "PyTorch is not importable",
    "torch is not PyTorch": (
        "the module named torch is not PyTorch (it lacks torch.cuda, torch.backends or torch.version)"
    ),
    "withheld text": "WithheldText: PyTorch's {name} is not {expected} (withheld)",
    "GPU properties unreadable": "the properties of {device} cannot be read",
    "allocator settings refused": "PyTorch refused its allocator settings (its message is not kept: it may echo them)",
}


def error_line(message, prog="mesure_memoire.py"):
    """A refusal as the program prints it on stderr: its name, "error", the message, one line."""
    return f"{prog}: error: {message}\n"


NOTHING_MEASURED = "nothing measured, nothing written"


def refused(message):
    """A refusal of measure or sweep before its GPU work, as its line says it: the message, then NOTHING_MEASURED."""
    return f"{message}; {NOTHING_MEASURED}"


def message_pattern(key, **values):
    """MESSAGES[key] as a regular expression: each field given stands for its value, any other for any text
    (for a variable part this machine cannot fix, such as an operating system's wording)."""
    import re
    import string

    parts = []
    for literal, field, _, _ in string.Formatter().parse(MESSAGES[key]):
        parts.append(re.escape(literal))
        if field is not None:
            parts.append(re.escape(str(values[field])) if field in values else ".+")
    return "".join(parts)


# --- part "notebook": one Run All in a real kernel, shared by test_notebook.py and test_figure.py ----------------


@pytest.fixture(scope="session")
def executed_notebook(tmp_path_factory):
    """A copy of the notebook run top to bottom in one real ipykernel (CPU PyTorch, no GPU), then, in the same kernel,
    a crafted measurement in place of step 3's and the figure cell again (id "figure-again"): (its folder, its cells
    by id, the committed notebook's SHA-256 before the run).  One kernel start for both files' tests."""
    import nbformat
    from nbclient import NotebookClient

    notebook_path = ROOT / "mesure-memoire.ipynb"
    folder = tmp_path_factory.mktemp("kernel")
    before = hashlib.sha256(notebook_path.read_bytes()).hexdigest()
    notebook = nbformat.read(notebook_path, as_version=4)
    nbformat.write(notebook, folder / notebook_path.name)
    crafted = (ROOT / "tests" / "data" / "report" / "bfloat16.json").read_text(encoding="utf-8")
    figure = next(cell for cell in notebook.cells if cell.id == "run-figure")
    notebook.cells += [
        nbformat.v4.new_code_cell(f"import json\nmeasurement = json.loads({crafted!r})", id="crafted-measurement"),
        nbformat.v4.new_code_cell(figure.source, id="figure-again"),
    ]
    NotebookClient(
        notebook, kernel_name="python3", timeout=120, resources={"metadata": {"path": str(folder)}}
    ).execute()
    return folder, {cell.id: cell for cell in notebook.cells}, before


# --- part "plan": counter records for the verdict rules (test_plan.py, test_plan_fit.py) ---------------------


def hand_made_records(settings, workspace=0, extra=None):
    """Records whose counters equal the prediction (plus a workspace after the first forward)."""
    plan = mesure_memoire.memory_plan(settings)
    records, allocated, requested = [], 0, 0
    for predicted in plan["phases"]:
        record = {
            "phase": predicted["phase"],
            "baseline_allocated_bytes": allocated,
            "baseline_requested_bytes": requested,
        }
        for key in ("passes", "repetition"):
            if key in predicted:
                record[key] = predicted[key]
        grown = workspace if predicted["phase"] == "cold_forward" else 0
        record["end_allocated_bytes"] = allocated + grown + predicted["end_allocated_bytes"]
        record["peak_allocated_bytes"] = allocated + grown + predicted["peak_allocated_bytes"]
        record["end_requested_bytes"] = requested + grown + predicted["end_requested_bytes"]
        record["peak_requested_bytes"] = requested + grown + predicted["peak_requested_bytes"]
        for key, value in (extra or {}).get(len(records), {}).items():
            record[key] += value
        records.append(record)
        allocated, requested = allocated + grown, requested + grown
        if predicted["phase"] in ("model_load", "inputs"):
            allocated += predicted["end_allocated_bytes"]
            requested += predicted["end_requested_bytes"]
    return records, plan
