"""Set-up time: from "pod created" to the first training step, estimated from what the pod must fetch.

The image's pull (the published worker image, or a bootstrap base), what boot installs on a bootstrap
pod (autoslm's worker dependencies; vLLM where the base lacks it), the model's download (its weights in
bf16) and the warm-up (loading the weights, vLLM's profiling and CUDA graphs). ``plan`` adds it to each
run's estimate and prints its range. Pure arithmetic on datasheet-like constants: it asks nothing.

None of these numbers was measured on a rented pod (docs/worker-image.md, "What only a real pod can
show"); they are chosen to err long, the side a limit must err on.
"""

from __future__ import annotations

from dataclasses import dataclass

from autoslm.catalog.memory import resolve_model
from autoslm.catalog.models import ModelInfo

POD_START_S = 60.0  # scheduling the pod and starting its container
PULL_GB_S = 0.05  # compressed image GB a host pulls and unpacks a second (~50 MB/s with extraction)
HUB_GB_S = 0.1  # model GB downloaded from the Hub a second (the prefetch, engine/pod/prefetch.py)
WARMUP_S = 60.0  # loading the weights onto the GPU, the trainer's set-up, the "before" batch's first compile
VLLM_WARMUP_S = 60.0  # colocated vLLM's start: memory profiling and CUDA-graph capture
# Compressed sizes: vLLM's image 9.0 GB (public records of its amd64 manifest), PyTorch's runtime image
# about 4 GB, the worker image (slim Python + the pinned GPU stack, vLLM included) about as large as vLLM's.
IMAGE_GB = {"worker": 9.0, "pytorch": 4.0, "vllm": 9.0}
# What boot installs from the package index, in seconds of download and install: autoslm with its worker
# extras (trl, peft, datasets, accelerate, bitsandbytes, liger-kernel, kernels: under 1 GB), and vLLM with
# what PyTorch's image lacks (flashinfer, cutlass-dsl, xgrammar, ...: about 3 GB of wheels).
INSTALL_S = {"autoslm": 90.0, "vllm": 240.0}
# The range shown around the estimate: the pulls and downloads vary most from host to host.
RANGE = (0.6, 1.5)
BF16_BYTES = 2.0  # a parameter's bytes as the Hub serves the catalog's models (safetensors in bf16)


@dataclass(frozen=True)
class SetupEstimate:
    seconds: float  # what the run's estimate counts
    low_min: int  # the range `plan` prints, in whole minutes
    high_min: int
    basis: str  # e.g. "pull 4.0 GB + install autoslm, vllm + model 1.0 GB + warm-up"

    @property
    def hours(self) -> float:
        return self.seconds / 3600


def model_download_gb(model: str | ModelInfo) -> float | None:
    """The model's weights in bf16, in GB (what the pod downloads from the Hub); None when unknown."""
    info = resolve_model(model)
    return info.params_b * BF16_BYTES if info is not None else None


def setup_estimate(model: str | ModelInfo, *, image: str, installs: tuple[str, ...] = (), vllm: bool = False) -> SetupEstimate:
    """Set-up of one pod: ``image`` is what it pulls ("worker", or a bootstrap base: "pytorch", "vllm");
    ``installs``, what boot installs at start ("autoslm", "vllm"); ``vllm``: colocated vLLM starts.
    A model the catalog does not know is counted as a 7B one."""
    pull_gb = IMAGE_GB[image]
    model_gb = model_download_gb(model)
    model_gb = model_gb if model_gb is not None else 7.0 * BF16_BYTES
    seconds = (
        POD_START_S
        + pull_gb / PULL_GB_S
        + sum(INSTALL_S[i] for i in installs)
        + model_gb / HUB_GB_S
        + WARMUP_S
        + (VLLM_WARMUP_S if vllm else 0.0)
    )
    basis = (
        f"pull {pull_gb:.1f} GB"
        + (f" + install {', '.join(installs)}" if installs else "")
        + f" + model {model_gb:.1f} GB + warm-up"
    )
    lo, hi = (max(1, round(seconds * f / 60)) for f in RANGE)
    return SetupEstimate(seconds, lo, hi, basis)
