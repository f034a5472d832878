"""How GRPO rollouts are generated (colocated vLLM or transformers), the 4-bit tier, and the limits
colocated vLLM puts on a spec. Pure decisions on the JobSpec and the catalog entry: ``validate`` and
``plan`` use them on the laptop, and the worker's GPU configuration (engine/train/gpu.py) builds on them.
``sleep_allowed`` is the one answer to whether "auto" may put vLLM to sleep; ``vllm_lora_rank`` the one
``--max-lora-rank`` vLLM is given for an adapter (lm-eval's vllm model, ``serve``, the model card's
usage), and ``lora_rank_issues`` where ``validate`` refuses a rank vLLM cannot load.

The catalog entry comes in as an argument: this module must never import ``autoslm.catalog``, which
sits above the recipes (what needs the catalog's tables is in ``catalog/spec_checks.py``).
"""

from __future__ import annotations

import re


def use_4bit(spec, model_info) -> bool:
    """The QLoRA tier: asked for explicitly, or "auto" and the catalog says the model needs it."""
    q = spec.train.quantization
    if q == "4bit":
        return True
    return q == "auto" and model_info is not None and getattr(model_info, "quant", "none") == "4bit"


def vllm_usable(spec, model_info, has_cuda: bool, has_vllm: bool, multi_turn: bool = False) -> tuple[bool, str]:
    """(use vLLM?, why) for GRPO generation, from ``train.vllm.enabled``: "auto" = on a CUDA GPU with
    vllm installed; true = wherever vllm is installed, a CPU included (vLLM's CPU build); false = never.
    Multi-turn episodes drive the same colocated engine turn by turn (``engine/rollout/multiturn.py``).
    The 4-bit tier never does: vLLM 0.31 has no bitsandbytes method, and TRL's weight sync cannot push
    4-bit layers into it (``vllm_spec_issues`` rejects ``enabled = true`` there)."""
    enabled = spec.train.vllm.enabled
    if enabled is False:
        return False, "train.vllm.enabled = false: generating with transformers"
    if not has_cuda and enabled == "auto":
        return False, "no CUDA: generating with transformers"
    if not has_vllm:
        return False, "vllm is not installed: generating with transformers (slower)"
    if model_info is not None and not model_info.vllm_ok:
        return False, f"vLLM cannot serve {model_info.id}: generating with transformers"
    if use_4bit(spec, model_info):
        return False, "4-bit QLoRA: vLLM cannot load bitsandbytes weights, generating with transformers"
    where = "" if has_cuda else " on the CPU"
    if multi_turn:
        return True, f"colocated vLLM{where}, driven turn by turn for multi-turn episodes"
    return True, f"colocated vLLM{where}"


# TRL 1.16 starts colocated vLLM with max_num_batched_tokens=4096 and max_num_seqs = the completions one
# process generates per step; vLLM refuses to start when max_num_seqs exceeds max_num_batched_tokens.
VLLM_MAX_BATCHED_TOKENS = 4096


def sleep_allowed(spec, multi_turn: bool) -> bool:
    """Whether "auto" may choose vLLM's sleep mode: the one answer, for ``validate``, ``plan``, the
    planner and the pod. Not for multi-turn episodes or dynamic sampling: they call vLLM's generate
    several times per step (once per turn, once per extra draw), and under sleep mode TRL wakes the
    engine and pushes every weight again at each call. ``multi_turn``: on the laptop,
    ``envs.task_table.is_multi_turn(spec)``; on the pod, the loaded environment's own answer."""
    return not (multi_turn or (spec.train.method == "grpo" and spec.train.dynamic_sampling))


# The ranks vLLM accepts as max_lora_rank (vllm/config/lora.py's MaxLoRARanks, vLLM 0.31): any other
# value fails the engine's start, so an adapter's rank is rounded up to the next of them.
VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)


def vllm_lora_rank(rank: int) -> int:
    """vLLM's ``max_lora_rank`` for an adapter of rank ``rank``: the smallest rank vLLM accepts that holds
    it. Raises ValueError (its message one line) for a rank above the largest, 512."""
    for allowed in VLLM_LORA_RANKS:
        if allowed >= rank:
            return allowed
    raise ValueError(f"LoRA rank {rank} is above {VLLM_LORA_RANKS[-1]}, the largest rank vLLM loads (max_lora_rank)")


def lora_rank_issues(spec) -> list[tuple[str, str]]:
    """(field, message) when vLLM would score a trained adapter it cannot load: lm-eval's vllm model runs
    on a rented GPU pod (``[eval] lm_eval``). A serve's own rank is checked by its field (``ServedAdapter.lora_rank``)."""
    rank = spec.train.lora_rank
    if not spec.eval.lm_eval or spec.compute.is_local or rank <= VLLM_LORA_RANKS[-1]:
        return []
    return [
        (
            "train.lora_rank",
            f"{rank} is above {VLLM_LORA_RANKS[-1]}, the largest LoRA rank vLLM loads, and eval.lm_eval scores the "
            f"adapter with vLLM on the GPU: use lora_rank = {VLLM_LORA_RANKS[-1]} or less, or remove eval.lm_eval",
        )
    ]


def vllm_spec_issues(spec, model_info) -> list[tuple[str, str]]:
    """(field, message) for GRPO settings colocated vLLM would reject on a GPU; checked by ``validate``."""
    t = spec.train
    if t.method != "grpo":
        return []
    out = []
    if t.vllm.max_model_len is not None and t.vllm.max_model_len < t.max_length:
        out.append(
            (
                "train.vllm.max_model_len",
                f"{t.vllm.max_model_len} is shorter than train.max_length = {t.max_length}: vLLM could not hold a "
                f"whole prompt and completion; set it to at least {t.max_length}, or leave it unset",
            )
        )
    servable = (model_info is None or model_info.vllm_ok) and not use_4bit(spec, model_info)
    if t.vllm.enabled is True and not servable:
        why = "the 4-bit tier" if use_4bit(spec, model_info) else f"{model_info.id}"
        out.append(("train.vllm.enabled", f'true, but vLLM cannot serve {why}: set it to "auto" or false'))
    procs = max(1, spec.compute.ranks)  # one training process per GPU, all pods
    per_process = t.prompts_per_step * t.group_size // procs
    if servable and per_process > VLLM_MAX_BATCHED_TOKENS:
        most = VLLM_MAX_BATCHED_TOKENS * procs // t.group_size
        out.append(
            (
                "train.prompts_per_step",
                f"{t.prompts_per_step} prompts x {t.group_size} completions = {per_process} sequences per process per "
                f"step, beyond colocated vLLM's batch of {VLLM_MAX_BATCHED_TOKENS}: use at most {most} prompts per step",
            )
        )
    return out


def fsdp_spec_issues(spec, model_info) -> list[tuple[str, str]]:
    """(field, message) for what FSDP cannot do here; checked by ``validate``. FSDP2 leaves bitsandbytes'
    4-bit weights out of sharding (accelerate's fsdp_utils), so every GPU would hold a whole copy: no
    saving, only risk. And TRL's weight sync into colocated vLLM gathers sharded tensors, a collective
    (TRL marks it untested with FSDP), on every generate call under sleep mode: ranks playing different
    numbers of turns or draws would hang."""
    if spec.compute.gpu_count <= 1 or spec.compute.strategy != "fsdp":
        return []
    out = []
    if use_4bit(spec, model_info):
        out.append(
            (
                "compute.strategy",
                "FSDP cannot shard 4-bit (bitsandbytes) weights: every GPU would hold them all; "
                'use compute.strategy = "ddp", or train.quantization = "none" to shard bf16 weights',
            )
        )
    elif spec.train.method == "grpo" and vllm_usable(spec, model_info, True, True)[0]:
        out.append(
            (
                "compute.strategy",
                "GRPO with colocated vLLM is not supported under FSDP (the weight sync into vLLM "
                'is untested upstream and can hang when ranks generate unequally); use compute.strategy = "ddp"',
            )
        )
    return out


# The modules a tied model shares one matrix between: the head, and the input embedding under the names the
# catalog's architectures give it (a vision-language checkpoint nests its language model one level down).
_TIED_MODULES = ("lm_head", "model.embed_tokens", "model.language_model.embed_tokens", "language_model.model.embed_tokens")


def tied_targets(targets) -> list[str]:
    """The entries of ``train.lora_targets`` that put LoRA on the head or the input embedding, matched as peft
    matches them: a list entry is a module name or its last dotted parts, a string other than "all-linear"
    (which leaves the head out) a regular expression on the whole name."""
    if isinstance(targets, str):
        if targets == "all-linear":
            return []
        try:
            pattern = re.compile(targets)
        except re.error:
            return []
        return [targets] if any(pattern.fullmatch(n) for n in _TIED_MODULES) else []
    return [t for t in targets if any(n == t or n.endswith("." + t) for n in _TIED_MODULES)]


def tied_lora_message(targets, hits: list[str], model: str) -> str:
    """The one line that refuses LoRA on a tied matrix while vLLM generates: what, why, what to do."""
    shown = targets if isinstance(targets, str) else "[" + ", ".join(f'"{t}"' for t in targets) + "]"
    named = ", ".join(hits)
    return (
        f"{shown} puts LoRA on {named}, but {model} ties lm_head to its input embeddings: the weight push to "
        f"colocated vLLM sends that one matrix once, so rollouts, evaluations and keep_best would come from a "
        f"model without that update; drop {named} from train.lora_targets, or set train.vllm.enabled = false"
    )


def tied_lora_issues(spec, model_info, has_vllm: bool = True) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    """(errors, warnings) as (field, message): LoRA on the head or the input embedding of a model that ties
    them, in a GRPO run that may generate with vLLM (``vllm_usable`` with CUDA, as on a pod; ``has_vllm``:
    whether the worker's Python has vllm, False for a local run in a Python without it).
    peft trains the head's update apart from the embedding's, but the tied matrix is one parameter under
    the embedding's name, so what vLLM gets is not what was trained. A model the catalog does not know is
    a warning: the worker checks the loaded model itself and stops before training (engine/train/grpo.py)."""
    t = spec.train
    hits = tied_targets(t.lora_targets) if t.method == "grpo" else []
    if not hits or not vllm_usable(spec, model_info, True, has_vllm)[0]:
        return [], []
    if model_info is not None and model_info.tied is not None:
        errors = [("train.lora_targets", tied_lora_message(t.lora_targets, hits, spec.model))] if model_info.tied else []
        return errors, []
    return [], [
        (
            "train.lora_targets",
            f"puts LoRA on {', '.join(hits)}; whether {spec.model} ties lm_head to its input "
            "embeddings is known only once it is loaded: the worker stops before training if it does (vLLM "
            "would not get that update); set train.vllm.enabled = false to train it either way",
        )
    ]
