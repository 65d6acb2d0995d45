"""The tile/wave quantization model (tuning.perf_model, each kernel's declared geometry): hand-computed H200 cases."""

from __future__ import annotations

import math

import pytest
from fingerprints import H200, H200_LIMITS

from tunekit.core.device_limits import DeviceLimits
from tunekit.core.occupancy import Resources, occupancy
from tunekit.core.registry import get_spec
from tunekit.search_spaces.gemm.gemm import is_aligned16
from tunekit.tuning import perf_model
from tunekit.tuning.perf_model import geometry


def gemm_problem(m: int, n: int = 4096, k: int = 4096, dtype: str = "bfloat16") -> dict:
    """A GEMM problem with the exact M (the ops bucket M; the model takes whatever M the problem holds)."""
    return {
        "m": m,
        "n": n,
        "k": k,
        "dtype": dtype,
        "a_layout": "row",
        "b_layout": "row",
        "activation": "none",
        "has_bias": False,
        "has_residual": False,
        "aligned16": is_aligned16(m, n, k, dtype, "row"),  # 16-byte leading dims, as the ops set it
    }


def gemm(variant: str, bm: int, bn: int, bk: int, *, split: int = 1, warps: int = 4, stages: int = 3) -> dict:
    return {
        "variant": variant,
        "BLOCK_M": bm,
        "BLOCK_N": bn,
        "BLOCK_K": bk,
        "GROUP_M": 8,
        "SPLIT_K": split,
        "num_warps": warps,
        "num_stages": stages,
    }


def layernorm_problem(rows: int, cols: int) -> dict:
    return {"rows": rows, "cols": cols, "dtype": "bfloat16", "weight": True, "bias": True}


BIG_TILE = gemm("grouped", 128, 256, 64, warps=8, stages=4)  # 4*(128*64 + 64*256)*2 = 192 KiB: 1 block per SM


# ---------------------------------------------------------------------------------------------------- occupancy


def test_registers_bind_with_their_allocation_granularity():
    # 128 registers x 32 lanes = 4096 per warp; a sub-partition's 16384 hold 4 warps, 16 per SM: two 8-warp blocks.
    occ = occupancy(Resources(256, 128, 0), H200_LIMITS)
    assert (occ.blocks_per_sm, occ.limiter) == (2, "registers")
    # 129 rounds up to 136 (units of 256 per warp): 4352 per warp, 3 warps per sub-partition, 12 per SM: one block.
    occ = occupancy(Resources(256, 129, 0), H200_LIMITS)
    assert (occ.blocks_per_sm, occ.limiter) == (1, "registers")


def test_shared_memory_binds_counting_the_reserved_kib():
    # 115712 + 1024 reserved = 116736 = exactly half of the SM's 233472: two blocks.
    occ = occupancy(Resources(128, 32, 115712), H200_LIMITS)
    assert (occ.blocks_per_sm, occ.limiter) == (2, "shared_memory")
    # Half the SM itself would fit twice without the driver's 1 KiB per block; with it, once.
    occ = occupancy(Resources(128, 32, 116736), H200_LIMITS)
    assert (occ.blocks_per_sm, occ.limiter) == (1, "shared_memory")


def test_threads_and_block_slots_bind():
    occ = occupancy(Resources(512, 16, 0), H200_LIMITS)  # 2048 / 512 threads; registers would allow 8
    assert (occ.blocks_per_sm, occ.limiter) == (4, "threads")
    occ = occupancy(Resources(32, 16, 0), H200_LIMITS)  # threads would allow 64, shared memory 228
    assert (occ.blocks_per_sm, occ.limiter) == (32, "blocks")


def test_blocks_that_cannot_launch():
    occ = occupancy(Resources(128, 32, 232449), H200_LIMITS)  # one byte over the per-block opt-in maximum
    assert occ.blocks_per_sm == 0 and occ.limiter == "shared_memory" and "per block" in occ.why_not
    assert occupancy(Resources(128, 32, 232448), H200_LIMITS).blocks_per_sm == 1
    occ = occupancy(Resources(1024, 255, 0, "compiled"), H200_LIMITS)  # 8192 per warp x 32 warps > 65536
    assert (occ.blocks_per_sm, occ.limiter) == (0, "registers")


# ------------------------------------------------------------------------------------------------- quantization


def test_gemm_4097_with_128x256_tiles_runs_four_full_waves():
    q = perf_model.quantize("gemm", BIG_TILE, gemm_problem(4097), H200_LIMITS)
    assert q is not None
    assert [d.tiles for d in q.geometry.dims] == [33, 16]
    assert q.tiles == 528 and q.occupancy.blocks_per_sm == 1 and q.slots == 132
    assert q.waves == 4 and q.wave_efficiency == 1.0
    assert q.padded_waste == pytest.approx(1 - 4097 / 4224)  # about 3.0%
    assert q.grid == 528


def test_gemm_4096_with_128x256_tiles_leaves_the_last_wave_short():
    q = perf_model.quantize("gemm", BIG_TILE, gemm_problem(4096), H200_LIMITS)
    assert q is not None
    assert q.tiles == 512 and q.waves == 4
    assert q.wave_efficiency == pytest.approx(512 / 528)
    assert q.padded_waste == 0.0


def test_persistent_grid_is_capped_but_tiles_quantize_the_same():
    q = perf_model.quantize("gemm", dict(BIG_TILE, variant="persistent"), gemm_problem(4097), H200_LIMITS)
    assert q is not None
    assert q.grid == 132 and q.tiles == 528 and q.waves == 4 and q.wave_efficiency == 1.0


def test_splitk_multiplies_tiles():
    config = gemm("splitk", 16, 64, 128, split=4, stages=5)
    q = perf_model.quantize("gemm", config, gemm_problem(16), H200_LIMITS)
    assert q is not None
    assert q.tiles == 1 * 64 * 4
    k_dim = q.geometry.dims[-1]
    assert (k_dim.name, k_dim.tiles, k_dim.extent) == ("k", 4, 1024)  # 32 BLOCK_K steps split 4 ways
    assert q.geometry.extra_kernels == 1  # the reduce-and-epilogue kernel


def test_layernorm_row_tiles():
    problem = layernorm_problem(4096, 4097)
    single = {"variant": "single", "BLOCK_N": 8192, "ROWS": 4, "num_warps": 16, "num_stages": 1}
    q = perf_model.quantize("layernorm", single, problem, H200_LIMITS)
    assert q is not None
    assert q.tiles == 1024 and q.geometry.dims[1].extent == 8192
    assert q.padded_waste == pytest.approx(1 - 4097 / 8192)
    looped = {"variant": "looped", "BLOCK_N": 1024, "ROWS": 1, "num_warps": 4, "num_stages": 2}
    q = perf_model.quantize("layernorm", looped, problem, H200_LIMITS)
    assert q is not None
    assert q.tiles == 4096 and q.geometry.dims[1].extent == 5 * 1024  # one program per row, 5 chunks
    assert q.padded_waste == pytest.approx(1 - 4097 / 5120)


def test_compiled_resources_override_the_estimate():
    config = BIG_TILE
    estimated = perf_model.quantize("gemm", config, gemm_problem(4097), H200_LIMITS)
    compiled = perf_model.compiled_resources(config, n_regs=64, shared_bytes=98304)
    measured = perf_model.quantize("gemm", config, gemm_problem(4097), H200_LIMITS, resources=compiled)
    assert estimated is not None and measured is not None
    assert estimated.occupancy.blocks_per_sm == 1
    assert measured.resources.source == "compiled" and measured.occupancy.blocks_per_sm == 2


def test_kernels_without_geometry_have_no_model(toy):  # the toy kernel declares no model
    assert perf_model.quantize("toy", {}, {}, H200_LIMITS) is None
    assert perf_model.rank("toy", [{}], {}, H200_LIMITS) is None
    assert perf_model.prune("toy", [{}], {}, H200_LIMITS) is None
    assert perf_model.signature("toy", {}, get_spec("gemm").space, H200_LIMITS) is None
    assert geometry("toy", {}, {}) is None


# ------------------------------------------------------------------------------------------- ranking and pruning


def _best_first(kernel: str, configs: list[dict], problem: dict) -> list[dict]:
    ranked = perf_model.rank(kernel, configs, problem, H200_LIMITS)
    assert ranked is not None
    return [q.config for q in ranked]


def test_large_gemm_ranks_big_tiles_ahead_of_small_ones():
    big = [BIG_TILE, gemm("grouped", 256, 128, 64, warps=8, stages=4)]
    small = [gemm("grouped", 16, 16, 64), gemm("grouped", 32, 32, 64)]
    order = _best_first("gemm", small + big, gemm_problem(4097))
    assert {order.index(c) for c in big} == {0, 1}


def test_skinny_gemm_ranks_splitk_or_block_m_16_ahead_of_block_m_256():
    good = [gemm("splitk", 16, 64, 128, split=4, stages=5), gemm("grouped", 16, 64, 128, stages=5)]
    wide = [gemm("grouped", 256, 128, 64, warps=8, stages=4), gemm("grouped", 256, 64, 64, warps=8, stages=3)]
    order = _best_first("gemm", wide + good, gemm_problem(16))
    assert max(order.index(c) for c in good) < min(order.index(c) for c in wide)


def test_row_kernels_prefer_filling_the_device():
    problem = layernorm_problem(64, 4096)
    one_program = {"variant": "single", "BLOCK_N": 4096, "ROWS": 64, "num_warps": 32, "num_stages": 1}
    many = {"variant": "single", "BLOCK_N": 4096, "ROWS": 4, "num_warps": 8, "num_stages": 1}
    assert _best_first("layernorm", [one_program, many], problem) == [many, one_program]


def test_rank_is_deterministic_whatever_the_input_order():
    configs = get_spec("gemm").space.valid_configs(gemm_problem(4097), H200)
    forward = _best_first("gemm", configs, gemm_problem(4097))
    backward = _best_first("gemm", list(reversed(configs)), gemm_problem(4097))
    assert forward == backward


def test_prune_drops_configs_over_shared_memory_and_hopeless_ones():
    over = gemm("grouped", 256, 128, 128, warps=8, stages=5)  # 5*(256*128 + 128*128)*2 = 480 KiB
    tiny = gemm("grouped", 16, 16, 64)  # ~8x the big tile's modelled time on 4097x4096x4096
    pruning = perf_model.prune("gemm", [over, tiny, BIG_TILE], gemm_problem(4097), H200_LIMITS)
    assert pruning is not None
    assert pruning.kept == [BIG_TILE]
    reasons = dict((perf_model.reason_kind(r), c) for c, r in pruning.pruned)
    assert reasons == {"cannot launch (shared_memory)": over, "hopeless": tiny}


def test_prune_never_prunes_the_best_modelled_config():
    over = [gemm("grouped", 256, 128, 128, warps=8, stages=s) for s in (4, 5)]
    pruning = perf_model.prune("gemm", over, gemm_problem(4097), H200_LIMITS)
    assert pruning is not None and len(pruning.kept) == 1 and len(pruning.pruned) == 1
    configs = get_spec("gemm").space.valid_configs(gemm_problem(16), H200)
    ranked = perf_model.rank("gemm", configs, gemm_problem(16), H200_LIMITS)
    pruning = perf_model.prune("gemm", configs, gemm_problem(16), H200_LIMITS)
    assert ranked is not None and pruning is not None
    assert ranked[0].config in pruning.kept
    assert len(pruning.kept) + len(pruning.pruned) == len(configs)


def test_seeds_take_the_best_of_each_family_first():
    configs = get_spec("gemm").space.valid_configs(gemm_problem(4097), H200)
    seeds = perf_model.seed_configs("gemm", configs, gemm_problem(4097), H200_LIMITS, 4)
    assert seeds is not None and len(seeds) == 4
    families = {(c["variant"], c["BLOCK_M"], c["BLOCK_N"]) for c in seeds}
    assert len(families) == 4
    ranked = perf_model.rank("gemm", configs, gemm_problem(4097), H200_LIMITS)
    assert ranked is not None and seeds[0] == ranked[0].config


def test_predicted_time_is_finite_only_for_launchable_configs():
    q = perf_model.quantize("gemm", gemm("grouped", 256, 128, 128, warps=8, stages=5), gemm_problem(4097), H200_LIMITS)
    assert q is not None and not q.launchable and math.isinf(q.predicted_clk) and q.waves == 0
    q = perf_model.quantize("gemm", BIG_TILE, gemm_problem(4097), H200_LIMITS)
    assert q is not None and 0.0 < q.efficiency <= 1.0


# ---------------------------------------------------------------------------------------------------- signature


def _same_tiles_everywhere(kernel: str, a: dict, b: dict) -> bool:
    """Brute force: every config of the space has the same tiles per dimension and padded extents on a and b."""
    for config in get_spec(kernel).space.all_configs():
        ga, gb = geometry(kernel, config, a), geometry(kernel, config, b)
        assert ga is not None and gb is not None
        if ga.dims != gb.dims:
            return False
    return True


def test_gemm_signature_is_equal_only_where_every_tile_count_agrees():
    space = get_spec("gemm").space

    def sig(problem: dict) -> tuple:
        signed = perf_model.signature("gemm", problem, space, H200_LIMITS, device=H200)
        assert signed is not None
        return signed

    # 4001 and 4002 need the same tiles for every BLOCK_M (251, 126, 63, 32, 16 for 16..256) and round to 4096.
    assert sig(gemm_problem(4001)) == sig(gemm_problem(4002))
    assert _same_tiles_everywhere("gemm", gemm_problem(4001), gemm_problem(4002))
    # 4000 is 250 tiles of 16 rows where 4001 needs 251.
    assert sig(gemm_problem(4000)) != sig(gemm_problem(4001))
    assert not _same_tiles_everywhere("gemm", gemm_problem(4000), gemm_problem(4001))
    # N 4095 differs in tiles, alignment and the aligned16 flag; dtype is not a size and always counts.
    assert sig(gemm_problem(4096, n=4096)) != sig(gemm_problem(4096, n=4095))
    assert sig(gemm_problem(4096)) != sig(gemm_problem(4096, dtype="float16"))


def test_row_signature_follows_chunks_and_alignment():
    space = get_spec("layernorm").space

    def sig(cols: int) -> tuple:
        signed = perf_model.signature("layernorm", layernorm_problem(4096, cols), space, H200_LIMITS)
        assert signed is not None
        return signed

    # Odd 4003 and 4005: the same chunks for every BLOCK_N from 16 up, the same block width, no alignment.
    assert sig(4003) == sig(4005)
    assert _same_tiles_everywhere("layernorm", layernorm_problem(4096, 4003), layernorm_problem(4096, 4005))
    assert sig(4001) != sig(4002)  # 4002 is 2-element aligned: the kernel's DIV differs
    assert sig(4000) != sig(4001)  # 250 chunks of 16 against 251
    other = DeviceLimits(**dict(H200_LIMITS.to_json(), sm_count=108))
    assert perf_model.signature("layernorm", layernorm_problem(4096, 4003), space, other) != sig(4003)
