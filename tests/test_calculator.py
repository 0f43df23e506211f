"""calcul_forfaits.py: the price of a package, its command line, --list, the catalog and its validation
(hostile catalogs included), the snapshot itself, the raw-results template and the quality protocol.
--results lives in test_results.py; the contract every program keeps (help, misuse, stdout, Ctrl-C) in
test_command_line.py.

In-process through main(argv); a new process only where one is what is tested (a FIFO or /dev/zero
that could block, ``-S``, another Python, what start-up imports).
"""

import csv
import hashlib
import json
import os
import subprocess
import sys
from fractions import Fraction

import pytest

import calcul_forfaits
from conftest import (
    ROOT,
    SHIPPED_ROOT,
    UnwritableStdout,
    assert_one_line,
    assert_one_line_refusal,
    calculator_refusal,
    half_up_cost,
    plain_id,
    run_script,
    tree_digest,
)
from conftest import call_calculator as call

CSV_PATH = ROOT / "tarifs-forfaits.csv"
COST_RULE = (
    "total price / accepted results, rounded half-up to four significant digits or to the cent, whichever is finer"
)


def csv_rows():
    with CSV_PATH.open(encoding="utf-8", newline="") as stream:
        return list(csv.DictReader(stream))


def tariff(price_cents):
    return {
        "gpu": "x",
        "model": "X",
        "memory_gb": 1,
        "gpus_per_lot": 1,
        "days": 3,
        "price_cents": price_cents,
        "currency": "USD",
        "snapshot_date": "2026-09-24",
    }


# --- the price of a package ----------------------------------------------------------------------------


@pytest.mark.parametrize("lots", [1, 2, 3, 7])
def test_every_row_and_several_lot_counts(lots):
    catalog = calcul_forfaits.load_catalog()
    for row in csv_rows():
        package = calcul_forfaits.price_package(catalog, row["gpu"], row["days"], str(lots), "7")
        lot_cents = int(row["price_cents"])
        assert package["lot_price_cents"] == lot_cents
        assert package["total_price_cents"] == lot_cents * lots
        assert package["gpus"] == int(row["gpus_per_lot"]) * lots
        assert package["cost_per_accepted_result_usd"] == half_up_cost(Fraction(lot_cents * lots, 100 * 7))


@pytest.mark.parametrize(
    ("total_cents", "accepted", "expected"),
    [
        (100, 3, "0.3333"),
        (200, 3, "0.6667"),
        (1, 2, "0.005000"),
        (5, 1000, "0.00005000"),
        (25, 10, "0.02500"),
        (364800, 1, "3648.00"),
        (123456, 1, "1234.56"),  # the cent is finer than four significant digits
        (222300, 120, "18.53"),  # 18.525, half-up: both rules agree
        (12345, 1000, "0.1235"),  # 0.12345, half-up (half-even would give 0.1234)
        (199999, 2, "1000.00"),  # 999.995, half-up to the cent
        (99995, 10000, "0.1000"),  # 0.099995 carries into a new digit: still four significant digits
        (45200, 1890000, "0.0002392"),  # issue 54: the H100 SXM's 7 days, 1,890,000 results, once "0.00"
        (239, 100, "0.02390"),  # two rentals once both "0.02"
        (242, 100, "0.02420"),
        (10007, 10, "10.01"),  # 10.007: from 10.00 up, the cent is the finer
        (10000, 1, "100.00"),  # exactly 100: the cent's two places kept
        (199991, 200, "10.00"),  # 9.99955 carries to 10.000: four significant digits are 10.00
    ],
)
def test_cost_rounds_half_up_to_four_significant_digits_or_the_cent_whichever_is_finer(total_cents, accepted, expected):
    package = calcul_forfaits.price_package([tariff(total_cents)], "x", "3", "1", str(accepted))
    assert package["cost_per_accepted_result_usd"] == expected
    assert half_up_cost(Fraction(total_cents, 100 * accepted)) == expected
    assert package["cost_rounding"] == COST_RULE


def test_a_nonzero_cost_never_prints_as_zero(capsys):
    status, out, err = call(capsys, "--gpu", "h100-sxm", "--days", "7", "--accepted-results", "1890000")
    assert (status, err) == (0, "")
    assert "  cost per accepted result  0.0002392 USD = total price / 1890000 accepted results (rounded half-up " in out
    assert "0.00 USD" not in out
    smallest = "9" * 30  # the most accepted results the grammar takes: the cost is still written, in plain digits
    status, out, err = call(capsys, "--gpu", "l4", "--days", "3", "--accepted-results", smallest, "--json")
    assert (status, err) == (0, "")
    assert json.loads(out)["cost_per_accepted_result_usd"] == half_up_cost(Fraction(3000, 100 * int(smallest)))
    assert json.loads(out)["cost_per_accepted_result_usd"] == "0." + "0" * 28 + "3000"


def test_the_readme_example_and_what_the_readme_says_of_its_prices(capsys):
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert "python calcul_forfaits.py --gpu b200 --days 7 --lots 2\n" in readme
    status, out, err = call(capsys, "--gpu", "b200", "--days", "7", "--lots", "2")
    assert status == 0, err
    assert "4 (2 per lot x 2 lot(s))" in out  # the B200 lot holds two GPUs
    assert "total price               3648.00 USD (364800 cents) = lot price x 2\n" in out
    assert (
        "snapshot of 2026-09-24, whole USD cents for the whole duration (3, 7 or 30 days), no hourly proration" in out
    )
    assert "The CSV proves neither current availability nor a reservation: check the offer shown before buying" in out
    said = " ".join(readme.split())
    for fact in (
        "two lots give four GPUs for twice the lot's price",
        "catalog snapshot of 24 September 2026",
        "in whole USD cents for the whole duration (3, 7 or 30 days), no hourly proration",
        "The CSV proves neither current availability nor a reservation: check the offer shown before buying",
    ):
        assert fact in said, fact


def test_without_accepted_results_the_text_says_how_to_get_the_cost(capsys):
    status, out, err = call(capsys, "--gpu", "h200", "--days", "7")
    assert (status, err) == (0, "")
    cost = "  cost per accepted result  not computed: add --accepted-results N (distinct useful units really accepted)"
    assert cost in out.splitlines(), out


def test_json_output_and_null_cost_without_accepted_results(capsys):
    status, out, err = call(capsys, "--gpu", "B200", "--days", "7", "--lots", "2", "--json")
    assert status == 0, err
    assert out.startswith('{\n  "gpu": "b200",\n  "model": "NVIDIA B200",\n')  # indented by two spaces
    assert json.loads(out) == {
        "gpu": "b200",
        "model": "NVIDIA B200",
        "memory_gb": 180,
        "days": 7,
        "lots": 2,
        "gpus_per_lot": 2,
        "gpus": 4,
        "lot_price_cents": 182400,
        "total_price_cents": 364800,
        "currency": "USD",
        "snapshot_date": "2026-09-24",
        "accepted_results": None,
        "cost_per_accepted_result_usd": None,
        "cost_rounding": COST_RULE,
    }
    status, out, _ = call(capsys, "--gpu", "b200", "--days", "7", "--lots", "2", "--accepted-results", "3", "--json")
    assert status == 0, err
    assert json.loads(out)["cost_per_accepted_result_usd"] == "1216.00"
    assert json.loads(out)["accepted_results"] == 3


# --- the calculator's command line -----------------------------------------------------------------------


def unknown_gpu(gpu, slugs=None):
    return [f"--gpu: unknown GPU {gpu}; " + (f"closest: {slugs}; " if slugs else "") + "see --list"]


def days_refused(value):
    return ["--days: expected 3, 7 or 30", f"got {value}"]


def not_positive(option, value):
    return [f"{option}: expected a positive whole number", f"got {value}"]


def not_allowed(option, mode):
    return [f"{option}: not allowed with {mode}"]


@pytest.mark.parametrize(
    ("args", "facts"),
    [
        (["--gpu", "h300", "--days", "7"], unknown_gpu("'h300'", "h200, b300, mi300x")),
        (
            ["--gpu", "h100", "--days", "7"],
            unknown_gpu("'h100'", "h200, h100-sxm, h100-pcie"),
        ),
        (["--gpu", "zzz", "--days", "7"], unknown_gpu("'zzz'")),
        (["--gpu", "", "--days", "7"], unknown_gpu("''")),
        (["--gpu", "h200", "--days", "5"], days_refused("'5'")),
        (["--gpu", "h200", "--days", "07"], days_refused("'07'")),
        (["--gpu", "h200", "--days", ""], days_refused("''")),
        (["--list", "--days", "5"], days_refused("'5'")),
        (["--gpu", "h200"], ["--days is required with --gpu (3, 7 or 30)"]),
        (["--gpu", "h200", "--days", "7", "--lots", "0"], not_positive("--lots", "'0'")),
        (["--gpu", "h200", "--days", "7", "--lots", "9" * 31], not_positive("--lots", repr("9" * 31))),
        (["--gpu", "h200", "--days", "7", "--accepted-results", "0"], not_positive("--accepted-results", "'0'")),
        (["--list", "--lots", "2"], not_allowed("--lots", "--list")),
        (["--list", "--accepted-results", "2"], not_allowed("--accepted-results", "--list")),
        (["--list", "--gpu", "h200"], not_allowed("--gpu", "--list")),
        (["--results", "r.csv", "--list"], not_allowed("--list", "--results")),
        (["--gpu", "b200", "--days", "7", "--results", "r.csv"], not_allowed("--results", "--gpu")),
        (["--results", "r.csv", "--days", "7"], not_allowed("--days", "--results")),
        (["--results", "r.csv", "--gpu", "b200"], not_allowed("--gpu", "--results")),
        ([], ["--gpu, --list, --results or --for-plan is required", "see --help"]),
        (["--json", "--catalog", "c.csv"], ["--gpu, --list, --results or --for-plan is required", "see --help"]),
        (["--gpu"], ["argument --gpu: expected one argument"]),
        (["--gpu", "--days", "7"], ["argument --gpu: expected one argument"]),
        (["--gpu", "-b200", "--days", "7"], ["argument --gpu: expected one argument"]),  # no slug starts with -
        (["--json=yes", "--list"], ["argument --json: ignored explicit argument 'yes'"]),
        (["--list", "extra"], ["unrecognized arguments: extra"]),
        (["--catalog", "", "--list"], ["--catalog: expected a file name, got ''"]),
        (["--catalog=", "--list"], ["--catalog: expected a file name, got ''"]),
        (["--results", ""], ["--results: expected a file name, got ''"]),
        (["--list", "--json", "--json"], ["argument --json: given twice"]),
    ],
    ids=plain_id,
)
def test_bad_options_are_refused_in_one_line_naming_the_option(capsys, args, facts):
    assert_one_line(calculator_refusal(capsys, *args), *facts, prog="calcul_forfaits.py: error")


def test_a_usage_error_names_the_option_right_after_the_program(capsys):
    """The calculator has no subcommand: nothing stands between "error:" and the option (mutant
    ArgumentParser.error_8 put an empty command's ": " there)."""
    line = calculator_refusal(capsys, "--list", "--json", "--json")
    assert line == "calcul_forfaits.py: error: argument --json: given twice\n"


def test_a_flag_is_parsed_as_given():
    """A flag's value is True (mutant parse_command_line_39, a flag parsed as False, is seen only here)."""
    assert calcul_forfaits.parse_command_line(["--list", "--json"]) == ("--list", {"--list": True, "--json": True})


HELP = """\
usage: calcul_forfaits.py (--gpu SLUG --days N [--lots N] [--accepted-results N]
                          | --list [--days N] | --results FILE
                          | --for-plan FILE --days N) [--catalog CSV] [--json]

IteraGPU Lab v1: the price of a whole IteraGPU package, and the cost of one accepted result.

options:
  -h, --help            print this help and exit
  --gpu SLUG            the GPU model of the package to price, e.g. b200 (any case; see --list)
  --list                print the catalog: the memory advertised and as PyTorch reports it, the
                        price per GPU-day
  --results FILE        a filled resultats-bruts.csv: the cost per accepted result of each rental
  --for-plan FILE       measure --plan --json's output (-: stdin): which catalog GPU holds the run,
                        judged as --memory-gib judges, on the memory PyTorch reports for each card
                        (see --list)
  --days N              3, 7 or 30 days, no proration (--gpu, --for-plan); with --list: a filter
  --lots N              with --gpu: the number of lots, a positive whole number (default 1)
  --accepted-results N  with --gpu: distinct useful units really accepted; no default on purpose
  --catalog CSV         the price file (default: tarifs-forfaits.csv beside this script)
  --json                print JSON instead of text

--results reads these columns, in this order: run_id, rental_id, date_utc, gpu, days, lots, device,
gpu_name, driver_version, torch_version, cuda_or_hip_build, measurement_file, measurement_sha256,
units_submitted, units_accepted, quality_metric, threshold, threshold_fixed_on, wall_clock_hours,
notes.
"""


def test_the_help_names_every_option_and_what_it_does(capsys):
    assert call(capsys, "--help") == (0, HELP, "")
    assert call(capsys, "--list", "-h") == (0, HELP, "")


@pytest.mark.parametrize(("version", "colour"), [((3, 13, 9), {}), ((3, 14), {"color": False})])
def test_the_parser_settings_colour_off_where_argparse_has_it(monkeypatch, version, colour):
    """Python 3.14 added ``color`` (on by default, read from NO_COLOR and FORCE_COLOR); the pass runs on 3.11,
    so a stand-in for argparse's own constructor records what the kit's parser asks for."""
    import argparse

    settings = {}
    monkeypatch.setattr(sys, "version_info", version)
    monkeypatch.setattr(argparse.ArgumentParser, "__init__", lambda self, **kwargs: settings.update(kwargs))
    calcul_forfaits.ArgumentParser(prog="p")
    formatter = settings.pop("formatter_class")("p")
    assert settings == {"prog": "p", "allow_abbrev": False, **colour}
    assert (type(formatter), formatter._width) == (argparse.HelpFormatter, 100)


def test_main_reads_the_command_line_when_given_no_argv(capsys, monkeypatch):
    monkeypatch.setattr("sys.argv", ["calcul_forfaits.py", "--gpu", "b200", "--days", "7", "--lots", "2"])
    assert calcul_forfaits.main() == 0
    assert "364800 cents" in capsys.readouterr().out


def test_a_refusal_without_a_stderr_still_exits_2(capsys, monkeypatch):
    monkeypatch.setattr("sys.stderr", None)
    assert calcul_forfaits.main(["--gpu", "h300", "--days", "7"]) == 2
    assert capsys.readouterr().out == ""


@pytest.mark.parametrize(
    ("stdout", "error"),
    [
        (UnwritableStdout(OSError(28, "No space left on device")), "OSError: [Errno 28] No space left on device"),
        (UnwritableStdout(ValueError("I/O operation on closed file.")), "ValueError: I/O operation on closed file."),
        (UnwritableStdout(ValueError("")), "ValueError"),  # no message: its type
        (None, "standard output is closed"),
        (UnwritableStdout(BrokenPipeError(32, "Broken pipe")), None),  # the reader left: nothing to say
    ],
    ids=plain_id,
)
def test_the_calculators_lines_for_an_unwritable_output(capsys, monkeypatch, stdout, error):
    monkeypatch.setattr(sys, "stdout", stdout)
    status = calcul_forfaits.main(["--gpu", "b200", "--days", "7"])
    said = f"calcul_forfaits.py: error: cannot write the output: {error}\n" if error else ""
    assert (status, capsys.readouterr().err) == (1, said)


def test_an_interrupt_while_computing_gives_the_calculators_line_and_130(capsys, monkeypatch):
    def interrupted(path=None):
        raise KeyboardInterrupt

    monkeypatch.setattr(calcul_forfaits, "load_catalog", interrupted)
    assert call(capsys, "--list") == (130, "", "calcul_forfaits.py: interrupted (Ctrl-C); nothing written\n")


def test_an_unwritable_stdout_is_pointed_at_the_null_device(monkeypatch):
    """The interpreter's last flush then has nowhere to fail; only its own stdout is touched."""
    import types

    reader, writer = os.pipe()
    open_before = sorted(os.listdir("/proc/self/fd")) if os.path.isdir("/proc/self/fd") else None
    real = sys.__stdout__  # still written by pytest and mutmut while the test runs
    stream = types.SimpleNamespace(fileno=lambda: writer, write=real.write, flush=real.flush)
    failure = BrokenPipeError(32, "Broken pipe")
    try:
        assert calcul_forfaits.GuardedStdout(stream).failed("calcul_forfaits.py", failure) == 1
        assert os.write(writer, b"kept") == 4  # not the interpreter's stdout: left alone
        assert os.read(reader, 10) == b"kept"
        monkeypatch.setattr(sys, "__stdout__", stream)
        assert calcul_forfaits.GuardedStdout(stream).failed("calcul_forfaits.py", failure) == 1
        assert os.write(writer, b"lost") == 4  # the null device takes it
    finally:
        os.close(writer)
    assert os.read(reader, 10) == b""  # the pipe's only writer was replaced: end of file
    os.close(reader)
    if open_before is not None:
        assert len(os.listdir("/proc/self/fd")) == len(open_before) - 2  # no descriptor leaked


# --- --list ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("price_cents", "expected"),
    [("15", "0.01"), ("45", "0.02"), ("9" * 30, None)],
    ids=["half-a-cent", "one-and-a-half-cents", "the-largest-price"],
)
def test_list_rounds_each_price_per_gpu_day_half_up_to_the_cent(tmp_path, capsys, price_cents, expected):
    """A 30-day lot of one GPU: 15 cents is half a cent a day, up to 0.01 (half-even would give 0.00)."""
    row = next(n for n, line in enumerate(GOOD.split(b"\n"), 1) if line.split(b",")[4:5] == [b"30"])
    gpu, gpus_per_lot = (
        GOOD.split(b"\n")[row - 1].decode().split(",")[0],
        int(GOOD.split(b"\n")[row - 1].split(b",")[3]),
    )
    (tmp_path / "c.csv").write_bytes(with_cell(row, "price_cents", price_cents.encode()))
    status, out, err = call(capsys, "--catalog", tmp_path / "c.csv", "--list", "--days", "30", "--json")
    assert (status, err) == (0, "")
    shown = next(r["usd_per_gpu_day"] for r in json.loads(out) if r["gpu"] == gpu)
    exact = Fraction(int(price_cents), 100 * 30 * gpus_per_lot)
    cents = (exact * 100 + Fraction(1, 2)).__floor__()
    assert shown == (expected or f"{cents // 100}.{cents % 100:02d}")
    if expected:
        assert gpus_per_lot == 1


def test_list_prints_the_catalog_with_price_per_gpu_day(capsys):
    status, out, _ = call(capsys, "--list")
    assert status == 0
    lines = out.splitlines()
    assert len(lines) == 1 + 45 + 2
    assert " ".join(lines[0].split()) == "gpu model memory_gb PyTorch GiB gpus_per_lot days lot price per GPU-day"
    b200_7 = next(line for line in lines if line.startswith("b200 ") and " 7 " in line)
    # 1824.00 / (7 days x 2 GPUs) = 130.285..., half-up
    assert b200_7.split() == ["b200", "NVIDIA", "B200", "180", "none", "2", "7", "1824.00", "USD", "130.29", "USD"]
    h200 = next(line for line in lines if line.startswith("h200 "))
    assert h200.split()[:5] == ["h200", "NVIDIA", "H200", "141", "139.80"]
    assert lines[-2] == "IteraGPU catalog snapshot of 2026-09-24; per GPU-day rounded half-up to the cent."
    assert lines[-1].startswith("memory_gb: as advertised; PyTorch GiB: total_memory as PyTorch reports it"), lines[-1]
    assert lines[-1].endswith("none: no figure recorded, --for-plan judges on memory_gb x 10**9 bytes."), lines[-1]
    assert all(not line.endswith(" ") for line in lines)
    status, out, _ = call(capsys, "--list", "--days", "7", "--json")
    rows = json.loads(out)
    assert status == 0
    assert len(rows) == 15
    assert {row["days"] for row in rows} == {7}
    assert [row["gpu"] for row in rows] == sorted(row["gpu"] for row in rows)
    assert next(row for row in rows if row["gpu"] == "b200")["usd_per_gpu_day"] == "130.29"
    figures = {row["gpu"]: (row["memory_gb"], row["pytorch_total_memory_bytes"]) for row in rows}
    assert (figures["h200"], figures["b200"]) == ((141, 150109880320), (180, None))


# --- the catalog's validation ----------------------------------------------------------------------

GOOD = CSV_PATH.read_bytes()
HEADER = GOOD.split(b"\n", 1)[0]
GPU_LINE_2 = GOOD.split(b"\n")[1].split(b",")[0].decode()


def replace_line(number, new):
    lines = GOOD.split(b"\n")
    lines[number - 1] = new
    return b"\n".join(lines)


def with_cell(number, column, value):
    """The shipped catalog with one cell changed (a column its header lacks: a cell added at the end)."""
    cells = GOOD.split(b"\n")[number - 1].split(b",")
    names = HEADER.decode().split(",")
    if column in names:
        cells[names.index(column)] = value
    else:
        cells.append(value)
    return replace_line(number, b",".join(cells))


SIXTEEN = "48 rows, expected 45 (15 models x 3 durations)"
CORRUPTIONS = {
    "duplicate row": (
        GOOD.replace(GOOD.split(b"\n")[2], GOOD.split(b"\n")[1]),
        "line 3",
        f"duplicate row for {GPU_LINE_2}, 3 days (first on line 2)",
    ),
    "missing row": (replace_line(3, b"").replace(b"\n\n", b"\n"), "", "has no row for 7 days"),
    "missing rows": (GOOD.replace(b"\n".join(GOOD.split(b"\n")[2:4]) + b"\n", b""), "", "has no row for 7, 30 days"),
    "a sixteenth model": (GOOD + b"".join(b"zz,ZZ,1,1,%d,100,USD,2026-09-24,\n" % d for d in (3, 7, 30)), "", SIXTEEN),
    "figure not a number": (
        with_cell(2, "pytorch_total_memory_bytes", b"79.25"),
        "line 2",
        "pytorch_total_memory_bytes",
    ),
    "zero figure": (with_cell(2, "pytorch_total_memory_bytes", b"0"), "line 2", "pytorch_total_memory_bytes"),
    "inconsistent figure": (
        with_cell(3, "pytorch_total_memory_bytes", b"85088670843"),
        "line 3",
        f"pytorch_total_memory_bytes of {GPU_LINE_2}",
    ),
    "decimal cents": (with_cell(2, "price_cents", b"9400.50"), "line 2", "price_cents"),
    "inconsistent lot size": (with_cell(3, "gpus_per_lot", b"2"), "line 3", f"gpus_per_lot of {GPU_LINE_2}"),
    "inconsistent model": (with_cell(3, "model", b"Other"), "line 3", f"model of {GPU_LINE_2}"),
    "prorated duration": (with_cell(2, "days", b"5"), "line 2", "days"),
    "other currency on one row": (with_cell(5, "currency", b"EUR"), "line 5", "currency must be USD"),
    "other snapshot on line 3": (
        with_cell(3, "snapshot_date", b"2026-09-25"),
        "line 3",
        "snapshot_date differs from the first row's (2026-09-24)",
    ),
    "bad date": (with_cell(2, "snapshot_date", b"24/09/2026"), "line 2", "snapshot_date"),
    "no such day": (with_cell(2, "snapshot_date", b"2026-02-29"), "line 2", "snapshot_date"),
    "bad header": (
        GOOD.replace(b"price_cents", b"price_usd", 1),
        "line 1",
        "bad header, expected gpu,model,memory_gb,gpus_per_lot,days,price_cents,currency,snapshot_date,"
        "pytorch_total_memory_bytes (the last one may be left out)",
    ),
    "missing field": (replace_line(2, b",".join(GOOD.split(b"\n")[1].split(b",")[:7])), "line 2", "fields"),
    "empty file": (b"", "", "empty file; nothing computed"),
    "header only": (HEADER + b"\n", "", "0 rows"),
    "not UTF-8": (GOOD.replace(b"NVIDIA A40", b"NVIDIA A4\xe9"), "", "not UTF-8"),
    "upper-case slug": (GOOD.replace(b"\nl4,", b"\nL4,"), "line", "slug"),
    "unclosed quote": (with_cell(2, "model", b'"NVIDIA'), "line 2", "malformed CSV"),
    "model with surrounding spaces": (with_cell(2, "model", b" NVIDIA X"), "line 2", "model must be"),
}


@pytest.mark.parametrize("kind", sorted(CORRUPTIONS))
def test_a_corrupted_catalog_is_refused_naming_file_line_and_reason(tmp_path, capsys, monkeypatch, kind):
    data, where, reason = CORRUPTIONS[kind]
    (tmp_path / "prices.csv").write_bytes(data)
    monkeypatch.chdir(tmp_path)
    line = calculator_refusal(capsys, "--catalog", "prices.csv", "--gpu", "h200", "--days", "7")
    for fragment in ("'prices.csv': ", where, reason, "; nothing computed"):
        assert fragment in line, (fragment, line)


def test_crlf_line_ends_and_a_missing_final_newline_are_accepted(tmp_path, capsys):
    (tmp_path / "crlf.csv").write_bytes(GOOD.replace(b"\n", b"\r\n"))
    (tmp_path / "no-final.csv").write_bytes(GOOD.rstrip(b"\n"))
    expected = call(capsys, "--gpu", "b200", "--days", "7")
    assert expected[0] == 0
    assert call(capsys, "--catalog", tmp_path / "crlf.csv", "--gpu", "b200", "--days", "7") == expected
    assert call(capsys, "--catalog", tmp_path / "no-final.csv", "--gpu", "b200", "--days", "7") == expected


def test_names_made_of_digits_stay_names(tmp_path, capsys):
    (tmp_path / "digits.csv").write_bytes(GOOD.replace(b"\nl4,NVIDIA L4,", b"\n4,4,"))
    status, out, err = call(capsys, "--catalog", tmp_path / "digits.csv", "--gpu", "4", "--days", "3", "--json")
    assert status == 0, err
    assert (json.loads(out)["gpu"], json.loads(out)["model"]) == ("4", "4")


def without_the_figures():
    """The shipped catalog as a user might have made it: the eight columns, no PyTorch figure."""
    return b"\n".join(line.rsplit(b",", 1)[0] for line in GOOD.split(b"\n") if line) + b"\n"


def test_a_catalog_without_pytorch_figures_loads_and_every_card_rests_on_its_nominal_memory(tmp_path, capsys):
    (tmp_path / "mine.csv").write_bytes(without_the_figures())
    status, out, err = call(capsys, "--catalog", tmp_path / "mine.csv", "--list", "--days", "7", "--json")
    assert (status, err) == (0, "")
    assert {row["pytorch_total_memory_bytes"] for row in json.loads(out)} == {None}
    assert call(capsys, "--catalog", tmp_path / "mine.csv", "--gpu", "b200", "--days", "7")[0] == 0
    plan = tmp_path / "plan.json"
    import mesure_memoire

    assert mesure_memoire.main(["measure", "--plan", "--json"]) == 0
    plan.write_text(capsys.readouterr().out)
    status, out, err = call(capsys, "--catalog", tmp_path / "mine.csv", "--for-plan", plan, "--days", "7", "--json")
    assert (status, err) == (0, "")
    cards = json.loads(out)["cards"]
    assert {card["judged_on"] for card in cards} == {"memory_gb x 10**9 (nominal)"}
    assert all(card["judged_memory_bytes"] == card["memory_gb"] * 10**9 for card in cards)
    status, text, _ = call(capsys, "--catalog", tmp_path / "mine.csv", "--for-plan", plan, "--days", "7")
    assert sum("yes*" in line.split() for line in text.splitlines()[3:18]) == 15, text
    assert text.splitlines()[-1].startswith("*: no PyTorch figure recorded: judged on the nominal memory_gb"), text


def with_every_figure():
    """The shipped catalog with a PyTorch figure on every row: each empty cell given the nominal bytes."""
    lines = []
    for line in GOOD.split(b"\n"):
        cells = line.split(b",")
        if line and not cells[-1]:
            cells[-1] = str(int(cells[2]) * 10**9).encode()
        lines.append(b",".join(cells))
    return b"\n".join(lines)


def test_no_card_resting_on_a_nominal_figure_means_no_note_about_it(tmp_path, capsys):
    import mesure_memoire

    (tmp_path / "all.csv").write_bytes(with_every_figure())
    assert mesure_memoire.main(["measure", "--plan", "--json"]) == 0
    (tmp_path / "plan.json").write_text(capsys.readouterr().out)
    status, text, err = call(
        capsys, "--catalog", tmp_path / "all.csv", "--for-plan", tmp_path / "plan.json", "--days", "7"
    )
    assert (status, err) == (0, "")
    assert "yes*" not in text and "no*" not in text
    assert "nominal" not in text, text


def test_the_catalog_s_pytorch_figures_are_the_maintainers_record_s():
    """validation/card-memory.md gives each card's figure, or none, with its source; the H200's is the project's
    own run's total_memory."""
    record = (SHIPPED_ROOT / "validation" / "card-memory.md").read_text(encoding="utf-8")  # not in mutmut's copy
    rows = {row["gpu"]: row for row in csv_rows() if row["days"] == "3"}
    for gpu, row in rows.items():
        line = next((line for line in record.splitlines() if line.startswith(f"| `{gpu}` |")), None)
        assert line is not None, gpu
        figure = row["pytorch_total_memory_bytes"]
        assert (f"| {int(figure):,} |" if figure else "| none |") in line, (gpu, line)
    evidence = (SHIPPED_ROOT / "validation/h200-2026-12-04/rerun/m-float16.json").read_text(encoding="utf-8")
    evidence = json.loads(evidence)
    assert evidence["environment"]["gpu"]["name"] == "NVIDIA H200"
    assert int(rows["h200"]["pytorch_total_memory_bytes"]) == evidence["environment"]["gpu"]["total_memory_bytes"]


def test_a_quoted_model_name_is_read_as_csv(tmp_path, capsys):
    data = GOOD.replace(b",NVIDIA H200,", b',"NVIDIA H200, ""141 GB""",')
    (tmp_path / "quoted.csv").write_bytes(data)
    status, out, err = call(capsys, "--catalog", tmp_path / "quoted.csv", "--gpu", "h200", "--days", "7")
    assert status == 0, err
    assert out.startswith('Package: NVIDIA H200, "141 GB" (h200), 7 days')


def test_a_missing_catalog_is_refused(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    line = calculator_refusal(capsys, "--catalog", "absent.csv", "--list")
    assert "'absent.csv': cannot be read (No such file or directory); nothing computed" in line


def test_the_default_catalog_is_found_from_another_working_folder(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    status, out, _ = call(capsys, "--gpu", "l4", "--days", "3", "--json")
    assert status == 0
    assert json.loads(out)["lot_price_cents"] == int(
        next(row for row in csv_rows() if (row["gpu"], row["days"]) == ("l4", "3"))["price_cents"]
    )


def test_a_refusal_of_the_default_catalog_names_it_without_its_path(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(calcul_forfaits, "__file__", str(tmp_path / "calcul_forfaits.py"))
    line = calculator_refusal(capsys, "--list")
    assert "'tarifs-forfaits.csv': cannot be read" in line
    assert str(tmp_path) not in line


def test_the_reader_takes_exactly_the_bound_and_refuses_one_byte_more(tmp_path):
    (tmp_path / "ten").write_bytes(b"0123456789")
    (tmp_path / "eleven").write_bytes(b"0123456789A")
    (tmp_path / "empty").write_bytes(b"")
    assert calcul_forfaits.read_bounded(tmp_path / "ten", "'ten'", limit=10) == b"0123456789"
    assert calcul_forfaits.read_bounded(tmp_path / "empty", "'empty'", limit=10) == b""
    with pytest.raises(calcul_forfaits.PricingError, match="^'eleven': larger than 10 bytes; nothing computed$"):
        calcul_forfaits.read_bounded(tmp_path / "eleven", "'eleven'", limit=10)
    assert calcul_forfaits.MAX_TABLE_BYTES == 2**20
    assert calcul_forfaits.MAX_MEASUREMENT_BYTES == 64 * 2**20


def test_the_reader_opens_without_blocking(tmp_path, monkeypatch):
    """A FIFO must not block the open: the flag is checked here, the FIFO itself in test_hostile_forfaits."""

    flags = []
    real_open = os.open
    monkeypatch.setattr(os, "open", lambda path, flag, *rest: flags.append(flag) or real_open(path, flag, *rest))
    (tmp_path / "f").write_bytes(b"x")
    assert calcul_forfaits.read_bounded(tmp_path / "f", "'f'") == b"x"
    assert flags == [os.O_RDONLY | os.O_NONBLOCK]


def test_the_reader_gathers_short_reads_and_stops_one_byte_past_the_bound(tmp_path, monkeypatch):
    """Short reads (4 bytes at most here) are gathered; a file over the bound is refused after reading
    one byte past it at most, never the whole file."""
    pieces, real_read = [], os.read

    def short_read(fd, size):
        pieces.append(real_read(fd, min(size, 4)))
        return pieces[-1]

    monkeypatch.setattr(os, "read", short_read)
    (tmp_path / "nine").write_bytes(b"012345678")
    (tmp_path / "thirty").write_bytes(b"x" * 30)
    assert calcul_forfaits.read_bounded(tmp_path / "nine", "'nine'", limit=10) == b"012345678"
    pieces.clear()
    with pytest.raises(calcul_forfaits.PricingError, match="larger than 10 bytes"):
        calcul_forfaits.read_bounded(tmp_path / "thirty", "'thirty'", limit=10)
    assert sum(map(len, pieces)) <= 11


def test_a_read_error_is_one_refusal(tmp_path, monkeypatch):

    def broken(fd, size):
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(os, "read", broken)
    (tmp_path / "f").write_bytes(b"x")
    with pytest.raises(calcul_forfaits.PricingError, match=r"^'f': cannot be read \(Input/output error\)"):
        calcul_forfaits.read_bounded(tmp_path / "f", "'f'")


# --- hostile catalogs: one stderr line, exit 2, no file changed ------------------------------------------

LIMIT = calcul_forfaits.MAX_TABLE_BYTES


def every_row(column, value):
    """The shipped catalog with ``column`` set to ``value`` on every row."""
    index = calcul_forfaits.CATALOG_COLUMNS.index(column)
    lines = GOOD.decode().splitlines()
    rows = [line.split(",") for line in lines[1:]]
    for row in rows:
        row[index] = value
    return "\n".join([lines[0], *(",".join(row) for row in rows)]).encode() + b"\n"


HOSTILE_FILES = {  # name -> bytes (a regular file), or a callable that makes something else at that path
    "fifo": os.mkfifo,
    "folder": os.mkdir,
    "zero.csv": lambda path: os.symlink("/dev/zero", path),
    "big.csv": GOOD * (LIMIT // len(GOOD) + 1),
    "wide-digits.csv": every_row("snapshot_date", "２０２６-09-24"),
    "newline-model.csv": GOOD.replace(b",NVIDIA H200,", b',"NVIDIA\nH200",'),
    "escape-model.csv": GOOD.replace(b",NVIDIA H200,", b",NVIDIA \x1b[2JH200,"),
    "bom.csv": b"\xef\xbb\xbf" * 2 + GOOD,  # one byte order mark is skipped (test_results.py), not two
}


def make_files(folder, files):
    """Create ``files`` (name -> bytes, or a callable given the path) in ``folder``; returns it."""
    for name, content in files.items():
        if callable(content):
            content(str(folder / name))
        else:
            (folder / name).write_bytes(content)
    return folder


def kit_digest():
    return {path.name: hashlib.sha256(path.read_bytes()).hexdigest() for path in ROOT.iterdir() if path.is_file()}


HOSTILE_CATALOGS = {  # case -> (argv, fragment of the one stderr line)
    "larger than the bound": (["--catalog", "big.csv", "--list"], f"'big.csv': larger than {LIMIT} bytes"),
    "a folder": (["--catalog", "folder", "--list"], "'folder': not a regular file"),
    "name with a newline": (["--catalog", "a\nb.csv", "--list"], "'a\\nb.csv': cannot be read"),
    "name with a NUL": (["--catalog", "a\0b.csv", "--list"], "'a\\x00b.csv': cannot be read"),
    "snapshot in wide digits": (["--catalog", "wide-digits.csv", "--list"], "line 2: snapshot_date"),
    "model with a newline": (["--catalog", "newline-model.csv", "--list"], "line 20: malformed CSV"),
    "model with an escape": (["--catalog", "escape-model.csv", "--list"], "model holds a control"),
    "two byte-order marks": (["--catalog", "bom.csv", "--list"], "line 1: bad header"),
    "gpu with a newline": (["--gpu", "h200\n", "--days", "7"], "unknown GPU 'h200\\n'"),
    "gpu not UTF-8": (["--gpu", "\udcff", "--days", "7"], "unknown GPU '\\udcff'"),
    "days with a newline": (["--gpu", "h200", "--days", "7\n"], "got '7\\n'"),
    "lots in Arabic-Indic digits": (["--gpu", "h200", "--days", "7", "--lots", "٢"], "got '٢'"),
    "accepted results with a newline": (["--gpu", "h200", "--days", "7", "--accepted-results", "1\n2"], "'1\\n2'"),
    "flag given a value with a newline": (["--list", "--json=a\nb"], "ignored explicit argument 'a\\nb'"),
}


@pytest.mark.parametrize("case", sorted(HOSTILE_CATALOGS))
def test_a_hostile_catalog_or_value_is_one_line(tmp_path, capsys, monkeypatch, case):
    argv, fragment = HOSTILE_CATALOGS[case]
    monkeypatch.chdir(make_files(tmp_path, HOSTILE_FILES))
    before, kit = tree_digest(tmp_path), kit_digest()
    assert fragment in calculator_refusal(capsys, *argv)
    assert tree_digest(tmp_path) == before
    assert kit_digest() == kit


BLOCKING_CATALOGS = {  # a regression would block (FIFO) or read without end (/dev/zero): a timeout guards them
    "a FIFO": (["--catalog", "fifo", "--list"], "'fifo': not a regular file"),
    "/dev/zero": (["--catalog", "/dev/zero", "--list"], "'/dev/zero': not a regular file"),
    "a link to /dev/zero": (["--catalog", "zero.csv", "--list"], "'zero.csv': not a regular file"),
}


@pytest.mark.whole_kit
@pytest.mark.parametrize("case", sorted(BLOCKING_CATALOGS))
def test_a_catalog_that_could_block_is_refused_unread(tmp_path, case):
    argv, fragment = BLOCKING_CATALOGS[case]
    make_files(tmp_path, HOSTILE_FILES)
    before = tree_digest(tmp_path)
    completed = subprocess.run(
        [sys.executable, str(ROOT / "calcul_forfaits.py"), *argv],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=30,
    )
    assert_one_line_refusal(completed, "calcul_forfaits.py: error: ", fragment)
    assert tree_digest(tmp_path) == before


# --- the grammar of values, the bounded reader, the cross-version behaviour ------------------------------


@pytest.mark.parametrize(
    ("rule", "accepted", "refused"),
    [
        (
            "is_date",
            ["2026-09-24", "2024-02-29", "2000-02-29", "0001-01-01", "2026-12-31", "2026-04-30"],
            [
                "20260924",
                "2026-W39-4",
                "2026-9-24",
                "2026-09-24T00:00",
                "0000-01-01",
                "2026-13-01",
                "2026-00-10",
                "2026-01-00",
                "2026-02-29",
                "1900-02-29",
                "2026-04-31",
                "２０２６-09-24",
                "2026/09/24",
                " 2026-09-24",
                "2026-09-a4",
                "2026-09-+4",
                "2026-0+-24",
                "2026-+9-24",
                "+026-09-24",
            ],
        ),
        (
            "is_utc_time",
            ["2026-10-05T09:00:00Z", "2026-12-31T23:59:59Z", "2026-01-01T00:00:00Z"],
            [
                "2026-10-05T24:00:00Z",
                "2026-10-05T23:60:00Z",
                "2026-10-05T23:00:60Z",
                "2026-10-05T09:00:00",
                "2026-10-05t09:00:00Z",
                "2026-10-05 09:00:00Z",
                "2026-10-05T09:00:00+00:00",
                "2026-02-30T09:00:00Z",
                "2026-10-05T9:00:00Z",
                "2026-10-05T09-00-00Z",
                "2026-10-05T０9:00:00Z",
            ],
        ),
        (
            "is_slug",
            ["b200", "rtx-pro-6000", "a-b-c", "4090"],
            ["", "-a", "a-", "a--b", "B200", "a_b", "é", "a b", "-"],
        ),
    ],
)
def test_the_grammar_of_values(rule, accepted, refused):
    check = getattr(calcul_forfaits, rule)
    assert [value for value in accepted if not check(value)] == []
    assert [value for value in refused if check(value)] == []


def test_zero_is_a_whole_number_only_where_counts_allow_it():
    assert calcul_forfaits.is_whole("0", zero=True)
    assert not calcul_forfaits.is_whole("0")
    assert not calcul_forfaits.is_whole("00", zero=True)
    assert calcul_forfaits.is_whole("10", zero=True)


def test_every_month_has_its_length():
    lengths = {1: 31, 2: 28, 3: 31, 4: 30, 5: 31, 6: 30, 7: 31, 8: 31, 9: 30, 10: 31, 11: 30, 12: 31}
    for month, days in lengths.items():
        assert calcul_forfaits.is_date(f"2026-{month:02d}-{days:02d}"), month
        assert not calcul_forfaits.is_date(f"2026-{month:02d}-{days + 1:02d}"), month


# --- the snapshot itself -------------------------------------------------------------------------

# Memory (GB) and typical on-demand USD per GPU-hour, 2025-2026 (public hourly rates, ranges only; no one
# provider's price).
TYPICAL_ON_DEMAND = {
    "a100-80gb": (80, 1.2, 2.0),
    "a40": (48, 0.35, 0.6),
    "b200": (180, 4.0, 6.5),
    "b300": (288, 5.5, 8.0),
    "h100-pcie": (80, 1.9, 2.6),
    "h100-sxm": (80, 2.0, 3.5),
    "h200": (141, 3.0, 4.5),
    "l4": (24, 0.4, 0.8),
    "l40s": (48, 0.8, 1.3),
    "mi300x": (192, 1.5, 2.6),
    "rtx-4090": (24, 0.3, 0.7),
    "rtx-5090": (32, 0.7, 1.1),
    "rtx-6000-ada": (48, 0.7, 1.0),
    "rtx-a6000": (48, 0.4, 0.8),
    "rtx-pro-6000": (96, 1.5, 2.0),
}


def per_gpu_hour():
    """{gpu: {days: USD per GPU-hour as a Fraction}} from the shipped CSV."""
    table = {}
    for row in csv_rows():
        hours = 24 * int(row["days"]) * int(row["gpus_per_lot"])
        table.setdefault(row["gpu"], {})[int(row["days"])] = Fraction(int(row["price_cents"]), 100 * hours)
    return table


def test_the_snapshot_is_a_plausible_line_up():
    rows = csv_rows()
    assert len(rows) == 45
    assert {row["gpu"] for row in rows} == set(TYPICAL_ON_DEMAND)
    assert {row["gpu"]: int(row["memory_gb"]) for row in rows} == {gpu: t[0] for gpu, t in TYPICAL_ON_DEMAND.items()}
    assert {row["snapshot_date"] for row in rows} == {"2026-09-24"}
    assert {row["currency"] for row in rows} == {"USD"}
    assert all(int(row["price_cents"]) % 100 == 0 for row in rows)  # whole dollars, as a rate card shows them
    assert {row["gpu"]: row["gpus_per_lot"] for row in rows if row["gpus_per_lot"] != "1"} == {"b200": "2"}
    for gpu, hourly in per_gpu_hour().items():
        assert hourly[3] > hourly[7] > hourly[30], gpu  # longer packages cost less per GPU-hour
        _, low, high = TYPICAL_ON_DEMAND[gpu]
        assert low <= hourly[3] <= high, (gpu, float(hourly[3]))  # a prepaid block is not dearer than on demand
        assert hourly[30] >= Fraction(low) * Fraction(6, 10), (gpu, float(hourly[30]))
    per_day = {}
    for row in rows:
        per_day.setdefault(row["gpu"], []).append(Fraction(int(row["price_cents"]), int(row["days"])))
    assert all(days[0] > days[1] > days[2] for days in per_day.values())  # the CSV lists 3, 7, 30 in order


DISCOUNT_GROUPS = {  # as the README states them: (7-day range, 30-day range) in % per GPU-hour, about
    ("b300", "b200", "rtx-pro-6000", "rtx-5090"): ((2, 5), (6, 12)),
    ("h100-pcie", "h100-sxm", "h200"): ((5, 8), (14, 20)),
    ("a100-80gb", "a40", "rtx-a6000", "rtx-4090", "rtx-6000-ada", "l40s", "l4", "mi300x"): ((8, 12), (20, 30)),
}


def test_the_discounts_are_those_the_readme_states():
    hourly = per_gpu_hour()
    assert sorted(gpu for group in DISCOUNT_GROUPS for gpu in group) == sorted(hourly)
    for group, ranges in DISCOUNT_GROUPS.items():
        for gpu in group:
            for days, (low, high) in zip((7, 30), ranges, strict=True):
                discount = 100 * (1 - hourly[gpu][days] / hourly[gpu][3])
                assert low - Fraction(1, 2) <= discount <= high + Fraction(1, 2), (gpu, days, float(discount))
    contributing = (ROOT / "CONTRIBUTING.md").read_text(encoding="utf-8")
    assert "2–5 % at 7 days, 6–12 % at 30 days" in contributing
    assert "(5–8 %, 14–20 %)" in contributing
    assert "MI300X: 8–12 %, 20–30 %)" in contributing


def test_the_readme_explains_the_pricing_and_contributing_the_b300_choice():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    section = readme.split("## 4. Relate quality and cost", 1)[1].split("\n## ", 1)[0]
    for fragment in ("per GPU-hour", "on-demand", "not any provider's"):
        assert fragment in section, fragment
    contributing = (ROOT / "CONTRIBUTING.md").read_text(encoding="utf-8")
    for fragment in ("B300", "A100 40GB", "per GPU-hour"):
        assert fragment in contributing, fragment


# --- the template and the protocol ---------------------------------------------------------------


def test_the_raw_results_template_is_header_only_and_documented():
    text = (ROOT / "resultats-bruts.csv").read_text(encoding="utf-8")
    lines = text.splitlines()
    assert len(lines) == 1
    assert text.endswith("\n")
    columns = lines[0].split(",")
    assert tuple(columns) == calcul_forfaits.RESULTS_COLUMNS
    for required in ("gpu", "days", "lots", "rental_id", "driver_version", "measurement_sha256", "units_accepted"):
        assert required in columns
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    table = readme.split("| Column | What to write |", 1)[1].split("\n\n", 1)[0]
    for column in columns:
        assert f"`{column}`" in table, column


def test_the_protocol_holds_each_required_element():
    protocol = (ROOT / "protocole-qualite.md").read_text(encoding="utf-8")
    for element in (
        "useful unit",
        "Corpus of distinct units",
        "Quality metric",
        "Numeric acceptance threshold",
        "Evaluation method",
        "Number of runs",
        "before renting",
        "MLPerf",
        "DAWNBench",
        "first touch of the data",
        "without pauses",
        "same code serves the quality check and the timed run",
        "No best-of-many",
        "Seeds",
        "mesure_memoire.py environment",
        "nvidia-smi",
        "not new useful units",
        "Deviations",
        "--accepted-results",
        "What that figure does not show",
        "supplies no corpus and no quality measure",
        "rental_id",
    ):
        assert element in protocol, element
    assert COST_RULE.replace("total price / accepted results, ", "") in " ".join(protocol.split())
    assert protocol.count("____") >= 15  # blanks to fill, not answers
    assert protocol.rstrip().endswith("```console\npython calcul_forfaits.py --results mes-resultats.csv\n```")


# --- start-up, and every Python --------------------------------------------------------------------


def imported_modules(*args, cwd):
    """The modules ``python -X importtime ARGS`` imports (a new process: start-up is what is tested)."""
    completed = subprocess.run(
        [sys.executable, "-X", "importtime", *map(str, args)], capture_output=True, text=True, cwd=cwd, timeout=60
    )
    assert completed.returncode == 0, completed.stderr
    return {line.rsplit("|", 1)[1].strip() for line in completed.stderr.splitlines() if line.count("|") == 2}


@pytest.mark.whole_kit
def test_the_price_of_a_package_adds_only_light_standard_modules(tmp_path):
    """Start-up is a guard: what the calculator adds to whatever this interpreter loads at start is
    standard library (argparse and its needs), and json, decimal, csv, difflib, hashlib, fractions
    come only where they are used.  Nothing is assumed about what the interpreter itself imports."""
    bare = imported_modules("-c", "pass", cwd=tmp_path)
    script = ROOT / "calcul_forfaits.py"
    added = imported_modules(script, "--gpu", "b200", "--days", "7", cwd=tmp_path) - bare
    assert "argparse" in added | bare
    assert {name.partition(".")[0] for name in added} <= sys.stdlib_module_names, added
    lazy = {"json", "decimal", "csv", "difflib", "hashlib", "fractions", "torch", "numpy"}
    assert added & lazy == set()
    with_cost = imported_modules(script, "--gpu", "b200", "--days", "7", "--accepted-results", "3", cwd=tmp_path)
    assert "decimal" in with_cost  # a lazy import is seen when it happens
    assert "json" not in with_cost - bare


@pytest.mark.whole_kit
def test_the_answers_need_no_site_packages(tmp_path):
    """Standard library only, under -S; every CPython of the version matrix runs it (noxfile.py)."""
    python = sys.executable
    (tmp_path / "basic.csv").write_bytes(GOOD.replace(b"2026-09-24", b"20260924"))
    ok = run_script(
        "calcul_forfaits.py",
        "--gpu",
        "b200",
        "--days",
        "7",
        "--lots",
        "2",
        "--accepted-results",
        "3",
        python=python,
        python_flags=("-S",),
        cwd=tmp_path,
    )
    assert (ok.returncode, ok.stderr) == (0, "")
    assert "1216.00 USD = total price / 3 accepted results" in ok.stdout
    refused = run_script(
        "calcul_forfaits.py", "--catalog", "basic.csv", "--list", python=python, python_flags=("-S",), cwd=tmp_path
    )
    assert_one_line_refusal(refused, "'basic.csv': line 2: snapshot_date must be a date written YYYY-MM-DD")
