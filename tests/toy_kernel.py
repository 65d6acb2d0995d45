"""A toy kernel spec for testing the generic machinery (tuner, cache, dispatch, CLI) quickly, without Triton.

Its launch is plain torch. Planted behaviour: variant "wrong" computes a wrong answer; BLOCK=64 with
variant "b" fails like a kernel that runs out of shared memory.

Fatal faults, for the isolation tests only (they would take a test process down with them): the environment
variable TOY_FAULTS maps "BLOCK/variant/num_warps" to a fault the launch of that config commits:
"hang" (never returns), "exit" (the process exits), "segfault" (SIGSEGV), "poison" (like an illegal memory
access: raises, and every later launch in this process raises too, as a corrupted CUDA context does),
"bug" (raises ValueError: not a known kernel failure).
"""

from __future__ import annotations

import json
import os
import signal
import time

import torch
from triton.runtime.errors import OutOfResources

from tunekit.core.device import DeviceFingerprint
from tunekit.core.errors import InvalidShapeError
from tunekit.core.space import Choice, Config, PowerOfTwo, Problem, Rule, SearchSpace
from tunekit.core.spec import DTYPES, KernelSpec, Tolerance, row_bucket

SPACE = SearchSpace(
    params=(PowerOfTwo("BLOCK", 1, 64), Choice("variant", ("a", "b", "wrong")), PowerOfTwo("num_warps", 1, 8)),
    rules=(Rule("block_fits_row", lambda c, p, d: int(c["BLOCK"]) <= int(p["cols"]), "a block wider than the row"),),
)


_POISONED: list[bool] = []
_ILLEGAL = "CUDA error: an illegal memory access was encountered"


def _commit_fault(config: Config) -> None:
    if _POISONED:
        raise RuntimeError(_ILLEGAL)
    faults = os.environ.get("TOY_FAULTS")
    if not faults:
        return
    fault = json.loads(faults).get(f"{config['BLOCK']}/{config['variant']}/{config['num_warps']}")
    if fault == "hang":
        time.sleep(3600)
    elif fault == "exit":
        os._exit(3)
    elif fault == "segfault":
        os.kill(os.getpid(), signal.SIGSEGV)
    elif fault == "bug":
        raise ValueError("planted bug")
    elif fault == "poison":
        _POISONED.append(True)
        raise RuntimeError(_ILLEGAL)


def launch(config: Config, inputs: tuple, outputs: tuple) -> None:
    _commit_fault(config)
    (x,), (y,) = inputs, outputs
    if config["BLOCK"] == 64 and config["variant"] == "b":
        raise OutOfResources(300000, 232448, "shared memory")
    y.copy_(x * 2 + (1 if config["variant"] == "wrong" else 0))


def make_inputs(problem: Problem, device: torch.device, seed: int) -> tuple:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(int(problem["rows"]), int(problem["cols"]), generator=g).to(DTYPES[str(problem["dtype"])])
    return (x.to(device),)


def problem_from_shape(shape: tuple[int, ...], dtype: str) -> Problem:
    if len(shape) != 2:
        raise InvalidShapeError(f"toy shapes are MxN, but got {shape}")
    return {"rows": row_bucket(shape[0]), "cols": shape[1], "dtype": dtype}


def heuristic(problem: Problem, device: DeviceFingerprint) -> Config:
    return {"BLOCK": 1, "variant": "a", "num_warps": 1}


SPEC = KernelSpec(
    name="toy",
    description="y = 2x (test kernel)",
    space=SPACE,
    problem_fields=("rows", "cols", "dtype"),
    launch=launch,
    alloc_outputs=lambda inputs: (torch.empty_like(inputs[0]),),
    reference=lambda inputs: (inputs[0] * 2,),
    make_inputs=make_inputs,
    problem_from_shape=problem_from_shape,
    default_problems=lambda device: [{"rows": 8, "cols": 64, "dtype": "float32"}],
    heuristic=heuristic,
    tolerances={"float32": Tolerance(1e-6, 1e-6), "float16": Tolerance(1e-3, 1e-3), "bfloat16": Tolerance(1e-2, 1e-2)},
    bytes_moved=lambda p: 8 * int(p["rows"]) * int(p["cols"]),
    flops=lambda p: int(p["rows"]) * int(p["cols"]),
    version=1,
    shape_help="MxN",
)


class PlantedTimer:
    """Fake timer: a planted time per config; counts how often each config is timed."""

    label = "fake"

    def __init__(self, best: Config | None = None) -> None:
        self.best = dict(best or {"BLOCK": 16, "variant": "b", "num_warps": 4})
        self.calls: dict[tuple, int] = {}

    def planted(self, config: Config) -> float:
        if config["variant"] == "wrong":
            return 0.001  # the fastest of all, and wrong: must never win
        distance = sum(config[k] != v for k, v in self.best.items())
        return 1.0 + distance + 0.01 * int(config["num_warps"])

    def __call__(self, fn, config: Config) -> float:
        fn()
        key = tuple(sorted(config.items()))
        self.calls[key] = self.calls.get(key, 0) + 1
        return self.planted(config)
