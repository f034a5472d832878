"""What autoslm knows about Hugging Face Jobs, as plain data (no imports beyond the standard library).

Jobs run on the Hub: the same ``HF_TOKEN`` that holds a run's store rents the GPU, and the Jobs API is
served by the Hub's own endpoint (``HF_ENDPOINT``), so a user with only a Hugging Face account can train.
``AUTOSLM_HFJOBS_URL`` points the Jobs calls elsewhere (a proxy, a test server) without moving the store.
"""

from __future__ import annotations

from dataclasses import dataclass

NAME = "hfjobs"
TITLE = "Hugging Face Jobs"
KEY_ENV = "HF_TOKEN"
KEY_SECTION = "huggingface"  # credentials.toml section read when HF_TOKEN is unset
URL_ENV = "AUTOSLM_HFJOBS_URL"  # the Jobs API's base URL; default: the Hub endpoint
HUB_ENDPOINT_ENV = "HF_ENDPOINT"
DEFAULT_URL = "https://huggingface.co"
KEY_WHERE = "https://huggingface.co/settings/tokens"
BILLING_WHERE = "https://huggingface.co/settings/billing"
JOBS_WHERE = "https://huggingface.co/settings/jobs"  # the Jobs page of an account (settings > Jobs)

# The base a bootstrap job starts from: PyTorch's official runtime image of the pinned torch, as RunPod's
# (a job takes any public image and runs ``command`` in it; this one has no vLLM).
BOOTSTRAP_IMAGE = (
    "pytorch/pytorch:2.13.0-cuda13.0-cudnn9-runtime@sha256:db80a41f8428644cebcb3d75b0b62df334ab6c0e75785951eb25f48bfbd42407"
)
BOOTSTRAP_BASE = "pytorch"
BOOTSTRAP_HAS_VLLM = False


@dataclass(frozen=True)
class Flavor:
    name: str  # the Jobs API's flavor ("l4x1")
    gpu: str  # the catalog's GPU name (autoslm/catalog/gpus.py), or the card's name where the catalog has none
    count: int
    vram_gb: float  # per GPU
    price_per_hour: float  # the whole flavor, $ per hour (billed per minute)


# List prices, $ per hour for the whole machine, as huggingface_hub's JobHardware names the flavors
# (2026-12). A live look (``list_jobs_hardware``) replaces them where a token is set.
LIST_PRICES_AS_OF = "2026-12"
FLAVORS: dict[str, Flavor] = {
    f.name: f
    for f in (
        Flavor("t4-small", "T4", 1, 16, 0.40),
        Flavor("t4-medium", "T4", 1, 16, 0.60),
        Flavor("a10g-small", "A10G", 1, 24, 1.00),
        Flavor("a10g-large", "A10G", 1, 24, 1.50),
        Flavor("a10g-largex2", "A10G", 2, 24, 3.00),
        Flavor("a10g-largex4", "A10G", 4, 24, 5.00),
        Flavor("l4x1", "L4", 1, 24, 0.80),
        Flavor("l4x4", "L4", 4, 24, 3.80),
        Flavor("l40sx1", "L40S", 1, 48, 1.80),
        Flavor("l40sx4", "L40S", 4, 48, 8.30),
        Flavor("l40sx8", "L40S", 8, 48, 23.50),
        Flavor("a100-large", "A100 80GB SXM", 1, 80, 2.50),
        Flavor("a100x4", "A100 80GB SXM", 4, 80, 10.00),
        Flavor("a100x8", "A100 80GB SXM", 8, 80, 20.00),
        Flavor("rtx-pro-6000", "RTX PRO 6000", 1, 96, 2.75),
        Flavor("rtx-pro-6000x2", "RTX PRO 6000", 2, 96, 5.50),
        Flavor("rtx-pro-6000x4", "RTX PRO 6000", 4, 96, 11.00),
        Flavor("rtx-pro-6000x8", "RTX PRO 6000", 8, 96, 22.00),
        Flavor("h200", "H200", 1, 141, 5.00),
        Flavor("h200x2", "H200", 2, 141, 10.00),
        Flavor("h200x4", "H200", 4, 141, 20.00),
        Flavor("h200x8", "H200", 8, 141, 40.00),
    )
}

# What the Jobs API calls a card (``accelerator.model``) -> the catalog's name, where they differ.
ACCELERATOR_NAMES = {"A100": "A100 80GB SXM", "RTX PRO 6000": "RTX PRO 6000", "RTXPRO6000": "RTX PRO 6000"}

# A job's stage -> the provider contract's pod state (autoslm/providers/base.py). A job has no exit code:
# the store's heartbeats and DONE decide whether it succeeded.
STATES = {
    "SCHEDULING": "pending",  # waiting for a machine: not billed (the job's durations say when it began to run)
    "RUNNING": "running",
    "UPDATING": "running",
    "COMPLETED": "exited",
    "ERROR": "exited",  # the command failed, the image could not start, or the job's timeout ended it
    "CANCELED": "terminated",
    "DELETED": "terminated",
}
BILLED_STAGES = ("SCHEDULING", "RUNNING", "UPDATING")  # a job that may yet bill: listed for gc, priced in its status
FINISHED_STAGES = ("COMPLETED", "ERROR", "CANCELED", "DELETED")
# Stages a job may be in without ever having run (its durations then give no running time): billed nothing.
STAGES_NOT_RUN = ("SCHEDULING", "ERROR", "CANCELED", "DELETED")

# Labels each job carries, so that ``gc`` and create-once find autoslm's jobs (and this attempt's) by label.
LABEL_APP = "app"  # = base.POD_LABEL
LABEL_POD = "autoslm-pod"  # the attempt's pod name (autoslm-<run>-s<seed>-a<attempt>-h<home>)
LABEL_RUN = "autoslm-run"
LABEL_HOME = "autoslm-home"
LABEL_ATTEMPT = "autoslm-attempt"
LABEL_NODE = "autoslm-node"  # a network group's job: its node rank (0 holds training rank 0)
LABEL_NODES = "autoslm-nodes"  # ... and how many jobs its group has

# A replica of several pods (``compute.nodes``) is K jobs in one network group (``run_job(network_group=,
# network_aliases=)``): they reach each other on every port; node 0 claims an alias, at which the others
# reach it as ``${HF_NETWORK_GROUP_PREFIX}<alias>`` (the platform sets the prefix in each job). Names are
# lowercase alphanumerics and dashes, a group's at most 46 characters, an alias's 34 (huggingface_hub's
# documented limits, the same in both pinned versions).
GROUP_NAME_MAX = 46
ALIAS_MAX = 34
GROUP_SEP = "+"  # a group's pod id: its jobs' ids joined by this, node 0 first
# What each job of a group is told (torch's launcher's names, and the alias the worker builds the primary's
# address from: autoslm/engine/nodes.py).
ENV_NODE_RANK = "NODE_RANK"
ENV_NUM_NODES = "NUM_NODES"
ENV_MASTER_PORT = "MASTER_PORT"
ENV_PRIMARY_ALIAS = "AUTOSLM_PRIMARY_ALIAS"
# The rendezvous port on node 0, from the group's name: each job has a machine of its own, so any port is
# free there; one per group keeps groups apart where several share a host (the fake's 127.0.0.1).
PRIMARY_PORTS = (20000, 30000)

# A job's own timeout: the run's time left plus this, so the in-pod watchdog ends the run first and the
# platform's timeout is the second, vendor-side money stop. Never absent: the Jobs default (30 minutes)
# would end a training run.
TIMEOUT_MARGIN_S = 900
MIN_TIMEOUT_S = 600
# A serving job (one that exposes a port) writes no checkpoint at its end: its timeout is its TTL (the
# serve's deadline) plus this, so the platform ends it soon after the TTL when nothing else could.
SERVE_TIMEOUT_MARGIN_S = 120

# What the vendor is and is not (its ``Capabilities`` in ``VENDOR``).
INTERRUPTIBLE = False
NOT_INTERRUPTIBLE_WHY = "Hugging Face Jobs has no interruptible (spot) machines: every job runs at the flavor's list price"
HAS_MARKET = False  # one list price per flavor (live from list_jobs_hardware), no bids, no hosts to choose
BATCH_STATUS = True  # list_jobs answers every job's stage in one call
ENDS_ITSELF = False  # a job ends when its command exits: no container restart, nothing left to bill
# JobSpec fields a job cannot honour, each with why (`plan` and `validate` say so instead of ignoring them).
NOT_APPLICABLE = {
    "compute.interruptible": NOT_INTERRUPTIBLE_WHY,
    "compute.disk_gb": "a flavor's disk is fixed by the flavor (list_jobs_hardware's ephemeral storage)",
}


def flavor_stage(stage: str | None) -> str:
    """The contract's state for a job stage; "unknown" for a stage this table does not know."""
    return STATES.get(str(stage or "").upper(), "unknown")
