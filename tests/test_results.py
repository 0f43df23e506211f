"""calcul_forfaits.py --results: one price per rental, the cost per accepted result, every refusal,
hostile results and measurement files included.

In-process through main(argv); a new process only for a FIFO or /dev/zero that could block.  The
measurement files here are placeholders: only their SHA-256 matters to the calculator.
"""

import hashlib
import io
import json
import os
import shutil
import subprocess
import sys
from fractions import Fraction

import pytest

import calcul_forfaits
from conftest import ROOT, assert_one_line, assert_one_line_refusal, calculator_refusal, half_up_cost, tree_digest
from conftest import call_calculator as call

DATA = ROOT / "tests" / "data" / "results"
EXAMPLE = DATA / "resultats-exemple.csv"
COLUMNS = calcul_forfaits.RESULTS_COLUMNS
PRICES = {(t["gpu"], t["days"]): t["price_cents"] for t in calcul_forfaits.load_catalog()}


def row(**values):
    """One run's cells, defaults filled in (the measurement file must exist: see ``folder``)."""
    cells = {
        "run_id": "r1",
        "rental_id": "rent-1",
        "date_utc": "2026-10-05T09:00:00Z",
        "gpu": "h100-sxm",
        "days": "7",
        "lots": "1",
        "device": "cuda:0",
        "gpu_name": "GPU",
        "driver_version": "1",
        "torch_version": "2.13.0",
        "cuda_or_hip_build": "13.0",
        "measurement_file": "m.json",
        "measurement_sha256": M_SHA,
        "units_submitted": "100",
        "units_accepted": "90",
        "quality_metric": "exact match",
        "threshold": "0.9",
        "threshold_fixed_on": "2026-10-01",
        "wall_clock_hours": "2.5",
        "notes": "",
    }
    cells.update(values)
    assert tuple(cells) == COLUMNS
    return ",".join(cells.values())


M_BYTES = b'{"placeholder": "not a measurement"}\n'
M_SHA = hashlib.sha256(M_BYTES).hexdigest()


@pytest.fixture
def folder(tmp_path):
    (tmp_path / "m.json").write_bytes(M_BYTES)
    return tmp_path


HEADER = ",".join(COLUMNS)


def write(folder, *rows, header=HEADER):
    path = folder / "runs.csv"
    path.write_text("\n".join([header, *rows]) + "\n", encoding="utf-8")
    return path


# --- the table --------------------------------------------------------------------------------------


def test_the_readme_s_command_reads_a_filled_copy(capsys, tmp_path, monkeypatch):
    """The README runs --results on the renter's filled copy of the template (here the example, under the README's
    name, beside the result files it names), never on the blank template."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    command = next(line for line in readme.splitlines() if line.startswith("python calcul_forfaits.py --results "))
    filled = command.split()[-1]
    assert filled != "resultats-bruts.csv"
    shutil.copytree(DATA, tmp_path, dirs_exist_ok=True)
    shutil.copy(EXAMPLE, tmp_path / filled)
    monkeypatch.chdir(tmp_path)
    status, out, err = call(capsys, *command.split()[2:], "--json")
    assert (status, err) == (0, "")
    assert json.loads(out)["rentals"] == json.loads(call(capsys, "--results", str(EXAMPLE), "--json")[1])["rentals"]


def test_the_example_file_gives_each_rental_once_cheapest_first(capsys):
    status, out, err = call(capsys, "--results", EXAMPLE, "--json")
    assert status == 0, err
    data = json.loads(out)
    assert (data["quality_metric"], data["threshold"], data["currency"]) == ("exact match", "0.9", "USD")
    assert data["snapshot_date"] == "2026-09-24"
    runs = list(csv_rows(EXAMPLE))
    expected = []
    for rental_id in dict.fromkeys(r["rental_id"] for r in runs):
        mine = [r for r in runs if r["rental_id"] == rental_id]
        total = PRICES[(mine[0]["gpu"], int(mine[0]["days"]))] * int(mine[0]["lots"])
        accepted = sum(int(r["units_accepted"]) for r in mine)
        expected.append((Fraction(total, accepted), rental_id, total, len(mine), accepted))
    expected.sort()
    assert [r["rental_id"] for r in data["rentals"]] == [e[1] for e in expected]
    for rental, (cost, _, total, count, accepted) in zip(data["rentals"], expected, strict=True):
        assert rental["total_price_cents"] == total
        assert rental["runs"] == count
        assert rental["units_accepted"] == accepted
        assert rental["cost_per_accepted_result_usd"] == half_up_cost(cost / 100)
    assert any(rental["runs"] > 1 for rental in data["rentals"])  # the example shows a price counted once


def csv_rows(path):
    import csv

    with open(path, encoding="utf-8", newline="") as stream:
        yield from csv.DictReader(stream)


def test_a_rental_with_several_runs_counts_its_price_once(folder, capsys):
    path = write(
        folder,
        row(run_id="a", lots="2", units_accepted="90"),
        row(run_id="b", lots="2", units_accepted="7"),
        row(run_id="c", rental_id="rent-2", gpu="mi300x", units_accepted="1", units_submitted="1"),
    )
    status, out, err = call(capsys, "--results", path, "--json")
    assert status == 0, err
    first, second = json.loads(out)["rentals"]
    h100 = PRICES[("h100-sxm", 7)] * 2
    assert first == {
        "rental_id": "rent-1",
        "gpu": "h100-sxm",
        "model": "NVIDIA H100 SXM",
        "memory_gb": 80,
        "days": 7,
        "lots": 2,
        "gpus_per_lot": 1,
        "gpus": 2,
        "lot_price_cents": h100 // 2,
        "total_price_cents": h100,
        "currency": "USD",
        "snapshot_date": "2026-09-24",
        "runs": 2,
        "run_ids": ["a", "b"],
        "units_submitted": 200,
        "units_accepted": 97,
        "cost_per_accepted_result_usd": half_up_cost(Fraction(h100, 100 * 97)),
    }
    assert second["rental_id"] == "rent-2"
    assert second["cost_per_accepted_result_usd"] == cents(PRICES[("mi300x", 7)])
    status, text, _ = call(capsys, "--results", path)
    assert status == 0, err
    lines = text.splitlines()
    assert lines[0] == "Rentals, cheapest accepted result first; quality metric exact match, threshold 0.9:"
    assert (
        " ".join(lines[1].split())
        == "rental_id gpu days lots GPUs total price runs submitted accepted per accepted result"
    )
    cost = half_up_cost(Fraction(h100, 100 * 97))
    assert " ".join(lines[2].split()) == f"rent-1 h100-sxm 7 2 2 {cents(h100)} USD 2 200 97 {cost} USD"
    assert lines[3].split()[0] == "rent-2"
    assert lines[4:] == [
        "Each rental's whole price counts once, however many runs it hosted: IteraGPU catalog snapshot of "
        "2026-09-24, whole USD cents, no hourly proration.",
        "Cost per accepted result = total price / units accepted over the rental's runs, rounded half-up to four "
        "significant digits or to the cent, whichever is finer.",
    ]


def cents(value):
    return f"{value // 100}.{value % 100:02d}"


def test_no_accepted_unit_gives_null_and_sorts_last(folder, capsys):
    path = write(
        folder,
        row(run_id="a", rental_id="zero", units_accepted="0"),
        row(run_id="b", rental_id="some", gpu="b300", days="30", units_accepted="1"),
    )
    status, out, _ = call(capsys, "--results", path, "--json")
    rentals = json.loads(out)["rentals"]
    assert status == 0
    assert [r["rental_id"] for r in rentals] == ["some", "zero"]
    assert rentals[1]["cost_per_accepted_result_usd"] is None
    assert rentals[1]["units_accepted"] == 0
    assert "null when no unit was accepted" in json.loads(out)["cost_rounding"]
    status, text, _ = call(capsys, "--results", path)
    assert text.splitlines()[3].endswith("none accepted")


def test_the_order_is_exact_when_two_costs_round_to_the_same_cent(folder, capsys):
    price = PRICES[("h100-sxm", 7)]
    # price/n and price/(n+1) round to the same cent once n is large enough; the larger n is cheaper
    n = 10 * price
    path = write(
        folder,
        row(run_id="a", rental_id="a-first", units_submitted=str(n), units_accepted=str(n)),
        row(run_id="b", rental_id="b-second", units_submitted=str(n + 1), units_accepted=str(n + 1)),
        row(run_id="c", rental_id="c-tie", units_submitted=str(n + 1), units_accepted=str(n + 1)),
    )
    status, out, _ = call(capsys, "--results", path, "--json")
    rentals = json.loads(out)["rentals"]
    assert status == 0
    assert len({r["cost_per_accepted_result_usd"] for r in rentals}) == 1
    assert [r["rental_id"] for r in rentals] == ["b-second", "c-tie", "a-first"]


def test_quoted_notes_and_crlf_line_ends_are_read(folder, capsys):
    path = write(folder, row(notes='"slow, then fine; said ""ok"""'))
    path.write_bytes(path.read_bytes().replace(b"\n", b"\r\n"))
    status, out, err = call(capsys, "--results", path, "--json")
    assert status == 0, err
    assert json.loads(out)["rentals"][0]["run_ids"] == ["r1"]


@pytest.mark.parametrize("sub", ["sub", "Xeon-runs"])  # any first letter: a relative path is not refused by it
def test_the_measurement_path_is_relative_to_the_results_file(folder, capsys, monkeypatch, sub):
    (folder / sub).mkdir()
    shutil.move(folder / "m.json", folder / sub / "m.json")
    write(folder, row(measurement_file=f"{sub}/m.json"))
    monkeypatch.chdir(folder.parent)
    status, _, err = call(capsys, "--results", f"{folder.name}/runs.csv")
    assert status == 0, err


def test_an_uppercase_sha256_and_gpu_slug_are_accepted(folder, capsys):
    path = write(folder, row(measurement_sha256=M_SHA.upper(), gpu="H100-SXM"))
    status, out, err = call(capsys, "--results", path, "--json")
    assert status == 0, err
    assert json.loads(out)["rentals"][0]["gpu"] == "h100-sxm"


PAIR = (
    "measurement_file and measurement_sha256 go together: both given, or both empty for a run without "
    "a measurement file; nothing computed"
)

# --- refusals: one line naming the file, the line and the reason; nothing computed ---------------------

REFUSALS = {
    "bad header": (dict(header="run_id,date_utc"), [], f"line 1: bad header, expected {','.join(COLUMNS)}; nothing"),
    "old template header": (dict(header=",".join(c for c in COLUMNS if c != "rental_id")), [], "bad header"),
    "duplicate run_id": ({}, [row(), row()], "line 3: duplicate run_id 'r1' (first on line 2)"),
    "malformed date": ({}, [row(date_utc="2026-10-05 09:00")], "line 2: date_utc must be"),
    "malformed fixed-on date": ({}, [row(threshold_fixed_on="20261001")], "line 2: threshold_fixed_on must be"),
    "malformed number": ({}, [row(units_submitted="1e3")], "line 2: units_submitted must be a whole number"),
    "negative units": ({}, [row(units_accepted="-1")], "line 2: units_accepted must be"),
    "decimal hours with a comma": ({}, [row(wall_clock_hours='"2,5"')], "line 2: wall_clock_hours must be a number"),
    "non-numeric threshold": ({}, [row(threshold="high")], "line 2: threshold must be a number"),
    "malformed SHA-256": ({}, [row(measurement_sha256="abc")], "line 2: measurement_sha256 must be 64 hexadecimal"),
    "unknown package": ({}, [row(gpu="h300")], "line 2: gpu: unknown GPU 'h300'; closest: h200, b300, mi300x"),
    "a duration the catalog lacks": ({}, [row(days="5")], "line 2: days must be one of 3, 7, 30"),
    "zero lots": ({}, [row(lots="0")], "line 2: lots must be a whole positive number"),
    "a rental that changes gpu": ({}, [row(), row(run_id="r2", gpu="h200")], "line 3: rental 'rent-1' differs"),
    "a rental that changes days": ({}, [row(), row(run_id="r2", days="30")], "from line 2"),
    "a rental that changes lots": ({}, [row(), row(run_id="r2", lots="2")], "line 3: rental 'rent-1' differs"),
    "too many accepted": ({}, [row(units_accepted="101")], "line 2: units_accepted 101 exceeds units_submitted 100"),
    "fixed after the run": ({}, [row(threshold_fixed_on="2026-10-06")], "2: threshold_fixed_on 2026-10-06 is after"),
    "another metric": ({}, [row(), row(run_id="r2", quality_metric="F1")], "line 3: quality_metric or threshold"),
    "another threshold": (
        {},
        [row(), row(run_id="r2", threshold="0.95")],
        "line 3: quality_metric or threshold differs from line 2's: a cost per accepted result "
        "compares packages under one protocol only",
    ),
    "missing measurement": ({}, [row(measurement_file="absent.json")], "'absent.json': cannot be read"),
    "altered measurement": ({}, [row(measurement_sha256="0" * 64)], "'m.json': its SHA-256 differs"),
    "altered on a later line": (
        {},
        [row(), row(run_id="r2", measurement_sha256="0" * 64)],
        "line 3: measurement_file 'm.json': its SHA-256 differs from measurement_sha256",
    ),
    "absolute measurement path": ({}, [row(measurement_file="/etc/hostname")], "measurement_file must be a path"),
    "measurement outside the folder": ({}, [row(measurement_file="../m.json")], "line 2: measurement_file must be"),
    "backslash parent": ({}, [row(measurement_file="a\\..\\m.json")], "line 2: measurement_file must be"),
    "measurement is a folder": ({}, [row(measurement_file=".")], "line 2: measurement_file '.': not a regular file"),
    "empty rental_id": ({}, [row(rental_id="")], "line 2: rental_id must be a non-empty text"),
    "control character in notes": ({}, [row(notes="a\x1b[31mred")], "line 2: notes holds a control"),
    "a line break inside quotes": ({}, [row(notes='"two'), 'lines"'], "line 2: malformed CSV"),
    "too few fields": ({}, [row()[: row().rindex(",")]], "line 2: expected 20 fields, found 19"),
    "a blank line between runs": ({}, [row(), "", row(run_id="r2")], "line 3: expected 20 fields, found 1"),
    "a file without its SHA-256": ({}, [row(measurement_sha256="")], "line 2: " + PAIR),
    "a SHA-256 without its file": ({}, [row(measurement_file="")], "line 2: " + PAIR),
    "header only": ({}, [], "no run recorded yet (header only): add one row per real run"),
}


@pytest.mark.parametrize("kind", sorted(REFUSALS))
def test_a_bad_results_file_is_refused_in_one_line(folder, capsys, kind):
    options, rows, fragment = REFUSALS[kind]
    path = write(folder, *rows, **options)
    before = tree_digest(folder)
    status, out, err = call(capsys, "--results", path)
    assert (status, out) == (2, ""), err
    assert len(err.splitlines()) == 1, err
    assert err.startswith(f"calcul_forfaits.py: error: {str(path)!r}: "), err
    assert fragment in err, err
    assert err.endswith("; nothing computed\n"), err
    assert tree_digest(folder) == before


def test_the_shipped_template_says_that_no_run_is_recorded(capsys, monkeypatch):
    monkeypatch.chdir(ROOT)
    line = calculator_refusal(capsys, "--results", "resultats-bruts.csv")
    assert "'resultats-bruts.csv': no run recorded yet" in line


def test_the_results_use_the_catalog_given(folder, capsys):
    catalog = (ROOT / "tarifs-forfaits.csv").read_text(encoding="utf-8")
    (folder / "prices.csv").write_text(catalog.replace("2026-09-24", "2026-12-01"), encoding="utf-8")
    path = write(folder, row())
    status, out, err = call(capsys, "--results", path, "--catalog", folder / "prices.csv", "--json")
    assert status == 0, err
    assert json.loads(out)["snapshot_date"] == "2026-12-01"


def test_a_measurement_file_may_be_larger_than_a_table(folder, capsys):
    big = b"{}" + b" " * calcul_forfaits.MAX_TABLE_BYTES
    (folder / "big.json").write_bytes(big)
    path = write(folder, row(measurement_file="big.json", measurement_sha256=hashlib.sha256(big).hexdigest()))
    status, _, err = call(capsys, "--results", path)
    assert (status, err) == (0, "")


def test_a_threshold_fixed_on_the_day_of_the_run_is_before_it(folder, capsys):
    path = write(folder, row(threshold_fixed_on="2026-10-05", date_utc="2026-10-05T00:00:00Z"))
    status, _, err = call(capsys, "--results", path)
    assert (status, err) == (0, "")


@pytest.mark.parametrize(
    ("column", "accepted", "refused"),
    [
        (
            "measurement_file",
            ["m.json", "a/b.json", "a..b.json", "runs/2026/m.json", ""],
            ["/m.json", "\\m.json", "../m.json", "a/../m.json", "a\\..\\m.json", "..", "a/.."],
        ),
        ("measurement_sha256", ["0" * 64, "aF" * 32], ["0" * 63, "0" * 65, "g" * 64, " " + "0" * 63, " "]),
        ("rental_id", ["r", "rent 1"], ["", " r", "r "]),
        ("days", ["3", "7", "30"], ["", "5", "07", "3.0", "٣"]),
    ],
)
def test_the_results_rules(column, accepted, refused):
    check = calcul_forfaits.RESULTS_RULES[column][0]
    assert [value for value in accepted if not check(value)] == []
    assert [value for value in refused if check(value)] == []


# --- what a results file may hold: runs without a measurement file, a BOM, blank lines at the end -------


def test_a_run_without_a_measurement_file_is_recorded(folder, capsys):
    path = write(folder, row(run_id="own", measurement_file="", measurement_sha256=""), row(run_id="synthetic"))
    status, out, err = call(capsys, "--results", path, "--json")
    assert (status, err) == (0, "")
    assert json.loads(out)["rentals"][0]["run_ids"] == ["own", "synthetic"]
    table = (ROOT / "README.md").read_text(encoding="utf-8").split("| Column | What to write |", 1)[1]
    assert "both empty for a run with none" in table.split("\n\n", 1)[0]


@pytest.mark.parametrize(
    ("prefix", "suffix"),
    [(b"\xef\xbb\xbf", b""), (b"", b"\n"), (b"", b"\r\n"), (b"", b"\n \n\t\n"), (b"\xef\xbb\xbf", b"\n\n")],
    ids=["BOM", "blank line", "blank CRLF line", "blank lines with spaces", "BOM and blank lines"],
)
def test_a_byte_order_mark_and_blank_lines_at_the_end_are_read(folder, capsys, prefix, suffix):
    # as a spreadsheet or an editor saves them; the catalog given follows the same grammar
    path = write(folder, row(), row(run_id="r2"))
    path.write_bytes(prefix + path.read_bytes() + suffix)
    (folder / "prices.csv").write_bytes(prefix + (ROOT / "tarifs-forfaits.csv").read_bytes() + suffix)
    status, out, err = call(capsys, "--results", path, "--catalog", folder / "prices.csv", "--json")
    assert (status, err) == (0, "")
    assert json.loads(out)["rentals"][0]["run_ids"] == ["r1", "r2"]


def test_thresholds_equal_as_numbers_are_one_protocol_shown_as_first_written(folder, capsys):
    path = write(folder, row(threshold="0.90"), row(run_id="r2", threshold="0.9"), row(run_id="r3", threshold="0.900"))
    status, out, err = call(capsys, "--results", path)
    assert (status, err) == (0, "")
    assert out.splitlines()[0] == "Rentals, cheapest accepted result first; quality metric exact match, threshold 0.90:"
    status, out, _ = call(capsys, "--results", path, "--json")
    assert (status, json.loads(out)["threshold"]) == (0, "0.90")


# --- measurement files: inside the results file's folder once resolved, each read once, a bounded total -----

SECRET = b'{"outside": "the folder"}\n'
ESCAPES = {  # measurement_file -> the link that makes it resolve outside the results file's folder
    "out.json": ("out.json", "{outside}/secret.json"),
    "passwd": ("passwd", "/etc/passwd"),
    "up.json": ("up.json", "../outside/secret.json"),
    "sub/secret.json": ("sub", "{outside}"),
}


@pytest.fixture
def inside(tmp_path):
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside" / "secret.json").write_bytes(SECRET)
    (tmp_path / "outside" / "m.json").write_bytes(M_BYTES)
    (tmp_path / "inside").mkdir()
    (tmp_path / "inside" / "m.json").write_bytes(M_BYTES)
    return tmp_path / "inside"


@pytest.mark.parametrize("measurement_file", sorted(ESCAPES))
def test_a_measurement_file_resolving_outside_the_folder_is_refused_unnamed(inside, capsys, measurement_file):
    link, target = ESCAPES[measurement_file]
    os.symlink(target.format(outside=inside.parent / "outside"), inside / link)
    resolved = os.path.realpath(inside / measurement_file)
    if not os.path.isfile(resolved):
        pytest.skip("no /etc/passwd here")
    with open(resolved, "rb") as stream:  # the right SHA-256: only the folder can refuse it
        sha = hashlib.sha256(stream.read()).hexdigest()
    path = write(inside, row(measurement_file=measurement_file, measurement_sha256=sha))
    err = calculator_refusal(capsys, "--results", path)
    assert f"{str(path)!r}: line 2: measurement_file {measurement_file!r}: resolves outside the results" in err
    assert resolved not in err
    assert "/etc" not in err


def test_links_that_stay_inside_the_folder_are_followed(inside, capsys, monkeypatch):
    os.symlink("m.json", inside / "alias.json")
    os.symlink(".", inside / "again")
    os.symlink("inside", inside.parent / "via")
    rows = [row(run_id=name, measurement_file=name) for name in ("alias.json", "again/m.json", "again/again/m.json")]
    write(inside, *rows)
    monkeypatch.chdir(inside.parent)
    status, out, err = call(capsys, "--results", "via/runs.csv", "--json")
    assert (status, err) == (0, "")
    assert json.loads(out)["rentals"][0]["runs"] == 3


def test_a_measurement_file_named_on_many_lines_is_hashed_once(folder, capsys, monkeypatch):
    """Six lines name one file, by its name and through a link: it counts once against the hashing bound."""
    os.symlink("m.json", folder / "alias.json")
    monkeypatch.setattr(calcul_forfaits, "MAX_HASHED_BYTES", len(M_BYTES))  # room for one reading of it only
    path = write(folder, *[row(run_id=f"r{i}", measurement_file=("m.json", "alias.json")[i % 2]) for i in range(6)])
    status, out, err = call(capsys, "--results", path, "--json")
    assert (status, err) == (0, "")
    assert json.loads(out)["rentals"][0]["runs"] == 6


@pytest.mark.parametrize(("last", "refused"), [("a.json", False), ("b.json", True)])
def test_the_bytes_hashed_for_one_results_file_are_bounded(folder, capsys, monkeypatch, last, refused):
    # 256 MiB, about a second of hashing: a 1 MiB results file naming distinct 64 MiB files stops there
    assert calcul_forfaits.MAX_HASHED_BYTES == 4 * calcul_forfaits.MAX_MEASUREMENT_BYTES == 2**28
    bound = 2 * len(M_BYTES)
    monkeypatch.setattr(calcul_forfaits, "MAX_HASHED_BYTES", bound)
    (folder / "a.json").write_bytes(M_BYTES.upper())
    (folder / "b.json").write_bytes(b"b")
    files = ["m.json", "a.json", "m.json", last]
    shas = {name: hashlib.sha256((folder / name).read_bytes()).hexdigest() for name in files}
    path = write(
        folder,
        *[row(run_id=f"r{i}", measurement_file=name, measurement_sha256=shas[name]) for i, name in enumerate(files)],
    )
    status, out, err = call(capsys, "--results", path)
    if not refused:
        assert (status, err) == (0, "")  # m.json counted once: the total equals the bound
        return
    assert (status, out) == (2, "")
    where = f"{str(path)!r}: line 5: measurement_file 'b.json': "
    assert_one_line(err, where, f"more than {bound} bytes", prog="calcul_forfaits.py: error")
    assert err.endswith("; nothing computed\n")


# --- hostile results files: one stderr line, exit 2, no file changed --------------------------------------

LIMIT = calcul_forfaits.MAX_TABLE_BYTES


def hostile_row(measurement_file):
    return f"{HEADER}\n{row(measurement_file=measurement_file)}\n".encode()


HOSTILE_FILES = {  # name -> bytes (a regular file), or a callable that makes something else at that path
    "fifo": os.mkfifo,
    "folder": os.mkdir,
    "zero.csv": lambda path: os.symlink("/dev/zero", path),
    "runs-fifo.csv": hostile_row("fifo"),
    "runs-zero.csv": hostile_row("zero.csv"),
    "runs-folder.csv": hostile_row("folder"),
    "runs-big.csv": hostile_row("m.json") * (LIMIT // 400 + 1),
    "runs-latin1.csv": hostile_row("m\xe9.json").replace("m\xe9".encode(), b"m\xe9"),
}


@pytest.fixture
def hostile(folder):
    for name, content in HOSTILE_FILES.items():
        if callable(content):
            content(str(folder / name))
        else:
            (folder / name).write_bytes(content)
    return folder


HOSTILE_RESULTS = {  # case -> (argv, fragment of the one stderr line)
    "larger than the bound": (["--results", "runs-big.csv"], f"larger than {LIMIT} bytes"),
    "a folder": (["--results", "folder"], "'folder': not a regular file"),
    "name with a newline": (["--results", "r\n.csv"], "'r\\n.csv': cannot be read"),
    "not UTF-8": (["--results", "runs-latin1.csv"], "not UTF-8"),
    "measurement a folder": (["--results", "runs-folder.csv"], "measurement_file 'folder': not a regular file"),
}


@pytest.mark.parametrize("case", sorted(HOSTILE_RESULTS))
def test_a_hostile_results_file_is_one_line(hostile, capsys, monkeypatch, case):
    argv, fragment = HOSTILE_RESULTS[case]
    monkeypatch.chdir(hostile)
    before = tree_digest(hostile)
    assert fragment in calculator_refusal(capsys, *argv)
    assert tree_digest(hostile) == before


BLOCKING_RESULTS = {  # a regression would block (FIFO) or read without end (/dev/zero): a timeout guards them
    "a FIFO": (["--results", "fifo"], "'fifo': not a regular file"),
    "/dev/zero": (["--results", "/dev/zero"], "'/dev/zero': not a regular file"),
    "measurement a FIFO": (["--results", "runs-fifo.csv"], "measurement_file 'fifo': not a regular file"),
    "measurement a link to /dev/zero": (["--results", "runs-zero.csv"], "measurement_file 'zero.csv': resolves out"),
}


@pytest.mark.whole_kit
@pytest.mark.parametrize("case", sorted(BLOCKING_RESULTS))
def test_a_results_file_that_could_block_is_refused_unread(hostile, case):
    argv, fragment = BLOCKING_RESULTS[case]
    before = tree_digest(hostile)
    completed = subprocess.run(
        [sys.executable, str(ROOT / "calcul_forfaits.py"), *argv],
        capture_output=True,
        text=True,
        cwd=hostile,
        timeout=30,
    )
    assert_one_line_refusal(completed, "calcul_forfaits.py: error: ", fragment)
    assert tree_digest(hostile) == before


def test_a_table_the_terminal_cannot_encode_is_written_escaped(folder, capsys, monkeypatch):
    path = write(folder, row(rental_id="rent-é"))
    ascii_out = io.TextIOWrapper(io.BytesIO(), encoding="ascii")
    monkeypatch.setattr(sys, "stdout", ascii_out)
    status = calcul_forfaits.main(["--results", str(path)])
    assert (status, capsys.readouterr().err) == (0, "")
    ascii_out.flush()
    assert "rent-\\xe9" in ascii_out.buffer.getvalue().decode("ascii")


def test_the_protocol_runs_results_on_the_renter_s_filled_copy_not_the_blank_template():
    protocol = (ROOT / "protocole-qualite.md").read_text(encoding="utf-8")
    section = protocol.split("## 9.", 1)[1]
    commands = [line for line in section.splitlines() if line.startswith("python calcul_forfaits.py --results ")]
    assert len(commands) == 1, commands
    filled = commands[0].split()[-1]
    assert filled != "resultats-bruts.csv", "the blank template holds no run: --results refuses it"
    assert f"`{filled}`" in section, "the section names the filled copy it runs on"
