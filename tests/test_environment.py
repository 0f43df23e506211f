"""`mesure_memoire.py environment`: a diagnosis that degrades field by field and stays private."""

import errno
import importlib.util
import json
import os
import sys
import types
import warnings

import pytest
import torch

import mesure_memoire
from conftest import (
    DEFAULT_SNAPSHOT_SETTINGS,
    GIB,
    MESSAGES,
    MIB,
    SHIPPED_ROOT,
    assert_one_line,
    current_device,
    error_line,
    plain_id,
    plain_ids,
    private_texts,
    raising,
    refused,
    run_script,
)

# PyTorch warnings recorded by earlier tests would show in field_errors: each test starts from none.
pytestmark = pytest.mark.usefixtures("no_earlier_warnings")


def _no_gpu_reason():
    """The reason the real kit gives on this machine: it depends on the build (CPU, CUDA or ROCm)."""
    if torch.cuda.is_available():
        pytest.skip("a GPU is visible here: the no-GPU path cannot run for real")
    if torch.version.cuda is None and getattr(torch.version, "hip", None) is None:
        return MESSAGES["no CUDA or ROCm build"]
    return MESSAGES["no GPU visible"]


def test_without_a_gpu_it_reports_none_usable_and_names_the_driver_commands(capsys):
    reason = _no_gpu_reason()
    assert mesure_memoire.main(["environment", "--device", "cuda:0", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["torch"] == torch.__version__
    assert data["torch_error"] is None
    assert data["cuda_build"] == torch.version.cuda
    assert data["hip_build"] == getattr(torch.version, "hip", None)
    assert data["device"] == "cuda:0"
    assert data["device_count"] == 0
    assert data["gpu_available"] is False
    assert data["gpu_unavailable_reason"] == reason
    assert data["python"]["version"].count(".") == 2
    assert mesure_memoire.main(["environment", "--device", "cuda:0"]) == 0
    out = capsys.readouterr().out
    assert "not the driver" in out
    assert "nvidia-smi --query-gpu=name,driver_version --format=csv" in out
    assert "amd-smi version" in out
    assert f"GPU usable            no: {reason}" in out


@pytest.mark.parametrize(
    "device",
    ["cuda", "cuda:-1", "cpu", "CUDA:0", "cuda:10000", "0"],  # the digits' grammar: test_numbers.py
)
def test_a_malformed_device_is_a_usage_error(device, capsys):
    assert mesure_memoire.main(["environment", "--device", device]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert_one_line(captured.err, "--device", "cuda:N")


@pytest.mark.whole_kit
def test_privacy_no_environment_variable_hostname_user_or_path_in_any_output(tmp_path):
    """Each command, with PyTorch and without it (-S; estimate never imports it).  The environment command with
    PyTorch is the marker test's (test_pytorch_markers.py), with the same checks: a CUDA_VISIBLE_DEVICES set to a
    sentinel there would hide the GPU that its measure needs on a GPU box.  Without PyTorch, environment exits 0
    and says why."""
    sentinel = "SENTINEL-7f3a9c-PRIVATE"
    env = dict(os.environ, ITERAGPU_PRIVATE_SENTINEL=sentinel, CUDA_VISIBLE_DEVICES=sentinel)
    runs = [
        (("-S",), ("environment", "--device", "cuda:0")),
        (("-S",), ("environment", "--device", "cuda:0", "--json")),
        ((), ("estimate", "--parameters", "7", "--bits", "4")),
        *((flags, ("measure", "--device", "cuda:0", "--output", "out.json")) for flags in ((), ("-S",))),
    ]
    completed = [
        run_script("mesure_memoire.py", *args, python_flags=flags, env=env, cwd=tmp_path) for flags, args in runs
    ]
    for text in (run.stdout + run.stderr for run in completed):
        for secret in private_texts(sentinel, tmp_path):
            assert secret not in text
    assert not (tmp_path / "out.json").exists()
    assert completed[1].returncode == 0, completed[1].stderr
    data = json.loads(completed[1].stdout)
    assert (data["torch"], data["gpu_available"], data["gpu"]) == (None, False, None)
    assert "torch" in data["torch_error"]
    assert data["gpu_unavailable_reason"] == MESSAGES["PyTorch not importable"]


def test_the_scripts_never_read_environment_variables():
    for script in ("mesure_memoire.py", "calcul_forfaits.py"):
        source = (SHIPPED_ROOT / script).read_text(encoding="utf-8")
        for reader in ("os.environ", "getenv", "gethostname", "getuser", "platform.node", "expanduser"):
            assert reader not in source, (script, reader)
        # The GPU's UUID is read once, to find the measured card among nvidia-smi's (test_card_state.py: never
        # written or printed); PATH only by the OS's search for that tool (shutil.which).
        assert source.count(".uuid") == (script == "mesure_memoire.py"), script


# The tests below use the stand_in_gpu fixture (conftest.py), because no GPU can be had
# here: they check how the collector degrades and what it keeps, not real GPU values.


def test_stand_in_gpu_fields_are_shown_and_identifiers_are_not(stand_in_gpu, capsys):
    """Each JSON field: test_the_collector_keeps_each_field_and_asks_the_chosen_device (no UUID, no serial)."""
    assert mesure_memoire.main(["environment", "--device", "cuda:0"]) == 0
    human = capsys.readouterr().out
    lines = human.splitlines()
    assert f"  PyTorch               {torch.__version__}" in lines
    assert "  CUDA build            13.0" in lines
    assert "  GPU name              Stand-in GPU" in lines
    assert "  compute capability    9.0" in lines  # a CUDA build: no architecture name after it
    assert "  mem_get_info          free 84825604096 / total 85899345920 bytes" in lines
    assert "  allocator backend     native" in lines
    assert "  memory (runtime)      85899345920 bytes = 80.00 GiB\n" in human
    assert "  allocator settings    PyTorch's defaults\n" in human
    assert "STANDIN" not in human


def test_a_warning_while_importing_pytorch_is_kept_not_printed(monkeypatch, capsys):
    import sys

    class Loader:  # a stand-in "torch" module whose import warns, as PyTorch does without NumPy
        def find_spec(self, name, path=None, target=None):

            return importlib.util.spec_from_loader(name, self) if name == "torch" else None

        def create_module(self, spec):
            return None

        def exec_module(self, module):
            for name in ("cuda", "backends", "version", "__version__", "get_float32_matmul_precision"):
                setattr(module, name, getattr(torch, name))  # the real PyTorch's API, as far as environment asks
            warnings.warn(
                "Failed to initialize NumPy (at /opt/conda/lib/site-packages/torch/x.py)", UserWarning, stacklevel=1
            )

    monkeypatch.delitem(sys.modules, "torch")
    monkeypatch.setattr(sys, "meta_path", [Loader(), *sys.meta_path])
    assert mesure_memoire.main(["environment", "--device", "cuda:0", "--json"]) == 0
    captured = capsys.readouterr()
    assert captured.err == ""
    assert json.loads(captured.out)["field_errors"]["pytorch_warnings"] == "UserWarning: Failed to initialize NumPy"


class FailingTorchImport:
    """A stand-in "torch" whose import fails with ``message``, as a missing shared library makes it fail."""

    def __init__(self, message):
        self.message = message

    def find_spec(self, name, path=None, target=None):
        if name == "torch":
            raise ImportError(self.message)
        return None


LIST_IMPORT_ERROR = "libcudnn.so.9: cannot open shared object file; searched /opt/cuda/lib:/home/alice/lib"


@pytest.fixture
def torch_import_quotes_a_list(monkeypatch):
    monkeypatch.delitem(sys.modules, "torch")
    monkeypatch.setattr(sys, "meta_path", [FailingTorchImport(LIST_IMPORT_ERROR), *sys.meta_path])


def test_an_import_error_quoting_a_path_list_is_scrubbed_in_the_refusal_of_measure(
    torch_import_quotes_a_list, capsys, tmp_path, monkeypatch
):
    monkeypatch.chdir(tmp_path)
    assert mesure_memoire.main(["measure", "--device", "cuda:0", "--output", "new.json"]) == 2
    captured = capsys.readouterr()
    scrubbed = MESSAGES["torch import error, scrubbed"].format(type="ImportError")
    said = refused(MESSAGES["PyTorch not importable, run it on the GPU box"].format(error=scrubbed))
    assert captured.err == error_line(said)
    assert mesure_memoire.main(["measure", "--device", "cuda:0", "--output", "new.json", "--debug"]) == 2
    *shown, last = capsys.readouterr().err.splitlines()
    assert "--- ImportError raised in PyTorch ---" in shown  # --debug: PyTorch's message, on the terminal only
    assert f"ImportError: {LIST_IMPORT_ERROR}" in shown
    assert f"{last}\n" == error_line(said)
    assert list(tmp_path.iterdir()) == []


def test_a_name_the_file_system_cannot_encode_keeps_its_character_in_the_refusal(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # a lone surrogate: UnicodeEncodeError quotes it as '\ud800'
    assert mesure_memoire.main(["measure", "--device", "cuda:0", "--output", "\ud800.json"]) == 2
    python_says = (
        "UnicodeEncodeError: 'utf-8' codec can't encode character '\\ud800' in position 0: surrogates not allowed"
    )
    said = MESSAGES["--output cannot create"].format(name="'\\ud800.json'", error=python_says)
    assert capsys.readouterr().err == error_line(refused(said))


# --- the device probes (stand-ins record the device index of every query) -----------------------------


@pytest.fixture
def two_devices(stand_in_gpu, monkeypatch):
    """stand_in_gpu with two devices that answer differently: device 1 as stand_in_gpu does, device 0 with
    another name, memory and BLAS workspace sizes, so that a field read from the wrong device shows."""
    properties = stand_in_gpu(count=2)
    other = types.SimpleNamespace(**{**vars(properties), "name": "Other GPU", "total_memory": 40 * GIB})
    current = current_device(monkeypatch)

    def workspace_size(size_bytes, other_bytes):
        return lambda size=None: size_bytes if current[-1] == 1 else other_bytes

    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda index: (other, properties)[index])
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda index: ((GIB, 40 * GIB), (79 * GIB, 80 * GIB))[index])
    cuda = torch.backends.cuda
    monkeypatch.setattr(cuda, "cublas_workspace_size", workspace_size(8 * MIB + 128 * 2**10, 7), raising=False)
    monkeypatch.setattr(cuda, "cublaslt_workspace_size", workspace_size(MIB, 9), raising=False)
    return types.SimpleNamespace(properties=properties)


def test_the_collector_keeps_each_field_and_asks_the_chosen_device(two_devices, monkeypatch):
    matmul = torch.backends.cuda.matmul
    monkeypatch.setattr(matmul, "allow_tf32", True)
    monkeypatch.setattr(matmul, "allow_fp16_reduced_precision_reduction", False)
    monkeypatch.setattr(matmul, "allow_bf16_reduced_precision_reduction", True)
    monkeypatch.setattr(torch, "get_float32_matmul_precision", lambda: "high")
    monkeypatch.setattr(torch.backends.cuda, "preferred_blas_library", lambda: "torch._C._BlasBackend.Cublaslt")
    monkeypatch.setattr(torch.backends.cudnn, "version", lambda: 91002)
    monkeypatch.setattr(torch.cuda.memory, "get_allocator_backend", lambda: "cudaMallocAsync")
    two_devices.properties.gcnArchName = "gfx90a"  # kept only from a ROCm build
    environment = mesure_memoire.collect_environment("cuda:1", False)
    assert set(environment["python"]) == {"version", "implementation"}
    assert set(environment["os"]) == {"name", "release", "machine"}
    del environment["python"], environment["os"]
    assert environment == {
        "torch": torch.__version__,
        "torch_error": None,
        "cuda_build": "13.0",
        "hip_build": None,
        "cudnn_or_miopen_version": 91002,
        "device": "cuda:1",
        "device_count": 2,
        "gpu_available": True,
        "gpu_unavailable_reason": None,
        "gpu": {
            "name": "Stand-in GPU",
            "compute_capability": "9.0",
            "gcn_arch_name": None,
            "multi_processor_count": 132,
            "total_memory_bytes": 80 * GIB,
            "mem_get_info_free_bytes": 79 * GIB,
            "mem_get_info_total_bytes": 80 * GIB,
            "allocator_backend": "cudaMallocAsync",
        },
        "settings": {
            "float32_matmul_precision": "high",
            "cuda_matmul_allow_tf32": True,
            "cuda_matmul_allow_fp16_reduced_precision_reduction": False,
            "cuda_matmul_allow_bf16_reduced_precision_reduction": True,
            "preferred_blas_library": "Cublaslt",
            "cublas_workspace_size_bytes": 8 * MIB + 128 * 2**10,
            "cublaslt_workspace_size_bytes": MIB,
        },
        "allocator_settings": None,  # the cudaMallocAsync backend has no snapshot: unknown
        "field_errors": {},
    }


def test_attributes_an_older_pytorch_lacks_are_null_not_errors(two_devices, monkeypatch):
    monkeypatch.delattr(torch.version, "hip")
    environment = mesure_memoire.collect_environment("cuda:1", False)
    assert environment["hip_build"] is None
    assert environment["field_errors"] == {}
    monkeypatch.setattr(torch.version, "hip", "7.0.1", raising=False)  # a ROCm build without gcnArchName
    environment = mesure_memoire.collect_environment("cuda:1", False)
    assert environment["gpu"]["gcn_arch_name"] is None
    assert environment["field_errors"] == {}
    # PyTorch 2.11 and 2.12 have no BLAS workspace queries; an older one no preferred_blas_library.
    monkeypatch.delattr(torch.backends.cuda, "cublas_workspace_size")
    monkeypatch.delattr(torch.backends.cuda, "cublaslt_workspace_size")
    monkeypatch.delattr(torch.backends.cuda, "preferred_blas_library")
    environment = mesure_memoire.collect_environment("cuda:1", False)
    assert environment["field_errors"] == {}
    for name in ("preferred_blas_library", "cublas_workspace_size_bytes", "cublaslt_workspace_size_bytes"):
        assert environment["settings"][name] is None


@pytest.mark.parametrize(
    ("count", "device", "reason"),
    [
        (2, "cuda:2", "cuda:2 is out of range: PyTorch sees 2 device(s)"),
        (None, "cuda:0", "cuda:0 is out of range: PyTorch sees None device(s)"),
    ],
)
def test_the_collector_names_a_device_out_of_range(stand_in_gpu, monkeypatch, count, device, reason):
    stand_in_gpu(count=2)
    if count is None:
        monkeypatch.setattr(torch.cuda, "device_count", lambda: 1 / 0)
    environment = mesure_memoire.collect_environment(device, False)
    assert environment["gpu_available"] is False
    assert environment["gpu"] is None
    assert environment["gpu_unavailable_reason"] == reason
    assert environment["device_count"] == count


def test_the_collector_when_the_gpu_is_not_visible_or_unreadable(stand_in_gpu, monkeypatch):
    stand_in_gpu()
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    environment = mesure_memoire.collect_environment("cuda:0", False)
    assert environment["gpu_unavailable_reason"] == (MESSAGES["no GPU visible"])
    monkeypatch.setattr(torch.version, "cuda", None)
    assert (
        mesure_memoire.collect_environment("cuda:0", False)["gpu_unavailable_reason"]
        == (MESSAGES["no CUDA or ROCm build"])
    )
    monkeypatch.setattr(torch.version, "hip", "7.0")
    assert mesure_memoire.collect_environment("cuda:0", False)["gpu_unavailable_reason"].startswith(
        "torch.cuda.is_avail"
    )
    stand_in_gpu()

    def unreadable(index):
        raise RuntimeError("no properties")

    monkeypatch.setattr(torch.cuda, "get_device_properties", unreadable)
    environment = mesure_memoire.collect_environment("cuda:0", False)
    assert environment["gpu_unavailable_reason"] == MESSAGES["GPU properties unreadable"].format(device="cuda:0")
    assert environment["gpu_available"] is False
    assert environment["gpu"] is None
    assert environment["field_errors"] == {"properties": "RuntimeError (text withheld)"}


def test_each_failing_query_leaves_null_and_names_itself(stand_in_gpu, monkeypatch):
    broken = {  # the field_errors key: the query that raises
        "float32_matmul_precision": (torch, "get_float32_matmul_precision"),
        "preferred_blas_library": (torch.backends.cuda, "preferred_blas_library"),
        "cudnn_or_miopen_version": (torch.backends.cudnn, "version"),
        "allocator_backend": (torch.cuda.memory, "get_allocator_backend"),
        "cublas_workspace_size": (torch.backends.cuda, "cublas_workspace_size"),
        "cublaslt_workspace_size": (torch.backends.cuda, "cublaslt_workspace_size"),
    }
    for owner, name in broken.values():
        monkeypatch.setattr(owner, name, raising(RuntimeError("broken")))
    environment = mesure_memoire.collect_environment("cuda:0", False)
    assert environment["field_errors"] == dict.fromkeys(broken, "RuntimeError (text withheld)")
    settings = environment["settings"]
    assert settings["float32_matmul_precision"] is settings["preferred_blas_library"] is None
    assert settings["cublas_workspace_size_bytes"] is settings["cublaslt_workspace_size_bytes"] is None
    assert environment["gpu"]["allocator_backend"] is None
    assert environment["gpu_available"] is True


def test_each_odd_text_is_null_and_its_field_error_names_it_and_what_was_expected(stand_in_gpu, monkeypatch):
    properties = stand_in_gpu()
    properties.gcnArchName = "/opt/hunter2/gfx942"
    monkeypatch.setattr(torch.version, "hip", "7.0.1", raising=False)  # gcnArchName is read from a ROCm build
    monkeypatch.setattr(torch.backends.cuda, "preferred_blas_library", lambda: "torch._C._BlasBackend.hunter2/x")
    environment = mesure_memoire.collect_environment("cuda:0", False)
    expected = {"preferred_blas_library": "a library's name", "gcn_arch_name": "an architecture's name"}
    assert environment["field_errors"] == {
        name: MESSAGES["withheld text"].format(name=name, expected=what) for name, what in expected.items()
    }
    assert environment["gpu"]["gcn_arch_name"] is environment["settings"]["preferred_blas_library"] is None
    assert "hunter2" not in mesure_memoire.to_json(environment)


# --- the environment's text --------------------------------------------------------------------------


def test_the_environment_text_names_each_field_and_says_unknown(two_devices, monkeypatch, capsys):
    """A ROCm build's GPU, its name withheld, its total unreadable, two queries failed."""
    two_devices.properties.gcnArchName = "gfx942:sramecc+:xnack-"
    two_devices.properties.major, two_devices.properties.minor = 9, 4
    two_devices.properties.name = "GPU ~hunter2"
    monkeypatch.setattr(torch.version, "hip", "7.0.1")
    monkeypatch.setattr(torch.version, "cuda", None)
    monkeypatch.delattr(torch.backends.cuda, "cublaslt_workspace_size")  # no such query: null, no line
    monkeypatch.setattr(torch.backends.cudnn, "version", lambda: 3)
    monkeypatch.setattr(torch.cuda, "mem_get_info", raising(RuntimeError("x")))
    monkeypatch.setattr(torch.cuda.memory, "get_allocator_backend", raising(RuntimeError("y")))
    assert mesure_memoire.main(["environment", "--device", "cuda:1"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[4:15] == [
        "  CUDA build            none",
        "  HIP build             7.0.1",
        "  cuDNN/MIOpen          3",
        "  device                cuda:1 (PyTorch sees 2 device(s))",
        "  GPU usable            yes",
        "  GPU name              unknown",
        "  compute capability    9.4 (gfx942:sramecc+:xnack-)",
        "  memory (runtime)      85899345920 bytes = 80.00 GiB",
        "  mem_get_info          free none / total none bytes",
        "  allocator backend     unknown",
        "  allocator settings    unknown (allocated bytes not checked)",
    ]
    assert "  setting               cublas_workspace_size_bytes = 8519680" in lines  # device 1's
    assert not any("cublaslt" in line for line in lines)
    assert [line for line in lines if "query failed" in line] == [
        "  query failed          allocator_backend: RuntimeError (text withheld)",
        "  query failed          mem_get_info: RuntimeError (text withheld)",
        "  query failed          name: WithheldText: PyTorch's name is not printable text of at most 100 characters "
        "without /, \\ or ~ (withheld)",
    ]
    assert lines[-3:] == [
        "The CUDA/HIP runtime built into PyTorch is not the driver: record the driver separately with the vendor tool.",
        "  NVIDIA nvidia-smi --query-gpu=name,driver_version --format=csv",
        "  AMD    amd-smi version",
    ]


CUDA_KERNEL_NOTE = "\nCUDA kernel errors might be asynchronously reported at some other API call"
# describe_error: an OS error's own description, never its file names; the part of a known PyTorch message
# the allow-list matches; anything else withheld.
DESCRIBED = [
    (RuntimeError("CUDA error: out of memory" + CUDA_KERNEL_NOTE), "RuntimeError: CUDA error: out of memory"),
    (
        RuntimeError("\n\n  CUDA error: no CUDA-capable device is detected  \nmore"),
        "RuntimeError: CUDA error: no CUDA-capable device is detected",
    ),
    (
        torch.OutOfMemoryError(
            "CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 139.81 GiB of which "
            "1.02 GiB is free. Process 4242 has 138 GiB memory in use. If reserved but unallocated memory is large "
            "try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation."
        ),
        "OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.",
    ),
    (
        RuntimeError("CUDA error: CUBLAS_STATUS_EXECUTION_FAILED when calling `cublasSgemm( handle, opa, opb)`"),
        "RuntimeError: CUDA error: CUBLAS_STATUS_EXECUTION_FAILED",
    ),
    (
        RuntimeError("cuDNN error: CUDNN_STATUS_NOT_INITIALIZED"),
        "RuntimeError: cuDNN error: CUDNN_STATUS_NOT_INITIALIZED",
    ),
    (AssertionError("Torch not compiled with CUDA enabled"), "AssertionError: Torch not compiled with CUDA enabled"),
    (RuntimeError("No CUDA GPUs are available"), "RuntimeError: No CUDA GPUs are available"),
    (
        RuntimeError(
            "Found no NVIDIA driver on your system. Please check that you have an NVIDIA GPU and installed a "
            "driver from http://www.nvidia.com/Download/index.aspx"
        ),
        "RuntimeError: Found no NVIDIA driver on your system",
    ),
    (
        RuntimeError("The NVIDIA driver on your system is too old (found version 11040). Please update your driver"),
        "RuntimeError: The NVIDIA driver on your system is too old",
    ),
    # A path, a URL or a setting's value inside a known message: the match stops before it.
    (
        RuntimeError("CUDA error: unspecified launch failure at /home/ana/lib/libcuda.so"),
        "RuntimeError: CUDA error: unspecified launch failure at",
    ),
    (RuntimeError("CUDA error: bad PYTORCH_NO_CUDA_MEMORY_CACHING=hunter2"), "RuntimeError: CUDA error: bad"),
    (RuntimeError("CUDA error: =hunter2"), "RuntimeError (text withheld)"),
    (RuntimeError("CUBLAS_STATUS_/home/ana"), "RuntimeError (text withheld)"),
    # Unknown text: withheld whole; only the first non-empty line is read.
    (RuntimeError("/home/ana/x.so: cannot open\nCUDA error: out of memory"), "RuntimeError (text withheld)"),
    (ValueError(), "ValueError"),
    (RuntimeError("  \n \n"), "RuntimeError"),
    # An OS error: its errno and the system's description, never the file names nor the text it was given.
    (
        OSError(errno.ENOENT, "No such file", "/home/ana/x.json"),
        f"FileNotFoundError: [Errno {errno.ENOENT}] {os.strerror(errno.ENOENT)}",
    ),
    (OSError("no such device /dev/nvidia0"), "OSError (text withheld)"),  # no errno: PyTorch's text
    (OSError(0, "hunter2 at /home/ana"), "OSError (text withheld)"),  # 0 is no error's number
]


@pytest.mark.parametrize(("error", "expected"), DESCRIBED, ids=plain_ids([(repr(error),) for error, _ in DESCRIBED]))
def test_describe_error_keeps_only_allowed_text(error, expected):
    assert mesure_memoire.describe_error(error) == expected


# --- the allocator settings: PyTorch's parsed values only, never the environment, never raw text -------

SNAPSHOT_STAND_IN = {  # torch.cuda.memory._snapshot()'s entry as PyTorch 2.4 to 2.15 build it (a stand-in: no GPU)
    "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True,secret-looking-text",
    "max_split_size": 21 * MIB,
    "garbage_collection_threshold": 0.0,
    "expandable_segments": True,
    "pinned_num_register_threads": 1,
    "release_lock_on_cudamalloc": False,
    "pinned_use_cuda_host_register": False,
    "roundup_power2_divisions": {str(2**index): (4 if index in (2, 3) else 0) for index in range(16)},
}


def test_the_snapshot_settings_are_kept_as_values_without_their_raw_text(stand_in_gpu, monkeypatch, capsys):
    monkeypatch.setattr(
        torch.cuda.memory, "_snapshot", lambda: {"segments": [], "allocator_settings": SNAPSHOT_STAND_IN}
    )
    environment = mesure_memoire.collect_environment("cuda:0", False)
    expected = {
        "max_split_size_bytes": 21 * MIB,
        "expandable_segments": True,
        "roundup_power2_divisions": {"4": 4, "8": 4},
    }
    assert environment["allocator_settings"] == {"backend": "native", **expected}
    assert "secret-looking-text" not in mesure_memoire.to_json(environment)
    assert mesure_memoire.main(["environment", "--device", "cuda:0"]) == 0
    shown = "max_split_size_bytes 22020096, expandable_segments True, roundup_power2_divisions {'4': 4, '8': 4}"
    assert f"  allocator settings    {shown}\n" in capsys.readouterr().out
    unlimited = {**SNAPSHOT_STAND_IN, "max_split_size": -1}  # SIZE_MAX as the int64 PyTorch hands over
    monkeypatch.setattr(torch.cuda.memory, "_snapshot", lambda: {"allocator_settings": unlimited})
    assert mesure_memoire.collect_environment("cuda:0", False)["allocator_settings"]["max_split_size_bytes"] is None


def test_a_division_count_of_1_rounds_nothing_and_is_not_kept_one_of_2_is(stand_in_gpu, monkeypatch):
    counts = {str(2**index): {0: 1, 1: 1, 3: 2}.get(index, 0) for index in range(16)}
    snapshot = {**DEFAULT_SNAPSHOT_SETTINGS, "roundup_power2_divisions": counts}
    monkeypatch.setattr(torch.cuda.memory, "_snapshot", lambda: {"allocator_settings": snapshot})
    assert mesure_memoire.collect_environment("cuda:0", False)["allocator_settings"]["roundup_power2_divisions"] == {
        "8": 2
    }


def test_settings_this_pytorch_cannot_tell_are_null(stand_in_gpu, monkeypatch):
    # A private API that fails for another reason than the settings (a stand-in): a failed query like another.
    monkeypatch.setattr(torch.cuda.memory, "_snapshot", raising(RuntimeError("snapshot is not supported here")))
    environment = mesure_memoire.collect_environment("cuda:0", False)
    assert environment["allocator_settings"] is None
    assert environment["field_errors"] == {"allocator_settings": "RuntimeError (text withheld)"}
    monkeypatch.delattr(torch.cuda.memory, "_snapshot", raising=False)  # no snapshot: PyTorch before 2.4
    environment = mesure_memoire.collect_environment("cuda:0", False)
    assert environment["allocator_settings"] is None
    assert "allocator_settings" not in environment["field_errors"]
    monkeypatch.setattr(torch.cuda.memory, "get_allocator_backend", lambda: 1 / 0)
    assert mesure_memoire.collect_environment("cuda:0", False)["allocator_settings"] is None  # no backend: no settings


@pytest.mark.parametrize("query", ["get_allocator_backend", "mem_get_info", "_snapshot"])
def test_a_refusal_of_the_settings_in_any_query_echoes_no_key(stand_in_gpu, monkeypatch, capsys, query):
    """On a GPU, PyTorch parses its allocator settings when CUDA starts: the first query raises (a stand-in)."""

    def refusing(*args):
        raise RuntimeError("Unrecognized CachingAllocator option: secret_key_42")

    monkeypatch.setattr(torch.cuda if query == "mem_get_info" else torch.cuda.memory, query, refusing)
    assert mesure_memoire.main(["environment", "--device", "cuda:0", "--json"]) == 0
    out = capsys.readouterr().out
    assert "secret_key_42" not in out
    settings_refused = MESSAGES["allocator settings refused"]
    assert settings_refused in json.loads(out)["field_errors"].values()
    assert mesure_memoire.main(["measure", "--device", "cuda:0", "--output", "never.json"]) == 2
    assert capsys.readouterr().err == error_line(refused(settings_refused))


@pytest.mark.parametrize(
    ("message", "refused"),
    [
        ("Unrecognized CachingAllocator option: secret_key_42", True),
        ("Unrecognized key 'secret_key_42' in Accelerator allocator config.", True),
        (
            "CUDA out of memory. Tried to allocate 2.00 MiB. If reserved but unallocated memory is large try "
            "setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.",
            False,
        ),
    ],
    ids=plain_id,
)
def test_only_a_refusal_of_the_allocator_settings_is_worded_as_one(message, refused):
    described = mesure_memoire.describe_error(RuntimeError(message))
    assert (described == mesure_memoire.ALLOCATOR_REFUSED) is refused
    assert ("secret_key_42" in described) is False


def test_the_cuda_malloc_async_backend_is_never_asked_for_a_snapshot(stand_in_gpu, monkeypatch):
    def refusing():  # a stand-in for PyTorch's: the cudaMallocAsync backend refuses a snapshot
        raise RuntimeError("Calling snapshot with backend:cudaMallocAsync is not meaningful.")

    monkeypatch.setattr(torch.cuda.memory, "_snapshot", refusing)
    monkeypatch.setattr(torch.cuda.memory, "get_allocator_backend", lambda: "cudaMallocAsync")
    environment = mesure_memoire.collect_environment("cuda:0", False)
    assert environment["allocator_settings"] is None  # unknown: no counter is checked under this backend
    assert environment["field_errors"] == {}
