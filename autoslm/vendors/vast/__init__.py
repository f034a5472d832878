"""Vast.ai (https://vast.ai): instances through its REST API. What autoslm knows of Vast, as data.

Its runtime is autoslm/providers/vast/: ``provider.py`` (``VastProvider``) and ``client.py`` (the API
client), imported only when a Vast provider is built (``VENDOR.provider()``), so this package stays as
light as the JobSpec that names it. Its own JobSpec settings: ``options.py`` here. Self-termination
inside a Vast instance: worker_image/boot_rules.py (POD_VENDORS) and autoslm/providers/vast/selfterm.py.
"""

from __future__ import annotations

from autoslm.vendors.vendor import Capabilities, Vendor

DEFAULT_URL = "https://console.vast.ai"
KEY_ENV = "VAST_API_KEY"
URL_ENV = "AUTOSLM_VAST_URL"

# vLLM's official image of the pinned release (0.31.0: torch 2.13.0+cu130, transformers 5.17.0), by
# digest. Its ENTRYPOINT (the vLLM server) is replaced through ``onstart``. See autoslm/controller/images.py.
BOOTSTRAP_IMAGE = "vllm/vllm-openai:v0.31.0@sha256:c1c9f6fd5c109ba7f0546a59f5b2f15fb87f64c77782e90a27b648b42a8e67c3"

# Catalog GPU name -> Vast ``gpu_name``. Vast names both A100 sizes alike ("A100 PCIE", "A100 SXM4"):
# offers are told apart by the memory they report.
GPU_IDS = {
    "RTX 3090": "RTX 3090",
    "RTX 4090": "RTX 4090",
    "RTX 5090": "RTX 5090",
    "RTX A5000": "RTX A5000",
    "RTX A6000": "RTX A6000",
    "RTX 6000 Ada": "RTX 6000Ada",
    "L4": "L4",
    "L40": "L40",
    "L40S": "L40S",
    "A40": "A40",
    "A100 40GB PCIe": "A100 PCIE",
    "A100 40GB SXM": "A100 SXM4",
    "A100 80GB PCIe": "A100 PCIE",
    "A100 80GB SXM": "A100 SXM4",
    "H100 PCIe": "H100 PCIE",
    "H100 SXM": "H100 SXM",
    "H100 NVL": "H100 NVL",
    "H200": "H200",
    "B200": "B200",
}

VENDOR = Vendor(
    name="vast",
    title="Vast",
    self_end="autoslm.providers.vast.selfterm:end_from_inside",
    options="autoslm.vendors.vast.options:VastOptions",
    top_level_options=("min_reliability",),  # compute.min_reliability, as JobSpecs wrote it before [compute.options.vast]
    provider_class="autoslm.providers.vast.provider:VastProvider",
    capabilities=Capabilities(
        market="offers",
        interruptible=True,  # bids: an outbid instance is stopped by Vast
        batch_status=True,
        create_window=True,
        ends_itself=True,  # Vast keeps a stopped instance, billing its disk: a finished worker destroys it
        keyless="search",  # Vast's offer search is public
        exposes_ports=True,  # a mapped public port (-p N:N)
        no_joining="Vast.ai has no private network between instances, and its NAT maps single ports, "
        "where gloo and NCCL connect every pair of ranks on ports of their own",
    ),
    key_env=KEY_ENV,
    key_section="vast",
    key_page="https://cloud.vast.ai/manage-keys/",
    pods_page="https://cloud.vast.ai/instances/",
    url_env=URL_ENV,
    default_url=DEFAULT_URL,
    pod_secret_envs=("CONTAINER_API_KEY",),  # the instance-scoped key Vast injects
    gpu_ids=GPU_IDS,
    bootstrap_image=BOOTSTRAP_IMAGE,
    bootstrap_has_vllm=True,  # in the base image itself
    bootstrap_base="vllm",
)
