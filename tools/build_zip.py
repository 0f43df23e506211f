"""Build the release: MANIFEST.json, then a byte-reproducible ``iteragpu-lab-v1.zip`` (not shipped).

Usage::

    python tools/build_zip.py                 # regenerate MANIFEST.json, write dist/iteragpu-lab-v1.zip
    python tools/build_zip.py --check         # exit 1 if MANIFEST.json is stale (2 if a member is unfit)

The archive holds exactly the nine members under one folder, in sorted order, each dated
2026-09-24 00:00:00 (or ``SOURCE_DATE_EPOCH``, clamped at 1980-01-01), mode 0644, made on
"Unix": two builds, on any machine and in any time zone, give the same bytes.  It refuses to
build (exit 2, no archive, manifest unchanged) when a member is missing, the notebook carries
outputs, the raw-results template holds a row, or the tariff catalog fails the calculator's
own validation.
"""

import argparse
import hashlib
import json
import os
import sys
import time
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tools"))

import build_notebook  # noqa: E402  (the notebook's own output check)
import calcul_forfaits  # noqa: E402  (the catalog's own validation)

NAME = "iteragpu-lab-v1"
MANIFEST = "MANIFEST.json"
MEMBERS = tuple(sorted((
    "README.md", "LICENSE.txt", MANIFEST, "mesure_memoire.py", "mesure-memoire.ipynb", "calcul_forfaits.py",
    "tarifs-forfaits.csv", "protocole-qualite.md", "resultats-bruts.csv",
)))  # fmt: skip
RELEASE_DATE = (2026, 9, 24, 0, 0, 0)
ZIP_EPOCH_SECONDS = 315532800  # 1980-01-01, the earliest date a zip entry can hold
ZIP_LAST_SECONDS = 4354819198  # 2107-12-31 23:59:58, the latest
UNIX = 3  # zip "version made by" system: the permission bits below are Unix ones
REGULAR_FILE_0644 = 0o100644


class BuildError(Exception):
    """A refusal to build: one line, exit 2."""


def member_timestamp():
    epoch = os.environ.get("SOURCE_DATE_EPOCH")  # the reproducible-builds convention
    if epoch is None:
        return RELEASE_DATE
    try:
        seconds = min(max(int(epoch), ZIP_EPOCH_SECONDS), ZIP_LAST_SECONDS)
    except ValueError:
        raise BuildError(f"SOURCE_DATE_EPOCH must be whole seconds, got {epoch!r}") from None
    return time.gmtime(seconds)[:6]


def check_members(source):
    """Refuse what must never ship; returns nothing, raises BuildError."""
    missing = [name for name in MEMBERS if name != MANIFEST and not (source / name).is_file()]
    if missing:
        raise BuildError(f"missing member(s): {', '.join(missing)}")
    notebook = json.loads((source / "mesure-memoire.ipynb").read_text(encoding="utf-8"))
    saved = build_notebook.saved_output_problems(notebook)
    if saved:
        raise BuildError(f"mesure-memoire.ipynb has saved outputs or execution counts in: {', '.join(saved)}")
    rows = (source / "resultats-bruts.csv").read_text(encoding="utf-8").splitlines()
    if len(rows) != 1:
        raise BuildError(f"resultats-bruts.csv must hold its header only, found {len(rows)} lines")
    try:
        calcul_forfaits.load_catalog(source / "tarifs-forfaits.csv")
    except calcul_forfaits.PricingError as error:
        raise BuildError(f"tarifs-forfaits.csv fails validation: {error}") from None


def manifest_text(source):
    members = []
    for name in MEMBERS:
        if name == MANIFEST:  # a file cannot hold its own hash
            members.append({"path": name, "bytes": None, "sha256": None})
            continue
        data = (source / name).read_bytes()
        members.append({"path": name, "bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()})
    manifest = {
        "name": NAME,
        "folder": f"{NAME}/",
        "note": f"{MANIFEST} lists itself without size or hash: a file cannot contain its own hash.",
        "members": members,
    }
    return json.dumps(manifest, indent=2) + "\n"


def stale_members(source):
    """Members whose committed manifest entry differs from the files (or the manifest itself)."""
    path = source / MANIFEST
    if not path.is_file():
        return [MANIFEST]
    committed = json.loads(path.read_text(encoding="utf-8"))
    expected = json.loads(manifest_text(source))
    entries = {entry.get("path"): entry for entry in committed.get("members", [])}
    differing = [e["path"] for e in expected["members"] if entries.get(e["path"]) != e]
    differing += sorted(set(entries) - set(MEMBERS))
    if not differing and committed != expected:
        differing = [MANIFEST]
    return differing


def write_zip(source, output, date_time):
    temporary = output.with_name(output.name + ".partial")
    try:
        with zipfile.ZipFile(temporary, "w") as archive:
            for name in MEMBERS:
                info = zipfile.ZipInfo(f"{NAME}/{name}", date_time)
                info.create_system = UNIX
                info.external_attr = REGULAR_FILE_0644 << 16
                info.compress_type = zipfile.ZIP_DEFLATED
                archive.writestr(info, (source / name).read_bytes(), compresslevel=9)
        os.replace(temporary, output)  # a whole archive or none under the final name
    finally:
        temporary.unlink(missing_ok=True)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="build_zip.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--output", type=Path, help=f"the archive to write (default: dist/{NAME}.zip)")
    parser.add_argument("--check", action="store_true", help="only check that MANIFEST.json matches the files")
    parser.add_argument("--source", type=Path, default=ROOT, help="the folder holding the members (default: here)")
    args = parser.parse_args(argv)
    source = args.source
    try:
        check_members(source)  # --check too: what must never ship fails CI as well
        if args.check:
            stale = stale_members(source)
            if stale:
                print(f"build_zip.py: {MANIFEST} is stale for {', '.join(stale)}: run python tools/build_zip.py",
                      file=sys.stderr)  # fmt: skip
                return 1
            return 0
        date_time = member_timestamp()  # refuse a bad SOURCE_DATE_EPOCH before writing anything
        output = args.output
        if output is None:
            output = source / "dist" / f"{NAME}.zip"
            output.parent.mkdir(exist_ok=True)
        elif not output.parent.is_dir():
            raise BuildError(f"--output: the folder of {output.name} does not exist")
        text = manifest_text(source)
        if not (source / MANIFEST).is_file() or (source / MANIFEST).read_text(encoding="utf-8") != text:
            (source / MANIFEST).write_text(text, encoding="utf-8", newline="\n")
        write_zip(source, output, date_time)
    except BuildError as error:
        print(f"build_zip.py: error: {error}", file=sys.stderr)
        return 2
    print(f"wrote {output.name}: {len(MEMBERS)} members under {NAME}/, dated {date_time[:3]}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
