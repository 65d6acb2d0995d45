"""Issue 29's adversarial cases, re-run: each is refused with a clear error or served correctly, never a traceback,
a wrong answer, a write outside the cache or an unbounded cost. `COUNTS` tallies tried / refused / served correctly
(`pytest -s` prints them at the end of the module)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from helpers import cli

import tunekit.ops as ops
from tunekit.core.errors import TunekitError

COUNTS = {"tried": 0, "refused": 0, "served": 0}


@pytest.fixture(scope="module", autouse=True)
def _print_counts():
    yield
    tried, refused, served = COUNTS["tried"], COUNTS["refused"], COUNTS["served"]
    print(f"\nissue 29 re-run: {tried} tried, {refused} refused, {served} served correctly, "
          f"{tried - refused - served} failures")  # fmt: skip


def _served(got: object, want: object) -> None:
    COUNTS["tried"] += 1
    for g, w in zip(got if isinstance(got, tuple) else (got,), want if isinstance(want, tuple) else (want,)):
        assert torch.allclose(g, w, atol=1e-5, rtol=1e-5), f"max error {(g - w).abs().max().item():.3g}"
    COUNTS["served"] += 1


def _refused(call) -> None:
    COUNTS["tried"] += 1
    with pytest.raises(TunekitError) as info:
        call()
    assert "\n" not in str(info.value)
    COUNTS["refused"] += 1


def _negative_views() -> dict[str, torch.Tensor]:
    """`z.conj().imag` (public API, no copy) and `torch._neg_view`: tensors with torch's negative bit."""
    g = torch.Generator().manual_seed(29)
    z = torch.complex(torch.randn(6, 16, generator=g), torch.randn(6, 16, generator=g))
    return {"conj_imag": z.conj().imag, "conj_imag_t": z.conj().imag.t(), "neg_view": torch._neg_view(z.real.clone())}


OPS = {
    "sum": lambda t: ops.sum(t, 0),
    "mean": lambda t: ops.mean(t, 0),
    "max": lambda t: ops.max(t, 1),
    "softmax": lambda t: ops.softmax(t, -1),
    "log_softmax": lambda t: ops.log_softmax(t, -1),
    "layer_norm": lambda t: ops.layer_norm(t, t.shape[-1:]),
    "rms_norm": lambda t: ops.rms_norm(t, t.shape[-1:]),
    "gelu": lambda t: ops.gelu(t),
    "bias_act": lambda t: ops.bias_act(t, t[0], "silu"),
    "bias_act_residual": lambda t: ops.bias_act_residual(t, t[0], t, "relu"),
    "linear": lambda t: ops.linear(t, t, t[:, 0]),
    "matmul": lambda t: ops.matmul(t, t.t()),
    "cross_entropy": lambda t: ops.cross_entropy(t, torch.arange(t.shape[0]) % t.shape[1]),
}


@pytest.mark.parametrize("view", ["conj_imag", "conj_imag_t", "neg_view"])
@pytest.mark.parametrize("op", sorted(OPS))
def test_negative_bit_views_give_torchs_answer(op, view):
    """Found: `ops.sum(z.conj().imag, 0)` off by 4.21, and layer_norm, softmax, sum, linear and gelu wrong through
    `torch._neg_view`. Each op, called four times (full path, watched, replayed, and once more after a plain tensor
    of the same signature built a plan), answers as on the resolved tensor."""
    t = _negative_views()[view]
    assert t.is_neg()
    want = OPS[op](t.resolve_neg())
    for _ in range(3):
        _served(OPS[op](t), want)
    plain = t.resolve_neg().clone()
    for _ in range(3):
        OPS[op](plain)
    _served(OPS[op](t), want)


def test_conjugate_bit_and_storage_kinds_are_refused():
    z = torch.complex(torch.randn(4, 8), torch.randn(4, 8)).conj()
    assert z.is_conj()
    _refused(lambda: ops.sum(z, 0))
    _refused(lambda: ops.gelu(torch.randn(4, 8).to_sparse()))
    _refused(lambda: ops.softmax(torch.randn(4, 8).to_sparse_csr(), -1))
    x = torch.randn(4, 8)
    _served(ops.softmax(x, -1), F.softmax(x, -1))


@pytest.mark.parametrize("op", ["sum", "layer_norm", "linear"])
def test_negative_bit_views_under_compile(op):
    """A compiled graph calls the op's custom op, whose launch resolves the bits (Dynamo cannot trace the test)."""
    t = _negative_views()["neg_view"]
    torch._dynamo.reset()
    compiled = torch.compile(OPS[op], backend="aot_eager", fullgraph=True)
    _served(compiled(t), OPS[op](t.resolve_neg()))
    torch._dynamo.reset()


# --- text: lone surrogates and invisible characters -------------------------------------------------------------


def _cli(*args: str):


    return cli(*args, env={"COLUMNS": "400"})


def _shipped_json(kernel: str) -> dict:
    from tunekit.store.database import shipped_entries

    return next(e for e in shipped_entries().values() if e.key.kernel == kernel).to_json()


@pytest.mark.parametrize("text", ["\ud800", "ok\udfff", "\U000e0041", "\u061c"])
def test_strange_text_in_imports_and_plans_is_refused_or_escaped(text, tmp_path):
    """A lone surrogate in an imported device name or a plan is refused at the boundary in one line; invisible
    characters that are valid text are imported and printed escaped. Nothing raises UnicodeEncodeError."""
    import json

    from tunekit.store.database import FORMAT
    from tunekit.store.key import SCHEMA_VERSION

    entry = _shipped_json("layernorm")
    entry["device"]["name"] = text
    from tunekit.core.device import DeviceFingerprint

    entry["key"]["device_key"] = DeviceFingerprint.from_json(entry["device"]).key
    doc = tmp_path / "db.json"
    doc.write_text(json.dumps({"format": FORMAT, "schema": SCHEMA_VERSION, "entries": [entry]}))
    surrogate = any(0xD800 <= ord(c) <= 0xDFFF for c in text)
    COUNTS["tried"] += 1
    result = _cli("import", str(doc))
    assert result.exit_code == (1 if surrogate else 0), (result.output, result.exception)
    result = _cli("show")
    assert result.exit_code == 0, (result.output, result.exception)
    assert text not in result.output
    result.output.encode("utf-8")
    plan = tmp_path / "plan.jsonl"
    plan.write_text(json.dumps({"kernel": "layernorm", "shape": [8, 64], "dtype": "float32", "x": text}) + "\n")
    plan.write_text(json.dumps({"kernel": text, "shape": [8, 64], "dtype": "float32"}) + "\n")
    result = _cli("plan", str(plan))
    assert result.exit_code == 1 and "Traceback" not in result.output and text not in result.output
    COUNTS["refused" if surrogate else "served"] += 1


# --- physical floors ----------------------------------------------------------------------------------------------


def _interpreter_entry(time_ms: float, timer: str = "interpreter-wall-clock"):
    """A layernorm entry (Triton code) measured in the interpreter."""
    from tunekit.core.device import fingerprint
    from tunekit.core.registry import get_spec
    from tunekit.store.entry import Entry, TrialRecord
    from tunekit.store.key import CacheKey

    spec, device = get_spec("layernorm"), fingerprint()
    problem = {"rows": 8, "cols": 256, "dtype": "float32", "weight": True, "bias": True}
    config = spec.heuristic(problem, device)
    key = CacheKey.make("layernorm", spec.source_hash, device.key, problem)
    trials = (TrialRecord(config, "ok", time_ms),)
    return Entry(key, config, time_ms, device.to_json(), {"strategy": "tpe", "timer": timer}, trials)


def test_an_import_faster_than_the_interpreter_can_launch_is_refused(tmp_path):
    """Found: an import at 0.0011 ms under the same timer passed the 1 us floor and replaced an 18 ms local best."""
    from tunekit.core.errors import DatabaseError
    from tunekit.store.database import import_document, write_document
    from tunekit.store.store import Store

    local = _interpreter_entry(18.0)
    path = tmp_path / "db.json"
    write_document(path, [_interpreter_entry(0.0011)])
    with Store() as store:
        store.put(local)
        COUNTS["tried"] += 1
        with pytest.raises(DatabaseError, match="physical floor"):
            import_document(store, path)
        COUNTS["refused"] += 1
        assert store.get(local.key) == local


def test_a_gpu_import_faster_than_the_device_s_peak_flops_is_refused():
    """A 4096^3 GEMM on an H200 (132 SMs) at 6 us: above its bytes at 20 TB/s (5 us), below its FLOPs at any
    peak 132 SMs can reach (21 us)."""
    from tunekit.core.errors import DatabaseError
    from tunekit.store.database import shipped_entries, validate_entry

    entry = next(
        e for e in shipped_entries().values() if e.key.kernel == "gemm" and dict(e.key.problem)["m"] == 4096
    ).to_json()
    assert dict(entry["key"]["problem"])["k"] == 4096
    entry["best"]["time_ms"] = 0.006
    entry["trials"] = []
    COUNTS["tried"] += 1
    with pytest.raises(DatabaseError, match="physical floor"):
        validate_entry(entry)
    COUNTS["refused"] += 1


@pytest.mark.parametrize("time_ms", [0.0, 0.0011])
def test_a_store_row_below_the_floor_is_never_served(time_ms):
    """Found: a stored time_ms=0 could never be beaten. Such a row (or one below its floor) is ignored: re-tuning
    replaces it."""
    from tunekit.store.store import Store

    row = _interpreter_entry(time_ms)
    with Store() as store:
        store.put(row)
        COUNTS["tried"] += 1
        assert store.get(row.key) is None
        COUNTS["refused"] += 1
        store.put(_interpreter_entry(18.0))
        assert store.get(row.key).time_ms == 18.0


# --- found beyond the issue: the view-kind fuzzer ------------------------------------------------------------------


@pytest.mark.parametrize("layout", ["permuted", "overlapping"])
@pytest.mark.parametrize("unsqueeze_dim", [1, 2])
def test_rotary_embedding_on_a_k_whose_output_layout_is_not_row_major(layout, unsqueeze_dim):
    """rotary_embedding wrote its outputs in k's layout (empty_like), whose last dim is not unit-stride for a
    fully permuted or overlapping k, while the kernel writes each head's D elements as one run: wrong values (off
    by 2.1, or 1.7e29). The fuzzer's new view kinds found it."""
    import math

    from tunekit.kernels.rope.rope import apply_rotary

    g = torch.Generator().manual_seed(3)
    shape = [1, 2, 1, 6] if unsqueeze_dim == 1 else [1, 1, 2, 6]
    if layout == "permuted":
        k = torch.randn(shape, generator=g).permute(3, 2, 1, 0).contiguous().permute(3, 2, 1, 0)
    else:
        base = torch.randn(math.prod(shape[:-1]) + shape[-1], generator=g)
        k = base.as_strided(shape, [*torch.empty(shape[:-1]).stride(), 1])
    q = torch.randn(shape, generator=g)
    cos, sin = torch.rand(1, 1, 6, generator=g), torch.rand(1, 1, 6, generator=g)
    for _ in range(3):
        _served(ops.rotary_embedding(q, k, cos, sin, unsqueeze_dim), apply_rotary(q, k, cos, sin, unsqueeze_dim))


def test_a_fleet_job_holding_a_lone_surrogate_fails_alone(tmp_path):
    """Found: a lone surrogate in a job killed `tunekit worker` and `status --jobs`. Plans refuse it now; a job that
    reaches the queue anyway (its API) fails as a job, and status prints it escaped."""
    from tunekit.fleet.queue import Job, JobQueue

    url = f"sqlite:///{tmp_path / 'fleet.db'}"
    problem = {"rows": 8, "cols": 256, "dtype": "\ud800", "weight": True, "bias": True}
    JobQueue(url).submit([Job("layernorm", problem, trials=1)])
    COUNTS["tried"] += 1
    result = _cli("worker", "--storage", url, "--max-jobs", "1")
    assert result.exit_code == 0 and "Traceback" not in result.output, (result.output, result.exception)
    result = _cli("status", "--storage", url, "--jobs")
    assert result.exit_code == 0, (result.output, result.exception)
    assert "\ud800" not in result.output and "\\ud800" in result.output
    result.output.encode("utf-8")
    COUNTS["refused"] += 1
