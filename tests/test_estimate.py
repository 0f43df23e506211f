"""`mesure_memoire.py estimate`: integer arithmetic, labels, refusals, standard library only."""

import json
import subprocess
import sys
from decimal import Decimal
from fractions import Fraction

import pytest

import mesure_memoire
from conftest import ROOT, assert_one_line, kit_error_of, plain_ids


@pytest.mark.parametrize(
    ("args", "option"),
    [
        (["--parameters", "nan", "--bits", "16"], "--parameters"),
        (["--parameters", "10", "--bits", "0"], "--bits"),
        (["--parameters", "10", "--bits", "16", "--reserve-gib", "nan"], "--reserve-gib"),
        (["--parameters", "10", "--bits", "16", "--reserve-gib", "1e999999"], "--reserve-gib"),
        (["--bits", "16"], "--parameters"),
        (["--parameters", "10"], "--bits"),
    ],
)
def test_bad_input_is_refused_in_one_line(args, option, capsys):
    assert mesure_memoire.main(["estimate", *args]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert_one_line(captured.err, "error: ", option)


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
    assert (
        mesure_memoire.main(
            ["estimate", "--parameters", parameters, "--bits", bits, "--reserve-gib", reserve, "--json"]
        )
        == 0
    )
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
    assert data["weight_bytes"] == weight_bytes
    assert "e+" not in text
    assert "E+" not in text
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert "`--json` gives them to six decimals" in " ".join(readme.split())


# --- rounding and exact decimals ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("number", "places", "expected"),
    [
        ("0.125", 2, "0.13"),
        ("2.5", 0, "3"),
        ("0.1249999", 2, "0.12"),
        ("7", 2, "7.00"),
    ],
)
def test_rounded_is_half_up_to_exactly_the_places(number, places, expected):
    result = mesure_memoire.rounded(Decimal(number), places)
    assert str(result) == expected  # the digits, the exponent: half-even would give 0.12, 2 and 1.000002


def test_rounded_and_ratios_keep_every_digit_of_the_largest_figures():
    big = Decimal("9" * 60 + ".125")
    assert str(mesure_memoire.rounded(big, 2)) == "9" * 60 + ".13"  # 28 digits (the default context) would fail
    assert str(mesure_memoire.decimal_ratio(10**61 + 1, 10)) == "1" + "0" * 59 + "0.1"
    third = mesure_memoire.decimal_ratio(1, 3)
    assert len(third.as_tuple().digits) == 200  # the exact context's precision
    with mesure_memoire.exact_context() as context:
        assert context.prec == 200


# --- the one number grammar ---------------------------------------------------------------------------------


WHOLE_NUMBERS = [  # (value, minimum, maximum or None, the number or what the refusal says it must be)
    ("9" * 30, 1, None, 10**30 - 1),
    (10**30 - 1, 1, None, 10**30 - 1),
    ("0", 0, None, 0),
    (str(2**64 - 1), 0, 2**64 - 1, 2**64 - 1),
    ("7", 3, 7, 7),
    (3, 3, 7, 3),
    (10**30, 1, None, "a positive whole number of at most 30 ASCII digits"),
    ("0" * 29 + "7", 1, None, "a positive whole number of at most 30 ASCII digits, no leading zero"),
    ("0", 1, None, "a positive whole number"),
    (0, 1, None, "a positive whole number"),
    (-1, 0, None, "a whole number >= 0"),
    (1, 2, None, "a whole number >= 2"),
    (None, 0, None, "a whole number >= 0"),
    (False, 0, None, "a whole number >= 0"),
    (1.0, 0, None, "a whole number >= 0"),
    (10**30 - 1, 1, 10**30 - 2, "a whole number from 1 to " + "9" * 29 + "8"),
    ("8", 3, 7, "a whole number from 3 to 7"),
    (2, 3, 7, "a whole number from 3 to 7"),
    (2**64, 0, 2**64 - 1, f"a whole number from 0 to {2**64 - 1}"),
]
WHOLE_NUMBER_IDS = plain_ids([(str(case[0]),) for case in WHOLE_NUMBERS])


@pytest.mark.parametrize(("value", "minimum", "maximum", "expected"), WHOLE_NUMBERS, ids=WHOLE_NUMBER_IDS)
def test_whole_number_takes_ascii_digits_or_an_int_within_its_bounds(value, minimum, maximum, expected):
    """Texts of every kind: test_numbers.py; an int or a float as the notebook's parameters give them."""
    bounds = (minimum,) if maximum is None else (minimum, maximum)
    if isinstance(expected, int):
        assert mesure_memoire.whole_number("--x", value, *bounds) == expected
    else:
        said = kit_error_of(mesure_memoire.whole_number, "--x", value, *bounds)
        assert said.startswith(f"--x: expected {expected}") and said.endswith(f", got {mesure_memoire.quoted(value)}")


def test_non_negative_decimal_message_and_value():
    said = kit_error_of(mesure_memoire.non_negative_decimal, "--r", "x")
    assert said.startswith("--r: expected a number >= 0 written with ASCII digits") and said.endswith(", got 'x'")
    assert str(mesure_memoire.non_negative_decimal("--r", "9" * 30 + "." + "9" * 30)) == "9" * 30 + "." + "9" * 30
    assert mesure_memoire.non_negative_decimal("--r", "0." + "0" * 29 + "1") == Decimal("1E-30")
    assert str(mesure_memoire.non_negative_decimal("--r", "5")) == "5.0"
    assert str(mesure_memoire.non_negative_decimal("--r", "0.5")) == "0.5"
    for value in ("9" * 31, "9" * 31 + ".5", "0." + "0" * 30 + "1", b"1", [1], Fraction(1), True):
        said = kit_error_of(mesure_memoire.non_negative_decimal, "--r", value)
        assert said.startswith("--r: expected a number >= 0"), value


# --- the estimate, in-process ---------------------------------------------------------------------------------


def test_estimate_text_of_the_readme_example(capsys):
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert "python mesure_memoire.py estimate --parameters 7000000000 --bits 16 --reserve-gib 4\n" in readme
    assert "14000000000 bytes, 13.04 GiB (14.00 GB), and 17.04 GiB in total" in readme
    assert mesure_memoire.main(["estimate", "--parameters", "7000000000", "--bits", "16", "--reserve-gib", "4"]) == 0
    assert capsys.readouterr().out.splitlines() == [
        "Weight-memory estimate (arithmetic only, no GPU)",
        "  parameters            7000000000",
        "  storage width         16 bits -> 2 bytes per parameter (rounded up to whole bytes)",
        "  weight bytes          14000000000",
        "  weights               13.04 GiB (2**30 bytes) = 14.00 GB (10**9 bytes)",
        "  reserve (hypothesis)  4.00 GiB, your assumption, not a measured reserve",
        "  total                 17.04 GiB",
        "Bytes are exact integers; GiB and GB are rounded half-up to 2 decimals.",
        "Not included: activations, KV cache, quantization metadata, gradients, optimizer states, libraries, "
        "the CUDA/ROCm context.",
        "This does not predict whether a real model fits a card.",
    ]
    assert mesure_memoire.main(["estimate", "--parameters", "1", "--bits", "8"]) == 0
    assert "  storage width         8 bits -> 1 byte per parameter" in capsys.readouterr().out


# --- to_json ------------------------------------------------------------------------------------------------


def test_to_json_indents_nested_containers_and_decimals():
    data = {"a": {"b": [Decimal("0.0000005"), {"c": Decimal("-1.25")}]}, 3: (1, "x"), "e": {}, "f": []}
    assert mesure_memoire.to_json(data) == (
        '{\n  "a": {\n    "b": [\n      0.000001,\n      {\n        "c": -1.250000\n      }\n    ]\n  },\n'
        '  "3": [\n    1,\n    "x"\n  ],\n  "e": {},\n  "f": []\n}\n'
    )
    assert (
        mesure_memoire.to_json(Decimal("12345678901234567890123456789.5")) == "12345678901234567890123456789.500000\n"
    )
    assert mesure_memoire.to_json(Decimal("2.5E+3")) == "2500.000000\n"
    assert mesure_memoire.to_json("é") == '"\\u00e9"\n'
    with pytest.raises(TypeError):
        mesure_memoire.to_json([Decimal("Infinity")])
    data = {"a": [1, 2.5, None, True, {}, [], 'é\n"x"'], "b": {"c": {"d": []}}, "e": "", "f": [[{}]]}
    assert mesure_memoire.to_json(data) == json.dumps(data, indent=2) + "\n"
    with pytest.raises(TypeError):
        mesure_memoire.to_json({"x": object()})
    with pytest.raises(TypeError):
        mesure_memoire.to_json({"x": Decimal("NaN")})


def test_shown_quotes_escapes_and_shortens_user_values():
    assert mesure_memoire.quoted("a\nb") == "'a\\nb'"
    long_value = "x" * 200 + "END"
    text = mesure_memoire.quoted(long_value)
    assert text == "'" + "x" * 59 + "..." + "x" * 8 + "END' (203 characters)"
    assert mesure_memoire.quoted("y" * 78) == "'" + "y" * 78 + "'"  # 80 characters with the quotes: kept whole
    assert mesure_memoire.name_as_typed("a b.json") == "a b.json"
    assert mesure_memoire.name_as_typed("z" * 4200) == "z" * 4200  # any path's length: whole
    for odd in ("", " lead.json", "trail.json ", "\u202egnp.json", "\t" + "z" * 4000):
        assert mesure_memoire.name_as_typed(odd) == repr(odd)  # whole, up to any path's length
    assert mesure_memoire.one_line("a\nb\r\tc\x1b\u2028é") == "a\\nb\\r\\tc\\x1b\\u2028é"
    assert (
        mesure_memoire.quoted("y" * 79) == "'" + "y" * 59 + "..." + "y" * 11 + "' (79 characters)"
    )  # 81 with the quotes
    assert mesure_memoire.quoted(12345) == "12345"
    assert mesure_memoire.name_as_typed(b"x.json") == "b'x.json'"
    assert mesure_memoire.name_as_typed("z" * 4201).endswith("' (4201 characters)")  # no path is longer


def test_the_options_reach_the_estimate_with_its_default_reserve(capsys):
    """--parameters=7 and --bits in any order; --reserve-gib defaults to 0."""
    assert mesure_memoire.main(["estimate", "--bits", "4", "--parameters=7", "--json"]) == 0
    estimate = json.loads(capsys.readouterr().out)
    assert (estimate["parameters"], estimate["bits"], estimate["reserve_gib"]) == (7, 4, 0)
    assert estimate["not_included"] == list(mesure_memoire.NOT_INCLUDED_IN_ESTIMATE)  # the text: the README's test
    assert mesure_memoire.main(["estimate", "--parameters", "7", "--bits", "4", "--reserve-gib", "0.5", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["reserve_gib"] == 0.5


@pytest.mark.parametrize(
    "argv",
    [
        ["--bitsx=16"],  # no guess: the required option is missing
        ["--", "--bitsx"],  # after --, not an option
    ],
)
def test_a_typo_of_a_required_option_reads_as_that_option_missing(argv, capsys):
    assert mesure_memoire.main(["estimate", "--parameters", "7", *argv]) == 2
    assert_one_line(capsys.readouterr().err, "estimate: ", "required: --bits")
