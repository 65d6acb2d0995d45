"""Inductor's GEMM choices from tunekit's store (opt-in).

Under max-autotune, Inductor benchmarks about twenty Triton tile configs of its own matmul template per GEMM, at
compile time, against cuBLAS. Where tunekit's store (the user's cache or a shipped pack) holds a tuned entry for
the same problem, `tuned_gemm_choices()` narrows that search to two candidates: Inductor's matmul template at
tunekit's tile (BLOCK_M/N/K, GROUP_M, warps, stages) and torch's extern GEMM. Inductor still times both in the
graph, with its epilogue fusion, so the pick is never a config Inductor measured slower. Where the store says
torch wins (measured, or the entry demoted by a model step), only torch's extern GEMM is offered; a GEMM with no
entry gets Inductor's own search (`untuned="inductor"`) or torch's GEMM alone (`untuned="aten"`, the default
mode's choice, for the default mode's compile time).

The narrowing is a wrapper around `InductorChoices._finalize_template_configs`, installed once and active only
in compiles whose options name a tunekit choices class (`route_inductor_choices` says why a subclass alone is
not enough: a training step's backward GEMMs).

Not a kernel of tunekit's: Inductor's own template runs, with a tile tuned for tunekit's kernel, a proxy for
what suits the problem. Split-K configs have no counterpart in that template: where one won, the fastest tile
tunekit measured without split-K stands in ("proxy"), next to torch's GEMM, or inside Inductor's own search.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, ClassVar

import torch

from tunekit.core.device import DeviceFingerprint, fingerprint
from tunekit.core.registry import get_spec
from tunekit.core.space import Config, Problem
from tunekit.core.spec import DTYPE_NAMES
from tunekit.runtime.dispatch import TORCH, resolve
from tunekit.store.store import Store

__all__ = ["gemm_choices_class", "gemm_problem_of", "inductor_tile_of", "tuned_gemm_choices", "tunekit_templates"]

MM_TEMPLATE = "triton::mm"  # the uid of Inductor's Triton matmul template
# dispatch's layers that resolve a problem from an entry of its own (served as tuned, or as torch by that entry)
OWN_ENTRY_LAYERS = ("cache", "shipped", "torch-measured", "torch-launch-bound", "demoted")


def gemm_problem_of(
    op_name: str, shapes: Sequence[Sequence[int]], strides: Sequence[Sequence[int]], dtypes: Sequence[torch.dtype]
) -> Problem | None:
    """tunekit's GEMM problem for an Inductor `mm` (mat1, mat2) or `addmm` (bias, mat1, mat2) with these static
    sizes, or None where tunekit has no such problem (another op, dtype, a 2-D addend, strided operands)."""
    if op_name == "mm" and len(shapes) == 2:
        bias = None
    elif op_name == "addmm" and len(shapes) == 3:
        bias = (shapes[0], strides[0])
    else:
        return None
    (a_shape, b_shape), (a_stride, b_stride) = shapes[-2:], strides[-2:]
    if len(a_shape) != 2 or len(b_shape) != 2 or len(set(dtypes)) != 1 or dtypes[0] not in DTYPE_NAMES:
        return None
    m, k = (int(d) for d in a_shape)
    n = int(b_shape[1])
    if bias is not None:  # tunekit's bias is a vector over N: Inductor passes it 1-D or expanded with stride 0
        b_sizes, b_strides = bias
        is_vector = list(b_sizes) == [n] or (len(b_sizes) == 2 and b_sizes[-1] == n and b_strides[0] == 0)
        if not is_vector:
            return None
    from tunekit.kernels.gemm.host import layout_of  # (a kernel package: imported where used)
    from tunekit.kernels.gemm.problem import make_problem

    # the op's own layout rule, on meta tensors (sizes and strides only)
    a_layout, b_layout = (
        layout_of(torch.empty_strided(s, t, device="meta")) for s, t in ((a_shape, a_stride), (b_shape, b_stride))
    )
    if "strided" in (a_layout, b_layout):
        return None

    return make_problem(
        m, n, k, DTYPE_NAMES[dtypes[0]], a_layout=a_layout, b_layout=b_layout, has_bias=bias is not None
    )


def inductor_tile_of(config: Config, k: int) -> dict[str, Any] | None:
    """Inductor matmul-template kwargs for a tunekit GEMM config, or None (split-K: no such template option).
    EVEN_K follows the tile: the template skips K masking only when BLOCK_K divides K."""
    if int(config.get("SPLIT_K", 1)) != 1:
        return None
    block_k = int(config["BLOCK_K"])
    return {
        "BLOCK_M": int(config["BLOCK_M"]),
        "BLOCK_N": int(config["BLOCK_N"]),
        "BLOCK_K": block_k,
        "GROUP_M": int(config["GROUP_M"]),
        "num_warps": int(config["num_warps"]),
        "num_stages": int(config["num_stages"]),
        "EVEN_K": k % block_k == 0,
    }


def tunekit_templates(
    problem: Problem, store: Store | None, device: DeviceFingerprint | None = None
) -> tuple[str, dict[str, Any] | None]:
    """("tuned", tile) where the store's entry serves tunekit's kernel at a tile Inductor's template can run;
    ("proxy", tile) where it serves a split-K config (no such template option; small-M, large-K GEMMs often are), the
    tile of the fastest trial measured without split-K; ("torch", None) where it serves torch's op (measured
    faster, or demoted); ("untuned", None) where the problem has no entry of its own (or no such trial)."""
    spec = get_spec("gemm")
    found = resolve(spec, problem, device or fingerprint(), store)
    if found.entry is None or found.layer not in OWN_ENTRY_LAYERS:
        return "untuned", None
    if found.config is TORCH:
        return "torch", None
    k = int(problem["k"])
    tile = inductor_tile_of(found.config, k)
    if tile is not None:
        return "tuned", tile
    unsplit = [t for t in found.entry.trials if t.status == "ok" and t.time_ms and inductor_tile_of(t.config, k)]
    if not unsplit:
        return "untuned", None
    return "proxy", inductor_tile_of(min(unsplit, key=lambda t: float(t.time_ms or 0.0)).config, k)


def narrowed_templates(
    choices_class: Any,
    handler: Any,
    template_choices: Any,
    kernel_inputs: Any,
    templates: Sequence[Any],
    op_name: str,
    kwarg_overrides: Any = None,
) -> Any:
    """Inductor's template configs for one GEMM, narrowed by `choices_class`'s settings and store (the module
    docstring says how); Inductor's own where tunekit has no problem for the GEMM."""

    def inductor_own() -> Any:
        return inductor_finalize(handler, template_choices, kernel_inputs, templates, op_name, kwarg_overrides)

    try:
        problem = gemm_problem_of(
            op_name, kernel_inputs.shapes_hinted(), kernel_inputs.strides_hinted(), kernel_inputs.dtypes()
        )
    except Exception:  # (inputs without static hints, and the like): Inductor decides
        problem = None
    if problem is None or kernel_inputs.device_type != "cuda":
        return inductor_own()
    decision, tile = tunekit_templates(problem, choices_class.store())
    choices_class.decisions.append((op_name, decision, problem))
    search = choices_class.untuned == "inductor"
    if decision == "untuned" and search:
        return inductor_own()
    from torch._inductor.kernel_template_choice import KernelTemplateChoice
    from torch._inductor.template_heuristics.params import DictKernelTemplateParams

    torchs, tunekits = [], []
    for template in templates:
        if template.uid.startswith("aten::"):  # torch's GEMM: offered in every case
            torchs.extend(handler.get_ktc(kernel_inputs, template, op_name))
        elif template.uid == MM_TEMPLATE and tile is not None:
            base = next(iter(handler.get_ktc(kernel_inputs, template, op_name)), None)
            if base is None:
                continue
            params = DictKernelTemplateParams({**base.params.to_kwargs(), **tile})
            tunekits.append(
                KernelTemplateChoice(
                    template=base.template,
                    params=params,
                    extra_kwargs=base.extra_kwargs,
                    layout=base.layout,
                    inputs=base.inputs,
                )
            )
    if decision == "proxy" and search:  # a stand-in for a split-K winner: one more candidate of Inductor's search
        return [*inductor_own(), *tunekits]
    return [*torchs, *tunekits] or inductor_own()


def _not_routed(handler: Any, *args: Any) -> Any:
    raise RuntimeError("route_inductor_choices() was not called")


inductor_finalize: Callable[..., Any] = _not_routed  # Inductor's own method, once `route_inductor_choices` ran
_routed: list[bool] = []  # whether it ran (in this process)


def route_inductor_choices() -> None:
    """Make every InductorChoices handler narrow GEMMs while a tunekit choices class is the compile's
    `inductor_choices_class` (once per process; a no-op for every other compile).

    Inductor keeps one choices handler per thread, made on the thread's first lowering. A training step's
    backward graph compiles on autograd's device thread, whose handler may predate the compile (an earlier
    compile made it), so a subclass alone would leave backward GEMMs to Inductor's full search; the compile's
    options, though, are in force there (Inductor wraps its inner compile in them), so the class is read from
    them."""
    global inductor_finalize
    from torch._inductor import config
    from torch._inductor.choices import InductorChoices

    # Once: another wrapper (tunekit.runtime.compiled_gemm's) may since sit on top of this one, and taking it as
    # Inductor's own would make the two call each other.
    if _routed:
        return
    inductor_finalize = InductorChoices._finalize_template_configs

    def finalize(
        self: Any, template_choices: Any, kernel_inputs: Any, templates: Any, op_name: str, kwarg_overrides: Any = None
    ) -> Any:
        active = config.inductor_choices_class
        if getattr(active, "narrows_gemms", False):
            return narrowed_templates(
                active, self, template_choices, kernel_inputs, templates, op_name, kwarg_overrides
            )
        return inductor_finalize(self, template_choices, kernel_inputs, templates, op_name, kwarg_overrides)

    InductorChoices._finalize_template_configs = finalize  # type: ignore[method-assign]
    _routed.append(True)


def gemm_choices_class(untuned: str = "aten") -> type[Any]:
    """A new InductorChoices class whose compiles narrow GEMM templates by tunekit's store; its `compile_options`
    are the torch.compile options that go with it (templates offered, and the class in Inductor's cache key, so
    two models compiled with and without it never share compiled code)."""
    if untuned not in ("aten", "inductor"):
        raise ValueError(f"untuned must be 'aten' or 'inductor', got {untuned!r}")
    try:  # private Inductor API: tested with torch 2.13 on a CPU, and run with the GPUs' 2.11
        from torch._inductor.choices import InductorChoices
        from torch._inductor.kernel_template_choice import KernelTemplateChoice  # noqa: F401
        from torch._inductor.template_heuristics.params import DictKernelTemplateParams  # noqa: F401
    except ImportError as exc:
        raise RuntimeError(f"this torch's Inductor has no template-choice hook to feed: {exc}") from exc
    if not hasattr(InductorChoices, "_finalize_template_configs"):
        raise RuntimeError("this torch's Inductor has no InductorChoices._finalize_template_configs to override")
    route_inductor_choices()
    opened: list[Store] = []  # the store, opened on the first GEMM (Inductor also builds a handler for its cache key)

    class TunekitChoices(InductorChoices):
        """The compile option that turns the narrowing on (see `route_inductor_choices`)."""

        narrows_gemms: ClassVar[bool] = True
        untuned: ClassVar[str]  # what a GEMM without an entry of its own is offered
        # (op, "tuned" / "proxy" / "torch" / "untuned", its problem): what each GEMM was offered
        decisions: ClassVar[list[tuple[str, str, Problem]]] = []
        compile_options: ClassVar[dict[str, Any]] = {}

        @staticmethod
        def store() -> Store:
            if not opened:
                opened.append(Store())
            return opened[0]

        @staticmethod
        def close() -> None:
            while opened:
                opened.pop().close()

        def uuid(self) -> str:  # Inductor's cache key of a custom choices class
            return f"tunekit-gemm-choices-{untuned}"

    TunekitChoices.untuned = untuned
    TunekitChoices.compile_options = {"max_autotune_gemm": True, "inductor_choices_class": TunekitChoices}
    return TunekitChoices


@contextmanager
def tuned_gemm_choices(untuned: str = "aten") -> Iterator[type[Any]]:
    """Yields a choices class whose `compile_options` make a compile lower GEMMs with tunekit's tuned tiles:

        with tuned_gemm_choices() as choices:
            fast = torch.compile(model, options=choices.compile_options)
            fast(x)
        # choices.decisions: what each GEMM was offered

    Pass the options: Inductor's config is per thread (in torch 2.13), and the options follow the compile to the
    thread where a training step's backward compiles; the context itself covers only compiles on this thread.
    Leaving it closes the store the class opened."""
    from torch._inductor import config

    choices = gemm_choices_class(untuned)
    try:
        with config.patch(choices.compile_options):
            yield choices
    finally:
        choices.close()
