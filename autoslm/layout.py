"""The artifact layout and the heartbeat/event schema: the contract between worker and controller.

A run's artifacts live under ``<phase>/<run_id>/seed<N>/`` in the store. Local data files a spec names
(a ``jsonl:`` dataset, an ``eval_path``) are shipped at launch to ``data/sha256/<hex>`` in the same
store, named by the sha256 of their bytes: the same content goes up once and is shared by every run in
the store. This module only names paths and defines the records; it does no I/O and must stay
importable without torch.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from autoslm.errors import UsageError

CHECKPOINT_RE = re.compile(r"^checkpoint-(\d+)$")
# Written last into every checkpoint: names each file with its size and sha256. A checkpoint without a
# valid manifest is partial or corrupt and is skipped on resume.
CHECKPOINT_MANIFEST = "autoslm_manifest.json"
# Written last into ``best/`` (keep_best): which evaluation the adapter beside it is from, its score, the
# attempt that made it, and each file's size and sha256. Without a valid one the folder is not trusted.
BEST_RECORD = "autoslm_best.json"

DATA_PREFIX = "data/sha256"
_SHA256 = re.compile(r"^[0-9a-f]{64}$")

Stage = Literal["setup", "loading", "training", "saving", "uploading", "done", "error"]


@dataclass(frozen=True)
class RunPaths:
    """Store-relative paths of one replica (one seed) of one run."""

    phase: str
    run_id: str
    seed: int

    @property
    def prefix(self) -> str:
        return f"{self.phase}/{self.run_id}/seed{self.seed}"

    def _p(self, name: str) -> str:
        return f"{self.prefix}/{name}"

    @property
    def heartbeat(self) -> str:
        return self._p("heartbeat.json")

    @property
    def events(self) -> str:
        return self._p("events.jsonl")

    @property
    def checkpoints(self) -> str:
        return self._p("checkpoint")

    def checkpoint(self, step: int) -> str:
        return f"{self.checkpoints}/checkpoint-{step}"

    @property
    def adapter(self) -> str:
        return self._p("adapter")

    @property
    def export(self) -> str:
        """`autoslm export --on`: the files an export run wrote (merged weights, a GGUF and its Modelfile)."""
        return self._p("export")

    @property
    def best(self) -> str:
        """keep_best: the adapter of the best evaluation so far, kept across attempts."""
        return self._p("best")

    @property
    def best_record(self) -> str:
        return f"{self.best}/{BEST_RECORD}"

    @property
    def metrics(self) -> str:
        return self._p("metrics.json")

    @property
    def train_meta(self) -> str:
        return self._p("train_meta.json")

    @property
    def done(self) -> str:
        return self._p("DONE")

    @property
    def error(self) -> str:
        return self._p(f"error_{self.phase}.txt")

    @property
    def rollouts(self) -> str:
        return self._p("rollouts.jsonl")

    @classmethod
    def parse(cls, prefix: str) -> "RunPaths":
        """Inverse of ``prefix``: ``"sft/run-1/seed0"`` -> RunPaths("sft", "run-1", 0)."""
        parts = prefix.strip("/").split("/")
        if len(parts) != 3 or not parts[2].startswith("seed") or not parts[2][4:].isdigit():
            raise ValueError(f"not a run prefix (want <phase>/<run_id>/seed<N>): {prefix!r}")
        return cls(parts[0], parts[1], int(parts[2][4:]))


class Heartbeat(BaseModel):
    """The worker's latest word on where it is. Newest wins; older beats may be dropped."""

    model_config = ConfigDict(extra="allow")

    run_id: str
    seed: int
    phase: str
    stage: Stage
    time: float = Field(default_factory=time.time, description="unix seconds when written")
    step: int = 0
    total_steps: int = 0
    loss: float | None = None
    learning_rate: float | None = None
    tokens_per_s: float | None = None
    metrics: dict[str, float] = Field(default_factory=dict, description="latest per-step metrics")
    message: str | None = None
    error: str | None = None
    retryable: bool | None = None
    gpu: dict[str, Any] | None = Field(default=None, description="GPU diagnostics, on error heartbeats")
    attempt: int = Field(default=1, description="how many times a worker has started on this replica")
    # Added fields are optional: a reader that does not know them ignores them (extra="allow"), and
    # ``stage`` keeps to the words above, which every reader parses.
    activity: str | None = Field(
        default=None,
        description='what the worker does within its stage: "evaluating" (a held-out evaluation, each batch of it beating as '
        'training steps do); "lm_eval" under "done" (``HARNESS_ACTIVITY``): the run is handed back (DONE is written) and '
        "lm-evaluation-harness runs on its pod, which stays until the harness ends or the run's limit",
    )
    progress: tuple[int, int] | None = Field(default=None, description="with activity: (done, total) of its rows")
    limit: str | None = Field(
        default=None,
        description='the limit ("max_hours" or "max_usd") training stopped before, '
        "once it did: the worker is saving what it learned, and the run ends naming that limit",
    )


class Event(BaseModel):
    """One line of events.jsonl: something that happened, in order."""

    model_config = ConfigDict(extra="allow")

    time: float = Field(default_factory=time.time)
    kind: str
    step: int | None = None
    data: dict[str, Any] = Field(default_factory=dict)


def data_blob(sha256: str) -> str:
    """Store path of a shipped data file, by the sha256 (hex) of its bytes."""
    if not _SHA256.match(sha256):
        raise ValueError(f"not a sha256 hex digest: {sha256!r}")
    return f"{DATA_PREFIX}/{sha256}"


def checkpoint_step(name: str) -> int | None:
    m = CHECKPOINT_RE.match(name)
    return int(m.group(1)) if m else None


# ---------------------------------------------------------------------------------------------------
# References: a shipped data file (``store:<hex>/<name>``) and a run seen through its store
# (``hf://owner/repo/<phase>/<run_id>[/seed<N>]``).

STORE_REF = "store:"


def is_store_ref(ref: str) -> bool:
    return isinstance(ref, str) and ref.startswith(STORE_REF)


def store_ref(sha256: str, name: str) -> str:
    return f"{STORE_REF}{sha256}/{name}"


# The heartbeat's ``activity`` while lm-evaluation-harness runs after the hand-back (stage "done", DONE
# written): the controller leaves the pod to it until it ends or the run's time or money limit passes.
HARNESS_ACTIVITY = "lm_eval"

# A serve's heartbeat message while its server answers: "serving <OpenAI base URL> (model <name>)".
SERVING_PREFIX = "serving "


def endpoint_of(message: str | None) -> str | None:
    """The OpenAI base URL a serve's heartbeat message names, or None."""
    if message and message.startswith(SERVING_PREFIX):
        return message[len(SERVING_PREFIX) :].split()[0]
    return None


def adapter_location(store_uri: str, paths: RunPaths) -> str:
    """Where a run's adapter lies: a local path for a ``file://`` store, else a store URI."""
    if store_uri.startswith("file://"):
        from urllib.parse import unquote, urlparse

        return str(Path(unquote(urlparse(store_uri).path)) / paths.adapter)
    return f"{store_uri.rstrip('/')}/{paths.adapter}"


def parse_remote(ref: str) -> tuple[str, RunPaths]:
    """``hf://owner/repo/<phase>/<run_id>[/seed<N>]`` -> (store uri, paths)."""
    parts = ref[len("hf://") :].strip("/").split("/")
    if len(parts) < 4:
        raise UsageError(f"{ref!r}: want hf://owner/repo/<phase>/<run_id>[/seed<N>]")
    seed = 0
    if len(parts) >= 5:
        if not parts[4].startswith("seed") or not parts[4][4:].isdigit():
            raise UsageError(f"{ref!r}: the last part must be seed<N>")
        seed = int(parts[4][4:])
    return f"hf://{parts[0]}/{parts[1]}", RunPaths(parts[2], parts[3], seed)


def tracker_urls(events: list[dict]) -> dict[str, str]:
    """Tracker name -> run URL, from the "tracker" events the worker wrote (as dicts)."""
    return {
        (e.get("data") or {}).get("name", "?"): (e.get("data") or {}).get("url", "") for e in events if e.get("kind") == "tracker"
    }


# -- the worker <-> controller environment --------------------------------------------------------
# The controller (``controller/supervisor.py``, and the provider for the price) writes these into a
# pod's environment; the pod (``engine/pod/context.py``, ``watchdog.py``, ``boot.py``, ``prefetch.py``)
# reads them through ``PodEnv``, with one set of defaults.
ENV_JOBSPEC = "AUTOSLM_JOBSPEC"  # the JobSpec as JSON
ENV_RUN_ID = "AUTOSLM_RUN_ID"
ENV_SEED = "AUTOSLM_SEED"  # which replica (default 0)
ENV_STORE = "AUTOSLM_STORE"  # the artifact store URI
ENV_DEADLINE = "AUTOSLM_DEADLINE"  # unix time after which the run must stop
ENV_ATTEMPT = "AUTOSLM_ATTEMPT"  # 1 for the first launch, n for the n-th (default 1)
ENV_SPENT_USD = "AUTOSLM_SPENT_USD"  # what the run cost before this pod
ENV_PRICE_PER_HOUR = "AUTOSLM_PRICE_PER_HOUR"  # this pod's price, written by the provider that placed it
ENV_BILLED_FROM = "AUTOSLM_BILLED_FROM"  # unix time the controller bills this pod from (its create)
# The limits a run can end at with what it learned handed back (the worker's own stop, or the
# controller's and the watchdog's end with the newest checkpoint's adapter): their JobSpec names.
LIMIT_HOURS, LIMIT_USD = "max_hours", "max_usd"
ENV_HOME = "AUTOSLM_HOME"  # local runs only: the controller's home (built-in models' cache on a pod)


@dataclass(frozen=True)
class PodEnv:
    """What the controller tells a pod. ``to_env`` on the controller side, ``from_env`` on the pod."""

    run_id: str
    store_uri: str
    spec_json: str = "{}"
    seed: int = 0
    attempt: int = 1
    deadline: float | None = None
    spent_usd: float = 0.0
    price_per_hour: float | None = None
    billed_from: float | None = None

    def to_env(self) -> dict[str, str]:
        env = {
            ENV_JOBSPEC: self.spec_json,
            ENV_RUN_ID: self.run_id,
            ENV_SEED: str(self.seed),
            ENV_STORE: self.store_uri,
            ENV_ATTEMPT: str(self.attempt),
            ENV_SPENT_USD: f"{self.spent_usd:.4f}",
        }
        if self.deadline is not None:
            env[ENV_DEADLINE] = str(self.deadline)
        if self.price_per_hour is not None:
            env[ENV_PRICE_PER_HOUR] = f"{self.price_per_hour:.4f}"
        if self.billed_from is not None:
            env[ENV_BILLED_FROM] = f"{self.billed_from:.3f}"
        return env

    @classmethod
    def from_env(cls, env, *, partial: bool = False) -> "PodEnv | None":
        """The pod's contract, or None outside a run (no store or run id; ``partial``: read what is
        there all the same). Raises ValueError naming a variable that is there but unreadable."""
        if not (env.get(ENV_STORE) and env.get(ENV_RUN_ID)) and not partial:
            return None

        def num(name: str, kind, default):
            text = env.get(name)
            if text in (None, ""):
                return default
            try:
                return kind(text)
            except ValueError:
                raise ValueError(f"{name}={text!r} is not a number") from None

        price = num(ENV_PRICE_PER_HOUR, float, None)
        return cls(
            run_id=env.get(ENV_RUN_ID) or "run",
            store_uri=env.get(ENV_STORE) or "",
            spec_json=env.get(ENV_JOBSPEC) or "{}",
            seed=num(ENV_SEED, int, 0),
            attempt=num(ENV_ATTEMPT, int, 1),
            deadline=num(ENV_DEADLINE, float, None),
            spent_usd=num(ENV_SPENT_USD, float, 0.0),
            price_per_hour=price if price is not None and price >= 0 else None,
            billed_from=num(ENV_BILLED_FROM, float, None),
        )

    @property
    def phase(self) -> str:
        """The run's phase from its JobSpec JSON without validating it (boot and prefetch run before that)."""
        import json

        try:
            spec = json.loads(self.spec_json or "{}")
        except ValueError:
            spec = {}
        return phase_of(spec)


def phase_of(spec) -> str:
    """A run's phase from its JobSpec's fields without validating them (boot, prefetch and a spec that
    does not parse): a serve's ``phase`` (its source run's), a training run's ``train.method``."""
    if not isinstance(spec, dict):
        return "sft"
    return spec.get("phase") or (spec.get("train") or {}).get("method") or "sft"


# The worker's exit codes (``engine/pod/runner.py``), which the controller reads from an exited pod
# (``controller/reconcile.py``). Not the CLI's codes (``errors.py``), though both use 0..3.
WORKER_EXIT_DONE = 0
WORKER_EXIT_RETRYABLE = 1  # a relaunch may fix it
WORKER_EXIT_FATAL = 2  # it never will: the run fails
WORKER_EXIT_SIGTERM = 143  # stopped (preempted, cancelled); resumes from its last checkpoint
