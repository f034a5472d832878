"""The orphan sweep behind `autoslm gc`: find autoslm pods in the providers' own lists, end the stray ones.

It asks every provider that has credentials here (and the local one) for its autoslm pods, reads
whose each is from its name (``podnames``: home id, run id), and terminates only this home's pods
whose run is over or that no run here knows. With ``all_homes`` it also terminates other homes'
pods (it cannot know their runs). It goes on past a provider or a pod that fails, and reports each.

It must never: touch a pod of a run that is still live here (its supervisor owns it), nor another
home's pod without ``all_homes``; stop at the first failure; end a pod on the strength of "unknown"
when the registry cannot say (damaged, locked, or from a newer autoslm: read-only here). Without a
readable registry it ends only the pods the user names (``pods``) or, with ``all_homes``, every
autoslm pod it finds; it lists the others with the command that would end them.
A run whose teardown failed (``troubled``) is reported as FAILED, never as "kept: live". A pod of a
run this home knows that it ends is billed to that run (``on_end``): nobody records it otherwise.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from autoslm.controller.podnames import PodName, RunKeys, parse_pod_name
from autoslm.controller.registry import Registry, run_state
from autoslm.errors import AutoslmError, ProviderAuthError
from autoslm.providers import VENDORS
from autoslm.providers.base import POD_LABEL, PodHandle, Provider


@dataclass
class GcReport:
    terminated: list[str] = field(default_factory=list)
    would_terminate: list[str] = field(default_factory=list)
    kept: list[str] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    skipped_providers: list[str] = field(default_factory=list)

    def lines(self) -> list[str]:
        return (
            [f"terminated {x}" for x in self.terminated]
            + [f"would terminate {x}" for x in self.would_terminate]
            + [f"kept {x}" for x in self.kept]
            + [f"FAILED {x}" for x in self.failures]
        )


def sweep(
    providers: Callable[[str], Provider],
    my_home: str,
    registry: Registry | None,
    *,
    dry_run: bool = False,
    all_homes: bool = False,
    names: tuple[str, ...] | None = None,
    pods: tuple[str, ...] = (),
    troubled: dict[str, str] | None = None,
    on_end: Callable[[PodHandle, str], None] | None = None,
) -> GcReport:
    """``registry`` None: none could be read. ``pods``: only these pod ids, which the user named.
    ``names``: the providers to ask (default: every registered vendor, ``providers.VENDORS``)."""
    report = GcReport()
    names = tuple(VENDORS) if names is None else names
    troubled = troubled or {}
    wanted = set(pods)
    # Which run of this registry a pod's name is of: its whole run id, or a shortened key with its hash.
    runs = RunKeys(registry.all_run_ids() if registry is not None else ())
    for pname in names:
        try:
            provider = providers(pname)
        except ProviderAuthError:
            report.skipped_providers.append(pname)  # no key here: nothing of ours can be there
            continue
        try:
            found = provider.list_pods(POD_LABEL)
        except AutoslmError as e:
            report.failures.append(f"{pname}: could not list pods: {e}")
            continue
        for handle in found:
            if wanted and handle.pod_id not in wanted:
                continue
            wanted.discard(handle.pod_id)
            what = f"{pname} pod {handle.pod_id} ({handle.name or 'no name'})"
            parsed = parse_pod_name(handle.name or "")
            run_id = runs.run_of(parsed) if parsed is not None else None
            if run_id in troubled:
                report.failures.append(f"{what}: ending run {run_id} failed: {troubled[run_id]}")
                continue
            verdict = _verdict(handle, (parsed, run_id), my_home, registry, all_homes, named=bool(pods))
            if verdict is not None:
                report.kept.append(f"{what}: {verdict}")
                continue
            if dry_run:
                report.would_terminate.append(what)
                continue
            try:
                provider.terminate(PodHandle(pname, handle.pod_id))
                report.terminated.append(what)
            except AutoslmError as e:
                report.failures.append(f"{what}: {e}")
                continue
            if on_end is not None and run_id is not None and registry is not None and not registry.read_only:
                try:
                    on_end(handle, run_id)
                except Exception as e:  # noqa: BLE001 - the pod is ended: a bill that failed is said, not fatal
                    report.failures.append(f"{what}: ended, but not billed: {e}")
    for pod_id in sorted(wanted):
        report.failures.append(f"pod {pod_id}: no autoslm pod with this id in the providers' lists")
    return report


def _verdict(
    handle: PodHandle,
    whose: tuple[PodName | None, str | None],
    my_home: str,
    registry: Registry | None,
    all_homes: bool,
    named: bool = False,
) -> str | None:
    """None: terminate it. Otherwise why it stays. ``whose``: its parsed name, and the run of this
    registry it is of (None: none here)."""
    parsed, run_id = whose
    mine = parsed is not None and (_this_machine(handle) or parsed.home in (my_home, None))
    if registry is not None and mine and run_id is not None:
        live = _run_verdict(registry, run_id)
        if live is None:
            return None  # its run is over
        if not (named and registry.read_only):  # a run this version cannot cancel: naming the pod ends it
            return f"{live}: `autoslm cancel {run_id}` ends it"
        return None
    if named:
        return None  # the user named it
    if registry is None or registry.read_only:
        # Nothing here can say whose it is: "unknown" is no reason to end a pod that may be supervised.
        if all_homes:
            return None
        why = (
            "no readable registry here says whose run it is"
            if registry is None
            else "the registry is from a newer autoslm and does not say whose run it is"
        )
        return f"{why}; `autoslm gc {handle.pod_id}` ends it (`--all-homes` ends every one)"
    if _this_machine(handle) and not handle.name:
        return None  # no run here knows it
    if parsed is None:
        return None if all_homes else "its name does not say whose it is"
    if not mine:
        return None if all_homes else f"belongs to another home ({parsed.home or 'unknown'}); --all-homes ends it"
    return None  # this home's, and no run here knows it


def _this_machine(handle: PodHandle) -> bool:
    """A pod of this machine (a vendor that rents nothing): only this home lists it. A rented vendor's
    list is the account's, which other homes share."""
    vendor = VENDORS.get(handle.provider)
    return vendor is not None and not vendor.rented


def _run_verdict(registry: Registry, run_id: str | None) -> str | None:
    if run_id is None or registry.get_run(run_id) is None:
        return None  # no run here knows it
    if run_state(registry.replicas(run_id)).live:
        return f"run {run_id} is live"
    return None
