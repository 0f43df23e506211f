"""`mesure_memoire.py report`: figures against a hand computation, flags, the one schema read, hostile files.

The results under tests/data/report are crafted (GPU "Crafted GPU", tool "crafted for the tests"):
they have the shape ``measure`` writes (RESULT_SCHEMA_VERSION) and no measured figure in them.
"""

import errno
import json
import math
import os
import re
from decimal import Decimal

import pytest

import mesure_memoire
from conftest import ROOT, assert_one_line, kit_error_of, plain_ids, run_script, tree_digest

DATA = ROOT / "tests" / "data" / "report"


def load(name):
    return json.loads((DATA / name).read_text(encoding="utf-8"))


def row_of(result, name="r.json"):
    return mesure_memoire.report_rows([(name, result)])[0]


# --- figures, checked against a hand computation ------------------------------------------------------


def test_the_peaks_are_maxima_over_every_phase_not_one_phase():
    result = load("float32.json")
    result["phases"][0]["peak_allocated_bytes"] = 2**40  # model_load
    result["phases"][-1]["peak_reserved_bytes"] = 2**41  # the last warm line
    row = row_of(result)
    assert (row["peak_allocated_bytes"], row["peak_reserved_bytes"]) == (2**40, 2**41)


@pytest.mark.parametrize(
    ("nanoseconds", "device_ms", "median_ms", "median_device_ms"),
    [
        ([3, 1, 2], [0.3, 0.1, 0.2], "0.000002", "0.2"),  # the middle line, not the binary float's expansion
        ([4, 1, 3, 2], [0.4, 0.1, 0.3, 0.2], "0.0000025", "0.25"),  # the exact mean of the middle two
        ([5, 5, 1, 9, 9], [1, 2, 4, 0, 10**30 - 1], "0.000005", "2"),  # ints are times too, zero is one
        ([2, 10**30 - 1], [0.1, 0.2], "5" + "0" * 23 + ".0000005", "0.15"),  # beyond 28 digits
    ],
    ids=["odd", "even", "five", "30-digits"],
)
def test_the_warm_median_is_exact(nanoseconds, device_ms, median_ms, median_device_ms):
    row = row_of(with_warm_lines(nanoseconds, device_ms))
    assert row["warm_median_ms"] == Decimal(median_ms)
    assert row["warm_median_device_ms"] == Decimal(median_device_ms)
    assert row["warm_repetitions"] == len(nanoseconds)


def test_device_median_keeps_whole_numbers_exact_writes_no_negative_zero_and_needs_every_line():
    result = load("bfloat16.json")
    warm = [phase for phase in result["phases"] if phase["phase"] == "warm_forward"]
    for phase in warm:
        phase["device_ms"] = 123456789012345678901  # a float would keep 17 digits
    assert row_of(result)["warm_median_device_ms"] == Decimal(123456789012345678901)
    for phase in warm:
        phase["device_ms"] = -0.0
    assert str(row_of(result)["warm_median_device_ms"]) == "0.0"
    warm[-1]["device_ms"] = None  # every warm line needs one
    assert row_of(result)["warm_median_device_ms"] is None


# --- flags ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("milliseconds", "drift", "flags"),
    [
        ((1.0, 1.0, 1.1), Decimal("0.1"), []),  # the limit itself: not flagged
        ((1.0, 1.05, 1.11), Decimal("0.11"), ["warm times drift +11.0%", "warm times spread 10.5% of the median"]),
        (
            (4.0, 4.0, 3.5, 3.4, 3.4, 3.4),
            Decimal("-0.15"),
            ["warm times drift -15.0%", "warm times spread 17.4% of the median"],  # 0.6 / 3.45
        ),
        ((1.0, 1.3, 1.0), Decimal(0), ["warm times spread 30.0% of the median"]),  # one slow line: no drift
        ((1.0, 1.2), None, ["warm times spread 18.2% of the median"]),  # under three lines: no drift told
    ],
    ids=["at_the_limit", "drifting", "falling_as_the_clock_recovers", "one_outlier", "two_lines"],
)
def test_a_drift_or_a_spread_beyond_a_tenth_is_flagged(milliseconds, drift, flags):
    row = row_of(with_warm_lines([round(ms * 10**6) for ms in milliseconds], [0.1] * len(milliseconds)))
    assert (row["warm_min_ms"], row["warm_max_ms"]) == (
        Decimal(str(min(milliseconds))),
        Decimal(str(max(milliseconds))),
    )
    assert row["warm_drift"] == drift
    assert row["flags"] == flags


def test_warm_times_of_zero_nanoseconds_are_reported_with_no_spread_flag(tmp_path, monkeypatch, capsys):
    # A median of 0 ms: no spread can be told (no division by zero), the row is shown, report exits 0.
    monkeypatch.chdir(tmp_path)
    (tmp_path / "r.json").write_text(json.dumps(with_warm_lines([0, 0, 0], [0.1] * 3)), encoding="utf-8")
    assert mesure_memoire.main(["report", "r.json"]) == 0
    captured = capsys.readouterr()
    assert "spread" not in captured.out and captured.err == ""
    assert "r.json" in captured.out


UNCHECKED = "prediction not checked (each such phase's not_checked_reason says why)"
# Each change of bfloat16.json and the one flag it raises (None: none), in the order of the flags in a row.
FLAG_CAUSES = [
    (("configuration", "fresh_process_warning", "PyTorch already held GPU memory"), "not a fresh process"),
    (("configuration", "fresh_process_warning", ""), "not a fresh process"),  # a string, however short
    (("prediction_check", "disagreements", [{"phase": "inputs"}]), "prediction disagreed"),
    (
        ("prediction_check", "not_checked", ["inputs"]),
        "prediction not checked (each such phase's not_checked_reason says why)",
    ),
    (("output_summary", "all_finite", False), "non-finite output"),
    (("sustained", "steady", None), None),  # too few windows to tell
    (("sustained", "steady", False), "sustained run not steady"),
    (("environment", "torch", "other"), "environment differs from row 1: PyTorch"),
]


def test_each_flag_is_raised_by_its_own_cause_only_and_all_are_shown_together(tmp_path, monkeypatch, capsys):
    changed, every = [], load("bfloat16.json")
    for (part, field, value), _ in FLAG_CAUSES:
        changed.append(load("bfloat16.json"))
        for result in (changed[-1], every):
            result[part][field] = value
    rows = mesure_memoire.report_rows([("base", load("bfloat16.json"))] + [("changed", r) for r in changed])
    assert [row["flags"] for row in rows] == [[]] + [[flag] if flag else [] for _, flag in FLAG_CAUSES]
    monkeypatch.chdir(tmp_path)
    (tmp_path / "a.json").write_bytes((DATA / "bfloat16.json").read_bytes())
    (tmp_path / "b.json").write_text(json.dumps(every), encoding="utf-8")
    assert mesure_memoire.main(["report", "a.json", "b.json"]) == 0
    lines = capsys.readouterr().out.splitlines()
    flags = [flag for _, flag in FLAG_CAUSES if flag]
    assert lines[2].endswith("; ".join(dict.fromkeys(flags)))
    assert lines[6].split() == ["b.json", "30", "0.825", "NO", "1.100"]


def test_an_environment_differing_from_the_first_row_is_flagged_by_part():
    first, gpu, torch, builds = (load("float32.json") for _ in range(4))
    gpu["environment"]["gpu"]["name"] = "Another crafted GPU"
    torch["environment"]["torch"] = "2.12.0+cu126"
    builds["environment"]["cuda_build"] = None
    builds["environment"]["hip_build"] = "7.0"
    rows = mesure_memoire.report_rows([("1", first), ("2", gpu), ("3", torch), ("4", builds), ("5", first)])
    assert [row["flags"] for row in rows] == [
        [],
        ["environment differs from row 1: GPU"],
        ["environment differs from row 1: PyTorch"],
        ["environment differs from row 1: CUDA build, HIP build"],
        [],
    ]
    rows = mesure_memoire.report_rows([("2", gpu), ("1", first)])
    assert [row["flags"] for row in rows] == [[], ["environment differs from row 1: GPU"]]


# --- the command line: text and JSON from the same rows -------------------------------------------------

EXPECTED_TEXT = """\
file           GPU          dtype     batch  context  width  parameters  peak alloc MiB  peak reserved MiB  cold ms  \
warm min ms  warm median ms  warm max ms  drift  flags
float32.json   Crafted GPU  float32       2      128   1024     8393728           46.02              48.00    5.432  \
      1.120           1.150        1.180  +1.7%  none
bfloat16.json  Crafted GPU  bfloat16      4      256    512     2099712           18.00              20.00    4.100  \
      0.880           0.900        0.920  +2.2%  none
Sustained runs (measure --sustained-s): forwards back to back, timed by CUDA events per window; steady: the last \
half's median time per forward; x warm: against the warm repetitions' device median.
file           seconds  steady ms  steady  x warm
bfloat16.json       30      0.825     yes   1.100
Peaks: maxima over each run's phases, PyTorch's allocator in that process only.
Times: wall clock; the warm figures are over the warm_forward lines, the drift their last third's median \
against their first third's.
"""


def test_text_output_is_the_hand_checked_table(monkeypatch, capsys):
    monkeypatch.chdir(DATA)
    before = tree_digest(DATA)
    assert mesure_memoire.main(["report", "float32.json", "bfloat16.json"]) == 0
    captured = capsys.readouterr()
    assert captured.out == EXPECTED_TEXT
    assert captured.err == ""
    assert tree_digest(DATA) == before


def test_json_output_holds_the_same_rows_with_file_as_given(monkeypatch, capsys):
    monkeypatch.chdir(DATA.parent)
    given = ["report/bfloat16.json", str(DATA / "float32.json"), "report/bfloat16.json"]
    assert mesure_memoire.main(["report", *given, "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert list(data) == ["results"]
    assert [row["file"] for row in data["results"]] == given
    # batch 2, context 128, width 1024, float32; warm lines 1.16, 1.12, 1.14, 1.18 ms; cold 5.4321 ms.
    assert data["results"][1] == {
        "file": given[1],
        "schema_version": 8,
        "gpu": "Crafted GPU",
        "torch": "2.13.0+cu130",
        "cuda_build": "13.0",
        "hip_build": None,
        "dtype": "float32",
        "batch": 2,
        "context": 128,
        "width": 1024,
        "parameters": 8 * 1024 * 1024 + 5 * 1024,
        # weights 33574912 + inputs 1048576 + workspace 8388608 + hidden 4194304 + output 1048576 (cold_forward)
        "peak_allocated_bytes": 48254976,
        "peak_reserved_bytes": 24 * 2**21,
        "cold_forward_ms": 5.4321,
        "warm_repetitions": 4,
        "warm_min_ms": 1.12,
        "warm_median_ms": 1.15,  # (1.14 + 1.16) / 2
        "warm_max_ms": 1.18,
        "warm_drift": 0.017241,  # 1.18 / 1.16 - 1, the last third (one line) against the first
        "warm_median_device_ms": None,
        **dict.fromkeys(mesure_memoire.SUSTAINED_ROW),  # no sustained run
        "flags": [],
    }
    assert data["results"][0]["warm_median_device_ms"] == 0.75  # 0.75, 0.5, 1.25 ms


def test_the_command_refuses_without_a_file(capsys):
    assert mesure_memoire.main(["report"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert_one_line(captured.err, "report: ", "required: FILE")


# --- hostile files: one line naming the file, exit 2, nothing printed on stdout, nothing changed ---------


def _write(folder, name, content):
    path = folder / name
    path.write_bytes(content if isinstance(content, bytes) else content.encode("utf-8"))
    return name


@pytest.mark.parametrize(
    ("argv", "shown"),
    [
        (["good.json", "bad\nname.json"], "'bad\\nname.json'"),
        (["-"], "-"),
        (["--", "--c"], "--c"),  # after two dashes, a name may start with a dash
    ],
    ids=["newline-in-name", "dash", "after-two-dashes"],
)
def test_a_file_that_does_not_exist_is_refused_in_one_line_naming_it(argv, shown, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    _write(tmp_path, "good.json", (DATA / "float32.json").read_bytes())
    assert mesure_memoire.main(["report", *argv]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert_one_line(captured.err, f"report: {shown} does not exist", "run measure on the GPU box", "--output")
    assert os.listdir(tmp_path) == ["good.json"]


LAST = len(load("bfloat16.json")["phases"]) - 1  # the last phase line of the file with_field changes


# Each hostile file, and the facts of why it is not a kit result.
HOSTILE = {
    "not JSON": (lambda folder: _write(folder, "t.json", "hello"), ["not JSON", "line 1 column 1"]),
    "not UTF-8": (lambda folder: _write(folder, "b.json", b"\xff\xfe{}"), ["not UTF-8"]),
    "a JSON list": (lambda folder: _write(folder, "l.json", "[]"), ["expected an object, got a list"]),
    "nested too deep": (lambda folder: _write(folder, "deep.json", "[" * 200000), ["too deep", "(RecursionError)"]),
    "a 5000-digit unused number": (
        lambda folder: _write(folder, "dn.json", with_field("unused", 7)[:-1] + "7" * 4999 + "}"),
        ["number too long", "(ValueError)"],
    ),
    "another kit": (lambda folder: _write(folder, "k.json", '{"kit": "other"}'), ["kit: expected 'iteragpu-lab-v1'"]),
}


def test_the_largest_name_and_count_and_a_zero_count_are_read():
    """One more than each bound is refused (NOT_AS_WRITTEN: a name of 257 characters, a count of 10**30)."""
    result = load("bfloat16.json")
    result["environment"]["gpu"]["name"] = "G" * 256
    for count in (0, 10**30 - 1):
        result["synthetic_model"]["parameters"] = count
        assert (row_of(result)["gpu"], row_of(result)["parameters"]) == ("G" * 256, count)


@pytest.mark.parametrize("case", HOSTILE)
def test_hostile_files_are_refused_in_one_line_naming_them(case, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    make, why = HOSTILE[case]
    name = make(tmp_path)
    good = _write(tmp_path, "good.json", (DATA / "float32.json").read_bytes())
    before = tree_digest(tmp_path)
    assert mesure_memoire.main(["report", good, name, good]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""  # nothing shown for the good files either: the report is whole or absent
    assert_one_line(captured.err, f"report: {name} is not a kit result: ", *why)
    assert tree_digest(tmp_path) == before


PHASES = load("bfloat16.json")["phases"]
WARM = next(k for k, line in enumerate(PHASES) if line["phase"] == "warm_forward")
DEFAULTS = mesure_memoire.DEFAULT_ALLOCATOR
ABSENT = object()  # the field left out
ALLOCATOR = "environment.allocator_settings"


def with_field(path, value):
    """bfloat16.json's text with its field at ``path`` (names and [indices]) set to ``value``, or left out."""
    result = load("bfloat16.json")
    *parents, last = [int(key) if key.isdigit() else key for key in re.findall(r"[^.\[\]]+", path)]
    parent = result
    for key in parents:
        parent = parent[key]
    if value is ABSENT:
        del parent[last]
    elif isinstance(parent, list) and last == len(parent):
        parent.append(value)
    else:
        parent[last] = value
    return json.dumps(result)


# Each result not as measure writes it: the field changed in bfloat16.json, which the refusal names, its value,
# what that field must be (RESULT_FORMAT's description, its facts) and what it holds as the refusal shows it.
NOT_AS_WRITTEN = [
    ("configuration", [], "an object", "a list"),
    ("configuration.batch", True, "a whole number > 0", True),
    ("configuration.context", 0, "a whole number > 0", 0),
    ("configuration.dtype", "float64", "one of float32, float16, bfloat16", "'float64'"),
    ("configuration.fresh_process_warning", ["x"], "null or text", "a list"),
    ("configuration.width", 10**40, "a whole number > 0", 10**40),
    (ALLOCATOR, "native", "null or the allocator", "'native'"),
    (ALLOCATOR, {**DEFAULTS, "x": 1}, "null or the allocator", "an object"),
    (ALLOCATOR, {**DEFAULTS, "backend": "native\n\x1b[31m"}, "null or the allocator", "an object"),
    (ALLOCATOR, {**DEFAULTS, "max_split_size_bytes": -5}, "null or the allocator", "an object"),
    (ALLOCATOR, {**DEFAULTS, "expandable_segments": 1}, "null or the allocator", "an object"),
    (ALLOCATOR, {**DEFAULTS, "roundup_power2_divisions": "xxx"}, "null or the allocator", "an object"),
    (ALLOCATOR, {**DEFAULTS, "roundup_power2_divisions": {"3": 4}}, "null or the allocator", "an object"),
    (ALLOCATOR, {**DEFAULTS, "roundup_power2_divisions": {"1": 1}}, "null or the allocator", "an object"),
    ("environment.gpu", [], "null or an object", "a list"),
    ("environment.gpu.name", "G" * 257, "null or text of at most 256", mesure_memoire.quoted("G" * 257)),
    ("environment.gpu.name", 5, "null or text of at most 256", 5),
    ("environment.torch", ABSENT, "null or text of at most 256", "nothing"),
    ("output_summary", None, "an object", None),
    ("output_summary.all_finite", 0, "true or false", 0),
    ("phases", [line for line in PHASES if line["phase"] != "warm_forward"], "one cold_forward line", "a list"),
    ("phases", [*PHASES, PHASES[2]], "one cold_forward line", "a list"),
    ("phases", {}, "a list", "an object"),
    ("phases", [line for line in PHASES if line["phase"] != "cold_forward"], "one cold_forward line", "a list"),
    (f"phases[{LAST + 1}]", 5, "an object", 5),
    (f"phases[{LAST}].device_ms", 10**309, "null or a time", "1" + "0" * 59 + "..." + "0" * 12 + " (310 characters)"),
    (f"phases[{WARM}].device_ms", True, "null or a time >= 0", True),
    (f"phases[{WARM}].device_ms", math.inf, "null or a time >= 0", "inf"),
    (f"phases[{WARM}].device_ms", math.nan, "null or a time >= 0", "nan"),
    (f"phases[{WARM}].device_ms", -1, "null or a time >= 0", -1),
    (f"phases[{WARM}].device_ms", 10**30, "null or a time >= 0", 10**30),
    ("phases[3].nanoseconds", -1, "a whole number >= 0", -1),
    ("phases[0].peak_reserved_bytes", "1", "a whole number >= 0", "'1'"),
    ("phases[0].phase", "backward", "one of model_load, inputs", "'backward'"),
    ("prediction_check.disagreements", 1, "a list", "1"),
    ("schema_version", 7, "8, this kit's (measure again", 7),
    ("sustained", [], "null or an object", "a list"),
    ("sustained.steady", "yes", "null, true or false", "'yes'"),
    ("sustained.steady_ms_per_forward", None, "a time >= 0", "None"),
    ("synthetic_model.parameters", 10**30, "a whole number >= 0", 10**30),
    ("synthetic_model.parameters", 1.0, "a whole number >= 0", "1.0"),
]


@pytest.mark.parametrize(("field", "value", "what", "shown"), NOT_AS_WRITTEN, ids=plain_ids(NOT_AS_WRITTEN))
def test_a_result_not_as_measure_writes_it_is_refused_naming_its_field(
    field, value, what, shown, tmp_path, monkeypatch, capsys
):
    monkeypatch.chdir(tmp_path)
    name = _write(tmp_path, "r.json", with_field(field, value))
    good = _write(tmp_path, "good.json", (DATA / "float32.json").read_bytes())
    before = tree_digest(tmp_path)
    assert mesure_memoire.main(["report", good, name, good]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""  # nothing shown for the good files either: the report is whole or absent
    line = assert_one_line(captured.err, f"report: r.json is not a kit result: {field}: expected {what}")
    assert line.endswith(f", got {shown}"), line
    assert tree_digest(tmp_path) == before


def test_a_file_over_the_size_bound_is_refused_without_reading_it_all(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert mesure_memoire.MAX_RESULT_BYTES == 32 * 2**20
    with open(tmp_path / "huge.json", "wb") as stream:
        stream.write(json.dumps(load("float32.json")).encode() + b" ")
        stream.truncate(mesure_memoire.MAX_RESULT_BYTES + 1)  # valid JSON followed by NULs, one byte too many
    assert mesure_memoire.main(["report", "huge.json"]) == 2
    assert_one_line(capsys.readouterr().err, "report: huge.json is not a kit result: larger than 32 MiB")
    with open(tmp_path / "edge.json", "wb") as stream:
        text = json.dumps(load("float32.json")).encode()
        stream.write(text + b" " * (mesure_memoire.MAX_RESULT_BYTES - len(text)))
    assert mesure_memoire.main(["report", "edge.json"]) == 0  # exactly at the bound: read


def test_a_file_that_cannot_be_opened_is_refused(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert mesure_memoire.main(["report", "x\0y"]) == 2
    assert_one_line(capsys.readouterr().err, "report: 'x\\x00y' cannot be opened (ValueError)")
    _write(tmp_path, "f", "{}")
    assert mesure_memoire.main(["report", "f/inside.json"]) == 2
    assert_one_line(capsys.readouterr().err, "report: f/inside.json cannot be opened (NotADirectoryError)")

    def unreadable(handle):
        raise OSError(errno.EIO, "I/O error")

    monkeypatch.setattr(os, "fstat", unreadable)
    assert mesure_memoire.main(["report", "f"]) == 2
    assert_one_line(capsys.readouterr().err, "report: f cannot be read (OSError)")


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs on this platform")
def test_a_fifo_is_refused_at_once(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    os.mkfifo("pipe.json")
    flags, real_open = [], os.open
    monkeypatch.setattr(os, "open", lambda path, flag, *rest: flags.append(flag) or real_open(path, flag, *rest))
    writer = real_open("pipe.json", os.O_RDWR)  # a writer is there: even a blocking open would return
    try:
        assert mesure_memoire.main(["report", "pipe.json"]) == 2
    finally:
        os.close(writer)
    assert flags == [os.O_RDONLY | os.O_NONBLOCK]  # with no writer, a blocking open would hang
    captured = capsys.readouterr()
    assert captured.out == ""
    assert_one_line(captured.err, "report: pipe.json is not a kit result: not a regular file")


@pytest.mark.whole_kit
def test_report_runs_with_the_standard_library_alone(tmp_path):
    completed = run_script("mesure_memoire.py", "report", str(DATA / "float32.json"), python_flags=("-S", "-I"))
    assert completed.returncode == 0, completed.stderr
    assert completed.stdout.splitlines()[1].split()[:3] == [str(DATA / "float32.json"), "Crafted", "GPU"]


# --- the README's example --------------------------------------------------------------------------------


def test_the_quick_start_s_report_reads_the_file_its_measure_writes(tmp_path, monkeypatch, capsys):
    """No measured figure is shown in the README: its report's output is described. Here on a crafted result
    under the quick start's name, the command gives one row, for that file, and changes nothing."""
    lines = (ROOT / "README.md").read_text(encoding="utf-8").split("## Contents", 1)[0].splitlines()
    measure = next(line for line in lines if line.startswith("python mesure_memoire.py measure --device"))
    report = next(line for line in lines if line.startswith("python mesure_memoire.py report "))
    written = measure.split("--output ", 1)[1]
    assert report.split()[3:] == [written]
    monkeypatch.chdir(tmp_path)
    (tmp_path / written).write_bytes((DATA / "float32.json").read_bytes())
    before = tree_digest(tmp_path)
    assert mesure_memoire.main([*report.split()[2:], "--json"]) == 0
    assert [row["file"] for row in json.loads(capsys.readouterr().out)["results"]] == [written]
    assert tree_digest(tmp_path) == before


# --- reading result files -------------------------------------------------------------------------------------


def with_warm_lines(nanoseconds, device_ms):
    """bfloat16.json with one warm_forward line per figure (nanoseconds, device ms)."""
    result = load("bfloat16.json")
    (warm,) = [phase for phase in result["phases"] if phase.get("repetition") == 1]
    others = [phase for phase in result["phases"] if phase["phase"] != "warm_forward"]
    lines = [
        dict(warm, repetition=n, nanoseconds=ns, device_ms=ms)
        for n, (ns, ms) in enumerate(zip(nanoseconds, device_ms, strict=True), 1)
    ]
    result["phases"] = others + lines
    return result


def test_an_unprintable_file_or_gpu_name_is_one_escaped_cell_in_each_table(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    result = load("bfloat16.json")
    result["environment"]["gpu"]["name"] = "G\nPU"
    (tmp_path / "a\nb.json").write_text(json.dumps(result), encoding="utf-8")
    assert mesure_memoire.main(["report", "a\nb.json"]) == 0
    rows = [line for line in capsys.readouterr().out.splitlines() if "b.json" in line]
    assert [row.split("  ")[0] for row in rows] == ["'a\\nb.json'"] * 2
    assert "'G\\nPU'" in rows[0]


# --- report: what a result must hold, and the rows -------------------------------------------------------------


def test_a_result_without_gpu_details_is_read_with_none():
    result = load("bfloat16.json")
    result["environment"]["gpu"] = None
    result["environment"]["torch"] = None
    row = mesure_memoire.report_rows([("r.json", result)])[0]
    assert (row["gpu"], row["torch"], row["cuda_build"]) == (None, None, "13.0")
    text = mesure_memoire.format_report({"results": [row]})
    assert text.splitlines()[1].split()[:2] == ["r.json", "none"]


def test_a_file_name_is_echoed_whole_up_to_the_longest_path_and_shortened_beyond():
    whole = "d/" * 2000 + "r.json"  # 4006 characters: shown as typed
    assert f"report: {whole} does not exist" in kit_error_of(mesure_memoire.read_result_file, whole)
    longer = "x" * 10_000_000
    message = kit_error_of(mesure_memoire.read_result_file, longer)
    assert message.startswith("report: 'xxx") and message.endswith("' (10000000 characters) cannot be opened (OSError)")
    assert len(message) < 4300


MIB = 2**20


# --- the allocator settings PyTorch parsed, beside each result ------------------------------------------------


def test_the_settings_that_differ_from_pytorchs_defaults_are_flagged():
    row, old = row_of(load("allocator.json")), row_of(load("bfloat16.json"))
    assert row["flags"] == ["allocator expandable_segments True: allocated bytes not checked"]
    assert old["flags"] == []
    assert {key: value for key, value in row.items() if key not in ("flags", "schema_version")} == {
        key: value for key, value in old.items() if key not in ("flags", "schema_version")
    }
    result = load("allocator.json")
    changed = {"backend": "cudaMallocAsync", "expandable_segments": False, "max_split_size_bytes": 21 * MIB}
    result["environment"]["allocator_settings"].update(changed, roundup_power2_divisions={"1": 2})  # 2: the least kept
    assert row_of(result)["flags"] == [
        "allocator backend 'cudaMallocAsync', max_split_size_bytes 22020096, roundup_power2_divisions {'1': 2}: "
        "allocated bytes not checked"
    ]
    result["environment"]["allocator_settings"] = dict(mesure_memoire.DEFAULT_ALLOCATOR)
    assert row_of(result)["flags"] == []
    result["environment"]["allocator_settings"] = None
    assert row_of(result)["flags"] == ["allocator settings not recorded: allocated bytes not checked"]
