"""How GRPO rollouts are generated (colocated vLLM or transformers), the 4-bit tier, and the limits
colocated vLLM puts on a spec. Pure decisions on the JobSpec and the catalog entry: ``validate`` and
``plan`` use them on the laptop, and the worker's GPU configuration (engine/train/gpu.py) builds on them.
"""

from __future__ import annotations


def use_4bit(spec, model_info) -> bool:
    """The QLoRA tier: asked for explicitly, or "auto" and the catalog says the model needs it."""
    q = getattr(spec.train, "quantization", "none")
    if q == "4bit":
        return True
    return q == "auto" and model_info is not None and getattr(model_info, "quant", "none") == "4bit"


def vllm_usable(spec, model_info, has_cuda: bool, has_vllm: bool, multi_turn: bool = False) -> tuple[bool, str]:
    """(use vLLM?, why) for GRPO generation. Multi-turn episodes drive the same colocated engine turn
    by turn (``engine/rollout/multiturn.py``). The 4-bit tier never does: vLLM 0.31 has no bitsandbytes method,
    and TRL's weight sync cannot push 4-bit layers into it."""
    if not has_cuda:
        return False, "no CUDA: generating with transformers"
    if not has_vllm:
        return False, "vllm is not installed: generating with transformers (slower)"
    if model_info is not None and not model_info.vllm_ok:
        return False, f"vLLM cannot serve {model_info.id}: generating with transformers"
    if use_4bit(spec, model_info):
        return False, "4-bit QLoRA: vLLM cannot load bitsandbytes weights, generating with transformers"
    if multi_turn:
        return True, "colocated vLLM, driven turn by turn for multi-turn episodes"
    return True, "colocated vLLM"


# TRL 1.16 starts colocated vLLM with max_num_batched_tokens=4096 and max_num_seqs = the completions one
# process generates per step; vLLM refuses to start when max_num_seqs exceeds max_num_batched_tokens.
VLLM_MAX_BATCHED_TOKENS = 4096


def vllm_spec_issues(spec, model_info) -> list[tuple[str, str]]:
    """(field, message) for GRPO settings colocated vLLM would reject on a GPU; checked by ``validate``."""
    t = spec.train
    if t.method != "grpo":
        return []
    out = []
    if t.vllm.max_model_len is not None and t.vllm.max_model_len < t.max_length:
        out.append(("train.vllm.max_model_len",
                    f"{t.vllm.max_model_len} is shorter than train.max_length = {t.max_length}: vLLM could not hold a "
                    f"whole prompt and completion; set it to at least {t.max_length}, or leave it unset"))
    servable = (model_info is None or model_info.vllm_ok) and not use_4bit(spec, model_info)
    procs = max(1, spec.compute.gpu_count)  # one training process per GPU
    per_process = t.prompts_per_step * t.group_size // procs
    if servable and per_process > VLLM_MAX_BATCHED_TOKENS:
        most = VLLM_MAX_BATCHED_TOKENS * procs // t.group_size
        out.append(("train.prompts_per_step",
                    f"{t.prompts_per_step} prompts x {t.group_size} completions = {per_process} sequences per process per "
                    f"step, beyond colocated vLLM's batch of {VLLM_MAX_BATCHED_TOKENS}: use at most {most} prompts per step"))
    return out


def recipe_summary(spec) -> str:
    """One line for ``autoslm plan``: the quantization tier and how GRPO rollouts are generated on the
    pod (which has CUDA and vllm). Pure: the CLI imports it without torch."""
    from autoslm.catalog import model_info, quant_tier

    info = model_info(spec.model)
    quant = quant_tier(info or spec.model, spec.train)
    parts = ["4-bit QLoRA" if quant == "4bit" else "bf16 LoRA"]
    if spec.train.method == "grpo":
        vllm, why = vllm_usable(spec, info, True, True)
        parts.append(f"rollouts: {why}" if not vllm else "rollouts: colocated vLLM")
    return "on the pod: " + "; ".join(parts)
