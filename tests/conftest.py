"""Shared helpers: the repository root, and running a kit script as a new user would."""

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def run_script(script, *args, python_flags=(), cwd=None, env=None, python=sys.executable):
    """Run ``python [flags] ROOT/script args`` in a new process; returns the CompletedProcess."""
    return subprocess.run(
        [python, *python_flags, str(ROOT / script), *map(str, args)],
        capture_output=True,
        text=True,
        cwd=cwd,
        env=env,
        timeout=120,
    )


def assert_one_line_refusal(completed, *fragments, exit_code=2):
    """A refusal: the exit status, one line on stderr naming the reason, no traceback, no stdout."""
    assert completed.returncode == exit_code, completed
    lines = completed.stderr.splitlines()
    assert len(lines) == 1, completed.stderr
    assert "Traceback" not in completed.stderr
    assert completed.stdout == ""
    for fragment in fragments:
        assert fragment in lines[0], (fragment, lines[0])


@pytest.fixture
def root():
    return ROOT
