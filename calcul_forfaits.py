"""IteraGPU Lab v1: the price of a whole IteraGPU package, and the cost of one accepted result.

Usage::

    python calcul_forfaits.py --gpu b200 --days 7 --lots 2
    python calcul_forfaits.py --gpu h100-sxm --days 30 --accepted-results 120 --json
    python calcul_forfaits.py --list --days 7

Standard library only (Python >= 3.10).  Prices come from ``tarifs-forfaits.csv`` beside this
script (or ``--catalog``): whole USD cents for one lot and the whole duration of 3, 7 or 30
days, never prorated.  Money is computed with integers and ``decimal.Decimal``, never floats.
The catalog is validated on every load; expected failures print one line and exit 2.
"""

import argparse
import csv
import difflib
import io
import json
import re
import sys
from dataclasses import asdict, dataclass
from datetime import date
from decimal import ROUND_HALF_UP, Context, Decimal, localcontext
from pathlib import Path

CATALOG_COLUMNS = ("gpu", "model", "memory_gb", "gpus_per_lot", "days", "price_cents", "currency", "snapshot_date")
DURATIONS_DAYS = (3, 7, 30)
CATALOG_MODELS = 15
CATALOG_FILE_NAME = "tarifs-forfaits.csv"
DEFAULT_CATALOG = Path(__file__).resolve().with_name(CATALOG_FILE_NAME)
CENT = Decimal("0.01")
_POSITIVE = re.compile(r"[1-9][0-9]{0,17}")  # no sign, decimals, separators or spaces
_SLUG = re.compile(r"[a-z0-9]+(?:-[a-z0-9]+)*")
_CURRENCY = re.compile(r"[A-Z]{3}")


class PricingError(Exception):
    """An expected failure: one line for the user, exit status 2."""


@dataclass(frozen=True)
class Tariff:
    gpu: str
    model: str
    memory_gb: int
    gpus_per_lot: int
    days: int
    price_cents: int
    currency: str
    snapshot_date: str


def positive_int(option, value):
    """Return ``value`` (an int, or a string of digits) as a positive int."""
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return value
    if isinstance(value, str) and _POSITIVE.fullmatch(value):
        return int(value)
    raise PricingError(f"{option}: expected a positive whole number, got {value!r}")


def parse_catalog(data, name=CATALOG_FILE_NAME):
    """Validate the catalog's bytes and return its tariffs; any defect raises PricingError."""

    def fail(reason, line=None):
        where = f"{name}: line {line}: " if line is not None else f"{name}: "
        raise PricingError(f"{where}{reason}; nothing computed")

    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as error:
        fail(f"not UTF-8 (byte {error.start})")
    if not text.strip():
        fail("empty file")
    reader = csv.reader(io.StringIO(text, newline=""), strict=True)
    try:
        rows = [(reader.line_num, row) for row in reader]
    except csv.Error as error:
        fail(f"malformed CSV ({error})", reader.line_num)
    header_line, header = rows[0]
    if tuple(header) != CATALOG_COLUMNS:
        fail(f"bad header, expected {','.join(CATALOG_COLUMNS)}", header_line)
    tariffs, seen, first_of_gpu = [], {}, {}
    for line, row in rows[1:]:
        if len(row) != len(CATALOG_COLUMNS):
            fail(f"expected {len(CATALOG_COLUMNS)} fields, found {len(row)}", line)
        fields = dict(zip(CATALOG_COLUMNS, row, strict=True))
        for column in ("memory_gb", "gpus_per_lot", "price_cents"):
            if not _POSITIVE.fullmatch(fields[column]):
                fail(f"{column} must be a whole positive number with no sign, decimals or spaces, "
                     f"got {fields[column]!r}", line)  # fmt: skip
        if not _SLUG.fullmatch(fields["gpu"]):
            fail(f"gpu must be a lower-case slug, got {fields['gpu']!r}", line)
        if not fields["model"] or fields["model"] != fields["model"].strip():
            fail("model must be a non-empty name without surrounding spaces", line)
        if fields["days"] not in {str(days) for days in DURATIONS_DAYS}:
            fail(f"days must be one of 3, 7, 30, got {fields['days']!r}", line)
        if not _CURRENCY.fullmatch(fields["currency"]):
            fail(f"currency must be a three-letter code, got {fields['currency']!r}", line)
        try:
            date.fromisoformat(fields["snapshot_date"])
        except ValueError:
            fail(f"snapshot_date must be a date written YYYY-MM-DD, got {fields['snapshot_date']!r}", line)
        tariff = Tariff(
            **{key: int(value) if key in ("memory_gb", "gpus_per_lot", "days", "price_cents") else value
               for key, value in fields.items()}
        )  # fmt: skip
        key = (tariff.gpu, tariff.days)
        if key in seen:
            fail(f"duplicate row for {tariff.gpu}, {tariff.days} days (first on line {seen[key]})", line)
        seen[key] = line
        first = first_of_gpu.setdefault(tariff.gpu, tariff)
        for column in ("model", "memory_gb", "gpus_per_lot"):
            if getattr(tariff, column) != getattr(first, column):
                fail(f"{column} of {tariff.gpu} differs from its first row", line)
        for column in ("currency", "snapshot_date"):
            if tariffs and getattr(tariff, column) != getattr(tariffs[0], column):
                fail(f"{column} differs from the first row's ({getattr(tariffs[0], column)})", line)
        tariffs.append(tariff)
    for gpu in first_of_gpu:
        missing = [days for days in DURATIONS_DAYS if (gpu, days) not in seen]
        if missing:
            fail(f"{gpu} has no row for {', '.join(map(str, missing))} days")
    expected_rows = CATALOG_MODELS * len(DURATIONS_DAYS)
    if len(tariffs) != expected_rows:
        fail(
            f"{len(tariffs)} rows, expected {expected_rows} ({CATALOG_MODELS} models x {len(DURATIONS_DAYS)} durations)"
        )
    return tariffs


def load_catalog(path=None):
    """Read and validate the catalog (default: the CSV beside this script)."""
    name = CATALOG_FILE_NAME if path is None else str(path)
    try:
        data = Path(path or DEFAULT_CATALOG).read_bytes()
    except OSError as error:
        raise PricingError(f"{name}: cannot be read ({error.strerror or type(error).__name__})") from None
    return parse_catalog(data, name)


def duration_days(value):
    """3, 7 or 30 (an int or its string); anything else is refused: prices are never prorated."""
    if str(value) not in {str(days) for days in DURATIONS_DAYS}:
        raise PricingError(f"--days: expected 3, 7 or 30 (fixed durations, no proration), got {value!r}")
    return int(value)


def find_tariff(catalog, gpu, days):
    slug = str(gpu).strip().lower()
    slugs = sorted({tariff.gpu for tariff in catalog})
    if slug not in slugs:
        closest = difflib.get_close_matches(slug, slugs, n=3, cutoff=0.5)
        hint = f"closest: {', '.join(closest)}; " if closest else ""
        raise PricingError(f"--gpu: unknown GPU {gpu!r}; {hint}see --list for every slug")
    days = duration_days(days)
    return next(t for t in catalog if t.gpu == slug and t.days == days)


def cents_to_usd(cents):
    return f"{cents // 100}.{cents % 100:02d}"


def usd_share(cents, divisor):
    """``cents / divisor`` in USD, rounded half-up to the cent, as a string.

    Computed and rounded in a 200-digit context: the default 28 digits cannot quantize the
    largest totals a valid catalog and ``--lots`` allow.
    """
    with localcontext(Context(prec=200)):
        return str((Decimal(cents) / 100 / Decimal(divisor)).quantize(CENT, rounding=ROUND_HALF_UP))


def price_package(catalog, gpu, days, lots=1, accepted_results=None):
    """The whole package's price; the cost per accepted result when that count is given."""
    tariff = find_tariff(catalog, gpu, days)
    lots = positive_int("--lots", lots)
    if accepted_results is not None:
        accepted_results = positive_int("--accepted-results", accepted_results)
    total_price_cents = tariff.price_cents * lots  # a lot's price already covers all its GPUs
    cost = None if accepted_results is None else usd_share(total_price_cents, accepted_results)
    return {
        "gpu": tariff.gpu,
        "model": tariff.model,
        "memory_gb": tariff.memory_gb,
        "days": tariff.days,
        "lots": lots,
        "gpus_per_lot": tariff.gpus_per_lot,
        "gpus": tariff.gpus_per_lot * lots,
        "lot_price_cents": tariff.price_cents,
        "total_price_cents": total_price_cents,
        "currency": tariff.currency,
        "snapshot_date": tariff.snapshot_date,
        "accepted_results": accepted_results,
        "cost_per_accepted_result_usd": cost,
        "cost_rounding": "total price / accepted results, rounded half-up to the cent",
    }


def format_package(package):
    currency = package["currency"]
    if package["cost_per_accepted_result_usd"] is None:
        cost = "not computed: add --accepted-results N (distinct useful units really accepted)"
    else:
        cost = (f"{package['cost_per_accepted_result_usd']} {currency} = total price / "
                f"{package['accepted_results']} accepted results (rounded half-up to the cent)")  # fmt: skip
    return "\n".join(
        [
            f"Package: {package['model']} ({package['gpu']}), {package['days']} days, {package['lots']} lot(s)",
            f"  GPUs                      {package['gpus']} "
            f"({package['gpus_per_lot']} per lot x {package['lots']} lot(s))",
            f"  lot price                 {cents_to_usd(package['lot_price_cents'])} {currency} "
            f"({package['lot_price_cents']} cents)",
            f"  total price               {cents_to_usd(package['total_price_cents'])} {currency} "
            f"({package['total_price_cents']} cents) = lot price x {package['lots']}",
            f"  cost per accepted result  {cost}",
            f"Prices: IteraGPU catalog snapshot of {package['snapshot_date']}, whole {currency} cents for the "
            "whole duration (3, 7 or 30 days), no hourly proration.",
            "The CSV proves neither current availability nor a reservation: check the offer shown before buying.",
        ]
    )


def catalog_table(catalog, days=None):
    """Rows of the catalog (optionally one duration) with the price per GPU-day, as data."""
    rows = []
    for tariff in sorted(catalog, key=lambda t: (t.gpu, t.days)):
        if days is not None and tariff.days != days:
            continue
        per_gpu_day = usd_share(tariff.price_cents, tariff.days * tariff.gpus_per_lot)
        rows.append({**asdict(tariff), "usd_per_gpu_day": per_gpu_day})
    return rows


def format_catalog(rows):
    header = ("gpu", "model", "memory_gb", "gpus_per_lot", "days", "lot price", "per GPU-day")
    lines = [header] + [
        (r["gpu"], r["model"], str(r["memory_gb"]), str(r["gpus_per_lot"]), str(r["days"]),
         f"{cents_to_usd(r['price_cents'])} {r['currency']}", f"{r['usd_per_gpu_day']} {r['currency']}")
        for r in rows
    ]  # fmt: skip
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    text = ["  ".join(cell.ljust(widths[i]) if i < 2 else cell.rjust(widths[i]) for i, cell in enumerate(line))
            for line in lines]  # fmt: skip
    text.append(f"IteraGPU catalog snapshot of {rows[0]['snapshot_date']}; per GPU-day rounded half-up to the cent.")
    return "\n".join(text)


class _Parser(argparse.ArgumentParser):
    """Usage errors become one line (PricingError) instead of usage text."""

    def error(self, message):
        raise PricingError(message)


def build_parser():
    parser = _Parser(prog="calcul_forfaits.py", description=__doc__.split("\n\n")[0])
    what = parser.add_mutually_exclusive_group(required=True)
    what.add_argument("--gpu", help="the GPU model's slug, e.g. b200 (case-insensitive; see --list)")
    what.add_argument("--list", action="store_true", help="print the catalog with the price per GPU-day")
    parser.add_argument("--days", help="package duration: 3, 7 or 30 (no proration); with --list, a filter")
    parser.add_argument("--lots", help="number of lots, a positive whole number (default 1)")
    parser.add_argument(
        "--accepted-results",
        help="distinct useful units really accepted, a positive whole number; no default on purpose",
    )
    parser.add_argument("--catalog", help=f"the price CSV (default: {CATALOG_FILE_NAME} beside this script)")
    parser.add_argument("--json", action="store_true", help="print JSON instead of text")
    return parser


def main(argv=None) -> int:
    try:
        args = build_parser().parse_args(argv)
        days = None if args.days is None else duration_days(args.days)
        if args.list and (args.lots is not None or args.accepted_results is not None):
            raise PricingError("--lots and --accepted-results apply to --gpu, not to --list")
        if args.gpu is not None and days is None:
            raise PricingError("--days is required with --gpu (3, 7 or 30)")
        catalog = load_catalog(args.catalog)
        if args.list:
            data = catalog_table(catalog, days)
            text = format_catalog(data)
        else:
            lots = 1 if args.lots is None else args.lots
            data = price_package(catalog, args.gpu, days, lots, args.accepted_results)
            text = format_package(data)
    except PricingError as error:
        print(f"calcul_forfaits.py: error: {error}", file=sys.stderr)
        return 2
    print(json.dumps(data, indent=2) if args.json else text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
