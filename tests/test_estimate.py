"""`mesure_memoire.py estimate`: integer arithmetic, labels, refusals, standard library only."""

import json
import shutil
import subprocess
import sys
from decimal import Decimal
from fractions import Fraction

import pytest

import mesure_memoire
from conftest import ROOT, assert_one_line_refusal, imported_modules, run_script


def test_reference_example_from_the_readme():
    completed = run_script(
        "mesure_memoire.py", "estimate", "--parameters", "7000000000", "--bits", "16", "--reserve-gib", "4"
    )
    assert completed.returncode == 0, completed.stderr
    out = completed.stdout
    assert "14000000000" in out
    assert "13.04 GiB" in out and "14.00 GB" in out and "17.04 GiB" in out
    assert "not a measured reserve" in out
    for item in mesure_memoire.NOT_INCLUDED_IN_ESTIMATE:
        assert item in out
    assert "does not predict whether a real model fits" in out
    assert "GB (10**9 bytes)" in out and "GiB (2**30 bytes)" in out
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert "python mesure_memoire.py estimate --parameters 7000000000 --bits 16 --reserve-gib 4\n" in readme
    assert "14000000000 bytes, 13.04 GiB (14.00 GB), and 17.04 GiB in total" in readme


@pytest.mark.parametrize(
    ("bits", "expected_bytes_per_parameter"),
    [(1, 1), (4, 1), (7, 1), (8, 1), (9, 2), (12, 2), (16, 2), (17, 3), (24, 3), (32, 4), (33, 5), (64, 8)],
)
def test_bits_round_up_to_whole_bytes(bits, expected_bytes_per_parameter):
    estimate = mesure_memoire.estimate_weights(1_000_003, bits)
    assert estimate["bytes_per_parameter"] == expected_bytes_per_parameter
    assert estimate["weight_bytes"] == 1_000_003 * expected_bytes_per_parameter
    assert isinstance(estimate["weight_bytes"], int)


def test_gib_and_gb_are_exact_decimals():
    estimate = mesure_memoire.estimate_weights(2**30, 8, "0.5")
    assert estimate["weight_gib"] == 1
    assert estimate["weight_gb"] == Decimal("1.073741824")
    assert estimate["total_gib"] == Decimal("1.5")


def test_the_largest_accepted_inputs_are_shown_exactly():
    parameters, bits = "9" * 30, "9" * 30
    completed = run_script("mesure_memoire.py", "estimate", "--parameters", parameters, "--bits", bits,
                           "--reserve-gib", "0.005")  # fmt: skip
    assert completed.returncode == 0, completed.stderr
    weight_bytes = int(parameters) * -(-int(bits) // 8)
    total = Fraction(weight_bytes, 2**30) + Fraction(5, 1000)
    hundredths = (total * 100 + Fraction(1, 2)).__floor__()  # half-up, independently of Decimal
    assert f"total                 {hundredths // 100}.{hundredths % 100:02d} GiB" in completed.stdout
    assert f"weight bytes          {weight_bytes}" in completed.stdout


def test_json_output_carries_the_same_figures():
    completed = run_script(
        "mesure_memoire.py", "estimate", "--parameters", "7000000000", "--bits", "12", "--reserve-gib", "4", "--json"
    )
    assert completed.returncode == 0, completed.stderr
    data = json.loads(completed.stdout)
    assert data["parameters"] == 7000000000 and data["bits"] == 12
    assert data["bytes_per_parameter"] == 2
    assert data["weight_bytes"] == 14000000000
    assert data["weight_gib"] == 13.038516  # 14e9 / 2**30, half-up to 6 decimals
    assert data["weight_gb"] == 14.0
    assert data["reserve_gib"] == 4.0
    assert data["total_gib"] == 17.038516
    assert "hypothesis" in data["reserve_is"]


@pytest.mark.parametrize(
    ("args", "option"),
    [
        (["--parameters", "0", "--bits", "16"], "--parameters"),
        (["--parameters", "-5", "--bits", "16"], "--parameters"),
        (["--parameters", "1.5", "--bits", "16"], "--parameters"),
        (["--parameters", "7e9", "--bits", "16"], "--parameters"),
        (["--parameters", "nan", "--bits", "16"], "--parameters"),
        (["--parameters", "inf", "--bits", "16"], "--parameters"),
        (["--parameters", "", "--bits", "16"], "--parameters"),
        (["--parameters", "1_000", "--bits", "16"], "--parameters"),
        (["--parameters", "10", "--bits", "0"], "--bits"),
        (["--parameters", "10", "--bits", "-8"], "--bits"),
        (["--parameters", "10", "--bits", "8.0"], "--bits"),
        (["--parameters", "10", "--bits", "16", "--reserve-gib", "-1"], "--reserve-gib"),
        (["--parameters", "10", "--bits", "16", "--reserve-gib", "nan"], "--reserve-gib"),
        (["--parameters", "10", "--bits", "16", "--reserve-gib", "inf"], "--reserve-gib"),
        (["--parameters", "10", "--bits", "16", "--reserve-gib", "-inf"], "--reserve-gib"),
        (["--parameters", "10", "--bits", "16", "--reserve-gib", "four"], "--reserve-gib"),
        (["--parameters", "10", "--bits", "16", "--reserve-gib", "1e30"], "--reserve-gib"),
        (["--parameters", "10", "--bits", "16", "--reserve-gib", "1e999999"], "--reserve-gib"),
        (["--parameters", "1" + "0" * 30, "--bits", "16"], "--parameters"),
        (["--bits", "16"], "--parameters"),
        (["--parameters", "10"], "--bits"),
    ],
)
def test_bad_input_is_refused_in_one_line(args, option, capsys):
    assert mesure_memoire.main(["estimate", *args]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    lines = captured.err.splitlines()
    assert len(lines) == 1 and option in lines[0] and lines[0].startswith("mesure_memoire.py: error:")


def test_refusal_from_the_command_line_has_no_traceback():
    completed = run_script("mesure_memoire.py", "estimate", "--parameters", "abc", "--bits", "16")
    assert_one_line_refusal(completed, "--parameters", "'abc'")


@pytest.mark.whole_kit
def test_runs_without_site_packages_and_never_imports_torch():
    code = (
        "import sys; sys.path.insert(0, sys.argv[1]); import mesure_memoire as m; "
        "rc = m.main(['estimate', '--parameters', '7000000000', '--bits', '16']); "
        "print('torch' in sys.modules, rc)"
    )
    completed = subprocess.run([sys.executable, "-S", "-c", code, str(ROOT)], capture_output=True, text=True)
    assert completed.returncode == 0, completed.stderr
    assert completed.stdout.splitlines()[-1] == "False 0"
    assert "13.04 GiB" in completed.stdout


def _python310():
    for candidate in ("python3.10", "/root/.pyenv/versions/3.10.13/bin/python3.10"):
        path = shutil.which(candidate) or candidate
        try:
            version = subprocess.run(
                [path, "-c", "import sys; print(sys.version_info[:2])"], capture_output=True, text=True, timeout=30
            )
        except OSError:
            continue
        if version.returncode == 0 and version.stdout.strip() == "(3, 10)":
            return path
    return None


@pytest.mark.whole_kit
def test_python_3_10_gives_the_same_estimate():
    python310 = _python310()
    if python310 is None:
        pytest.skip("no Python 3.10 interpreter on this machine")
    args = ("estimate", "--parameters", "7000000000", "--bits", "12", "--reserve-gib", "4", "--json")
    old = run_script("mesure_memoire.py", *args, python=python310, python_flags=("-S",))
    new = run_script("mesure_memoire.py", *args)
    assert old.returncode == 0, old.stderr
    assert old.stdout == new.stdout


def _half_up_six(fraction):
    millionths = (fraction * 10**6 + Fraction(1, 2)).__floor__()
    return f"{millionths // 10**6}.{millionths % 10**6:06d}"


@pytest.mark.parametrize(
    ("parameters", "bits", "reserve"),
    [
        ("9" * 30, "9" * 30, "0." + "9" * 30),
        ("1", "1", "0"),
        ("7000000000", "12", "4"),
        ("1" + "0" * 29, "64", "9" * 30),
    ],
)
def test_json_gives_gib_and_gb_to_exactly_six_decimals_at_every_size(parameters, bits, reserve, capsys):
    assert mesure_memoire.main(["estimate", "--parameters", parameters, "--bits", bits, "--reserve-gib", reserve,
                                "--json"]) == 0  # fmt: skip
    text = capsys.readouterr().out
    data = json.loads(text)  # valid JSON
    weight_bytes = int(parameters) * -(-int(bits) // 8)
    expected = {
        "weight_gib": _half_up_six(Fraction(weight_bytes, 2**30)),
        "weight_gb": _half_up_six(Fraction(weight_bytes, 10**9)),
        "reserve_gib": _half_up_six(Fraction(reserve)),
        "total_gib": _half_up_six(Fraction(weight_bytes, 2**30) + Fraction(reserve)),
    }
    for key, literal in expected.items():
        assert f'  "{key}": {literal},\n' in text, key  # the exact digits, never 9.3e+20
    assert data["weight_bytes"] == weight_bytes and "e+" not in text and "E+" not in text
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert "`--json` gives them to six decimals" in " ".join(readme.split())


@pytest.mark.parametrize(
    ("reserve", "expected"),
    [("4", "4"), ("4.", "4"), (".5", "0.5"), ("0.5", "0.5"), ("007", "7"), ("0", "0"), ("0.0", "0"), (4, "4"),
     (0.25, "0.25"), (Decimal("1.5"), "1.5"), ("0." + "1" * 30, "0." + "1" * 30), ("9" * 30, "9" * 30)],
)  # fmt: skip
def test_one_number_grammar_accepts_plain_decimals(reserve, expected):
    value = mesure_memoire.non_negative_decimal("--reserve-gib", reserve)
    assert value == Decimal(expected) and not value.is_signed()


@pytest.mark.parametrize("reserve", ["-0", "-0.0", "+1", " 1", "1 ", "1_0", "٤", "1e1", "0x1", "..5", "", ".", True,
                                     -1, -0.0, float("nan"), 1e30, None, "0." + "1" * 31, "1" * 31])  # fmt: skip
def test_one_number_grammar_refuses_the_rest(reserve):
    with pytest.raises(mesure_memoire.KitError, match="--reserve-gib: expected a number >= 0"):
        mesure_memoire.non_negative_decimal("--reserve-gib", reserve)


def test_to_json_writes_what_json_dumps_writes_except_for_decimals():
    data = {"a": [1, 2.5, None, True, {}, [], 'é\n"x"'], "b": {"c": {"d": []}}, "e": "", "f": [[{}]]}
    assert mesure_memoire.to_json(data) == json.dumps(data, indent=2) + "\n"
    assert mesure_memoire.to_json({"x": Decimal("2.5"), "y": [Decimal(10) ** 25]}) == (
        '{\n  "x": 2.500000,\n  "y": [\n    10000000000000000000000000.000000\n  ]\n}\n'
    )
    with pytest.raises(TypeError):
        mesure_memoire.to_json({"x": object()})
    with pytest.raises(TypeError):
        mesure_memoire.to_json({"x": Decimal("NaN")})


def test_whole_numbers_take_ascii_digits_and_an_upper_bound():
    assert mesure_memoire.whole_number("--seed", str(2**64 - 1), 0, 2**64 - 1) == 2**64 - 1
    assert mesure_memoire.whole_number("--seed", 0, 0, 2**64 - 1) == 0
    for value in (2**64, str(2**64), "-1", -1, "٣", "１", "1_0", True, 1.0, "9" * 31):
        with pytest.raises(mesure_memoire.KitError, match="--seed"):
            mesure_memoire.whole_number("--seed", value, 0, 2**64 - 1)
    with pytest.raises(mesure_memoire.KitError, match="from 0 to 18446744073709551615"):
        mesure_memoire.measure_config("cuda:0", 1, 1, 1, "float32", 0, 1, 2**64)


@pytest.mark.whole_kit
def test_the_estimate_imports_only_decimal_beyond_a_bare_interpreter(tmp_path):
    """Start-up is a guard, not a goal: json, datetime, stat and PyTorch are imported only where used
    (argparse, and the re it imports, are the command line's)."""
    bare = imported_modules("-c", "pass", cwd=tmp_path)
    script = ROOT / "mesure_memoire.py"
    extra = imported_modules(script, "estimate", "--parameters", "7000000000", "--bits", "16", cwd=tmp_path) - bare
    assert "decimal" in extra  # the GiB are exact decimals
    assert not extra & {"json", "datetime", "stat", "torch"}
    with_json = imported_modules(script, "estimate", "--parameters", "7", "--bits", "16", "--json", cwd=tmp_path)
    assert "json" in with_json  # a lazy import is seen when it happens
