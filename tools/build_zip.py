"""Build the release: a byte-reproducible dist/iteragpu-lab-v1.zip, then MANIFEST.json (a maintainer's tool)."""

import hashlib
import io
import json
import os
import sys
import zipfile
from pathlib import Path

PROG = "build_zip.py"
ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tools")]  # the kit's own code and build_notebook, from any working folder
if not (ROOT / "mesure_memoire.py").is_file():  # build_notebook would say so under its own name
    sys.stderr.write(f"{PROG}: error: mesure_memoire.py is missing from the kit's folder (the tool imports it)\n")
    raise SystemExit(2)
import build_notebook  # noqa: E402
import calcul_forfaits  # noqa: E402
from mesure_memoire import ArgumentParser, KitError, Once, one_line, run_command_line, say  # noqa: E402

NAME = "iteragpu-lab-v1"
MANIFEST = "MANIFEST.json"
NOTEBOOK = "mesure-memoire.ipynb"
MEMBERS = tuple(
    sorted(
        (
            "README.md",
            "LICENSE.txt",
            MANIFEST,
            "mesure_memoire.py",
            NOTEBOOK,
            "calcul_forfaits.py",
            "tarifs-forfaits.csv",
            "protocole-qualite.md",
            "resultats-bruts.csv",
        )
    )
)
# Every member carries the release date: no clock, time zone or SOURCE_DATE_EPOCH can change the bytes.
RELEASE_DATE = (2026, 9, 24, 0, 0, 0)
UNIX = 3  # zip's "version made by" system: the permission bits below are Unix ones
REGULAR_FILE_0644 = 0o100644
DESCRIPTION = (
    f"Write dist/{NAME}.zip, then {MANIFEST} if it changed: the nine members under {NAME}/, sorted, "
    "dated 2026-09-24 00:00:00, mode 0644, so that every build gives the same bytes. Refuses (exit 2, "
    "nothing written) a member that is missing or unfit, a notebook that tools/build_notebook.py did not "
    "generate, and any existing output but its own archive at dist/."
)


def reason(error):
    return error.strerror or type(error).__name__


def read_member(source, name):
    """The bytes of a member, None if it is missing."""
    path = source / name
    return path.read_bytes() if path.exists() else None


def read_members(source):
    """name -> bytes of the eight members the manifest hashes; every missing one is named at once."""
    contents = {name: read_member(source, name) for name in MEMBERS if name != MANIFEST}
    missing = [name for name, data in contents.items() if data is None]
    if missing:
        raise KitError(f"missing member(s): {', '.join(missing)}")
    return contents


def check_members(contents):
    """Refuse what must never ship, with the kit's own generator and validation rather than a copy of them."""
    # Byte for byte: a notebook saved by Jupyter (outputs, language_info.version, ...) is not the generated one.
    if contents[NOTEBOOK] != build_notebook.notebook_bytes(contents["mesure_memoire.py"]):
        raise KitError(
            f"{NOTEBOOK} is not what tools/build_notebook.py generates from mesure_memoire.py (saved "
            "from Jupyter, or edited?): run python tools/build_notebook.py"
        )
    rows = contents["resultats-bruts.csv"].splitlines()
    if len(rows) != 1:
        raise KitError(f"resultats-bruts.csv must hold its header only, found {len(rows)} lines")
    try:
        calcul_forfaits.parse_catalog(contents["tarifs-forfaits.csv"], "tarifs-forfaits.csv")
    except calcul_forfaits.PricingError as error:
        raise KitError(f"tarifs-forfaits.csv fails validation: {one_line(error)}") from None


def manifest_text(contents):
    """MANIFEST.json's text for these member bytes; it lists itself without size or hash."""
    members = [
        {"path": name, "bytes": None, "sha256": None}
        if name == MANIFEST
        else {"path": name, "bytes": len(contents[name]), "sha256": hashlib.sha256(contents[name]).hexdigest()}
        for name in MEMBERS
    ]
    note = f"{MANIFEST} lists itself without size or hash: a file cannot contain its own hash."
    return json.dumps({"name": NAME, "folder": f"{NAME}/", "note": note, "members": members}, indent=2) + "\n"


def stale_members(committed, expected):
    """The members whose entry in the committed manifest (its bytes, None if missing) differs from ``expected``'s;
    [MANIFEST] when only the rest of its text does."""
    if committed == expected.encode("utf-8"):
        return []
    try:  # not JSON (or missing): stale as a whole
        entries = {entry["path"]: entry for entry in json.loads(committed or b"")["members"]}
    except ValueError:
        return [MANIFEST]
    differing = [entry["path"] for entry in json.loads(expected)["members"] if entries.get(entry["path"]) != entry]
    differing += sorted(set(entries) - set(MEMBERS))  # entries for files that are no member
    if not differing:
        return [MANIFEST]
    return differing


def archive_bytes(contents, manifest):
    """The whole zip, in memory: sorted members under one folder, one date, mode 0644, deflated at level 9."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        for name in MEMBERS:
            info = zipfile.ZipInfo(f"{NAME}/{name}", RELEASE_DATE)
            info.create_system = UNIX
            info.external_attr = REGULAR_FILE_0644 << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            archive.writestr(info, manifest.encode("utf-8") if name == MANIFEST else contents[name], compresslevel=9)
    return buffer.getvalue()


def is_own_archive(path):
    """Whether ``path`` is a regular file, not a link, holding a zip of exactly this kit's members."""
    try:
        with zipfile.ZipFile(path) as archive:
            return not path.is_symlink() and archive.namelist() == [f"{NAME}/{name}" for name in MEMBERS]
    except (OSError, zipfile.BadZipFile):
        return False


def write(path, data, replace):
    """Write ``data`` whole to ``path`` (a new file only, unless ``replace``: this tool's own output), through a
    temporary name beside it, never through a link (build_notebook.write_whole)."""
    try:
        build_notebook.write_whole(path, data, replace)
    except FileExistsError:
        raise KitError(f"{path} already exists: this tool writes over nothing but its own outputs") from None
    except OSError as error:
        raise KitError(f"cannot write {path} ({reason(error)})") from None


def relative_name(path, root):
    """``path`` relative to the repository when it lies inside it."""
    try:
        return one_line(str(path.resolve().relative_to(root.resolve())))
    except ValueError:
        return one_line(str(path))


def command(argv):
    parser = ArgumentParser(prog=PROG, description=DESCRIPTION)
    parser.add_argument(
        "--output",
        action=Once,
        metavar="FILE",
        help=f"write the archive to this new file instead of dist/{NAME}.zip",
    )
    parser.add_argument(
        "--check",
        action=Once,
        nargs=0,
        const=True,
        default=False,
        help=f"write nothing; exit 1 if {MANIFEST} is stale, 2 if a member is unfit",
    )
    parser.add_argument(
        "--source",
        action=Once,
        type=Path,
        default=ROOT,
        metavar="FOLDER",
        help="the folder holding the members (default: this repository)",
    )
    args = parser.parse_args(argv)
    if args.check and args.output is not None:
        raise KitError("--output does not apply to --check, which writes nothing")
    contents = read_members(args.source)
    if (args.source / MANIFEST).is_symlink():  # written below: through a link, it would be someone else's file
        raise KitError(f"{MANIFEST} is a link: this tool writes over nothing but its own outputs")
    check_members(contents)  # --check too: what must never ship fails CI as well
    manifest = manifest_text(contents)
    committed = read_member(args.source, MANIFEST)
    if args.check:
        stale = stale_members(committed, manifest)
        if stale:
            say(PROG, f"{MANIFEST} is stale for {', '.join(stale)}: run python tools/build_zip.py", prefix="")
        return 1 if stale else 0
    default = args.source / "dist" / f"{NAME}.zip"
    output = default if args.output is None else Path(args.output)
    replace = os.path.abspath(output) == os.path.abspath(default)
    if replace and os.path.lexists(output) and not is_own_archive(output):
        raise KitError(f"{output} exists and is not this tool's archive: move it away")
    archive = archive_bytes(contents, manifest)
    if replace:
        try:
            default.parent.mkdir(exist_ok=True)
        except OSError as error:
            raise KitError(f"cannot create {default.parent} ({reason(error)})") from None
    write(output, archive, replace)
    updated = committed != manifest.encode("utf-8")
    if updated:
        write(args.source / MANIFEST, manifest.encode("utf-8"), replace=True)
    written = relative_name(output, args.source)
    summary = f"wrote {written}: {len(MEMBERS)} members under {NAME}/, dated 2026-09-24 00:00:00"
    if updated:
        summary += f"; {MANIFEST} updated"
    print(summary)
    return 0


def main(argv=None) -> int:
    return run_command_line(PROG, command, sys.argv[1:] if argv is None else argv)


if __name__ == "__main__":
    raise SystemExit(main())
