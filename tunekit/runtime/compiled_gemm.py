"""A GEMM inside a torch.compile graph, served by the Inductor choice stored with its problem's entry.

Compile's default mode lowers every GEMM to torch's (cuBLAS through aten::mm); max-autotune times Inductor's
candidates (its Triton templates at a dozen tiles, a split-K decomposition, torch's GEMM) for every GEMM of every
compile, tens of seconds per model. Here that search runs once, when a model is tuned under compile
(`searching`): its fastest Triton template is the problem's candidate, kept only where the compiled step ran faster
with it than with torch's GEMM, by its GEMMs' time in a profile or by the whole step's where the host bounds it
(tunekit.evaluation.compiled_step). The kept choice is stored with the problem's entry (`compiled_*` fields:
tunekit.store.entry.with_compiled).

A later compile of a patched model finds the choice when it traces the linear (`linear`) and calls
`tunekit::inductor_mm(a, b, choice)` there; its lowering hands Inductor exactly that one candidate, so nothing is
benchmarked while compiling and Inductor fuses the bias and activation into it as into its own template. A choice
this Inductor does not offer for the problem (another torch, an imported file) lowers as torch's GEMM. Problems
without a choice trace as torch's code: the graph compile alone builds.

TUNEKIT_COMPILE_OPS (any value, `none` included) turns this off: the graph is then what that setting says.
"""

from __future__ import annotations

import json
import math
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch

from tunekit.core.device import fingerprint
from tunekit.core.errors import CacheError
from tunekit.core.registry import get_spec
from tunekit.core.space import Problem
from tunekit.core.spec import DTYPE_NAMES
from tunekit.runtime import compile_policy
from tunekit.store.database import shipped_entries
from tunekit.store.entry import COMPILED, compiled_choice
from tunekit.store.key import CacheKey
from tunekit.store.store import Store

__all__ = ["SEARCH", "Override", "choice_of", "identify", "linear", "searched"]

SEARCH = "search"  # a choice that lets Inductor search (max-autotune's candidates) and records its winner
ATEN_PREFIX = "aten::"  # Inductor's uid of torch's own GEMM (the default mode's choice)
TEMPLATE_PREFIX = "triton::"  # Inductor's uids of its Triton GEMM templates (one kernel: the GEMM's own launch)
_MAX_CHOICE_CHARS = 4096  # a stored choice longer than this is not one Inductor made

# Which choices a trace takes: 0 and below are the store's (one less each time the store's verdicts change), above
# are a tuning run's overrides. Traced code reads it, so Dynamo guards on it: each override compiles its own graph,
# going back to the store's reuses its graph, and a compiled model retraces once after its verdicts change (`renew`).
EPOCH = 0
_OVERRIDES: dict[int, Callable[[Problem], str]] = {}
_STORED: dict[str, str] = {}  # problem (canonical JSON) -> its stored choice ("" for none), read once per process


def _canonical(problem: Mapping[str, object]) -> str:
    return json.dumps(dict(problem), sort_keys=True, separators=(",", ":"))


def _scalar(value: object) -> bool:
    return value is None or isinstance(value, (bool, int, float, str))


def identify(uid: str, params: Mapping[str, object]) -> str:
    """A candidate of Inductor's as a choice: its template's uid and its scalar parameters, as canonical JSON."""
    kept = {name: value for name, value in params.items() if _scalar(value)}
    return json.dumps({"uid": uid, "params": kept}, sort_keys=True, separators=(",", ":"))


def searching(choice: str) -> bool:
    """Whether a choice asks for Inductor's search: SEARCH, or SEARCH and a run's nonce (`search_choice`)."""
    return choice == SEARCH or choice.startswith(SEARCH + ":")


def search_choice() -> str:
    """SEARCH with a nonce: a graph traced with it is new to Inductor's caches, so it is lowered (and searched)
    again rather than loaded with an earlier search's kernels."""
    return f"{SEARCH}:{time.time_ns()}"


def _searched_problem(choice: str) -> str | None:
    """The problem a searching choice names (the trace adds it: the lowering's inputs may not be laid out yet)."""
    _, _, problem = choice.partition("|")
    return problem or None


def _decoded(choice: str) -> tuple[str, dict[str, object]] | None:
    if searching(choice) or len(choice) > _MAX_CHOICE_CHARS:
        return None
    try:
        raw = json.loads(choice)
    except ValueError:
        return None
    if not isinstance(raw, dict) or not isinstance(raw.get("uid"), str) or not isinstance(raw.get("params"), dict):
        return None
    return raw["uid"], raw["params"]


def is_torchs(choice: str) -> bool:
    """Whether a choice is torch's own GEMM (what compile's default mode runs)."""
    decoded = _decoded(choice)
    return decoded is not None and decoded[0].startswith(ATEN_PREFIX)


def forget() -> None:
    """Read the store again on the next trace (dispatch's reset_all; a compiled graph keeps what it traced)."""
    _STORED.clear()


def renew() -> None:
    """The store's verdicts changed (a decision was stored): read it again, and have the graphs compiled with the
    store's choices traced again on their next call (once: the epoch they guard on moves)."""
    global EPOCH
    forget()
    if EPOCH <= 0:
        EPOCH -= 1


def _stored_choice(problem: Problem) -> str:
    name = _canonical(problem)
    found = _STORED.get(name)
    if found is not None:
        return found
    spec = get_spec("gemm")
    key = CacheKey.make(spec.name, spec.source_hash, fingerprint().key, problem)
    try:
        store: Store | None = Store()
    except CacheError:  # an unreadable cache: the shipped databases alone
        store = None
    try:
        entry = store.get(key) if store is not None else None
    finally:
        if store is not None:
            store.close()
    if entry is None or not any(k.startswith(COMPILED) for k in entry.provenance):  # no verdict of this machine's
        entry = shipped_entries().get(key, entry)
    found = _STORED[name] = (compiled_choice(entry) if entry is not None else None) or ""
    return found


def choice_of(problem: Problem) -> str:
    """What a compiled graph runs for a GEMM problem: a stored (or overridden) Inductor choice, or "" (torch's)."""
    if compile_policy.FORCED is not None:
        return ""
    override = _OVERRIDES.get(EPOCH) if EPOCH > 0 else None
    choice = override(problem) if override is not None else _stored_choice(problem)
    return "" if not choice or is_torchs(choice) else choice


@torch._dynamo.assume_constant_result
def _traced_choice(m: int, n: int, k: int, dtype: str, a_layout: str, b_layout: str, bias: bool, epoch: int) -> str:
    """choice_of for a traced GEMM: a constant to Dynamo (it reads the store), `epoch` the override it was traced
    under. Registers the lowering first where a choice is made (before Inductor lowers the graph)."""
    from tunekit.kernels.gemm.problem import make_problem  # (a kernel package: imported where used)

    problem = make_problem(m, n, k, dtype, a_layout=a_layout, b_layout=b_layout, has_bias=bias)
    choice = choice_of(problem)
    if choice:
        _register_lowering()
    if searching(choice):
        choice += "|" + without_bias(problem)
    return choice


def _static(*sizes: object) -> bool:
    return all(isinstance(s, int) for s in sizes)


def _layout_of(rows: int, cols: int, row_stride: int, col_stride: int) -> str | None:
    """A matrix's layout from its sizes and strides: "row" or "col"-major, else None (other strides)."""
    if col_stride == 1 and (rows <= 1 or row_stride == cols):
        return "row"
    if row_stride == 1 and (cols <= 1 or col_stride == rows):
        return "col"
    return None


def _layout(t: torch.Tensor) -> str | None:
    return _layout_of(*t.shape, *t.stride())


def _choice_for(a: tuple[int, ...], b: tuple[int, ...], dtype: torch.dtype, has_bias: bool) -> str:
    """The traced choice for a @ b, each given as (rows, cols, row stride, col stride), read from sizes alone so
    that nothing is added to the graph; "" where there is none (then the caller writes torch's code)."""
    if dtype not in DTYPE_NAMES or not _static(*a, *b):
        return ""
    (m, k), n = a[:2], b[1]
    a_layout, b_layout = _layout_of(*a), _layout_of(*b)
    if 0 in (m, n, k) or a_layout is None or b_layout is None:
        return ""
    return _traced_choice(m, n, k, DTYPE_NAMES[dtype], a_layout, b_layout, has_bias, EPOCH)


def mm(a: torch.Tensor, b: torch.Tensor, has_bias: bool = False) -> torch.Tensor | None:
    """a @ b (2-D) as a compiled graph's GEMM with a stored choice, or None where there is none (then the caller
    writes torch's code). Called while Dynamo or AOTAutograd traces."""
    if b.dtype != a.dtype:
        return None
    choice = _choice_for((*a.shape, *a.stride()), (*b.shape, *b.stride()), a.dtype, has_bias)
    return torch.ops.tunekit.inductor_mm(a, b, choice) if choice else None


def linear(input: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor | None:
    """F.linear(input, weight, bias) under torch.compile through a stored GEMM choice, or None (none stored).
    The problem is read off sizes and strides first: a linear without a choice adds nothing to the graph."""
    if input.dim() < 1 or weight.dim() != 2 or weight.dtype != input.dtype or not input.is_contiguous():
        return None
    if torch.is_autocast_enabled(input.device.type):  # F.linear casts under autocast; the op would not
        return None
    if bias is not None and bias.dtype != input.dtype:
        return None
    (n, k), shape = weight.shape, input.shape
    if not _static(*shape):
        return None
    m = math.prod(shape[:-1])
    # input as A [M, K] (contiguous: row-major), weight.T as B [K, N] (weight's strides swapped)
    choice = _choice_for((m, k, k, 1), (k, n, weight.stride(1), weight.stride(0)), input.dtype, bias is not None)
    if not choice:
        return None
    out = torch.ops.tunekit.inductor_mm(input.reshape(m, k), weight.t(), choice)
    if bias is not None:
        out = out + bias  # Inductor fuses it into the GEMM's epilogue
    return out.view(*shape[:-1], n)


# -- the op: a plain GEMM for torch, one Inductor choice for Inductor ------------------------------------------------


@torch.library.custom_op("tunekit::inductor_mm", mutates_args=())
def inductor_mm(a: torch.Tensor, b: torch.Tensor, choice: str) -> torch.Tensor:
    """a @ b. Inductor lowers it with `choice` (its own candidate, stored); everywhere else it is torch.mm."""
    return torch.mm(a, b)


@inductor_mm.register_fake
def _inductor_mm_fake(a: torch.Tensor, b: torch.Tensor, choice: str) -> torch.Tensor:
    return a.new_empty((a.shape[0], b.shape[1]))


def _setup(ctx: Any, inputs: tuple[Any, ...], output: torch.Tensor) -> None:
    a, b, _choice = inputs
    ctx.save_for_backward(a, b)


def _gemm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """A backward GEMM, traced with AOTAutograd's joint graph: its own stored choice, else torch's."""
    out = mm(a, b)
    return torch.mm(a, b) if out is None else out


def _backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, torch.Tensor | None, None]:
    """dA = dY B^T and dB = A^T dY, each in its operand's layout, as tunekit's eager GEMM backward computes them
    (the same problems, so the same entries): a column-major operand (linear's weight.T) gets the transpose of a
    row-major product."""
    a, b = ctx.saved_tensors
    need_a, need_b = ctx.needs_input_grad[:2]
    grad_a = grad_b = None
    if need_a:
        grad_a = _gemm(b, grad.t()).t() if _layout(a) == "col" else _gemm(grad, b.t())
    if need_b:
        grad_b = _gemm(grad.t(), a).t() if _layout(b) == "col" else _gemm(a.t(), grad)
    return grad_a, grad_b, None


inductor_mm.register_autograd(_backward, setup_context=_setup)


# -- the lowering: one candidate, or Inductor's search with its winner recorded ---------------------------------------


@dataclass(frozen=True)
class Searched:
    """Inductor's search for one GEMM problem: its winner (as a choice), and the winner's and torch's ms."""

    choice: str
    ms: float
    torch_ms: float | None


_SEARCHED: dict[str, Searched] = {}  # problem (canonical JSON) -> the search's result
_LOWERING = threading.local()  # .choice: the choice the thread is lowering (Inductor lowers on several threads)
_registered: list[bool] = []


def searched() -> dict[str, Searched]:
    """Every search's result in this process so far, by problem (canonical JSON); `clear_searched` empties it."""
    return dict(_SEARCHED)


def clear_searched() -> None:
    _SEARCHED.clear()


def _register_lowering() -> None:
    if _registered:
        return
    from torch._inductor.choices import InductorChoices
    from torch._inductor.lowering import register_lowering
    from torch._inductor.select_algorithm import add_feedback_saver

    inner = InductorChoices._finalize_template_configs

    def finalize(self: Any, template_choices: Any, kernel_inputs: Any, templates: Any, *rest: Any, **kw: Any) -> Any:
        offered = inner(self, template_choices, kernel_inputs, templates, *rest, **kw)
        choice = getattr(_LOWERING, "choice", None)
        return offered if choice is None or searching(choice) else _narrowed(list(offered), choice)

    InductorChoices._finalize_template_configs = finalize  # type: ignore[method-assign]
    add_feedback_saver(_save_winner)
    register_lowering(torch.ops.tunekit.inductor_mm.default, type_promotion_kind=None)(_lower)
    _registered.append(True)


def _candidate(ktc: Any) -> str:
    return identify(str(ktc.template.uid), ktc.params.to_kwargs())


def _narrowed(offered: list[Any], choice: str) -> list[Any]:
    """The one candidate `choice` names, else torch's GEMM (as the default mode lowers it)."""
    for ktc in offered:  # (not built here: Inductor fixes the output's layout before it builds a choice)
        if _candidate(ktc) == choice:
            return [ktc]
    return [ktc for ktc in offered if str(ktc.template.uid).startswith(ATEN_PREFIX)] or offered[:1]


def _template(caller: Any) -> Any:
    """The candidate behind one of Inductor's timed choices where it is a Triton template (its kernel is the GEMM's
    own launch), else None (torch's GEMM, a split-K decomposition)."""
    ktc = getattr(caller, "annotations", {}).get("ktc")
    return ktc if ktc is not None and str(ktc.template.uid).startswith(TEMPLATE_PREFIX) else None


def _save_winner(timings: Mapping[Any, float], *_: Any) -> None:
    """Inductor's feedback after a search, for the problem being lowered (if searching): its fastest Triton template,
    even where torch's GEMM timed faster alone. A step bound by the host gains from a template what its GPU time
    does not show (an Inductor template's launch costs the host less than torch's GEMM call: decode at 8 tokens ran
    1.25-1.29x faster with Inductor's Triton templates alone, at the same GPU time; H200, RESULTS.md), so the
    compiled step, not this timing, decides between the two."""
    problem = getattr(_LOWERING, "problem", None)
    if problem is None or not timings:
        return
    templates = [(ms, _template(c)) for c, ms in timings.items() if _template(c) is not None and math.isfinite(ms)]
    if not templates:
        return
    ms, ktc = min(templates, key=lambda pair: pair[0])
    torch_ms = [ms for c, ms in timings.items() if str(getattr(c, "name", "")).startswith("extern_")]
    _SEARCHED[problem] = Searched(_candidate(ktc), float(ms), min(torch_ms) if torch_ms else None)


@contextmanager
def _lowering(choice: str, problem: str | None) -> Iterator[None]:
    _LOWERING.choice, _LOWERING.problem = choice, problem
    try:
        yield
    finally:
        _LOWERING.choice = _LOWERING.problem = None


def _lower(a: Any, b: Any, choice: str) -> Any:
    from torch._inductor import config
    from torch._inductor.kernel.mm import tuned_mm

    problem = _searched_problem(choice) if searching(choice) else None
    # Templates only through the choices this module narrows (no CPU, CUTLASS or CK GEMM templates beside them).
    patches: dict[str, object] = {
        "max_autotune_gemm": True,
        "max_autotune_gemm_backends": "ATEN,TRITON",
        "benchmark_epilogue_fusion": False,
    }
    if searching(choice):
        done = _SEARCHED.get(problem) if problem is not None else None
        if done is not None:  # the same problem again (each layer has it): its winner, no second search
            choice = done.choice
        else:
            patches["autotune_local_cache"] = False  # a cached result would not reach the feedback
    with _lowering(choice, problem if searching(choice) else None), config.patch(patches):
        return tuned_mm(a, b)


# -- overrides: what a tuning run compiles ---------------------------------------------------------------------------


class Override:
    """Choices for a tuning run's compiles, in place of the store's: `choose(problem)` gives each GEMM problem's
    choice (SEARCH to search, "" for torch's). Each override is its own epoch, so Dynamo keeps a graph per override
    and entering one again reuses its graph."""

    _next = 1

    def __init__(self, choose: Callable[[Problem], str]) -> None:
        self.epoch = Override._next
        Override._next += 1
        _OVERRIDES[self.epoch] = choose

    @contextmanager
    def active(self) -> Iterator[None]:
        global EPOCH
        before, EPOCH = EPOCH, self.epoch
        try:
            yield
        finally:
            EPOCH = before


def without_bias(problem: Mapping[str, object]) -> str:
    """A problem's canonical JSON without its bias: the lowering sees the GEMM alone (the bias is its epilogue)."""
    return _canonical({**problem, "has_bias": False})
