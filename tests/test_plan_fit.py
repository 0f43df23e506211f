"""`measure --plan --memory-gib`: the verdict on a card and the largest size per dimension, the one fit rule
that measure applies too (stand-in GPU), and the allocator settings PyTorch parsed (allocated bytes checked
under the defaults only)."""

import itertools
import json

import pytest
import torch

import mesure_memoire
from conftest import (
    GIB,
    MEASURE_TRIAL,
    MIB,
    NOTHING_MEASURED,
    ROOT,
    assert_one_line,
    config,
    hand_made_records,
    host_memory,
    plan,
)

# PyTorch warnings recorded by earlier tests would show in field_errors: each test starts from none.
pytestmark = pytest.mark.usefixtures("no_earlier_warnings")


# --- --plan --memory-gib: the verdict on a card and the largest size per dimension (part "fit") ------------

LARGEST_ACCEPTED = 10**30 - 1


def needs(**overrides):
    """needs_card_memory_bytes of the whole plan, its counts as given: what the search is checked against."""
    return mesure_memoire.memory_plan(config(**overrides))["needs_card_memory_bytes"]


FIT_CASES = [
    (dict(), "3"),
    (dict(batch=2, context=128, width=1024, warmup=3, repeats=5), "80"),
    (dict(batch=3, context=5, width=3, dtype="bfloat16", warmup=0, repeats=1), "2.5"),
    (dict(batch=7, context=33, width=200, dtype="float16", warmup=4, repeats=3), "141.25"),
]


@pytest.mark.parametrize(("sizes", "memory_gib"), FIT_CASES)
def test_each_largest_value_fits_and_the_next_one_does_not(sizes, memory_gib):
    fit = mesure_memoire.plan_with_fit(config(**sizes), memory_gib)
    memory_bytes = int(mesure_memoire.Decimal(memory_gib) * GIB)
    assert fit["memory_bytes"] == memory_bytes
    assert fit["fits"] is (fit["needs_card_memory_bytes"] <= memory_bytes)
    for dimension, largest in fit["largest"].items():
        assert needs(**{**sizes, dimension: largest}) <= memory_bytes < needs(**{**sizes, dimension: largest + 1})


def test_the_verdict_is_the_needed_free_memory_against_the_card_at_the_byte():
    needed = needs()
    exactly, one_byte_less = (str(mesure_memoire.decimal_ratio(value, GIB)) for value in (needed, needed - 1))
    fit = mesure_memoire.plan_with_fit(config(), exactly)
    assert (fit["memory_bytes"], fit["fits"]) == (needed, True)
    assert fit["largest"]["width"] >= 64  # at exactly the needed memory, each dimension fits at least as given
    assert fit["largest"]["context"] >= 16
    less = mesure_memoire.plan_with_fit(config(), one_byte_less)
    assert (less["fits"], less["largest"]["width"] < 64) == (False, True)


def test_none_when_even_one_does_not_fit_and_the_accepted_maximum_when_everything_does():
    assert mesure_memoire.plan_with_fit(config(), "1")["largest"] == {"batch": None, "context": None, "width": None}
    assert mesure_memoire.plan_with_fit(config(), "1")["fits"] is False
    huge = mesure_memoire.plan_with_fit(config(), "1" + "0" * 29)["largest"]
    assert huge["batch"] == huge["context"] == LARGEST_ACCEPTED  # the kit accepts no larger value
    assert needs(batch=LARGEST_ACCEPTED) <= 10**29 * GIB
    assert needs(width=huge["width"]) <= 10**29 * GIB < needs(width=huge["width"] + 1)


def test_the_largest_may_be_one():
    """1 fits, 2 does not: the search must not start above 1."""
    memory_bytes = needs(batch=1)
    assert needs(batch=2) > memory_bytes
    assert mesure_memoire.largest_that_fits(config(), memory_bytes, "batch") == 1


def test_the_card_memory_is_a_decimal_more_than_zero(capsys):
    half = mesure_memoire.plan_with_fit(config(), "0.5")
    assert (half["memory_gib"], half["memory_bytes"]) == (mesure_memoire.Decimal("0.5"), GIB // 2)
    assert mesure_memoire.plan_with_fit(config(), "1.0000000001")["memory_bytes"] == GIB  # rounded down to bytes
    for zero in ("0", "0.0", "0.000", ".5", "-1", "1e3", "8 ", "1.2.3", "", "5.", "01"):  # one wording for all
        assert mesure_memoire.main([*MEASURE_TRIAL, "--plan", "--memory-gib", zero]) == 2
        said = capsys.readouterr().err
        assert_one_line(said, "error: --memory-gib: expected a card's memory in GiB", f", got '{zero}'")
        assert "at most one decimal point between digits (80, 0.5)" in said
    for bad in ("x" * 100, "\x1b"):
        assert mesure_memoire.main([*MEASURE_TRIAL, "--plan", "--memory-gib", bad]) == 2
        assert_one_line(capsys.readouterr().err, "--memory-gib: ", f", got {mesure_memoire.quoted(bad)}")


def test_memory_gib_goes_with_plan(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert mesure_memoire.main([*MEASURE_TRIAL, "--memory-gib", "80", "--output", "x.json"]) == 2
    assert_one_line(capsys.readouterr().err, "--json and --memory-gib go with --plan")
    assert list(tmp_path.iterdir()) == []


FIT_TEXT = """\
On a card of 3.0 GiB (3221225472 bytes): fits, needing 2416088576 bytes (2.25 GiB).
Largest that fits, each dimension alone with the others as given: batch 21841, context 349467, width 5007.
Fits: measure and sweep accept the run on an otherwise empty card of this memory whose free memory is its total \
less a context of at most the allowance, under PyTorch's default allocator settings; the plan counts no other \
process: a measurement on the card is the proof.
"""


def test_the_fit_text_and_json_come_from_the_same_data(capsys):
    assert mesure_memoire.main([*MEASURE_TRIAL, "--plan", "--memory-gib", "3"]) == 0
    text = capsys.readouterr().out
    plan_ = mesure_memoire.memory_plan(config())
    assert text == mesure_memoire.format_plan(plan_) + "\n" + FIT_TEXT
    assert mesure_memoire.main([*MEASURE_TRIAL, "--plan", "--memory-gib", "3", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert (data["fits"], data["largest"]) == (True, {"batch": 21841, "context": 349467, "width": 5007})
    assert (data["memory_gib"], data["memory_bytes"], data["needs_card_memory_bytes"]) == (3, 3 * GIB, 2416088576)


def test_the_card_memory_is_written_in_plain_digits_however_small():
    plan_ = mesure_memoire.plan_with_fit(config(), "0.000000001")  # Decimal's str would write 1E-9
    assert mesure_memoire.format_fit(plan_).startswith("On a card of 0.000000001 GiB (1 bytes): does NOT fit")


# --- one fit rule: what --plan --memory-gib calls fitting, measure accepts on that card (stand-in GPU) -------

ISSUE_RUN = ["--batch", "2", "--context", "128", "--width", "1024", "--dtype", "float32"]
ISSUE_SIZES = dict(batch=2, context=128, width=1024)


@pytest.mark.parametrize("memory_gib", ["139.8", "80", "2.5"])
def test_measure_accepts_every_largest_size_on_that_card_with_its_context(
    stand_in_gpu, monkeypatch, tmp_path, capsys, memory_gib
):
    """The stand-in card has exactly the plan's memory; its free memory is that less the stated context
    allowance.  At each largest size measure passes the fit check (it stops at the host check, made to
    refuse so that nothing is built); one more is refused by the fit check."""
    monkeypatch.chdir(tmp_path)
    assert mesure_memoire.main(["measure", *ISSUE_RUN, "--plan", "--memory-gib", memory_gib, "--json"]) in (0, 3)
    fit = json.loads(capsys.readouterr().out)
    total = fit["memory_bytes"]
    stand_in_gpu(total_memory=total)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda index: (total - fit["context_allowance_bytes"], total))
    host_memory(monkeypatch, 4096, 0)
    assert fit["context_allowance_bytes"] >= 600 * MIB
    sizes = dict(zip(ISSUE_RUN[::2], ISSUE_RUN[1::2], strict=True))
    for dimension, largest in fit["largest"].items():
        for value, refusal in ((largest, "building the model on the CPU"), (largest + 1, "the predicted peak")):
            run = {**sizes, f"--{dimension}": str(value)}
            argv = ["measure", "--device", "cuda:0", *(item for pair in run.items() for item in pair)]
            assert mesure_memoire.main([*argv, "--output", "o.json"]) == 2
            err = capsys.readouterr().err
            assert refusal in assert_one_line(err, NOTHING_MEASURED), (dimension, value)
    assert list(tmp_path.iterdir()) == []


def test_a_run_that_does_not_fit_exits_3_with_the_plan_and_its_verdict_printed(capsys):
    assert mesure_memoire.main([*MEASURE_TRIAL, "--plan", "--memory-gib", "2"]) == 3
    captured = capsys.readouterr()
    lines = captured.out.splitlines()
    assert lines[0].startswith("Plan for measure")
    assert lines[-2:] == [  # no "Fits:" note after a run that does not fit: the verdict and the largest end it
        "On a card of 2.0 GiB (2147483648 bytes): does NOT fit (268604928 bytes short), needing 2416088576 bytes "
        "(2.25 GiB).",
        "Largest that fits, each dimension alone with the others as given: batch none (even 1 does not fit), "
        "context none (even 1 does not fit), width none (even 1 does not fit).",
    ]
    assert_one_line(captured.err, "does not fit a card of 2.0 GiB (exit 3)")
    assert mesure_memoire.main([*MEASURE_TRIAL, "--plan", "--memory-gib", "2", "--json"]) == 3
    captured = capsys.readouterr()
    assert json.loads(captured.out)["fits"] is False
    assert captured.err.count("\n") == 1
    assert (
        mesure_memoire.main([*MEASURE_TRIAL, "--plan", "--memory-gib", "2.3"]) == 0
    )  # 2.3 GiB: 2469606195 bytes, fits


def test_the_plan_needs_no_device(capsys):
    without = [item for item in MEASURE_TRIAL if item not in ("--device", "cuda:0")]
    assert mesure_memoire.main([*without, "--plan", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["configuration"]["device"] is None
    assert {key: value for key, value in data.items() if key != "configuration"} == {
        key: value for key, value in mesure_memoire.memory_plan(config()).items() if key != "configuration"
    }
    assert mesure_memoire.main([*without, "--plan"]) == 0
    assert "(the largest default of any backend; " in capsys.readouterr().out
    assert mesure_memoire.main([*without, "--output", "o.json"]) == 2
    assert_one_line(capsys.readouterr().err, "--device and --output are required (unless --plan")


def test_the_plan_states_the_host_memory_that_measure_checks(stand_in_gpu, monkeypatch, tmp_path, capsys):
    monkeypatch.chdir(tmp_path)
    predicted = plan(1, 16, 64, "float32")
    assert predicted["needs_host_memory_bytes"] == 4 * (64 * 256 + 256 + 256 * 64 + 64) == 132352
    host_memory(monkeypatch, 1, 132351)  # one byte less than the plan states
    assert mesure_memoire.main([*MEASURE_TRIAL, "--output", "o.json"]) == 2
    assert_one_line(
        capsys.readouterr().err, "needs 0.00 GiB, more than this machine's 0.00 GiB", "shrink --width", NOTHING_MEASURED
    )


@pytest.mark.whole_kit
def test_exit_3_comes_after_the_whole_plan_on_the_terminal_s_order(tmp_path):
    """The plan reaches standard output before the error line reaches standard error (one pipe for both, and
    standard output buffered as it is by default)."""
    import os
    import subprocess
    import sys

    buffered = {name: value for name, value in os.environ.items() if name != "PYTHONUNBUFFERED"}
    completed = subprocess.run(
        [sys.executable, str(ROOT / "mesure_memoire.py"), *MEASURE_TRIAL, "--plan", "--memory-gib", "2"],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        check=False,
        env=buffered,
    )
    assert completed.returncode == 3
    lines = completed.stdout.splitlines()
    assert lines[0].startswith("Plan for measure")
    assert lines[-2].startswith("Largest that fits")  # no "Fits:" note: the run does not fit
    assert_one_line(lines[-1], "does not fit a card of 2.0 GiB (exit 3)")
    assert list(tmp_path.iterdir()) == []


# --- the allocator settings PyTorch parsed: allocated bytes checked under the defaults only, never a false verdict

WIDE = dict(batch=5, context=77, width=3000, dtype="float32", warmup=1, repeats=1)  # the review's sizes
REQUESTED = ["end_requested_bytes", "peak_requested_bytes"]
OTHER = "allocated bytes: settings other than PyTorch's defaults "
UNREADABLE = "allocated bytes: PyTorch's allocator settings could not be read"
NO_REQUESTED = "this PyTorch's memory_stats has no requested-bytes counters"
ASYNC = "the cudaMallocAsync backend keeps no requested-bytes figure and rounds no block as the native one"
SETTINGS_CASES = [
    # backend, the settings that differ from the defaults (None: unreadable), requested counters kept, then each
    # phase's verdict, the counters it checks and why the others are not
    (
        "native",
        {"roundup_power2_divisions": {"1": 4}},
        True,
        "agrees",
        REQUESTED,
        OTHER + "(roundup_power2_divisions {'1': 4})",
    ),
    (
        "native",
        {"expandable_segments": True, "max_split_size_bytes": 21 * MIB},
        True,
        "agrees",
        REQUESTED,
        OTHER + "(max_split_size_bytes 22020096, expandable_segments True)",
    ),
    ("native", None, True, "agrees", REQUESTED, UNREADABLE),
    ("native", None, False, "not checked", [], f"{UNREADABLE}; {NO_REQUESTED}"),
    ("cudaMallocAsync", None, False, "not checked", [], ASYNC),
    (None, None, False, "not checked", [], "PyTorch's allocator backend could not be read"),
]


@pytest.mark.parametrize(("backend", "differing", "requested", "verdict", "counters", "reason"), SETTINGS_CASES)
def test_the_counters_checked_under_each_allocator_setting(backend, differing, requested, verdict, counters, reason):
    allocator = None if differing is None else {**mesure_memoire.DEFAULT_ALLOCATOR, **differing}
    plan = mesure_memoire.memory_plan(config(**WIDE))
    records = hand_made_records(config(**WIDE))[0]
    for record in records:  # any rounding the setting makes: allocated bytes are not judged
        record["end_allocated_bytes"] += 3 * MIB + 7
        record["peak_allocated_bytes"] += 5 * MIB + 3
        if not requested:  # a PyTorch whose memory_stats has no requested-bytes counters
            record.update(baseline_requested_bytes=None, end_requested_bytes=None, peak_requested_bytes=None)
    checked, prediction_check, workspace = mesure_memoire.check_against_plan(records, plan, None, backend, allocator)
    assert {r["verdict"] for r in checked} == {verdict}
    assert all(r["checked_counters"] == counters for r in checked)
    assert {r["not_checked_reason"] for r in checked} == {reason}
    assert prediction_check["disagreements"] == []
    assert prediction_check["agrees"] is (verdict == "agrees")
    assert len(prediction_check["not_checked"]) == (0 if counters else len(records))
    assert workspace["measured_bytes"] is None
    for index in range(len(records) if counters else 0):  # requested bytes stay exact: one byte off disagrees
        records[index]["peak_requested_bytes"] += 1
        checked = mesure_memoire.check_against_plan(records, plan, None, backend, allocator)[0]
        assert checked[index]["verdict"] == "disagrees", index
        records[index]["peak_requested_bytes"] -= 1


def test_the_help_says_memory_gib_takes_the_gib_pytorch_reports_and_where_a_catalog_card_s_is(capsys):
    assert mesure_memoire.main(["measure", "--help"]) == 0
    lines = capsys.readouterr().out.splitlines()
    first = next(number for number, line in enumerate(lines) if line.startswith("  --memory-gib GIB"))
    following = itertools.takewhile(lambda line: not line.startswith("  -"), lines[first + 1 :])  # its own lines
    entry = " ".join(" ".join([lines[first], *following]).split())
    for fact in ("PyTorch", "environment", "calcul_forfaits.py --list"):
        assert fact in entry, (fact, entry)
