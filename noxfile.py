"""The version matrix: the test suite on each CPython 3.10-3.13 found on PATH, with the oldest PyTorch the
kit supports (2.4.1), a release in the middle of the range (2.8.0), the one validated on a GPU (2.11.0) and
the newest the package index serves, plus CI's own stack.

Run from the repository root (nox is in requirements-dev.txt):

    nox -l                                         # the sessions
    nox --envdir ../nox-envs                       # the whole matrix; a missing interpreter is skipped
    nox -s "tests-3.12(torch='newest')" -- -x      # one cell; what follows -- goes to pytest
    nox -s "tests-3.10(torch='2.4.1')"             # the oldest release the README supports

nox looks for ``python3.X`` on PATH. With pyenv, put every version there for the run, e.g.
``PYENV_VERSION=3.10.13:3.11.7:3.12.1:3.13.0 nox ...``.  Each cell builds a fresh virtual environment
(about 5 GB: on Linux PyPI serves only CUDA builds of torch, with their nvidia-* packages; pip's cache
shares the downloads) and deletes it once its tests pass, so only failed cells stay for inspection.

Copy each cell's summary line (passed, failed, skipped), with the date and the torch build, into
validation/compatibility.md. Refresh it when the matrix changes and before each release.
"""

import os
import shutil
from pathlib import Path

import nox

PYTHONS = ["3.10", "3.11", "3.12", "3.13"]
# The releases each Python is tested with: the oldest the README supports, one in the middle, the one the
# validation GPU box runs, and the newest on PyPI when the matrix was last changed (`pip index versions torch`).
TORCH_RELEASES = ("2.4.1", "2.8.0", "2.11.0", "newest")
NEWEST_TORCH = "2.15.0"
NEWEST_TORCH_FOR = {"3.10": "2.14.1"}  # 2.15 has no wheel for Python 3.10: the newest one that has
NO_WHEEL = {("2.4.1", "3.13")}  # PyPI's 2.4.1 has wheels for Python 3.8 to 3.12 only
CI_TORCH = "2.13.0"  # CI's stack: the CPU build on this machine's disk, for Python 3.11 only
REQUIREMENTS = Path(__file__).parent / "requirements-dev.txt"

nox.options.sessions = ["tests", "ci", "old_pythons"]


def install(session, torch):
    """requirements-dev.txt with its torch pin replaced by ``torch``."""
    lines = REQUIREMENTS.read_text(encoding="utf-8").splitlines()
    pinned = [f"torch=={torch}" if line.startswith("torch==") else line for line in lines]
    requirements = Path(session.create_tmp()) / "requirements.txt"
    requirements.write_text("\n".join(pinned) + "\n", encoding="utf-8")
    # A machine-wide pip constraint (this one's caps torch at 2.14.1) would refuse the newest release;
    # /dev/null replaces it for this session's pip only.
    session.install("-r", str(requirements), env={"PIP_CONSTRAINT": os.devnull})
    session.run("python", "-c", "import torch; print('torch', torch.__version__, 'CUDA', torch.version.cuda)")


def run_tests(session):
    session.run("python", "-m", "pytest", *session.posargs)
    shutil.rmtree(session.virtualenv.location, ignore_errors=True)  # passed: free its gigabytes


@nox.session(python=PYTHONS)
@nox.parametrize("torch", TORCH_RELEASES)
def tests(session, torch):
    if (torch, session.python) in NO_WHEEL:
        session.skip(f"PyTorch {torch} has no wheel for Python {session.python}")
    if torch == "newest":
        torch = NEWEST_TORCH_FOR.get(session.python, NEWEST_TORCH)
    install(session, torch)
    run_tests(session)


@nox.session(python="3.11")
def ci(session):
    install(session, CI_TORCH)
    run_tests(session)


# The notebook's code cells, run as one script the way a plain python3 runs them (tools/build_notebook.py).
NOTEBOOK_AS_SCRIPT = (
    "import json; cells = json.load(open('mesure-memoire.ipynb', encoding='utf-8'))['cells']; "
    "exec('\\n\\n'.join(''.join(c['source']) for c in cells if c['cell_type'] == 'code'))"
)


@nox.session(python=False)
def old_pythons(session):
    """Below 3.10 (python3.8 and python3.9 on PATH): both scripts and the notebook's code say so in one line."""
    for version in ("3.8", "3.9"):
        python = shutil.which(f"python{version}")
        if python is None:
            session.skip(f"python{version} is not on PATH")
        for name, command in (
            ("mesure_memoire.py", ["mesure_memoire.py", "--help"]),
            ("calcul_forfaits.py", ["calcul_forfaits.py", "--help"]),
            ("mesure-memoire.ipynb", ["-c", NOTEBOOK_AS_SCRIPT]),
        ):
            output = session.run(python, *command, success_codes=[2], silent=True, external=True)
            expected = f"{name}: error: Python 3.10 or later is needed; this is Python {version}."
            if not (output.startswith(expected) and output.count("\n") == 1):
                session.error(f"python{version} {name}: {output!r}")
