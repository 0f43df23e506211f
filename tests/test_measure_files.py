"""`mesure_memoire.py measure`'s result file: the name checks, the atomic, never-overwriting write, temporary
files beside the result, the umask, and what a crash or a full disk leaves (nothing).
"""

import errno
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
    RecordingCudaStandIn,
    error_line,
    kit_error_of,
    refused,
    run_in_process,
    stand_in_measurement,
)

# PyTorch warnings recorded by earlier tests would show in field_errors: each test starts from none.
pytestmark = pytest.mark.usefixtures("no_earlier_warnings")


def test_check_new_output_refuses_what_no_command_line_gives(tmp_path, monkeypatch):
    """The notebook's OUTPUT may be None or bytes; the command line's cases are test_command_line.py's."""
    monkeypatch.chdir(tmp_path)
    for empty in ("  ", None, b"x.json"):
        assert kit_error_of(mesure_memoire.check_new_output, empty) == MESSAGES["--output empty"]
    assert mesure_memoire.check_new_output("new.json") == "new.json"
    assert os.listdir() == []


def test_the_temporary_file_is_made_beside_the_result_and_may_be_removed_by_someone_else(tmp_path, monkeypatch):
    """In the result's own folder: the final link stays on one file system.  A temporary file someone else
    removed meanwhile is no failure."""
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


def test_measure_to_file_records_warnings_and_writes_the_json(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(mesure_memoire, "PYTORCH_WARNINGS", [])

    def measured(config, tool):
        warnings.simplefilter("always")
        warnings.warn("CUDA initialization: from /x/y/z.py", UserWarning, stacklevel=1)
        return {"tool": tool, "environment": {"field_errors": {}}, "v": Decimal("0.5"), "c": config}

    monkeypatch.setattr(mesure_memoire, "measure", measured)
    result = mesure_memoire.measure_to_file({"k": 1}, "r.json", tool="t", debug=False)
    assert result["environment"]["field_errors"] == {"pytorch_warnings": "UserWarning: CUDA initialization: from"}
    assert (tmp_path / "r.json").read_text(encoding="utf-8") == mesure_memoire.to_json(result)
    assert json.loads((tmp_path / "r.json").read_text())["tool"] == "t"


# --- a finished measurement (stand-in GPU) and its file --------------------------------------------


@pytest.fixture
def stand_in_measure(stand_in_gpu, monkeypatch):
    """measure() on the stand-ins, because no GPU can be had here (``stand_in_gpu``, and the real CPU model's
    phases with RecordingCudaStandIn counters); returns the configurations measure() was called with."""
    stand_in_measurement(monkeypatch, RecordingCudaStandIn(device=torch.device("cpu")))
    calls, real_measure = [], mesure_memoire.measure

    def recorded(config, tool):
        calls.append(config)
        return real_measure(config, tool)

    monkeypatch.setattr(mesure_memoire, "measure", recorded)
    return calls


@pytest.mark.parametrize("error", [errno.EPERM, errno.ENOTSUP])
def test_a_folder_without_hard_links_is_refused_before_measuring(folder, capsys, monkeypatch, stand_in_measure, error):
    def no_hard_links(source, destination):
        raise OSError(error, os.strerror(error), source, None, destination)

    monkeypatch.setattr(os, "link", no_hard_links)
    code, captured = run_in_process(capsys, folder, [*MEASURE, "--output", "o.json"])  # no temporary left
    assert (code, captured.out) == (2, "")
    said = os.strerror(error)
    assert captured.err == error_line(refused(MESSAGES["--output no hard links"].format(name="o.json", error=said)))
    assert stand_in_measure == [], "nothing measured"


def test_the_result_is_written_whole_with_its_exact_seed(folder, capsys, stand_in_measure):
    assert mesure_memoire.main([*MEASURE, "--output", "o.json", "--seed", str(2**64 - 1)]) == 0
    captured = capsys.readouterr()
    assert captured.err == ""
    assert captured.out.endswith("Result written to o.json\n")
    result = json.loads((folder / "o.json").read_text(encoding="utf-8"))
    assert result["configuration"]["seed"] == 2**64 - 1
    assert len(result["phases"]) == 6
    assert sorted(os.listdir(folder)) == ["existing.json", "fifo", "o.json", "sub"]  # no temporary left


def test_a_result_name_taken_during_the_measurement_is_never_overwritten(folder, capsys, monkeypatch, stand_in_measure):
    real_measure = mesure_memoire.measure

    def someone_else_writes_meanwhile(config, tool):
        (folder / "o.json").write_text("theirs")
        return real_measure(config, tool)

    monkeypatch.setattr(mesure_memoire, "measure", someone_else_writes_meanwhile)
    assert mesure_memoire.main([*MEASURE, "--output", "o.json"]) == 2
    assert capsys.readouterr().err == error_line(MESSAGES["--output appeared meanwhile"].format(name="o.json"))
    assert (folder / "o.json").read_text() == "theirs"
    assert sorted(os.listdir(folder)) == ["existing.json", "fifo", "o.json", "sub"]  # no temporary left


def test_the_result_file_respects_the_umask(folder):
    previous = os.umask(0o022)
    try:
        mesure_memoire.write_new_file("r.json", "{}\n")
    finally:
        os.umask(previous)
    assert stat.S_IMODE(os.stat(folder / "r.json").st_mode) == 0o644


def test_a_full_disk_after_the_measurement_is_one_line(folder, capsys, monkeypatch, stand_in_measure):
    def disk_full(descriptor):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "fsync", disk_full)
    code, captured = run_in_process(capsys, folder, [*MEASURE, "--output", "o.json"])
    assert (code, captured.out) == (2, "")
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
    else:  # the check's link to the output's name before measuring, or the result's after
        real_link, calls = os.link, []

        def link(source, target):
            calls.append(target)
            if len(calls) == (1 if where == "link-at-check" else 2):
                raise KeyboardInterrupt
            return real_link(source, target)

        monkeypatch.setattr(os, "link", link)
    code, captured = run_in_process(capsys, folder, [*MEASURE, "--output", "o.json"])
    assert (code, captured.out) == (130, "")
    assert captured.err == MESSAGES["interrupted, no partial file"].format(signal="Ctrl-C")


def test_a_temporary_name_already_taken_is_refused_and_that_file_kept(folder, capsys, monkeypatch, stand_in_measure):
    taken = folder / f".partial-{bytes(8).hex()}.tmp"
    taken.write_bytes(b"someone else's")
    monkeypatch.setattr(os, "urandom", lambda size: bytes(size))  # the taken name is drawn
    code, captured = run_in_process(capsys, folder, [*MEASURE, "--output", "o.json"])  # every file kept as it was
    assert code == 2
    said = MESSAGES["--output cannot create"].format(name="o.json", error="FileExistsError: [Errno 17] File exists")
    assert captured.err == error_line(refused(said))
    assert stand_in_measure == [], "nothing measured"
