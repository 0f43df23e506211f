"""Validate this version of the kit on a real GPU, and keep the evidence (not shipped).

Usage::

    python3 tools/gpu_validation.py --device cuda:0 --output-dir validation-run

Into a new (or empty) folder it writes: the vendor tool's driver query, the environment JSON,
``measure`` results from fresh processes (the README's small trial; its larger command in
float32, float16 and bfloat16; a compute-bound configuration for the timing cross-check), the
notebook's code cells run as plain python3 and their result, a log of each run,
``summary.json`` and ``verdict.txt``.  It checks invariants on every result and prints a
verdict table last.  It needs python3 and PyTorch only, and a usable
GPU: without one it exits 2 and writes nothing.  Exit 1 when an invariant fails.
"""

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tools"))

import build_notebook  # noqa: E402  (to run the notebook's code cells without Jupyter)
import mesure_memoire  # noqa: E402  (the kit's own script, beside this folder)

NOTEBOOK_RESULT = "mesures-notebook.json"  # the output named in the notebook's parameters cell

ALIGNMENT_BYTES = 512  # the CUDA caching allocator rounds every block up to 512 bytes
SLACK_PER_TENSOR_BYTES = 2**20  # allowed above that: 1 MiB per tensor
TIMING_RATIO_BOUNDS = (0.8, 1.5)  # our median / Timer's: ours adds Python and two synchronizations
TIMER_MIN_RUN_SECONDS = 2.0

SMALL = {"batch": 1, "context": 16, "width": 64, "warmup": 1, "repeats": 2}
LARGER = {"batch": 2, "context": 128, "width": 1024, "warmup": 3, "repeats": 5}
CROSS_CHECK = {"batch": 8, "context": 1024, "width": 4096, "warmup": 3, "repeats": 10, "dtype": "bfloat16"}
RUNS = {  # file stem -> measure options
    "measure-small-float32": {**SMALL, "dtype": "float32"},
    "measure-larger-float32": {**LARGER, "dtype": "float32"},
    "measure-larger-float16": {**LARGER, "dtype": "float16"},
    "measure-larger-bfloat16": {**LARGER, "dtype": "bfloat16"},
    "measure-crosscheck-bfloat16": CROSS_CHECK,
}


def aligned(size_bytes):
    return -(-size_bytes // ALIGNMENT_BYTES) * ALIGNMENT_BYTES


def check_result(result):
    """The invariants of one measure result: a list of (check, passed, detail)."""
    checks = []

    def check(name, passed, detail=""):
        checks.append((name, bool(passed), detail))

    config = result.get("configuration", {})
    phases = result.get("phases", [])
    expected = mesure_memoire.phase_names({"warmup": config.get("warmup", 0), "repeats": config.get("repeats", 0)})
    names = [phase.get("phase") for phase in phases]
    check("phase lines", names == expected, f"{len(names)} lines")
    repetitions = [phase.get("repetition") for phase in phases if phase.get("phase") == "warm_forward"]
    check("repetitions numbered", repetitions == list(range(1, config.get("repeats", 0) + 1)))
    check("GPU recorded", result.get("environment", {}).get("gpu_available") is True)
    check("fresh process", config.get("fresh_process_warning") is None)
    for phase in phases:
        label = phase.get("phase", "?") + (f"#{phase['repetition']}" if "repetition" in phase else "")
        fields = [phase.get(name) for name in mesure_memoire.PHASE_MEMORY_FIELDS]
        if not all(isinstance(value, int) for value in fields):
            check(f"{label}: counters", False, "missing or non-integer counter")
            continue
        base_alloc, base_res, end_alloc, end_res, peak_alloc, peak_res = fields
        check(
            f"{label}: allocated <= reserved",
            base_alloc <= base_res and end_alloc <= end_res and peak_alloc <= peak_res,
        )
        check(f"{label}: peaks >= ends and baselines", min(peak_alloc - end_alloc, peak_alloc - base_alloc,
                                                           peak_res - end_res, peak_res - base_res) >= 0)  # fmt: skip
        check(f"{label}: time > 0", phase.get("seconds", 0) > 0)
    model = result.get("synthetic_model", {})
    by_name = {phase.get("phase"): phase for phase in phases}
    tensors = model.get("parameter_tensors", [])
    for phase_name, sizes in (
        ("model_load", [tensor["bytes"] for tensor in tensors]),
        ("inputs", [model.get("input_bytes", 0)]),
    ):
        phase = by_name.get(phase_name)
        if phase is None or not all(isinstance(phase.get(k), int) for k in mesure_memoire.PHASE_MEMORY_FIELDS):
            check(f"{phase_name}: allocated delta", False, "phase missing")
            continue
        low = sum(aligned(size) for size in sizes)
        high = low + SLACK_PER_TENSOR_BYTES * len(sizes)
        delta = phase["end_allocated_bytes"] - phase["baseline_allocated_bytes"]
        check(f"{phase_name}: allocated delta", low <= delta <= high, f"{delta} bytes, expected {low}..{high}")
    return checks


def observations(result):
    """Figures worth reporting beside the verdict (not pass/fail)."""
    by_name = {phase["phase"]: phase for phase in result["phases"]}
    model = result["synthetic_model"]
    warm = [phase["seconds"] for phase in result["phases"] if phase["phase"] == "warm_forward"]
    # What the first forward leaves allocated beyond the weights and inputs (the output is
    # already released): cuBLAS's workspace, mostly.
    left_by_cold = by_name["warm_forward"]["baseline_allocated_bytes"] - by_name["inputs"]["end_allocated_bytes"]
    return {
        "parameter_bytes_predicted": model["parameter_bytes"],
        "model_load_allocated_delta_bytes": by_name["model_load"]["end_allocated_bytes"]
        - by_name["model_load"]["baseline_allocated_bytes"],
        "allocated_left_after_cold_forward_bytes": left_by_cold,
        "warm_forward_median_seconds": statistics.median(warm),
    }


def timer_median_seconds(torch, device, options, seed=0):
    """torch.utils.benchmark.Timer's median for the same forward as ``measure``."""
    from torch.utils import benchmark

    width, dtype = options["width"], getattr(torch, options["dtype"])
    torch.manual_seed(seed)
    model = mesure_memoire.build_model(torch, width).to(device=device, dtype=dtype).eval()
    inputs = torch.randn(options["batch"], options["context"], width, device=device, dtype=dtype)

    def forward():
        with torch.inference_mode():
            return model(inputs)

    for _ in range(options["warmup"]):
        forward()
    return (
        benchmark.Timer(stmt="forward()", globals={"forward": forward})
        .blocked_autorange(min_run_time=TIMER_MIN_RUN_SECONDS)
        .median
    )


def run_to_file(command, log_path, shown):
    """Run a command in a fresh process inside the evidence folder; log it as ``shown``.

    Relative names and ``shown`` keep absolute paths out of the evidence.
    """
    completed = subprocess.run(command, capture_output=True, text=True, timeout=300, cwd=log_path.parent)
    log_path.write_text(f"$ {shown}\nexit status {completed.returncode}\n{completed.stdout}{completed.stderr}")
    return completed


def _shown(arguments):
    return " ".join(["python3", "mesure_memoire.py", *arguments])


def format_verdicts(rows):
    width = max(len(name) for name, _, _ in [("check", 0, 0), *rows])
    lines = [f"{'check'.ljust(width)}  verdict  detail"]
    for name, ok, detail in rows:
        detail = " ".join(str(detail).split())  # one line per check, whatever a log held
        lines.append(f"{name.ljust(width)}  {'PASS' if ok else 'FAIL':7}  {detail}".rstrip())
    failed = sum(not passed for _, passed, _ in rows)
    lines.append(f"{len(rows) - failed} passed, {failed} failed")
    return "\n".join(lines)


def validate(device, output_dir):
    environment = mesure_memoire.collect_environment(device)
    if not environment["gpu_available"]:
        raise mesure_memoire.KitError(f"no usable GPU for {device}: {environment['gpu_unavailable_reason']}")
    output_dir.mkdir(parents=True, exist_ok=True)
    script = str(ROOT / "mesure_memoire.py")
    for vendor_command in mesure_memoire.DRIVER_COMMANDS.values():
        try:
            run_to_file(vendor_command.split(), output_dir / "driver.txt", vendor_command)
            break
        except OSError:  # this vendor's tool is not installed
            continue
    else:
        (output_dir / "driver.txt").write_text("no vendor tool (nvidia-smi, amd-smi) found\n")
    arguments = ["environment", "--device", device, "--json"]
    run_to_file([sys.executable, script, *arguments], output_dir / "environment.txt", _shown(arguments))
    rows, summary = [], {"device": device, "runs": {}}
    for stem, options in RUNS.items():
        arguments = ["measure", "--device", device, "--output", f"{stem}.json"]
        for key, value in options.items():
            arguments += [f"--{key}", str(value)]
        completed = run_to_file([sys.executable, script, *arguments], output_dir / f"{stem}.log", _shown(arguments))
        if completed.returncode != 0:
            rows.append((f"{stem}: exit status", False, completed.stderr.strip()[:200]))
            continue
        result = json.loads((output_dir / f"{stem}.json").read_text(encoding="utf-8"))
        rows += [(f"{stem}: {name}", passed, detail) for name, passed, detail in check_result(result)]
        summary["runs"][stem] = {"command": _shown(arguments), **observations(result)}
    # The notebook's code cells as one plain python3 script (no Jupyter on a GPU box), with its
    # default parameters: the small trial, written to NOTEBOOK_RESULT in the evidence folder.
    notebook = json.loads(build_notebook.NOTEBOOK.read_text(encoding="utf-8"))
    code = build_notebook.code_cells_as_script(notebook)
    completed = run_to_file([sys.executable, "-c", code], output_dir / "notebook.log", "python3 <notebook code cells>")
    if completed.returncode != 0 or not (output_dir / NOTEBOOK_RESULT).is_file():
        rows.append(("notebook code cells: result written", False, completed.stdout.strip()[-200:]))
    else:
        result = json.loads((output_dir / NOTEBOOK_RESULT).read_text(encoding="utf-8"))
        rows += [(f"notebook: {name}", passed, detail) for name, passed, detail in check_result(result)]
        summary["runs"]["notebook"] = {"command": "python3 <notebook code cells>", **observations(result)}
    cross = summary["runs"].get("measure-crosscheck-bfloat16")
    if cross:
        import torch

        timer_seconds = timer_median_seconds(torch, torch.device(device), CROSS_CHECK)
        ratio = cross["warm_forward_median_seconds"] / timer_seconds
        cross.update(timer_median_seconds=timer_seconds, ratio_measure_to_timer=ratio)
        low, high = TIMING_RATIO_BOUNDS
        rows.append(("timing cross-check: measure / Timer median", low <= ratio <= high, f"ratio {ratio:.3f}"))
    summary["verdicts"] = [{"check": n, "passed": p, "detail": d} for n, p, d in rows]
    (output_dir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    verdict = format_verdicts(rows)
    (output_dir / "verdict.txt").write_text(verdict + "\n")
    return verdict, all(passed for _, passed, _ in rows)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="gpu_validation.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", required=True, help="the GPU to validate, written cuda:N")
    parser.add_argument("--output-dir", required=True, type=Path, help="a new or empty folder for the evidence")
    args = parser.parse_args(argv)
    try:
        mesure_memoire.device_index(args.device)
        if args.output_dir.exists() and (not args.output_dir.is_dir() or any(args.output_dir.iterdir())):
            raise mesure_memoire.KitError(f"--output-dir: {args.output_dir} exists and is not an empty folder")
        verdict, passed = validate(args.device, args.output_dir)
    except mesure_memoire.KitError as error:
        print(f"gpu_validation.py: error: {error}", file=sys.stderr)
        return 2
    print(verdict)
    return 0 if passed else 1


if __name__ == "__main__":
    raise SystemExit(main())
