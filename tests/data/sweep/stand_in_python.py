"""A stand-in for the Python interpreter the sweep starts its children with, because no GPU can be had here.

Started as ``STAND-IN SCRIPT COMMAND OPTIONS...`` (through a small executable the tests write beside
``behaviours.json``), it logs its arguments to ``calls.log`` there and does what ``behaviours.json`` says:
``environment`` prints the environment given (or, with a "probe" behaviour, that exit status and
output, or hangs); ``measure`` looks up the varied value and writes a result copied from a template with
the sizes given ("write", printing a table as measure does) or a given file as it is ({"copy": FILE}),
refuses ("exit2"; "exit2-bytes" with bytes that are not UTF-8), runs out of memory ("exit3"), fails a
phase ("exit3-failed"), exits 0 or 1 without a word ("exit0", "exit1"), or hangs ("hang", after leaving
a partial file in the output's folder and its process id in ``hanging.pid``; "write-then-hang" writes its result first);
"remove-folder-then-exit3" removes the output's folder, then runs out of memory; {"slow": SECONDS, "at": STEP} runs the
real script's ``measure`` with a stand-in PyTorch whose import, phase and write (the result's fsync) each
log their name in ``moments.log``, STEP then taking SECONDS in a call that does not return to the
interpreter (SIGINT and SIGTERM blocked, as in a long kernel or driver call, then the mask as it was); its
process id in ``child.pid``.  Every other call first unblocks SIGINT and SIGTERM, as the kit's main does.
With "stray" in ``behaviours.json``, a ``measure`` child first leaves a file of that name (or one of each
name of a list) in the output's folder (a file manager's, an editor's).  Each call also logs the
interpreter flags it was started with (``flags.log``), whether its standard input is /dev/null
(``stdin.log``), and a hanging child the signal that stops it (``signals.log``).  It measures nothing.
"""

import json
import os
import signal
import sys
import time

HERE = os.path.dirname(os.path.abspath(sys.argv[0]))
with open(os.path.join(HERE, "behaviours.json"), encoding="utf-8") as stream:
    BEHAVIOURS = json.load(stream)
# The interpreter's flags come before the script: python3 -I mesure_memoire.py measure ...
at_script = next(i for i, argument in enumerate(sys.argv) if argument.endswith("mesure_memoire.py"))
with open(os.path.join(HERE, "flags.log"), "a", encoding="utf-8") as log:
    log.write(json.dumps(sys.argv[1:at_script]) + "\n")
with open(os.path.join(HERE, "calls.log"), "a", encoding="utf-8") as log:
    log.write(json.dumps(sys.argv[at_script:]) + "\n")
with open(os.path.join(HERE, "stdin.log"), "a", encoding="utf-8") as log:
    log.write(json.dumps(os.path.samestat(os.fstat(0), os.stat(os.devnull))) + "\n")
script, command, *options = sys.argv[at_script:]


def as_the_kit_starts():
    """What the kit's main does first: a sweep starts its children with SIGINT and SIGTERM blocked, and a blocked
    mask survives exec.  The "slow" behaviours run the kit's own main instead, which must do it itself."""
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT, signal.SIGTERM})


if command == "environment":
    as_the_kit_starts()
    probe = BEHAVIOURS.get("probe", {})
    if probe.get("hang"):
        time.sleep(120)
    print(probe.get("stdout", json.dumps(BEHAVIOURS["environment"])))
    raise SystemExit(probe.get("exit", 0))
given = {name: value for name, _, value in (option[2:].partition("=") for option in options)}  # --debug: ""
behaviour = BEHAVIOURS["values"][given[BEHAVIOURS["vary"]]]
if not (isinstance(behaviour, dict) and "slow" in behaviour):
    as_the_kit_starts()
strays = BEHAVIOURS.get("stray", [])
for stray in [strays] if isinstance(strays, str) else strays:
    open(os.path.join(os.path.dirname(given["output"]), stray), "w").close()
if behaviour == "remove-folder-then-exit3":
    for name in os.listdir(os.path.dirname(given["output"])):
        os.unlink(os.path.join(os.path.dirname(given["output"]), name))
    os.rmdir(os.path.dirname(given["output"]))
    print("mesure_memoire.py: error: " + BEHAVIOURS["messages"]["exit3"], file=sys.stderr)
    raise SystemExit(3)


def moment(name, seconds):
    """A stand-in PyTorch's step: its name logged, then a call that does not return to the interpreter
    (at the step chosen; the others return at once)."""
    seconds = seconds if name == behaviour["at"] else 0
    with open(os.path.join(HERE, "moments.log"), "a", encoding="utf-8") as log:
        log.write(name + "\n")
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
    time.sleep(seconds)
    signal.pthread_sigmask(signal.SIG_SETMASK, previous)  # a pending signal is handled here, as after a kernel


if isinstance(behaviour, dict) and "slow" in behaviour:
    sys.path.insert(0, os.path.dirname(script))
    import mesure_memoire

    with open(os.path.join(HERE, "child.pid"), "w", encoding="utf-8") as stream:
        stream.write(str(os.getpid()))
    seconds, real_fsync = behaviour["slow"], os.fsync

    def measure_with_a_stand_in_pytorch(config, tool):
        moment("import", seconds)
        moment("phase", seconds)
        return {}

    def slow_fsync(descriptor):
        moment("write", seconds)
        real_fsync(descriptor)

    mesure_memoire.measure, os.fsync = measure_with_a_stand_in_pytorch, slow_fsync
    raise SystemExit(mesure_memoire.main([command, *options]))
if isinstance(behaviour, dict):  # {"copy": FILE}: that result, as it is
    with open(behaviour["copy"], "rb") as source, open(given["output"], "xb") as stream:
        stream.write(source.read())
    raise SystemExit(0)
if behaviour == "write":
    with open(BEHAVIOURS["template"], encoding="utf-8") as stream:
        result = json.load(stream)
    sizes = {key: int(given[key]) for key in ("batch", "context", "width")}
    result["configuration"].update(sizes)
    result["synthetic_model"]["parameters"] = 8 * sizes["width"] ** 2 + 5 * sizes["width"]
    with open(given["output"], "x", encoding="utf-8") as stream:
        json.dump(result, stream)
    print("phase  ms  (a stand-in's table)")
    raise SystemExit(0)
if behaviour in ("exit2", "exit3", "exit3-failed"):
    print("mesure_memoire.py: error: " + BEHAVIOURS["messages"][behaviour], file=sys.stderr)
    raise SystemExit(int(behaviour[4]))
if behaviour == "exit2-bytes":
    sys.stderr.buffer.write(b"mesure_memoire.py: error: not UTF-8: \xff\xfe\n")
    raise SystemExit(2)
if behaviour in ("exit0", "exit1"):
    raise SystemExit(int(behaviour[-1]))
assert behaviour in ("hang", "write-then-hang"), behaviour
if behaviour == "write-then-hang":
    open(given["output"], "x").close()


def stopped_by(number, frame):
    with open(os.path.join(HERE, "signals.log"), "a", encoding="utf-8") as log:
        log.write(signal.Signals(number).name + "\n")
    raise KeyboardInterrupt if number == signal.SIGINT else SystemExit(128 + number)


for number in (signal.SIGINT, signal.SIGTERM):
    if signal.getsignal(number) is not signal.SIG_IGN:  # a test may start it ignoring SIGINT
        signal.signal(number, stopped_by)
open(os.path.join(os.path.dirname(given["output"]), ".partial-0123456789abcdef.tmp"), "w").close()
with open(os.path.join(HERE, "hanging.tmp"), "w") as stream:
    stream.write(str(os.getpid()))
os.replace(os.path.join(HERE, "hanging.tmp"), os.path.join(HERE, "hanging.pid"))
time.sleep(120)
