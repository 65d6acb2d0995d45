"""The conformance sweep of tunekit.patch: every causal-LM family the installed transformers ships, built tiny from
its own config class with random weights, patched, and compared with the unpatched model.

Families come from transformers itself (`MODEL_FOR_CAUSAL_LM_MAPPING_NAMES`: model type -> class), never from a
hand list; each is built at tiny widths (`tiny_config`: 64 wide, 2 layers of 4 heads, a 128-token vocabulary, few
experts), seeded, in the dtype and on the device asked for. Per family, on a deep copy patched with tunekit.patch:
- one training step: the forward's logits, the loss and every parameter's gradient (train mode, dropout off;
  the interpreter's GEMMs are what the CPU sweep's time goes to, so the logits come from this forward),
- a short greedy `generate` with the KV cache: the same tokens (in half precision, a step where the unpatched
  model's top two logits are within the dtype's tolerance may pick either),
are compared with the unpatched model's, in the same dtype, within `TOLERANCES[dtype]`; then `unpatch` must give
back the state dict and logits bit-equal. In half precision the unpatched model is itself off the exact result by
more than any fixed tolerance where a gradient runs through many roundings (a selective scan's A_log, a router's
gate): there a quantity past the tolerance still matches when the patched model is no further from the same
model run in float32 than `HALF_SLACK` times the unpatched model is: tunekit is never less accurate than eager.
A family is:
- `matched`: all of the above hold (whether or not anything was swapped),
- `failed`: the patched model raised, differed, or unpatch did not restore it (the sweep's test fails on any),
- `cannot build`: no tiny model could be built (an encoder-decoder, a vision or audio tower, missing extra
  dependencies): listed with the reason, never dropped,
- `cannot run`: the unpatched model itself fails at tiny size (listed with the reason; nothing to compare).

Used by tests/runtime/test_patch_conformance*.py (fp32, CPU) and tests/gpu/patch_conformance.py (bf16, fp16).
"""

from __future__ import annotations

import contextlib
import copy
import inspect
import io
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

WIDTH, LAYERS, HEADS, KV_HEADS, HEAD_DIM, VOCAB = 64, 2, 4, 2, 16, 128
BATCH, SEQUENCE, NEW_TOKENS = 2, 8, 2  # 2 new tokens: the prefill, then a decode step on the KV cache
TINY_PARAMETERS = 2_000_000  # more, and some size of the family did not shrink (a sub-config of its own)
# The config keywords of a tiny model, under each name configs use for them; only the names a config has are set.
_TINY: dict[str, object] = {
    **dict.fromkeys(("hidden_size", "n_embd", "d_model", "dim", "model_dim"), WIDTH),
    **dict.fromkeys(("intermediate_size", "ffn_dim", "d_ff", "ffn_hidden_size", "n_inner"), 96),
    **dict.fromkeys(("decoder_ffn_dim", "encoder_ffn_dim"), 96),
    **dict.fromkeys(("moe_intermediate_size", "shared_expert_intermediate_size", "expert_intermediate_size"), 32),
    **dict.fromkeys(("num_hidden_layers", "n_layer", "num_layers", "n_layers", "decoder_layers"), LAYERS),
    **dict.fromkeys(("num_attention_heads", "n_head", "num_heads", "n_heads", "decoder_attention_heads"), HEADS),
    **dict.fromkeys(("num_key_value_heads", "num_kv_heads", "n_kv_heads", "multi_query_group_num"), KV_HEADS),
    **dict.fromkeys(("head_dim", "kv_channels", "d_kv", "attention_head_size"), HEAD_DIM),
    **dict.fromkeys(("max_position_embeddings", "n_positions", "n_ctx", "max_seq_len"), 64),
    **dict.fromkeys(("num_experts", "num_local_experts", "n_routed_experts", "moe_num_experts"), 4),
    **dict.fromkeys(("num_experts_per_tok", "moe_topk", "top_k", "moe_k"), 2),
    **dict.fromkeys(("n_group", "topk_group", "n_shared_experts", "num_shared_experts"), 1),
    **dict.fromkeys(("first_k_dense_replace",), 1),
    **dict.fromkeys(("q_lora_rank", "kv_lora_rank"), 16),
    **dict.fromkeys(("qk_rope_head_dim", "qk_nope_head_dim"), HEAD_DIM),  # MLA: rotary dims are head_dim's
    "rotary_dim": HEAD_DIM // 2,  # a partial rotary (GPT-J, CodeGen)
    **dict.fromkeys(("v_head_dim",), HEAD_DIM),
    **dict.fromkeys(("state_size", "ssm_state_size", "mamba_d_state", "linear_key_head_dim"), 8),
    **dict.fromkeys(("linear_value_head_dim",), HEAD_DIM),
    **dict.fromkeys(("mamba_d_head", "mamba_head_dim"), 2 * WIDTH // HEADS),  # heads x head = expand (2) x width
    **dict.fromkeys(("mamba_n_groups", "n_groups"), 1),
    "attn_layer_indices": [1],  # hybrids: layer 0 their recurrent kind, layer 1 attention
    **dict.fromkeys(("attn_layer_period", "expert_layer_period"), 2),
    **dict.fromkeys(("attn_layer_offset", "expert_layer_offset"), 1),
    "attention_types": [[["global", "local"], 1]],  # GPT-Neo: one of each
    **dict.fromkeys(("linear_num_key_heads", "linear_num_value_heads", "mamba_n_heads"), HEADS),
    **dict.fromkeys(("sliding_window", "attention_window_size", "local_window_size"), 16),
    "vocab_size": VOCAB,
    "pad_token_id": 0,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "use_cache": True,
}
_DROPOUT_WORDS = ("dropout", "pdrop", "drop_rate", "dropout_rate")
_PER_LAYER = ("layer_types", "intermediate_size", "block_types", "layers_block_type", "hybrid_override_pattern")
_MULTIMODAL = ("vision_config", "audio_config", "vision_tower", "visual", "image_token_id", "vq_config")


@dataclass(frozen=True)
class Tolerance:
    """Errors relative to the largest value of the unpatched model's tensor (logits, loss, each gradient)."""

    logits: float
    loss: float
    grads: float
    tie: float  # a generate step may pick either token when the unpatched top two are this close (relative)


TOLERANCES: dict[torch.dtype, Tolerance] = {
    torch.float32: Tolerance(logits=1e-4, loss=1e-5, grads=1e-3, tie=1e-5),
    torch.bfloat16: Tolerance(logits=3e-2, loss=1e-2, grads=8e-2, tie=3e-2),
    torch.float16: Tolerance(logits=1e-2, loss=5e-3, grads=5e-2, tie=1e-2),
}


HALF_SLACK = 2.0  # how much further from float32 than the unpatched model a half-precision result may be


class CannotBuild(Exception):
    """A family that no tiny model is built for here (the reason is the message)."""


@dataclass
class FamilyResult:
    family: str  # transformers' model type
    model_class: str
    status: str  # matched, failed, cannot build, cannot run
    reason: str = ""
    swapped: int = 0
    fused: int = 0
    skipped: list[str] = field(default_factory=list)  # the patch report's reasons
    errors: dict[str, float] = field(default_factory=dict)  # logits, loss, grads: the largest relative errors
    seconds: float = 0.0

    @property
    def patched(self) -> bool:
        return self.swapped > 0 or self.fused > 0


def causal_lm_families() -> list[tuple[str, str]]:
    """(model type, class name) of every causal LM transformers maps: each class once per config class (GPT-SW3 is
    GPT-2's class and config: listed once, under the type its config names, gpt2)."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    chosen: dict[tuple[str, str], str] = {}
    for model_type, class_name in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.items():
        name = str(class_name[0] if isinstance(class_name, (tuple, list)) else class_name)
        key = (name, str(CONFIG_MAPPING_NAMES.get(model_type, model_type)))
        held = chosen.get(key)
        if held is None or (_config_type(model_type) == model_type and _config_type(held) != held):
            chosen[key] = model_type
    return sorted((model_type, name) for (name, _), model_type in chosen.items())


def _config_type(model_type: str) -> str | None:
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    try:
        return str(CONFIG_MAPPING[model_type].model_type)
    except Exception:  # a config class that is not importable here
        return None


def _short(failure: BaseException) -> str:
    """The failure's type and first lines (a validation error says what failed on its second)."""
    text = " ".join(line.strip() for line in str(failure).strip().splitlines()[:2])
    return f"{type(failure).__name__}: {text[:200]}"


def _per_layer(value: list[Any], layers: int) -> list[Any]:
    """A per-layer list for `layers` layers keeping each kind of entry it had (a hybrid keeps both its layers)."""
    kinds = list(dict.fromkeys(value if not isinstance(value[0], (list, dict)) else []))
    if not kinds:
        return value[:layers]
    return [kinds[i % len(kinds)] for i in range(max(layers, len(kinds)))]


def tiny_config(model_type: str) -> Any:
    """The family's own config class with the tiny sizes (`_TINY`, only the names it has), dropout off."""
    import transformers
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    try:
        config_class = CONFIG_MAPPING[model_type]
        default = config_class()
    except Exception as failure:  # a config that needs arguments or extra packages
        raise CannotBuild(f"its config does not build: {_short(failure)}") from failure
    if any(getattr(default, name, None) is not None for name in _MULTIMODAL):
        raise CannotBuild("a multimodal model (a vision or audio tower beside the language model)")
    if getattr(default, "text_config", None) is not None and not isinstance(default, transformers.PretrainedConfig):
        raise CannotBuild("a composite config")
    known = set(default.to_dict()) | set(inspect.signature(config_class.__init__).parameters)
    known |= set(getattr(config_class, "attribute_map", {}))
    keywords = {name: value for name, value in _TINY.items() if name in known}
    layers = LAYERS
    for name in _PER_LAYER:
        value = getattr(default, name, None)
        held = getattr(config_class, getattr(config_class, "attribute_map", {}).get(name, name), None)
        if isinstance(held, property) and held.fset is None:
            continue  # derived from other keywords
        if isinstance(value, list) and value:
            keywords[name] = _per_layer(value, LAYERS) if name != "intermediate_size" else [96] * LAYERS
            layers = max(layers, len(keywords[name]))
        elif isinstance(value, str) and name == "hybrid_override_pattern":
            kinds = "".join(dict.fromkeys(value))
            keywords[name], layers = kinds, max(layers, len(kinds))
    for name in ("num_hidden_layers", "n_layer", "num_layers", "n_layers"):
        if name in keywords:
            keywords[name] = layers
    for name, value in default.to_dict().items():
        if any(word in name for word in _DROPOUT_WORDS) and isinstance(value, float):
            keywords[name] = 0.0
    try:
        return config_class(**keywords)
    except Exception as failure:
        raise CannotBuild(f"its config does not take tiny sizes: {_short(failure)}") from failure


def build(model_type: str, class_name: str, dtype: torch.dtype, device: str, seed: int = 0) -> torch.nn.Module:
    """The family's model at tiny size, random weights (seeded), in `dtype` on `device`."""
    import transformers

    with _quiet():
        config = tiny_config(model_type)
    model_class = getattr(transformers, class_name, None)
    if model_class is None:
        raise CannotBuild(f"transformers exports no {class_name}")
    if getattr(config, "is_encoder_decoder", False) and not class_name.endswith("ForCausalLM"):
        raise CannotBuild("an encoder-decoder")
    try:
        with _quiet(), torch.device("meta"):  # counted before any weight is drawn
            parameters = sum(p.numel() for p in model_class(config).parameters())
    except Exception as failure:  # extra packages, a tower that does not shrink, a size it refuses
        raise CannotBuild(f"the model does not build at tiny size: {_short(failure)}") from failure
    if parameters > TINY_PARAMETERS:
        raise CannotBuild(f"{parameters / 1e6:.0f}M parameters at the tiny sizes (sizes its config keeps elsewhere)")
    torch.manual_seed(seed)
    try:
        with _quiet():
            model = model_class(config)
    except Exception as failure:  # extra packages, a tower that does not shrink, a size it refuses
        raise CannotBuild(f"the model does not build at tiny size: {_short(failure)}") from failure
    return model.to(device=device, dtype=dtype)


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """transformers' warnings and prints about random configs (token ids, generation defaults) are no result."""
    import transformers

    verbosity = transformers.logging.get_verbosity()
    transformers.logging.set_verbosity_error()
    try:
        with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
            warnings.simplefilter("ignore")
            yield
    finally:
        transformers.logging.set_verbosity(verbosity)


def _relative(a: torch.Tensor, b: torch.Tensor) -> float:
    """max |a - b| / max |b| (inf where shapes differ or a is not finite where b is)."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return float("inf")
    a, b = a.detach().float(), b.detach().float()
    if not torch.equal(torch.isfinite(a), torch.isfinite(b)):
        return float("inf")
    finite = torch.isfinite(b)
    if not finite.any():
        return 0.0
    return float((a - b)[finite].abs().max() / b[finite].abs().max().clamp_min(1e-6))


def _inputs(device: str) -> torch.Tensor:
    generator = torch.Generator().manual_seed(1)
    return torch.randint(3, VOCAB, (BATCH, SEQUENCE), generator=generator).to(device)


def _logits(model: torch.nn.Module, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(ids, use_cache=False).logits


def _train_step(
    model: torch.nn.Module, ids: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor | None]]:
    """(logits, loss, each parameter's gradient) of one training step."""
    model.train()
    model.zero_grad(set_to_none=True)
    torch.manual_seed(2)  # routers and noise that draw in train mode draw alike in both models
    out = model(ids, labels=ids, use_cache=False)
    out.loss.backward()
    grads = {name: p.grad for name, p in model.named_parameters()}
    model.zero_grad(set_to_none=True)
    model.eval()
    return out.logits.detach(), out.loss.detach(), grads


def _generate(model: torch.nn.Module, ids: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
    with torch.no_grad(), _quiet():
        out = model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=NEW_TOKENS,
            min_new_tokens=NEW_TOKENS,
            do_sample=False,
            use_cache=True,
            return_dict_in_generate=True,
            output_logits=True,
            pad_token_id=0,
        )
    return out.sequences, list(out.logits)


def _generation_differs(
    got: tuple[torch.Tensor, list[torch.Tensor]], want: tuple[torch.Tensor, list[torch.Tensor]], tie: float
) -> str | None:
    """Why the patched model's greedy tokens are not the unpatched model's: None when equal, or when they part at
    a step where the unpatched model's top two logits were within `tie` (relative) of each other."""
    sequences, (want_sequences, want_logits) = got[0], want
    if sequences.shape == want_sequences.shape and torch.equal(sequences, want_sequences):
        return None
    start = want_sequences.shape[1] - len(want_logits)
    for step, logits in enumerate(want_logits):
        column = start + step
        if column >= sequences.shape[1]:
            return f"generated {sequences.shape[1] - start} tokens, the unpatched model {len(want_logits)}"
        differs = sequences[:, column] != want_sequences[:, column]
        if differs.any():
            top = logits.float().topk(2, dim=-1).values
            gap = (top[:, 0] - top[:, 1]) / logits.float().abs().amax(-1).clamp_min(1e-6)
            if bool((gap[differs] <= tie).all()):
                return None  # a near tie: either token is the model's answer
            return f"greedy tokens differ at new token {step} (not a near tie)"
    return "greedy sequences differ"


def _state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {name: value.detach().clone() for name, value in model.state_dict().items()}


Step = tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor | None]]  # logits, loss, each gradient


def _within(got: torch.Tensor, want: torch.Tensor, tolerance: float, exact: torch.Tensor | None) -> tuple[float, bool]:
    """`got`'s error relative to `want`, and whether it matches: within `tolerance`, or (given the float32 run,
    `exact`) no further from it than HALF_SLACK times `want` is."""
    err = _relative(got, want)
    if err <= tolerance or exact is None or got.shape != want.shape or got.dtype != want.dtype:
        return err, err <= tolerance
    mine, theirs = _relative(got.float(), exact.float()), _relative(want.float(), exact.float())
    return err, mine <= max(tolerance, HALF_SLACK * theirs)


def _grad_error(
    got: dict[str, torch.Tensor | None],
    want: dict[str, torch.Tensor | None],
    tolerance: float,
    exact: dict[str, torch.Tensor | None] | None = None,
) -> tuple[float, str]:
    """The largest relative gradient error among the parameters that do not match, and the parameter it is on
    (0 and "" when every gradient matches)."""
    worst, where = 0.0, ""
    for name, reference in want.items():
        mine = got.get(name)
        if (mine is None) != (reference is None):
            return float("inf"), f"{name} (a gradient on one side only)"
        if mine is not None and reference is not None:
            err, ok = _within(mine, reference, tolerance, exact.get(name) if exact is not None else None)
            if not ok and err > worst:
                worst, where = err, name
    return worst, where


def check_family(
    model_type: str,
    class_name: str,
    dtype: torch.dtype = torch.float32,
    device: str = "cpu",
    patch: Callable[[torch.nn.Module], Any] | None = None,
) -> FamilyResult:
    """Build the family tiny, patch a deep copy, compare it with the unpatched model (see the module docstring)."""
    from tunekit.integrations.patching import patch as tunekit_patch
    from tunekit.integrations.patching import unpatch

    start = time.perf_counter()
    result = FamilyResult(model_type, class_name, "matched")
    tolerance = TOLERANCES[dtype]
    try:
        reference = build(model_type, class_name, dtype, device).eval()
    except CannotBuild as failure:
        result.status, result.reason = "cannot build", str(failure)
        return result
    ids = _inputs(device)
    try:  # the unpatched model's own run: what there is to match
        want_step = _train_step(reference, ids)
        want_generated = _generate(reference, ids)
        want_logits = _logits(reference, ids)
        # the same weights in float32: how far half precision itself is from the exact result
        exact = _train_step(copy.deepcopy(reference).float(), ids) if dtype != torch.float32 else None
    except Exception as failure:  # the family itself, not tunekit: nothing to compare
        result.status, result.reason = "cannot run", f"the unpatched model fails at tiny size: {_short(failure)}"
        return result
    model = copy.deepcopy(reference)
    before = _state(model)
    try:
        report = (patch or tunekit_patch)(model)
        result.swapped, result.fused = len(report.swapped), len(report.fused)
        result.skipped = [f"{path or '<model>'}: {why}" for path, why in report.skipped]
        reasons = _compare(model, ids, want_step, want_generated, tolerance, result, exact)
        unpatch(model)
        after = _state(model)
        if after.keys() != before.keys() or not all(torch.equal(after[k], v) for k, v in before.items()):
            reasons.append("unpatch did not restore the state dict")
        if not torch.equal(_logits(model, ids), want_logits):
            reasons.append("unpatch did not restore the logits bit-equal")
    except Exception as failure:  # the patched model raised: the one thing tunekit.patch must never cause
        reasons = [f"the patched model raised {_short(failure)}"]
    if reasons:
        result.status, result.reason = "failed", "; ".join(reasons)
    result.seconds = time.perf_counter() - start
    return result


def _compare(
    model: torch.nn.Module,
    ids: torch.Tensor,
    want_step: tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor | None]],
    want_generated: tuple[torch.Tensor, list[torch.Tensor]],
    tolerance: Tolerance,
    result: FamilyResult,
    exact: Step | None = None,
) -> list[str]:
    """The patched model's training step (logits, loss, gradients) and generation against the unpatched model's
    (and, in half precision, against the float32 run `exact`); why they differ."""
    reasons: list[str] = []
    logits, loss, grads = _train_step(model, ids)
    exact_logits, exact_loss, exact_grads = exact if exact is not None else (None, None, None)
    result.errors["logits"], ok = _within(logits, want_step[0], tolerance.logits, exact_logits)
    if not ok:
        reasons.append(f"logits differ by {result.errors['logits']:.3g} (more than {tolerance.logits:g})")
    result.errors["loss"], ok = _within(loss, want_step[1], tolerance.loss, exact_loss)
    if not ok:
        reasons.append(f"the loss differs by {result.errors['loss']:.3g} (more than {tolerance.loss:g})")
    result.errors["grads"], _ = _grad_error(grads, want_step[2], 0.0)  # the largest, matched or not
    worst, where = _grad_error(grads, want_step[2], tolerance.grads, exact_grads)
    if where:
        beyond = f", and further from float32 than {HALF_SLACK:g}x the unpatched model's" if exact else ""
        reasons.append(f"the gradient of {where} differs by {worst:.3g} (> {tolerance.grads:g}{beyond})")
    differs = _generation_differs(_generate(model, ids), want_generated, tolerance.tie)
    if differs is not None:
        reasons.append(differs)
    return reasons


def sweep(
    families: list[tuple[str, str]] | None = None,
    dtype: torch.dtype = torch.float32,
    device: str = "cpu",
    progress: Callable[[FamilyResult], None] | None = None,
) -> list[FamilyResult]:
    """check_family for each family (all of transformers' causal LMs when none are given)."""
    results = []
    for model_type, class_name in families if families is not None else causal_lm_families():
        result = check_family(model_type, class_name, dtype, device)
        if progress is not None:
            progress(result)
        results.append(result)
    return results


def table(results: list[FamilyResult]) -> str:
    """Counts, then one line per family that is not plainly matched (failed, cannot build or run, skipped swaps)."""
    counts = {status: sum(r.status == status for r in results) for status in ("matched", "failed")}
    unbuilt = sum(r.status in ("cannot build", "cannot run") for r in results)
    patched = sum(r.patched for r in results if r.status in ("matched", "failed"))
    with_skips = sum(bool(r.skipped) for r in results)
    lines = [
        f"{len(results)} families: {patched} patched, {counts['matched']} matched, {with_skips} with skipped "
        f"modules, {counts['failed']} failed, {unbuilt} cannot build or run at tiny size",
        f"{'family':<28} {'status':<13} {'swapped':>7} {'fused':>5} {'skipped':>7} {'logits':>8} {'grads':>8}  note",
    ]
    for r in sorted(results, key=lambda r: (r.status != "failed", r.status, r.family)):
        logits, grads = r.errors.get("logits"), r.errors.get("grads")
        note = r.reason or ("; ".join(dict.fromkeys(s.split(": ", 1)[1] for s in r.skipped)) if r.skipped else "")
        lines.append(
            f"{r.family:<28} {r.status:<13} {r.swapped:>7} {r.fused:>5} {len(r.skipped):>7} "
            f"{'' if logits is None else f'{logits:.1e}':>8} {'' if grads is None else f'{grads:.1e}':>8}  {note}"
        )
    return "\n".join(lines)
