"""A stand-in for the Python interpreter the sweep starts its children with, because no GPU can be had here.

Started as ``STAND-IN SCRIPT COMMAND OPTIONS...`` (through a small executable the tests write beside
``behaviours.json``), it logs its arguments to ``calls.log`` there and does what ``behaviours.json`` says:
``environment`` prints the environment given (or, with a "probe" behaviour, that exit status and
output, or hangs); ``measure`` looks up the varied value and writes a result copied from a template with
the sizes given ("write", printing a table as measure does) or a given file as it is ({"copy": FILE}),
refuses ("exit2"; "exit2-bytes" with bytes that are not UTF-8), runs out of memory ("exit3"), exits 0
or 1 without a word ("exit0", "exit1"), or hangs ("hang", after leaving a partial file in the
output's folder and its process id in ``hanging.pid``; "write-then-hang" writes its result first).
Each call also logs whether its standard input is /dev/null (``stdin.log``), and a hanging child the
signal that stops it (``signals.log``).  It measures nothing.
"""

import json
import os
import signal
import sys
import time

HERE = os.path.dirname(os.path.abspath(sys.argv[0]))
with open(os.path.join(HERE, "behaviours.json"), encoding="utf-8") as stream:
    BEHAVIOURS = json.load(stream)
with open(os.path.join(HERE, "calls.log"), "a", encoding="utf-8") as log:
    log.write(json.dumps(sys.argv[1:]) + "\n")
with open(os.path.join(HERE, "stdin.log"), "a", encoding="utf-8") as log:
    log.write(json.dumps(os.path.samestat(os.fstat(0), os.stat(os.devnull))) + "\n")
script, command, *options = sys.argv[1:]
if command == "environment":
    probe = BEHAVIOURS.get("probe", {})
    if probe.get("hang"):
        time.sleep(120)
    print(probe.get("stdout", json.dumps(BEHAVIOURS["environment"])))
    raise SystemExit(probe.get("exit", 0))
given = dict(option[2:].split("=", 1) for option in options)
behaviour = BEHAVIOURS["values"][given[BEHAVIOURS["vary"]]]
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
if behaviour in ("exit2", "exit3"):
    print("mesure_memoire.py: error: " + BEHAVIOURS["messages"][behaviour], file=sys.stderr)
    raise SystemExit(int(behaviour[-1]))
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
