"""RunPod (https://www.runpod.io): pods through its REST v2 API. What autoslm knows of RunPod, as data.

Its runtime is autoslm/providers/runpod/: ``provider.py`` (``RunPodProvider``), ``client.py`` (the API
client), ``clusters.py``, imported only when a RunPod provider is built (``VENDOR.provider()``), so this
package stays as light as the JobSpec that names it. Its own JobSpec settings: ``options.py`` here.
Self-termination inside a RunPod pod: worker_image/boot_rules.py (POD_VENDORS) and
autoslm/providers/runpod/selfterm.py.
"""

from __future__ import annotations

from autoslm.vendors.vendor import Capabilities, Vendor

DEFAULT_URL = "https://api.runpod.io"
KEY_ENV = "RUNPOD_API_KEY"
URL_ENV = "AUTOSLM_RUNPOD_URL"

# PyTorch's official runtime image of the pinned torch (2.13.0, CUDA 13.0), by digest: it has no
# ENTRYPOINT, so the create's ``args`` are the command (the vLLM image's ENTRYPOINT is its server, and
# v2 cannot replace it). It has no vLLM. See autoslm/controller/images.py and docs/worker-image.md.
BOOTSTRAP_IMAGE = (
    "pytorch/pytorch:2.13.0-cuda13.0-cudnn9-runtime@sha256:db80a41f8428644cebcb3d75b0b62df334ab6c0e75785951eb25f48bfbd42407"
)

# Catalog GPU name -> RunPod v2 catalog id. RunPod's catalog lists the 80 GB A100s only.
GPU_IDS = {
    "RTX 3090": "NVIDIA GeForce RTX 3090",
    "RTX 4090": "NVIDIA GeForce RTX 4090",
    "RTX 5090": "NVIDIA GeForce RTX 5090",
    "RTX A5000": "NVIDIA RTX A5000",
    "RTX A6000": "NVIDIA RTX A6000",
    "RTX 6000 Ada": "NVIDIA RTX 6000 Ada Generation",
    "L4": "NVIDIA L4",
    "L40": "NVIDIA L40",
    "L40S": "NVIDIA L40S",
    "A40": "NVIDIA A40",
    "A100 80GB PCIe": "NVIDIA A100 80GB PCIe",
    "A100 80GB SXM": "NVIDIA A100-SXM4-80GB",
    "H100 PCIe": "NVIDIA H100 PCIe",
    "H100 SXM": "NVIDIA H100 80GB HBM3",
    "H100 NVL": "NVIDIA H100 NVL",
    "H200": "NVIDIA H200",
    "B200": "NVIDIA B200",
}

# On-demand list prices, $ per GPU per hour (secure cloud), as published in 2026-11: what `plan` shows
# without RUNPOD_API_KEY (RunPod needs a key for anything), marked "catalog price".
LIST_PRICES_AS_OF = "2026-11"
LIST_PRICES = {
    "RTX 3090": 0.46,
    "RTX 4090": 0.69,
    "RTX 5090": 0.94,
    "RTX A5000": 0.27,
    "RTX A6000": 0.49,
    "RTX 6000 Ada": 0.77,
    "L4": 0.43,
    "L40": 0.99,
    "L40S": 0.86,
    "A40": 0.40,
    "A100 80GB PCIe": 1.64,
    "A100 80GB SXM": 1.74,
    "H100 PCIe": 2.39,
    "H100 SXM": 2.69,
    "H100 NVL": 2.79,
    "H200": 3.59,
    "B200": 5.98,
}

VENDOR = Vendor(
    name="runpod",
    title="RunPod",
    self_end="autoslm.providers.runpod.selfterm:end_from_inside",
    options="autoslm.vendors.runpod.options:RunPodOptions",
    top_level_options=("cloud",),  # compute.cloud, as JobSpecs wrote it before [compute.options.runpod]
    provider_class="autoslm.providers.runpod.provider:RunPodProvider",
    capabilities=Capabilities(
        market="offers",
        interruptible=False,
        not_interruptible="RunPod has no interruptible (spot) pods in its v2 API",
        batch_status=True,
        create_window=True,
        ends_itself=True,  # RunPod restarts an exited container: a finished worker ends its pod
        keyless="list prices",
        exposes_ports=True,  # its proxy: https://<pod>-<port>.proxy.runpod.net
        joins_pods=True,  # Instant Clusters: /v2/clusters, K pods in one data center on a private network
        joined_by="an Instant Cluster",
        pod_link_gbps=1600.0,  # RunPod's Instant Clusters: 1600 to 3200 Gbit/s between nodes, the lower counted
    ),
    key_env=KEY_ENV,
    key_section="runpod",
    key_page="https://console.runpod.io/user/settings",
    pods_page="https://console.runpod.io/pods",
    url_env=URL_ENV,
    default_url=DEFAULT_URL,
    pod_secret_envs=(KEY_ENV,),  # RunPod injects a pod-scoped key under the account key's name
    gpu_ids=GPU_IDS,
    bootstrap_image=BOOTSTRAP_IMAGE,
    bootstrap_has_vllm=False,
    bootstrap_base="pytorch",
    list_prices=LIST_PRICES,
    list_prices_as_of=LIST_PRICES_AS_OF,
)
