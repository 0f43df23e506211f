"""`measure --plan`: the prediction by hand, the command without PyTorch, and the fit check it feeds."""

import copy
import itertools
import json

import pytest
import torch

# Semi-private PyTorch APIs (present in 2.11 to 2.15, the version matrix): the dispatch mode that sees each
# op, and weak references to storages.  Nothing in the kit uses them.
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils._python_dispatch import TorchDispatchMode

import mesure_memoire
from conftest import (
    GIB,
    MEASURE_TRIAL,
    MIB,
    NO_PER_CALL,
    NOTHING_MEASURED,
    ROOT,
    RecordingCudaStandIn,
    assert_one_line,
    config,
    hand_made_records,
    host_memory,
    plain_id,
    plain_ids,
    plan,
    run_script,
)

ALLOWANCE = 256 * MIB

# PyTorch warnings recorded by earlier tests would show in field_errors: each test starts from none.
pytestmark = pytest.mark.usefixtures("no_earlier_warnings")


def test_large_blocks_carry_their_slack():
    predicted = plan(8, 1024, 4096, "bfloat16")
    slack = [(p["end_allocated_slack_bytes"], p["peak_allocated_slack_bytes"]) for p in predicted["phases"]]
    # Weights: two blocks above 1 MiB (the biases are small); input, output 64 MiB; hidden 2 blocks.
    assert slack == [(2 * MIB, 2 * MIB), (MIB, MIB)] + [(MIB, 2 * MIB)] * 4
    # Exactly 1 MiB is still the small pool (no slack); the 4 MiB hidden activations are not.
    boundary = plan(2, 128, 1024, "float32")["phases"]
    assert [(p["end_allocated_slack_bytes"], p["peak_allocated_slack_bytes"]) for p in boundary[1:3]] == [
        (0, 0),
        (0, 2 * MIB),
    ]
    assert [
        (p["end_allocated_slack_bytes"], p["peak_allocated_slack_bytes"]) for p in plan(1, 16, 64, "float32")["phases"]
    ] == [(0, 0)] * 6


def test_the_allocator_block_rule():
    blocks = [mesure_memoire.allocated_block_bytes(n) for n in (1, 511, 512, 513, 1024, 1025, 2**20 + 1)]
    assert blocks == [512, 512, 512, 1024, 1024, 1536, 2**20 + 512]


# --- the command ------------------------------------------------------------------------------------


@pytest.mark.whole_kit
def test_plan_runs_without_pytorch_and_writes_nothing(tmp_path):
    completed = run_script("mesure_memoire.py", *MEASURE_TRIAL, "--plan", "--json", python_flags=("-S",), cwd=tmp_path)
    assert completed.returncode == 0, completed.stderr
    assert completed.stderr == ""
    assert json.loads(completed.stdout)["predicted_peak_allocated_bytes"] == 268604928
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    ("arguments", "facts"),
    [
        (["--width", "0"], ["--width: expected a positive whole number", ", got '0'"]),
        (["--dtype", "float64"], ["--dtype: expected one of float32, float16, bfloat16", ", got 'float64'"]),
        (["--output", "x.json"], ["--plan writes nothing", "drop --output"]),
    ],
    ids=plain_id,
)
def test_plan_refusals(tmp_path, monkeypatch, capsys, arguments, facts):
    monkeypatch.chdir(tmp_path)
    base = MEASURE_TRIAL[:3]  # the device alone: each option below is then given once
    assert mesure_memoire.main([*base, "--plan", *arguments]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert_one_line(captured.err, *facts)
    assert list(tmp_path.iterdir()) == []


HUGE_COUNTS = [
    (["--repeats", "9" * 30], ["--repeats: expected a whole number from 1 to 1000", "(a measurement is a short"]),
    (["--warmup", "1001"], ["--warmup: expected a whole number from 0 to 1000", "bounded trial), got '1001'"]),
]


@pytest.mark.parametrize("mode", [["--plan", "--json"], ["--output", "new.json"]], ids=["plan", "output"])
@pytest.mark.parametrize(("arguments", "facts"), HUGE_COUNTS, ids=plain_ids(HUGE_COUNTS))
def test_counts_are_bounded_with_their_reason_before_any_prediction(
    tmp_path, monkeypatch, capsys, mode, arguments, facts
):
    """A 30-digit count gave an OverflowError traceback, also from measure --output (the prediction runs
    before PyTorch is checked), and --warmup 1000000000 a MemoryError."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(mesure_memoire, "memory_plan", lambda config: pytest.fail("predicted an unbounded count"))
    assert mesure_memoire.main([*MEASURE_TRIAL[:3], *arguments, *mode]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert_one_line(captured.err, *facts)
    assert list(tmp_path.iterdir()) == []


def test_any_warm_up_count_is_predicted_exactly_by_the_real_model():
    """One pass stands for any count: 1000 warm-up passes, each releasing the last output first."""
    records, check, _ = run_on_the_cpu(config(warmup=1000, repeats=1))
    assert check == {"agrees": True, "disagreements": [], "not_checked": []}
    assert records[3]["passes"] == 1000


def test_output_is_required_unless_plan_and_json_needs_plan(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert mesure_memoire.main(MEASURE_TRIAL) == 2
    assert_one_line(capsys.readouterr().err, "--device and --output are required (unless --plan")
    assert mesure_memoire.main([*MEASURE_TRIAL, "--json", "--output", "x.json"]) == 2
    assert_one_line(capsys.readouterr().err, "--json and --memory-gib go with --plan")
    assert list(tmp_path.iterdir()) == []


# --- the fit check (stand-in GPU) --------------------------------------------------------------------


def test_the_fit_check_uses_the_predicted_peak_and_the_free_memory(stand_in_gpu, monkeypatch, tmp_path, capsys):
    """At the byte: the predicted peak plus the margin fits (the host check, made to refuse, comes next), one
    byte less is refused before the kit touches the GPU.  A failed mem_get_info: test_pytorch_values.py."""
    predicted = plan(8, 1024, 4096, "bfloat16")
    peak, needed = predicted["predicted_peak_allocated_bytes"], predicted["needs_free_bytes"]
    host_memory(monkeypatch, 4096, 0)
    sizes = ["--batch", "8", "--context", "1024", "--width", "4096", "--dtype", "bfloat16"]
    for free, refusal in ((needed, "building the model on the CPU"), (needed - 1, "the predicted peak")):
        monkeypatch.setattr(torch.cuda, "mem_get_info", lambda index, free=free: (free, 80 * GIB))
        monkeypatch.setattr(torch.cuda, "set_device", lambda device: pytest.fail("the GPU was touched"))
        assert mesure_memoire.main([*MEASURE_TRIAL[:3], *sizes, "--output", str(tmp_path / "o.json")]) == 2
        err = capsys.readouterr().err
        assert_one_line(err, refusal, NOTHING_MEASURED)
    facts = f"peak, {peak} bytes (1.06 GiB), exceeds the {needed - 1} bytes", " free (mem_get_info) less a 1.00 GiB"
    assert_one_line(err, *facts, ": shrink --context (the activations dominate)")
    assert list(tmp_path.iterdir()) == []


def test_the_readme_plan_command_and_figures_match_the_code(capsys):

    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    line = next(
        line for line in readme.splitlines() if line.startswith("python mesure_memoire.py measure") and "--plan" in line
    )
    assert mesure_memoire.main(line.split()[2:]) == 0
    assert "Predicted peak allocated:" in capsys.readouterr().out
    assert mesure_memoire.BLAS_WORKSPACE_ALLOWANCE_BYTES == 256 * MIB
    assert "allowance of 256 MiB" in readme
    assert mesure_memoire.FIT_MARGIN_BYTES == 2**30
    assert "less a margin of 1 GiB" in readme
    assert mesure_memoire.ALLOCATOR_ROUNDING_BYTES == 512
    assert "512-byte block" in readme


# --- the plan's text ---------------------------------------------------------------------------------

PLAN_TEXT = """\
Plan for measure (arithmetic only, no GPU, nothing written): batch 1, context 16, width 64, float32
Per phase, above the phase's baseline; requested bytes exact, allocated rounded to 512-byte blocks:
phase            end req MiB  peak req MiB  end alloc MiB  peak alloc MiB
model_load             0.126         0.126          0.126           0.126
inputs                 0.004         0.004          0.004           0.004
cold_forward           0.004         0.031          0.004           0.031
warmup x3              0.004         0.031          0.004           0.031
warm_forward #1        0.004         0.031          0.004           0.031
warm_forward #2        0.004         0.031          0.004           0.031
BLAS workspace allowance on the first forward: 256.000 MiB (the largest default of any backend; measure measures \
the workspace)
Predicted peak allocated: 268604928 bytes = 0.25 GiB, in cold_forward
measure needs 1342346752 bytes = 1.25 GiB free (the peak plus a 1.00 GiB margin); a card needs 2416088576 bytes = \
2.25 GiB (including a 1.00 GiB allowance for the CUDA/ROCm context).
Host memory: building the model on the CPU needs 132352 bytes = 0.00 GiB of RAM (measure checks it).
Not included: the CUDA/ROCm context, the BLAS handles and kernel code, which the allocator's counters never see, \
reserved memory above allocated (the allocator's segments)."""


def test_the_plan_text_exactly(capsys):
    assert mesure_memoire.main([*MEASURE_TRIAL[:-4], "--warmup", "3", "--repeats", "2", "--plan"]) == 0
    assert capsys.readouterr().out == PLAN_TEXT + "\n"


# --- the fit check -----------------------------------------------------------------------------------


def fit_plan(weights, peak, batch=1, context=1):
    tensors = {"0.weight": weights - 3, "0.bias": 1, "2.weight": 1, "2.bias": 1}
    return {
        "predicted_peak_allocated_bytes": peak,
        "fit_margin_bytes": GIB,
        "needs_free_bytes": peak + GIB,
        "tensor_bytes": tensors,
        "configuration": {"batch": batch, "context": context},
    }


@pytest.mark.parametrize(
    ("weights", "peak", "batch", "context", "advice"),
    [
        (1000, 2000, 1, 1, "shrink --width (the weights dominate)"),  # exactly half the peak: weights
        (999, 2000, 1, 1, "shrink --context (the activations dominate)"),
        (999, 2000, 5, 5, "shrink --context (the activations dominate)"),  # a tie: --context
        (999, 2000, 6, 5, "shrink --batch (the activations dominate)"),
    ],
)
def test_the_advice_names_what_dominates(weights, peak, batch, context, advice):
    message = mesure_memoire.fit_problem(
        fit_plan(weights, peak, batch, context), {"gpu": {"mem_get_info_free_bytes": GIB}}
    )
    assert message.endswith(": " + advice)


def test_the_synthetic_model_description_exactly():
    model = mesure_memoire.synthetic_model(config(batch=2, context=3, width=5, dtype="float16"))
    assert model == {
        "architecture": "Linear(5 -> 20) -> GELU -> Linear(20 -> 5)",
        "hidden_width": 20,
        "execution": "eval mode, torch.inference_mode, no autocast, no gradients, no optimizer",
        "parameters": 225,
        "parameter_bytes": 450,
        "parameter_tensors": [
            {"name": "0.weight", "shape": [20, 5], "bytes": 200},
            {"name": "0.bias", "shape": [20], "bytes": 40},
            {"name": "2.weight", "shape": [5, 20], "bytes": 200},
            {"name": "2.bias", "shape": [5], "bytes": 10},
        ],
        "input_shape": [2, 3, 5],
        "input_bytes": 60,
    }


def test_the_plan_document_s_phase_levels():
    """The plan's text (test_the_plan_text_exactly) shows its other figures; the JSON alone holds each phase's level."""
    plan = mesure_memoire.memory_plan(config(batch=1, context=2, width=3, warmup=0, repeats=1))
    assert (plan["kit"], plan["plan_schema_version"]) == ("iteragpu-lab-v1", 1)
    peak = 2048 + 512 + 256 * MIB + 1024
    assert plan["predicted_peak_allocated_bytes"] == peak
    # The level at each phase's peak: its baseline (the allowance stays from the first forward on), its own peak.
    assert [phase["predicted_peak_level_allocated_bytes"] for phase in plan["phases"]] == [2048, 2560, peak, peak]
    assert plan["phases"][3]["repetition"] == 1


CPU = torch.device("cpu")


class LiveTensorBytes(TorchDispatchMode):
    """The bytes of the live storages that PyTorch's ops create on one device type, and their peak."""

    def __init__(self, device_type):
        super().__init__()
        self.device_type = device_type
        self.storages = {}  # the storage's address -> (weak reference, requested bytes)
        self.peak_requested = self.peak_allocated = 0

    def live_sizes(self):
        for key, (ref, _) in list(self.storages.items()):
            if ref.expired():
                del self.storages[key]
        return [size for _, size in self.storages.values()]

    def requested(self):
        return sum(self.live_sizes())

    def allocated(self):
        return sum(mesure_memoire.allocated_block_bytes(size) for size in self.live_sizes())

    def reset_peaks(self):
        self.peak_requested, self.peak_allocated = self.requested(), self.allocated()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        inputs = {tensor.untyped_storage()._cdata for tensor in tensors_in((args, kwargs))}
        result = func(*args, **kwargs)
        for tensor in tensors_in(result):
            if tensor.device.type != self.device_type:
                continue
            storage = tensor.untyped_storage()
            if storage._cdata in inputs:  # a view or an in-place op: no new memory
                continue
            ref = StorageWeakRef(storage)
            self.storages.setdefault(ref.cdata, (ref, storage.nbytes()))
        # Memory only rises when an op creates its outputs, while its inputs are still alive.
        self.peak_requested = max(self.peak_requested, self.requested())
        self.peak_allocated = max(self.peak_allocated, self.allocated())
        return result


def tensors_in(value):
    """The tensors in an op's arguments or results: nested tuples, lists and dicts (no private pytree)."""
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, dict):
        value = list(value.values())
    return [tensor for item in value for tensor in tensors_in(item)] if isinstance(value, (tuple, list)) else []


class LiveTensorCounters(RecordingCudaStandIn):
    """The counter stand-in, reporting what LiveTensorBytes sees of the real ops (reserved = allocated)."""

    def __init__(self, tracker, device=CPU):
        super().__init__(device=device)
        self.tracker = tracker

    def levels(self):
        tracker = self.tracker
        allocated = tracker.allocated()
        return {
            "allocated": allocated,
            "reserved": allocated,
            "peak_allocated": tracker.peak_allocated,
            "peak_reserved": tracker.peak_allocated,
            "requested": tracker.requested(),
            "peak_requested": tracker.peak_requested,
        }

    def reset_peaks(self):
        self.tracker.reset_peaks()

    def mem_get_info(self, device):
        self._check("mem_get_info", device)
        return self._record("mem_get_info", (GIB, GIB + self.levels()["reserved"]))


def run_on_the_cpu(settings):
    """measure_phases with the real model on the CPU, its counters taken from the live storages."""
    tracker = LiveTensorBytes("cpu")
    with tracker:
        records, summary, per_call, _ = mesure_memoire.measure_phases(torch, LiveTensorCounters(tracker), CPU, settings)
    return mesure_memoire.check_against_plan(records, mesure_memoire.memory_plan(settings), per_call)


CONFIGURATIONS = [
    dict(batch=1, context=16, width=64, warmup=1, repeats=2),  # the README's small trial
    dict(batch=3, context=5, width=3, warmup=3, repeats=2),  # every tensor below one 512-byte block
    dict(batch=2, context=33, width=40, warmup=0, repeats=1),  # no warm-up line
    dict(batch=2, context=128, width=256, warmup=2, repeats=1),  # activations above 1 MiB in float32
]


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("sizes", CONFIGURATIONS)
def test_the_prediction_matches_the_live_tensors_of_the_real_model(sizes, dtype):
    records, check, workspace = run_on_the_cpu(config(dtype=dtype, **sizes))
    if dtype == "float32":
        # On the CPU the float32 build is the model itself, so model_load is checked too.
        assert check == {"agrees": True, "disagreements": [], "not_checked": []}
    else:
        # The CPU also counts the float32 build before the cast, which a GPU's counters never
        # see: only model_load's peak may differ (the transfer is checked on the meta device).
        assert {(d["phase"], d["counter"]) for d in check["disagreements"]} <= {
            ("model_load", "peak_requested_bytes"),
            ("model_load", "peak_allocated_bytes"),
        }
        assert all(r["verdict"] == "agrees" for r in records if r["phase"] != "model_load")
    assert workspace["measured_bytes"] == 0  # no BLAS workspace on the CPU
    forward = next(r for r in records if r["phase"] == "cold_forward")
    element = torch.empty((), dtype=getattr(torch, dtype)).element_size()
    activation = sizes["batch"] * sizes["context"] * 4 * sizes["width"] * element
    # Both hidden activations were alive together, and nothing else was allocated.
    assert forward["peak_requested_bytes"] - forward["baseline_requested_bytes"] == 2 * activation


def test_the_transfer_allocates_one_tensor_per_parameter_on_the_target_device():
    """Module.to(device, dtype), as model_load runs it, watched on the meta device."""
    for dtype in mesure_memoire.DTYPE_BYTES:
        settings = config(width=48, dtype=dtype)
        predicted = mesure_memoire.memory_plan(settings)["phases"][0]
        tracker = LiveTensorBytes("meta")
        with tracker, torch.inference_mode():
            model = mesure_memoire.build_model(torch, 48).to(device="meta", dtype=getattr(torch, dtype)).eval()
            assert tracker.requested() == predicted["end_requested_bytes"]
            assert tracker.allocated() == predicted["end_allocated_bytes"]
        assert tracker.peak_requested == predicted["peak_requested_bytes"]  # no transient copy on the target
        assert tracker.peak_allocated == predicted["peak_allocated_bytes"]
        assert len(tracker.live_sizes()) == 4 == len(list(model.parameters()))


class LinearWithPerCallWorkspace(torch.nn.Linear):
    """A Linear that takes a workspace for each call and gives it back before it returns, as PyTorch 2.4's
    cuBLASLt path does on a GPU (gemm_and_bias in aten/src/ATen/cuda/CUDABlas.cpp: 1 MiB by default)."""

    def __init__(self, width_in, width_out, workspace_bytes):
        super().__init__(width_in, width_out)
        self.workspace_bytes = workspace_bytes

    def forward(self, inputs):
        output = super().forward(inputs)
        workspace = torch.empty(self.workspace_bytes, dtype=torch.uint8)
        del workspace
        return output


class GELUWithTemporary(torch.nn.GELU):
    """A GELU that also holds an unpredicted temporary while it runs: an error the check must see."""

    def forward(self, inputs):
        temporary = torch.empty(3 * 2**18, dtype=torch.uint8)
        output = super().forward(inputs)
        del temporary
        return output


def run_with_workspaces(monkeypatch, settings, gelu=torch.nn.GELU):
    """measure_phases on the real CPU model whose products take 1 MiB (fc1) and 2 MiB (fc2) per call."""

    def build_model(torch_module, width):
        return torch.nn.Sequential(
            LinearWithPerCallWorkspace(width, 4 * width, MIB),
            gelu(),
            LinearWithPerCallWorkspace(4 * width, width, 2 * MIB),
        )

    monkeypatch.setattr(mesure_memoire, "build_model", build_model)
    tracker = LiveTensorBytes("cpu")
    with tracker:
        records, _, per_call, _ = mesure_memoire.measure_phases(torch, LiveTensorCounters(tracker), CPU, settings)
    return records, per_call


def test_a_workspace_taken_per_call_is_measured_per_product_and_predicted_while_it_runs(monkeypatch):
    settings = config()  # the spec's first size: the workspaces are far above its activations
    records, per_call = run_with_workspaces(monkeypatch, settings)
    assert per_call == {
        "fc1": {"allocated_bytes": MIB, "requested_bytes": MIB},
        "fc2": {"allocated_bytes": 2 * MIB, "requested_bytes": 2 * MIB},
    }
    plan = mesure_memoire.memory_plan(settings)
    checked, check, workspace = mesure_memoire.check_against_plan(copy.deepcopy(records), plan, per_call)
    assert check == {"agrees": True, "disagreements": [], "not_checked": []}
    assert workspace["per_call"] == per_call
    # Not measured, none is predicted: each forward's peaks disagree, and only those.
    _, check, _ = mesure_memoire.check_against_plan(copy.deepcopy(records), plan)
    forwards = {"cold_forward", "warmup", "warm_forward"}
    peaks = {"peak_requested_bytes", "peak_allocated_bytes"}
    assert {(d["phase"], d["counter"]) for d in check["disagreements"]} == set(itertools.product(forwards, peaks))
    # Each product's own figure counts: fc2's workspace as small as fc1's is too little.
    smaller = {**per_call, "fc2": per_call["fc1"]}
    _, check, _ = mesure_memoire.check_against_plan(copy.deepcopy(records), plan, smaller)
    assert {d["phase"] for d in check["disagreements"]} == forwards


@pytest.mark.parametrize("requested", [4 * MIB - 100, None], ids=["requested", "no requested counters"])
def test_the_first_product_s_workspace_is_predicted_beside_its_output(requested):
    """The request is held while fc1 runs; where PyTorch counts no requested bytes, the 4 MiB block it took."""
    records, plan = hand_made_records(config())
    for record in records:
        if record["phase"] not in ("model_load", "inputs"):  # fc1's 16 KiB output and its workspace at the peak
            record["peak_allocated_bytes"] += 4 * MIB - 16384
            record["peak_requested_bytes"] += (requested or 0) - 16384
        if requested is None:
            record["baseline_requested_bytes"] = None
    per_call = {**NO_PER_CALL, "fc1": {"allocated_bytes": 4 * MIB, "requested_bytes": requested}}
    assert mesure_memoire.check_against_plan(records, plan, per_call)[1]["agrees"] is True
    assert mesure_memoire.check_against_plan(records, plan, NO_PER_CALL)[1]["agrees"] is False


def test_a_per_call_workspace_hides_no_error_at_a_moment_no_product_runs(monkeypatch):
    # Activations of 2 MiB: GELU's moment (two activations) is within 0.5 MiB of fc2's (its 2 MiB workspace beside
    # GELU's output), and GELU's unpredicted 0.75 MiB makes it the peak, where no product runs.
    settings = config(batch=2, context=128, width=512)
    records, per_call = run_with_workspaces(monkeypatch, settings, gelu=GELUWithTemporary)
    _, check, _ = mesure_memoire.check_against_plan(records, mesure_memoire.memory_plan(settings), per_call)
    assert {d["phase"] for d in check["disagreements"]} == {"cold_forward", "warmup", "warm_forward"}


# --- the verdict rules, on hand-made records ------------------------------------------------------


@pytest.mark.parametrize(
    ("phase", "counter", "change"),
    [
        (1, "end_requested_bytes", 1),  # requested bytes are exact
        (1, "end_requested_bytes", -1),
        (1, "end_allocated_bytes", 512),  # a small block has no slack
        (2, "peak_requested_bytes", 4),  # a transient allocation in the first forward
        (4, "peak_allocated_bytes", -512),
        (5, "end_allocated_bytes", 1),
    ],
)
def test_each_counter_is_checked(phase, counter, change):
    records, plan = hand_made_records(config(), extra={phase: {counter: change}})
    checked, check, _ = mesure_memoire.check_against_plan(records, plan)
    assert check["agrees"] is False
    (disagreement,) = check["disagreements"]
    assert disagreement["phase"] == checked[phase]["phase"]
    assert disagreement["counter"] == counter
    assert disagreement["difference_bytes"] == change
    assert checked[phase]["verdict"] == "disagrees"
    assert checked[phase]["disagreements"] == [disagreement]
    assert [r["verdict"] for i, r in enumerate(checked) if i != phase] == ["agrees"] * (len(checked) - 1)
    every = list(mesure_memoire.PREDICTED_COUNTERS)  # under the defaults, with requested bytes: all, no reason
    assert {(r["checked_counters"] == every, r["not_checked_reason"]) for r in checked} == {(True, None)}


def test_a_large_block_may_hold_up_to_its_slack_more_and_beyond_it_the_upper_bound_is_the_closest():
    settings = config(batch=2, context=128, width=1024)  # the weights are 16 MiB blocks: 2 MiB of slack
    for extra in (2**20, 2 * 2**20, 2 * 2**20 + 512):
        records, plan = hand_made_records(settings, extra={0: {"end_allocated_bytes": extra}})
        records[0]["peak_allocated_bytes"] = records[0]["end_allocated_bytes"]
        bound = plan["phases"][0]["end_allocated_bytes"] + 2 * 2**20
        disagreements = mesure_memoire.check_against_plan(records, plan)[1]["disagreements"]
        expected = [(bound, 512)] * 2 if extra > 2 * 2**20 else []  # the end and the peak
        assert [(d["predicted_bytes"], d["difference_bytes"]) for d in disagreements] == expected, extra


def test_without_requested_counters_the_allocated_ones_decide_the_verdict():
    records, plan = hand_made_records(config())
    for record in records:
        record["baseline_requested_bytes"] = record["end_requested_bytes"] = record["peak_requested_bytes"] = None
    checked, check, workspace = mesure_memoire.check_against_plan(records, plan)
    assert {r["verdict"] for r in checked} == {"agrees"}
    missing = "this PyTorch's memory_stats has no requested-bytes counters"
    assert {r["not_checked_reason"] for r in checked} == {missing}
    assert {tuple(r["checked_counters"]) for r in checked} == {("end_allocated_bytes", "peak_allocated_bytes")}
    assert check == {"agrees": True, "disagreements": [], "not_checked": []}
    assert workspace["measured_bytes"] == 0


def test_a_disagreement_names_its_repetition_and_the_closest_bound():
    records, plan = hand_made_records(
        config(), extra={4: {"end_requested_bytes": -4}, 5: {"peak_allocated_bytes": 512}}
    )
    _, check, _ = mesure_memoire.check_against_plan(records, plan)
    base = {"phase": "warm_forward", "relative_to": "the phase's baseline"}
    assert check["disagreements"] == [
        {
            **base,
            "repetition": 1,
            "counter": "end_requested_bytes",
            "predicted_bytes": 4096,
            "measured_bytes": 4092,
            "difference_bytes": -4,
        },
        {
            **base,
            "repetition": 2,
            "counter": "peak_allocated_bytes",
            "predicted_bytes": 32768,
            "measured_bytes": 33280,
            "difference_bytes": 512,
        },
    ]
    # Below its lower bound, the first forward's end is compared with the output it must hold.
    records, plan = hand_made_records(config(), extra={2: {"end_allocated_bytes": -512}})
    disagreement = mesure_memoire.check_against_plan(records, plan)[1]["disagreements"][0]
    assert (disagreement["counter"], disagreement["predicted_bytes"], disagreement["difference_bytes"]) == (
        "end_allocated_bytes",
        4096,
        -512,
    )


def test_the_first_forward_s_peaks_are_checked_with_the_measured_workspace():
    workspace = 8 * 2**20 + 128 * 2**10
    records, plan = hand_made_records(config(), workspace=workspace, extra={2: {"peak_requested_bytes": -4}})
    (disagreement,) = mesure_memoire.check_against_plan(records, plan)[1]["disagreements"]
    assert (disagreement["counter"], disagreement["predicted_bytes"], disagreement["difference_bytes"]) == (
        "peak_requested_bytes",
        32768 + workspace,
        -4,
    )
    # A 2 MiB output (one large block, 1 MiB of slack): the peak may sit up to that slack below.
    settings = config(batch=4, context=128, width=1024)
    slack = mesure_memoire.memory_plan(settings)["phases"][2]["end_allocated_slack_bytes"]
    assert slack == 2**20
    for change, agrees in ((-slack, True), (-slack - 512, False)):
        records, plan = hand_made_records(settings, workspace=workspace, extra={2: {"peak_allocated_bytes": change}})
        check = mesure_memoire.check_against_plan(records, plan)[1]
        assert check["agrees"] is agrees, change
        if not agrees:
            assert check["disagreements"][0]["difference_bytes"] == -512
