"""A replica's pod as it is asked for, once per attempt: its name, command, image, environment, deadline,
the port it serves and the GPU wish it is placed by (``pod_request``); the bootstrap start command of a
pod without a published image, a replica's log file, and how late a heartbeat may reach the store.
"""

from __future__ import annotations

import os
from pathlib import Path

from autoslm.controller.podnames import pod_name
from autoslm.controller.registry import RunRecord
from autoslm.layout import ENV_HOME, PodEnv
from autoslm.providers.base import PodRequest, Serving

WORKER_COMMAND = ["python", "-m", "autoslm.engine"]
# Environment variables passed through to a pod when set here: endpoints and the Hub token.
PASS_THROUGH = ("HF_TOKEN", "HF_ENDPOINT", "HF_HUB_DISABLE_XET")


def pod_request(sup, run: RunRecord, seed: int, attempt: int, spent_usd: float | None = None) -> PodRequest:
    """What a replica's pod is created with, whichever provider creates it: its command, image, GPU wish,
    deadline, served port, and environment (the run, the store's keys, the trackers' and the judge's keys
    by name, what the run spent before this pod). Built once per attempt."""
    from autoslm.catalog import default_worker_image  # the catalog loads for a pod being asked for, not to read a run

    spec = run.spec
    env = PodEnv(
        run_id=run.run_id,
        store_uri=run.store_uri,
        spec_json=run.spec_json,
        seed=seed,
        attempt=attempt,
        deadline=run.deadline,
        # What the run cost before this pod: the in-pod watchdog keeps the rest under limits.max_usd.
        spent_usd=spent_usd if spent_usd is not None else sum(x.cost_usd for x in sup.registry.replicas(run.run_id)),
        billed_from=sup.clock(),  # the launch bills from its intent, written right after this
    ).to_env()  # the provider adds the price (AUTOSLM_PRICE_PER_HOUR): only it knows the offer
    env["PYTHONUNBUFFERED"] = "1"
    if spec.compute.is_local:
        env[ENV_HOME] = str(sup.home)
    for name in PASS_THROUGH:
        if os.environ.get(name):
            env[name] = os.environ[name]
    if run.store_uri.startswith("hf://") and "HF_TOKEN" not in env:
        token = _hub_login_token()
        if token:
            env["HF_TOKEN"] = token
    from autoslm.controller.tracker_env import pod_env

    if spec.kind == "train":  # a serve reports to no tracker and asks no judge
        env.update(pod_env(spec.train.report_to))  # tracker keys, by name from this environment
        judge = spec.environment.judge
        if judge is not None and judge.api_key_env and os.environ.get(judge.api_key_env):
            env[judge.api_key_env] = os.environ[judge.api_key_env]
    command, image, bootstrap = list(WORKER_COMMAND), spec.compute.image, False
    if not spec.compute.is_local and image in ("auto", "bootstrap", None):
        # "auto" is decided at launch (sdk.prepare); an undecided one (a run recorded before
        # bootstrap existed, whose published image may not exist) starts the way that works anyway.
        command, image, bootstrap = _bootstrap_command(sup, run), None, True
    from autoslm.controller.placement import gpu_wish

    return PodRequest(
        name=pod_name(sup.home_id, run.run_id, seed, attempt),
        command=command,
        env=env,
        wish=gpu_wish(spec.compute),
        image=image or default_worker_image(),
        bootstrap=bootstrap,
        deadline=run.deadline,
        serving=Serving((spec.port,)) if spec.kind == "serve" else None,
        log_path=str(log_path(sup.home, run.run_id, seed)),
    )


def _bootstrap_command(sup, run: RunRecord) -> list[str]:
    """worker_image/boot.sh with autoslm's wheel, shipped into the run's store once per content."""
    from autoslm.controller.images import boot_command, wants_vllm
    from autoslm.controller.wheel import ship_wheel

    ref = ship_wheel(sup.store(run.store_uri), sup.home / "wheels")
    return boot_command(ref, list(WORKER_COMMAND), vllm=wants_vllm(run.spec))


def store_lag_s(spec) -> float:
    """How late a heartbeat may reach the store: the worker commits at most ``commits_per_hour`` times
    an hour to a Hub repo, so a fresh heartbeat may wait one commit interval before anyone can read it."""
    if spec.artifacts.store != "hf":
        return 0.0
    return 3600.0 / spec.artifacts.commits_per_hour


def log_path(home: Path, run_id: str, seed: int) -> Path:
    return Path(home) / "logs" / run_id / f"seed{seed}.log"


def _hub_login_token() -> str | None:
    try:
        from huggingface_hub import get_token

        return get_token()
    except Exception:  # noqa: BLE001 - no login is fine: the store will say what is missing
        return None
