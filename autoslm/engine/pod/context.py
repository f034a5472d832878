"""What a worker is told when it starts, read once from its environment: nothing else is global.

The provider hands the worker these variables (and only these; secrets and endpoints aside), read
through ``layout.PodEnv`` (the contract the controller builds them from):

    AUTOSLM_JOBSPEC    the JobSpec as JSON: the single source of truth for every training knob
    AUTOSLM_RUN_ID     the run id
    AUTOSLM_SEED       which replica this worker trains
    AUTOSLM_STORE      the artifact store URI (file:///dir or hf://owner/repo)
    AUTOSLM_DEADLINE   unix time after which the run must stop (its launch plus limits.max_hours, a serve's TTL)
    AUTOSLM_ATTEMPT    1 for the first launch, n for the n-th relaunch
    AUTOSLM_SPENT_USD, AUTOSLM_PRICE_PER_HOUR, AUTOSLM_BILLED_FROM
                       what the run spent before this pod, the pod's price, when its bill began:
                       with limits.max_usd, when this pod's money runs out (engine/pod/limits.py)
    AUTOSLM_HOME       cache for built-in models (default ~/.autoslm)
    AUTOSLM_WORKDIR    scratch space (default: a fresh temporary directory per worker)
    AUTOSLM_PREFETCH_S seconds the image's entrypoint spent downloading the model (reported, not a knob)
    HF_TOKEN, HF_ENDPOINT, the pod's id and key as its vendor injects them ...: secrets, endpoints
                       and provider ids (worker_image/boot_rules.py's POD_VENDORS names the vendors')
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

from autoslm.errors import FatalWorkerError
from autoslm.layout import PodEnv, RunPaths


@dataclass(frozen=True)
class WorkerContext:
    spec_json: str
    run_id: str
    seed: int
    store_uri: str
    deadline: float | None
    attempt: int
    home: Path
    workdir: Path
    prefetch_s: float | None = None
    spent_usd: float = 0.0
    price_per_hour: float | None = None
    billed_from: float | None = None

    @classmethod
    def from_env(cls, environ: dict[str, str] | None = None) -> "WorkerContext":
        env = os.environ if environ is None else environ
        missing = [k for k in ("AUTOSLM_JOBSPEC", "AUTOSLM_RUN_ID", "AUTOSLM_STORE") if not env.get(k)]
        if missing:
            raise FatalWorkerError(
                f"the worker needs {', '.join(missing)} in its environment",
                hint="start runs with `autoslm launch SPEC`, which sets them",
            )
        try:
            pod = PodEnv.from_env(env)
        except ValueError as e:
            raise FatalWorkerError(f"bad environment: {e}") from None
        seed, attempt, deadline = pod.seed, pod.attempt, pod.deadline
        home = Path(env.get("AUTOSLM_HOME") or Path.home() / ".autoslm").expanduser()
        run_id = env["AUTOSLM_RUN_ID"]
        workdir = Path(env["AUTOSLM_WORKDIR"]) if env.get("AUTOSLM_WORKDIR") else None
        if workdir is None:
            workdir = Path(tempfile.mkdtemp(prefix=f"autoslm-{run_id}-s{seed}-"))
        try:
            prefetch_s = float(env["AUTOSLM_PREFETCH_S"]) if env.get("AUTOSLM_PREFETCH_S") else None
        except ValueError:
            prefetch_s = None
        return cls(
            env["AUTOSLM_JOBSPEC"],
            run_id,
            seed,
            env["AUTOSLM_STORE"],
            deadline,
            attempt,
            home,
            workdir,
            prefetch_s,
            spent_usd=pod.spent_usd,
            price_per_hour=pod.price_per_hour,
            billed_from=pod.billed_from,
        )

    def paths(self, phase: str) -> RunPaths:
        return RunPaths(phase, self.run_id, self.seed)
