"""The prediction against what real PyTorch ops allocate, run on the CPU (and the meta device).

No GPU can be had here.  ``LiveTensorBytes`` is not a stand-in: it watches the real ops that
the real model runs (a TorchDispatchMode) and counts the storages they create on one device
for as long as PyTorch keeps them alive (weak references to the storages).  So the tensors
that are alive together in each phase are PyTorch's, not numbers a stand-in is told.  The
counter stand-in (conftest's RecordingCudaStandIn) only carries those counts to the
protocol, in place of torch.cuda.

What the CPU cannot show: allocations inside a CUDA kernel (the BLAS workspace; a temporary
of the CPU-to-GPU copy), the caching allocator's own rounding (applied here by the kit's
function), and the transfer of model_load, since on the CPU a float32 model is its own copy.
The transfer is checked on the meta device instead, through the real Module.to.
"""

import importlib.util
import json

import pytest
import torch
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

import mesure_memoire
from conftest import ROOT, RecordingCudaStandIn

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
        inputs = {t.untyped_storage()._cdata for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)}
        result = func(*args, **kwargs)
        for tensor in tree_leaves(result):
            if not isinstance(tensor, torch.Tensor) or tensor.device.type != self.device_type:
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


class LiveTensorCounters(RecordingCudaStandIn):
    """The counter stand-in, reporting what LiveTensorBytes sees of the real ops (reserved = allocated)."""

    def __init__(self, tracker, device=CPU):
        super().__init__(device=device)
        self.tracker = tracker

    def levels(self):
        tracker = self.tracker
        allocated = tracker.allocated()
        return {"allocated": allocated, "reserved": allocated, "peak_allocated": tracker.peak_allocated,
                "peak_reserved": tracker.peak_allocated, "requested": tracker.requested(),
                "peak_requested": tracker.peak_requested}  # fmt: skip

    def reset_peaks(self):
        self.tracker.reset_peaks()


def config(**overrides):
    values = dict(device="cuda:0", batch=1, context=16, width=64, dtype="float32", warmup=1, repeats=2, seed=0)
    values.update(overrides)
    return mesure_memoire.measure_config(**values)


def run_on_the_cpu(settings):
    """measure_phases with the real model on the CPU, its counters taken from the live storages."""
    tracker = LiveTensorBytes("cpu")
    with tracker:
        records, summary = mesure_memoire.measure_phases(torch, LiveTensorCounters(tracker), CPU, settings)
    return mesure_memoire.check_prediction(records, mesure_memoire.predict_memory(settings))


CONFIGURATIONS = [
    dict(batch=1, context=16, width=64, warmup=1, repeats=2),  # the README's small trial
    dict(batch=3, context=5, width=3, warmup=3, repeats=2),  # every tensor below one 512-byte block
    dict(batch=2, context=33, width=40, warmup=0, repeats=1),  # no warm-up line
    dict(batch=2, context=128, width=256, warmup=2, repeats=1),  # activations above 1 MiB in float32
]


@pytest.mark.parametrize("dtype", list(mesure_memoire.DTYPE_BYTES))
@pytest.mark.parametrize("sizes", CONFIGURATIONS)
def test_the_prediction_matches_the_live_tensors_of_the_real_model(sizes, dtype):
    records, check, workspace = run_on_the_cpu(config(dtype=dtype, **sizes))
    assert [r["phase"] for r in records] == mesure_memoire.phase_names(config(**sizes))
    if dtype == "float32":
        # On the CPU the float32 build is the model itself, so model_load is checked too.
        assert check == {"agrees": True, "disagreements": [], "not_checked": []}
    else:
        # The CPU also counts the float32 build before the cast, which a GPU's counters never
        # see: only model_load's peak may differ (the transfer is checked on the meta device).
        assert {(d["phase"], d["counter"]) for d in check["disagreements"]} <= {
            ("model_load", "peak_requested_bytes"), ("model_load", "peak_allocated_bytes")
        }  # fmt: skip
        assert all(r["verdict"] == "agrees" for r in records if r["phase"] != "model_load")
    assert workspace["measured_bytes"] == 0 and workspace["requested_bytes"] == 0  # no BLAS workspace on the CPU
    forward = next(r for r in records if r["phase"] == "cold_forward")
    element = torch.empty((), dtype=getattr(torch, dtype)).element_size()
    activation = sizes["batch"] * sizes["context"] * 4 * sizes["width"] * element
    # Both hidden activations were alive together, and nothing else was allocated.
    assert forward["peak_requested_bytes"] - forward["baseline_requested_bytes"] == 2 * activation


def test_the_transfer_allocates_one_tensor_per_parameter_on_the_target_device():
    """Module.to(device, dtype), as model_load runs it, watched on the meta device."""
    for dtype in mesure_memoire.DTYPE_BYTES:
        settings = config(width=48, dtype=dtype)
        predicted = mesure_memoire.predict_memory(settings)["phases"][0]
        tracker = LiveTensorBytes("meta")
        with tracker, torch.inference_mode():
            model = mesure_memoire.build_model(torch, 48).to(device="meta", dtype=getattr(torch, dtype)).eval()
            assert tracker.requested() == predicted["end_requested_bytes"]
            assert tracker.allocated() == predicted["end_allocated_bytes"]
        assert tracker.peak_requested == predicted["peak_requested_bytes"]  # no transient copy on the target
        assert tracker.peak_allocated == predicted["peak_allocated_bytes"]
        assert len(tracker.live_sizes()) == 4 == len(list(model.parameters()))


def test_a_wrong_liveness_model_is_caught_by_the_real_run(monkeypatch):
    """If the prediction assumed the first Linear's output released before GELU writes its own,
    the real ops would contradict it: the check can fail."""
    real_forward_pass = mesure_memoire._forward_pass

    def optimistic():
        events = real_forward_pass()
        events.remove(("free", "fc1_output"))
        return [("alloc", "fc1_output"), ("free", "fc1_output")] + events[1:]

    monkeypatch.setattr(mesure_memoire, "_forward_pass", optimistic)
    records, check, _ = run_on_the_cpu(config())
    assert check["agrees"] is False
    assert {d["phase"] for d in check["disagreements"]} == {"cold_forward", "warmup", "warm_forward"}
    warm = next(d for d in check["disagreements"] if d["phase"] == "warm_forward")
    # Predicted: the GELU output and the final output, 5 x 4096 bytes; PyTorch: both hidden outputs, 8 x 4096.
    assert (warm["counter"], warm["predicted_bytes"], warm["measured_bytes"]) == ("peak_requested_bytes", 20480, 32768)


def test_a_model_that_keeps_its_activations_is_caught(monkeypatch):
    """The real protocol, with a model that keeps every activation alive: the verdicts say so."""
    real_build_model = mesure_memoire.build_model
    kept = []

    def hoarding_model(torch_module, width):
        model = real_build_model(torch_module, width)
        for layer in model:
            layer.register_forward_hook(lambda module, args, output: kept.append(output))
        return model

    monkeypatch.setattr(mesure_memoire, "build_model", hoarding_model)
    records, check, _ = run_on_the_cpu(config())
    assert not check["agrees"]
    assert [r["verdict"] for r in records][3:] == ["disagrees"] * 3  # warmup and both repetitions
    assert kept


# --- the verdict rules, on hand-made records ------------------------------------------------------


def hand_made_records(settings, workspace=0, extra=None):
    """Records whose counters equal the prediction (plus a workspace after the first forward)."""
    plan = mesure_memoire.predict_memory(settings)
    records, allocated, requested = [], 0, 0
    for predicted in plan["phases"]:
        record = {"phase": predicted["phase"], "baseline_allocated_bytes": allocated,
                  "baseline_requested_bytes": requested}  # fmt: skip
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


def test_a_workspace_is_measured_not_assumed():
    records, plan = hand_made_records(config(), workspace=8 * 2**20 + 128 * 2**10)
    checked, check, workspace = mesure_memoire.check_prediction(records, plan)
    assert check["agrees"] is True
    assert workspace["measured_bytes"] == workspace["requested_bytes"] == 8 * 2**20 + 128 * 2**10
    assert checked[2]["predicted"]["peaks_checked_plus_measured_workspace"] == {
        "allocated_bytes": 8 * 2**20 + 128 * 2**10, "requested_bytes": 8 * 2**20 + 128 * 2**10
    }  # fmt: skip
    assert checked[2]["predicted"]["peak_requested_bytes"] == 32768  # the prediction itself, without it
    assert workspace["allowance_bytes"] == mesure_memoire.BLAS_WORKSPACE_ALLOWANCE_BYTES


@pytest.mark.parametrize(
    ("phase", "counter", "change", "agrees"),
    [
        (1, "end_requested_bytes", 1, False),  # requested bytes are exact
        (1, "end_requested_bytes", -1, False),
        (1, "end_allocated_bytes", 512, False),  # a small block has no slack
        (2, "peak_requested_bytes", 4, False),  # a transient allocation in the first forward
        (4, "peak_allocated_bytes", -512, False),
        (5, "end_allocated_bytes", 1, False),
    ],
)
def test_each_counter_is_checked(phase, counter, change, agrees):
    records, plan = hand_made_records(config(), extra={phase: {counter: change}})
    checked, check, _ = mesure_memoire.check_prediction(records, plan)
    assert check["agrees"] is agrees
    (disagreement,) = check["disagreements"]
    assert disagreement["phase"] == checked[phase]["phase"] and disagreement["counter"] == counter
    assert disagreement["difference_bytes"] == change
    assert checked[phase]["verdict"] == "disagrees" and checked[phase]["disagreements"] == [disagreement]
    assert [r["verdict"] for i, r in enumerate(checked) if i != phase] == ["agrees"] * (len(checked) - 1)


def test_each_record_gets_its_prediction_and_a_verdict_with_its_reason():
    records, plan = hand_made_records(config(), extra={1: {"end_requested_bytes": 1}})
    checked, _, _ = mesure_memoire.check_prediction(records, plan)
    inputs = plan["phases"][1]
    assert checked[1]["predicted"] == {
        "end_requested_bytes": inputs["end_requested_bytes"], "peak_requested_bytes": inputs["peak_requested_bytes"],
        "end_allocated_bytes": inputs["end_allocated_bytes"], "peak_allocated_bytes": inputs["peak_allocated_bytes"],
        "relative_to": "the phase's baseline", "end_allocated_slack_bytes": inputs["end_allocated_slack_bytes"],
        "peak_allocated_slack_bytes": inputs["peak_allocated_slack_bytes"],
    }  # fmt: skip
    assert [(r["verdict"], r["verdict_reason"]) for r in checked[:3]] == [
        ("agrees", None), ("disagrees", None), ("agrees", None)
    ]  # fmt: skip
    for record in records:
        record["baseline_requested_bytes"] = None
    checked, _, _ = mesure_memoire.check_prediction(records, plan)
    assert (checked[0]["verdict"], checked[0]["verdict_reason"]) == (
        "not checked",
        "this PyTorch's memory_stats has no requested-bytes counters",
    )


def test_a_large_block_may_hold_up_to_one_mebibyte_more():
    settings = config(batch=2, context=128, width=1024)  # the weights are 16 MiB blocks
    for extra, agrees in ((2**20, True), (2 * 2**20, True), (2 * 2**20 + 1, False)):
        records, plan = hand_made_records(settings, extra={0: {"end_allocated_bytes": extra}})
        records[0]["peak_allocated_bytes"] = records[0]["end_allocated_bytes"]
        assert mesure_memoire.check_prediction(records, plan)[1]["agrees"] is agrees, extra


def test_without_requested_counters_the_verdict_is_not_checked():
    records, plan = hand_made_records(config())
    for record in records:
        record["baseline_requested_bytes"] = record["end_requested_bytes"] = record["peak_requested_bytes"] = None
    checked, check, workspace = mesure_memoire.check_prediction(records, plan)
    assert {r["verdict"] for r in checked} == {"not checked"}
    assert all("requested-bytes" in r["verdict_reason"] for r in checked)
    assert check["agrees"] is False and check["disagreements"] == [] and len(check["not_checked"]) == len(checked)
    assert workspace["requested_bytes"] is None and workspace["measured_bytes"] == 0


def test_a_result_from_the_real_measure_code_passes_the_validators_checker(stand_in_gpu, monkeypatch, tmp_path):
    """Integration: measure() and to_json() as the CLI runs them, the real model's live CPU tensors as
    counters (torch.cuda's set-up calls replaced by the named stand-ins), then gpu_validation's checker:
    every row passes, so the two agree on schema 2.  Doctoring one counter makes a row fail."""
    spec = importlib.util.spec_from_file_location("gpu_validation", ROOT / "tools" / "gpu_validation.py")
    gpu_validation = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gpu_validation)
    settings = config(batch=2, context=8, width=32, warmup=2, repeats=3)
    tracker = LiveTensorBytes("cpu")
    real_measure_phases = mesure_memoire.measure_phases
    for name, stand_in in [("is_initialized", lambda: False), ("set_device", lambda device: None),
                           ("init", lambda: None), ("memory_allocated", lambda device: 0),
                           ("memory_reserved", lambda device: 0)]:  # fmt: skip
        monkeypatch.setattr(torch.cuda, name, stand_in)

    def on_the_cpu(torch_module, cuda, device, configuration):
        counters = LiveTensorCounters(tracker)
        counters.device_ms = 1e-6  # the stand-in's event time must stay below the real wall time
        with tracker:
            return real_measure_phases(torch_module, counters, CPU, configuration)

    monkeypatch.setattr(mesure_memoire, "measure_phases", on_the_cpu)
    result = json.loads(mesure_memoire.to_json(mesure_memoire.measure(settings, tool="mesure_memoire.py")))
    rows = gpu_validation.check_result(result, requested=settings)
    assert len(rows) >= 7 and [row for row in rows if not row[2]] == []
    result["phases"][1]["peak_requested_bytes"] += 512
    assert [row[1] for row in gpu_validation.check_result(result, requested=settings) if not row[2]]


def test_a_disagreement_names_its_repetition_and_the_closest_bound():
    records, plan = hand_made_records(
        config(), extra={4: {"end_requested_bytes": -4}, 5: {"peak_allocated_bytes": 512}}
    )
    _, check, _ = mesure_memoire.check_prediction(records, plan)
    base = {"phase": "warm_forward", "relative_to": "the phase's baseline"}
    assert check["disagreements"] == [
        {**base, "repetition": 1, "counter": "end_requested_bytes", "predicted_bytes": 4096, "measured_bytes": 4092,
         "difference_bytes": -4},
        {**base, "repetition": 2, "counter": "peak_allocated_bytes", "predicted_bytes": 32768, "measured_bytes": 33280,
         "difference_bytes": 512},
    ]  # fmt: skip
    # Below its lower bound, the first forward's end is compared with the output it must hold.
    records, plan = hand_made_records(config(), extra={2: {"end_allocated_bytes": -512}})
    disagreement = mesure_memoire.check_prediction(records, plan)[1]["disagreements"][0]
    assert (disagreement["counter"], disagreement["predicted_bytes"], disagreement["difference_bytes"]) == (
        "end_allocated_bytes", 4096, -512
    )  # fmt: skip


def test_above_a_large_block_s_slack_the_closest_bound_is_the_upper_one():
    settings = config(batch=2, context=128, width=1024)  # the weights are 16 MiB blocks: 2 MiB of slack
    records, plan = hand_made_records(settings, extra={0: {"end_allocated_bytes": 2 * 2**20 + 512}})
    records[0]["peak_allocated_bytes"] = records[0]["end_allocated_bytes"] - 2 * 2**20 - 512
    (disagreement,) = mesure_memoire.check_prediction(records, plan)[1]["disagreements"]
    expected = plan["phases"][0]["end_allocated_bytes"]
    assert (disagreement["predicted_bytes"], disagreement["difference_bytes"]) == (expected + 2 * 2**20, 512)


def test_the_first_forward_s_peaks_are_checked_with_the_measured_workspace():
    workspace = 8 * 2**20 + 128 * 2**10
    records, plan = hand_made_records(config(), workspace=workspace, extra={2: {"peak_requested_bytes": -4}})
    (disagreement,) = mesure_memoire.check_prediction(records, plan)[1]["disagreements"]
    assert (disagreement["counter"], disagreement["predicted_bytes"], disagreement["difference_bytes"]) == (
        "peak_requested_bytes", 32768 + workspace, -4
    )  # fmt: skip
    # A 2 MiB output (one large block, 1 MiB of slack): the peak may sit up to that slack below.
    settings = config(batch=4, context=128, width=1024)
    slack = mesure_memoire.predict_memory(settings)["phases"][2]["end_allocated_slack_bytes"]
    assert slack == 2**20
    for change, agrees in ((-slack, True), (-slack - 512, False)):
        records, plan = hand_made_records(settings, workspace=workspace, extra={2: {"peak_allocated_bytes": change}})
        check = mesure_memoire.check_prediction(records, plan)[1]
        assert check["agrees"] is agrees, change
        if not agrees:
            assert check["disagreements"][0]["difference_bytes"] == -512


def test_without_requested_counters_the_allocated_ones_are_still_checked():
    records, plan = hand_made_records(config(), extra={1: {"end_allocated_bytes": 512}})
    for record in records:
        record["baseline_requested_bytes"] = record["end_requested_bytes"] = record["peak_requested_bytes"] = None
    checked, check, _ = mesure_memoire.check_prediction(records, plan)
    assert [(d["phase"], d["counter"]) for d in check["disagreements"]] == [("inputs", "end_allocated_bytes")]
    assert checked[1]["verdict"] == "disagrees" and check["not_checked"] == [
        "model_load", "cold_forward", "warmup x1", "warm_forward #1", "warm_forward #2"
    ]  # fmt: skip


def test_records_and_prediction_must_have_the_same_phases():
    records, plan = hand_made_records(config())
    with pytest.raises(ValueError):
        mesure_memoire.check_prediction(records[:-1], plan)
