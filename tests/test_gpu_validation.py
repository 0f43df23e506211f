"""tools/gpu_validation.py: its refusal without a GPU, and its invariant checker.

The results checked here are hand-made fixtures with consistent counters, not measurements.
"""

import importlib.util

import pytest
import torch

import mesure_memoire
from conftest import ROOT, assert_one_line_refusal, run_script

spec = importlib.util.spec_from_file_location("gpu_validation", ROOT / "tools" / "gpu_validation.py")
gpu_validation = importlib.util.module_from_spec(spec)
spec.loader.exec_module(gpu_validation)

MIB = 2**20


def hand_made_result(warmup=1, repeats=2):
    """A result shaped like measure's, with counters a caching allocator could give."""
    config = mesure_memoire.measure_config("cuda:0", 2, 128, 1024, "float32", warmup, repeats, 0)
    model = mesure_memoire.synthetic_model(config)
    weights = sum(gpu_validation.aligned(t["bytes"]) for t in model["parameter_tensors"])
    inputs = gpu_validation.aligned(model["input_bytes"])
    workspace = 32 * MIB  # what cuBLAS keeps after the first forward on Hopper

    def phase(name, base, end, peak, reserved, **labels):
        return {"phase": name, "nanoseconds": 1000, "seconds": 1e-6, "baseline_allocated_bytes": base,
                "baseline_reserved_bytes": reserved, "end_allocated_bytes": end, "end_reserved_bytes": reserved,
                "peak_allocated_bytes": peak, "peak_reserved_bytes": reserved, **labels}  # fmt: skip

    after_inputs = weights + inputs
    forward_end = after_inputs + workspace + inputs
    phases = [
        phase("model_load", 0, weights, weights, 64 * MIB),
        phase("inputs", weights, after_inputs, after_inputs, 64 * MIB),
        phase("cold_forward", after_inputs, forward_end, forward_end + 8 * MIB, 128 * MIB),
    ]
    if warmup:
        phases.append(
            phase("warmup", forward_end - inputs, forward_end, forward_end + 8 * MIB, 128 * MIB, passes=warmup)
        )
    phases += [
        phase("warm_forward", forward_end - inputs, forward_end, forward_end + 8 * MIB, 128 * MIB, repetition=n)
        for n in range(1, repeats + 1)
    ]
    return {
        "environment": {"gpu_available": True},
        "configuration": {**config, "fresh_process_warning": None},
        "synthetic_model": model,
        "phases": phases,
    }


def failed(result):
    return [name for name, passed, _ in gpu_validation.check_result(result) if not passed]


@pytest.mark.parametrize(("warmup", "repeats"), [(1, 2), (3, 5), (0, 1)])
def test_a_consistent_result_passes_every_check(warmup, repeats):
    assert failed(hand_made_result(warmup, repeats)) == []


def doctor(change):
    result = hand_made_result()
    change(result)
    return result


@pytest.mark.parametrize(
    ("change", "expected_failure"),
    [
        (lambda r: r["phases"].pop(3), "phase lines"),
        (lambda r: r["phases"][4].update(repetition=3), "repetitions numbered"),
        (lambda r: r["phases"][2].update(end_allocated_bytes=r["phases"][2]["end_reserved_bytes"] + 1),
         "cold_forward: allocated <= reserved"),
        (lambda r: r["phases"][5].update(peak_allocated_bytes=0), "warm_forward#2: peaks >= ends and baselines"),
        (lambda r: r["phases"][0].update(end_allocated_bytes=1000), "model_load: allocated delta"),
        (lambda r: r["phases"][1].update(end_allocated_bytes=r["phases"][1]["end_allocated_bytes"] + 2 * MIB),
         "inputs: allocated delta"),
        (lambda r: r["phases"][3].update(seconds=0), "warmup: time > 0"),
        (lambda r: r["phases"][3].update(peak_reserved_bytes=None), "warmup: counters"),
        (lambda r: r["environment"].update(gpu_available=False), "GPU recorded"),
        (lambda r: r["configuration"].update(fresh_process_warning="not fresh"), "fresh process"),
    ],
)  # fmt: skip
def test_a_doctored_result_is_rejected(change, expected_failure):
    assert expected_failure in failed(doctor(change))


def test_observations_report_the_model_load_delta_and_what_cold_forward_leaves():
    result = hand_made_result()
    seen = gpu_validation.observations(result)
    assert seen["model_load_allocated_delta_bytes"] == result["phases"][0]["end_allocated_bytes"]
    assert seen["parameter_bytes_predicted"] == result["synthetic_model"]["parameter_bytes"]
    assert seen["allocated_left_after_cold_forward_bytes"] == 32 * MIB
    assert seen["warm_forward_median_seconds"] == 1e-6


def test_verdict_table_counts_failures():
    table = gpu_validation.format_verdicts([("a", True, ""), ("bb", False, "why\nnot")])
    assert table.splitlines() == [
        "check  verdict  detail",
        "a      PASS",
        "bb     FAIL     why not",
        "1 passed, 1 failed",
    ]


def test_timer_cross_check_runs_the_same_forward(monkeypatch):
    options = {"batch": 1, "context": 4, "width": 8, "dtype": "float32", "warmup": 1}
    monkeypatch.setattr(gpu_validation, "TIMER_MIN_RUN_SECONDS", 0.05)
    seconds = gpu_validation.timer_median_seconds(torch, torch.device("cpu"), options)
    assert 0 < seconds < 0.1


def test_without_a_gpu_it_refuses_and_writes_nothing(tmp_path):
    completed = run_script("tools/gpu_validation.py", "--device", "cuda:0", "--output-dir", "evidence", cwd=tmp_path)
    assert_one_line_refusal(completed, "no usable GPU for cuda:0")
    assert list(tmp_path.iterdir()) == []


def test_a_non_empty_output_folder_is_refused(tmp_path):
    (tmp_path / "evidence").mkdir()
    (tmp_path / "evidence" / "old.json").write_text("{}")
    completed = run_script("tools/gpu_validation.py", "--device", "cuda:0", "--output-dir", "evidence", cwd=tmp_path)
    assert_one_line_refusal(completed, "not an empty folder")
    assert [p.name for p in (tmp_path / "evidence").iterdir()] == ["old.json"]


def test_the_runs_cover_the_readme_commands_and_three_dtypes():
    runs = gpu_validation.RUNS
    assert runs["measure-small-float32"] == {"batch": 1, "context": 16, "width": 64, "warmup": 1, "repeats": 2,
                                             "dtype": "float32"}  # fmt: skip
    assert {r["dtype"] for r in runs.values()} == set(mesure_memoire.DTYPE_BYTES)
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    for stem, output in (
        ("measure-small-float32", "mesures-petit-essai.json"),
        ("measure-larger-float32", "mesures.json"),
    ):
        options = runs[stem]
        flags = " ".join(
            f"--{key} {options[key]}" for key in ("batch", "context", "width", "dtype", "warmup", "repeats")
        )
        assert f"python mesure_memoire.py measure --device cuda:0 {flags} --output {output}" in readme
