"""One grammar for numbers, the same in both shipped scripts (README, "Options are spelled in full").

A whole number is 0 or ASCII digits not starting with 0; a decimal (mesure_memoire.py's --reserve-gib,
the results CSV's threshold and hours) is a whole number, then optionally "." and at least one digit.
No sign, exponent, underscore, space or other script's digits.  Each text below goes through both
scripts' options alike, and through each script's own check of that grammar."""

import pytest

import calcul_forfaits
import mesure_memoire
from conftest import assert_one_line, calculator_refusal, call_calculator, kit_error_of, plain_ids

# (text, a whole number?, a decimal?)
NUMBERS = [
    ("0", True, True),
    ("7", True, True),
    ("4096", True, True),
    ("0.5", False, True),
    ("10.25", False, True),
    ("0." + "1" * 30, False, True),  # 30 digits after the point: the bound of each side
    ("0." + "0" * 30 + "1", False, False),
    ("07", False, False),
    ("00", False, False),
    ("07.5", False, False),
    (".5", False, False),
    ("5.", False, False),
    (".", False, False),
    ("1.2.3", False, False),
    ("", False, False),
    ("+1", False, False),
    ("-1", False, False),
    ("1e3", False, False),
    ("1_0", False, False),
    ("1,5", False, False),
    (" 1", False, False),
    ("1\n", False, False),
    ("٤", False, False),  # an Arabic-Indic digit
    ("１", False, False),  # a full-width digit
    ("²", False, False),  # str.isdigit() is true for a superscript
    ("5.٤", False, False),
]
# Plain ASCII ids: the mutation pass selects tests by id and loses those holding escapes or spaces.
IDS = plain_ids(NUMBERS)


@pytest.mark.parametrize(("text", "whole", "decimal"), NUMBERS, ids=IDS)
def test_each_script_checks_the_grammar_alike(text, whole, decimal):
    assert calcul_forfaits.is_whole(text, zero=True) is whole
    assert (mesure_memoire.device_index(f"cuda:{text}") == int(text)) if whole else True
    if not whole:
        said = kit_error_of(mesure_memoire.device_index, f"cuda:{text}")
        assert said == f"--device: expected cuda:N (for example cuda:0), got {mesure_memoire.quoted(f'cuda:{text}')}"
    assert calcul_forfaits.is_number(text) is decimal  # mesure_memoire.py's decimal: through main, below


@pytest.mark.parametrize(("text", "whole", "decimal"), [case for case in NUMBERS if case[0] != "0"], ids=IDS[1:])
def test_a_whole_number_option_of_either_script_follows_the_grammar(text, whole, decimal, capsys):
    """--parameters and --lots take positive whole numbers: the same texts pass and fail in both."""
    estimate = ["estimate", "--parameters", text, "--bits", "8"]
    if whole:
        assert mesure_memoire.main(estimate) == 0
        assert f"  parameters            {text}\n" in capsys.readouterr().out
        status, out, err = call_calculator(capsys, "--gpu", "b200", "--days", "7", "--lots", text)
        assert (status, err) == (0, "")
        assert f", {text} lot(s)\n" in out
    else:
        assert mesure_memoire.main(estimate) == 2
        said = f", got {mesure_memoire.quoted(text)}"
        assert_one_line(capsys.readouterr().err, "--parameters: expected a positive whole number", said)
        err = calculator_refusal(capsys, "--gpu", "b200", "--days", "7", "--lots", text)
        assert f"--lots: expected a positive whole number, got {text!r}" in err


@pytest.mark.parametrize(("text", "whole", "decimal"), NUMBERS, ids=IDS)
def test_the_decimal_option_follows_the_grammar(text, whole, decimal, capsys):
    status = mesure_memoire.main(["estimate", "--parameters", "1", "--bits", "8", "--reserve-gib", text])
    captured = capsys.readouterr()
    if decimal:
        assert (status, captured.err) == (0, "")
    else:
        assert status == 2
        assert_one_line(captured.err, "--reserve-gib: expected a number >= 0", f", got {mesure_memoire.quoted(text)}")


def test_zero_is_a_whole_number_where_an_option_takes_it(capsys):
    assert mesure_memoire.main(["measure", "--device", "cuda:0", "--warmup", "0", "--plan", "--json"]) == 0
    assert '"warmup": 0,' in capsys.readouterr().out
    assert mesure_memoire.main(["measure", "--device", "cuda:0", "--warmup", "00", "--plan"]) == 2
    assert_one_line(capsys.readouterr().err, "--warmup: expected a whole number from 0 to 1000", ", got '00'")


def test_one_is_a_size_each_size_option_takes(capsys):
    sizes = ["--batch", "1", "--context", "1", "--width", "1"]
    assert mesure_memoire.main(["measure", "--device", "cuda:0", *sizes, "--plan", "--json"]) == 0
    assert '"batch": 1,\n    "context": 1,\n    "width": 1,' in capsys.readouterr().out


@pytest.mark.parametrize(("digits", "accepted"), [(30, True), (31, False)])
def test_one_bound_on_a_whole_number_s_digits_in_both_scripts(digits, accepted, capsys):
    """30 ASCII digits at most, typed or read from a CSV, in both scripts (--seed's 2**64 - 1 has 20)."""
    text = "9" * digits
    assert (mesure_memoire.main(["estimate", "--parameters", text, "--bits", "8"]) == 0) is accepted
    assert (calcul_forfaits.main(["--gpu", "b200", "--days", "7", "--lots", text]) == 0) is accepted
    assert calcul_forfaits.is_whole(text) is accepted
    capsys.readouterr()
