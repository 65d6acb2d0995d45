"""`tunekit explain`: what the quantization model sees for one problem, as plain text.

The device's limits and the model's rates, then one row per candidate family (the parameters that fix the grid,
e.g. variant x BLOCK_M x BLOCK_N for GEMM; the other parameters aggregated, each row showing its best-modelled
config): tiles, padded waste, blocks per SM and what limits them, waves, wave efficiency and the modelled time
relative to the best. Then what is pruned and why (the space's rules, the model's reasons) and the top-modelled
configs a search would be seeded with. Lines stay within `width` columns (120 unless told; the CLI passes its
terminal's): where the family table does not fit, each family is one record, wrapped between its fields.
"""

from __future__ import annotations

import textwrap
from collections import Counter
from typing import TYPE_CHECKING

from tunekit.core.device_limits import DeviceLimits
from tunekit.core.occupancy import RESERVED_SMEM_PER_BLOCK
from tunekit.core.space import Config, Problem, Value, config_id
from tunekit.tuning.perf_model import HOPELESS_RATIO, Quantization, prune, rank, reason_kind, seed_configs
from tunekit.tuning.roofline import Arch, arch_for

if TYPE_CHECKING:
    from tunekit.core.device import DeviceFingerprint
    from tunekit.core.spec import KernelSpec

WIDTH = 120
MAX_FAMILIES = 40
SEEDS = 8
_COLUMNS = (
    ("family", 26, "<"),
    ("valid", 5, ">"),
    ("kept", 5, ">"),
    ("tiles", 9, ">"),
    ("tile", 15, "<"),
    ("waste", 6, ">"),
    ("blk/SM", 6, ">"),
    ("limiter", 13, "<"),
    ("waves", 6, ">"),
    ("wave eff", 8, ">"),
    ("rel time", 8, ">"),
)


def _row(cells: tuple[str, ...]) -> str:
    return " ".join(f"{cell[:width]:{align}{width}}" for cell, (_, width, align) in zip(cells, _COLUMNS)).rstrip()


def _table_fits(width: int) -> bool:
    return sum(w for _, w, _ in _COLUMNS) + len(_COLUMNS) - 1 <= width


def _record(cells: tuple[str, ...], width: int) -> list[str]:
    """A family row as one record, `label: name=value ...`, wrapped between the pairs."""
    label, *rest = cells
    fields = " ".join(f"{name.replace(' ', '_')}={cell}" for (name, _, _), cell in zip(_COLUMNS[1:], rest))
    return _wrap(f"{label}: {fields}", "", width)


def _wrap(text: str, indent: str = "  ", width: int = WIDTH) -> list[str]:
    lines = textwrap.wrap(
        text, width, initial_indent=indent, subsequent_indent=indent + "    ", break_long_words=False,
        break_on_hyphens=False,
    )  # fmt: skip
    return lines or [indent]


def _kib(n: int) -> str:
    return f"{n / 1024:.1f} KiB"


def _config_text(config: Config) -> str:
    return " ".join(f"{k}={v}" for k, v in config.items())


def _family_label(config: Config, params: tuple[str, ...]) -> str:
    values = [str(config[p]) for p in params if p in config]
    if params and params[0] == "variant" and values:
        return f"{values[0]} {'x'.join(values[1:])}".strip()
    return "x".join(values)


def _limiter(q: Quantization) -> str:
    """What bounds the resident programs per SM: a resource, or the launch itself (a persistent grid)."""
    return "grid" if q.programs_per_sm < q.occupancy.blocks_per_sm else q.occupancy.limiter


def _family_row(label: str, valid: int, kept: int, q: Quantization, best_clk: float) -> tuple[str, ...]:
    if not q.launchable:
        return (label, str(valid), str(kept), str(q.tiles), q.tile_shape, f"{q.padded_waste:.1%}", "0",
                q.occupancy.limiter, "-", "-", "no launch")  # fmt: skip
    return (
        label,
        str(valid),
        str(kept),
        str(q.tiles),
        q.tile_shape,
        f"{q.padded_waste:.1%}",
        str(q.programs_per_sm),
        _limiter(q),
        str(q.waves),
        f"{q.wave_efficiency:.3f}",
        f"{q.predicted_clk / best_clk:.2f}",
    )


def _header(
    spec: KernelSpec, problem: Problem, device: DeviceFingerprint, limits: DeviceLimits, width: int
) -> list[str]:
    arch = arch_for(device.compute_capability)
    lines = _wrap(f"{spec.name}: {spec.describe_problem(problem).replace(',', ', ')}", "", width)
    lines += _wrap(
        f"Device: {device.name} (compute capability {device.compute_capability}): {limits.sm_count} SMs, "
        f"warp {limits.warp_size}, {limits.max_threads_per_sm} threads/SM, {limits.max_blocks_per_sm} blocks/SM, "
        f"{limits.regs_per_sm} registers/SM, shared memory {_kib(limits.smem_per_sm)}/SM and "
        f"{_kib(limits.smem_per_block)}/block (+{RESERVED_SMEM_PER_BLOCK // 1024} KiB the driver reserves per block)",
        "",
        width,
    )
    lines += _wrap(
        f"Model rates ({arch.name}, per SM per clock): {arch.tensor_flops_per_clk:g} tensor flops, "
        f"{arch.tf32_flops_per_clk:g} tf32 flops, {arch.alu_ops_per_clk:g} fp32 ops, {arch.dram_bytes_per_clk:g} B "
        f"DRAM, {arch.l2_bytes_per_clk:g} B L2; {arch.memory_latency_clk:g} clk memory latency",
        "",
        width,
    )
    return lines


def explain(
    spec: KernelSpec, problem: Problem, device: DeviceFingerprint, limits: DeviceLimits, width: int = WIDTH
) -> str:
    """A readable report of how the problem quantizes on the device for every family of the kernel's space."""
    space = spec.space
    lines = _header(spec, problem, device, limits, width)
    rule_breaks: Counter[str] = Counter()
    valid: list[dict[str, Value]] = []
    for config in space.all_configs():
        broken = space.violations(config, problem, device)
        rule_breaks.update(broken)
        if not broken:
            valid.append(config)
    model = spec.model
    arch = arch_for(device.compute_capability)
    ranked = rank(spec.name, valid, problem, limits, arch=arch)
    pruning = prune(spec.name, valid, problem, limits, arch=arch)
    kept_count = len(valid) if pruning is None else len(pruning.kept)
    lines += _wrap(
        f"Space: {space.size} configs; {len(valid)} allowed by the space's rules; {kept_count} kept by the model",
        "",
        width,
    )
    lines.append("")
    if model is None or ranked is None or pruning is None:
        lines += _wrap(f"No tile model for {spec.name}: the tuner searches it without pruning or seeding.", "", width)
        lines += _pruned_by_rules(rule_breaks, width)
        return "\n".join(lines) + "\n"

    kept_ids = {config_id(c) for c in pruning.kept}
    families: dict[str, list[Quantization]] = {}
    for q in ranked:  # best first, so each family's first entry is its best-modelled config
        families.setdefault(_family_label(q.config, model.family), []).append(q)
    best_clk = min((q.predicted_clk for q in ranked if q.launchable), default=1.0)
    lines += _wrap(
        f"Candidate families ({' x '.join(model.family)}): each row is the family's best-modelled config;", "", width
    )
    lines += _wrap(
        "tiles = programs a non-persistent launch has; blk/SM = programs resident per SM (limiter: what bounds "
        "them; grid: the launch itself); rel time = modelled time / the best modelled time",
        "",
        width,
    )
    table = _table_fits(width)
    if table:
        lines.append(_row(tuple(name for name, _, _ in _COLUMNS)))
    for label, members in list(families.items())[:MAX_FAMILIES]:
        kept = sum(config_id(q.config) in kept_ids for q in members)
        cells = _family_row(label, len(members), kept, members[0], best_clk)
        lines += [_row(cells)] if table else _record(cells, width)
    if len(families) > MAX_FAMILIES:
        lines.append(f"... and {len(families) - MAX_FAMILIES} more families")
    if any(q.geometry.persistent for q in ranked):
        lines += _wrap(
            "Persistent variants launch min(tiles, slots) programs that loop over the tiles; their waves of tiles "
            "quantize the same way (a program runs ceil(tiles / programs) of them).",
            "",
            width,
        )
    lines.append("")
    lines += _pruned_by_rules(rule_breaks, width)
    lines += _wrap(
        f"Pruned by the model (of the {len(valid)} the rules allow; hopeless: > {HOPELESS_RATIO:g}x the best):",
        "",
        width,
    )
    by_kind = Counter(reason_kind(reason) for _, reason in pruning.pruned)
    if not by_kind:
        lines.append("  nothing")
    for kind, count in sorted(by_kind.items(), key=lambda kv: (-kv[1], kv[0])):
        lines += _count_line(kind, count, width)
    lines.append("")
    lines += _seed_lines(spec, valid, problem, limits, ranked, best_clk, width, arch)
    return "\n".join(lines) + "\n"


def _seed_lines(
    spec: KernelSpec,
    valid: list[dict[str, Value]],
    problem: Problem,
    limits: DeviceLimits,
    ranked: list[Quantization],
    best_clk: float,
    width: int,
    arch: Arch,
) -> list[str]:
    """The configs a search tries first, with their modelled time relative to the best."""
    by_id = {config_id(q.config): q for q in ranked}
    seeds = [by_id[config_id(c)] for c in seed_configs(spec.name, valid, problem, limits, SEEDS, arch=arch) or []]
    lines = _wrap(
        f"Seeds: the {len(seeds)} top-modelled configs a search tries first (the best of each family first)", "", width
    )
    for i, q in enumerate(seeds, 1):
        rel = q.predicted_clk / best_clk
        lines += _wrap(
            f"{i:>2}. rel {rel:.2f}  tiles {q.tiles}  waves {q.waves}  {_config_text(q.config)}", "  ", width
        )
    return lines


def _count_line(name: str, count: int, width: int) -> list[str]:
    line = f"  {name:<60} {count:>8}"
    return [line] if len(line) <= width else _wrap(f"{name} {count}", "  ", width)


def _pruned_by_rules(rule_breaks: Counter[str], width: int) -> list[str]:
    lines = _wrap("Pruned by the space's rules (configs breaking each rule; a config can break several):", "", width)
    if not rule_breaks:
        lines.append("  nothing")
    for name, count in sorted(rule_breaks.items(), key=lambda kv: (-kv[1], kv[0])):
        lines += _count_line(name, count, width)
    lines.append("")
    return lines
