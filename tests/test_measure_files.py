"""`mesure_memoire.py measure`'s result file: the name checks and their limits, the atomic, never-overwriting
write, temporary files beside the result, the umask, and what a crash or a full disk leaves (nothing).
"""

import errno
import itertools
import json
import os
import stat
import warnings
from decimal import Decimal

import pytest
import torch

import mesure_memoire
from conftest import (
    MEASURE,
    MESSAGES,
    MIB,
    RecordingCudaStandIn,
    error_line,
    kit_error_of,
    raising,
    run_in_process,
    tree_digest,
)

# PyTorch warnings recorded by earlier tests would show in field_errors: each test starts from none.
pytestmark = pytest.mark.usefixtures("no_earlier_warnings")


# --- files: names, limits, temporary files, exclusive writes ---------------------------------------------------


def test_the_limits_are_the_output_folders_or_255_bytes_a_name_and_4096_a_path_where_unreadable(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    os.mkdir("here")
    limits = {"here": {"PC_NAME_MAX": 11, "PC_PATH_MAX": 22}}  # the file system that will hold the file
    monkeypatch.setattr(os, "pathconf", lambda folder, name: limits.get(folder, {}).get(name, 4096))
    assert mesure_memoire.check_new_output("here/" + "n" * 11) == "here/" + "n" * 11
    assert kit_error_of(mesure_memoire.check_new_output, "here/" + "n" * 12) == (
        MESSAGES["--output too long"].format(name="here/" + "n" * 12, limit=11)
    )
    for error in (AttributeError("no pathconf"), ValueError("unknown name"), OSError(errno.EINVAL, "no")):
        monkeypatch.setattr(os, "pathconf", raising(error))
        assert mesure_memoire.check_new_output("here/" + "n" * 255) == "here/" + "n" * 255, error
        assert kit_error_of(mesure_memoire.check_new_output, "here/" + "n" * 256) == (
            MESSAGES["--output too long"].format(name=mesure_memoire.name_as_typed("here/" + "n" * 256), limit=255)
        ), error
        # and paths below 4096 bytes (PATH_MAX counts the terminating NUL)
        assert mesure_memoire.check_new_output("./" * 2000 + "n" * 95) == "./" * 2000 + "n" * 95, error
        assert kit_error_of(mesure_memoire.check_new_output, "./" * 2000 + "n" * 96) == (
            MESSAGES["--output path too long"].format(
                name=mesure_memoire.name_as_typed("./" * 2000 + "n" * 96), limit=4095
            )
        ), error


def test_check_new_output_bounds_the_name_and_the_path(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(os, "pathconf", lambda folder, name: {"PC_NAME_MAX": 10, "PC_PATH_MAX": 16}[name])
    assert mesure_memoire.check_new_output("n" * 10) == "n" * 10
    too_long = MESSAGES["--output too long"].format(name="n" * 11, limit=10)
    assert kit_error_of(mesure_memoire.check_new_output, "n" * 11) == too_long
    os.mkdir("d")
    assert mesure_memoire.check_new_output("d/" + "p" * 9) == "d/" + "p" * 9  # 11 bytes of path
    assert mesure_memoire.check_new_output("./d/" + "p" * 10) == "./d/" + "p" * 10  # 14 bytes
    os.mkdir("dd")
    assert mesure_memoire.check_new_output("dd/" + "q" * 10) == "dd/" + "q" * 10  # 13 bytes
    os.makedirs("ddd/eee")
    assert mesure_memoire.check_new_output("ddd/eee/" + "r" * 7) == "ddd/eee/" + "r" * 7  # 15 bytes
    # 16 bytes: the system's PATH_MAX counts the terminating NUL, so the kernel would refuse it after the run
    assert kit_error_of(mesure_memoire.check_new_output, "ddd/eee/" + "r" * 8) == (
        MESSAGES["--output path too long"].format(name="ddd/eee/rrrrrrrr", limit=15)
    )
    assert sorted(os.listdir(tmp_path)) == ["d", "dd", "ddd"]  # the probe files are gone


def test_check_new_output_messages_are_whole(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "old.json").write_text("{}")
    (tmp_path / "f").write_text("")
    assert kit_error_of(mesure_memoire.check_new_output, "old.json") == MESSAGES["--output exists"].format(
        name="old.json"
    )
    assert kit_error_of(mesure_memoire.check_new_output, "a/..") == MESSAGES["--output a folder"].format(name="a/..")
    assert kit_error_of(mesure_memoire.check_new_output, "..") == MESSAGES["--output a folder"].format(name="..")
    assert kit_error_of(mesure_memoire.check_new_output, "f/x.json") == MESSAGES["--output no folder"].format(
        name="f/x.json"
    )
    assert kit_error_of(mesure_memoire.check_new_output, "x\0.json") == MESSAGES["--output cannot create"].format(
        name="'x\\x00.json'", error="ValueError: embedded null character"
    )
    for empty in ("", "  ", None, b"x.json"):
        assert kit_error_of(mesure_memoire.check_new_output, empty) == MESSAGES["--output empty"]
    assert mesure_memoire.check_new_output("new.json") == "new.json"
    assert sorted(os.listdir()) == ["f", "old.json"]


def test_check_new_output_probes_the_folder_and_removes_the_probe(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    os.mkdir("sub")
    assert mesure_memoire.check_new_output("sub/r.json") == "sub/r.json"
    assert mesure_memoire.check_new_output("r.json") == "r.json"
    assert os.listdir("sub") == [], "the probe is removed"
    assert sorted(os.listdir(".")) == ["sub"], "the probe is removed"

    def no_room(path, *args):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "open", no_room)
    assert kit_error_of(mesure_memoire.check_new_output, "r.json") == MESSAGES["--output cannot create"].format(
        name="r.json", error="OSError: [Errno 28] No space left on device"
    )


def test_write_new_file_writes_utf8_and_never_over_a_file_that_appears_meanwhile(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    mesure_memoire.write_new_file("é.json", "é\n")
    assert (tmp_path / "é.json").read_bytes() == "é\n".encode()
    real_link = os.link

    def someone_else_writes_first(source, destination):
        (tmp_path / "x.json").write_text("theirs")
        real_link(source, destination)

    monkeypatch.setattr(os, "link", someone_else_writes_first)
    assert kit_error_of(mesure_memoire.write_new_file, "x.json", "{}") == MESSAGES[
        "--output appeared meanwhile"
    ].format(name="x.json")
    assert (tmp_path / "x.json").read_text() == "theirs"
    monkeypatch.setattr(os, "link", raising(OSError(errno.EPERM, "no")))
    with pytest.raises(OSError, match="no"):  # no hard links: nothing written, nothing else tried
        mesure_memoire.write_new_file("z.json", "zz")
    assert sorted(os.listdir(tmp_path)) == ["x.json", "é.json"]  # no temporary left


def test_the_temporary_file_is_made_beside_the_result_and_may_be_removed_by_someone_else(tmp_path, monkeypatch):
    """In the result's own folder: the final link (or rename) stays on one file system.  A temporary file someone
    else removed meanwhile is no failure; any other error removing it is."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "sub").mkdir()
    folders = []
    real_link = os.link

    def link_then_remove(source, target):  # the temporary file's folder, seen where it is linked to the result
        folders.append(os.path.dirname(source))
        real_link(source, target)
        os.unlink(source)

    monkeypatch.setattr(os, "link", link_then_remove)
    mesure_memoire.write_new_file("sub/r.json", "{}")
    mesure_memoire.write_new_file("r.json", "{}")
    assert folders == ["sub", "."]
    assert sorted(os.listdir(tmp_path)) == ["r.json", "sub"]
    assert os.listdir(tmp_path / "sub") == ["r.json"]
    monkeypatch.setattr(os, "unlink", raising(PermissionError(errno.EACCES, "Permission denied")))
    with pytest.raises(PermissionError):
        mesure_memoire.write_new_file("s.json", "{}\n")


def test_measure_to_file_records_warnings_and_writes_the_json(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(mesure_memoire, "PYTORCH_WARNINGS", [])

    def measured(config, tool):
        warnings.simplefilter("always")
        warnings.warn("CUDA initialization: from /x/y/z.py", UserWarning, stacklevel=1)
        return {"tool": tool, "environment": {"field_errors": {}}, "v": Decimal("0.5"), "c": config}

    monkeypatch.setattr(mesure_memoire, "measure", lambda config, tool: {"environment": {"field_errors": {}}})
    assert mesure_memoire.measure_to_file({}, "q.json", tool="t", debug=False) == {"environment": {"field_errors": {}}}
    monkeypatch.setattr(mesure_memoire, "measure", measured)
    result = mesure_memoire.measure_to_file({"k": 1}, "r.json", tool="t", debug=False)
    assert result["environment"]["field_errors"] == {"pytorch_warnings": "UserWarning: CUDA initialization: from"}
    assert (tmp_path / "r.json").read_text(encoding="utf-8") == mesure_memoire.to_json(result)
    assert json.loads((tmp_path / "r.json").read_text())["tool"] == "t"
    monkeypatch.setattr(
        mesure_memoire, "measure", lambda config, tool: pytest.fail("measured before checking the output")
    )
    assert kit_error_of(mesure_memoire.measure_to_file, {}, "r.json", "t", False) == MESSAGES["--output exists"].format(
        name="r.json"
    )


# --- a finished measurement (stand-in GPU) and its file --------------------------------------------


@pytest.fixture
def stand_in_measure(monkeypatch):
    """Replaces measure(), because no GPU can be had here: the real CPU model runs its phases with
    RecordingCudaStandIn counters; the result has measure()'s keys.  Proves nothing about GPUs."""
    calls = []

    def fake_measure(config, tool):
        calls.append(config)
        cpu = torch.device("cpu")
        phases, output_summary, per_call, timing = mesure_memoire.measure_phases(
            torch, RecordingCudaStandIn(device=cpu), cpu, config
        )
        return {
            "kit": mesure_memoire.KIT_NAME,
            "tool": tool,
            "environment": {"field_errors": {}, "gpu": {"total_memory_gib": Decimal(80)}},
            "configuration": {**config, "fresh_process_warning": None},
            "torch_version_warning": None,
            "synthetic_model": mesure_memoire.synthetic_model(config),
            "phases": phases,
            "workspace": {"measured_bytes": 0, "allowance_bytes": 256 * MIB, "per_call": per_call},
            "output_summary": output_summary,
            **timing,
        }

    monkeypatch.setattr(mesure_memoire, "measure", fake_measure)
    return calls


@pytest.mark.parametrize("error", [errno.EPERM, errno.ENOTSUP])
def test_a_folder_without_hard_links_is_refused_before_measuring(folder, capsys, monkeypatch, stand_in_measure, error):
    def no_hard_links(source, destination):
        raise OSError(error, os.strerror(error), source, None, destination)

    monkeypatch.setattr(os, "link", no_hard_links)
    before = tree_digest(folder)
    code, captured = run_in_process(capsys, folder, [*MEASURE, "--output", "o.json"])
    assert code == 2
    assert captured.out == ""
    said = os.strerror(error)
    assert captured.err == error_line(MESSAGES["--output no hard links"].format(name="o.json", error=said))
    assert stand_in_measure == [], "nothing measured"
    assert tree_digest(folder) == before, "no temporary left"


def test_the_result_is_written_whole_with_its_exact_seed(folder, capsys, stand_in_measure):
    assert mesure_memoire.main([*MEASURE, "--output", "o.json", "--seed", str(2**64 - 1)]) == 0
    captured = capsys.readouterr()
    assert captured.err == ""
    assert captured.out.endswith("Result written to o.json\n")
    result = json.loads((folder / "o.json").read_text(encoding="utf-8"))
    assert result["configuration"]["seed"] == 2**64 - 1
    assert len(result["phases"]) == 6
    assert sorted(os.listdir(folder)) == ["existing.json", "fifo", "o.json", "sub"]  # no temporary left


def test_the_written_name_and_the_warning_stay_one_line_each(folder, capsys, monkeypatch, stand_in_measure):
    real_measure = mesure_memoire.measure

    def not_fresh(config, tool):
        result = real_measure(config, tool)
        result["configuration"]["fresh_process_warning"] = "held memory\nbefore"
        return result

    monkeypatch.setattr(mesure_memoire, "measure", not_fresh)
    assert mesure_memoire.main([*MEASURE, "--output", "a\nb.json"]) == 0
    captured = capsys.readouterr()
    assert captured.err == "mesure_memoire.py: warning: held memory\\nbefore\n"
    assert captured.out.endswith("\nResult written to 'a\\nb.json'\n")
    assert (folder / "a\nb.json").is_file()


@pytest.mark.parametrize("umask", [0o022, 0o002, 0o077])
def test_the_result_file_respects_the_umask(folder, umask):
    previous = os.umask(umask)
    try:
        mesure_memoire.write_new_file("r.json", "{}\n")
    finally:
        os.umask(previous)
    assert stat.S_IMODE(os.stat(folder / "r.json").st_mode) == 0o666 & ~umask


def test_a_full_disk_after_the_measurement_is_one_line(folder, capsys, monkeypatch, stand_in_measure):
    def disk_full(descriptor):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "fsync", disk_full)
    code, captured = run_in_process(capsys, folder, [*MEASURE, "--output", "o.json"])
    assert code == 2
    assert captured.out == ""
    said = MESSAGES["--output cannot write"].format(name="o.json", error="OSError: [Errno 28] No space left on device")
    assert captured.err == error_line(said)


@pytest.mark.parametrize("where", ["measure", "fsync", "link-at-check", "link", "created-at-check", "created-at-write"])
def test_ctrl_c_anywhere_in_measure_exits_130_and_leaves_no_file(folder, capsys, monkeypatch, stand_in_measure, where):
    def interrupt(*args):
        raise KeyboardInterrupt

    if where.startswith("created"):  # the signal lands just after a temporary file is created (issue 42)
        real_open, created = os.open, []

        def open_then_interrupted(path, *args):
            descriptor = real_open(path, *args)
            created.append(path)
            if ".partial-" in str(path) and len(created) == (1 if where == "created-at-check" else 2):
                raise KeyboardInterrupt
            return descriptor

        monkeypatch.setattr(os, "open", open_then_interrupted)
    elif where == "measure":
        monkeypatch.setattr(mesure_memoire, "measure", interrupt)
    elif where == "fsync":
        monkeypatch.setattr(os, "fsync", interrupt)
    else:  # the probe's link before measuring, or the result's after
        real_link, calls = os.link, []

        def link(source, target):
            calls.append(target)
            if len(calls) == (1 if where == "link-at-check" else 2):
                raise KeyboardInterrupt
            return real_link(source, target)

        monkeypatch.setattr(os, "link", link)
    code, captured = run_in_process(capsys, folder, [*MEASURE, "--output", "o.json"])
    assert code == 130
    assert captured.out == ""
    assert captured.err == MESSAGES["interrupted, no partial file"].format(signal="Ctrl-C")


def test_a_name_the_output_check_draws_already_taken_is_refused_and_that_file_kept(
    folder, capsys, monkeypatch, stand_in_measure
):
    """The check before measuring creates a temporary file, then links it under a second name: were either name
    someone else's file, the run is refused before measuring and that file stays as it was."""
    taken = folder / f".partial-{bytes(8).hex()}.tmp"
    taken.write_bytes(b"someone else's")
    names = itertools.cycle([b"\x01" * 8, bytes(8)])  # one name free, the other taken
    monkeypatch.setattr(os, "urandom", lambda size: next(names)[:size])
    code, captured = run_in_process(capsys, folder, [*MEASURE, "--output", "o.json"])  # every file kept as it was
    assert code == 2
    said = MESSAGES["--output cannot create"].format(name="o.json", error="FileExistsError: [Errno 17] File exists")
    assert captured.err == error_line(said)
    assert stand_in_measure == [], "nothing measured"


def test_a_temporary_name_already_taken_is_never_overwritten(folder, monkeypatch):
    taken = folder / f".partial-{bytes(8).hex()}.tmp"
    taken.write_bytes(b"someone else's")
    monkeypatch.setattr(os, "urandom", lambda size: bytes(size))  # the taken name is drawn
    with pytest.raises(FileExistsError):
        mesure_memoire.write_new_file("s.json", "{}\n")
    assert not (folder / "s.json").exists()
    assert taken.read_bytes() == b"someone else's"
