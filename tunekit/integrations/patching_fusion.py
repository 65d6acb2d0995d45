"""Fusing an activation module into the GEMM epilogue of the projection it follows, inside their common parent.

For each parent with swapped projections and activation children (patching_probes.activation_of), each pairing is
tried: the activation set on the projection, the activation module replaced by Identity, and the parent's output
on a probe compared with its output before (within `probing`: eval mode, constant parameters random). A pairing
that changes the output is undone. A projection that more than one parent holds is never fused: the other parent
would get the activation too.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import torch

from tunekit import nn as tk_nn
from tunekit.integrations.patching_probes import activation_of, call, can_probe, close, probe_input, probing

FUSED = "_tunekit_fused_from"  # on a fused projection: (parent, attribute name, the activation module)
_ACTIVATION = "_tunekit_activation"  # on a fused projection: the activation its forward applies


def _weight(module: torch.nn.Module) -> torch.Tensor:
    weight = tk_nn.param(module, "weight")
    assert weight is not None  # only projections reach here
    return weight


def _in_features(module: torch.nn.Module) -> int:
    weight = _weight(module)
    return int(weight.shape[1] if isinstance(module, torch.nn.Linear) else weight.shape[0])


def _parent_output(parent: torch.nn.Module, x: torch.Tensor) -> list[torch.Tensor] | None:
    """The parent's output on x as [1, rows, features] (a layer's usual shape), else on x as [rows, features]."""
    return call(parent, x[None]) or call(parent, x)


def _all_close(got: list[torch.Tensor] | None, expected: list[torch.Tensor]) -> bool:
    return got is not None and len(got) == len(expected) and all(close(a, b) for a, b in zip(got, expected))


def fuse_in(
    parent: torch.nn.Module,
    path: str,
    is_projection: Callable[[torch.nn.Module], bool],
    shared: set[int],
) -> list[tuple[str, str]]:
    """Fuse each activation child of `parent` into the projection child whose output it is applied to; returns
    (projection path, activation) for each fusion. `shared`: ids of modules held by more than one parent."""
    projections = [(n, m) for n, m in parent.named_children() if is_projection(m) and id(m) not in shared]
    if not projections:
        return []
    like = _weight(projections[0][1])
    if not can_probe(like):
        return []
    activations = [(n, m, a) for n, m in parent.named_children() if (a := activation_of(m, like)) is not None]
    if not activations:
        return []
    fused: list[tuple[str, str]] = []
    with probing(parent):
        for in_dim in dict.fromkeys(_in_features(m) for _, m in projections):
            x = probe_input(in_dim, like)
            expected = _parent_output(parent, x)
            if expected is None:
                continue
            run = partial(_parent_output, parent, x)
            for act in activations:
                if getattr(parent, act[0]) is not act[1]:
                    continue  # fused already, on another probe width
                proj_name = next((n for n, proj in projections if _try_fusion(parent, act, proj, run, expected)), None)
                if proj_name is not None:
                    fused.append((f"{path}.{proj_name}".lstrip("."), act[2]))
    return fused


def _try_fusion(
    parent: torch.nn.Module,
    act: tuple[str, torch.nn.Module, str],
    proj: torch.nn.Module,
    run: Callable[[], list[torch.Tensor] | None],
    expected: list[torch.Tensor],
) -> bool:
    """Fuse the activation into `proj` if the parent's output stays `expected`; else leave both as they were."""
    act_name, act_module, activation = act
    if proj.__dict__.get(_ACTIVATION) is not None or not _feeds(proj, act_module, run):
        return False
    proj.__dict__[_ACTIVATION] = activation
    setattr(parent, act_name, torch.nn.Identity())
    if _all_close(run(), expected):
        proj.__dict__[FUSED] = (parent, act_name, act_module)
        return True
    proj.__dict__.pop(_ACTIVATION)
    setattr(parent, act_name, act_module)
    return False


def _feeds(proj: torch.nn.Module, act_module: torch.nn.Module, run: Callable[[], object]) -> bool:
    """Whether every call of the activation module, on the probe, takes the projection's output itself: only then
    is the activation the projection's epilogue. A comparison of the parent's output alone can miss an activation
    applied elsewhere (Mamba's mixer applies its SiLU to a convolution and a gate, and in bfloat16 fusing it into
    `dt_proj` changed the probe's output by less than the tolerance, and a gradient by 24%)."""
    outputs: list[torch.Tensor] = []
    inputs: list[object] = []
    hooks = [
        proj.register_forward_hook(lambda _m, _args, out: outputs.append(out)),
        act_module.register_forward_pre_hook(lambda _m, args: inputs.append(args[0] if len(args) == 1 else None)),
    ]
    try:
        run()
    finally:
        for hook in hooks:
            hook.remove()
    return bool(inputs) and len(outputs) == 1 and all(x is outputs[0] for x in inputs)


def unfuse(module: torch.nn.Module) -> None:
    """Put back the activation module fused into `module`, if any."""
    fused = module.__dict__.pop(FUSED, None)
    if fused is None:
        return  # tunekit.nn.Linear keeps its own activation under the same name
    parent, name, activation = fused
    setattr(parent, name, activation)
    module.__dict__.pop(_ACTIVATION, None)
