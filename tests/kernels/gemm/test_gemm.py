"""The fused-epilogue GEMM against torch in float64: every interpreter-runnable variant x every epilogue x dtype x
awkward sizes, both layouts of A and B, the TMA kernel and the staged variant (run directly: the interpreter
executes tensor descriptors, though the space never offers tma or staged there), the space's rules on the
interpreter and on a fake H200 (and the recorded H200 timing tables still matching them), heuristic validity, the
ops (strides, leading dims, empty and K == 0 inputs, torch.compile) and bad inputs.

Kept small (M, N, K <= 100, 16/32 blocks): the interpreter runs every program in Python.
"""

from __future__ import annotations

import itertools
import math

import pytest
import torch
import torch.nn.functional as F
from fingerprints import A10, H200, H200_LIMITS, MI300
from kernel_checks import assert_heuristic_valid

from tunekit.core.device import fingerprint
from tunekit.core.errors import InvalidInputError, InvalidShapeError
from tunekit.core.spec import DTYPE_NAMES
from tunekit.evaluation.simulate import check_table
from tunekit.evaluation.timing_table import load_all
from tunekit.kernels import gemm as G
from tunekit.kernels.common import pow2_divisor
from tunekit.kernels.gemm import host as GH
from tunekit.kernels.gemm import problem as GP
from tunekit.ops.gemm import linear, matmul
from tunekit.runtime.dispatch import dispatcher
from tunekit.search_spaces.gemm.gemm import SPACE, VARIANTS, has_tma, is_aligned16, smem_bytes
from tunekit.tuning import perf_model
from tunekit.tuning.verify import verify_config

SPEC = G.SPEC
CPU = torch.device("cpu")
DTYPES = (torch.float32, torch.float16, torch.bfloat16)
SIZES = ((1, 1, 1), (7, 13, 5), (33, 17, 65), (64, 48, 32), (100, 3, 16))  # (M, N, K)
LAYOUTS = tuple(itertools.product(("row", "col"), repeat=2))

INTERP = fingerprint()

# name -> (activation, has_bias, has_residual, alpha, beta)
EPILOGUES = {
    "none": ("none", False, False, 1.0, 1.0),
    "bias_relu": ("relu", True, False, 1.0, 1.0),
    "bias_gelu": ("gelu", True, False, 1.0, 1.0),
    "gelu_tanh_residual": ("gelu_tanh", False, True, 1.0, 1.0),
    "silu": ("silu", False, False, 1.0, 1.0),
    "alpha_beta": ("none", True, True, -0.5, 2.0),
}


def config(variant: str = "grouped", bm: int = 16, bn: int = 16, bk: int = 16, split: int = 1, **kw: int) -> dict:
    return {
        "variant": variant,
        "BLOCK_M": bm,
        "BLOCK_N": bn,
        "BLOCK_K": bk,
        "GROUP_M": kw.get("group_m", 1),
        "SPLIT_K": split,
        "num_warps": kw.get("num_warps", 4),
        "num_stages": kw.get("num_stages", 3),
    }


# Interpreter-runnable variants: (name, config).
VARIANT_CONFIGS = {
    "grouped": config("grouped", 16, 32, 16),
    "persistent": config("persistent", 32, 16, 16, group_m=1),
    "splitk2": config("splitk", 16, 16, 16, split=2),
    "splitk4": config("splitk", 32, 16, 16, split=4, group_m=8),
}


def operand(rows: int, cols: int, layout: str, dtype: torch.dtype, seed: int, scale: float = 1.0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    if layout == "row":
        return (scale * torch.randn(rows, cols, generator=g)).to(dtype)
    return (scale * torch.randn(cols, rows, generator=g)).to(dtype).T


def gemm_inputs(
    m: int,
    n: int,
    k: int,
    dtype: torch.dtype,
    epilogue: str = "none",
    layouts: tuple[str, str] = ("row", "row"),
    seed: int = 0,
) -> tuple:
    activation, has_bias, has_residual, alpha, beta = EPILOGUES[epilogue]
    a = operand(m, k, layouts[0], dtype, seed)
    b = operand(k, n, layouts[1], dtype, seed + 1, scale=1 / math.sqrt(k))  # keeps outputs ~N(0, 1)
    bias = operand(1, n, "row", dtype, seed + 2, scale=0.5)[0] if has_bias else None
    residual = operand(m, n, "row", dtype, seed + 3) if has_residual else None
    return (a, b, bias, residual, activation, alpha, beta)


def reference64(inputs: tuple) -> torch.Tensor:
    """torch in float64 (its own gelu/silu), rounded once to the input dtype."""
    a, b, bias, residual, activation, alpha, beta = inputs
    y = alpha * (a.double() @ b.double())
    if bias is not None:
        y = y + bias.double()
    y = {
        "none": lambda v: v,
        "relu": torch.relu,
        "gelu": F.gelu,
        "gelu_tanh": lambda v: F.gelu(v, approximate="tanh"),
        "silu": F.silu,
    }[activation](y)
    if residual is not None:
        y = y + beta * residual.double()
    return y.to(a.dtype)


def assert_matches(got: torch.Tensor, want: torch.Tensor, what: str = "") -> None:
    assert got.shape == want.shape and got.dtype == want.dtype, what
    tol = SPEC.tolerances[DTYPE_NAMES[want.dtype]]
    torch.testing.assert_close(got, want, atol=tol.atol, rtol=tol.rtol, msg=lambda m: f"{what}: {m}")


def run_launch(cfg: dict, inputs: tuple) -> torch.Tensor:
    (out,) = SPEC.alloc_outputs(inputs)
    out.fill_(float("nan"))  # an element the kernel never writes stays NaN and fails the comparison
    SPEC.launch(cfg, inputs, (out,))
    return out


# --------------------------------------------------------------------------------------------- kernel results


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: DTYPE_NAMES[d])
@pytest.mark.parametrize("epilogue", list(EPILOGUES))
@pytest.mark.parametrize("variant", list(VARIANT_CONFIGS))
def test_variants_x_epilogues_match_float64(variant: str, epilogue: str, dtype: torch.dtype) -> None:
    for i, (m, n, k) in enumerate(SIZES):
        layouts = LAYOUTS[i % len(LAYOUTS)]
        inputs = gemm_inputs(m, n, k, dtype, epilogue, layouts, seed=i)
        got = run_launch(VARIANT_CONFIGS[variant], inputs)
        assert_matches(got, reference64(inputs), f"{variant} {epilogue} {m}x{n}x{k} {layouts}")


@pytest.mark.parametrize("layouts", LAYOUTS, ids=lambda lay: "-".join(lay))
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: DTYPE_NAMES[d])
def test_both_layouts_of_a_and_b(layouts: tuple[str, str], dtype: torch.dtype) -> None:
    for m, n, k in ((33, 17, 65), (64, 48, 32)):
        inputs = gemm_inputs(m, n, k, dtype, "alpha_beta", layouts, seed=m)
        for variant, cfg in VARIANT_CONFIGS.items():
            assert_matches(run_launch(cfg, inputs), reference64(inputs), f"{variant} {layouts} {m}x{n}x{k}")


@pytest.mark.parametrize("layouts", LAYOUTS, ids=lambda lay: "-".join(lay))
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: DTYPE_NAMES[d])
def test_tma_kernel_runs_in_interpreter(layouts: tuple[str, str], dtype: torch.dtype) -> None:
    """Never offered here, but the interpreter executes host tensor descriptors: check the kernel's indexing."""
    for (m, n, k), epilogue in (((64, 48, 32), "bias_gelu"), ((48, 32, 80), "gelu_tanh_residual")):
        inputs = gemm_inputs(m, n, k, dtype, epilogue, layouts)
        assert G.tensors_aligned16(*inputs[:4]) and is_aligned16(m, n, k, DTYPE_NAMES[dtype], layouts[0])
        assert GH._tma_descriptors(inputs[0], inputs[1], 32, 16, 16) is not None  # really the TMA kernel
        got = run_launch(config("tma", 32, 16, 16, group_m=1), inputs)
        assert_matches(got, reference64(inputs), f"tma {layouts} {m}x{n}x{k}")


class _NotTma:
    """Stands in for the non-TMA kernels: launching one (kernel[grid](...)) fails the test."""

    def __getitem__(self, grid: object) -> None:
        raise AssertionError("the tma config fell back to plain loads")


# (dtype, M, N, K): 16-byte aligned leading dims that are not multiples of 16 elements nor of the blocks below
# (64 x 32 x 32): M, N and K each end in a partial tile, so the descriptors' zero fill is what makes them right.
BYTE_ALIGNED = (("bfloat16", 40, 24, 40), ("float16", 72, 24, 40), ("float32", 36, 20, 44))


@pytest.mark.parametrize("layouts", LAYOUTS, ids=lambda lay: "-".join(lay))
@pytest.mark.parametrize("case", BYTE_ALIGNED, ids=lambda c: f"{c[0]}-{c[1]}x{c[2]}x{c[3]}")
def test_tma_on_byte_aligned_sizes(
    case: tuple[str, int, int, int], layouts: tuple[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """aligned16 is 16 bytes, as TMA needs: sizes that are no multiple of 16 elements (or of the tile) are aligned
    when their rows span multiples of 16 bytes, the space offers tma on Hopper, and the descriptor kernel is right
    with ragged M, N and K tails (K = 40 / 44 with BLOCK_K = 32: the last K tile is partly zero-filled)."""
    dtype, m, n, k = case
    problem = G.make_problem(
        m, n, k, dtype, a_layout=layouts[0], b_layout=layouts[1], activation="gelu", has_bias=True, has_residual=True
    )
    assert problem["aligned16"] and k % 32 and (n % 16 or k % 16)
    cfg = config("tma", 64, 32, 32, group_m=1 if m <= 64 else 8)
    assert SPACE.is_valid(cfg, problem, H200), SPACE.violations(cfg, problem, H200)
    inputs = SPEC.make_inputs(problem, CPU, 0)
    assert G.tensors_aligned16(*inputs[:4]) and GH._tma_descriptors(inputs[0], inputs[1], 64, 32, 32) is not None

    for name in ("_gemm_grouped_kernel", "_gemm_persistent_kernel", "_gemm_splitk_kernel"):
        monkeypatch.setattr(GH, name, _NotTma())  # a fallback to plain loads fails here
    got = run_launch(cfg, inputs)
    assert_matches(got, reference64(inputs), f"tma {dtype} {layouts} {m}x{n}x{k}")
    assert verify_config(SPEC, cfg, problem, CPU, seed=1) is None


# (M, N, K) whose rows are no multiple of 16 bytes in fp16/bf16, as bf16 2053^3 but small: odd K and N, M odd too
# (column-major A's leading dim), each ending in a partial 32-wide tile.
UNALIGNED = ((37, 45, 53), (70, 33, 41))


@pytest.mark.parametrize("layouts", LAYOUTS, ids=lambda lay: "-".join(lay))
@pytest.mark.parametrize("dtype", (torch.float16, torch.bfloat16), ids=lambda d: DTYPE_NAMES[d])
def test_staged_runs_the_tma_kernel_on_aligned_copies(
    dtype: torch.dtype, layouts: tuple[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The copies get 16-byte leading strides in the operand's own layout; the TMA kernel (no fallback to plain
    loads) reads them and writes the unpadded C, bias and residual read as they are."""
    for name in ("_gemm_grouped_kernel", "_gemm_persistent_kernel", "_gemm_splitk_kernel"):
        monkeypatch.setattr(GH, name, _NotTma())
    cfg = config("staged", 32, 32, 32, group_m=8)
    for i, ((m, n, k), epilogue) in enumerate(itertools.product(UNALIGNED, ("bias_gelu", "alpha_beta"))):
        inputs = gemm_inputs(m, n, k, dtype, epilogue, layouts, seed=i)
        a, b = inputs[0], inputs[1]
        assert not G.tensors_aligned16(a) and not G.tensors_aligned16(b)
        for t in (a, b):
            copy = GH._staged(t)
            assert G.tensors_aligned16(copy) and G.layout_of(copy) == G.layout_of(t) and torch.equal(copy, t)
        assert_matches(run_launch(cfg, inputs), reference64(inputs), f"staged {epilogue} {m}x{n}x{k} {layouts}")


def test_staged_copies_only_unaligned_operands(monkeypatch: pytest.MonkeyPatch) -> None:
    """A 16-byte aligned operand goes to the kernel as it is; an unaligned one, strided included, is copied."""
    aligned = torch.randn(24, 40, dtype=torch.bfloat16)
    assert GH._staged(aligned) is aligned
    strided = torch.randn(66, 130, dtype=torch.bfloat16)[::2, ::2][:33, :45]
    copy = GH._staged(strided)
    assert G.layout_of(copy) == "row" and copy.stride() == (48, 1) and torch.equal(copy, strided)

    # A [33, 45] has 90-byte rows: copied, padded to 48 columns. B [45, 40] has 80-byte rows: used as it is.
    inputs = gemm_inputs(33, 40, 45, torch.bfloat16, "bias_relu")
    described: list[tuple[torch.Tensor, torch.Tensor]] = []
    real = GH._tma_descriptors

    def spy(a: torch.Tensor, b: torch.Tensor, bm: int, bn: int, bk: int) -> object:
        described.append((a, b))
        return real(a, b, bm, bn, bk)

    monkeypatch.setattr(GH, "_tma_descriptors", spy)
    assert_matches(run_launch(config("staged", 32, 32, 32, group_m=8), inputs), reference64(inputs))
    ((a, b),) = described
    assert a.stride() == (48, 1) and a.data_ptr() != inputs[0].data_ptr() and b is inputs[1]


def test_staged_falls_back_to_plain_loads_on_the_copies(monkeypatch: pytest.MonkeyPatch) -> None:
    """Where no descriptor can be built, the grouped kernel runs on the aligned copies, with the same tiles."""
    monkeypatch.setattr(GH, "_tma_descriptors", lambda *args: None)
    inputs = gemm_inputs(37, 45, 53, torch.float16, "alpha_beta", ("col", "row"))
    assert_matches(run_launch(config("staged", 32, 32, 32, group_m=8), inputs), reference64(inputs))


def test_warp_specialize_flag_changes_nothing_in_the_interpreter() -> None:
    """Not in the space (tests/gpu/gemm_staged_probe.py times it on the GPU); off by default, same results on."""
    inputs = gemm_inputs(48, 32, 80, torch.bfloat16, "gelu_tanh_residual")
    cfg = config("tma", 32, 16, 16, group_m=8)
    plain = run_launch(cfg, inputs)
    assert_matches(plain, reference64(inputs))
    assert torch.equal(run_launch(dict(cfg, WARP_SPECIALIZE=True), inputs), plain)


def test_aligned16_counts_bytes() -> None:
    """The flag's sizes part: N, K (and M for column-major A) times the element size, multiples of 16 bytes."""
    assert is_aligned16(3000, 3000, 3000, "bfloat16", "row")  # 6000-byte rows: TMA-capable
    assert is_aligned16(3000, 3000, 3000, "bfloat16", "col") and is_aligned16(3001, 3000, 3000, "bfloat16", "row")
    assert not is_aligned16(3001, 3000, 3000, "bfloat16", "col")  # column-major A: M is its leading dim
    assert is_aligned16(1, 20, 44, "float32", "row") and not is_aligned16(1, 20, 44, "float16", "row")
    assert not is_aligned16(64, 4095, 4096, "float32", "row") and not is_aligned16(64, 4096, 4094, "float32", "row")
    assert not is_aligned16(64, 4096, 4092, "bfloat16", "row") and is_aligned16(64, 4096, 4092, "float32", "row")
    # Tensors: leading strides in bytes and data pointers.
    assert G.tensors_aligned16(torch.empty(3, 4), torch.empty(5, 8, dtype=torch.float16).T)
    assert not G.tensors_aligned16(torch.empty(3, 4, dtype=torch.float16))  # an 8-byte leading stride
    assert not G.tensors_aligned16(torch.empty(13)[1:].view(3, 4))  # pointer off by 4 bytes
    assert not G.tensors_aligned16(torch.empty(4, 6)[:, :4])  # 24-byte leading stride
    # The recorded 3000^3 table keeps its stored flag (false); the problem made today is TMA-capable.
    problem = G.make_problem(3000, 3000, 3000, "bfloat16", activation="gelu", has_bias=True)
    tma = config("tma", 128, 128, 64, group_m=8, num_warps=8)
    assert problem["aligned16"] and SPACE.is_valid(tma, problem, H200)
    assert SPACE.violations(tma, dict(problem, aligned16=False), H200) == ["tma_needs_aligned16"]


def test_alignment_hints() -> None:
    """ALIGN is what divides N, K, the leading strides (and M for column-major A); sizes divisible by 8, not 16,
    run the hinted path (x // 8 * 8) and must still be exact."""
    for (m, n, k), layouts in itertools.product(((24, 40, 56), (17, 40, 24)), LAYOUTS):
        inputs = gemm_inputs(m, n, k, torch.float16, "alpha_beta", layouts)
        a, b, _, residual = inputs[:4]
        c = torch.empty(m, n, dtype=a.dtype)
        align = GH._alignment(a, b, c, residual, layouts[0] == "col", layouts[1] == "col")
        assert align == (1 if layouts[0] == "col" and m == 17 else 8)
        for cfg in VARIANT_CONFIGS.values():
            assert_matches(run_launch(cfg, inputs), reference64(inputs), f"{cfg['variant']} {m}x{n}x{k} {layouts}")
    assert pow2_divisor(3000, 0, 4096) == 8 and pow2_divisor(4096, 64) == 16 and pow2_divisor(7) == 1


def test_tma_falls_back_on_unaligned_operands() -> None:
    inputs = gemm_inputs(20, 17, 33, torch.float16, "bias_relu")
    assert GH._tma_descriptors(inputs[0], inputs[1], 16, 16, 16) is None
    assert_matches(run_launch(config("tma"), inputs), reference64(inputs))


def test_tall_skinny_and_block_shapes() -> None:
    inputs = gemm_inputs(100, 3, 16, torch.float32, "bias_gelu")
    want = reference64(inputs)
    for bm, bn, bk in ((16, 16, 16), (32, 16, 16), (16, 32, 32), (128, 16, 16)):
        for variant in ("grouped", "persistent"):
            assert_matches(run_launch(config(variant, bm, bn, bk), inputs), want, f"{variant} {bm}x{bn}x{bk}")


def test_splitk_uneven_and_empty_splits_and_determinism() -> None:
    # K = 65 with BLOCK_K = 16: 5 K-blocks over 4 splits of 2 -> the last split has no work and must write zeros.
    inputs = gemm_inputs(33, 17, 65, torch.float32, "alpha_beta")
    cfg = config("splitk", 16, 16, 16, split=4)
    first = run_launch(cfg, inputs)
    assert_matches(first, reference64(inputs))
    assert torch.equal(first, run_launch(cfg, inputs))  # a fixed-order reduction: bitwise repeatable


def test_64bit_offsets_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """Tensors spanning 2**31 elements use int64 offsets; exercise that path by lowering the threshold."""
    monkeypatch.setattr(GH, "INT32_LIMIT", 8)
    inputs = gemm_inputs(33, 17, 65, torch.float16, "gelu_tanh_residual", ("col", "row"))
    for cfg in (*VARIANT_CONFIGS.values(), config("tma")):
        assert_matches(run_launch(cfg, inputs), reference64(inputs), cfg["variant"])


def test_zero_k_launch_applies_epilogue_to_zeros() -> None:
    inputs = gemm_inputs(5, 7, 1, torch.float32, "alpha_beta")
    a, b = inputs[0][:, :0], inputs[1][:0]
    inputs = (a, b, *inputs[2:])
    for cfg in (*VARIANT_CONFIGS.values(), config("tma")):
        assert_matches(run_launch(cfg, inputs), reference64(inputs), cfg["variant"])


@pytest.mark.parametrize("problem", SPEC.default_problems(INTERP), ids=SPEC.describe_problem)
def test_spec_make_inputs_and_verify(problem: dict) -> None:
    """The tuner's path: make_inputs -> NaN-poisoned outputs -> reference, for the heuristic and other configs."""
    valid = SPACE.valid_configs(problem, INTERP)
    others = [next(c for c in valid if c["variant"] == variant) for variant in ("persistent", "splitk")]
    for cfg in [SPEC.heuristic(problem, INTERP), *others]:
        assert SPACE.is_valid(cfg, problem, INTERP), SPACE.violations(cfg, problem, INTERP)
        assert verify_config(SPEC, cfg, problem, CPU, seed=3) is None, cfg


@pytest.mark.parametrize("dtype", ("float32", "float16", "bfloat16"))
@pytest.mark.parametrize("sizes", ((32, 48, 64), (24, 40, 40), (36, 20, 44)), ids=lambda s: "x".join(map(str, s)))
def test_make_inputs_honours_layouts_and_alignment(sizes: tuple[int, int, int], dtype: str) -> None:
    m, n, k = sizes
    p = G.make_problem(m, n, k, dtype, a_layout="col", b_layout="col", has_bias=True, has_residual=True)
    size = getattr(torch, dtype).itemsize
    assert p["aligned16"] == all(d * size % 16 == 0 for d in sizes)
    a, b, bias, residual, _, alpha, beta = SPEC.make_inputs(p, CPU, 0)
    assert G.layout_of(a) == "col" and G.layout_of(b) == "col"
    assert G.tensors_aligned16(a, b, bias, residual) == p["aligned16"]
    assert a.shape == (m, k) and b.shape == (k, n) and alpha != 1.0 and beta != 1.0
    # An unaligned problem whose sizes are aligned gets padded leading strides: no longer 16-byte multiples.
    unaligned = dict(p, aligned16=False)
    a, b, *_ = SPEC.make_inputs(unaligned, CPU, 0)
    assert G.layout_of(a) == "col" and not G.tensors_aligned16(a) and not G.tensors_aligned16(b)
    assert verify_config(SPEC, config(), unaligned, CPU, seed=0) is None
    assert verify_config(SPEC, config("tma"), unaligned, CPU, seed=0) is None  # falls back to plain loads


def test_wrong_kernel_fails_verification(monkeypatch: pytest.MonkeyPatch) -> None:
    """The verification the tests and tuner rely on catches an epilogue applied twice (a classic splitk bug)."""
    problem = G.make_problem(32, 32, 64, "float32", activation="relu", has_bias=True)
    real = G.epilogue_reference

    def doubled(acc, bias, residual, activation, alpha, beta):  # type: ignore[no-untyped-def]
        return real(real(acc, bias, residual, activation, alpha, beta), bias, residual, activation, alpha, beta)

    monkeypatch.setattr(GP, "epilogue_reference", doubled)
    assert verify_config(SPEC, config(), problem, CPU, seed=0) is not None


# ------------------------------------------------------------------------------------------------ space rules


def test_tma_offered_only_on_hopper_for_aligned_problems() -> None:
    aligned = G.make_problem(256, 256, 256, "bfloat16", a_layout="col")
    unaligned = G.make_problem(256, 250, 256, "bfloat16")
    assert aligned["aligned16"] and not unaligned["aligned16"]
    tma = config("tma", 64, 64, 64, group_m=8, num_stages=3)
    assert has_tma(H200) and not has_tma(INTERP) and not has_tma(A10) and not has_tma(MI300)
    assert SPACE.is_valid(tma, aligned, H200)
    assert "tma_needs_aligned16" in SPACE.violations(tma, unaligned, H200)
    for device in (INTERP, A10, MI300):
        assert "tma_needs_hopper" in SPACE.violations(tma, aligned, device)
    for problem in SPEC.default_problems(INTERP):
        assert all(c["variant"] != "tma" for c in SPACE.valid_configs(problem, INTERP))


def test_staged_offered_on_hopper_only_for_unaligned_sizes() -> None:
    """From the sizes, not the aligned16 flag: aligned sizes with unaligned strides (the recorded 3000^3 table)
    get no staged configs; tma's tile parameters and pinning rules apply to staged alike."""
    staged = config("staged", 128, 128, 64, group_m=8, num_warps=8)
    unaligned = (
        G.make_problem(2053, 2053, 2053, "bfloat16", activation="gelu", has_bias=True),
        G.make_problem(4096, 4096, 4094, "float32"),  # K: 16376-byte rows
        G.make_problem(4095, 4096, 4096, "float16", a_layout="col"),  # column-major A: M is its leading dim
    )
    for problem in unaligned:
        assert SPACE.is_valid(staged, problem, H200), SPACE.violations(staged, problem, H200)
        assert SPACE.violations(dict(staged, variant="tma"), problem, H200) == ["tma_needs_aligned16"]
        assert SPACE.violations(dict(staged, SPLIT_K=2), problem, H200) == ["splitk_iff_split_k_above_1"]
        assert SPACE.violations(dict(staged, GROUP_M=1), problem, H200) == ["group_m_8_unless_one_row_of_tiles"]
        for device in (INTERP, A10, MI300):
            assert "tma_needs_hopper" in SPACE.violations(staged, problem, device)
    aligned = G.make_problem(3000, 3000, 3000, "bfloat16", activation="gelu", has_bias=True)
    for problem in (aligned, dict(aligned, aligned16=False), G.make_problem(4095, 4096, 4096, "float16")):
        assert SPACE.violations(staged, problem, H200) == ["staged_only_for_unaligned_sizes"]
    # The staged configs are the tma configs of the problem's aligned twin: same tiles, same pins.
    odd, even = G.make_problem(2053, 2053, 2053, "bfloat16"), G.make_problem(2056, 2056, 2056, "bfloat16")
    assert _tiles_of(odd, "staged") == _tiles_of(even, "tma")
    assert not _tiles_of(odd, "tma") and not _tiles_of(even, "staged")


def _tiles_of(problem: dict, variant: str) -> set[tuple]:
    """The valid configs of one variant on the H200, less the variant itself."""
    valid = SPACE.valid_configs(problem, H200)
    return {tuple(v for name, v in c.items() if name != "variant") for c in valid if c["variant"] == variant}


def test_recorded_gemm_tables_keep_their_valid_configs() -> None:
    """Every recorded H200 GEMM table still holds exactly the configs the space finds valid (the source hash
    warning is expected after a kernel edit; an error would make the simulated tuning runs meaningless)."""
    tables = [t for t in load_all() if t.kernel == "gemm"]
    assert tables
    for table in tables:
        assert not [p for p in check_table(table) if p.startswith("error")], table.problem


def test_model_adds_the_staging_copies_to_tma() -> None:
    """staged quantizes as tma on the same tiles, plus one copy kernel per unaligned operand and its bytes."""
    tma = config("tma", 128, 256, 64, group_m=8, num_warps=8, num_stages=3)
    problem = G.make_problem(2053, 2053, 2053, "bfloat16", activation="gelu", has_bias=True)
    plain = perf_model.quantize("gemm", tma, problem, H200_LIMITS)
    staged = perf_model.quantize("gemm", dict(tma, variant="staged"), problem, H200_LIMITS)
    assert plain is not None and staged is not None
    assert staged.geometry.dims == plain.geometry.dims and staged.grid == plain.grid == 132
    assert (plain.geometry.extra_kernels, plain.geometry.extra_dram_bytes) == (0, 0.0)
    assert staged.geometry.extra_kernels == 2  # A [2053, 2053] and B [2053, 2053], both padded to 2056
    assert staged.geometry.extra_dram_bytes == 2 * 2 * 2053 * (2053 + 2056)
    assert staged.predicted_clk > plain.predicted_clk
    b_only = dict(problem, k=2048, b_layout="row")  # A's rows (K) aligned: only B (N = 2053) is copied
    assert perf_model.quantize("gemm", dict(tma, variant="staged"), b_only, H200_LIMITS).geometry.extra_kernels == 1


def test_smem_rule_prunes_on_hopper_not_in_interpreter() -> None:
    problem = G.make_problem(4096, 4096, 4096, "bfloat16")
    big = config("grouped", 256, 128, 64, group_m=8, num_warps=8, num_stages=5)
    assert smem_bytes(big, problem) > H200.smem_per_block
    assert SPACE.violations(big, problem, H200) == ["pipeline_fits_shared_memory"]
    assert SPACE.is_valid(big, problem, INTERP)
    fits = dict(big, num_stages=3)
    assert smem_bytes(fits, problem) <= H200.smem_per_block and SPACE.is_valid(fits, problem, H200)
    fp32 = dict(G.make_problem(4096, 4096, 4096, "float32"))
    assert not SPACE.is_valid(fits, fp32, H200)  # 4-byte elements double the footprint


def test_splitk_rules() -> None:
    problem = G.make_problem(16, 4096, 4096, "bfloat16")
    assert SPACE.is_valid(config("splitk", 16, 64, 128, split=8), problem, H200)
    assert "splitk_iff_split_k_above_1" in SPACE.violations(config("splitk", split=1), problem, H200)
    assert "splitk_iff_split_k_above_1" in SPACE.violations(config("grouped", split=2), problem, H200)
    short_k = G.make_problem(16, 4096, 100, "bfloat16")
    assert "splitk_needs_long_k" in SPACE.violations(config("splitk", 16, 64, 32, split=2), short_k, H200)
    huge = G.make_problem(65536, 65536, 65536, "bfloat16")
    assert "splitk_workspace_at_most_512MiB" in SPACE.violations(config("splitk", split=2), huge, H200)


def test_block_rules_follow_problem_sizes() -> None:
    problem = G.make_problem(7, 13, 5, "float32")
    assert SPACE.is_valid(config(), problem, INTERP)
    assert "block_m_within_m" in SPACE.violations(config(bm=32), problem, INTERP)
    assert "block_n_within_n" in SPACE.violations(config(bn=32), problem, INTERP)
    assert "block_k_within_k" in SPACE.violations(config(bk=32), problem, INTERP)
    assert "accumulator_fits_registers" in SPACE.violations(
        config(bm=256, bn=256, num_warps=8), G.make_problem(512, 512, 64, "float16"), INTERP
    )
    assert "eight_warps_need_big_tile" in SPACE.violations(
        config(bm=32, bn=32, num_warps=8), G.make_problem(512, 512, 64, "float16"), INTERP
    )


def test_every_rule_has_a_reason() -> None:
    assert all(rule.why for rule in SPACE.rules)
    assert {p.name for p in SPACE.params} == set(SPEC.space.names)
    assert set(VARIANTS) == {"grouped", "persistent", "splitk", "tma", "staged"}


def _sweep_problems():
    dims = (1, 3, 16, 17, 64, 100, 1000, 4096, 8191)
    for m, n, k in itertools.product(dims, (1, 17, 128, 4096), (1, 16, 65, 4096, 8192)):
        for dtype, (al, bl) in zip(("float32", "float16", "bfloat16", "bfloat16"), LAYOUTS):
            yield G.make_problem(m, n, k, dtype, a_layout=al, b_layout=bl, activation="gelu", has_bias=True)


def test_heuristic_always_valid() -> None:
    for device in (INTERP, H200, A10, MI300):
        for problem in _sweep_problems():
            assert_heuristic_valid(SPEC, problem, device)


def test_heuristic_splits_k_for_few_tiles_on_gpu() -> None:
    skinny = SPEC.heuristic(G.make_problem(16, 4096, 4096, "bfloat16"), H200)
    assert skinny["variant"] == "splitk" and skinny["SPLIT_K"] > 1
    assert SPEC.heuristic(G.make_problem(4096, 4096, 4096, "bfloat16"), H200)["variant"] == "grouped"


def test_heuristic_stages_unaligned_problems_on_hopper() -> None:
    odd = G.make_problem(2053, 2053, 2053, "bfloat16", activation="gelu", has_bias=True)
    assert SPEC.heuristic(odd, H200)["variant"] == "staged"
    assert SPEC.heuristic(odd, A10)["variant"] == "grouped"
    assert SPEC.heuristic(G.make_problem(16, 4096, 4093, "bfloat16"), H200)["variant"] == "splitk"  # skinny M


# --------------------------------------------------------------------------------------------- problem parsing


def test_problem_from_shape() -> None:
    p = SPEC.problem_from_shape((4097, 4096, 4096), "bfloat16")
    assert p["m"] == 4097 and (p["n"], p["k"]) == (4096, 4096)
    assert p["aligned16"] and (p["a_layout"], p["b_layout"], p["activation"]) == ("row", "row", "none")
    assert not SPEC.problem_from_shape((64, 4095, 4096), "float16")["aligned16"]
    with pytest.raises(InvalidShapeError, match="MxNxK"):
        SPEC.problem_from_shape((64, 64), "float16")
    with pytest.raises(InvalidShapeError, match=">= 1"):
        SPEC.problem_from_shape((64, 0, 64), "float16")
    with pytest.raises(InvalidInputError, match="dtype"):
        SPEC.problem_from_shape((64, 64, 64), "int8")


def test_default_problems() -> None:
    interp = SPEC.default_problems(INTERP)
    assert interp and all(p["m"] * p["n"] * p["k"] <= 64**3 for p in interp)
    gpu = SPEC.default_problems(H200)
    assert {(p["m"], p["n"], p["k"]) for p in gpu} >= {(4096, 4096, 4096), (16, 4096, 4096), (4097, 4096, 4096)}
    for p in interp + gpu:
        assert SPACE.valid_configs(p, INTERP if p in interp else H200)
        assert SPACE.is_valid(SPEC.heuristic(p, H200), p, H200)


# ------------------------------------------------------------------------------------------------------ ops


def test_matmul_strided_operands() -> None:
    base = torch.randn(40, 70)
    a_row = base[:33, :65]  # row-major with a padded leading dim
    a_col = torch.randn(65, 33).T
    a_strided = torch.randn(66, 130)[::2, ::2][:33, :65]  # neither dim unit-stride: copied to row-major
    b_row, b_col = torch.randn(65, 17) / 8, torch.randn(17, 65).T / 8
    bias, residual = torch.randn(17), torch.randn(33, 17)
    for a, b in itertools.product((a_row, a_col, a_strided), (b_row, b_col)):
        got = matmul(a, b, bias=bias, activation="silu", alpha=0.5, beta=-1.0, residual=residual)
        want = reference64((a, b, bias, residual, "silu", 0.5, -1.0))
        assert_matches(got, want, f"{a.stride()} {b.stride()}")


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: DTYPE_NAMES[d])
def test_linear_matches_torch(dtype: torch.dtype) -> None:
    x = torch.randn(2, 5, 40).to(dtype)
    weight = (torch.randn(24, 40) / 6).to(dtype)
    bias = torch.randn(24).to(dtype)
    residual = torch.randn(2, 5, 24).to(dtype)
    got = linear(x, weight, bias, "gelu_tanh", residual)
    want = F.gelu(F.linear(x.double(), weight.double(), bias.double()), approximate="tanh") + residual.double()
    assert_matches(got, want.to(dtype))
    assert_matches(linear(x, weight), F.linear(x.double(), weight.double()).to(dtype))
    assert_matches(linear(x[0, 0], weight, bias), F.linear(x[0, 0].double(), weight.double(), bias.double()).to(dtype))


def test_op_problem_keys() -> None:
    d = dispatcher("gemm")
    d.clear()
    x, w = torch.randn(20, 32, dtype=torch.float16), torch.randn(48, 32, dtype=torch.float16)
    linear(x, w, activation="relu")
    ((key,),) = (tuple(d.memo),)
    assert SPEC.problem_dict(key) == {
        "m": 20, "n": 48, "k": 32, "dtype": "float16", "a_layout": "row", "b_layout": "col",
        "activation": "relu", "has_bias": False, "has_residual": False, "aligned16": True,
    }  # fmt: skip
    d.clear()
    # 16 bytes, not 16 elements: K = 40 and N = 24 bf16 are 80- and 48-byte rows.
    linear(torch.randn(20, 40, dtype=torch.bfloat16), torch.randn(24, 40, dtype=torch.bfloat16))
    ((key,),) = (tuple(d.memo),)
    assert SPEC.problem_dict(key)["aligned16"] is True
    d.clear()
    linear(torch.randn(20, 36, dtype=torch.bfloat16), torch.randn(24, 36, dtype=torch.bfloat16))  # 72-byte rows
    ((key,),) = (tuple(d.memo),)
    assert SPEC.problem_dict(key)["aligned16"] is False
    d.clear()
    misaligned = torch.randn(20 * 32 + 1, dtype=torch.float16)[1:].view(20, 32)  # data pointer off by 2 bytes
    matmul(misaligned, w.T)
    ((key,),) = (tuple(d.memo),)
    assert SPEC.problem_dict(key)["aligned16"] is False


def test_empty_and_zero_k() -> None:
    w = torch.randn(4, 3)
    assert linear(torch.randn(0, 3), w).shape == (0, 4)
    assert linear(torch.randn(2, 0, 3), w).shape == (2, 0, 4)
    assert matmul(torch.randn(5, 3), torch.randn(3, 0)).shape == (5, 0)
    bias, residual = torch.randn(4), torch.randn(2, 4)
    got = linear(torch.randn(2, 0), torch.randn(4, 0), bias, "gelu", residual)
    torch.testing.assert_close(got, F.gelu(bias).expand(2, 4) + residual)
    got = matmul(torch.randn(2, 0), torch.randn(0, 4), bias=bias, alpha=3.0, beta=0.5, residual=residual)
    torch.testing.assert_close(got, bias.expand(2, 4) + 0.5 * residual)


@pytest.mark.usefixtures("swapped_under_compile")
def test_ops_under_torch_compile() -> None:
    x, w, b = torch.randn(3, 7, 40), torch.randn(24, 40) / 6, torch.randn(24)
    r = torch.randn(3, 7, 24)

    def model(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor, r: torch.Tensor) -> torch.Tensor:
        h = linear(x, w, b, activation="silu", residual=r)
        return matmul(h[0], w, alpha=2.0) * 2  # [7, 24] @ [24, 40]

    compiled = torch.compile(model, fullgraph=True, backend="eager")
    want = 2 * (2 * (F.silu(F.linear(x[0], w, b)) + r[0]) @ w)
    torch.testing.assert_close(compiled(x, w, b, r), want, atol=1e-2, rtol=1e-2)


def test_bad_inputs() -> None:
    a, b = torch.randn(4, 8), torch.randn(8, 5)
    cases = [
        (lambda: matmul(a.half(), b), "no mixed dtypes"),
        (lambda: matmul(a, b, bias=torch.randn(5).half()), "bias dtype"),
        (lambda: linear(a, torch.randn(5, 8).bfloat16()), "weight dtype"),
        (lambda: matmul(a.int(), b.int()), "dtype must be one of"),
        (lambda: matmul(a, torch.randn(7, 5)), "matching K"),
        (lambda: matmul(a[0], b), "2-D"),
        (lambda: linear(a, torch.randn(5, 7)), "in_features"),
        (lambda: matmul(a, b, bias=torch.randn(4)), r"bias must have shape \[5\]"),
        (lambda: matmul(a, b, residual=torch.randn(5, 4)), "residual must have"),
        (lambda: linear(a, torch.randn(5, 8), residual=torch.randn(4, 4)), "residual must have"),
        (lambda: matmul(a, b, activation="tanh"), "activation must be"),
        (lambda: matmul(a, b, alpha="2"), "alpha must be"),
        (lambda: matmul(a.numpy(), b), "must be a tensor"),
        (lambda: linear(a, None), "weight must be a tensor"),
    ]
    for fn, match in cases:
        with pytest.raises(InvalidInputError, match=match):
            fn()
