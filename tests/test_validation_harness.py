"""tools/gpu_validation.py, proven on the CPU up to the GPU boundary.

No GPU can be had here.  The flow tests replace the children with tests/data/gpu_validation/fake_child.py, a
named STAND-IN for the GPU children (its results are laid out from the kit's own prediction, not measured),
called in this process except where a test needs a real one.  The numerics and the Timer cross-check run on
real PyTorch CPU ops; the refusal without a GPU runs the real kit's environment in this process.  The
command-line contract (help, -OO, an option twice, stdout, Ctrl-C) is tested in test_command_line.py.
"""

import contextlib
import importlib.util
import io
import json
import os
import signal
import subprocess
import sys
import tarfile
import tempfile
import time
import types

import pytest
import torch

import mesure_memoire
from conftest import (
    MESSAGES,
    ROOT,
    RecordingCudaStandIn,
    left_running,
    no_gpu_here,
    signal_main_thread,
    tree_digest,
)

FAKE_CHILD = ROOT / "tests" / "data" / "gpu_validation" / "fake_child.py"


def load(name, path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


gpu_validation = load("gpu_validation", ROOT / "tools" / "gpu_validation.py")
fake_child = load("fake_child", FAKE_CHILD)


def with_stand_in_children(monkeypatch, *doctors, real=()):
    """The children's commands replaced by fake_child.py, called in this process (its output captured): the flows
    that judge figures need no real process.  The kinds in ``real`` start as real processes, for the tests of the
    time limits and the signals; the clock sampler, beside the children, is always a real stand-in process."""
    flags = [part for doctor in doctors for part in ("--doctor", doctor)]
    real_execute, start = gpu_validation.execute, gpu_validation.Sampler.start

    def command_for(kind, arguments):
        return [sys.executable, str(FAKE_CHILD), *flags, kind, *arguments]

    def execute(record, command, cwd, setting, limit):
        if command[2 + len(flags)] in real:
            return real_execute(record, command, cwd, setting, limit)
        out, err = io.StringIO(), io.StringIO()
        with monkeypatch.context() as patch, contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            patch.chdir(cwd or os.getcwd())
            if setting is not None:
                patch.setenv(gpu_validation.ALLOCATOR_VARIABLE, setting)  # read by the stand-in only
            status = fake_child.main(command[2:])
        record.update(outcome="exited", exit_status=status, stdout=out.getvalue(), stderr=err.getvalue())

    def start_and_wait_for_its_log(sampler):
        # Children called in this process take no time, unlike the GPU's (seconds each): the flow would judge the
        # timing rows before the stand-in sampler, a fresh interpreter, has logged a line, and leave them not judged.
        start(sampler)
        deadline = time.monotonic() + 30
        while sampler.process is not None and not sampler.path.stat().st_size and time.monotonic() < deadline:
            time.sleep(0.01)

    monkeypatch.setattr(gpu_validation, "command_for", command_for)
    monkeypatch.setattr(gpu_validation, "execute", execute)
    monkeypatch.setattr(gpu_validation.Sampler, "start", start_and_wait_for_its_log)


@pytest.fixture
def scratch(tmp_path, monkeypatch):
    """The system's temporary folder, for the validator's working folder: it must be left empty."""
    folder = tmp_path / "scratch"
    folder.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(folder))
    yield folder
    assert list(folder.iterdir()) == []


def validate(tmp_path, capsys, *extra):
    status = gpu_validation.main(["--device", "cuda:0", "--output-dir", str(tmp_path / "out"), *extra])
    out, err = capsys.readouterr()
    assert max(map(len, out.splitlines()), default=0) <= gpu_validation.LINE_CHARACTERS
    rows = {line.split("  ")[1]: line for line in out.splitlines()[:-1]}
    return status, out, err, rows


def failed(rows):
    return sorted(name for name, line in rows.items() if line.startswith("FAIL "))


def evidence(tmp_path):
    """The two files the caller's folder receives: verdict.txt's text and the archive's members by name."""
    folder = tmp_path / "out"
    assert sorted(path.name for path in folder.iterdir()) == ["gpu-validation.tar.gz", "verdict.txt"]
    with tarfile.open(folder / "gpu-validation.tar.gz") as tar:
        members = {m.name.removeprefix("gpu-validation/"): m for m in tar.getmembers() if m.isfile()}
        texts = {name: tar.extractfile(member).read().decode() for name, member in members.items()}
    assert {member.uname for member in members.values()} == {""}
    assert {member.uid for member in members.values()} == {0}
    return (folder / "verdict.txt").read_text(), texts


# --- the whole flow, with stand-in children ---------------------------------------------------------


def test_a_rehearsal_runs_the_time_plan_in_order_and_leaves_a_verdict_and_one_archive(
    tmp_path, capsys, monkeypatch, scratch
):
    with_stand_in_children(monkeypatch, "scale=0.005")  # each child sleeps its estimate / 200
    status, out, err, rows = validate(tmp_path, capsys)
    assert (status, err, failed(rows)) == (0, "", [])
    assert out.splitlines()[-1] == f"{len(rows)} passed, 0 failed, 0 not judged"
    for name in gpu_validation.CONFIGURATIONS:
        assert f"{name}: within the loosest bound the default flags allow" in rows
        assert f"{name}: within the tight bound with reduced-precision reduction off" in rows
    verdict, texts = evidence(tmp_path)
    assert verdict == out == texts["verdict.txt"]
    children = json.loads(texts["children.json"])
    assert [child["name"] for child in children] == [name for name, _ in gpu_validation.time_plan()]
    assert sum(seconds for _, seconds in gpu_validation.time_plan()) < 250  # validation/gpu-validation-plan.md
    checks = [json.loads(line) for line in texts["checks.jsonl"].splitlines()]
    assert [check["check"] for check in checks] == list(rows)
    assert {f"results/{n}-run1.json" for n in gpu_validation.CONFIGURATIONS} < set(texts)
    assert {f"results/big-{d}-run2.json" for d in gpu_validation.DTYPES} < set(texts)
    assert {"report.txt", "cross-check.json", "vendor-tool.json", "notebook/mesures-notebook.json"} < set(texts)
    assert json.loads(texts["vendor-tool.json"]) == [fake_child.VENDOR]
    assert str(tmp_path) not in "".join(texts.values())
    # the most valuable rows first
    order = list(rows)
    first_runs = [order.index(f"{name} run 1: the kit's checks") for name in gpu_validation.CONFIGURATIONS]
    assert order[:2] == ["environment: a usable GPU", "vendor tool: the GPU PyTorch names"]
    assert first_runs == list(range(2, 14))
    assert (
        max(first_runs)
        < order.index("cross-check child ran")
        < order.index("big-bfloat16: measure's warm median / synchronized Timer's")
    )
    assert (
        order.index("big-bfloat16: CUDA-event median / wall median")
        < order.index("fit check refuses a size beyond the GPU (fit_problem too)")
        < order.index("big-float32 run 2: the kit's checks")
    )
    assert (
        order.index("big-bfloat16: two fresh runs, same counters and checksum")
        < order.index("PYTORCH_CUDA_ALLOC_CONF=roundup_power2_divisions:4: the kit's checks")
        < order.index("notebook's code cells as plain python3")
    )
    # the allocator runs: each child gets its setting, shown in its command, and is judged by what it recorded
    shown = [child["command"] for child in children if child["name"].startswith("allocator-")]
    assert shown == [
        f"PYTORCH_CUDA_ALLOC_CONF={s} python3 mesure_memoire.py measure --device cuda:0 --batch=5 --context=77 "
        f"--width=3000 --dtype=float32 --warmup=1 --repeats=2 --seed=0 --output results/{n}.json"
        for s, n in zip(
            gpu_validation.ALLOCATOR_RUNS,
            ("allocator-roundup_power2_divisions", "allocator-expandable_segments", "allocator-backend"),
            strict=True,
        )
    ]
    for setting in gpu_validation.ALLOCATOR_RUNS:
        assert rows[f"PYTORCH_CUDA_ALLOC_CONF={setting}: the kit's checks"] == (
            f"PASS  PYTORCH_CUDA_ALLOC_CONF={setting}: the kit's checks  5"
        )


def test_a_budget_spent_stops_the_run_with_the_verdict_and_archive_of_every_row_so_far(
    tmp_path, capsys, monkeypatch, scratch
):
    with_stand_in_children(monkeypatch, "scale=0.02")  # about 4 s of children for a 1 s budget
    status, out, err, rows = validate(tmp_path, capsys, "--budget-seconds", "1")
    assert (status, err) == (1, "")
    assert rows["the run finished within its budget"].startswith(
        "FAIL  the run finished within its budget  stopped before "
    )
    assert "notebook's code cells as plain python3" not in rows
    verdict, texts = evidence(tmp_path)
    assert verdict == out == texts["verdict.txt"]
    assert json.loads(texts["children.json"])[-1]["outcome"] == "not run"


def test_sigterm_ends_the_running_child_and_leaves_the_verdict_and_archive_of_every_row_so_far(
    tmp_path, capsys, monkeypatch, scratch
):
    with_stand_in_children(
        monkeypatch, "terminate", real=("cross-check",)
    )  # the cross-check child sends SIGTERM to the validator
    status, out, err, rows = validate(tmp_path, capsys)
    assert status == 143
    assert err == MESSAGES["validator interrupted"].format(signal="SIGTERM")
    assert rows["the run finished"] == "FAIL  the run finished  stopped by SIGTERM"
    assert rows["big-bfloat16 run 1: the kit's checks"].startswith("PASS  ")
    assert "fit check refuses a size beyond the GPU (fit_problem too)" not in rows
    verdict, texts = evidence(tmp_path)
    assert verdict == out == texts["verdict.txt"]
    with pytest.raises(ProcessLookupError):  # killed and reaped: no child left running
        os.kill(int(texts["child.pid"]), 0)


@pytest.mark.parametrize(("sent", "status"), [("SIGINT", 130), ("SIGTERM", 143)])
def test_a_signal_while_a_child_starts_ends_that_child_before_the_validator(
    tmp_path, capsys, monkeypatch, scratch, sent, status
):
    """A Ctrl-C or SIGTERM that lands while the validator starts the vendor tool's child, between the child's fork
    and its exec (Popen has not returned): the child is killed and reaped, not left running alone."""
    with_stand_in_children(monkeypatch, "hang-vendor", real=("vendor",))  # one left running would stay
    real_popen, started = subprocess.Popen, tmp_path / "started.pid"

    def popen(args, **kwargs):
        if "vendor" in args:

            def between_fork_and_exec():
                started.write_text(str(os.getpid()))
                signal_main_thread(os.getppid(), getattr(signal, sent))

            kwargs["preexec_fn"] = between_fork_and_exec
        return real_popen(args, **kwargs)

    monkeypatch.setattr(subprocess, "Popen", popen)
    result = validate_as_from_a_terminal(tmp_path, capsys)
    assert not left_running(int(started.read_text()))
    assert result[0] == status
    assert result[3]["the run finished"] == f"FAIL  the run finished  stopped by {sent.replace('SIGINT', 'Ctrl-C')}"


def validate_as_from_a_terminal(tmp_path, capsys):
    """validate() with Ctrl-C raising KeyboardInterrupt here, as from a terminal (a suite started in the
    background has SIGINT ignored)."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        return validate(tmp_path, capsys)
    finally:
        signal.signal(signal.SIGINT, previous)


@pytest.mark.parametrize(("sent", "said", "status"), [("SIGINT", "Ctrl-C", 130), ("SIGTERM", "SIGTERM", 143)])
def test_a_child_gone_when_the_validator_ends_its_session_is_no_failure_of_the_validator(
    tmp_path, capsys, monkeypatch, scratch, sent, said, status
):
    """Ctrl-C or SIGTERM (a time limit's) while a child ends: the child, reaped while Popen waits for it after the
    interrupt, leaves no session to kill; the run still ends as stopped, 130 or 143, with its verdict."""
    with_stand_in_children(monkeypatch, f"stop-and-exit={sent}", real=("vendor",))
    status_, out, err, rows = validate_as_from_a_terminal(tmp_path, capsys)
    assert (status_, err) == (status, MESSAGES["validator interrupted"].format(signal=said)), out
    assert rows["the run finished"] == f"FAIL  the run finished  stopped by {said}"
    assert "validation completed" not in rows
    assert evidence(tmp_path)[0] == out


DISAGREED = (  # the rows the doctor "disagree" must fail, and only those
    {f"{n} run 1: the kit's checks" for n in gpu_validation.CONFIGURATIONS}
    | {f"big-{d} run 2: the kit's checks" for d in gpu_validation.DTYPES}
    | {
        f"PYTORCH_CUDA_ALLOC_CONF={s}: the kit's checks"
        for s in ("roundup_power2_divisions:4", "expandable_segments:True")
    }
)
DOCTORED = {  # doctor -> the rows it must fail, and only those
    "ignored-setting": {f"PYTORCH_CUDA_ALLOC_CONF={s}: the kit's checks" for s in gpu_validation.ALLOCATOR_RUNS},
    "nondeterministic": {f"big-{d}: two fresh runs, same counters and checksum" for d in gpu_validation.DTYPES},
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
    "slow-timer": {f"big-{d}: measure's warm median / synchronized Timer's" for d in gpu_validation.DTYPES}
    | {f"big-{d}: sustained steady time / Timer's back-to-back" for d in gpu_validation.SUSTAINED_DTYPES},
    "no-refusal": {"fit check refuses a size beyond the GPU (fit_problem too)"},
    "unsupported=name": {"vendor tool: the GPU PyTorch names"},  # field by field: the name alone is lost
}


@pytest.mark.parametrize("doctor", DOCTORED)
def test_each_doctored_figure_fails_its_own_rows_and_only_those(tmp_path, capsys, monkeypatch, scratch, doctor):
    with_stand_in_children(monkeypatch, doctor)
    status, out, err, rows = validate(tmp_path, capsys)
    assert (status, err) == (1, "")
    assert set(failed(rows)) == DOCTORED[doctor]
    assert evidence(tmp_path)[0] == out


def test_an_unknown_vendor_field_costs_only_itself(tmp_path, capsys, monkeypatch, scratch):
    with_stand_in_children(monkeypatch, "unsupported=clocks.sm")
    status, _, _, rows = validate(tmp_path, capsys)
    assert status == 0
    assert rows["vendor tool: the GPU PyTorch names"] == (
        "PASS  vendor tool: the GPU PyTorch names  Stand-in GPU, driver 580.00.01"
    )
    vendor = json.loads(evidence(tmp_path)[1]["vendor-tool.json"])
    assert vendor == [{**fake_child.VENDOR, "clocks.sm": None}]


def allocator_result(monkeypatch, setting):
    """The stand-in's result under one allocator setting, as the validator's child would write it."""
    monkeypatch.setenv(gpu_validation.ALLOCATOR_VARIABLE, setting)  # read by the stand-in only
    return json.loads(mesure_memoire.to_json(fake_child.crafted_result(gpu_validation.ALLOCATOR_SIZE)))


def test_under_cuda_malloc_async_unknown_settings_are_what_pytorch_2_11_can_record(monkeypatch):
    result = allocator_result(monkeypatch, "backend:cudaMallocAsync")
    assert result["environment"]["allocator_settings"] is None  # as 2.11 records it
    here = {"torch": "2.11.0+stand-in"}
    rows = gpu_validation.check_allocator_run(result, "backend:cudaMallocAsync", here)
    assert [row[2] for row in rows] == [True] * 5
    assert rows[4][3] == "PyTorch 2.11.0+stand-in"
    assert not gpu_validation.check_allocator_run(result, "backend:cudaMallocAsync", {"torch": "2.13.0"})[1][2]
    assert not gpu_validation.check_allocator_run(result, "expandable_segments:True", here)[0][2]  # native expected
    result["environment"]["gpu"]["allocator_backend"] = "native"  # the backend not recorded as set
    assert not gpu_validation.check_allocator_run(result, "backend:cudaMallocAsync", here)[0][2]
    result["environment"]["gpu"]["allocator_backend"] = "cudaMallocAsync"
    result["phases"][0]["verdict"] = "agrees"  # not the kit's own verdict: both rows fail
    rows = gpu_validation.check_allocator_run(result, "backend:cudaMallocAsync", here)
    assert [row[2] for row in rows] == [True, True, False, True, False]
    result["phases"][0]["verdict"] = "not checked"
    result["phases"][0]["checked_counters"] = ["end_requested_bytes"]  # a counter it cannot check: two rows fail
    rows = gpu_validation.check_allocator_run(result, "backend:cudaMallocAsync", here)
    assert [row[2] for row in rows] == [True, True, True, False, False]
    assert gpu_validation.check_allocator_run({"kit": "x"}, "backend:cudaMallocAsync", {})[0][:3] == (
        "report",
        "read by report",
        False,
    )


def test_native_settings_recorded_as_unknown_are_not_as_set(monkeypatch):
    result = allocator_result(monkeypatch, "expandable_segments:True")
    assert gpu_validation.check_allocator_run(result, "expandable_segments:True", {})[0][2]
    result["environment"]["allocator_settings"] = None
    assert not gpu_validation.check_allocator_run(result, "expandable_segments:True", {})[0][2]


def test_the_disagreement_fails_its_own_rows_named_with_the_kit_s_own_figures(tmp_path, capsys, monkeypatch, scratch):
    with_stand_in_children(monkeypatch, "disagree")
    status, out, err, rows = validate(tmp_path, capsys)
    assert (status, err) == (1, "")
    assert set(failed(rows)) == DISAGREED
    line = rows["small-float32 run 1: the kit's checks"]
    assert "prediction disagreed" in line
    verdict, texts = evidence(tmp_path)
    assert verdict == out
    whole = [json.loads(line) for line in texts["checks.jsonl"].splitlines()]
    [detail] = [check["detail"] for check in whole if check["check"] == "small-float32 run 1: the kit's checks"]
    assert '"counter": "peak_requested_bytes"' in detail
    assert '"difference_bytes": 512' in detail


def test_a_hanging_child_is_killed_and_reported_and_the_verdict_still_written(tmp_path, capsys, monkeypatch, scratch):
    with_stand_in_children(monkeypatch, "hang", real=("cross-check",))
    status, out, _, rows = validate(tmp_path, capsys, "--timeout-seconds", "1")
    assert status == 1
    assert "cross-check timed out" in rows["every child that started finished in time"]
    assert rows["cross-check child ran"].startswith(
        "FAIL  cross-check child ran  timed out, exit status None: killed after 1 s"
    )
    assert evidence(tmp_path)[0] == out


# --- refusals: one line, exit 2, nothing written ------------------------------------------------------


def test_without_a_gpu_it_refuses_in_one_line_and_writes_nothing(tmp_path, capsys, monkeypatch, scratch):
    no_gpu_here()

    def execute(record, command, cwd, setting, limit):  # the real kit's environment, called in this process
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            status = mesure_memoire.main(command[2:])
        record.update(outcome="exited", exit_status=status, stdout=out.getvalue())

    monkeypatch.setattr(gpu_validation, "execute", execute)
    status = gpu_validation.main(["--device", "cuda:0", "--output-dir", str(tmp_path / "out")])
    out, err = capsys.readouterr()
    assert (status, out) == (2, "")
    assert err.count("\n") == 1
    assert err.startswith("gpu_validation.py: error: no usable GPU for cuda:0: ")
    assert "exit status" not in err  # the kit's own reason, not a failed child
    assert list(tmp_path.iterdir()) == [scratch]


@pytest.mark.parametrize(
    ("existing", "message"),
    [
        ("out/verdict.txt", "--output-dir: verdict.txt already exists there (nothing is overwritten)"),
        (
            "out/gpu-validation.tar.gz",
            "--output-dir: gpu-validation.tar.gz already exists there (nothing is overwritten)",
        ),
        ("out", "--output-dir: {out} is not a folder"),
    ],
)
def test_an_existing_verdict_or_archive_is_refused_and_left_as_it_was(
    tmp_path, capsys, monkeypatch, scratch, existing, message
):
    with_stand_in_children(monkeypatch)
    (tmp_path / existing).parent.mkdir(exist_ok=True)
    (tmp_path / existing).write_text("kept")
    before = tree_digest(tmp_path)
    status, out, err, _ = validate(tmp_path, capsys)
    assert (status, out) == (2, "")
    assert err == f"gpu_validation.py: error: {message.format(out=tmp_path / 'out')}\n"
    assert tree_digest(tmp_path) == before


def test_a_folder_that_cannot_be_made_is_one_line_and_leaves_nothing(tmp_path, capsys, monkeypatch, scratch):
    with_stand_in_children(monkeypatch)
    (tmp_path / "a-file").write_text("kept")
    before = tree_digest(tmp_path)
    status = gpu_validation.main(["--device", "cuda:0", "--output-dir", str(tmp_path / "a-file" / "out")])
    out, err = capsys.readouterr()
    assert (status, out) == (2, "")
    assert err.startswith("gpu_validation.py: error: --output-dir: NotADirectoryError: ")
    assert err.count("\n") == 1
    assert tree_digest(tmp_path) == before


@pytest.mark.parametrize(
    ("argv", "fragment"),
    [
        (["--device", "cpu"], MESSAGES["--device not cuda:N"].format(device="'cpu'")),
        (["--timeout-seconds", "0"], "--timeout-seconds"),
        (["--budget-seconds", "1e3"], "--budget-seconds"),
        (["--output-dir", ""], "--output-dir: expected the name of a folder, got ''"),
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
    _, summary, _, _ = mesure_memoire.measure_phases(torch, RecordingCudaStandIn(device=cpu), cpu, config)
    answer = gpu_validation.cross_check(torch, torch.device("cpu"), [spec("bfloat16")])["x"]
    assert answer["checksum_float64"] == summary["checksum_float64"]
    assert answer["elements"] == 2 * 8 * 64


# The flags the numerics rows judge by.  fp32_precision and allow_fp16_accumulation: 2.11 and later have both,
# 2.8.0 only the second, 2.4.1 neither (the version matrix).
HAS_MATMUL_FLAG = {
    flag: hasattr(torch.backends.cuda.matmul, flag) for flag in ("fp32_precision", "allow_fp16_accumulation")
}
NEWER_MATMUL_FLAGS = all(HAS_MATMUL_FLAG.values())


@pytest.fixture
def matmul_flags_restored():
    """PyTorch's real matmul flags, put back as they were after the test."""
    matmul = torch.backends.cuda.matmul
    kept = {flag: getattr(matmul, flag) for flag in ("fp32_precision", "allow_fp16_accumulation")}
    yield matmul
    for flag, value in kept.items():
        setattr(matmul, flag, value)


@pytest.mark.skipif(not NEWER_MATMUL_FLAGS, reason="this PyTorch lacks fp32_precision or allow_fp16_accumulation")
def test_the_matmul_arithmetic_is_read_from_pytorch_and_a_raising_read_is_null(matmul_flags_restored):
    matmul = matmul_flags_restored
    matmul.fp32_precision, matmul.allow_fp16_accumulation = "ieee", True
    assert gpu_validation.matmul_arithmetic(torch) == {
        "float32_matmul_precision": "highest",
        "allow_tf32": False,
        "fp32_precision": "ieee",
        "allow_fp16_reduced_precision_reduction": matmul.allow_fp16_reduced_precision_reduction,
        "allow_bf16_reduced_precision_reduction": matmul.allow_bf16_reduced_precision_reduction,
        "allow_fp16_accumulation": True,
    }
    matmul.fp32_precision = "tf32"  # the new API set: PyTorch's legacy reads raise
    flags = gpu_validation.matmul_arithmetic(torch)
    assert (flags["float32_matmul_precision"], flags["allow_tf32"], flags["fp32_precision"]) == (None, None, "tf32")


def stand_in_matmul(precision, **flags):
    """A stand-in for a PyTorch's matmul settings: get_float32_matmul_precision and the matmul flags given."""
    matmul = types.SimpleNamespace(**flags)
    return types.SimpleNamespace(
        get_float32_matmul_precision=lambda: precision,
        backends=types.SimpleNamespace(cuda=types.SimpleNamespace(matmul=matmul)),
    )


REDUCTION = {"allow_fp16_reduced_precision_reduction": False, "allow_bf16_reduced_precision_reduction": True}


@pytest.mark.parametrize(
    ("stand_in", "read"),
    [
        (  # PyTorch 2.4's API: no fp32_precision, no fp16 accumulation
            stand_in_matmul("high", allow_tf32=True, **REDUCTION),
            {"float32_matmul_precision": "high", "allow_tf32": True, "fp32_precision": None},
        ),
        (  # odd values: neither a boolean nor a known word
            stand_in_matmul("hunter2", allow_tf32=1, fp32_precision="TF32", allow_fp16_accumulation="x", **REDUCTION),
            {"float32_matmul_precision": None, "allow_tf32": None, "fp32_precision": None},
        ),
    ],
    ids=["older", "odd"],
)
def test_a_matmul_flag_pytorch_lacks_or_answers_oddly_is_null(stand_in, read):
    assert gpu_validation.matmul_arithmetic(stand_in) == {**read, **REDUCTION, "allow_fp16_accumulation": None}


@pytest.mark.parametrize("dtype", gpu_validation.DTYPES)
def test_real_outputs_pass_both_bounds_under_the_flags_pytorch_reports_then_the_flags_come_back(dtype):
    before = gpu_validation.matmul_arithmetic(torch)
    answers = gpu_validation.cross_check(torch, torch.device("cpu"), [spec(dtype)])
    assert answers["settings"] == before == gpu_validation.matmul_arithmetic(torch), "flags restored"
    assert answers["strict_settings"] == {
        **before,
        "allow_fp16_reduced_precision_reduction": False,
        "allow_bf16_reduced_precision_reduction": False,
    }
    assert answers["torch"] == str(torch.__version__)
    rows = gpu_validation.judge_numerics("x", spec(dtype), answers["x"], answers)
    release = tuple(int(part) for part in torch.__version__.split(".")[:2])
    ignored = dtype != "float32" and release < gpu_validation.STRICT_REDUCTION_SINCE  # cuBLASLt ignores the flags
    assert [row[1] for row in rows] == [True, None if ignored else True], rows
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
    before = gpu_validation.matmul_arithmetic(torch)
    build = mesure_memoire.build_model  # the kit's layers, in a model whose forward fails under the strict flags
    monkeypatch.setattr(mesure_memoire, "build_model", lambda t, width: FailsWithReductionOff(*build(t, width)))
    with pytest.raises(RuntimeError, match="reduction off"):
        gpu_validation.cross_check(torch, torch.device("cpu"), [spec("float16")])
    assert gpu_validation.matmul_arithmetic(torch) == before


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
    for regime in ("synchronized", "back_to_back"):
        assert answer[f"timer_{regime}_median_seconds"] > 0
        started, ended = answer[f"timer_{regime}_window"]
        assert 0.05 <= ended - started < 60
    monkeypatch.delattr(torch.utils, "benchmark")  # as on a PyTorch whose benchmark needs the absent NumPy
    monkeypatch.setitem(sys.modules, "torch.utils.benchmark", None)
    answer = gpu_validation.cross_check(torch, torch.device("cpu"), [timed])["x"]
    assert "timer_synchronized_median_seconds" not in answer
    assert "torch.utils.benchmark" in answer["timer_error"]


def test_a_row_names_this_machine_s_known_folders_as_path_and_a_gpu_uuid_as_withheld(tmp_path, capsys):
    from pathlib import Path

    validation = gpu_validation.Validation("cuda:0", tmp_path / "work", runner=None)
    folders = (sys.prefix, sys.base_prefix, str(Path.home()), tempfile.gettempdir(), str(ROOT))
    detail = " ".join(f"{folder}/x" for folder in folders) + " GPU-8a1f6c2e-3b4d-4e5f-9a0b-1c2d3e4f5a6b"
    validation.row("evidence", True, detail)
    capsys.readouterr()
    shown = json.loads((tmp_path / "work" / "checks.jsonl").read_text())["detail"]  # the whole detail, uncut
    for folder in folders:
        assert f"{folder}/" not in shown, folder
    assert shown.count("<path>/x") == len(folders)
    assert "<withheld>" in shown


def test_a_child_s_log_keeps_the_kit_s_lines_and_never_pytorch_s_raw_stderr(tmp_path, monkeypatch):
    """What PyTorch writes on a child's stderr can hold ANSI escapes and any path: the archive keeps it only by the
    kit's allow-list; the kit's own lines stay whole.  (A stand-in child writes what PyTorch could.)"""
    kit_line = "mesure_memoire.py: error: phase inputs failed (batch 1): RuntimeError (text withheld); nothing written"
    raw = "\x1b[33m[W1206 /opt/site/torch/lib/x.cpp:12] TORCH_X=hunter2\x1b[0m"
    written = f"{raw}\nCUDA error: out of memory\n{kit_line}\n"
    script = f"import sys; sys.stderr.write({written!r})"
    monkeypatch.setattr(gpu_validation, "command_for", lambda kind, arguments: [sys.executable, "-c", script])
    runner = gpu_validation.Runner(timeout_seconds=60, budget_seconds=60)
    validation = gpu_validation.Validation("cuda:0", tmp_path / "work", runner)
    validation.child("child", "kit", [])
    [log] = (tmp_path / "work" / "logs").iterdir()
    text = log.read_text()
    for secret in ("\x1b", "/opt/site", "hunter2"):
        assert secret not in text, secret
    assert f"{kit_line}\n" in text
    assert "CUDA error: out of memory" in text, "a known message is kept by the allow-list"


# --- the clock sampler, on the H200's own log -----------------------------------------------------------------

RERUN = ROOT / "validation" / "h200-2026-12-04" / "rerun"


def test_the_sampler_s_busy_windows_on_the_h200_rerun_s_clock_log():
    """Golden data: the rerun's clocks.csv (nvidia-smi every 50 ms) and steps.txt (when each step began), one
    H200 on 4 December 2026.  A step's busy window: its samples without the GPU-idle reason (the idle clock decays
    through 480, 420, 390 ... to 345 MHz, so the clock cannot tell)."""
    samples = gpu_validation.parse_samples((RERUN / "clocks.csv").read_text(encoding="utf-8"))
    assert len(samples) == 645 and min(sample.clock_mhz for sample in samples) == 345
    steps = [line.split() for line in (RERUN / "steps.txt").read_text(encoding="utf-8").splitlines()]
    starts = [gpu_validation.time_of_day(step[-1]) for step in steps]
    windows = [
        gpu_validation.busy_window(samples, start, end) for start, end in zip(starts[:-1], starts[1:], strict=True)
    ]
    # measure float16, Timer float16, measure bfloat16, Timer bfloat16: (median MHz, samples, power-capped)
    assert [gpu_validation.clock_figures(window) for window in windows] == [
        (1980, 59, 16),
        (1980, 128, 44),
        (1980, 79, 16),
        (1980, 98, 35),
    ]
    assert [min(sample.clock_mhz for sample in window) for window in windows] == [1425, 1170, 1500, 1215]
    # The last half of Timer's back-to-back run: the clock the power cap holds it to.
    assert [gpu_validation.clock_figures(window[len(window) // 2 :])[0] for window in windows] == [
        1965,
        1447.5,
        1980,
        1530,
    ]


def test_a_sampler_line_cut_or_not_available_is_left_out():
    text = (
        "2026/12/04 16:53:21.078, 465 MHz, 108.80 W, 39, 0x0000000000000001\n"
        "2026/12/04 16:53:21.133, [N/A], 108.80 W, 39, 0x0000000000000000\n"
        "2026/12/04 16:53:21.183, 1980 MHz, 700.00 W, 40, 0x00000000000000\n"  # cut: still a number
        "2026/12/04 16:53:21.2"
    )
    assert gpu_validation.parse_samples(text) == [
        gpu_validation.Sample(60801.078, 465, 1),
        gpu_validation.Sample(60801.183, 1980, 0),
    ]


def test_a_timing_row_is_not_judged_where_the_clocks_differ_and_says_both(tmp_path, capsys, monkeypatch):
    validation = gpu_validation.Validation("cuda:0", tmp_path / "work", runner=None)
    now = time.time()

    def stamp(epoch, mhz):  # a sampler line, stamped as nvidia-smi does: the local time
        local = time.strftime("%Y/%m/%d %H:%M:%S", time.localtime(epoch)) + f"{epoch % 1:.3f}"[1:]
        return f"{local}, {mhz} MHz, 650.00 W, 55, 0x0000000000000000"

    lines = [stamp(now + i * 0.05, 1980) for i in range(20)] + [stamp(now + 2 + i * 0.05, 1500) for i in range(20)]
    (tmp_path / "work" / "clocks.csv").write_text("\n".join(lines) + "\n")
    windows = ([now, now + 1], [now + 2, now + 3])
    validation.like_with_like("same regime", 3.0, 3.0, windows, 0.0, "")
    assert capsys.readouterr().out.startswith("NOT JUDGED  same regime  1.0000 in [0.9500, 1.0500]")
    assert "SM clock medians 1980.0 and 1500.0 MHz (20 and 20 samples" in validation.rows[-1][2]
    validation.like_with_like("same clock", 3.3, 3.0, (windows[0], windows[0]), 0.0, "")
    assert capsys.readouterr().out.startswith("FAIL  same clock  1.1000 in [0.9500, 1.0500]")
