"""Start-up time of the kit's two standard-library paths, as a ratio to a bare interpreter (not a test).

Usage::

    python benchmarks/startup.py              # 41 rounds
    python benchmarks/startup.py --runs 101   # steadier medians
    python benchmarks/startup.py --parts      # also what estimate's extra time is made of

Each round runs ``python -c pass`` and then each command once, in turn, so that a machine
speeding up or slowing down weighs on all of them alike; the ratio compares the medians of the
wall-clock times, a process start included.  The goal is at most 1.5x for both commands.  The
figures depend on the machine, its load and the interpreter: compare them on one machine only.
Standard library only.
"""

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
GOAL_RATIO = 1.5
BARE = ("-c", "pass")
COMMANDS = (
    ("calcul_forfaits.py", "--gpu", "b200", "--days", "7"),
    ("mesure_memoire.py", "estimate", "--parameters", "7000000000", "--bits", "16"),
)
PARTS = {  # estimate's extra time: compiling the script (Python keeps no bytecode for a script it runs), its imports
    "compiling mesure_memoire.py": (
        "-c",
        "compile(open('mesure_memoire.py', encoding='utf-8').read(), 'mesure_memoire.py', 'exec')",
    ),
    "its imports": ("-c", "import decimal, math, os, time"),
}


def positive_int(text):
    if not (text.isascii() and text.isdigit()) or int(text) < 1:
        raise argparse.ArgumentTypeError(f"expected a positive whole number, got {text!r}")
    return int(text)


def wall_seconds(python, arguments):
    """One run's wall-clock seconds; a failing command stops the benchmark (its time would mean nothing)."""
    started = time.perf_counter()
    completed = subprocess.run([python, *arguments], cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    seconds = time.perf_counter() - started
    if completed.returncode != 0:
        raise SystemExit(
            f"startup.py: {' '.join(arguments)} exited with {completed.returncode}: {completed.stderr.strip()!r}"
        )
    return seconds


def measure(python, runs, commands=COMMANDS):
    """Median seconds of the bare interpreter and of each command, from ``runs`` interleaved rounds."""
    timings = {arguments: [] for arguments in (BARE, *commands)}
    wall_seconds(python, BARE)  # one untimed round warms the file-system cache
    for arguments in commands:
        wall_seconds(python, arguments)
    for _ in range(runs):
        for arguments in timings:
            timings[arguments].append(wall_seconds(python, arguments))
    return {arguments: statistics.median(seconds) for arguments, seconds in timings.items()}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="startup.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=positive_int, default=41, help="rounds of interleaved runs (default 41)")
    parser.add_argument("--python", default=sys.executable, help="the interpreter to time (default: this one)")
    parser.add_argument("--parts", action="store_true", help="also time compiling mesure_memoire.py and its imports")
    args = parser.parse_args(argv)
    medians = measure(args.python, args.runs, COMMANDS + tuple(PARTS.values()) if args.parts else COMMANDS)
    bare = medians[BARE]
    version = subprocess.run(
        [args.python, "-c", "import platform; print(platform.python_version())"], capture_output=True, text=True
    ).stdout.strip()
    print(f"Python {version}, median of {args.runs} interleaved runs each; goal: at most {GOAL_RATIO}x a bare start")
    print(f"  {'python -c pass':<66} {bare * 1000:7.1f} ms")
    for arguments in COMMANDS:
        ratio = medians[arguments] / bare
        verdict = "meets the goal" if ratio <= GOAL_RATIO else "over the goal"
        print(f"  {'python ' + ' '.join(arguments):<66} {medians[arguments] * 1000:7.1f} ms  {ratio:.2f}x  {verdict}")
    for label, arguments in PARTS.items() if args.parts else ():
        extra_ms = (medians[arguments] - bare) * 1000
        print(f"  part of estimate: {label:<48} {extra_ms:+7.1f} ms over a bare start")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
