"""Shared helpers: the repository root, and running a kit script as a new user would."""

import contextlib
import hashlib
import os
import subprocess
import sys
import types
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


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


@pytest.fixture
def stand_in_gpu(monkeypatch):
    """A stand-in for a visible CUDA GPU, because no GPU can be had here.

    It patches the few torch.cuda queries the kit makes, so that the collector and the
    refusals can be exercised; it allocates nothing and proves nothing about real GPUs.
    Call the returned function to change the device count or the announced memory.
    """
    import torch

    def install(count=1, total_memory=80 * 2**30, bf16=True):
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
        monkeypatch.setattr(torch.cuda, "get_device_properties", lambda index: properties)
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda index: (9, 0))
        monkeypatch.setattr(torch.cuda, "mem_get_info", lambda index: (total_memory - 2**30, total_memory))
        monkeypatch.setattr(torch.cuda.memory, "get_allocator_backend", lambda: "native")
        monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda including_emulation=True: bf16)
        monkeypatch.setattr(torch.cuda, "device", lambda index: contextlib.nullcontext())
        monkeypatch.setattr(torch.version, "cuda", "13.0")
        return properties

    install()
    return install


class RecordingCudaStandIn:
    """A stand-in for torch.cuda, because no GPU can be had here: it records the order of
    the protocol's calls and returns fixed counters.  For ordering tests only.

    ``observe`` (optional) is called at each call and its value recorded with it;
    ``fail_on_synchronize`` raises the given exception at that (1-based) synchronize call.
    """

    def __init__(self, observe=None, fail_on_synchronize=None):
        self.calls = []
        self.observe = observe or (lambda: None)
        self.fail_on_synchronize = fail_on_synchronize or (0, None)
        self.synchronize_count = 0

    def _record(self, name, value=None):
        self.calls.append((name, self.observe()))
        return value

    def synchronize(self, device):
        self.synchronize_count += 1
        number, error = self.fail_on_synchronize
        if number == self.synchronize_count:
            raise error
        self._record("synchronize")

    def memory_allocated(self, device):
        return self._record("memory_allocated", 1000)

    def memory_reserved(self, device):
        return self._record("memory_reserved", 2000)

    def reset_peak_memory_stats(self, device):
        self._record("reset_peak_memory_stats")

    def max_memory_allocated(self, device):
        return self._record("max_memory_allocated", 1500)

    def max_memory_reserved(self, device):
        return self._record("max_memory_reserved", 2500)
