"""The validation's numerics judgement (tools/gpu_validation.py), proven on the CPU.

Each arithmetic a GPU's matmul may do is emulated with real PyTorch CPU ops on the kit's own model
(its weights as measure builds them, at every harness size, in float16 and bfloat16 and float32): split-K
into S chunks reduced in the dtype or in float32, TF32 inputs, and gross errors.  Each is scored with the
harness's own reference and bound under the flags it runs with: PyTorch's defaults (the loose bound) or
the two reduced-precision reduction booleans off (the tight bound).  An allowed arithmetic must lie below
its bound and a forbidden one above it, each by at least MARGIN.  The emulated forward takes ROWS tokens
and the second layer's first OUTPUTS outputs (the judgement of any rows and outputs is the same
derivation): the smallest sample whose margins hold, so that the sequential reductions stay cheap.
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
ROWS, OUTPUTS = 4, 64
HALF = ("float16", "bfloat16")
# Split counts: the error grows with S (about u sqrt(S / 2) per reduction), so 1, 2, 16, S_MIN, 256 and
# K (every chunk one term: accumulation in the dtype) bound every count between; a layer whose K is
# smaller than S takes K chunks.  Each count costs S sequential steps: K is the dearest.
CHUNKS = (1, 2, 16, 64, 256, "K")
S_MIN = 64  # the fewest chunks reduced in the dtype that fail the tight bound by MARGIN at every size
# Split-K reduced in float32 (one chunk is no reduction, tested above): the order moves the error by 2**-24,
# unseen here.
FLOAT32_CHUNKS = (2, 64, "K")
DEFAULTS = {  # PyTorch's defaults (2.4 to 2.13): reduced-precision reductions allowed, no TF32
    "float32_matmul_precision": "highest",
    "allow_tf32": False,
    "fp32_precision": "none",
    "allow_fp16_reduced_precision_reduction": True,
    "allow_bf16_reduced_precision_reduction": True,
    "allow_fp16_accumulation": False,
}
STRICT = {**DEFAULTS, "allow_fp16_reduced_precision_reduction": False, "allow_bf16_reduced_precision_reduction": False}
TF32_NEW_API = {**DEFAULTS, "fp32_precision": "tf32", "allow_tf32": None, "float32_matmul_precision": None}
FP16_ACCUMULATION = {**STRICT, "allow_fp16_accumulation": True}


def rounded(tensor, dtype):
    """float32 values rounded to ``dtype`` (kept in float32, which holds them exactly)."""
    return tensor.to(getattr(torch, dtype)).float()


def to_tf32(tensor):
    """float32 values rounded to TF32's 10-bit mantissa, to nearest even (as the tensor cores read them)."""
    bits = tensor.contiguous().view(torch.int32)
    bits = (bits + 0xFFF + ((bits >> 13) & 1)) & ~0x1FFF
    return bits.view(torch.float32)


def split_k(x, weight_t, chunks, reduction):
    """x @ weight_t in ``chunks`` chunks of K, each summed in float32, then reduced one after another in
    ``reduction`` (each partial sum rounded to it; in float32, at once: the order moves the error by about
    2**-24, unseen here).  K is padded with zeros to a whole number of chunks."""
    k = x.shape[1]
    count = k if chunks == "K" else min(chunks, k)
    length = -(-k // count)
    if length * count > k:  # pad copies: only where needed (the big size's weight is 256 MiB)
        x = torch.nn.functional.pad(x, (0, length * count - k))
        weight_t = torch.nn.functional.pad(weight_t, (0, 0, 0, length * count - k))
    x_chunks = x.reshape(x.shape[0], count, length).transpose(0, 1)
    w_chunks = weight_t.reshape(count, length, -1)
    block = max(1, 2**21 // (x.shape[0] * weight_t.shape[1]))  # chunks computed together: a few MiB
    total = torch.zeros(x.shape[0], weight_t.shape[1], dtype=getattr(torch, reduction))
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # thousands of small steps: threads cost more than they give
    try:
        for start in range(0, count, block):
            parts = torch.bmm(x_chunks[start : start + block], w_chunks[start : start + block])
            if reduction == "float32":
                total += parts.sum(0)
                continue
            for part in parts.to(total.dtype):
                total = total + part  # computed in float32, rounded to the reduction's type
        return total.float()
    finally:
        torch.set_num_threads(threads)


def linear(x, weight, bias, dtype, arithmetic):
    """One Linear in ``dtype``; x, weight and bias hold dtype values in float32.  ``arithmetic``: "tf32",
    "transposed" (the weight's buffer read transposed), "no-bias", or (chunks, the reduction's type)."""
    if arithmetic == "tf32":
        return rounded(to_tf32(x) @ to_tf32(weight).T + bias, dtype)
    if arithmetic == "transposed":
        return rounded(x @ weight.reshape(weight.shape[1], weight.shape[0]) + bias, dtype)
    if arithmetic == "no-bias":
        return rounded(x @ weight.T, dtype)
    chunks, reduction = arithmetic
    if chunks == 1:  # one chunk: no reduction, one rounding
        return rounded(x @ weight.T + bias, dtype)
    return rounded(split_k(x, transposed(weight), chunks, reduction) + bias, dtype)


_TRANSPOSED = {}


def transposed(weight):
    """weight.T contiguous, kept per weight: copying the big size's 256 MiB at each call would dominate."""
    key = (weight.data_ptr(), tuple(weight.shape))
    if key not in _TRANSPOSED:
        _TRANSPOSED[key] = weight.T.contiguous()
    return _TRANSPOSED[key]


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
def emulated_error(width, dtype, arithmetic, activation="gelu", second=None):
    """The relative L2 error of one emulated forward against the harness's float64 reference; ``second``:
    the second layer's arithmetic where it differs from the first's (a bias lost there only)."""
    x, (w1, b1, w2, b2), reference, _ = operands(width, dtype)
    with torch.no_grad():
        hidden = rounded(ACTIVATIONS[activation](linear(x, w1, b1, dtype, arithmetic)), dtype)
        output = linear(hidden, w2, b2, dtype, second or arithmetic).double()
    return ((output - reference).norm() / reference.norm()).item()


def scored(size, dtype, flags, arithmetic, activation="gelu", second=None):
    """(relative L2 error, the harness's bound under ``flags``) of one emulated forward."""
    width = gpu_validation.SIZES[size]["width"]
    bound = gpu_validation.relative_error_bound(dtype, width, operands(width, dtype)[3], flags)
    # Every argument passed, so that one forward is one cache entry however the test names it.
    return emulated_error(width, dtype, arithmetic, activation, second), bound


# The big size's model and operands take seconds to build: its tests share one worker, which builds them once.
ONE_WORKER = pytest.mark.xdist_group("numerics at the big size")
SIZES = [pytest.param(size, marks=ONE_WORKER) if size == "big" else size for size in gpu_validation.SIZES]


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("chunks", CHUNKS)
def test_under_the_default_flags_every_split_reduced_in_the_dtype_passes_the_loose_bound(size, dtype, chunks):
    error, bound = scored(size, dtype, DEFAULTS, (chunks, dtype))
    assert 0 < error * MARGIN <= bound, f"{size} {dtype} S={chunks}: {error:.3e} vs bound {bound:.3e}"


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("chunks", FLOAT32_CHUNKS)
def test_with_reduction_off_every_split_reduced_in_float32_passes_the_tight_bound(size, dtype, chunks):
    error, bound = scored(size, dtype, STRICT, (chunks, "float32"))
    assert 0 < error * MARGIN <= bound, f"{size} {dtype} S={chunks}: {error:.3e} vs bound {bound:.3e}"


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("chunks", [c for c in CHUNKS if c == "K" or c >= S_MIN])
def test_with_reduction_off_a_split_reduced_in_the_dtype_fails_the_tight_bound(size, dtype, chunks):
    error, bound = scored(size, dtype, STRICT, (chunks, dtype))  # at "K": accumulation in the dtype
    assert error >= MARGIN * bound, f"{size} {dtype} S={chunks}: {error:.3e} vs bound {bound:.3e}"


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("dtype", HALF)
def test_below_s_min_a_split_reduced_in_the_dtype_is_not_separable(size, dtype):
    error, bound = scored(size, dtype, STRICT, (2, dtype))
    assert error < bound  # the limit the derivation states: fewer than S_MIN chunks are not judged


ALLOWED = {  # (dtype, arithmetic, flags): float32 and the flags that ask for more
    "float32, float32 accumulation": ("float32", (1, "float32"), DEFAULTS),
    "float32, split-K reduced in float32": ("float32", ("K", "float32"), STRICT),
    "float32, TF32 asked (the new API; the legacy reads null)": ("float32", "tf32", TF32_NEW_API),
    "float32, TF32 asked (allow_tf32)": ("float32", "tf32", {**DEFAULTS, "allow_tf32": True}),
    "float16, accumulation in float16 asked": ("float16", ("K", "float16"), FP16_ACCUMULATION),
}
FORBIDDEN = {  # (dtype, arithmetic, activation, second layer's arithmetic, flags): caught by either bound
    "float32, TF32 when highest was asked": ("float32", "tf32", "gelu", None, DEFAULTS),
    "float32, tanh-GELU": ("float32", (1, "float32"), "tanh-gelu", None, DEFAULTS),
    "float32, the second bias lost": ("float32", (1, "float32"), "gelu", "no-bias", DEFAULTS),
    "float16, ReLU for GELU": ("float16", (1, "float16"), "relu", None, DEFAULTS),
    **{f"{d}, identity for GELU": (d, (1, d), "identity", None, DEFAULTS) for d in gpu_validation.DTYPES},
    **{f"{d}, W1 read transposed": (d, "transposed", "gelu", (1, d), DEFAULTS) for d in gpu_validation.DTYPES},
    **{f"{d}, ReLU for GELU, tight": (d, (1, d), "relu", None, STRICT) for d in HALF},
    **{f"{d}, the second bias lost, tight": (d, (1, d), "gelu", "no-bias", STRICT) for d in HALF},
}


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("case", ALLOWED)
def test_each_allowed_arithmetic_passes_with_its_margin(size, case):
    dtype, arithmetic, flags = ALLOWED[case]
    error, bound = scored(size, dtype, flags, arithmetic)
    assert 0 < error * MARGIN <= bound, f"{size} {case}: {error:.3e} vs bound {bound:.3e}"


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("case", FORBIDDEN)
def test_each_forbidden_arithmetic_fails_by_its_margin(size, case):
    dtype, arithmetic, activation, second, flags = FORBIDDEN[case]
    error, bound = scored(size, dtype, flags, arithmetic, activation, second)
    assert error >= MARGIN * bound, f"{size} {case}: {error:.3e} vs bound {bound:.3e}"


@ONE_WORKER
@pytest.mark.parametrize(
    ("dtype", "activation", "second"), [("bfloat16", "relu", None), ("float16", "gelu", "no-bias")]
)
def test_gross_errors_the_loose_bound_cannot_separate_are_below_it_at_the_big_size(dtype, activation, second):
    error, bound = scored("big", dtype, DEFAULTS, (1, dtype), activation, second)
    assert error < bound  # caught by the tight bound only (above), as the derivation states


@pytest.mark.parametrize("dtype", HALF)
def test_tanh_gelu_in_a_half_type_is_below_the_roundings_and_not_judged(dtype):
    error, bound = scored("small", dtype, STRICT, (1, dtype), "tanh-gelu")
    assert error < bound  # the limit the derivation states: no size separates it
