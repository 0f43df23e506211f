"""Validate this version of the kit on one real GPU, and keep the evidence (not shipped).

Usage::

    python3 tools/gpu_validation.py --device cuda:0 --output-dir h200-evidence

It creates the new folder ``h200-evidence`` and, beside it, ``h200-evidence.tar.gz`` holding the
same files.  Every GPU step runs in a fresh child process; this process never imports PyTorch,
so it holds no CUDA context while the measured children run.  In order:

1. ``mesure_memoire.py environment --json`` (a child): without a usable GPU, exit 2, nothing kept.
2. Provenance: SHA-256 of the kit's shipped files checked against ``MANIFEST.json``; the GPU's
   name, driver, MIG mode, clocks and power limit from ``nvidia-smi`` (never a UUID or serial
   number), field by field where a field cannot be read.
3. Every configuration (three sizes x float32, float16, bfloat16): ``measure --plan --json``,
   then ``measure`` twice, each in a new process.  Each result is checked (phase lines,
   counters, the per-phase prediction verdicts, device time, workspace, finite output); the two
   runs must give identical allocated, reserved and requested counters and the same checksum.
4. The notebook's code cells run as one plain python3 script (no Jupyter on a GPU box).
5. A cross-check child, the same forwards again: ``torch.utils.benchmark.Timer`` on the chosen
   device made current; each output's checksum (it must equal measure's) and absolute sum (the
   scale of the float16/bfloat16 checksum tolerance); the reduced-precision outputs' elementwise
   distance to float32's.
6. A size the fit check must refuse: exit 2, one line, no file.

A child that outlives ``--timeout-seconds`` (or the whole ``--budget-seconds``) is killed and
reported; ``summary.json`` and ``verdict.txt`` are always written, and the verdict table is
printed last.  Exit 0 when every check passes, 1 when one fails, 2 on a refusal (bad argument,
unusable output folder, no usable GPU), 130 on Ctrl-C (children killed, no archive).
Standard library only; schema 1 and schema 2 results are both read.
"""

import argparse
import contextlib
import csv
import gzip
import hashlib
import io
import json
import math
import os
import re
import signal
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TOOLS = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(TOOLS))  # build_notebook, imported only when the notebook's code is run

import mesure_memoire  # noqa: E402  (the kit's own script, standard library only at import)

MACHINE_PATHS = (str(ROOT), str(TOOLS), sys.executable, sys.prefix)  # never in the evidence or a message

PROG = "gpu_validation.py"
KIT_SCRIPT = "mesure_memoire.py"
NOTEBOOK_FILE = "mesure-memoire.ipynb"
MANIFEST_FILE = "MANIFEST.json"
ARCHIVE_TOP = "gpu-validation"  # the one folder inside the .tar.gz, whatever the output folder is called
ARCHIVE_MTIME = 0  # every member and the gzip header: the same evidence gives the same bytes

CHILD_TIMEOUT_SECONDS = 150  # one child: import torch, create a context, measure (about 5-15 s on an H200)
BUDGET_SECONDS = 285  # all children together, so that the whole run ends within 5 minutes
VENDOR_TIMEOUT_SECONDS = 20
MAX_CHILD_OUTPUT_CHARS = 2_000_000  # kept in a log; a child's output beyond this is cut
MAX_RESULT_BYTES = 64 * 2**20  # a result file larger than this is not read

# The README's small trial and larger command, and a compute-bound size whose forward (about
# 2.2 TFLOP: some 3-5 ms in float16/bfloat16 and 35-45 ms in float32 on an H200) dwarfs Python's
# overhead, and whose 100 warm-up passes keep the GPU busy for 0.3-4 s, long enough for its
# clocks to settle before the timed repetitions.
SIZES = {
    "small": {"batch": 1, "context": 16, "width": 64, "warmup": 1, "repeats": 2},
    "larger": {"batch": 2, "context": 128, "width": 1024, "warmup": 3, "repeats": 5},
    "big": {"batch": 8, "context": 1024, "width": 4096, "warmup": 100, "repeats": 30},
}
DTYPES = ("float32", "float16", "bfloat16")
SEED = 0
CONFIGURATIONS = {
    f"{size}-{dtype}": {**options, "dtype": dtype, "seed": SEED} for size, options in SIZES.items() for dtype in DTYPES
}
RUNS_PER_CONFIGURATION = 2
TIMED_SIZE = "big"  # the size of the Timer cross-check and of the device-versus-wall bound
TIMER_MIN_RUN_SECONDS = 1.0

# Reduced precision against float32, on the same GPU, seed and inputs.  u is the unit roundoff of
# the reduced format: 2**-11 for float16 (11-bit significand), 2**-8 for bfloat16 (8 bits).
# - measure's checksums: |checksum - float32's| <= u x the float32 output's absolute sum.  The
#   checksum is a signed sum whose terms largely cancel (for seed 0 at 2x128x1024 it is 0.06 % of
#   the absolute sum), so a bound relative to the checksum itself would be ill-conditioned; the
#   absolute sum is the scale of the error.  On the CPU (seeds 0-2; widths 64, 1024 and 4096, the
#   last with 256 positions) the difference stayed below 0.07 u.  Coarse by nature: a signed sum
#   cannot see every error, hence the elementwise check.
# - elementwise, in the cross-check child: ||y - y_float32|| / ||y_float32|| <= 4 u.  Rounding the
#   output alone costs about u/sqrt(3); with the inputs, weights and hidden activations the CPU
#   gave 1.01-1.08 u at every size; 4 u leaves room for the GPU's accumulation order and reduced-
#   precision reductions, and still fails a lost output bias (11 u in bfloat16 at width 1024, 39 u
#   at width 64, on the CPU) or ReLU for GELU (33-38 %).
UNIT_ROUNDOFF = {"float16": 2**-11, "bfloat16": 2**-8}
ELEMENTWISE_UNIT_ROUNDOFFS = 4
SAME_OUTPUT_RELATIVE = 2**-20  # the cross-check child's checksums against measure's: the same work on the same GPU
# measure's warm_forward median / Timer's median: measure adds one launch sequence and two
# synchronizations (tens of microseconds) to a forward of milliseconds, and runs in another
# process (clocks may differ by a few per cent): never below 0.9, at most 1.25.
TIMER_RATIO_BOUNDS = (0.9, 1.25)
# CUDA-event time / wall time of the timed size's warm passes: the wall clock adds only Python
# and the synchronizations to milliseconds of device work.
DEVICE_WALL_RATIO_MIN = 0.8
DEVICE_OVER_WALL_ALLOWANCE_MS = 0.05  # events and clock are not taken at the same instant
REQUESTED_FIELDS = ("baseline_requested_bytes", "end_requested_bytes", "peak_requested_bytes")
VENDOR_FIELDS = (  # what nvidia-smi may tell; never uuid, serial or a PCI address
    "index",
    "name",
    "driver_version",
    "mig.mode.current",
    "clocks.sm",
    "clocks.mem",
    "clocks.max.sm",
    "clocks.max.mem",
    "clocks.applications.graphics",
    "clocks.applications.memory",
    "power.limit",
)
_UUID_LIKE = re.compile(
    r"(?i)\b(?:GPU|MIG)-[0-9a-f-]{8,}|\b[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\b"
)
_PATH_LIKE = re.compile(r"(?:[A-Za-z]:)?[\\/][^\s'\"():,]*[\\/][^\s'\"():,]*")


class ValidationError(Exception):
    """A refusal: one line on stderr, exit 2, nothing kept."""


# ---------------------------------------------------------------------------------------------
# Child processes


class Runner:
    """Runs children one at a time in new sessions, within one time budget; records each run."""

    def __init__(self, timeout_seconds, budget_seconds, clock=time.monotonic):
        self.timeout_seconds = timeout_seconds
        self.deadline = clock() + budget_seconds
        self.clock = clock
        self.records = []

    def run(self, name, argv, shown, cwd, timeout_seconds=None):
        """Run ``argv``; returns a record: name, shown command, outcome, exit status, output, seconds.

        ``outcome`` is "exited", "timed out" (killed), "not run" (budget spent) or "could not start".
        """
        limit = min(timeout_seconds or self.timeout_seconds, self.deadline - self.clock())
        record = {
            "name": name,
            "command": shown,
            "outcome": "not run",
            "exit_status": None,
            "seconds": 0.0,
            "stdout": "",
            "stderr": "",
            "timeout_seconds": max(0.0, round(limit, 1)),
        }
        self.records.append(record)
        if limit < 1:
            record["stderr"] = "not run: the time budget of the children is spent"
            return record
        started = self.clock()
        try:
            process = subprocess.Popen(
                argv,
                cwd=cwd,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                start_new_session=True,
            )
        except OSError as exc:
            record.update(outcome="could not start", stderr=mesure_memoire.describe_error(exc))
            return record
        try:
            stdout, stderr = process.communicate(timeout=limit)
            record["outcome"] = "exited"
        except subprocess.TimeoutExpired:
            kill_group(process)
            stdout, stderr = _drain(process)
            record["outcome"] = "timed out"
            stderr += f"\nkilled after {limit:.0f} s: it did not finish in time".encode()
        except BaseException:  # Ctrl-C above all: no child outlives the validation
            kill_group(process)
            _drain(process)
            raise
        record.update(
            exit_status=process.returncode,
            seconds=round(self.clock() - started, 3),
            stdout=_text(stdout),
            stderr=_text(stderr),
        )
        return record


def kill_group(process):
    """Kill a child and everything it started (it leads its own session)."""
    with contextlib.suppress(OSError):  # already gone
        os.killpg(process.pid, signal.SIGKILL)


def _drain(process):
    try:
        return process.communicate(timeout=10)
    except subprocess.TimeoutExpired:  # a grandchild that left the group still holds a pipe
        process.kill()
        return b"", b""


def _text(data):
    text = data.decode("utf-8", errors="replace") if data else ""
    return text if len(text) <= MAX_CHILD_OUTPUT_CHARS else text[:MAX_CHILD_OUTPUT_CHARS] + "\n[cut]"


def command_for(kind, arguments):
    """The real command of a child: (argv, shown).  ``shown`` is what the evidence records.

    kind "kit": the kit's script; "cross-check": this module's cross_check_child; "notebook":
    the notebook's code cells as one script (arguments: [code]); "vendor": nvidia-smi.
    The tests replace this function with stand-in commands.
    """
    if kind == "kit":
        return [sys.executable, str(ROOT / KIT_SCRIPT), *arguments], " ".join(["python3", KIT_SCRIPT, *arguments])
    if kind == "cross-check":
        code = (
            "import sys; sys.path.insert(0, sys.argv[1]); import gpu_validation as g; g.cross_check_child(sys.argv[2:])"
        )
        return [sys.executable, "-c", code, str(TOOLS), *arguments], "python3 <cross-check child> " + " ".join(
            arguments[:2]
        )
    if kind == "notebook":
        return [sys.executable, "-c", *arguments], "python3 <the notebook's code cells>"
    if kind == "vendor":
        return ["nvidia-smi", *arguments], " ".join(["nvidia-smi", *arguments])
    raise ValueError(kind)


# ---------------------------------------------------------------------------------------------
# The cross-check child (runs in its own process, on the GPU)


def cross_check_child(argv):
    """Child entry: ``cuda:N SPEC_JSON``; prints one JSON object, or one line on stderr and exits 3."""
    import warnings

    try:
        device, specs = argv[0], json.loads(argv[1])
        index = mesure_memoire.device_index(device)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # NumPy's absence, for one: not this check's business
            import torch
        torch.cuda.set_device(index)  # Timer synchronizes only the current device
        result = cross_check(torch, torch.device("cuda", index), specs, lambda: torch.cuda.current_device())
    except Exception as exc:  # the parent records the line and fails the cross-check rows
        print(f"cross-check child: {mesure_memoire.describe_error(exc)}", file=sys.stderr)
        raise SystemExit(3) from None
    sys.stdout.write(json.dumps(result) + "\n")


def cross_check(torch, device, specs, current_device):
    """For each spec, in order: the output's checksum, absolute sum and finiteness; for a spec
    naming a ``reference`` (an earlier float32 spec of the same size), the relative L2 distance
    of its output to the reference's; and Timer's median when asked.

    Same model, seed and inputs as ``measure``.  ``current_device`` is recorded to show which
    device Timer's synchronization covered.
    """
    from torch.utils import benchmark

    answers, references = {}, {}
    for spec in specs:
        dtype = getattr(torch, spec["dtype"])
        torch.manual_seed(spec["seed"])
        with torch.inference_mode():
            model = mesure_memoire.build_model(torch, spec["width"]).to(device=device, dtype=dtype).eval()
            generator = torch.Generator(device=device)
            generator.manual_seed(spec["seed"])
            shape = (spec["batch"], spec["context"], spec["width"])
            inputs = torch.randn(shape, generator=generator, device=device, dtype=dtype)
            output = model(inputs).double()
            answer = {
                "dtype": spec["dtype"],
                "checksum_float64": output.sum().item(),
                "absolute_sum_float64": output.abs().sum().item(),
                "all_finite": bool(torch.isfinite(output).all().item()),
                "elements": output.numel(),
            }
            reference = references.get(spec.get("reference"))
            if reference is not None:
                distance = (output - reference).norm() / reference.norm()
                answer["relative_l2_to_reference"] = distance.item()
            if spec.get("keep_as_reference"):
                references[spec["name"]] = output
            del output

        def forward(model=model, inputs=inputs):
            with torch.inference_mode():
                return model(inputs)

        if spec.get("timer"):
            for _ in range(spec["warmup"]):
                forward()
            measurement = benchmark.Timer(stmt="forward()", globals={"forward": forward}).blocked_autorange(
                min_run_time=spec.get("min_run_seconds", TIMER_MIN_RUN_SECONDS)
            )
            answer.update(
                timer_median_seconds=measurement.median,
                timer_measurements=len(measurement.times),
                current_device=current_device(),
            )
        answers[spec["name"]] = answer
    return answers


def cross_check_specs():
    """Every configuration, each size's float32 first (the reference of its float16 and bfloat16)."""
    specs = []
    for size in SIZES:
        for dtype in DTYPES:
            name = f"{size}-{dtype}"
            spec = {**CONFIGURATIONS[name], "name": name, "timer": size == TIMED_SIZE}
            if dtype == "float32":
                spec["keep_as_reference"] = True
            else:
                spec["reference"] = f"{size}-float32"
            if spec["timer"]:
                spec["min_run_seconds"] = TIMER_MIN_RUN_SECONDS
            specs.append(spec)
    return specs


# ---------------------------------------------------------------------------------------------
# Provenance


def sha256_of(path):
    digest = hashlib.sha256()
    with open(path, "rb") as stream:
        for block in iter(lambda: stream.read(2**20), b""):
            digest.update(block)
    return digest.hexdigest()


def kit_file_hashes(root=ROOT):
    """SHA-256 of every file MANIFEST.json lists (and of this tool), with the manifest's verdict."""
    hashes, mismatches = {}, []
    try:
        manifest = json.loads((root / MANIFEST_FILE).read_text(encoding="utf-8"))
        members = [(m["path"], m.get("sha256")) for m in manifest["members"]]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        return {"files": {}, "mismatches": [f"{MANIFEST_FILE}: {mesure_memoire.describe_error(exc)}"]}
    for name, expected in members:
        try:
            hashes[name] = sha256_of(root / name)
        except OSError as exc:
            hashes[name] = None
            mismatches.append(f"{name}: {mesure_memoire.describe_error(exc)}")
            continue
        if expected is not None and hashes[name] != expected:
            mismatches.append(f"{name}: differs from {MANIFEST_FILE}")
    return {"files": hashes, "mismatches": mismatches, "validator_sha256": sha256_of(Path(__file__))}


def scrub_identifier(value):
    """Withhold anything shaped like a GPU UUID, whatever field it came in."""
    return None if value is None or _UUID_LIKE.search(value) else value


def parse_vendor_csv(text, fields):
    """Rows of ``nvidia-smi --format=csv,noheader`` for ``fields``: a list of dicts, or raises ValueError.

    Only the requested (allowed) fields are kept; "[N/A]"-like values become null.
    """
    rows = []
    for cells in csv.reader(io.StringIO(text), skipinitialspace=True):
        if not cells:
            continue
        if len(cells) != len(fields):
            raise ValueError(f"expected {len(fields)} columns, got {len(cells)}")
        row = {}
        for field, cell in zip(fields, cells, strict=True):
            cell = cell.strip()
            row[field] = None if cell.startswith("[") or cell in ("N/A", "") else scrub_identifier(cell)
        rows.append(row)
    if not rows:
        raise ValueError("no GPU listed")
    return rows


def vendor_query(runner, fields=VENDOR_FIELDS):
    """The vendor tool's view of the GPUs, degrading field by field: {"gpus": [...], "field_errors": {...}}."""
    allowed = [field for field in fields if field in VENDOR_FIELDS]

    def query(names):
        argv, shown = command_for("vendor", [f"--query-gpu={','.join(names)}", "--format=csv,noheader"])
        record = runner.run("nvidia-smi", argv, shown, cwd=None, timeout_seconds=VENDOR_TIMEOUT_SECONDS)
        if record["outcome"] != "exited" or record["exit_status"] != 0:
            reason = record["outcome"] if record["outcome"] != "exited" else f"exit status {record['exit_status']}"
            raise ValueError(f"{reason}: {one_line(record['stderr'] or record['stdout'])}")
        return parse_vendor_csv(record["stdout"], names)

    try:
        return {"tool": "nvidia-smi", "gpus": query(allowed), "field_errors": {}}
    except ValueError as whole:
        if str(whole).startswith(("could not start", "not run", "timed out")):  # no use asking field by field
            return {"tool": "nvidia-smi", "gpus": [], "field_errors": dict.fromkeys(allowed, str(whole))}
    gpus, field_errors = [], {}
    for field in allowed:  # one field at a time: an unsupported field costs only itself
        try:
            rows = query([field])
        except ValueError as exc:
            field_errors[field] = str(exc)
            continue
        for position, row in enumerate(rows):
            if position == len(gpus):
                gpus.append({})
            gpus[position][field] = row[field]
    return {"tool": "nvidia-smi", "gpus": gpus, "field_errors": field_errors}


# ---------------------------------------------------------------------------------------------
# Checks of one result (schema 1 or 2); each check is (family, what, passed, detail)


def phase_label(phase):
    return str(phase.get("phase", "?")) + (f"#{phase['repetition']}" if phase.get("repetition") is not None else "")


def _is_int(value):
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value):
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def check_result(result, requested=None):
    """The invariants of one ``measure`` result; ``requested`` is the configuration asked for."""
    checks = []

    def check(family, what, passed, detail=""):
        checks.append((family, what, bool(passed), detail))

    if not isinstance(result, dict):
        check("structure", "a JSON object", False, type(result).__name__)
        return checks
    schema = result.get("schema_version")
    check("structure", "schema version 1 or 2", schema in (1, 2), repr(schema))
    config = result.get("configuration") if isinstance(result.get("configuration"), dict) else {}
    phases = [p for p in result.get("phases") or [] if isinstance(p, dict)]
    if requested:
        asked = {key: requested[key] for key in ("batch", "context", "width", "dtype", "warmup", "repeats")}
        got = {key: config.get(key) for key in asked}
        check("structure", "configuration as requested", got == asked, "" if got == asked else repr(got))
    warmup, repeats = config.get("warmup"), config.get("repeats")
    if _is_int(warmup) and _is_int(repeats):
        expected = mesure_memoire.phase_names({"warmup": warmup, "repeats": repeats})
    else:
        expected = None
    names = [phase.get("phase") for phase in phases]
    check("structure", "phase lines", names == expected, f"{len(names)} lines")
    repetitions = [phase.get("repetition") for phase in phases if phase.get("phase") == "warm_forward"]
    check("structure", "repetitions numbered", _is_int(repeats) and repetitions == list(range(1, repeats + 1)))
    environment = result.get("environment") if isinstance(result.get("environment"), dict) else {}
    check("structure", "GPU recorded", environment.get("gpu_available") is True)
    check(
        "structure",
        "fresh process",
        config.get("fresh_process_warning") is None,
        one_line(config.get("fresh_process_warning") or ""),
    )
    for phase in phases:
        label = phase_label(phase)
        fields = [phase.get(name) for name in mesure_memoire.PHASE_MEMORY_FIELDS]
        if not all(_is_int(value) for value in fields):
            check("structure", f"{label}: counters", False, "missing or non-integer counter")
            continue
        base_alloc, base_res, end_alloc, end_res, peak_alloc, peak_res = fields
        check(
            "structure",
            f"{label}: allocated <= reserved",
            base_alloc <= base_res and end_alloc <= end_res and peak_alloc <= peak_res,
        )
        check(
            "structure",
            f"{label}: peaks >= ends and baselines",
            min(peak_alloc - end_alloc, peak_alloc - base_alloc, peak_res - end_res, peak_res - base_res) >= 0,
        )
        seconds = phase.get("seconds")
        check("structure", f"{label}: time > 0", _is_number(seconds) and seconds > 0)
    if schema == 2:
        checks += schema2_checks(result, phases, config)
    else:
        check(
            "predictions",
            "schema 2 fields",
            False,
            f"schema {schema!r} result: no predictions, device time, workspace or output summary",
        )
    return checks


def schema2_checks(result, phases, config):
    checks = []

    def check(family, what, passed, detail=""):
        checks.append((family, what, bool(passed), detail))

    all_disagreements = []
    for phase in phases:
        label = phase_label(phase)
        requested = [phase.get(name) for name in REQUESTED_FIELDS]
        allocated = [
            phase.get(name) for name in ("baseline_allocated_bytes", "end_allocated_bytes", "peak_allocated_bytes")
        ]
        if all(_is_int(value) for value in requested + allocated):
            check(
                "predictions",
                f"{label}: requested <= allocated",
                all(r <= a for r, a in zip(requested, allocated, strict=True)),
            )
        else:
            check("predictions", f"{label}: requested counters", False, "missing (null) requested-bytes counter")
        verdict = phase.get("verdict")
        disagreements = phase.get("disagreements")
        if verdict == "agrees":
            check("predictions", f"{label}: verdict", disagreements == [], "agrees")
        else:
            shown = "; ".join(describe_disagreement(d) for d in disagreements or [] if isinstance(d, dict))
            check("predictions", f"{label}: verdict", False, f"{verdict!r}" + (f": {shown}" if shown else ""))
        if isinstance(disagreements, list):
            all_disagreements += disagreements
        if not isinstance(phase.get("predicted"), dict):
            check("predictions", f"{label}: prediction recorded", False, "no 'predicted' object")
        device_ms, seconds = phase.get("device_ms"), phase.get("seconds")
        if not (_is_number(device_ms) and _is_number(seconds)):
            check("device time", f"{label}: device_ms", False, f"device_ms {device_ms!r}")
        else:
            wall_ms = seconds * 1000
            check(
                "device time",
                f"{label}: 0 < device_ms <= wall",
                0 < device_ms <= wall_ms + DEVICE_OVER_WALL_ALLOWANCE_MS,
                f"device {device_ms:.4f} ms, wall {wall_ms:.4f} ms",
            )
    prediction_check = result.get("prediction_check")
    if not isinstance(prediction_check, dict):
        check("predictions", "prediction_check", False, "missing")
    else:
        agrees = prediction_check.get("agrees")
        listed = prediction_check.get("disagreements")
        # The same count as the phases list (the contract says "like", so the objects may differ).
        consistent = (
            agrees is (not all_disagreements) and isinstance(listed, list) and len(listed) == len(all_disagreements)
        )
        check(
            "predictions",
            "prediction_check agrees with the phases",
            agrees is True and consistent,
            f"agrees {agrees!r}, {len(listed) if isinstance(listed, list) else '?'} disagreement(s)"
            + ("" if consistent else "; not the phases' own disagreements"),
        )
    workspace = result.get("workspace")
    measured = workspace.get("measured_bytes") if isinstance(workspace, dict) else None
    check(
        "workspace",
        "workspace measured",
        _is_int(measured) and measured >= 0 and isinstance(workspace.get("how"), str),
        f"{measured!r} bytes",
    )
    summary = result.get("output_summary") if isinstance(result.get("output_summary"), dict) else {}
    elements = math.prod(config.get(key) or 0 for key in ("batch", "context", "width"))
    check(
        "numerics", "output all finite", summary.get("all_finite") is True, f"all_finite {summary.get('all_finite')!r}"
    )
    check(
        "numerics",
        "checksum recorded",
        _is_number(summary.get("checksum_float64")) and summary.get("elements") == elements,
        f"checksum {summary.get('checksum_float64')!r}, elements {summary.get('elements')!r} (expected {elements})",
    )
    return checks


def describe_disagreement(item):
    return (
        f"{item.get('counter')} predicted {item.get('predicted_bytes')} measured "
        f"{item.get('measured_bytes')} ({item.get('difference_bytes'):+} bytes)"
        if _is_int(item.get("difference_bytes"))
        else one_line(repr(item))
    )


def compare_runs(first, second):
    """The two fresh runs of one configuration: (counters identical, checksum identical, figures)."""
    differences = []
    phases_a, phases_b = first.get("phases") or [], second.get("phases") or []
    if len(phases_a) != len(phases_b):
        differences.append(f"{len(phases_a)} phase lines vs {len(phases_b)}")
    for phase_a, phase_b in zip(phases_a, phases_b, strict=False):  # a length difference is reported above
        for counter in (*mesure_memoire.PHASE_MEMORY_FIELDS, *REQUESTED_FIELDS):
            if phase_a.get(counter) != phase_b.get(counter):
                differences.append(
                    f"{phase_label(phase_a)} {counter}: {phase_a.get(counter)!r} vs {phase_b.get(counter)!r}"
                )
    checksums = [(run.get("output_summary") or {}).get("checksum_float64") for run in (first, second)]
    same_checksum = _is_number(checksums[0]) and checksums[0] == checksums[1]
    medians = [warm_median_ms(run) for run in (first, second)]
    spread = None
    if all(_is_number(m) and m > 0 for m in medians):
        spread = (max(medians) - min(medians)) / min(medians)
    return {
        "counter_differences": differences,
        "same_checksum": same_checksum,
        "checksums": checksums,
        "warm_median_ms": medians,
        "warm_median_spread": spread,
        "device_median_ms": [warm_median_ms(run, "device_ms") for run in (first, second)],
    }


def warm_median_ms(result, key="seconds"):
    values = [p.get(key) for p in result.get("phases") or [] if p.get("phase") == "warm_forward"]
    if not values or not all(_is_number(v) for v in values):
        return None
    return statistics.median(values) * (1000 if key == "seconds" else 1)


def milliseconds(value):
    return "n/a" if value is None else f"{value:.4f} ms"


def checksum_agreement(reference_checksum, absolute_sum, checksum, dtype):
    """(passed, |difference| / absolute sum, bound): a reduced-precision checksum against float32's."""
    bound = UNIT_ROUNDOFF[dtype]
    if not all(_is_number(v) for v in (reference_checksum, absolute_sum, checksum)) or absolute_sum <= 0:
        return False, None, bound
    relative = abs(checksum - reference_checksum) / absolute_sum
    return relative <= bound, relative, bound


# ---------------------------------------------------------------------------------------------
# Evidence: text that never carries a path, and the archive


def printable(text):
    """``text`` on one line, every control character (a newline above all) escaped as repr would."""
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in str(text))


def one_line(text):
    return " ".join(str(text).split())


def scrub(text, secrets):
    """Remove the given absolute strings, then anything path-shaped, from text kept as evidence."""
    for secret in sorted((s for s in secrets if s and len(s) > 1), key=len, reverse=True):
        text = text.replace(secret, "<path>")
    return _PATH_LIKE.sub("<path>", text)


def write_new(path, text):
    """A new file (never an existing one); written whole or removed."""
    try:
        with open(path, "x", encoding="utf-8", newline="\n") as stream:
            stream.write(text)
    except BaseException:
        if os.path.isfile(path):
            os.unlink(path)
        raise


def archive_bytes(folder):
    """A .tar.gz of every file under ``folder``: sorted members under ARCHIVE_TOP, no owner, fixed dates."""
    names = sorted(
        os.path.relpath(os.path.join(base, name), folder).replace(os.sep, "/")
        for base, _, files in os.walk(folder)
        for name in files
    )
    buffer = io.BytesIO()
    with (
        gzip.GzipFile(filename="", mode="wb", fileobj=buffer, mtime=ARCHIVE_MTIME) as zipped,
        tarfile.open(fileobj=zipped, mode="w", format=tarfile.PAX_FORMAT) as tar,
    ):
        for name in names:
            data = Path(folder, name).read_bytes()
            info = tarfile.TarInfo(f"{ARCHIVE_TOP}/{name}")
            info.size, info.mtime, info.mode = len(data), ARCHIVE_MTIME, 0o644
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def write_archive(folder, archive):
    """Write the archive beside the folder through a temporary file: whole, or not at all."""
    handle, temporary = tempfile.mkstemp(prefix=".partial-", suffix=".tmp", dir=os.path.dirname(archive) or ".")
    try:
        with os.fdopen(handle, "wb") as stream:
            stream.write(archive_bytes(folder))
        try:
            os.link(temporary, archive)  # fails if the name appeared meanwhile: nothing is replaced
        except FileExistsError:
            raise ValidationError("the archive's name appeared during the validation; nothing overwritten") from None
        except OSError:  # a file system without hard links: an exclusive create instead
            with open(temporary, "rb") as source, open(archive, "xb") as target:
                target.write(source.read())
    finally:
        os.unlink(temporary)


def files_holding(folder, secrets):
    """Evidence files that hold one of the ``secrets`` (absolute paths of this machine)."""
    found = []
    for base, _, files in os.walk(folder):
        for name in files:
            path = os.path.join(base, name)
            data = Path(path).read_bytes()
            if any(secret.encode() in data for secret in secrets if secret and len(secret) > 1):
                found.append(os.path.relpath(path, folder))
    return sorted(found)


# ---------------------------------------------------------------------------------------------
# The validation


def measure_arguments(device, options, output=None, plan=False):
    arguments = ["measure", "--device", device]
    for key in ("batch", "context", "width", "dtype", "warmup", "repeats", "seed"):
        arguments += [f"--{key}", str(options[key])]
    return arguments + (["--plan", "--json"] if plan else ["--output", output])


def read_json(path):
    """(data, None) or (None, why)."""
    try:
        if os.path.getsize(path) > MAX_RESULT_BYTES:
            return None, "larger than the tool reads"
        return json.loads(Path(path).read_text(encoding="utf-8")), None
    except FileNotFoundError:
        return None, "no file written"
    except (OSError, ValueError) as exc:
        return None, mesure_memoire.describe_error(exc)


def parse_stdout_json(record):
    try:
        return json.loads(record["stdout"]), None
    except ValueError:
        outcome = record["outcome"] if record["outcome"] != "exited" else f"exit status {record['exit_status']}"
        return None, f"{outcome}: {one_line(scrub(record['stderr'], MACHINE_PATHS))[-300:]}"


def refusal_size(environment):
    """A size whose input alone is as large as the whole GPU: the fit check must refuse it."""
    total = (environment.get("gpu") or {}).get("total_memory_bytes")
    options = {"batch": 1, "context": 1024, "width": 64, "dtype": "float32", "warmup": 0, "repeats": 1, "seed": 0}
    if _is_int(total):
        options["batch"] = -(-total // (1024 * 64 * 4))
    return options


class Validation:
    """Runs every step, collects what the children left, then judges."""

    def __init__(self, device, folder, runner):
        self.device, self.folder, self.runner = device, Path(folder), runner
        self.secrets = [*MACHINE_PATHS, str(self.folder.resolve())]
        self.rows, self.summary = [], {"device": self.device, "tool": PROG}
        self.logged = 0
        self.refusal = None

    def child(self, kind, arguments, name, cwd=None):
        argv, shown = command_for(kind, arguments)
        record = self.runner.run(name, argv, shown, cwd=cwd or self.folder)
        self.flush_logs()
        return record

    def flush_logs(self):
        """Each child's log, written once the folder is known to be kept."""
        if not (self.folder / "logs").is_dir():
            return
        for record in self.runner.records[self.logged :]:
            self.logged += 1
            text = (
                f"$ {record['command']}\noutcome {record['outcome']}, exit status {record['exit_status']}, "
                f"{record['seconds']} s\n--- stdout\n{record['stdout']}\n--- stderr\n{record['stderr']}\n"
            )
            write_new(self.folder / "logs" / f"{self.logged:02d}-{record['name']}.log", scrub(text, self.secrets))

    def row(self, name, passed, detail=""):
        self.rows.append((name, bool(passed), one_line(scrub(str(detail), self.secrets))))

    # --- steps ---

    def environment(self):
        record = self.child("kit", ["environment", "--device", self.device, "--json"], "environment")
        environment, error = parse_stdout_json(record)
        if not isinstance(environment, dict):
            raise ValidationError(f"the environment check of {self.device} failed ({error})")
        if environment.get("gpu_available") is not True:
            raise ValidationError(f"no usable GPU for {self.device}: {environment.get('gpu_unavailable_reason')}")
        self.summary["environment"] = environment
        return environment

    def provenance(self, when):
        vendor = vendor_query(self.runner)
        self.flush_logs()
        self.summary.setdefault("provenance", {})[f"vendor_tool_{when}"] = vendor
        return vendor

    def run_configurations(self):
        runs = {}
        for name, options in CONFIGURATIONS.items():
            plan_record = self.child("kit", measure_arguments(self.device, options, plan=True), f"plan-{name}")
            plan, _ = parse_stdout_json(plan_record)
            if isinstance(plan, dict):
                write_new(self.folder / "plans" / f"{name}.json", json.dumps(plan, indent=2) + "\n")
            runs[name] = {"plan": plan, "plan_record": plan_record, "results": []}
            for number in range(1, RUNS_PER_CONFIGURATION + 1):
                output = f"results/{name}-run{number}.json"
                record = self.child("kit", measure_arguments(self.device, options, output), f"{name}-run{number}")
                result, error = read_json(self.folder / output)
                runs[name]["results"].append({"record": record, "result": result, "error": error})
        return runs

    def run_notebook(self):
        """The notebook's code cells as one plain python3 script, in its own empty folder."""
        try:
            import build_notebook  # only its code_cells_as_script(notebook) -> str is used

            notebook = json.loads((ROOT / NOTEBOOK_FILE).read_text(encoding="utf-8"))
            code = build_notebook.code_cells_as_script(notebook)
        except Exception as exc:  # a notebook or builder that cannot be read is a failed check, not a crash
            return None, f"the notebook's code cannot be read: {mesure_memoire.describe_error(exc)}"
        code, count = re.subn(r"^DEVICE = .*$", f"DEVICE = {self.device!r}", code, flags=re.MULTILINE)
        if count != 1 and self.device != "cuda:0":
            return None, f"the notebook's parameters do not name its device once ({count} DEVICE lines)"
        (self.folder / "notebook").mkdir()
        record = self.child("notebook", [code], "notebook", cwd=self.folder / "notebook")
        written = sorted(p for p in (self.folder / "notebook").iterdir() if p.suffix == ".json")
        if record["outcome"] != "exited" or record["exit_status"] != 0 or len(written) != 1:
            return None, (
                f"{record['outcome']}, exit status {record['exit_status']}, {len(written)} result file(s): "
                + one_line(record["stdout"] + record["stderr"])[-200:]
            )
        return read_json(written[0])

    def run_cross_check(self):
        specs = json.dumps(cross_check_specs(), separators=(",", ":"))
        record = self.child("cross-check", [self.device, specs], "cross-check")
        answers, error = parse_stdout_json(record)
        if isinstance(answers, dict):
            write_new(self.folder / "cross-check.json", json.dumps(answers, indent=2, sort_keys=True) + "\n")
            return answers, None
        return None, error

    def run_refusal(self, environment):
        options = refusal_size(environment)
        plan_record = self.child("kit", measure_arguments(self.device, options, plan=True), "refusal-plan")
        plan, _ = parse_stdout_json(plan_record)
        output = "results/refused.json"
        record = self.child("kit", measure_arguments(self.device, options, output), "refusal")
        self.refusal = (options, plan, record, os.path.lexists(self.folder / output))

    def judge_refusal(self, environment):
        if self.refusal is None:
            self.row("fit check refuses a size beyond free memory", False, "not run")
            return
        options, plan, record, written = self.refusal
        free = (environment.get("gpu") or {}).get("mem_get_info_free_bytes")
        predicted = plan.get("predicted_peak_allocated_bytes") if isinstance(plan, dict) else None
        lines = record["stderr"].splitlines()
        refused = (
            record["outcome"] == "exited"
            and record["exit_status"] == 2
            and len(lines) == 1
            and "Traceback" not in record["stderr"]
            and not written
        )
        beyond = _is_int(predicted) and _is_int(free) and predicted > free
        self.summary["refusal"] = {
            "configuration": options,
            "predicted_peak_allocated_bytes": predicted,
            "free_bytes_before": free,
            "exit_status": record["exit_status"],
            "stderr": record["stderr"],
        }
        self.row(
            "fit check refuses a size beyond free memory",
            refused and beyond,
            f"batch {options['batch']}: predicted peak {predicted!r} > free {free!r} bytes; "
            f"exit {record['exit_status']}, {len(lines)} stderr line(s)"
            + (", a file written" if written else "")
            + f": {lines[0] if lines else ''}",
        )

    # --- judging ---

    def judge_configurations(self, runs, cross):
        reproducibility = {}
        for name, run in runs.items():
            options = CONFIGURATIONS[name]
            results = [r["result"] for r in run["results"]]
            problems = [
                f"run {n}: {r['record']['outcome']}, exit status {r['record']['exit_status']}, {r['error']}: "
                + one_line(r["record"]["stderr"])[-200:]
                for n, r in enumerate(run["results"], 1)
                if not isinstance(r["result"], dict)
            ]
            self.row(f"{name}: both runs wrote a result", not problems, "; ".join(problems))
            families = {}
            for number, result in enumerate(results, 1):
                if isinstance(result, dict):
                    for family, what, passed, detail in check_result(result, options):
                        families.setdefault(family, []).append((f"run {number} {what}", passed, detail))
            for family in ("structure", "predictions", "device time", "workspace", "numerics"):
                checks = families.get(family, [])
                failed = [
                    f"{what}" + (f" ({detail})" if detail else "") for what, passed, detail in checks if not passed
                ]
                if family == "workspace":
                    measured = [
                        (r.get("workspace") or {}).get("measured_bytes") for r in results if isinstance(r, dict)
                    ]
                    detail = f"measured {measured} bytes"
                else:
                    detail = f"{len(checks)} checks" if checks else "no result to check"
                self.row(f"{name}: {family}", checks and not failed, "; ".join(failed[:3]) if failed else detail)
            self.judge_plan(name, run["plan"], results)
            if all(isinstance(r, dict) for r in results) and len(results) == 2:
                comparison = compare_runs(*results)
                reproducibility[name] = comparison
                spread = comparison["warm_median_spread"]
                self.row(
                    f"{name}: counters identical in both runs",
                    not comparison["counter_differences"],
                    "; ".join(comparison["counter_differences"][:3])
                    or f"warm median {comparison['warm_median_ms']} ms, spread "
                    f"{'n/a' if spread is None else f'{spread:.1%}'}",
                )
                self.row(f"{name}: same seed, same checksum", comparison["same_checksum"], f"{comparison['checksums']}")
            else:  # a missing run is never a reproduced one
                self.row(f"{name}: counters identical in both runs", False, "two results are needed")
                self.row(f"{name}: same seed, same checksum", False, "two results are needed")
        self.summary["reproducibility"] = reproducibility
        self.judge_numerics(runs, cross)

    def judge_plan(self, name, plan, results):
        predicted = plan.get("predicted_peak_allocated_bytes") if isinstance(plan, dict) else None
        peaks = [
            max((p.get("peak_allocated_bytes", 0) for p in r.get("phases") or []), default=None)
            for r in results
            if isinstance(r, dict)
        ]
        plan_phases = [p.get("phase") for p in plan.get("phases") or []] if isinstance(plan, dict) else None
        ok = (
            _is_int(predicted)
            and peaks
            and all(_is_int(p) and p <= predicted for p in peaks)
            and all(plan_phases == [p.get("phase") for p in r.get("phases") or []] for r in results if r)
        )
        self.row(
            f"{name}: measured peak within --plan's",
            ok,
            f"predicted {predicted!r}, measured {peaks} bytes; plan phases {'match' if ok else repr(plan_phases)}",
        )

    def judge_numerics(self, runs, cross):
        checksums = {}
        for name, run in runs.items():
            first = run["results"][0]["result"] if run["results"] else None
            checksums[name] = ((first or {}).get("output_summary") or {}).get("checksum_float64")
        cross = cross if isinstance(cross, dict) else {}
        table = {}
        for size in SIZES:
            reproduced = []
            for dtype in DTYPES:
                name = f"{size}-{dtype}"
                answer = cross.get(name) if isinstance(cross.get(name), dict) else {}
                child, scale = answer.get("checksum_float64"), answer.get("absolute_sum_float64")
                same = (
                    answer.get("all_finite") is True
                    and all(_is_number(v) for v in (child, scale, checksums.get(name)))
                    and abs(child - checksums[name]) <= SAME_OUTPUT_RELATIVE * scale
                )
                reproduced.append((dtype, same, child, checksums.get(name)))
            self.row(
                f"{size}: cross-check child reproduces measure's checksums",
                all(same for _, same, _, _ in reproduced),
                "; ".join(f"{d} {'same' if ok else f'child {c!r} vs measure {m!r}'}" for d, ok, c, m in reproduced),
            )
            absolute_sum = (cross.get(f"{size}-float32") or {}).get("absolute_sum_float64")
            for dtype in UNIT_ROUNDOFF:
                name = f"{size}-{dtype}"
                passed, relative, bound = checksum_agreement(
                    checksums.get(f"{size}-float32"), absolute_sum, checksums.get(name), dtype
                )
                self.row(
                    f"{name}: checksum near float32's",
                    passed,
                    f"|difference| / float32 absolute sum {'n/a' if relative is None else f'{relative:.2e}'} "
                    f"<= {bound:.2e} (one unit roundoff)",
                )
                distance = (cross.get(name) or {}).get("relative_l2_to_reference")
                limit = ELEMENTWISE_UNIT_ROUNDOFFS * UNIT_ROUNDOFF[dtype]
                close = _is_number(distance) and distance <= limit
                self.row(
                    f"{name}: output near float32's, elementwise",
                    close,
                    f"relative L2 distance {'n/a' if not _is_number(distance) else f'{distance:.2e}'} <= {limit:.2e} "
                    f"({ELEMENTWISE_UNIT_ROUNDOFFS} unit roundoffs)",
                )
                table[name] = {
                    "checksum_difference_to_absolute_sum": relative,
                    "checksum_bound": bound,
                    "relative_l2_to_float32": distance,
                    "relative_l2_bound": limit,
                }
        self.summary["numerics"] = table

    def judge_timing(self, runs, cross):
        timing = {}
        for dtype in DTYPES:
            name = f"{TIMED_SIZE}-{dtype}"
            results = [r["result"] for r in runs.get(name, {}).get("results", []) if isinstance(r["result"], dict)]
            walls = [
                p["seconds"] * 1000
                for r in results
                for p in r.get("phases") or []
                if p.get("phase") == "warm_forward" and _is_number(p.get("seconds"))
            ]
            devices = [
                p["device_ms"]
                for r in results
                for p in r.get("phases") or []
                if p.get("phase") == "warm_forward" and _is_number(p.get("device_ms"))
            ]
            answer = (cross or {}).get(name) or {}
            timer_ms = (
                answer.get("timer_median_seconds") * 1000 if _is_number(answer.get("timer_median_seconds")) else None
            )
            wall_ms = statistics.median(walls) if walls else None
            device_ms = statistics.median(devices) if devices else None
            ratio = wall_ms / timer_ms if wall_ms and timer_ms else None
            low, high = TIMER_RATIO_BOUNDS
            current = answer.get("current_device")
            index = mesure_memoire.device_index(self.device)
            self.row(
                f"{name}: measure / Timer median",
                ratio is not None and low <= ratio <= high and current == index,
                f"{'n/a' if ratio is None else f'{ratio:.3f}'} in [{low}, {high}]; measure {milliseconds(wall_ms)}, "
                f"Timer {milliseconds(timer_ms)} on current device {current!r}",
            )
            device_ratio = device_ms / wall_ms if device_ms and wall_ms else None
            self.row(
                f"{name}: CUDA-event / wall median",
                device_ratio is not None
                and DEVICE_WALL_RATIO_MIN <= device_ratio <= 1 + DEVICE_OVER_WALL_ALLOWANCE_MS / wall_ms,
                f"{'n/a' if device_ratio is None else f'{device_ratio:.3f}'} >= {DEVICE_WALL_RATIO_MIN}; "
                f"device {milliseconds(device_ms)}, wall {milliseconds(wall_ms)}",
            )
            timing[name] = {
                "measure_wall_median_ms": wall_ms,
                "measure_device_median_ms": device_ms,
                "timer_median_ms": timer_ms,
                "measure_to_timer": ratio,
                "device_to_wall": device_ratio,
                "timer_current_device": current,
            }
        self.summary["timing"] = timing

    def judge_provenance(self, hashes, vendor, environment):
        self.row(
            "kit files match MANIFEST.json",
            not hashes["mismatches"] and hashes["files"],
            "; ".join(hashes["mismatches"]) or f"{len(hashes['files'])} files",
        )
        index = str(mesure_memoire.device_index(self.device))
        gpus = vendor["gpus"]
        row = next((g for g in gpus if g.get("index") == index), gpus[0] if len(gpus) == 1 else {})
        missing = [f for f in VENDOR_FIELDS if row.get(f) is None and not f.startswith("clocks.applications")]
        name = (environment.get("gpu") or {}).get("name")
        self.row(
            "vendor tool: name, driver, MIG, clocks, power limit",
            not missing and row.get("name") == name,
            (f"missing {', '.join(missing)}" if missing else f"{row.get('name')}, driver {row.get('driver_version')}")
            + ("" if row.get("name") == name else f"; PyTorch names {name!r}"),
        )

    def judge_children(self):
        hung = [r for r in self.runner.records if r["outcome"] in ("timed out", "not run")]
        self.row("no child hung or was skipped", not hung, "; ".join(f"{r['name']} {r['outcome']}" for r in hung))
        self.summary["children"] = [
            {k: r[k] for k in ("name", "command", "outcome", "exit_status", "seconds")} for r in self.runner.records
        ]

    def finish(self, verdict_rows_extra=()):
        for row in verdict_rows_extra:
            self.row(*row)
        holding = files_holding(self.folder, self.secrets)
        self.row("no path of this machine in the evidence", not holding, ", ".join(holding))
        self.summary["verdicts"] = [{"check": n, "passed": p, "detail": d} for n, p, d in self.rows]
        text = scrub(json.dumps(self.summary, indent=2, sort_keys=True, default=str) + "\n", self.secrets)
        write_new(self.folder / "summary.json", text)
        verdict = format_verdicts(self.rows)
        write_new(self.folder / "verdict.txt", verdict + "\n")
        return verdict, all(passed for _, passed, _ in self.rows)


def validate(device, folder, archive, runner):
    """The whole validation; returns (verdict table, all passed).  Raises ValidationError before any evidence."""
    validation = Validation(device, folder, runner)
    try:
        os.mkdir(folder)
    except OSError as exc:
        raise ValidationError(f"--output-dir {os.fspath(folder)!r}: cannot create it ({type(exc).__name__})") from None
    try:
        environment = validation.environment()
    except BaseException:
        os.rmdir(folder)  # still empty: a refusal leaves nothing
        raise
    for sub in ("logs", "plans", "results"):
        (validation.folder / sub).mkdir()
    validation.flush_logs()
    write_new(validation.folder / "environment.json", json.dumps(environment, indent=2, sort_keys=True) + "\n")
    interrupted = False
    try:
        hashes = kit_file_hashes()
        validation.summary.setdefault("provenance", {})["kit_files"] = hashes
        vendor = validation.provenance("before")
        runs = validation.run_configurations()
        # In order of importance, should the time budget run out: the Timer and numerics
        # cross-check, the refusal, then the notebook.
        cross, cross_error = validation.run_cross_check()
        validation.run_refusal(environment)
        notebook, notebook_error = validation.run_notebook()
        validation.provenance("after")
        validation.judge_provenance(hashes, vendor, environment)
        validation.judge_configurations(runs, cross)
        validation.row("cross-check child ran", cross is not None, cross_error or "")
        validation.judge_timing(runs, cross)
        validation.judge_refusal(environment)
        notebook_checks = check_result(notebook) if isinstance(notebook, dict) else []
        failed = [f"{what} ({detail})" for _, what, passed, detail in notebook_checks if not passed]
        validation.row(
            "notebook code cells as plain python3",
            notebook_checks and not failed,
            notebook_error or "; ".join(failed[:3]) or f"{len(notebook_checks)} checks",
        )
    except KeyboardInterrupt:
        interrupted = True
    except Exception as exc:  # a defect of this tool still leaves a summary and a verdict
        validation.row("validation completed", False, f"the validator failed: {mesure_memoire.describe_error(exc)}")
    validation.judge_children()
    extra = [("validation completed", False, "interrupted by Ctrl-C; children killed")] if interrupted else []
    verdict, passed = validation.finish(extra)
    if interrupted:
        raise KeyboardInterrupt
    try:
        write_archive(folder, archive)
    except OSError as exc:
        raise ValidationError(
            f"the evidence is in the folder, but its archive cannot be written ({type(exc).__name__})"
        ) from None
    return verdict, passed


def format_verdicts(rows):
    width = max(len(name) for name, _, _ in [("check", 0, 0), *rows])
    lines = [f"{'check'.ljust(width)}  verdict  detail"]
    for name, ok, detail in rows:
        lines.append(f"{name.ljust(width)}  {'PASS' if ok else 'FAIL':7}  {one_line(detail)}".rstrip())
    failed = sum(not passed for _, passed, _ in rows)
    lines.append(f"{len(rows) - failed} passed, {failed} failed")
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------
# Command line


class _Parser(argparse.ArgumentParser):
    """Usage errors become one line (ValidationError) instead of usage text and exit."""

    def error(self, message):
        raise ValidationError(printable(message))


def positive_seconds(option, value):
    if not re.fullmatch(r"[0-9]{1,6}", value) or int(value) < 1:
        raise ValidationError(f"{option}: expected whole seconds from 1 to 999999, got {value!r}")
    return int(value)


def build_parser():
    parser = _Parser(prog=PROG, description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", required=True, help="the GPU to validate, written cuda:N")
    parser.add_argument("--output-dir", required=True, help="a new folder for the evidence (its .tar.gz goes beside)")
    parser.add_argument(
        "--timeout-seconds",
        default=str(CHILD_TIMEOUT_SECONDS),
        help=f"kill a child running longer than this (default {CHILD_TIMEOUT_SECONDS})",
    )
    parser.add_argument(
        "--budget-seconds",
        default=str(BUDGET_SECONDS),
        help=f"time for all children together; later ones are skipped (default {BUDGET_SECONDS})",
    )
    return parser


def main(argv=None) -> int:
    try:
        args = build_parser().parse_args(argv)
        mesure_memoire.device_index(args.device)
        timeout = positive_seconds("--timeout-seconds", args.timeout_seconds)
        budget = positive_seconds("--budget-seconds", args.budget_seconds)
        folder = args.output_dir.rstrip("/\\") or args.output_dir
        if not folder.strip() or "\n" in folder or "\r" in folder:
            raise ValidationError(f"--output-dir: expected a new folder name, got {args.output_dir!r}")
        archive = folder + ".tar.gz"
        if os.path.lexists(archive):
            raise ValidationError(f"--output-dir: {archive!r} already exists beside it (nothing is overwritten)")
        if os.path.lexists(folder):
            raise ValidationError(f"--output-dir: {folder!r} already exists; name a new folder")
        verdict, passed = validate(args.device, folder, archive, Runner(timeout, budget))
    except (ValidationError, mesure_memoire.KitError) as error:
        print(f"{PROG}: error: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted: children killed; no archive written", file=sys.stderr)
        return 130
    try:
        print(verdict, flush=True)
    except BrokenPipeError:  # a closed stdout: the evidence is written; say nothing more
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    except OSError as exc:
        print(f"{PROG}: error: cannot print the verdict ({type(exc).__name__}); it is in verdict.txt", file=sys.stderr)
        return 1
    return 0 if passed else 1


if __name__ == "__main__":
    raise SystemExit(main())
