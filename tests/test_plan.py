"""`measure --plan`: the prediction by hand, the command without PyTorch, and the fit check it feeds."""

import json

import pytest

import mesure_memoire
from conftest import assert_one_line_refusal, run_script, tree_digest

MIB = 2**20
ALLOWANCE = 256 * MIB
SMALL_TRIAL = ["measure", "--device", "cuda:0", "--batch", "1", "--context", "16", "--width", "64",
               "--dtype", "float32", "--warmup", "1", "--repeats", "2"]  # fmt: skip


def plan(batch, context, width, dtype, warmup=1, repeats=2):
    return mesure_memoire.predict_memory(
        mesure_memoire.measure_config("cuda:0", batch, context, width, dtype, warmup, repeats, 0)
    )


def counters(phase):
    return tuple(phase[name] for name in mesure_memoire.PREDICTED_COUNTERS)


# Counted by hand.  Weights: fc1 4W x W and 4W, fc2 W x 4W and W values; input and output B x C x W;
# each hidden activation B x C x 4W.  Allocated: each tensor rounded up to 512 bytes on its own.
# (end requested, peak requested, end allocated, peak allocated) per phase, then the whole run's peak.
HAND_COUNTS = [
    # batch 1, context 16, width 64, 4 bytes: weights 65536 + 1024 + 65536 + 256 (-> 512)
    ((1, 16, 64, "float32"), (132352, 132352, 132608, 132608), (4096,) * 4, (4096, 32768, 4096, 32768),
     132608 + 4096 + ALLOWANCE + 32768),
    # 2 bytes: weights 32768 + 512 + 32768 + 128 (-> 512); input 2048; hidden 8192 each
    ((1, 16, 64, "float16"), (66176, 66176, 66560, 66560), (2048,) * 4, (2048, 16384, 2048, 16384),
     66560 + 2048 + ALLOWANCE + 16384),
    ((1, 16, 64, "bfloat16"), (66176, 66176, 66560, 66560), (2048,) * 4, (2048, 16384, 2048, 16384),
     66560 + 2048 + ALLOWANCE + 16384),
    # batch 3, context 5, width 3, 4 bytes: weights 144 + 48 + 144 + 12, each one 512-byte block;
    # input 180 (512); hidden 720 each (1024)
    ((3, 5, 3, "float32"), (348, 348, 2048, 2048), (180, 180, 512, 512), (180, 1440, 512, 2048),
     2048 + 512 + ALLOWANCE + 2048),
    # 2 bytes: weights 72 + 24 + 72 + 6; input 90; hidden 360 each (512)
    ((3, 5, 3, "bfloat16"), (174, 174, 2048, 2048), (90, 90, 512, 512), (90, 720, 512, 1024),
     2048 + 512 + ALLOWANCE + 1024),
    ((3, 5, 3, "float16"), (174, 174, 2048, 2048), (90, 90, 512, 512), (90, 720, 512, 1024),
     2048 + 512 + ALLOWANCE + 1024),
    # batch 8, context 1024, width 4096, 2 bytes: weights 128 MiB + 32768 + 128 MiB + 8192;
    # input 64 MiB; hidden 256 MiB each
    ((8, 1024, 4096, "bfloat16"), (268476416,) * 4, (64 * MIB,) * 4, (64 * MIB, 512 * MIB, 64 * MIB, 512 * MIB),
     268476416 + 64 * MIB + ALLOWANCE + 512 * MIB),
    # 4 bytes: weights 256 MiB + 65536 + 256 MiB + 16384; input 128 MiB; hidden 512 MiB each
    ((8, 1024, 4096, "float32"), (536952832,) * 4, (128 * MIB,) * 4, (128 * MIB, 1024 * MIB, 128 * MIB, 1024 * MIB),
     536952832 + 128 * MIB + ALLOWANCE + 1024 * MIB),
]  # fmt: skip


@pytest.mark.parametrize(("sizes", "model_load", "inputs", "forward", "peak"), HAND_COUNTS)
def test_the_prediction_matches_a_hand_count(sizes, model_load, inputs, forward, peak):
    predicted = plan(*sizes, warmup=3, repeats=2)
    assert [p["phase"] for p in predicted["phases"]] == [
        "model_load", "inputs", "cold_forward", "warmup", "warm_forward", "warm_forward"
    ]  # fmt: skip
    assert counters(predicted["phases"][0]) == model_load
    assert counters(predicted["phases"][1]) == inputs
    # The first forward, three warm-up passes (each releasing the last output first) and each
    # repetition: the output at the end, both hidden activations together at the peak.
    assert {counters(phase) for phase in predicted["phases"][2:]} == {forward}
    assert predicted["phases"][3]["passes"] == 3 and [p.get("repetition") for p in predicted["phases"][4:]] == [1, 2]
    assert predicted["phases"][2]["alive_at_peak"] == ["fc1_output", "gelu_output"]
    assert predicted["predicted_peak_allocated_bytes"] == peak
    assert predicted["predicted_peak_phase"] == "cold_forward"
    assert predicted["needs_free_bytes"] == peak + 2**30


def test_large_blocks_carry_their_slack():
    predicted = plan(8, 1024, 4096, "bfloat16")
    slack = [(p["end_allocated_slack_bytes"], p["peak_allocated_slack_bytes"]) for p in predicted["phases"]]
    # Weights: two blocks above 1 MiB (the biases are small); input, output 64 MiB; hidden 2 blocks.
    assert slack == [(2 * MIB, 2 * MIB), (MIB, MIB)] + [(MIB, 2 * MIB)] * 4
    # Exactly 1 MiB is still the small pool (no slack); the 4 MiB hidden activations are not.
    boundary = plan(2, 128, 1024, "float32")["phases"]
    assert [(p["end_allocated_slack_bytes"], p["peak_allocated_slack_bytes"]) for p in boundary[1:3]] == [
        (0, 0), (0, 2 * MIB)
    ]  # fmt: skip
    assert [(p["end_allocated_slack_bytes"], p["peak_allocated_slack_bytes"]) for p in plan(1, 16, 64, "float32")[
        "phases"
    ]] == [(0, 0)] * 6  # fmt: skip


def test_the_allocator_block_rule():
    assert [mesure_memoire.allocated_block_bytes(n) for n in (1, 511, 512, 513, 1024, 1025, 2**20 + 1)] == [
        512, 512, 512, 1024, 1024, 1536, 2**20 + 512
    ]  # fmt: skip


# --- the command ------------------------------------------------------------------------------------


def test_plan_json_in_process_writes_nothing(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    before = tree_digest(tmp_path)
    assert mesure_memoire.main([*SMALL_TRIAL, "--plan", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["predicted_peak_allocated_bytes"] == 132608 + 4096 + ALLOWANCE + 32768
    assert [p["phase"] for p in data["phases"]] == mesure_memoire.phase_names({"warmup": 1, "repeats": 2})
    assert data["blas_workspace_allowance_bytes"] == ALLOWANCE and data["allocator_rounding_bytes"] == 512
    assert tree_digest(tmp_path) == before == {}


def test_plan_text_comes_from_the_same_data(capsys):
    assert mesure_memoire.main([*SMALL_TRIAL, "--plan"]) == 0
    text = capsys.readouterr().out
    assert text == mesure_memoire.format_plan(mesure_memoire.predict_memory(
        mesure_memoire.measure_config("cuda:0", 1, 16, 64, "float32", 1, 2, 0)
    )) + "\n"  # fmt: skip
    lines = text.splitlines()
    assert lines[2].split() == ["phase", "end", "req", "MiB", "peak", "req", "MiB", "end", "alloc", "MiB", "peak",
                                "alloc", "MiB"]  # fmt: skip
    assert lines[5].split() == ["cold_forward", "0.004", "0.031", "0.004", "0.031"]
    assert "Predicted peak allocated: 268604928 bytes = 0.25 GiB, in cold_forward" in text
    assert "1342346752 bytes = 1.25 GiB free" in text


@pytest.mark.whole_kit
def test_plan_runs_without_pytorch_and_writes_nothing(tmp_path):
    completed = run_script("mesure_memoire.py", *SMALL_TRIAL, "--plan", "--json", python_flags=("-S",), cwd=tmp_path)
    assert completed.returncode == 0 and completed.stderr == ""
    assert json.loads(completed.stdout)["predicted_peak_allocated_bytes"] == 268604928
    assert list(tmp_path.iterdir()) == []
    completed = run_script("mesure_memoire.py", *SMALL_TRIAL, "--plan", python_flags=("-S",), cwd=tmp_path)
    assert completed.returncode == 0 and "Predicted peak allocated: 268604928 bytes" in completed.stdout


@pytest.mark.parametrize(
    ("arguments", "fragment"),
    [
        (["--width", "0"], "--width: expected a positive whole number"),
        (["--batch", "1.5"], "--batch: expected a positive whole number"),
        (["--context", "-3"], "--context: expected a positive whole number"),
        (["--dtype", "float64"], "--dtype: expected one of float32, float16, bfloat16, got 'float64'"),
        (["--repeats", "0"], "--repeats: expected a positive whole number"),
        (["--output", "x.json"], "--plan writes nothing"),
    ],
)
def test_plan_refusals(tmp_path, monkeypatch, capsys, arguments, fragment):
    monkeypatch.chdir(tmp_path)
    base = SMALL_TRIAL[:3]  # the device alone: each option below is then given once
    assert mesure_memoire.main([*base, "--plan", *arguments]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and len(captured.err.splitlines()) == 1 and fragment in captured.err
    assert list(tmp_path.iterdir()) == []


def test_output_is_required_unless_plan_and_json_needs_plan(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert mesure_memoire.main(SMALL_TRIAL) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--output: a new file name is required" in err and "--plan" in err
    assert mesure_memoire.main([*SMALL_TRIAL, "--json", "--output", "x.json"]) == 2
    assert "--json goes with --plan" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


@pytest.mark.whole_kit
def test_plan_refuses_a_bad_dimension_like_measure_from_the_command_line(tmp_path):
    completed = run_script("mesure_memoire.py", *SMALL_TRIAL[:7], "--width", "0", "--plan", python_flags=("-S",),
                           cwd=tmp_path)  # fmt: skip
    assert_one_line_refusal(completed, "--width: expected a positive whole number")
    assert list(tmp_path.iterdir()) == []


# --- the fit check (stand-in GPU) --------------------------------------------------------------------


def fit_refusal(stand_in_gpu, monkeypatch, tmp_path, capsys, free_bytes, *arguments):
    import torch

    stand_in_gpu(total_memory=80 * 2**30)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda index: (free_bytes, 80 * 2**30))
    allocations = []
    monkeypatch.setattr(torch.cuda, "set_device", lambda device: allocations.append("set_device"))
    code = mesure_memoire.main(["measure", "--device", "cuda:0", *arguments, "--output", str(tmp_path / "o.json")])
    err = capsys.readouterr().err
    assert allocations == []  # refused before the kit touches the GPU
    assert list(tmp_path.iterdir()) == []
    return code, err


def test_the_fit_check_uses_the_predicted_peak_and_the_free_memory(stand_in_gpu, monkeypatch, tmp_path, capsys):
    predicted = plan(8, 1024, 4096, "bfloat16")
    needed = predicted["needs_free_bytes"]
    code, err = fit_refusal(stand_in_gpu, monkeypatch, tmp_path, capsys, needed - 1, "--batch", "8", "--context",
                            "1024", "--width", "4096", "--dtype", "bfloat16")  # fmt: skip
    assert code == 2 and len(err.splitlines()) == 1
    peak = predicted["predicted_peak_allocated_bytes"]
    assert f"the predicted peak, {peak} bytes" in err and f"exceeds the {needed - 1} bytes" in err
    assert "free (mem_get_info) less a 1.00 GiB margin" in err
    assert "shrink --context (the activations dominate)" in err


def test_the_fit_check_passes_at_exactly_the_needed_memory(stand_in_gpu):
    stand_in_gpu()
    predicted = plan(8, 1024, 4096, "bfloat16")
    environment = mesure_memoire.collect_environment("cuda:0")
    environment["gpu"]["mem_get_info_free_bytes"] = predicted["needs_free_bytes"]
    assert mesure_memoire.fit_problem(predicted, environment) is None
    environment["gpu"]["mem_get_info_free_bytes"] = None  # mem_get_info failed: the announced total is used
    environment["gpu"]["total_memory_bytes"] = predicted["needs_free_bytes"] - 1
    assert "announced in total (mem_get_info failed)" in mesure_memoire.fit_problem(predicted, environment)


@pytest.mark.parametrize(
    ("arguments", "advice"),
    [
        (["--width", "30000"], "shrink --width (the weights dominate)"),
        (["--batch", "40000", "--context", "8", "--width", "512"], "shrink --batch (the activations dominate)"),
        (["--batch", "1", "--context", "400000", "--width", "512"], "shrink --context (the activations dominate)"),
    ],
)
def test_the_refusal_names_the_dimension_to_shrink(stand_in_gpu, monkeypatch, tmp_path, capsys, arguments, advice):
    code, err = fit_refusal(stand_in_gpu, monkeypatch, tmp_path, capsys, 4 * 2**30, *arguments)
    assert code == 2 and advice in err and len(err.splitlines()) == 1


def test_the_readme_plan_command_and_figures_match_the_code(capsys):
    from conftest import ROOT

    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    line = next(
        line for line in readme.splitlines() if line.startswith("python mesure_memoire.py measure") and "--plan" in line
    )
    assert mesure_memoire.main(line.split()[2:]) == 0
    assert "Predicted peak allocated:" in capsys.readouterr().out
    assert mesure_memoire.BLAS_WORKSPACE_ALLOWANCE_BYTES == 256 * MIB and "allowance of 256 MiB" in readme
    assert mesure_memoire.FIT_MARGIN_BYTES == 2**30 and "less a margin of 1 GiB" in readme
    assert mesure_memoire.ALLOCATOR_ROUNDING_BYTES == 512 and "512-byte block" in readme
