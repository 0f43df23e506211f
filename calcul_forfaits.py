"""IteraGPU Lab v1: the price of a whole IteraGPU package, and the cost of one accepted result.

Usage::

    python calcul_forfaits.py --gpu b200 --days 7 --lots 2
    python calcul_forfaits.py --gpu h100-sxm --days 30 --accepted-results 120 --json
    python calcul_forfaits.py --list --days 7
    python calcul_forfaits.py --results resultats-bruts.csv
    python calcul_forfaits.py --for-plan plan.json --days 7

Standard library only (Python >= 3.10).  Prices come from ``tarifs-forfaits.csv`` beside this
script (or ``--catalog``): whole USD cents for one lot and the whole duration of 3, 7 or 30
days, never prorated.  Money is computed with integers and ``decimal.Decimal``, never floats.
Every input file is validated on every load; expected failures print one line and exit 2.
Modules only some answers need (json, decimal, csv, difflib, hashlib, fractions) are imported
where they are used.
"""

import sys  # first: a Ctrl-C from here on is one line (below), not a traceback


def _interrupted_at_start(kind, error, traceback):
    """sys.excepthook until main() handles Ctrl-C itself: one line and 130 for a Ctrl-C during the imports."""
    if not issubclass(kind, KeyboardInterrupt):
        return sys.__excepthook__(kind, error, traceback)
    import os

    try:
        os.write(2, b"calcul_forfaits.py: interrupted (Ctrl-C)\n")
    finally:  # a closed stderr too
        os._exit(130)


if __name__ == "__main__":
    sys.excepthook = _interrupted_at_start

# Below 3.10, one line says so.  (Python parses a whole file before running it: this one keeps to the
# grammar of 3.8, which a test checks, so that this line is what an older Python prints.)
if sys.version_info < (3, 10):  # noqa: UP036 -- the check is the point
    this_python = ".".join(map(str, sys.version_info[:3]))
    sys.stderr.write(f"calcul_forfaits.py: error: Python 3.10 or later is needed; this is Python {this_python}\n")
    raise SystemExit(2)

import argparse  # noqa: E402 -- after the version check, as every import
import os  # noqa: E402
import stat  # noqa: E402

PROG = "calcul_forfaits.py"
DURATIONS_DAYS = (3, 7, 30)
DURATIONS_TEXT = tuple(map(str, DURATIONS_DAYS))  # as written on a command line or in a CSV
CATALOG_MODELS = 15
CURRENCY = "USD"  # every ``_usd`` key below relies on it
CATALOG_FILE_NAME = "tarifs-forfaits.csv"
RESULTS_FILE_NAME = "resultats-bruts.csv"
MAX_TABLE_BYTES = 2**20  # a valid catalog is about 2.5 KB; years of runs fit many times over
MAX_MEASUREMENT_BYTES = 64 * 2**20  # a measure result file holds a few KB per hundred phases
MAX_HASHED_BYTES = 4 * MAX_MEASUREMENT_BYTES  # over one results file: about a second of hashing
COST_ROUNDING = "rounded half-up to four significant digits or to the cent, whichever is finer"
COST_RULE = f"total price / accepted results, {COST_ROUNDING}"
MAX_DIGITS = 30  # mesure_memoire.py's bound too: one for every whole number the kit reads


class PricingError(Exception):
    """An expected failure: one line for the user, and the exit status to use."""

    exit_code = 2


def one_line(text):
    """``text`` on one line: newlines, tabs and other unprintable characters are escaped."""
    return "".join(char if char.isprintable() else repr(char)[1:-1] for char in str(text))


def describe_error(exc):
    # mesure_memoire.py's keeps only an allow-list of PyTorch's texts: the only errors told here, writing stdout's,
    # come from the standard library and name no file.
    message = one_line(exc)
    return f"{type(exc).__name__}: {message}" if message else type(exc).__name__


def fail(name, reason, line_number=None):
    """Refuse a file: its name (a repr), the line when known, the reason."""
    raise PricingError(f"{name}: {'' if line_number is None else f'line {line_number}: '}{reason}; nothing computed")


# --- the grammar of values: ASCII digits only, the same on every Python version --------------------------


def is_whole(text, zero=False):
    """1 to MAX_DIGITS ASCII digits, no sign, no leading zero (``zero``: "0" too)."""
    return (
        0 < len(text) <= MAX_DIGITS and text.isascii() and text.isdigit() and (text[0] != "0" or zero and text == "0")
    )


def is_number(text):
    """A non-negative number: a whole number (is_whole's, "0" too), then optionally "." and 1 to MAX_DIGITS
    ASCII digits."""
    whole, point, fraction = text.partition(".")
    digits = fraction.isascii() and fraction.isdigit() and len(fraction) <= MAX_DIGITS
    return is_whole(whole, zero=True) and (digits or not point)


def is_date(text):
    """Exactly ``YYYY-MM-DD``, a real calendar date (3.11's date.fromisoformat takes more forms)."""
    digits = text[:4] + text[5:7] + text[8:]
    if len(text) != 10 or text[4::3] != "--" or not (digits.isascii() and digits.isdigit()) or digits < "0001":
        return False
    year, month, day = int(text[:4]), int(text[5:7]), int(text[8:])
    leap = year % 4 == 0 and (year % 100 != 0 or year % 400 == 0)
    return 0 < month < 13 and 0 < day <= (31, 28 + leap, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31)[month - 1]


def is_utc_time(text):
    """Exactly ``YYYY-MM-DDTHH:MM:SSZ``."""
    clock = text[11:13] + text[14:16] + text[17:19]
    return (
        len(text) == 20
        and is_date(text[:10])
        and text[10::3] == "T::Z"
        and clock.isascii()
        and clock.isdigit()
        and clock[:2] < "24"
        and clock[2:4] < "60"
        and clock[4:] < "60"
    )


def is_slug(text):
    return text.isascii() and text.replace("-", "").isalnum() and text == text.lower() and "" not in text.split("-")


def is_relative_or_empty(text):
    return (
        not text or ".." not in text.replace("\\", "/").split("/") and text[0] not in "/\\" and not os.path.isabs(text)
    )


# A CSV's columns, in order, each with the rule its values follow (None: any printable text).
# The parser, its messages, the template's header and the README's table all follow these.
TEXT = (lambda text: text != "" and text == text.strip(), "a non-empty text without surrounding spaces")
POSITIVE = (is_whole, "a whole positive number with no sign, decimals or spaces")
COUNT = (lambda text: is_whole(text, zero=True), "a whole number (ASCII digits, no sign)")
NUMBER = (is_number, "a number (ASCII digits, at most one decimal point)")
DATE = (is_date, "a date written YYYY-MM-DD")
DURATION = (DURATIONS_TEXT.__contains__, "one of 3, 7, 30 (no proration)")
CATALOG_RULES = {
    "gpu": (is_slug, "a lower-case slug"),
    "model": TEXT,
    "memory_gb": POSITIVE,
    "gpus_per_lot": POSITIVE,
    "days": DURATION,
    "price_cents": POSITIVE,
    "currency": (CURRENCY.__eq__, f"{CURRENCY}, the kit's currency"),
    "snapshot_date": DATE,
    # Optional (a catalog may leave the column out, or a cell empty): the card's total_memory as PyTorch reports
    # it, the lowest figure on record (validation/card-memory.md); without it --for-plan judges on memory_gb x
    # 10**9 bytes and marks the answer.
    "pytorch_total_memory_bytes": (
        lambda text: not text or is_whole(text),
        "a whole positive number of bytes, or empty (no figure recorded)",
    ),
}
RESULTS_RULES = {
    "run_id": TEXT,
    "rental_id": TEXT,
    "date_utc": (is_utc_time, "a UTC time written YYYY-MM-DDTHH:MM:SSZ"),
    "gpu": TEXT,
    "days": DURATION,
    "lots": POSITIVE,
    "device": None,
    "gpu_name": None,
    "driver_version": None,
    "torch_version": None,
    "cuda_or_hip_build": None,
    "measurement_file": (
        is_relative_or_empty,
        "a path relative to the results file's folder, without '..' (or empty: none)",
    ),
    "measurement_sha256": (
        lambda text: not text or len(text) == 64 and text.strip("0123456789abcdefABCDEF") == "",
        "64 hexadecimal digits (or empty: no measurement file)",
    ),
    "units_submitted": COUNT,
    "units_accepted": COUNT,
    "quality_metric": TEXT,
    "threshold": NUMBER,
    "threshold_fixed_on": DATE,
    "wall_clock_hours": NUMBER,
    "notes": None,
}
CATALOG_COLUMNS = tuple(CATALOG_RULES)
INT_COLUMNS = ("memory_gb", "gpus_per_lot", "days", "price_cents")  # the catalog's whole numbers
RESULTS_COLUMNS = tuple(RESULTS_RULES)


def positive_int(option, text):
    """A command line's ``text`` as a positive int."""
    if not is_whole(text):
        raise PricingError(f"{option}: expected a positive whole number, got {text!r}")
    return int(text)


# --- reading files: one bounded reader, one CSV grammar ------------------------------------------------


def read_bounded(path, name, limit=MAX_TABLE_BYTES):
    """The bytes of a regular file of at most ``limit`` bytes; anything else raises PricingError.

    Opened non-blocking, then checked on the open descriptor: a FIFO neither blocks nor is read,
    /dev/zero is refused before a byte is read, and a huge file costs ``limit`` bytes at most.
    """
    try:
        descriptor = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except (OSError, ValueError) as error:  # ValueError: a NUL byte in the name
        fail(name, f"cannot be read ({getattr(error, 'strerror', None) or error})")
    try:
        if not stat.S_ISREG(os.fstat(descriptor).st_mode):
            fail(name, "not a regular file")
        data = b""
        while len(data) <= limit:
            chunk = os.read(descriptor, limit + 1 - len(data))
            if not chunk:
                return data
            data += chunk
    except OSError as error:
        fail(name, f"cannot be read ({error.strerror})")
    finally:
        os.close(descriptor)
    fail(name, f"larger than {limit} bytes")


def parse_table(data, name, rules, last_optional=False):
    """Validate a CSV's bytes against ``rules``; returns [(line number, {column: value})] after the header.

    UTF-8 (a byte order mark, as some spreadsheets write, is skipped), LF or CRLF line ends, blank
    lines at the end ignored, the exact header (``last_optional``: it may leave out the last column), the
    right number of fields on every line, no control (nor other unprintable) character in any field, and each
    column's rule.
    """
    try:
        text = data.decode("utf-8").removeprefix("\ufeff")
    except UnicodeDecodeError as error:
        fail(name, f"not UTF-8 (byte {error.start})")
    if not text.strip():
        fail(name, "empty file")
    lines = text.split("\n")
    while not lines[-1].strip():  # the empty text after the last line end, and blank lines an editor left
        lines.pop()
    rows = []
    for line_number, line in enumerate(lines, start=1):
        line = line.removesuffix("\r")
        row = line.split(",")
        if '"' in line:  # quoted fields (a note holding a comma): the csv module, only then
            import csv

            try:
                row = next(csv.reader([line], strict=True))
            except csv.Error as error:
                fail(name, f"malformed CSV ({error})", line_number)
        if line_number == 1 and last_optional and tuple(row) == tuple(rules)[:-1]:
            rules = dict(tuple(rules.items())[:-1])
        if line_number == 1 and tuple(row) != tuple(rules):
            left_out = " (the last one may be left out)" if last_optional else ""
            fail(name, f"bad header, expected {','.join(rules)}{left_out}", line_number)
        try:
            fields = dict(zip(rules, row, strict=True))
        except ValueError:
            fail(name, f"expected {len(rules)} fields, found {len(row)}", line_number)
        for column, value in fields.items():
            if not value.isprintable():
                fail(name, f"{column} holds a control or unprintable character: {value!r}", line_number)
            if rules[column] and line_number > 1 and not rules[column][0](value):
                fail(name, f"{column} must be {rules[column][1]}, got {value!r}", line_number)
        rows.append((line_number, fields))
    return rows[1:]


# --- the catalog ---------------------------------------------------------------------------------------


def parse_catalog(data, name=repr(CATALOG_FILE_NAME)):  # noqa: B008  (a constant string)
    """Validate the catalog's bytes and return its tariffs (dicts, whole numbers as ints)."""
    tariffs, line_of_key, first_row_of_gpu = [], {}, {}
    for line_number, row in parse_table(data, name, CATALOG_RULES, last_optional=True):
        figure = row.get("pytorch_total_memory_bytes")
        tariff = {
            **row,
            **{column: int(row[column]) for column in INT_COLUMNS},
            "pytorch_total_memory_bytes": int(figure) if figure else None,
        }
        key = (tariff["gpu"], tariff["days"])
        if key in line_of_key:
            fail(name, f"duplicate row for {key[0]}, {key[1]} days (first on line {line_of_key[key]})", line_number)
        line_of_key[key] = line_number
        first_row = first_row_of_gpu.setdefault(tariff["gpu"], tariff)
        for column in ("model", "memory_gb", "gpus_per_lot", "pytorch_total_memory_bytes"):
            if tariff[column] != first_row[column]:
                fail(name, f"{column} of {tariff['gpu']} differs from its first row", line_number)
        if tariffs and tariff["snapshot_date"] != tariffs[0]["snapshot_date"]:
            fail(name, f"snapshot_date differs from the first row's ({tariffs[0]['snapshot_date']})", line_number)
        tariffs.append(tariff)
    for gpu in first_row_of_gpu:
        missing = [str(days) for days in DURATIONS_DAYS if (gpu, days) not in line_of_key]
        if missing:
            fail(name, f"{gpu} has no row for {', '.join(missing)} days")
    if len(tariffs) != CATALOG_MODELS * len(DURATIONS_DAYS):
        expected = f"{CATALOG_MODELS * len(DURATIONS_DAYS)} ({CATALOG_MODELS} models x {len(DURATIONS_DAYS)} durations)"
        fail(name, f"{len(tariffs)} rows, expected {expected}")
    return tariffs


def load_catalog(path=None):
    """Read and validate the catalog (default: the CSV beside this script, named by its file name only)."""
    if path is None:
        here = os.path.dirname(os.path.realpath(__file__))
        return parse_catalog(read_bounded(os.path.join(here, CATALOG_FILE_NAME), repr(CATALOG_FILE_NAME)))
    name = repr(os.fspath(path))
    return parse_catalog(read_bounded(path, name), name)


def find_tariff(catalog, gpu, days, option="--gpu"):
    """The catalog's row for a slug (any case) and a duration already checked: 3, 7 or 30 days."""
    slug = str(gpu).lower()
    for tariff in catalog:
        if tariff["gpu"] == slug and tariff["days"] == int(days):
            return tariff
    import difflib  # only for this refusal

    closest = difflib.get_close_matches(slug, sorted({tariff["gpu"] for tariff in catalog}))
    hint = f"closest: {', '.join(closest)}; " if closest else ""
    raise PricingError(f"{option}: unknown GPU {gpu!r}; {hint}see --list for every slug")


# --- money ---------------------------------------------------------------------------------------------


def cents_to_usd(cents):
    return f"{cents // 100}.{cents % 100:02d}"


def usd_share(cents, divisor):
    """``cents / divisor`` in USD, rounded half-up to the cent, as a string.

    Computed and rounded in a 200-digit context: the default 28 digits cannot quantize the
    largest totals a valid catalog and ``--lots`` allow.
    """
    from decimal import ROUND_HALF_UP, Context, Decimal, localcontext

    with localcontext(Context(prec=200)):
        return str((Decimal(cents) / 100 / Decimal(divisor)).quantize(Decimal("0.01"), rounding=ROUND_HALF_UP))


def cost_usd(cents, divisor):
    """``cents / divisor`` in USD, positive, as a decimal string: rounded half-up to four significant digits or to
    the cent, whichever is finer, so that no cost rounds to 0.00 and small costs stay comparable.  Whole
    numbers only, so exact whatever the sizes; Decimal writes the digits, never in exponent form."""
    from decimal import Decimal

    numerator, denominator = cents, 100 * divisor
    places = 2
    while numerator * 10**places < 1000 * denominator:  # fewer than four significant digits before the point
        places += 1
    units = (2 * numerator * 10**places + denominator) // (2 * denominator)  # half-up
    if places > 2 and units == 10**4:  # 9.9995 carried to 10.000: four significant digits are 10.00
        units, places = units // 10, places - 1
    return f"{Decimal(f'{units}E-{places}'):f}"  # the constructor is exact; scaleb would round to 28 digits


def package(tariff, lots):
    """A rental of ``lots`` lots of one tariff: the price of the whole package, counted once."""
    return {
        "gpu": tariff["gpu"],
        "model": tariff["model"],
        "memory_gb": tariff["memory_gb"],
        "days": tariff["days"],
        "lots": lots,
        "gpus_per_lot": tariff["gpus_per_lot"],
        "gpus": tariff["gpus_per_lot"] * lots,
        "lot_price_cents": tariff["price_cents"],
        "total_price_cents": tariff["price_cents"] * lots,  # a lot's price already covers all its GPUs
        "currency": tariff["currency"],
        "snapshot_date": tariff["snapshot_date"],
    }


def price_package(catalog, gpu, days, lots, accepted_results):
    """The whole package's price; the cost per accepted result when that count is given (the counts as typed)."""
    result = package(find_tariff(catalog, gpu, days), positive_int("--lots", lots))
    if accepted_results is not None:
        accepted_results = positive_int("--accepted-results", accepted_results)
    cost = None if accepted_results is None else cost_usd(result["total_price_cents"], accepted_results)
    return {
        **result,
        "accepted_results": accepted_results,
        "cost_per_accepted_result_usd": cost,
        "cost_rounding": COST_RULE,
    }


# --- raw results: one line per run, one price per rental ----------------------------------------------


class MeasurementHashes:
    """The SHA-256 of each measurement file read, by resolved path, and the bytes hashed so far:
    a file named on many lines is read once, and the total read for one results file is bounded."""

    def __init__(self):
        self.sha256_of_path, self.hashed_bytes = {}, 0


def check_measurement(name, line_number, row, folder, hashes):
    """Check a run's measurement file against its measurement_sha256; both empty: the run has none.

    ``folder`` is the results file's folder, resolved: a file resolving outside it (through a link)
    is refused, named as the row wrote it, never by where it leads.
    """
    relative, sha256 = row["measurement_file"], row["measurement_sha256"].lower()
    if bool(relative) != bool(sha256):
        fail(
            name,
            "measurement_file and measurement_sha256 go together: both given, or both empty for a run "
            "without a measurement file",
            line_number,
        )
    if not relative:
        return
    where = f"{name}: line {line_number}: measurement_file {relative!r}"
    resolved = os.path.realpath(os.path.join(folder, relative))
    if os.path.commonpath([folder, resolved]) != folder:
        raise PricingError(f"{where}: resolves outside the results file's folder (through a link); nothing computed")
    if resolved not in hashes.sha256_of_path:
        import hashlib

        measurement = read_bounded(resolved, where, MAX_MEASUREMENT_BYTES)
        hashes.hashed_bytes += len(measurement)
        if hashes.hashed_bytes > MAX_HASHED_BYTES:
            raise PricingError(
                f"{where}: the distinct measurement files named so far total more than "
                f"{MAX_HASHED_BYTES} bytes, the most --results hashes (a bound on its time); "
                "nothing computed"
            )
        hashes.sha256_of_path[resolved] = hashlib.sha256(measurement).hexdigest()
    if hashes.sha256_of_path[resolved] != sha256:
        raise PricingError(f"{where}: its SHA-256 differs from measurement_sha256; nothing computed")


def rental_table(data, name, catalog, folder):
    """Group a filled results file's runs by rental, each rental's price counted once, cheapest first.

    Every row is checked before anything is computed: one protocol (one metric, and one threshold
    compared as a number, fixed before each run), the units, the package against the catalog, and
    the measurement file if any (a path relative to ``folder``) against its SHA-256.
    """
    from decimal import Decimal

    rows = parse_table(data, name, RESULTS_RULES)
    if not rows:
        fail(name, "no run recorded yet (header only): add one row per real run")
    rentals, line_of_run, line_of_rental, (first_line, first_row) = {}, {}, {}, rows[0]
    protocol = (first_row["quality_metric"], Decimal(first_row["threshold"]))  # 0.9 and 0.90: one threshold
    folder, hashes = os.path.realpath(folder), MeasurementHashes()
    for line_number, row in rows:
        run_id, rental_id = row["run_id"], row["rental_id"]
        if run_id in line_of_run:
            fail(name, f"duplicate run_id {run_id!r} (first on line {line_of_run[run_id]})", line_number)
        line_of_run[run_id] = line_number
        submitted, accepted = checked_run(name, line_number, row, protocol, first_line)
        try:
            rented = package(find_tariff(catalog, row["gpu"], row["days"], "gpu"), int(row["lots"]))
        except PricingError as error:
            fail(name, error, line_number)
        rental = rentals.setdefault(
            rental_id,
            {"rental_id": rental_id, **rented, "runs": 0, "run_ids": [], "units_submitted": 0, "units_accepted": 0},
        )
        if any(rented[column] != rental[column] for column in ("gpu", "days", "lots")):
            fail(
                name,
                f"rental {rental_id!r} differs in gpu, days or lots from line {line_of_rental[rental_id]}",
                line_number,
            )
        line_of_rental.setdefault(rental_id, line_number)
        check_measurement(name, line_number, row, folder, hashes)
        rental["runs"] += 1
        rental["run_ids"].append(run_id)
        rental["units_submitted"] += submitted
        rental["units_accepted"] += accepted
    return {
        "rentals": ranked(rentals.values()),
        "quality_metric": first_row["quality_metric"],
        "threshold": first_row["threshold"],  # as the first run wrote it
        "currency": catalog[0]["currency"],
        "snapshot_date": catalog[0]["snapshot_date"],
        "cost_rounding": f"{COST_RULE}; null when no unit was accepted",
    }


def checked_run(name, line_number, row, protocol, first_line):
    """A run's (units submitted, units accepted), once its protocol and units are checked."""
    from decimal import Decimal

    if row["threshold_fixed_on"] > row["date_utc"][:10]:
        fail(
            name,
            f"threshold_fixed_on {row['threshold_fixed_on']} is after the run's start "
            f"{row['date_utc']}: the protocol is fixed before the runs",
            line_number,
        )
    submitted, accepted = int(row["units_submitted"]), int(row["units_accepted"])
    if accepted > submitted:
        fail(name, f"units_accepted {accepted} exceeds units_submitted {submitted}", line_number)
    if (row["quality_metric"], Decimal(row["threshold"])) != protocol:
        fail(
            name,
            f"quality_metric or threshold differs from line {first_line}'s: a cost per accepted "
            "result compares packages under one protocol only",
            line_number,
        )
    return submitted, accepted


def ranked(rentals):
    """The rentals, cheapest accepted result first (none accepted last), each with its cost per result."""
    from fractions import Fraction  # the exact order: two costs may round to the same figure

    table = sorted(
        rentals,
        key=lambda r: (
            not r["units_accepted"],
            r["units_accepted"] and Fraction(r["total_price_cents"], r["units_accepted"]),
            r["rental_id"],
        ),
    )
    for rental in table:
        accepted = rental["units_accepted"]
        rental["cost_per_accepted_result_usd"] = cost_usd(rental["total_price_cents"], accepted) if accepted else None
    return table


# --- which card holds a planned run: the plan file of mesure_memoire.py measure --plan --json ----------

PLAN_KIT = "iteragpu-lab-v1"
PLAN_SCHEMA_VERSIONS = (1,)  # the plan_schema_version values this calculator reads
PLAN_DTYPES = ("float32", "float16", "bfloat16")
FIT_SIZES = ("batch", "context", "width")
GIB_BYTES, GB_BYTES = 2**30, 10**9
MEMORY_NOTE = (
    "PyTorch GiB: total_memory as PyTorch reports it (the catalog's pytorch_total_memory_bytes); a card holds the "
    "run when it covers needs_card_memory_bytes, as measure --plan --memory-gib judges."
)
NOMINAL = "memory_gb x 10**9 (nominal)"  # what a card without PyTorch's figure is judged on
NOMINAL_NOTE = (
    "*: no PyTorch figure recorded: judged on the nominal memory_gb x 10**9 bytes, which PyTorch may not see whole; "
    "environment on the rented box gives its figure, a measure there is the proof."
)


def read_input(path):
    """The bytes of a file, or of standard input for ``-`` (bounded alike), and the name to refuse it by."""
    if path != "-":
        return read_bounded(path, repr(path)), repr(path)
    name = "standard input"
    try:
        data = sys.stdin.buffer.read(MAX_TABLE_BYTES + 1)
    except (AttributeError, OSError, ValueError) as error:  # no stdin, a closed one, an unreadable one
        fail(name, f"cannot be read ({getattr(error, 'strerror', None) or type(error).__name__})")
    if len(data) > MAX_TABLE_BYTES:
        fail(name, f"larger than {MAX_TABLE_BYTES} bytes")
    return data, name


def is_positive_int(value):
    """A JSON whole number of 1 to MAX_DIGITS digits: what mesure_memoire.py writes (in_units' 200-digit
    decimals would fail past about 200)."""
    return type(value) is int and 0 < value < 10**MAX_DIGITS


def plan_text(data, name):
    """A plan's bytes as text: UTF-8, with or without a byte order mark, or UTF-16 with one (either order):
    what Windows PowerShell 5.1's ">" writes (UTF-16 LE, a mark, CRLF, which JSON reads as spaces)."""
    utf16 = data.startswith((b"\xff\xfe", b"\xfe\xff"))
    try:
        return data.decode("utf-16" if utf16 else "utf-8").removeprefix("\ufeff")  # "utf-16" drops its own mark
    except UnicodeDecodeError:
        fail(name, "not a plan: neither UTF-8 nor UTF-16 with a byte order mark")


def parse_plan(data, name):
    """The configuration and needs of a plan file, checked; anything else is refused."""
    import json

    try:
        plan = json.loads(plan_text(data, name))
    except (ValueError, RecursionError):  # not JSON, or nested past the parser's depth
        plan = None
    if not isinstance(plan, dict) or plan.get("kit") != PLAN_KIT or "plan_schema_version" not in plan:
        fail(name, "not a plan: expected the JSON of mesure_memoire.py measure --plan --json")
    version = plan["plan_schema_version"]
    if type(version) is not int or version not in PLAN_SCHEMA_VERSIONS:
        known = ", ".join(map(str, PLAN_SCHEMA_VERSIONS))
        fail(name, f"plan_schema_version {json.dumps(version)[:40]} is not one this calculator reads ({known})")
    config = plan.get("configuration")
    sizes_valid = isinstance(config, dict) and all(is_positive_int(config.get(key)) for key in FIT_SIZES)
    needs = {key: plan.get(key) for key in ("needs_card_memory_bytes", "needs_host_memory_bytes")}
    if not sizes_valid or config.get("dtype") not in PLAN_DTYPES or not all(map(is_positive_int, needs.values())):
        fail(name, "a plan with a missing or invalid configuration or needs figure")
    return {"configuration": {key: config[key] for key in (*FIT_SIZES, "dtype")}, **needs}


def holds_run(needs_card_memory_bytes, card_memory_bytes):
    """mesure_memoire.py's holds_run (--plan --memory-gib), copied: a card holds the run when
    its memory covers the plan's needs, which already count the margin and the context allowance.  One rule:
    tests/test_for_plan.py holds both scripts to the same verdict on every catalog card."""
    return needs_card_memory_bytes <= card_memory_bytes


def cards_for_plan(catalog, plan, days):
    """One row per GPU model of the catalog: whether one GPU of it holds the run, the room left (negative:
    lacking) and the price of one lot for ``days``.  Each card is judged on the memory PyTorch reports for it,
    else on its nominal memory (the row says which).  Fitting rows first, cheapest first; then the others,
    closest to fitting first."""
    needs = plan["needs_card_memory_bytes"]
    rows = []
    for tariff in catalog:
        if tariff["days"] != days:
            continue
        figure = tariff["pytorch_total_memory_bytes"]
        memory_bytes = tariff["memory_gb"] * GB_BYTES if figure is None else figure
        rows.append(
            {
                "gpu": tariff["gpu"],
                "model": tariff["model"],
                "memory_gb": tariff["memory_gb"],
                "pytorch_total_memory_bytes": figure,
                "judged_memory_bytes": memory_bytes,
                "judged_on": NOMINAL if figure is None else "pytorch_total_memory_bytes",
                "fits": holds_run(needs, memory_bytes),
                "room_bytes": memory_bytes - needs,
                "gpus_per_lot": tariff["gpus_per_lot"],
                "lot_price_cents": tariff["price_cents"],
            }
        )
    rows.sort(key=lambda r: (not r["fits"], 0 if r["fits"] else -r["room_bytes"], r["lot_price_cents"]))
    return {
        **plan,
        "days": days,
        "gpus_per_run": 1,
        "cards": rows,
        "memory_is": MEMORY_NOTE,
        "currency": catalog[0]["currency"],
        "snapshot_date": catalog[0]["snapshot_date"],
    }


def in_units(value_bytes, unit_bytes):
    """``value_bytes / unit_bytes`` rounded half-up to two decimals, as a string."""
    from decimal import ROUND_HALF_UP, Context, Decimal, localcontext

    with localcontext(Context(prec=200)):
        return str((Decimal(value_bytes) / unit_bytes).quantize(Decimal("0.01"), rounding=ROUND_HALF_UP))


def pytorch_gib(figure):
    """A card's PyTorch figure in GiB for a table, or "none" when the catalog records none."""
    return "none" if figure is None else in_units(figure, GIB_BYTES)


def card_cells(row, currency):
    room = "left" if row["fits"] else "short"
    return (
        row["gpu"],
        row["model"],
        str(row["memory_gb"]),
        pytorch_gib(row["pytorch_total_memory_bytes"]),
        ("yes" if row["fits"] else "no") + ("*" if row["judged_on"] == NOMINAL else ""),
        f"{in_units(abs(row['room_bytes']), GIB_BYTES)} {room}",
        f"{in_units(abs(row['room_bytes']), GB_BYTES)} {room}",
        str(row["gpus_per_lot"]),
        f"{cents_to_usd(row['lot_price_cents'])} {currency}",
    )


def format_cards(data):
    config, needs, host, days = (
        data[key] for key in ("configuration", "needs_card_memory_bytes", "needs_host_memory_bytes", "days")
    )
    header = (
        "gpu",
        "model",
        "memory GB",
        "PyTorch GiB",
        "holds the run",
        "room GiB",
        "room GB",
        "GPUs per lot",
        "lot price",
    )
    table = columns_text([header, *(card_cells(row, data["currency"]) for row in data["cards"])])
    return "\n".join(
        [
            f"Plan: batch {config['batch']}, context {config['context']}, width {config['width']}, "
            f"{config['dtype']}; one card needs {needs} bytes = {in_units(needs, GIB_BYTES)} GiB = "
            f"{in_units(needs, GB_BYTES)} GB; the host needs {host} bytes = {in_units(host, GIB_BYTES)} GiB of RAM.",
            f"One GPU per run, {days}-day packages; those that hold the run first, cheapest first, then the closest:",
            *table,
            f"Lot price: one lot for {days} days, whatever its GPUs (the run uses one); IteraGPU catalog snapshot "
            f"of {data['snapshot_date']}, whole {data['currency']} cents.",
            data["memory_is"],
            *([NOMINAL_NOTE] if any(row["judged_on"] == NOMINAL for row in data["cards"]) else []),
        ]
    )


# --- text output ---------------------------------------------------------------------------------------


def columns_text(rows, left_aligned=2):
    """Rows of cells as aligned columns: the first ``left_aligned`` columns left-aligned, the others right-aligned."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return [
        "  ".join(cell.ljust(widths[i]) if i < left_aligned else cell.rjust(widths[i]) for i, cell in enumerate(row))
        for row in rows
    ]


def format_package(data):
    usd = lambda cents: f"{cents_to_usd(cents)} {data['currency']}"  # noqa: E731
    cost = "not computed: add --accepted-results N (distinct useful units really accepted)"
    if data["cost_per_accepted_result_usd"] is not None:
        cost = (
            f"{data['cost_per_accepted_result_usd']} {data['currency']} = total price / "
            f"{data['accepted_results']} accepted results ({COST_ROUNDING})"
        )
    return f"""Package: {data["model"]} ({data["gpu"]}), {data["days"]} days, {data["lots"]} lot(s)
  GPUs                      {data["gpus"]} ({data["gpus_per_lot"]} per lot x {data["lots"]} lot(s))
  lot price                 {usd(data["lot_price_cents"])} ({data["lot_price_cents"]} cents)
  total price               {usd(data["total_price_cents"])} ({data["total_price_cents"]} cents) \
= lot price x {data["lots"]}
  cost per accepted result  {cost}
Prices: IteraGPU catalog snapshot of {data["snapshot_date"]}, whole {data["currency"]} cents for the whole duration \
(3, 7 or 30 days), no hourly proration.
The CSV proves neither current availability nor a reservation: check the offer shown before buying."""


def catalog_table(catalog, days=None):
    """Rows of the catalog (optionally one duration) with the price per GPU-day, as data."""
    return [
        {**t, "usd_per_gpu_day": usd_share(t["price_cents"], t["days"] * t["gpus_per_lot"])}
        for t in sorted(catalog, key=lambda t: (t["gpu"], t["days"]))
        if days in (None, t["days"])
    ]


def format_catalog(rows):
    header = ("gpu", "model", "memory_gb", "PyTorch GiB", "gpus_per_lot", "days", "lot price", "per GPU-day")
    rows_of_cells = [header] + [
        (
            r["gpu"],
            r["model"],
            str(r["memory_gb"]),
            pytorch_gib(r["pytorch_total_memory_bytes"]),
            str(r["gpus_per_lot"]),
            str(r["days"]),
            f"{cents_to_usd(r['price_cents'])} {r['currency']}",
            f"{r['usd_per_gpu_day']} {r['currency']}",
        )
        for r in rows
    ]
    return "\n".join(
        columns_text(rows_of_cells)
        + [
            f"IteraGPU catalog snapshot of {rows[0]['snapshot_date']}; per GPU-day rounded half-up to the cent.",
            "memory_gb: as advertised; PyTorch GiB: total_memory as PyTorch reports it (pytorch_total_memory_bytes), "
            "what --for-plan judges on; none: no figure recorded, --for-plan judges on memory_gb x 10**9 bytes.",
        ]
    )


def format_rentals(data):
    currency = data["currency"]
    rows_of_cells = [
        (
            "rental_id",
            "gpu",
            "days",
            "lots",
            "GPUs",
            "total price",
            "runs",
            "submitted",
            "accepted",
            "per accepted result",
        )
    ] + [
        (
            r["rental_id"],
            r["gpu"],
            str(r["days"]),
            str(r["lots"]),
            str(r["gpus"]),
            f"{cents_to_usd(r['total_price_cents'])} {currency}",
            str(r["runs"]),
            str(r["units_submitted"]),
            str(r["units_accepted"]),
            "none accepted"
            if r["cost_per_accepted_result_usd"] is None
            else f"{r['cost_per_accepted_result_usd']} {currency}",
        )
        for r in data["rentals"]
    ]
    return "\n".join(
        [
            f"Rentals, cheapest accepted result first; quality metric {data['quality_metric']}, "
            f"threshold {data['threshold']}:",
            *columns_text(rows_of_cells),
            f"Each rental's whole price counts once, however many runs it hosted: IteraGPU catalog snapshot of "
            f"{data['snapshot_date']}, whole {currency} cents, no hourly proration.",
            f"Cost per accepted result = total price / units accepted over the rental's runs, {COST_ROUNDING}.",
        ]
    )


# --- command line: argparse under the kit's contract ---------------------------------------------------
# This script runs alone, so it holds a copy of mesure_memoire.py's command-line contract (the block
# between the markers below, error class renamed; tests/test_repository.py checks that it is identical):
# misuse is one line and exit 2, --help exits 0, an unwritable stdout exits 1 (a closed pipe silently),
# Ctrl-C 130, SIGTERM 143.

SUMMARY = "IteraGPU Lab v1: the price of a whole IteraGPU package, and the cost of one accepted result."
USAGE = (
    f"%(prog)s (--gpu SLUG --days N [--lots N] [--accepted-results N]\n{' ' * (len(PROG) + 8)}"
    f"| --list [--days N] | --results FILE\n{' ' * (len(PROG) + 8)}"
    "| --for-plan FILE --days N) [--catalog CSV] [--json]"
)
# The options: name -> (metavar, or None for a flag; help).  The parser and its --help both read it.
OPTIONS = {
    "--gpu": ("SLUG", "the GPU model of the package to price, e.g. b200 (any case; see --list)"),
    "--list": (None, "print the catalog: the memory advertised and as PyTorch reports it, the price per GPU-day"),
    "--results": ("FILE", f"a filled {RESULTS_FILE_NAME}: the cost per accepted result of each rental"),
    "--for-plan": (
        "FILE",
        "measure --plan --json's output (-: stdin): which catalog GPU holds the run, judged as --memory-gib judges, "
        "on the memory PyTorch reports for each card (see --list)",
    ),
    "--days": ("N", "3, 7 or 30 days, no proration (--gpu, --for-plan); with --list: a filter"),
    "--lots": ("N", "with --gpu: the number of lots, a positive whole number (default 1)"),
    "--accepted-results": ("N", "with --gpu: distinct useful units really accepted; no default on purpose"),
    "--catalog": ("CSV", f"the price file (default: {CATALOG_FILE_NAME} beside this script)"),
    "--json": (None, "print JSON instead of text"),
}
RESULTS_HELP = f"--results reads these columns, in this order: {', '.join(RESULTS_COLUMNS)}."
MODES = {  # each mode, and the options that go with it
    "--gpu": ("--gpu", "--days", "--lots", "--accepted-results", "--catalog", "--json"),
    "--list": ("--list", "--days", "--catalog", "--json"),
    "--results": ("--results", "--catalog", "--json"),
    "--for-plan": ("--for-plan", "--days", "--catalog", "--json"),
}


def parse_command_line(argv):
    """The mode and the options given, checked: (mode, {option: value, True for a flag})."""
    parser = ArgumentParser(prog=PROG, usage=USAGE, description=SUMMARY, epilog=RESULTS_HELP, add_help=False)
    parser.add_argument("-h", "--help", action="help", help="print this help and exit")
    for option, (metavar, text) in OPTIONS.items():
        value = {"metavar": metavar} if metavar else {"nargs": 0, "const": True}
        parser.add_argument(option, action=Once, help=text, **value)
    namespace = parser.parse_args(argv)
    given = {
        f"--{dest.replace('_', '-')}": getattr(namespace, dest) for dest in getattr(namespace, "_given_options", ())
    }
    mode = next((option for option in given if option in MODES), None)
    if mode is None:
        raise PricingError("one of --gpu, --list, --results or --for-plan is required; see --help")
    for option in given:
        if option not in MODES[mode]:
            raise PricingError(f"{option}: not allowed with {mode}")
        if OPTIONS[option][0] in ("CSV", "FILE") and given[option] == "":
            raise PricingError(f"{option}: expected a file name, got ''")
    days = given.get("--days")
    if days is not None and days not in DURATIONS_TEXT:
        raise PricingError(f"--days: expected 3, 7 or 30 (fixed durations, no proration), got {days!r}")
    if mode in ("--gpu", "--for-plan") and days is None:
        raise PricingError(f"--days is required with {mode} (3, 7 or 30)")
    return mode, given


def run(argv):
    """Compute what the command line asks for; returns the text to print."""
    mode, given = parse_command_line(argv)
    catalog = load_catalog(given.get("--catalog"))
    days = given.get("--days")
    if mode == "--list":
        data = catalog_table(catalog, days and int(days))
        text = format_catalog(data)
    elif mode == "--results":
        path = given["--results"]
        data = rental_table(read_bounded(path, repr(path)), repr(path), catalog, os.path.dirname(path))
        text = format_rentals(data)
    elif mode == "--for-plan":
        data = cards_for_plan(catalog, parse_plan(*read_input(given["--for-plan"])), int(days))
        text = format_cards(data)
    else:
        data = price_package(catalog, given["--gpu"], days, given.get("--lots", "1"), given.get("--accepted-results"))
        text = format_package(data)
    if "--json" in given:
        import json

        text = json.dumps(data, indent=2)
    return text


def print_answer(argv):
    # One write: an output that fails fails before any of it is shown.  The text is escaped where stdout
    # cannot encode it (PYTHONIOENCODING=ascii, a C locale): a GPU name in a catalog is data, not an error.
    encoding = getattr(sys.stdout, "encoding", None) or "utf-8"
    sys.stdout.write((run(argv) + "\n").encode(encoding, "backslashreplace").decode(encoding))


# >>> command-line contract
HELP_WIDTH = 100  # fixed, so that argparse never reads COLUMNS from the environment


class ArgumentParser(argparse.ArgumentParser):
    """argparse under the contract: no abbreviations, no colour, a fixed width, misuse as one PricingError."""

    def __init__(self, **kwargs):
        kwargs.setdefault("allow_abbrev", False)
        kwargs.setdefault("formatter_class", lambda prog: argparse.HelpFormatter(prog, width=HELP_WIDTH))
        if sys.version_info >= (3, 14):
            kwargs.setdefault("color", False)  # argparse would read NO_COLOR and FORCE_COLOR
        super().__init__(**kwargs)

    def error(self, message):
        command = self.prog.partition(" ")[2]  # a subcommand's parser: name the command
        raise PricingError(f"{command}: {message}" if command else message)


class Once(argparse.Action):
    """Store an option's value and refuse it given twice (argparse would keep the last); records the order."""

    def __call__(self, parser, namespace, values, option_string=None):
        given = getattr(namespace, "_given_options", ())
        if self.dest in given:
            parser.error(f"argument {option_string}: given twice")
        namespace._given_options = (*given, self.dest)
        setattr(namespace, self.dest, self.const if self.nargs == 0 else values)


class GuardedStdout:
    """sys.stdout while a command runs: a failed write or flush raises GuardedStdout.Failed (argparse would
    swallow an OSError while printing the help), exit 1."""

    class Failed(Exception):
        pass

    def __init__(self, stream):
        self.stream = stream

    def write(self, text):
        return self._call("write", text)

    def flush(self):
        if self.stream is not None:  # descriptor 1 closed: only a write fails (a command may print nothing)
            self._call("flush")

    def __getattr__(self, name):
        return getattr(self.stream, name)

    def _call(self, name, *args):
        try:
            return getattr(self.stream, name)(*args)
        except (AttributeError, OSError, ValueError) as error:  # no stream, a closed one, a character it cannot encode
            raise self.Failed(error) from None

    def failed(self, prog, error):
        """One line, none for a closed pipe (as POSIX tools do); returns 1."""
        if not isinstance(error, BrokenPipeError):
            closed = self.stream is None
            say(prog, "cannot write the output: " + ("standard output is closed" if closed else describe_error(error)))
        to_devnull(self.stream)
        return 1


def say(prog, message, prefix="error: "):
    """One line on stderr, starting with the program's name; a closed stderr is not an error."""
    try:
        sys.stderr.write(f"{prog}: {prefix}{one_line(message)}\n")
        sys.stderr.flush()
    except (AttributeError, OSError, ValueError):
        to_devnull(sys.stderr)


def to_devnull(stream):
    """Point the real stdout's or stderr's descriptor at os.devnull: what the stream still holds then goes
    nowhere at the interpreter's final flush, instead of failing there (and turning the exit status into 120)."""
    if stream is not None and stream in (sys.__stdout__, sys.__stderr__):
        try:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, stream.fileno())
            os.close(devnull)
        except (OSError, ValueError):
            pass


class Terminated(KeyboardInterrupt):
    """SIGTERM (timeout, a scheduler, docker stop), raised where the program stands: it cleans up as on Ctrl-C."""


def _terminated(signal_number, frame):
    raise Terminated


def run_command_line(prog, command, argv, interrupted="interrupted (Ctrl-C)"):
    """Run ``command(argv)`` under the contract; returns the exit status, never raises SystemExit."""
    import signal

    guarded = sys.stdout = GuardedStdout(sys.stdout)
    try:  # SIGINT's too: both are set aside while an interruption is said (below), then put back
        handlers = {signal.SIGINT: signal.getsignal(signal.SIGINT)}
        handlers[signal.SIGTERM] = signal.signal(signal.SIGTERM, _terminated)
    except ValueError:  # not the main thread, which alone handles signals: they stay as they were
        handlers = {}
    try:
        try:
            status = command(argv) or 0
        except SystemExit as exit_:  # argparse after --help; its errors are PricingError (ArgumentParser.error)
            status = exit_.code if isinstance(exit_.code, int) else 2
        sys.stdout.flush()
    except PricingError as error:
        say(prog, error)
        return error.exit_code
    except GuardedStdout.Failed as failure:
        return guarded.failed(prog, *failure.args)
    except KeyboardInterrupt as stop:  # SIGTERM too (Terminated); its text, if any, on the same line: what is left
        for number in handlers:  # another signal while this one is said: the one line, whole, and this status
            signal.signal(number, signal.SIG_IGN)
        said = "SIGTERM" if isinstance(stop, Terminated) else "Ctrl-C"
        say(prog, interrupted.replace("Ctrl-C", said) + "".join(map(str, stop.args)), prefix="")
        return 143 if said == "SIGTERM" else 130  # 128 + 15 or 2, as a shell reports a process the signal ended
    finally:
        sys.stdout = guarded.stream
        for number, handler in handlers.items():
            signal.signal(number, handler)
    return status


# <<< command-line contract


def main(argv=None) -> int:
    """Exit status: 0 done, 1 the output could not be written, 2 a refusal, 130 interrupted, 143 SIGTERM."""
    return run_command_line(
        PROG, print_answer, sys.argv[1:] if argv is None else argv, "interrupted (Ctrl-C); nothing written"
    )


if __name__ == "__main__":
    raise SystemExit(main())
