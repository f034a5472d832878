"""Every error autoslm raises on purpose, and the CLI exit code each maps to.

    AutoslmError                      exit 1   (base; anything we raise deliberately)
    ├── SpecError                     exit 2   bad JobSpec: carries every problem found, at once
    ├── UsageError                    exit 2   bad command-line use (unknown run id, bad flag combination)
    ├── RunFailed                     exit 1   the run ended failed or cancelled
    ├── ProviderError                 exit 3   the compute provider could not do what we asked
    │   ├── ProviderRefused                    a definite no, and nothing done (no credit): only the user can change it
    │   │   └── ProviderAuthError              key missing or refused
    │   ├── ProviderRateLimited                429 after our retries
    │   ├── ProviderUnavailable                network error, timeout, 5xx after our retries
    │   ├── NoCapacity                         no GPU/offer matches right now
    │   └── ProvisioningFailed                 a pod was (maybe) created and then failed: names pod_id
    ├── StoreError                    exit 3   the artifact store could not do what we asked
    │   ├── StoreUnavailable                   could not tell (network, timeout, 5xx): never "not there"
    │   └── StoreAuthError                     token missing or refused
    ├── RegistryError                 exit 1   this machine's run registry ($AUTOSLM_HOME/registry.db)
    │   ├── RegistryCorrupt                    SQLite cannot read it (or its tables have an unknown shape)
    │   ├── RegistryNewer                      written by a newer autoslm: readable, never written
    │   ├── RegistryLocked                     another process held its write lock too long
    │   └── RegistryReadOnly                   the file or its directory cannot be written
    └── WorkerError                   exit 1   raised inside the worker
        └── FatalWorkerError                   a restart cannot fix it (bad spec, missing data): not retryable

Messages are one line a user can act on: what, where, what to do. They never contain a secret
(``autoslm.secrets.redact`` is applied by the CLI before printing, as a second line of defence).
"""

from __future__ import annotations

from dataclasses import dataclass


class AutoslmError(Exception):
    exit_code = 1

    def __init__(self, message: str, *, hint: str | None = None):
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        return f"{self.message} ({self.hint})" if self.hint else self.message


@dataclass(frozen=True)
class SpecIssue:
    """One problem in a JobSpec: where it is and what is wrong."""

    file: str
    field: str  # dotted path such as "train.batch_size"; "" for the whole file
    message: str

    def __str__(self) -> str:
        where = f"{self.file}: {self.field}" if self.field else self.file
        return f"{where}: {self.message}"


class SpecError(AutoslmError):
    exit_code = 2

    def __init__(self, issues: list[SpecIssue]):
        self.issues = list(issues)
        super().__init__("\n".join(str(i) for i in self.issues))


class UsageError(AutoslmError):
    exit_code = 2


class RunFailed(AutoslmError):
    exit_code = 1


class ProviderError(AutoslmError):
    exit_code = 3


class ProviderRefused(ProviderError):
    """The vendor said no and did nothing (no prepaid credit, a key or token without the right): a create
    refused so is an answer, not a create that may still land, and asking again changes nothing."""


class ProviderAuthError(ProviderRefused):
    pass


class ProviderRateLimited(ProviderError):
    pass


class ProviderUnavailable(ProviderError):
    pass


class NoCapacity(ProviderError):
    pass


class ProvisioningFailed(ProviderError):
    def __init__(self, message: str, *, pod_id: str | None = None, hint: str | None = None):
        if pod_id and not hint:
            hint = f"pod {pod_id} may still exist: check the provider's console and terminate it manually"
        super().__init__(message, hint=hint)
        self.pod_id = pod_id


class StoreError(AutoslmError):
    exit_code = 3


class StoreUnavailable(StoreError):
    pass


class StoreAuthError(StoreError):
    pass


class RegistryError(AutoslmError):
    """The run registry (controller/registry/) cannot do what a command asks."""

    exit_code = 1


class RegistryCorrupt(RegistryError):
    """The registry file exists but SQLite cannot read it (or it has tables of an unknown shape)."""


class RegistryNewer(RegistryError):
    """The registry was written by a newer autoslm: this one may read it, never write it."""


class RegistryLocked(RegistryError):
    """Another process held the registry's write lock for longer than ``LOCK_WAIT_S``."""


class RegistryReadOnly(RegistryError):
    """The registry file (or its directory) cannot be written by this user."""


class WorkerError(AutoslmError):
    retryable = True


class FatalWorkerError(WorkerError):
    retryable = False
