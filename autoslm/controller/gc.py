"""The orphan sweep behind `autoslm gc`: find autoslm pods in the providers' own lists, end the stray ones.

It asks every provider that has credentials here (and the local one) for its autoslm pods, reads
whose each is from its name (``podnames``: home id, run id), and terminates only this home's pods
whose run is over or that no run here knows. With ``all_homes`` it also terminates other homes'
pods (it cannot know their runs). It goes on past a provider or a pod that fails, and reports each.

It must never: touch a pod of a run that is still live here (its supervisor owns it), nor another
home's pod without ``all_homes``; stop at the first failure. It works without a registry (a damaged
file): then every pod of this home counts as unknown, since nothing here supervises it any more.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from autoslm.controller.podnames import parse_pod_name
from autoslm.controller.registry import TERMINAL, Registry, run_state
from autoslm.errors import AutoslmError, ProviderAuthError
from autoslm.providers.base import POD_LABEL, PodHandle, Provider

PROVIDERS = ("local", "runpod", "vast")


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
    names: tuple[str, ...] = PROVIDERS,
) -> GcReport:
    report = GcReport()
    for pname in names:
        try:
            provider = providers(pname)
        except ProviderAuthError:
            report.skipped_providers.append(pname)  # no key here: nothing of ours can be there
            continue
        try:
            pods = provider.list_pods(POD_LABEL)
        except AutoslmError as e:
            report.failures.append(f"{pname}: could not list pods: {e}")
            continue
        for handle in pods:
            what = f"{pname} pod {handle.pod_id} ({handle.name or 'no name'})"
            verdict = _verdict(handle, my_home, registry, all_homes)
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
    return report


def _verdict(handle: PodHandle, my_home: str, registry: Registry | None, all_homes: bool) -> str | None:
    """None: terminate it. Otherwise why it stays."""
    if handle.provider == "local" and not handle.name:
        return None if registry is None else _run_verdict(registry, None)
    parsed = parse_pod_name(handle.name or "")
    if parsed is None:
        return None if all_homes else "its name does not say whose it is"
    ours = parsed.home == my_home or (parsed.home is None and registry is not None and registry.get_run(parsed.run_id) is not None)
    if handle.provider == "local":
        ours = True  # local pods live under this home's own directory
    if not ours:
        return None if all_homes else f"belongs to another home ({parsed.home or 'unknown'}); --all-homes ends it"
    if registry is None:
        return None
    return _run_verdict(registry, parsed.run_id)


def _run_verdict(registry: Registry, run_id: str | None) -> str | None:
    if run_id is None or registry.get_run(run_id) is None:
        return None  # no run here knows it
    if run_state(registry.replicas(run_id)) not in TERMINAL:
        return f"run {run_id} is live"
    return None
