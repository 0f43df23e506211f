"""A STAND-IN for the GPU children of tools/gpu_validation.py, because no GPU can be had here.

It answers as the real children would on a healthy GPU, with crafted figures (not measurements):

    fake_child.py [--doctor WHAT]... KIND ARGUMENTS...

KIND is "kit" (mesure_memoire.py's environment, measure --plan --json, and measure --output),
"cross-check", "notebook" or "vendor" (nvidia-smi --query-gpu=... --format=csv,noheader).
``--doctor`` changes one thing, to prove that the validator notices it:

- ``disagree``: every measure result's cold_forward disagrees with its prediction;
- ``nondeterministic``: the end_reserved_bytes of model_load depend on the output name;
- ``nan``: the outputs are not finite;
- ``far-checksum``: the bfloat16 checksums are off by twice the tolerance;
- ``slow-timer``: Timer's median is half of measure's;
- ``far-output``: the float16 outputs are 10 unit roundoffs from float32's, elementwise;
- ``no-refusal``: measure writes a result even for a size beyond free memory;
- ``unsupported=FIELD``: nvidia-smi does not know FIELD;
- ``schema1``: measure writes schema 1 results.

Also importable: ``crafted_result(options, ...)`` builds a consistent schema-2 result.
"""

import json
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))

import mesure_memoire  # noqa: E402

MIB = 2**20
TOTAL_BYTES = 150_000_000_000
FREE_BYTES = 149_000_000_000
GPU_NAME = "Stand-in GPU"
ABSOLUTE_SUM = 1000.0
CHECKSUM_FLOAT32 = 10.0
UNIT_ROUNDOFF = {"float32": 0.0, "float16": 2**-11, "bfloat16": 2**-8}
WORKSPACE_BYTES = 32 * MIB + 128 * 2**10
WALL_SECONDS = {"small": 0.0002, "larger": 0.0004, "big": 0.003}
VENDOR_VALUES = {
    "index": "0",
    "name": GPU_NAME,
    "driver_version": "580.00.01",
    "mig.mode.current": "Disabled",
    "clocks.sm": "1980 MHz",
    "clocks.mem": "3201 MHz",
    "clocks.max.sm": "1980 MHz",
    "clocks.max.mem": "3201 MHz",
    "clocks.applications.graphics": "1980 MHz",
    "clocks.applications.memory": "3201 MHz",
    "power.limit": "700.00 W",
}


def aligned(size_bytes):
    return -(-size_bytes // 512) * 512


def size_name(options):
    for name, width in (("small", 64), ("larger", 1024), ("big", 4096)):
        if options["width"] == width:
            return name
    return "other"


def checksum(dtype, doctors=()):
    off = 0.1 * UNIT_ROUNDOFF[dtype] * ABSOLUTE_SUM  # a tenth of the validator's bound
    if "far-checksum" in doctors and dtype == "bfloat16":
        off = 2 * UNIT_ROUNDOFF[dtype] * ABSOLUTE_SUM
    return CHECKSUM_FLOAT32 + off


def environment():
    return {
        "gpu_available": True,
        "gpu_unavailable_reason": None,
        "torch": "2.11.0+stand-in",
        "gpu": {"name": GPU_NAME, "total_memory_bytes": TOTAL_BYTES, "mem_get_info_free_bytes": FREE_BYTES},
    }


def plan(options):
    config = mesure_memoire.measure_config("cuda:0", *(options[k] for k in ("batch", "context", "width", "dtype",
                                                                            "warmup", "repeats", "seed")))  # fmt: skip
    model = mesure_memoire.synthetic_model(config)
    peak = aligned(model["parameter_bytes"]) + 10 * aligned(model["input_bytes"]) + WORKSPACE_BYTES + 4 * MIB
    phases = [{"phase": name} for name in mesure_memoire.phase_names(config)]
    return {"predicted_peak_allocated_bytes": peak, "phases": phases}


def crafted_result(options, doctors=(), salt=""):
    """A schema-2 result as measure would write it on a healthy GPU (crafted, not measured)."""
    config = mesure_memoire.measure_config("cuda:0", *(options[k] for k in ("batch", "context", "width", "dtype",
                                                                            "warmup", "repeats", "seed")))  # fmt: skip
    model = mesure_memoire.synthetic_model(config)
    weights = sum(aligned(t["bytes"]) for t in model["parameter_tensors"])
    inputs = aligned(model["input_bytes"])
    output = aligned(model["output_bytes"])
    hidden = 4 * inputs
    reserved = 4 * (weights + inputs + WORKSPACE_BYTES + 2 * hidden + output)
    wall = WALL_SECONDS.get(size_name(options), 0.001)

    def phase(name, base, end, peak, **labels):
        record = {"phase": name, "nanoseconds": int(wall * 1e9), "seconds": wall,
                  "baseline_allocated_bytes": base, "baseline_reserved_bytes": reserved,
                  "end_allocated_bytes": end, "end_reserved_bytes": reserved,
                  "peak_allocated_bytes": peak, "peak_reserved_bytes": reserved,
                  "baseline_requested_bytes": base - 256 if base else 0, "end_requested_bytes": end - 256,
                  "peak_requested_bytes": peak - 256, "device_ms": wall * 1000 * 0.95,
                  "predicted": {"end_allocated_bytes": end - base, "peak_allocated_bytes": peak - base,
                                "end_requested_bytes": end - base, "peak_requested_bytes": peak - base},
                  "verdict": "agrees", "disagreements": [], **labels}  # fmt: skip
        return record

    loaded = weights + inputs
    steady = loaded + WORKSPACE_BYTES
    forward_peak = steady + 2 * hidden + output
    phases = [
        phase("model_load", 0, weights, weights),
        phase("inputs", weights, loaded, loaded),
        phase("cold_forward", loaded, steady + output, forward_peak),
    ]
    if options["warmup"]:
        phases.append(phase("warmup", steady, steady + output, forward_peak, passes=options["warmup"]))
    phases += [phase("warm_forward", steady, steady + output, forward_peak, repetition=n)
               for n in range(1, options["repeats"] + 1)]  # fmt: skip
    disagreements = []
    if "disagree" in doctors:
        item = {"phase": "cold_forward", "repetition": None, "counter": "peak_allocated_bytes",
                "predicted_bytes": forward_peak - loaded - 512, "measured_bytes": forward_peak - loaded,
                "difference_bytes": 512}  # fmt: skip
        phases[2].update(verdict="disagrees", disagreements=[item])
        disagreements.append(item)
    if "nondeterministic" in doctors and salt.endswith("run2.json"):
        phases[0]["end_reserved_bytes"] += 2 * MIB
        phases[0]["peak_reserved_bytes"] += 2 * MIB
    result = {
        "kit": mesure_memoire.KIT_NAME,
        "schema_version": 2,
        "tool": "mesure_memoire.py",
        "created_utc": "2026-11-30T00:00:00Z",
        "environment": environment(),
        "configuration": {**config, "fresh_process_warning": None},
        "synthetic_model": model,
        "phases": phases,
        "prediction_check": {"agrees": not disagreements, "disagreements": disagreements},
        "workspace": {"measured_bytes": WORKSPACE_BYTES, "how": "stand-in: crafted, not measured"},
        "output_summary": {
            "all_finite": "nan" not in doctors,
            "checksum_float64": checksum(options["dtype"], doctors),
            "elements": options["batch"] * options["context"] * options["width"],
        },
    }
    if "schema1" in doctors:
        result["schema_version"] = 1
        for key in ("prediction_check", "workspace", "output_summary"):
            del result[key]
        for record in phases:
            for key in ("baseline_requested_bytes", "end_requested_bytes", "peak_requested_bytes", "device_ms",
                        "predicted", "verdict", "disagreements"):  # fmt: skip
                del record[key]
    return result


def options_from(arguments):
    options = {"warmup": 1, "repeats": 2, "seed": 0, "batch": 1, "context": 16, "width": 64, "dtype": "float32"}
    for key in options:
        if f"--{key}" in arguments:
            value = arguments[arguments.index(f"--{key}") + 1]
            options[key] = value if key == "dtype" else int(value)
    return options


def kit(arguments, doctors):
    if arguments[0] == "environment":
        print(json.dumps(environment()))
        return 0
    options = options_from(arguments)
    predicted = plan(options)
    if "--plan" in arguments:
        print(json.dumps(predicted))
        return 0
    if predicted["predicted_peak_allocated_bytes"] > FREE_BYTES and "no-refusal" not in doctors:
        print("mesure_memoire.py: error: stand-in refusal: predicted peak exceeds free memory", file=sys.stderr)
        return 2
    output = arguments[arguments.index("--output") + 1]
    Path(output).write_text(json.dumps(crafted_result(options, doctors, salt=output)))
    print(f"Result written to {output}")
    return 0


def cross_check(arguments, doctors):
    answers = {}
    for spec in json.loads(arguments[1]):
        answer = {"dtype": spec["dtype"], "checksum_float64": checksum(spec["dtype"], doctors),
                  "absolute_sum_float64": ABSOLUTE_SUM, "all_finite": True,
                  "elements": spec["batch"] * spec["context"] * spec["width"]}  # fmt: skip
        if "reference" in spec:
            far = "far-output" in doctors and spec["dtype"] == "float16"
            answer["relative_l2_to_reference"] = (10 if far else 1.05) * UNIT_ROUNDOFF[spec["dtype"]]
        if spec["timer"]:
            wall = WALL_SECONDS["big"] / (2 if "slow-timer" in doctors else 1.05)
            answer.update(timer_median_seconds=wall, timer_measurements=300, current_device=0)
        answers[spec["name"]] = answer
    print(json.dumps(answers))
    return 0


def vendor(arguments, doctors):
    fields = arguments[0].split("=", 1)[1].split(",")
    unsupported = [d.split("=", 1)[1] for d in doctors if d.startswith("unsupported=")]
    for field in fields:
        if field in unsupported:
            print(f'Field "{field}" is not a valid field to query.', file=sys.stderr)
            return 2
    print(", ".join(VENDOR_VALUES[field] for field in fields))
    return 0


def main(argv):
    doctors = []
    while argv and argv[0] == "--doctor":
        doctors.append(argv[1])
        argv = argv[2:]
    kind, arguments = argv[0], argv[1:]
    if kind == "notebook":
        options = {"batch": 1, "context": 16, "width": 64, "dtype": "float32", "warmup": 1, "repeats": 2, "seed": 0}
        Path("mesures-notebook.json").write_text(json.dumps(crafted_result(options, doctors)))
        print(f"stand-in notebook run in {os.path.basename(os.getcwd())}")
        return 0
    return {"kit": kit, "cross-check": cross_check, "vendor": vendor}[kind](arguments, doctors)


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
