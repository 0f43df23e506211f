"""``mesure_memoire.py measure ARGUMENTS...`` in a fresh process on a stand-in for a visible CUDA GPU, because no
GPU can be had here: real PyTorch (which reads its environment variables as usual), its torch.cuda queries
answered with fixed figures, the phases run on the CPU with the suite's recording stand-in for the counters.
It proves nothing about a GPU.  Where a GPU is visible, the real measurement runs, unpatched."""

import contextlib
import sys
import types
from pathlib import Path

TESTS = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(TESTS), str(TESTS.parent)]

import mesure_memoire  # noqa: E402 -- after the path


def stand_in_gpu(torch):
    from conftest import RecordingCudaStandIn

    total = 80 * 2**30
    properties = types.SimpleNamespace(
        name="Stand-in GPU", major=9, minor=0, total_memory=total, multi_processor_count=132
    )
    cuda = torch.cuda
    answers = {
        "is_available": lambda: True,
        "device_count": lambda: 1,
        "get_device_properties": lambda index: properties,
        "get_device_capability": lambda index: (9, 0),
        "mem_get_info": lambda index: (total - 2**30, total),
        "is_bf16_supported": lambda including_emulation=True: True,
        "device": lambda index: contextlib.nullcontext(),
        "set_device": lambda device: None,
        "init": lambda: None,
        "memory_allocated": lambda device: 0,
        "memory_reserved": lambda device: 0,
    }
    for name, answer in answers.items():
        setattr(cuda, name, answer)
    cuda.memory.get_allocator_backend = lambda: "native"
    torch.version.cuda = "13.0"
    cpu, real_phases = torch.device("cpu"), mesure_memoire.measure_phases

    def on_the_cpu(torch_module, cuda_module, device, config):
        return real_phases(torch_module, RecordingCudaStandIn(device=cpu), cpu, config)

    mesure_memoire.measure_phases = on_the_cpu


# PyTorch imported by the kit, as measure imports it: what it says while it loads is the kit's to keep or withhold.
with mesure_memoire.CapturedPyTorch("--debug" in sys.argv):
    torch, why_not = mesure_memoire.import_torch()
if torch is not None and not torch.cuda.is_available():
    stand_in_gpu(torch)
sys.exit(mesure_memoire.main(["measure", *sys.argv[1:]]))
