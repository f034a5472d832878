"""Which worker failures a restart can fix. Everything else fails the run at once, on its first pod.

Not retryable: a bad JobSpec, missing data (a file that is not there will not appear by itself), an
unknown model or dataset repo, bad or missing credentials, a package the pod's python lacks (an
ImportError: the same image on a new pod lacks it too), a CUDA out-of-memory error while a GRPO step
generates (``engine/train/grpo.py`` raises it as a FatalWorkerError naming the generation batch, the
length, the GPU and the planner's peak: the same GPU would fail the same way). Retryable: everything
else (network, out-of-memory elsewhere on a bad host, a CUDA fault, preemption) -- the controller relaunches within
limits.max_restarts, so a misjudged "retryable" costs a few pods, a misjudged "fatal" a whole run.

Vendor exceptions are recognised by class name so this module imports nothing heavy.
"""

from __future__ import annotations

from autoslm.errors import FatalWorkerError, ProviderAuthError, SpecError, StoreAuthError, UsageError

# huggingface_hub: the repo or revision does not exist (or is gated): a typo in spec.model or
# environment.id, not a blip.
_FATAL_HUB = {"RepositoryNotFoundError", "GatedRepoError", "RevisionNotFoundError", "DisabledRepoError"}


def is_retryable(e: BaseException) -> bool:
    if isinstance(e, (FatalWorkerError, SpecError, UsageError)):  # bad input: the same input fails again
        return False
    if isinstance(e, (StoreAuthError, ProviderAuthError)):
        return False  # bad credentials
    if isinstance(e, (FileNotFoundError, IsADirectoryError, NotADirectoryError)):
        return False  # missing data
    if isinstance(e, ImportError):
        return False  # a missing or broken package: every pod of this image has the same
    names = {c.__name__ for c in type(e).__mro__}
    if names & _FATAL_HUB:
        return False
    status = getattr(getattr(e, "response", None), "status_code", None)
    if "HfHubHTTPError" in names and status in (401, 403):
        return False  # the Hub refused the token
    return True
