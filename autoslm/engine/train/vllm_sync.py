"""The weights a GRPO run pushes into its colocated vLLM: each LoRA layer's base weight plus its update,
computed into a temporary, so the frozen base weights are never written.

TRL 1.16 (``VLLMGeneration._iter_named_params``) merges the adapter into the base weights in place, reads
them and unmerges. In bf16, W + d - d is not W: each sync leaves rounding behind in the base, and over a
run the base drifts by a large part of the LoRA update itself (TRL issue 6688; 350 syncs of a growing
update moved the built-in model's base by 40-56% of the update's norm). Training, evaluation and keep-best
then see a model nobody downloads: a user gets the adapter, to apply to the pristine base.

``merged_named_params`` yields what TRL's walk yields, same names and order, but a LoRA layer's weight is
``(W in float32 + scale * B @ A)`` cast to W's dtype, one layer's float32 temporary at a time (never a copy
of the model). ``engine.train.trainer.ExactSyncVLLMGeneration`` walks with it under TRL's ``sync_weights``
(this module never touches a TRL object), which keeps everything else:
sleep-mode wake-up, the colocate and server pushes, the prefix-cache reset, and on a CPU host the
layerwise reload around it (``vllm_cpu``). Sharded training (FSDP, DeepSpeed ZeRO-3) keeps TRL's walk,
whose gathers are collectives every rank must join; autoslm refuses FSDP with colocated vLLM anyway
(``recipes.generation.fsdp_spec_issues``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator


def lora_layers(model) -> dict | None:
    """{name of a LoRA layer's base module: the LoRA layer}; None when the model has an adapter layer
    this module cannot merge out of place (another PEFT method, or LoRA on a kind of layer vLLM never
    serves), which then keeps TRL's own merge."""
    from peft.tuners.lora.layer import Embedding, Linear, LoraLayer, _ConvNd
    from peft.tuners.tuners_utils import BaseTunerLayer

    out = {}
    for name, module in model.named_modules():
        if isinstance(module, BaseTunerLayer):
            if not isinstance(module, (Linear, Embedding, _ConvNd)) or not isinstance(module, LoraLayer):
                return None
            out[f"{name}.base_layer"] = module
    return out


def _to_merge(layer) -> list[str]:
    """The adapters peft's ``merge_adapter`` would merge into this layer: active, not merged already."""
    return [
        a for a in layer.active_adapters if a not in layer.merged_adapters and (a in layer.lora_A or a in layer.lora_embedding_A)
    ]


def merged_tensor(layer, leaf: str):
    """The base module's ``leaf`` ("weight" or "bias") with the layer's active adapters added, in a new
    tensor of the base's dtype; the base parameter itself when no adapter changes it."""
    import torch
    from peft.tuners.lora.layer import Linear

    base = getattr(layer.get_base_layer(), leaf)
    adapters = _to_merge(layer)
    if leaf == "bias":
        adapters = [a for a in adapters if layer.lora_bias.get(a)]
    if not adapters:
        return base.data
    with torch.no_grad():
        out = base.detach().to(torch.float32, copy=True)
        for a in adapters:
            if leaf == "bias":
                out += layer.lora_B[a].bias.float() * layer.scaling[a]
            elif a in layer.lora_variant:  # DoRA and the like: their merge is not W + delta
                out = layer.lora_variant[a].merge_safe(layer, a, out)
            elif isinstance(layer, Linear):
                A, B = layer.lora_A[a].weight.float(), layer.lora_B[a].weight.float()
                if layer.fan_in_fan_out:  # W is stored (in, out): add (B @ A)^T
                    out.addmm_(A.T, B.T, alpha=layer.scaling[a])
                else:
                    out.addmm_(B, A, alpha=layer.scaling[a])
            else:
                out += layer.get_delta_weight(a).float()
        return out.to(base.dtype)


def merged_named_params(model, fix_name: Callable[..., str], layers: dict | None = None) -> Iterator[tuple[str, object]]:
    """(name vLLM expects, tensor) for every weight vLLM takes, in TRL's order and under TRL's names (the
    PEFT wrappers' parts of a name dropped, ``fix_name`` being TRL's ``_fix_param_name_to_vllm``), with
    each LoRA layer merged out of place. Each merged tensor is new: the consumer may keep or drop it."""
    layers = lora_layers(model) if layers is None else layers
    skip = getattr(model, "prefix", "lora_")
    for name, param in model.named_parameters():
        vllm_name = name.removeprefix("base_model.model.").replace(".base_layer", "")
        if skip in vllm_name or "original_module" in vllm_name:  # the adapter's own weights; modules_to_save's original
            continue
        vllm_name = fix_name(vllm_name, extra_prefixes=["modules_to_save.default."])
        owner, _, leaf = name.rpartition(".")
        layer = layers.get(owner)
        yield vllm_name, (merged_tensor(layer, leaf) if layer is not None and leaf in ("weight", "bias") else param.data)


def tied_lora_layers(model) -> list[str]:
    """The LoRA layers on the one matrix a tied model shares between its head and its input embedding.
    ``named_parameters()`` yields that matrix once, under the embedding's name, so neither walk (TRL's
    nor ``merged_named_params``) can push both updates: vLLM would generate without what was trained."""
    from peft.tuners.tuners_utils import BaseTunerLayer

    shared = getattr(model.get_input_embeddings(), "weight", None)  # a LoRA layer's .weight is its base's
    head = model.get_output_embeddings()
    if shared is None or head is None or getattr(head, "weight", None) is not shared:
        return []
    return [
        name.removeprefix("base_model.model.")
        for name, module in model.named_modules()
        if isinstance(module, BaseTunerLayer) and getattr(module.get_base_layer(), "weight", None) is shared
    ]


def refuse_tied_lora(model, spec) -> None:
    """Stop before training when vLLM would generate from a model without the update of a tied layer: the
    worker's own check of what ``validate`` refuses from the catalog (``recipes.generation.tied_lora_issues``),
    for a model the catalog does not know."""
    hits = tied_lora_layers(model)
    if hits:
        from autoslm.errors import FatalWorkerError
        from autoslm.recipes.generation import tied_lora_message

        raise FatalWorkerError(f"train.lora_targets: {tied_lora_message(spec.train.lora_targets, hits, spec.model)}")


def exact_layers(model, *, sharded: bool) -> dict | None:
    """The LoRA layers to merge out of place when pushing ``model`` into vLLM (``lora_layers``); None, and
    TRL's merge kept, for a model without LoRA or with sharded weights (FSDP, ZeRO-3)."""
    from accelerate.utils import is_peft_model

    if not is_peft_model(model) or sharded:
        return None
    return lora_layers(model)


__all__ = ["exact_layers", "lora_layers", "merged_named_params", "merged_tensor", "refuse_tied_lora", "tied_lora_layers"]
