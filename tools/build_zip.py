"""Build the release: MANIFEST.json, then a byte-reproducible ``iteragpu-lab-v1.zip`` (not shipped).

Usage::

    python tools/build_zip.py                 # regenerate MANIFEST.json, write dist/iteragpu-lab-v1.zip
    python tools/build_zip.py --check         # exit 1 if MANIFEST.json is stale (2 if a member is unfit)

The archive holds exactly the nine members under one folder, in sorted order, each dated
2026-09-24 00:00:00 (or ``SOURCE_DATE_EPOCH``, clamped at 1980-01-01), mode 0644, made on
"Unix": two builds, on any machine and in any time zone, give the same bytes.  It refuses to
build (exit 2, one line, every file as it was) when a member is missing or unfit, the notebook
carries outputs, the raw-results template holds a row, the tariff catalog fails the
calculator's own validation, or the output would replace an existing file: only this tool's
own archive at its default place is ever replaced.  Everything is computed and checked in
memory first; the archive and the manifest are then written beside their final names and
renamed together.  Ctrl-C (exit 130) or SIGTERM (exit 143) leave every file as it was.
"""

import argparse
import contextlib
import hashlib
import io
import json
import os
import signal
import stat
import sys
import time
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

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
# The members are text files of a few KiB: a bigger one is a mistake, and the bound keeps reading,
# hashing and compressing short, so that Ctrl-C acts at once.
MEMBER_LIMIT_BYTES = 2**20
ARCHIVE_LIMIT_BYTES = 16 * 2**20  # an existing archive bigger than this is not this tool's
PROGRAM = "build_zip.py"


class BuildError(Exception):
    """A refusal to build: one line, exit 2."""


class StaleManifest(Exception):
    """--check found MANIFEST.json out of date: one line, exit 1 (a rebuild fixes it)."""


class Interrupted(BaseException):
    """SIGTERM, raised where the process is so that the temporary files are removed."""

    def __init__(self, signal_number):
        super().__init__(signal_number)
        self.signal_number = signal_number


def one_line(text):
    """``text`` with control characters escaped: a message stays on one line whatever the user typed."""
    return "".join(character if character.isprintable() else repr(character)[1:-1] for character in str(text))


def shown(value):
    """A user's value as it appears in a message: repr, so a newline or an escape is visible and harmless."""
    return repr(str(value))


class _Parser(argparse.ArgumentParser):
    """Usage errors become one line (BuildError) instead of the usage text."""

    def error(self, message):
        raise BuildError(one_line(message))


def member_timestamp(epoch=None):
    """The members' zip date: the release date, or ``epoch`` (SOURCE_DATE_EPOCH's text) clamped to zip's range."""
    if epoch is None:
        return RELEASE_DATE
    # int() would also take " 12", "+12", "1_000" and non-ASCII digits such as Arabic-Indic ones.
    if not (epoch.isascii() and epoch.isdigit()):
        raise BuildError(f"SOURCE_DATE_EPOCH must be whole seconds in ASCII digits, got {epoch!r}")
    # Twelve digits already pass 2107; the length test keeps int() away from huge strings.  Leading zeros
    # do not count: "0000000000001" is 1980, not a far future.
    digits = epoch.lstrip("0") or "0"
    seconds = ZIP_LAST_SECONDS if len(digits) > 12 else min(max(int(digits), ZIP_EPOCH_SECONDS), ZIP_LAST_SECONDS)
    return time.gmtime(seconds)[:6]


def read_regular(path, label, limit=MEMBER_LIMIT_BYTES):
    """The bytes of a regular file of at most ``limit`` bytes; a FIFO, a device or a folder is refused unread."""
    try:
        # O_NONBLOCK: opening a FIFO must not wait for a writer; fstat then refuses it.
        descriptor = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except (FileNotFoundError, NotADirectoryError):
        raise
    except OSError as error:
        raise BuildError(f"{label}: cannot be read ({error.strerror or type(error).__name__})") from None
    if not stat.S_ISREG(os.fstat(descriptor).st_mode):
        os.close(descriptor)
        raise BuildError(f"{label} is not a regular file")
    with os.fdopen(descriptor, "rb") as stream:
        try:
            data = stream.read(limit + 1)
        except OSError as error:
            raise BuildError(f"{label}: cannot be read ({error.strerror or type(error).__name__})") from None
    if len(data) > limit:
        raise BuildError(f"{label} is larger than {limit} bytes")
    return data


def read_members(source):
    """name -> bytes for the eight content members; every missing one is named at once."""
    contents, missing = {}, []
    for name in MEMBERS:
        if name == MANIFEST:
            continue
        try:
            contents[name] = read_regular(source / name, name)
        except (FileNotFoundError, NotADirectoryError):
            missing.append(name)
    if missing:
        raise BuildError(f"missing member(s): {', '.join(missing)}")
    return contents


def check_members(contents):
    """Refuse what must never ship; returns nothing, raises BuildError."""
    for folder in (str(ROOT / "tools"), str(ROOT)):
        if folder not in sys.path:
            sys.path.insert(0, folder)
    import build_notebook  # the notebook's own output check; imported here, where Ctrl-C is handled
    import calcul_forfaits  # the catalog's own validation

    try:
        notebook = json.loads(contents["mesure-memoire.ipynb"].decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as error:
        raise BuildError(f"mesure-memoire.ipynb is not a JSON notebook ({one_line(error)})") from None
    cells = notebook.get("cells") if isinstance(notebook, dict) else None
    if not isinstance(cells, list) or not all(isinstance(cell, dict) for cell in cells):
        raise BuildError("mesure-memoire.ipynb is not a notebook: expected a JSON object with a list of cells")
    saved = build_notebook.saved_output_problems(notebook)
    if saved:
        raise BuildError(
            f"mesure-memoire.ipynb has saved outputs or execution counts in: {one_line(', '.join(map(str, saved)))}"
        )
    try:
        rows = contents["resultats-bruts.csv"].decode("utf-8").splitlines()
    except UnicodeDecodeError as error:
        raise BuildError(f"resultats-bruts.csv is not UTF-8 (byte {error.start})") from None
    if len(rows) != 1:
        raise BuildError(f"resultats-bruts.csv must hold its header only, found {len(rows)} lines")
    try:
        calcul_forfaits.parse_catalog(contents["tarifs-forfaits.csv"], "tarifs-forfaits.csv")
    except calcul_forfaits.PricingError as error:
        raise BuildError(f"tarifs-forfaits.csv fails validation: {one_line(error)}") from None


def manifest_text(contents):
    """MANIFEST.json's text for these member bytes."""
    members = []
    for name in MEMBERS:
        if name == MANIFEST:  # a file cannot hold its own hash
            members.append({"path": name, "bytes": None, "sha256": None})
            continue
        data = contents[name]
        members.append({"path": name, "bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()})
    manifest = {
        "name": NAME,
        "folder": f"{NAME}/",
        "note": f"{MANIFEST} lists itself without size or hash: a file cannot contain its own hash.",
        "members": members,
    }
    return json.dumps(manifest, indent=2) + "\n"


def stale_members(source, contents=None):
    """Members whose committed manifest entry differs from the files; [MANIFEST] when only its text differs."""
    contents = read_members(source) if contents is None else contents
    expected_text = manifest_text(contents)
    try:
        committed_bytes = read_regular(source / MANIFEST, MANIFEST)
    except (FileNotFoundError, NotADirectoryError):
        return [MANIFEST]
    if committed_bytes == expected_text.encode("utf-8"):  # byte for byte: the manifest is shipped too
        return []
    try:
        committed = json.loads(committed_bytes.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        return [MANIFEST]
    entries = committed.get("members") if isinstance(committed, dict) else None
    if not isinstance(entries, list) or not all(isinstance(entry, dict) for entry in entries):
        return [MANIFEST]
    by_path = {str(entry.get("path")): entry for entry in entries}
    differing = [e["path"] for e in json.loads(expected_text)["members"] if by_path.get(e["path"]) != e]
    differing += sorted(set(by_path) - set(MEMBERS))
    return differing or [MANIFEST]


def archive_bytes(contents, manifest, date_time):
    """The whole zip, in memory: nothing reaches the disk before every check has passed."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        for name in MEMBERS:
            info = zipfile.ZipInfo(f"{NAME}/{name}", date_time)
            info.create_system = UNIX
            info.external_attr = REGULAR_FILE_0644 << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            data = manifest.encode("utf-8") if name == MANIFEST else contents[name]
            archive.writestr(info, data, compresslevel=9)
    return buffer.getvalue()


def is_own_archive(path):
    """Whether ``path`` is a regular file holding a zip of exactly this kit's members (any version)."""
    try:
        status = os.lstat(path)
        if not stat.S_ISREG(status.st_mode) or status.st_size > ARCHIVE_LIMIT_BYTES:
            return False
        with zipfile.ZipFile(path) as archive:
            return archive.namelist() == [f"{NAME}/{name}" for name in MEMBERS]
    except (OSError, zipfile.BadZipFile, ValueError):
        return False


def check_output(output, replaceable):
    """Refuse an output that names a folder, an existing file (unless ``replaceable``: the default archive)."""
    if os.path.isdir(output):
        raise BuildError(f"--output {shown(output)} is a folder: name the archive file")
    if os.path.lexists(output):
        if not replaceable:
            raise BuildError(f"--output {shown(output)} already exists: this tool never writes over a file")
        if not is_own_archive(output):
            raise BuildError(f"{shown(output)} exists and is not this tool's archive: move it away")
    parent = output.parent
    if os.path.lexists(parent) and not parent.is_dir():
        raise BuildError(f"the folder of {shown(output)} is not a folder")


def create_temporary(final, data, created):
    """Write ``data`` to ``final.partial``, created new: an existing one (someone's) is never replaced.

    The path joins ``created`` as soon as the file exists, so that an interruption at any later
    point still finds it to remove.
    """
    temporary = final.with_name(final.name + ".partial")
    try:
        stream = open(temporary, "xb")  # noqa: SIM115  (closed just below; these clauses are about opening)
    except FileExistsError:
        raise BuildError(f"{shown(temporary)} already exists (an interrupted build?): remove it, then retry") from None
    except OSError as error:
        raise BuildError(f"cannot write beside {shown(final)} ({error.strerror or type(error).__name__})") from None
    created.append(temporary)
    try:
        with stream:
            stream.write(data)
    except OSError as error:
        raise BuildError(f"cannot write {shown(temporary)} ({error.strerror or type(error).__name__})") from None
    return temporary


def link_new(temporary, final):
    """Give ``temporary``'s file the name ``final``, which must not exist (checked by the system, not before)."""
    try:
        os.link(temporary, final)
    except FileExistsError:
        raise BuildError(f"--output {shown(final)} already exists: this tool never writes over a file") from None
    except OSError:
        # A file system without hard links: an exclusive create still never replaces anything.
        with open(temporary, "rb") as data, open(final, "xb") as stream:
            try:
                stream.write(data.read())
            except BaseException:
                final.unlink(missing_ok=True)
                raise


@contextlib.contextmanager
def signals_held():
    """Ctrl-C and SIGTERM wait while the two renames happen: both files change, or neither."""
    if not hasattr(signal, "pthread_sigmask"):
        yield
        return
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


def write_release(source, output, replaceable, manifest, archive, progress):
    """Write the archive and, if it changed, the manifest; ``progress["written"]`` once both are in place."""
    manifest_path = source / MANIFEST
    try:
        current_manifest = read_regular(manifest_path, MANIFEST)
    except (FileNotFoundError, NotADirectoryError):
        current_manifest = None
    new_manifest = manifest.encode("utf-8")
    created_folder = False
    temporaries = []
    try:
        if not output.parent.is_dir():
            if not replaceable:
                raise BuildError(f"--output: the folder of {shown(output)} does not exist")
            try:
                output.parent.mkdir()
            except OSError as error:
                raise BuildError(f"cannot create {shown(output.parent)} ({error.strerror})") from None
            created_folder = True
        archive_temporary = create_temporary(output, archive, temporaries)
        manifest_temporary = None
        if current_manifest != new_manifest:
            manifest_temporary = create_temporary(manifest_path, new_manifest, temporaries)
        with signals_held():
            replacing = replaceable and os.path.lexists(output)
            if replacing:
                os.replace(archive_temporary, output)
            else:
                link_new(archive_temporary, output)
            if manifest_temporary is not None:
                try:
                    os.replace(manifest_temporary, manifest_path)
                except OSError as error:
                    if not replacing:  # a new archive without its manifest would be a half-done build
                        output.unlink(missing_ok=True)
                    reason = error.strerror or type(error).__name__
                    archive_state = "the archive was replaced" if replacing else "no archive written"
                    raise BuildError(f"cannot replace {MANIFEST} ({reason}); {archive_state}") from None
            progress["written"] = True
    except OSError as error:
        raise BuildError(f"cannot write {shown(output)} ({error.strerror or type(error).__name__})") from None
    finally:
        for temporary in temporaries:
            with contextlib.suppress(OSError):
                temporary.unlink(missing_ok=True)
        if created_folder and not progress.get("written"):
            with contextlib.suppress(OSError):
                output.parent.rmdir()


def build_parser():
    parser = _Parser(prog=PROGRAM, description=__doc__.split("\n\n")[0])
    parser.add_argument("--output", type=Path, help=f"a new archive file to write (default: dist/{NAME}.zip)")
    parser.add_argument("--check", action="store_true", help="only check that MANIFEST.json matches the files")
    parser.add_argument("--source", type=Path, default=ROOT, help="the folder holding the members (default: here)")
    return parser


def run(args, progress):
    """Check or build; returns the line for stdout (None for none).  Failures raise."""
    source = args.source
    if args.check and args.output is not None:
        raise BuildError("--output does not apply to --check, which writes nothing")
    contents = read_members(source)
    check_members(contents)  # --check too: what must never ship fails CI as well
    if args.check:
        stale = stale_members(source, contents)
        if stale:
            names = ", ".join(map(one_line, stale))
            raise StaleManifest(f"{MANIFEST} is stale for {names}: run python tools/build_zip.py")
        return None
    date_time = member_timestamp(os.environ.get("SOURCE_DATE_EPOCH"))  # the reproducible-builds convention
    default = source / "dist" / f"{NAME}.zip"
    output = default if args.output is None else args.output
    replaceable = os.path.abspath(output) == os.path.abspath(default)
    check_output(output, replaceable)
    manifest = manifest_text(contents)
    archive = archive_bytes(contents, manifest, date_time)
    write_release(source, output, replaceable, manifest, archive, progress)
    dated = "{:04d}-{:02d}-{:02d} {:02d}:{:02d}:{:02d}".format(*date_time)
    return f"wrote {one_line(output.name)}: {len(MEMBERS)} members under {NAME}/, dated {dated}"


def _raise_interrupted(signal_number, frame):
    raise Interrupted(signal_number)


def _report(line):
    """Print ``line`` on stdout; a closed or full stdout is one line on stderr (none for a broken pipe), exit 1."""
    if sys.stdout is None:
        print(f"{PROGRAM}: error: stdout is closed: {line}", file=sys.stderr)
        return 1
    try:
        print(line, flush=True)
    except OSError as error:
        with contextlib.suppress(OSError, ValueError):  # the interpreter's final flush must not fail again
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
        if not isinstance(error, BrokenPipeError):
            print(f"{PROGRAM}: error: cannot write to stdout ({error.strerror}): {line}", file=sys.stderr)
        return 1
    return 0


def main(argv=None) -> int:
    progress = {}
    previous_handler = None
    try:
        if signal.getsignal(signal.SIGTERM) is not signal.SIG_IGN:
            previous_handler = signal.signal(signal.SIGTERM, _raise_interrupted)
    except ValueError:  # not the main thread: SIGTERM keeps its default
        pass
    try:
        args = build_parser().parse_args(argv)
        line = run(args, progress)
    except StaleManifest as error:
        print(f"{PROGRAM}: {error}", file=sys.stderr)
        return 1
    except BuildError as error:
        print(f"{PROGRAM}: error: {error}", file=sys.stderr)
        return 2
    except (KeyboardInterrupt, Interrupted) as error:
        number = getattr(error, "signal_number", signal.SIGINT)
        what = "the archive and MANIFEST.json were written whole" if progress.get("written") else "nothing written"
        print(f"{PROGRAM}: interrupted by {signal.Signals(number).name}: {what}", file=sys.stderr)
        return 128 + number
    finally:
        if previous_handler is not None:
            signal.signal(signal.SIGTERM, previous_handler)
    return 0 if line is None else _report(line)


if __name__ == "__main__":
    raise SystemExit(main())
