"""Rules the spaces of several kernel families declare alike (rows.py holds what only the row kernels' share): how
large a program's register tile may be, how it spreads over the program's threads, and what its pipeline stages
buffer in shared memory. A space passes what a tile (or chunk) of its configs is and says why in its own terms;
the check and the rule's name are these."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from tunekit.core.space import Config, Problem, Rule
from tunekit.kernels.common import element_bytes, threads

if TYPE_CHECKING:
    from tunekit.core.device import DeviceFingerprint

Elements = Callable[[Config], int]  # elements of a program's tile or chunk under a config


def tile_at_most_elements(most: int, tile: Elements, why: str) -> Rule:
    """A program's tile holds at most `most` elements (rule tile_at_most_{most}_elements)."""

    def tile_fits(config: Config, problem: Problem, device: DeviceFingerprint) -> bool:
        return tile(config) <= most

    return Rule(f"tile_at_most_{most}_elements", tile_fits, why=why)


def at_least_one_element_per_thread(tile: Elements, why: str) -> Rule:
    """Every thread holds an element of the tile; a one-warp program may idle lanes (a tiny tile needs one warp)."""

    def every_thread_busy(config: Config, problem: Problem, device: DeviceFingerprint) -> bool:
        return tile(config) >= threads(config) or config["num_warps"] == 1

    return Rule("at_least_one_element_per_thread", every_thread_busy, why=why)


def at_most_elements_per_thread(most: int, tile: Elements, why: str) -> Rule:
    """No thread holds more than `most` elements of the tile (rule at_most_{most}_elements_per_thread)."""

    def few_elements_per_thread(config: Config, problem: Problem, device: DeviceFingerprint) -> bool:
        return tile(config) <= most * threads(config)

    return Rule(f"at_most_{most}_elements_per_thread", few_elements_per_thread, why=why)


def stages_fit_shared_memory(chunk: Elements, why: str) -> Rule:
    """Each pipeline stage past the first buffers one chunk of the input in shared memory, within what one block may
    have (the interpreter has no shared memory limit)."""

    def stages_fit(config: Config, problem: Problem, device: DeviceFingerprint) -> bool:
        if config["num_stages"] == 1 or device.smem_per_block == 0:
            return True
        staged = (int(config["num_stages"]) - 1) * chunk(config) * element_bytes(str(problem["dtype"]))
        return staged <= device.smem_per_block

    return Rule("pipeline_stages_fit_shared_memory", stages_fit, why=why)
