"""tools/gpu_validation.py, proven on the CPU up to the GPU boundary.

No GPU can be had here.  The flow tests replace the children's commands with
tests/data/gpu_validation/fake_child.py, a named STAND-IN for the GPU children (its results are laid
out from the kit's own prediction, not measured).  The numerics and the Timer cross-check run on
real PyTorch CPU ops; the refusal without a GPU runs the real kit.  The command-line contract
(help, -OO, an option twice, stdout, Ctrl-C) is tested in test_command_line.py.
"""

import importlib.util
import json
import sys
import tarfile

import pytest
import torch

import mesure_memoire
from conftest import MESSAGES, ROOT, RecordingCudaStandIn, tree_digest

FAKE_CHILD = ROOT / "tests" / "data" / "gpu_validation" / "fake_child.py"


def load(name, path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


gpu_validation = load("gpu_validation", ROOT / "tools" / "gpu_validation.py")
fake_child = load("fake_child", FAKE_CHILD)


def with_stand_in_children(monkeypatch, *doctors):
    def command_for(kind, arguments):
        flags = [part for doctor in doctors for part in ("--doctor", doctor)]
        return [sys.executable, str(FAKE_CHILD), *flags, kind, *arguments], f"stand-in {kind}"

    monkeypatch.setattr(gpu_validation, "command_for", command_for)


def validate(tmp_path, capsys, *extra):
    status = gpu_validation.main(["--device", "cuda:0", "--output-dir", str(tmp_path / "evidence"), *extra])
    out, err = capsys.readouterr()
    rows = {line.split("  ")[0]: line for line in out.splitlines()[:-1]}
    return status, out, err, rows


def failed(rows):
    return sorted(name for name, line in rows.items() if " FAIL " in f"{line} ")


# --- the whole flow, with stand-in children ---------------------------------------------------------


def test_healthy_children_pass_every_check_and_leave_one_archive_of_the_evidence(tmp_path, capsys, monkeypatch):
    with_stand_in_children(monkeypatch)
    status, out, err, rows = validate(tmp_path, capsys)
    assert (status, err, failed(rows)) == (0, "", [])
    assert out.splitlines()[-1] == f"{len(rows)} passed, 0 failed"
    for name in gpu_validation.CONFIGURATIONS:
        assert f"{name}: within the loosest bound the default flags allow" in rows
        assert f"{name}: within the tight bound with reduced-precision reduction off" in rows
        assert f"{name} run 2: the kit's checks" in rows
    folder = tmp_path / "evidence"
    assert (folder / "verdict.txt").read_text() == out
    with tarfile.open(tmp_path / "evidence.tar.gz") as tar:
        members = tar.getmembers()
        names = {member.name for member in members}
        assert {member.uname for member in members} == {""}
        assert {member.uid for member in members} == {0}
        assert tar.extractfile("gpu-validation/verdict.txt").read().decode() == out
    assert {f"gpu-validation/results/{n}-run{r}.json" for n in gpu_validation.CONFIGURATIONS for r in (1, 2)} < names
    assert {
        "gpu-validation/report.txt",
        "gpu-validation/cross-check.json",
        "gpu-validation/vendor-tool-after.json",
        "gpu-validation/notebook/mesures-notebook.json",
        "gpu-validation/environment.json",
    } < names
    assert str(tmp_path) not in "".join(p.read_text() for p in folder.rglob("*") if p.is_file())


DOCTORED = {  # doctor -> the rows it must fail, and only those
    "disagree": {f"{n} run {r}: the kit's checks" for n in gpu_validation.CONFIGURATIONS for r in (1, 2)}
    | {
        f"PYTORCH_CUDA_ALLOC_CONF={s}: the kit's checks"
        for s in ("roundup_power2_divisions:4", "expandable_segments:True")
    },
    "ignored-setting": {f"PYTORCH_CUDA_ALLOC_CONF={s}: the kit's checks" for s in gpu_validation.ALLOCATOR_RUNS},
    "nondeterministic": {f"{n}: two fresh runs, same counters and checksum" for n in gpu_validation.CONFIGURATIONS},
    "far-output": {
        f"{s}-float16: {b}"
        for s in gpu_validation.SIZES
        for b in (
            "within the loosest bound the default flags allow",
            "within the tight bound with reduced-precision reduction off",
        )
    },
    "strict-flags": {  # the run with reduction off keeps the default arithmetic's error
        f"{s}-{d}: within the tight bound with reduced-precision reduction off"
        for s in gpu_validation.SIZES
        for d in ("float16", "bfloat16")
    },
    "slow-timer": {f"big-{d}: measure's warm median / Timer's" for d in gpu_validation.DTYPES},
    "no-refusal": {"fit check refuses a size beyond the GPU (fit_problem too)"},
    "unsupported=name": {"vendor tool: the GPU PyTorch names"},
}


@pytest.mark.parametrize("doctor", DOCTORED)
def test_each_doctored_figure_fails_its_own_rows_and_only_those(tmp_path, capsys, monkeypatch, doctor):
    with_stand_in_children(monkeypatch, doctor)
    status, out, err, rows = validate(tmp_path, capsys)
    assert (status, err) == (1, "")
    assert set(failed(rows)) == DOCTORED[doctor]
    assert (tmp_path / "evidence" / "verdict.txt").read_text() == out


def test_the_allocator_runs_set_their_setting_and_judge_what_the_result_records(tmp_path, capsys, monkeypatch):
    with_stand_in_children(monkeypatch)
    _, _, _, rows = validate(tmp_path, capsys)
    children = json.loads((tmp_path / "evidence" / "children.json").read_text())
    shown = [child["command"] for child in children if child["name"].startswith("allocator-")]
    assert shown == [f"PYTORCH_CUDA_ALLOC_CONF={s} stand-in kit" for s in gpu_validation.ALLOCATOR_RUNS]
    for setting in gpu_validation.ALLOCATOR_RUNS:
        assert rows[f"PYTORCH_CUDA_ALLOC_CONF={setting}: the kit's checks"].endswith(" PASS  4")
    result = json.loads((tmp_path / "evidence" / "results" / "allocator-backend.json").read_text())
    rows = gpu_validation.check_allocator_run(result, "backend:cudaMallocAsync", {"torch": "2.11.0+stand-in"})
    assert [row[2] for row in rows] == [True] * 4
    assert rows[3][3] == "PyTorch 2.11.0+stand-in"
    assert not gpu_validation.check_allocator_run(result, "backend:cudaMallocAsync", {"torch": "2.13.0"})[1][2]
    assert not gpu_validation.check_allocator_run(result, "expandable_segments:True", {"torch": "2.11.0+stand-in"})[0][
        2
    ]
    result["phases"][0]["verdict"] = "agrees"  # not the kit's own verdict: both rows fail
    rows = gpu_validation.check_allocator_run(result, "backend:cudaMallocAsync", {"torch": "2.11.0+stand-in"})
    assert [row[2] for row in rows] == [True, True, False, False]
    assert gpu_validation.check_allocator_run({"kit": "x"}, "backend:cudaMallocAsync", {})[0][:3] == (
        "report",
        "read by report",
        False,
    )


def test_the_disagreement_is_named_with_the_kit_s_own_figures(tmp_path, capsys, monkeypatch):
    with_stand_in_children(monkeypatch, "disagree")
    _, _, _, rows = validate(tmp_path, capsys)
    line = rows["small-float32 run 1: the kit's checks"]
    assert "prediction disagreed" in line
    assert '"counter": "peak_requested_bytes"' in line
    assert '"difference_bytes": 512' in line


def test_a_hanging_child_is_killed_and_reported_and_the_verdict_still_written(tmp_path, capsys, monkeypatch):
    with_stand_in_children(monkeypatch, "hang")
    status, out, _, rows = validate(tmp_path, capsys, "--timeout-seconds", "2")
    assert status == 1
    assert "cross-check timed out" in rows["every child ran and finished in time"]
    assert " FAIL " in rows["cross-check child ran"]
    assert "killed after 2 s" in rows["cross-check child ran"]
    assert (tmp_path / "evidence" / "verdict.txt").read_text() == out


def test_once_the_budget_is_spent_no_child_starts_and_each_is_named(tmp_path, capsys, monkeypatch):
    with_stand_in_children(monkeypatch)
    runner = gpu_validation.Runner(timeout_seconds=5, budget_seconds=0)
    record = runner.run("late", "kit", ["environment"])
    assert (record["outcome"], record["exit_status"]) == ("not run", None)


# --- refusals: one line, exit 2, nothing written ------------------------------------------------------


def test_without_a_gpu_it_refuses_in_one_line_and_writes_nothing(tmp_path, capsys):
    status = gpu_validation.main(["--device", "cuda:0", "--output-dir", str(tmp_path / "evidence")])
    out, err = capsys.readouterr()
    assert (status, out) == (2, "")
    assert err.count("\n") == 1
    assert err.startswith("gpu_validation.py: error: no usable GPU for cuda:0")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("existing", ["evidence", "evidence.tar.gz"])
def test_an_existing_folder_or_archive_is_refused_and_left_as_it_was(tmp_path, capsys, monkeypatch, existing):
    with_stand_in_children(monkeypatch)
    (tmp_path / existing).mkdir() if "." not in existing else (tmp_path / existing).write_text("kept")
    before = tree_digest(tmp_path)
    status, out, err, _ = validate(tmp_path, capsys)
    assert (status, out, err.count("\n")) == (2, "", 1)
    assert "already exists" in err
    assert tree_digest(tmp_path) == before


@pytest.mark.parametrize(
    ("argv", "fragment"),
    [
        (["--device", "cpu"], MESSAGES["--device not cuda:N"].format(device="'cpu'")),
        (["--timeout-seconds", "0"], "--timeout-seconds"),
        (["--budget-seconds", "1e3"], "--budget-seconds"),
        (["--output-dir", ""], MESSAGES["--output-dir not a folder name"].format(value="''")),
    ],  # not the current folder
)
def test_bad_values_are_one_line(tmp_path, capsys, argv, fragment):
    base = {"--device": "cuda:0", "--output-dir": str(tmp_path / "e")}
    base.update(zip(argv[::2], argv[1::2], strict=True))
    assert gpu_validation.main([part for item in base.items() for part in item]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.count("\n") == 1
    assert fragment in err
    assert list(tmp_path.iterdir()) == []


# --- judging one result with the kit's own code ------------------------------------------------------


def test_a_verdict_edited_to_agree_is_not_the_kit_s_own(tmp_path):
    result = json.loads(
        mesure_memoire.to_json(fake_child.crafted_result(gpu_validation.CONFIGURATIONS["small-float16"]))
    )
    assert [row for row in gpu_validation.check_result(result) if not row[2]] == []
    result["phases"][2]["peak_requested_bytes"] += 512  # the counter changed, the recorded verdict kept
    assert [row[1] for row in gpu_validation.check_result(result) if not row[2]] == [
        "verdicts are check_against_plan's on the recorded counters"
    ]


def test_a_workspace_beyond_the_plan_s_allowance_fails(tmp_path):
    result = fake_child.crafted_result(gpu_validation.CONFIGURATIONS["small-float32"])
    result["workspace"]["measured_bytes"] = result["workspace"]["allowance_bytes"] + 1
    assert "the workspaces kept and per call within the plan's allowance" in [
        r[1] for r in gpu_validation.check_result(result) if not r[2]
    ]


# --- numerics and Timer, on real PyTorch CPU ops ------------------------------------------------------


def spec(dtype, width=64, **changes):
    return {
        "name": "x",
        "batch": 2,
        "context": 8,
        "width": width,
        "dtype": dtype,
        "warmup": 1,
        "repeats": 1,
        "seed": 0,
        **changes,
    }


def test_the_cross_check_computes_measure_s_forward_exactly():
    config = mesure_memoire.measure_config("cuda:0", 2, 8, 64, "bfloat16", 1, 1, 0)
    cpu = torch.device("cpu")
    _, summary, _ = mesure_memoire.measure_phases(torch, RecordingCudaStandIn(device=cpu), cpu, config)
    answer = gpu_validation.cross_check(torch, torch.device("cpu"), [spec("bfloat16")])["x"]
    assert answer["checksum_float64"] == summary["checksum_float64"]
    assert answer["elements"] == 2 * 8 * 64


@pytest.mark.parametrize("dtype", gpu_validation.DTYPES)
def test_real_outputs_pass_both_bounds_under_the_flags_pytorch_reports_then_the_flags_come_back(dtype):
    before = mesure_memoire.matmul_arithmetic(torch)
    answers = gpu_validation.cross_check(torch, torch.device("cpu"), [spec(dtype)])
    assert answers["settings"] == before == mesure_memoire.matmul_arithmetic(torch), "flags restored"
    assert answers["strict_settings"] == {
        **before,
        "allow_fp16_reduced_precision_reduction": False,
        "allow_bf16_reduced_precision_reduction": False,
    }
    assert answers["torch"] == str(torch.__version__)
    rows = gpu_validation.judge_numerics("x", spec(dtype), answers["x"], answers)
    assert [row[1] for row in rows] == [True, True], rows
    assert [len(row[2]) < 300 for row in rows] == [True, True]
    assert answers["x"]["relative_l2_error"] > 0
    assert answers["x"]["strict_relative_l2_error"] > 0
    assert set(answers["x"]["error_terms"]) == {"Y", "HR", "HT", "OT"}
    if dtype != "float32":  # the rounding of each hidden value and output is seen: a reference that differs
        assert answers["x"]["relative_l2_error"] > gpu_validation.UNIT_ROUNDOFF[dtype] / 10


class FailsWithReductionOff(torch.nn.Sequential):  # the kit's layers; its forward raises under the strict flags
    def forward(self, inputs):
        if not torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction:
            raise RuntimeError("the forward failed with reduction off")
        return super().forward(inputs)


def test_the_flags_come_back_even_when_the_strict_forward_raises(monkeypatch):
    before = mesure_memoire.matmul_arithmetic(torch)
    build = mesure_memoire.build_model  # the kit's layers, in a model whose forward fails under the strict flags
    monkeypatch.setattr(mesure_memoire, "build_model", lambda t, width: FailsWithReductionOff(*build(t, width)))
    with pytest.raises(RuntimeError, match="reduction off"):
        gpu_validation.cross_check(torch, torch.device("cpu"), [spec("float16")])
    assert mesure_memoire.matmul_arithmetic(torch) == before


def test_a_wrong_forward_fails_both_bounds(monkeypatch):
    def relu_model(torch_module, width):
        return torch.nn.Sequential(
            torch.nn.Linear(width, 4 * width), torch.nn.ReLU(), torch.nn.Linear(4 * width, width)
        )

    monkeypatch.setattr(mesure_memoire, "build_model", relu_model)
    answers = gpu_validation.cross_check(torch, torch.device("cpu"), [spec("float32")])
    rows = gpu_validation.judge_numerics("x", spec("float32"), answers["x"], answers)
    assert [row[:2] for row in rows] == [
        ("x: within the loosest bound the default flags allow", False),
        ("x: within the tight bound with reduced-precision reduction off", False),
    ]
    assert rows[0][2].startswith("relative L2 ")
    assert rows[0][2].endswith("(partial sums in float32)")


STRICT_CROSS = {
    "settings": {},
    "strict_settings": {
        "allow_fp16_reduced_precision_reduction": False,
        "allow_bf16_reduced_precision_reduction": False,
    },
    "torch": "2.11.0",
}


@pytest.mark.parametrize(
    "answer",
    [
        {},
        {"relative_l2_error": 0.0, "strict_relative_l2_error": 0.0},
        {"relative_l2_error": 0.0, "strict_relative_l2_error": 0.0, "error_terms": {}},
        {
            "relative_l2_error": 0.0,
            "strict_relative_l2_error": 0.0,
            "error_terms": dict.fromkeys(["Y", "HR", "HT", "OT"], 0.0),
        },
        {
            "relative_l2_error": "0",
            "strict_relative_l2_error": "0",
            "error_terms": dict.fromkeys(["Y", "HR", "HT", "OT"], 1.0),
        },
    ],
)
def test_a_missing_or_malformed_answer_is_never_within_either_bound(answer):
    rows = gpu_validation.judge_numerics("x", spec("float16"), answer, STRICT_CROSS)
    assert [row[1] for row in rows] == [False, False]
    assert [row[1] for row in gpu_validation.judge_numerics("x", spec("float16"), answer, {})] == [False, False]


@pytest.mark.parametrize(
    ("dtype", "cross", "tight"),
    [
        ("float16", STRICT_CROSS, True),
        ("bfloat16", {**STRICT_CROSS, "torch": "2.7.1+cu126"}, None),  # cuBLASLt ignored the flag
        ("float32", {**STRICT_CROSS, "torch": "2.7.1+cu126"}, True),  # the flags are not float32's
        ("float16", {**STRICT_CROSS, "torch": "2.8.0+cu128"}, True),
        ("float16", {**STRICT_CROSS, "strict_settings": None}, False),  # the flags could not be set
        ("bfloat16", {**STRICT_CROSS, "strict_settings": {"allow_bf16_reduced_precision_reduction": True}}, False),
    ],
)
def test_the_tight_row_is_judged_only_where_the_flags_were_off_and_honoured(dtype, cross, tight):
    terms = dict.fromkeys(["Y", "HR", "HT", "OT"], 1.0)
    answer = {"relative_l2_error": 1e-9, "strict_relative_l2_error": 1e-9, "error_terms": terms}
    rows = gpu_validation.judge_numerics("x", spec(dtype), answer, cross)
    assert [row[1] for row in rows] == [True, tight], rows
    assert len(rows[1][2]) < 300


def test_the_bound_follows_its_derivation():
    u, u32, terms = 2**-8, 2**-24, {"Y": 2.0, "HR": 3.0, "HT": 5.0, "OT": 7.0}
    expected = ((u * u * 5 + 65 * u * u * 5 + 257 * u * u * 7) / 2) ** 0.5  # the default flags: in the dtype
    assert gpu_validation.relative_error_bound("bfloat16", 64, terms, {}) == pytest.approx(expected, rel=1e-12)
    flags = {"allow_bf16_reduced_precision_reduction": False}  # reduction off: in float32
    expected = ((u * u * 5 + 65 * u32**2 * 5 + 257 * u32**2 * 7) / 2) ** 0.5
    assert gpu_validation.relative_error_bound("bfloat16", 64, terms, flags) == pytest.approx(expected, rel=1e-12)
    u16 = 2**-11  # accumulation in float16, where asked: its own roundoff, reduction off or not
    expected = ((u16**2 * 5 + 65 * u16**2 * 5 + 257 * u16**2 * 7) / 2) ** 0.5
    flags = {"allow_fp16_reduced_precision_reduction": False, "allow_fp16_accumulation": True}
    assert gpu_validation.relative_error_bound("float16", 64, terms, flags) == pytest.approx(expected, rel=1e-12)
    tf32 = 2 * 2**-22  # float32 with TF32 inputs: both factors of each product rounded
    expected = ((u32**2 * 5 + (65 * u32**2 + tf32) * 5 + (257 * u32**2 + tf32) * 7) / 2) ** 0.5
    for flags in ({"allow_tf32": True}, {"fp32_precision": "tf32"}, {"float32_matmul_precision": "high"}):
        assert gpu_validation.relative_error_bound("float32", 64, terms, flags) == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize(
    ("dtype", "flags", "allowed"),
    [
        ("float16", {}, ("float16", 0.0)),
        ("bfloat16", {"allow_bf16_reduced_precision_reduction": False}, ("float32", 0.0)),
        ("float16", {"allow_bf16_reduced_precision_reduction": False}, ("float16", 0.0)),
        (
            "float16",
            {"allow_fp16_reduced_precision_reduction": False, "allow_fp16_accumulation": True},
            ("float16", 0.0),
        ),
        (
            "bfloat16",
            {"allow_bf16_reduced_precision_reduction": False, "allow_fp16_accumulation": True},
            ("float32", 0.0),
        ),
        ("float32", {"allow_tf32": None, "float32_matmul_precision": None}, ("float32", 0.0)),
        ("float32", {"float32_matmul_precision": "medium", "allow_tf32": True}, ("float32", 2**-8)),
        ("float16", {"allow_tf32": True, "allow_fp16_reduced_precision_reduction": False}, ("float32", 0.0)),
    ],
)
def test_what_the_recorded_flags_allow(dtype, flags, allowed):
    assert gpu_validation.allowed_arithmetic(dtype, flags) == allowed


def test_the_timer_cross_check_runs_on_real_ops_and_its_absence_is_one_reason(monkeypatch):
    timed = spec("float32", timer=True, min_run_seconds=0.05)
    answer = gpu_validation.cross_check(torch, torch.device("cpu"), [timed])["x"]
    assert answer["timer_median_seconds"] > 0
    assert answer["timer_measurements"] >= 1
    monkeypatch.delattr(torch.utils, "benchmark")  # as on a PyTorch whose benchmark needs the absent NumPy
    monkeypatch.setitem(sys.modules, "torch.utils.benchmark", None)
    answer = gpu_validation.cross_check(torch, torch.device("cpu"), [timed])["x"]
    assert "timer_median_seconds" not in answer
    assert "torch.utils.benchmark" in answer["timer_error"]
