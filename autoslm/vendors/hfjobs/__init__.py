"""Hugging Face Jobs (https://huggingface.co/docs/huggingface_hub/guides/jobs): a pod is a job, its GPU
a flavor. The one ``HF_TOKEN`` that holds a run's store on the Hub also rents the GPU, so a user with only
a Hugging Face account can train. What autoslm knows of it, as data: ``VENDOR``, and ``data`` beside it.

Its runtime is autoslm/providers/hfjobs/: ``client`` (its Jobs API through huggingface_hub) and
``provider`` (``HFJobsProvider``), imported only when a provider is built, so the control plane's start
does not pay for huggingface_hub.
"""

from __future__ import annotations

from autoslm.vendors.hfjobs import data
from autoslm.vendors.vendor import Capabilities, Vendor

# Catalog GPU name (autoslm/catalog/gpus.py) -> the one-GPU flavor of that card (a multi-GPU run takes its
# xN flavor: data.FLAVORS). The T4, A10G and RTX PRO 6000 flavors are offered too, with fit unknown: the
# catalog has no row for those cards.
GPU_IDS = {"L4": "l4x1", "L40S": "l40sx1", "A100 80GB SXM": "a100-large", "H200": "h200"}

VENDOR = Vendor(
    name=data.NAME,
    title=data.TITLE,
    provider_class="autoslm.providers.hfjobs.provider:HFJobsProvider",
    capabilities=Capabilities(
        market="list prices",  # one price per flavor, live from list_jobs_hardware; no bids, no hosts
        interruptible=data.INTERRUPTIBLE,
        not_interruptible=data.NOT_INTERRUPTIBLE_WHY,
        batch_status=data.BATCH_STATUS,
        create_window=True,  # a create whose answer was lost is found by its labels
        ends_itself=data.ENDS_ITSELF,
        exposes_ports=True,  # run_job(expose=[port]): https://<job id>--<port>.hf.jobs, behind the Hub token
        endpoint_from="status",  # the job's status names the URL (expose_urls); nothing in the job says it
        endpoint_token_env=data.KEY_ENV,  # a port not exposed as public answers only with a Hub token
        keyless="own list",  # the flavor table, priced per machine (not per GPU): HFJobsProvider.keyless()
        pod_logs=True,  # a job's log (fetch_job_logs): HFJobsProvider.pod_logs
        joins_pods=True,  # run_job(network_group=): jobs of one group reach each other on every port
        joined_by="a network group",
        not_applicable=data.NOT_APPLICABLE,
    ),
    key_env=data.KEY_ENV,
    key_section=data.KEY_SECTION,
    key_page=data.KEY_WHERE,
    pods_page=data.JOBS_WHERE,
    url_env=data.URL_ENV,
    default_url=data.DEFAULT_URL,
    key_reaches_pods=True,  # HF_TOKEN is also every pod's store token
    gpu_ids=GPU_IDS,
    other_gpus=("T4", "A10G", "RTX PRO 6000"),
    bootstrap_image=data.BOOTSTRAP_IMAGE,
    bootstrap_has_vllm=data.BOOTSTRAP_HAS_VLLM,
    bootstrap_base=data.BOOTSTRAP_BASE,
    list_prices_as_of=data.LIST_PRICES_AS_OF,  # the prices themselves are data.FLAVORS's, per machine
)
