"""A stand-in for the Python interpreter the sweep starts its children with, because no GPU can be had here.

Started as ``STAND-IN SCRIPT COMMAND OPTIONS...`` (through a small executable the tests write beside
``behaviours.json``), it logs its arguments to ``calls.log`` there and does what ``behaviours.json`` says:
``environment`` prints the environment given; ``measure`` looks up the varied value and
writes a result copied from a template with the sizes given ("write") or a given file as it is
({"copy": FILE}), refuses ("exit2"), runs out of memory ("exit3") or hangs ("hang", after leaving a
partial file in the output's folder and its process id in ``hanging.pid``).  It measures nothing.
"""

import json
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(sys.argv[0]))
with open(os.path.join(HERE, "behaviours.json"), encoding="utf-8") as stream:
    BEHAVIOURS = json.load(stream)
with open(os.path.join(HERE, "calls.log"), "a", encoding="utf-8") as log:
    log.write(json.dumps(sys.argv[1:]) + "\n")
script, command, *options = sys.argv[1:]
if command == "environment":
    print(json.dumps(BEHAVIOURS["environment"]))
    raise SystemExit(0)
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
    raise SystemExit(0)
if behaviour in ("exit2", "exit3"):
    print("mesure_memoire.py: error: " + BEHAVIOURS["messages"][behaviour], file=sys.stderr)
    raise SystemExit(int(behaviour[-1]))
assert behaviour == "hang", behaviour
open(os.path.join(os.path.dirname(given["output"]), ".partial-0123456789abcdef.tmp"), "w").close()
with open(os.path.join(HERE, "hanging.tmp"), "w") as stream:
    stream.write(str(os.getpid()))
os.replace(os.path.join(HERE, "hanging.tmp"), os.path.join(HERE, "hanging.pid"))
time.sleep(120)
