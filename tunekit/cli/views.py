"""What `tunekit tune`, `show` and `devices` print: compact text that reads at 80 columns, and the same as JSON.

Forms used everywhere: a problem is `name=value` pairs joined by spaces in the spec's field order, a config its
parameters likewise (so a narrow terminal wraps between pairs, never inside one, and nothing is cut). Text that
came from storage (device names, provenance, configs of imported entries) is made printable before it is shown:
control characters become escapes, and the CLI prints it with rich markup off.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

from tunekit.core.render import plain as printable
from tunekit.core.space import Config, Problem

if TYPE_CHECKING:
    from tunekit.core.device import DeviceFingerprint
    from tunekit.core.spec import KernelSpec
    from tunekit.store.entry import Entry
    from tunekit.store.store import Store
    from tunekit.tuning.tune_types import TuneReport

INTERPRETER_NOTE = (
    "note: kernels run in Triton's interpreter on the CPU. Its timings only show that the kernels run and give "
    "correct results; they mean nothing for a GPU, so no speedups are shown. Tune on the GPU you serve from."
)


def counted(n: int, noun: str) -> str:
    """`1 entry`, `2 entries`, `1 problem`, `0 problems`."""
    if n == 1:
        return f"1 {noun}"
    return f"{n} {noun[:-1]}ies" if noun.endswith("y") else f"{n} {noun}s"


def problem_text(spec: KernelSpec, problem: Problem) -> str:
    fields = [f for f in spec.problem_fields if f in problem] + sorted(set(problem) - set(spec.problem_fields))
    return " ".join(f"{f}={printable(problem[f])}" for f in fields)


def config_text(spec: KernelSpec, config: Config) -> str:
    names = [n for n in spec.space.names if n in config] + sorted(set(config) - set(spec.space.names))
    return " ".join(f"{n}={printable(config[n])}" for n in names)


@dataclass(frozen=True)
class TuneResult:
    """One finished problem of `tunekit tune`."""

    spec: KernelSpec
    problem: Problem
    report: TuneReport
    entry: Entry  # as stored (merged with what was there)
    heuristic_ms: float | None
    interpreter: bool

    @property
    def skipped(self) -> bool:
        return self.report.skipped

    def counts(self) -> str:
        r = self.report
        stored = len(self.entry.trials)
        if self.skipped:
            return f"already tuned: {stored} trials stored, nothing measured (--force or a larger --trials adds more)"
        if r.shared_from is not None:
            return f"shares the entry of {r.shared_from} (same quantization), nothing measured"
        repeats = f" (and {counted(r.reused, 'repeat suggestion')} answered from them)" if r.reused else ""
        return f"{r.benchmarked} measured{repeats}, {stored} stored ({r.stop_reason})"

    def timing(self) -> str:
        """Tuned time against the heuristic's and torch's; nothing in the interpreter, whose timings mean nothing."""
        if self.interpreter:
            return ""
        text = f"{self.entry.time_ms:.4f} ms"
        for name, other in (("heuristic", self.heuristic_ms), ("torch", self.torch_ms)):
            if other:
                speedup = other / self.entry.time_ms if self.entry.time_ms > 0 else float("inf")
                text += f", {name} {other:.4f} ms ({speedup:.2f}x)"
        if self.torch_ms is not None and self.torch_ms <= self.entry.time_ms:
            text += ", torch serves it"  # tunekit.runtime.dispatch: the torch-measured layer
        return text

    @property
    def torch_ms(self) -> float | None:
        """torch's op timed by the tuning run (tunekit.tuning.torch_candidate), or None."""
        from tunekit.store.entry import torch_time

        return torch_time(self.entry.provenance)

    def line(self) -> str:
        """The whole result on one line (logs, pipes)."""
        timing = self.timing()
        parts = [f"{self.spec.name} {problem_text(self.spec, self.problem)}:"]
        if timing:
            parts.append(f"{timing};")
        parts.append(f"{self.counts()};")
        parts.append(f"config {config_text(self.spec, self.entry.config)}")
        return " ".join(parts)

    def block(self) -> list[str]:
        """The result as a terminal block: the problem on its own line, then indented details."""
        timing = self.timing()
        details = f"{timing}; {self.counts()}" if timing else self.counts()
        return [
            f"{self.spec.name} {problem_text(self.spec, self.problem)}",
            f"  {details}",
            f"  config {config_text(self.spec, self.entry.config)}",
        ]

    def to_json(self) -> dict[str, Any]:
        r = self.report
        return {
            "kernel": self.spec.name,
            "problem": dict(self.problem),
            "problem_text": problem_text(self.spec, self.problem),
            "status": "already tuned" if self.skipped else ("shared" if r.shared_from is not None else "tuned"),
            "config": dict(self.entry.config),
            "time_ms": self.entry.time_ms,
            "heuristic_ms": self.heuristic_ms,
            "torch_ms": self.torch_ms,
            "timer": self.entry.provenance.get("timer"),
            "measured": r.benchmarked,
            "reused": r.reused,
            "stored_before": r.stored_trials,
            "stored_trials": len(self.entry.trials),
            "stop_reason": r.stop_reason,
            "shared_from": r.shared_from,
            "phases": dict(r.phases),  # seconds by phase (tunekit.tuning.phases)
        }


def in_step_text(entry: Entry) -> str | None:
    """What tune_model measured for the entry's problem inside a model step (tunekit.evaluation.in_step), or None."""
    from tunekit.store.entry import in_step_record

    record = in_step_record(entry.provenance)
    if record is None:
        return None
    times = ", ".join(
        f"{printable(str(name))} {ms:.3f}" for name, ms in record["ms"].items() if isinstance(ms, (int, float))
    )
    spread = record.get("noise")
    spread_text = f"; control spread {spread:.1%}" if isinstance(spread, (int, float)) else ""
    return (
        f"in step {printable(str(record.get('step', '?')))}: kept {printable(str(record.get('kept', '?')))}; "
        f"ms per step run ({printable(str(record.get('calls', '?')))} calls, "
        f"{printable(str(record.get('problems', '?')))} problems decided "
        f"together): {times}{spread_text}"
    )


def compiled_text(entry: Entry) -> str | None:
    """What a torch.compile graph runs for the entry's GEMM, as decided in a compiled step
    (tunekit.evaluation.compiled_step), or None."""
    from tunekit.store.entry import COMPILED

    fields = {k[len(COMPILED) :]: v for k, v in entry.provenance.items() if k.startswith(COMPILED)}
    if "kept" not in fields:
        return None
    kept = "Inductor's candidate " + printable(str(fields.get("choice", "?"))) if fields["kept"] == "choice" else ""
    if kept and fields.get("by") == "step":  # its GEMMs alone were not faster: the host-bound step was
        kept += " (kept for the whole step's time)"
    times = ", ".join(
        f"{printable(name[len('ms_') :])} {ms:.4f}"
        for name, ms in fields.items()
        if name.startswith("ms_") and isinstance(ms, (int, float))
    )
    return f"compiled ({printable(str(fields.get('step', '?')))}): {kept or 'torch' + chr(39) + 's GEMM'}" + (
        f"; ms per step run: {times}" if times else ""
    )


def device_json(fp: DeviceFingerprint) -> dict[str, Any]:
    return {"label": fp.label, "key": fp.key, "interpreter": fp.is_interpreter, **fp.to_json()}


@dataclass(frozen=True)
class ShownEntry:
    """One entry of `tunekit show`: from the user's cache or a shipped database, and what serves it here."""

    source: str  # "cache" or "shipped"
    spec: KernelSpec
    entry: Entry
    why_not: str  # "" when this entry itself can serve this device, else why not (runtime.dispatch.why_not_served)
    served_by: str  # the dispatch layer that serves this entry's problem on this device

    @property
    def pack(self) -> str | None:
        """The model pack a shipped entry came from (tunekit.evaluation.model_packs), None for other entries."""
        pack = self.entry.provenance.get("pack") if self.source == "shipped" else None
        return printable(str(pack)) if pack else None

    @property
    def origin(self) -> str:
        return f"{self.source} (pack {self.pack})" if self.pack else self.source

    def device_text(self) -> str:
        name = printable(self.entry.device.get("name", "?"))
        return f"{name} ({printable(self.entry.key.device_key)[:8]})"

    @property
    def servable(self) -> bool:
        return not self.why_not

    def _stale(self) -> str:
        """Said of an entry that does not serve as it is (its kernel changed since, or it was recorded under another
        Triton: tunekit.runtime.version_policy); not of other devices'."""
        return f" ({printable(self.why_not)})" if self.why_not and self.why_not != "another device" else ""

    def block(self) -> list[str]:
        from tunekit.store.entry import torch_time

        e = self.entry
        torch_ms = torch_time(e.provenance)
        torch_text = f" (torch {torch_ms:.4f} ms)" if torch_ms is not None else ""
        in_step = in_step_text(e)
        compiled = compiled_text(e)
        return [
            f"{e.key.kernel} {problem_text(self.spec, dict(e.key.problem))}",
            f"  {self.origin} · {self.device_text()} · {e.time_ms:.4f} ms{torch_text} · {len(e.trials)} trials · "
            f"served here by {self.served_by}" + self._stale(),
            f"  config {config_text(self.spec, e.config)}",
            *([f"  {in_step}"] if in_step else []),
            *([f"  {compiled}"] if compiled else []),
        ]

    def to_json(self) -> dict[str, Any]:
        e = self.entry
        return {
            "source": self.source,
            "pack": self.pack,
            "kernel": e.key.kernel,
            "problem": dict(e.key.problem),
            "problem_text": problem_text(self.spec, dict(e.key.problem)),
            "device_name": e.device.get("name"),
            "device_key": e.key.device_key,
            "source_hash": e.key.source_hash,
            "time_ms": e.time_ms,
            "timer": e.provenance.get("timer"),
            "config": dict(e.config),
            "trials": len(e.trials),
            "servable_here": self.servable,
            "why_not_served": self.why_not,
            "served_here_by": self.served_by,
            "provenance": e.provenance,
        }


@dataclass(frozen=True)
class Listing:
    entries: list[ShownEntry]
    unknown: int  # entries of kernels this tunekit does not register (not listed)
    # Entries of other devices, not listed (`show` without --all-devices), counted by device name.
    other_devices: dict[str, int]


def served_layer(spec: KernelSpec, problem: dict[str, Any], device: DeviceFingerprint, store: Store) -> str:
    """The dispatch layer that serves a stored entry's problem here (`tunekit show`), or, for a problem this kernel
    no longer declares (a field renamed or retyped since the entry was stored), that nothing does."""
    from tunekit.core.problems import problem_error
    from tunekit.runtime.dispatch import resolve

    if problem_error(spec, problem) is not None:
        return "nothing (stale: not a problem of the kernel as it is now)"
    return resolve(spec, problem, device, store).layer


def list_entries(
    store: Store, device: DeviceFingerprint, kernel: str | None, shipped: bool, all_devices: bool = False
) -> Listing:
    """The cache's entries, then (with `shipped`) the shipped databases', each with the dispatch layer that serves
    its problem on `device` (tunekit.runtime.dispatch.resolve, as an op call would). Without `all_devices`, only
    the entries that are `device`'s (its own, or its GPU model's under another Triton); the others are counted."""
    from tunekit.core.errors import UnknownKernelError
    from tunekit.core.registry import get_spec
    from tunekit.runtime import version_policy
    from tunekit.runtime.dispatch import why_not_served
    from tunekit.store.database import shipped_entries
    from tunekit.store.snapshot import Snapshot
    from tunekit.store.user_entries import is_user_kernel

    local = sorted(store.entries(), key=lambda e: (e.key.kernel, str(e.key.problem), e.key.digest))
    snapshot = cast("Store", Snapshot(local))
    sources = [("cache", local)]
    if shipped:
        sources.append(
            ("shipped", sorted(shipped_entries().values(), key=lambda e: (e.key.kernel, str(e.key.problem))))
        )
    listed: list[ShownEntry] = []
    unknown = 0
    others: dict[str, int] = {}
    served: dict[tuple[str, Any], str] = {}
    for source, entries in sources:
        for e in entries:
            if (kernel is not None and e.key.kernel != kernel) or is_user_kernel(e.key.kernel):
                continue  # user kernels are listed by tunekit.cli.user_kernels
            try:
                spec = get_spec(e.key.kernel)
            except UnknownKernelError:
                unknown += 1
                continue
            why_not = why_not_served(e, device)
            if why_not == "another device" and not all_devices:
                name = printable(e.device.get("name", "?"))
                others[name] = others.get(name, 0) + 1
                continue
            problem = dict(e.key.problem)
            layer = served.get((e.key.kernel, e.key.problem))
            if layer is None:
                with version_policy.no_checks():  # show reports what was checked; it runs nothing
                    layer = served[(e.key.kernel, e.key.problem)] = served_layer(spec, problem, device, snapshot)
            if source == "shipped" and why_not.startswith("stale: measured") and e.key.source_hash == spec.source_hash:
                why_not = version_policy.describe(e, device)
            listed.append(ShownEntry(source, spec, e, why_not, layer))
    return Listing(listed, unknown, others)
