"""tools/gpu_validation.py, proven on the CPU up to the GPU boundary.

No GPU can be had here.  The results checked are crafted by tests/data/gpu_validation/fake_child.py,
a STAND-IN for the GPU children (it writes consistent schema-2 results, not measurements); the
flow tests replace the children's commands with it.  The numerics and the Timer cross-check run
on real PyTorch CPU ops; the refusal without a GPU runs the real kit.
"""

import contextlib
import gzip
import importlib.util
import io
import json
import math
import os
import signal
import subprocess
import sys
import tarfile
import time

import pytest

import mesure_memoire
from conftest import ROOT, sigint_as_from_a_terminal, tree_digest

DATA = ROOT / "tests" / "data" / "gpu_validation"
FAKE_CHILD = DATA / "fake_child.py"


def load(name, path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


gpu_validation = load("gpu_validation", ROOT / "tools" / "gpu_validation.py")
fake_child = load("fake_child", FAKE_CHILD)
MIB = 2**20


def options(size="larger", dtype="float32", **changes):
    return {**gpu_validation.CONFIGURATIONS[f"{size}-{dtype}"], **changes}


def failures(result, requested=None):
    return [(family, what) for family, what, passed, _ in gpu_validation.check_result(result, requested) if not passed]


# --- the checker, with crafted schema-2 results ----------------------------------------------


@pytest.mark.parametrize("size", list(gpu_validation.SIZES))
@pytest.mark.parametrize("dtype", gpu_validation.DTYPES)
def test_a_crafted_schema2_result_passes_every_check(size, dtype):
    wanted = options(size, dtype)
    checks = gpu_validation.check_result(fake_child.crafted_result(wanted), wanted)
    assert [c for c in checks if not c[2]] == []
    families = {family for family, _, _, _ in checks}
    assert families == {"structure", "predictions", "device time", "workspace", "numerics"}


def test_no_warmup_gives_no_warmup_line_and_still_passes():
    wanted = options(warmup=0, repeats=1)
    assert failures(fake_child.crafted_result(wanted), wanted) == []


def doctored(change, wanted=None):
    result = fake_child.crafted_result(wanted or options())
    change(result)
    return result


def set_phase(index, **values):
    return lambda result: result["phases"][index].update(values)


DISAGREEMENT = {"phase": "cold_forward", "repetition": None, "counter": "end_requested_bytes",
                "predicted_bytes": 10, "measured_bytes": 12, "difference_bytes": 2}  # fmt: skip


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        (lambda r: r["phases"].pop(3), [("structure", "phase lines")]),
        (set_phase(4, repetition=3), [("structure", "repetitions numbered")]),
        (lambda r: r["phases"][2].update(end_reserved_bytes=r["phases"][2]["end_allocated_bytes"] - 1),
         [("structure", "cold_forward: allocated <= reserved")]),
        (set_phase(5, peak_allocated_bytes=0), [("structure", "warm_forward#2: peaks >= ends and baselines"),
                                                ("predictions", "warm_forward#2: requested <= allocated")]),
        (set_phase(3, seconds=0), [("structure", "warmup: time > 0"),
                                   ("device time", "warmup: 0 < device_ms <= wall")]),
        (set_phase(3, peak_reserved_bytes=None), [("structure", "warmup: counters")]),
        (lambda r: r["environment"].update(gpu_available=False), [("structure", "GPU recorded")]),
        (lambda r: r["configuration"].update(fresh_process_warning="not\nfresh"), [("structure", "fresh process")]),
        (lambda r: r.update(schema_version=3), [("structure", "schema version 1 or 2"),
                                                ("predictions", "schema 2 fields")]),
        (lambda r: r["configuration"].update(width=32), [("structure", "configuration as requested"),
                                                         ("numerics", "checksum recorded")]),
        (set_phase(2, verdict="disagrees", disagreements=[DISAGREEMENT]),
         [("predictions", "cold_forward: verdict"), ("predictions", "prediction_check agrees with the phases")]),
        (set_phase(2, disagreements=[DISAGREEMENT]),
         [("predictions", "cold_forward: verdict"), ("predictions", "prediction_check agrees with the phases")]),
        (set_phase(1, verdict="not checked"), [("predictions", "inputs: verdict")]),
        (set_phase(1, end_requested_bytes=10**9), [("predictions", "inputs: requested <= allocated")]),
        (set_phase(1, peak_requested_bytes=None), [("predictions", "inputs: requested counters")]),
        (set_phase(0, predicted=None), [("predictions", "model_load: prediction recorded")]),
        (set_phase(4, device_ms=None), [("device time", "warm_forward#1: device_ms")]),
        (set_phase(4, device_ms=0.0), [("device time", "warm_forward#1: 0 < device_ms <= wall")]),
        (set_phase(4, device_ms=1.0), [("device time", "warm_forward#1: 0 < device_ms <= wall")]),
        (set_phase(4, device_ms=math.nan), [("device time", "warm_forward#1: device_ms")]),
        (lambda r: r["prediction_check"].update(agrees=False),
         [("predictions", "prediction_check agrees with the phases")]),
        (lambda r: r.pop("prediction_check"), [("predictions", "prediction_check")]),
        (lambda r: r["prediction_check"].update(disagreements=[DISAGREEMENT]),
         [("predictions", "prediction_check agrees with the phases")]),
        (lambda r: r["workspace"].update(measured_bytes=None), [("workspace", "workspace measured")]),
        (lambda r: r["workspace"].update(measured_bytes=-1), [("workspace", "workspace measured")]),
        (lambda r: r["workspace"].pop("how"), [("workspace", "workspace measured")]),
        (lambda r: r["output_summary"].update(all_finite=False), [("numerics", "output all finite")]),
        (lambda r: r["output_summary"].update(checksum_float64=math.inf), [("numerics", "checksum recorded")]),
        (lambda r: r["output_summary"].update(elements=7), [("numerics", "checksum recorded")]),
    ],
)  # fmt: skip
def test_each_doctored_result_fails_its_own_check(change, expected):
    assert failures(doctored(change), options()) == expected


def test_device_time_may_exceed_wall_time_only_by_the_stated_allowance():
    wall_ms = options()  # larger: 0.4 ms per phase in the crafted result
    limit = fake_child.WALL_SECONDS["larger"] * 1000 + gpu_validation.DEVICE_OVER_WALL_ALLOWANCE_MS
    assert failures(doctored(set_phase(4, device_ms=limit)), wall_ms) == []
    assert failures(doctored(set_phase(4, device_ms=limit + 1e-6)), wall_ms) == [
        ("device time", "warm_forward#1: 0 < device_ms <= wall")
    ]


def test_a_schema1_result_is_read_and_fails_only_for_the_missing_schema2_fields():
    wanted = options()
    result = fake_child.crafted_result(wanted, doctors=("schema1",))
    assert "device_ms" not in result["phases"][0]
    assert failures(result, wanted) == [("predictions", "schema 2 fields")]


@pytest.mark.parametrize("result", [[], "text", {"phases": "x", "configuration": None, "environment": 3}])
def test_a_malformed_result_fails_without_an_exception(result):
    assert failures(result)


def test_a_disagreement_is_named_with_its_difference_in_the_verdict_detail():
    checks = gpu_validation.check_result(doctored(set_phase(2, verdict="disagrees", disagreements=[DISAGREEMENT])))
    detail = next(d for _, what, _, d in checks if what == "cold_forward: verdict")
    assert detail == "'disagrees': end_requested_bytes predicted 10 measured 12 (+2 bytes)"


# --- the two fresh runs -----------------------------------------------------------------------


def test_two_identical_runs_compare_equal_and_report_their_spread():
    first, second = fake_child.crafted_result(options()), fake_child.crafted_result(options())
    for phase in second["phases"]:
        phase["seconds"] *= 1.5
    comparison = gpu_validation.compare_runs(first, second)
    assert comparison["counter_differences"] == []
    assert comparison["same_checksum"] is True
    assert comparison["warm_median_ms"] == pytest.approx([0.4, 0.6])
    assert comparison["warm_median_spread"] == pytest.approx(0.5)


@pytest.mark.parametrize(
    "counter",
    [*mesure_memoire.PHASE_MEMORY_FIELDS, *gpu_validation.REQUESTED_FIELDS],
)
def test_any_counter_that_differs_between_the_runs_is_named(counter):
    first, second = fake_child.crafted_result(options()), fake_child.crafted_result(options())
    second["phases"][5][counter] += 512
    comparison = gpu_validation.compare_runs(first, second)
    assert comparison["counter_differences"] == [
        f"warm_forward#2 {counter}: {first['phases'][5][counter]} vs {first['phases'][5][counter] + 512}"
    ]


def test_a_different_checksum_or_phase_count_is_reported():
    first, second = fake_child.crafted_result(options()), fake_child.crafted_result(options())
    second["output_summary"]["checksum_float64"] += 1e-12
    second["phases"].pop()
    comparison = gpu_validation.compare_runs(first, second)
    assert comparison["same_checksum"] is False
    assert comparison["counter_differences"] == ["9 phase lines vs 8"]


def test_a_missing_checksum_is_never_the_same_checksum():
    first, second = fake_child.crafted_result(options()), fake_child.crafted_result(options())
    for run in (first, second):
        run["output_summary"]["checksum_float64"] = None
    assert gpu_validation.compare_runs(first, second)["same_checksum"] is False


# --- numerics: the tolerances, and real CPU ops ----------------------------------------------


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_the_checksum_bound_is_one_unit_roundoff_of_the_absolute_sum(dtype):
    bound = gpu_validation.UNIT_ROUNDOFF[dtype]
    assert bound == {"float16": 2**-11, "bfloat16": 2**-8}[dtype]
    agree = gpu_validation.checksum_agreement
    assert agree(10.0, 1000.0, 10.0 + bound * 1000.0, dtype) == (True, pytest.approx(bound), bound)
    assert agree(10.0, 1000.0, 10.0 - bound * 1000.0 * 1.001, dtype)[0] is False
    assert agree(10.0, 0.0, 10.0, dtype)[0] is False
    assert agree(10.0, 1000.0, math.nan, dtype)[0] is False
    assert agree(None, 1000.0, 10.0, dtype)[0] is False


@pytest.fixture(scope="module")
def cpu_cross_check():
    """The cross-check's own code on real CPU ops, for the small and larger sizes."""
    import torch

    specs = [spec for spec in gpu_validation.cross_check_specs() if not spec["name"].startswith("big")]
    specs[0] = {**specs[0], "timer": True, "min_run_seconds": 0.02}  # small-float32: the Timer path too
    return torch, gpu_validation.cross_check(torch, torch.device("cpu"), specs, lambda: 7)


def test_the_cross_check_computes_measure_s_forward_and_its_checksum(cpu_cross_check):
    torch, answers = cpu_cross_check
    wanted = options("small")
    torch.manual_seed(0)
    model = mesure_memoire.build_model(torch, wanted["width"]).eval()
    generator = torch.Generator().manual_seed(0)
    with torch.inference_mode():
        output = model(torch.randn((1, 16, 64), generator=generator)).double()
    answer = answers["small-float32"]
    assert answer["checksum_float64"] == output.sum().item()
    assert answer["absolute_sum_float64"] == output.abs().sum().item()
    assert (answer["all_finite"], answer["elements"]) == (True, 1024)
    assert answer["current_device"] == 7 and 0 < answer["timer_median_seconds"] < 0.05
    assert "timer_median_seconds" not in answers["larger-float32"]


@pytest.mark.parametrize("size", ["small", "larger"])
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_real_reduced_precision_outputs_meet_both_tolerances_on_the_cpu(cpu_cross_check, size, dtype):
    _, answers = cpu_cross_check
    reference, answer = answers[f"{size}-float32"], answers[f"{size}-{dtype}"]
    passed, relative, bound = gpu_validation.checksum_agreement(
        reference["checksum_float64"], reference["absolute_sum_float64"], answer["checksum_float64"], dtype
    )
    assert passed and relative < bound / 10  # the margin the bound's comment states
    distance = answer["relative_l2_to_reference"]
    assert 0.5 * bound < distance <= gpu_validation.ELEMENTWISE_UNIT_ROUNDOFFS * bound


def test_a_wrong_forward_fails_the_elementwise_bound(cpu_cross_check):
    """GELU replaced by ReLU in bfloat16: the elementwise check catches what a signed sum may not."""
    torch, answers = cpu_cross_check
    torch.manual_seed(0)
    model = mesure_memoire.build_model(torch, 1024).eval()
    generator = torch.Generator().manual_seed(0)
    inputs = torch.randn((2, 128, 1024), generator=generator)
    with torch.inference_mode():
        reference = model(inputs).double()
        wrong = model[2](torch.relu(model[0](inputs))).double()
    distance = ((wrong - reference).norm() / reference.norm()).item()
    assert distance > gpu_validation.ELEMENTWISE_UNIT_ROUNDOFFS * gpu_validation.UNIT_ROUNDOFF["bfloat16"]
    assert reference.sum().item() == answers["larger-float32"]["checksum_float64"]


def test_the_real_cross_check_command_reaches_the_gpu_boundary_and_fails_in_one_line(tmp_path):
    """Its real command line, on this CPU-only build: it imports and gets as far as making the device current."""
    specs = json.dumps(gpu_validation.cross_check_specs()[:1])
    argv, shown = gpu_validation.command_for("cross-check", ["cuda:0", specs])
    record = gpu_validation.Runner(60, 60).run("cross-check", argv, shown, tmp_path)
    assert (record["outcome"], record["exit_status"], record["stdout"]) == ("exited", 3, "")
    assert record["stderr"].startswith("cross-check child: ") and len(record["stderr"].splitlines()) == 1
    assert "_cuda_setDevice" in record["stderr"]  # torch.cuda.set_device, on a build without CUDA
    assert shown == f"python3 <cross-check child> cuda:0 {specs}" and str(ROOT) not in shown


def test_every_size_runs_in_three_dtypes_and_the_readme_commands_are_among_them():
    configurations = gpu_validation.CONFIGURATIONS
    assert set(configurations) == {f"{s}-{d}" for s in ("small", "larger", "big") for d in gpu_validation.DTYPES}
    assert set(gpu_validation.DTYPES) == set(mesure_memoire.DTYPE_BYTES)
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    for name, output in (("small-float32", "mesures-petit-essai.json"), ("larger-float32", "mesures.json")):
        flags = " ".join(f"--{k} {configurations[name][k]}" for k in ("batch", "context", "width", "dtype", "warmup",
                                                                      "repeats"))  # fmt: skip
        assert f"python mesure_memoire.py measure --device cuda:0 {flags} --output {output}" in readme
    specs = gpu_validation.cross_check_specs()
    assert [s["name"] for s in specs] == [f"{s}-{d}" for s in gpu_validation.SIZES for d in gpu_validation.DTYPES]
    assert [s["name"] for s in specs if s["timer"]] == ["big-float32", "big-float16", "big-bfloat16"]


# --- children: timeouts, budget --------------------------------------------------------------

SLEEPER = """\
import subprocess, sys, time
grandchild = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
open(sys.argv[1], "w").write(str(grandchild.pid))
time.sleep(60)
"""


def gone(pid, seconds=5.0):
    """True once ``pid`` no longer runs (gone, or a zombie nobody has reaped yet)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{pid}/stat") as stream:
                if stream.read().rsplit(")", 1)[1].split()[0] == "Z":
                    return True
        except FileNotFoundError:
            return True
        time.sleep(0.05)
    return False


def test_a_hanging_child_and_its_grandchild_are_killed_and_reported(tmp_path):
    runner = gpu_validation.Runner(timeout_seconds=1, budget_seconds=60)
    pid_file = tmp_path / "pid"
    started = time.monotonic()
    record = runner.run("sleeper", [sys.executable, "-c", SLEEPER, str(pid_file)], "python3 <sleeper>", tmp_path)
    assert time.monotonic() - started < 10
    assert record["outcome"] == "timed out" and record["exit_status"] == -signal.SIGKILL
    assert "killed after 1 s" in record["stderr"]
    assert gone(int(pid_file.read_text()))


def test_once_the_budget_is_spent_children_are_not_run_and_say_so(tmp_path):
    now = [0.0]
    runner = gpu_validation.Runner(timeout_seconds=100, budget_seconds=50, clock=lambda: now[0])
    now[0] = 49.5
    record = runner.run("late", [sys.executable, "-c", "raise SystemExit(3)"], "late", tmp_path)
    assert (record["outcome"], record["exit_status"]) == ("not run", None)
    assert runner.records == [record]


def test_a_child_gets_the_smaller_of_its_timeout_and_the_budget_left(tmp_path):
    runner = gpu_validation.Runner(timeout_seconds=100, budget_seconds=30)
    record = runner.run("quick", [sys.executable, "-c", "print('hello')"], "quick", tmp_path)
    assert (record["outcome"], record["exit_status"], record["stdout"]) == ("exited", 0, "hello\n")
    assert 25 < record["timeout_seconds"] <= 30


def test_a_child_that_cannot_start_is_reported(tmp_path):
    runner = gpu_validation.Runner(timeout_seconds=5, budget_seconds=30)
    record = runner.run("missing", [str(tmp_path / "no-such-tool")], "no-such-tool", tmp_path)
    assert record["outcome"] == "could not start" and "FileNotFoundError" in record["stderr"]
    assert str(tmp_path) not in record["stderr"]


# --- provenance -------------------------------------------------------------------------------

CANNED_CSV = "0, NVIDIA H200, 580.65.06, Disabled, 1980 MHz, 3201 MHz, 1980 MHz, 3201 MHz, [N/A], [N/A], 700.00 W\n"


def test_the_vendor_csv_parser_keeps_only_the_asked_fields_and_reads_n_a_as_null():
    rows = gpu_validation.parse_vendor_csv(CANNED_CSV, gpu_validation.VENDOR_FIELDS)
    assert rows == [{"index": "0", "name": "NVIDIA H200", "driver_version": "580.65.06", "mig.mode.current": "Disabled",
                     "clocks.sm": "1980 MHz", "clocks.mem": "3201 MHz", "clocks.max.sm": "1980 MHz",
                     "clocks.max.mem": "3201 MHz", "clocks.applications.graphics": None,
                     "clocks.applications.memory": None, "power.limit": "700.00 W"}]  # fmt: skip
    assert not any("uuid" in f or "serial" in f or "pci" in f for f in gpu_validation.VENDOR_FIELDS)


@pytest.mark.parametrize(
    "canned",
    [
        "GPU-5c3e1f2a-0b4d-4e6f-8a9b-1c2d3e4f5a6b, 580.65.06\n",
        "5c3e1f2a-0b4d-4e6f-8a9b-1c2d3e4f5a6b, 580.65.06\n",
        "MIG-5c3e1f2a-0b4d-4e6f-8a9b-1c2d3e4f5a6b, 580.65.06\n",
    ],
)
def test_a_uuid_is_never_emitted_even_in_an_allowed_field(canned):
    rows = gpu_validation.parse_vendor_csv(canned, ["name", "driver_version"])
    assert rows == [{"name": None, "driver_version": "580.65.06"}]


@pytest.mark.parametrize("canned", ["NVIDIA H200, 580.65.06, GPU-5c3e1f2a-0b4d-4e6f-8a9b-1c2d3e4f5a6b\n", "", "\n"])
def test_unexpected_vendor_output_is_refused_whole(canned):
    with pytest.raises(ValueError):
        gpu_validation.parse_vendor_csv(canned, ["name", "driver_version"])


IN_PROCESS = "<stand-in, in process>"


def fake_commands(monkeypatch, *doctors, replace=None, seen=None, in_process=False):
    """Replace every child's command with the stand-in (``replace`` may swap one for another).

    ``in_process``: the stand-in's main() runs inside this process (fast) instead of a new one;
    a command that ``replace`` gives still runs as a real child.
    """
    real = gpu_validation.command_for

    def command_for(kind, arguments):
        _, shown = real(kind, arguments)
        if seen is not None:
            seen.append((kind, arguments))
        swapped = replace(kind, arguments) if replace else None
        if swapped:
            return swapped, shown
        extra = [item for doctor in doctors for item in ("--doctor", doctor)]
        return [IN_PROCESS if in_process else sys.executable, str(FAKE_CHILD), *extra, kind, *arguments], shown

    monkeypatch.setattr(gpu_validation, "command_for", command_for)
    monkeypatch.setattr(gpu_validation, "Runner", InProcessRunner)


class InProcessRunner(gpu_validation.Runner):
    """The real Runner, except that the stand-in marked IN_PROCESS runs as a function call."""

    def run(self, name, argv, shown, cwd, timeout_seconds=None):
        if argv[0] != IN_PROCESS:
            return super().run(name, argv, shown, cwd, timeout_seconds)
        stdout, stderr, before = io.StringIO(), io.StringIO(), os.getcwd()
        try:
            os.chdir(cwd or before)
            with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
                status = fake_child.main(argv[2:])
        finally:
            os.chdir(before)
        record = {"name": name, "command": shown, "outcome": "exited", "exit_status": status, "seconds": 0.0,
                  "stdout": stdout.getvalue(), "stderr": stderr.getvalue(), "timeout_seconds": 1}  # fmt: skip
        self.records.append(record)
        return record


def test_the_vendor_query_degrades_field_by_field(monkeypatch):
    fake_commands(monkeypatch, "unsupported=clocks.applications.memory", in_process=True)
    vendor = gpu_validation.vendor_query(gpu_validation.Runner(20, 60))
    assert vendor["gpus"] == [{k: v for k, v in fake_child.VENDOR_VALUES.items() if k != "clocks.applications.memory"}]
    assert list(vendor["field_errors"]) == ["clocks.applications.memory"]
    assert "is not a valid field" in vendor["field_errors"]["clocks.applications.memory"]


def test_without_the_vendor_tool_every_field_is_null_with_its_reason(monkeypatch, tmp_path):
    monkeypatch.setattr(gpu_validation, "command_for", lambda kind, arguments: ([str(tmp_path / "nvidia-smi")], "x"))
    runner = gpu_validation.Runner(20, 60)
    vendor = gpu_validation.vendor_query(runner)
    assert vendor["gpus"] == [] and len(runner.records) == 1  # not asked again field by field
    assert set(vendor["field_errors"]) == set(gpu_validation.VENDOR_FIELDS)
    assert all(reason.startswith("could not start") for reason in vendor["field_errors"].values())


@pytest.mark.whole_kit
def test_the_kit_files_are_hashed_and_checked_against_the_manifest(tmp_path):
    import hashlib

    hashes = gpu_validation.kit_file_hashes()
    manifest = json.loads((ROOT / "MANIFEST.json").read_text(encoding="utf-8"))
    assert hashes["mismatches"] == []
    assert sorted(hashes["files"]) == sorted(m["path"] for m in manifest["members"])
    readme = hashlib.sha256((ROOT / "README.md").read_bytes()).hexdigest()
    assert hashes["files"]["README.md"] == readme
    (tmp_path / "a.txt").write_text("changed")
    (tmp_path / "MANIFEST.json").write_text(json.dumps({"members": [
        {"path": "a.txt", "sha256": "0" * 64}, {"path": "gone.txt", "sha256": None}, {"path": "MANIFEST.json",
                                                                                     "sha256": None}]}))  # fmt: skip
    doctored_hashes = gpu_validation.kit_file_hashes(tmp_path)
    assert doctored_hashes["mismatches"] == ["a.txt: differs from MANIFEST.json",
                                             "gone.txt: FileNotFoundError: [Errno 2] No such file or directory: "
                                             "'<path>'"]  # fmt: skip


# --- evidence: the archive, and no path -------------------------------------------------------


def test_the_archive_is_deterministic_sorted_and_holds_no_path(tmp_path):
    folder = tmp_path / "evidence"
    (folder / "results").mkdir(parents=True)
    (folder / "summary.json").write_text("{}\n")
    (folder / "results" / "b.json").write_text("b")
    (folder / "a.txt").write_text("a")
    first = gpu_validation.archive_bytes(folder)
    os.utime(folder / "a.txt", (1, 1))
    assert gpu_validation.archive_bytes(folder) == first
    assert first[4:8] == b"\0\0\0\0" and first[3] & 0x08 == 0  # gzip: no date, no file name
    with tarfile.open(fileobj=io.BytesIO(first)) as tar:
        members = tar.getmembers()
        assert [m.name for m in members] == ["gpu-validation/a.txt", "gpu-validation/results/b.json",
                                             "gpu-validation/summary.json"]  # fmt: skip
        assert {(m.uid, m.gid, m.uname, m.gname, m.mtime, m.mode) for m in members} == {(0, 0, "", "", 0, 0o644)}
        assert tar.extractfile("gpu-validation/results/b.json").read() == b"b"
    assert str(tmp_path).encode() not in gzip.decompress(first)


def test_the_archive_is_written_whole_and_never_over_an_existing_file(tmp_path):
    folder = tmp_path / "evidence"
    folder.mkdir()
    (folder / "x").write_text("x")
    archive = str(tmp_path / "evidence.tar.gz")
    gpu_validation.write_archive(folder, archive)
    with open(archive, "rb") as stream:
        assert stream.read() == gpu_validation.archive_bytes(folder)
    with pytest.raises(gpu_validation.ValidationError, match="nothing overwritten"):
        gpu_validation.write_archive(folder, archive)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["evidence", "evidence.tar.gz"]


def test_paths_are_scrubbed_from_logs_and_found_in_files(tmp_path):
    text = f"File {tmp_path}/x.py, line 3\nand /usr/lib/python3/y.py too; not 1/2"
    assert gpu_validation.scrub(text, [str(tmp_path)]) == "File <path>/x.py, line 3\nand <path> too; not 1/2"
    (tmp_path / "clean").write_text("nothing here")
    (tmp_path / "leaky").write_text(f"at {tmp_path}")
    assert gpu_validation.files_holding(tmp_path, [str(tmp_path)]) == ["leaky"]


# --- the command line: refusals ---------------------------------------------------------------


def refusal(capsys, argv, *fragments):
    assert gpu_validation.main(argv) == 2
    out, err = capsys.readouterr()
    assert out == "" and len(err.splitlines()) == 1 and err.startswith("gpu_validation.py: error: ")
    for fragment in fragments:
        assert fragment in err
    return err


def test_without_a_gpu_it_refuses_in_one_line_and_writes_nothing(tmp_path, capsys):
    """The real kit's environment child, on this CPU-only machine."""
    refusal(capsys, ["--device", "cuda:0", "--output-dir", str(tmp_path / "evidence")], "no usable GPU for cuda:0")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    ("argv", "fragment"),
    [
        ([], "the following arguments are required: --device, --output-dir"),
        (["--device", "cuda:0\n", "--output-dir", "e"], "got 'cuda:0\\n'"),
        (["--device", "gpu0", "--output-dir", "e"], "expected cuda:N"),
        (["--device", "cuda:0", "--output-dir", "e", "stray\nvalue"], "unrecognized arguments: stray\\nvalue"),
        (["--device", "cuda:0", "--output-dir", "e", "--timeout-seconds", "0"], "--timeout-seconds: expected"),
        (["--device", "cuda:0", "--output-dir", "e", "--budget-seconds", "1e3"], "got '1e3'"),
        (["--device", "cuda:0", "--output-dir", "new\nline"], "got 'new\\nline'"),
        (["--device", "cuda:0", "--output-dir", ""], "expected a new folder name"),
    ],
)
def test_argument_errors_are_one_line(tmp_path, capsys, monkeypatch, argv, fragment):
    monkeypatch.chdir(tmp_path)
    refusal(capsys, argv, fragment)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("existing", ["folder", "empty folder", "file", "archive"])
def test_an_existing_output_is_refused_and_left_as_it_was(tmp_path, capsys, existing):
    if existing == "folder":
        (tmp_path / "evidence").mkdir()
        (tmp_path / "evidence" / "old.json").write_text("{}")
    elif existing == "empty folder":
        (tmp_path / "evidence").mkdir()
    elif existing == "file":
        (tmp_path / "evidence").write_text("mine")
    else:
        (tmp_path / "evidence.tar.gz").write_text("mine")
    before = tree_digest(tmp_path)
    refusal(capsys, ["--device", "cuda:0", "--output-dir", str(tmp_path / "evidence")], "already exists")
    assert tree_digest(tmp_path) == before


@pytest.mark.parametrize("where", ["parent is a file", "parent missing", "read-only"])
def test_an_output_folder_that_cannot_be_created_is_refused(tmp_path, capsys, monkeypatch, where):
    (tmp_path / "file").write_text("mine")
    target = {"parent is a file": tmp_path / "file" / "e", "parent missing": tmp_path / "no" / "e"}.get(where)
    if where == "read-only":  # root ignores permission bits: the refusal os.mkdir gives is what matters
        target = tmp_path / "e"

        def read_only(path, *args):
            raise PermissionError(13, "Permission denied", str(path))

        monkeypatch.setattr(gpu_validation.os, "mkdir", read_only)
    before = tree_digest(tmp_path)
    err = refusal(capsys, ["--device", "cuda:0", "--output-dir", str(target)], "cannot create it")
    assert tree_digest(tmp_path) == before
    assert "Errno" not in err


# --- the whole flow, the GPU check forced, children replaced by the stand-in -------------------


def run_flow(tmp_path, capsys, monkeypatch, *doctors, device="cuda:0", replace=None, seen=None, extra=(),
             in_process=True):  # fmt: skip
    monkeypatch.setitem(sys.modules, "torch", None)  # the validating process must never import PyTorch
    fake_commands(monkeypatch, *doctors, replace=replace, seen=seen, in_process=in_process)
    folder = tmp_path / "evidence"
    status = gpu_validation.main(["--device", device, "--output-dir", str(folder), *extra])
    out, err = capsys.readouterr()
    return status, out, err, folder


def verdict_lines(out):
    return {line.split("  ")[0]: line for line in out.splitlines()}


@pytest.mark.whole_kit
def test_the_flow_passes_with_healthy_children_and_keeps_its_evidence(tmp_path, capsys, monkeypatch):
    seen = []
    status, out, err, folder = run_flow(tmp_path, capsys, monkeypatch, seen=seen, in_process=False)
    assert (status, err) == (0, "")
    lines = out.splitlines()
    assert lines[0].startswith("check ") and lines[-1].endswith("passed, 0 failed")
    assert (folder / "verdict.txt").read_text() == out
    summary = json.loads((folder / "summary.json").read_text())
    assert all(v["passed"] for v in summary["verdicts"]) and len(summary["verdicts"]) == len(lines) - 2
    kinds = [kind for kind, _ in seen]
    assert kinds.count("kit") == 1 + 9 * 3 + 2 and kinds.count("cross-check") == 1 and kinds.count("notebook") == 1
    notebook_code = next(arguments[0] for kind, arguments in seen if kind == "notebook")
    assert "DEVICE = 'cuda:0'" in notebook_code and "measure_to_file(" in notebook_code
    results = sorted(p.name for p in (folder / "results").iterdir())
    assert results == sorted(f"{name}-run{n}.json" for name in gpu_validation.CONFIGURATIONS for n in (1, 2))
    commands = [child["command"] for child in summary["children"]]
    assert "python3 mesure_memoire.py measure --device cuda:0 --batch 8 --context 1024 --width 4096 --dtype bfloat16 " \
           "--warmup 100 --repeats 30 --seed 0 --output results/big-bfloat16-run2.json" in commands  # fmt: skip
    with tarfile.open(tmp_path / "evidence.tar.gz") as tar:
        names = [m.name for m in tar.getmembers()]
        everything = b"".join(tar.extractfile(m).read() for m in tar.getmembers())
    on_disk = sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file())
    assert names == ["gpu-validation/" + name for name in on_disk]
    assert str(tmp_path).encode() not in everything and str(ROOT).encode() not in everything
    assert sorted(p.name for p in tmp_path.iterdir()) == ["evidence", "evidence.tar.gz"]


@pytest.mark.whole_kit
def test_the_flow_names_each_doctored_figure_in_its_verdict_line(tmp_path, capsys, monkeypatch):
    doctors = ("disagree", "nondeterministic", "nan", "far-checksum", "far-output", "slow-timer", "no-refusal",
               "unsupported=power.limit")  # fmt: skip
    status, out, err, folder = run_flow(tmp_path, capsys, monkeypatch, *doctors, device="cuda:1")
    assert (status, err) == (1, "")
    lines = verdict_lines(out)
    failed = {name for name, line in lines.items() if "  FAIL  " in line}
    for name in gpu_validation.CONFIGURATIONS:
        assert {f"{name}: predictions", f"{name}: numerics", f"{name}: counters identical in both runs"} <= failed
    assert (
        "run 1 cold_forward: verdict ('disagrees': peak_allocated_bytes predicted"
        in lines["small-float32: predictions"]
    )
    assert "model_load end_reserved_bytes" in lines["larger-float16: counters identical in both runs"]
    assert "output all finite" in lines["big-float32: numerics"]
    for size in gpu_validation.SIZES:
        assert {f"{size}-bfloat16: checksum near float32's", f"{size}-float16: output near float32's, elementwise"} \
            <= failed  # fmt: skip
        assert f"{size}-float16: checksum near float32's" not in failed
    for dtype in gpu_validation.DTYPES:  # Timer ran on current device 0, not the cuda:1 asked for
        assert "current device 0" in lines[f"big-{dtype}: measure / Timer median"]
        assert f"big-{dtype}: measure / Timer median" in failed
    assert "a file written" in lines["fit check refuses a size beyond free memory"]
    assert "missing power.limit" in lines["vendor tool: name, driver, MIG, clocks, power limit"]
    assert "no child hung or was skipped" not in failed and "kit files match MANIFEST.json" not in failed
    assert "cold_forward: verdict" in lines["notebook code cells as plain python3"]  # the stand-in doctors it too
    assert (tmp_path / "evidence.tar.gz").is_file()


@pytest.mark.whole_kit
def test_a_hanging_child_is_killed_and_the_summary_and_verdict_are_still_written(tmp_path, capsys, monkeypatch):
    def replace(kind, arguments):
        if "results/big-bfloat16-run2.json" in arguments:
            return [sys.executable, "-c", "import time; time.sleep(60)"]
        return None

    started = time.monotonic()
    status, out, err, folder = run_flow(tmp_path, capsys, monkeypatch, replace=replace,
                                        extra=["--timeout-seconds", "1"])  # fmt: skip
    assert time.monotonic() - started < 30
    assert (status, err) == (1, "")
    lines = verdict_lines(out)
    failed = sorted(name for name, line in lines.items() if "  FAIL  " in line)
    assert failed == ["big-bfloat16: both runs wrote a result", "big-bfloat16: counters identical in both runs",
                      "big-bfloat16: same seed, same checksum", "no child hung or was skipped"]  # fmt: skip
    assert "run 2: timed out, exit status -9, no file written" in lines["big-bfloat16: both runs wrote a result"]
    assert lines["no child hung or was skipped"].endswith("big-bfloat16-run2 timed out")
    summary = json.loads((folder / "summary.json").read_text())
    assert {"name": "big-bfloat16-run2", "outcome": "timed out"}.items() <= next(
        c for c in summary["children"] if c["name"] == "big-bfloat16-run2"
    ).items()
    assert (folder / "verdict.txt").read_text() == out


def test_ctrl_c_kills_the_running_child_and_exits_130_in_one_line(tmp_path, capsys, monkeypatch):
    pid_file = tmp_path / "pid"

    def replace(kind, arguments):
        if "results/small-float16-run1.json" in arguments:
            return [sys.executable, "-c", SLEEPER, str(pid_file)]
        return None

    def interrupt(signum, frame):
        raise KeyboardInterrupt  # what Python makes of a SIGINT

    previous = signal.signal(signal.SIGALRM, interrupt)
    signal.setitimer(signal.ITIMER_REAL, 0.8)
    try:
        status, out, err, folder = run_flow(tmp_path, capsys, monkeypatch, replace=replace)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    assert (status, out) == (130, "")
    assert err == "gpu_validation.py: interrupted: children killed; no archive written\n"
    assert gone(int(pid_file.read_text()))
    assert "interrupted by Ctrl-C" in (folder / "verdict.txt").read_text()
    assert not (tmp_path / "evidence.tar.gz").exists()
    assert not list(tmp_path.glob(".partial-*"))


def test_a_real_sigint_reaches_the_tool_as_one_line_and_exit_130(tmp_path):
    """Through the interpreter: a real SIGINT, while a stand-in environment child hangs."""
    wrapper = f"""
import sys
sys.path.insert(0, {str(ROOT / "tools")!r})
import gpu_validation as g
g.command_for = lambda kind, arguments: ([sys.executable, "-c", "import time; time.sleep(60)"], "sleeper")
raise SystemExit(g.main(["--device", "cuda:0", "--output-dir", "evidence"]))
"""
    process = subprocess.Popen([sys.executable, "-c", wrapper], cwd=tmp_path, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True, preexec_fn=sigint_as_from_a_terminal)  # fmt: skip
    deadline = time.monotonic() + 20
    while not (tmp_path / "evidence").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.3)
    process.send_signal(signal.SIGINT)
    out, err = process.communicate(timeout=30)
    assert (process.returncode, out) == (130, "")
    assert err == "gpu_validation.py: interrupted: children killed; no archive written\n"
    assert list(tmp_path.iterdir()) == []  # interrupted before the GPU was confirmed: nothing kept


def test_an_environment_child_that_crashes_is_a_one_line_refusal_without_its_paths(tmp_path, capsys, monkeypatch):
    crash = f"import sys; sys.stderr.write('Traceback: {ROOT}/mesure_memoire.py failed\\n'); sys.exit(1)"
    monkeypatch.setattr(gpu_validation, "command_for", lambda kind, arguments: ([sys.executable, "-c", crash], "x"))
    expected = "the environment check of cuda:0 failed (exit status 1: Traceback: <path>/mesure_memoire.py failed)"
    err = refusal(capsys, ["--device", "cuda:0", "--output-dir", str(tmp_path / "e")], expected)
    assert str(ROOT) not in err
    assert list(tmp_path.iterdir()) == []


def test_an_archive_that_cannot_be_written_is_one_line_and_the_folder_stays(tmp_path, capsys, monkeypatch):
    def no_space(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(gpu_validation.tempfile, "mkstemp", no_space)
    status, out, err, folder = run_flow(tmp_path, capsys, monkeypatch)
    assert (status, out) == (2, "")
    assert (
        err == "gpu_validation.py: error: the evidence is in the folder, but its archive cannot be written (OSError)\n"
    )
    assert (folder / "verdict.txt").is_file() and not (tmp_path / "evidence.tar.gz").exists()


@pytest.mark.whole_kit
def test_a_full_stdout_is_one_line_on_stderr_and_the_verdict_stays_in_its_file(tmp_path, capsys, monkeypatch):
    class FullStdout(io.StringIO):
        def write(self, text):
            raise OSError(28, "No space left on device")

    monkeypatch.setattr(sys, "stdout", FullStdout())
    status, _, err, folder = run_flow(tmp_path, capsys, monkeypatch)
    assert status == 1
    assert err == "gpu_validation.py: error: cannot print the verdict (OSError); it is in verdict.txt\n"
    assert (folder / "verdict.txt").read_text().endswith("passed, 0 failed\n")
