"""A STAND-IN for the GPU children of tools/gpu_validation.py, because no GPU can be had here.

    fake_child.py [--doctor WHAT]... KIND ARGUMENTS...

KIND is "kit" (mesure_memoire.py environment / measure), "cross-check", "notebook", "vendor"
(nvidia-smi) or "sampler" (nvidia-smi --loop-ms: the clock log, a busy card at its highest clock).
It answers as the real children would on a healthy GPU, with crafted figures (not measurements):
counters laid out from the kit's own prediction, verdicts from the kit's own check_against_plan.
``--doctor`` changes one thing, to prove the validator notices it:
``disagree`` (cold_forward's requested peak 512 bytes off), ``nondeterministic`` (run 2 reserves
2 MiB more), ``far-output`` (float16 twice both its numerics bounds), ``strict-flags`` (the run with
reduced-precision reduction off keeps the error of the default arithmetic, as where cuBLASLt ignores it),
``slow-timer`` (both Timers' medians half of measure's), ``no-refusal`` (measure writes even beyond the
GPU), ``hang`` (the cross-check child sleeps), ``unsupported=FIELD`` (nvidia-smi does not know FIELD),
``ignored-setting`` (the allocator setting the validator sets is not honoured), ``terminate`` (the
cross-check child writes its process id to ``child.pid``, sends SIGTERM to the validator, then sleeps),
``hang-vendor`` (the vendor tool's child sleeps), ``stop-and-exit=SIGNAL`` (the vendor tool's child sends
SIGINT or SIGTERM to the validator and exits at once, within the 0.25 s that Popen.communicate gives a child
after a KeyboardInterrupt: reaped there),
``scale=F`` (each child first sleeps F times its time-plan estimate: a rehearsal of the GPU run).  Under
PYTORCH_CUDA_ALLOC_CONF (set by the validator for its allocator runs; read here only, by this stand-in,
never by the kit) it answers with the settings PyTorch records: those of the native allocator as parsed
(the validator's expected ones); none under cudaMallocAsync (the snapshot refuses), whose requested-bytes
counters stay at zero.  Its counters are laid out by the kit's plan (allocated bytes as under the defaults:
under other settings the kit does not check them).
"""

import json
import os
import signal
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path[:0] = [str(ROOT), str(ROOT / "tools")]


def kit_modules():
    """gpu_validation and mesure_memoire, imported where used: compiling the kit takes a while (much longer
    under the mutation pass, whose copy is rewritten), so the environment and vendor children answer without
    it and a short --timeout-seconds kills only the child meant to hang."""
    import gpu_validation
    import mesure_memoire

    return gpu_validation, mesure_memoire


MIB = 2**20
TOTAL_BYTES, FREE_BYTES = 150_000_000_000, 149_000_000_000
GPU_NAME = "Stand-in GPU"
WORKSPACE_BYTES = 32 * MIB + 1 * MIB  # PyTorch 2.11 on Hopper: cuBLAS 32 MiB, cuBLASLt 1 MiB, both kept
CHECKSUM = {"float32": 10.0, "float16": 10.001, "bfloat16": 10.01}
WALL_NS = 3_000_000
DEVICE_MS = WALL_NS / 1e6 * 0.95
VENDOR = {
    "index": "0",
    "name": GPU_NAME,
    "driver_version": "580.00.01",
    "mig.mode.current": "Disabled",
    "clocks.sm": "1980 MHz",
    "clocks.mem": "3201 MHz",
    "clocks.max.sm": "1980 MHz",
    "clocks.max.mem": "3201 MHz",
    "power.limit": "700.00 W",
}


def environment(backend="native", allocator=None):
    return {
        "gpu_available": True,
        "gpu_unavailable_reason": None,
        "torch": "2.11.0+stand-in",
        "cuda_build": "13.0",
        "hip_build": None,
        "gpu": {
            "name": GPU_NAME,
            "total_memory_bytes": TOTAL_BYTES,
            "mem_get_info_free_bytes": FREE_BYTES,
            "allocator_backend": backend,
        },
        "allocator_settings": allocator,
    }


def crafted_result(options, doctors=(), output=""):
    """A result as measure would write it on a healthy GPU (crafted, not measured)."""
    gpu_validation, mesure_memoire = kit_modules()
    config = mesure_memoire.measure_config(
        "cuda:0", *(options[k] for k in gpu_validation.CONFIG_KEYS), options.get("sustained-s")
    )
    text = os.environ.get(gpu_validation.ALLOCATOR_VARIABLE, "")
    text = "" if "ignored-setting" in doctors else text
    backend = "cudaMallocAsync" if "backend:cudaMallocAsync" in text else "native"
    allocator = {**mesure_memoire.DEFAULT_ALLOCATOR, **gpu_validation.ALLOCATOR_RUNS.get(text, ("", "", {}))[2]}
    allocator = allocator if backend == "native" else None
    plan = mesure_memoire.memory_plan(config)
    no_requested = backend != "native"  # cudaMallocAsync keeps the requested-bytes counters at zero
    reserved = 4 * plan["predicted_peak_allocated_bytes"]
    more = 2 * MIB if "nondeterministic" in doctors and "run2" in output else 0
    records, allocated, requested = [], 0, 0
    for predicted in plan["phases"]:
        extra = WORKSPACE_BYTES if predicted["phase"] == "cold_forward" else 0
        labels = {key: predicted[key] for key in ("repetition", "passes") if key in predicted}
        record = {
            "phase": predicted["phase"],
            **labels,
            "nanoseconds": WALL_NS,
            "device_ms": DEVICE_MS,
            "baseline_reserved_bytes": reserved,
            "end_reserved_bytes": reserved + more,
            "peak_reserved_bytes": reserved,
        }
        for kind, level in (("allocated", allocated), ("requested", requested)):
            record[f"baseline_{kind}_bytes"] = level
            for moment in ("end", "peak"):
                record[f"{moment}_{kind}_bytes"] = level + predicted[f"{moment}_{kind}_bytes"] + extra
            if kind == "requested" and no_requested:
                record.update(baseline_requested_bytes=0, end_requested_bytes=0, peak_requested_bytes=0)
        if "disagree" in doctors and predicted["phase"] == "cold_forward":
            record["peak_requested_bytes"] += 512
        allocated += extra + (predicted["end_allocated_bytes"] if predicted["phase"] in ("model_load", "inputs") else 0)
        requested += extra + (predicted["end_requested_bytes"] if predicted["phase"] in ("model_load", "inputs") else 0)
        records.append(record)
    per_call = {product: {"allocated_bytes": 0, "requested_bytes": 0} for product in ("fc1", "fc2")}  # all kept
    phases, prediction_check, workspace = mesure_memoire.check_against_plan(records, plan, per_call, backend, allocator)
    return {
        "kit": mesure_memoire.KIT_NAME,
        "schema_version": mesure_memoire.RESULT_SCHEMA_VERSION,
        "tool": "mesure_memoire.py",
        "environment": environment(backend, allocator),
        "created_utc": "2026-12-04T00:00:00Z",
        "configuration": {**config, "fresh_process_warning": None},
        "synthetic_model": mesure_memoire.synthetic_model(config),
        "phases": phases,
        "prediction_check": prediction_check,
        "workspace": workspace,
        "output_summary": {
            "all_finite": True,
            "checksum_float64": CHECKSUM[config["dtype"]],
            "elements": config["batch"] * config["context"] * config["width"],
        },
        "sustained": config["sustained_seconds"] and sustained_section(config["sustained_seconds"]),
        "card_state": {"before_warmup": {"reading": None, "why_null": "no nvidia-smi on PATH"}},
        "predicted_peak_allocated_bytes": plan["predicted_peak_allocated_bytes"],
        "fit_margin_bytes": plan["fit_margin_bytes"],
    }


def sustained_section(seconds):
    """A sustained run's section: one window a second, each forward the warm repetitions' device time."""
    windows = [DEVICE_MS] * seconds
    return {
        "sustained_seconds": seconds,
        "forwards_per_window": 333,
        "window_ms_per_forward": windows,
        "steady_ms_per_forward": DEVICE_MS,
        "steady": True,
        "ratio_to_warm_median": 1.0,
    }


def sampler(arguments, doctors):
    """nvidia-smi --loop-ms: the whole log at once, a busy card at its highest clock from 5 s ago to 5 minutes on
    (each window the validator reads then holds samples), then a wait to be killed."""
    now = time.time()
    for step in range(-100, 6000):
        stamp = now + step * 0.05
        clock = time.strftime("%Y/%m/%d %H:%M:%S", time.localtime(stamp)) + f"{stamp % 1:.3f}"[1:]
        print(f"{clock}, 1980 MHz, 650.00 W, 55, 0x0000000000000000")
    sys.stdout.flush()
    time.sleep(600)


def kit(arguments, doctors):
    gpu_validation, mesure_memoire = kit_modules()
    options = parsed_options(arguments)
    config = mesure_memoire.measure_config("cuda:0", *(options[k] for k in gpu_validation.CONFIG_KEYS))
    problem = mesure_memoire.fit_problem(mesure_memoire.memory_plan(config), environment())
    if problem and "no-refusal" not in doctors:
        print(f"mesure_memoire.py: error: {problem}", file=sys.stderr)
        return 2
    output = arguments[arguments.index("--output") + 1]
    Path(output).write_text(mesure_memoire.to_json(crafted_result(options, doctors, output)))
    print(f"Result written to {output}")
    return 0


def cross_check(arguments, doctors):
    gpu_validation, mesure_memoire = kit_modules()
    if "hang" in doctors:
        time.sleep(60)
    if "terminate" in doctors:  # the validator is stopped while this child runs: it must end this child
        Path("child.pid").write_text(str(os.getpid()))
        os.kill(os.getppid(), signal.SIGTERM)
        time.sleep(60)
    defaults = {
        "float32_matmul_precision": "highest",
        "allow_tf32": False,
        "fp32_precision": "none",
        "allow_fp16_reduced_precision_reduction": True,
        "allow_bf16_reduced_precision_reduction": True,
        "allow_fp16_accumulation": False,
    }
    strict = {
        **defaults,
        "allow_fp16_reduced_precision_reduction": False,
        "allow_bf16_reduced_precision_reduction": False,
    }
    answers = {"settings": defaults, "strict_settings": strict, "torch": environment()["torch"]}
    terms = {"Y": 1.0, "HR": 1.0, "HT": 1.0, "OT": 1.0}
    for spec in json.loads(arguments[1]):
        loose = gpu_validation.relative_error_bound(spec["dtype"], spec["width"], terms, defaults)
        tight = gpu_validation.relative_error_bound(spec["dtype"], spec["width"], terms, strict)
        scale = 2 if "far-output" in doctors and spec["dtype"] == "float16" else 0.9
        answer = {
            "checksum_float64": CHECKSUM[spec["dtype"]],
            "absolute_sum_float64": 1000.0,
            "all_finite": True,
            "elements": spec["batch"] * spec["context"] * spec["width"],
            "error_terms": terms,
            "relative_l2_error": scale * loose,
            # strict-flags: the booleans recorded as off, the error still that of the default arithmetic
            "strict_relative_l2_error": scale * (loose if "strict-flags" in doctors else tight),
        }
        if spec["timer"]:
            slow = 2 if "slow-timer" in doctors else 1
            now = time.time()
            answer.update(
                timer_synchronized_median_seconds=WALL_NS / 1e9 / 1.05 / slow,
                timer_synchronized_window=[now - 1, now - 0.5],
                timer_back_to_back_median_seconds=DEVICE_MS / 1e3 / slow,
                timer_back_to_back_window=[now - 0.5, now],
            )
        answers[spec["name"]] = answer
    print(json.dumps(answers))
    return 0


def rehearse(kind, arguments, doctors):
    """Sleep the scaled time-plan estimate of this child (doctor ``scale=F``)."""
    scales = [float(d.removeprefix("scale=")) for d in doctors if d.startswith("scale=")]
    if not scales:
        return
    gpu_validation, mesure_memoire = kit_modules()
    options = parsed_options(arguments)
    started = gpu_validation.IMPORT_SECONDS + gpu_validation.CONTEXT_SECONDS
    if kind == "vendor":
        seconds = gpu_validation.VENDOR_SECONDS
    elif kind == "cross-check":
        seconds = gpu_validation.cross_check_seconds(json.loads(arguments[1]))
    elif kind == "notebook":
        seconds = gpu_validation.measure_seconds(gpu_validation.NOTEBOOK_SIZE) + gpu_validation.DRAWING_SECONDS
    elif "--batch" not in " ".join(arguments) or options["batch"] > 10**6:  # environment, or the refusal
        seconds = started
    else:
        seconds = gpu_validation.measure_seconds(options) + options.get("sustained-s", 0)
    time.sleep(seconds * scales[0])


def parsed_options(arguments):
    options = {k: v for k, _, v in (a.removeprefix("--").partition("=") for a in arguments if "=" in a)}
    return {k: v if k in ("dtype", "query-gpu", "format") else int(v) for k, v in options.items()}


def main(argv):
    doctors = []
    while argv[0] == "--doctor":
        doctors.append(argv[1])
        argv = argv[2:]
    kind, arguments = argv[0], argv[1:]
    if kind == "sampler":
        return sampler(arguments, doctors)
    rehearse(kind, arguments, doctors)
    if kind == "vendor" or arguments[:1] == ["environment"]:
        return vendor(arguments, doctors) if kind == "vendor" else print(json.dumps(environment())) or 0
    if kind == "notebook":
        mesure_memoire = kit_modules()[1]
        code = Path(arguments[0]).read_text()
        assert "DEVICE = 'cuda:0'" in code, "the validator sets the notebook's device"
        options = {"batch": 1, "context": 16, "width": 64, "dtype": "float32", "warmup": 1, "repeats": 2, "seed": 0}
        Path("mesures-notebook.json").write_text(mesure_memoire.to_json(crafted_result(options)))
        return 0
    return {"kit": kit, "cross-check": cross_check}[kind](arguments, doctors)


def vendor(arguments, doctors):
    if "hang-vendor" in doctors:
        time.sleep(60)
    for doctor in doctors:  # the validator is stopped as this child ends: it is gone before the validator kills it
        if doctor.startswith("stop-and-exit="):
            os.kill(os.getppid(), getattr(signal, doctor.removeprefix("stop-and-exit=")))
            return 0
    fields = arguments[0].split("=", 1)[1].split(",")
    unknown = [field for field in fields if f"unsupported={field}" in doctors]
    if unknown:
        print(f'Field "{unknown[0]}" is not a valid field to query.', file=sys.stderr)
        return 2
    print(", ".join(VENDOR[field] for field in fields))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
