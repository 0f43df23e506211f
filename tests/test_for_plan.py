"""`calcul_forfaits.py --for-plan`: which catalog GPU holds a planned run, from a real plan file written by
`mesure_memoire.py measure --plan --json`, and the refusal of anything that is not such a plan."""

import csv
import io
import json
import subprocess
import sys

import pytest

import mesure_memoire
from conftest import (
    ROOT,
    assert_one_line,
    assert_one_line_refusal,
    calculator_refusal,
    call_calculator,
    plain_id,
)

LARGE_RUN = ["measure", "--batch", "2", "--context", "128", "--width", "60000", "--dtype", "float32", "--plan"]


def plan_file(tmp_path, capsys, *extra, run=LARGE_RUN):
    """A real plan: measure --plan --json's output, written to a file; returns its path and its JSON."""
    assert mesure_memoire.main([*run, "--json", *extra]) in (0, 3)
    text = capsys.readouterr().out
    path = tmp_path / "plan.json"
    path.write_text(text)
    return path, json.loads(text)


def catalog_rows(days):
    with open(ROOT / "tarifs-forfaits.csv", newline="") as handle:
        return [row for row in csv.DictReader(handle) if row["days"] == str(days)]


def judged_bytes(row):
    """A catalog row's memory as the verdict counts it: PyTorch's figure, else the nominal GB (marked)."""
    figure = row.get("pytorch_total_memory_bytes")
    return int(figure) if figure else int(row["memory_gb"]) * 10**9


def test_every_model_of_the_catalog_once_fitting_and_cheapest_first_then_the_closest(tmp_path, capsys):
    path, plan = plan_file(tmp_path, capsys)
    status, out, err = call_calculator(capsys, "--for-plan", path, "--days", "7", "--json")
    assert (status, err) == (0, "")
    data = json.loads(out)
    needs = plan["needs_card_memory_bytes"]
    assert needs == 118170079232
    assert data["needs_card_memory_bytes"] == needs
    assert data["configuration"] == {"batch": 2, "context": 128, "width": 60000, "dtype": "float32"}
    assert data["needs_host_memory_bytes"] == plan["needs_host_memory_bytes"] == 115201200000
    expected = []
    for row in catalog_rows(7):  # each card judged on PyTorch's figure, or marked as resting on the nominal one
        memory_bytes, figure = judged_bytes(row), row["pytorch_total_memory_bytes"]
        judged_on = "pytorch_total_memory_bytes" if figure else "memory_gb x 10**9 (nominal)"
        figures = (int(row["memory_gb"]), int(figure) if figure else None, judged_on)
        expected.append(
            (row["gpu"], memory_bytes, needs <= memory_bytes, memory_bytes - needs, int(row["price_cents"]), *figures)
        )
    fitting = sorted((e for e in expected if e[2]), key=lambda e: e[4])
    others = sorted((e for e in expected if not e[2]), key=lambda e: (-e[3], e[4]))
    cards = data["cards"]
    keys = ("gpu", "judged_memory_bytes", "fits", "room_bytes", "lot_price_cents", "memory_gb")
    keys += ("pytorch_total_memory_bytes", "judged_on")
    assert [tuple(c[key] for key in keys) for c in cards] == [*fitting, *others]
    assert [c["gpu"] for c in cards[:5]] == ["mi300x", "h200", "b300", "b200", "rtx-pro-6000"]
    assert [c["gpu"] for c in cards[5:8]] == ["a100-80gb", "h100-sxm", "h100-pcie"]  # 79.24, 79.10, 74.51 GiB
    # Equal room: the cheaper first (a40 58.00, rtx-a6000 72.00 USD, both on their nominal 48 GB).
    assert [c["gpu"] for c in cards if c["judged_memory_bytes"] == 48 * 10**9] == ["a40", "rtx-a6000"]
    b200 = next(c for c in cards if c["gpu"] == "b200")
    assert (b200["gpus_per_lot"], b200["lot_price_cents"], data["gpus_per_run"]) == (2, 182400, 1)
    assert (data["days"], data["currency"], data["snapshot_date"]) == (7, "USD", "2026-09-24")


def exact_gib(memory_bytes):
    """Bytes as GiB written exactly (a power of two divides them: at most 30 decimals)."""
    from decimal import Context, Decimal

    return f"{Context(prec=80).divide(Decimal(memory_bytes), Decimal(2**30)):f}"


def test_memory_gib_and_for_plan_agree_on_every_card_at_its_edge(tmp_path, capsys):
    """For each card, its exact figure as --memory-gib: the largest context that fits and one more; the
    calculator's verdict on each of those plans is measure's (exit 0 fits, 3 does not)."""
    plan_path = tmp_path / "plan.json"
    for row in catalog_rows(7):
        gib = exact_gib(judged_bytes(row))
        assert mesure_memoire.main(["measure", "--width", "8192", "--plan", "--memory-gib", gib, "--json"]) in (0, 3)
        largest = json.loads(capsys.readouterr().out)["largest"]["context"]
        for context in (largest, largest + 1):
            run = ["measure", "--context", str(context), "--width", "8192", "--plan", "--memory-gib", gib, "--json"]
            status = mesure_memoire.main(run)
            plan_path.write_text(capsys.readouterr().out)
            assert status == (0 if context == largest else 3), (row["gpu"], context)
            _, out, _ = call_calculator(capsys, "--for-plan", plan_path, "--days", "7", "--json")
            card = next(card for card in json.loads(out)["cards"] if card["gpu"] == row["gpu"])
            assert card["fits"] is (status == 0), (row["gpu"], context, status)


def test_the_80_and_141_gb_cards_hold_a_run_that_fits_their_recorded_figure(tmp_path, capsys):
    """Issue 54's plan: 76.25 GiB fits --memory-gib 80, and the 80 GB A100 and H100 SXM and the H200, whose
    PyTorch figures are recorded; the cheapest card that holds it is the A100 80GB, not an MI300X."""
    issue_run = ["measure", "--batch", "64", "--context", "4096", "--width", "8192", "--plan"]
    path, plan = plan_file(tmp_path, capsys, "--memory-gib", "80", run=issue_run)
    assert plan["fits"] is True
    status, out, _ = call_calculator(capsys, "--for-plan", path, "--days", "7", "--json")
    cards = json.loads(out)["cards"]
    fits = {card["gpu"]: card["fits"] for card in cards}
    assert (fits["a100-80gb"], fits["h100-sxm"], fits["h200"]) == (True, True, True)
    assert (cards[0]["gpu"], cards[0]["lot_price_cents"]) == ("a100-80gb", 22000)


TEXT_HEAD = """\
Plan: batch 2, context 128, width 60000, float32; one card needs 118170079232 bytes = 110.05 GiB = 118.17 GB; the \
host needs 115201200000 bytes = 107.29 GiB of RAM.
One GPU per run, 7-day packages; those that hold the run first, cheapest first, then the closest:
gpu           model                           memory GB  PyTorch GiB  holds the run     room GiB      room GB \
 GPUs per lot    lot price
mi300x        AMD Instinct MI300X                   192         none           yes*   68.76 left   73.83 left \
            1   271.00 USD
h200          NVIDIA H200                           141       139.80            yes   29.75 left   31.94 left \
            1   573.00 USD"""
TEXT_TAIL = """\
l4            NVIDIA L4                              24         none            no*  87.70 short  94.17 short \
            1    64.00 USD
Lot price: one lot for 7 days, whatever its GPUs (the run uses one); IteraGPU catalog snapshot of 2026-09-24, whole \
USD cents.
PyTorch GiB: total_memory as PyTorch reports it (the catalog's pytorch_total_memory_bytes); a card holds the run \
when it covers needs_card_memory_bytes, as measure --plan --memory-gib judges.
*: no PyTorch figure recorded: judged on the nominal memory_gb x 10**9 bytes, which PyTorch may not see whole; \
environment on the rented box gives its figure, a measure there is the proof.
"""


def test_the_text_from_the_same_data(tmp_path, capsys):
    path, _ = plan_file(tmp_path, capsys)
    status, out, err = call_calculator(capsys, "--for-plan", path, "--days", "7")
    assert (status, err) == (0, "")
    assert out.startswith(TEXT_HEAD + "\n")
    assert out.endswith(TEXT_TAIL)
    assert len(out.splitlines()) == 2 + 1 + 15 + 3


def test_a_plan_with_memory_gib_and_standard_input(tmp_path, capsys, monkeypatch):
    path, plan = plan_file(tmp_path, capsys, "--memory-gib", "80")  # does not fit 80 GiB: exit 3, plan printed
    assert plan["fits"] is False
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(path.read_bytes())))
    status, out, err = call_calculator(capsys, "--for-plan", "-", "--days", "30")
    assert (status, err) == (0, "")
    assert out.startswith("Plan: batch 2, context 128, width 60000")
    assert "One GPU per run, 30-day packages;" in out
    assert "Lot price: one lot for 30 days" in out


def plan_text(**changes):
    plan = mesure_memoire.memory_plan(mesure_memoire.measure_config(None, 1, 16, 64, "float32", 1, 2, 0))
    plan.update(changes)
    return json.dumps({key: value for key, value in plan.items() if value != "DROP"})


# The facts of why a file is not a plan this calculator reads.
NOT_A_PLAN = ["not a plan", "mesure_memoire.py measure --plan --json"]
ENCODING = ["not a plan: neither UTF-8 nor UTF-16 with a byte order mark"]
INVALID = ["a missing or invalid configuration or needs figure"]


def unknown_schema(version):
    return [f"plan_schema_version {version} is not one this calculator reads (1)"]


# What Windows PowerShell 5.1's ">" writes (UTF-16 LE, a byte order mark, CRLF), and UTF-8 with a byte order mark.
WINDOWS_ENCODINGS = {
    "utf-16-le with bom and crlf": lambda text: b"\xff\xfe" + text.replace("\n", "\r\n").encode("utf-16-le"),
    "utf-16-be with bom": lambda text: b"\xfe\xff" + text.encode("utf-16-be"),
    "utf-8 with bom": lambda text: b"\xef\xbb\xbf" + text.encode("utf-8"),
}


@pytest.mark.parametrize("encoding", list(WINDOWS_ENCODINGS), ids=plain_id)
def test_a_plan_saved_by_windows_powershell_or_with_a_byte_order_mark_is_read(tmp_path, capsys, monkeypatch, encoding):
    """A real plan, re-encoded as Windows writes it: the same answer as from its UTF-8 bytes, file or stdin."""
    path, _ = plan_file(tmp_path, capsys)
    expected = call_calculator(capsys, "--for-plan", path, "--days", "7", "--json")
    saved = tmp_path / "saved.json"
    saved.write_bytes(WINDOWS_ENCODINGS[encoding](path.read_text()))
    assert call_calculator(capsys, "--for-plan", saved, "--days", "7", "--json") == expected
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(saved.read_bytes())))
    assert call_calculator(capsys, "--for-plan", "-", "--days", "7", "--json") == expected


def test_a_30_digit_need_is_shown_exactly_in_gib(tmp_path, capsys):
    """The quotient is rounded once, half-up to the cent: 28 digits would round it twice (…0.0049999999 to
    …0.0050000, then up to …0.01)."""
    needs = 10**20 * 2**30 + 5368709  # 10**20 GiB and 0.0049999998882 GiB
    path = tmp_path / "plan.json"
    path.write_text(plan_text(needs_card_memory_bytes=needs))
    status, out, err = call_calculator(capsys, "--for-plan", str(path), "--days", "7")
    assert (status, err) == (0, "")
    assert f"one card needs {needs} bytes = 100000000000000000000.00 GiB = " in out


@pytest.mark.parametrize(
    ("content", "facts"),
    [
        (b"", NOT_A_PLAN),
        (b"\xff\xfe", NOT_A_PLAN),
        (b"\xff\xfe{\x00", NOT_A_PLAN),
        (b"\xff\xfe{", ENCODING),  # an odd byte after the mark: not UTF-16
        (b"\xff\xfe\x00\xd8}\x00", ENCODING),  # a lone surrogate
        ('{"kit": "iteragpu-lab-v1 \u00e9"}'.encode("latin-1"), ENCODING),
        (plan_text().encode("utf-16-le"), NOT_A_PLAN),  # UTF-16 without its mark: not told from UTF-8's NULs
        (b"\xef\xbb\xbf\xef\xbb\xbf" + plan_text().encode(), NOT_A_PLAN),  # one mark is skipped, not two
        (b"[" * 100000, NOT_A_PLAN),
        (b"[1, 2]", NOT_A_PLAN),
        (b'{"kit": "iteragpu-lab-v1"}', NOT_A_PLAN),
        (plan_text(kit="other").encode(), NOT_A_PLAN),
        (plan_text(plan_schema_version="DROP").encode(), NOT_A_PLAN),
        (plan_text(plan_schema_version=2).encode(), unknown_schema(2)),
        (plan_text(plan_schema_version=True).encode(), unknown_schema("true")),
        (plan_text(plan_schema_version="1").encode(), unknown_schema('"1"')),
        (plan_text(plan_schema_version="9" * 100).encode(), unknown_schema('"' + "9" * 39)),
        (plan_text(needs_card_memory_bytes="DROP").encode(), INVALID),
        (plan_text(needs_card_memory_bytes=0).encode(), INVALID),
        (plan_text(needs_card_memory_bytes=1.5).encode(), INVALID),
        (plan_text(needs_host_memory_bytes=True).encode(), INVALID),
        (plan_text(needs_card_memory_bytes=10**30).encode(), INVALID),  # 31 digits: past the kit's bound
        (plan_text(needs_host_memory_bytes=10**300).encode(), INVALID),  # was a decimal.InvalidOperation traceback
        (plan_text(configuration=[]).encode(), INVALID),
        (plan_text(configuration={"batch": 1, "context": 16, "width": 64, "dtype": "float64"}).encode(), INVALID),
        (plan_text(configuration={"batch": 1, "context": 16, "dtype": "float32"}).encode(), INVALID),
        (plan_text(configuration={"batch": 0, "context": 16, "width": 64, "dtype": "float32"}).encode(), INVALID),
    ],
    ids=plain_id,
)
def test_a_file_that_is_not_a_known_plan_is_refused_in_one_line(tmp_path, capsys, content, facts):
    path = tmp_path / "plan.json"
    path.write_bytes(content)
    line = calculator_refusal(capsys, "--for-plan", path, "--days", "7")
    assert_one_line(line, f"error: {str(path)!r}: ", *facts, "; nothing computed", prog="calcul_forfaits.py")


def test_the_options_of_for_plan(tmp_path, capsys):
    path, _ = plan_file(tmp_path, capsys)
    assert "--days is required with --for-plan" in calculator_refusal(capsys, "--for-plan", path)
    line = calculator_refusal(capsys, "--for-plan", path, "--days", "7", "--lots", "2")
    assert "--lots: not allowed with --for-plan" in line
    assert "--for-plan: expected a file name, got ''" in calculator_refusal(capsys, "--for-plan", "", "--days", "7")
    line = calculator_refusal(capsys, "--for-plan", "missing.json", "--days", "7")
    assert "'missing.json': cannot be read (No such file or directory); nothing computed" in line
    line = calculator_refusal(capsys, "--for-plan", tmp_path, "--days", "7")
    assert f"{str(tmp_path)!r}: not a regular file; nothing computed" in line


@pytest.mark.whole_kit
def test_standard_input_without_end_is_refused_after_its_bound(tmp_path):
    """``--for-plan - < /dev/zero``: one line once the bound is passed, not a read without end (a fresh
    process: a regression would exhaust this one's memory; the timeout guards the hang)."""
    with open("/dev/zero", "rb") as zeros:
        completed = subprocess.run(
            [sys.executable, str(ROOT / "calcul_forfaits.py"), "--for-plan", "-", "--days", "7"],
            stdin=zeros,
            capture_output=True,
            text=True,
            cwd=tmp_path,
            timeout=30,
        )
    assert_one_line_refusal(completed, "calcul_forfaits.py: error: standard input: larger than 1048576 bytes")
    assert list(tmp_path.iterdir()) == []


class UnreadableStdin:
    def read(self, size):
        raise OSError(5, "Input/output error")


def test_standard_input_is_bounded_and_may_be_missing_or_unreadable(capsys, monkeypatch):
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b" " * (2**20 + 1))))
    line = calculator_refusal(capsys, "--for-plan", "-", "--days", "7")
    assert "standard input: larger than 1048576 bytes; nothing computed" in line
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b" " * 2**20)))
    assert "standard input: not a plan" in calculator_refusal(capsys, "--for-plan", "-", "--days", "7")
    monkeypatch.setattr(sys, "stdin", None)
    line = calculator_refusal(capsys, "--for-plan", "-", "--days", "7")
    assert "standard input: cannot be read (AttributeError)" in line
    monkeypatch.setattr(sys, "stdin", type("Stdin", (), {"buffer": UnreadableStdin()})())
    line = calculator_refusal(capsys, "--for-plan", "-", "--days", "7")
    assert "standard input: cannot be read (Input/output error)" in line


def test_the_calculator_imports_nothing_of_the_measuring_script():
    source = (ROOT / "calcul_forfaits.py").read_text()
    assert "mesure_memoire" not in source.replace("mesure_memoire.py", "")


def test_at_exactly_the_needed_memory_a_card_holds_the_run_and_rounding_is_half_up(tmp_path, capsys):
    """The L4's 24 GB exactly (no PyTorch figure recorded: its nominal one, marked): it holds the run, 0.00 left;
    125,000,000 bytes short of the next is 0.13 GB (half-up; half-even would write 0.12)."""
    path = tmp_path / "plan.json"
    path.write_text(plan_text(needs_card_memory_bytes=24 * 10**9))
    status, out, _ = call_calculator(capsys, "--for-plan", path, "--days", "7", "--json")
    l4 = next(card for card in json.loads(out)["cards"] if card["gpu"] == "l4")
    assert (status, l4["fits"], l4["room_bytes"]) == (0, True, 0)
    path.write_text(plan_text(needs_card_memory_bytes=24 * 10**9 + 125000000))
    status, out, _ = call_calculator(capsys, "--for-plan", path, "--days", "7")
    l4_line = next(line for line in out.splitlines() if line.startswith("l4 "))
    assert l4_line.split()[3:11] == ["24", "none", "no*", "0.12", "short", "0.13", "short", "1"], l4_line


def test_the_readme_s_for_plan_example_on_the_readme_s_plan(tmp_path, capsys, monkeypatch):
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    plan_line = next(line for line in readme.splitlines() if line.endswith(" --plan --json > plan.json"))
    assert plan_line.startswith("python mesure_memoire.py measure ")
    assert "--device" not in plan_line  # the plan needs no device
    assert "\npython calcul_forfaits.py --for-plan plan.json --days 7\n" in readme
    assert "`--for-plan -`" in readme, "the README shows the plan read from standard input"
    assert "`pytorch_total_memory_bytes`" in readme, "where a catalog card's figure is read"
    said = [part for part in readme.split("\n\n") if "--memory-gib" in part and "PyTorch" in part]
    assert any("`environment`" in part for part in said), "--memory-gib takes the GiB PyTorch reports"
    monkeypatch.chdir(tmp_path)
    plan_file(tmp_path, capsys, run=plan_line.split()[2:-3])  # less "--json > plan.json"
    status, out, err = call_calculator(capsys, "--for-plan", "plan.json", "--days", "7")
    assert (status, err) == (0, "")
    assert out.startswith("Plan: batch 2, context 128, width 1024, float32;")
