"""What the catalog says about a whole spec: vLLM's share of each GPU it names (``vllm_share_issues``,
from the planner's ``fit_report``) and the one line ``autoslm plan`` prints about the pod's recipe
(``recipe_summary``).

They sit here, above ``autoslm.recipes``, because they need the catalog's tables and memory model:
``recipes`` holds the rules a run follows and must never import the catalog (tests/unit/test_layers.py).
It must never touch the network, the filesystem or torch.
"""

from __future__ import annotations

from autoslm.catalog.fit import fit_report
from autoslm.catalog.gpus import gpu_info
from autoslm.catalog.memory import VLLM_KV_WARN, quant_tier
from autoslm.catalog.models import model_info
from autoslm.recipes.generation import vllm_usable


def vllm_share_issues(spec, model_info, *, allow_sleep: bool = True) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    """(errors, warnings) as (field, message) about vLLM's share on each GPU of ``compute.gpu`` the catalog
    knows, from the planner's one answer (``catalog.fit_report``, at the micro-batch the pod would run).
    A share the user set (a number): vLLM would refuse to start where it leaves KV room for less than one
    ``max_model_len`` request (an error when that is every GPU named, else a warning: the planner leaves
    those out). Set or "auto": where the KV room holds less than ``VLLM_KV_WARN`` of a step's rollouts, it
    decodes each step in several waves (a warning naming them). ``allow_sleep`` False: multi-turn or
    dynamic sampling, for which "auto" never chooses sleep mode."""
    t = spec.train
    errors: list[tuple[str, str]] = []
    warnings: list[tuple[str, str]] = []
    util = t.vllm.gpu_memory_utilization
    if t.method != "grpo" or model_info is None or not vllm_usable(spec, model_info, True, True)[0]:
        return errors, warnings
    field = "train.vllm.gpu_memory_utilization"
    known = [g for g in (gpu_info(name) for name in spec.compute.gpus) if g is not None]
    refused = []
    for g in known:
        fit = fit_report(model_info, g, t, processes=spec.compute.ranks, strategy=spec.compute.strategy, allow_sleep=allow_sleep)
        est = fit.estimate
        if est is None or not est.vllm_gb:
            continue
        fixed = est.vllm_gb - est.vllm_kv_gb
        room = fit.share_gb - fixed
        if util != "auto" and room < est.vllm_kv_gb:
            refused.append(
                f"{util:g} of a {g.name} is {fit.share_gb:.1f} GiB; vLLM needs ~{fixed:.1f} GiB before its KV "
                f"cache, leaving {max(room, 0):.2f} GiB, less than one {est.vllm_kv_gb:.2f} GiB request at max_model_len"
            )
        elif fit.ok and fit.kv_fraction is not None and fit.kv_fraction < VLLM_KV_WARN:
            who = f"{util:g} of a {g.name}" if util != "auto" else f'"auto" on a {g.name} ({fit.vllm_util:g})'
            warnings.append(
                (
                    field,
                    f"{who} leaves vLLM {room:.1f} GiB of KV cache, {fit.kv_fraction:.0%} of the "
                    f"{est.vllm_kv_full_gb:.1f} GiB a step's rollouts need: it decodes each step in ~{fit.waves} waves"
                    + ('; "auto" sizes it to what the card holds beside training' if util != "auto" else ""),
                )
            )
    if refused and len(refused) == len(known):  # no GPU the spec names could start vLLM
        errors += [(field, f'{why}: vLLM would refuse to start; raise it, or set it to "auto"') for why in refused]
    else:  # the planner leaves those GPUs out
        warnings += [(field, f"{why}: vLLM would refuse to start there, so no such GPU is rented") for why in refused]
    return errors, warnings


def recipe_summary(spec) -> str:
    """One line for ``autoslm plan``: the quantization tier and how GRPO rollouts are generated on the
    pod (which has CUDA and vllm). Pure: the CLI imports it without torch."""
    info = model_info(spec.model)
    quant = quant_tier(info or spec.model, spec.train)
    parts = ["4-bit QLoRA" if quant == "4bit" else "bf16 LoRA"]
    if spec.train.method == "grpo":
        vllm, why = vllm_usable(spec, info, True, True)  # the pod has CUDA and vllm
        parts.append(f"rollouts: {why}" if not vllm else "rollouts: colocated vLLM")
    if spec.eval.lm_eval:
        from autoslm.recipes.harness import task_label

        shots = f", {spec.eval.lm_eval_shots}-shot" if spec.eval.lm_eval_shots is not None else ""
        parts.append(
            f"after training, lm-eval {', '.join(map(task_label, spec.eval.lm_eval))}{shots} on the base and the adapter "
            "(its time is in the estimate)"
        )
    return "on the pod: " + "; ".join(parts)
