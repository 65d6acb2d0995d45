"""The cache commands: what it holds and serves (show), tuning databases out and in (export, import), forget."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from tunekit.cli.app import DtypeOpt, JsonOpt, ShapeOpt, say
from tunekit.cli.problems import kernel_problems
from tunekit.cli.user_kernels import show_user_entries, user_entries, user_entries_json
from tunekit.cli.views import config_text, counted, list_entries
from tunekit.core.errors import TunekitError
from tunekit.core.render import plain

if TYPE_CHECKING:
    from tunekit.core.device import DeviceFingerprint
    from tunekit.store.store import Store


def show(
    kernel: Annotated[str | None, typer.Option("--kernel", "-k", help="Only this kernel.")] = None,
    shape: ShapeOpt = None,
    dtype: DtypeOpt = None,
    kernels: Annotated[bool, typer.Option("--kernels", help="List the kernels and exit.")] = False,
    shipped: Annotated[
        bool, typer.Option("--shipped/--no-shipped", help="Also list the entries of the shipped databases.")
    ] = True,
    all_devices: Annotated[
        bool, typer.Option("--all-devices", help="Also list other devices' entries (they never serve here).")
    ] = False,
    json_out: JsonOpt = False,
) -> None:
    """What the cache and the shipped databases hold for this device, and which dispatch layer serves each problem
    here (other devices' entries are counted; --all-devices lists them); with --kernel and --shape, which layer
    serves that problem."""
    import json

    from tunekit.cli.views import device_json
    from tunekit.core.device import fingerprint
    from tunekit.core.registry import get_spec, kernel_names
    from tunekit.store.store import Store
    from tunekit.store.user_entries import is_user_kernel

    if dtype is not None and not shape:
        raise TunekitError("--dtype goes with --kernel and --shape (it names the problem whose serving layer is shown)")
    if kernels:
        described = {name: get_spec(name).description for name in kernel_names()}
        if json_out:
            print(json.dumps({"kernels": described}, indent=1))
            return
        for name, description in described.items():
            say(f"{name}: {description}")
        return
    device = fingerprint()
    with Store() as store:
        if shape:
            if kernel is None:
                raise TunekitError("--shape needs --kernel")
            _show_served(kernel, shape, dtype, device, store, json_out)
            return
        if kernel is not None and not is_user_kernel(kernel):
            get_spec(kernel)  # an unknown name fails with the list of valid ones
        listed = list_entries(store, device, kernel, shipped, all_devices)
        users = user_entries(store, kernel)
    others = dict(listed.other_devices)
    if not all_devices:
        for e in users:
            if e.key.device_key != device.key:
                name = plain(e.device.get("name", "?"))
                others[name] = others.get(name, 0) + 1
        users = [e for e in users if e.key.device_key == device.key]
    if json_out:
        document = {
            "device": device_json(device),
            "cache": str(store.directory),
            "entries": [e.to_json() for e in listed.entries],
            "unknown_kernels": listed.unknown,
            "user_kernels": user_entries_json(users),
            "other_devices": others,  # entries not listed (without --all-devices), by device name
        }
        print(json.dumps(document, indent=1, default=str))
        return
    say(f"this device: {device.label} (key {device.key})")
    say(f"cache: {store.directory}")
    for shown in listed.entries:
        for line in shown.block():
            say(line)
    show_user_entries(users, device)
    counts = {source: sum(e.source == source for e in listed.entries) for source in ("cache", "shipped")}
    summary = f"{counts['cache']} {_entries(counts['cache'])} in the cache"
    summary += "" if all_devices else " for this device"
    summary += f", {counts['shipped']} shipped" if shipped else " (shipped entries hidden by --no-shipped)"
    if listed.unknown:
        summary += f"; {listed.unknown} {_entries(listed.unknown)} of kernels this tunekit does not know, not listed"
    if others:
        n = sum(others.values())
        by_device = ", ".join(f"{name}: {count}" for name, count in sorted(others.items()))
        summary += f"; {n} {_entries(n)} of other devices not listed ({by_device}), --all-devices lists them"
    say(summary)


def _show_served(
    kernel: str, shape: list[str], dtype: str | None, device: DeviceFingerprint, store: Store, json_out: bool
) -> None:
    """`show --kernel K --shape S`: which layer serves each of those problems here."""
    import json

    from tunekit.cli.views import device_json, printable, problem_text
    from tunekit.core.registry import get_spec
    from tunekit.runtime import version_policy
    from tunekit.runtime.dispatch import resolve
    from tunekit.store.database import shipped_entries

    spec = get_spec(kernel)
    served = []
    for problem in kernel_problems(kernel, shape, dtype):
        with version_policy.no_checks():  # show runs nothing: an unchecked entry is named below
            res = resolve(spec, problem, device, store)
        unchecked = version_policy.candidate(spec, problem, device, shipped_entries())
        res_note = version_policy.describe(unchecked, device) if res.layer != "shipped" and unchecked else ""
        pack = res.entry.provenance.get("pack") if res.layer == "shipped" and res.entry is not None else None
        served.append(
            {"kernel": kernel, "problem": problem, "layer": res.layer, "config": dict(res.config)}
            | ({"pack": pack} if pack else {})
            | ({"other_triton": res_note} if res_note else {})
            | ({"bucket": res.note} if res.note else {})
        )
        if not json_out:
            say(f"{kernel} {problem_text(spec, problem)}")
            origin = f"{res.layer} (pack {printable(str(pack))})" if pack else res.layer
            say(f"  served by {origin}: {config_text(spec, res.config)}")
            for note in (res_note, res.note):
                if note:
                    say(f"  ({note})")
    if json_out:
        print(json.dumps({"device": device_json(device), "resolutions": served}, indent=1))


def _entries(n: int) -> str:
    return "entry" if n == 1 else "entries"


def export_cmd(
    out: Annotated[Path, typer.Option("--out", "-o", help="File to write (JSON).")],
    kernel: Annotated[str | None, typer.Option("--kernel", "-k", help="Only this kernel.")] = None,
    device: Annotated[
        str | None,
        typer.Option(
            help="Only this device: its key (or a prefix, as `tunekit show` prints it), or 'current' (this machine's)."
        ),
    ] = None,
    storage: Annotated[
        str | None,
        typer.Option(
            "--storage", help="Export every device's results from this shared fleet store instead of the local cache."
        ),
    ] = None,
    json_out: JsonOpt = False,
) -> None:
    """Write the cache, or a fleet's shared store (filtered by kernel and device), as a tuning database."""
    import json

    from tunekit.core.device import fingerprint
    from tunekit.core.registry import get_spec
    from tunekit.store.database import export_entries, write_document
    from tunekit.store.store import Store

    if storage is not None:
        device_key = fingerprint().key if device == "current" else device
        from tunekit.fleet import queue

        if kernel is not None:
            get_spec(kernel)  # unknown names fail with the list of valid ones
        skipped: dict[str, str] = {}
        n = write_document(out, queue.export_entries(storage, kernel, device_key, skipped=skipped))
        if json_out:
            print(json.dumps({"out": str(out), "from": storage, "exported": n, "left_out": len(skipped)}, indent=1))
            return
        none = _none_of(n, "storage", kernel, device)
        say(f"exported {counted(n, 'entry')} from {plain(storage)} to {plain(out)}{none}")
        if skipped:
            say(f"{counted(len(skipped), 'job')} left out: their job or result is unreadable (see the warnings above)")
        return
    with Store() as store:
        entries = export_entries(store, kernel, _device_key(store, device))
    n = write_document(out, entries)
    if json_out:
        print(json.dumps({"out": str(out), "from": str(store.directory), "exported": n}, indent=1))
        return
    say(f"exported {counted(n, 'entry')} to {plain(out)}{_none_of(n, 'cache', kernel, device)}")


def _device_key(store: Store, device: str | None) -> str | None:
    """--device as a full key: 'current', a key or a unique prefix of one among the cache's entries' devices."""
    from tunekit.core.device import fingerprint

    if device is None or device == "current":
        return None if device is None else fingerprint().key
    names = {e.key.device_key: plain(e.device.get("name", "?")) for e in store.entries()}
    found = [key for key in names if key.startswith(device)]
    if device in names or len(found) == 1:
        return device if device in names else found[0]
    if found:
        raise TunekitError(f"--device {device!r} is the prefix of {len(found)} device keys: give more of it")
    if not names:
        raise TunekitError(f"--device {plain(device)!r}: the cache holds no entry of any device")
    known = ", ".join(f"{key} ({name})" for key, name in sorted(names.items())[:4])
    raise TunekitError(f"--device {plain(device)!r} is no device of the cache's entries: 'current' or one of: {known}")


def _none_of(n: int, where: str, kernel: str | None, device: str | None) -> str:
    """Why an export wrote no entry: what the filters asked for that the cache (or the storage) does not hold."""
    if n:
        return ""
    of = f" of kernel {plain(kernel)}" if kernel else ""
    if device is not None:
        of += " of this device" if device == "current" else f" of device {plain(device)}"
    return f": the {where} holds no entry{of}"


def import_cmd(
    path: Annotated[Path, typer.Argument(help="A tuning database written by `tunekit export`.")],
    json_out: JsonOpt = False,
) -> None:
    """Validate FILE, then merge it into the cache.

    Every entry must be what this tunekit would serve (its config in the space and within the space's rules, its
    times above the physical floor); one bad entry refuses the whole file. Per key, the local best is kept unless
    the file's entry was measured faster by the same timer.
    """
    import json

    from tunekit.store.database import import_document
    from tunekit.store.store import Store

    with Store() as store:
        result = import_document(store, path)
    if json_out:
        counts = {"read": result.read, "added": result.added, "improved": result.improved, "kept": result.kept}
        counts["refused"] = result.refused
        print(json.dumps({"file": str(path), "cache": str(store.directory), **counts}, indent=1))
        return
    text = f"imported {plain(path)}: {counted(result.read, 'entry')} read, {result.added} added"
    text += f", {result.improved} improved"
    if result.kept:
        text += f", {result.kept} left as they were (the local entry was as fast or faster, or timed by another timer)"
    if result.refused:
        text += f", {result.refused} refused (their best config was measured wrong or failed here)"
    say(text)


def forget(
    kernel: Annotated[str | None, typer.Option("--kernel", "-k", help="Entries of this kernel.")] = None,
    device: Annotated[
        str | None,
        typer.Option(help="Entries of this device key (or a prefix, as `tunekit show` prints it), or 'current'."),
    ] = None,
    key: Annotated[
        str | None, typer.Option("--key", help="The entry with this cache key digest (or a unique prefix).")
    ] = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="List what would be removed; remove nothing.")] = False,
) -> None:
    """Remove entries from the cache: those matching every filter given (at least one)."""
    from tunekit.core.device import fingerprint
    from tunekit.store.forget import Selection, select
    from tunekit.store.forget import forget as forget_entries
    from tunekit.store.store import Store

    selection = Selection(kernel, fingerprint().key if device == "current" else device, key)
    with Store() as store:
        if dry_run:
            found = select(store, selection)
            for e in found:
                problem = " ".join(f"{k}={plain(v)}" for k, v in e.key.problem)
                say(f"{e.key.digest}  {plain(e.key.kernel)}  {plain(e.device.get('name', '?'))}  {problem}")
            say(f"{counted(len(found), 'entry')} would be removed")
            return
        removed = forget_entries(store, selection)
    say(f"removed {counted(removed, 'entry')}")


def in_step(
    kernel: Annotated[str | None, typer.Option("--kernel", "-k", help="Only this kernel.")] = None,
    json_out: JsonOpt = False,
) -> None:
    """Per problem tune_model decided inside a model step: the tuner's time and torch's (each problem alone), and
    the step's own: the ms per step run of the calls decided with it, as kept and as torch's op."""
    import json

    from tunekit.cli.views import printable, problem_text
    from tunekit.core.device import fingerprint
    from tunekit.core.registry import get_spec
    from tunekit.store.database import shipped_entries
    from tunekit.store.entry import in_step_record, torch_time
    from tunekit.store.store import Store

    if kernel is not None:
        get_spec(kernel)  # an unknown name fails with the list of valid ones
    device = fingerprint()
    with Store() as store:
        local = list(store.entries())
    seen = {e.key for e in local}
    entries = [*local, *(e for e in shipped_entries().values() if e.key not in seen)]
    rows = []
    for e in sorted(entries, key=lambda e: (e.key.kernel, str(e.key.problem))):
        record = in_step_record(e.provenance)
        if e.key.device_key != device.key or (kernel is not None and e.key.kernel != kernel) or record is None:
            continue
        served = str(record.get("kept", ""))
        ms = record["ms"]
        rows.append(
            {
                "kernel": e.key.kernel,
                "problem": problem_text(get_spec(e.key.kernel), dict(e.key.problem)),
                "tuner_ms": e.time_ms,
                "torch_ms": torch_time(e.provenance),
                "step": record.get("step"),
                "kept": served,
                "in_step_ms": ms.get(served),
                "in_step_torch_ms": ms.get("torch"),
                "calls": record.get("calls"),
            }
        )
    if json_out:
        print(json.dumps({"device": device.label, "problems": rows}, indent=1, default=str))
        return

    def ms_text(value: object) -> str:
        return f"{value:.4f}" if isinstance(value, (int, float)) else "-"

    say(f"this device: {device.label}; in-step ms: the step's calls decided with the problem, per step run")
    say(f"{'problem':<44} {'tuner ms':>9} {'torch ms':>9} {'step':<8} {'kept':<7} {'in-step':>9} {'torch':>9}")
    for r in rows:
        name = printable(f"{r['kernel']} {r['problem']}")[:44]
        say(
            f"{name:<44} {ms_text(r['tuner_ms']):>9} {ms_text(r['torch_ms']):>9} {printable(str(r['step']))[:8]:<8} "
            f"{printable(r['kept'])[:7]:<7} {ms_text(r['in_step_ms']):>9} {ms_text(r['in_step_torch_ms']):>9}"
        )
    if not rows:
        say("nothing measured in a step yet: tunekit.tune_model(model, steps) measures each problem where it runs")
