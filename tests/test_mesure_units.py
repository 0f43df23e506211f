"""mesure_memoire.py's helpers, in-process and exactly: numbers, rounding, messages, files, the command line.

Each test pins a behaviour the README or a docstring promises (half-up rounding, the one number grammar's
bounds, whole refusal lines, a result file never overwritten) so that the mutation pass sees it fail when
the code is wrong.  No GPU and no subprocess here.
"""

import errno
import inspect
import io
import json
import os
import sys
import warnings
from decimal import Decimal
from fractions import Fraction

import pytest

import mesure_memoire as mm


def refusal(function, *args):
    """The KitError message ``function(*args)`` raises."""
    with pytest.raises(mm.KitError) as caught:
        function(*args)
    return str(caught.value)


# --- rounding and exact decimals ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("number", "places", "expected"),
    [("0.125", 2, "0.13"), ("0.135", 2, "0.14"), ("2.5", 0, "3"), ("0.0000005", 6, "0.000001"),
     ("0.1249999", 2, "0.12"), ("7", 2, "7.00"), ("1.0000015", 6, "1.000002")],
)  # fmt: skip
def test_rounded_is_half_up_to_exactly_the_places(number, places, expected):
    result = mm.rounded(Decimal(number), places)
    assert str(result) == expected  # the digits, the exponent: half-even would give 0.12, 2 and 1.000002


def test_rounded_and_ratios_keep_every_digit_of_the_largest_figures():
    big = Decimal("9" * 60 + ".125")
    assert str(mm.rounded(big, 2)) == "9" * 60 + ".13"  # 28 digits (the default context) would fail
    assert str(mm.decimal_ratio(10**61 + 1, 10)) == "1" + "0" * 59 + "0.1"
    third = mm.decimal_ratio(1, 3)
    assert len(third.as_tuple().digits) == 200  # the exact context's precision
    with mm.exact_context() as context:
        assert context.prec == 200


def test_decimal_ratio_divides_in_its_order():
    assert mm.decimal_ratio(3 * 2**30, 2**30) == 3
    assert mm.decimal_ratio(1, 4) == Decimal("0.25")


# --- the one number grammar ---------------------------------------------------------------------------------


def test_whole_number_accepts_exactly_max_digits_and_refuses_more():
    assert mm.MAX_DIGITS == 30
    assert mm.whole_number("--x", "9" * 30, 1) == 10**30 - 1
    assert mm.whole_number("--x", 10**30 - 1, 1) == 10**30 - 1
    assert mm.whole_number("--x", "0" * 29 + "7", 1) == 7  # 30 characters, leading zeros allowed
    assert mm.whole_number("--x", 1, 1) == 1 and mm.whole_number("--x", "0", 0) == 0
    message = "--x: expected a positive whole number of at most 30 ASCII digits, got "
    assert refusal(mm.whole_number, "--x", 10**30, 1) == message + "1" + "0" * 30
    assert refusal(mm.whole_number, "--x", "0" * 30 + "7", 1) == message + "'" + "0" * 30 + "7'"
    assert refusal(mm.whole_number, "--x", "0", 1) == message + "'0'"
    assert refusal(mm.whole_number, "--x", 0, 1) == message + "0"
    assert (
        refusal(mm.whole_number, "--x", -1, 0) == "--x: expected a whole number >= 0 of at most 30 ASCII digits, got -1"
    )
    assert (
        refusal(mm.whole_number, "--x", 1, 2) == "--x: expected a whole number >= 2 of at most 30 ASCII digits, got 1"
    )
    assert refusal(mm.whole_number, "--x", None, 0).endswith("got None")
    assert refusal(mm.whole_number, "--x", False, 0).endswith("got False")


def test_whole_number_with_an_upper_bound_names_both_ends():
    assert mm.whole_number("--y", 10**30 - 2, 1, 10**30 - 2) == 10**30 - 2
    assert refusal(mm.whole_number, "--y", 10**30 - 1, 1, 10**30 - 2) == (
        f"--y: expected a whole number from 1 to {10**30 - 2} in ASCII digits, got {10**30 - 1}"
    )
    assert (
        refusal(mm.whole_number, "--y", "8", 3, 7)
        == "--y: expected a whole number from 3 to 7 in ASCII digits, got '8'"
    )
    assert refusal(mm.whole_number, "--y", 2, 3, 7) == "--y: expected a whole number from 3 to 7 in ASCII digits, got 2"
    assert mm.whole_number("--y", "7", 3, 7) == 7 and mm.whole_number("--y", 3, 3, 7) == 3


def test_non_negative_decimal_message_and_value():
    message = "--r: expected a number >= 0 written with ASCII digits and at most one decimal point (at most 30 digits"
    assert refusal(mm.non_negative_decimal, "--r", "x") == message + " on each side), got 'x'"
    assert str(mm.non_negative_decimal("--r", "9" * 30 + "." + "9" * 30)) == "9" * 30 + "." + "9" * 30
    assert mm.non_negative_decimal("--r", "0." + "0" * 29 + "1") == Decimal("1E-30")
    assert str(mm.non_negative_decimal("--r", "5")) == "5.0" and str(mm.non_negative_decimal("--r", ".5")) == "0.5"
    for value in ("9" * 31, "9" * 31 + ".5", "0." + "0" * 30 + "1", b"1", [1], Fraction(1), True):
        assert refusal(mm.non_negative_decimal, "--r", value).startswith(message), value


def test_device_index_reads_the_number_after_cuda():
    assert mm.device_index("cuda:0") == 0 and mm.device_index("cuda:12") == 12 and mm.device_index("cuda:9999") == 9999
    for device in ("cuda:10000", "cuda:", "cpu", 0, None, "CUDA:0"):
        assert refusal(mm.device_index, device) == f"--device: expected cuda:N (for example cuda:0), got {device!r}"


def test_measure_config_validates_each_option_by_its_name():
    assert mm.measure_config("cuda:3", "2", "3", "4", "bfloat16", "0", "1", str(mm.MAX_SEED)) == {
        "device": "cuda:3", "batch": 2, "context": 3, "width": 4, "dtype": "bfloat16", "warmup": 0, "repeats": 1,
        "seed": 2**64 - 1,
    }  # fmt: skip
    assert mm.measure_config("cuda:0", 1, 1, 1, "float16", 0, 1, 0)["seed"] == 0
    good = ["cuda:0", 1, 1, 1, "float32", 0, 1, 0]
    positive = "a positive whole number of at most 30 ASCII digits, got 0"
    for index, option in ((1, "--batch"), (2, "--context"), (3, "--width"), (6, "--repeats")):
        args = list(good)
        args[index] = 0
        assert refusal(mm.measure_config, *args) == f"{option}: expected {positive}"
    args = list(good)
    args[5] = -1
    assert (
        refusal(mm.measure_config, *args) == "--warmup: expected a whole number >= 0 of at most 30 ASCII digits, got -1"
    )
    args = list(good)
    args[7] = -1
    assert refusal(mm.measure_config, *args) == (
        "--seed: expected a whole number from 0 to 18446744073709551615 in ASCII digits, got -1"
    )
    args = list(good)
    args[4] = "float64"
    assert refusal(mm.measure_config, *args) == "--dtype: expected one of float32, float16, bfloat16, got 'float64'"
    args = list(good)
    args[0] = "cuda"
    assert refusal(mm.measure_config, *args).startswith("--device: expected cuda:N")


# --- messages on one line ------------------------------------------------------------------------------------


def test_shown_shortens_past_the_limit_only():
    assert mm.shown("y" * 79) == "'" + "y" * 59 + "..." + "y" * 11 + "' (79 characters)"  # 81 with the quotes
    assert mm.shown("abcdefghij", limit=12) == "'abcdefghij'"
    assert mm.shown(12345) == "12345"
    assert mm.shown_name("z" * 80) == "z" * 80
    assert mm.shown_name(b"x.json") == "b'x.json'"
    assert mm.shown_name("bad\n.json") == "'bad\\n.json'"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("cannot open '/home/someone/x.py' here", "cannot open '<path>' here"),
        ('cannot open "C:\\Users\\x\\y.dll"', 'cannot open "<path>"'),
        ("\n\n  first line at /usr/lib/libcuda.so.1 now  \nsecond /x/y", "first line at <path> now"),
        ("from torch/csrc/x.cpp:12", "from <path>:12"),
        ("the CUDA/ROCm context", "the CUDA/ROCm context"),
        ("tab\there", "tab\\there"),
        ("", ""),
        ("   \n \n", ""),
    ],
)
def test_redact_keeps_the_first_line_without_paths(text, expected):
    assert mm.redact(text) == expected


def test_describe_error_names_the_type_and_the_redacted_message():
    assert mm.describe_error(OSError(errno.ENOENT, "No such file", "/home/u/f")) == (
        "FileNotFoundError: [Errno 2] No such file: '<path>'"
    )
    assert mm.describe_error(ValueError()) == "ValueError"
    assert mm.describe_error(RuntimeError("at /a/b/c\nmore")) == "RuntimeError: at <path>"
    assert mm.describe_error(RuntimeError("no device X")) == "RuntimeError: no device X"  # only ": " is stripped


def test_captured_warnings_are_kept_once_redacted_and_joined(monkeypatch):
    monkeypatch.setattr(mm, "PYTORCH_WARNINGS", [])
    field_errors = {}
    with mm.CapturedWarnings(field_errors) as captured:
        warnings.simplefilter("always")
        warnings.warn("loaded from /opt/lib/x.so", UserWarning, stacklevel=1)
        warnings.warn("loaded from /opt/lib/x.so", UserWarning, stacklevel=1)
        warnings.warn("slow", RuntimeWarning, stacklevel=1)
    assert isinstance(captured, mm.CapturedWarnings)
    assert mm.PYTORCH_WARNINGS == ["UserWarning: loaded from <path>", "RuntimeWarning: slow"]
    assert field_errors == {"pytorch_warnings": "UserWarning: loaded from <path> | RuntimeWarning: slow"}
    later = {}
    with mm.CapturedWarnings(later):  # warnings seen earlier in the process are reported again
        pass
    assert later == {"pytorch_warnings": "UserWarning: loaded from <path> | RuntimeWarning: slow"}
    with mm.CapturedWarnings():  # no field_errors: kept in the process list only
        warnings.simplefilter("always")
        warnings.warn("third", UserWarning, stacklevel=1)
    assert mm.PYTORCH_WARNINGS[-1] == "UserWarning: third"


def test_captured_warnings_let_exceptions_through_and_restore_the_filters(monkeypatch):
    monkeypatch.setattr(mm, "PYTORCH_WARNINGS", [])
    field_errors = {}
    before = list(warnings.filters)
    with pytest.raises(ZeroDivisionError), mm.CapturedWarnings(field_errors):
        warnings.simplefilter("ignore")
        1 / 0  # noqa: B018
    assert warnings.filters == before and field_errors == {}


def test_import_torch_reports_why_in_one_line(monkeypatch):
    torch, why = mm.import_torch()
    assert why is None and torch is sys.modules["torch"]
    monkeypatch.setitem(sys.modules, "torch", None)
    assert mm.import_torch() == (None, "ModuleNotFoundError: import of torch halted; None in sys.modules")


# --- the estimate, in-process ---------------------------------------------------------------------------------

ESTIMATE_TEXT = """\
Weight-memory estimate (arithmetic only, no GPU)
  parameters            134217728
  storage width         8 bits -> 1 bytes per parameter (rounded up to whole bytes)
  weight bytes          134217728
  weights               0.13 GiB (2**30 bytes) = 0.13 GB (10**9 bytes)
  reserve (hypothesis)  0.01 GiB, your assumption, not a measured reserve
  total                 0.14 GiB
Bytes are exact integers; GiB and GB are rounded half-up to 2 decimals.
Not included: activations, KV cache, quantization metadata, gradients, optimizer states, libraries, \
the CUDA/ROCm context.
This does not predict whether a real model fits a card.
"""


def test_estimate_text_rounds_halves_up(capsys):
    # 2**27 bytes = 0.125 GiB exactly; a reserve of 0.005 GiB; 0.130 GiB in total: every half goes up.
    assert mm.main(["estimate", "--parameters", str(2**27), "--bits", "8", "--reserve-gib", "0.005"]) == 0
    captured = capsys.readouterr()
    assert captured.out == ESTIMATE_TEXT.replace("0.14 GiB", "0.13 GiB") and captured.err == ""


def test_estimate_text_of_the_readme_example(capsys):
    assert mm.main(["estimate", "--parameters", "7000000000", "--bits", "16", "--reserve-gib", "4"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[1:7] == [
        "  parameters            7000000000",
        "  storage width         16 bits -> 2 bytes per parameter (rounded up to whole bytes)",
        "  weight bytes          14000000000",
        "  weights               13.04 GiB (2**30 bytes) = 14.00 GB (10**9 bytes)",
        "  reserve (hypothesis)  4.00 GiB, your assumption, not a measured reserve",
        "  total                 17.04 GiB",
    ]


def test_estimate_weights_returns_every_field():
    assert mm.estimate_weights(1, 1) == {
        "parameters": 1, "bits": 1, "bytes_per_parameter": 1, "weight_bytes": 1,
        "weight_gib": Decimal(1) / 2**30, "weight_gb": Decimal("1E-9"), "reserve_gib": Decimal(0),
        "reserve_is": "a hypothesis chosen by the user, not a measured reserve", "total_gib": Decimal(1) / 2**30,
        "not_included": ["activations", "KV cache", "quantization metadata", "gradients", "optimizer states",
                         "libraries", "the CUDA/ROCm context"],
    }  # fmt: skip
    assert mm.estimate_weights("3", "9", "0.5")["total_gib"] == Decimal("0.50000000558793544769287109375")
    assert refusal(mm.estimate_weights, 0, 8) == (
        "--parameters: expected a positive whole number of at most 30 ASCII digits, got 0"
    )
    assert (
        refusal(mm.estimate_weights, 1, 0)
        == "--bits: expected a positive whole number of at most 30 ASCII digits, got 0"
    )
    assert refusal(mm.estimate_weights, 1, 1, "-1").startswith("--reserve-gib: expected a number >= 0")


def test_estimate_json_rounds_halves_up_to_six_decimals(capsys):
    # 2**9 bytes = 0.000000476837158203125 GiB; 0.0000005 GiB reserve: both halves at the 7th decimal go up.
    assert mm.main(["estimate", "--parameters", "512", "--bits", "8", "--reserve-gib", "0.0000005", "--json"]) == 0
    text = capsys.readouterr().out
    assert '  "weight_gib": 0.000000,\n' in text and '  "reserve_gib": 0.000001,\n' in text
    assert '  "total_gib": 0.000001,\n' in text and '  "weight_gb": 0.000001,\n' in text  # 0.000000512 GB
    assert text.startswith('{\n  "parameters": 512,\n  "bits": 8,\n') and text.endswith("\n  ]\n}\n")


# --- to_json ------------------------------------------------------------------------------------------------


def test_to_json_indents_nested_containers_and_decimals():
    data = {"a": {"b": [Decimal("0.0000005"), {"c": Decimal("-1.25")}]}, 3: (1, "x"), "e": {}, "f": []}
    assert mm.to_json(data) == (
        '{\n  "a": {\n    "b": [\n      0.000001,\n      {\n        "c": -1.250000\n      }\n    ]\n  },\n'
        '  "3": [\n    1,\n    "x"\n  ],\n  "e": {},\n  "f": []\n}\n'
    )
    assert mm.to_json(Decimal("12345678901234567890123456789.5")) == "12345678901234567890123456789.500000\n"
    assert mm.to_json(Decimal("2.5E+3")) == "2500.000000\n"
    assert mm.to_json("é") == '"\\u00e9"\n'
    with pytest.raises(TypeError):
        mm.to_json([Decimal("Infinity")])


# --- files: names, limits, temporary files, exclusive writes ---------------------------------------------------


def test_name_limits_ask_the_file_system_and_fall_back(tmp_path, monkeypatch):
    asked = []

    def pathconf(folder, name):
        asked.append((folder, name))
        return {"PC_NAME_MAX": 11, "PC_PATH_MAX": 22}[name]

    monkeypatch.setattr(os, "pathconf", pathconf)
    assert mm._name_limits("here") == (11, 22)
    assert asked == [("here", "PC_NAME_MAX"), ("here", "PC_PATH_MAX")]
    for error in (AttributeError("no pathconf"), ValueError("unknown name"), OSError(errno.EINVAL, "no")):
        monkeypatch.setattr(os, "pathconf", lambda folder, name, error=error: (_ for _ in ()).throw(error))
        assert mm._name_limits("here") == (255, 4096)


def test_check_new_output_bounds_the_name_and_the_path(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(os, "pathconf", lambda folder, name: {"PC_NAME_MAX": 10, "PC_PATH_MAX": 16}[name])
    assert mm.check_new_output("n" * 10) == "n" * 10
    too_long = "--output: nnnnnnnnnnn is too long for this file system (names: 10 bytes)"
    assert refusal(mm.check_new_output, "n" * 11) == too_long
    os.mkdir("d")
    assert mm.check_new_output("d/" + "p" * 9) == "d/" + "p" * 9  # 11 bytes of path
    assert mm.check_new_output("./d/" + "p" * 10) == "./d/" + "p" * 10  # 14 bytes
    os.mkdir("dd")
    assert mm.check_new_output("dd/" + "q" * 10) == "dd/" + "q" * 10  # 13 bytes
    os.makedirs("ddd/e")
    assert mm.check_new_output("ddd/e/" + "r" * 9) == "ddd/e/" + "r" * 9  # 15 bytes: under the limit
    assert refusal(mm.check_new_output, "ddd/e/" + "r" * 10) == (  # 16 bytes: the limit counts the terminator
        "--output: ddd/e/rrrrrrrrrr is too long for this file system (names: 10 bytes)"
    )
    assert sorted(os.listdir(tmp_path)) == ["d", "dd", "ddd"]  # the probe files are gone


def test_check_new_output_messages_are_whole(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "old.json").write_text("{}")
    (tmp_path / "f").write_text("")
    assert refusal(mm.check_new_output, "old.json") == (
        "--output: old.json already exists; choose a new name (results are never overwritten)"
    )
    assert refusal(mm.check_new_output, "a/..") == "--output: a/.. names a folder, not a new file"
    assert refusal(mm.check_new_output, "..") == "--output: .. names a folder, not a new file"
    assert refusal(mm.check_new_output, "f/x.json") == "--output: the folder of f/x.json does not exist"
    assert refusal(mm.check_new_output, "x\0.json") == (
        "--output: cannot create 'x\\x00.json': ValueError: embedded null character; nothing measured"
    )
    for empty in ("", "  ", None, b"x.json"):
        assert refusal(mm.check_new_output, empty) == "--output: a new file name is required"
    assert mm.check_new_output("new.json") == "new.json" and sorted(os.listdir()) == ["f", "old.json"]


def test_check_new_output_probes_the_folder_and_removes_the_probe(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    created, real_create = [], mm._create_temporary

    def recording(folder):
        created.append(folder)
        return real_create(folder)

    monkeypatch.setattr(mm, "_create_temporary", recording)
    os.mkdir("sub")
    assert mm.check_new_output("sub/r.json") == "sub/r.json" and mm.check_new_output("r.json") == "r.json"
    assert created == ["sub", "."] and os.listdir("sub") == []

    def no_room(folder):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(mm, "_create_temporary", no_room)
    assert refusal(mm.check_new_output, "r.json") == (
        "--output: cannot create r.json: OSError: [Errno 28] No space left on device; nothing measured"
    )


def test_create_temporary_tries_100_names_then_gives_up(tmp_path, monkeypatch):
    draws = []
    monkeypatch.setattr(os, "urandom", lambda size: draws.append(size) or bytes(range(size)))
    path, descriptor = mm._create_temporary(str(tmp_path))
    os.close(descriptor)
    assert path == os.path.join(str(tmp_path), ".partial-0001020304050607.tmp") and draws == [8]
    with pytest.raises(FileExistsError) as caught:
        mm._create_temporary(str(tmp_path))
    assert str(caught.value) == f"no free temporary name in {tmp_path}" and len(draws) == 101
    assert os.path.getsize(path) == 0 and os.listdir(tmp_path) == [".partial-0001020304050607.tmp"]


def test_write_exclusively_never_overwrites_and_removes_a_partial_file(tmp_path, monkeypatch):
    target = str(tmp_path / "r.json")
    mm._write_exclusively(target, b"first")
    with pytest.raises(FileExistsError):
        mm._write_exclusively(target, b"second")
    assert (tmp_path / "r.json").read_bytes() == b"first"

    def fsync_fails(descriptor):
        raise OSError(errno.EIO, "I/O error")

    monkeypatch.setattr(os, "fsync", fsync_fails)
    with pytest.raises(OSError, match="I/O error"):
        mm._write_exclusively(str(tmp_path / "s.json"), b"data")
    assert sorted(os.listdir(tmp_path)) == ["r.json"]


def test_write_new_file_writes_utf8_and_refuses_a_name_taken_meanwhile(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    mm.write_new_file("é.json", "é\n")
    assert (tmp_path / "é.json").read_bytes() == "é\n".encode()

    def taken(source, destination):
        raise FileExistsError(errno.EEXIST, "File exists")

    monkeypatch.setattr(os, "link", taken)
    assert refusal(mm.write_new_file, "x.json", "{}") == "--output: x.json appeared meanwhile; nothing overwritten"
    (tmp_path / "y.json").write_bytes(b"theirs")
    monkeypatch.setattr(os, "link", lambda source, destination: (_ for _ in ()).throw(OSError(errno.EPERM, "no")))
    assert refusal(mm.write_new_file, "y.json", "{}") == "--output: y.json appeared meanwhile; nothing overwritten"
    assert (tmp_path / "y.json").read_bytes() == b"theirs"
    mm.write_new_file("z.json", "zz")  # no hard links: the exclusive create
    assert (tmp_path / "z.json").read_bytes() == b"zz"
    assert sorted(os.listdir(tmp_path)) == ["y.json", "z.json", "é.json"]  # no temporary left


def test_the_temporary_file_is_made_beside_the_result(tmp_path, monkeypatch):
    """In the result's own folder: the final link (or rename) stays on one file system."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "sub").mkdir()
    folders = []
    real_create_temporary = mm._create_temporary

    def create_temporary(folder):
        folders.append(folder)
        return real_create_temporary(folder)

    monkeypatch.setattr(mm, "_create_temporary", create_temporary)
    mm.write_new_file("sub/r.json", "{}")
    mm.write_new_file("r.json", "{}")
    assert folders == ["sub", "."]
    assert sorted(os.listdir(tmp_path)) == ["r.json", "sub"] and os.listdir(tmp_path / "sub") == ["r.json"]


def test_write_new_file_tolerates_a_temporary_removed_by_someone_else(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    real_link = os.link

    def link_then_remove(source, destination):
        real_link(source, destination)
        os.unlink(source)

    monkeypatch.setattr(os, "link", link_then_remove)
    mm.write_new_file("r.json", "{}\n")
    assert os.listdir(tmp_path) == ["r.json"]

    def other_unlink_error(path):
        raise PermissionError(errno.EACCES, "Permission denied")

    monkeypatch.setattr(os, "unlink", other_unlink_error)
    with pytest.raises(PermissionError):
        mm.write_new_file("s.json", "{}\n")


def test_measure_to_file_records_warnings_and_writes_the_json(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(mm, "PYTORCH_WARNINGS", [])

    def measured(config, tool):
        warnings.simplefilter("always")
        warnings.warn("from /x/y/z.py", UserWarning, stacklevel=1)
        return {"tool": tool, "environment": {"field_errors": {}}, "v": Decimal("0.5"), "c": config}

    monkeypatch.setattr(mm, "measure", measured)
    result = mm.measure_to_file({"k": 1}, "r.json", tool="t")
    assert result["environment"]["field_errors"] == {"pytorch_warnings": "UserWarning: from <path>"}
    assert (tmp_path / "r.json").read_text(encoding="utf-8") == mm.to_json(result)
    assert json.loads((tmp_path / "r.json").read_text())["tool"] == "t"
    for environment in (None, {"field_errors": None}):
        monkeypatch.setattr(mm, "measure", lambda config, tool, environment=environment: {"environment": environment})
        name = f"n{len(os.listdir(tmp_path))}.json"
        assert mm.measure_to_file({}, name, tool="t") == {"environment": environment}
    monkeypatch.setattr(mm, "measure", lambda config, tool: pytest.fail("measured before checking the output"))
    assert refusal(mm.measure_to_file, {}, "r.json", "t").startswith("--output: r.json already exists")

    def full(path, text):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(mm, "measure", lambda config, tool: {})
    monkeypatch.setattr(mm, "write_new_file", full)
    assert refusal(mm.measure_to_file, {}, "new.json", "t") == (
        "--output: cannot write new.json: OSError: [Errno 28] No space left on device; nothing written"
    )


# --- reading result files -------------------------------------------------------------------------------------


def test_read_at_most_reads_in_pieces_up_to_the_limit(monkeypatch):
    source, asked = io.BytesIO(b"0123456789"), []

    def short_reads(handle, size):
        asked.append(size)
        return source.read(min(size, 3))

    monkeypatch.setattr(os, "read", short_reads)
    assert mm._read_at_most(7, 7) == b"0123456"
    assert asked == [7, 4, 1]
    source.seek(0)
    asked.clear()
    assert mm._read_at_most(7, 100) == b"0123456789" and asked == [100, 97, 94, 91, 90]


def test_read_result_file_messages_are_whole(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "ok.json").write_text('{"a": 1}')
    assert mm.read_result_file("ok.json") == {"a": 1}
    (tmp_path / "big.json").write_text("1" * 5000)
    assert refusal(mm.read_result_file, "big.json") == "report: 'big.json' is not a kit result: not JSON (ValueError)"
    (tmp_path / "deep.json").write_text("[" * 100000)
    assert refusal(mm.read_result_file, "deep.json") == (
        "report: 'deep.json' is not a kit result: not JSON (RecursionError)"
    )
    (tmp_path / "bad.json").write_text('{"a": 1,\n  x}')
    assert refusal(mm.read_result_file, "bad.json") == (
        "report: 'bad.json' is not a kit result: not JSON (Expecting property name enclosed in double quotes at line 2"
        " column 3)"
    )
    assert refusal(mm.read_result_file, "no.json") == "report: 'no.json' does not exist"
    (tmp_path / "latin.json").write_bytes(b'{"a": "\xe9"}')
    assert refusal(mm.read_result_file, "latin.json") == "report: 'latin.json' is not a kit result: not UTF-8 text"

    def unreadable(handle, size):
        raise OSError(errno.EIO, "I/O error")

    monkeypatch.setattr(os, "read", unreadable)
    assert refusal(mm.read_result_file, "ok.json") == "report: 'ok.json' cannot be read (OSError)"


def test_counts_milliseconds_and_medians_are_exact():
    assert mm._count(0) == 0 and mm._count(10**30 - 1) == 10**30 - 1
    for value in (-1, 10**30, True, 1.0, "1", None):
        assert mm._count(value) is None, value
    assert mm._milliseconds(1234567) == Decimal("1.234567")
    assert mm._median([3, 1, 2]) == 2 and isinstance(mm._median([5]), Decimal)
    assert mm._median([4, 1, 3, 2]) == Decimal("2.5")
    assert mm._median([Decimal("0.1"), Decimal("0.2")]) == Decimal("0.15")
    assert str(mm._median([1, 10**40])) == "5" + "0" * 38 + "0.5"  # exact beyond 28 digits


def test_checked_result_messages_name_the_file_and_the_field():
    def problem(result):
        return refusal(mm._checked_result, "r.json", result)

    prefix = "report: 'r.json' is not a kit result: "
    assert problem([]) == prefix + "a JSON list, not an object"
    assert problem({"kit": "x"}) == prefix + "its 'kit' is not 'iteragpu-lab-v1'"
    assert problem({"kit": mm.KIT_NAME}) == prefix + "schema_version None is not one this version reads (1 or 2)"
    assert problem({"kit": mm.KIT_NAME, "schema_version": 0}) == prefix + (
        "schema_version 0 is not one this version reads (1 or 2)"
    )


def test_cells_show_none_and_escape_unprintable_text():
    assert mm._cell(None) == "none" and mm._cell("a b") == "a b" and mm._cell(3) == "3"
    assert mm._cell("a\nb") == "'a\\nb'"


# --- the command line --------------------------------------------------------------------------------------------


def test_usage_errors_are_one_line(capsys):
    assert mm.main(["estimate", "--parameters", "1", "--bits", "1", "a\nb", "c"]) == 2
    assert capsys.readouterr().err == (
        "mesure_memoire.py: error: unexpected argument 'a\\nb' for estimate (see estimate --help)\n"
    )
    assert mm.main(["nope\n"]) == 2
    assert capsys.readouterr().err == (
        "mesure_memoire.py: error: unknown command 'nope\\n': expected estimate, environment, measure, report "
        "(see --help)\n"
    )


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        ([], "a command is required: estimate, environment, measure, report (see --help)"),
        (["-x"], "unknown command '-x': expected estimate, environment, measure, report (see --help)"),
        (["estimate", "--bits"], "--bits: expected a value (N)"),
        (["estimate", "--bits", "--json"], "--bits: expected a value (N)"),
        (["estimate", "--bits=1", "--bits", "2"], "--bits given twice"),
        (["estimate", "--json=no"], "--json takes no value, got 'no'"),
        (["estimate", "--json", "--json"], "--json given twice"),
        (["estimate", "--param", "1"], "unknown option '--param' for estimate (see estimate --help)"),
        (["estimate", "-p", "1"], "unknown option '-p' for estimate (see estimate --help)"),
        (["estimate", "FILE"], "unexpected argument 'FILE' for estimate (see estimate --help)"),
        (["report", "--FILE", "a"], "unknown option '--FILE' for report (see report --help)"),
        (["report", "--json"], "report needs FILE (see report --help)"),
        (["report", "--"], "report needs FILE (see report --help)"),
        (["estimate", "--help=x"], "--help takes no value, got 'x'"),
        (["estimate", "-h=x"], "unknown option '-h=x' for estimate (see estimate --help)"),
        (["estimate", "--", "x"], "unknown option '--' for estimate (see estimate --help)"),
        (["report", "-"], "unknown option '-' for report (see report --help)"),
        (["measure", "--output", "o.json"], "measure needs --device (see measure --help)"),
        (["estimate", "--json"], "estimate needs --parameters, --bits (see estimate --help)"),
    ],
)
def test_each_misuse_of_the_command_line_is_named(argv, message):
    assert refusal(mm.parse_args, argv) == message


def test_options_values_and_defaults_reach_the_command():
    assert mm.parse_args(["estimate", "--parameters", "1", "--bits=-2"]) == (
        "estimate",
        {"--parameters": "1", "--bits": "-2", "--reserve-gib": "0", "--json": False},
    )
    assert mm.parse_args(["estimate", "--bits", "-2", "--parameters=a=b", "--json"])[1] == (
        {"--parameters": "a=b", "--bits": "-2", "--reserve-gib": "0", "--json": True}
    )
    assert mm.parse_args(["measure", "--device", "cuda:0"]) == ("measure", {
        "--device": "cuda:0", "--output": None, "--batch": "1", "--context": "16", "--width": "64",
        "--dtype": "float32", "--warmup": "1", "--repeats": "2", "--seed": "0", "--plan": False, "--json": False,
    })  # fmt: skip
    assert mm.parse_args(["report", "a", "--json", "b", "--", "--c", "-d"]) == (
        "report",
        {"FILE": ["a", "b", "--c", "-d"], "--json": True},
    )
    assert mm.parse_args(["report", "--", "a"]) == ("report", {"FILE": ["a"], "--json": False})
    assert mm.parse_args(["environment", "--device", "cuda:1", "--json"]) == (
        "environment",
        {"--device": "cuda:1", "--json": True},
    )
    assert mm.parse_args(["--help", "estimate"]) == (None, {"--help": True})
    assert mm.parse_args(["-h"]) == (None, {"--help": True})
    assert refusal(mm.parse_args, ["measure", "--bogus", "-h"]) == (  # in order: the misuse comes first
        "unknown option '--bogus' for measure (see measure --help)"
    )
    assert mm.parse_args(["measure", "--device", "cuda:0", "-h", "--bogus"]) == ("measure", {"--help": True})
    assert mm.parse_args(["estimate", "--help"]) == ("estimate", {"--help": True})


def test_each_command_runs_its_own_handler(monkeypatch, capsys):
    seen = []
    for name in mm.COMMANDS:
        monkeypatch.setattr(mm, f"_command_{name}", lambda args, name=name: seen.append(name))
    # the table holds the handlers themselves, so the stand-ins are put in the table too
    monkeypatch.setattr(mm, "COMMANDS", {name: (summary, getattr(mm, f"_command_{name}"), table)
                                         for name, (summary, _, table) in mm.COMMANDS.items()})  # fmt: skip
    for argv in (["estimate", "--parameters", "1", "--bits", "2"], ["environment", "--device", "cuda:0"],
                 ["measure", "--device", "cuda:0"], ["report", "a"]):  # fmt: skip
        assert mm.main(argv) == 0
    assert seen == ["estimate", "environment", "measure", "report"]


def test_the_table_names_each_handler_and_the_options_of_measure_config():
    handlers = {name: handler for name, (_, handler, _) in mm.COMMANDS.items()}
    assert handlers == {"estimate": mm._command_estimate, "environment": mm._command_environment,
                        "measure": mm._command_measure, "report": mm._command_report}  # fmt: skip
    assert set(mm.MEASURE_CONFIG_OPTIONS) <= set(mm.COMMANDS["measure"][2])
    parameters = inspect.signature(mm.measure_config).parameters  # the signature, also through mutmut's wrapper
    assert tuple(f"--{name}" for name in parameters) == mm.MEASURE_CONFIG_OPTIONS


def test_main_without_arguments_reads_the_command_line(monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", ["mesure_memoire.py", "estimate", "--parameters", "8", "--bits", "8", "--json"])
    assert mm.main() == 0
    assert json.loads(capsys.readouterr().out)["weight_bytes"] == 8


def test_help_reaches_stdout_and_exits_0(capsys):
    assert mm.main(["estimate", "--help"]) == 0
    assert capsys.readouterr().out == (
        "usage: mesure_memoire.py estimate --parameters N --bits N [--reserve-gib GIB] [--json]\n"
        "\n"
        "weight memory from a parameter count, no GPU\n"
        "\n"
        "options:\n"
        "  --parameters N        number of parameters, a positive integer\n"
        "  --bits N              storage width per parameter in bits (4, 8, 16, 32 ...)\n"
        "  --reserve-gib GIB     extra GiB you assume on top of the weights (a hypothesis; default 0)\n"
        "  --json                print one JSON object instead of text\n"
        "  -h, --help            print this help and exit\n"
    )
    assert mm.main(["report", "-h"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: mesure_memoire.py report FILE ... [--json]\n")
    assert "  FILE ...              measure result files, in the order to show (after --, a name may start wi" in out
    assert mm.main(["measure", "--help"]) == 0
    usage = capsys.readouterr().out.split("\n\n")[0].split("\n")
    assert usage == [  # wrapped at 100 columns, between options
        "usage: mesure_memoire.py measure --device cuda:N [--output FILE] [--batch N] [--context N]",
        "       [--width N] [--dtype NAME] [--warmup N] [--repeats N] [--seed N] [--plan] [--json]",
    ]


@pytest.mark.parametrize(("metavar_length", "lines"), [(69, 1), (70, 2)])
def test_a_usage_line_holds_100_columns_at_most(monkeypatch, metavar_length, lines):
    metavar = "M" * metavar_length
    monkeypatch.setitem(mm.COMMANDS, "x", ("s", None, {"--a": (metavar, mm.REQUIRED, "t")}))
    usage = mm.help_text("x").split("\n\n")[0].split("\n")
    one_line = [f"usage: mesure_memoire.py x --a {metavar}"]  # 100 columns with 69 M
    assert usage == (one_line if lines == 1 else ["usage: mesure_memoire.py x", f"       --a {metavar}"])


def test_the_script_help_lists_each_command_with_its_summary(capsys):
    assert mm.main(["--help"]) == 0
    assert capsys.readouterr().out == (
        "usage: mesure_memoire.py COMMAND [OPTION ...]   (estimate | environment | measure | report)\n"
        "\n" + mm.__doc__.split("\n\n")[0] + "\n"
        "\n"
        "commands:\n"
        "  estimate     weight memory from a parameter count, no GPU\n"
        "  environment  diagnose Python, PyTorch and the chosen GPU\n"
        "  measure      measure the synthetic MLP phase by phase on a GPU\n"
        "  report       compare result files side by side, one row each; reads them, writes nothing\n"
        "\n"
        "mesure_memoire.py COMMAND --help prints a command's options.\n"
    )


def test_report_command_json_and_text_come_from_the_same_rows(capsys, monkeypatch):
    data = os.path.join(os.path.dirname(__file__), "data", "report")
    monkeypatch.chdir(data)
    assert mm.main(["report", "schema2.json", "--json"]) == 0
    out = capsys.readouterr().out
    assert out == mm.to_json(mm.report(["schema2.json"]))
    assert mm.main(["report", "schema2.json"]) == 0
    assert capsys.readouterr().out == mm.format_report(mm.report(["schema2.json"])) + "\n"


def test_say_writes_one_prefixed_line_and_survives_a_broken_stderr(capsys, monkeypatch):
    mm.say("mesure_memoire.py", "a\nb")
    mm.say("mesure_memoire.py", "c", prefix="warning: ")
    mm.say("mesure_memoire.py", "d", prefix="")
    assert (
        capsys.readouterr().err
        == "mesure_memoire.py: error: a\\nb\nmesure_memoire.py: warning: c\nmesure_memoire.py: d\n"
    )

    class Broken:
        def __init__(self, error):
            self.error = error

        def write(self, text):
            raise self.error

    for error in (OSError(errno.EIO, "x"), ValueError("closed")):
        monkeypatch.setattr(sys, "stderr", Broken(error))
        mm.say("mesure_memoire.py", "lost")  # nothing raised


def test_say_flushes_stderr(monkeypatch):
    flushed = []

    class Recording(io.StringIO):
        def flush(self):
            flushed.append(self.getvalue())

    monkeypatch.setattr(sys, "stderr", Recording())
    mm.say("mesure_memoire.py", "x")
    assert flushed == ["mesure_memoire.py: error: x\n"]


def test_guarded_stdout_passes_through_and_tells_failures_apart():
    stream = io.StringIO()
    guarded = mm.GuardedStdout(stream)
    assert guarded.write("abc") == 3 and guarded.getvalue() == "abc" and guarded.flush() is None
    with pytest.raises(mm.StdoutFailed) as caught:
        mm.GuardedStdout(None).write("x")
    assert caught.value.args == (None,)
    stream.close()
    with pytest.raises(mm.StdoutFailed) as caught:
        guarded.write("x")
    assert isinstance(caught.value.args[0], ValueError) and caught.value.__suppress_context__

    class Full(io.StringIO):
        def flush(self):
            raise OSError(errno.ENOSPC, "No space left on device")

    with pytest.raises(mm.StdoutFailed) as caught:
        mm.GuardedStdout(Full()).flush()
    assert caught.value.args[0].errno == errno.ENOSPC


def test_stdout_failed_points_the_real_descriptor_at_devnull(tmp_path, monkeypatch, capsys):
    real_stdout = sys.__stdout__
    with open(tmp_path / "out.txt", "w") as stream:
        sys.__stdout__ = stream  # restored before the file closes: the test runner writes there between tests
        try:
            failure = mm.StdoutFailed(OSError(errno.ENOSPC, "No space left on device"))
            code = mm.stdout_failed("mesure_memoire.py", failure, stream)
        finally:
            sys.__stdout__ = real_stdout
        assert code == 1 and os.path.realpath(f"/proc/self/fd/{stream.fileno()}") == os.devnull
    assert capsys.readouterr().err == (
        "mesure_memoire.py: error: cannot write the output: OSError: [Errno 28] No space left on device\n"
    )
    with open(tmp_path / "other.txt", "w") as other:  # not the interpreter's stdout: left alone
        assert mm.stdout_failed("mesure_memoire.py", mm.StdoutFailed(BrokenPipeError(errno.EPIPE, "x")), other) == 1
        assert os.path.realpath(f"/proc/self/fd/{other.fileno()}") == str(tmp_path / "other.txt")
    assert capsys.readouterr().err == ""
    assert mm.stdout_failed("mesure_memoire.py", mm.StdoutFailed(), None) == 1
    assert capsys.readouterr().err == "mesure_memoire.py: error: cannot write the output: standard output is closed\n"


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="this system has no /dev/full")
def test_main_points_the_interpreters_own_stdout_at_devnull_when_it_fails(monkeypatch, capsys):
    """So that the interpreter's last flush at exit cannot print a second error."""
    real_stdout = sys.__stdout__
    with open("/dev/full", "w") as full:
        monkeypatch.setattr(sys, "stdout", full)
        sys.__stdout__ = full  # restored before the file closes: the test runner writes there between tests
        try:
            code = mm.main(["estimate", "--parameters", "1", "--bits", "8"])
        finally:
            sys.__stdout__ = real_stdout
        assert code == 1 and os.path.realpath(f"/proc/self/fd/{full.fileno()}") == os.devnull
    assert capsys.readouterr().err == (
        "mesure_memoire.py: error: cannot write the output: OSError: [Errno 28] No space left on device\n"
    )


def test_main_restores_stdout_and_returns_each_status(capsys, monkeypatch):
    stdout = sys.stdout
    assert mm.main(["estimate", "--parameters", "1", "--bits", "1", "--json"]) == 0
    assert sys.stdout is stdout and json.loads(capsys.readouterr().out)["weight_bytes"] == 1

    def fails(args):
        raise mm.MeasurementFailed("out of memory")

    monkeypatch.setattr(mm, "estimate_weights", lambda *args: fails(args))
    assert mm.main(["estimate", "--parameters", "1", "--bits", "1"]) == 3
    assert capsys.readouterr().err == "mesure_memoire.py: error: out of memory\n"
    assert sys.stdout is stdout


# --- report: what a result must hold, and the rows -------------------------------------------------------------

REPORT_DATA = os.path.join(os.path.dirname(__file__), "data", "report")


def _schema2():
    with open(os.path.join(REPORT_DATA, "schema2.json"), encoding="utf-8") as stream:
        return json.load(stream)


@pytest.mark.parametrize(
    ("change", "why"),
    [
        (lambda r: r["synthetic_model"].pop("parameters"), "its configuration or parameter count is not one"),
        (lambda r: r["configuration"].update(context=0), "its configuration or parameter count is not one"),
        (lambda r: r.update(synthetic_model=None), "configuration, synthetic_model or environment is missing"),
        (lambda r: r.update(configuration=[]), "configuration, synthetic_model or environment is missing"),
        (lambda r: r["environment"].update(hip_build=7), "its environment's GPU name, PyTorch or build is not text"),
        (lambda r: r["phases"].append(5), "a phase line is missing its name, time or peak counters"),
        (lambda r: r.update(phases={}), "a phase line is missing its name, time or peak counters"),
        (lambda r: r["phases"][0].pop("nanoseconds"), "a phase line is missing its name, time or peak counters"),
        (lambda r: r["phases"][0].update(peak_allocated_bytes=-1), "a phase line is missing its name"),
        (lambda r: r.update(output_summary=None), "schema 2 needs output_summary.all_finite, true or false"),
        (lambda r: r["prediction_check"].update(agrees=1), "schema 2 needs prediction_check.agrees, true or false"),
        (
            lambda r: r.update(phases=[p for p in r["phases"] if p["phase"] != "cold_forward"]),
            "it needs one cold_forward line",
        ),
    ],
)
def test_checked_result_refuses_each_missing_part_by_name(change, why):
    result = _schema2()
    change(result)
    message = refusal(mm._checked_result, "r.json", result)
    assert message.startswith("report: 'r.json' is not a kit result: " + why), message


def test_a_result_without_gpu_details_is_read_with_none():
    result = _schema2()
    result["environment"]["gpu"] = None
    result["environment"]["torch"] = None
    row = mm.report_rows([("r.json", result)])[0]
    assert (row["gpu"], row["torch"], row["cuda_build"]) == (None, None, "13.0")
    text = mm.format_report({"results": [row], "derived_figures": "d", "flop_convention": "f"})
    assert text.splitlines()[1].split()[:2] == ["r.json", "none"]
    assert mm.report_rows([]) == []


def test_device_times_must_be_finite_numbers_and_not_booleans():
    result = _schema2()
    warm = [phase for phase in result["phases"] if phase["phase"] == "warm_forward"]
    for phase, value in zip(warm, (1, 2, 4), strict=True):
        phase["device_ms"] = value  # ints are numbers too
    assert mm.report_rows([("r", result)])[0]["warm_median_device_ms"] == Decimal("2.0")
    for bad in (True, "1", float("inf")):
        warm[0]["device_ms"] = bad
        assert mm.report_rows([("r", result)])[0]["warm_median_device_ms"] is None, bad


def test_read_result_file_opens_without_blocking(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "ok.json").write_text("{}")
    flags, real_open = [], os.open
    monkeypatch.setattr(os, "open", lambda path, flag, *rest: flags.append(flag) or real_open(path, flag, *rest))
    assert mm.read_result_file("ok.json") == {}
    assert flags == [os.O_RDONLY | os.O_NONBLOCK]  # a FIFO cannot hang the open
    os.mkfifo("pipe")
    writer = real_open("pipe", os.O_RDWR)  # a writer is there: even a blocking open would return
    try:
        assert refusal(mm.read_result_file, "pipe") == "report: 'pipe' is not a kit result: not a regular file"
    finally:
        os.close(writer)


def test_a_stdout_that_fails_only_on_flush_is_one_line_and_exit_1(capsys, monkeypatch):
    written = []

    class FullOnFlush:
        def write(self, text):
            written.append(text)
            return len(text)

        def flush(self):
            raise OSError(errno.ENOSPC, "No space left on device")

    for argv in (["estimate", "--parameters", "1", "--bits", "1"], ["--help"]):
        monkeypatch.setattr(sys, "stdout", FullOnFlush())
        written.clear()
        assert mm.main(argv) == 1
        assert written and capsys.readouterr().err == (
            "mesure_memoire.py: error: cannot write the output: OSError: [Errno 28] No space left on device\n"
        )


def test_ctrl_c_is_one_exact_line_and_status_130(capsys, monkeypatch):
    def interrupted(*args):
        raise KeyboardInterrupt

    monkeypatch.setattr(mm, "estimate_weights", interrupted)
    assert mm.main(["estimate", "--parameters", "1", "--bits", "1"]) == 130
    captured = capsys.readouterr()
    assert captured.err == "mesure_memoire.py: interrupted (Ctrl-C); no partial file left behind\n"
    assert captured.out == ""


def test_stdout_failed_survives_a_closed_interpreter_stdout(tmp_path, capsys):
    real_stdout = sys.__stdout__
    stream = open(tmp_path / "closed.txt", "w")  # noqa: SIM115 -- closed on purpose below
    stream.close()
    sys.__stdout__ = stream
    try:
        code = mm.stdout_failed("mesure_memoire.py", mm.StdoutFailed(BrokenPipeError(errno.EPIPE, "x")), stream)
    finally:
        sys.__stdout__ = real_stdout
    assert code == 1 and capsys.readouterr().err == ""


def test_measure_to_file_adds_no_warning_field_when_none_was_raised(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(mm, "PYTORCH_WARNINGS", [])
    monkeypatch.setattr(mm, "measure", lambda config, tool: {"environment": {"field_errors": {}}})
    assert mm.measure_to_file({}, "r.json", tool="t") == {"environment": {"field_errors": {}}}
