"""The benchmark suite's data: the issue's shapes are in it, and `tunekit bench` picks the right problems."""

from __future__ import annotations

import json

import pytest
from helpers import cli

from tunekit.core import backend
from tunekit.core.errors import TunekitError
from tunekit.core.registry import get_spec
from tunekit.evaluation import suite
from tunekit.evaluation.suite import EPILOGUES, families, family_for, work_list

pytestmark = pytest.mark.usefixtures("wide_terminal")


def shapes(family: str, scope: str = "full") -> set[tuple[int, int, str]]:
    return {(int(p["rows"]), int(p["cols"]), str(p["dtype"])) for p in families()[family].problems(scope)}


@pytest.mark.parametrize("family", ["layernorm", "rmsnorm", "layernorm_backward"])
def test_norm_suites_hold_the_issue_shapes(family):
    found = shapes(family)
    widths = {n for _, n, _ in found}
    assert {768, 1024, 2048, 4096, 12288, 16384, 25600} <= widths  # hidden sizes of common networks
    assert {4095, 4097, 8191, 8193} <= widths  # 2^k ± 1
    for dtype in ("float16", "bfloat16"):
        small = {m for m, n, d in found if d == dtype and n == 4096 and m <= 64}
        assert {1, 4, 16, 64} <= small  # decode-sized row counts
        assert any(m >= 1024 for m, n, d in found if d == dtype and n == 25600)
    # Row counts are powers of two: the problem is the tensor measured (no row bucketing in between).
    assert all(m & (m - 1) == 0 for m, _, _ in found)


def test_softmax_and_reduction_rows_are_at_least_1024():
    for family in ("softmax", "reduction"):
        found = shapes(family)
        assert found and all(m >= 1024 for m, _, _ in found)
        assert {d for _, _, d in found} >= {"bfloat16"}
    assert {p["op"] for p in families()["reduction"].full} == {"sum", "max"}


def test_gelu_suite_is_128mi_fp32_tanh_gelu():
    problems = families()["gelu"].full
    assert any(p["numel"] == 1 << 27 and p["dtype"] == "float32" for p in problems)
    assert all(p["activation"] == "gelu_tanh" and not p["has_bias"] and not p["has_residual"] for p in problems)
    assert family_for("pointwise").name == "gelu"


def test_gemm_suite_holds_llm_projections_squares_and_odd_sizes_with_every_epilogue():
    problems = families()["gemm"].full
    found = {(p["m"], p["n"], p["k"], suite.epilogue_of(p)) for p in problems}
    assert all(p["dtype"] == "bfloat16" for p in problems)
    for m in (1, 16, 128, 2048, 8192, 16384):
        for n, k in ((4096, 4096), (4096, 14336), (14336, 4096), (11008, 4096)):
            assert {(m, n, k, e) for e in EPILOGUES} <= found
    for size in (1024, 2048, 4096, 8192, 3000, 1000, 2053):
        assert (size, size, size, "bias_gelu_residual") in found
    assert (4097, 4096, 4096, "none") in found
    assert set(EPILOGUES) == {"none", "bias_relu", "bias_gelu", "bias_gelu_residual"}
    # LLM weights are [out, in]: x @ W.T makes B column-major.
    assert all(p["b_layout"] == "col" for p in problems if p["m"] == 16 and p["n"] == 14336)


def test_every_family_has_quick_and_tiny_problems_of_its_kernel():
    for family in families().values():
        spec = get_spec(family.kernel)
        assert family.quick and family.tiny
        assert all(set(p) == set(spec.problem_fields) for p in family.full + family.quick + family.tiny)
        assert all(spec.bytes_moved(p) < 1 << 20 for p in family.tiny)  # seconds in the interpreter


def test_work_list_picks_tiny_problems_in_the_interpreter_and_filters_dtype():
    memory = work_list(None, "memory", [], None, quick=False, interpreted=True)
    assert {f.name for f, _ in memory} == set(suite.SUITES["memory"])
    assert all(p in f.tiny for f, p in memory)
    gpu_quick = work_list("gemm", None, [], None, quick=True, interpreted=False)
    assert [p for _, p in gpu_quick] == list(families()["gemm"].quick)
    bf16 = work_list("layernorm", None, [], "bfloat16", quick=False, interpreted=False)
    assert bf16 and all(p["dtype"] == "bfloat16" for _, p in bf16)


def test_a_gemm_shape_is_measured_with_every_epilogue():
    work = work_list("gemm", None, [(64, 48, 32)], None, quick=False, interpreted=True)
    assert [suite.epilogue_of(p) for _, p in work] == list(EPILOGUES)
    assert all((p["m"], p["n"], p["k"], p["dtype"]) == (64, 48, 32, "float32") for _, p in work)


@pytest.mark.parametrize(
    "kernel, suite_name, shapes, message",
    [
        (None, None, [], "--kernel NAME or --suite NAME"),
        ("layernorm", "memory", [], "--kernel NAME or --suite NAME"),
        (None, "nope", [], "unknown suite 'nope'"),
        (None, "memory", [(8, 8)], "--shape needs --kernel"),
    ],
)
def test_work_list_refuses_ambiguous_requests(kernel, suite_name, shapes, message):
    with pytest.raises(TunekitError, match=message):
        work_list(kernel, suite_name, shapes, None, quick=False, interpreted=True)


def test_cublaslt_applies_to_bias_relu_and_bias_gelu_only():
    spec = get_spec("gemm")
    gemm = families()["gemm"]
    device = backend.torch_device()
    for epilogue, applies in (("none", False), ("bias_relu", True), ("bias_gelu", True), ("bias_gelu_residual", False)):
        problem = suite.gemm_problem(16, 16, 32, "float32", epilogue)
        inputs = gemm.adapt_inputs(spec.make_inputs(problem, device, 0))
        assert inputs[5:] == (1.0, 1.0)  # alpha = beta = 1: the plain user code
        built = suite.cublaslt_runner(inputs)
        assert callable(built) == applies, epilogue


def test_nine_op_chain_is_tanh_gelu():
    import torch

    x = torch.linspace(-6, 6, 101, dtype=torch.float64)
    torch.testing.assert_close(suite.nine_op_gelu_tanh(x), torch.nn.functional.gelu(x, approximate="tanh"))


def test_cli_bench_kernel_shape_json(tmp_path):
    out = tmp_path / "run.json"
    result = cli("bench", "--kernel", "layernorm", "--shape", "16x256", "--json", str(out))
    assert result.exit_code == 0, result.output
    assert "16x256 fp32" in result.output and "interpreter wall-clock" in result.output
    data = json.loads(out.read_text())
    assert data["format"] == "tunekit-bench" and len(data["rows"]) == 1
    statuses = {m["impl"]: m["status"] for m in data["rows"][0]["measurements"]}
    assert statuses == {"tunekit": "ok", "heuristic": "ok", "torch": "ok", "copy": "ok"}


@pytest.mark.parametrize(
    "args, message",
    [
        (["bench"], "--kernel NAME or --suite NAME"),
        (["bench", "--suite", "nope"], "unknown suite 'nope'"),
        (["bench", "--kernel", "nope"], "unknown kernel 'nope'"),
        (["plot", "missing.json"], "cannot read the bench results missing.json: no such file"),
    ],
)
def test_cli_bench_errors_are_one_line(args, message):
    result = cli(*args)
    assert result.exit_code == 1
    assert message in result.output and "Traceback" not in result.output


def test_help_of_bench_and_plot():
    for cmd in ("bench", "plot"):
        result = cli(cmd, "--help")
        assert result.exit_code == 0 and "Usage" in result.output


def test_norm_groups_split_widths_multiple_of_8_from_2k_plus_minus_1():
    assert all(suite.is_pow2_plus_minus_1(n) for n in suite.ODD_SIZES)
    assert not any(suite.is_pow2_plus_minus_1(n) for n in suite.HIDDEN_SIZES + suite.SMALL_ROW_WIDTHS + (1, 2, 11))
    for name in ("layernorm", "rmsnorm", "layernorm_backward"):
        groups = dict(families()[name].groups)
        full = families()[name].full
        assert {p["cols"] for p in full if groups[suite.WIDTH_8](p)} == set(suite.HIDDEN_SIZES)
        assert {p["cols"] for p in full if groups[suite.WIDTH_ODD](p)} == set(suite.ODD_SIZES)


def test_gemm_groups_are_the_targets_size_classes():
    groups = dict(families()["gemm"].groups)

    def classes(p):
        return {name for name, member in groups.items() if member(p)}

    for p in families()["gemm"].full:
        m, n, k = p["m"], p["n"], p["k"]
        if (m, n, k) in suite.ODD_GEMMS:
            assert classes(p) == {suite.GEMM_ODD}, (m, n, k)
        elif m <= 128:
            assert classes(p) == {suite.GEMM_SKINNY}, (m, n, k)
        elif m * n >= 2048**2:
            assert classes(p) == {suite.GEMM_LARGE}, (m, n, k)
        else:
            assert classes(p) == set(), (m, n, k)  # 1024³: aligned, not large
    assert any(classes(p) == {suite.GEMM_LARGE} for p in families()["gemm"].full)


def test_every_target_names_a_family_group_and_ratio_the_suite_measures():
    from tunekit.evaluation.names import COPY_RATIO

    baselines = {"torch", "torch.compile"}
    for target in suite.TARGETS:
        family = families()[target.family]
        assert target.group == suite.ALL or target.group in dict(family.groups), target
        names = baselines | {b.name for b in family.baselines}
        assert target.ratio == COPY_RATIO or target.ratio.removeprefix("vs ") in names, target
        assert target.ratio != COPY_RATIO or family.bound == "memory", target
        assert any(dict(family.groups).get(target.group, lambda p: True)(p) for p in family.full), target
