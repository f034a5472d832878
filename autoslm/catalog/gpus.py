"""The GPUs autoslm rents: memory, bandwidth and throughput, and the worker image a pod runs. Pure
data. Each vendor's id for a GPU is the vendor's own data (``Vendor.gpu_ids``); names are looked up
through every vendor's ids too.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from autoslm.vendors.table import VENDORS

GiB = 1024**3


@dataclass(frozen=True)
class GPUInfo:
    """One GPU type. ``name`` is what a JobSpec says (``compute.gpu``); each vendor maps it to its own
    id (``Vendor.gpu_ids``, autoslm/providers/<vendor>/)."""

    name: str
    vram_gb: float  # the datasheet's number ("48 GB")
    mem_gib: float  # what the card reports to CUDA (an L40S's "48 GB" is 45 GiB, a 4090's "24 GB" is 24 GiB)
    bf16_tflops: float  # dense bf16 tensor throughput, from the vendor's datasheet
    mem_bw_gbs: float  # memory bandwidth, GB/s
    capability: tuple[int, int] = (8, 0)  # CUDA compute capability: bf16 and flash-attention need >= 8.0, FA3 9.0
    aliases: tuple[str, ...] = ()


GPUS: dict[str, GPUInfo] = {
    g.name: g
    for g in (
        GPUInfo("RTX 3090", 24, 24.0, 71, 936, (8, 6)),
        GPUInfo("RTX 4090", 24, 24.0, 165, 1008, (8, 9)),
        GPUInfo("RTX 5090", 32, 31.8, 209, 1792, (12, 0)),
        GPUInfo("RTX A5000", 24, 24.0, 55, 768, (8, 6), ("A5000",)),
        GPUInfo("RTX A6000", 48, 48.0, 77, 768, (8, 6), ("A6000",)),
        GPUInfo("RTX 6000 Ada", 48, 48.0, 182, 960, (8, 9), ("RTX 6000 Ada Generation",)),
        GPUInfo("L4", 24, 22.5, 121, 300, (8, 9)),
        GPUInfo("L40", 48, 45.0, 181, 864, (8, 9)),
        GPUInfo("L40S", 48, 45.0, 362, 864, (8, 9)),
        GPUInfo("A40", 48, 45.0, 75, 696, (8, 6)),
        # Four A100s: 40 and 80 GB, PCIe and SXM. A vendor may name both sizes alike, told apart by the
        # memory an offer reports.
        GPUInfo("A100 40GB PCIe", 40, 39.4, 312, 1555, (8, 0), ("A100 PCIe 40GB",)),
        GPUInfo("A100 40GB SXM", 40, 39.4, 312, 1555, (8, 0), ("A100 SXM4 40GB", "A100-SXM4-40GB")),
        GPUInfo("A100 80GB PCIe", 80, 80.0, 312, 1935, (8, 0), ("A100 PCIe 80GB",)),
        GPUInfo("A100 80GB SXM", 80, 80.0, 312, 2039, (8, 0), ("A100 SXM4 80GB",)),
        GPUInfo("H100 PCIe", 80, 79.6, 756, 2000, (9, 0)),
        GPUInfo("H100 SXM", 80, 79.6, 989, 3350, (9, 0), ("H100", "H100 80GB", "H100 80GB HBM3")),
        GPUInfo("H100 NVL", 94, 93.6, 835, 3900, (9, 0)),
        GPUInfo("H200", 141, 140.4, 989, 4800, (9, 0)),
        GPUInfo("B200", 180, 179.0, 2250, 8000, (10, 0)),
    )
}

# The worker image's CUDA build (torch 2.13 wheels from PyPI carry CUDA 13.0): hosts must offer at least this.
WORKER_MIN_CUDA = "13.0"
# Where worker_image/Dockerfile is pushed (docs/worker-image.md); compute.image overrides it.
WORKER_IMAGE_REPO = "ghcr.io/autoslm/worker"


def default_worker_image() -> str:
    """The worker image tagged with this autoslm version."""
    from autoslm.version import __version__

    return f"{WORKER_IMAGE_REPO}:{__version__}"


def _norm(name: str) -> str:
    return re.sub(r"[^a-z0-9]", "", name.lower().replace("nvidia", "").replace("geforce", ""))


# Names that fit several cards ("A100", a vendor's "A100 PCIE"): never one of them silently.
_AMBIGUOUS_ALIASES = {
    "A100": ("A100 40GB PCIe", "A100 40GB SXM", "A100 80GB PCIe", "A100 80GB SXM"),
    "A100 SXM": ("A100 40GB SXM", "A100 80GB SXM"),
    "A100 40GB": ("A100 40GB PCIe", "A100 40GB SXM"),
    "A100 80GB": ("A100 80GB PCIe", "A100 80GB SXM"),
}
_GPU_INDEX: dict[str, list[GPUInfo]] = {}
for _g in GPUS.values():
    _vendor_ids = (v.gpu_ids.get(_g.name) for v in VENDORS.values())
    for _n in dict.fromkeys(n for n in (_g.name, *_vendor_ids, *_g.aliases) if n):
        if _g not in _GPU_INDEX.setdefault(_norm(_n), []):
            _GPU_INDEX[_norm(_n)].append(_g)
for _alias, _names in _AMBIGUOUS_ALIASES.items():
    _GPU_INDEX.setdefault(_norm(_alias), [GPUS[n] for n in _names])


def gpu_choices(name: str) -> list[str]:
    """The cards a name could mean when it means more than one ("A100" -> the four A100s); [] otherwise."""
    found = _GPU_INDEX.get(_norm(name), [])
    return [g.name for g in found] if len(found) > 1 else []


def gpu_info(name: str, mem_gib: float | None = None) -> GPUInfo | None:
    """Find a GPU by our name or any vendor's id for it, ignoring case, spaces and "NVIDIA GeForce". A
    name several cards share ("A100 PCIE" on Vast) needs the memory the card reports (``mem_gib``) to
    pick one; without it, None (``gpu_choices`` lists them)."""
    found = _GPU_INDEX.get(_norm(name), [])
    if len(found) == 1:
        return found[0]
    if found and mem_gib:
        fits = [g for g in found if abs(g.mem_gib - mem_gib) <= 0.1 * g.mem_gib]
        return fits[0] if len(fits) == 1 else None
    return None


def gpu_id(provider: str, name: str) -> str | None:
    """The vendor's id for a GPU name (``Vendor.gpu_ids``); None if it has none.

    An unknown name is passed through unchanged, so a GPU newer than this table still works when
    the user writes the vendor's own id.
    """
    g = gpu_info(name)
    if g is None:
        return None if gpu_choices(name) else name
    vendor = VENDORS.get(provider)
    return vendor.gpu_id(g.name) if vendor else None


def gpu_names() -> list[str]:
    return sorted(GPUS)
