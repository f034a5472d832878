"""Which trained adapter ``RUN[@STEP]`` names, checked in its store: a succeeded run's final adapter, or a
kept checkpoint's, with its rank and the LoRA module's name. What `autoslm serve` serves and `autoslm
export` converts (``find_source``). It reads the registry and the store, and changes nothing.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING

from autoslm.controller.state import RunState, run_state
from autoslm.errors import UsageError

if TYPE_CHECKING:
    from autoslm.spec import JobSpec


@dataclass(frozen=True)
class Source:
    """A run's final adapter or one of its kept checkpoints, where it lies."""

    run_id: str
    spec: JobSpec  # the trained run's
    store_uri: str
    adapter_path: str
    step: int | None
    rank: int
    lora_name: str


def split_ref(ref: str) -> tuple[str, int | None]:
    """RUN[@STEP] -> (run, step)."""
    run, at, step = ref.partition("@")
    if not at:
        return ref, None
    if not step.isdigit():
        raise UsageError(
            f"{ref!r}: the part after @ must be a checkpoint's step number",
            hint="e.g. RUN@200; `autoslm status RUN` shows the run",
        )
    return run, int(step)


def find_source(client, ref: str, verb: str = "serve") -> Source:
    """The adapter ``ref`` names, checked in its store: the final one of a succeeded run, or a kept checkpoint's.
    ``verb`` is what the command does with it (serve, export), for its messages."""
    from autoslm.layout import RunPaths
    from autoslm.store.artifacts import RunArtifacts

    run_ref, step = split_ref(ref)
    run = client.resolve(run_ref)
    replicas = client.registry.replicas(run.run_id)
    if run.spec.kind == "serve":
        raise UsageError(
            f"run {run.run_id} is itself a serve (of run {run.spec.adapter.source_run})", hint=f"{verb} the trained run"
        )
    art = RunArtifacts(client.stores(run.store_uri), RunPaths(run.phase, run.run_id, replicas[0].seed))
    if step is None:
        path, name = _final_adapter(run, replicas, art, verb), run.name
    else:
        path, name = _kept_checkpoint(run, art, step), f"{run.name}-step{step}"
    raw = client.stores(run.store_uri).read_bytes(f"{path}/adapter_config.json")
    try:
        config = json.loads(raw) if raw else None
    except ValueError:
        config = None
    if not isinstance(config, dict) or not isinstance(config.get("r"), int):
        raise UsageError(f"run {run.run_id}: no readable adapter_config.json at {path} in {run.store_uri}")
    rank = max([config["r"], *[v for v in (config.get("rank_pattern") or {}).values() if isinstance(v, int)]])
    return Source(run.run_id, run.spec, run.store_uri, path, step, rank, name)


def _final_adapter(run, replicas, art, verb: str) -> str:
    state = run_state(replicas)
    if state != RunState.SUCCEEDED or not art.has_adapter():
        kept = art.list_checkpoints()
        hint = (
            f"{verb} a kept checkpoint: {', '.join(f'{run.run_id}@{s}' for s in kept)}"
            if kept
            else f"`autoslm status {run.run_id}` says where it is"
        )
        raise UsageError(f"run {run.run_id} is {state} and has no adapter to {verb}", hint=hint)
    return art.paths.adapter


def _kept_checkpoint(run, art, step: int) -> str:
    best = art.get_json(art.paths.best_record) or {}
    kept = art.list_checkpoints()
    if step in kept:
        return art.paths.checkpoint(step)
    if best.get("step") == step:
        return art.paths.best
    steps = sorted(set(kept) | ({best["step"]} if isinstance(best.get("step"), int) else set()))
    said = ", ".join(map(str, steps)) if steps else "none"
    raise UsageError(
        f"run {run.run_id} kept no checkpoint of step {step} (kept: {said})",
        hint="checkpoints are kept every train.save_every steps, the newest two, and the best with eval.keep_best",
    )
