"""calcul_forfaits.py, the tariff snapshot, the raw-results template and the quality protocol."""

import csv
import json
from fractions import Fraction

import pytest

import calcul_forfaits
from conftest import ROOT, assert_one_line_refusal, run_script

CSV_PATH = ROOT / "tarifs-forfaits.csv"


def csv_rows():
    with CSV_PATH.open(encoding="utf-8", newline="") as stream:
        return list(csv.DictReader(stream))


def half_up_cents(fraction):
    """An independent half-up rounding to the cent, with fractions."""
    cents = (fraction * 100 + Fraction(1, 2)).__floor__()
    return f"{cents // 100}.{cents % 100:02d}"


# --- arithmetic --------------------------------------------------------------------------------


@pytest.mark.parametrize("lots", [1, 2, 3, 7])
def test_every_row_and_several_lot_counts(lots):
    catalog = calcul_forfaits.load_catalog()
    for row in csv_rows():
        package = calcul_forfaits.price_package(catalog, row["gpu"], int(row["days"]), lots, accepted_results=7)
        lot_cents = int(row["price_cents"])
        assert package["lot_price_cents"] == lot_cents
        assert package["total_price_cents"] == lot_cents * lots
        assert package["gpus"] == int(row["gpus_per_lot"]) * lots
        assert package["cost_per_accepted_result_usd"] == half_up_cents(Fraction(lot_cents * lots, 100 * 7))


@pytest.mark.parametrize(
    ("total_cents", "accepted", "expected"),
    [(100, 3, "0.33"), (200, 3, "0.67"), (1, 2, "0.01"), (5, 1000, "0.00"), (25, 10, "0.03"), (364800, 1, "3648.00")],
)
def test_cost_rounds_half_up_to_the_cent(total_cents, accepted, expected):
    tariff = calcul_forfaits.Tariff("x", "X", 1, 1, 3, total_cents, "USD", "2026-09-24")
    assert calcul_forfaits.price_package([tariff], "x", 3, 1, accepted)["cost_per_accepted_result_usd"] == expected
    assert half_up_cents(Fraction(total_cents, 100 * accepted)) == expected


def test_the_largest_valid_totals_are_rounded_exactly(tmp_path):
    biggest_cents = "9" * 18  # the most the catalog's validation accepts
    (tmp_path / "big.csv").write_bytes(with_cell(2, "price_cents", biggest_cents.encode()))
    lots, accepted = "9" * 18, "7"
    completed = run_script("calcul_forfaits.py", "--catalog", "big.csv", "--gpu", "a100-40gb", "--days", "3",
                           "--lots", lots, "--accepted-results", accepted, "--json", cwd=tmp_path)  # fmt: skip
    assert completed.returncode == 0, completed.stderr
    total = int(biggest_cents) * int(lots)
    assert json.loads(completed.stdout)["total_price_cents"] == total
    assert json.loads(completed.stdout)["cost_per_accepted_result_usd"] == half_up_cents(Fraction(total, 100 * 7))


def test_the_readme_example_and_its_output():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert "python calcul_forfaits.py --gpu b200 --days 7 --lots 2\n" in readme
    completed = run_script("calcul_forfaits.py", "--gpu", "b200", "--days", "7", "--lots", "2")
    assert completed.returncode == 0, completed.stderr
    shown = readme.split("```text\n", 1)[1].split("```", 1)[0]
    assert completed.stdout == shown
    assert "4 (2 per lot x 2 lot(s))" in completed.stdout  # the B200 lot holds two GPUs


def test_json_output_and_null_cost_without_accepted_results(tmp_path):
    completed = run_script("calcul_forfaits.py", "--gpu", "B200", "--days", "7", "--lots", "2", "--json", cwd=tmp_path)
    assert completed.returncode == 0, completed.stderr
    data = json.loads(completed.stdout)
    assert {k: data[k] for k in ("gpu", "days", "lots", "gpus_per_lot", "gpus", "lot_price_cents",
                                  "total_price_cents", "currency", "snapshot_date", "accepted_results",
                                  "cost_per_accepted_result_usd")} == {
        "gpu": "b200", "days": 7, "lots": 2, "gpus_per_lot": 2, "gpus": 4, "lot_price_cents": 182400,
        "total_price_cents": 364800, "currency": "USD", "snapshot_date": "2026-09-24", "accepted_results": None,
        "cost_per_accepted_result_usd": None,
    }  # fmt: skip
    with_count = run_script("calcul_forfaits.py", "--gpu", "b200", "--days", "7", "--lots", "2",
                            "--accepted-results", "3", "--json", cwd=tmp_path)  # fmt: skip
    assert json.loads(with_count.stdout)["cost_per_accepted_result_usd"] == "1216.00"


def test_text_output_states_the_snapshot_limits():
    completed = run_script("calcul_forfaits.py", "--gpu", "h200", "--days", "30", "--accepted-results", "120")
    out = completed.stdout
    assert "snapshot of 2026-09-24" in out and "no hourly proration" in out
    assert "proves neither current availability nor a reservation" in out
    assert "check the offer shown before buying" in out
    assert "rounded half-up to the cent" in out


def test_list_prints_the_catalog_with_price_per_gpu_day(tmp_path):
    completed = run_script("calcul_forfaits.py", "--list", cwd=tmp_path)
    assert completed.returncode == 0, completed.stderr
    assert len(completed.stdout.splitlines()) == 1 + 45 + 1
    b200_7 = next(line for line in completed.stdout.splitlines() if line.startswith("b200 ") and " 7 " in line)
    assert b200_7.split()[-2:] == ["130.29", "USD"]  # 1824.00 / (7 days x 2 GPUs) = 130.285..., half-up
    seven = run_script("calcul_forfaits.py", "--list", "--days", "7", "--json", cwd=tmp_path)
    rows = json.loads(seven.stdout)
    assert len(rows) == 15 and {row["days"] for row in rows} == {7}


# --- refusals ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "fragments"),
    [
        (["--gpu", "h300", "--days", "7"], ["unknown GPU 'h300'", "closest: h200", "--list"]),
        (["--gpu", "zzz", "--days", "7"], ["unknown GPU 'zzz'", "--list"]),
        (["--gpu", "h200", "--days", "5"], ["--days", "no proration"]),
        (["--gpu", "h200", "--days", "0"], ["--days"]),
        (["--gpu", "h200", "--days", "-7"], ["--days"]),
        (["--gpu", "h200", "--days", "7.0"], ["--days"]),
        (["--gpu", "h200"], ["--days is required"]),
        (["--gpu", "h200", "--days", "7", "--lots", "0"], ["--lots"]),
        (["--gpu", "h200", "--days", "7", "--lots", "-1"], ["--lots"]),
        (["--gpu", "h200", "--days", "7", "--lots", "1.5"], ["--lots"]),
        (["--gpu", "h200", "--days", "7", "--accepted-results", "0"], ["--accepted-results"]),
        (["--gpu", "h200", "--days", "7", "--accepted-results", "-3"], ["--accepted-results"]),
        (["--gpu", "h200", "--days", "7", "--accepted-results", "2.5"], ["--accepted-results"]),
        (["--gpu", "h200", "--days", "7", "--accepted-results", "many"], ["--accepted-results"]),
        (["--list", "--lots", "2"], ["--list"]),
        (["--list", "--gpu", "h200"], ["not allowed with"]),
        ([], ["--gpu", "--list"]),
    ],
)
def test_bad_options_are_refused(args, fragments):
    assert_one_line_refusal(run_script("calcul_forfaits.py", *args), *fragments)


# --- the catalog's validation ----------------------------------------------------------------------

GOOD = CSV_PATH.read_bytes()
HEADER = GOOD.split(b"\n", 1)[0]


def replace_line(number, new):
    lines = GOOD.split(b"\n")
    lines[number - 1] = new
    return b"\n".join(lines)


def with_cell(number, column, value):
    cells = GOOD.split(b"\n")[number - 1].split(b",")
    cells[calcul_forfaits.CATALOG_COLUMNS.index(column)] = value
    return replace_line(number, b",".join(cells))


CORRUPTIONS = {
    "duplicate row": (GOOD.replace(GOOD.split(b"\n")[2], GOOD.split(b"\n")[1]), "line 3", "duplicate row"),
    "missing row": (replace_line(3, b"").replace(b"\n\n", b"\n"), "", "has no row for 7 days"),
    "a sixteenth model": (GOOD + b"".join(b"zz,ZZ,1,1,%d,100,USD,2026-09-24\n" % d for d in (3, 7, 30)), "", "48 rows"),
    "decimal cents": (with_cell(2, "price_cents", b"9400.50"), "line 2", "price_cents"),
    "negative cents": (with_cell(2, "price_cents", b"-9400"), "line 2", "price_cents"),
    "empty cents": (with_cell(2, "price_cents", b""), "line 2", "price_cents"),
    "spaced cents": (with_cell(2, "price_cents", b"9 400"), "line 2", "price_cents"),
    "signed cents": (with_cell(2, "price_cents", b"+9400"), "line 2", "price_cents"),
    "zero cents": (with_cell(2, "price_cents", b"0"), "line 2", "price_cents"),
    "inconsistent lot size": (with_cell(3, "gpus_per_lot", b"2"), "line 3", "gpus_per_lot of a100-40gb"),
    "prorated duration": (with_cell(2, "days", b"5"), "line 2", "days"),
    "other currency": (with_cell(5, "currency", b"EUR"), "line 5", "currency"),
    "other snapshot": (with_cell(5, "snapshot_date", b"2026-09-25"), "line 5", "snapshot_date"),
    "bad date": (with_cell(2, "snapshot_date", b"24/09/2026"), "line 2", "snapshot_date"),
    "bad header": (GOOD.replace(b"price_cents", b"price_usd", 1), "line 1", "bad header"),
    "missing field": (replace_line(2, b"a100-40gb,NVIDIA A100 40GB,40,1,3,9400,USD"), "line 2", "fields"),
    "empty file": (b"", "", "empty file"),
    "header only": (HEADER + b"\n", "", "0 rows"),
    "not UTF-8": (GOOD.replace(b"NVIDIA A40", b"NVIDIA A4\xe9"), "", "not UTF-8"),
    "upper-case slug": (GOOD.replace(b"\nl4,", b"\nL4,"), "line", "slug"),
}  # fmt: skip


@pytest.mark.parametrize("kind", sorted(CORRUPTIONS))
def test_a_corrupted_catalog_is_refused_naming_file_line_and_reason(tmp_path, kind):
    data, where, reason = CORRUPTIONS[kind]
    (tmp_path / "prices.csv").write_bytes(data)
    completed = run_script(
        "calcul_forfaits.py", "--catalog", "prices.csv", "--gpu", "h200", "--days", "7", cwd=tmp_path
    )
    assert_one_line_refusal(completed, "prices.csv: ", where, reason, "nothing computed")


def test_a_missing_catalog_is_refused(tmp_path):
    completed = run_script("calcul_forfaits.py", "--catalog", "absent.csv", "--list", cwd=tmp_path)
    assert_one_line_refusal(completed, "absent.csv: cannot be read")


def test_the_default_catalog_is_found_from_another_working_folder(tmp_path):
    completed = run_script("calcul_forfaits.py", "--gpu", "l4", "--days", "3", "--json", cwd=tmp_path)
    assert completed.returncode == 0, completed.stderr
    assert json.loads(completed.stdout)["lot_price_cents"] == 4700


# --- the snapshot itself -------------------------------------------------------------------------

MARKET_USD_PER_GPU_HOUR = {  # public 2025-2026 ranges
    "h100-sxm": (2, 3.5), "h200": (3, 4.5), "b200": (4, 6.5), "a100-80gb": (1.2, 2), "l4": (0.4, 0.8),
    "rtx-4090": (0.3, 0.9),
}  # fmt: skip


def test_the_snapshot_is_a_plausible_line_up():
    rows = csv_rows()
    assert len(rows) == 45 and len({row["gpu"] for row in rows}) == 15
    by_gpu = {}
    for row in rows:
        by_gpu.setdefault(row["gpu"], {})[int(row["days"])] = row
    assert by_gpu["b200"][7]["gpus_per_lot"] == "2"
    for gpu, durations in by_gpu.items():
        assert sorted(durations) == [3, 7, 30]
        per_day = [Fraction(int(durations[d]["price_cents"]), d) for d in (3, 7, 30)]
        assert per_day[0] > per_day[1] > per_day[2], gpu  # longer packages cost less per day
        if gpu in MARKET_USD_PER_GPU_HOUR:
            low, high = MARKET_USD_PER_GPU_HOUR[gpu]
            for days, row in durations.items():
                hourly = Fraction(int(row["price_cents"]), 100 * 24 * days * int(row["gpus_per_lot"]))
                assert low <= hourly <= high, (gpu, days, float(hourly))


# --- the template and the protocol ---------------------------------------------------------------


def test_the_raw_results_template_is_header_only_and_documented():
    text = (ROOT / "resultats-bruts.csv").read_text(encoding="utf-8")
    lines = text.splitlines()
    assert len(lines) == 1 and text.endswith("\n")
    columns = lines[0].split(",")
    for required in ("gpu", "days", "lots", "driver_version", "measurement_sha256", "units_accepted", "threshold"):
        assert required in columns
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    for column in columns:
        assert f"`{column}`" in readme, column


def test_the_protocol_holds_each_required_element():
    protocol = (ROOT / "protocole-qualite.md").read_text(encoding="utf-8")
    for element in (
        "useful unit", "Corpus of distinct units", "Quality metric", "Numeric acceptance threshold",
        "Evaluation method", "Number of runs", "before renting", "MLPerf", "DAWNBench",
        "first touch of the data", "without pauses", "same code serves the quality check and the timed run",
        "No best-of-many", "Seeds", "mesure_memoire.py environment", "nvidia-smi", "not new useful units",
        "Deviations", "--accepted-results", "What that figure does not show",
        "supplies no corpus and no quality measure",
    ):  # fmt: skip
        assert element in protocol, element
    assert protocol.count("____") >= 15  # blanks to fill, not answers
