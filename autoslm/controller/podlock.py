"""What the lock file (worker_image/pod-lock.json, `make lock`) says boot does on each base image.

The lock holds pip's resolutions of the pod's installs against a twin of each base, made from the
index's metadata for the pod's platform (worker_image/lock.py). Here boot's own decisions
(worker_image/boot_rules.py: ``compare``, ``plan_vllm``) run on them, so `plan` can say what a real pod
will do -- e.g. that vLLM's install keeps the image's torchaudio against vLLM's exact pin -- and
tests/unit/test_pod_lock.py can fail when a pin would make boot drop vLLM or change a held package.
No network, no torch.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from functools import lru_cache

from autoslm._image import boot_rules


@dataclass(frozen=True)
class VllmOutcome:
    """boot's decision on vLLM's install on one twin: what it installs, which held package it keeps at the
    image's version against vLLM's pin, or why it refuses (then the run generates with transformers)."""

    install: dict[str, str] = field(default_factory=dict)
    kept: dict[str, tuple[str, str]] = field(default_factory=dict)
    refusal: str | None = None


@lru_cache(maxsize=1)
def load() -> dict:
    from autoslm.controller.wheel import image_file

    return json.loads(image_file("pod-lock.json").read_text())


def twin_of(provider: str, lock: dict | None = None) -> dict | None:
    """The lock's twin of the bootstrap base ``provider`` starts (``Vendor.bootstrap_base``), if it has one."""
    from autoslm.providers import VENDORS

    vendor = VENDORS.get(provider)
    if vendor is None or vendor.bootstrap_image is None:
        return None
    return (lock or load())["twins"].get(vendor.bootstrap_base)


def autoslm_changes(twin: dict) -> tuple[dict, list, dict]:
    """boot's ``compare`` of the image's held set before and after autoslm's install: (changed, removed, added)."""
    installed = twin["autoslm"].get("install")
    if installed is None:
        raise ValueError(f"autoslm's install does not resolve on this twin: {twin['autoslm'].get('error')}")
    after = {**twin["image"], **installed}
    return boot_rules.compare(boot_rules.held_of(twin["image"]), boot_rules.held_of(after))


def vllm_outcome(twin: dict) -> VllmOutcome | None:
    """None where the image has vLLM (nothing to install)."""
    v = twin.get("vllm")
    if v is None:
        return None
    held = boot_rules.held_of(twin["image"])
    for round_ in ("held", "keep_images_unpinned"):
        if "install" in v.get(round_, {}):
            install, kept, refusal = boot_rules.plan_vllm(v[round_]["install"], held)
            return VllmOutcome(install, kept, refusal)
    errors = [v[r]["error"] for r in ("held", "keep_images_unpinned") if "error" in v.get(r, {})]
    return VllmOutcome(refusal=f"it does not resolve with the image's stack held: {errors[-1] if errors else '?'}")


def kept_against_vllm(provider: str, lock: dict | None = None) -> dict[str, tuple[str, str]]:
    twin = twin_of(provider, lock)
    outcome = vllm_outcome(twin) if twin else None
    return dict(outcome.kept) if outcome else {}


def problems(lock: dict | None = None) -> list[str]:
    """What would go wrong on a real pod by the lock: boot dropping vLLM, or an install that changes a held
    package. [] when boot keeps vLLM where it installs it and every image keeps its held versions."""
    lock = lock or load()
    out = []
    for name, twin in lock["twins"].items():
        try:
            changed, removed, _ = autoslm_changes(twin)
        except ValueError as e:
            out.append(f"{name}: {e}")
            continue
        if changed or removed:
            out.append(f"{name}: installing autoslm would change the image's {boot_rules.describe_change(changed, removed)}")
        outcome = vllm_outcome(twin)
        if outcome is None:
            continue
        if outcome.refusal or "vllm" not in outcome.install:
            out.append(f"{name}: boot would not install vLLM ({outcome.refusal or 'vllm is not in what resolves'})")
            continue
        after = {**twin["image"], **twin["autoslm"]["install"], **outcome.install}
        changed, removed, _ = boot_rules.compare(boot_rules.held_of(twin["image"]), boot_rules.held_of(after))
        changed = {n: c for n, c in changed.items() if n not in outcome.kept}
        if changed or removed:
            out.append(f"{name}: installing vLLM would change the image's {boot_rules.describe_change(changed, removed)}")
    return out
