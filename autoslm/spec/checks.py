"""The JobSpec's checks across sections, and the facts about a spec that `validate`, `plan` and the
controller ask for: batch sizes against the GPUs, vLLM's share of the card, a cloud run's store and
model, the Hub's commit budget against the heartbeat timeout, the evaluation, and the fields a
provider does not read. Each check returns (field, message) pairs; nothing here rents or downloads.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING

from autoslm.errors import SpecIssue

if TYPE_CHECKING:
    from autoslm.spec.models import JobSpec


def unused_fields(spec: JobSpec) -> list[tuple[str, str]]:
    """Fields the JobSpec sets that none of its providers reads: a vendor's options where the run does
    not use that vendor, then each vendor's ``Capabilities.not_applicable``: (field, why), for `validate`
    and `plan` to say instead of ignoring them silently. A field one provider of a failover list reads is used."""
    out = unused_options(spec.compute)
    vendors = [spec.compute.vendors[n] for n in spec.compute.providers]
    for field in dict.fromkeys(f for v in vendors for f in v.capabilities.not_applicable):
        section, _, key = field.partition(".")
        part = getattr(spec, section, None)
        if part is None or key not in part.model_fields_set or not all(field in v.capabilities.not_applicable for v in vendors):
            continue
        out.append((field, "not used here: " + "; ".join(dict.fromkeys(v.capabilities.not_applicable[field] for v in vendors))))
    return out


def unused_options(compute) -> list[tuple[str, str]]:
    """The options written for a vendor the run does not use (``compute.options.<vendor>``, or an option's
    top-level name where it was written so: ``compute.cloud``), each named where it was written."""
    out = []
    for name, options in compute.options.items():
        if name in compute.providers:
            continue
        vendor = compute.vendors[name]
        why = f"not used here: only {vendor.title} reads it, and the run does not use {vendor.title}"
        written = [key for key in type(options).model_fields if key in options.model_fields_set]
        out += [(compute.written_at(name, key), why) for key in written] or [(f"compute.options.{name}", why)]
    return out


def min_heartbeat_timeout_s(commits_per_hour: int) -> int:
    """The shortest heartbeat timeout a Hub store's commit budget can meet: the worker's uploader
    commits about once every 3600/commits_per_hour seconds; a heartbeat may wait one interval behind
    the last commit and one behind a checkpoint that took the turn, and its own commit takes time.
    Three intervals (180 s at the default 60 an hour)."""
    return math.ceil(3 * 3600 / commits_per_hour)


def worker_may_have_vllm(spec: JobSpec) -> bool:
    """Whether the worker's Python may have vllm: a pod's does; a local run's worker is this Python."""
    import importlib.util

    return not spec.compute.is_local or importlib.util.find_spec("vllm") is not None


def semantic_issues(spec: JobSpec, fname: str, base_dir: Path | None = None) -> list[SpecIssue]:
    """Checks that need more than one field, or the local filesystem; all found at once. ``base_dir``:
    the folder holding the spec file (reward files must be inside it)."""
    from autoslm.catalog import model_info
    from autoslm.envs.task_table import check_environment, check_rewards
    from autoslm.recipes.evaluation import eval_spec_issues
    from autoslm.recipes.generation import fsdp_spec_issues

    found = [*check_environment(spec), *check_rewards(spec, base_dir), *_batch_issues(spec)]
    found += fsdp_spec_issues(spec, model_info(spec.model))
    if spec.train.method == "grpo":
        found += _generation_issues(spec)
    found += _cloud_issues(spec) + _heartbeat_issues(spec)
    found += eval_spec_issues(spec.eval, spec.train, spec.compute)
    if spec.eval.lm_eval:
        from autoslm.envs.lm_tasks import task_issues
        from autoslm.recipes.generation import lora_rank_issues

        found += lora_rank_issues(spec)

        found += task_issues(spec.eval.lm_eval, remote=None if spec.compute.is_local else "/".join(spec.compute.providers))
    if spec.train.method == "sft" and spec.environment.judge is not None:
        found.append(("environment.judge", "a judge scores GRPO completions; remove it for SFT"))
    return [SpecIssue(fname, f, m) for f, m in found]


def _batch_issues(spec: JobSpec) -> list[tuple[str, str]]:
    """The batch sizes split over the training processes, one per GPU."""
    from autoslm.recipes.batching import BatchingError, plan_grpo_batches, plan_sft_batches

    out = []
    procs = spec.compute.ranks  # one training process per GPU of every pod: batch sizes are split over them
    written = spec.compute.ranks_written
    asked = spec.train.num_processes if spec.train.method == "grpo" else None  # GRPO's alone
    if asked is not None and asked != procs:
        out.append(
            (
                "train.num_processes",
                f"{asked} disagrees with {written}: the number of training processes is that; remove train.num_processes",
            )
        )
    try:
        if spec.train.method == "grpo":
            plan_grpo_batches(spec.train, procs, written=written)
        else:
            plan_sft_batches(spec.train, procs, written=written)
    except BatchingError as e:
        out.append((e.field, str(e)))
    return out


def _generation_issues(spec: JobSpec) -> list[tuple[str, str]]:
    """GRPO's generation: vLLM against the model and the card, tied LoRA weights, the context, and a
    local run asking for a vLLM this Python does not have."""
    from autoslm.catalog import model_info
    from autoslm.catalog.spec_checks import vllm_share_issues
    from autoslm.envs.context import context_issues, turn_weight_issues
    from autoslm.envs.task_table import is_multi_turn
    from autoslm.recipes.generation import sleep_allowed, tied_lora_issues, vllm_spec_issues

    info = model_info(spec.model)
    out = list(vllm_spec_issues(spec, info))
    out += tied_lora_issues(spec, info, worker_may_have_vllm(spec))[0]
    allow = sleep_allowed(spec, is_multi_turn(spec))
    out += vllm_share_issues(spec, info, allow_sleep=allow)[0]
    out += context_issues(spec)[0] + turn_weight_issues(spec)
    if spec.compute.is_local and spec.train.vllm.enabled is True:
        import importlib.util

        if importlib.util.find_spec("vllm") is None:  # a local run's worker uses this Python
            out.append(
                (
                    "train.vllm.enabled",
                    "true, but vllm is not installed in this Python, which runs "
                    "the local worker: use an environment with vLLM (make setup-vllm builds .venv-vllm "
                    'with its CPU build), or set it to "auto"',
                )
            )
    return out


def _cloud_issues(spec: JobSpec) -> list[tuple[str, str]]:
    """A pod's own disk dies with the pod: the laptop would see no heartbeat and lose the adapter."""
    if spec.compute.is_local:
        return []
    out = []
    cloud = "/".join(spec.compute.providers)
    if spec.artifacts.store == "local":
        out.append(
            (
                "artifacts.store",
                f"a local store cannot be reached from a {cloud} pod: "
                'use store = "hf" with repo = "owner/name" (a Hugging Face dataset repo)',
            )
        )
    if spec.model.startswith(("/", "./", "~")):
        out.append(
            ("model", f"a local model path does not reach a {cloud} pod: push the model to the Hub and name it as owner/name")
        )
    return out


def _heartbeat_issues(spec: JobSpec) -> list[tuple[str, str]]:
    """A Hub store's commit budget against the heartbeat timeout."""
    if spec.artifacts.store != "hf":
        return []
    least = min_heartbeat_timeout_s(spec.artifacts.commits_per_hour)
    if spec.limits.heartbeat_timeout_s >= least:
        return []
    every = 3600 / spec.artifacts.commits_per_hour
    return [
        (
            "limits.heartbeat_timeout_s",
            f"{spec.limits.heartbeat_timeout_s:g} is shorter than the Hub store can deliver heartbeats: with "
            f"artifacts.commits_per_hour = {spec.artifacts.commits_per_hour} the worker commits one about every {every:.0f}s "
            f"(a checkpoint may take a turn), so a healthy pod would be killed; use at least {least}",
        )
    ]
