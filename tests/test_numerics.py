"""The validation's numerics judgement (tools/gpu_validation.py), proven on the CPU.

Each arithmetic a GPU's matmul may do is emulated with real PyTorch CPU ops on the kit's own model
(its weights as measure builds them, at every harness size and dtype): float32 accumulation, split-K
into four chunks reduced in the dtype, accumulation in the dtype, TF32 inputs, and wrong activations.
Each is scored with the harness's own reference and bound under the flags it is run with: an allowed
arithmetic must lie below the bound, a forbidden one above it, each by at least MARGIN.  The emulated
forward takes ROWS tokens and the second layer's first OUTPUTS outputs (the judgement of any rows and
outputs is the same derivation) so that the sequential emulations stay fast.
"""

import functools
import importlib.util

import pytest
import torch

import mesure_memoire
from conftest import ROOT

spec = importlib.util.spec_from_file_location("gpu_validation", ROOT / "tools" / "gpu_validation.py")
gpu_validation = importlib.util.module_from_spec(spec)
spec.loader.exec_module(gpu_validation)

MARGIN = 1.5
ROWS, OUTPUTS = 8, 128
SPLIT_K_CHUNKS = 4  # the emulation's split: the most the bound allows
DEFAULTS = {  # PyTorch's defaults (2.4 to 2.13): reduced-precision reductions allowed, no TF32
    "float32_matmul_precision": "highest",
    "allow_tf32": False,
    "fp32_precision": "none",
    "allow_fp16_reduced_precision_reduction": True,
    "allow_bf16_reduced_precision_reduction": True,
    "allow_fp16_accumulation": False,
}
TF32_NEW_API = {**DEFAULTS, "fp32_precision": "tf32", "allow_tf32": None, "float32_matmul_precision": None}
FP16_ACCUMULATION = {**DEFAULTS, "allow_fp16_accumulation": True}


def rounded(tensor, dtype):
    """float32 values rounded to ``dtype`` (kept in float32, which holds them exactly)."""
    return tensor.to(getattr(torch, dtype)).float()


def to_tf32(tensor):
    """float32 values rounded to TF32's 10-bit mantissa, to nearest even (as the tensor cores read them)."""
    bits = tensor.contiguous().view(torch.int32)
    bits = (bits + 0xFFF + ((bits >> 13) & 1)) & ~0x1FFF
    return bits.view(torch.float32)


def linear(x, weight, bias, dtype, arithmetic):
    """One Linear in ``dtype`` with the given arithmetic; x, weight and bias hold dtype values in float32."""
    if arithmetic == "tf32":
        return rounded(to_tf32(x) @ to_tf32(weight).T + bias, dtype)
    if arithmetic == "split-k":
        k = x.shape[1]
        edges = [round(i * k / SPLIT_K_CHUNKS) for i in range(SPLIT_K_CHUNKS + 1)]
        total = None
        for start, end in zip(edges, edges[1:], strict=False):
            part = rounded(x[:, start:end] @ weight[:, start:end].T, dtype)
            total = part if total is None else rounded(total + part, dtype)
        return rounded(total + bias, dtype)
    if arithmetic == "dtype":
        return rounded(accumulated_in(dtype, x, weight) + bias, dtype)
    return rounded(x @ weight.T + bias, dtype)  # float32 accumulation: what PyTorch's GEMMs do


def accumulated_in(dtype, x, weight):
    """x @ weight.T with every partial sum rounded to ``dtype``, one term after another."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # thousands of small steps: threads cost more than they give
    try:
        total, columns = torch.zeros(x.shape[0], weight.shape[0]), weight.T.contiguous()
        for k in range(x.shape[1]):
            total = rounded(total + x[:, k : k + 1] * columns[k], dtype)
        return total
    finally:
        torch.set_num_threads(threads)


ACTIVATIONS = {
    "gelu": torch.nn.functional.gelu,
    "tanh-gelu": functools.partial(torch.nn.functional.gelu, approximate="tanh"),
    "relu": torch.relu,
    "identity": lambda z: z,
}


@functools.cache
def kit_model(width):
    torch.manual_seed(0)  # as measure does: the weights first, on the CPU, in float32
    return mesure_memoire.build_model(torch, width)


@functools.cache
def operands(width, dtype):
    """The kit's model and inputs in ``dtype`` (as float32), and the harness's float64 reference and sums."""
    model = kit_model(width)
    generator = torch.Generator()
    generator.manual_seed(0)
    x = rounded(torch.randn((ROWS, width), generator=generator), dtype)
    with torch.no_grad():
        w1, b1 = (rounded(p.detach(), dtype) for p in (model[0].weight, model[0].bias))
        w2, b2 = (rounded(p.detach()[:OUTPUTS], dtype) for p in (model[2].weight, model[2].bias))
    parameters = (w1, b1, w2, b2)
    reference, terms = gpu_validation.float64_reference(torch, x.double(), *(p.double() for p in parameters))
    return x, parameters, reference, terms


@functools.cache
def emulated_error(width, dtype, arithmetic, activation):
    """The relative L2 error of one emulated forward against the harness's float64 reference."""
    x, (w1, b1, w2, b2), reference, _ = operands(width, dtype)
    with torch.no_grad():
        hidden = rounded(ACTIVATIONS[activation](linear(x, w1, b1, dtype, arithmetic)), dtype)
        output = linear(hidden, w2, b2, dtype, arithmetic).double()
    return ((output - reference).norm() / reference.norm()).item()


def scored(size, dtype, arithmetic, activation, flags):
    """(relative L2 error, the harness's bound under ``flags``) of one emulated forward."""
    width = gpu_validation.SIZES[size]["width"]
    bound = gpu_validation.relative_error_bound(dtype, width, operands(width, dtype)[3], flags)
    return emulated_error(width, dtype, arithmetic, activation), bound


ALLOWED = {
    "float32, float32 accumulation": ("float32", "float32", DEFAULTS),
    "float32, TF32 asked (the new API; the legacy reads null)": ("float32", "tf32", TF32_NEW_API),
    "float32, TF32 asked (allow_tf32)": ("float32", "tf32", {**DEFAULTS, "allow_tf32": True}),
    "float16, float32 accumulation": ("float16", "float32", DEFAULTS),
    "float16, split-K reduced in float16": ("float16", "split-k", DEFAULTS),
    "float16, accumulation in float16 asked": ("float16", "dtype", FP16_ACCUMULATION),
    "bfloat16, float32 accumulation": ("bfloat16", "float32", DEFAULTS),
    "bfloat16, split-K reduced in bfloat16": ("bfloat16", "split-k", DEFAULTS),
}
FORBIDDEN = {
    "float32, TF32 when highest was asked": ("float32", "tf32", "gelu"),
    "float32, tanh-GELU": ("float32", "float32", "tanh-gelu"),
    "float16, accumulation in float16": ("float16", "dtype", "gelu"),
    "bfloat16, accumulation in bfloat16": ("bfloat16", "dtype", "gelu"),
    **{f"{d}, {a} for GELU": (d, "float32", a) for d in gpu_validation.DTYPES for a in ("relu", "identity")},
}


@pytest.mark.parametrize("size", gpu_validation.SIZES)
@pytest.mark.parametrize("case", ALLOWED)
def test_each_allowed_arithmetic_passes_with_its_margin(size, case):
    dtype, arithmetic, flags = ALLOWED[case]
    error, bound = scored(size, dtype, arithmetic, "gelu", flags)
    assert 0 < error * MARGIN <= bound, f"{size} {case}: {error:.3e} vs bound {bound:.3e}"


@pytest.mark.parametrize("size", gpu_validation.SIZES)
@pytest.mark.parametrize("case", FORBIDDEN)
def test_each_forbidden_arithmetic_fails_by_its_margin(size, case):
    dtype, arithmetic, activation = FORBIDDEN[case]
    error, bound = scored(size, dtype, arithmetic, activation, DEFAULTS)
    assert error >= MARGIN * bound, f"{size} {case}: {error:.3e} vs bound {bound:.3e}"


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_tanh_gelu_in_a_half_type_is_below_the_roundings_and_not_judged(dtype):
    error, bound = scored("small", dtype, "float32", "tanh-gelu", DEFAULTS)
    assert error < bound  # the limit the derivation states: no size separates it


@pytest.mark.xfail(strict=True, reason="issue 40: the bound assumes split-K in at most 4 chunks")
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_split_k_into_k_chunks_reduced_in_the_dtype_the_default_flags_allow_passes(dtype):
    # K chunks of one term each, reduced in the dtype, is accumulation in the dtype: the default flags allow it
    error, bound = scored("small", dtype, "dtype", "gelu", DEFAULTS)
    assert error <= bound, f"{dtype}: {error:.3e} vs bound {bound:.3e}"
